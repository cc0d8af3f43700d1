//! Reads the tasks of the fires about to run, many in one batched store read, before their
//! steps need them (issue 23: a herd on PostgreSQL).
//!
//! An idle task is unloaded (`cells.rs`), so a fire step first reads its task back: spec,
//! progress and live entry, one point read each. On sled those are memory reads; on
//! PostgreSQL each is a round trip, made on a tokio worker, and a herd of 100 000 one-shots
//! paid 300 000 of them one after the other. The fire pump (`dispatch.rs`) takes its keys
//! through [`Ahead`], which keeps up to [`BATCH`] keys beyond the one it hands out read (or
//! being read) with one [`crate::store::Store::get_tasks`] per batch: one round trip for 256
//! tasks.
//!
//! Correctness: the cell's lock is the authority. A batch first takes the lock of each cell
//! that is unloaded and free ([`tokio::sync::Mutex::try_lock_owned`]: it never waits, so it
//! can wait for nobody while holding others), then reads, then fills the cells and lets them
//! go. Every change of a task is made under its lock and is durable before that lock is
//! released, so what a batch reads while it holds the lock is the task as it is: a command
//! can come only before (the batch then reads its result) or after (it finds the cell
//! loaded, with the same state). A cell that is busy is left alone; a task the batch cannot
//! read, or whose load needs more (its runs cannot be read: parked), stays unloaded and its
//! step loads it the usual way.
//!
//! The same batch reads the timeline counters of its tasks that the store does not hold in
//! memory (a task met first since start-up, or one of more than the store keeps), loaded
//! cells too (start-up loads the tasks due within a minute), with one more batched read
//! ([`crate::store::Store::prime_timeline_seqs`]): otherwise each fire's first event read its
//! task's first and last timeline keys on its own, two round trips per task on PostgreSQL.
//! Under the cells' locks, like the tasks: what is read is the counter as it is.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::OwnedMutexGuard;

use super::{cells, Inner, Slot};

/// Tasks read in one batch, and how many keys are kept read ahead of the one handed out.
pub(crate) const BATCH: usize = 256;
/// Keys taken off the queue at most (they keep their order and their step guards).
const AHEAD_MAX: usize = 4 * BATCH;

/// The fire queue, read ahead (module doc). `T` rides along with each key (its step guard).
pub(crate) struct Ahead<T> {
    queued: UnboundedReceiver<(Arc<str>, T)>,
    keys: VecDeque<(Arc<str>, T)>,
    /// The first `fetched` of `keys` have had their batch started.
    fetched: usize,
}

impl<T> Ahead<T> {
    pub(crate) fn new(queued: UnboundedReceiver<(Arc<str>, T)>) -> Ahead<T> {
        Ahead {
            queued,
            keys: VecDeque::new(),
            fetched: 0,
        }
    }

    /// The next key in queue order (`None` once the queue is closed and empty). Before it is
    /// handed out, the tasks of the keys after it are being read, up to [`BATCH`] ahead.
    pub(crate) async fn next(&mut self, inner: &Weak<Inner>) -> Option<(Arc<str>, T)> {
        if self.keys.is_empty() {
            let first = self.queued.recv().await?;
            self.keys.push_back(first);
        }
        while self.keys.len() < AHEAD_MAX {
            match self.queued.try_recv() {
                Ok(k) => self.keys.push_back(k),
                Err(_) => break,
            }
        }
        if self.fetched < BATCH && self.fetched < self.keys.len() {
            let end = (self.fetched + BATCH).min(self.keys.len());
            if let Some(inner) = inner.upgrade() {
                let ids = self.keys.range(self.fetched..end).map(|(id, _)| id.clone());
                start(&inner, ids.collect());
            }
            self.fetched = end;
        }
        let next = self.keys.pop_front();
        self.fetched = self.fetched.saturating_sub(1);
        next
    }
}

/// Locks the unloaded, free cells among `ids` now (so the steps that follow wait for the
/// batch instead of reading on their own) and reads them on a blocking thread.
fn start(inner: &Arc<Inner>, ids: Vec<Arc<str>>) {
    let mut held = Vec::with_capacity(ids.len());
    for id in ids {
        let Some((id, cell)) = cells::cell_of(inner, &id) else {
            continue; // not live: its step finds it gone
        };
        let Ok(guard) = cell.try_lock_owned() else {
            continue; // a step or command has it: it loads it itself
        };
        if matches!(*guard, Slot::Unloaded(_)) || !inner.store.timeline_seq_known(&id) {
            held.push((id, guard));
        }
    }
    if held.is_empty() {
        return;
    }
    let inner = inner.clone();
    // The store's calls block: on a blocking thread they hold no tokio worker for the trip.
    tokio::task::spawn_blocking(move || fill(&inner, held));
}

/// One batched read of the held cells' tasks that are unloaded, each loaded as `cells::lock`
/// would, and one of the timeline counters of all of them. The locks are released when `held`
/// drops, loaded or (on any failure) still unloaded.
fn fill(inner: &Inner, held: Vec<(Arc<str>, OwnedMutexGuard<Slot>)>) {
    let ids: Vec<&str> = held.iter().map(|(id, _)| &**id).collect();
    if let Err(e) = inner.store.prime_timeline_seqs(&ids) {
        // Each first event reads its own counter, as without the batch.
        tracing::debug!(error = %e, tasks = ids.len(), "prefetch of timeline counters failed");
    }
    let mut unloaded: Vec<(Arc<str>, OwnedMutexGuard<Slot>)> = held
        .into_iter()
        .filter(|(_, g)| matches!(**g, Slot::Unloaded(_)))
        .collect();
    if !unloaded.is_empty() {
        load(inner, &mut unloaded);
    }
}

/// [`fill`]'s batched read and load of unloaded cells.
fn load(inner: &Inner, held: &mut [(Arc<str>, OwnedMutexGuard<Slot>)]) {
    let ids: Vec<&str> = held.iter().map(|(id, _)| &**id).collect();
    // Asked before the read (`cells::load`).
    let epochs: Vec<Option<u64>> = ids.iter().map(|id| inner.load_epoch(id)).collect();
    let tasks = match inner.store.get_tasks(&ids) {
        Ok(t) => t,
        Err(e) => {
            // Each step reads its own task and handles the error as it always does.
            tracing::debug!(error = %e, tasks = held.len(), "prefetch read failed");
            return;
        }
    };
    for (((id, guard), read), epoch) in held.iter_mut().zip(tasks).zip(epochs) {
        let Ok(Some((task, message))) = read else {
            continue; // gone or unreadable: its step says so
        };
        let next_run = task.fires + 1;
        let Slot::Unloaded(out) = &**guard else {
            continue;
        };
        if let Ok(Some((st, None))) = cells::load_task(inner, id, task, out) {
            let mut st = st.at(epoch);
            // The message of the run its fire starts next (a task of one message, no run
            // active: run `fires + 1`, message 0), so neither the fire nor the send reads it
            // again. A change of the task's messages drops it (`commit.rs`, `after`).
            if let (Some(m), true) = (message, st.runs.is_empty()) {
                st.prefetched = Some((next_run, 0, m));
            }
            **guard = Slot::Loaded(Box::new(st));
        }
    }
}
