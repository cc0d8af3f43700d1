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
