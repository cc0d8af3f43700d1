//! Group commit: many writers, one log record and one durable sync per group.
//!
//! Writers hand their job (the encoded writes of one step, with its preconditions) to a bounded
//! queue and await the answer. The commit thread takes every job that has queued up (up to
//! [`GROUP_MAX`]), applies them all in one backend call (one write-ahead log record for sled:
//! `backend.rs`), makes them durable with one
//! `sync`, and only then answers each. So a writer is answered only once its own write is on
//! disk, no store lock is ever taken on a tokio worker, and under load the cost of one flush is
//! shared by the whole group.
//!
//! The queue is bounded ([`QUEUE_JOBS`]): a caller that must not wait (an HTTP create) gets
//! [`StoreError::Busy`] when it is full and answers 503 with `Retry-After`; engine steps wait
//! for room. Nothing queues without bound. Before a job is queued, the admission law
//! (`store/pace.rs::admit`) slows it by up to 50 ms while the backend's memtable is behind,
//! and a memtable at its hard bound counts as a full queue.
//!
//! Health: a failed apply or sync is remembered (and logged once per change) until a later
//! group succeeds; `/healthz` and `/metrics` read it. While it fails the engine refuses writes
//! up front, so no group might come to prove the storage works again: a heal thread
//! (`herald-heal`) queues an empty probe group every [`PROBE_EVERY`] meanwhile. It goes through
//! the backend like any group (a full disk refuses it, `store/space.rs`), a failed one lets the
//! backend start afresh ([`Backend::recover`], at most once per [`RECOVER_EVERY`]), and the
//! first that succeeds clears the failure: herald heals on a timer, not only after a write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};

use super::backend::{Backend, RawOp, Rejected};
use super::gather::Gather;
use super::pace::{self, Admit};
use super::StoreError;

/// Most jobs in one group (one log record, one sync).
pub const GROUP_MAX: usize = 4_096;
/// A group takes no more jobs once it holds this many writes. A chunk of a herd's settles is
/// one job of ~1 300 writes (`engine/chunk.rs`): without a bound, a herd's settles queue up
/// into groups of tens of chunks (one took the commit thread ~100 ms in a profile), and every
/// write behind one, and every settle in it, waits for all of it. Bounded, they go in groups
/// of ~12 chunks, for a few more syncs. Herd of 100 000, alternating runs: last message at
/// due + 542 and 616 ms against 688 and 698 ms unbounded.
pub const GROUP_OPS_MAX: usize = 16_384;
/// A group takes no more jobs once it holds this many bytes of writes, and a job may hold at
/// most [`JOB_BYTES_MAX`]: a group is one write-ahead log record, whose lengths are 32-bit
/// (`wal.rs`), so a group stays under 2 GiB + the last job's bytes < 4 GiB. Without the
/// bounds a few huge creates queued together wrapped the record's length: acknowledged, then
/// cut as a torn tail at the next start (review finding). A create is at most `[limits]
/// body_bytes_max` (1 MiB by default) or a broadcast's copies (`request::validate`'s
/// `BROADCAST_BYTES_MAX`, 768 MiB): only huge broadcasts ever meet the group bound.
pub const GROUP_BYTES_MAX: usize = 1 << 30;
/// Most bytes of writes one job may hold; more is refused before it is queued, for its
/// writer alone (`StoreError::Encode`), not as a failing store.
pub const JOB_BYTES_MAX: usize = 1 << 30;
/// Least time between two attempts to reopen a failing backend.
const RECOVER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How often the heal thread probes a failing store.
pub const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// A group that takes this long is logged with where its time went.
const SLOW_GROUP: std::time::Duration = std::time::Duration::from_millis(100);

/// Jobs that may wait for the commit thread (default; tests use a small queue).
pub const QUEUE_JOBS: usize = 16_384;

type Reply = oneshot::Sender<Result<Result<(), Rejected>, StoreError>>;

