//! Durable state in sled: tasks, runs (cursors), failures, idempotency keys.
//!
//! Trees and keys (keys are byte strings ordered for scans):
//! - `tasks`: task id → [`Task`]
//! - `runs`: task id ‖ 0x00 ‖ run number (u32 big-endian) → [`Run`]; ids never contain 0x00,
//!   so a prefix scan on `id ‖ 0x00` finds exactly one task's runs, in run order
//! - `failures`: failure id (the delivery key) → [`Failure`]
//! - `idempotency`: client key → [`IdemRecord`]
//! - `meta`: `format` → format version byte
//!
//! Writes that belong together go in one [`Batch`], applied as one sled transaction across
//! trees, so a crash never leaves a task and its run half-updated. Durability is separate:
//! [`Store::durable`] waits for a group-commit flush (see `commit`).

pub mod codec;
pub mod commit;

use std::path::Path;

use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use crate::model::{Failure, Run, Task};
use codec::{decode, encode, FORMAT_VERSION};
use commit::GroupCommit;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Sled(#[from] sled::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record in {tree} at key {key:?}: {detail}")]
    Corrupt {
        tree: String,
        key: String,
        detail: String,
    },
    #[error("encode: {0}")]
    Encode(String),
    #[error("durable flush failed: {0}")]
    Durability(String),
    #[error("data directory {dir} has format version {found}; this build reads {FORMAT_VERSION}")]
    Version { dir: String, found: u8 },
}

/// What an idempotency key remembers: the task it created and a hash of the request body.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct IdemRecord {
    pub task_id: String,
    pub body_sha256: [u8; 32],
}

/// One write of a batch.
#[derive(Debug, Clone)]
pub enum Op {
    Task(Box<Task>),
    Run(String, Run),
    Failure(Failure),
    DeleteFailure(String),
}

