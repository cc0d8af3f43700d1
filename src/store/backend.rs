//! The storage boundary: the few operations the engine needs from a key-value store, so that a
//! second backend (a replicated one, say) can sit behind [`super::Store`] without touching the
//! engine. sled is the embedded default ([`SledBackend`]); tests wrap it to inject faults.
//!
//! The contract:
//! - [`Backend::apply`] applies a group of jobs; each job is atomic on its own (all of its
//!   writes or none) and guarded by its preconditions (keys that must be absent). The result
//!   says, per job, whether it was applied or which precondition failed.
//! - [`Backend::sync`] makes everything applied before it durable (survives power loss) and
//!   visible to reads. The commit thread calls `apply` then `sync` for each group.
//! - Point reads and ordered scans by tree.

use std::fs::File;
use std::path::{Path, PathBuf};

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use super::memtable::{self, Layer, Mem};
use super::pace;
use super::space;
use super::wal::{self, Segment, Write};
use super::StoreError;

/// The trees. Keys are ordered byte strings (see `store/mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TreeId {
    Specs,
    Progress,
    Live,
    Messages,
    Runs,
    Failures,
    Idem,
    /// Secondary index of `Live` in start-up order (see `records::due_key`).
    Due,
    /// The runs that are `running`, keyed like `Runs`, with empty values (`store/mod.rs`).
    Active,
}

/// How many trees there are.
pub const TREES: usize = 9;

impl TreeId {
    pub const ALL: [TreeId; TREES] = [
        TreeId::Specs,
        TreeId::Progress,
        TreeId::Live,
        TreeId::Messages,
        TreeId::Runs,
        TreeId::Failures,
        TreeId::Idem,
        TreeId::Due,
        TreeId::Active,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TreeId::Specs => "specs",
            TreeId::Progress => "progress",
            TreeId::Live => "live",
            TreeId::Messages => "messages",
            TreeId::Runs => "runs",
            TreeId::Failures => "failures",
            TreeId::Idem => "idempotency",
            TreeId::Due => "due",
            TreeId::Active => "active_runs",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One write of a job, already encoded.
#[derive(Clone, Debug)]
pub enum RawOp {
    Put(TreeId, Vec<u8>, Vec<u8>),
    Delete(TreeId, Vec<u8>),
    /// Precondition: the job applies only if this key is absent.
    Absent(TreeId, Vec<u8>),
    /// Puts (`Some`) or deletes (`None`) `key` in `tree` and keeps a secondary index of that
    /// tree in step, in the same job: the index entry of the value being replaced is removed
    /// and one for the new value is put (its value a copy of the primary value).
    /// `index_key(key, value)` derives an index key. Rewriting a value unchanged writes
    /// nothing. The writer need not know the old value: the backend reads it.
    Indexed(Box<IndexedWrite>),
}

/// See [`RawOp::Indexed`].
#[derive(Clone, Debug)]
pub struct IndexedWrite {
    pub tree: TreeId,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    pub index: TreeId,
    pub index_key: fn(&[u8], &[u8]) -> Vec<u8>,
    /// The writer knows the store holds no value of `key` when the job's preconditions hold
    /// (a new task's live entry: a live entry is never stored without its spec, and the job
    /// requires the spec to be absent), so the backend need not read it.
    pub stored_absent: bool,
}

/// Why a job was not applied: the first precondition that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub tree: TreeId,
    pub key: Vec<u8>,
}

/// A key and its value.
pub type Kv = (Vec<u8>, Vec<u8>);

pub type KvIter<'a> = Box<dyn Iterator<Item = Result<Kv, StoreError>> + Send + 'a>;

pub trait Backend: Send + Sync + 'static {
    /// Takes the jobs by value: their keys and values move into the log and the memtable.
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError>;
    fn sync(&self) -> Result<(), StoreError>;
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keys `>= start` in order; with `prefix`, only keys that start with it.
    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a>;
    /// Called by the commit thread after a group failed: a backend whose failures stick (sled)
    /// starts afresh here. The default does nothing.
    fn recover(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The last key with `prefix`, if any.
    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError>;
    /// Several point reads that see one state: no group is applied half-way between them
    /// (an export reads each task this way). The default reads one by one, which is atomic
    /// only for a backend that applies nothing concurrently.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }
    /// Bytes written and not yet in the backend's index (a write-behind memtable); 0 for a
    /// backend without one.
    fn memtable_bytes(&self) -> usize {
        0
    }
}

/// sled 0.34 behind a write-ahead log (`store/wal.rs`) and a write-behind memtable
/// (`store/memtable.rs`):
/// - `apply` resolves a group into plain writes (preconditions checked, secondary index keys
///   derived, reading the memtable, sled and the group's own earlier writes) and appends them
///   to the log as one record;
/// - `sync` makes the record durable with one `fdatasync` and puts its writes in the
///   memtable's active layer, where reads see them at once;
/// - the applier thread (`herald-apply`, at idle CPU priority) takes frozen layers, writes
///   them to sled (one write per key however often it was written), flushes sled, deletes the
///   log segments the layer covers, and only then drops the layer.
///
/// So the commit thread never writes to sled: a group costs one append, one sync and a few
/// B-tree inserts in memory. Reads look in the memtable before sled ([`MergedScan`] for scans).
///
/// Memory is bounded: the active layer is frozen at [`FREEZE_BYTES`] or [`FREEZE_AGE`], and
/// a group waits (so the queue fills and creates get 503) while it is over [`ACTIVE_MAX_BYTES`]
/// and the applier is still busy with the previous layer.
///
/// sled 0.34 remembers an I/O error (a full disk, say) and fails every later operation with it,
/// even after the disk works again. When the applier meets one, writes are refused until the
/// commit thread's [`Backend::recover`] has reopened sled; the applier then writes the frozen
/// layer again (every write carries its whole value, so that is idempotent). Nothing is lost
/// meanwhile: what sled may not hold is in the layers and in the log.
pub struct SledBackend {
    shared: Arc<Shared>,
    applier: Option<std::thread::JoinHandle<()>>,
}

/// A frozen layer is made once the active one holds this much ...
pub const FREEZE_BYTES: usize = 4 << 20;
/// ... or once its first write is this old (so that memory and replay stay small when idle).
pub const FREEZE_AGE: Duration = Duration::from_secs(1);
/// Over this, a group waits for the applier to finish the frozen layer (back-pressure).
pub const ACTIVE_MAX_BYTES: usize = 32 << 20;

struct Shared {
    dir: PathBuf,
    cache_bytes: u64,
    /// `None` only while a reopen failed; every operation then fails until the next one.
    inner: RwLock<Option<SledInner>>,
    /// The segment being appended to and the group `apply` resolved for `sync`.
    log: Mutex<Log>,
    mem: RwLock<Mem>,
    /// The applier's inbox; `done` is signalled (under this lock) when a frozen layer is
    /// dropped, `work` when there is something for the applier.
    applier: Mutex<Inbox>,
    work: Condvar,
    done: Condvar,
    /// The applier met a sled error: writes are refused until `recover` reopened sled.
    sled_failed: AtomicBool,
    /// Groups applied so far, and when the last one came (µs since `epoch`): the applier
    /// holds back while they come fast (`store/pace.rs`).
    groups: AtomicU64,
    last_group_us: AtomicU64,
    epoch: Instant,
    /// A write waited for room since the applier last looked: it must not hold back.
    pressed: AtomicBool,
    /// The applier's pacing state (only the applier thread takes it).
    pacer: Mutex<pace::Pacer>,
    /// Per tree, no key in sled is above this (see [`SledFences`]).
    sled_fences: Mutex<SledFences>,
    /// The applier waits for free space before it writes a layer into sled (`store/space.rs`):
    /// a write that would wait for room fails at once instead.
    low_space: AtomicBool,
    /// An old sled handle being closed on its own thread (see [`SledBackend::reopen_sled`]):
    /// answers once the close is done. Until then sled's lock on the directory is held.
    closing: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// How long a reopen waits for the old sled handle to close before it reports it stuck and
/// tries again later (the close goes on in the background).
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Longest a group waits for room in the memtable before it fails.
const ROOM_WAIT_MAX: Duration = Duration::from_secs(5);
/// How often the applier looks at free space again while it waits for some.
const SPACE_POLL: Duration = Duration::from_millis(200);

/// Per tree, a key no smaller than any key sled holds, or `None` while unknown.
///
/// Why: a point read that misses the memtable walks sled, and most misses are of keys newer
/// than anything sled has: every create requires its task's id absent, and ids herald makes
/// grow with time, as most a client makes do. Under concurrency they arrive a little out of
/// order, so the bound is sled's alone: the memtable holds the last second or more of writes,
/// so a new id is found there or is above what sled has. That read was ~15 % of the commit
/// thread in a burst of creates.
///
/// Invariant: every key in sled is at or below its tree's fence. The applier raises it to a
/// layer's last key *before* it writes the layer into sled (so before the layer leaves the
/// memtable: a read that misses the memtable after the drop sees the raised fence); deletes
/// leave it where it is; it is worked out at the first miss that needs it (the memtable's
/// layers, then sled's last key) and forgotten (`None`) when sled was written directly
/// (`SledBackend::written_directly`, after a migration at open).
///
/// Its limit: one fence per tree, so a key that sorts above every id herald makes (a client id
/// such as `morning-digest`: herald's begin with hex milliseconds, `019…` today) lifts the
/// fence for good, and from then on herald's own new ids are read from sled as before. Speed
/// only, never a wrong answer.
type SledFences = [Option<Vec<u8>>; TREES];

#[derive(Default)]
struct Inbox {
    /// A frozen layer and the closed segments it covers.
    layer: Option<(Arc<Layer>, Vec<PathBuf>)>,
    /// A segment was taken: make a spare.
    spare: bool,
    stop: bool,
}

struct Log {
    /// `None` only after a segment could not be created; appends then fail until `recover`.
    seg: Option<Segment>,
    /// Resolved by `apply`, appended, not yet durable nor in the memtable.
    pending: Option<Vec<Write>>,
    /// Segments closed since the last freeze: every record in them is in the active layer or
    /// an older one. The next freeze covers them.
    closed: Vec<PathBuf>,
}

impl Log {
    /// Forgets a group whose `sync` never came or failed: it is cut off the log, so it is
    /// never replayed. Also finishes a cut back that failed before (a no-op when the log
    /// holds nothing that is not durable).
    fn discard(&mut self) -> Result<(), StoreError> {
        self.pending = None;
        if let Some(seg) = &mut self.seg {
            seg.cut_back()?;
        }
        Ok(())
    }
}

struct SledInner {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    /// sled 0.34's `flush` uses `sync_file_range`, which does not survive power loss; syncing
    /// its data file (`db`) as well does.
    data_file: Option<File>,
}

impl SledInner {
    fn open(dir: &Path, cache_bytes: u64) -> Result<SledInner, StoreError> {
        std::fs::create_dir_all(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()?;
        let mut trees = Vec::new();
        for t in TreeId::ALL {
            trees.push(db.open_tree(t.name())?);
        }
        let data_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("db"))
            .ok();
        if data_file.is_none() {
            tracing::warn!(dir = %dir.display(), "sled data file not found; flushes will not fsync it");
        }
        Ok(SledInner {
            db,
            trees,
            data_file,
        })
    }

