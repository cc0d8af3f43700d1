//! The dispatcher: takes due keys from the timer thread and carries out the engine's plans.
//!
//! Key `(task, 0)` is the task's schedule: [`fire`] asks [`plan::fire`] what the due fire does
//! (misfire, overlap, next fire), writes the plan durably, then starts its runs.
//!
//! Key `(task, n)` is run `n`: [`run_step`] makes one attempt of the message at its cursor in
//! two phases:
//! 1. **arm** ([`ARM_LEAD_MS`] before the message is due, under the task lock): check the task
//!    may send, mark the attempt in flight and make that durable;
//! 2. **send** (at the due instant): check again under the lock (pause and cancel win here),
//!    read the message, send outside the lock, then **settle** under the lock with
//!    [`plan::settle`]: cursor / retry / failure list, durable, and only then plan the run's
//!    next step.
//!
//! Failure rules:
//! - A send starts only after the durable write of its *own* in-flight mark succeeded.
//! - A failed write changes nothing in memory, or (when the send already happened) unloads the
//!   task so that it is read back from what is on disk; the step is tried again later. On disk
//!   the message is still in flight, so it goes again with the next attempt number and the same
//!   idempotency key: the only duplicate herald allows.
//! - A bug (an invalid transition, a cursor past the messages) or a record that cannot be read
//!   parks the task `failed` with the reason and an alert; it is never retried forever.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc::UnboundedReceiver;

use super::cells::{self, Locked};
use super::plan::{self, Attempt};
use super::timer::{RunKey, StepGuard, FAILURE_RETRY_RUN};
use super::{alerts, retry, EngineError, Inner};
use crate::deliver::{backoff, Admission, Delivery};
use crate::logsafe::Escaped;
use crate::model::{delivery_key, Outcome, Run, RunState, Task, TaskState};
use crate::schedule::{format_utc, minutes_left};
use crate::store::Batch;

/// How long before a message is due its attempt is armed (in-flight mark made durable).
/// Covers a flush even on a busy disk (typically 1–5 ms; tens of ms under heavy IO).
pub const ARM_LEAD_MS: u64 = 100;

/// How long before its instant a one-shot's fire is handled (its run started and its first
/// attempt armed, durably), at least. Many one-shots often share an instant (a notice to a
/// whole list): those get a longer lead, growing with how many share their second
/// (`engine/herd.rs`), so that a herd's fires are all handled before the instant and its sends
/// leave at the due millisecond, in deadline order. A run armed before an outage that spans
/// its instant is resumed (its message may have left) rather than judged by `misfire_grace`;
/// a restart before the instant gives the armed attempt back (`cells::load`). Cron and
/// reminder fires keep [`ARM_LEAD_MS`]: an early fire would judge overlap against a run that
/// is about to end.
pub const ONE_SHOT_LEAD_MS: u64 = 2_000;

/// When the fire step of a task due at `due_ms` runs: [`lead_ms`] earlier, and a one-shot
/// that shares its second with many others earlier still (`engine/herd.rs`).
pub(crate) fn fire_step_at(inner: &Inner, due_ms: u64, one_shot: bool) -> u64 {
    let extra = if one_shot {
        inner
            .herd
            .lock()
            .extra_lead_ms(due_ms, inner.clock.now_ms())
    } else {
        0
    };
    due_ms.saturating_sub(lead_ms(one_shot) + extra)
}

/// The earliest a fire step may run before its instant (an earlier one is a stale wheel
/// entry and is put back).
fn lead_max_ms(one_shot: bool) -> u64 {
    if one_shot {
        ONE_SHOT_LEAD_MS + super::herd::HERD_LEAD_MAX_MS
    } else {
        ARM_LEAD_MS
    }
}

/// The fire lead of a one-shot (`true`) or a cron/reminders schedule.
pub(crate) fn lead_ms(one_shot: bool) -> u64 {
    if one_shot {
        ONE_SHOT_LEAD_MS
    } else {
        ARM_LEAD_MS
    }
}

