//! A task's timeline (API.md "Trace and timeline"): one event per step herald took for it,
//! written in the same durable write as the step it records. Pure data: the engine's
//! `commit.rs` builds these from a `Change`; the store keeps them per task in `seq` order.

use serde::{Deserialize, Serialize};

/// The kinds of API.md, by their wire names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineKind {
    Created,
    Patched,
    Paused,
    Resumed,
    Triggered,
    Cancelled,
    Fired,
    Skipped,
    Expired,
    Attempt,
    RetryScheduled,
    Delivered,
    Failed,
    FailureRetried,
    FailureDismissed,
    Held,
    ResumedAfterRestart,
}

impl TimelineKind {
    /// The wire name (`"retry_scheduled"`), as the API and the event bus spell it.
    pub fn name(self) -> &'static str {
        match self {
            TimelineKind::Created => "created",
            TimelineKind::Patched => "patched",
            TimelineKind::Paused => "paused",
            TimelineKind::Resumed => "resumed",
            TimelineKind::Triggered => "triggered",
            TimelineKind::Cancelled => "cancelled",
            TimelineKind::Fired => "fired",
            TimelineKind::Skipped => "skipped",
            TimelineKind::Expired => "expired",
            TimelineKind::Attempt => "attempt",
            TimelineKind::RetryScheduled => "retry_scheduled",
            TimelineKind::Delivered => "delivered",
            TimelineKind::Failed => "failed",
            TimelineKind::FailureRetried => "failure_retried",
            TimelineKind::FailureDismissed => "failure_dismissed",
            TimelineKind::Held => "held",
            TimelineKind::ResumedAfterRestart => "resumed_after_restart",
        }
    }
}

/// One step of a task. `seq` is given by the store when the event is written (per task,
/// increasing); until then it is 0.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineEvent {
    pub seq: u64,
    pub at_ms: u64,
    pub kind: TimelineKind,
    pub run: Option<u32>,
    pub msg: Option<u32>,
    pub attempt: Option<u32>,
    /// Kind-specific detail (API.md): e.g. `{"status": 500, "duration_ms": 12, "outcome": "retry"}`.
    pub detail: serde_json::Value,
}

impl TimelineEvent {
    /// An event about the task as a whole (created, paused, …).
    pub fn task(kind: TimelineKind, at_ms: u64) -> TimelineEvent {
        TimelineEvent {
            seq: 0,
            at_ms,
            kind,
            run: None,
            msg: None,
            attempt: None,
            detail: serde_json::Value::Null,
        }
    }

    /// An event about one run (fired, skipped, expired) or one of its messages.
    pub fn run(kind: TimelineKind, at_ms: u64, run: u32, msg: Option<u32>) -> TimelineEvent {
        TimelineEvent {
            run: Some(run),
            msg,
            ..TimelineEvent::task(kind, at_ms)
        }
    }

    pub fn with_attempt(mut self, attempt: u32) -> TimelineEvent {
        self.attempt = Some(attempt);
        self
    }

    pub fn with_detail(mut self, detail: serde_json::Value) -> TimelineEvent {
        self.detail = detail;
        self
    }
}

/// The trace id of a task made before traces existed (no `trace_id` stored): derived from
/// its id, so every attempt of it still shares one trace.
pub fn fallback_trace_id(task_id: &str) -> [u8; 16] {
    use sha2::Digest;
    let d = sha2::Sha256::digest(task_id.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The bytes of exactly `N * 2` lowercase or uppercase hex digits.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != N * 2 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(out)
}

/// A task's `trace_id` as 32 hex digits in JSON (exports), `null` when none.
pub mod hex_trace {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<[u8; 16]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_some(&super::hex(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 16]>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::unhex::<16>(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom("trace_id: expected 32 hex digits")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let b: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(unhex::<16>(&hex(&b)), Some(b));
        assert_eq!(unhex::<16>("00"), None);
        assert_eq!(unhex::<2>("zz00"), None);
        assert_eq!(unhex::<2>("aB09"), Some([0xab, 0x09]));
    }

    #[test]
    fn the_fallback_trace_is_stable_per_task() {
        assert_eq!(fallback_trace_id("a"), fallback_trace_id("a"));
        assert_ne!(fallback_trace_id("a"), fallback_trace_id("b"));
    }
}
