//! Durable state: task specs and progress, messages, runs (cursors), failures, idempotency keys.
//!
//! Trees and keys (keys are byte strings ordered for scans; see `records.rs` for the split):
//! - `specs`: task id → [`records::SpecRecord`] (written at create and patch; holds the task's
//!   message when it was created with one)
//! - `progress`: task id → [`records::ProgressRecord`] (rewritten by the engine; absent while
//!   it is the initial one, derived from the spec, which then holds the live entry it was
//!   created with)
//! - `due`: [`records::due_key`] → [`records::LiveEntry`], one per unfinished task in start-up
//!   order, derived from its progress record (stored or derived) and kept in step with it by
//!   the backend (`RawOp::Indexed`, [`records::due_entry`])
//! - `live` (formats up to 6): task id → [`records::LiveEntry`]; emptied by the migration to
//!   format 7 (`migrate.rs`)
//! - `messages`: task id ‖ 0x00 ‖ seq (u32 big-endian) → [`Message`]
//! - `runs`: task id ‖ 0x00 ‖ run number (u32 big-endian) → [`Run`]; ids never contain 0x00,
//!   so a prefix scan on `id ‖ 0x00` finds exactly one task's runs (or messages), in order
//! - `active_runs`: the same key → empty, exactly for the runs whose record says `running`
//!   (written with every run record, [`encode_batch`]): loading a task reads its active runs
//!   through it, never its whole history ([`Store::active_runs_of`])
//! - `timeline`: task id ‖ 0x00 ‖ seq (u64 big-endian) → [`timeline::TimelineRecord`], a
//!   task's events, written in the batch of the step they record (`timeline.rs`)
//! - `failures`: failure id (the delivery key) → [`Failure`]
//! - `idempotency`: client key → [`IdemRecord`]
//! - `meta` (sled only): `format` → data-directory format ([`DIR_FORMAT`])
//!
//! Writes that belong together go in one [`Batch`]; [`Store::write`] hands it to the group
//! commit (`commit.rs`) and resolves once it is applied atomically *and* durable. The engine
//! reaches storage only through this type, and this type reaches it only through the narrow
//! [`backend::Backend`] interface.

pub mod backend;
pub mod codec;
pub mod commit;
pub mod embedded;
pub mod fault;
pub mod gather;
pub mod image;
pub mod legacy;
pub mod memtable;
pub mod migrate;
pub mod pace;
pub mod pg;
pub mod purge;
pub mod records;
pub mod space;
pub mod timeline;
pub mod wal;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::timeline::TimelineEvent;
use crate::model::{Failure, Message, Run, RunState, Task, TaskProgress, TaskSpec};
use backend::{Backend, IndexedWrite, RawOp, Rejected, TreeId};
use codec::{decode, encode};
use commit::GroupCommit;
use embedded::SledBackend;
use records::{join, progress_of, progress_record, spec_of, LiveEntry, ProgressRecord, SpecRecord};

/// Layout of the data directory written by this build (the trees above). Format 1 had one
/// `tasks` tree; it is migrated on open (`legacy.rs`). Format 2 had no `due` index; it is
/// built from `live` on open. Format 3 had no write-ahead log (`wal-*.log`): its trees are
/// read as they are; the number moved so that an older build refuses a directory whose last
/// writes may still be in the log. Format 4 had no `active_runs` index; it is built from
/// `runs` on open ([`build_active_index`]). Format 5 kept every message in `messages` and a
/// progress record beside every spec; format 6 keeps a create's only message inside its spec
/// ([`records::SpecRecord::message`]) and stores no progress record while the task's progress
/// is the one it was created with ([`records::ProgressRecord::initial`]). Format 5 records are
/// read as they are (nothing to migrate); the number moved so that an older build refuses a
/// directory with specs it would read as having lost their message or progress. Format 7 has
/// no `live` tree (the due entry is derived from the progress record, a new task's progress
/// from its spec, whose record is version 2); formats 1 to 6 are migrated on open
/// (`migrate.rs`). Format 8 may hold progress version 3 and run version 2 records (recipient
/// time's slot walls, `records/`); format 7 is read as it is, and the number moved so that an
/// older build refuses a directory with records it would skip as damaged.
pub const DIR_FORMAT: u8 = 8;
/// The oldest data-directory format this build reads as it is, with no migration: 7 (format 8
/// only moved the number). An open that must not change the directory (an export) takes it as
/// it is and leaves its format byte ([`StoreOptions::keep_format`]).
pub const DIR_FORMAT_READ_AS_IS: u8 = 7;
/// Most finished run records one fire deletes from a task's history ([`Op::TrimRuns`]): a
/// task restored with a long history comes down to `runs_max` over some fires, each bounded.
pub const TRIM_MAX: usize = 64;

/// sled's page cache when the config does not say (`[store] cache_mb`); sled's own default
/// is 1 GiB. sled counts a page by its bytes on disk, and holds it in memory as ~9× that
/// (40-byte `IVec`s per key and value, page and LRU bookkeeping), so 8 MiB here is ~100 MiB
/// of RSS at 1 M pending. 8 sent a 100 000 herd faster than 16 (0.79–0.87 s against
/// 1.03–1.17 s, alternating runs) and 4 slower (1.31–1.41 s): docs/performance.md, issue 29.
pub const DEFAULT_CACHE_BYTES: u64 = 8 << 20;

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
    #[error("storage write failed: {0}")]
    Write(String),
    #[error("the write queue is full; try again shortly")]
    Busy,
    /// Free space on the data directory's filesystem is under a reserve (`store/space.rs`).
    #[error("the disk holding {dir} is full: {free_mib} MiB free, herald keeps {reserve_mib} MiB; writes resume by themselves once space is freed")]
    DiskFull {
        dir: String,
        free_mib: u64,
        reserve_mib: u64,
    },
    #[error(
        "data directory {dir} has format version {found}; this build reads formats 1 to {DIR_FORMAT}"
    )]
    Version { dir: String, found: u8 },
    #[error("the storage engine crashed opening {dir}: {detail}")]
    Panic { dir: String, detail: String },
    /// A database store that cannot be opened (`store/pg`): the line says which and why.
    #[error("{0}")]
    Database(String),
    /// The store cannot be reached right now (a database server down or unreachable): nothing
    /// is wrong with any record, and the same call may work shortly (`store/pg`).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Cluster mode: the write touches a shard this process no longer holds (its lease ran
    /// out or another node took it over, `store/pg/fence.rs`). Nothing was written; the
    /// shard's tasks are unloaded here and its owner carries on.
    #[error("shard {shard} is owned by another node now; nothing was written")]
    OwnershipLost { shard: u32 },
}

impl StoreError {
    /// The error a failed group gives each of its writers (the commit thread answers them
    /// all with one). The storage's own errors keep their type: a full disk stays
    /// [`StoreError::DiskFull`], an I/O error keeps its [`std::io::ErrorKind`] (sled's too),
    /// so a caller can tell ENOSPC from EIO. Anything else becomes a [`StoreError::Write`]
    /// with its text, as every group failure was before, so [`StoreError::is_storage`]
    /// answers as it did.
    pub fn for_each_writer(&self) -> StoreError {
        match self {
            StoreError::DiskFull {
                dir,
                free_mib,
                reserve_mib,
            } => StoreError::DiskFull {
                dir: dir.clone(),
                free_mib: *free_mib,
                reserve_mib: *reserve_mib,
            },
            StoreError::Io(e) => StoreError::Io(std::io::Error::new(e.kind(), e.to_string())),
            // sled's own `clone` of an I/O error keeps its kind but writes its `Debug` text.
            StoreError::Sled(sled::Error::Io(e)) => StoreError::Sled(sled::Error::Io(
                std::io::Error::new(e.kind(), e.to_string()),
            )),
            StoreError::Sled(e) => StoreError::Sled(e.clone()),
            StoreError::Unavailable(s) => StoreError::Unavailable(s.clone()),
            StoreError::Write(s) => StoreError::Write(s.clone()),
            other => StoreError::Write(other.to_string()),
        }
    }

