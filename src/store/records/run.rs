//! Run records (tree `runs`), failure-list entries (tree `failures`) and idempotency records
//! (tree `idempotency`) as they are on disk. Frozen, like `spec.rs`: never changed; a new
//! shape is a new version. Failures and idempotency records have not changed shape since
//! format 1; runs have a version 2 (their slot's wall), written only for a run that has one.

use serde::{Deserialize, Serialize};

/// Variant order is the on-disk code: never reorder, never insert.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStateV1 {
    Running,
    Completed,
    Cancelled,
    Skipped,
    Expired,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunV1 {
    pub run: u32,
    pub scheduled_at_ms: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub state: RunStateV1,
    pub total: u32,
    pub cursor: u32,
    pub in_flight: Option<u32>,
    pub attempts: u32,
    pub sent: u32,
    pub failed: u32,
    pub next_at_ms: Option<u64>,
    pub last_attempt_at_ms: Option<u64>,
    pub reason: Option<String>,
}

/// The run record, version 2: [`RunV1`] and `slot_wall_ms`, the wall time of the
/// recipient-time cron slot the run is the run of (`model::Run::slot_wall_ms`). Written only
/// for a run that has one; any other is written as version 1, whose bytes older builds read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunV2 {
    pub run: u32,
    pub scheduled_at_ms: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub state: RunStateV1,
    pub total: u32,
    pub cursor: u32,
    pub in_flight: Option<u32>,
    pub attempts: u32,
    pub sent: u32,
    pub failed: u32,
    pub next_at_ms: Option<u64>,
    pub last_attempt_at_ms: Option<u64>,
    pub reason: Option<String>,
    pub slot_wall_ms: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FailureV1 {
    pub id: String,
    pub task_id: String,
    pub run: u32,
    pub seq: u32,
    pub to: String,
    pub channel: String,
    pub attempts: u32,
    pub last_error: String,
    pub failed_at_ms: u64,
    pub retrying: bool,
    pub retries: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct IdemV1 {
    pub task_id: String,
    pub body_sha256: [u8; 32],
}
