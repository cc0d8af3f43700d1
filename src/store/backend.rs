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
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

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
}

impl TreeId {
    pub const ALL: [TreeId; 8] = [
        TreeId::Specs,
        TreeId::Progress,
        TreeId::Live,
        TreeId::Messages,
        TreeId::Runs,
        TreeId::Failures,
        TreeId::Idem,
        TreeId::Due,
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
    fn apply(&self, jobs: &[Vec<RawOp>]) -> Result<Vec<Result<(), Rejected>>, StoreError>;
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
}

/// sled 0.34 behind a write-ahead log (`store/wal.rs`): `apply` resolves a group into plain
/// writes (preconditions checked, secondary index keys derived, reading sled and the group's
/// own earlier writes) and appends them to the log as one record; `sync` makes the record
/// durable with one `fdatasync` and then applies it to sled, one `sled::Batch` per tree and no
/// transaction. A checkpoint thread flushes sled and deletes closed log segments. So there is
/// exactly one writer (the commit thread), a group is one sequential append plus one sync, and
/// sled's `flush()` is off the write path.
///
/// Readers see sled: a group becomes visible when `sync` returns (per tree at once; across
/// trees [`Backend::get_atomic`] waits for a group being applied).
///
/// sled 0.34 remembers an I/O error (a full disk, say) and fails every later operation with it,
/// even after the disk works again. [`Backend::recover`] therefore reopens the directory and
/// replays the log into it: the handle sits behind a lock so that it can be replaced while
/// herald runs.
pub struct SledBackend {
    dir: PathBuf,
    cache_bytes: u64,
    /// `None` only while a reopen failed; every operation then fails until the next one.
    inner: Arc<RwLock<Option<SledInner>>>,
    /// The segment being appended to and the group `apply` resolved for `sync`.
    log: Mutex<Log>,
    /// Held for writing while a group is applied to sled (see `get_atomic`).
    applying: RwLock<()>,
    /// Closed segments go to the checkpoint thread (`None` once dropping).
    checkpoints: Option<std::sync::mpsc::Sender<PathBuf>>,
    checkpointer: Option<std::thread::JoinHandle<()>>,
}

struct Log {
    /// `None` only after a segment could not be created; appends then fail until `recover`.
    seg: Option<Segment>,
    /// Resolved by `apply`, appended, not yet durable nor in sled.
    pending: Option<Vec<Write>>,
    /// A durable record failed to reach sled: sled is behind the log, and a group resolved
    /// against it now could be wrong. Writes are refused until `recover` has replayed the log.
    behind: bool,
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

    /// Applies resolved writes one by one. No `sled::Batch`: the log already makes a group
    /// atomic (a crash half-way is replayed whole), and a batch per tree costs sled a batch
    /// manifest and its exclusive lock each (delivery bench, unsigned: 9 100 sends/s with a
    /// batch per tree, 13 500 without).
    fn apply_writes(&self, writes: &[Write]) -> Result<(), StoreError> {
        for w in writes {
            let t = &self.trees[w.tree.index()];
            match &w.value {
                Some(v) => {
                    t.insert(w.key.as_slice(), v.as_slice())?;
                }
                None => {
                    t.remove(w.key.as_slice())?;
                }
            }
        }
        Ok(())
    }