    /// The kind of the I/O error underneath, if it is one (ours or sled's).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            StoreError::Io(e) => Some(e.kind()),
            StoreError::Sled(sled::Error::Io(e)) => Some(e.kind()),
            _ => None,
        }
    }

    /// A full disk: under herald's reserve, or the filesystem said so (ENOSPC, EDQUOT).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::DiskFull { .. })
            || matches!(
                self.io_kind(),
                Some(std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
            )
    }

    /// Errors of the storage itself (disk, sled), as opposed to one bad record or a full queue.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            StoreError::Sled(_)
                | StoreError::Io(_)
                | StoreError::Write(_)
                | StoreError::Unavailable(_)
                | StoreError::DiskFull { .. }
        )
    }
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
    /// The whole task (spec and progress).
    Task(Box<Task>),
    /// Only what the engine changes: state, fires, counters (the spec for its id and kind);
    /// and the progress it replaces when the writer holds it (`IndexedWrite::old`).
    Progress(Arc<TaskSpec>, Box<TaskProgress>, Option<Box<TaskProgress>>),
    /// Replaces a task's messages (`old_count` were stored before).
    Messages {
        task_id: String,
        old_count: u32,
        messages: Vec<Message>,
    },
    Run(String, Run),
    Failure(Failure),
    DeleteFailure(String),
    /// Deletes a finished task and everything it holds (retention, `DELETE /v1/tasks/{id}`).
    DeleteTask(purge::Footprint),
    /// Deletes the task's oldest finished run records numbered below `below`, at most
    /// [`TRIM_MAX`] of them (a live task's history is bounded: `[store] runs_max`).
    TrimRuns {
        task_id: String,
        below: u32,
    },
    /// Writes an idempotency key as it was (import of an export).
    PutIdem(String, IdemRecord),
    /// Appends events to a task's timeline; their seqs are given at [`Store::write`]
    /// (`timeline.rs`), and the oldest beyond `[store] timeline_max` are deleted.
    Timeline {
        task_id: String,
        events: Vec<TimelineEvent>,
    },
    /// Writes timeline events with the seqs they carry (import of an export).
    PutTimeline {
        task_id: String,
        events: Vec<TimelineEvent>,
    },
    /// The batch creates this task (a notification, `engine/commit.rs`): see [`RawOp::Born`].
    Born(String),
    /// The batch writes from this task's memory, read at this epoch of its shard: see
    /// [`RawOp::LoadedAt`].
    LoadedAt(String, u64),
}

/// One entry of the due index as [`Store::due_entries`] reads it: the due key, the task id
/// and its live entry, or the error reading it.
pub type DueItem = Result<(Vec<u8>, String, LiveEntry), StoreError>;

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
    pub fn progress(&mut self, t: &Task) -> &mut Self {
        let (spec, p) = t.clone().split();
        self.ops
            .push(Op::Progress(Arc::new(spec), Box::new(p), None));
        self
    }
    /// [`Batch::progress`] of a task the engine holds locked: shares the spec, copies the
    /// progress, and says what it replaces (`was`, the engine's, which is the store's: the
    /// backend need not read it).
    pub fn progress_of(
        &mut self,
        spec: &Arc<TaskSpec>,
        p: &TaskProgress,
        was: &TaskProgress,
    ) -> &mut Self {
        self.ops.push(Op::Progress(
            spec.clone(),
            Box::new(p.clone()),
            Some(Box::new(was.clone())),
        ));
        self
    }
    /// See [`Op::TrimRuns`].
    pub fn trim_runs(&mut self, task_id: &str, below: u32) -> &mut Self {
        self.ops.push(Op::TrimRuns {
            task_id: task_id.to_string(),
            below,
        });
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
    /// See [`Op::Timeline`]. No events: nothing is written.
    pub fn timeline(&mut self, task_id: &str, events: Vec<TimelineEvent>) -> &mut Self {
        if !events.is_empty() {
            self.ops.push(Op::Timeline {
                task_id: task_id.to_string(),
                events,
            });
        }
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

/// `id ‖ 0x00 ‖ n` (big-endian): the key of run `n` or message `n` of a task.
pub fn run_key(task_id: &str, n: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(task_id.len() + 5);
    k.extend_from_slice(task_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn id_prefix(task_id: &str) -> Vec<u8> {
    let mut k = task_id.as_bytes().to_vec();
    k.push(0);
    k
}

/// A page of tasks, where the next one starts, and the records skipped as unreadable.
pub type TaskPage = (Vec<Task>, Option<String>, Vec<StoreError>);

/// Most records one listing page examines (see [`Store::task_page`]).
pub const SCAN_MAX: usize = 10_000;

/// The smallest key greater than `a` (for "after" paging).
fn after_key(a: &str) -> Vec<u8> {
    let mut k = a.as_bytes().to_vec();
    k.push(0);
    k
}

/// Which records a listing walks (see [`Store::task_page`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// Every task (specs).
    All,
    /// Running tasks only (their stretch of the due index).
    Running,
    /// Paused tasks only (their stretch of the due index).
    Paused,
}

/// Options for opening the store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub cache_bytes: u64,
    /// How long finished tasks are kept before the retention sweep deletes them (`[store]
    /// retention`); `None` keeps them forever. Applied by the engine, not by the store.
    pub retention_ms: Option<u64>,
    /// Most run records an unfinished task keeps (`[store] runs_max`); older finished ones
    /// are deleted as it fires. Applied by the engine.
    pub runs_max: u32,
    /// Most timeline events a task keeps (`[store] timeline_max`; 0: none are written).
    pub timeline_max: u32,
    /// Most entries the failure list holds (`[store] failures_max`); past it a message given
    /// up on is not listed (its run still counts it failed), counted and alerted. Applied by
    /// the engine.
    pub failures_max: u64,
    /// Leave a directory of format [`DIR_FORMAT_READ_AS_IS`] at its format instead of marking
    /// it [`DIR_FORMAT`] (an export: the herald that wrote it must still open it). Records of
    /// this build's newer versions must then not be written; an export writes none.
    pub keep_format: bool,
}

/// `[store] failures_max` when the config does not say.
pub const DEFAULT_FAILURES_MAX: u64 = 100_000;

/// `[store] retention` when the config does not say.
pub const DEFAULT_RETENTION_MS: u64 = 7 * 86_400_000;
/// `[store] runs_max` when the config does not say.
pub const DEFAULT_RUNS_MAX: u32 = 1_000;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_bytes: DEFAULT_CACHE_BYTES,
            retention_ms: Some(DEFAULT_RETENTION_MS),
            runs_max: DEFAULT_RUNS_MAX,
            timeline_max: timeline::DEFAULT_TIMELINE_MAX,
            failures_max: DEFAULT_FAILURES_MAX,
            keep_format: false,
        }
    }
}

pub struct Store {
    backend: Arc<dyn Backend>,
    commit: GroupCommit,
    /// Run records decoded by the run readers ([`Store::run_records_read`]).
    run_reads: std::sync::atomic::AtomicU64,
    /// `[store] timeline_max` (`timeline.rs`).
    timeline_max: std::sync::atomic::AtomicU32,
    /// Each task's next timeline seq (`timeline.rs`).
    seqs: timeline::Seqs,
    /// Declared last, so dropped last: set once everything above is closed (the commit thread
    /// joined, sled's lock on the directory released).
    closed: Closed,
}

