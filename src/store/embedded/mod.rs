//! The embedded engine: sled 0.34 behind a write-ahead log (`store/wal.rs`) and a write-behind
//! memtable (`store/memtable.rs`), paced by `store/pace.rs` and kept off a full disk by
//! `store/space.rs`. The group resolver is `resolve.rs`, the merged memtable-and-sled scan
//! `scan.rs`.
//!
//! Lock order (a thread holding one may take only those after it; `try_*` calls excepted, they
//! never wait): `log` → `sled_fences` → `applier` (the inbox, with its condvars) → `mem` →
//! `closing` → `inner` → `pacer`; `closing` is held by a reopen across its swap of `inner`,
//! and the space gauge is taken alone. Debug builds assert it on every blocking acquire
//! (`order.rs`: a lock taken out of order panics naming both). No lock is held across a call
//! into sled: `inner` is held only to clone the handle out of it ([`SledHold`]) or to swap it,
//! and an old handle swapped out by a reopen is closed on a thread of its own once its last
//! reader has let go (`SledBackend::reopen_sled`), since sled's drop can block on I/O for good.

use std::fs::File;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Condvar;

use super::backend::{Backend, Kv, KvIter, RawOp, Rejected, TreeId, TREES};
use super::memtable::{Layer, Mem, ACTIVE_MAX_BYTES, FREEZE_AGE, FREEZE_BYTES};
use super::pace;
use super::space;
use super::wal::{self, Segment, Write};
use super::StoreError;

mod alive;
mod order;
mod resolve;
mod scan;
#[cfg(test)]
mod tests;

use order::{OMutex, ORwLock, Rank};
use resolve::Resolver;
use scan::MergedScan;

/// sled 0.34 behind a write-ahead log (`store/wal.rs`) and a write-behind memtable
/// (`store/memtable.rs`):
/// - `apply` resolves a group into plain writes (preconditions checked, secondary index keys
///   derived, reading the memtable, sled and the group's own earlier writes) and appends them
///   to the log as one record;
/// - `sync` makes the record durable with one `fdatasync` and puts its writes in the
///   memtable's active layer, where reads see them at once;
/// - the applier thread (`herald-apply`, at idle CPU priority) takes frozen layers, writes
///   them to sled (one write per key however often it was written; a run of keys in one
///   sled leaf as one copy of it, `apply_sorted`), flushes sled, deletes the log segments
///   the layer covers, and only then drops the layer;
/// - the spare thread (`herald-spare`, normal priority) zero-fills the next log segment ahead,
///   so that a rotation is a rename.
///
/// So the commit thread never writes to sled: a group costs one append, one sync and a few
/// B-tree inserts in memory. Reads look in the memtable before sled ([`MergedScan`] for scans).
///
/// Memory is bounded: the active layer is frozen at [`FREEZE_BYTES`] or [`FREEZE_AGE`], and
/// a group waits (so the queue fills and creates get 503) while it is over [`ACTIVE_MAX_BYTES`]
/// and the applier is still busy with the previous layer.
///
/// sled 0.34 remembers an I/O error (a full disk, say) and fails every later operation with it,
/// even after the disk works again. When the applier meets one, writes are refused (and
/// [`Backend::failing`] says why) until sled is reopened: by the commit thread's
/// [`Backend::recover`] after a failed group, or by the applier itself once a second (an idle
/// server has no group to fail); the applier then writes the frozen layer again (every write
/// carries its whole value, so that is idempotent). Nothing is lost meanwhile: what sled may
/// not hold is in the layers and in the log.
pub struct SledBackend {
    shared: Arc<Shared>,
    applier: Option<std::thread::JoinHandle<()>>,
    spare: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    dir: PathBuf,
    cache_bytes: u64,
    /// `None` only while a reopen failed; every operation then fails until the next one.
    inner: ORwLock<Option<Arc<SledInner>>>,
    /// The segment being appended to and the group `apply` resolved for `sync`.
    log: OMutex<Log>,
    mem: ORwLock<Mem>,
    /// The applier's inbox; `done` is signalled (under this lock) when a frozen layer is
    /// dropped, `work` when there is something for the applier.
    applier: OMutex<Inbox>,
    work: Condvar,
    done: Condvar,
    /// Signalled (under `applier`) when a rotation took the spare segment (`spare_maker`).
    spare_wanted: Condvar,
    /// The applier met a sled error: writes are refused until sled is reopened (by `recover`,
    /// or by the applier itself: [`Shared::wait_for_reopen`]).
    sled_failed: AtomicBool,
    /// What the applier's error was, while `sled_failed` (`Backend::failing`). A plain mutex,
    /// taken alone (no other lock is taken while it is held).
    sled_error: parking_lot::Mutex<Option<String>>,
    /// Writes (keys) of the groups applied so far, and when the last group came (µs since
    /// `epoch`): the applier holds back while they come fast (`store/pace.rs`).
    writes: AtomicU64,
    last_group_us: AtomicU64,
    epoch: Instant,
    /// A write waited for room since the applier last looked: it must not hold back.
    pressed: AtomicBool,
    /// The applier's pacing state (only the applier thread takes it).
    pacer: OMutex<pace::Pacer>,
    /// Per tree, no key in sled is above this (see [`SledFences`]).
    sled_fences: OMutex<SledFences>,
    /// The applier waits for free space before it writes a layer into sled (`store/space.rs`):
    /// a write that would wait for room fails at once instead.
    low_space: AtomicBool,
    /// An old sled handle being closed on its own thread (see [`SledBackend::reopen_sled`]):
    /// answers once the close is done. Until then sled's lock on the directory is held.
    closing: OMutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Free space as the commit thread last read it.
    gauge: space::Gauge,
    /// The applier's progress: chunks of keys written into sled and layers done (a write
    /// waiting for room tells a slow applier from a stuck one by it).
    applied: AtomicU64,
    /// The last log segment sled holds durably (`SledInner::checkpoint`): a new segment is
    /// always numbered past it.
    checkpoint: AtomicU64,
    /// The active layer's bytes, stored after every change of it (under `mem`'s write lock),
    /// so the admission law reads it on a tokio worker without a lock.
    active_bytes: AtomicUsize,
    /// Test knobs ([`SledBackend::knobs`]).
    knobs: Arc<Knobs>,
}

