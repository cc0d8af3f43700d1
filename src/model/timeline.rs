//! A task's timeline (API.md "Trace and timeline"): one event per step herald took for it,
//! written in the same durable write as the step it records. Pure data: the engine's
//! `commit.rs` builds these from a `Change`; the store keeps them per task in `seq` order.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Outcome;

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

/// The seq of a task's `created` event, its first; the store numbers the others from 2.
pub const CREATED_SEQ: u64 = 1;

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

    /// A task's `created` event, seq [`CREATED_SEQ`]: its creation time, its trace and how many
    /// messages it has. Derived from the task, never stored (`store/timeline.rs`): the store
    /// writes it only before a patch could change what it says.
    pub fn created(task: &super::Task) -> TimelineEvent {
        TimelineEvent {
            seq: CREATED_SEQ,
            ..TimelineEvent::task(TimelineKind::Created, task.created_at_ms).with_detail(json!({
                "trace_id": hex(&trace_id_of(task)),
                "messages": task.message_count,
            }))
        }
    }

    /// The event as API.md shows it (the timeline page and the event bus).
    pub fn view(&self) -> serde_json::Value {
        json!({
            "seq": self.seq,
            "at": super::instant::format_utc(self.at_ms),
            "kind": self.kind.name(),
            "run": self.run,
            "msg": self.msg,
            "attempt": self.attempt,
            "detail": if self.detail.is_null() { json!({}) } else { self.detail.clone() },
        })
    }
}

/// Why a send waited without burning an attempt (`held` events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldWhy {
    RateLimit,
    Breaker,
    /// A local resource ran out (too many open files, no buffer space).
    LocalResource,
    QuietHours,
    /// It did not go, and its attempt is not spent: the task was cancelled or paused before
    /// its request was written (while the send waited for a slot of the channel or for a
    /// platform's token: its gate closed), herald began to shut down, or in cluster mode too
    /// little of the shard's trust was left.
    Stopped,
}

impl HeldWhy {
    pub fn name(self) -> &'static str {
        match self {
            HeldWhy::RateLimit => "rate_limit",
            HeldWhy::Breaker => "breaker",
            HeldWhy::LocalResource => "local_resource",
            HeldWhy::QuietHours => "quiet_hours",
            HeldWhy::Stopped => "stopped",
        }
    }
}

/// The events of the steps of a send, as the engine's commit place writes them. Pure: every
/// instant is passed in.
impl TimelineEvent {
    /// One attempt and its answer: `{"status", "duration_ms", "platform_code", "outcome",
    /// "error"}` (absent parts null).
    pub fn attempt(
        at_ms: u64,
        run: u32,
        seq: u32,
        attempt: u32,
        outcome: &Outcome,
        status: Option<u16>,
        duration_ms: u64,
    ) -> TimelineEvent {
        let (name, code, error) = attempt_facts(outcome);
        TimelineEvent::run(TimelineKind::Attempt, at_ms, run, Some(seq))
            .with_attempt(attempt)
            .with_detail(json!({
                "status": status,
                "duration_ms": duration_ms,
                "platform_code": code,
                "outcome": name,
                "error": error,
            }))
    }

    /// The next attempt of a message is due at `next_at_ms` because of `reason` (the last
    /// attempt's error, or `Retry-After`).
    pub fn retry_scheduled(
        at_ms: u64,
        run: u32,
        seq: u32,
        attempt: u32,
        next_at_ms: u64,
        reason: &str,
    ) -> TimelineEvent {
        TimelineEvent::run(TimelineKind::RetryScheduled, at_ms, run, Some(seq))
            .with_attempt(attempt)
            .with_detail(json!({
                "at": super::instant::format_utc(next_at_ms),
                "reason": reason,
            }))
    }

    /// A send waits until `until_ms` (no attempt burned).
    pub fn held(at_ms: u64, run: u32, seq: u32, until_ms: u64, why: HeldWhy) -> TimelineEvent {
        TimelineEvent::run(TimelineKind::Held, at_ms, run, Some(seq)).with_detail(json!({
            "until": super::instant::format_utc(until_ms),
            "why": why.name(),
        }))
    }

    /// A message was accepted by its channel at attempt `attempt`.
    pub fn delivered(at_ms: u64, run: u32, seq: u32, attempt: u32) -> TimelineEvent {
        TimelineEvent::run(TimelineKind::Delivered, at_ms, run, Some(seq)).with_attempt(attempt)
    }

    /// A message went to the failure list after `attempts` attempts.
    pub fn failed(at_ms: u64, run: u32, seq: u32, attempts: u32, error: &str) -> TimelineEvent {
        TimelineEvent::run(TimelineKind::Failed, at_ms, run, Some(seq))
            .with_attempt(attempts)
            .with_detail(json!({ "error": error }))
    }