struct Job {
    ops: Vec<RawOp>,
    /// [`RawOp::bytes`] of `ops`.
    bytes: usize,
    reply: Reply,
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
    /// Writes the admission law (`store/pace.rs::admit`) made wait, the longest wait it gave
    /// (µs), and the writes it refused (or sent on to wait for room) at the hard bound.
    pub admit_delayed: AtomicU64,
    pub admit_delay_max_us: AtomicU64,
    pub admit_full: AtomicU64,
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
            admit_delayed: AtomicU64::new(0),
            admit_delay_max_us: AtomicU64::new(0),
            admit_full: AtomicU64::new(0),
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
    // Both are `Option` only so that `Drop` can close the queue and then join the thread.
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<CommitStats>,
    pub health: Arc<Health>,
    queue_jobs: usize,
    /// Read for the admission law (its active layer's size).
    backend: Arc<dyn Backend>,
    bell: Arc<Doorbell>,
}

/// How a writer tells the commit thread, while it waits for more writers (`gather.rs`), that
/// enough have queued: the thread sets `target` (jobs in the queue) and sleeps on `cv` until
/// then or its deadline; a writer whose job makes the queue reach it rings. Outside a wait
/// `target` is 0 and a write costs one atomic load. A ring that is missed (the store-load race
/// between a writer and the thread, or a spurious order) costs the rest of the wait, no more.
#[derive(Default)]
struct Doorbell {
    target: std::sync::atomic::AtomicUsize,
    m: Mutex<()>,
    cv: parking_lot::Condvar,
}

