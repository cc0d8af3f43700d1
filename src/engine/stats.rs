//! Engine figures for `/metrics` beyond plain counters: the fire-lateness histogram, and a
//! census of unfinished tasks by state and of the failure list.
//!
//! The census comes from a scan of the `live` index and the failure list (memory does not know
//! the state of an unloaded task), so it is taken at most every [`Census::fresh_for`] and
//! cached: at a million tasks a scan takes seconds, and a scrape every 15 s must not turn into
//! a full scan every 15 s.

use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;

/// Upper bounds (seconds) of the lateness buckets (1 ms resolution near zero: the wheel's
/// tick); +Inf is added by the histogram.
pub const LATENESS_BOUNDS_S: [f64; 12] = [
    0.0, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 60.0,
];

/// How late sends start: from the instant the schedule (or pacing) planned a message to the
/// instant its attempt starts.
pub fn lateness_histogram() -> Histogram {
    Histogram::new(LATENESS_BOUNDS_S)
}

/// Unfinished tasks by state and the failure list's size, as of `taken_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Census {
    pub pending: u64,
    pub running: u64,
    pub paused: u64,
    pub failures: u64,
    pub taken_at: Instant,
    /// How long the scan took.
    pub took: Duration,
}

impl Census {
    /// A census stays good for 20 times what it took, and at least 10 s: the scans cost at
    /// most ~5 % of one core however large the store grows.
    pub fn fresh_for(&self) -> Duration {
        (self.took * 20).max(Duration::from_secs(10))
    }

    pub fn is_fresh(&self, now: Instant) -> bool {
        now.duration_since(self.taken_at) < self.fresh_for()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_census_is_kept_longer() {
        let t = Instant::now();
        let c = |took_ms| Census {
            pending: 0,
            running: 0,
            paused: 0,
            failures: 0,
            taken_at: t,
            took: Duration::from_millis(took_ms),
        };
        assert_eq!(c(1).fresh_for(), Duration::from_secs(10));
        assert_eq!(c(2_000).fresh_for(), Duration::from_secs(40));
        assert!(c(1).is_fresh(t + Duration::from_secs(9)));
        assert!(!c(1).is_fresh(t + Duration::from_secs(10)));
    }

    #[test]
    fn lateness_buckets_are_cumulative_in_seconds() {
        let h = lateness_histogram();
        for ms in [0u64, 1, 3, 7, 70_000] {
            h.observe(ms as f64 / 1000.0);
        }
        let mut text = String::new();
        let mut r = prometheus_client::registry::Registry::default();
        r.register("late_seconds", "x", h);
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).unwrap();
        assert!(text.contains("late_seconds_bucket{le=\"0\"} 1"), "{text}");
        assert!(
            text.contains("late_seconds_bucket{le=\"0.005\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("late_seconds_bucket{le=\"+Inf\"} 5"),
            "{text}"
        );
        assert!(text.contains("late_seconds_count 5"), "{text}");
    }
}