    /// After a restart, the message that was in flight is sent again (attempt `attempt`).
    pub fn resumed_after_restart(at_ms: u64, run: u32, seq: u32, attempt: u32) -> TimelineEvent {
        TimelineEvent::run(TimelineKind::ResumedAfterRestart, at_ms, run, Some(seq))
            .with_attempt(attempt)
            .with_detail(json!({ "message": seq, "attempt": attempt }))
    }
}

/// An attempt's outcome in the words spans and timeline events use: its name (`sent`,
/// `retry`, `permanent`, `held`), the platform's code when the answer carried one (the
/// success rule writes it as `platform code N`), and the error.
pub fn attempt_facts(o: &Outcome) -> (&'static str, Option<&str>, Option<&str>) {
    let (name, error) = match o {
        Outcome::Sent => ("sent", None),
        Outcome::Retry { error, .. } => ("retry", Some(error.as_str())),
        Outcome::Permanent { error } => ("permanent", Some(error.as_str())),
        Outcome::Held { error, .. } => ("held", Some(error.as_str())),
    };
    let code = error.and_then(|e| {
        let rest = &e[e.find("platform code ")? + "platform code ".len()..];
        let end = rest.find([':', ' ', ',']).unwrap_or(rest.len());
        Some(&rest[..end]).filter(|c| !c.is_empty())
    });
    (name, code, error)
}

/// The trace id of a task made before traces existed (no `trace_id` stored): derived from
/// its id, so every attempt of it still shares one trace.
pub fn fallback_trace_id(task_id: &str) -> [u8; 16] {
    use sha2::Digest;
    let d = sha2::Sha256::digest(task_id.as_bytes());
    // The first 16 of the digest's 32 bytes.
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(d.iter()) {
        *o = *b;
    }
    out
}

/// A task's trace id: the one stored, or for a task made before traces one derived from its id.
pub fn trace_id_of(t: &super::Task) -> [u8; 16] {
    t.trace_id.unwrap_or_else(|| fallback_trace_id(&t.id))
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // A nibble is below 16, so `from_digit` always gives a digit.
        for nibble in [b >> 4, b & 15] {
            s.push(char::from_digit(nibble.into(), 16).unwrap_or('0'));
        }
    }
    s
}

/// [`hex`] written only when displayed: a log field that costs nothing while its level is
/// off (a trace id on every settle's log line).
pub struct Hex<'a>(pub &'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex(self.0))
    }
}

/// The bytes of exactly `N * 2` lowercase or uppercase hex digits.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != N * 2 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let &[hi, lo] = pair else { return None };
        *o = digit(hi)? << 4 | digit(lo)?;
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
    fn attempt_facts_find_the_platform_code() {
        let o = Outcome::Permanent {
            error: "platform code 40014: invalid access_token".into(),
        };
        assert_eq!(
            attempt_facts(&o),
            (
                "permanent",
                Some("40014"),
                Some("platform code 40014: invalid access_token")
            )
        );
        let o = Outcome::Retry {
            error: "HTTP 500".into(),
            not_before_ms: None,
        };
        assert_eq!(attempt_facts(&o), ("retry", None, Some("HTTP 500")));
        assert_eq!(attempt_facts(&Outcome::Sent), ("sent", None, None));
    }

    #[test]
    fn send_events_carry_api_md_details() {
        let o = Outcome::Retry {
            error: "HTTP 429: slow down".into(),
            not_before_ms: Some(5_000),
        };
        let e = TimelineEvent::attempt(1_000, 2, 3, 1, &o, Some(429), 12);
        assert_eq!(
            (e.kind, e.run, e.msg, e.attempt),
            (TimelineKind::Attempt, Some(2), Some(3), Some(1))
        );
        assert_eq!(
            e.detail,
            json!({"status": 429, "duration_ms": 12, "platform_code": null, "outcome": "retry", "error": "HTTP 429: slow down"})
        );
        let r = TimelineEvent::retry_scheduled(1_000, 2, 3, 1, 5_000, "Retry-After");
        assert_eq!(
            r.detail,
            json!({"at": "1970-01-01T00:00:05Z", "reason": "Retry-After"})
        );
        let h = TimelineEvent::held(1_000, 2, 3, 2_000, HeldWhy::Breaker);
        assert_eq!(h.detail["why"], "breaker");
        assert_eq!(TimelineEvent::delivered(1, 2, 3, 4).attempt, Some(4));
    }

    #[test]
    fn the_fallback_trace_is_stable_per_task() {
        assert_eq!(fallback_trace_id("a"), fallback_trace_id("a"));
        assert_ne!(fallback_trace_id("a"), fallback_trace_id("b"));
    }
}