/// Set when the store that owns it has closed (see [`Store::closed_flag`]).
struct Closed(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Store {
    /// Opens (or creates) the store in `dir` with default options.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(dir, &StoreOptions::default())
    }

    /// Opens (or creates) the store in `dir`, migrating an older format. A data directory sled
    /// cannot read (it may panic on a truncated file) is an error, never a crash.
    pub fn open_with(dir: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        let backend = open_catching_panics(dir, opts.cache_bytes)?;
        let db = backend.db()?;
        let meta = db.open_tree("meta")?;
        match meta.get("format")?.as_deref() {
            Some([DIR_FORMAT]) => {}
            // Read as it is: no record of format 7 carries a slot wall.
            Some([7]) => {}
            // The `live` tree is folded into the progress records below.
            Some([6]) => {}
            // Every step through the log and safe to run again: an upgrade whose `format`
            // write was lost (killed before it was durable) runs again over format-7 records.
            // No direct clear of sled's trees: the log may have put entries there already.
            Some([1]) => {
                // Writes each task's due entry with its progress (no rebuild after it).
                legacy::migrate_v1(&db, &backend)?;
                build_active_index(&backend)?;
            }
            Some([2]) => {
                migrate::due_from_live(&backend)?;
                build_active_index(&backend)?;
            }
            Some([3 | 4]) => build_active_index(&backend)?,
            // Read as they are: a spec without a message, a progress record beside each spec.
            Some([5]) => {}
            Some(v) => {
                return Err(StoreError::Version {
                    dir: dir.display().to_string(),
                    found: v.first().copied().unwrap_or(0),
                })
            }
            None => {}
        }
        let format = meta
            .get("format")?
            .as_deref()
            .and_then(|v| v.first().copied());
        drop(db);
        backend.written_directly();
        if format.is_some_and(|f| f < 7) {
            // Formats 1 to 6 have a `live` tree (the steps above leave one); through the log.
            migrate::live_into_progress(&backend)?;
        }
        let kept = opts.keep_format && format == Some(DIR_FORMAT_READ_AS_IS);
        if format != Some(DIR_FORMAT) && !kept {
            meta.insert("format", &[DIR_FORMAT])?;
            // Durable before the first write in this format: a later `format` write lost to a
            // crash would make the next open run the upgrade again over its records.
            backend.flush_sled()?;
        }
        drop(meta);
        let backend: Arc<dyn Backend> = Arc::new(backend);
        let store = Store::with_backend(backend)?;
        store.set_timeline_max(opts.timeline_max);
        Ok(store)
    }

    /// A store over any backend (tests wrap sled to inject faults).
    pub fn with_backend(backend: Arc<dyn Backend>) -> Result<Store, StoreError> {
        Store::with_backend_queue(backend, commit::QUEUE_JOBS)
    }

    /// Like [`Store::with_backend`] with a write queue of `queue_jobs` jobs.
    pub fn with_backend_queue(
        backend: Arc<dyn Backend>,
        queue_jobs: usize,
    ) -> Result<Store, StoreError> {
        let commit = GroupCommit::start(backend.clone(), queue_jobs)?;
        Ok(Store {
            backend,
            commit,
            run_reads: Default::default(),
            timeline_max: timeline::DEFAULT_TIMELINE_MAX.into(),
            seqs: Default::default(),
            closed: Closed(Arc::default()),
        })
    }

    /// Becomes true once this store is dropped and closed: the directory can be opened again.
    pub fn closed_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.closed.0.clone()
    }

    pub fn commit_stats(&self) -> &commit::CommitStats {
        &self.commit.stats
    }

    /// The storage error of the last group, while storage fails.
    pub fn failing(&self) -> Option<String> {
        self.commit
            .health
            .failing()
            .or_else(|| self.backend.failing())
    }

    /// Jobs waiting for the commit thread.
    pub fn queued(&self) -> usize {
        self.commit.queued()
    }

    /// Read round trips to the backend so far (0 on sled; `/metrics`, `tests/pg_herd.rs`).
    pub fn read_round_trips(&self) -> u64 {
        self.backend.read_round_trips()
    }

    /// Herald's last life sign in this store ([`Backend::last_alive`]).
    pub fn last_alive(&self) -> Result<Option<u64>, StoreError> {
        self.backend.last_alive()
    }

    /// Records a life sign ([`Backend::stamp_alive`]). Can block (a file write, a round trip):
    /// not from a runtime worker.
    pub fn stamp_alive(&self, ms: u64) -> Result<(), StoreError> {
        self.backend.stamp_alive(ms)
    }

    /// Whether a read can hold its thread for long ([`Backend::reads_block`]).
    pub fn reads_block(&self) -> bool {
        self.backend.reads_block()
    }

    /// A read made from async code on a runtime worker: when it can block (PostgreSQL), the
    /// worker's other tasks move to another thread meanwhile (`block_in_place`), so a stalled
    /// server holds this request only. Inline otherwise, and on a current-thread runtime
    /// (tests), where `block_in_place` is not allowed.
    pub(crate) fn read_in_place<T>(&self, read: impl FnOnce() -> T) -> T {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let multi =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        if self.reads_block() && multi {
            tokio::task::block_in_place(read)
        } else {
            read()
        }
    }

    /// Bytes in the backend's write-behind memtable (durable, not yet in sled).
    pub fn memtable_bytes(&self) -> usize {
        self.backend.memtable_bytes()
    }

    /// Applies `batch` atomically and resolves once it is durable. Waits for room in the
    /// write queue.
    pub async fn write(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut ops = encode_batch(batch)?;
        let mut expand = || {
            self.expand_reads(&mut ops, batch)
                .and_then(|()| self.keep_inline_messages(batch, &mut ops))
        };
        // Those reads are round trips on PostgreSQL, up to its statement timeout in a stall:
        // off the worker then (a fire of a recurring task past `runs_max` trims; a patch reads
        // the stored spec), so one stalled read never holds a worker's other tasks.
        let written = if self.batch_reads(batch) {
            self.read_in_place(expand)
        } else {
            expand()
        };
        let r = match written {
            Ok(()) => self.commit.write(ops, true).await,
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Rejected {
                lost_shard: Some(shard),
                ..
            })) => Err(StoreError::OwnershipLost { shard }),
            Ok(Err(r)) => Err(StoreError::Write(format!(
                "unexpected precondition failure in {}",
                r.tree.name()
            ))),
            Err(e) => Err(e),
        };
        if r.is_err() {
            // The seqs given to its events were not written: read again next time.
            for op in &batch.ops {
                if let Op::Timeline { task_id, .. } = op {
                    self.seqs.forget(task_id);
                }
            }
        }
        r
    }

    /// Deletes idempotency keys whose tasks are gone (`(key, task its record names)`), each
    /// in a job of its own: one whose record no longer names that task (a create freed it
    /// and took it again meanwhile) is left, and the others go on ([`RawOp::IdemOf`]).
    /// How many were deleted (or were already absent). One after the other: such keys are
    /// few (a task's delete takes its key with it; these are the ones left over).
    pub async fn delete_idem_keys(&self, keys: Vec<(String, String)>) -> Result<usize, StoreError> {
        let mut deleted = 0;
        for (key, task) in keys {
            let ops = vec![
                RawOp::IdemOf(key.as_bytes().to_vec(), task),
                RawOp::Delete(TreeId::Idem, key.into_bytes()),
            ];
            match self.commit.write(ops, true).await? {
                Ok(()) => deleted += 1,
                Err(Rejected {
                    lost_shard: Some(shard),
                    ..
                }) => return Err(StoreError::OwnershipLost { shard }),
                Err(_) => {}
            }
        }
        Ok(deleted)
    }

    /// Whether writing `batch` reads the store first ([`Store::expand_reads`],
    /// [`Store::keep_inline_messages`]).
    fn batch_reads(&self, batch: &Batch) -> bool {
        batch.ops.iter().any(|op| match op {
            Op::TrimRuns { .. } | Op::DeleteTask(_) | Op::Task(_) => true,
            Op::Timeline { task_id, events } => {
                !events.is_empty() && !self.timeline_seq_known(task_id)
            }
            _ => false,
        })
    }

    /// The ops of a batch that depend on what is stored: run trims, timeline seqs and the
    /// timeline of a deleted task.
    fn expand_reads(&self, ops: &mut Vec<RawOp>, batch: &Batch) -> Result<(), StoreError> {
        for op in &batch.ops {
            match op {
                Op::TrimRuns { task_id, below } => self.push_trim(ops, task_id, *below)?,
                Op::Timeline { task_id, events } => {
                    self.push_timeline(ops, task_id, events, false)?
                }
                Op::DeleteTask(fp) => self.push_timeline_delete(ops, &fp.id)?,
                Op::PutTimeline { task_id, .. } => self.seqs.forget(task_id),
                _ => {}
            }
        }
        Ok(())
    }

    /// Inserts a new task (its messages and idempotency key) unless the id or the key is
    /// taken; durable when it answers `Created`. A full write queue is [`StoreError::Busy`]
    /// at once (the API answers 503 with `Retry-After`).
    pub async fn insert_new_task(
        &self,
        task: &Task,
        messages: &[Message],
        idem: Option<(&str, [u8; 32])>,
    ) -> Result<Inserted, StoreError> {
        self.insert_new_task_with(task, messages, idem, &[]).await
    }

    /// [`Store::insert_new_task`] with the task's first timeline events (`created`), in the
    /// same write.
    pub async fn insert_new_task_with(
        &self,
        task: &Task,
        messages: &[Message],
        idem: Option<(&str, [u8; 32])>,
        events: &[TimelineEvent],
    ) -> Result<Inserted, StoreError> {
        // Encoded from the borrowed task: a `Batch` would take a copy of it and its messages.
        let mut ops = Vec::with_capacity(8 + events.len());
        push_new_task(&mut ops, task, messages, idem)?;
        self.push_timeline(&mut ops, &task.id, events, true)?;
        let r = self.commit.write(ops, false).await;
        if !events.is_empty() && !matches!(r, Ok(Ok(()))) {
            // Not created (or the id was taken): the counter set for a new task is wrong.
            self.seqs.forget(&task.id);
        }
        match r? {
            Ok(()) => Ok(Inserted::Created),
            Err(Rejected {
                lost_shard: Some(shard),
                ..
            }) => Err(StoreError::OwnershipLost { shard }),
            Err(r) if r.tree == TreeId::Idem => {
                let key = String::from_utf8_lossy(&r.key).into_owned();
                match self.read_in_place(|| self.idem_get(&key))? {
                    Some(rec) => Ok(Inserted::KeyUsed(rec)),
                    // Gone in between (cannot happen today: keys are never deleted).
                    None => Ok(Inserted::IdTaken),
                }
            }
            Err(_) => Ok(Inserted::IdTaken),
        }
    }

    fn get_decoded<T: codec::Stored>(
        &self,
        tree: TreeId,
        key: &[u8],
    ) -> Result<Option<T>, StoreError> {
        match self.backend.get(tree, key)? {
            Some(v) => decode(tree.name(), key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// A task (spec and progress); `None` if there is no such task.
    pub fn get_task(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let Some(spec) = self.backend.get(TreeId::Specs, id.as_bytes())? else {
            return Ok(None);
        };
        let progress = self.backend.get(TreeId::Progress, id.as_bytes())?;
        let task = task_of(id, &spec, progress.as_deref());
        Ok(self
            .gone_meanwhile(id, progress.is_none(), task)?
            .map(|(t, _)| t))
    }

    /// [`Store::get_task`] of many tasks, in `ids`' order, with one batched read
    /// ([`Backend::get_many`]: one round trip on Postgres) of their specs, progress records
    /// records. Per task: `Ok(None)` when there is no such task, `Err` when its
    /// records cannot be decoded; the whole call fails only when the read does. With each
    /// task, the message its spec holds (a task of one message: [`Store::get_message`] of
    /// seq 0 reads the same record).
    pub fn get_tasks(&self, ids: &[&str]) -> Result<Vec<TaskRead>, StoreError> {
        const TREES_READ: [TreeId; 2] = [TreeId::Specs, TreeId::Progress];
        let keys: Vec<(TreeId, Vec<u8>)> = ids
            .iter()
            .flat_map(|id| TREES_READ.map(|t| (t, id.as_bytes().to_vec())))
            .collect();
        let mut vals = self.backend.get_many(&keys)?.into_iter();
        Ok(ids
            .iter()
            .map(|id| {
                let (spec, progress) = (vals.next(), vals.next());
                let (Some(spec), Some(progress)) = (spec, progress) else {
                    return Err(StoreError::Write(format!(
                        "a batched read answered fewer values than keys (task {id})"
                    )));
                };
                match spec {
                    Some(spec) => {
                        let no_progress = progress.is_none();
                        let task = task_of(id, &spec, progress.as_deref());
                        self.gone_meanwhile(id, no_progress, task)
                    }
                    None => Ok(None),
                }
            })
            .collect())
    }

    /// A task's records are read one key after another, not in one snapshot: a delete
    /// (retention, `DELETE`) that commits between the spec's read and the progress's leaves
    /// a spec without its progress. That is a task gone, not a corrupt one, when its spec is
    /// gone too on a second look.
    fn gone_meanwhile(&self, id: &str, no_progress: bool, read: TaskRead) -> TaskRead {
        match read {
            Err(StoreError::Corrupt { .. }) if no_progress && !self.task_exists(id)? => Ok(None),
            r => r,
        }
    }

    /// Whether a task with this id exists (finished or not).
    pub fn task_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.backend.get(TreeId::Specs, id.as_bytes())?.is_some())
    }

    /// Message `seq` of a task: inside its spec when the spec holds it (format 6, a task
    /// created with one message), else in `messages`.
    pub fn get_message(&self, task_id: &str, seq: u32) -> Result<Option<Message>, StoreError> {
        if seq == 0 {
            if let Some(spec) = self.get_decoded::<SpecRecord>(TreeId::Specs, task_id.as_bytes())? {
                if let Some(m) = spec.message {
                    return Ok(Some(m));
                }
            }
        }
        self.get_decoded(TreeId::Messages, &run_key(task_id, seq))
    }

    /// A spec that holds its task's only message keeps it when a batch rewrites the spec
    /// without touching the messages ([`Op::Task`] is encoded from the task, which holds
    /// none); and gives it up when a batch writes the messages into `messages` ([`Op::Messages`],
    /// a patch), so the spec never shadows them. Reads the old spec: the caller holds the
    /// task's lock, as for every write of a task.
    fn keep_inline_messages(&self, batch: &Batch, ops: &mut Vec<RawOp>) -> Result<(), StoreError> {
        let mut specs: Vec<&Task> = Vec::new();
        let mut messages: Vec<&str> = Vec::new();
        for op in &batch.ops {
            match op {
                Op::Task(t) => specs.push(t),
                Op::Messages { task_id, .. } => messages.push(task_id),
                _ => {}
            }
        }
        for t in specs {
            if messages.contains(&t.id.as_str()) {
                continue; // written as `spec_of(t)`: no inline message, they are in `messages`
            }
            let old = self.get_decoded::<SpecRecord>(TreeId::Specs, t.id.as_bytes())?;
            if let Some(m) = old.and_then(|s| s.message) {
                let mut spec = spec_of(t);
                spec.message = Some(m);
                let value = encode(&spec)?;
                for op in ops.iter_mut() {
                    if let RawOp::Put(TreeId::Specs, k, v) = op {
                        if k.as_slice() == t.id.as_bytes() {
                            *v = value.clone();
                        }
                    }
                }
            }
        }
        for id in messages {
            if batch
                .ops
                .iter()
                .any(|op| matches!(op, Op::Task(t) if t.id == id))
            {
                continue;
            }
            let old = self.get_decoded::<SpecRecord>(TreeId::Specs, id.as_bytes())?;
            if let Some(mut spec) = old.filter(|s| s.message.is_some()) {
                spec.message = None;
                ops.push(RawOp::Put(
                    TreeId::Specs,
                    id.as_bytes().to_vec(),
                    encode(&spec)?,
                ));
            }
        }
        Ok(())
    }

    /// Every unfinished task's live entry, in start-up order (the due index's). A read error
    /// ends the scan: it comes back as the last item (sled may repeat a page error forever,
    /// so the caller must stop).
    pub fn live_entries(
        &self,
    ) -> impl Iterator<Item = Result<(String, LiveEntry), StoreError>> + '_ {
        self.due_entries(&[])
            .map(|item| item.map(|(_, id, e)| (id, e)))
    }

    /// Live entries in start-up order (running, then pending by next fire, then the rest; see
    /// [`records::due_key`]) from the due-index key `start` on. Items: the due key, the task
    /// id and its entry. A record that does not decode is an error and the scan goes on; a
    /// read error of the tree ends it.
    pub fn due_entries(
        &self,
        start: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, String, LiveEntry), StoreError>> + '_ {
        bounded(self.backend.scan(TreeId::Due, start, None)).map(|item| {
            let (k, v) = item?;
            let id = records::due_key_id(&k).unwrap_or_default();
            let e: LiveEntry = decode("live", id, &v)?;
            let id = String::from_utf8_lossy(id).into_owned();
            Ok((k, id, e))
        })
    }

    /// Cluster mode: the live entries of one shard's tasks in start-up order (as
    /// [`Store::due_entries`], read at once: a node loads a shard when it is granted it).
    pub fn shard_due_entries(&self, shard: u32) -> Result<Vec<DueItem>, StoreError> {
        Ok(self
            .backend
            .shard_rows(TreeId::Due, shard)?
            .into_iter()
            .map(|(k, v)| {
                let id = records::due_key_id(&k).unwrap_or_default();
                let e: LiveEntry = decode("live", id, &v)?;
                let id = String::from_utf8_lossy(id).into_owned();
                Ok((k, id, e))
            })
            .collect())
    }

    /// Cluster mode: tasks other nodes created for shards this process holds (the inbox).
    pub fn take_inbox(&self) -> Result<Vec<String>, StoreError> {
        self.backend.take_inbox()
    }

    /// The live entry of one task (`None`: the task is finished or unknown), from its
    /// progress, stored or derived.
    pub fn live_entry(&self, id: &str) -> Result<Option<LiveEntry>, StoreError> {
        let key = id.as_bytes();
        if let Some(v) = self.backend.get(TreeId::Progress, key)? {
            return Ok(decode::<ProgressRecord>("progress", key, &v)?.live());
        }
        match self.get_decoded::<SpecRecord>(TreeId::Specs, key)? {
            Some(spec) => Ok(spec.initial),
            None => Ok(None),
        }
    }

    /// One page of tasks in id order after `after`, keeping those `keep` accepts. Returns the
    /// page, where the next page starts (`None` on the last), and the records that could not be
    /// read (reported and skipped; a read error of the tree itself ends the page there).
    /// `walk` says which stretch of keys is examined: every task, or the running or paused
    /// tasks' stretch of the due index.
    ///
    /// Bounded work: at most [`SCAN_MAX`] records are examined per page. A page that reaches
    /// the bound with fewer than `limit` matches ends early and its `next` points after the last
    /// record examined, so a rare filter over a million tasks costs many short requests, never
    /// one long one.
    pub fn task_page(
        &self,
        after: Option<&str>,
        limit: usize,
        walk: Walk,
        keep: impl Fn(&Task) -> bool,
    ) -> Result<TaskPage, StoreError> {
        let after = after.map(after_key).unwrap_or_default();
        // Running and paused tasks are each one id-ordered stretch of the due index.
        let (tree, prefix) = match walk {
            Walk::All => (TreeId::Specs, Vec::new()),
            Walk::Running => (TreeId::Due, records::due_class_prefix(records::DUE_RUNNING)),
            Walk::Paused => (TreeId::Due, records::due_class_prefix(records::DUE_OTHER)),
        };
        let start = [prefix.as_slice(), after.as_slice()].concat();
        let mut out: Vec<Task> = Vec::new();
        let mut bad = Vec::new();
        let mut last_examined: Option<String> = None;
        let scan = self.backend.scan(tree, &start, Some(&prefix));
        for (scanned, item) in bounded(scan).enumerate() {
            let (k, _) = match item {
                Ok(kv) => kv,
                // The store failing (an outage, an I/O error) is the page's error, not a page
                // cut short: a short page with no `next` would read as the whole list.
                Err(e) if e.is_storage() => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, tree = tree.name(), "listing stopped at a storage error");
                    bad.push(e);
                    break;
                }
            };
            let id =
                String::from_utf8_lossy(k.get(prefix.len()..).unwrap_or_default()).into_owned();
            if scanned == SCAN_MAX {
                // More records follow: the next page starts after the last one examined.
                return Ok((out, last_examined, bad));
            }
            last_examined = Some(id.clone());
            match self.get_task(&id) {
                Ok(Some(t)) if keep(&t) => {
                    if out.len() == limit {
                        let next = out.last().map(|t| t.id.clone());
                        return Ok((out, next, bad));
                    }
                    out.push(t);
                }
                Ok(_) => {}
                Err(e) if e.is_storage() => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, "listing skips a task record it cannot read");
                    bad.push(e);
                }
            }
        }
        Ok((out, None, bad))
    }

    /// Every failure record, decoded; corrupt ones come back as errors naming their key. A
    /// read error of the tree ends the iteration.
    pub fn all_failures(&self) -> impl Iterator<Item = Result<Failure, StoreError>> + '_ {
        bounded(self.backend.scan(TreeId::Failures, &[], None)).map(|item| {
            let (k, v) = item?;
            decode("failures", &k, &v)
        })
    }

    /// Entries in the failure list (a scan: the census for `/metrics` calls it rarely).
    pub fn failure_count(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for item in bounded(self.backend.scan(TreeId::Failures, &[], None)) {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// The runs of a task in run order. Corrupt run records are errors.
    pub fn runs_of(&self, task_id: &str) -> Result<Vec<Run>, StoreError> {
        let p = id_prefix(task_id);
        bounded(self.backend.scan(TreeId::Runs, &p, Some(&p)))
            .map(|item| {
                let (k, v) = item?;
                self.run_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                decode("runs", &k, &v)
            })
            .collect()
    }

    /// The runs of a task that are `running`, in run order: through the `active_runs` index,
    /// so the cost is O(active runs), whatever the task's history. An index entry whose run
    /// record is gone or no longer running is skipped (never the case when both are written
    /// together, as [`encode_batch`] does).
    pub fn active_runs_of(&self, task_id: &str) -> Result<Vec<Run>, StoreError> {
        let p = id_prefix(task_id);
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Active, &p, Some(&p))) {
            let (k, _) = item?;
            self.run_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(v) = self.backend.get(TreeId::Runs, &k)? {
                let r: Run = decode("runs", &k, &v)?;
                if r.state == RunState::Running {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Run records decoded so far by [`Store::runs_of`] and [`Store::active_runs_of`] (tests
    /// and benches check that loading a task does not read its history).
    pub fn run_records_read(&self) -> u64 {
        self.run_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The deletes of an [`Op::TrimRuns`]: the task's oldest run records below `below`, at
    /// most [`TRIM_MAX`], skipping any that is still running (its settle writes it again).
    fn push_trim(&self, ops: &mut Vec<RawOp>, task_id: &str, below: u32) -> Result<(), StoreError> {
        let p = id_prefix(task_id);
        let end = run_key(task_id, below);
        for item in bounded(self.backend.scan(TreeId::Runs, &p, Some(&p))).take(TRIM_MAX) {
            let (k, _) = item?;
            if k >= end {
                break;
            }
            if self.backend.get(TreeId::Active, &k)?.is_some() {
                continue;
            }
            ops.push(RawOp::Delete(TreeId::Runs, k));
        }
        Ok(())
    }

    /// Up to `limit` runs of a task after run number `after`, in run order, and whether more
    /// follow. Corrupt run records are errors.
    pub fn runs_page(
        &self,
        task_id: &str,
        after: Option<u32>,
        limit: usize,
    ) -> Result<(Vec<Run>, bool), StoreError> {
        let p = id_prefix(task_id);
        let start = match after {
            Some(n) if n == u32::MAX => return Ok((Vec::new(), false)),
            Some(n) => run_key(task_id, n + 1),
            None => p.clone(),
        };
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Runs, &start, Some(&p))) {
            let (k, v) = item?;
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(decode("runs", &k, &v)?);
        }
        Ok((out, false))
    }

    /// The most recent run of a task.
    pub fn last_run(&self, task_id: &str) -> Result<Option<Run>, StoreError> {
        match self
            .backend
            .last_with_prefix(TreeId::Runs, &id_prefix(task_id))?
        {
            Some((k, v)) => decode("runs", &k, &v).map(Some),
            None => Ok(None),
        }
    }

    pub fn idem_get(&self, key: &str) -> Result<Option<IdemRecord>, StoreError> {
        self.get_decoded(TreeId::Idem, key.as_bytes())
    }

    pub fn get_run(&self, task_id: &str, run: u32) -> Result<Option<Run>, StoreError> {
        self.get_decoded(TreeId::Runs, &run_key(task_id, run))
    }

    pub fn get_failure(&self, id: &str) -> Result<Option<Failure>, StoreError> {
        self.get_decoded(TreeId::Failures, id.as_bytes())
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
        let task_prefix = task.map(|t| format!("{t}:").into_bytes());
        let start: Vec<u8> = match (after, &task_prefix) {
            (Some(a), _) => after_key(a),
            (None, Some(p)) => p.clone(),
            (None, None) => Vec::new(),
        };
        let mut out = Vec::new();
        for item in bounded(
            self.backend
                .scan(TreeId::Failures, &start, task_prefix.as_deref()),
        ) {
            let (k, v) = match item {
                Ok(kv) => kv,
                // As a task listing: the store failing is the page's error.
                Err(e) if e.is_storage() => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, "failure listing stopped at a storage error");
                    break;
                }
            };
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

    /// Raw access for tests that need to plant a corrupt record (in the spec tree, with a
    /// live entry so that start-up meets it). Through the write queue like every write, so it
    /// is durable when it returns and never races the commit thread.
    #[doc(hidden)]
    pub async fn raw_insert_task_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let k = key.as_bytes().to_vec();
        let live = raw_live_entry();
        let ops = vec![
            RawOp::Put(TreeId::Specs, k.clone(), bytes.to_vec()),
            RawOp::Put(TreeId::Due, records::due_key_of(&k, &live), encode(&live)?),
        ];
        self.raw_write(ops).await
    }

    /// Raw access for tests: `bytes` as the live entry of task `key` (a pending one-shot's
    /// place in the due index), with no spec: a live index record that does not decode.
    #[doc(hidden)]
    pub async fn raw_insert_live_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let k = records::due_key_of(key.as_bytes(), &raw_live_entry());
        self.raw_write(vec![RawOp::Put(TreeId::Due, k, bytes.to_vec())])
            .await
    }

    async fn raw_write(&self, ops: Vec<RawOp>) -> Result<(), StoreError> {
        match self.commit.write(ops, true).await? {
            Ok(()) => Ok(()),
            Err(r) => Err(StoreError::Write(format!(
                "unexpected precondition failure in {}",
                r.tree.name()
            ))),
        }
    }
}

/// The live entry the raw test writes file their task under.
fn raw_live_entry() -> LiveEntry {
    LiveEntry {
        state: crate::model::TaskState::Pending,
        next_fire_at_ms: None,
        one_shot: true,
    }
}

/// Ends an iteration at its first error (after yielding it): sled can return the same page
/// error forever, and a scan must never loop on it.
fn bounded<'a, T: 'a>(
    it: impl Iterator<Item = Result<T, StoreError>> + 'a,
) -> impl Iterator<Item = Result<T, StoreError>> + 'a {
    let mut failed = false;
    it.take_while(move |item| {
        if failed {
            return false;
        }
        failed = item.is_err();
        true
    })
}

