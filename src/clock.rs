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
    /// Forward wall jumps seen so far ([`WALL_JUMP_MS`] or more).
    fn wall_jumps(&self) -> WallJumps {
        WallJumps::default()
    }
    /// True for clocks that only move when a test moves them; the timer thread then waits for a
    /// wake-up command instead of sleeping until a deadline in real time.
    fn is_manual(&self) -> bool {
        false
    }
}

/// What a clock knows of forward wall jumps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallJumps {
    /// How many so far.
    pub count: u64,
    /// The wall instant the last one ended at (0: none). Fires due before it were jumped
    /// over: judged like an outage (`engine/dispatch.rs`).
    pub end_ms: u64,
    /// The last one's size: how much more the wall moved than the monotonic clock.
    pub size_ms: u64,
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
            {
                let mut j = self.jumps.lock();
                j.count += 1;
                j.end_ms = j.end_ms.max(raw);
                j.size_ms = moved as u64;
            }
            tracing::warn!(jump_ms = moved, to = %crate::schedule::format_utc(raw),
                "the wall clock jumped forward: fires due in the jumped-over span are judged like an outage (misfire policy), durations keep to the monotonic clock");
        } else if moved <= -(WALL_JUMP_MS as i64) {
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
            let mut j = self.jumps.lock();
            j.count += 1;
            j.end_ms = j.end_ms.max(to);
            j.size_ms = ms;
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

/// Database time for cluster mode (HA.md "Time": the wheel fires at database time): another
/// clock's wall reading plus the offset to the database the lease loop last measured
/// (`cluster/offset.rs`: database minus node). Durations stay on the inner monotonic clock.
///
/// Invariant kept: `now_ms` never goes backwards. A new measurement that lowers the offset
/// holds the reading still until it catches up (as a stepped-back wall clock does); one that
/// raises it moves it forward by at most `max_clock_offset` (a node further off owns nothing).
pub struct OffsetClock {
    inner: Arc<dyn Clock>,
    offset_ms: Arc<AtomicI64>,
    last: AtomicU64,
}

impl OffsetClock {
    /// `offset_ms` is shared with whoever measures it (the lease loop's `Ownership`).
    pub fn new(inner: Arc<dyn Clock>, offset_ms: Arc<AtomicI64>) -> OffsetClock {
        OffsetClock {
            inner,
            offset_ms,
            last: AtomicU64::new(0),
        }
    }
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> u64 {
        let raw = self.inner.now_ms();
        let off = self.offset_ms.load(Ordering::Acquire);
        let t = if off >= 0 {
            raw.saturating_add(off.unsigned_abs())
        } else {
            raw.saturating_sub(off.unsigned_abs())
        };
        let prev = self.last.fetch_max(t, Ordering::AcqRel);
        prev.max(t)
    }
    fn mono_ms(&self) -> u64 {
        self.inner.mono_ms()
    }
    fn wall_jumps(&self) -> WallJumps {
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
        let off = Arc::new(AtomicI64::new(0));
        let c = OffsetClock::new(inner.clone(), off.clone());
        assert_eq!(c.now_ms(), 10_000);
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
}