/// Test knobs: an applier slowed to a byte rate, and sled flushes that block (as sled 0.34's
/// can for good after an I/O error) until released. Both off by default; production code
/// never sets them.
#[derive(Debug, Default)]
pub struct Knobs {
    /// Bytes per second the applier writes layers into sled at (0: as fast as it can).
    pub applier_bytes_per_s: AtomicU64,
    /// While set, every flush of sled (the applier's after a layer, the migrations') waits.
    pub block_sled_flush: AtomicBool,
    /// Flushes of sled waiting on `block_sled_flush` right now.
    pub flushes_blocked: AtomicU64,
    /// While set, an atomic read (and a read of a prefix's last key) waits between its look at
    /// the memtable and its reads of sled, and a sled fence being worked out waits after its
    /// read of sled, before it is set (where none holds a lock): a test moves layers into
    /// sled, or a group through the memtable, meanwhile.
    pub hold_atomic_reads: AtomicBool,
    /// Atomic reads waiting on `hold_atomic_reads` right now.
    pub atomic_reads_held: AtomicU64,
    /// While set, every freeze closes the open log segment, full or not (as before issue 29's
    /// review): a test sees a layer's segment deleted once sled holds it.
    pub close_segment_on_freeze: AtomicBool,
    /// While set, every write of a layer into sled fails before it writes anything, as after
    /// an I/O error (a full disk, EIO): a test sees the applier's failure and its healing.
    pub fail_layer_writes: AtomicBool,
}

impl Knobs {
    /// Waits while flushes are blocked (called right before sled's flush).
    fn flush_gate(&self) {
        gate(&self.block_sled_flush, &self.flushes_blocked);
    }

    /// Waits while atomic reads are held (called between an atomic read's two halves).
    fn atomic_read_gate(&self) {
        gate(&self.hold_atomic_reads, &self.atomic_reads_held);
    }
}

/// Waits while `closed` is set, counted in `waiting` meanwhile (a test sees who is held).
fn gate(closed: &AtomicBool, waiting: &AtomicU64) {
    if !closed.load(Ordering::SeqCst) {
        return;
    }
    waiting.fetch_add(1, Ordering::SeqCst);
    while closed.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(2));
    }
    waiting.fetch_sub(1, Ordering::SeqCst);
}

/// How long a reopen waits for the old sled handle to close before it reports it stuck and
/// tries again later (the close goes on in the background).
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How often the applier, its write of a layer into sled failed, reopens sled itself
/// ([`Shared::wait_for_reopen`]).
const REOPEN_EVERY: Duration = Duration::from_secs(1);
/// A group waiting for room in the memtable fails once the applier has made no progress
/// (no chunk of keys written into sled, no layer done) for this long.
const APPLIER_STALL_MAX: Duration = Duration::from_secs(30);
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
///
/// A fence is worked out without this lock held (sled's read of its last key may wait on the
/// disk): `changes` counts every raise and reset, and a fence worked out while it moved is
/// worked out again, since a layer raised meanwhile may be in sled and not in it.
#[derive(Default)]
struct SledFences {
    by_tree: [Option<Vec<u8>>; TREES],
    changes: u64,
}

#[derive(Default)]
struct Inbox {
    /// A frozen layer and the closed segments it covers.
    layer: Option<(Arc<Layer>, Vec<PathBuf>)>,
    /// A segment was taken: the spare thread makes a spare.
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

/// A reader's hold on one of sled's trees. It keeps the whole handle it came from, so a
/// reopen's close thread waits for it: the last drop of an old handle is never on a reader's
/// thread (sled's drop can block for good after an I/O error). Anything made from the tree (a
/// sled iterator holds a clone of it) must not outlive this hold.
struct SledHold {
    inner: Arc<SledInner>,
    tree: TreeId,
}

impl std::ops::Deref for SledHold {
    type Target = sled::Tree;

