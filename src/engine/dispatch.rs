//! The dispatcher: takes due keys from the timer thread and acts on them.
//!
//! Key `(task, 0)` is the task's schedule: [`fire`] handles the fire that is due (or every fire
//! missed while herald was down or the task paused, judged by the misfire policy), applies the
//! overlap policy, starts runs and plans the next fire.
//!
//! Key `(task, n)` is run `n`: [`run_step`] makes one attempt of the message at its cursor in
//! two phases:
//! 1. **arm** ([`ARM_LEAD_MS`] before the message is due, under the task lock): check the task
//!    may send, mark the attempt in flight and make that durable;
//! 2. **send** (at the due instant): check again under the lock (pause and cancel win here),
//!    send outside the lock, then **settle** under the lock: cursor / retry / failure list,
//!    durable, and only then plan the run's next step.
//!
//! Arming ahead means the flush is off the critical path: the message leaves at its due
//! millisecond, not one flush later. Settling durably before the next step is planned is what
//! keeps "nothing before the cursor is sent again" true across a crash, and the durable in-flight
//! mark makes the attempt count exact: after a crash the in-flight message is sent again with
//! the next attempt number and the same idempotency key.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc::UnboundedReceiver;

use super::timer::{RunKey, FAILURE_RETRY_RUN};
use super::{alerts, derive_state, retry, EngineError, Inner, LiveTask};
use crate::deliver::{backoff, Admission, Delivery};
use crate::model::{delivery_key, Failure, Outcome, Overlap, Run, RunState, Task, TaskState};
use crate::schedule::misfire::{judge, Decision, MISSED_LIST_MAX, MISS_TOLERANCE_MS};
use crate::schedule::plan::may_run_more;
use crate::schedule::{format_utc, mark_fired, minutes_left, next_fire};
use crate::store::Batch;

/// How long before a message is due its attempt is armed (in-flight mark made durable).
/// Covers a flush even on a busy disk (typically 1–5 ms; tens of ms under heavy IO).
pub const ARM_LEAD_MS: u64 = 100;

/// How long to wait before trying a step again after a storage error.
pub(crate) const STORAGE_RETRY_MS: u64 = 1_000;

/// Expired fires recorded one by one per fire step; more are only counted (a year-long outage
/// of a per-minute cron must not write half a million records).
const EXPIRED_RECORDS_MAX: usize = 100;

pub(crate) async fn dispatcher(inner: Weak<Inner>, mut due: UnboundedReceiver<RunKey>) {
    while let Some(key) = due.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let guard = inner.timer.step_guard();
        tokio::spawn(async move {
            let _guard = guard;
            if key.run == FAILURE_RETRY_RUN {
                if let Err(e) = retry::failure_retry(&inner, &key).await {
                    tracing::error!(failure = %key.task, error = %e,
                        "failure retry step failed; trying again in {STORAGE_RETRY_MS} ms");
                    inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
                }
                return;
            }
            let Some(cell) = inner.live.lock().get(&*key.task).cloned() else {
                return; // finished or cancelled: nothing to do
            };
            let r = if key.run == 0 {
                fire(&inner, &cell, &key).await
            } else {
                run_step(&inner, &cell, &key).await
            };
            if let Err(e) = r {
                tracing::error!(task = %key.task, run = key.run, error = %e,
                    "step failed; trying again in {STORAGE_RETRY_MS} ms");
                inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
            }
        });
    }
}

/// When to wake for the next fire of a task, if any.
pub(crate) fn plan_fire(inner: &Inner, task: &Task) {
    let key = RunKey::new(&task.id, 0);
    match task.next_fire_at_ms {
        Some(at) if matches!(task.state, TaskState::Pending | TaskState::Running) => {
            inner.timer.at(key, at.saturating_sub(ARM_LEAD_MS))
        }
        _ => inner.timer.cancel(key),
    }
}

/// When to wake for the next step of a run.
pub(crate) fn plan_run(inner: &Inner, task_id: &str, run: &Run) {
    if let Some(at) = run.next_at_ms {
        inner.timer.at(
            RunKey::new(task_id, run.run),
            at.saturating_sub(ARM_LEAD_MS),
        );
    }
}

