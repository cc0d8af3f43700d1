//! The progress record (tree `progress`) and the live entry (the `due` index's values; the
//! `live` tree up to format 6) as they are on disk. Frozen, like `spec.rs`: never changed; a new shape is a new version.

use serde::{Deserialize, Serialize};

/// A task's state. Variant order is the on-disk code: never reorder, never insert.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStateV1 {
    Pending,
    Running,
    Paused,
    Completed,
    Cancelled,
    Failed,
    Expired,
}

/// The progress record, version 1 (formats 4 to 6).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProgressV1 {
    pub state: TaskStateV1,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    pub queued: Vec<(u32, u64)>,
    pub skipped: u32,
    pub expired: u32,
    pub watched_since_ms: u64,
    pub failed_reason: Option<String>,
}

/// The progress record, version 2 (format 7): [`ProgressV1`] and `one_shot`, so that the due
/// index's entry (`records::due_entry`) is derived from the progress record alone now that
/// the `live` tree is gone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProgressV2 {
    pub state: TaskStateV1,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    pub queued: Vec<(u32, u64)>,
    pub skipped: u32,
    pub expired: u32,
    pub watched_since_ms: u64,
    pub failed_reason: Option<String>,
    pub one_shot: bool,
}

/// The progress record, version 3: [`ProgressV2`] and the recipient-time cron's slot walls
/// (`schedule/recipient.rs`: two slots can share a run instant): the last fire's
/// (`last_slot_wall_ms`) and each queued fire's (the third of `queued`). Written only when one
/// of them is known; a record without any is written as version 2, whose bytes older builds
/// read (and the walls are then derived from the instants, as they were).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProgressV3 {
    pub state: TaskStateV1,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    pub queued: Vec<(u32, u64, Option<u64>)>,
    pub skipped: u32,
    pub expired: u32,
    pub watched_since_ms: u64,
    pub failed_reason: Option<String>,
    pub one_shot: bool,
    pub last_slot_wall_ms: Option<u64>,
}

/// The live entry, version 1 (formats 4 to 7: the `live` tree up to format 6, the `due`
/// index's values, and a format-7 spec's `initial`) (formats 4 to 6).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveV1 {
    pub state: TaskStateV1,
    pub next_fire_at_ms: Option<u64>,
    pub one_shot: bool,
}