    /// Makes everything applied to sled so far durable.
    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        if let Some(f) = &self.data_file {
            f.sync_data()?;
        }
        Ok(())
    }

    /// Writes a frozen layer into sled, one write per key, and flushes sled. No `sled::Batch`
    /// and no transaction: the log already makes a group atomic (a crash half-way is replayed
    /// whole), readers see the layer until it is dropped, and a batch per tree costs sled a
    /// batch manifest and its exclusive lock each. `pace` runs before every 1 024 keys (it may
    /// wait, `store/pace.rs`); it returning `true` stops the write early, with an error.
    fn write_layer(&self, layer: &Layer, pace: &dyn Fn() -> bool) -> Result<(), StoreError> {
        for t in TreeId::ALL {
            let tree = &self.trees[t.index()];
            for (i, (k, v)) in layer.entries(t).enumerate() {
                if i % 1024 == 0 && pace() {
                    return Err(StoreError::Write("stopping".into()));
                }
                match v {
                    Some(v) => {
                        tree.insert(k.as_slice(), v.as_slice())?;
                    }
                    None => {
                        tree.remove(k.as_slice())?;
                    }
                }
            }
        }
        self.flush()
    }
}

fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Puts the calling thread in `SCHED_IDLE`: the applier's work can wait while the engine has
/// fires and sends to make, and takes the idle time. (Nice 10 was not enough: in a herd the
/// applier still took a third of the CPU, and the drain stalled behind it.) When the engine
/// keeps both cores busy for long, the active layer reaches [`ACTIVE_MAX_BYTES`], writes wait,
/// and the applier gets the CPU: back-pressure, not starvation. Best effort.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower the applier's priority");
    }
}

impl Shared {
    fn closed_error(&self) -> StoreError {
        StoreError::Write(format!(
            "the data directory {} is closed after a failed reopen",
            self.dir.display()
        ))
    }