    /// Replays the log segments in `dir` into sled, makes sled durable and deletes them.
    /// Returns the number for the next segment.
    fn replay(&self, dir: &Path) -> Result<u64, StoreError> {
        let (records, segs) = wal::read_all(dir)?;
        let Some((last, _)) = segs.last() else {
            return Ok(1);
        };
        let started = std::time::Instant::now();
        for writes in &records {
            self.apply_writes(writes)?;
        }
        self.flush()?;
        for (_, path) in &segs {
            remove_if_there(path)?;
        }
        wal::sync_dir(dir)?;
        if !records.is_empty() {
            tracing::info!(
                records = records.len(),
                segments = segs.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "replayed the write-ahead log"
            );
        }
        Ok(last + 1)
    }
}

fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The checkpoint thread: for each closed segment, flush sled (everything in the segment was
/// applied before it was closed) and then delete it. A failed flush keeps the segments; they
/// go with the next checkpoint, or are replayed at the next open.
fn checkpoints(
    dir: PathBuf,
    inner: Arc<RwLock<Option<SledInner>>>,
    rx: std::sync::mpsc::Receiver<PathBuf>,
) {
    let mut closed: Vec<PathBuf> = Vec::new();
    let spare = |dir: &Path| {
        if let Err(e) = wal::prepare_spare(dir) {
            tracing::warn!(error = %e, "could not make a spare write-ahead log segment; the next one is made when needed");
        }
    };
    spare(&dir);
    while let Ok(first) = rx.recv() {
        closed.push(first);
        closed.extend(rx.try_iter());
        // Held across flush and delete: `recover` (which replays what is on disk) waits.
        let guard = inner.read();
        let Some(i) = &*guard else { continue };
        let r = i.flush().and_then(|()| {
            for p in &closed {
                remove_if_there(p)?;
            }
            Ok(wal::sync_dir(&dir)?)
        });
        drop(guard);
        match r {
            Ok(()) => {
                closed.clear();
                spare(&dir);
            }
            Err(e) => {
                tracing::warn!(error = %e, segments = closed.len(), "checkpoint failed; the log segments are kept and tried again at the next one")
            }
        }
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        self.checkpoints.take();
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
    }
}

impl SledBackend {
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, StoreError> {
        let inner = SledInner::open(dir, cache_bytes)?;
        let next = inner.replay(dir)?;
        let seg = Segment::create(dir, next)?;
        let inner = Arc::new(RwLock::new(Some(inner)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (d, i) = (dir.to_path_buf(), inner.clone());
        let checkpointer = std::thread::Builder::new()
            .name("herald-checkpoint".into())
            .spawn(move || checkpoints(d, i, rx))?;
        Ok(SledBackend {
            dir: dir.to_path_buf(),
            cache_bytes,
            inner,
            log: Mutex::new(Log {
                seg: Some(seg),
                pending: None,
                behind: false,
            }),
            applying: RwLock::new(()),
            checkpoints: Some(tx),
            checkpointer: Some(checkpointer),
        })
    }

    /// sled's handle (for `meta` and migrations at open).
    pub fn db(&self) -> Result<sled::Db, StoreError> {
        self.with(|i| i.db.clone())
    }

    fn with<T>(&self, f: impl FnOnce(&SledInner) -> T) -> Result<T, StoreError> {
        match &*self.inner.read() {
            Some(i) => Ok(f(i)),
            None => Err(StoreError::Write(format!(
                "the data directory {} is closed after a failed reopen",
                self.dir.display()
            ))),
        }
    }

    fn tree(&self, t: TreeId) -> Result<sled::Tree, StoreError> {
        self.with(|i| i.trees[t.index()].clone())
    }
}

/// A group's writes so far, over sled: what the next job of the group reads.
struct Resolver<'a> {
    trees: &'a [sled::Tree],
    seen: HashMap<(TreeId, Vec<u8>), Option<Vec<u8>>>,
    writes: Vec<Write>,
}

impl Resolver<'_> {
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // A borrowed lookup would need the key as an owned tuple anyway; keys are short.
        if let Some(v) = self.seen.get(&(tree, key.to_vec())) {
            return Ok(v.clone());
        }
        Ok(self.trees[tree.index()].get(key)?.map(|v| v.to_vec()))
    }

    fn put(&mut self, tree: TreeId, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.seen.insert((tree, key.clone()), value.clone());
        self.writes.push(Write { tree, key, value });
    }

    /// One job: its preconditions, then its writes.
    fn job(&mut self, ops: &[RawOp]) -> Result<Result<(), Rejected>, StoreError> {
        for op in ops {
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
                RawOp::Put(t, k, v) => self.put(*t, k.clone(), Some(v.clone())),
                RawOp::Delete(t, k) => self.put(*t, k.clone(), None),
                RawOp::Absent(..) => {}
                RawOp::Indexed(w) => {
                    let old = self.get(w.tree, &w.key)?;
                    if old == w.value {
                        continue;
                    }
                    if let Some(old) = &old {
                        self.put(w.index, (w.index_key)(&w.key, old), None);
                    }
                    if let Some(v) = &w.value {
                        self.put(w.index, (w.index_key)(&w.key, v), Some(v.clone()));
                    }
                    self.put(w.tree, w.key.clone(), w.value.clone());
                }
            }
        }
        Ok(Ok(()))
    }
}

