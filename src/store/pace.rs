//! When the applier writes a frozen memtable layer into sled: not while the write path is
//! busy, unless memory or time says it must.
//!
//! Why: the applier runs at `SCHED_IDLE`, yet while it wrote sled during a burst of creates it
//! still cost the request path (sled's node splits are ~40 % of its time, and its flushes share
//! the disk with the log's). Held back, bursts of 30 000 creates at 64 connections ran ~1.18×
//! as fast (median of per-round ratios, two builds taking turns, faster in 8 of 10 rounds).
//! A burst is absorbed by the memtable instead, and the layer goes into sled once the writes
//! pause.
//!
//! Bounds, so that deferring never turns into back-pressure or unbounded replay:
//! - the applier never waits once the active layer holds [`DEFER_MAX_BYTES`] (the soft mark
//!   where admission starts to slow writes, a quarter of the bound at which they would wait
//!   for it), so that under sustained load it is writing well before any write waits;
//! - it never waits more than [`DEFER_MAX_TIME`] in all for one layer;
//! - once a bound ended a wait under load, it does not wait again until the writes pause
//!   ([`Pacer`]).
//!
//! Pure: the caller measures and sleeps.

use std::time::Duration;

/// Writes (keys) per second at which the write path counts as busy: a create writes two (its
/// spec and its due entry), so 2 000 is a create every millisecond; a trickle below it is not
/// worth deferring for. Counted in writes, not groups: a herd's chunk is one job of ~1 300
/// writes, and its few hundred groups a second read as idle when groups were counted: the
/// applier wrote sled through the herd (11 % of a herd's samples under a competing writer)
/// and shared the disk with the log's syncs.
pub const BUSY_WRITES_PER_S: u64 = 2_000;
/// How long one look at the write path lasts (the writes counted over it).
pub const POLL: Duration = Duration::from_millis(5);
/// The applier does not wait once the active layer is this big (16 MiB: a burst of ~45 000
/// creates).
pub const DEFER_MAX_BYTES: usize = 16 << 20;
// The applier always catches up before a write would wait for it.
const _: () = assert!(DEFER_MAX_BYTES < super::memtable::ACTIVE_MAX_BYTES);
/// Nor once it has waited this long for the layer it holds.
pub const DEFER_MAX_TIME: Duration = Duration::from_secs(5);

/// Whether `writes` committed during a poll of length `span` make the write path busy.
pub fn busy(writes: u64, span: Duration) -> bool {
    u128::from(writes) * 1_000_000 >= u128::from(BUSY_WRITES_PER_S) * span.as_micros()
}

/// The applier's pacing across layers. Once a bound ended a wait while the writes kept coming,
/// or a write had to wait for room, the load is sustained, not a burst: the applier then writes
/// without waiting (as it would without pacing) until the writes pause *and* the memtable has
/// caught up (its active layer under `small_bytes`, the freeze size). A pause alone is not
/// enough: writes waiting for room, or one slow sync, look like a pause, and waiting again
/// with a full memtable would hand the writes back-pressure while one core idles.
#[derive(Debug, Default)]
pub struct Pacer {
    catching_up: bool,
}

impl Pacer {
    /// No group for a whole poll; the active layer holds `active_bytes`.
    pub fn quiet(&mut self, active_bytes: usize, small_bytes: usize) {
        if active_bytes < small_bytes {
            self.catching_up = false;
        }
    }

    /// A write waited for the applier: sustained load.
    pub fn pressed(&mut self) {
        self.catching_up = true;
    }

    /// Whether to look at the write path before the next chunk (a look takes a [`POLL`]).
    pub fn looks(&self) -> bool {
        !self.catching_up
    }

    /// Whether to wait another poll: `writes` were committed during the last one, of length
    /// `span`; the active layer holds `active_bytes`; the applier has already waited `waited`
    /// for its layer.
    pub fn wait(
        &mut self,
        writes: u64,
        span: Duration,
        active_bytes: usize,
        waited: Duration,
    ) -> bool {
        if self.catching_up || !busy(writes, span) {
            return false;
        }
        if active_bytes >= DEFER_MAX_BYTES || waited >= DEFER_MAX_TIME {
            self.catching_up = true;
            return false;
        }
        true
    }
}

/// Admission, the other half of the pacing: while the applier is behind (the active layer
/// over [`ADMIT_SOFT_BYTES`]), every write waits a little before it joins the commit queue,
/// the same for every writer at a given fill, so the writers slow down together long before
/// the hard bound ([`ADMIT_FULL_BYTES`], where a group would wait for the applier) instead of
/// all hitting it at once. Why: with a wall, a slow applier let the memtable fill at full
/// speed and then held *every* write for a whole layer (p99 1.2–1.4 s in the load bench with
/// a competing `fdatasync` writer, 52 writers queued behind one group).
///
/// The law, with `a` the active layer's bytes:
/// - `a < SOFT` (16 MiB): no wait;
/// - `SOFT <= a < KNEE` (16..28 MiB): `DELAY_MAX * (a - SOFT) / (KNEE - SOFT)`, 0..50 ms;
/// - `KNEE <= a < FULL` (28..64 MiB): `DELAY_MAX`;
/// - `a >= FULL`: full, like a full queue: a write that must not wait (an HTTP create) is
///   refused at once (503 with `Retry-After`), an engine step waits for room as before.
///
/// It is a proportional controller on the memtable: `n` writers of `b` bytes each, delayed
/// `d`, put in at most `n * b / d` bytes/s, so the fill settles where that meets the
/// applier's rate (64 connections of ~1 KiB creates at 50 ms: ~1.3 MB/s, far under any disk's
/// applier). A write's own wait is at most [`ADMIT_DELAY_MAX`] (50 ms), which leaves half of
/// the 100 ms bound to the group's own commit.
pub const ADMIT_SOFT_BYTES: usize = DEFER_MAX_BYTES;
/// Where the delay reaches [`ADMIT_DELAY_MAX`]. The room from here to the hard bound is for
/// what a steady law cannot slow: a herd's settles, a few hundred big writes at once
/// (`memtable::ACTIVE_MAX_BYTES`).
pub const ADMIT_KNEE_BYTES: usize = 28 << 20;
/// The hard bound: a group waits for the applier over it (`memtable::ACTIVE_MAX_BYTES`).
pub const ADMIT_FULL_BYTES: usize = super::memtable::ACTIVE_MAX_BYTES;
/// The longest a write waits to be admitted.
pub const ADMIT_DELAY_MAX: Duration = Duration::from_millis(50);
const _: () = assert!(ADMIT_SOFT_BYTES < ADMIT_KNEE_BYTES && ADMIT_KNEE_BYTES < ADMIT_FULL_BYTES);

