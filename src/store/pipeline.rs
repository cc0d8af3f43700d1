//! The group commit as a pipeline of two threads, for a backend whose `apply` appends to a log
//! and whose sync may run apart from it (the embedded engine, `Backend::pipeline_ticket`).
//!
//! - **apply stage** (`herald-commit`): takes the queued jobs, resolves and appends them as one
//!   group (`Backend::apply`), and hands the group, with its ticket, to the sync stage.
//! - **sync stage** (`herald-sync`): takes every group handed over, makes them durable with one
//!   `fdatasync` (`Backend::sync_through`, outside the log's lock), puts them in the memtable,
//!   and only then answers their writers.
//!
//! Why: in turn, a group's cycle is its CPU (resolve, encode, append, the memtable's inserts)
//! plus its sync, and the writers that come back meanwhile wait for both. Here the next group
//! is resolved and appended while the disk syncs the last one, so a writer waits for the rest
//! of the sync under way and then its own, and the CPU is off that path. (A herd's chunk of
//! ~1 300 settles is ~1 ms of resolving: in turn, the sync waited for it.)
//!
//! The rules that keep it what the group commit was:
//! - A writer is answered only once its group is durable, and after every group before it
//!   (one log, synced in order: a sync covers everything appended before it began).
//! - A group resolves against the groups before it that are not yet durable (`resolve.rs`).
//!   If one of those is cut off (a failed sync cuts every unsynced group: nothing appended
//!   after a failed sync can be trusted on disk), the later ones are cut off with it and their
//!   writers are told so; none of them ever becomes durable by a later sync
//!   (`Backend::abandon`).
//! - The apply stage holds a group, while a sync is under way and syncs are slow, until as many
//!   writers have queued as the last sync carried (or the sync ends): one append and one
//!   hand-off for them all, instead of one per writer. The sync stage waits for stragglers as
//!   the group commit in turn did (`gather.rs`), but only while no sync is under way.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::backend::{Backend, RawOp, Rejected};
use super::commit::{
    answer, fail, take_queued, CommitStats, Doorbell, Health, Job, Recovery, Reply,
};
use super::gather::{Gather, OPS_ENOUGH, SYNC_SLOW, WAIT_MAX};

/// A group appended, on its way to the sync stage.
struct Applied {
    ticket: u64,
    replies: Vec<Reply>,
    results: Vec<Result<(), Rejected>>,
    ops: usize,
}

/// What the stages tell each other besides the groups.
#[derive(Default)]
struct Signals {
    /// A sync is under way (the apply stage may hold a group for more writers).
    syncing: AtomicBool,
    /// Writers the last sync answered.
    last_writers: AtomicUsize,
    /// The sync's running mean is slow enough to be worth holding a group for.
    slow: AtomicBool,
}

/// What the sync stage shares with the apply stage.
struct Stage {
    signals: Arc<Signals>,
    recovery: Arc<Recovery>,
    /// The commit's doorbell: the end of a sync wakes an apply stage holding a group for it.
    bell: Arc<Doorbell>,
}

