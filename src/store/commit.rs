//! Group commit: many writers, one log record per group, one durable sync for all the groups
//! appended while the last sync ran.
//!
//! Writers hand their job (the encoded writes of one step, with its preconditions) to a bounded
//! queue and await the answer. Two threads carry jobs out, as a pipeline:
//! - the commit thread (`herald-commit`) takes every job that has queued up (up to
//!   [`GROUP_MAX`]) and applies them in one backend call (one write-ahead log record for sled:
//!   `backend.rs`), then hands the group to
//! - the sync thread (`herald-sync`), which makes every group handed to it durable with one
//!   `sync` and only then answers each job.
//!
//! So while one `fdatasync` runs, the next group is resolved and appended: on a disk whose
//! sync takes as long as a group's CPU work, that doubles what one core commits. A writer is
//! still answered only once its own write is on disk, no store lock is ever taken on a tokio
//! worker, and under load the cost of one flush is shared by every group it covers. At most
//! [`GROUPS_AHEAD`] groups wait for the sync thread, so what is appended and not yet durable
//! stays bounded.
//!
//! The queue is bounded ([`QUEUE_JOBS`]): a caller that must not wait (an HTTP create) gets
//! [`StoreError::Busy`] when it is full and answers 503 with `Retry-After`; engine steps wait
//! for room. Nothing queues without bound.
//!
//! Health: a failed apply or sync is remembered (and logged once per change) until a later
//! group succeeds; `/healthz` and `/metrics` read it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};

use super::backend::{Backend, RawOp, Rejected};
use super::StoreError;

/// Most jobs in one group (one log record, one sync).
pub const GROUP_MAX: usize = 4_096;
/// Groups applied and waiting for the sync thread, at most; the commit thread waits beyond.
pub const GROUPS_AHEAD: usize = 2;
/// Least time between two attempts to reopen a failing backend.
const RECOVER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Jobs that may wait for the commit thread (default; tests use a small queue).
pub const QUEUE_JOBS: usize = 16_384;

type Reply = oneshot::Sender<Result<Result<(), Rejected>, String>>;

struct Job {
    ops: Vec<RawOp>,
    reply: Reply,
}

/// A group the commit thread applied, for the sync thread to make durable and answer.
struct Group {
    seq: u64,
    replies: Vec<(Reply, Result<(), Rejected>)>,
    /// When the commit thread took it (for the flush-time histogram).
    started: Instant,
}

#[derive(Debug)]
pub struct CommitStats {
    /// Durable flushes done (one per group).
    pub flushes: AtomicU64,
    /// Jobs answered.
    pub waiters: AtomicU64,
    /// Groups or flushes that failed.
    pub failures: AtomicU64,
    /// Largest group so far.
    pub group_max: AtomicU64,
    /// Total time spent applying and flushing, in microseconds.
    pub busy_us: AtomicU64,
    /// Time per group: apply and durable flush, in seconds.
    pub flush_seconds: Histogram,
    /// Writers per group (how much one flush is shared).
    pub group_size: Histogram,
}

/// Upper bounds of the flush-time buckets (seconds): a good disk's fdatasync is ~0.2 ms to a
/// few ms; a stalling one shows up in the top buckets.
pub const FLUSH_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Upper bounds of the group-size buckets (writers per flush, up to [`GROUP_MAX`]).
pub const GROUP_BOUNDS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

impl Default for CommitStats {
    fn default() -> Self {
        CommitStats {
            flushes: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            group_max: AtomicU64::new(0),
            busy_us: AtomicU64::new(0),
            flush_seconds: Histogram::new(FLUSH_BOUNDS_S),
            group_size: Histogram::new(GROUP_BOUNDS),
        }
    }
}

/// What the last group said about the storage: `None` when it worked.
#[derive(Default)]
pub struct Health {
    failing: Mutex<Option<String>>,
}

impl Health {
    pub fn failing(&self) -> Option<String> {
        self.failing.lock().clone()
    }

    fn set(&self, v: Option<String>) {
        let mut f = self.failing.lock();
        match (&*f, &v) {
            (None, Some(e)) => {
                tracing::error!(error = %e, "storage is failing: writes are refused and sends stop until it works again")
            }
            (Some(_), None) => tracing::warn!("storage works again"),
            _ => {}
        }
        *f = v;
    }
}

pub struct GroupCommit {
    // `Option` only so that `Drop` can close the queue and then join the threads.
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub stats: Arc<CommitStats>,
    pub health: Arc<Health>,
    queue_jobs: usize,
}

