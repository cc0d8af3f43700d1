//! Records of earlier data-directory formats, kept so that an upgrade never strands data.
//!
//! Format 1 (herald 0.1, until the spec/progress split) kept one `tasks` tree holding the whole
//! task, messages included. [`migrate_v1`] rewrites it into the current trees the first time a
//! newer herald opens the directory (`Store::open`), in bounded chunks, and only then records
//! the new format: an interrupted migration simply runs again. Runs, failures and idempotency
//! records did not change shape and are read as they are.
//!
//! The types here are frozen: they describe bytes already on disk and must never change. They
//! hold the frozen value types of `records/spec.rs` (whose shapes format 1 already had), and
//! convert to the model in `records/convert.rs` ([`upgrade_v1`]).
//! `tests/fixtures/v1-data` is a data directory written by format-1 herald; `tests/upgrade.rs`
//! opens it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::backend::{Backend, RawOp};
use super::codec::decode;
use super::embedded::SledBackend;
use super::records::convert::upgrade_v1;
use super::records::progress::TaskStateV1;
use super::records::spec::{MisfireV1, OverlapV1, PacingV1, RetryPolicyV1, ScheduleV1};
use super::{Batch, Op, StoreError};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MessageV1 {
    pub to: String,
    pub body: String,
}

/// The format-1 task record, field for field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TaskV1 {
    pub id: String,
    pub name: Option<String>,
    pub channel: String,
    pub schedule: ScheduleV1,
    pub messages: Vec<MessageV1>,
    pub pacing: PacingV1,
    pub retry: Option<RetryPolicyV1>,
    pub misfire: MisfireV1,
    pub misfire_grace_ms: u64,
    pub overlap: OverlapV1,
    pub metadata: BTreeMap<String, String>,
    pub state: TaskStateV1,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    pub queued: Vec<(u32, u64)>,
    pub skipped: u32,
    pub expired: u32,
}

/// Rewrites a format-1 `tasks` tree into specs, progress, live entries and messages, in chunks
/// (each durable), then drops the old tree. Safe to run again after an interruption: every
/// write is a plain put of the same value.
pub fn migrate_v1(db: &sled::Db, backend: &SledBackend) -> Result<(), StoreError> {
    let old = db.open_tree("tasks")?;
    let (mut moved, mut bad) = (0usize, 0usize);
    let mut chunk: Vec<Vec<RawOp>> = Vec::new();
    for item in old.iter() {
        let (k, v) = match item {
            Ok(kv) => kv,
            Err(e) => {
                // A page that cannot be read ends the scan (sled may repeat the error forever).
                tracing::error!(error = %e, "format-1 migration stopped at a storage error; tasks after it are not migrated");
                bad += 1;
                break;
            }
        };
        let v1: TaskV1 = match decode("tasks", &k, &v) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "format-1 migration skips a record it cannot read");
                bad += 1;
                continue;
            }
        };
        let (task, messages) = upgrade_v1(v1);
        let mut b = Batch::new();
        b.ops.push(Op::Task(Box::new(task.clone())));
        b.ops.push(Op::Messages {
            task_id: task.id.clone(),
            old_count: 0,
            messages,
        });
        chunk.push(super::encode_batch(&b)?);
        moved += 1;
        if chunk.len() >= 1_000 {
            backend.apply(std::mem::take(&mut chunk))?;
            backend.sync()?;
        }
    }
    if !chunk.is_empty() {
        backend.apply(chunk)?;
    }
    backend.sync()?;
    db.drop_tree("tasks")?;
    db.flush()?;
    tracing::warn!(
        moved,
        unreadable = bad,
        "data directory upgraded from format 1 to {}",
        super::DIR_FORMAT
    );
    Ok(())
}