/// How long to wait before trying a step again after a storage error.
pub(crate) const STORAGE_RETRY_MS: u64 = 1_000;

/// Fire steps running at once. A herd hands over tens of thousands of fires at one instant;
/// bounded, they wait on a semaphore (a cheap poll each) instead of each doing its reads and
/// writes ahead of the sends that are due meanwhile.
const FIRES_AT_ONCE: usize = 256;

/// Most run keys in one chunk ([`super::chunk`]): the timer hands over everything due in a
/// round (in batches of as many), so a herd's sends to a local channel are written, and
/// settled, a chunk at a time.
const CHUNK_MAX: usize = super::timer::HAND_OVER_MAX;

pub(crate) async fn dispatcher(inner: Weak<Inner>, mut due: UnboundedReceiver<Vec<RunKey>>) {
    let fires = Arc::new(tokio::sync::Semaphore::new(FIRES_AT_ONCE));
    while let Some(keys) = due.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut runs = Vec::new();
        for key in keys {
            let guard = inner.timer.step_guard();
            if draining(&inner) {
                // Draining: the key's durable state (pending, or armed) is what the next boot
                // recovers from; starting it now could only start a send that the exit cuts off.
                continue;
            }
            if key.run == 0 || key.run == FAILURE_RETRY_RUN {
                spawn_step(&inner, key, guard, Some(&fires));
            } else {
                runs.push((key, guard));
                if runs.len() == CHUNK_MAX {
                    spawn_runs(&inner, std::mem::take(&mut runs));
                }
            }
        }
        spawn_runs(&inner, runs);
    }
}

/// Run steps due together: one on its own, more as a chunk.
fn spawn_runs(inner: &Arc<Inner>, mut runs: Vec<(RunKey, StepGuard)>) {
    if runs.len() > 1 {
        tokio::spawn(super::chunk::run(inner.clone(), runs));
    } else if let Some((key, guard)) = runs.pop() {
        spawn_step(inner, key, guard, None);
    }
}

/// Runs one due key's step in a task of its own. `fires`: the semaphore that bounds fire
/// steps (for keys `(task, 0)`).
pub(super) fn spawn_step(
    inner: &Arc<Inner>,
    key: RunKey,
    guard: StepGuard,
    fires: Option<&Arc<tokio::sync::Semaphore>>,
) {
    let inner = inner.clone();
    let fires = fires.cloned();
    tokio::spawn(async move {
        let _guard = guard;
        let _permit = match (&fires, key.run) {
            (Some(f), 0) => f.clone().acquire_owned().await.ok(),
            _ => None,
        };
        if key.run == FAILURE_RETRY_RUN {
            if let Err(e) = retry::failure_retry(&inner, &key).await {
                tracing::error!(failure = %key.task, error = %e,
                    "failure retry step failed; trying again in {STORAGE_RETRY_MS} ms");
                inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
            }
            return;
        }
        let r = if key.run == 0 {
            fire(&inner, &key).await
        } else {
            run_step(&inner, &key).await
        };
        if let Err(e) = r {
            step_error(&inner, key, &e);
        }
    });
}

/// After a step failed: storage errors are tried again later; anything else was parked (or
/// the task is gone), logged and alerted where it happened.
pub(super) fn step_error(inner: &Inner, key: RunKey, e: &EngineError) {
    if is_retryable(e) {
        tracing::debug!(task = %key.task, run = key.run, error = %e,
            "step failed; trying again in {STORAGE_RETRY_MS} ms");
        inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
    }
}

pub(super) fn draining(inner: &Inner) -> bool {
    inner.draining.load(std::sync::atomic::Ordering::Acquire)
}

/// Counts a send from its start until its outcome is settled (or the step gave up).
pub(super) struct SendInFlight<'a>(&'a Inner);

impl<'a> SendInFlight<'a> {
    pub(super) fn new(inner: &'a Inner) -> Self {
        inner
            .sends_in_flight
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        SendInFlight(inner)
    }
}