impl Drop for GroupCommit {
    /// Closes the queue and waits for the threads (the sync thread ends once the commit thread
    /// has), so that their handles on the database are gone when the store is dropped (a
    /// reopen of the same directory must not find it still locked).
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl GroupCommit {
    pub fn start(backend: Arc<dyn Backend>, queue_jobs: usize) -> std::io::Result<GroupCommit> {
        let (tx, rx) = mpsc::channel::<Job>(queue_jobs.max(1));
        let stats = Arc::new(CommitStats::default());
        let health = Arc::new(Health::default());
        let recovery = Arc::new(Recovery::default());
        let (groups_tx, groups_rx) = std::sync::mpsc::sync_channel::<Group>(GROUPS_AHEAD);
        let (b, s, h, r) = (
            backend.clone(),
            stats.clone(),
            health.clone(),
            recovery.clone(),
        );
        let syncer = std::thread::Builder::new()
            .name("herald-sync".into())
            .spawn(move || sync_groups(b, groups_rx, s, h, r))?;
        let (s, h) = (stats.clone(), health.clone());
        let committer = std::thread::Builder::new()
            .name("herald-commit".into())
            .spawn(move || apply_groups(backend, rx, groups_tx, s, h, recovery))?;
        Ok(GroupCommit {
            tx: Some(tx),
            threads: vec![committer, syncer],
            stats,
            health,
            queue_jobs: queue_jobs.max(1),
        })
    }

    /// Applies `ops` atomically and resolves once they are durable. With `wait == false` a full
    /// queue is [`StoreError::Busy`] at once.
    pub async fn write(
        &self,
        ops: Vec<RawOp>,
        wait: bool,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let stopped = || StoreError::Write("commit thread stopped".into());
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let (reply, rx) = oneshot::channel();
        let job = Job { ops, reply };
        if wait {
            tx.send(job).await.map_err(|_| stopped())?;
        } else {
            tx.try_send(job).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::Busy,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        }
        rx.await.map_err(|_| stopped())?.map_err(StoreError::Write)
    }

    /// Jobs waiting for the commit thread right now.
    pub fn queued(&self) -> usize {
        self.tx
            .as_ref()
            .map_or(0, |tx| self.queue_jobs - tx.capacity())
    }
}

/// When a failing backend was last asked to start afresh (shared by both threads).
#[derive(Default)]
struct Recovery {
    last: Mutex<Option<Instant>>,
}

impl Recovery {
    /// Some backends keep failing once they failed (sled remembers an I/O error): let them
    /// start afresh, at most once a second, so herald recovers by itself once the disk works
    /// again.
    fn after_failure(&self, backend: &dyn Backend) {
        {
            let mut last = self.last.lock();
            if last.is_some_and(|t: Instant| t.elapsed() < RECOVER_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(e) = backend.recover() {
            tracing::warn!(error = %e, "reopening the storage failed; trying again after the next failed write");
        }
    }
}

/// Answers every job of a group that failed as a whole.
fn fail_all(
    replies: impl IntoIterator<Item = Reply>,
    e: &str,
    stats: &CommitStats,
    health: &Health,
) {
    stats.failures.fetch_add(1, Ordering::Relaxed);
    health.set(Some(e.to_string()));
    for reply in replies {
        // A writer that gave up (request dropped) is fine to ignore.
        let _ = reply.send(Err(e.to_string()));
    }
}

/// The commit thread: takes the queued jobs as a group, applies it, hands it to the sync
/// thread. Ends when every [`GroupCommit`] sender is dropped.
fn apply_groups(
    backend: Arc<dyn Backend>,
    mut rx: mpsc::Receiver<Job>,
    groups: std::sync::mpsc::SyncSender<Group>,
    stats: Arc<CommitStats>,
    health: Arc<Health>,
    recovery: Arc<Recovery>,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let (ops, replies): (Vec<Vec<RawOp>>, Vec<Reply>) =
            jobs.into_iter().map(|j| (j.ops, j.reply)).unzip();
        let applied = backend.apply(&ops);
        stats
            .busy_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match applied {
            Ok(a) => {
                let group = Group {
                    seq: a.seq,
                    replies: replies.into_iter().zip(a.results).collect(),
                    started,
                };
                if groups.send(group).is_err() {
                    return; // the sync thread is gone: stopping
                }
            }
            Err(e) => {
                fail_all(replies, &e.to_string(), &stats, &health);
                recovery.after_failure(&*backend);
            }
        }
    }
}

/// The sync thread: makes every group handed over durable (one `sync` covers all of them) and
/// answers their jobs.
fn sync_groups(
    backend: Arc<dyn Backend>,
    rx: std::sync::mpsc::Receiver<Group>,
    stats: Arc<CommitStats>,
    health: Arc<Health>,
    recovery: Arc<Recovery>,
) {
    while let Ok(first) = rx.recv() {
        let mut groups = vec![first];
        groups.extend(rx.try_iter());
        let started = Instant::now();
        let mut answered = 0usize;
        for g in groups {
            let r = backend.sync(g.seq);
            let took = g.started.elapsed();
            stats.flush_seconds.observe(took.as_secs_f64());
            answered += g.replies.len();
            match r {
                Ok(()) => {
                    health.set(None);
                    for (reply, r) in g.replies {
                        let _ = reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    fail_all(
                        g.replies.into_iter().map(|(reply, _)| reply),
                        &e.to_string(),
                        &stats,
                        &health,
                    );
                    recovery.after_failure(&*backend);
                }
            }
        }
        stats
            .busy_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        stats.group_size.observe(answered as f64);
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats.waiters.fetch_add(answered as u64, Ordering::Relaxed);
        stats
            .group_max
            .fetch_max(answered as u64, Ordering::Relaxed);
    }
}
