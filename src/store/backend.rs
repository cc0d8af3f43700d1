//! The storage boundary: the few operations the engine needs from a key-value store, so that a
//! second backend (a replicated one, say) can sit behind [`super::Store`] without touching the
//! engine. sled is the embedded default ([`SledBackend`]); tests wrap it to inject faults.
//!
//! The contract:
//! - [`Backend::apply`] applies a group of jobs; each job is atomic on its own (all of its
//!   writes or none) and guarded by its preconditions (keys that must be absent). The result
//!   says, per job, whether it was applied or which precondition failed. Applied writes are
//!   visible to reads at once but not yet durable.
//! - [`Backend::sync`] makes everything applied before it durable (survives power loss).
//! - Point reads and ordered scans by tree.

use std::fs::File;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

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

/// sled 0.34 as the backend: one multi-tree transaction per group (sled serialises them on a
/// process-wide lock, so there is exactly one writer: the commit thread), then one `flush()` and
/// an `fdatasync` of sled's data file per group.
///
/// sled 0.34 remembers an I/O error (a full disk, say) and fails every later operation with it,
/// even after the disk works again. [`Backend::recover`] therefore reopens the directory: the
/// handle sits behind a lock so that it can be replaced while herald runs.
pub struct SledBackend {
    dir: PathBuf,
    cache_bytes: u64,
    /// `None` only while a reopen failed; every operation then fails until the next one.
    inner: RwLock<Option<SledInner>>,
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
}

impl SledBackend {
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, StoreError> {
        Ok(SledBackend {
            dir: dir.to_path_buf(),
            cache_bytes,
            inner: RwLock::new(Some(SledInner::open(dir, cache_bytes)?)),
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

impl Backend for SledBackend {
    fn apply(&self, jobs: &[Vec<RawOp>]) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let trees = self.with(|i| i.trees.clone())?;
        let r = trees.as_slice().transaction(|tx| {
            let mut results = Vec::with_capacity(jobs.len());
            'job: for ops in jobs {
                for op in ops {
                    if let RawOp::Absent(t, k) = op {
                        if tx[t.index()].get(k.as_slice())?.is_some() {
                            results.push(Err(Rejected {
                                tree: *t,
                                key: k.clone(),
                            }));
                            continue 'job;
                        }
                    }
                }
                for op in ops {
                    match op {
                        RawOp::Put(t, k, v) => {
                            tx[t.index()].insert(k.as_slice(), v.as_slice())?;
                        }
                        RawOp::Delete(t, k) => {
                            tx[t.index()].remove(k.as_slice())?;
                        }
                        RawOp::Absent(..) => {}
                        RawOp::Indexed(w) => {
                            let (primary, index) = (&tx[w.tree.index()], &tx[w.index.index()]);
                            let old = primary.get(w.key.as_slice())?;
                            if old.as_deref() == w.value.as_deref() {
                                continue;
                            }
                            if let Some(old) = &old {
                                index.remove((w.index_key)(&w.key, old))?;
                            }
                            match &w.value {
                                Some(v) => {
                                    primary.insert(w.key.as_slice(), v.as_slice())?;
                                    index.insert((w.index_key)(&w.key, v), v.as_slice())?;
                                }
                                None => {
                                    primary.remove(w.key.as_slice())?;
                                }
                            }
                        }
                    }
                }
                results.push(Ok(()));
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(results)
        });
        match r {
            Ok(v) => Ok(v),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(StoreError::Sled(e)),
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        let guard = self.inner.read();
        let Some(inner) = &*guard else {
            return Err(StoreError::Write("the data directory is closed".into()));
        };
        inner.db.flush()?;
        if let Some(f) = &inner.data_file {
            f.sync_data()?;
        }
        Ok(())
    }

    fn recover(&self) -> Result<(), StoreError> {
        let mut inner = self.inner.write();
        // The old handle must be gone before the directory can be locked again. A reader that
        // still holds a tree of it (an iterator) keeps it open: then this fails and is tried
        // again after the next failed group.
        *inner = None;
        let fresh = SledInner::open(&self.dir, self.cache_bytes)?;
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

    /// A read-only transaction over the trees: sled serialises it with the commit thread's
    /// group transactions, so it sees a group either wholly or not at all.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let trees = self.with(|i| i.trees.clone())?;
        let r = trees.as_slice().transaction(|tx| {
            let mut out = Vec::with_capacity(keys.len());
            for (t, k) in keys {
                out.push(tx[t.index()].get(k.as_slice())?.map(|v| v.to_vec()));
            }
            Ok::<_, ConflictableTransactionError<StoreError>>(out)
        });
        match r {
            Ok(v) => Ok(v),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(StoreError::Sled(e)),
        }
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
