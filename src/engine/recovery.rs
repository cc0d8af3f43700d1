//! Start-up: put every live task back where it was, reading only the `live` index (one small
//! record per unfinished task; finished tasks are never read).
//!
//! - `pending`: its next fire goes back on the wheel; the task stays unloaded until it fires.
//!   Fires whose time passed while herald was down are missed (they were due before this
//!   process started watching) and are judged by the misfire policy when that entry fires.
//! - `running`: loaded; each active run resumes at its cursor, at the instant its next step
//!   was due (or now). A message that was in flight at the crash is sent again — with the same
//!   idempotency key and the next attempt number — because nobody knows whether the channel
//!   got it (`cells::load`).
//! - `paused`: nothing goes on the wheel; the runs keep their cursors for the resume.
//!
//! A record that cannot be read is reported with its key and skipped (a task whose runs cannot
//! be read is parked `failed`); a read error of the index itself ends the scan, loudly.

use std::sync::Arc;

use super::cells;
use super::dispatch::{lead_ms, plan_fire, plan_run};
use super::timer::RunKey;
use super::{derive_state, EngineError, Inner};
use crate::model::TaskState;
use crate::store::Batch;

pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    let started = std::time::Instant::now();
    let (mut pending, mut running_ids, mut paused, mut corrupt) =
        (0usize, Vec::new(), 0usize, 0usize);
    {
        let mut live = inner.live.lock();
        for item in inner.store.live_entries() {
            let (id, entry) = match item {
                Ok(e) => e,
                Err(e) => {
                    corrupt += 1;
                    tracing::error!(error = %e, "live index: a record could not be read");
                    continue;
                }
            };
            let id: Arc<str> = Arc::from(id);
            match entry.state {
                TaskState::Pending => {
                    pending += 1;
                    if let Some(at) = entry.next_fire_at_ms {
                        inner.timer.at(
                            RunKey {
                                task: id.clone(),
                                run: 0,
                            },
                            at.saturating_sub(lead_ms(entry.one_shot)),
                        );
                    }
                }
                TaskState::Paused => paused += 1,
                TaskState::Running => running_ids.push(id.clone()),
                // A finished task has no live entry; one that says so is stale: skip it.
                _ => continue,
            }
            live.insert(id, None);
        }
    }
    let index_ms = started.elapsed().as_millis() as u64;
    let running = running_ids.len();
    for id in running_ids {
        let mut l = match cells::lock(inner, &id).await {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) => {
                corrupt += 1;
                tracing::error!(task = %id, error = %e, "task could not be recovered");
                continue;
            }
        };
        let st = l.st();
        // A queued fire was waiting for a run that finished: start it.
        let mut fixes = Batch::new();
        if st.runs.is_empty() && !st.task.queued.is_empty() {
            let mut task = st.task.clone();
            let (n, at) = task.queued.remove(0);
            let r = super::plan::start_run(&mut task, n, at, now);
            fixes.run(&task.id, &r);
            st.runs.insert(r.run, r);
            st.task = task;
        }
        let to = derive_state(&st.task, !st.runs.is_empty());
        if to != st.task.state || !fixes.is_empty() {
            let mut task = st.task.clone();
            task.set_state(to, now)?;
            fixes.progress(&task);
            inner.store.write(&fixes).await?;
            st.task = task;
        }
        if st.task.state == TaskState::Running {
            for r in st.runs.values() {
                plan_run(inner, &st.task.id, r);
            }
        }
        plan_fire(inner, &st.task);
        l.release(inner);
    }
    // Failure-list retries that were under way go on.
    let mut retries = 0usize;
    for item in inner.store.all_failures() {
        match item {
            Ok(f) if f.retrying => {
                retries += 1;
                inner
                    .timer
                    .at(RunKey::new(&f.id, super::timer::FAILURE_RETRY_RUN), now);
            }
            Ok(_) => {}
            Err(e) => {
                corrupt += 1;
                tracing::error!(error = %e, "skipping a failure record that cannot be read");
            }
        }
    }
    tracing::info!(
        pending,
        running,
        paused,
        retries,
        corrupt,
        index_ms,
        took_ms = started.elapsed().as_millis() as u64,
        "recovery done"
    );
    Ok(())
}
