//! `[cluster]` (HA.md "Config"): several herald nodes on one PostgreSQL. The keys are fixed by
//! HA.md; each is checked here, and the section needs `[store] url` (a cluster shares one
//! database; sled is one machine's).

use serde::Deserialize;

use super::{invalid, ConfigError};
use crate::cluster::lease::Timing;
use crate::model::parse_duration_ms;

/// The file's `[cluster]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ClusterFile {
    node_id: Option<String>,
    advertise: Option<String>,
    shards: Option<u64>,
    lease: Option<String>,
    renew: Option<String>,
    safety: Option<String>,
    max_clock_offset: Option<String>,
}

/// `[cluster]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Default: the host's name.
    pub node_id: String,
    /// Where other nodes reach this one's API (forwarding); `None`: not advertised.
    pub advertise: Option<String>,
    /// S, used only when the schema is first created.
    pub shards: u32,
    pub timing: Timing,
    pub max_clock_offset_ms: u64,
}

fn ms(key: &str, v: &Option<String>, default: u64) -> Result<u64, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration_ms(s)
            .map_err(|e| invalid(format!("cluster.{key}"), format!("{s:?}: {e}"))),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "herald".into())
}

/// Checks `[cluster]`; `has_database`: whether `[store] url` is set; `listen`: the address
/// the API listens on (`listen` or `--listen`).
pub(super) fn cluster(
    file: Option<&ClusterFile>,
    has_database: bool,
    listen: std::net::SocketAddr,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(f) = file else { return Ok(None) };
    if !has_database {
        return Err(invalid(
            "cluster",
            "cluster mode needs a shared PostgreSQL database: set [store] url (or HERALD_STORE_URL)",
        ));
    }
    let node_id = match &f.node_id {
        Some(n) if n.trim().is_empty() || n.len() > 200 => {
            return Err(invalid("cluster.node_id", "must be 1 to 200 characters"))
        }
        Some(n) => n.clone(),
        None => hostname(),
    };
    if let Some(a) = &f.advertise {
        if !(a.starts_with("http://") || a.starts_with("https://")) {
            return Err(invalid(
                "cluster.advertise",
                format!("{a:?} is not a URL like http://10.0.0.5:7700"),
            ));
        }
    }
    if f.advertise.is_none() && listen.ip().is_unspecified() {
        // Without it the node advertises the address it listens on, and this one names no
        // address: other nodes would answer every command for this node's shards with a 503
        // saying a takeover is under way, for as long as it holds them.
        return Err(invalid(
            "cluster.advertise",
            format!("must be set when herald listens on every interface ({listen}): other nodes forward commands for this node's tasks to it; give the URL they reach this node at, like http://10.0.0.5:7700 (or listen on that one address)"),
        ));
    }
    let max = u64::from(crate::store::pg::schema::MAX_SHARDS);
    let shards = match f.shards {
        None => crate::store::pg::schema::DEFAULT_SHARDS,
        Some(s) if (1..=max).contains(&s) => u32::try_from(s).unwrap_or(1),
        Some(s) => {
            return Err(invalid(
                "cluster.shards",
                format!("{s} is not between 1 and {max}"),
            ))
        }
    };
    let d = Timing::default();
    let timing = Timing {
        ttl_ms: ms("lease", &f.lease, d.ttl_ms)?,
        renew_ms: ms("renew", &f.renew, d.renew_ms)?,
        safety_ms: ms("safety", &f.safety, d.safety_ms)?,
    };
    timing.check().map_err(|m| invalid("cluster", m))?;
    // Half the lease is each session's `idle_in_transaction_session_timeout` (`server.rs`),
    // an int of milliseconds on PostgreSQL: beyond it the start failed naming that parameter.
    if timing.ttl_ms > 2 * PG_MS_MAX {
        return Err(invalid(
            "cluster.lease",
            format!(
                "at most {} ms (~49.7 days): half of it is PostgreSQL's idle_in_transaction_session_timeout, at most {PG_MS_MAX} ms",
                2 * PG_MS_MAX
            ),
        ));
    }
    // No clock is measured exactly (the estimate's error is half a round trip): with 0 the
    // node would never own a shard while `/healthz` said ok.
    let max_clock_offset_ms = ms("max_clock_offset", &f.max_clock_offset, 500)?;
    if max_clock_offset_ms == 0 {
        return Err(invalid(
            "cluster.max_clock_offset",
            "must be more than 0: no node's clock is measured exactly, so with 0 this node would own no shard",
        ));
    }
    Ok(Some(ClusterConfig {
        node_id,
        advertise: f.advertise.clone(),
        shards,
        timing,
        max_clock_offset_ms,
    }))
}

/// The largest number of milliseconds PostgreSQL takes for a timeout setting (an `int`).
pub(super) const PG_MS_MAX: u64 = i32::MAX as u64;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<ClusterConfig>, ConfigError> {
        let f: ClusterFile = toml::from_str(text).unwrap();
        cluster(Some(&f), true, LOOPBACK.parse().unwrap())
    }

    const LOOPBACK: &str = "127.0.0.1:7700";

    #[test]
    fn defaults_are_ha_mds() {
        let c = parse("node_id = \"a\"").unwrap().unwrap();
        assert_eq!(c.node_id, "a");
        assert_eq!(c.shards, 64);
        assert_eq!(c.timing, Timing::default());
        assert_eq!(c.max_clock_offset_ms, 500);
    }

    #[test]
    fn each_bad_key_is_named() {
        let e = |t: &str| parse(t).unwrap_err().to_string();
        assert!(e("shards = 0").starts_with("cluster.shards"));
        assert!(e("lease = \"soon\"").starts_with("cluster.lease"));
        assert!(e("advertise = \"10.0.0.5\"").starts_with("cluster.advertise"));
        assert!(e("lease = \"1s\"\nsafety = \"2s\"").contains("longer than cluster.safety"));
        assert!(e("node_id = \"\"").starts_with("cluster.node_id"));
        assert!(e("max_clock_offset = \"0s\"").starts_with("cluster.max_clock_offset"));
        assert!(e("max_clock_offset = \"0ms\"").contains("more than 0"));
        // Half the lease goes to PostgreSQL as a timeout in ms (an int): 2 * 2^31 - 2 at most.
        let over = format!("lease = \"{}ms\"", 2 * PG_MS_MAX + 1);
        assert!(e(&over).starts_with("cluster.lease"), "{}", e(&over));
        assert!(e("lease = \"50d\"").starts_with("cluster.lease"));
        let f: ClusterFile = toml::from_str("").unwrap();
        assert!(cluster(Some(&f), false, LOOPBACK.parse().unwrap())
            .unwrap_err()
            .to_string()
            .contains("[store] url"));
    }

    /// On every interface the node has no address to advertise of its own: forwards to it
    /// would fail for as long as it holds shards. Refused at start, naming the key.
    #[test]
    fn listening_on_every_interface_needs_advertise() {
        for any in ["0.0.0.0:7700", "[::]:7700"] {
            let f: ClusterFile = toml::from_str("node_id = \"a\"").unwrap();
            let e = cluster(Some(&f), true, any.parse().unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("cluster.advertise"), "{e}");
            let f: ClusterFile = toml::from_str("advertise = \"http://10.0.0.5:7700\"").unwrap();
            let c = cluster(Some(&f), true, any.parse().unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(c.advertise.as_deref(), Some("http://10.0.0.5:7700"));
        }
        assert!(parse("node_id = \"a\"")
            .unwrap()
            .unwrap()
            .advertise
            .is_none());
    }
}
