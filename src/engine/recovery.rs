//! Start-up: put every live task back where it was.
//!
//! - `pending`: its next fire goes back on the wheel; a fire time that passed while herald was
//!   down fires at once (misfire `fire_now`).
//! - `running`: each active run resumes at its cursor, at the instant its next step was due (or
//!   now). A message that was in flight at the crash is sent again — with the same
//!   idempotency key — because nobody knows whether the channel got it.
//! - `paused`: nothing goes on the wheel.
//!
//! A corrupt record is reported with its key and skipped; the rest is served.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::timer::RunKey;
use super::{EngineError, Inner, LiveState};
use crate::model::{RunState, TaskState};
use crate::store::Batch;

pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    let (mut pending, mut running, mut resent, mut corrupt) = (0usize, 0usize, 0usize, 0usize);
    let mut fixes = Batch::new();
    for item in inner.store.all_tasks() {
        let mut task = match item {
            Ok(t) => t,
            Err(e) => {
                corrupt += 1;
                tracing::error!(error = %e, "skipping corrupt task record");
                continue;
            }
        };
        if task.state.is_terminal() {
            continue;
        }
        let runs = match inner.store.runs_of(&task.id) {
            Ok(r) => r,
            Err(e) => {
                corrupt += 1;
                tracing::error!(task = %task.id, error = %e, "skipping task with a corrupt run record");
                continue;
            }
        };
        let mut active = BTreeMap::new();
        for mut r in runs.into_iter().filter(|r| r.state == RunState::Running) {
            if let Some(seq) = r.in_flight.take() {
                resent += 1;
                tracing::warn!(task = %task.id, run = r.run, seq,
                    "message was in flight at shutdown; sending it again with the same idempotency key");
                r.next_at_ms = Some(now);
            }
            active.insert(r.run, r);
        }
        if task.state == TaskState::Running && active.is_empty() {
            // The run finished but the task's own update did not reach the disk.
            let to = if task.next_fire_at_ms.is_some() {
                TaskState::Pending
            } else {
                TaskState::Completed
            };
            task.set_state(to, now)?;
            fixes.task(&task);
            if to == TaskState::Completed {
                continue;
            }
        }
        match task.state {
            TaskState::Pending => {
                pending += 1;
                if let Some(at) = task.next_fire_at_ms {
                    inner.timer.at(RunKey::new(&task.id, task.runs + 1), at);
                }
            }
            TaskState::Running => {
                running += 1;
                for r in active.values() {
                    inner
                        .timer
                        .at(RunKey::new(&task.id, r.run), r.next_at_ms.unwrap_or(now));
                }
            }
            _ => {}
        }
        let id = task.id.clone();
        let cell = Arc::new(tokio::sync::Mutex::new(LiveState { task, runs: active }));
        inner.live.lock().insert(id, cell);
    }
    if !fixes.is_empty() {
        inner.store.apply(&fixes)?;
        inner.store.durable().await?;
    }
    tracing::info!(pending, running, resent, corrupt, "recovery done");
    Ok(())
}
