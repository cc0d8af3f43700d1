//! Group commit: many writers, one durable flush.
//!
//! A writer first applies its change to sled (in memory, visible at once), then calls
//! [`GroupCommit::durable`]. The commit thread takes every waiter that has queued up, runs one
//! `flush()` + `sync_data()` for all of them, and answers each. A waiter is only answered by a
//! flush that *started after it queued*, so its own write is covered. Under load the cost of a
//! flush is shared by the whole batch, which is what lets many concurrent creates answer 201
//! quickly while every 201 still means "on disk".

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

type Waiter = oneshot::Sender<Result<(), String>>;

#[derive(Default, Debug)]
pub struct CommitStats {
    /// Durable flushes done.
    pub flushes: AtomicU64,
    /// Waiters answered.
    pub waiters: AtomicU64,
}

pub struct GroupCommit {
    // Both are `Option` only so that `Drop` can close the channel and then join the thread.
    tx: Option<Sender<Waiter>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<CommitStats>,
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
    /// Starts the commit thread. `data_file` is sled's data file, synced after each flush
    /// because sled 0.34's own flush uses `sync_file_range`, which does not survive power loss.
    pub fn start(db: sled::Db, data_file: Option<File>) -> std::io::Result<GroupCommit> {
        let (tx, rx) = crossbeam_channel::unbounded::<Waiter>();
        let stats = Arc::new(CommitStats::default());
        let s = stats.clone();
        let thread = std::thread::Builder::new()
            .name("herald-commit".into())
            .spawn(move || run(db, data_file, rx, s))?;
        Ok(GroupCommit {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        })
    }

    /// Resolves once everything written before this call is durable.
    pub async fn durable(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .as_ref()
            .ok_or_else(|| "commit thread stopped".to_string())?
            .send(tx)
            .map_err(|_| "commit thread stopped".to_string())?;
        rx.await.map_err(|_| "commit thread stopped".to_string())?
    }
}

fn run(db: sled::Db, data_file: Option<File>, rx: Receiver<Waiter>, stats: Arc<CommitStats>) {
    // Ends when every GroupCommit (and so every Sender) is dropped.
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let result = flush(&db, data_file.as_ref());
        if let Err(e) = &result {
            tracing::error!(error = %e, "durable flush failed");
        }
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats
            .waiters
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for w in batch {
            // A waiter that gave up (request dropped) is fine to ignore.
            let _ = w.send(result.clone());
        }
    }
}

fn flush(db: &sled::Db, data_file: Option<&File>) -> Result<(), String> {
    db.flush().map_err(|e| format!("sled flush: {e}"))?;
    if let Some(f) = data_file {
        f.sync_data().map_err(|e| format!("sync_data: {e}"))?;
    }
    Ok(())
}