/// Builds the `active_runs` index from `runs` (format 4 → 5), through the backend (the log
/// may hold run records sled does not have yet), in bounded groups, and makes it durable.
fn build_active_index(backend: &SledBackend) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let (mut n, mut ops) = (0usize, Vec::new());
    let flush = |ops: Vec<RawOp>| -> Result<(), StoreError> {
        if !ops.is_empty() {
            backend.apply(vec![ops])?;
            backend.sync()?;
        }
        Ok(())
    };
    for item in bounded(backend.scan(TreeId::Runs, &[], None)) {
        let (k, v) = item?;
        // A record that does not decode is left out: loading its task reports it as before.
        let running =
            codec::decode::<Run>("runs", &k, &v).is_ok_and(|r| r.state == RunState::Running);
        if running {
            ops.push(RawOp::Put(TreeId::Active, k, Vec::new()));
            n += 1;
            if ops.len() == 10_000 {
                flush(std::mem::take(&mut ops))?;
            }
        }
    }
    flush(ops)?;
    tracing::info!(
        running = n,
        took_ms = started.elapsed().as_millis() as u64,
        "built the active-runs index of this data directory (format 4 -> 5)"
    );
    Ok(())
}

/// Encodes a batch into backend writes.
fn encode_batch(batch: &Batch) -> Result<Vec<RawOp>, StoreError> {
    let mut ops = Vec::with_capacity(batch.ops.len() * 3);
    for op in &batch.ops {
        match op {
            Op::Task(t) => push_task(&mut ops, t, Records::Task)?,
            Op::Progress(spec, p, was) => push_progress(&mut ops, spec, p, was.as_deref())?,
            Op::Messages {
                task_id,
                old_count,
                messages,
            } => push_messages(&mut ops, task_id, *old_count, messages)?,
            Op::Run(id, r) => {
                let key = run_key(id, r.run);
                ops.push(if r.state == RunState::Running {
                    RawOp::Put(TreeId::Active, key.clone(), Vec::new())
                } else {
                    RawOp::Delete(TreeId::Active, key.clone())
                });
                ops.push(RawOp::Put(TreeId::Runs, key, encode(r)?));
            }
            // Expanded by `Store::write`, which reads which records there are.
            Op::TrimRuns { .. } => {}
            Op::Failure(f) => ops.push(RawOp::Put(
                TreeId::Failures,
                f.id.as_bytes().to_vec(),
                encode(f)?,
            )),
            Op::DeleteFailure(id) => {
                ops.push(RawOp::Delete(TreeId::Failures, id.as_bytes().to_vec()))
            }
            Op::DeleteTask(fp) => {
                let key = fp.id.as_bytes().to_vec();
                // Through the index, so that a due entry goes with the progress whatever the
                // task's state (a finished task has none); before the spec's delete, which a
                // derived progress is read from.
                ops.push(progress_write(key.clone(), None, true, false));
                ops.push(RawOp::Delete(TreeId::Specs, key));
                for seq in 0..fp.messages {
                    ops.push(RawOp::Delete(TreeId::Messages, run_key(&fp.id, seq)));
                }
                for run in &fp.runs {
                    ops.push(RawOp::Delete(TreeId::Runs, run_key(&fp.id, *run)));
                    ops.push(RawOp::Delete(TreeId::Active, run_key(&fp.id, *run)));
                }
                for f in &fp.failures {
                    ops.push(RawOp::Delete(TreeId::Failures, f.as_bytes().to_vec()));
                }
            }
            // Expanded by `Store::write`, which gives the seqs (`timeline.rs`).
            Op::Timeline { .. } => {}
            Op::PutTimeline { task_id, events } => {
                for e in events {
                    ops.push(RawOp::Put(
                        TreeId::Timeline,
                        timeline::timeline_key(task_id, e.seq),
                        encode(&timeline::TimelineRecord::of(e))?,
                    ));
                }
            }
            Op::Born(id) => ops.push(RawOp::Born(id.clone())),
            Op::LoadedAt(id, epoch) => ops.push(RawOp::LoadedAt(id.clone(), *epoch)),
            Op::PutIdem(key, rec) => ops.push(RawOp::Put(
                TreeId::Idem,
                key.as_bytes().to_vec(),
                encode(rec)?,
            )),
        }
    }
    Ok(ops)
}

