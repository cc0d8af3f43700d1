//! How early a one-shot's fire is handled when many one-shots share its instant. Pure.
//!
//! A one-shot's fire (its run started and its first attempt armed, durably) is handled
//! [`ONE_SHOT_LEAD_MS`](super::dispatch::ONE_SHOT_LEAD_MS) before its instant, so that its
//! send leaves at the due millisecond. A herd (a notice to a whole list: 100 000 one-shots at
//! one instant) needs more: fires are handled at some tens of thousands per second, and a
//! fire not handled by the instant delays its send (and everything queued behind it). So each
//! one-shot counts itself in the second it is due, and the n-th one-shot of a second is fired
//! `n / FIRE_RATE_PER_S` earlier still: the herd's fires are spread ahead of the instant and
//! all of them are armed when it comes (the issue's "a herd is armed ahead; the arm lead may
//! grow with the backlog").
//!
//! Counts only grow (a cancelled or edited one-shot is not taken back out): an overestimate
//! fires a little earlier, which is harmless. Seconds in the past are forgotten, and the map
//! is bounded.
//!
//! The cost of a longer lead: a run armed before an outage that spans its instant is resumed
//! after the restart (its message may have left) rather than judged by `misfire_grace`; a
//! restart before the instant gives the armed attempt back (`cells::load`).

use std::collections::BTreeMap;

/// Fires per second the engine is assumed to handle while also sending. Measured on 2 cores:
/// ~25 000/s alone on sled. On PostgreSQL, at 10 000/s a herd of 100 000 had only 71 000 of
/// its fires armed at the instant (its reads slowed by a sequential-scan plan then, since
/// fixed: `store/pg/backend.rs`), and the other 29 000 queued behind the first sends'
/// settles; at 5 000/s every fire was armed by the instant, at the pace asked. Conservative,
/// so that a herd is armed in time on either store on a busier machine.
pub const FIRE_RATE_PER_S: u64 = 5_000;
/// The most a herd adds to a one-shot's lead.
pub const HERD_LEAD_MAX_MS: u64 = 30_000;
const BUCKET_MS: u64 = 1_000;
/// Seconds counted at most (~40 bytes each); past that, a new second adds no lead.
const BUCKETS_MAX: usize = 65_536;

/// One-shot fires counted per second they are due in.
#[derive(Debug, Default)]
pub struct HerdLeads {
    per_second: BTreeMap<u64, u32>,
}

impl HerdLeads {
    /// Counts a one-shot due at `due_ms` and returns how much earlier than the base lead its
    /// fire is handled: the one-shots counted before it in its second, at [`FIRE_RATE_PER_S`].
    pub fn extra_lead_ms(&mut self, due_ms: u64, now_ms: u64) -> u64 {
        let past = now_ms / BUCKET_MS;
        if self
            .per_second
            .first_key_value()
            .is_some_and(|(s, _)| *s < past)
        {
            self.per_second = self.per_second.split_off(&past);
        }
        let second = due_ms / BUCKET_MS;
        if !self.per_second.contains_key(&second) && self.per_second.len() >= BUCKETS_MAX {
            return 0;
        }
        let n = self.per_second.entry(second).or_default();
        let before = u64::from(*n);
        *n = n.saturating_add(1);
        (before * 1_000 / FIRE_RATE_PER_S).min(HERD_LEAD_MAX_MS)
    }

    /// Seconds counted.
    #[cfg(test)]
    pub fn seconds(&self) -> usize {
        self.per_second.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_herd_is_spread_ahead_of_its_instant_and_a_trickle_is_not() {
        let mut h = HerdLeads::default();
        let due = 1_000_000;
        let leads: Vec<u64> = (0..100_000).map(|_| h.extra_lead_ms(due, 0)).collect();
        assert_eq!(
            leads[0], 0,
            "the first one-shot of a second keeps the base lead"
        );
        assert_eq!(
            leads[99_999],
            99_999 * 1_000 / FIRE_RATE_PER_S,
            "100 000 at FIRE_RATE_PER_S: the last fires 100 000 / rate seconds earlier"
        );
        assert!(leads[99_999] >= 10_000, "{}", leads[99_999]);
        assert!(leads.windows(2).all(|w| w[0] <= w[1]));
        // One-shots spread one per second: no extra lead at all.
        let trickle: Vec<u64> = (0..100)
            .map(|i| h.extra_lead_ms(2_000_000 + i * 1_000, 0))
            .collect();
        assert!(trickle.iter().all(|l| *l == 0));
    }

    #[test]
    fn the_extra_lead_is_capped_and_past_seconds_are_forgotten() {
        let mut h = HerdLeads::default();
        let mut last = 0;
        for _ in 0..1_000_000 {
            last = h.extra_lead_ms(5_000, 0);
        }
        assert_eq!(last, HERD_LEAD_MAX_MS);
        h.extra_lead_ms(9_000, 0);
        assert_eq!(h.seconds(), 2);
        assert_eq!(
            h.extra_lead_ms(9_000, 6_000),
            100 / FIRE_RATE_PER_S,
            "second 5 is past"
        );
        assert_eq!(h.seconds(), 1);
    }

    #[test]
    fn the_map_is_bounded() {
        let mut h = HerdLeads::default();
        for s in 0..(BUCKETS_MAX as u64 + 10) {
            h.extra_lead_ms(s * 1_000, 0);
        }
        assert_eq!(h.seconds(), BUCKETS_MAX);
        for _ in 0..50_000 {
            assert_eq!(
                h.extra_lead_ms(u64::MAX - 1, 0),
                0,
                "a new second past the bound"
            );
        }
    }
}