impl Drop for SendInFlight<'_> {
    fn drop(&mut self) {
        self.0
            .sends_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Storage errors (and a full queue) pass; a step that failed on them is tried again.
fn is_retryable(e: &EngineError) -> bool {
    match e {
        EngineError::Store(s) => s.is_storage() || matches!(s, crate::store::StoreError::Busy),
        EngineError::Storage(_) => true,
        _ => false,
    }
}

/// When to wake for the next fire of a task, if any.
pub(crate) fn plan_fire(inner: &Inner, task: &Task) {
    let key = RunKey::new(&task.id, 0);
    match task.next_fire_at_ms {
        Some(at) if matches!(task.state, TaskState::Pending | TaskState::Running) => inner
            .timer
            .at(key, fire_step_at(inner, at, task.schedule.is_one_shot())),
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

/// [`park`] behind a box, for callers that are themselves called by `park`'s callers (the
/// recursion would otherwise make an infinitely sized future).
pub(crate) fn park_boxed<'a>(
    inner: &'a Arc<Inner>,
    l: &'a mut Locked,
    reason: String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), EngineError>> + Send + 'a>> {
    Box::pin(async move { park(inner, l, &reason).await })
}

/// Parks a task `failed` with `reason` (a bug or a corrupt record): its runs stop, nothing of
/// it is sent again, an alert is raised. Durable before it returns.
pub(crate) async fn park(
    inner: &Arc<Inner>,
    l: &mut Locked,
    reason: &str,
) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    let st = l.st();
    let mut task = st.task.clone();
    let Ok(to) = task.state.park() else {
        return Ok(());
    };
    task.state = to;
    task.updated_at_ms = now;
    task.failed_reason = Some(reason.to_string());
    task.next_fire_at_ms = None;
    task.queued.clear();
    let mut batch = Batch::new();
    batch.progress(&task);
    for r in st.runs.values() {
        if st.sending.contains(&r.run) {
            continue; // its outcome is still settled when the send returns
        }
        let mut r = r.clone();
        r.disarm();
        r.state = RunState::Cancelled;
        r.finished_at_ms = Some(now);
        r.next_at_ms = None;
        r.reason = Some(format!("task failed: {reason}"));
        batch.run(&task.id, &r);
    }
    inner.store.write(&batch).await?;
    for r in st.runs.keys() {
        inner.timer.cancel(RunKey::new(&task.id, *r));
    }
    st.runs.retain(|n, _| st.sending.contains(n));
    tracing::error!(task = %task.id, reason, "task parked as failed");
    let channel = task.channel.clone();
    st.task = task;
    inner.events.task(&st.task); // events (issue 11)
    plan_fire(inner, &st.task);
    alerts::parked(inner, &l.id, &channel, reason);
    Ok(())
}

/// Handles the due fire(s) of a task's schedule.
async fn fire(inner: &Arc<Inner>, key: &RunKey) -> Result<(), EngineError> {
    let Some(mut l) = cells::lock(inner, &key.task).await? else {
        return Ok(()); // finished or cancelled: nothing to do
    };
    match fire_locked(inner, &mut l, key).await {
        Ok(()) => {
            l.release(inner);
            Ok(())
        }
        Err(e) => step_failed(inner, l, e).await,
    }
}

