//! Time sources. Everything inside herald is UTC milliseconds since the Unix epoch (`u64`).
//!
//! The engine never calls `SystemTime::now()` directly: it asks a [`Clock`], so tests can
//! drive time by hand with [`ManualClock`] and never wait for real time to pass.
//!
//! Two readings: `now_ms` is the wall clock, for instants a user named (schedules);
//! `mono_ms` is the monotonic clock, for durations (rate-limit windows, breaker cool-downs,
//! pacing gaps, backoff: `engine/timer.rs` holds every run step to both). A wall clock that
//! jumps (NTP step, VM migration, laptop resume) moves `now_ms` only, so a jump can neither
//! shorten a gap nor empty a rate-limit window.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A wall clock moving this much more than the monotonic clock, between two readings, is a
/// jump (logged, counted, and judged like an outage for misfire). NTP slews far slower
/// (at most 0.5 ms/s), so only steps reach it.
pub const WALL_JUMP_MS: u64 = 5_000;

/// A source of "now" in Unix milliseconds. Wheel ticks are these milliseconds: instants are
/// integers already, so a deadline never needs rounding to a tick (a fractional deadline would
/// have to round *up*: an entry must never fire early).
///
/// Invariant: `now_ms` never goes backwards for one clock value. A system clock that steps back
/// (NTP) is clamped to the last value it returned, so deadlines computed from it stay ordered.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
    /// Monotonic milliseconds for measuring durations: never jumps, shares `now_ms`'s origin
    /// at start. Only differences between two readings mean anything.
    fn mono_ms(&self) -> u64 {
        self.now_ms()
    }
    /// Forward wall jumps of the clock `now_ms` reads, seen so far ([`WALL_JUMP_MS`] or
    /// more): what fires are judged by (`engine/step.rs`).
    fn wall_jumps(&self) -> WallJumps {
        WallJumps::default()
    }
    /// The jumps and steps back of this node's own wall clock, for `/metrics`. The same as
    /// [`Clock::wall_jumps`] but under [`OffsetClock`], whose database time does not follow
    /// the node's wall while the node's wall still may jump.
    fn node_wall_jumps(&self) -> WallJumps {
        self.wall_jumps()
    }
    /// True for clocks that only move when a test moves them; the timer thread then waits for a
    /// wake-up command instead of sleeping until a deadline in real time.
    fn is_manual(&self) -> bool {
        false
    }
}

/// How many forward jumps [`WallJumps`] keeps apart for [`WallJumps::jumped_after`].
const RECENT_JUMPS: usize = 8;

/// One forward jump: the wall instant it ended at and its size (0: an empty slot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Jump {
    end_ms: u64,
    size_ms: u64,
}

/// What a clock knows of wall jumps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallJumps {
    /// How many forward jumps so far.
    pub count: u64,
    /// The wall instant the last one ended at (0: none). Fires due before it were jumped
    /// over: judged like an outage (`engine/dispatch.rs`).
    pub end_ms: u64,
    /// The last one's size: how much more the wall moved than the monotonic clock.
    pub size_ms: u64,
    /// How many steps back ([`WALL_JUMP_MS`] or more) so far (`herald_wall_clock_steps_back`).
    pub back_count: u64,
    /// The last forward jumps, oldest first, empty slots last.
    recent: [Jump; RECENT_JUMPS],
}

impl WallJumps {
    /// Notes a forward jump of `size_ms` that ended at wall instant `end_ms`.
    fn record(&mut self, end_ms: u64, size_ms: u64) {
        self.count += 1;
        self.end_ms = self.end_ms.max(end_ms);
        self.size_ms = size_ms;
        // Full: the two oldest become one (the later end, both sizes), so a fire due between
        // them is given the older's size too: more grace, never less than the jumps took.
        if self.recent.iter().all(|j| j.size_ms > 0) {
            let [a, b, ..] = &mut self.recent;
            b.size_ms = b.size_ms.saturating_add(a.size_ms);
            *a = Jump::default();
            self.recent.rotate_left(1);
        }
        if let Some(slot) = self.recent.iter_mut().find(|j| j.size_ms == 0) {
            *slot = Jump { end_ms, size_ms };
        }
    }

