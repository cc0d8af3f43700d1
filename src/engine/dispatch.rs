//! The dispatcher: takes due keys from the timer thread and steps runs.
//!
//! One step of a run = one attempt of the message at its cursor:
//! 1. under the task lock: check the task may send (cancel/pause win here), start the run if
//!    this is a fire, mark the attempt in flight and write that to the store;
//! 2. outside the lock: hand the message to the channel;
//! 3. under the lock: settle the outcome on the cursor (sent / retry / failure list), make it
//!    durable, and only then put the run's next step on the wheel.
//!
//! Step 3's durable write is what keeps "nothing before the cursor is sent again" true across a
//! crash: the next send is scheduled only after the cursor advance is on disk. Step 1's durable
//! in-flight mark makes the attempt count exact across a crash: a message re-sent after a crash
//! carries `attempt` n+1 (so a receiver can tell it is a repeat), and `max_attempts` holds even
//! when herald dies between attempts. Both flushes go through the group commit, so concurrent
//! runs share them.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc::UnboundedReceiver;

use super::timer::RunKey;
use super::{EngineError, Inner};
use crate::deliver::{backoff, Delivery};
use crate::model::{delivery_key, Failure, Outcome, Run, RunState, TaskState};
use crate::schedule::format_utc;
use crate::store::Batch;

/// How long to wait before trying a step again after a storage error.
const STORAGE_RETRY_MS: u64 = 1_000;

pub(crate) async fn dispatcher(inner: Weak<Inner>, mut due: UnboundedReceiver<RunKey>) {
    while let Some(key) = due.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = step(&inner, &key).await {
                tracing::error!(task = %key.task, run = key.run, error = %e,
                    "step failed; trying again in {STORAGE_RETRY_MS} ms");
                inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
            }
        });
    }
}

