//! File descriptors: raise the soft `RLIMIT_NOFILE` to the hard limit at start, and split what
//! there is between HTTP clients and herald's own work.
//!
//! A service manager's default soft limit (often 1024) is far below the hard limit (often
//! 524288); nothing is gained by staying under it. Whatever the limit, HTTP connections get at
//! most `limit - reserve`: the reserve covers the store (sled's files), stdio, the runtime's
//! own descriptors, file channels, and one connection per concurrent webhook send (plus its
//! token fetch), so that a flood of clients can never make a delivery fail for want of a
//! descriptor.

/// Descriptors kept for everything that is not an HTTP client or a webhook send: sled's files
/// (a handful), stdio, epoll, event fds, the listener, file channels, `/proc` reads, slack.
pub const RESERVE_BASE: u64 = 64;

/// Default cap on HTTP connections when the descriptors would allow more.
pub const CONNECTIONS_DEFAULT_MAX: usize = 1024;

/// Fewer descriptors than this for HTTP clients and herald refuses to start.
const CONNECTIONS_MIN: u64 = 8;

/// The soft limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: u64,
    pub now: u64,
}

/// The current soft `RLIMIT_NOFILE`.
pub fn nofile() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass; nothing else is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_nofile() -> std::io::Result<Raised> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as in `nofile`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let new = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(Raised {
        before,
        now: nofile()?,
    })
}

/// Descriptors kept back from HTTP clients for herald's own work under `config`: the base,
/// one connection per concurrent webhook send and its token fetch, the background drains of
/// answers' bodies (each holds its socket after the send's slot is let go) and the alert
/// deliveries (which take no slot of their channel) when a webhook channel can carry them, one
/// file per file channel, PostgreSQL's pool with the commits' connections, the process
/// lock's and the lease and notification connections, and in cluster mode the connections of
/// commands forwarded to other nodes (`api/forward.rs`: at most `FORWARDS_MAX` under way,
/// and as many again idle).
pub fn reserve(config: &crate::config::Config) -> u64 {
    use crate::config::ChannelKind;
    let webhooks = || {
        config
            .channels
            .iter()
            .filter(|c| matches!(c.kind, ChannelKind::Webhook { .. }))
    };
    let sends: u64 = webhooks().map(|c| u64::from(c.concurrency) + 1).sum();
    // As many as the channel's slots (`WebhookSink::keep_drains`).
    let drains: u64 = webhooks().map(|c| u64::from(c.concurrency)).sum();
    let alerts_by_webhook = config
        .alerts_channel
        .as_ref()
        .is_some_and(|name| webhooks().any(|c| &c.name == name));
    let alerts = if alerts_by_webhook {
        crate::engine::ALERT_DELIVERIES_MAX as u64
    } else {
        0
    };
    let files = config
        .channels
        .iter()
        .filter(|c| matches!(c.kind, ChannelKind::File { .. }))
        .count() as u64;
    let database = config
        .database
        .as_ref()
        // The read pool, the commits' own connections, the process lock's session, and in
        // cluster mode the lease loop's and the inbox listener's.
        .map_or(0, |d| {
            d.pool_size as u64 + crate::store::pg::backend::COMMIT_CONNECTIONS as u64 + 3
        });
    let forwards = if config.cluster.is_some() {
        2 * crate::api::forward::FORWARDS_MAX as u64
    } else {
        0
    };
    RESERVE_BASE + sends + drains + alerts + files + database + forwards
}

/// The cap on HTTP connections: the configured value, or [`CONNECTIONS_DEFAULT_MAX`], never
/// more than what the descriptor `limit` leaves after `reserve`. An error when the limit
/// leaves next to nothing (herald could not serve and deliver both).
pub fn connections_max(
    limit: u64,
    reserve: u64,
    configured: Option<usize>,
) -> Result<(usize, Option<String>), String> {
    let room = limit.saturating_sub(reserve);
    if room < CONNECTIONS_MIN {
        return Err(format!(
            "the file descriptor limit ({limit}) leaves {room} for HTTP connections after {reserve} reserved for the store and webhook sends; raise it (ulimit -n, LimitNOFILE=) to at least {}",
            reserve + CONNECTIONS_MIN * 8
        ));
    }
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    Ok(match configured {
        Some(n) if n > room => (
            room,
            Some(format!(
                "limits.connections_max = {n} is more than the descriptor limit {limit} leaves after {reserve} reserved; using {room}"
            )),
        ),
        Some(n) => (n, None),
        None => (room.min(CONNECTIONS_DEFAULT_MAX), None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_limit_minus_the_reserve() {
        assert_eq!(connections_max(1024, 100, None).unwrap(), (924, None));
        assert_eq!(connections_max(1 << 20, 100, None).unwrap().0, 1024);
        assert_eq!(connections_max(1 << 20, 100, Some(5000)).unwrap().0, 5000);
        let (n, warn) = connections_max(256, 100, Some(5000)).unwrap();
        assert_eq!(n, 156);
        assert!(warn.unwrap().contains("using 156"));
        assert!(connections_max(100, 96, None).is_err());
    }

    /// Every kind of descriptor herald holds for its own work is kept back: a webhook's sends,
    /// the body drains, alert deliveries over a webhook, file channels, the database's pool.
    #[test]
    fn the_reserve_counts_what_herald_itself_holds() {
        use crate::config::{Config, Overrides};
        let cfg = |toml: &str| {
            Config::from_toml(
                toml,
                Overrides {
                    listen: None,
                    data_dir: Some("/tmp/x".into()),
                    token: None,
                },
            )
            .unwrap()
        };
        assert_eq!(reserve(&cfg("")), RESERVE_BASE);
        let hook = "[channels.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\nconcurrency = 10\n";
        let drains = 10;
        assert_eq!(reserve(&cfg(hook)), RESERVE_BASE + 11 + drains);
        let alerts = format!("{hook}[alerts]\nchannel = \"hook\"\n");
        let alert_max = crate::engine::ALERT_DELIVERIES_MAX as u64;
        assert_eq!(
            reserve(&cfg(&alerts)),
            RESERVE_BASE + 11 + drains + alert_max
        );
        let file = "[channels.f]\nkind = \"file\"\npath = \"/tmp/x/out\"\n";
        assert_eq!(reserve(&cfg(file)), RESERVE_BASE + 1);
        let db = "[store]\nurl = \"postgres://db/x\"\npool_size = 20\n";
        assert_eq!(reserve(&cfg(db)), RESERVE_BASE + 25);
        // Cluster mode: the forwarding client's connections, under way and idle.
        let cluster = format!("{db}[cluster]\nnode_id = \"a\"\n");
        let forwards = 2 * crate::api::forward::FORWARDS_MAX as u64;
        assert_eq!(reserve(&cfg(&cluster)), RESERVE_BASE + 25 + forwards);
    }

    #[test]
    fn raising_never_lowers() {
        let before = nofile().unwrap();
        let r = raise_nofile().unwrap();
        assert!(r.now >= before);
    }
}
