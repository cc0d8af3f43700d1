//! The task creation request as it arrives (JSON shape of API.md) and its validation into a
//! [`Task`]. Validation is pure: `now` and the set of channels come from the caller. Every
//! error names the field it is about, in the dotted path clients see (`schedule.at`,
//! `messages[3].body`).
//!
//! Above `model` (it reads schedules with `crate::schedule`) and below the API, the engine and
//! config, which call it: `mod.rs` holds the wire types, `validate.rs` the checks of each block,
//! `schedule.rs` the schedule block, `build.rs` turning a create or a patch into a `Task`,
//! `restore.rs` a task read from a backup checked by the same rules.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::Limits;
#[cfg(test)]
use crate::model::Task;

mod build;
mod restore;
mod schedule;
mod validate;

pub use restore::{check_task, check_zones, restored_message};
pub use validate::{validate_quiet, validate_retry};

/// A validation error: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub id: Option<String>,
    pub name: Option<String>,
    pub channel: Option<String>,
    pub schedule: ScheduleRequest,
    pub messages: Option<Vec<MessageRequest>>,
    /// Broadcast shorthand: one message per recipient with the same body.
    pub to: Option<Vec<String>>,
    pub body: Option<String>,
    pub pacing: Option<PacingRequest>,
    pub retry: Option<RetryRequest>,
    pub misfire: Option<String>,
    pub misfire_grace: Option<String>,
    pub overlap: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// `en` (default) or `zh`.
    pub lang: Option<String>,
    /// The zone of messages without their own `tz`, in recipient time.
    pub default_tz: Option<String>,
    /// Absent: the channel's; `null`: none; an object: the task's own window.
    #[serde(default, deserialize_with = "present")]
    pub quiet_hours: Option<Option<QuietHoursRequest>>,
    pub notify: Option<NotifyRequest>,
    /// The trace the task joins (the API sets it from `traceparent`, or starts one); never
    /// read from the body.
    #[serde(skip)]
    pub trace_id: Option<[u8; 16]>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct QuietHoursRequest {
    pub from: String,
    pub to: String,
    /// An IANA zone, or `recipient` (each message's own zone).
    pub tz: String,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct NotifyRequest {
    pub channel: String,
    pub to: String,
    pub on: Option<Vec<String>>,
}

/// A field that may be absent (outer `None`) or `null` (`Some(None)`): serde gives absent
/// fields their default and calls this only for present ones, `null` included.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    pub at: Option<String>,
    pub after: Option<String>,
    pub tz: Option<String>,
    pub dst: Option<DstRequest>,
    pub cron: Option<String>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub max_runs: Option<u32>,
    pub reminders: Option<RemindersRequest>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RemindersRequest {
    pub event_at: String,
    pub tz: Option<String>,
    pub before: Vec<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct DstRequest {
    pub gap: Option<String>,
    pub repeat: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    pub to: String,
    pub body: String,
    /// Free JSON object for the channel's templates (`{{ data.template_id }}`).
    pub data: Option<serde_json::Value>,
    /// The recipient's IANA zone (for a schedule in recipient time).
    pub tz: Option<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PacingRequest {
    pub interval: Option<String>,
    pub batch_size: Option<u32>,
    pub batch_pause: Option<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    pub max_attempts: Option<u32>,
    pub backoff: Option<String>,
    pub initial: Option<String>,
    pub max: Option<String>,
}

/// A change to a task (`PATCH /v1/tasks/{id}`): only these fields may change.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    pub name: Option<String>,
    pub schedule: Option<ScheduleRequest>,
    pub messages: Option<Vec<MessageRequest>>,
    pub to: Option<Vec<String>>,
    pub body: Option<String>,
    pub pacing: Option<PacingRequest>,
    pub retry: Option<RetryRequest>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub lang: Option<String>,
    /// As on create: the zone of new messages without their own `tz`, in recipient time.
    pub default_tz: Option<String>,
}

/// Most offsets in one reminders schedule.
pub const REMINDERS_MAX: usize = 100;

/// What validation needs to know about the world.
pub struct Context<'a> {
    pub now_ms: u64,
    pub limits: &'a Limits,
    pub channel_exists: &'a dyn Fn(&str) -> bool,
}

/// A task as a create would make it from this JSON at `now_ms` (default limits, every channel
/// known): the fixture of the engine's and schedule's unit tests.
#[cfg(test)]
pub(crate) fn test_task(v: serde_json::Value, now_ms: u64) -> Task {
    let req: TaskRequest = serde_json::from_value(v).expect("a valid test request");
    req.into_task(&Context {
        now_ms,
        limits: &Limits::default(),
        channel_exists: &|_| true,
    })
    .expect("a valid test task")
    .0
}

#[cfg(test)]
mod tests;