async fn step(inner: &Arc<Inner>, key: &RunKey) -> Result<(), EngineError> {
    let Some(cell) = inner.live.lock().get(&*key.task).cloned() else {
        return Ok(()); // finished or cancelled: nothing to do
    };
    // ---- 1. start the attempt, under the lock
    let mut st = cell.lock().await;
    if !matches!(st.task.state, TaskState::Pending | TaskState::Running) {
        return Ok(()); // paused or finished: the wheel entry was stale
    }
    let now = inner.clock.now_ms();
    let mut task = st.task.clone();
    let mut run = match st.runs.get(&key.run) {
        Some(r) => r.clone(),
        None => {
            // A fire: only the next run of a task can start, and only when it is due.
            if key.run != task.runs + 1 {
                return Ok(());
            }
            let Some(at) = task.next_fire_at_ms else {
                return Ok(());
            };
            if at > now {
                inner.timer.at(key.clone(), at);
                return Ok(());
            }
            task.runs += 1;
            task.next_fire_at_ms = None; // one-shot schedules fire once
            task.set_state(TaskState::Running, now)?;
            tracing::info!(task = %task.id, run = key.run, late_ms = now - at, "run started");
            Run::new(key.run, at, now, task.messages.len() as u32)
        }
    };
    if run.in_flight.is_some() {
        return Ok(()); // another step of this run is sending right now
    }
    if let Some(at) = run.next_at_ms.filter(|at| *at > now) {
        inner.timer.at(key.clone(), at);
        return Ok(());
    }
    let due_at = run.next_at_ms.unwrap_or(now);
    let Some(seq) = run.begin_attempt(now) else {
        return Ok(());
    };
    let mut batch = Batch::new();
    if task != st.task {
        batch.task(&task);
    }
    batch.run(&task.id, &run);
    inner.store.apply(&batch)?;
    inner.store.durable().await?;
    // Pacing counts from the moment the send really starts, after the flush (which takes a
    // variable few ms), so the gaps a receiver sees are the interval, not interval ± flush time.
    let sent_at = inner.clock.now_ms();
    run.last_attempt_at_ms = Some(sent_at);
    st.task = task;
    st.runs.insert(key.run, run.clone());

    let t = &st.task;
    let Some(msg) = t.messages.get(seq as usize) else {
        return Err(EngineError::Conflict(format!(
            "run {} of {} has cursor {seq} past its {} messages",
            key.run,
            t.id,
            t.messages.len()
        )));
    };
    let delivery = Delivery {
        task_id: t.id.clone(),
        run: key.run,
        seq,
        to: msg.to.clone(),
        body: msg.body.clone(),
        scheduled_at: format_utc(due_at),
        attempt: run.attempts,
        idempotency_key: delivery_key(&t.id, key.run, seq),
        sent_at: format_utc(sent_at),
    };
    let channel = inner.channels.get(&t.channel).cloned();
    let policy = t
        .retry
        .or(channel.as_ref().map(|c| c.retry))
        .unwrap_or_default();
    let interval_ms = t.pacing.interval_ms;
    let channel_name = t.channel.clone();
    drop(st);

    // ---- 2. send, outside the lock
    tracing::debug!(task = %delivery.task_id, run = delivery.run, seq, attempt = delivery.attempt,
        late_ms = now.saturating_sub(due_at), "attempt");
    let outcome = match &channel {
        Some(c) => c.send(&delivery, || inner.clock.now_ms()).await,
        None => Outcome::Permanent {
            error: format!("channel {channel_name:?} is no longer configured"),
        },
    };

    // ---- 3. settle, under the lock
    let mut st = cell.lock().await;
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
    let settled = run.settle(
        outcome.clone(),
        policy.max_attempts,
        delay,
        interval_ms,
        now,
    );
    log_outcome(&delivery, &outcome, &settled);
    let mut batch = Batch::new();
    if let Some(g) = &settled.gave_up {
        batch.failure(Failure {
            id: delivery.idempotency_key.clone(),
            task_id: delivery.task_id.clone(),
            run: key.run,
            seq: g.seq,
            to: delivery.to.clone(),
            channel: channel_name,
            attempts: g.attempts,
            last_error: g.error.clone(),
            failed_at_ms: now,
        });
    }
    let mut task = st.task.clone();
    if run.is_done() && task.state == TaskState::Running {
        // One-shot schedules have no further fire: the task is complete. (A run that partly
        // failed still completes; its failures are in the failure list.)
        let to = if task.next_fire_at_ms.is_some() {
            TaskState::Pending
        } else {
            TaskState::Completed
        };
        task.set_state(to, now)?;
        tracing::info!(task = %task.id, run = key.run, sent = run.sent, failed = run.failed,
            state = %task.state, "run finished");
    }
    if task != st.task {
        batch.task(&task);
    }
    batch.run(&task.id, &run);
    let written = match inner.store.apply(&batch) {
        Ok(()) => inner.store.durable().await.map_err(EngineError::from),
        Err(e) => Err(e.into()),
    };
    // Memory follows what happened even if the write failed: the message *was* sent (or not),
    // and the next write of this run carries the whole record again.
    let done = run.is_done() || run.state != RunState::Running;
    st.task = task;
    if done {
        st.runs.remove(&key.run);
    } else {
        st.runs.insert(key.run, run);
    }
    if st.task.state == TaskState::Running {
        if let Some(mut at) = settled.next_at_ms {
            if written.is_err() {
                at = at.max(now + STORAGE_RETRY_MS);
            }
            inner.timer.at(key.clone(), at);
        }
    } else if st.task.state == TaskState::Pending {
        if let Some(at) = st.task.next_fire_at_ms {
            inner
                .timer
                .at(RunKey::new(&st.task.id, st.task.runs + 1), at);
        }
    }
    if st.task.state.is_terminal() {
        let mut live = inner.live.lock();
        if live.get(&*key.task).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            live.remove(&*key.task);
        }
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
