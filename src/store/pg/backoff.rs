//! How often herald tries the database again while it cannot reach it. Pure: the caller
//! hands in the instant.
//!
//! Why: while the server is down every call (the heal thread's probe every 500 ms, the
//! engine's reads, each API read) would open a new connection attempt, and a server coming
//! back up meets a storm of them. After a connection failure calls fail at once for a delay
//! that doubles from [`FIRST`] up to [`MAX`]; the first call after it tries for real, and a
//! success forgets the failures. [`MAX`] bounds how long herald may stay down after the
//! server is back.

use std::time::{Duration, Instant};

/// The wait after the first failure.
pub const FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two attempts.
pub const MAX: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
pub struct Backoff {
    /// Connection failures in a row.
    fails: u32,
    /// No attempt before this.
    until: Option<Instant>,
    /// The last failure, for the calls refused meanwhile.
    why: String,
}

impl Backoff {
    /// The wait after `fails` failures in a row.
    pub fn delay(fails: u32) -> Duration {
        let doublings = fails.saturating_sub(1).min(16);
        (FIRST * (1u32 << doublings)).min(MAX)
    }

    /// `Some((time left, last failure))` while calls must not try yet.
    pub fn holding(&self, now: Instant) -> Option<(Duration, &str)> {
        match self.until {
            Some(t) if now < t => Some((t - now, &self.why)),
            _ => None,
        }
    }

    pub fn failed(&mut self, now: Instant, why: &str) {
        self.fails = self.fails.saturating_add(1);
        self.until = Some(now + Backoff::delay(self.fails));
        self.why = why.to_string();
    }

    pub fn succeeded(&mut self) {
        self.fails = 0;
        self.until = None;
    }

    pub fn fails(&self) -> u32 {
        self.fails
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_up_to_its_bound() {
        assert_eq!(Backoff::delay(1), FIRST);
        assert_eq!(Backoff::delay(2), FIRST * 2);
        assert_eq!(Backoff::delay(3), FIRST * 4);
        assert_eq!(Backoff::delay(30), MAX);
        assert_eq!(Backoff::delay(u32::MAX), MAX);
    }

    #[test]
    fn calls_wait_after_a_failure_and_a_success_forgets_it() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.holding(t0).is_none());
        b.failed(t0, "refused");
        let (left, why) = b.holding(t0).unwrap();
        assert_eq!((left, why), (FIRST, "refused"));
        assert!(
            b.holding(t0 + FIRST).is_none(),
            "the next attempt is allowed"
        );
        b.failed(t0 + FIRST, "refused");
        assert_eq!(b.holding(t0 + FIRST).unwrap().0, FIRST * 2);
        b.succeeded();
        assert_eq!(b.fails(), 0);
        assert!(b.holding(t0 + FIRST).is_none());
    }
}
