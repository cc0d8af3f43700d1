//! Config keys from environment variables: every key in [`super::ENV_KEYS`] can be set by
//! `HERALD_` + the dotted key upper-cased with `.` → `_` (`limits.body_bytes_max` →
//! `HERALD_LIMITS_BODY_BYTES_MAX`). The values are merged into the parsed TOML table before it
//! is read, so an environment value is checked exactly like the same value in the file and
//! every key keeps one code path. Precedence: a variable fills only a key the file does not
//! set; command-line flags beat both. Why the file wins: the container image and the systemd
//! unit carry `HERALD_*` defaults (listen address, data directory), and a config file mounted
//! over them must not be silently overridden by the packaging's defaults.

use super::{invalid, ConfigError};

/// How an environment string becomes a TOML value: the variable is text, the key may not be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Float,
    Bool,
}

/// The variable that sets `key`.
pub fn var_name(key: &str) -> String {
    format!("HERALD_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// What [`apply`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Variables written into the table.
    pub set: usize,
    /// Variables left out because the file sets their key, as `HERALD_LISTEN (listen)`.
    pub shadowed: Vec<String>,
}

/// Writes the value of every set variable of `keys` whose key `table` (the file) does not set
/// into `table`. An empty variable counts as unset (`HERALD_TOKEN=` in a compose file means
/// "no value", not "the empty token").
pub fn apply(
    table: &mut toml::Table,
    keys: &[(&str, Kind)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Applied, ConfigError> {
    let mut applied = Applied::default();
    for &(key, kind) in keys {
        let name = var_name(key);
        let Some(raw) = env(&name).filter(|v| !v.is_empty()) else {
            continue;
        };
        if is_set(table, key) {
            applied.shadowed.push(format!("{name} ({key})"));
            continue;
        }
        let bad = |what: &str| invalid(&name, format!("{raw:?} is not {what} (sets {key})"));
        let value = match kind {
            Kind::Str => toml::Value::String(raw.clone()),
            Kind::Int => toml::Value::Integer(raw.trim().parse().map_err(|_| bad("an integer"))?),
            Kind::Float => toml::Value::Float(raw.trim().parse().map_err(|_| bad("a number"))?),
            Kind::Bool => toml::Value::Boolean(match raw.trim() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(bad("true or false")),
            }),
        };
        insert(table, key, value).map_err(|m| invalid(&name, m))?;
        applied.set += 1;
    }
    Ok(applied)
}

/// True when the dotted `key` has a value in `table`.
fn is_set(table: &toml::Table, key: &str) -> bool {
    let mut parts = key.split('.');
    let Some(first) = parts.next() else {
        return false;
    };
    let mut v = table.get(first);
    for p in parts {
        v = v.and_then(|t| t.as_table()).and_then(|t| t.get(p));
    }
    v.is_some()
}

/// Sets the dotted `key` in `table`, creating the tables on the way.
fn insert(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut t = table;
    for (i, p) in parts.iter().enumerate() {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return Err(format!(
                    "{} in the config file is not a table",
                    parts.get(..=i).unwrap_or_default().join(".")
                ))
            }
        };
    }
    t.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_dotted_key() {
        assert_eq!(var_name("data_dir"), "HERALD_DATA_DIR");
        assert_eq!(
            var_name("limits.body_bytes_max"),
            "HERALD_LIMITS_BODY_BYTES_MAX"
        );
    }

    #[test]
    fn values_are_typed_by_the_table_and_nested() {
        let mut t = toml::Table::new();
        let env = |n: &str| match n {
            "HERALD_LISTEN" => Some("0.0.0.0:1".to_string()),
            "HERALD_STORE_CACHE_MB" => Some("32".to_string()),
            "HERALD_TOKEN" => Some(String::new()),
            _ => None,
        };
        let keys = [
            ("listen", Kind::Str),
            ("store.cache_mb", Kind::Int),
            ("token", Kind::Str),
        ];
        assert_eq!(apply(&mut t, &keys, &env).unwrap().set, 2);
        assert_eq!(t["listen"].as_str(), Some("0.0.0.0:1"));
        assert_eq!(t["store"]["cache_mb"].as_integer(), Some(32));
        assert!(!t.contains_key("token"));
        let bad = |_: &str| Some("lots".to_string());
        let e = apply(
            &mut toml::Table::new(),
            &[("store.cache_mb", Kind::Int)],
            &bad,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("HERALD_STORE_CACHE_MB:"), "{e}");
    }

    #[test]
    fn a_variable_fills_only_a_key_the_file_does_not_set() {
        let mut t: toml::Table =
            toml::from_str("listen = \"127.0.0.1:1\"\n[store]\ncache_mb = 4\n").unwrap();
        let env = |n: &str| match n {
            "HERALD_LISTEN" => Some("0.0.0.0:7700".to_string()),
            "HERALD_STORE_CACHE_MB" => Some("32".to_string()),
            "HERALD_STORE_RETENTION" => Some("1d".to_string()),
            "HERALD_DATA_DIR" => Some("/var/lib/herald".to_string()),
            _ => None,
        };
        let keys = [
            ("listen", Kind::Str),
            ("data_dir", Kind::Str),
            ("store.cache_mb", Kind::Int),
            ("store.retention", Kind::Str),
        ];
        let a = apply(&mut t, &keys, &env).unwrap();
        assert_eq!(a.set, 2);
        assert_eq!(
            a.shadowed,
            [
                "HERALD_LISTEN (listen)",
                "HERALD_STORE_CACHE_MB (store.cache_mb)"
            ]
        );
        assert_eq!(t["listen"].as_str(), Some("127.0.0.1:1"), "the file wins");
        assert_eq!(t["store"]["cache_mb"].as_integer(), Some(4));
        assert_eq!(t["store"]["retention"].as_str(), Some("1d"), "filled in");
        assert_eq!(t["data_dir"].as_str(), Some("/var/lib/herald"));
    }
}
