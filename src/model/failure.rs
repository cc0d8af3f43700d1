//! A failure-list entry: one message herald gave up on.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Equal to the delivery's idempotency key `{task}:{run}:{seq}`: one entry per message.
    pub id: String,
    pub task_id: String,
    pub run: u32,
    pub seq: u32,
    pub to: String,
    pub channel: String,
    pub attempts: u32,
    pub last_error: String,
    /// When it (last) failed.
    pub failed_at_ms: u64,
    /// A retry was asked for (`POST /v1/failures/{id}/retry`) and is under way.
    pub retrying: bool,
    /// Attempts made by such retries (also counted in `attempts`).
    pub retries: u32,
}

/// The idempotency key of one message of one run; also the failure id.
pub fn delivery_key(task_id: &str, run: u32, seq: u32) -> String {
    format!("{task_id}:{run}:{seq}")
}