/// What admission says to one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Join the queue now.
    Now,
    /// Wait this long first (at most [`ADMIT_DELAY_MAX`]).
    After(Duration),
    /// The memtable is at its hard bound: as good as a full queue.
    Full,
}

/// The admission law (above) for an active layer of `active_bytes`.
pub fn admit(active_bytes: usize) -> Admit {
    if active_bytes < ADMIT_SOFT_BYTES {
        return Admit::Now;
    }
    if active_bytes >= ADMIT_FULL_BYTES {
        return Admit::Full;
    }
    let over = (active_bytes.min(ADMIT_KNEE_BYTES) - ADMIT_SOFT_BYTES) as u128;
    let span = (ADMIT_KNEE_BYTES - ADMIT_SOFT_BYTES) as u128;
    let us = ADMIT_DELAY_MAX.as_micros() * over / span;
    match us {
        0 => Admit::Now,
        us => Admit::After(Duration::from_micros(us as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_two_thousand_writes_a_second() {
        let ms = Duration::from_millis;
        assert!(busy(10, ms(5)));
        assert!(!busy(9, ms(5)));
        assert!(!busy(0, ms(5)));
        // One herd chunk of 1 300 writes in a poll is busy, as ten creates are.
        assert!(busy(1_300, ms(5)));
    }

    const SMALL: usize = 4 << 20;

    #[test]
    fn waits_through_a_burst_within_memory_and_time() {
        let ms = Duration::from_millis;
        let mut p = Pacer::default();
        assert!(p.looks());
        assert!(p.wait(100, ms(5), 0, ms(0)));
        assert!(p.wait(100, ms(5), DEFER_MAX_BYTES - 1, DEFER_MAX_TIME - ms(1)));
        // The writes paused: the layer goes now.
        assert!(!p.wait(4, ms(5), 0, ms(10)));
        assert!(p.looks(), "a burst that ended leaves the pacer as it was");
    }

    #[test]
    fn a_bound_hit_under_load_means_sustained_load_until_quiet_and_caught_up() {
        let ms = Duration::from_millis;
        for (bytes, waited) in [(DEFER_MAX_BYTES, ms(0)), (0, DEFER_MAX_TIME)] {
            let mut p = Pacer::default();
            assert!(
                !p.wait(100, ms(5), bytes, waited),
                "the bound ends the wait"
            );
            // The next layers, still under load and with room: no waiting, not even looks.
            assert!(!p.looks());
            assert!(!p.wait(100, ms(5), 0, ms(0)));
            // A pause with a big memtable (writes waiting for room look like one) changes
            // nothing; a pause once it has caught up does.
            p.quiet(SMALL, SMALL);
            assert!(!p.looks());
            p.quiet(SMALL - 1, SMALL);
            assert!(p.looks());
            assert!(
                p.wait(100, ms(5), 0, ms(0)),
                "a new burst is waited out again"
            );
        }
    }

    #[test]
    fn a_write_waiting_for_room_means_sustained_load() {
        let ms = Duration::from_millis;
        let mut p = Pacer::default();
        p.pressed();
        assert!(!p.looks());
        assert!(!p.wait(100, ms(5), 0, ms(0)));
    }

    #[test]
    fn admission_slows_evenly_from_the_soft_mark_and_is_full_only_at_the_hard_bound() {
        let ms = Duration::from_millis;
        assert_eq!(admit(0), Admit::Now);
        assert_eq!(admit(ADMIT_SOFT_BYTES - 1), Admit::Now);
        assert_eq!(admit(ADMIT_SOFT_BYTES), Admit::Now);
        let mid = (ADMIT_SOFT_BYTES + ADMIT_KNEE_BYTES) / 2;
        assert_eq!(admit(mid), Admit::After(ms(25)));
        assert_eq!(admit(ADMIT_KNEE_BYTES), Admit::After(ADMIT_DELAY_MAX));
        assert_eq!(admit(ADMIT_FULL_BYTES - 1), Admit::After(ADMIT_DELAY_MAX));
        assert_eq!(admit(ADMIT_FULL_BYTES), Admit::Full);
        // Monotone and never past the bound, byte by byte over a coarse grid.
        let mut last = Duration::ZERO;
        for a in (0..ADMIT_FULL_BYTES).step_by(4093) {
            let d = match admit(a) {
                Admit::Now => Duration::ZERO,
                Admit::After(d) => d,
                Admit::Full => panic!("full at {a}"),
            };
            assert!(d >= last && d <= ADMIT_DELAY_MAX, "{a}: {d:?}");
            last = d;
        }
    }
}
