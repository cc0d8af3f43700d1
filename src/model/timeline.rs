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