    /// Closes the open segment (if it holds anything) and starts the next one; the closed one
    /// waits in `log.closed` for the next freeze.
    fn rotate(&self, log: &mut Log) {
        let Some(seg) = log.seg.as_mut() else { return };
        if seg.is_empty() {
            return;
        }
        match Segment::create(&self.dir, seg.n + 1) {
            Ok(fresh) => {
                let closed = std::mem::replace(seg, fresh);
                log.closed.push(closed.path.clone());
                self.applier.lock().spare = true;
                self.work.notify_one();
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a new write-ahead log segment; appending to the old one")
            }
        }
    }

    /// Hands the active layer to the applier if none is frozen and `due(active)`. Called with
    /// the log locked, so no group is between its append and its insert into the memtable:
    /// the segments closed so far hold nothing that is not in this layer or an older one.
    fn freeze_if(&self, log: &mut Log, due: impl Fn(&Layer) -> bool) {
        if log.pending.is_some() {
            // A group is appended and not yet synced: its segment must stay the open one.
            return;
        }
        {
            let m = self.mem.read();
            if m.frozen.is_some() || m.active.is_empty() || !due(&m.active) {
                return;
            }
        }
        self.rotate(log);
        let covered = std::mem::take(&mut log.closed);
        let layer = self.mem.write().freeze();
        self.applier.lock().layer = Some((layer, covered));
        self.work.notify_one();
    }

    /// Waits while the active layer is over [`ACTIVE_MAX_BYTES`] and a layer is still frozen.
    /// Fails at once while the applier cannot write (sled failed, or no free space): then the
    /// wait could be without end, and the writer is better told so.
    fn wait_for_room(&self) -> Result<(), StoreError> {
        let mut inbox = self.applier.lock();
        let started = Instant::now();
        loop {
            {
                let m = self.mem.read();
                if m.active.bytes < ACTIVE_MAX_BYTES || m.frozen.is_none() {
                    return Ok(());
                }
            }
            if self.sled_failed.load(Ordering::SeqCst) {
                return Err(sled_behind());
            }
            if self.low_space.load(Ordering::SeqCst) {
                let free = space::free_bytes(&self.dir).unwrap_or(0);
                return Err(space::full(&self.dir, free, space::WRITE_RESERVE));
            }
            if started.elapsed() >= ROOM_WAIT_MAX {
                // The applier is stuck (a flush that never returns, say): fail the group, so
                // health says so and writes are refused up front, instead of queueing without
                // an answer.
                return Err(StoreError::Write(format!(
                    "the applier has not taken the memtable for {} s; writes are refused until it does",
                    ROOM_WAIT_MAX.as_secs()
                )));
            }
            self.pressed.store(true, Ordering::Relaxed);
            tracing::debug!("memtable full: the write waits for the applier");
            self.done.wait_for(&mut inbox, Duration::from_millis(100));
        }
    }

    /// Raises the fences over a layer about to be written into sled (see [`SledFences`]).
    fn raise_sled_fences(&self, layer: &Layer) {
        let mut fences = self.sled_fences.lock();
        for t in TreeId::ALL {
            if let (Some(last), Some(f)) = (layer.last_key(t), &mut fences[t.index()]) {
                if last > f.as_slice() {
                    *f = last.to_vec();
                }
            }
        }
    }

    /// Whether `key` is above every key sled holds in `tree`, so a read of sled would miss.
    fn above_sled_fence(&self, tree: TreeId, key: &[u8]) -> Result<bool, StoreError> {
        let mut fences = self.sled_fences.lock();
        let fence = match &fences[tree.index()] {
            Some(f) => f,
            None => fences[tree.index()].insert(self.sled_fence_now(tree)?),
        };
        Ok(key > fence.as_slice())
    }

    /// A fence worked out afresh: the last key of every layer, then sled's. A layer the
    /// applier is writing now (its raise found the fence unknown) is still in the memtable,
    /// and one dropped between the two reads is in sled by then: keys move from the memtable
    /// to sled, never back. Every later layer raises the fence itself.
    fn sled_fence_now(&self, tree: TreeId) -> Result<Vec<u8>, StoreError> {
        let in_layers = {
            let m = self.mem.read();
            let last = |l: &Layer| l.last_key(tree).map(|k| k.to_vec());
            last(&m.active).max(m.frozen.as_deref().and_then(last))
        };
        let in_sled = match &*self.inner.read() {
            Some(i) => i.trees[tree.index()].last()?.map(|(k, _)| k.to_vec()),
            None => return Err(self.closed_error()),
        };
        Ok(in_layers.max(in_sled).unwrap_or_default())
    }

    /// Writes one frozen layer to sled until it is there and durable (retrying after a
    /// reopen), deletes the segments it covers, then drops it. `false`: stopping.
    fn apply_layer(&self, layer: &Layer, covered: &[PathBuf]) -> bool {
        let stop = || self.applier.lock().stop;
        let started = Instant::now();
        let waited = std::cell::Cell::new(Duration::ZERO);
        let pace = || self.hold_back(&waited);
        self.raise_sled_fences(layer);
        loop {
            if !self.wait_for_space(layer.bytes) {
                return false;
            }
            let r = match &*self.inner.read() {
                Some(i) => i.write_layer(layer, &pace),
                None => Err(self.closed_error()),
            };
            match r {
                Ok(()) => break,
                Err(_) if stop() => return false,
                Err(e) => {
                    tracing::warn!(error = %e, keys = layer.len(), "writing the memtable into sled failed; writes wait for a reopen, then it is written again");
                    self.sled_failed.store(true, Ordering::SeqCst);
                    let mut inbox = self.applier.lock();
                    while self.sled_failed.load(Ordering::SeqCst) && !inbox.stop {
                        self.work.wait_for(&mut inbox, Duration::from_millis(100));
                    }
                    if inbox.stop {
                        return false;
                    }
                }
            }
        }
        tracing::debug!(
            keys = layer.len(),
            bytes = layer.bytes,
            segments = covered.len(),
            took_ms = started.elapsed().as_millis() as u64,
            held_back_ms = waited.get().as_millis() as u64,
            "memtable layer written into sled"
        );
        // sled holds the layer durably: its segments may go. One that cannot be removed now
        // is replayed (idempotently) at the next open.
        let removed = covered
            .iter()
            .try_for_each(|p| remove_if_there(p))
            .and_then(|()| wal::sync_dir(&self.dir));
        if let Err(e) = removed {
            tracing::warn!(error = %e, "could not delete checkpointed write-ahead log segments; they are replayed at the next start");
        }
        let _inbox = self.applier.lock();
        self.mem.write().drop_frozen();
        self.done.notify_all();
        true
    }

