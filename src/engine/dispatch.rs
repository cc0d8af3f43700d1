//! The dispatcher: takes due keys from the timer thread and routes each by its kind.
//!
//! - [`Key::Fire`]: the task's schedule — a fire step (`step::fire`). At most
//!   [`FIRES_AT_ONCE`] run at once; the rest wait as keys in the fire queue ([`fire_pump`]),
//!   not as spawned tasks, so a herd of 100 000 fires costs 100 000 queued keys, not 100 000
//!   tasks parked on a semaphore.
//! - [`Key::Run`]: a run's next step (arm, or send and settle). Run keys due together go to a
//!   chunk (`chunk.rs`), one alone to the one-key path (`step::run_step`).
//! - [`Key::Retry`]: a failure-list retry (`retry.rs`).
//!
//! While draining nothing starts: each key's durable state (pending, or armed) is what the
//! next boot recovers from.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::Semaphore;

use super::step::{self, Step};
use super::timer::{Key, RunKey, StepGuard};
use super::Inner;

/// Fire steps running at once. A herd hands over tens of thousands of fires at one instant;
/// bounded, they wait on a semaphore (a cheap poll each) instead of each doing its reads and
/// writes ahead of the sends that are due meanwhile.
const FIRES_AT_ONCE: usize = 256;

/// Most run keys in one chunk ([`super::chunk`]): the timer hands over everything due in a
/// round (in batches of as many), so a herd's sends to a local channel are written, and
/// settled, a chunk at a time.
const CHUNK_MAX: usize = super::timer::HAND_OVER_MAX;

pub(crate) async fn dispatcher(inner: Weak<Inner>, mut due: UnboundedReceiver<Vec<Key>>) {
    let (fires, queued) = mpsc::unbounded_channel();
    tokio::spawn(fire_pump(inner.clone(), queued));
    while let Some(keys) = due.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut runs = Vec::new();
        for key in keys {
            let guard = inner.timer.step_guard();
            if step::draining(&inner) {
                // Draining: the key's durable state (pending, or armed) is what the next boot
                // recovers from; starting it now could only start a send that the exit cuts off.
                continue;
            }
            if !inner.owns_key(&key) {
                // Cluster mode: its shard is not held (any more): its owner acts on it. Held
                // but not trusted this moment (a renewal answered late): the key comes back
                // later, as a closed send window's step does ([`Inner::holds`]).
                if inner.holds_key(&key) {
                    step::window_closed(&inner, key);
                }
                continue;
            }
            match key {
                Key::Fire(task) => {
                    // Only at shutdown is the pump gone; the key's durable state stays.
                    let _ = fires.send((task, guard));
                }
                Key::Retry(id) => step::spawn(&inner, Step::Retry(id), guard),
                Key::Run(task, run) => {
                    runs.push((RunKey { task, run }, guard));
                    if runs.len() == CHUNK_MAX {
                        spawn_runs(&inner, std::mem::take(&mut runs));
                    }
                }
            }
        }
        spawn_runs(&inner, runs);
    }
}

/// Run steps due together: one on its own, more as a chunk.
fn spawn_runs(inner: &Arc<Inner>, mut runs: Vec<(RunKey, StepGuard)>) {
    if runs.len() > 1 {
        let ahead = inner.chunks_ahead.enter();
        tokio::spawn(super::chunk::run(inner.clone(), runs, ahead));
    } else if let Some((key, guard)) = runs.pop() {
        step::spawn(inner, Step::Run(key), guard);
    }
}

/// Starts fire steps in the order they fell due, each once a permit is free: at most
/// [`FIRES_AT_ONCE`] fire steps exist at a time. A waiting fire keeps its step guard, so
/// `Engine::idle` and the drain count it as outstanding.
async fn fire_pump(inner: Weak<Inner>, queued: UnboundedReceiver<(Arc<str>, StepGuard)>) {
    let permits = Arc::new(Semaphore::new(FIRES_AT_ONCE));
    // The tasks of the next fires are read in batches meanwhile (`prefetch.rs`).
    let mut queued = super::prefetch::Ahead::new(queued);
    while let Some((task, guard)) = queued.next(&inner).await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if step::draining(&inner) {
            continue; // the next boot fires it
        }
        if !inner.owns(&task) {
            // The shard's owner fires it; or, held but not trusted this moment, this
            // process a little later ([`Inner::holds`]).
            if inner.holds(&task) {
                step::window_closed(&inner, Key::Fire(task));
            }
            continue;
        }
        step::spawn(&inner, Step::Fire(task, permit), guard);
    }
}