    /// How far the wall jumped after `due_ms`: the sizes of the jumps that ended after it
    /// summed. A fire due then looks that much later than it is; the jumped span is not
    /// lateness (`engine/step.rs` adds it to the misfire grace). Two quick jumps (+1 h, then
    /// +6 s) count both, where the last one's size alone left the hour as lateness.
    pub fn jumped_after(&self, due_ms: u64) -> u64 {
        self.recent
            .iter()
            .filter(|j| j.end_ms > due_ms)
            .fold(0, |sum, j| sum.saturating_add(j.size_ms))
    }

    /// A task's `misfire_grace_ms` for a fire due at `due_ms`, with what the wall jumped
    /// after it added ([`WallJumps::jumped_after`]).
    pub fn grace_ms(&self, due_ms: u64, misfire_grace_ms: u64) -> u64 {
        misfire_grace_ms.saturating_add(self.jumped_after(due_ms))
    }
}

/// The wall clock, clamped so it never runs backwards, beside the monotonic clock; it notices
/// wall jumps ([`WALL_JUMP_MS`]).
pub struct SystemClock {
    last: AtomicU64,
    start: Instant,
    start_wall_ms: u64,
    /// Wall minus monotonic at the last reading (follows slow drift; a jump moves it at once).
    offset_ms: AtomicI64,
    jumps: parking_lot::Mutex<WallJumps>,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SystemClock {
    pub fn new() -> Self {
        let start_wall_ms = wall_ms();
        SystemClock {
            last: AtomicU64::new(0),
            start: Instant::now(),
            start_wall_ms,
            offset_ms: AtomicI64::new(0),
            jumps: parking_lot::Mutex::new(WallJumps::default()),
        }
    }

    /// Notes a jump if the wall moved [`WALL_JUMP_MS`] more (or less) than the monotonic
    /// clock since the last reading.
    fn watch(&self, raw: u64, mono: u64) {
        let offset = raw as i64 - mono as i64;
        // Most readings: the offset moved by rounding and slew only. A plain load keeps the
        // hot path free of a shared write; a drift past 1 s is taken in (not a jump).
        if (offset - self.offset_ms.load(Ordering::Acquire)).abs() <= 1_000 {
            return;
        }
        let prev = self.offset_ms.swap(offset, Ordering::AcqRel);
        let moved = offset - prev;
        if moved >= WALL_JUMP_MS as i64 {
            self.jumps.lock().record(raw, moved.unsigned_abs());
            tracing::warn!(jump_ms = moved, to = %crate::schedule::format_utc(raw),
                "the wall clock jumped forward: fires due in the jumped-over span are judged like an outage (misfire policy), durations keep to the monotonic clock");
        } else if moved <= -(WALL_JUMP_MS as i64) {
            self.jumps.lock().back_count += 1;
            tracing::warn!(jump_ms = moved,
                "the wall clock stepped back: herald's clock holds still until it catches up (nothing early, nothing twice)");
        }
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let raw = wall_ms();
        self.watch(raw, self.mono_ms());
        // A reading at or below `last` (within a millisecond, or the wall stepped back) is
        // answered with `last`: a plain load then, no shared write
        // (an unconditional `fetch_max` bounced this cache line between the workers and the
        // timer thread on every call, ~5 % of the workers' samples in a herd). fetch_max
        // returns the previous maximum; the clamped value is the max of both.
        let last = self.last.load(Ordering::Acquire);
        if raw <= last {
            return last;
        }
        let prev = self.last.fetch_max(raw, Ordering::AcqRel);
        prev.max(raw)
    }

    fn mono_ms(&self) -> u64 {
        self.start_wall_ms
            .saturating_add(self.start.elapsed().as_millis() as u64)
    }

    fn wall_jumps(&self) -> WallJumps {
        *self.jumps.lock()
    }
}

/// Measures durations on a [`Clock`]'s monotonic reading beside the wall `now` a caller has.
/// Without a clock (pure tests, tools) the wall `now` is the monotonic reading too.
#[derive(Clone, Default)]
pub struct Durations(Option<Arc<dyn Clock>>);

impl std::fmt::Debug for Durations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Durations(clock)"
        } else {
            "Durations(wall)"
        })
    }
}