impl Doorbell {
    /// Waits until `queued()` reaches `target` or `wait` has passed.
    fn wait(&self, target: usize, wait: std::time::Duration, queued: impl Fn() -> usize) {
        let deadline = Instant::now() + wait;
        let mut g = self.m.lock();
        self.target.store(target, Ordering::SeqCst);
        while queued() < target {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        self.target.store(0, Ordering::SeqCst);
    }

    /// After a job was queued: rings if the thread waits for as many as are queued now.
    fn ring(&self, queued: usize) {
        std::sync::atomic::fence(Ordering::SeqCst);
        let t = self.target.load(Ordering::SeqCst);
        if t > 0 && queued >= t {
            let _g = self.m.lock();
            self.cv.notify_one();
        }
    }
}

impl Drop for GroupCommit {
    /// Closes the queue and waits for the thread, so that the thread's handle on the database
    /// is gone when the store is dropped (a reopen of the same directory must not find it
    /// still locked).
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl GroupCommit {
    pub fn start(backend: Arc<dyn Backend>, queue_jobs: usize) -> std::io::Result<GroupCommit> {
        let (tx, rx) = mpsc::channel::<Job>(queue_jobs.max(1));
        let stats = Arc::new(CommitStats::default());
        let health = Arc::new(Health::default());
        let (s, h) = (stats.clone(), health.clone());
        let admission = backend.clone();
        let bell = Arc::new(Doorbell::default());
        let b = bell.clone();
        let thread = std::thread::Builder::new()
            .name("herald-commit".into())
            .spawn(move || run(backend, rx, s, h, &b))?;
        let (weak, h) = (tx.downgrade(), health.clone());
        std::thread::Builder::new()
            .name("herald-heal".into())
            .spawn(move || heal(weak, h))?;
        Ok(GroupCommit {
            tx: Some(tx),
            thread: Some(thread),
            stats,
            health,
            queue_jobs: queue_jobs.max(1),
            backend: admission,
            bell,
        })
    }

    /// Applies `ops` atomically and resolves once they are durable. First the admission law
    /// (`store/pace.rs::admit`) may make the write wait a little, while the applier is behind.
    /// With `wait == false` a full queue, or a memtable at its hard bound, is
    /// [`StoreError::Busy`] at once.
    pub async fn write(
        &self,
        ops: Vec<RawOp>,
        wait: bool,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let stopped = || StoreError::Write("commit thread stopped".into());
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let bytes = job_bytes(&ops)?;
        if let Admit::After(d) = pace::admit(self.backend.active_bytes()) {
            self.stats.admit_delayed.fetch_add(1, Ordering::Relaxed);
            self.stats
                .admit_delay_max_us
                .fetch_max(d.as_micros() as u64, Ordering::Relaxed);
            tokio::time::sleep(d).await;
        }
        // Looked at again after the wait: the fill may have reached the bound meanwhile.
        if pace::admit(self.backend.active_bytes()) == Admit::Full {
            self.stats.admit_full.fetch_add(1, Ordering::Relaxed);
            if !wait {
                return Err(StoreError::Busy);
            }
        }
        let (reply, rx) = oneshot::channel();
        let job = Job { ops, bytes, reply };
        if wait {
            tx.send(job).await.map_err(|_| stopped())?;
        } else {
            tx.try_send(job).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::Busy,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        }
        self.bell.ring(self.queued());
        rx.await.map_err(|_| stopped())?
    }

    /// Jobs waiting for the commit thread right now.
    pub fn queued(&self) -> usize {
        self.tx
            .as_ref()
            .map_or(0, |tx| self.queue_jobs - tx.capacity())
    }
}

/// The heal thread: an empty probe group every [`PROBE_EVERY`] while the store fails. Ends
/// once the queue is gone (the store was dropped). A full queue skips a probe: writes are
/// moving then anyway.
fn heal(queue: mpsc::WeakSender<Job>, health: Arc<Health>) {
    loop {
        std::thread::sleep(PROBE_EVERY);
        let Some(tx) = queue.upgrade() else { return };
        if health.failing().is_some() {
            let (reply, _answer) = oneshot::channel();
            let _ = tx.try_send(Job {
                ops: Vec::new(),
                bytes: 0,
                reply,
            });
        }
    }
}

/// The bytes of a job's writes, refused past [`JOB_BYTES_MAX`].
fn job_bytes(ops: &[RawOp]) -> Result<usize, StoreError> {
    bytes_within(ops, JOB_BYTES_MAX)
}

/// [`job_bytes`] against `max`.
fn bytes_within(ops: &[RawOp], max: usize) -> Result<usize, StoreError> {
    let bytes: usize = ops.iter().map(RawOp::bytes).sum();
    if bytes > max {
        return Err(StoreError::Encode(format!(
            "a write of {bytes} bytes is more than one write may hold ({max})"
        )));
    }
    Ok(bytes)
}

/// Adds the jobs queued now to the group, within its bounds (the group's bytes are counted
/// from its jobs).
fn take_queued(rx: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>, ops: &mut usize) {
    let mut bytes: usize = jobs.iter().map(|j| j.bytes).sum();
    while jobs.len() < GROUP_MAX && *ops < GROUP_OPS_MAX && bytes < GROUP_BYTES_MAX {
        match rx.try_recv() {
            Ok(j) => {
                *ops += j.ops.len();
                bytes += j.bytes;
                jobs.push(j);
            }
            Err(_) => break,
        }
    }
}

fn run(
    backend: Arc<dyn Backend>,
    mut rx: mpsc::Receiver<Job>,
    stats: Arc<CommitStats>,
    health: Arc<Health>,
    bell: &Doorbell,
) {
    let mut last_recover: Option<Instant> = None;
    let mut gather = Gather::default();
    // Ends when every GroupCommit (and so every Sender) is dropped.
    while let Some(first) = rx.blocking_recv() {
        let mut ops = first.ops.len();
        let mut jobs = vec![first];
        take_queued(&mut rx, &mut jobs, &mut ops);
        // A slow sync and fewer writers back than the last group had: wait a little for the
        // rest (`gather.rs`), until they are queued or the wait is over, then take them too.
        if let Some(d) = gather.wait(jobs.len(), ops) {
            let missing = gather.previous().saturating_sub(jobs.len());
            bell.wait(missing, d, || rx.len());
            take_queued(&mut rx, &mut jobs, &mut ops);
        }
        let started = Instant::now();
        let (ops, replies): (Vec<Vec<RawOp>>, Vec<Reply>) =
            jobs.into_iter().map(|j| (j.ops, j.reply)).unzip();
        let n_ops: usize = ops.iter().map(Vec::len).sum();
        let mut synced = None;
        let result = backend.apply(ops).and_then(|r| {
            let t = Instant::now();
            synced = Some(t);
            let s = backend.sync();
            gather.observe(replies.len(), t.elapsed());
            s.map(|()| r)
        });
        let took = started.elapsed();
        if took >= SLOW_GROUP {
            // Where a slow group's time went: the apply (admission to the memtable, the
            // resolve, the log append) or the sync (the disk).
            let apply = synced.map_or(took, |t| t - started);
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                apply_ms = apply.as_millis() as u64,
                sync_ms = (took - apply).as_millis() as u64,
                writers = replies.len(),
                ops = n_ops,
                "a slow commit group"
            );
        }
        stats
            .busy_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        stats.flush_seconds.observe(took.as_secs_f64());
        stats.group_size.observe(replies.len() as f64);
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats
            .waiters
            .fetch_add(replies.len() as u64, Ordering::Relaxed);
        stats
            .group_max
            .fetch_max(replies.len() as u64, Ordering::Relaxed);
        match result {
            Ok(results) => {
                health.set(None);
                for (reply, r) in replies.into_iter().zip(results) {
                    // A writer that gave up (request dropped) is fine to ignore.
                    let _ = reply.send(Ok(r));
                }
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                health.set(Some(e.to_string()));
                for reply in replies {
                    let _ = reply.send(Err(e.for_each_writer()));
                }
                // Some backends keep failing once they failed (sled remembers an I/O error):
                // let them start afresh, at most once a second, so herald recovers by itself
                // once the disk works again.
                if last_recover.is_none_or(|t: Instant| t.elapsed() >= RECOVER_EVERY) {
                    last_recover = Some(Instant::now());
                    if let Err(e) = backend.recover() {
                        tracing::warn!(error = %e, "starting the storage afresh failed; the heal thread tries again");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A group stops taking jobs once it holds `GROUP_BYTES_MAX` bytes, so its log record's
    /// 32-bit lengths never wrap (jobs of 600 MiB: two in a group, the third in the next);
    /// a job above `JOB_BYTES_MAX` is refused before it is queued.
    #[test]
    fn a_group_is_bounded_by_its_bytes_and_a_job_by_its_own() {
        let (tx, mut rx) = mpsc::channel(8);
        let job = |bytes| {
            let (reply, _) = oneshot::channel();
            Job {
                ops: Vec::new(),
                bytes,
                reply,
            }
        };
        for _ in 0..3 {
            tx.try_send(job(600 << 20)).ok().unwrap();
        }
        let (mut jobs, mut ops) = (Vec::new(), 0);
        take_queued(&mut rx, &mut jobs, &mut ops);
        assert_eq!(jobs.len(), 2);
        let (mut next, mut ops) = (Vec::new(), 0);
        take_queued(&mut rx, &mut next, &mut ops);
        assert_eq!(next.len(), 1);
        let put =
            |n: usize| RawOp::Put(super::super::backend::TreeId::Specs, vec![0; 8], vec![0; n]);
        assert_eq!(job_bytes(&[put(100), put(20)]).ok(), Some(136));
        let big = RawOp::Indexed(Box::new(super::super::backend::IndexedWrite {
            tree: super::super::backend::TreeId::Specs,
            key: vec![0; 8],
            value: Some(Vec::new()),
            store: true,
            index: super::super::backend::TreeId::Due,
            entry: |_, _| None,
            derived_from: super::super::backend::TreeId::Specs,
            derive: |_, _| None,
            stored_absent: false,
            old: None,
        }));
        assert_eq!(job_bytes(&[big]).ok(), Some(8));
        assert_eq!(bytes_within(&[put(92)], 100).ok(), Some(100));
        let e = bytes_within(&[put(93)], 100).err().unwrap();
        assert!(matches!(e, StoreError::Encode(_)), "{e}");
    }

    /// The commit thread's wait ends when the writer that completes its count rings, not at
    /// its deadline (a minute here: the test would take that long if the ring were lost);
    /// a ring below the count, or with nobody waiting, wakes nothing.
    #[test]
    fn the_writer_that_completes_the_count_ends_the_wait() {
        let bell = Arc::new(Doorbell::default());
        let queued = Arc::new(AtomicUsize::new(0));
        bell.ring(5); // nobody waits: nothing happens
        let (b, q) = (bell.clone(), queued.clone());
        let writers = std::thread::spawn(move || {
            for _ in 0..3 {
                // Each writer queues, then rings with the queue's length.
                while b.target.load(Ordering::SeqCst) == 0 {
                    std::thread::yield_now();
                }
                let n = q.fetch_add(1, Ordering::SeqCst) + 1;
                b.ring(n);
            }
        });
        let started = Instant::now();
        bell.wait(3, Duration::from_secs(60), || queued.load(Ordering::SeqCst));
        assert!(queued.load(Ordering::SeqCst) >= 3);
        assert!(started.elapsed() < Duration::from_secs(60));
        assert_eq!(bell.target.load(Ordering::SeqCst), 0, "no wait after it");
        writers.join().unwrap();
    }
}
