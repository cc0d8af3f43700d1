//! Time sources. Everything inside herald is UTC milliseconds since the Unix epoch (`u64`).
//!
//! The engine never calls `SystemTime::now()` directly: it asks a [`Clock`], so tests can
//! drive time by hand with [`ManualClock`] and never wait for real time to pass.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" in Unix milliseconds. Wheel ticks are these milliseconds: instants are
/// integers already, so a deadline never needs rounding to a tick (a fractional deadline would
/// have to round *up*: an entry must never fire early).
///
/// Invariant: `now_ms` never goes backwards for one clock value. A system clock that steps back
/// (NTP) is clamped to the last value it returned, so deadlines computed from it stay ordered.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
    /// True for clocks that only move when a test moves them; the timer thread then waits for a
    /// wake-up command instead of sleeping until a deadline in real time.
    fn is_manual(&self) -> bool {
        false
    }
}

/// The wall clock, clamped so it never runs backwards.
#[derive(Default)]
pub struct SystemClock {
    last: AtomicU64,
}

impl SystemClock {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let raw = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        // fetch_max returns the previous maximum; the clamped value is the max of both.
        let prev = self.last.fetch_max(raw, Ordering::AcqRel);
        prev.max(raw)
    }
}

/// A clock that moves only when told to. Starts at the given instant.
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: AtomicU64::new(start_ms),
        }
    }
    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::AcqRel);
    }
    /// Sets the clock; a value in the past is ignored (time never goes backwards).
    pub fn set(&self, ms: u64) {
        self.now.fetch_max(ms, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
    fn is_manual(&self) -> bool {
        true
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
}
