//! What an HTTP answer means for a delivery (DESIGN.md, "Delivery semantics"). Pure.
//!
//! 2xx → sent. 429/503 with `Retry-After` → retry at that instant. 408, 425, 429, 5xx → retry
//! with backoff. Every other status (3xx not followed, other 4xx) → permanent failure.

use std::time::{Duration, UNIX_EPOCH};

use crate::model::Outcome;

/// Longest `Retry-After` we honour; a receiver asking for more is capped, not obeyed blindly.
pub const RETRY_AFTER_MS_MAX: u64 = 24 * 3_600_000;

/// Classifies a response. `retry_after` is the raw header value, `excerpt` a short piece of the
/// response body for the failure list.
pub fn classify(status: u16, retry_after: Option<&str>, excerpt: &str, now_ms: u64) -> Outcome {
    let error = if excerpt.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {excerpt}")
    };
    match status {
        200..=299 => Outcome::Sent,
        429 | 503 => Outcome::Retry {
            error,
            not_before_ms: retry_after.and_then(|v| parse_retry_after(v, now_ms)),
        },
        408 | 425 | 500..=599 => Outcome::Retry {
            error,
            not_before_ms: None,
        },
        _ => Outcome::Permanent { error },
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date, to an absolute instant (capped).
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    let at = if let Ok(secs) = v.parse::<u64>() {
        now_ms.saturating_add(secs.saturating_mul(1_000))
    } else if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Delay-seconds too large for a u64: more than the cap in any case.
        u64::MAX
    } else {
        let t = httpdate::parse_http_date(v).ok()?;
        let ms = t
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis() as u64;
        ms.max(now_ms)
    };
    Some(at.min(now_ms.saturating_add(RETRY_AFTER_MS_MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn kind(o: &Outcome) -> &'static str {
        match o {
            Outcome::Sent => "sent",
            Outcome::Retry { .. } => "retry",
            Outcome::Permanent { .. } => "permanent",
            Outcome::Held { .. } => "held",
        }
    }

    #[test]
    fn status_classes() {
        for (s, k) in [
            (200, "sent"),
            (204, "sent"),
            (301, "permanent"),
            (400, "permanent"),
            (401, "permanent"),
            (404, "permanent"),
            (408, "retry"),
            (425, "retry"),
            (429, "retry"),
            (500, "retry"),
            (502, "retry"),
            (503, "retry"),
        ] {
            assert_eq!(kind(&classify(s, None, "", NOW)), k, "status {s}");
        }
    }

    #[test]
    fn retry_after_seconds_and_date() {
        match classify(429, Some("2"), "slow down", NOW) {
            Outcome::Retry {
                not_before_ms,
                error,
            } => {
                assert_eq!(not_before_ms, Some(NOW + 2_000));
                assert_eq!(error, "HTTP 429: slow down");
            }
            o => panic!("{o:?}"),
        }
        let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(NOW + 5_000));
        assert_eq!(parse_retry_after(&date, NOW), Some(NOW + 5_000));
        // A date in the past means "now"; garbage is ignored; huge values are capped.
        let past = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(NOW - 5_000));
        assert_eq!(parse_retry_after(&past, NOW), Some(NOW));
        assert_eq!(parse_retry_after("soon", NOW), None);
        assert_eq!(
            parse_retry_after("99999999999", NOW),
            Some(NOW + RETRY_AFTER_MS_MAX)
        );
        // Past u64: still delay-seconds, capped, not ignored.
        assert_eq!(
            parse_retry_after("99999999999999999999999", NOW),
            Some(NOW + RETRY_AFTER_MS_MAX)
        );
        // Retry-After on a 500 is not a documented instruction: plain backoff.
        match classify(500, Some("2"), "", NOW) {
            Outcome::Retry { not_before_ms, .. } => assert_eq!(not_before_ms, None),
            o => panic!("{o:?}"),
        }
    }
}
