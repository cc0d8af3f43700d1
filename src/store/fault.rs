//! A backend wrapper that fails on command: for tests of what the engine does when storage
//! fails (apply, sync) and recovers. Not used outside tests, but public so integration tests
//! can build an engine on it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use super::backend::{Backend, Kv, KvIter, RawOp, Rejected, TreeId};
use super::StoreError;

/// Switches shared between a test and its [`FaultyBackend`].
#[derive(Debug)]
pub struct Faults {
    /// Groups that may still be applied before applying fails (negative: no limit).
    pub apply_budget: AtomicI64,
    /// Applying a group fails (nothing is written).
    pub fail_apply: AtomicBool,
    /// The durable flush fails (the group is applied in memory but not known to be on disk).
    pub fail_sync: AtomicBool,
    /// Groups refused so far.
    pub refused: AtomicU64,
    /// While set, the durable flush waits (a disk that stalls).
    pub stall_sync: AtomicBool,
    /// Flushes that found `stall_sync` set and waited (a test knows the commit thread is held).
    pub syncs_stalled: AtomicU64,
    /// Times the commit thread asked the backend to start afresh.
    pub recovers: AtomicU64,
    /// Every read fails (a store that cannot be read right now: a database outage).
    pub fail_reads: AtomicBool,
    /// Reads refused so far.
    pub reads_refused: AtomicU64,
    /// Scans of this tree fail (counted in `reads_refused`); other reads go through.
    pub fail_scans_of: parking_lot::Mutex<Option<TreeId>>,
    /// Each read (a point read, a scan's start) first waits this many microseconds: a store
    /// whose every statement is a round trip (PostgreSQL), on a disk-backed test rig.
    pub read_delay_us: AtomicU64,
    /// Reads that waited for `read_delay_us` (a test knows a slowed reader is under way).
    pub reads_delayed: AtomicU64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            apply_budget: AtomicI64::new(-1),
            fail_apply: AtomicBool::new(false),
            fail_sync: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            stall_sync: AtomicBool::new(false),
            syncs_stalled: AtomicU64::new(0),
            recovers: AtomicU64::new(0),
            fail_reads: AtomicBool::new(false),
            reads_refused: AtomicU64::new(0),
            fail_scans_of: parking_lot::Mutex::new(None),
            read_delay_us: AtomicU64::new(0),
            reads_delayed: AtomicU64::new(0),
        }
    }
}

impl Faults {
    /// Lets `n` more groups through, then fails every apply until [`Faults::set`] clears it.
    pub fn fail_after(&self, n: i64) {
        self.apply_budget.store(n, Ordering::SeqCst);
    }

    /// A read to refuse now, counted; `None`: let it through (after `read_delay_us`).
    fn read_fault(&self) -> Option<StoreError> {
        let delay_us = self.read_delay_us.load(Ordering::SeqCst);
        if delay_us > 0 {
            self.reads_delayed.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
        if !self.fail_reads.load(Ordering::SeqCst) {
            return None;
        }
        self.reads_refused.fetch_add(1, Ordering::SeqCst);
        Some(injected("read"))
    }

    pub fn set(&self, apply: bool, sync: bool) {
        self.apply_budget.store(-1, Ordering::SeqCst);
        self.fail_apply.store(apply, Ordering::SeqCst);
        self.fail_sync.store(sync, Ordering::SeqCst);
    }
}

pub struct FaultyBackend {
    pub inner: Arc<dyn Backend>,
    pub faults: Arc<Faults>,
}

fn injected(what: &str) -> StoreError {
    StoreError::Io(std::io::Error::other(format!(
        "injected fault: {what} (No space left on device)"
    )))
}

impl Backend for FaultyBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let budget =
            self.faults
                .apply_budget
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                    (b > 0).then(|| b - 1)
                });
        let out_of_budget = budget == Err(0);
        if out_of_budget || self.faults.fail_apply.load(Ordering::SeqCst) {
            self.faults.refused.fetch_add(1, Ordering::SeqCst);
            return Err(injected("apply"));
        }
        self.inner.apply(jobs)
    }

    fn sync(&self) -> Result<(), StoreError> {
        if self.faults.stall_sync.load(Ordering::SeqCst) {
            self.faults.syncs_stalled.fetch_add(1, Ordering::SeqCst);
        }
        while self.faults.stall_sync.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if self.faults.fail_sync.load(Ordering::SeqCst) {
            self.faults.refused.fetch_add(1, Ordering::SeqCst);
            return Err(injected("sync"));
        }
        self.inner.sync()
    }

    fn recover(&self) -> Result<(), StoreError> {
        self.faults.recovers.fetch_add(1, Ordering::SeqCst);
        self.inner.recover()
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.faults.read_fault() {
            Some(e) => Err(e),
            None => self.inner.get(tree, key),
        }
    }

    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a> {
        if *self.faults.fail_scans_of.lock() == Some(tree) {
            self.faults.reads_refused.fetch_add(1, Ordering::SeqCst);
            return Box::new(std::iter::once(Err(injected("scan"))));
        }
        match self.faults.read_fault() {
            Some(e) => Box::new(std::iter::once(Err(e))),
            None => self.inner.scan(tree, start, prefix),
        }
    }

    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        match self.faults.read_fault() {
            Some(e) => Err(e),
            None => self.inner.last_with_prefix(tree, prefix),
        }
    }

    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        match self.faults.read_fault() {
            Some(e) => Err(e),
            None => self.inner.get_atomic(keys),
        }
    }

    /// Refused like a scan while reads fail.
    fn shard_rows(&self, tree: TreeId, shard: u32) -> Result<Vec<Kv>, StoreError> {
        match self.faults.read_fault() {
            Some(e) => Err(e),
            None => self.inner.shard_rows(tree, shard),
        }
    }

    /// Never refused: a test fails the reads of the tasks taken out of the inbox, after the
    /// inbox gave them (`tests/cluster_inbox_reads.rs`).
    fn take_inbox(&self) -> Result<Vec<String>, StoreError> {
        self.inner.take_inbox()
    }

    fn last_alive(&self) -> Result<Option<u64>, StoreError> {
        self.inner.last_alive()
    }
    fn stamp_alive(&self, ms: u64) -> Result<(), StoreError> {
        self.inner.stamp_alive(ms)
    }
    fn memtable_bytes(&self) -> usize {
        self.inner.memtable_bytes()
    }

    fn active_bytes(&self) -> usize {
        self.inner.active_bytes()
    }
}