/// Handles the due fire(s) of a task's schedule.
async fn fire(inner: &Arc<Inner>, cell: &Arc<LiveTask>, key: &RunKey) -> Result<(), EngineError> {
    let mut st = cell.lock().await;
    if !matches!(st.task.state, TaskState::Pending | TaskState::Running) {
        return Ok(()); // paused or finished: a stale wheel entry
    }
    let now = inner.clock.now_ms();
    let Some(due) = st.task.next_fire_at_ms else {
        return Ok(());
    };
    if due > now + ARM_LEAD_MS {
        inner.timer.at(key.clone(), due - ARM_LEAD_MS);
        return Ok(());
    }
    let mut task = st.task.clone();
    let total = task.messages.len() as u32;

    // Which fires, and what to do with each.
    let decisions = if now > due + MISS_TOLERANCE_MS {
        let mut missed = vec![due];
        let mut probe = task.clone();
        mark_fired(&mut probe, due);
        while missed.len() < MISSED_LIST_MAX {
            match next_fire(&probe, now) {
                Some(n) if n + MISS_TOLERANCE_MS < now => {
                    missed.push(n);
                    mark_fired(&mut probe, n);
                }
                _ => break,
            }
        }
        tracing::warn!(task = %task.id, missed = missed.len(), policy = ?task.misfire,
            "fires were missed (herald down or task paused); judging them by the misfire policy");
        judge(task.misfire, task.misfire_grace_ms, &missed, now)
    } else {
        vec![Decision::Run(due)]
    };

    let mut batch = Batch::new();
    let mut started: Vec<Run> = Vec::new();
    let mut expired_recorded = 0usize;
    for d in decisions {
        let run_no = task.fires + 1;
        match d {
            Decision::Expire(t, why) => {
                mark_fired(&mut task, t);
                task.expired += 1;
                if expired_recorded < EXPIRED_RECORDS_MAX {
                    expired_recorded += 1;
                    tracing::warn!(task = %task.id, run = run_no, reason = %why, "fire expired");
                    batch.run(
                        &task.id,
                        &Run::not_started(run_no, t, now, total, RunState::Expired, why),
                    );
                }
            }
            Decision::Skip(t, why) => {
                mark_fired(&mut task, t);
                skip(&mut task, &mut batch, run_no, t, now, why);
            }
            Decision::Run(t) => {
                mark_fired(&mut task, t);
                if !may_run_more(&task) {
                    skip(
                        &mut task,
                        &mut batch,
                        run_no,
                        t,
                        now,
                        "max_runs reached".into(),
                    );
                    continue;
                }
                let busy = !st.runs.is_empty() || !started.is_empty();
                if busy && task.overlap != Overlap::Allow {
                    // Misfire catch-up (several runs from one outage) queues behind the first
                    // whatever the policy; a regular fire follows the overlap policy.
                    let catching_up = !started.is_empty();
                    if catching_up || (task.overlap == Overlap::Queue && task.queued.is_empty()) {
                        tracing::info!(task = %task.id, run = run_no, "fire queued behind the active run");
                        task.queued.push((run_no, t));
                    } else {
                        let why = if task.overlap == Overlap::Queue {
                            "overlap queue: a run is already waiting".to_string()
                        } else {
                            "overlap skip: the previous run was still sending".to_string()
                        };
                        skip(&mut task, &mut batch, run_no, t, now, why);
                    }
                    continue;
                }
                started.push(start_run(&mut task, run_no, t, now));
            }
        }
    }
    task.next_fire_at_ms = next_fire(&task, now);
    let to = derive_state(&task, !st.runs.is_empty() || !started.is_empty());
    task.set_state(to, now)?;
    // Arm the first attempt of each new run in the same durable write.
    for r in &mut started {
        r.begin_attempt(now);
        batch.run(&task.id, r);
    }
    batch.task(&task);
    inner.store.apply(&batch)?;
    inner.store.durable().await?;
    for r in started {
        tracing::info!(task = %task.id, run = r.run, late_ms = now.saturating_sub(r.scheduled_at_ms),
            "run started");
        // Armed: the send phase is due at the run's start instant.
        inner
            .timer
            .at(RunKey::new(&task.id, r.run), r.next_at_ms.unwrap_or(now));
        inner.events.progress(&task, &r); // events (issue 11)
        st.runs.insert(r.run, r);
    }
    st.task = task;
    inner.events.task(&st.task); // events (issue 11)
    plan_fire(inner, &st.task);
    retire_if_finished(inner, cell, &st.task);
    Ok(())
}

fn skip(task: &mut Task, batch: &mut Batch, run_no: u32, t: u64, now: u64, why: String) {
    task.skipped += 1;
    tracing::info!(task = %task.id, run = run_no, reason = %why, "fire skipped");
    batch.run(
        &task.id,
        &Run::not_started(
            run_no,
            t,
            now,
            task.messages.len() as u32,
            RunState::Skipped,
            why,
        ),
    );
}

