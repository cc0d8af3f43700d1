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

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;
    use crate::store::{codec, Store};

    /// A format-1 data directory of `n` pending one-shots, each with one message of `body`
    /// bytes, as herald 0.1 wrote it (no log, one `tasks` tree).
    fn format_1_dir(dir: &Path, n: usize, body: usize) {
        let db = sled::open(dir).unwrap();
        let tasks = db.open_tree("tasks").unwrap();
        let (proto, _) = crate::store::tests::task("proto");
        for i in 0..n {
            let id = format!("t{i:06}");
            let v1 = TaskV1 {
                id: id.clone(),
                name: None,
                channel: "log".into(),
                schedule: (&proto.schedule).into(),
                messages: vec![MessageV1 {
                    to: "a".into(),
                    body: "b".repeat(body),
                }],
                pacing: crate::model::Pacing::every(5).into(),
                retry: None,
                misfire: crate::model::Misfire::Skip.into(),
                misfire_grace_ms: 6,
                overlap: crate::model::Overlap::Allow.into(),
                metadata: Default::default(),
                state: crate::model::TaskState::Pending.into(),
                created_at_ms: 1,
                updated_at_ms: 2,
                next_fire_at_ms: Some(1_900_000_000_000 + i as u64),
                runs: 0,
                fires: 0,
                last_fire_ms: None,
                done_offsets_ms: vec![],
                queued: vec![],
                skipped: 0,
                expired: 0,
            };
            tasks
                .insert(id.as_bytes(), codec::encode(&v1).unwrap())
                .unwrap();
        }
        set_format(&db, 1);
    }

    /// sled itself on `dir`, once a store closed there has let go of its lock.
    pub(crate) fn sled_open(dir: &Path) -> sled::Db {
        for _ in 0..500 {
            if let Ok(db) = sled::open(dir) {
                return db;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        sled::open(dir).unwrap()
    }

    /// `Store::open`, again while sled's directory lock is still held: a store or sled handle
    /// dropped just before lets the lock go only once its last background thread ends.
    pub(crate) fn store_open(dir: &Path) -> Store {
        for _ in 0..500 {
            match Store::open(dir) {
                Ok(s) => return s,
                Err(e) if format!("{e:?}").contains("could not acquire lock") => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("open {}: {e}", dir.display()),
            }
        }
        Store::open(dir).unwrap()
    }

    pub(crate) fn set_format(db: &sled::Db, v: u8) {
        db.open_tree("meta")
            .unwrap()
            .insert("format", &[v])
            .unwrap();
        db.flush().unwrap();
    }

    /// Opens `dir` until the applier has moved everything into sled (the memtable empty),
    /// so that what the log held is in sled's trees.
    pub(crate) async fn settle(dir: &Path) {
        let s = store_open(dir);
        for _ in 0..400 {
            if s.memtable_bytes() == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("the memtable never drained");
    }

    /// A format-1 directory big enough that the migration's writes (through the log) fill
    /// memtable layers the applier writes into sled during the upgrade: every task keeps its
    /// due entry (a direct clear and rebuild of sled's `due` after the migration lost those
    /// already in sled, and the tasks never fired).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_big_format_1_directory_keeps_every_due_entry() {
        let dir = tempfile::tempdir().unwrap();
        let n = 40_000;
        format_1_dir(dir.path(), n, 1_500);
        let s = store_open(dir.path());
        assert!(s.get_task("t000000").unwrap().is_some());
        let due = s.due_entries(&[]).count();
        assert_eq!(due, n, "due entries after migrating {n} format-1 tasks");
    }

    /// An upgrade whose `format` write did not reach the disk (kill -9 within sled's flush
    /// interval): the next open takes the directory for format 1 again. The migration finds
    /// nothing left to do and every due entry (here all in sled) stays.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_format_1_upgrade_run_again_keeps_the_due_index() {
        let dir = tempfile::tempdir().unwrap();
        format_1_dir(dir.path(), 3, 10);
        drop(store_open(dir.path()));
        // Reopened: the log is read into a layer that goes into sled, and its segments go.
        settle(dir.path()).await;
        set_format(&sled_open(dir.path()), 1);
        let s = store_open(dir.path());
        assert!(s.get_task("t000001").unwrap().is_some());
        let due: Vec<String> = s.due_entries(&[]).map(|e| e.unwrap().1).collect();
        assert_eq!(due, ["t000000", "t000001", "t000002"]);
    }
}