    /// Waits (applier) until a layer of `bytes` may go into sled (`store/space.rs`). `false`:
    /// stopping.
    fn wait_for_space(&self, bytes: usize) -> bool {
        loop {
            let free = space::free_bytes(&self.dir);
            if space::may_apply(free, bytes) {
                if self.low_space.swap(false, Ordering::SeqCst) {
                    tracing::warn!(dir = %self.dir.display(), "free space is back: the memtable goes into sled again");
                }
                return true;
            }
            if !self.low_space.swap(true, Ordering::SeqCst) {
                tracing::error!(dir = %self.dir.display(), free_bytes = free.unwrap_or(0), layer_bytes = bytes,
                    "the disk is nearly full: the memtable waits in memory (it is in the log), writes are refused until space is freed");
            }
            let mut inbox = self.applier.lock();
            if inbox.stop {
                return false;
            }
            self.work.wait_for(&mut inbox, SPACE_POLL);
        }
    }

    /// Notes a group for the applier's pacing (commit thread).
    fn note_group(&self) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_micros() as u64;
        self.last_group_us.store(now, Ordering::Relaxed);
    }

    /// Called by the applier before each chunk of a layer: waits while the write path is busy
    /// (`store/pace.rs` decides; `waited` adds up the time held back for this layer). `true`:
    /// stopping.
    fn hold_back(&self, waited: &std::cell::Cell<Duration>) -> bool {
        loop {
            if self.applier.lock().stop {
                return true;
            }
            // No group for a whole poll: quiet, no need to watch.
            let since = self
                .epoch
                .elapsed()
                .as_micros()
                .saturating_sub(u128::from(self.last_group_us.load(Ordering::Relaxed)));
            let mut pacer = self.pacer.lock();
            if self.pressed.swap(false, Ordering::Relaxed) {
                pacer.pressed();
            }
            // Never blocks: the caller holds `inner.read()`, and other paths take `mem` before
            // `inner`. A layer being written or frozen right now is reason enough to go on.
            let Some(active) = self.mem.try_read().map(|m| m.active.bytes) else {
                return false;
            };
            if since > pace::POLL.as_micros() {
                pacer.quiet(active, FREEZE_BYTES);
                return false;
            }
            if !pacer.looks() {
                return false;
            }
            let (g0, t0) = (self.groups.load(Ordering::Relaxed), Instant::now());
            std::thread::sleep(pace::POLL);
            let span = t0.elapsed();
            let groups = self.groups.load(Ordering::Relaxed).saturating_sub(g0);
            let Some(active) = self.mem.try_read().map(|m| m.active.bytes) else {
                return false;
            };
            if !pacer.wait(groups, span, active, waited.get()) {
                return false;
            }
            waited.set(waited.get() + span);
        }
    }
}

fn sled_behind() -> StoreError {
    StoreError::Write("sled failed to take the memtable; waiting for a reopen".into())
}

/// The applier thread: frozen layers into sled, spare segments, and freezing an idle layer
/// once it is [`FREEZE_AGE`] old.
fn applier(shared: Arc<Shared>) {
    lower_priority();
    let spare = |dir: &Path| {
        if let Err(e) = wal::prepare_spare(dir) {
            tracing::warn!(error = %e, "could not make a spare write-ahead log segment; the next one is made when needed");
        }
    };
    spare(&shared.dir);
    loop {
        let (layer, make_spare) = {
            let mut inbox = shared.applier.lock();
            if inbox.layer.is_none() && !inbox.spare && !inbox.stop {
                shared.work.wait_for(&mut inbox, FREEZE_AGE / 4);
            }
            if inbox.stop {
                return;
            }
            (inbox.layer.take(), std::mem::take(&mut inbox.spare))
        };
        if let Some((layer, covered)) = layer {
            if !shared.apply_layer(&layer, &covered) {
                return;
            }
        }
        if make_spare {
            spare(&shared.dir);
        }
        // An idle layer: freeze it, unless the commit thread is in the middle of a group.
        if let Some(mut log) = shared.log.try_lock() {
            shared.freeze_if(&mut log, |a| {
                a.since.is_some_and(|t| t.elapsed() >= FREEZE_AGE)
            });
        }
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        self.shared.applier.lock().stop = true;
        self.shared.work.notify_all();
        if let Some(t) = self.applier.take() {
            let _ = t.join();
        }
    }
}

impl SledBackend {
    /// Opens sled in `dir` and reads what the log holds into the memtable (frozen at once, so
    /// the applier writes it into sled in the background while herald starts).
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, StoreError> {
        let inner = SledInner::open(dir, cache_bytes)?;
        let started = Instant::now();
        let (records, segs) = wal::read_all(dir)?;
        let mut mem = Mem::default();
        let n_records = records.len();
        for w in records.into_iter().flatten() {
            mem.active.insert(w, started);
        }
        let next = segs.last().map_or(1, |(n, _)| n + 1);
        let seg = Segment::create(dir, next)?;
        if mem.active.is_empty() {
            // Segments without a record (all zeros) hold nothing to keep.
            for (_, p) in &segs {
                remove_if_there(p)?;
            }
        } else {
            tracing::info!(
                records = n_records,
                segments = segs.len(),
                keys = mem.active.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "read the write-ahead log into memory; it goes into sled in the background"
            );
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            cache_bytes,
            inner: RwLock::new(Some(inner)),
            log: Mutex::new(Log {
                seg: Some(seg),
                pending: None,
                closed: segs.into_iter().map(|(_, p)| p).collect(),
            }),
            mem: RwLock::new(mem),
            applier: Mutex::new(Inbox::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            sled_failed: AtomicBool::new(false),
            groups: AtomicU64::new(0),
            last_group_us: AtomicU64::new(0),
            epoch: Instant::now(),
            pressed: AtomicBool::new(false),
            pacer: Mutex::new(pace::Pacer::default()),
            sled_fences: Mutex::new(Default::default()),
            low_space: AtomicBool::new(false),
            closing: Mutex::new(None),
        });
        shared.freeze_if(&mut shared.log.lock(), |_| true);
        let s = shared.clone();
        let applier = std::thread::Builder::new()
            .name("herald-apply".into())
            .spawn(move || applier(s))?;
        Ok(SledBackend {
            shared,
            applier: Some(applier),
        })
    }

    /// sled's handle (for `meta` and migrations at open, which write to sled directly: only
    /// a directory without log records needs one). Whoever writes through it calls
    /// [`SledBackend::written_directly`] when done (`Store::open_with` does, after them all).
    pub fn db(&self) -> Result<sled::Db, StoreError> {
        self.with(|i| i.db.clone())
    }