async fn fire_locked(inner: &Arc<Inner>, l: &mut Locked, key: &RunKey) -> Result<(), EngineError> {
    let st = l.st();
    if !matches!(st.task.state, TaskState::Pending | TaskState::Running) {
        return Ok(()); // paused or finished: a stale wheel entry
    }
    if draining(inner) {
        return Ok(()); // the next boot fires it
    }
    let now = inner.clock.now_ms();
    let Some(due) = st.task.next_fire_at_ms else {
        return Ok(());
    };
    let one_shot = st.task.schedule.is_one_shot();
    if due > now + lead_max_ms(one_shot) {
        inner
            .timer
            .at(key.clone(), fire_step_at(inner, due, one_shot));
        return Ok(());
    }
    let watched = st.task.watched_since_ms.max(inner.boot_ms);
    // Issue 26, a wall jump forward (clock.rs) is judged like an outage that took no real
    // time: fires due before the jump's end were jumped over, so the misfire policy decides
    // (default: one coalesced run, never a burst of catch-up runs); their lateness against
    // misfire_grace leaves the jumped span out (the jump adds its size to the grace here,
    // and the task keeps its own grace).
    let jump = inner.clock.wall_jumps();
    let p = if due < jump.end_ms && jump.end_ms > watched {
        let mut t = st.task.clone();
        t.misfire_grace_ms = t.misfire_grace_ms.saturating_add(jump.size_ms);
        let mut p = plan::fire(&t, st.runs.len(), due, now, jump.end_ms)?;
        p.task.misfire_grace_ms = st.task.misfire_grace_ms;
        tracing::warn!(task = %p.task.id, missed = p.missed, policy = ?p.task.misfire, jump_ms = jump.size_ms,
            "fires were jumped over by the wall clock; judged by the misfire policy");
        p
    } else {
        let p = plan::fire(&st.task, st.runs.len(), due, now, watched)?;
        if p.missed > 0 {
            tracing::warn!(task = %p.task.id, missed = p.missed, policy = ?p.task.misfire,
                "fires were missed (herald down or task paused); judged by the misfire policy");
        }
        p
    };
    let mut batch = Batch::new();
    for r in p.not_started.iter().chain(&p.started) {
        batch.run(&p.task.id, r);
    }
    // History is bounded: the newest `runs_max` run numbers stay (the store skips a run still
    // running, and deletes at most `store::TRIM_MAX` per fire).
    if let Some(max) = inner.config.runs_max {
        if p.task.fires > max {
            batch.trim_runs(&p.task.id, p.task.fires - max + 1);
        }
    }
    batch.progress(&p.task);
    inner.store.write(&batch).await?;
    for r in &p.not_started {
        tracing::info!(task = %p.task.id, run = r.run, state = ?r.state,
            reason = %crate::logsafe::Opt(r.reason.as_deref()), "fire not started");
    }
    for r in p.started {
        tracing::info!(task = %p.task.id, run = r.run, late_ms = now.saturating_sub(r.scheduled_at_ms),
            "run started");
        if let Some(seq) = r
            .in_flight
            .filter(|_| r.next_at_ms.is_some_and(|at| at > now))
        {
            // Armed ahead: read its message now, while the instant is still to come. A read
            // that fails is left to the send, which reads again.
            if let Ok(Some(m)) = inner.store.get_message(&p.task.id, seq) {
                st.prefetched = Some((r.run, seq, m));
            }
        }
        // Armed: the send phase is due at the run's start instant.
        inner
            .timer
            .at(RunKey::new(&p.task.id, r.run), r.next_at_ms.unwrap_or(now));
        inner.events.progress(&p.task, &r); // events (issue 11)
        st.runs.insert(r.run, r);
    }
    st.task = p.task;
    inner.events.task(&st.task); // events (issue 11)
    plan_fire(inner, &st.task);
    Ok(())
}

/// One step of run `key.run`: arm, or send and settle.
async fn run_step(inner: &Arc<Inner>, key: &RunKey) -> Result<(), EngineError> {
    let Some(l) = cells::lock(inner, &key.task).await? else {
        return Ok(()); // finished or cancelled: nothing to do
    };
    run_step_locked(inner, key, l).await
}

/// Runs [`run_step`] in a task of its own for a key whose cell the caller has locked already
/// (a chunk that cannot send it, `chunk.rs`).
pub(super) fn spawn_locked(inner: &Arc<Inner>, key: RunKey, guard: StepGuard, l: Locked) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let _guard = guard;
        if let Err(e) = run_step_locked(&inner, &key, l).await {
            step_error(&inner, key, &e);
        }
    });
}

