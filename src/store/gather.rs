//! How long the commit thread waits for more writers before a group's durable sync.
//!
//! Why: when the sync is the slow part (a real disk: ~0.3–2 ms per `fdatasync`), the writers
//! answered by one sync come back together a little later, each after its own step (a send, a
//! plan). Taking whatever is queued the moment the last sync ends gives a convoy: a small group
//! of stragglers takes the disk, and the writers that return during its sync wait for all of
//! it, then go in the next group — so groups alternate small and large and the disk does twice
//! the syncs it needs. Waiting a little for the writers of the previous group makes the groups
//! as large as the load is, and the syncs per write fall (an unpaced webhook sequence: one
//! durable write per message, 20 runs in parallel).
//!
//! The law (PostgreSQL's `commit_delay`/`commit_siblings`, made adaptive):
//! - go at once when at least as many writers are queued as the previous group had, or the
//!   previous group had fewer than [`SIBLINGS_MIN`] (a lone writer never waits), or the group
//!   holds many writes already;
//! - go at once when syncs are cheap (their running mean under [`SYNC_SLOW`]: tmpfs, a fast
//!   disk): a wait would cost more than the sync it saves;
//! - else wait until as many writers are queued as the previous group had (the commit
//!   thread's doorbell: the writer that completes the count wakes it), or at most one mean
//!   sync and [`WAIT_MAX`], then take what has queued. A load that dropped costs one such
//!   wait: the next group's size is the new target.
//!
//! Measured (webhook sends, 20 unpaced sequences, data on disk, same hour): taking what was
//! queued, 9.0 k messages/s and 0.157 syncs per message; a fixed sleep of half a mean sync,
//! 14.3 k/s and 0.129; a whole mean sync, 12.7 k/s and 0.102 (the sleep outlasted the writers).
//!
//! Pure: the commit thread measures and sleeps.

use std::time::Duration;

/// Fewest writers in the previous group for the next one to wait for more.
pub const SIBLINGS_MIN: usize = 4;
/// Syncs faster than this (their running mean) are not worth waiting for: tmpfs (a few µs).
/// A disk's sync of the log, which overwrites zero-filled blocks (`wal.rs`), can take
/// ~0.1 ms: at 200 µs here such a disk never waited, and its groups halved (webhook sends,
/// 20 sequences, alternating builds: 0.172 / 0.175 syncs per message and 27.6 / 26.1 k/s
/// against 0.091 / 0.094 and 29.6 / 28.2 k/s at 50 µs).
pub const SYNC_SLOW: Duration = Duration::from_micros(50);
/// Longest wait before a group's sync.
pub const WAIT_MAX: Duration = Duration::from_millis(1);
/// A group with this many writes goes at once. A herd's chunk is one job of ~1 300 writes,
/// and there the commit thread's own work (resolving the writes) is what the sends wait for,
/// not the sync: waiting for more chunks only idled it (100 000 one-shots, last send at due
/// + 1.33 / 1.35 s waiting against 1.13 / 0.94 s not, alternating runs).
pub const OPS_ENOUGH: usize = 512;

/// The commit thread's memory of recent groups.
#[derive(Debug, Default)]
pub struct Gather {
    previous: usize,
    /// Running mean of the sync time, in µs (weight 1/8 to the newest).
    sync_us: f64,
}

impl Gather {
    /// How long to wait for more writers with `queued` jobs of `ops` writes taken; `None`: go.
    pub fn wait(&self, queued: usize, ops: usize) -> Option<Duration> {
        if self.previous < SIBLINGS_MIN || queued >= self.previous || ops >= OPS_ENOUGH {
            return None;
        }
        let sync = Duration::from_micros(self.sync_us as u64);
        if sync < SYNC_SLOW {
            return None;
        }
        Some(sync.min(WAIT_MAX))
    }

    /// Writers in the previous group: how many a wait waits for.
    pub fn previous(&self) -> usize {
        self.previous
    }

    /// A group of `writers` was made durable by a sync that took `sync`.
    pub fn observe(&mut self, writers: usize, sync: Duration) {
        self.previous = writers;
        let us = sync.as_micros() as f64;
        self.sync_us = if self.sync_us == 0.0 {
            us
        } else {
            self.sync_us + (us - self.sync_us) / 8.0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(previous: usize) -> Gather {
        let mut g = Gather::default();
        g.observe(previous, Duration::from_micros(800));
        g
    }

    #[test]
    fn a_lone_writer_and_cheap_syncs_never_wait() {
        assert_eq!(Gather::default().wait(1, 1), None);
        assert_eq!(slow(SIBLINGS_MIN - 1).wait(1, 1), None);
        let mut fast = Gather::default();
        fast.observe(20, Duration::from_micros(30));
        assert_eq!(fast.wait(1, 1), None);
    }

    #[test]
    fn fewer_than_the_previous_group_wait_up_to_a_sync_bounded() {
        let g = slow(20);
        assert_eq!(g.wait(3, 6), Some(Duration::from_micros(800)));
        assert_eq!(g.previous(), 20);
        assert_eq!(g.wait(20, 40), None, "as many as last time: go");
        assert_eq!(g.wait(3, OPS_ENOUGH), None, "a big group goes");
        let mut very = Gather::default();
        very.observe(20, Duration::from_millis(10));
        assert_eq!(very.wait(3, 6), Some(WAIT_MAX));
    }

    #[test]
    fn the_sync_mean_moves_an_eighth_at_a_time() {
        let mut g = slow(20);
        g.observe(20, Duration::from_micros(1_600));
        assert_eq!(g.sync_us, 900.0);
        // A run of cheap syncs brings it under the threshold: no more waiting.
        for _ in 0..40 {
            g.observe(20, Duration::from_micros(20));
        }
        assert_eq!(g.wait(1, 1), None);
    }
}