    /// Reopens sled; the applier then writes its frozen layer again. Nothing is replayed from
    /// the log: every write sled may have lost is still in a layer (a layer is dropped only
    /// after sled was flushed with it), so the fences stay true (sled holds no key it did not
    /// hold before).
    ///
    /// No lock is held across a call into sled that can block: after an I/O error sled's drop
    /// can wait forever for a flush, so the old handle is taken out under the write lock (a
    /// swap) and closed on a thread of its own, waited for at most [`CLOSE_WAIT`]. Meanwhile
    /// reads that need sled fail at once ("closed") instead of waiting. A close still running
    /// at the next attempt is waited for again; sled's lock on the directory is held until it
    /// ends. While the disk is too full to write a layer nothing is reopened (the old handle
    /// keeps serving reads).
    fn reopen_sled(&self) -> Result<(), StoreError> {
        let s = &self.shared;
        let free = space::free_bytes(&s.dir);
        if !space::may_apply(free, 0) {
            return Err(space::full(&s.dir, free.unwrap_or(0), space::APPLY_RESERVE));
        }
        let mut closing = s.closing.lock();
        if closing.is_none() {
            let old = s.inner.write().take();
            if let Some(old) = old {
                let (done, rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name("herald-sled-close".into())
                    .spawn(move || {
                        drop(old);
                        let _ = done.send(());
                    })?;
                *closing = Some(rx);
            }
        }
        if let Some(rx) = closing.as_ref() {
            match rx.recv_timeout(CLOSE_WAIT) {
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => *closing = None,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    return Err(StoreError::Write(format!(
                        "sled's old handle on {} has not closed after its I/O error (sled 0.34 can hang there); herald keeps trying, and a restart clears it",
                        s.dir.display()
                    )));
                }
            }
        }
        drop(closing);
        let fresh = SledInner::open(&s.dir, s.cache_bytes)?;
        *s.inner.write() = Some(fresh);
        s.sled_failed.store(false, Ordering::SeqCst);
        s.work.notify_all();
        tracing::warn!(dir = %s.dir.display(), "storage reopened");
        Ok(())
    }

    /// sled was written behind the memtable's back: its fences are worked out again.
    pub fn written_directly(&self) {
        *self.shared.sled_fences.lock() = Default::default();
    }

    fn with<T>(&self, f: impl FnOnce(&SledInner) -> T) -> Result<T, StoreError> {
        match &*self.shared.inner.read() {
            Some(i) => Ok(f(i)),
            None => Err(self.shared.closed_error()),
        }
    }

    fn tree(&self, t: TreeId) -> Result<sled::Tree, StoreError> {
        self.with(|i| i.trees[t.index()].clone())
    }

    /// A point read of sled alone.
    fn sled_get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(tree)?.get(key)?.map(|v| v.to_vec()))
    }
}

/// A group's writes so far, over the memtable and sled: what the next job of the group reads.
struct Resolver<'a> {
    backend: &'a SledBackend,
    /// Per tree, where the newest write of each key the group wrote is in `writes` (a value is
    /// not copied for it: most are never read again). One map per tree so that a read looks a
    /// key up by its slice, without copying it.
    seen: [HashMap<Vec<u8>, usize, foldhash::fast::RandomState>; TREES],
    writes: Vec<Write>,
}

impl Resolver<'_> {
    fn new(backend: &SledBackend, jobs: usize) -> Resolver<'_> {
        Resolver {
            backend,
            // Room for a create's writes per job: growing the maps was ~5 % of the thread.
            seen: std::array::from_fn(|_| {
                HashMap::with_capacity_and_hasher(jobs, Default::default())
            }),
            writes: Vec::with_capacity(jobs * 6),
        }
    }

    /// What the group wrote to `key`, if it did.
    fn written(&self, tree: TreeId, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let i = *self.seen[tree.index()].get(key)?;
        Some(self.writes[i].value.clone())
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.written(tree, key) {
            Some(v) => Ok(v),
            None => self.backend.get(tree, key),
        }
    }

    fn put(&mut self, tree: TreeId, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.seen[tree.index()].insert(key.clone(), self.writes.len());
        self.writes.push(Write { tree, key, value });
    }

    /// One job: its preconditions, then its writes.
    fn job(&mut self, ops: Vec<RawOp>) -> Result<Result<(), Rejected>, StoreError> {
        for op in &ops {
            if let RawOp::Absent(t, k) = op {
                if self.get(*t, k)?.is_some() {
                    return Ok(Err(Rejected {
                        tree: *t,
                        key: k.clone(),
                    }));
                }
            }
        }
        for op in ops {
            match op {
                RawOp::Put(t, k, v) => self.put(t, k, Some(v)),
                RawOp::Delete(t, k) => self.put(t, k, None),
                RawOp::Absent(..) => {}
                RawOp::Indexed(w) => {
                    let IndexedWrite {
                        tree,
                        key,
                        value,
                        index,
                        index_key,
                        stored_absent,
                    } = *w;
                    // The writer's promise covers what was stored before this group, not what
                    // an earlier job of the group wrote.
                    let old = match (self.written(tree, &key), stored_absent) {
                        (Some(v), _) => v,
                        (None, true) => {
                            debug_assert!(
                                self.backend.get(tree, &key)?.is_none(),
                                "a stored_absent promise was wrong"
                            );
                            None
                        }
                        (None, false) => self.backend.get(tree, &key)?,
                    };
                    if old == value {
                        continue;
                    }
                    if let Some(old) = &old {
                        self.put(index, index_key(&key, old), None);
                    }
                    if let Some(v) = &value {
                        self.put(index, index_key(&key, v), Some(v.clone()));
                    }
                    self.put(tree, key, value);
                }
            }
        }
        Ok(Ok(()))
    }
}

/// How many memtable entries a scan copies at a time.
const SCAN_CHUNK: usize = 256;

/// A forward scan over the memtable merged with sled. The memtable is read in chunks (a lock
/// per chunk, never held between `next` calls); a layer's entry wins over sled's for the same
/// key and a deletion hides it.
///
/// Why it sees every key that was there for the whole scan: a key moves from the memtable to
/// sled-only when its frozen layer is dropped, which happens after the layer is in sled and
/// bumps [`Mem::gen`]. Each chunk is read with the generation; when it changed since sled's
/// iterator was made, that iterator (which may have read a leaf before the layer got there)
/// is made again from the last key returned.
struct MergedScan<'a> {
    backend: &'a SledBackend,
    tree: TreeId,
    prefix: Option<Vec<u8>>,
    /// Everything up to here was returned (or skipped as deleted).
    lower: Bound<Vec<u8>>,
    mem: std::collections::VecDeque<memtable::Entry>,
    /// `mem` holds every memtable entry left in the range.
    mem_complete: bool,
    gen: Option<u64>,
    sled: Option<sled::Iter>,
    sled_head: Option<Kv>,
    sled_done: bool,
    failed: bool,
}