/// The apply stage; starts the sync stage and ends (after it) when the queue is closed.
pub(super) fn run(
    backend: Arc<dyn Backend>,
    mut rx: mpsc::Receiver<Job>,
    stats: Arc<CommitStats>,
    health: Arc<Health>,
    bell: Arc<Doorbell>,
) {
    let (tx, synced_rx) = std_mpsc::channel::<Applied>();
    let signals = Arc::new(Signals::default());
    let recovery = Arc::new(Recovery::default());
    let sync = {
        let (b, s, h) = (backend.clone(), stats.clone(), health.clone());
        let stage = Stage {
            signals: signals.clone(),
            recovery: recovery.clone(),
            bell: bell.clone(),
        };
        std::thread::Builder::new()
            .name("herald-sync".into())
            .spawn(move || sync_stage(&*b, synced_rx, &s, &h, &stage))
    };
    let sync = match sync {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "could not start the sync thread; groups are applied and synced in turn");
            return super::commit::run_in_turn(backend, rx, stats, health, &bell);
        }
    };
    while let Some(first) = rx.blocking_recv() {
        let mut ops = first.ops.len();
        let mut jobs = vec![first];
        take_queued(&mut rx, &mut jobs, &mut ops);
        if hold(&signals, jobs.len(), ops) {
            let target = signals.last_writers.load(Ordering::Relaxed);
            let missing = target.saturating_sub(jobs.len());
            bell.wait_until(missing, WAIT_MAX, || {
                rx.len() >= missing || !signals.syncing.load(Ordering::Acquire)
            });
            take_queued(&mut rx, &mut jobs, &mut ops);
        }
        let started = Instant::now();
        let (ops, replies): (Vec<Vec<RawOp>>, Vec<Reply>) =
            jobs.into_iter().map(|j| (j.ops, j.reply)).unzip();
        let n_ops = ops.iter().map(Vec::len).sum();
        let applied = backend.apply(ops);
        stats.busy(started.elapsed());
        match applied {
            Ok(results) => {
                let applied = Applied {
                    ticket: backend.pipeline_ticket().unwrap_or(0),
                    replies,
                    results,
                    ops: n_ops,
                };
                if let Err(std_mpsc::SendError(a)) = tx.send(applied) {
                    // The sync stage is gone (only a panic ends it early): nothing of this
                    // group is known durable.
                    let e = super::StoreError::Write("the sync thread stopped".into());
                    fail(&stats, &health, a.replies, &e);
                }
            }
            Err(e) => {
                fail(&stats, &health, replies, &e);
                recovery.maybe(&*backend);
            }
        }
    }
    drop(tx);
    let _ = sync.join();
}

/// Whether the apply stage holds `jobs` writers (`ops` writes) for more: only while a slow
/// sync is under way, fewer have queued than the last sync answered, and the group is small.
fn hold(signals: &Signals, jobs: usize, ops: usize) -> bool {
    signals.syncing.load(Ordering::Acquire)
        && signals.slow.load(Ordering::Relaxed)
        && jobs < signals.last_writers.load(Ordering::Relaxed)
        && ops < OPS_ENOUGH
}

/// The sync stage: every group handed over, made durable in order, then answered. Ends when
/// the apply stage is gone and every group it handed over is answered.
fn sync_stage(
    backend: &dyn Backend,
    rx: std_mpsc::Receiver<Applied>,
    stats: &CommitStats,
    health: &Health,
    stage: &Stage,
) {
    let signals = &*stage.signals;
    let mut gather = Gather::default();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let writers = |b: &[Applied]| b.iter().map(|a| a.replies.len()).sum::<usize>();
        let ops = |b: &[Applied]| b.iter().map(|a| a.ops).sum::<usize>();
        // A slow sync and fewer writers than the last one answered: wait a little for the
        // rest (`gather.rs`). The apply stage does not hold groups meanwhile (no sync is under
        // way), so each straggler comes as soon as it is appended.
        if let Some(d) = gather.wait(writers(&batch), ops(&batch)) {
            let deadline = Instant::now() + d;
            while writers(&batch) < gather.previous() {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(a) => {
                        batch.push(a);
                        batch.extend(rx.try_iter());
                    }
                    Err(_) => break,
                }
            }
        }
        let n = writers(&batch);
        signals.syncing.store(true, Ordering::Release);
        let started = Instant::now();
        // In ticket order: the first that needs it syncs everything appended so far; the
        // rest are durable by then (or were cut off with it).
        let mut synced = false;
        let fates: Vec<Result<(), super::StoreError>> = batch
            .iter()
            .map(|a| match backend.sync_through(a.ticket) {
                Ok(s) => {
                    synced |= s;
                    Ok(())
                }
                Err(e) => {
                    backend.abandon();
                    Err(e)
                }
            })
            .collect();
        let took = started.elapsed();
        signals.syncing.store(false, Ordering::Release);
        stage.bell.wake();
        stats.busy(took);
        if synced {
            gather.observe(n, took);
            signals.last_writers.store(n, Ordering::Relaxed);
            signals
                .slow
                .store(gather.mean_sync() >= SYNC_SLOW, Ordering::Relaxed);
            stats.flushed(n, took);
        }
        let mut failed = false;
        for (a, fate) in batch.into_iter().zip(fates) {
            match fate {
                Ok(()) => answer(health, a.replies, a.results),
                Err(e) => {
                    failed = true;
                    fail(stats, health, a.replies, &e);
                }
            }
        }
        if failed {
            stage.recovery.maybe(backend);
        }
    }
}