async fn run_step_locked(
    inner: &Arc<Inner>,
    key: &RunKey,
    mut l: Locked,
) -> Result<(), EngineError> {
    let prepared = match prepare(inner, &mut l, key).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            l.release(inner);
            return Ok(());
        }
        Err(e) => return step_failed(inner, l, e).await,
    };
    // ---- send, outside the lock: a slow receiver never blocks cancel or pause. The cell
    // stays loaded meanwhile (a sending run is never idle), and a cancel keeps the sending run
    // so its outcome is settled here even if the task left the live map.
    let cell = l.cell();
    l.release(inner);
    let _in_flight = SendInFlight::new(inner);
    let outcome = send(inner, &prepared).await;
    let Some(mut l) = cells::relock(inner, &key.task, cell).await? else {
        return Ok(());
    };
    match settle(inner, &mut l, key, prepared, outcome).await {
        Ok(()) => {
            l.release(inner);
            Ok(())
        }
        Err(e) => step_failed(inner, l, e).await,
    }
}

/// A step's error: storage errors pass (the step is tried again), anything else parks the task.
pub(super) async fn step_failed(
    inner: &Arc<Inner>,
    mut l: Locked,
    e: EngineError,
) -> Result<(), EngineError> {
    if is_retryable(&e) || !l.is_loaded() {
        l.release(inner);
        return Err(e);
    }
    let reason = e.to_string();
    let parked = park(inner, &mut l, &reason).await;
    l.release(inner);
    parked?;
    Err(EngineError::Internal(reason))
}

/// What the send phase needs once the lock is released.
pub(super) struct Prepared {
    pub delivery: Delivery,
    pub channel: Option<Arc<crate::deliver::Channel>>,
    channel_name: String,
    policy: crate::model::RetryPolicy,
    pacing: crate::model::Pacing,
    pub probe: bool,
}