/// Writes applied atomically together.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }
    pub fn task(&mut self, t: &Task) -> &mut Self {
        self.ops.push(Op::Task(Box::new(t.clone())));
        self
    }
    pub fn run(&mut self, task_id: &str, r: &Run) -> &mut Self {
        self.ops.push(Op::Run(task_id.to_string(), r.clone()));
        self
    }
    pub fn failure(&mut self, f: Failure) -> &mut Self {
        self.ops.push(Op::Failure(f));
        self
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Result of trying to insert a new task.
#[derive(Debug)]
pub enum Inserted {
    Created,
    /// A task with this id exists already.
    IdTaken,
    /// The idempotency key was used before; here is what it recorded.
    KeyUsed(IdemRecord),
}

pub struct Store {
    db: sled::Db,
    tasks: sled::Tree,
    runs: sled::Tree,
    failures: sled::Tree,
    idem: sled::Tree,
    commit: GroupCommit,
}

pub fn run_key(task_id: &str, run: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(task_id.len() + 5);
    k.extend_from_slice(task_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&run.to_be_bytes());
    k
}

fn runs_prefix(task_id: &str) -> Vec<u8> {
    let mut k = task_id.as_bytes().to_vec();
    k.push(0);
    k
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir)?;
        let db = sled::Config::new().path(dir).open()?;
        let meta = db.open_tree("meta")?;
        match meta.get("format")? {
            Some(v) if v.as_ref() != [FORMAT_VERSION] => {
                return Err(StoreError::Version {
                    dir: dir.display().to_string(),
                    found: v.first().copied().unwrap_or(0),
                })
            }
            Some(_) => {}
            None => {
                meta.insert("format", &[FORMAT_VERSION])?;
            }
        }
        // sled 0.34 keeps its log in the file `db` inside the directory.
        let data_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("db"))
            .ok();
        if data_file.is_none() {
            tracing::warn!(dir = %dir.display(), "sled data file not found; flushes will not fsync it");
        }
        let commit = GroupCommit::start(db.clone(), data_file)?;
        Ok(Store {
            tasks: db.open_tree("tasks")?,
            runs: db.open_tree("runs")?,
            failures: db.open_tree("failures")?,
            idem: db.open_tree("idempotency")?,
            db,
            commit,
        })
    }

    pub fn commit_stats(&self) -> &commit::CommitStats {
        &self.commit.stats
    }

    /// Waits until every write made before the call is on disk.
    pub async fn durable(&self) -> Result<(), StoreError> {
        self.commit.durable().await.map_err(StoreError::Durability)
    }

    pub fn get_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        match self.tasks.get(id.as_bytes())? {
            Some(v) => decode("tasks", id.as_bytes(), &v).map(Some),
            None => Ok(None),
        }
    }

    /// Inserts a new task (and its idempotency key) unless the id or the key is taken.
    pub fn insert_new_task(
        &self,
        task: &Task,
        idem: Option<(&str, [u8; 32])>,
    ) -> Result<Inserted, StoreError> {
        let value = encode(task)?;
        let idem_value = match &idem {
            Some((_, hash)) => Some(encode(&IdemRecord {
                task_id: task.id.clone(),
                body_sha256: *hash,
            })?),
            None => None,
        };
        let r = (&self.tasks, &self.idem).transaction(|(tasks, keys)| {
            if let Some((key, _)) = &idem {
                if let Some(old) = keys.get(key.as_bytes())? {
                    let rec: IdemRecord = decode("idempotency", key.as_bytes(), &old)
                        .map_err(ConflictableTransactionError::Abort)?;
                    return Ok(Inserted::KeyUsed(rec));
                }
            }
            if tasks.get(task.id.as_bytes())?.is_some() {
                return Ok(Inserted::IdTaken);
            }
            tasks.insert(task.id.as_bytes(), value.as_slice())?;
            if let (Some((key, _)), Some(v)) = (&idem, &idem_value) {
                keys.insert(key.as_bytes(), v.as_slice())?;
            }
            Ok(Inserted::Created)
        });
        flatten(r)
    }

    /// Applies a batch atomically (one transaction across trees).
    pub fn apply(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut encoded = Vec::with_capacity(batch.ops.len());
        for op in &batch.ops {
            encoded.push(match op {
                Op::Task(t) => (0u8, t.id.as_bytes().to_vec(), Some(encode(t)?)),
                Op::Run(id, r) => (1, run_key(id, r.run), Some(encode(r)?)),
                Op::Failure(f) => (2, f.id.as_bytes().to_vec(), Some(encode(f)?)),
                Op::DeleteFailure(id) => (2, id.as_bytes().to_vec(), None),
            });
        }
        let r = (&self.tasks, &self.runs, &self.failures).transaction(|(t, r, f)| {
            for (tree, key, value) in &encoded {
                let tree = match tree {
                    0 => t,
                    1 => r,
                    _ => f,
                };
                match value {
                    Some(v) => tree.insert(key.as_slice(), v.as_slice())?,
                    None => tree.remove(key.as_slice())?,
                };
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(())
        });
        flatten(r)
    }

    /// One page of tasks in id order after `after`, keeping those `keep` accepts. Returns the
    /// page and whether more matching tasks follow. Corrupt records are reported and skipped.
    pub fn task_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&Task) -> bool,
    ) -> Result<(Vec<Task>, bool), StoreError> {
        let iter = match after {
            Some(a) => {
                let mut start = a.as_bytes().to_vec();
                start.push(0); // the smallest key greater than `a`
                self.tasks.range(start..)
            }
            None => self.tasks.iter(),
        };
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item?;
            match decode::<Task>("tasks", &k, &v) {
                Ok(t) if keep(&t) => {
                    if out.len() == limit {
                        return Ok((out, true));
                    }
                    out.push(t);
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "skipping corrupt task record"),
            }
        }
        Ok((out, false))
    }

    /// Every task record, decoded; corrupt ones come back as errors naming their key.
    pub fn all_tasks(&self) -> impl Iterator<Item = Result<Task, StoreError>> + '_ {
        self.tasks.iter().map(|item| {
            let (k, v) = item?;
            decode("tasks", &k, &v)
        })
    }

    /// Every failure record, decoded; corrupt ones come back as errors naming their key.
    pub fn all_failures(&self) -> impl Iterator<Item = Result<Failure, StoreError>> + '_ {
        self.failures.iter().map(|item| {
            let (k, v) = item?;
            decode("failures", &k, &v)
        })
    }

    /// The runs of a task in run order. Corrupt run records are errors.
    pub fn runs_of(&self, task_id: &str) -> Result<Vec<Run>, StoreError> {
        self.runs
            .scan_prefix(runs_prefix(task_id))
            .map(|item| {
                let (k, v) = item?;
                decode("runs", &k, &v)
            })
            .collect()
    }

    /// The most recent run of a task.
    pub fn last_run(&self, task_id: &str) -> Result<Option<Run>, StoreError> {
        match self.runs.scan_prefix(runs_prefix(task_id)).next_back() {
            Some(item) => {
                let (k, v) = item?;
                decode("runs", &k, &v).map(Some)
            }
            None => Ok(None),
        }
    }

    pub fn idem_get(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        match self.idem.get(key.as_bytes())? {
            Some(v) => decode("idempotency", key.as_bytes(), &v).map(Some),
            None => Ok(None),
        }
    }

    pub fn get_run(&self, task_id: &str, run: u32) -> Result<Option<Run>, StoreError> {
        let key = run_key(task_id, run);
        match self.runs.get(&key)? {
            Some(v) => decode("runs", &key, &v).map(Some),
            None => Ok(None),
        }
    }

    pub fn get_failure(&self, id: &str) -> Result<Option<Failure>, StoreError> {
        match self.failures.get(id.as_bytes())? {
            Some(v) => decode("failures", id.as_bytes(), &v).map(Some),
            None => Ok(None),
        }
    }

    /// One page of failures in id order after `after`, optionally of one task.
    pub fn failure_page(
        &self,
        task: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Failure>, bool), StoreError> {
        // Failure ids start with the task id, so a task filter can start its scan there; the
        // exact task check below is still needed because ids may contain ':'.
        let start: Vec<u8> = match (after, task) {
            (Some(a), _) => {
                let mut s = a.as_bytes().to_vec();
                s.push(0);
                s
            }
            (None, Some(t)) => format!("{t}:").into_bytes(),
            (None, None) => Vec::new(),
        };
        let mut out = Vec::new();
        for item in self.failures.range(start..) {
            let (k, v) = item?;
            if let Some(t) = task {
                if !k.starts_with(format!("{t}:").as_bytes()) {
                    break;
                }
            }
            match decode::<Failure>("failures", &k, &v) {
                Ok(f) if task.is_none_or(|t| f.task_id == t) => {
                    if out.len() == limit {
                        return Ok((out, true));
                    }
                    out.push(f);
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "skipping corrupt failure record"),
            }
        }
        Ok((out, false))
    }

    /// Raw access for tests that need to plant a corrupt record.
    #[doc(hidden)]
    pub fn raw_insert_task_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.tasks.insert(key.as_bytes(), bytes)?;
        Ok(())
    }

    pub fn flush_now(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

fn flatten<T>(r: Result<T, TransactionError<StoreError>>) -> Result<T, StoreError> {
    match r {
        Ok(v) => Ok(v),
        Err(TransactionError::Abort(e)) => Err(e),
        Err(TransactionError::Storage(e)) => Err(StoreError::Sled(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn task(id: &str) -> Task {
        let req: TaskRequest = serde_json::from_value(serde_json::json!({
            "id": id, "schedule": {"after": "1h"}, "messages": [{"to": "a", "body": "b"}]
        }))
        .unwrap();
        req.into_task(&Context {
            now_ms: 1_800_000_000_000,
            limits: &Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap()
    }

    #[tokio::test]
    async fn tasks_runs_and_failures_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            let t = task("t1");
            assert!(matches!(
                s.insert_new_task(&t, None).unwrap(),
                Inserted::Created
            ));
            let mut b = Batch::new();
            b.run("t1", &Run::new(1, 5, 6, 1))
                .run("t1", &Run::new(2, 7, 8, 1));
            b.failure(Failure {
                id: delivery_key("t1", 1, 0),
                task_id: "t1".into(),
                run: 1,
                seq: 0,
                to: "a".into(),
                channel: "log".into(),
                attempts: 3,
                last_error: "HTTP 500".into(),
                failed_at_ms: 9,
                retrying: false,
                retries: 0,
            });
            s.apply(&b).unwrap();
            s.durable().await.unwrap();
            assert_eq!(
                s.commit_stats()
                    .flushes
                    .load(std::sync::atomic::Ordering::Relaxed),
                1
            );
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.get_task("t1").unwrap().unwrap().id, "t1");
        let runs = s.runs_of("t1").unwrap();
        assert_eq!(runs.iter().map(|r| r.run).collect::<Vec<_>>(), vec![1, 2]);
        let (f, more) = s.failure_page(Some("t1"), None, 10).unwrap();
        assert_eq!((f.len(), more), (1, false));
    }

    #[test]
    fn id_and_key_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let t = task("same");
        assert!(matches!(
            s.insert_new_task(&t, Some(("k1", [1; 32]))).unwrap(),
            Inserted::Created
        ));
        assert!(matches!(
            s.insert_new_task(&t, None).unwrap(),
            Inserted::IdTaken
        ));
        match s
            .insert_new_task(&task("other"), Some(("k1", [2; 32])))
            .unwrap()
        {
            Inserted::KeyUsed(r) => {
                assert_eq!((r.task_id.as_str(), r.body_sha256), ("same", [1; 32]))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            s.get_task("other").unwrap().is_none(),
            "a conflict writes nothing"
        );
    }

    #[test]
    fn pages_and_prefix_scans_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        for id in ["a", "a:b", "b", "c"] {
            s.insert_new_task(&task(id), None).unwrap();
            let mut b = Batch::new();
            b.run(id, &Run::new(1, 0, 0, 1));
            s.apply(&b).unwrap();
        }
        assert_eq!(
            s.runs_of("a").unwrap().len(),
            1,
            "runs of a:b are not runs of a"
        );
        let (p, more) = s.task_page(None, 2, |_| true).unwrap();
        assert_eq!(
            p.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
            ["a", "a:b"]
        );
        assert!(more);
        let (p, more) = s.task_page(Some("a:b"), 2, |_| true).unwrap();
        assert_eq!(
            p.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
        assert!(!more);
    }

    #[test]
    fn corrupt_task_is_reported_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.insert_new_task(&task("good"), None).unwrap();
        s.raw_insert_task_bytes("bad", &[1, 0xff, 0xff]).unwrap();
        let all: Vec<_> = s.all_tasks().collect();
        assert_eq!(all.len(), 2);
        let err = all
            .iter()
            .find_map(|r| r.as_ref().err())
            .unwrap()
            .to_string();
        assert!(err.contains("\"bad\""), "{err}");
        let (p, _) = s.task_page(None, 10, |_| true).unwrap();
        assert_eq!(p.len(), 1);
        assert!(s.get_task("bad").is_err());
    }
}