/// A new run of `task` for the fire at `t` (run number already allocated by `mark_fired`).
pub(crate) fn start_run(task: &mut Task, run_no: u32, t: u64, now: u64) -> Run {
    task.runs += 1;
    Run::new(run_no, t, now, task.messages.len() as u32)
}

/// Removes a finished task's cell from the live map.
fn retire_if_finished(inner: &Inner, cell: &Arc<LiveTask>, task: &Task) {
    if task.state.is_terminal() {
        let mut live = inner.live.lock();
        if live.get(&task.id).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            live.remove(&task.id);
        }
    }
}

/// One step of run `key.run`: arm, or send and settle.
async fn run_step(
    inner: &Arc<Inner>,
    cell: &Arc<LiveTask>,
    key: &RunKey,
) -> Result<(), EngineError> {
    let mut st = cell.lock().await;
    if st.task.state != TaskState::Running || st.sending.contains(&key.run) {
        return Ok(()); // paused, finished, or this run is sending right now
    }
    let Some(mut run) = st.runs.get(&key.run).cloned() else {
        return Ok(());
    };
    let now = inner.clock.now_ms();
    let due = run.next_at_ms.unwrap_or(now);
    if run.in_flight.is_none() {
        // ---- arm
        if due > now + ARM_LEAD_MS {
            inner.timer.at(key.clone(), due - ARM_LEAD_MS);
            return Ok(());
        }
        if run.begin_attempt(now).is_none() {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.run(&st.task.id, &run);
        inner.store.apply(&batch)?;
        inner.store.durable().await?;
        st.runs.insert(key.run, run.clone());
    }
    let now = inner.clock.now_ms();
    if due > now {
        inner.timer.at(key.clone(), due);
        return Ok(());
    }

    // ---- send, outside the lock
    let Some(seq) = run.in_flight else {
        return Ok(());
    };
    let t = &st.task;
    let Some(msg) = t.messages.get(seq as usize) else {
        return Err(EngineError::Conflict(format!(
            "run {} of {} has cursor {seq} past its {} messages",
            key.run,
            t.id,
            t.messages.len()
        )));
    };
    let sent_at = now;
    run.last_attempt_at_ms = Some(sent_at);
    let body = match minutes_left(&t.schedule, run.scheduled_at_ms) {
        Some(m) => msg.body.replace("{{minutes_left}}", &m.to_string()),
        None => msg.body.clone(),
    };
    let delivery = Delivery {
        task_id: t.id.clone(),
        run: key.run,
        seq,
        to: msg.to.clone(),
        body,
        scheduled_at: format_utc(due),
        attempt: run.attempts,
        idempotency_key: delivery_key(&t.id, key.run, seq),
        sent_at: format_utc(sent_at),
    };
    let channel = inner.channels.get(&t.channel).cloned();
    let policy = t
        .retry
        .or(channel.as_ref().map(|c| c.retry))
        .unwrap_or_default();
    let pacing = t.pacing;
    let channel_name = t.channel.clone();
    // Rate limit and breaker: a send that may not go now waits on the wheel, still armed;
    // nothing is failed and no attempt is burned.
    let probe = match channel.as_ref().map(|c| c.admit(now)) {
        Some(Admission::Hold { until_ms, breaker }) => {
            tracing::debug!(task = %t.id, run = key.run, seq, until_ms, breaker, "send held");
            inner.timer.at(key.clone(), until_ms);
            return Ok(());
        }
        Some(Admission::Go { probe }) => probe,
        None => false,
    };
    st.runs.insert(key.run, run);
    st.sending.insert(key.run);
    drop(st);

    tracing::debug!(task = %delivery.task_id, run = delivery.run, seq, attempt = delivery.attempt,
        late_ms = sent_at.saturating_sub(due), "attempt");
    let outcome = match &channel {
        Some(c) => {
            let o = c.send(&delivery, || inner.clock.now_ms()).await;
            if let Some(tr) = c.record(inner.clock.now_ms(), &o, probe) {
                alerts::breaker(inner, &c.name, tr);
            }
            o
        }
        None => Outcome::Permanent {
            error: format!("channel {channel_name:?} is no longer configured"),
        },
    };

    // ---- settle, under the lock
    let mut st = cell.lock().await;
    st.sending.remove(&key.run);
    let now = inner.clock.now_ms();
    let Some(mut run) = st.runs.get(&key.run).cloned() else {
        return Ok(());
    };
    let delay = backoff::retry_delay_ms(
        &policy,
        run.attempts,
        inner.config.jitter_seed,
        &delivery.idempotency_key,
    );
    let settled = run.settle(outcome.clone(), policy.max_attempts, delay, &pacing, now);
    log_outcome(&delivery, &outcome, &settled);
    let mut batch = Batch::new();
    let failure = settled.gave_up.as_ref().map(|g| Failure {
        id: delivery.idempotency_key.clone(),
        task_id: delivery.task_id.clone(),
        run: key.run,
        seq: g.seq,
        to: delivery.to.clone(),
        channel: channel_name.clone(),
        attempts: g.attempts,
        last_error: g.error.clone(),
        failed_at_ms: now,
        retrying: false,
        retries: 0,
    });
    if let Some(f) = &failure {
        batch.failure(f.clone());
    }
    let mut task = st.task.clone();
    let finished = run.is_done() || run.state != RunState::Running;
    // The next attempt is due within the arm lead: arm it in this same durable write, so a
    // short interval costs one flush per message, not two.
    let armed_now = !finished
        && task.state == TaskState::Running
        && settled
            .next_at_ms
            .is_some_and(|at| at.saturating_sub(ARM_LEAD_MS) <= now);
    if armed_now {
        run.begin_attempt(now);
    }
    let mut next_run = None;
    if finished {
        tracing::info!(task = %task.id, run = key.run, sent = run.sent, failed = run.failed,
            "run finished");
        // A queued fire starts when the run it waited for is done.
        let others_active = st.runs.len() > 1;
        if !task.queued.is_empty()
            && (!others_active || task.overlap == Overlap::Allow)
            && !task.state.is_terminal()
        {
            let (n, at) = task.queued.remove(0);
            next_run = Some(start_run(&mut task, n, at, now));
        }
    }
    if task.state == TaskState::Running {
        let active = st.runs.len() > usize::from(finished) || next_run.is_some();
        let to = derive_state(&task, active);
        task.set_state(to, now)?;
    }
    batch.run(&task.id, &run);
    if let Some(r) = &next_run {
        batch.run(&task.id, r);
    }
    if task != st.task {
        batch.task(&task);
    }
    let written = match inner.store.apply(&batch) {
        Ok(()) => inner.store.durable().await.map_err(EngineError::from),
        Err(e) => Err(e.into()),
    };
    // events (issue 11): the run's progress, once it is durable
    if written.is_ok() {
        inner.events.progress(&task, &run);
    }

    // Memory follows what happened even if the write failed: the message *was* sent (or not),
    // and the next write of this run carries the whole record again.
    if finished {
        st.runs.remove(&key.run);
    } else {
        st.runs.insert(key.run, run.clone());
    }
    st.task = task;
    if st.task.state == TaskState::Running {
        if !finished {
            let mut r = run;
            if written.is_err() {
                r.next_at_ms = r.next_at_ms.map(|a| a.max(now + STORAGE_RETRY_MS));
            }
            if armed_now {
                // Armed: straight to the send phase at the due instant.
                if let Some(at) = r.next_at_ms {
                    inner.timer.at(key.clone(), at);
                }
            } else {
                plan_run(inner, &st.task.id, &r);
            }
        }
        if let Some(r) = next_run {
            tracing::info!(task = %st.task.id, run = r.run, "queued run started");
            plan_run(inner, &st.task.id, &r);
            st.runs.insert(r.run, r);
        }
    }
    plan_fire(inner, &st.task);
    retire_if_finished(inner, cell, &st.task);
    drop(st);
    if let (Some(f), Ok(())) = (&failure, &written) {
        alerts::failure(inner, f, "failure");
        inner.events.failure(f, "added"); // events (issue 11)
    }
    written
}

fn log_outcome(d: &Delivery, outcome: &Outcome, settled: &crate::model::Settled) {
    match outcome {
        Outcome::Sent => {
            tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt, "sent")
        }
        Outcome::Retry { error, .. } | Outcome::Permanent { error } => {
            if let Some(g) = &settled.gave_up {
                tracing::warn!(task = %d.task_id, run = d.run, seq = d.seq, attempts = g.attempts,
                    error = %error, failure = %d.idempotency_key, "gave up: message moved to the failure list");
            } else {
                tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt,
                    error = %error, next_at = ?settled.next_at_ms, "attempt failed; will retry");
            }
        }
    }
}