/// A new task's writes: its idempotency key and spec, each required absent, then the task and
/// its messages. The `Absent(Specs, id)` here is what makes the live write's `stored_absent`
/// promise true: keep them together.
fn push_new_task(
    ops: &mut Vec<RawOp>,
    task: &Task,
    messages: &[Message],
    idem: Option<(&str, [u8; 32])>,
) -> Result<(), StoreError> {
    if let Some((key, hash)) = idem {
        ops.push(RawOp::Absent(TreeId::Idem, key.as_bytes().to_vec()));
        ops.push(RawOp::Put(
            TreeId::Idem,
            key.as_bytes().to_vec(),
            encode(&IdemRecord {
                task_id: task.id.clone(),
                body_sha256: hash,
            })?,
        ));
    }
    ops.push(RawOp::Absent(TreeId::Specs, task.id.as_bytes().to_vec()));
    ops.push(RawOp::Born(task.id.clone()));
    match messages {
        // Format 6: the only message goes inside the spec, one key fewer.
        [only] => push_task(ops, task, Records::New(Some(only))),
        _ => {
            push_task(ops, task, Records::New(None))?;
            push_messages(ops, &task.id, 0, messages)
        }
    }
}

/// Which of a task's records a write puts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Records<'a> {
    /// A new task (its job requires the spec absent): spec (holding the task's only message,
    /// if given), the progress unless it is the initial one (derived when read: the spec
    /// holds the live entry instead), due entry.
    New(Option<&'a Message>),
    /// Spec, progress, due entry.
    Task,
}