/// Arms the attempt (durably) if it is not armed yet, and prepares the send if it is due.
pub(super) async fn prepare(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
) -> Result<Option<Prepared>, EngineError> {
    let st = l.st();
    if st.task.state != TaskState::Running || st.sending.contains(&key.run) || draining(inner) {
        return Ok(None); // paused, finished, this run is sending right now, or draining
    }
    let Some(mut run) = st.runs.get(&key.run).cloned() else {
        return Ok(None);
    };
    let now = inner.clock.now_ms();
    let due = run.next_at_ms.unwrap_or(now);
    let arming = run.in_flight.is_none();
    if arming {
        // ---- arm
        if due > now + ARM_LEAD_MS {
            inner.timer.at(key.clone(), due - ARM_LEAD_MS);
            return Ok(None);
        }
        if run.begin_attempt(now).is_none() {
            return Ok(None);
        }
        let mut batch = Batch::new();
        batch.run(&st.task.id, &run);
        // Memory changes only once the mark is durable: a failed write sends nothing.
        inner.store.write(&batch).await?;
        st.runs.insert(key.run, run.clone());
    }
    let now = inner.clock.now_ms();
    // Issue 26: a due stored before a forward wall jump looks long past now, but it was one
    // pacing/backoff duration ahead on the monotonic clock; the wheel (timer.rs, its
    // continuity rule) keeps the send ARM_LEAD_MS after the arm just made, instead of sending
    // at once. (Once the wheel hands it back, the run is armed already: it is sent.)
    if due > now || (arming && due < inner.clock.wall_jumps().end_ms) {
        inner.timer.at(key.clone(), due);
        return Ok(None);
    }
    if draining(inner) {
        // Armed on disk but not sent: the next boot sends it (once).
        return Ok(None);
    }
    let Some(seq) = run.in_flight else {
        return Ok(None);
    };
    // The message read when the run was armed ahead, if it is this attempt's.
    let prefetched = match &st.prefetched {
        Some((r, s, _)) if *r == key.run && *s == seq => st.prefetched.take().map(|p| p.2),
        _ => None,
    };
    let t = &st.task;
    let msg = match prefetched {
        Some(m) => Some(m),
        None => inner.store.get_message(&t.id, seq)?,
    };
    let msg = match msg {
        Some(m) if seq < t.message_count => m,
        _ => {
            return Err(EngineError::Internal(format!(
                "run {} has cursor {seq} but the task has {} messages",
                key.run, t.message_count
            )))
        }
    };
    let channel = inner.channels.get(&t.channel).cloned();
    // Rate limit and breaker: a send that may not go now waits on the wheel, still armed;
    // nothing is failed and no attempt is burned.
    let probe = match channel.as_ref().map(|c| c.admit(now)) {
        Some(Admission::Hold { until_ms, breaker }) => {
            tracing::debug!(task = %t.id, run = key.run, seq, until = %format_utc(until_ms), breaker, "send held");
            inner.timer.at(key.clone(), until_ms);
            return Ok(None);
        }
        Some(Admission::Go { probe }) => probe,
        None => false,
    };
    // The schedule's instant for the run's first message, however late herald got to it;
    // for the rest, the instant pacing (or a retry) planned it for.
    let scheduled = if seq == 0 { run.scheduled_at_ms } else { due };
    inner
        .lateness
        .observe(now.saturating_sub(scheduled) as f64 / 1000.0);
    let minutes = minutes_left(&t.schedule, run.scheduled_at_ms);
    let body = match minutes {
        Some(m) => msg.body.replace("{{minutes_left}}", &m.to_string()),
        None => msg.body,
    };
    let delivery = Delivery {
        task_id: t.id.clone(),
        run: key.run,
        seq,
        to: msg.to,
        body,
        scheduled_at: format_utc(scheduled),
        attempt: run.attempts,
        idempotency_key: delivery_key(&t.id, key.run, seq),
        sent_at: format_utc(now),
        // For channel templates.
        data: msg.data,
        scheduled_at_ms: scheduled,
        minutes_left: minutes,
        metadata: t.metadata.clone(),
    };
    let policy = t
        .retry
        .or(channel.as_ref().map(|c| c.retry))
        .unwrap_or_default();
    run.last_attempt_at_ms = Some(now);
    let prepared = Prepared {
        delivery,
        channel,
        channel_name: t.channel.clone(),
        policy,
        pacing: t.pacing,
        probe,
    };
    st.runs.insert(key.run, run);
    st.sending.insert(key.run);
    Ok(Some(prepared))
}

async fn send(inner: &Arc<Inner>, p: &Prepared) -> Outcome {
    let d = &p.delivery;
    tracing::debug!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt, "attempt");
    match &p.channel {
        Some(c) => {
            let o = c.send(d, || inner.clock.now_ms()).await;
            record(inner, c, &o, p.probe);
            o
        }
        None => Outcome::Permanent {
            error: format!("channel {:?} is no longer configured", p.channel_name),
        },
    }
}

/// Counts an admitted send's outcome on its channel (and its breaker, alerting on a change).
pub(super) fn record(inner: &Arc<Inner>, c: &crate::deliver::Channel, o: &Outcome, probe: bool) {
    if let Some(tr) = c.record(inner.clock.now_ms(), o, probe) {
        alerts::breaker(inner, &c.name, tr);
    }
}

/// Settles the attempt under the lock: plan, write, then memory and the wheel.
async fn settle(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    p: Prepared,
    outcome: Outcome,
) -> Result<(), EngineError> {
    let Some((plan, batch)) = settle_plan(inner, l, key, &p, &outcome)? else {
        return Ok(());
    };
    if let Err(e) = inner.store.write(&batch).await {
        settle_lost(inner, l, key, &e);
        return Err(e.into());
    }
    settle_done(inner, l, key, plan);
    Ok(())
}

