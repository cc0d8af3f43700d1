//! Engine figures for `/metrics` that are not plain counters: the fire-lateness histogram.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (ms) of the lateness buckets; the last bucket is +Inf.
pub const LATENESS_BOUNDS_MS: [u64; 12] = [0, 1, 2, 5, 10, 25, 50, 100, 250, 1_000, 5_000, 60_000];

/// Cumulative-on-render histogram of how late sends start: from the instant the schedule
/// (or pacing) planned a message to the instant its attempt starts.
#[derive(Default)]
pub struct Lateness {
    /// One count per bound, plus +Inf.
    buckets: [AtomicU64; LATENESS_BOUNDS_MS.len() + 1],
    sum_ms: AtomicU64,
    count: AtomicU64,
}

impl Lateness {
    pub fn observe(&self, late_ms: u64) {
        let i = LATENESS_BOUNDS_MS
            .iter()
            .position(|b| late_ms <= *b)
            .unwrap_or(LATENESS_BOUNDS_MS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(late_ms, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// (upper bound in ms or `None` for +Inf, cumulative count), then sum and count.
    pub fn snapshot(&self) -> (Vec<(Option<u64>, u64)>, u64, u64) {
        let mut acc = 0;
        let mut rows = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            acc += b.load(Ordering::Relaxed);
            rows.push((LATENESS_BOUNDS_MS.get(i).copied(), acc));
        }
        (
            rows,
            self.sum_ms.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_inf_counts_all() {
        let h = Lateness::default();
        for l in [0, 1, 3, 7, 70_000] {
            h.observe(l);
        }
        let (rows, sum, count) = h.snapshot();
        assert_eq!(rows[0], (Some(0), 1));
        assert_eq!(rows[1], (Some(1), 2));
        assert_eq!(rows[3], (Some(5), 3));
        assert_eq!(rows[4], (Some(10), 4));
        assert_eq!(rows.last(), Some(&(None, 5)));
        assert_eq!((sum, count), (70_011, 5));
    }
}