fn push_task(ops: &mut Vec<RawOp>, t: &Task, what: Records) -> Result<(), StoreError> {
    let key = t.id.as_bytes().to_vec();
    let new = matches!(what, Records::New(_));
    let progress = progress_of(t);
    let mut spec = spec_of(t);
    if let Records::New(Some(m)) = what {
        spec.message = Some(m.clone());
    }
    // A new task whose progress is the initial one stores none: its spec holds the live
    // entry it is derived from when read.
    if new {
        if let Some(live) = progress.live() {
            if ProgressRecord::created(&spec, &live) == progress {
                spec.initial = Some(live);
            }
        }
    }
    let store = spec.initial.is_none();
    // Before the spec's put: what it derives from is the spec as it was (`IndexedWrite`).
    ops.push(progress_write(
        key.clone(),
        Some(encode(&progress)?),
        store,
        new,
    ));
    ops.push(RawOp::Put(TreeId::Specs, key, encode(&spec)?));
    Ok(())
}

/// A progress record, and the due entry derived from it; `was`: the progress it replaces,
/// as the writer holds it.
fn push_progress(
    ops: &mut Vec<RawOp>,
    spec: &TaskSpec,
    p: &TaskProgress,
    was: Option<&TaskProgress>,
) -> Result<(), StoreError> {
    let key = spec.id.as_bytes().to_vec();
    let value = encode(&progress_record(spec, p))?;
    let mut op = progress_write(key, Some(value), true, false);
    if let (RawOp::Indexed(w), Some(was)) = (&mut op, was) {
        w.old = Some(encode(&progress_record(spec, was))?);
    }
    ops.push(op);
    Ok(())
}

/// One task of [`Store::get_tasks`]: the task and the message its spec holds, `None` when
/// there is no such task, an error when its records do not decode.
pub type TaskRead = Result<Option<(Task, Option<Message>)>, StoreError>;

/// A task from its stored spec and progress record (`None`: derived from the spec), and the
/// message the spec holds. The one decoding of a task for [`Store::get_task`] and
/// [`Store::get_tasks`].
fn task_of(
    id: &str,
    spec: &[u8],
    progress: Option<&[u8]>,
) -> Result<Option<(Task, Option<Message>)>, StoreError> {
    let key = id.as_bytes();
    let mut spec: SpecRecord = decode(TreeId::Specs.name(), key, spec)?;
    let progress: ProgressRecord = match progress {
        Some(p) => decode(TreeId::Progress.name(), key, p)?,
        None => initial_progress(&spec)?,
    };
    let message = spec.message.take();
    Ok(Some((join(spec, progress), message)))
}

/// The progress of a task that has no progress record (nothing happened to it since its
/// create): derived from its spec. A spec without the live entry to derive it from (a
/// finished task always has its progress stored) means the record is missing for real.
fn initial_progress(spec: &SpecRecord) -> Result<ProgressRecord, StoreError> {
    ProgressRecord::initial(spec).ok_or_else(|| StoreError::Corrupt {
        tree: "progress".into(),
        key: spec.id.clone(),
        detail: "the task's spec exists but its progress record is missing".into(),
    })
}

/// Writes (or deletes) a task's progress record, keeping its due entry in step. `store`
/// false: a new task's initial progress, which only gets its due entry (its spec holds what
/// it is derived from). `stored_absent`: the store holds no progress of `key` when the
/// job's preconditions hold (a new task).
fn progress_write(key: Vec<u8>, value: Option<Vec<u8>>, store: bool, stored_absent: bool) -> RawOp {
    RawOp::Indexed(Box::new(IndexedWrite {
        tree: TreeId::Progress,
        key,
        value,
        store,
        index: TreeId::Due,
        entry: records::due_entry,
        derived_from: TreeId::Specs,
        derive: records::initial_progress,
        stored_absent,
        old: None,
    }))
}

fn push_messages(
    ops: &mut Vec<RawOp>,
    task_id: &str,
    old_count: u32,
    messages: &[Message],
) -> Result<(), StoreError> {
    for (i, m) in messages.iter().enumerate() {
        ops.push(RawOp::Put(
            TreeId::Messages,
            run_key(task_id, i as u32),
            encode(m)?,
        ));
    }
    for i in messages.len() as u32..old_count {
        ops.push(RawOp::Delete(TreeId::Messages, run_key(task_id, i)));
    }
    Ok(())
}

/// The data-directory format sled holds in `db` (`None`: none written yet), read with sled
/// alone and creating nothing: the `meta` tree is opened only if it is there. Its first byte,
/// as [`Store::open_with`] reads it.
pub fn stored_format(db: &sled::Db) -> Result<Option<u8>, StoreError> {
    if !db.tree_names().iter().any(|n| n.as_ref() == b"meta") {
        return Ok(None);
    }
    let format = db.open_tree("meta")?.get("format")?;
    Ok(format.and_then(|v| v.first().copied()))
}

/// Refuses a data directory of a format above this build's ([`StoreError::Version`]). Asked
/// before anything in it changes (`embedded::SledInner::open`, before the log is read): the
/// newer build that wrote it (met on a rollback) must find its log as it left it, not
/// replayed, cut at a record this build cannot read, or followed by a new segment.
pub fn refuse_newer(dir: &Path, format: Option<u8>) -> Result<(), StoreError> {
    match format {
        Some(found) if found > DIR_FORMAT => Err(StoreError::Version {
            dir: dir.display().to_string(),
            found,
        }),
        _ => Ok(()),
    }
}