/// The settle's decision and the writes that record it; memory is untouched but for the run
/// no longer sending. `None`: the run is gone (nothing to settle).
pub(super) fn settle_plan(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    p: &Prepared,
    outcome: &Outcome,
) -> Result<Option<(plan::SettlePlan, Batch)>, EngineError> {
    let st = l.st();
    st.sending.remove(&key.run);
    let now = inner.clock.now_ms();
    let Some(run) = st.runs.get(&key.run).cloned() else {
        return Ok(None);
    };
    let delay = backoff::retry_delay_ms(
        &p.policy,
        run.attempts,
        inner.config.jitter_seed,
        &p.delivery.idempotency_key,
    );
    let plan = plan::settle(
        &st.task,
        &run,
        st.runs.len() > 1,
        Attempt {
            outcome: outcome.clone(),
            max_attempts: p.policy.max_attempts,
            retry_delay_ms: delay,
            pacing: p.pacing,
            to: &p.delivery.to,
            channel: &p.channel_name,
        },
        now,
        ARM_LEAD_MS,
    )?;
    log_outcome(&p.delivery, outcome, &plan);
    let mut batch = Batch::new();
    if let Some(f) = &plan.failure {
        batch.failure(f.clone());
    }
    batch.run(&plan.task.id, &plan.run);
    if let Some(r) = &plan.next_run {
        batch.run(&plan.task.id, r);
    }
    if plan.task != st.task {
        batch.progress(&plan.task);
    }
    Ok(Some((plan, batch)))
}

/// The settle's write failed: the send happened (or not) but its outcome is not on disk.
/// Memory is forgotten and read back from what is there (the message in flight), so nothing
/// runs ahead of the disk; the step is tried again.
pub(super) fn settle_lost(
    inner: &Inner,
    l: &mut Locked,
    key: &RunKey,
    e: &crate::store::StoreError,
) {
    tracing::warn!(task = %l.id, run = key.run, error = %e,
        "could not record the outcome; the task is reloaded from disk and its in-flight message goes again");
    l.unload();
    inner
        .timer
        .at(key.clone(), inner.clock.now_ms() + STORAGE_RETRY_MS);
}

/// The settle is durable: memory, the wheel, events and alerts follow it.
pub(super) fn settle_done(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    plan: plan::SettlePlan,
) {
    let st = l.st();
    inner.events.progress(&plan.task, &plan.run); // events (issue 11)
    if plan.finished {
        st.runs.remove(&key.run);
        tracing::info!(task = %plan.task.id, run = key.run, sent = plan.run.sent, failed = plan.run.failed,
            "run finished");
    } else {
        st.runs.insert(key.run, plan.run.clone());
    }
    st.task = plan.task;
    if st.task.state == TaskState::Running {
        if !plan.finished {
            if plan.armed_next {
                // Armed: straight to the send phase at the due instant.
                if let Some(at) = plan.run.next_at_ms {
                    inner.timer.at(key.clone(), at);
                }
            } else {
                plan_run(inner, &st.task.id, &plan.run);
            }
        }
        if let Some(r) = plan.next_run {
            tracing::info!(task = %st.task.id, run = r.run, "queued run started");
            plan_run(inner, &st.task.id, &r);
            st.runs.insert(r.run, r);
        }
    }
    plan_fire(inner, &st.task);
    if let Some(f) = &plan.failure {
        alerts::failure(inner, f, "failure");
        inner.events.failure(f, "added"); // events (issue 11)
    }
}

fn log_outcome(d: &Delivery, outcome: &Outcome, plan: &plan::SettlePlan) {
    match outcome {
        Outcome::Sent => {
            tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt, "sent")
        }
        // `Held` (local resource shortage) settles like a retry that burned no attempt.
        Outcome::Retry { error, .. }
        | Outcome::Permanent { error }
        | Outcome::Held { error, .. } => {
            if let Some(f) = &plan.failure {
                tracing::warn!(task = %d.task_id, run = d.run, seq = d.seq, attempts = f.attempts,
                    error = %Escaped(error), failure = %d.idempotency_key, "gave up: message moved to the failure list");
            } else {
                tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt,
                    error = %Escaped(error), next_at = %crate::schedule::format_opt(plan.run.next_at_ms), "attempt failed; will retry");
            }
        }
    }
}