impl MergedScan<'_> {
    fn refill(&mut self) {
        let m = self.backend.shared.mem.read();
        let (chunk, complete) = m.chunk(self.tree, &self.lower, self.prefix.as_deref(), SCAN_CHUNK);
        let gen = m.gen;
        drop(m);
        self.mem = chunk.into();
        self.mem_complete = complete;
        if self.gen != Some(gen) {
            self.gen = Some(gen);
            self.sled = None;
            self.sled_head = None;
            self.sled_done = false;
        }
    }

    fn pull_sled(&mut self) -> Result<(), StoreError> {
        if self.sled.is_none() {
            let t = self.backend.tree(self.tree)?;
            self.sled = Some(t.range::<Vec<u8>, _>((self.lower.clone(), Bound::Unbounded)));
        }
        let Some(it) = self.sled.as_mut() else {
            return Ok(());
        };
        match it.next() {
            None => self.sled_done = true,
            Some(item) => {
                let (k, v) = item?;
                if self.prefix.as_ref().is_some_and(|p| !k.starts_with(p)) {
                    self.sled_done = true;
                } else {
                    self.sled_head = Some((k.to_vec(), v.to_vec()));
                }
            }
        }
        Ok(())
    }
}

impl Iterator for MergedScan<'_> {
    type Item = Result<Kv, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            if self.mem.is_empty() && !self.mem_complete {
                self.refill();
            }
            if self.sled_head.is_none() && !self.sled_done {
                if let Err(e) = self.pull_sled() {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
            let mem_key = self.mem.front().map(|(k, _)| k.as_slice());
            let sled_key = self.sled_head.as_ref().map(|(k, _)| k.as_slice());
            let from_mem = memtable::layer_first(mem_key, sled_key)?;
            if from_mem {
                let (k, v) = self.mem.pop_front()?;
                if self.sled_head.as_ref().is_some_and(|(s, _)| *s == k) {
                    self.sled_head = None;
                }
                self.lower = Bound::Excluded(k.clone());
                if let Some(v) = v {
                    return Some(Ok((k, v)));
                }
            } else {
                let (k, v) = self.sled_head.take()?;
                self.lower = Bound::Excluded(k.clone());
                return Some(Ok((k, v)));
            }
        }
    }
}

