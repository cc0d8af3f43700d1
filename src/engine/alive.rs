//! herald's life sign ([`crate::store::Backend::stamp_alive`]): while herald runs, the wall
//! instant goes to the store every [`EVERY`]; start-up reads the last one before it stamps.
//!
//! Why: misfire counts only the time nobody watched (DESIGN.md). A send waiting in a rate
//! limit's backlog when the process died was watched until the process died, but nothing on
//! disk said until when: a restart judged it from its instant, and a backlog of 15 minutes
//! with a grace of 10 expired every send still waiting, after a restart of seconds. With the
//! life sign the restart judges only the time after it (`plan::recover_started`): the outage
//! plus at most one [`EVERY`].
//!
//! A single node's sign only: in cluster mode no node stamps (a shard moves between nodes
//! under its own fenced leases, HA.md), and start-up reads none.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Inner;

/// How often the life sign is stamped: the most of the time herald watched that a restart
/// can count as outage.
pub const EVERY: Duration = Duration::from_secs(1);

/// How long a drain's last stamp may take (a stalled database must not hold the exit).
const LAST_WAIT: Duration = Duration::from_millis(250);

/// The last process's life sign (0: none, cluster mode, or unreadable), read before this
/// process stamps. Never after `boot_ms`: a clock stepped back across the restart must not
/// make the outage look shorter than nothing.
pub(super) async fn before(inner: &Arc<Inner>) -> u64 {
    if inner.config.cluster.is_some() {
        return 0;
    }
    match super::offload::read(inner, |i| Ok(i.store.last_alive()?)).await {
        Ok(ms) => ms.unwrap_or(0).min(inner.boot_ms),
        Err(e) => {
            tracing::warn!(error = %e, "the last life sign could not be read: a send waiting in a backlog before the outage is judged from its instant");
            0
        }
    }
}

/// Stamps every [`EVERY`] until the engine is dropped (single-node mode only).
pub(super) fn start(inner: &Arc<Inner>) {
    if inner.config.cluster.is_some() {
        return;
    }
    tokio::spawn(stamp_every(Arc::downgrade(inner)));
}

async fn stamp_every(inner: Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        stamp(&i).await;
        drop(i);
        tokio::time::sleep(EVERY).await;
    }
}

/// One stamp on the blocking pool (a file write on a slow disk, or a round trip, can block).
/// A failed one is left: the next start judges from the previous stamp, a longer outage.
async fn stamp(inner: &Arc<Inner>) {
    let i = inner.clone();
    let now = inner.clock.now_ms();
    let done = tokio::task::spawn_blocking(move || i.store.stamp_alive(now)).await;
    if let Ok(Err(e)) = done {
        tracing::debug!(error = %e, "life sign not stamped");
    }
}

/// The last stamp, at the end of a drain: herald watched until now. Bounded by [`LAST_WAIT`].
pub(super) async fn last(inner: &Arc<Inner>) {
    if inner.config.cluster.is_none() {
        let _ = tokio::time::timeout(LAST_WAIT, stamp(inner)).await;
    }
}