impl Backend for SledBackend {
    fn apply(&self, jobs: &[Vec<RawOp>]) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let mut log = self.log.lock();
        log.discard()?;
        if log.behind {
            return Err(StoreError::Write(
                "sled is behind the write-ahead log; waiting for a reopen".into(),
            ));
        }
        let trees = self.with(|i| i.trees.clone())?;
        let mut r = Resolver {
            trees: &trees,
            seen: HashMap::new(),
            writes: Vec::new(),
        };
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
        let mut log = self.log.lock();
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
        let applied = {
            let _applying = self.applying.write();
            self.with(|i| i.apply_writes(&writes)).and_then(|r| r)
        };
        if let Err(e) = applied {
            log.behind = true;
            return Err(e);
        }
        let Some(seg) = log.seg.as_mut() else {
            return Ok(());
        };
        if seg.full() {
            match Segment::create(&self.dir, seg.n + 1) {
                Ok(fresh) => {
                    let closed = std::mem::replace(seg, fresh);
                    if let Some(tx) = &self.checkpoints {
                        let _ = tx.send(closed.path.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a new write-ahead log segment; appending to the old one")
                }
            }
        }
        Ok(())
    }

    fn recover(&self) -> Result<(), StoreError> {
        let mut log = self.log.lock();
        log.discard()?;
        log.seg = None;
        let mut inner = self.inner.write();
        // The old handle must be gone before the directory can be locked again. A reader that
        // still holds a tree of it (an iterator) keeps it open: then this fails and is tried
        // again after the next failed group.
        *inner = None;
        let fresh = SledInner::open(&self.dir, self.cache_bytes)?;
        // What the log holds and sled may not (a group whose apply failed) goes in now.
        let next = fresh.replay(&self.dir)?;
        log.seg = Some(Segment::create(&self.dir, next)?);
        log.behind = false;
        *inner = Some(fresh);
        tracing::warn!(dir = %self.dir.display(), "storage reopened");
        Ok(())
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let t = self.tree(tree)?;
        Ok(t.get(key)?.map(|v| v.to_vec()))
    }

    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a> {
        let prefix = prefix.map(|p| p.to_vec());
        let t = match self.tree(tree) {
            Ok(t) => t,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        let it = t
            .range(start.to_vec()..)
            .take_while(move |item| match (&prefix, item) {
                (Some(p), Ok((k, _))) => k.starts_with(p),
                _ => true,
            })
            .map(|item| {
                item.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            });
        Box::new(it)
    }

    /// Waits for a group being applied to sled, so it sees a group wholly or not at all.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let _applying = self.applying.read();
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }

    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        match self.tree(tree)?.scan_prefix(prefix).next_back() {
            Some(item) => {
                let (k, v) = item?;
                Ok(Some((k.to_vec(), v.to_vec())))
            }
            None => Ok(None),
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
        b.apply(&[vec![put(TreeId::Specs, "kept", "1")]]).unwrap();
        b.sync().unwrap();
        b.apply(&[vec![put(TreeId::Specs, "lost", "1")]]).unwrap();
        assert_eq!(
            get(&b, TreeId::Specs, "lost"),
            None,
            "not visible before sync"
        );
        // The next group discards it (its sync failed, say).
        let r = b
            .apply(&[vec![
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

    #[test]
    fn jobs_of_one_group_see_the_writes_of_the_jobs_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let b = SledBackend::open(dir.path(), 8 << 20).unwrap();
        let live = |v: &str| {
            RawOp::Indexed(Box::new(IndexedWrite {
                tree: TreeId::Live,
                key: b"t".to_vec(),
                value: Some(v.as_bytes().to_vec()),
                index: TreeId::Due,
                index_key: |k, v| [v, k].concat(),
            }))
        };
        let r = b
            .apply(&[
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
}
