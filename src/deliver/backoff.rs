//! Backoff between attempts of one message. Pure and deterministic: the "random" jitter comes
//! from a seed mixed with the delivery key and attempt number, so tests can predict it and a
//! restart computes the same delay.

use crate::model::{Backoff, RetryPolicy};

/// Delay before attempt `attempt + 1`, given that `attempt` (1-based) attempts were made.
///
/// Fixed: `initial`. Exponential: full jitter, uniform in `[0, min(max, initial * 2^(attempt-1))]`
/// (AWS's "full jitter": spreads retries of many messages so they do not arrive together).
pub fn retry_delay_ms(policy: &RetryPolicy, attempt: u32, seed: u64, key: &str) -> u64 {
    match policy.backoff {
        Backoff::Fixed => policy.initial_ms,
        Backoff::Exponential => {
            let shift = attempt.saturating_sub(1).min(62);
            let ceiling = policy
                .initial_ms
                .saturating_mul(1u64 << shift)
                .min(policy.max_ms);
            let r = splitmix64(seed ^ fnv1a(key) ^ u64::from(attempt).wrapping_mul(0x9E37));
            if ceiling == u64::MAX {
                r
            } else {
                r % (ceiling + 1)
            }
        }
    }
}

/// The most a held send's wake-up is spread past the end of its hold ([`hold_wake_ms`]): the
/// breaker's look again while its probe is out (`breaker.rs`, `PROBE_RECHECK_MS_MAX`).
pub const HOLD_SPREAD_MAX_MS: u64 = 1_000;

/// When a send held at `now_ms` until `until_ms` (an open breaker, a rate limit) comes back:
/// `until_ms` plus a jitter in `[0, min((until_ms - now_ms) / 4, HOLD_SPREAD_MAX_MS)]`, from
/// `seed`, `key` (the send's own) and `until_ms`, so the sends one breaker or one rate limit
/// holds until the same instant wake spread over up to a second instead of all at once (each
/// locks its task and asks the channel again; all but one are held again).
///
/// Bounded by a quarter of the hold: a short hold (a rate limit's next slot some ms away)
/// stays short, so a lone sequence held by a channel's rate waits on average an eighth of a
/// hold longer; and never before `until_ms` (it could not go then).
pub fn hold_wake_ms(now_ms: u64, until_ms: u64, seed: u64, key: &str) -> u64 {
    let bound = (until_ms.saturating_sub(now_ms) / 4).min(HOLD_SPREAD_MAX_MS);
    if bound == 0 {
        return until_ms;
    }
    let r = splitmix64(seed ^ fnv1a(key) ^ until_ms.wrapping_mul(0x9E37_79B9));
    until_ms.saturating_add(r % (bound + 1))
}

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(initial_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            backoff: Backoff::Exponential,
            initial_ms,
            max_ms,
        }
    }

    #[test]
    fn a_held_send_wakes_within_its_bound_and_never_before_its_hold_ends() {
        let now = 1_800_000_000_000;
        for hold in [0, 1, 3, 4, 40, 399, 4_000, 4_004, 60_000, u64::MAX - now] {
            let until = now + hold;
            let bound = (hold / 4).min(HOLD_SPREAD_MAX_MS);
            for key in ["a:1:0", "a:1:1", "b:2:3", ""] {
                let at = hold_wake_ms(now, until, 9, key);
                assert!(at >= until, "hold {hold}: woke at {at}, before {until}");
                assert!(
                    at - until <= bound,
                    "hold {hold}: {} past {bound}",
                    at - until
                );
                assert_eq!(at, hold_wake_ms(now, until, 9, key), "deterministic");
            }
        }
        // A hold that ended already (or never began) wakes at once: no jitter.
        assert_eq!(hold_wake_ms(now, now - 5, 9, "k"), now - 5);
        assert_eq!(hold_wake_ms(now, now + 3, 9, "k"), now + 3);
    }

    #[test]
    fn sends_held_to_one_instant_wake_spread_over_the_bound() {
        let now = 1_000_000;
        let until = now + 30_000; // a breaker's cool-down
        let wakes: std::collections::BTreeSet<u64> = (0..1_000)
            .map(|i| hold_wake_ms(now, until, 7, &format!("t{i}:1:0")))
            .collect();
        assert!(
            wakes.len() > 500,
            "spread: {} distinct instants",
            wakes.len()
        );
        let (first, last) = (*wakes.first().unwrap(), *wakes.last().unwrap());
        assert!(first < until + 100 && last > until + HOLD_SPREAD_MAX_MS - 100);
        assert!(last <= until + HOLD_SPREAD_MAX_MS);
    }

    #[test]
    fn fixed_is_constant() {
        let p = RetryPolicy {
            backoff: Backoff::Fixed,
            initial_ms: 700,
            ..RetryPolicy::default()
        };
        assert_eq!(retry_delay_ms(&p, 1, 1, "k"), 700);
        assert_eq!(retry_delay_ms(&p, 9, 2, "k"), 700);
    }

    #[test]
    fn exponential_stays_under_the_growing_cap_and_is_deterministic() {
        let p = exp(100, 1_000);
        for attempt in 1..20 {
            let cap = (100u64 << (attempt - 1).min(62)).min(1_000);
            for key in ["a:1:0", "a:1:1", "b:2:3"] {
                let d = retry_delay_ms(&p, attempt, 42, key);
                assert!(d <= cap, "attempt {attempt}: {d} > {cap}");
                assert_eq!(d, retry_delay_ms(&p, attempt, 42, key));
            }
        }
        // Jitter actually spreads: 100 keys do not all get the same delay.
        let delays: std::collections::BTreeSet<u64> = (0..100)
            .map(|i| retry_delay_ms(&p, 4, 7, &format!("t:1:{i}")))
            .collect();
        assert!(delays.len() > 50, "{delays:?}");
        // Extreme values neither overflow nor panic.
        let _ = retry_delay_ms(&exp(u64::MAX, u64::MAX), 64, 1, "k");
    }
}
