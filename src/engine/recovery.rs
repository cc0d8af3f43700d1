//! Start-up: put every live task back where it was.
//!
//! - `pending`: its next fire goes back on the wheel; fires whose time passed while herald was
//!   down are judged by the misfire policy when that entry fires (at once).
//! - `running`: each active run resumes at its cursor, at the instant its next step was due (or
//!   now). A message that was in flight at the crash is sent again — with the same idempotency
//!   key and the next attempt number — because nobody knows whether the channel got it.
//! - `paused`: nothing goes on the wheel; the runs keep their cursors for the resume.
//!
//! A corrupt record is reported with its key and skipped; the rest is served.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::dispatch::{plan_fire, plan_run, start_run};
use super::{derive_state, EngineError, Inner, LiveState};
use crate::model::{RunState, TaskState};
use crate::store::Batch;

pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    let (mut live_tasks, mut resent, mut corrupt) = (0usize, 0usize, 0usize);
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
                // The attempt stays counted: it may have reached the channel.
                resent += 1;
                tracing::warn!(task = %task.id, run = r.run, seq,
                    "message was in flight at shutdown; sending it again with the same idempotency key");
                r.next_at_ms = Some(now);
            }
            active.insert(r.run, r);
        }
        // A run finished but the task's own update did not reach the disk, or a queued fire
        // was waiting for it: bring the task's state in line with its runs.
        if task.state == TaskState::Running && active.is_empty() && !task.queued.is_empty() {
            let (n, at) = task.queued.remove(0);
            let r = start_run(&mut task, n, at, now);
            fixes.run(&task.id, &r);
            active.insert(r.run, r);
        }
        let to = derive_state(&task, !active.is_empty());
        if to != task.state {
            task.set_state(to, now)?;
            fixes.task(&task);
            if to.is_terminal() {
                continue;
            }
        }
        if task.state == TaskState::Running {
            for r in active.values() {
                plan_run(inner, &task.id, r);
            }
        }
        plan_fire(inner, &task);
        live_tasks += 1;
        let id = task.id.clone();
        let cell = Arc::new(tokio::sync::Mutex::new(LiveState::new(task, active)));
        inner.live.lock().insert(id, cell);
    }
    // Failure-list retries that were under way go on.
    let mut retries = 0usize;
    for item in inner.store.all_failures() {
        match item {
            Ok(f) if f.retrying => {
                retries += 1;
                inner.timer.at(
                    super::timer::RunKey::new(&f.id, super::timer::FAILURE_RETRY_RUN),
                    now,
                );
            }
            Ok(_) => {}
            Err(e) => {
                corrupt += 1;
                tracing::error!(error = %e, "skipping corrupt failure record");
            }
        }
    }
    if !fixes.is_empty() {
        inner.store.apply(&fixes)?;
        inner.store.durable().await?;
    }
    tracing::info!(live_tasks, resent, retries, corrupt, "recovery done");
    Ok(())
}