/// Opens sled, turning a panic inside it (seen on a truncated data file) into an error and
/// keeping its backtrace off the terminal.
fn open_catching_panics(dir: &Path, cache_bytes: u64) -> Result<SledBackend, StoreError> {
    quiet_panics::install();
    let r = quiet_panics::catch(|| SledBackend::open(dir, cache_bytes));
    match r {
        Ok(r) => r,
        Err(detail) => Err(StoreError::Panic {
            dir: dir.display().to_string(),
            detail,
        }),
    }
}

/// A panic hook that stays quiet for panics caught on purpose: the process-wide hook is wrapped
/// once, and only the thread inside [`quiet_panics::catch`] has its panic message captured
/// instead of printed. Every other panic goes to the previous hook as before.
mod quiet_panics {
    use std::cell::RefCell;
    use std::sync::Once;

    thread_local! {
        static CAPTURE: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
    }

    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let captured = CAPTURE.with(|c| {
                    let mut c = c.borrow_mut();
                    match c.as_mut() {
                        Some(slot) => {
                            *slot = Some(info.to_string());
                            true
                        }
                        None => false,
                    }
                });
                if !captured {
                    previous(info);
                }
            }));
        });
    }

    /// Runs `f`; a panic in it becomes `Err(message)`.
    pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
        CAPTURE.with(|c| *c.borrow_mut() = Some(None));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let msg = CAPTURE.with(|c| c.borrow_mut().take().flatten());
        r.map_err(|_| msg.unwrap_or_else(|| "panic without a message".into()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::*;
    use crate::request::{Context, TaskRequest};

    /// A one-hour one-shot with two messages (shared by the store's test modules).
    pub(crate) fn task(id: &str) -> (Task, Vec<Message>) {
        let req: TaskRequest = serde_json::from_value(serde_json::json!({
            "id": id, "schedule": {"after": "1h"}, "to": ["a", "b"], "body": "hello"
        }))
        .unwrap();
        req.into_task(&Context {
            now_ms: 1_800_000_000_000,
            limits: &Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap()
    }

    /// The failure-list entry of message 0 of run 1 of `task_id`.
    pub(crate) fn failure_of(task_id: &str) -> Failure {
        Failure {
            id: delivery_key(task_id, 1, 0),
            task_id: task_id.into(),
            run: 1,
            seq: 0,
            to: "a".into(),
            channel: "log".into(),
            attempts: 3,
            last_error: "HTTP 500".into(),
            failed_at_ms: 9,
            retrying: false,
            retries: 0,
        }
    }

    async fn insert(s: &Store, id: &str) {
        let (t, m) = task(id);
        assert!(matches!(
            s.insert_new_task(&t, &m, None).await.unwrap(),
            Inserted::Created
        ));
    }

    #[tokio::test]
    async fn tasks_messages_runs_and_failures_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            insert(&s, "t1").await;
            let mut b = Batch::new();
            b.run("t1", &Run::new(1, 5, 6, 1))
                .run("t1", &Run::new(2, 7, 8, 1));
            b.failure(failure_of("t1"));
            s.write(&b).await.unwrap();
            let stats = s.commit_stats();
            assert_eq!(stats.flushes.load(std::sync::atomic::Ordering::Relaxed), 2);
        }
        let s = Store::open(dir.path()).unwrap();
        let t = s.get_task("t1").unwrap().unwrap();
        assert_eq!((t.id.as_str(), t.message_count), ("t1", 2));
        assert_eq!(s.get_message("t1", 1).unwrap().unwrap().to, "b");
        assert!(s.get_message("t1", 2).unwrap().is_none());
        let runs = s.runs_of("t1").unwrap();
        assert_eq!(runs.iter().map(|r| r.run).collect::<Vec<_>>(), vec![1, 2]);
        let (f, more) = s.failure_page(Some("t1"), None, 10).unwrap();
        assert_eq!((f.len(), more), (1, false));
        let live: Vec<_> = s.live_entries().map(|e| e.unwrap().0).collect();
        assert_eq!(live, ["t1"]);
    }

    #[tokio::test]
    async fn a_spec_without_progress_is_a_task_gone_only_once_its_spec_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let corrupt = || -> TaskRead {
            Err(StoreError::Corrupt {
                tree: "progress".into(),
                key: "t1".into(),
                detail: "missing".into(),
            })
        };
        // Deleted between the reads: nothing there on the second look.
        assert!(matches!(s.gone_meanwhile("t1", true, corrupt()), Ok(None)));
        // Still there: corrupt for real, and reported.
        insert(&s, "t1").await;
        assert!(matches!(
            s.gone_meanwhile("t1", true, corrupt()),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(s.get_task("t1").unwrap().is_some());
    }

    #[tokio::test]
    async fn finished_tasks_leave_the_live_index_and_progress_writes_keep_the_spec() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        insert(&s, "a").await;
        insert(&s, "b").await;
        let mut a = s.get_task("a").unwrap().unwrap();
        a.state = TaskState::Cancelled;
        a.name = Some("not written by a progress write".into());
        let mut batch = Batch::new();
        batch.progress(&a);
        s.write(&batch).await.unwrap();
        let live: Vec<_> = s.live_entries().map(|e| e.unwrap().0).collect();
        assert_eq!(live, ["b"]);
        let back = s.get_task("a").unwrap().unwrap();
        assert_eq!((back.state, back.name), (TaskState::Cancelled, None));
    }

    /// The due index of a store, as (task id, state, next fire) in index order.
    fn due_order(s: &Store) -> Vec<(String, TaskState, Option<u64>)> {
        s.due_entries(&[])
            .map(|e| {
                let (_, id, e) = e.unwrap();
                (id, e.state, e.next_fire_at_ms)
            })
            .collect()
    }

    #[tokio::test]
    async fn the_due_index_follows_the_live_index_in_start_up_order() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        for id in ["a", "b", "c", "d"] {
            insert(&s, id).await;
        }
        let at = |id: &str| s.get_task(id).unwrap().unwrap();
        let (mut a, mut b, mut c, mut d) = (at("a"), at("b"), at("c"), at("d"));
        a.next_fire_at_ms = Some(300);
        b.next_fire_at_ms = Some(100);
        c.state = TaskState::Paused;
        d.state = TaskState::Running;
        let mut batch = Batch::new();
        for t in [&a, &b, &c, &d] {
            batch.progress(t);
        }
        s.write(&batch).await.unwrap();
        assert_eq!(
            due_order(&s),
            [
                ("d".into(), TaskState::Running, d.next_fire_at_ms),
                ("b".into(), TaskState::Pending, Some(100)),
                ("a".into(), TaskState::Pending, Some(300)),
                ("c".into(), TaskState::Paused, c.next_fire_at_ms),
            ]
        );
        // Listings by running or paused state walk only those tasks, in id order.
        let ids = |walk: Walk, after: Option<&str>| -> Vec<String> {
            let (page, _, bad) = s.task_page(after, 10, walk, |_| true).unwrap();
            assert!(bad.is_empty());
            page.into_iter().map(|t| t.id).collect()
        };
        assert_eq!(ids(Walk::Running, None), ["d"]);
        assert_eq!(ids(Walk::Paused, None), ["c"]);
        assert!(ids(Walk::Paused, Some("c")).is_empty());
        assert_eq!(ids(Walk::All, None), ["a", "b", "c", "d"]);
        // A move, a finish and two writes of one task in one group: one entry per live task.
        b.next_fire_at_ms = Some(500);
        d.state = TaskState::Completed;
        a.next_fire_at_ms = Some(400);
        let mut batch = Batch::new();
        batch.progress(&b);
        batch.progress(&d);
        batch.progress(&a);
        a.next_fire_at_ms = Some(50);
        batch.progress(&a);
        s.write(&batch).await.unwrap();
        assert_eq!(
            due_order(&s),
            [
                ("a".into(), TaskState::Pending, Some(50)),
                ("b".into(), TaskState::Pending, Some(500)),
                ("c".into(), TaskState::Paused, c.next_fire_at_ms),
            ]
        );
        assert_eq!(s.live_entries().count(), 3);
    }

    #[tokio::test]
    async fn a_format_2_directory_gets_its_due_index_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            for id in ["x", "y", "z"] {
                insert(&s, id).await;
            }
        }
        {
            // What a format 2 build left: no due index.
            let db = crate::store::legacy::tests::sled_open(dir.path());
            db.open_tree("due").unwrap().clear().unwrap();
            db.open_tree("meta")
                .unwrap()
                .insert("format", &[2])
                .unwrap();
            db.flush().unwrap();
        }
        let s = crate::store::legacy::tests::store_open(dir.path());
        let ids: Vec<String> = due_order(&s).into_iter().map(|e| e.0).collect();
        assert_eq!(ids, ["x", "y", "z"]);
    }

    #[tokio::test]
    async fn many_writers_share_groups_and_each_is_answered_after_its_flush() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(Store::open(dir.path()).unwrap());
        let mut handles = Vec::new();
        for i in 0..200 {
            let s = s.clone();
            handles.push(tokio::spawn(async move {
                let (t, m) = task(&format!("t{i:03}"));
                s.insert_new_task(&t, &m, None).await.unwrap()
            }));
        }
        for h in handles {
            assert!(matches!(h.await.unwrap(), Inserted::Created));
        }
        let flushes = s
            .commit_stats()
            .flushes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            flushes < 200,
            "200 concurrent creates took {flushes} flushes"
        );
        assert_eq!(s.live_entries().count(), 200);
    }

    #[tokio::test]
    async fn id_and_key_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (t, m) = task("same");
        assert!(matches!(
            s.insert_new_task(&t, &m, Some(("k1", [1; 32])))
                .await
                .unwrap(),
            Inserted::Created
        ));
        assert!(matches!(
            s.insert_new_task(&t, &m, None).await.unwrap(),
            Inserted::IdTaken
        ));
        let (other, m2) = task("other");
        match s
            .insert_new_task(&other, &m2, Some(("k1", [2; 32])))
            .await
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
        assert!(s.get_message("other", 0).unwrap().is_none());
    }

    #[tokio::test]
    async fn pages_and_prefix_scans_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        for id in ["a", "a:b", "b", "c"] {
            insert(&s, id).await;
            let mut b = Batch::new();
            b.run(id, &Run::new(1, 0, 0, 1));
            s.write(&b).await.unwrap();
        }
        assert_eq!(
            s.runs_of("a").unwrap().len(),
            1,
            "runs of a:b are not runs of a"
        );
        let ids = |p: &[Task]| p.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        let (p, next, _) = s.task_page(None, 2, Walk::All, |_| true).unwrap();
        assert_eq!(ids(&p), ["a", "a:b"]);
        assert_eq!(next.as_deref(), Some("a:b"));
        let (p, next, _) = s.task_page(Some("a:b"), 2, Walk::All, |_| true).unwrap();
        assert_eq!(ids(&p), ["b", "c"]);
        assert_eq!(next, None);
    }

    #[tokio::test]
    async fn corrupt_task_is_reported_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        insert(&s, "good").await;
        s.raw_insert_task_bytes("bad", &[1, 0xff, 0xff])
            .await
            .unwrap();
        let (p, _, bad) = s.task_page(None, 10, Walk::All, |_| true).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].to_string().contains("\"bad\""), "{}", bad[0]);
        assert!(s.get_task("bad").is_err());
    }

    #[tokio::test]
    async fn sled_reopens_in_place_and_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let backend = std::sync::Arc::new(SledBackend::open(dir.path(), 8 << 20).unwrap());
        let s = Store::with_backend(backend.clone()).unwrap();
        insert(&s, "before").await;
        backend.recover().unwrap();
        insert(&s, "after").await;
        assert!(s.get_task("before").unwrap().is_some());
        assert!(s.get_task("after").unwrap().is_some());
        assert_eq!(s.live_entries().count(), 2);
    }

    #[tokio::test]
    async fn failed_writes_change_nothing_and_storage_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let sled = SledBackend::open(dir.path(), 8 << 20).unwrap();
        let faults = std::sync::Arc::new(fault::Faults::default());
        let backend = fault::FaultyBackend {
            inner: std::sync::Arc::new(sled),
            faults: faults.clone(),
        };
        let s = Store::with_backend(std::sync::Arc::new(backend)).unwrap();
        faults.set(true, false);
        let (t, m) = task("x");
        assert!(s.insert_new_task(&t, &m, None).await.is_err());
        assert!(s.failing().is_some());
        assert!(
            s.get_task("x").unwrap().is_none(),
            "a refused group writes nothing"
        );
        faults.set(false, false);
        assert!(matches!(
            s.insert_new_task(&t, &m, None).await.unwrap(),
            Inserted::Created
        ));
        assert!(
            s.failing().is_none(),
            "health comes back with the first good group"
        );
    }

    fn run_in(n: u32, state: RunState) -> Run {
        let mut r = Run::new(n, 1_000 * u64::from(n), 1_000 * u64::from(n), 2);
        r.state = state;
        r
    }

    #[tokio::test]
    async fn the_active_index_follows_every_run_write_and_trims_skip_running_runs() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let mut b = Batch::new();
        for n in 1..=5 {
            b.run("t", &run_in(n, RunState::Running));
        }
        s.write(&b).await.unwrap();
        let active = |s: &Store| -> Vec<u32> {
            s.active_runs_of("t")
                .unwrap()
                .iter()
                .map(|r| r.run)
                .collect()
        };
        assert_eq!(active(&s), vec![1, 2, 3, 4, 5]);
        let mut b = Batch::new();
        b.run("t", &run_in(1, RunState::Completed))
            .run("t", &run_in(3, RunState::Skipped))
            .run("t", &run_in(4, RunState::Cancelled));
        s.write(&b).await.unwrap();
        assert_eq!(active(&s), vec![2, 5]);
        // Below 5: runs 1, 3, 4 go; 2 is still running and stays.
        let mut b = Batch::new();
        b.trim_runs("t", 5);
        s.write(&b).await.unwrap();
        let left: Vec<u32> = s.runs_of("t").unwrap().iter().map(|r| r.run).collect();
        assert_eq!(left, vec![2, 5]);
        // Deleting the task's footprint takes its index entries too.
        let mut b = Batch::new();
        b.ops.push(Op::DeleteTask(purge::Footprint {
            id: "t".into(),
            messages: 0,
            runs: vec![2, 5],
            failures: vec![],
            settling: false,
        }));
        s.write(&b).await.unwrap();
        assert!(active(&s).is_empty());
        assert!(s.backend.scan(TreeId::Active, &[], None).next().is_none());
    }

    /// A create whose spec record could not be read back (its only message past the decoder's
    /// limit) is refused at once, typed, with nothing stored: before, it was acknowledged and
    /// the task then read as corrupt for good.
    #[tokio::test]
    async fn a_task_too_big_to_read_back_is_refused_and_nothing_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (mut t, _) = task("big");
        t.message_count = 1;
        let m = Message {
            to: "a".into(),
            body: "x".repeat(codec::DECODE_LIMIT_BYTES + 1),
            data: None,
            tz: None,
        };
        match s.insert_new_task(&t, std::slice::from_ref(&m), None).await {
            Err(StoreError::Encode(e)) => assert!(e.contains("read back"), "{e}"),
            other => panic!("{:?}", other.map(|_| "inserted")),
        }
        assert!(s.backend.get(TreeId::Specs, b"big").unwrap().is_none());
        assert!(s.task_ids().next().is_none(), "nothing stored");
        // The same id with a message that fits is created as usual.
        let small = Message {
            body: "x".into(),
            ..m
        };
        assert!(matches!(
            s.insert_new_task(&t, &[small], None).await.unwrap(),
            Inserted::Created
        ));
        assert_eq!(s.task_image("big").unwrap().unwrap().messages.len(), 1);
    }

    /// A directory of a newer format (a newer build's, met on a rollback) is refused before
    /// anything in it changes: its log is not replayed, cut or added to, so the build that
    /// wrote it finds every one of its writes again.
    #[test]
    fn a_newer_format_is_refused_before_its_log_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = crate::store::legacy::tests::sled_open(dir.path());
            crate::store::legacy::tests::set_format(&db, DIR_FORMAT + 1);
            db.flush().unwrap();
        }
        // A synced record, then a torn append after it (which an open cuts off).
        let write = wal::Write {
            tree: TreeId::Specs,
            key: b"k".to_vec(),
            value: Some(b"v".to_vec()),
        };
        let mut bytes = Vec::new();
        wal::encode_record(&[write], &mut bytes);
        bytes.extend_from_within(..bytes.len() - 3);
        std::fs::write(wal::segment_path(dir.path(), 5), &bytes).unwrap();
        let log = || -> Vec<(String, Vec<u8>)> {
            let mut files: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("wal-"))
                .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
                .collect();
            files.sort();
            files
        };
        let before = log();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let e = loop {
            match Store::open(dir.path()) {
                Ok(_) => panic!("a newer format opened"),
                Err(e) if format!("{e:?}").contains("could not acquire lock") => {
                    assert!(std::time::Instant::now() < deadline, "sled's lock held");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => break e,
            }
        };
        assert!(
            matches!(e, StoreError::Version { found, .. } if found == DIR_FORMAT + 1),
            "{e}"
        );
        assert!(log() == before, "the log is as it was");
    }

    #[test]
    fn a_format_4_directory_gets_its_active_index_built_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            // What format 4 wrote: run records, no `active_runs` tree, no log records.
            let db = crate::store::legacy::tests::sled_open(dir.path());
            let runs = db.open_tree("runs").unwrap();
            for (n, state) in [(1, RunState::Completed), (2, RunState::Running)] {
                runs.insert(run_key("old", n), encode(&run_in(n, state)).unwrap())
                    .unwrap();
            }
            db.open_tree("meta")
                .unwrap()
                .insert("format", &[4])
                .unwrap();
            db.flush().unwrap();
        }
        let s = crate::store::legacy::tests::store_open(dir.path());
        let active: Vec<u32> = s
            .active_runs_of("old")
            .unwrap()
            .iter()
            .map(|r| r.run)
            .collect();
        assert_eq!(active, vec![2]);
        assert_eq!(s.runs_of("old").unwrap().len(), 2);
    }
}
