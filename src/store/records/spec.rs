//! The spec record (tree `specs`) as it is on disk, and the frozen types it holds. Frozen:
//! these describe bytes already written and never change; a new shape is a new type written
//! with the next version byte (`codec::Stored::VERSION`). The model's types
//! (`model::Schedule`…) may change freely: `convert.rs` maps them onto these.
//!
//! Variant order is the on-disk code (bincode writes the variant's index): never reorder,
//! never insert; a new variant of the model goes into a new version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The spec record, version 1 (data-directory formats 4 to 6). Fields after `created_at_ms`
/// were appended while formats 4 to 6 were current: each reads as its default from a record
/// that ends before it ([`trailing_or_default`]), which is how older specs decode.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SpecV1 {
    pub id: String,
    pub name: Option<String>,
    pub channel: String,
    pub schedule: ScheduleV1,
    pub message_count: u32,
    pub pacing: PacingV1,
    pub retry: Option<RetryPolicyV1>,
    pub misfire: MisfireV1,
    pub misfire_grace_ms: u64,
    pub overlap: OverlapV1,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: u64,
    /// Appended after format 4 was released: `en` from a record that ends before it.
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub lang: LangV1,
    /// Format 6: the task's only message, kept here instead of in `messages`.
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub message: Option<MessageV1>,
    /// Appended after format 5 (recipient time).
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub recipient_zones: Vec<String>,
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub quiet_hours: QuietSettingV1,
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub notify: Option<NotifyV1>,
    /// Appended with the timeline (issue 25).
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub trace_id: Option<[u8; 16]>,
}

/// The spec record, version 2 (format 7). Against [`SpecV1`]: no `id` (it is the record's key,
/// given back on decode: `codec::Stored::with_key`), every field written (nothing trails), and
/// `initial`: the live state the task was created with while its progress record is not
/// stored (derived from this, `records::ProgressRecord::initial`); `None` once it is stored
/// and in every spec a patch writes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SpecV2 {
    pub name: Option<String>,
    pub channel: String,
    pub schedule: ScheduleV1,
    pub message_count: u32,
    pub pacing: PacingV1,
    pub retry: Option<RetryPolicyV1>,
    pub misfire: MisfireV1,
    pub misfire_grace_ms: u64,
    pub overlap: OverlapV1,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: u64,
    pub lang: LangV1,
    pub message: Option<MessageV1>,
    pub recipient_zones: Vec<String>,
    pub quiet_hours: QuietSettingV1,
    pub notify: Option<NotifyV1>,
    pub trace_id: Option<[u8; 16]>,
    pub initial: Option<super::progress::LiveV1>,
}

/// A field appended at the end of a bincode record: its default when the record's bytes end
/// before it. bincode is not self-describing, so `#[serde(default)]` alone would not do:
/// reading past the end is an error, which this turns into the default. Bytes left unread
/// still fail the record, through the codec's check that every byte was used. (Only version-1
/// records use it; a later version has all its fields.)
pub(super) fn trailing_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(T::deserialize(d).unwrap_or_default())
}

/// One message (tree `messages`, and inside a format-6 spec).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MessageV1 {
    pub to: String,
    pub body: String,
    /// JSON text.
    pub data: Option<String>,
    /// Appended after format 5: none from a record that ends before it.
    #[serde(default, deserialize_with = "trailing_or_default")]
    pub tz: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DstGapV1 {
    Shift,
    Skip,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DstRepeatV1 {
    First,
    Last,
    Both,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DstPolicyV1 {
    pub gap: DstGapV1,
    pub repeat: DstRepeatV1,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum ScheduleV1 {
    At {
        at: String,
        tz: Option<String>,
        dst: DstPolicyV1,
        at_ms: u64,
    },
    After {
        after: String,
        after_ms: u64,
        at_ms: u64,
    },
    Cron {
        cron: String,
        tz: Option<String>,
        dst: DstPolicyV1,
        start: Option<String>,
        start_ms: Option<u64>,
        end: Option<String>,
        end_ms: Option<u64>,
        max_runs: Option<u32>,
    },
    Reminders {
        event_at: String,
        tz: Option<String>,
        dst: DstPolicyV1,
        event_ms: u64,
        before: Vec<String>,
        before_ms: Vec<u64>,
    },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacingV1 {
    pub interval_ms: u64,
    pub batch_size: Option<u32>,
    pub batch_pause_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackoffV1 {
    Fixed,
    Exponential,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicyV1 {
    pub max_attempts: u32,
    pub backoff: BackoffV1,
    pub initial_ms: u64,
    pub max_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MisfireV1 {
    FireNow,
    Skip,
    FireAll,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlapV1 {
    Skip,
    Queue,
    Allow,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LangV1 {
    /// What a record written before `lang` reads as.
    #[default]
    En,
    Zh,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub enum QuietSettingV1 {
    /// What a record written before quiet hours reads as.
    #[default]
    Channel,
    Off,
    Own(QuietHoursV1),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuietHoursV1 {
    pub from_min: u16,
    pub to_min: u16,
    pub tz: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotifyOnV1 {
    Failed,
    Expired,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NotifyV1 {
    pub channel: String,
    pub to: String,
    pub on: Vec<NotifyOnV1>,
}