    fn deref(&self) -> &sled::Tree {
        self.tree.of(&self.inner.trees)
    }
}

struct SledInner {
    knobs: Arc<Knobs>,
    db: sled::Db,
    trees: [sled::Tree; TREES],
    /// sled 0.34's `flush` uses `sync_file_range`, which does not survive power loss; syncing
    /// its data file (`db`) as well does.
    data_file: Option<File>,
}

impl SledInner {
    fn open(dir: &Path, cache_bytes: u64, knobs: Arc<Knobs>) -> Result<SledInner, StoreError> {
        std::fs::create_dir_all(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()?;
        // A newer build's directory is refused before a tree is made or the log is read.
        super::refuse_newer(dir, super::stored_format(&db)?)?;
        let opened = TreeId::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()?;
        let trees: [sled::Tree; TREES] = opened
            .try_into()
            .map_err(|_| StoreError::Write("sled opened a tree count other than TREES".into()))?;
        let data_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("db"))
            .ok();
        if data_file.is_none() {
            tracing::warn!(dir = %dir.display(), "sled data file not found; flushes will not fsync it");
        }
        Ok(SledInner {
            knobs,
            db,
            trees,
            data_file,
        })
    }

    /// Makes everything applied to sled so far durable.
    fn flush(&self) -> Result<(), StoreError> {
        self.knobs.flush_gate();
        self.db.flush()?;
        if let Some(f) = &self.data_file {
            f.sync_data()?;
        }
        Ok(())
    }

    /// Writes a frozen layer into sled and flushes sled: each tree's keys in order, 1 024 at a
    /// time through `apply_sorted` (vendored sled: a run of keys in one leaf rewrites it once,
    /// instead of a copy of the leaf per key). No `sled::Batch` and no transaction: the log
    /// already makes a group atomic (a crash half-way is replayed whole), readers see the
    /// layer until it is dropped, and a batch per tree costs sled a batch manifest and its
    /// exclusive lock each. `pace` runs before every 1 024 keys (it may wait,
    /// `store/pace.rs`); it returning `true` stops the write early, with an error.
    /// `through`: the last log segment the layer covers, recorded with it (the checkpoint,
    /// [`SledInner::checkpoint`]).
    fn write_layer(
        &self,
        layer: &Layer,
        through: Option<u64>,
        pace: &dyn Fn() -> bool,
    ) -> Result<(), StoreError> {
        if self.knobs.fail_layer_writes.load(Ordering::SeqCst) {
            return Err(StoreError::Io(std::io::Error::other(
                "injected by the test knob fail_layer_writes",
            )));
        }
        let mut chunk: Vec<(&[u8], Option<&[u8]>)> = Vec::with_capacity(1024);
        for t in TreeId::ALL {
            let tree = t.of(&self.trees);
            let mut entries = layer.entries(t).peekable();
            while entries.peek().is_some() {
                if pace() {
                    return Err(StoreError::Write("stopping".into()));
                }
                chunk.clear();
                chunk.extend(
                    entries
                        .by_ref()
                        .take(1024)
                        .map(|(k, v)| (k.as_slice(), v.as_deref())),
                );
                tree.apply_sorted(&chunk)?;
            }
        }
        if let Some(n) = through {
            self.db.insert(CHECKPOINT_KEY, &n.to_be_bytes())?;
        }
        self.flush()
    }