impl Backend for SledBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let s = &self.shared;
        let free = space::free_bytes(&s.dir);
        if !space::may_write(free) {
            return Err(space::full(&s.dir, free.unwrap_or(0), space::WRITE_RESERVE));
        }
        s.wait_for_room()?;
        s.note_group();
        let mut log = s.log.lock();
        log.discard()?;
        if s.sled_failed.load(Ordering::SeqCst) {
            return Err(sled_behind());
        }
        s.freeze_if(&mut log, |a| a.bytes >= FREEZE_BYTES);
        let mut r = Resolver::new(self, jobs.len());
        let mut results = Vec::with_capacity(jobs.len());
        for ops in jobs {
            results.push(r.job(ops)?);
        }
        if !r.writes.is_empty() {
            let mut record = Vec::new();
            wal::encode_record(&r.writes, &mut record);
            let seg = log
                .seg
                .as_mut()
                .ok_or_else(|| StoreError::Write("no write-ahead log segment is open".into()))?;
            seg.append(&record)?;
        }
        log.pending = Some(r.writes);
        Ok(results)
    }

    fn sync(&self) -> Result<(), StoreError> {
        let s = &self.shared;
        let mut log = s.log.lock();
        let Some(writes) = log.pending.take() else {
            // Nothing went through the log (a migration wrote to sled directly): flush sled.
            return self.with(|i| i.flush())?;
        };
        if writes.is_empty() {
            return Ok(());
        }
        let seg = log
            .seg
            .as_mut()
            .ok_or_else(|| StoreError::Write("no write-ahead log segment is open".into()))?;
        seg.sync()?;
        let full = seg.full();
        let now = Instant::now();
        {
            let mut m = s.mem.write();
            for w in writes {
                m.active.insert(w, now);
            }
        }
        if full {
            s.rotate(&mut log);
        }
        Ok(())
    }

    /// Starts afresh after a failed group: finishes the log's cut back, opens a segment if
    /// none is open, and reopens sled if the applier met an error in it (never otherwise: a
    /// full disk refused by `store/space.rs` or a failed log sync leaves sled as it was, and
    /// reads go on using it).
    fn recover(&self) -> Result<(), StoreError> {
        let s = &self.shared;
        {
            let mut log = s.log.lock();
            log.discard()?;
            if log.seg.is_none() {
                let n = wal::segments(&s.dir)?.last().map_or(1, |(n, _)| n + 1);
                log.seg = Some(Segment::create(&s.dir, n)?);
            }
        }
        if s.sled_failed.load(Ordering::SeqCst) || s.inner.read().is_none() {
            self.reopen_sled()?;
        }
        Ok(())
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // A miss in memory means sled has the newest value: a layer leaves memory only after
        // it is in sled. The fence is looked at after the memtable: a layer that left it in
        // between raised the fence before (see `SledFences`).
        if let Some(v) = self.shared.mem.read().get(tree, key) {
            return Ok(v);
        }
        // No check against sled here even in debug builds: the key may be committed and
        // reach sled right after this answer, which was true when given.
        if self.shared.above_sled_fence(tree, key)? {
            return Ok(None);
        }
        self.sled_get(tree, key)
    }

    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a> {
        Box::new(MergedScan {
            backend: self,
            tree,
            prefix: prefix.map(|p| p.to_vec()),
            lower: Bound::Included(start.to_vec()),
            mem: Default::default(),
            mem_complete: false,
            gen: None,
            sled: None,
            sled_head: None,
            sled_done: false,
            failed: false,
        })
    }

    /// Holds the memtable for reading across the reads: a group goes into it whole, and a
    /// frozen layer cannot be dropped in between.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let m = self.shared.mem.read();
        keys.iter()
            .map(|(t, k)| match m.get(*t, k) {
                Some(v) => Ok(v),
                None => self.sled_get(*t, k),
            })
            .collect()
    }

    fn memtable_bytes(&self) -> usize {
        let m = self.shared.mem.read();
        m.active.bytes + m.frozen.as_ref().map_or(0, |f| f.bytes)
    }

    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        // The memtable is held for reading throughout, so no layer leaves it meanwhile.
        let m = self.shared.mem.read();
        let mut mem = m.with_prefix(tree, prefix);
        let mut sled = self.tree(tree)?.scan_prefix(prefix).rev();
        let mut sled_head = sled.next().transpose()?;
        loop {
            let mem_key = mem.last().map(|(k, _)| k.as_slice());
            let sled_key = sled_head.as_ref().map(|(k, _)| k.as_ref());
            let from_mem = match (mem_key, sled_key) {
                (None, None) => return Ok(None),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(mk), Some(sk)) => mk >= sk,
            };
            if !from_mem {
                return Ok(sled_head.map(|(k, v)| (k.to_vec(), v.to_vec())));
            }
            let Some((k, v)) = mem.pop() else {
                return Ok(None);
            };
            if let Some(v) = v {
                return Ok(Some((k, v)));
            }
            // Deleted in memory: whatever sled has for it does not count.
            if sled_head
                .as_ref()
                .is_some_and(|(s, _)| s.as_ref() == k.as_slice())
            {
                sled_head = sled.next().transpose()?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: TreeId, k: &str, v: &str) -> RawOp {
        RawOp::Put(t, k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    fn get(b: &SledBackend, t: TreeId, k: &str) -> Option<Vec<u8>> {
        b.get(t, k.as_bytes()).unwrap()
    }

    /// Waits (with a deadline) until the applier has written every layer into sled.
    fn settle(b: &SledBackend) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while b.memtable_bytes() > 0 {
            assert!(Instant::now() < deadline, "the memtable never drained");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn commit(b: &SledBackend, ops: Vec<RawOp>) {
        assert_eq!(b.apply(vec![ops]).unwrap(), vec![Ok(())]);
        b.sync().unwrap();
    }

    fn keys_of(it: KvIter<'_>) -> Vec<String> {
        it.map(|kv| String::from_utf8(kv.unwrap().0).unwrap())
            .collect()
    }

    #[test]
    fn scans_merge_the_memtable_over_sled_and_deletions_hide_what_sled_has() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        commit(
            &b,
            ["a1", "a2", "a3", "b1"]
                .iter()
                .map(|k| put(TreeId::Runs, k, "old"))
                .collect(),
        );
        settle(&b);
        commit(
            &b,
            vec![
                RawOp::Delete(TreeId::Runs, b"a2".to_vec()),
                put(TreeId::Runs, "a0", "new"),
                put(TreeId::Runs, "a3", "new"),
                put(TreeId::Runs, "a4", "new"),
            ],
        );
        assert!(
            b.memtable_bytes() > 0,
            "the second group is still in memory"
        );
        assert_eq!(
            keys_of(b.scan(TreeId::Runs, b"a", Some(b"a"))),
            vec!["a0", "a1", "a3", "a4"]
        );
        assert_eq!(
            keys_of(b.scan(TreeId::Runs, b"a2", None)),
            vec!["a3", "a4", "b1"]
        );
        assert_eq!(get(&b, TreeId::Runs, "a3").as_deref(), Some(&b"new"[..]));
        assert_eq!(get(&b, TreeId::Runs, "a2"), None);
        let last = b.last_with_prefix(TreeId::Runs, b"a").unwrap().unwrap();
        assert_eq!(last, (b"a4".to_vec(), b"new".to_vec()));
        commit(&b, vec![RawOp::Delete(TreeId::Runs, b"a4".to_vec())]);
        commit(&b, vec![RawOp::Delete(TreeId::Runs, b"a3".to_vec())]);
        let last = b.last_with_prefix(TreeId::Runs, b"a").unwrap().unwrap();
        assert_eq!(
            last.0,
            b"a1".to_vec(),
            "a3 is deleted in memory though sled still has it"
        );
        settle(&b);
        assert_eq!(
            keys_of(b.scan(TreeId::Runs, b"", None)),
            vec!["a0", "a1", "b1"]
        );
        assert_eq!(b.sled_get(TreeId::Runs, b"a3").unwrap(), None);
    }

    #[test]
    fn a_scan_sees_every_key_while_layers_move_into_sled_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        // Enough keys for many chunks; written in groups so several layers are frozen and
        // dropped while the scan runs.
        let n = 20 * SCAN_CHUNK;
        for g in 0..20 {
            let ops = (0..SCAN_CHUNK)
                .map(|i| put(TreeId::Due, &format!("k{:06}", g * SCAN_CHUNK + i), "v"))
                .collect();
            commit(&b, ops);
        }
        let mut seen = Vec::new();
        let scan = b.scan(TreeId::Due, b"", None);
        let mut gens = std::collections::BTreeSet::new();
        for kv in scan {
            seen.push(kv.unwrap().0);
            if seen.len() % 500 == 0 {
                // Give the applier time to move a layer; force a freeze of what is active.
                let mut log = b.shared.log.lock();
                b.shared.freeze_if(&mut log, |_| true);
                drop(log);
                let deadline = Instant::now() + Duration::from_secs(10);
                while b.shared.mem.read().frozen.is_some() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            gens.insert(b.shared.mem.read().gen);
        }
        assert!(gens.len() > 1, "layers were dropped during the scan");
        let want: Vec<Vec<u8>> = (0..n).map(|i| format!("k{i:06}").into_bytes()).collect();
        assert_eq!(seen, want, "every key once, in order");
    }

    #[test]
    fn a_log_left_by_a_crash_is_replayed_into_sled_at_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledBackend::open(dir.path(), 8 << 20).unwrap());
        // What a killed process leaves: records in the log that sled never saw.
        let mut seg = Segment::create(dir.path(), 40).unwrap();
        let mut bytes = Vec::new();
        let w = |t, k: &str, v: Option<&str>| Write {
            tree: t,
            key: k.as_bytes().to_vec(),
            value: v.map(|v| v.as_bytes().to_vec()),
        };
        wal::encode_record(
            &[
                w(TreeId::Specs, "a", Some("1")),
                w(TreeId::Runs, "r", Some("x")),
            ],
            &mut bytes,
        );
        wal::encode_record(
            &[w(TreeId::Specs, "a", Some("2")), w(TreeId::Runs, "r", None)],
            &mut bytes,
        );
        seg.append(&bytes).unwrap();
        seg.sync().unwrap();
        drop(seg);
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        assert_eq!(get(&b, TreeId::Specs, "a").as_deref(), Some(&b"2"[..]));
        assert_eq!(get(&b, TreeId::Runs, "r"), None);
        settle(&b);
        assert_eq!(
            b.sled_get(TreeId::Specs, b"a").unwrap().as_deref(),
            Some(&b"2"[..]),
            "in sled once the applier is done"
        );
        let segs: Vec<u64> = wal::segments(dir.path())
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            segs,
            vec![41],
            "replayed segments are deleted; the next one is new"
        );
    }

    #[test]
    fn a_group_whose_sync_never_came_is_neither_visible_nor_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        b.apply(vec![vec![put(TreeId::Specs, "kept", "1")]])
            .unwrap();
        b.sync().unwrap();
        b.apply(vec![vec![put(TreeId::Specs, "lost", "1")]])
            .unwrap();
        assert_eq!(
            get(&b, TreeId::Specs, "lost"),
            None,
            "not visible before sync"
        );
        // The next group discards it (its sync failed, say).
        let r = b
            .apply(vec![vec![
                RawOp::Absent(TreeId::Specs, b"lost".to_vec()),
                put(TreeId::Specs, "next", "1"),
            ]])
            .unwrap();
        assert_eq!(r, vec![Ok(())]);
        b.sync().unwrap();
        let (records, _) = wal::read_all(dir.path()).unwrap();
        let keys: Vec<&[u8]> = records.iter().flatten().map(|w| w.key.as_slice()).collect();
        assert_eq!(keys, vec![&b"kept"[..], b"next"]);
    }

    /// A live write of key `t` with value `v`, indexed under `v` then `t`.
    fn live_of_t(v: &str, stored_absent: bool) -> RawOp {
        RawOp::Indexed(Box::new(IndexedWrite {
            tree: TreeId::Live,
            key: b"t".to_vec(),
            value: Some(v.as_bytes().to_vec()),
            index: TreeId::Due,
            index_key: |k, v| [v, k].concat(),
            stored_absent,
        }))
    }

    #[test]
    fn jobs_of_one_group_see_the_writes_of_the_jobs_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        let live = |v: &str| live_of_t(v, false);
        let r = b
            .apply(vec![
                vec![
                    RawOp::Absent(TreeId::Specs, b"t".to_vec()),
                    put(TreeId::Specs, "t", "s"),
                    live("1"),
                ],
                vec![RawOp::Absent(TreeId::Specs, b"t".to_vec())],
                vec![live("2")],
            ])
            .unwrap();
        assert_eq!(r[0], Ok(()));
        assert!(
            r[1].is_err(),
            "the first job's insert is seen by the second"
        );
        b.sync().unwrap();
        let due: Vec<Vec<u8>> = b
            .scan(TreeId::Due, b"", None)
            .map(|kv| kv.unwrap().0)
            .collect();
        assert_eq!(
            due,
            vec![b"2t".to_vec()],
            "the index moved with the second write"
        );
    }

    /// `stored_absent` spares the read of what is stored, never of what the group wrote: a
    /// second new-task write of a key in the same group still moves the index off the first.
    #[test]
    fn a_stored_absent_promise_does_not_hide_the_groups_own_writes() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        let live = |v: &str| live_of_t(v, true);
        let r = b.apply(vec![vec![live("1")], vec![live("2")]]).unwrap();
        assert_eq!(r, vec![Ok(()), Ok(())]);
        b.sync().unwrap();
        let due: Vec<Vec<u8>> = b
            .scan(TreeId::Due, b"", None)
            .map(|kv| kv.unwrap().0)
            .collect();
        assert_eq!(due, vec![b"2t".to_vec()], "the first entry was replaced");
        let live_now = b.get(TreeId::Live, b"t").unwrap();
        assert_eq!(live_now.as_deref(), Some(&b"2"[..]));
    }

    /// A read above sled's fence skips sled, and the fence always covers what sled holds:
    /// keys in sled, in the memtable, and in a layer that moved into sled after the fence was
    /// worked out are all found; keys above everything are not.
    #[test]
    fn reads_find_every_stored_key_around_the_sled_fence() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        commit(&b, vec![put(TreeId::Specs, "b", "1")]);
        settle(&b);
        commit(&b, vec![put(TreeId::Specs, "d", "2")]);
        // The fence is worked out here, from sled ("b") and the memtable ("d").
        assert_eq!(get(&b, TreeId::Specs, "a"), None);
        assert_eq!(get(&b, TreeId::Specs, "b").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&b, TreeId::Specs, "d").as_deref(), Some(&b"2"[..]));
        assert_eq!(get(&b, TreeId::Specs, "e"), None);
        // "f" goes through the memtable into sled: the applier must raise the fence first.
        commit(&b, vec![put(TreeId::Specs, "f", "3")]);
        settle(&b);
        assert_eq!(get(&b, TreeId::Specs, "f").as_deref(), Some(&b"3"[..]));
        assert_eq!(get(&b, TreeId::Specs, "g"), None);
        let r = b.apply(vec![vec![RawOp::Absent(TreeId::Specs, b"f".to_vec())]]);
        assert!(
            r.unwrap()[0].is_err(),
            "a create of an id sled holds is refused"
        );
    }

    /// A fence worked out while a frozen layer waits for sled covers the layer: its keys are
    /// found after it moved into sled. The layer is held in the memtable by the applier's
    /// pacing (groups noted at 5 000/s), so the fence is surely worked out before sled has
    /// it. Then a key sled got directly is found too.
    #[test]
    fn a_fence_worked_out_while_a_layer_waits_for_sled_covers_it() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        let keys: Vec<String> = (0..5_000).map(|i| format!("k{i:06}")).collect();
        commit(
            &b,
            keys.iter().map(|k| put(TreeId::Specs, k, "v")).collect(),
        );
        let busy = std::sync::atomic::AtomicBool::new(true);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                while busy.load(Ordering::Relaxed) {
                    b.shared.note_group();
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while b.shared.mem.read().frozen.is_none() {
                assert!(Instant::now() < deadline, "the layer was never frozen");
                std::thread::sleep(Duration::from_millis(5));
            }
            // A miss of the memtable works the fence out, the layer not yet in sled.
            assert_eq!(get(&b, TreeId::Specs, "a"), None);
            busy.store(false, Ordering::Relaxed);
        });
        settle(&b);
        for k in keys.iter().rev().step_by(97) {
            assert!(get(&b, TreeId::Specs, k).is_some(), "{k} lost");
        }
        assert_eq!(get(&b, TreeId::Specs, "l"), None);
        b.db()
            .unwrap()
            .open_tree("specs")
            .unwrap()
            .insert("z", "direct")
            .unwrap();
        b.written_directly();
        assert_eq!(get(&b, TreeId::Specs, "z").as_deref(), Some(&b"direct"[..]));
    }
}
