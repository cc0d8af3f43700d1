//! Config keys from environment variables: every key in [`super::ENV_KEYS`] can be set by
//! `HERALD_` + the dotted key upper-cased with `.` → `_` (`limits.body_bytes_max` →
//! `HERALD_LIMITS_BODY_BYTES_MAX`). The values are merged into the parsed TOML table before it
//! is read, so an environment value is checked exactly like the same value in the file and
//! every key keeps one code path. Precedence: file < environment < command-line flags.

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

/// Writes the value of every set variable of `keys` into `table`. An empty variable counts as
/// unset (`HERALD_TOKEN=` in a compose file means "no value", not "the empty token").
pub fn apply(
    table: &mut toml::Table,
    keys: &[(&str, Kind)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<usize, ConfigError> {
    let mut applied = 0;
    for &(key, kind) in keys {
        let name = var_name(key);
        let Some(raw) = env(&name).filter(|v| !v.is_empty()) else {
            continue;
        };
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
        applied += 1;
    }
    Ok(applied)
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
                    parts[..=i].join(".")
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
        assert_eq!(apply(&mut t, &keys, &env).unwrap(), 2);
        assert_eq!(t["listen"].as_str(), Some("0.0.0.0:1"));
        assert_eq!(t["store"]["cache_mb"].as_integer(), Some(32));
        assert!(!t.contains_key("token"));
        let bad = |_: &str| Some("lots".to_string());
        let e = apply(&mut t, &[("store.cache_mb", Kind::Int)], &bad).unwrap_err();
        assert!(e.to_string().starts_with("HERALD_STORE_CACHE_MB:"), "{e}");
    }
}