    /// The last log segment whose every record sled holds durably (`None`: none recorded).
    /// Written in the same flush as the layer that covers it: a segment at or before it that
    /// is still on disk (its delete failed) holds values older than sled's, and replaying it
    /// would bring them back over newer ones.
    /// One of another length is damage, an error: read as none (0) it had every segment
    /// still on disk replayed over the newer values sled holds.
    fn checkpoint(&self) -> Result<Option<u64>, StoreError> {
        let Some(v) = self.db.get(CHECKPOINT_KEY)? else {
            return Ok(None);
        };
        match <[u8; 8]>::try_from(v.as_ref()) {
            Ok(b) => Ok(Some(u64::from_be_bytes(b))),
            Err(_) => Err(StoreError::Corrupt {
                tree: "sled's default tree".into(),
                key: String::from_utf8_lossy(CHECKPOINT_KEY).into_owned(),
                detail: format!(
                    "the write-ahead log checkpoint holds {} bytes, not 8",
                    v.len()
                ),
            }),
        }
    }
}

/// Where sled keeps its checkpoint of the log (its default tree, which holds nothing else).
const CHECKPOINT_KEY: &[u8] = b"herald.wal.checkpoint";

/// Removes the segments at or before `checkpoint` (sled holds them: a delete after their layer
/// was written failed), so that they are not replayed over newer values.
fn remove_checkpointed(dir: &Path, checkpoint: u64) -> Result<(), StoreError> {
    let stale: Vec<_> = wal::segments(dir)?
        .into_iter()
        .filter(|(n, _)| *n <= checkpoint)
        .collect();
    for (n, p) in &stale {
        tracing::warn!(segment = n, checkpoint, "a write-ahead log segment sled already holds was still there (its delete had failed); removed unread");
        remove_if_there(p)?;
    }
    if !stale.is_empty() {
        wal::sync_dir(dir)?;
    }
    Ok(())
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
    /// The sled handle, cloned out of `inner` (whose lock is held for the clone only).
    fn hold(&self) -> Result<Arc<SledInner>, StoreError> {
        self.inner.read().clone().ok_or_else(|| self.closed_error())
    }

    fn closed_error(&self) -> StoreError {
        StoreError::Write(format!(
            "sled on {} is being reopened after an I/O error (or its reopen failed and is tried again); it answers once open",
            self.dir.display()
        ))
    }

    /// Closes the open segment (if it holds anything) and starts the next one; the closed one
    /// waits in `log.closed` for the next freeze.
    fn rotate(&self, log: &mut Log) {
        let Some(seg) = log.seg.as_mut() else { return };
        if seg.is_empty() || seg.uncut() {
            return;
        }
        match Segment::create(&self.dir, seg.n + 1) {
            Ok(fresh) => {
                let closed = std::mem::replace(seg, fresh);
                log.closed.push(closed.path.clone());
                self.took_spare(seg);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a new write-ahead log segment; appending to the old one")
            }
        }
    }

    /// A segment was just made for the log (`rotate`, `recover`): the spare thread makes the
    /// next spare; a segment that had to be filled here, every writer waiting, is logged.
    fn took_spare(&self, seg: &Segment) {
        if let Some(took) = seg.filled_inline {
            tracing::warn!(
                segment = seg.n,
                took_ms = took.as_millis() as u64,
                "no spare write-ahead log segment was ready: one was filled on the write path"
            );
        }
        self.applier.lock().spare = true;
        self.spare_wanted.notify_one();
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
        // Only a full segment is closed here. Closing each one a freeze meets (every second
        // under a trickle of writes) made the spare thread zero-fill and sync a new 8 MiB
        // segment every second: ~8 MiB/s written to an idle server's disk. A segment left
        // open is covered by the layer that holds its last record, once it closes; replaying
        // it over sled at a start is idempotent.
        let full = log.seg.as_ref().is_some_and(|seg| seg.full());
        if full || self.knobs.close_segment_on_freeze.load(Ordering::Relaxed) {
            self.rotate(log);
        }
        let covered = std::mem::take(&mut log.closed);
        let layer = {
            let mut m = self.mem.write();
            let layer = m.freeze();
            self.active_bytes.store(m.active.bytes, Ordering::Relaxed);
            layer
        };
        self.applier.lock().layer = Some((layer, covered));
        self.work.notify_one();
    }

    /// Waits while the active layer is over [`ACTIVE_MAX_BYTES`] and a layer is still frozen.
    /// Fails at once while the applier cannot write (sled failed, or no free space): then the
    /// wait could be without end, and the writer is better told so.
    fn wait_for_room(&self) -> Result<(), StoreError> {
        let mut inbox = self.applier.lock();
        // Since when the applier has made no progress while this write waited.
        let (mut seen, mut since) = (self.applied.load(Ordering::Relaxed), Instant::now());
        let began = since;
        loop {
            {
                let m = self.mem.read();
                if m.active.bytes < ACTIVE_MAX_BYTES || m.frozen.is_none() {
                    if began.elapsed() >= Duration::from_millis(10) {
                        tracing::debug!(
                            waited_ms = began.elapsed().as_millis() as u64,
                            "a group waited for the applier (memtable full)"
                        );
                    }
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
            let now_applied = self.applied.load(Ordering::Relaxed);
            if now_applied != seen {
                (seen, since) = (now_applied, Instant::now());
            } else if since.elapsed() >= APPLIER_STALL_MAX {
                // The applier is stuck (a flush that never returns, say), not merely slow: fail
                // the group, so health says so and writes are refused up front, instead of
                // queueing without an answer. A slow disk keeps the applier moving, and the
                // write waits as long as it does (back-pressure, not an error).
                return Err(StoreError::Write(format!(
                    "the applier has written nothing into sled for {} s; writes are refused until it does",
                    APPLIER_STALL_MAX.as_secs()
                )));
            }
            self.pressed.store(true, Ordering::Relaxed);
            tracing::debug!("memtable full: the write waits for the applier");
            self.done
                .wait_for(inbox.guard_mut(), Duration::from_millis(100));
        }
    }

    /// Raises the fences over a layer about to be written into sled (see [`SledFences`]).
    fn raise_sled_fences(&self, layer: &Layer) {
        let mut fences = self.sled_fences.lock();
        fences.changes += 1;
        for t in TreeId::ALL {
            if let (Some(last), Some(f)) = (layer.last_key(t), t.of_mut(&mut fences.by_tree)) {
                if last > f.as_slice() {
                    *f = last.to_vec();
                }
            }
        }
    }

    /// Whether `key` is above every key sled holds in `tree`, so a read of sled would miss.
    fn above_sled_fence(&self, tree: TreeId, key: &[u8]) -> Result<bool, StoreError> {
        loop {
            let changes = {
                let mut fences = self.sled_fences.lock();
                if let Some(f) = tree.of_mut(&mut fences.by_tree) {
                    return Ok(key > f.as_slice());
                }
                fences.changes
            };
            let fresh = self.sled_fence_now(tree)?;
            let mut fences = self.sled_fences.lock();
            let moved = fences.changes != changes;
            let slot = tree.of_mut(&mut fences.by_tree);
            match slot {
                Some(f) => return Ok(key > f.as_slice()),
                None if !moved => return Ok(key > slot.insert(fresh).as_slice()),
                // A layer was raised (or sled reset) while the fence was worked out.
                None => continue,
            }
        }
    }

    /// A fence worked out afresh, with no lock held across sled: the last key of every layer,
    /// then sled's. A layer the applier is writing now (its raise found the fence unknown) is
    /// still in the memtable, and one dropped between the two reads is in sled by then: keys
    /// move from the memtable to sled, never back. A layer raised after the caller's look at
    /// the fences changes their count, and the caller works the fence out again.
    fn sled_fence_now(&self, tree: TreeId) -> Result<Vec<u8>, StoreError> {
        let in_layers = {
            let m = self.mem.read();
            let last = |l: &Layer| l.last_key(tree).map(|k| k.to_vec());
            last(&m.active).max(m.frozen.as_deref().and_then(last))
        };
        let in_sled = tree
            .of(&self.hold()?.trees)
            .last()?
            .map(|(k, _)| k.to_vec());
        self.knobs.atomic_read_gate();
        Ok(in_layers.max(in_sled).unwrap_or_default())
    }

    /// Writes one frozen layer to sled until it is there and durable (retrying after a
    /// reopen), deletes the segments it covers, then drops it. `false`: stopping.
    fn apply_layer(&self, layer: &Layer, covered: &[PathBuf]) -> bool {
        let stop = || self.applier.lock().stop;
        let started = Instant::now();
        let waited = std::cell::Cell::new(Duration::ZERO);
        let pace = || {
            self.applied.fetch_add(1, Ordering::Relaxed);
            self.hold_back(&waited)
        };
        self.raise_sled_fences(layer);
        if !self.slowed(layer.bytes) {
            return false;
        }
        loop {
            if !self.wait_for_space(layer.bytes) {
                return false;
            }
            let through = covered.iter().filter_map(|p| wal::segment_number(p)).max();
            let r = self
                .hold()
                .and_then(|i| i.write_layer(layer, through, &pace));
            match r {
                Ok(()) => {
                    if let Some(n) = through {
                        self.checkpoint.fetch_max(n, Ordering::SeqCst);
                    }
                    break;
                }
                Err(_) if stop() => return false,
                Err(e) => {
                    tracing::warn!(error = %e, keys = layer.len(), "writing the memtable into sled failed; writes wait for a reopen, then it is written again");
                    *self.sled_error.lock() = Some(format!(
                        "writing the memtable into sled failed ({e}); writes are refused until sled is reopened, tried every {} s",
                        REOPEN_EVERY.as_secs()
                    ));
                    self.sled_failed.store(true, Ordering::SeqCst);
                    if !self.wait_for_reopen() {
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
        self.applied.fetch_add(1, Ordering::Relaxed);
        let _inbox = self.applier.lock();
        self.mem.write().drop_frozen();
        self.done.notify_all();
        true
    }

    /// Reopens sled; the applier then writes its frozen layer again. Nothing is replayed from
    /// the log: every write sled may have lost is still in a layer (a layer is dropped only
    /// after sled was flushed with it), so the fences stay true (sled holds no key it did not
    /// hold before). Called by the commit thread (`recover`) and by the applier
    /// ([`Shared::wait_for_reopen`]): `closing` is held throughout, so one reopen runs at a
    /// time, and one that finds sled reopened meanwhile (no failure, a handle) does nothing.
    ///
    /// No lock is held across a call into sled that can block: after an I/O error sled's drop
    /// can wait forever for a flush, so the old handle is taken out under the write lock (a
    /// swap) and closed on a thread of its own, waited for at most [`CLOSE_WAIT`]. Meanwhile
    /// reads that need sled fail at once ("closed") instead of waiting. A close still running
    /// at the next attempt is waited for again; sled's lock on the directory is held until it
    /// ends. While the disk is too full to write a layer nothing is reopened (the old handle
    /// keeps serving reads).
    fn reopen_sled(&self) -> Result<(), StoreError> {
        let free = space::free_bytes(&self.dir);
        if !space::may_apply(free, 0) {
            return Err(space::full(
                &self.dir,
                free.unwrap_or(0),
                space::APPLY_RESERVE,
            ));
        }
        let mut closing = self.closing.lock();
        if !self.sled_failed.load(Ordering::SeqCst) && self.inner.read().is_some() {
            // Reopened by another caller while this one waited for `closing`.
            return Ok(());
        }
        self.close_old(&mut closing)?;
        let fresh = SledInner::open(&self.dir, self.cache_bytes, self.knobs.clone())?;
        *self.inner.write() = Some(Arc::new(fresh));
        *self.sled_error.lock() = None;
        self.sled_failed.store(false, Ordering::SeqCst);
        drop(closing);
        self.work.notify_all();
        tracing::warn!(dir = %self.dir.display(), "storage reopened");
        Ok(())
    }

    /// Takes the handle out of `inner` and closes it on a thread of its own (unless a close
    /// is under way already), waiting for the close at most [`CLOSE_WAIT`].
    fn close_old(
        &self,
        closing: &mut Option<std::sync::mpsc::Receiver<()>>,
    ) -> Result<(), StoreError> {
        if closing.is_none() {
            let old = self.inner.write().take();
            if let Some(old) = old {
                let (done, rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name("herald-sled-close".into())
                    .spawn(move || {
                        // Readers may still hold it (`SledHold`): once the last of them has
                        // let go, sled's drop (which can block for good after an I/O error)
                        // runs here, never on a reader's thread. No new holder can appear:
                        // the handle is out of `inner`.
                        let mut old = old;
                        loop {
                            match Arc::try_unwrap(old) {
                                Ok(inner) => break drop(inner),
                                Err(still_held) => old = still_held,
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
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
                        self.dir.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Waits (applier) until sled is reopened after its write of a layer failed, and reopens
    /// it itself every [`REOPEN_EVERY`] meanwhile. The commit thread's `recover` reopens it
    /// too, but only after a group failed: on an idle server no group may come (the engine
    /// refuses writes while `Backend::failing` says so), and sled, once the disk works again,
    /// would stay failed with the layer in memory. `false`: stopping.
    fn wait_for_reopen(&self) -> bool {
        loop {
            {
                let until = Instant::now() + REOPEN_EVERY;
                let mut inbox = self.applier.lock();
                while self.sled_failed.load(Ordering::SeqCst) && !inbox.stop {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    self.work
                        .wait_for(inbox.guard_mut(), left.min(Duration::from_millis(100)));
                }
                if inbox.stop {
                    return false;
                }
                if !self.sled_failed.load(Ordering::SeqCst) {
                    return true;
                }
            }
            // No lock held: a reopen takes `closing` and `inner`, and may wait on a close.
            if let Err(e) = self.reopen_sled() {
                tracing::debug!(error = %e, "the applier could not reopen sled yet; it tries again");
            }
        }
    }

    /// The test knob `applier_bytes_per_s`: waits as long as a layer of `bytes` takes at that
    /// rate. `false`: stopping.
    fn slowed(&self, bytes: usize) -> bool {
        let rate = self.knobs.applier_bytes_per_s.load(Ordering::Relaxed);
        if rate == 0 {
            return true;
        }
        let until = Instant::now() + Duration::from_secs_f64(bytes as f64 / rate as f64);
        loop {
            if self.applier.lock().stop {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(20)));
        }
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
            self.work.wait_for(inbox.guard_mut(), SPACE_POLL);
        }
    }

    /// Notes a group of `writes` keys for the applier's pacing (commit thread).
    fn note_group(&self, writes: usize) {
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
        let now = self.epoch.elapsed().as_micros() as u64;
        self.last_group_us.store(now, Ordering::Relaxed);
    }

    /// Called by the applier before each chunk of a layer: waits while the write path is busy
    /// (`store/pace.rs` decides; `waited` adds up the time held back for this layer). `true`:
    /// stopping.
    fn hold_back(&self, waited: &std::cell::Cell<Duration>) -> bool {
        loop {
            // `try_lock`: the applier never waits here for a lock a writer holds. A contended
            // inbox reads as "not stopping": the next chunk, or the next poll, looks again.
            if self.applier.try_lock().is_some_and(|inbox| inbox.stop) {
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
            // Never blocks: a layer being written or frozen right now is reason enough to go
            // on.
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
            let (w0, t0) = (self.writes.load(Ordering::Relaxed), Instant::now());
            std::thread::sleep(pace::POLL);
            let span = t0.elapsed();
            let writes = self.writes.load(Ordering::Relaxed).saturating_sub(w0);
            let Some(active) = self.mem.try_read().map(|m| m.active.bytes) else {
                return false;
            };
            if !pacer.wait(writes, span, active, waited.get()) {
                return false;
            }
            waited.set(waited.get() + span);
        }
    }
}

fn sled_behind() -> StoreError {
    StoreError::Write("sled failed to take the memtable; waiting for a reopen".into())
}

/// The applier thread: frozen layers into sled, and freezing an idle layer once it is
/// [`FREEZE_AGE`] old.
fn applier(shared: Arc<Shared>) {
    lower_priority();
    loop {
        let layer = {
            let mut inbox = shared.applier.lock();
            if inbox.layer.is_none() && !inbox.stop {
                shared.work.wait_for(inbox.guard_mut(), FREEZE_AGE / 4);
            }
            if inbox.stop {
                return;
            }
            inbox.layer.take()
        };
        if let Some((layer, covered)) = layer {
            if !shared.apply_layer(&layer, &covered) {
                return;
            }
        }
        // An idle layer: freeze it, unless the commit thread is in the middle of a group.
        if let Some(mut log) = shared.log.try_lock() {
            shared.freeze_if(&mut log, |a| {
                a.since.is_some_and(|t| t.elapsed() >= FREEZE_AGE)
            });
        }
    }
}

/// The spare thread (`herald-spare`, at normal priority): a zero-filled spare segment made
/// ahead, again each time a rotation takes it, so the commit thread's rotation is a rename.
///
/// Why not the applier, which made them before: it runs at idle priority and, during a burst,
/// holds back with a frozen layer in hand; a spare asked for then came only after that layer,
/// and rotations in between filled their 8 MiB on the write path, every writer waiting on the
/// commit thread meanwhile (12–26 ms each under a competing `fdatasync` writer, 9–10 times
/// per fill and herd of 100 000 one-shots).
fn spare_maker(shared: Arc<Shared>) {
    loop {
        if let Err(e) = wal::prepare_spare(&shared.dir) {
            tracing::warn!(error = %e, "could not make a spare write-ahead log segment; the next one is made when needed");
        }
        let mut inbox = shared.applier.lock();
        while !inbox.spare && !inbox.stop {
            shared.spare_wanted.wait(inbox.guard_mut());
        }
        if inbox.stop {
            return;
        }
        inbox.spare = false;
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        self.shared.applier.lock().stop = true;
        self.shared.work.notify_all();
        self.shared.spare_wanted.notify_all();
        for t in [self.applier.take(), self.spare.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl SledBackend {
    /// Opens sled in `dir` and reads what the log holds into the memtable (frozen at once, so
    /// the applier writes it into sled in the background while herald starts).
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, StoreError> {
        let knobs = Arc::new(Knobs::default());
        let inner = SledInner::open(dir, cache_bytes, knobs.clone())?;
        let started = Instant::now();
        let checkpoint = inner.checkpoint()?.unwrap_or(0);
        remove_checkpointed(dir, checkpoint)?;
        let (records, segs) = wal::read_all(dir)?;
        let mut mem = Mem::default();
        let n_records = records.len();
        for w in records.into_iter().flatten() {
            mem.active.insert(w, started);
        }
        // Numbers only grow past the checkpoint: a segment numbered at or before it would be
        // taken for one sled holds, and removed unread at the next start.
        let next = segs.last().map_or(1, |(n, _)| n + 1).max(checkpoint + 1);
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
            inner: ORwLock::new(Rank::Inner, Some(Arc::new(inner))),
            log: OMutex::new(
                Rank::Log,
                Log {
                    seg: Some(seg),
                    pending: None,
                    closed: segs.into_iter().map(|(_, p)| p).collect(),
                },
            ),
            mem: ORwLock::new(Rank::Mem, mem),
            applier: OMutex::new(Rank::Applier, Inbox::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            spare_wanted: Condvar::new(),
            sled_failed: AtomicBool::new(false),
            sled_error: parking_lot::Mutex::new(None),
            writes: AtomicU64::new(0),
            last_group_us: AtomicU64::new(0),
            epoch: Instant::now(),
            pressed: AtomicBool::new(false),
            pacer: OMutex::new(Rank::Pacer, pace::Pacer::default()),
            sled_fences: OMutex::new(Rank::SledFences, Default::default()),
            low_space: AtomicBool::new(false),
            closing: OMutex::new(Rank::Closing, None),
            gauge: space::Gauge::default(),
            applied: AtomicU64::new(0),
            checkpoint: AtomicU64::new(checkpoint),
            active_bytes: AtomicUsize::new(0),
            knobs,
        });
        shared.freeze_if(&mut shared.log.lock(), |_| true);
        Self::start(shared)
    }

    /// Starts the applier and the spare thread over `shared`.
    fn start(shared: Arc<Shared>) -> Result<SledBackend, StoreError> {
        let s = shared.clone();
        let applier = std::thread::Builder::new()
            .name("herald-apply".into())
            .spawn(move || applier(s))?;
        let mut backend = SledBackend {
            shared,
            applier: Some(applier),
            spare: None,
        };
        let s = backend.shared.clone();
        // On an error here `backend` is dropped, which stops and joins the applier.
        backend.spare = Some(
            std::thread::Builder::new()
                .name("herald-spare".into())
                .spawn(move || spare_maker(s))?,
        );
        Ok(backend)
    }

    /// sled's handle (for `meta` and migrations at open, which write to sled directly: only
    /// a directory without log records needs one). Whoever writes through it calls
    /// [`SledBackend::written_directly`] when done (`Store::open_with` does, after them all).
    /// The clone is outside any `SledHold`: used only at open, before a reopen can happen;
    /// anything later that keeps it would make a reopen's close wait on it unseen.
    pub fn db(&self) -> Result<sled::Db, StoreError> {
        self.with(|i| i.db.clone())
    }

    /// Reopens sled ([`Shared::reopen_sled`]).
    fn reopen_sled(&self) -> Result<(), StoreError> {
        self.shared.reopen_sled()
    }

    /// The test knobs (see [`Knobs`]).
    #[doc(hidden)]
    pub fn knobs(&self) -> Arc<Knobs> {
        self.shared.knobs.clone()
    }

    /// Makes everything written to sled so far durable (its data file synced too): the
    /// `format` in `meta`, written directly at open, before anything relies on it.
    pub fn flush_sled(&self) -> Result<(), StoreError> {
        self.with(|i| i.flush())?
    }

    /// sled was written behind the memtable's back: its fences are worked out again.
    pub fn written_directly(&self) {
        let mut fences = self.shared.sled_fences.lock();
        fences.by_tree = Default::default();
        fences.changes += 1;
    }

    fn with<T>(&self, f: impl FnOnce(&SledInner) -> T) -> Result<T, StoreError> {
        let i = self.shared.hold()?;
        Ok(f(&i))
    }

    /// One of sled's trees, held (see [`SledHold`]): keep it alive as long as anything made
    /// from it (an iterator) is.
    /// The last key under `prefix`: the newest of `mem` (the memtable's entries under it, in
    /// order; a deletion hides sled's value) and sled's, read backwards.
    fn last_over_sled(
        &self,
        tree: TreeId,
        prefix: &[u8],
        mut mem: Vec<super::memtable::Entry>,
    ) -> Result<Option<Kv>, StoreError> {
        // Declared before the iterator, so dropped after it (see `SledHold`).
        let hold = self.tree(tree)?;
        let mut sled = hold.scan_prefix(prefix).rev();
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

    fn tree(&self, t: TreeId) -> Result<SledHold, StoreError> {
        Ok(SledHold {
            inner: self.shared.hold()?,
            tree: t,
        })
    }

    /// A point read of sled alone.
    fn sled_get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(tree)?.get(key)?.map(|v| v.to_vec()))
    }
}

impl Backend for SledBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let s = &self.shared;
        let free = s.gauge.free(&s.dir);
        if !space::may_write(free) {
            return Err(space::full(&s.dir, free.unwrap_or(0), space::WRITE_RESERVE));
        }
        s.wait_for_room()?;
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
        s.note_group(r.writes.len());
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
            m.groups += 1;
            s.active_bytes.store(m.active.bytes, Ordering::Relaxed);
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
                // Past the checkpoint, as at open: a lower number would be removed unread.
                let checkpoint = s.checkpoint.load(Ordering::SeqCst);
                let n = wal::segments(&s.dir)?
                    .last()
                    .map_or(1, |(n, _)| n + 1)
                    .max(checkpoint + 1);
                let seg = Segment::create(&s.dir, n)?;
                s.took_spare(&seg);
                log.seg = Some(seg);
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
        Box::new(MergedScan::new(self, tree, start, prefix))
    }

    /// One point in time for every key: a group goes into the memtable whole. First without
    /// holding the memtable across sled's reads (a reader there would hold off the commit
    /// thread, and every writer behind it, for as long as sled takes): the memtable's answers
    /// under its lock, sled's for the misses after, and the answer stands if no group went
    /// into the memtable meanwhile. A key the memtable missed is not in a frozen layer, so
    /// the applier does not change it in sled; a layer dropped meanwhile moved its keys to
    /// sled with the same values. Under writes that never pause, the reads are made under
    /// the lock after a few tries.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        const TRIES: usize = 3;
        for _ in 0..TRIES {
            let (groups, in_mem) = {
                let m = self.shared.mem.read();
                let found: Vec<_> = keys.iter().map(|(t, k)| m.get(*t, k)).collect();
                (m.groups, found)
            };
            self.shared.knobs.atomic_read_gate();
            let vals = keys
                .iter()
                .zip(in_mem)
                .map(|((t, k), v)| match v {
                    Some(v) => Ok(v),
                    None => self.sled_get(*t, k),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if self.shared.mem.read().groups == groups {
                return Ok(vals);
            }
        }
        let m = self.shared.mem.read();
        keys.iter()
            .map(|(t, k)| match m.get(*t, k) {
                Some(v) => Ok(v),
                None => self.sled_get(*t, k),
            })
            .collect()
    }

    fn active_bytes(&self) -> usize {
        self.shared.active_bytes.load(Ordering::Relaxed)
    }

    fn last_alive(&self) -> Result<Option<u64>, StoreError> {
        alive::read(&self.shared.dir)
    }

    fn stamp_alive(&self, ms: u64) -> Result<(), StoreError> {
        alive::write(&self.shared.dir, ms)
    }

    fn memtable_bytes(&self) -> usize {
        let m = self.shared.mem.read();
        m.active.bytes + m.frozen.as_ref().map_or(0, |f| f.bytes)
    }

    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        // No lock is held across sled's read (a cold page waits on the disk, and the commit
        // thread waiting for the memtable's write lock would stop every reader behind it): the
        // memtable's entries are copied, then sled is read. Keys reach sled only in a layer
        // that was in the copy, until that layer is dropped (`gen`): then sled may hold writes
        // newer than the copy, and the read is made again. The last try's answer stands; its
        // callers hold their task's lock, so the task's own keys do not move meanwhile.
        const TRIES: usize = 3;
        let mut tries = 0;
        loop {
            let (gen, mem) = {
                let m = self.shared.mem.read();
                (m.gen, m.with_prefix(tree, prefix))
            };
            self.shared.knobs.atomic_read_gate();
            let found = self.last_over_sled(tree, prefix, mem)?;
            tries += 1;
            if tries == TRIES || self.shared.mem.read().gen == gen {
                return Ok(found);
            }
        }
    }
    /// The applier's error while its write of a layer into sled failed and sled is not yet
    /// reopened: writes are refused meanwhile, and health says so even if no group failed.
    fn failing(&self) -> Option<String> {
        let s = &self.shared;
        if !s.sled_failed.load(Ordering::SeqCst) {
            return None;
        }
        let why = s.sled_error.lock().clone();
        Some(why.unwrap_or_else(|| sled_behind().to_string()))
    }
}