impl Durations {
    pub fn of(clock: Arc<dyn Clock>) -> Durations {
        Durations(Some(clock))
    }

    /// The monotonic reading to measure with, given the caller's wall `now`.
    pub fn mono(&self, wall_now: u64) -> u64 {
        self.0.as_ref().map_or(wall_now, |c| c.mono_ms())
    }

    /// The wall instant at which monotonic instant `at` comes, seen from a reading
    /// (`wall_now`, `mono_now`): the remaining duration added to the wall.
    pub fn wall_at(wall_now: u64, mono_now: u64, at: u64) -> u64 {
        wall_now.saturating_add(at.saturating_sub(mono_now))
    }
}

/// A clock that moves only when told to. Starts at the given instant.
/// Wall and monotonic time move together unless a test jumps the wall alone.
pub struct ManualClock {
    now: AtomicU64,
    mono: AtomicU64,
    jumps: parking_lot::Mutex<WallJumps>,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: AtomicU64::new(start_ms),
            mono: AtomicU64::new(start_ms),
            jumps: parking_lot::Mutex::new(WallJumps::default()),
        }
    }
    /// Moves the clock forward by `ms` (wall and monotonic).
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::AcqRel);
        self.mono.fetch_add(ms, Ordering::AcqRel);
    }
    /// Sets the clock; a value in the past is ignored (time never goes backwards). The
    /// monotonic clock moves as far.
    pub fn set(&self, ms: u64) {
        let prev = self.now.fetch_max(ms, Ordering::AcqRel);
        self.mono
            .fetch_add(ms.saturating_sub(prev), Ordering::AcqRel);
    }
    /// The wall clock alone jumps forward by `ms` (an NTP step, a resumed VM); counted as a
    /// jump when it is at least [`WALL_JUMP_MS`].
    pub fn jump_wall(&self, ms: u64) {
        let to = self.now.fetch_add(ms, Ordering::AcqRel) + ms;
        if ms >= WALL_JUMP_MS {
            self.jumps.lock().record(to, ms);
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
    fn mono_ms(&self) -> u64 {
        self.mono.load(Ordering::Acquire)
    }
    fn wall_jumps(&self) -> WallJumps {
        *self.jumps.lock()
    }
    fn is_manual(&self) -> bool {
        true
    }
}

/// [`OffsetClock`]'s offset before the lease loop's first acceptable measurement.
pub const NOT_MEASURED: i64 = i64::MIN;

/// Database time for cluster mode (HA.md "Time": the wheel fires at database time): another
/// clock's MONOTONIC reading plus the offset to the database the lease loop last measured
/// (`cluster/node.rs`: database minus that same clock's `mono_ms` at a probe's midpoint).
/// Durations stay on the inner monotonic clock.
///
/// Why monotonic: a step of the node's wall clock (`date -s`, a VM snapshot restored, chrony's
/// makestep) must not move database time. Read off the wall, a +1 h step handed the wheel
/// every fire of the next hour at once (one-shots up to 1 h early, crons judged jumped over)
/// while the node still held its leases, until the next measurement refused its shards. The
/// wall offset is still measured and judged against `max_clock_offset` (the refusal); it only
/// no longer feeds this clock. Hence [`Clock::wall_jumps`] is empty here: database time did
/// not jump (the node's own wall jumps stay in [`Clock::node_wall_jumps`]).
///
/// `mono_ms` is epoch-anchored on both clocks ([`SystemClock`]: its wall at start plus the
/// time elapsed since; [`ManualClock`]: its start plus every advance), so before the first
/// measurement ([`NOT_MEASURED`]) the reading is `inner.mono_ms()`: the wall as it was at
/// start, moved by elapsed time, which is what the wall read then unless it jumped. (Reading
/// the wall itself until then left a jump before the first measurement in the clock: held
/// still, never back, for as long as the jump, once the measurement came.)
///
/// Invariant kept: `now_ms` never goes backwards. A new measurement that lowers the offset
/// holds the reading still until it catches up (as a stepped-back wall clock does); one that
/// raises it moves it forward by what database time gained on the node's monotonic clock
/// since the last one (a measurement is taken only while the node's wall is within
/// `max_clock_offset`, so the first one moves it by at most that).
pub struct OffsetClock {
    inner: Arc<dyn Clock>,
    mono_offset_ms: Arc<AtomicI64>,
    /// The highest reading given: shared with the lease loop ([`held_ahead_ms`]).
    last: Arc<AtomicU64>,
}

impl OffsetClock {
    /// `mono_offset_ms` (database minus `inner.mono_ms()`, [`NOT_MEASURED`] at first) is
    /// shared with whoever measures it (the lease loop's `Ownership`).
    pub fn new(inner: Arc<dyn Clock>, mono_offset_ms: Arc<AtomicI64>) -> OffsetClock {
        OffsetClock::sharing(inner, mono_offset_ms, Arc::new(AtomicU64::new(0)))
    }

    /// As [`OffsetClock::new`], its highest reading kept in `last`, which the lease loop
    /// reads too ([`held_ahead_ms`]).
    pub fn sharing(
        inner: Arc<dyn Clock>,
        mono_offset_ms: Arc<AtomicI64>,
        last: Arc<AtomicU64>,
    ) -> OffsetClock {
        OffsetClock {
            inner,
            mono_offset_ms,
            last,
        }
    }
}

/// How far an [`OffsetClock`] whose highest reading was `last` is held ahead of database time
/// (`mono_ms` of its inner clock plus `mono_offset_ms`, a measurement's). A node started with
/// its wall ahead of the database read that wall (`mono_ms` is anchored to it) until its first
/// acceptable measurement; once its wall is stepped back, the measurement is acceptable, but
/// the clock, which never goes back, stays ahead until database time catches up: fires due
/// in between would go early. The lease loop takes no shards while this exceeds
/// `max_clock_offset` (`cluster/node.rs`, `judge_clock`).
pub fn held_ahead_ms(last: u64, mono_ms: u64, mono_offset_ms: i64) -> u64 {
    let db = if mono_offset_ms >= 0 {
        mono_ms.saturating_add(mono_offset_ms.unsigned_abs())
    } else {
        mono_ms.saturating_sub(mono_offset_ms.unsigned_abs())
    };
    last.saturating_sub(db)
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> u64 {
        let mono = self.inner.mono_ms();
        let off = self.mono_offset_ms.load(Ordering::Acquire);
        let t = if off == NOT_MEASURED {
            mono
        } else if off >= 0 {
            mono.saturating_add(off.unsigned_abs())
        } else {
            mono.saturating_sub(off.unsigned_abs())
        };
        let prev = self.last.fetch_max(t, Ordering::AcqRel);
        prev.max(t)
    }
    fn mono_ms(&self) -> u64 {
        self.inner.mono_ms()
    }
    fn wall_jumps(&self) -> WallJumps {
        WallJumps::default()
    }
    fn node_wall_jumps(&self) -> WallJumps {
        self.inner.wall_jumps()
    }
    fn is_manual(&self) -> bool {
        self.inner.is_manual()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::new(1_000);
        c.advance(5);
        assert_eq!(c.now_ms(), 1_005);
        c.set(10);
        assert_eq!(c.now_ms(), 1_005);
        c.set(2_000);
        assert_eq!(c.now_ms(), 2_000);
        assert!(c.is_manual());
        assert_eq!(c.mono_ms(), 2_000);
        c.jump_wall(3_600_000);
        assert_eq!((c.now_ms(), c.mono_ms()), (3_602_000, 2_000));
        let j = c.wall_jumps();
        assert_eq!((j.count, j.end_ms, j.size_ms), (1, 3_602_000, 3_600_000));
    }

    #[test]
    fn durations_convert_a_monotonic_instant_to_the_wall() {
        assert_eq!(Durations::wall_at(10_000, 500, 2_500), 12_000);
        assert_eq!(Durations::wall_at(10_000, 500, 100), 10_000, "past: now");
        let d = Durations::default();
        assert_eq!(d.mono(42), 42);
    }

    #[test]
    fn system_clock_is_monotonic_and_plausible() {
        let c = SystemClock::new();
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a);
        // After 2020-01-01 and before 2100-01-01.
        assert!(a > 1_577_836_800_000 && a < 4_102_444_800_000);
    }

    #[test]
    fn offset_clock_reads_database_time_and_never_goes_back() {
        let inner = Arc::new(ManualClock::new(10_000));
        let off = Arc::new(AtomicI64::new(NOT_MEASURED));
        let c = OffsetClock::new(inner.clone(), off.clone());
        assert_eq!(c.now_ms(), 10_000, "not measured yet: the node's own time");
        off.store(300, Ordering::Release);
        assert_eq!(
            c.now_ms(),
            10_300,
            "the database is 300 ms ahead of the node"
        );
        off.store(-200, Ordering::Release);
        assert_eq!(c.now_ms(), 10_300, "a lower offset holds still, never back");
        inner.advance(600);
        assert_eq!(c.now_ms(), 10_400);
        assert_eq!(
            c.mono_ms(),
            10_600,
            "durations stay on the node's monotonic clock"
        );
        assert!(c.is_manual());
    }

    /// Finding: database time followed a step of the node's wall clock at once (a +1 h step
    /// handed over every fire of the next hour before the next measurement refused the node).
    #[test]
    fn offset_clock_does_not_follow_a_wall_jump() {
        let inner = Arc::new(ManualClock::new(10_000));
        let off = Arc::new(AtomicI64::new(300));
        let c = OffsetClock::new(inner.clone(), off.clone());
        assert_eq!(c.now_ms(), 10_300);
        inner.jump_wall(3_600_000);
        assert_eq!(
            c.now_ms(),
            10_300,
            "the node's wall jumped, the database's did not"
        );
        assert_eq!(
            c.wall_jumps(),
            WallJumps::default(),
            "no jump in database time"
        );
        assert_eq!(
            c.node_wall_jumps().count,
            1,
            "the node's own jump, for /metrics"
        );
        inner.advance(1_000);
        assert_eq!(c.now_ms(), 11_300, "time still passes");
        off.store(500, Ordering::Release);
        assert_eq!(c.now_ms(), 11_500, "a new measurement moves it as before");
        inner.jump_wall(3_600_000);
        off.store(450, Ordering::Release);
        assert_eq!(c.now_ms(), 11_500, "nor a jump after one, and never back");
    }

    /// Finding: a node started with its wall an hour ahead read that hour until its first
    /// acceptable measurement; after its wall was stepped back the measurement was
    /// acceptable and the node took shards while its clock, never going back, stayed an hour
    /// ahead: one-shots of that hour went early. The lease loop now sees how far it is held.
    #[test]
    fn a_clock_started_ahead_is_held_ahead_after_its_wall_is_stepped_back() {
        let hour = 3_600_000;
        // The node's wall (and so its monotonic anchor) an hour ahead of the database's.
        let inner = Arc::new(ManualClock::new(hour + 10_000));
        let off = Arc::new(AtomicI64::new(NOT_MEASURED));
        let last = Arc::new(AtomicU64::new(0));
        let c = OffsetClock::sharing(inner.clone(), off.clone(), last.clone());
        assert_eq!(
            c.now_ms(),
            hour + 10_000,
            "not measured: the node's own time"
        );
        // Stepped back; the database is at 10 000 on the node's monotonic hour + 10 000.
        off.store(-(hour as i64), Ordering::Release);
        assert_eq!(c.now_ms(), hour + 10_000, "never back: held");
        let held = held_ahead_ms(
            last.load(Ordering::Acquire),
            inner.mono_ms(),
            -(hour as i64),
        );
        assert_eq!(held, hour);
        inner.advance(hour);
        assert_eq!(c.now_ms(), hour + 10_000, "caught up");
        let held = held_ahead_ms(
            last.load(Ordering::Acquire),
            inner.mono_ms(),
            -(hour as i64),
        );
        assert_eq!(held, 0, "caught up: no longer held");
        assert_eq!(held_ahead_ms(5, 10, 3), 0);
        assert_eq!(held_ahead_ms(u64::MAX, 0, i64::MIN + 1), u64::MAX);
    }

    #[test]
    fn offset_clock_before_its_first_measurement_ignores_a_jump_too() {
        let inner = Arc::new(ManualClock::new(10_000));
        let off = Arc::new(AtomicI64::new(NOT_MEASURED));
        let c = OffsetClock::new(inner.clone(), off.clone());
        inner.jump_wall(3_600_000);
        assert_eq!(c.now_ms(), 10_000);
        off.store(-100, Ordering::Release);
        inner.advance(200);
        assert_eq!(
            c.now_ms(),
            10_100,
            "the first measurement is not held up by the jump"
        );
    }

    /// Finding: only the last jump's size was kept, so after +1 h and +6 s in quick
    /// succession a fire due before both was an hour late against a grace of 6 s.
    #[test]
    fn quick_jumps_add_up_for_a_fire_due_before_them() {
        let c = ManualClock::new(1_000_000);
        c.jump_wall(3_600_000);
        c.advance(2_000);
        c.jump_wall(6_000);
        let j = c.wall_jumps();
        assert_eq!((j.count, j.size_ms), (2, 6_000));
        assert_eq!(j.jumped_after(999_999), 3_606_000, "due before both");
        assert_eq!(j.jumped_after(4_601_000), 6_000, "due between them");
        assert_eq!(j.jumped_after(j.end_ms), 0, "due after both");
        assert_eq!(j.grace_ms(999_999, 60_000), 3_666_000);
        assert_eq!(WallJumps::default().jumped_after(0), 0);
    }

    #[test]
    fn many_jumps_keep_their_total_for_old_fires() {
        let c = ManualClock::new(0);
        for _ in 0..20 {
            c.jump_wall(10_000);
            c.advance(1_000);
        }
        let j = c.wall_jumps();
        assert_eq!(j.count, 20);
        assert_eq!(j.jumped_after(0), 200_000, "merged, never lost");
        assert_eq!(j.jumped_after(j.end_ms - 1), 10_000, "the last one alone");
    }

    #[test]
    fn a_system_clock_counts_its_steps_back() {
        let c = SystemClock::new();
        c.watch(1_000_000, 1_000_000);
        c.watch(990_000, 1_000_500);
        let j = c.wall_jumps();
        assert_eq!((j.back_count, j.count), (1, 0));
        c.watch(1_000_000, 1_001_000);
        assert_eq!(c.wall_jumps().count, 1, "the way back up is a forward jump");
        c.watch(1_001_100, 1_001_100);
        assert_eq!(
            c.wall_jumps().back_count,
            1,
            "slew and rounding are no step"
        );
    }
}
