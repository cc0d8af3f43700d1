//! Retrying a message from the failure list (`POST /v1/failures/{id}/retry`).
//!
//! The retry is a fresh series of attempts (up to the task's retry policy), each a wheel entry
//! `Key::Retry(failure id)`; it carries the same idempotency key as the original
//! message and the next attempt number. Rate limits and the breaker apply as for any send.
//! Success removes the entry from the failure list; exhausting the attempts leaves it there
//! (with the new attempts and error) and raises an alert. The run's own counters are history
//! and are not rewritten. What an attempt leads to is decided by `plan::failure_retry` (pure),
//! with the same retry rule as a run. Quiet hours hold each attempt as they hold a run's send
//! (issue 28): one asked for, or whose backoff falls, inside the window waits for its end.
use std::sync::Arc;

use super::commit::{self, RetryWheel};
use super::plan::RetryPlan;
use super::step::SendGate;
use super::timer::Key;
use super::{offload, EngineError, Inner};
use crate::deliver::{backoff, Admission};
use crate::model::{Outcome, TimelineEvent};

pub(crate) async fn failure_retry(
    inner: &Arc<Inner>,
    failure_id: &Arc<str>,
) -> Result<(), EngineError> {
    let id = &**failure_id;
    let key = Key::Retry(failure_id.clone());
    let guard = inner.failures_lock.lock().await;
    let Some(mut f) = read_failure(inner, id).await? else {
        return Ok(()); // dismissed
    };
    // An attempt of it is on its way (a retry asked for again while it was sent): its settle
    // decides what comes next. Another attempt now would overlap it.
    if !f.retrying || inner.failure_sends.contains(failure_id) {
        return Ok(());
    }
    let Some((task, channel, msg)) = inputs(inner, &mut f).await? else {
        return Ok(());
    };
    // Read before the admission: an admitted send that stops on an error would keep its rate
    // slot and, as the breaker's probe, hold the channel half-open until the probe's lease ran
    // out.
    let run_fire = run_fire(inner, &f).await?;
    let now = inner.clock.now_ms();
    if super::step::draining(inner) {
        // Still `retrying`: the next boot arms it again (`resume_failure_retries`).
        return Ok(());
    }
    let (spec, _) = task.split();
    let tz = msg.tz.clone();
    // On a shard being handed over the send window below closes, and the new owner arms the
    // retry again: a hold here would write its `held` event twice.
    let quiet = super::plan::quiet_until(&spec, tz.as_deref(), channel.quiet_hours.as_ref(), now)
        .filter(|_| !inner.releasing(&f.task_id));
    if let Some(until) = quiet {
        drop(guard);
        quiet_hold(inner, failure_id, until).await;
        return Ok(());
    }
    let scheduled = due_of(&spec, tz.as_deref(), run_fire, now);
    let mut delivery = render(&spec, &f, msg, scheduled, now);
    let (probe, rate_tick) = match channel.admit(now) {
        Admission::Hold { until_ms, .. } => {
            inner.timer.at(key, until_ms);
            return Ok(());
        }
        Admission::Go { probe, rate_tick } => (probe, rate_tick),
    };
    // Cluster mode: as a run's send (`step.rs`), only with enough of the shard's trust left
    // (none on a shard being handed over), cut off where the trust ends, and counted on the
    // shard until its outcome is settled, so a handover waits for it.
    // (Its end is read again once the send has a slot: `step::send_in_slot`.)
    let (_on_shard, epoch) = match inner.send_window(&f.task_id) {
        super::cluster::Window::Closed => {
            channel.unsent(probe);
            drop(guard);
            super::step::window_closed(inner, key);
            return Ok(());
        }
        super::cluster::Window::Within(_, on_shard, epoch) => (Some(on_shard), Some(epoch)),
        super::cluster::Window::Unbounded => (None, None),
    };
    delivery.epoch = epoch;
    let policy = spec.retry.unwrap_or(channel.retry);
    let sending = inner.failure_sends.mark(failure_id);
    // Its task has a send out too, until the settle: a delete (the retention sweep, or
    // `DELETE /v1/tasks/{id}` of a finished task) skips it meanwhile. Taken under the
    // failures lock, which a delete holds while it looks (`retention.rs`).
    let _out = inner.sends_out.mark(&Arc::from(f.task_id.as_str()));
    drop(guard);

    let quiet = (&spec, tz.as_deref());
    let sent = send_attempt(inner, &channel, &delivery, (rate_tick, probe), quiet).await;
    let Some((outcome, report)) = sent else {
        // Cancelled or paused since its check (or unreadable): the next step says so.
        drop(sending);
        inner.timer.at(key, inner.clock.now_ms());
        return Ok(());
    };

    // A local resource shortage (EMFILE, ENOBUFS), or not started after its wait for a slot
    // (a drain, a cancel or pause, the breaker, the rate limit, too little trust): nothing
    // left this host; try again later without counting an attempt (issue 9). Stopped: the
    // next run of the step (or the next boot, after a drain) looks at the task again. Its
    // mark goes first: nothing of it is on its way, and a step due at once must not take
    // the mark for an attempt under way (it would end there, the entry left retrying).
    if let Outcome::Held { until_ms, why, .. } = outcome {
        drop(sending);
        if why == crate::model::timeline::HeldWhy::QuietHours {
            quiet_hold(inner, failure_id, until_ms).await;
        } else {
            inner.timer.at(key, until_ms);
        }
        return Ok(());
    }
    settle(inner, id, &delivery, outcome, &report, &policy).await
}

/// The retry's attempt `d`, admitted (`(rate_tick, probe)`), sent once it has its task's send
/// gate, as a run's send: a cancel or pause answered from now on closes it, and no request of
/// this retry is written after that; `None`: the task was cancelled or paused since its check
/// (or is unreadable), nothing sent. Then a slot of the channel ([`retry_slot`]; `quiet`: its
/// task and its message's zone). Traced like a run's attempt: the task's trace with a span of
/// its own, and an `attempt` event in the timeline beside what it led to (issue 25). Recorded
/// on the channel (and its breaker) only if it went: not if it was held or cut off where the
/// trust ended.
async fn send_attempt(
    inner: &Arc<Inner>,
    channel: &crate::deliver::Channel,
    d: &crate::deliver::Delivery,
    (rate_tick, probe): (Option<u64>, bool),
    quiet: (&crate::model::TaskSpec, Option<&str>),
) -> Option<(Outcome, crate::deliver::AttemptReport)> {
    let Some(gate) = retry_gate(inner, &d.task_id).await else {
        channel.unsent(probe);
        return None;
    };
    let slot = retry_slot(inner, channel, &d.task_id, (rate_tick, probe), quiet).await;
    let sent = match slot {
        Ok(slot) => super::step::send_in_slot(inner, channel, d, slot, probe, gate.gate()).await,
        Err(o) => {
            channel.unsent(probe);
            (o, Default::default())
        }
    };
    drop(gate);
    Some(sent)
}

/// Quiet hours hold retry `id`'s attempt until `until` (the window's end in its message's
/// zone; `plan::quiet_until`, the decision a run's send asks), as they hold a run's send
/// (`step::hold_for_time`): nothing sent, no attempt counted, the entry still `retrying`.
/// Its step comes back at the window's end, a wall instant (`Timer::at_wall`: a wall step in
/// the night keeps 08:00 at 08:00), and the hold is on the task's timeline (`held`, why
/// `quiet_hours`, until when) beside the retry's attempts. Under the failures lock, with the
/// entry as it is now: one dismissed or stopped meanwhile is neither armed nor written. The
/// step does not come back before `until` (unless the retry is asked for again), so it is one
/// event per hold. A failed read arms it all the same; a failed write of the event changes
/// nothing (the hold stands).
async fn quiet_hold(inner: &Arc<Inner>, id: &Arc<str>, until: u64) {
    let _guard = inner.failures_lock.lock().await;
    let f = match read_failure(inner, id).await {
        Ok(Some(f)) if f.retrying => f,
        Ok(_) => return,
        Err(e) => {
            tracing::debug!(failure = %id, error = %e, "a failure retry held for quiet hours could not be read");
            inner.timer.at_wall(Key::Retry(id.clone()), until);
            return;
        }
    };
    inner.timer.at_wall(Key::Retry(id.clone()), until);
    tracing::debug!(failure = %id, until = %crate::schedule::format_utc(until), "failure retry held for quiet hours");
    let why = crate::model::timeline::HeldWhy::QuietHours;
    let held = TimelineEvent::held(inner.clock.now_ms(), f.run, f.seq, until, why);
    let steps = vec![held];
    if let Err(e) = commit::failure_saved(inner, &f, RetryWheel::Keep, None, None, steps).await {
        tracing::debug!(failure = %id, error = %e, "the quiet-hours hold's timeline event was not written");
    }
}

/// What a retry of `f` sends: its task, channel and message, read off the workers when the
/// store's reads can block. `None` when there is nothing to send: the entry then says why (no
/// longer possible, or the task cancelled or paused), written.
async fn inputs(
    inner: &Arc<Inner>,
    f: &mut crate::model::Failure,
) -> Result<
    Option<(
        crate::model::Task,
        Arc<crate::deliver::Channel>,
        crate::model::Message,
    )>,
    EngineError,
> {
    let (task_id, seq) = (f.task_id.clone(), f.seq);
    let (task, msg) = offload::read(inner, move |i| {
        let task = i.store.get_task(&task_id)?;
        let msg = match task {
            Some(_) => i.store.get_message(&task_id, seq)?,
            None => None,
        };
        Ok((task, msg))
    })
    .await?;
    let channel = inner.channels.get(&f.channel).cloned();
    let (Some(task), Some(channel)) = (task, channel) else {
        f.retrying = false;
        f.last_error = format!(
            "retry impossible: task {:?} or channel {:?} no longer exists",
            f.task_id, f.channel
        );
        return save(inner, f).await.map(|()| None);
    };
    let Some(msg) = msg else {
        f.retrying = false;
        f.last_error = format!("retry impossible: the task no longer has message {}", f.seq);
        return save(inner, f).await.map(|()| None);
    };
    if let Some(why) = stopped(inner, &f.task_id, task.state).await? {
        (f.retrying, f.last_error) = (false, why);
        return save(inner, f).await.map(|()| None);
    }
    Ok(Some((task, channel, msg)))
}

/// A slot of the channel's concurrency for a failure retry, as for a run's send
/// (`step.rs::slot`): the retry was admitted, and its task looked at, before any wait; so after
/// a wait a drain begun meanwhile, or a cancel or pause answered meanwhile, stops it (no send
/// starts after either), quiet hours begun meanwhile hold it to the window's end
/// (`step::quiet_after_wait`; `quiet`: its task and its message's zone), a breaker opened
/// meanwhile holds it unless it is the probe, and the rate slot is taken again, counted from
/// when the send starts.
/// The task's state is read from the store, not under its lock: a cancel or pause answers
/// once it is durable, and the lock is never waited for while a slot is held (a chunk holds
/// its tasks' locks while it waits for this channel's slots). `Err`: not sent, held (no
/// attempt counted).
async fn retry_slot<'c>(
    inner: &Arc<Inner>,
    channel: &'c crate::deliver::Channel,
    task_id: &str,
    (rate_tick, probe): (Option<u64>, bool),
    quiet: (&crate::model::TaskSpec, Option<&str>),
) -> Result<(tokio::sync::SemaphorePermit<'c>, bool), Outcome> {
    let (permit, waited) = channel
        .permit()
        .await
        .ok_or_else(|| crate::deliver::Channel::closed().0)?;
    if !waited {
        return Ok((permit, false));
    }
    let held = |why: &str, until_ms: u64, held_why| Outcome::Held {
        error: format!("not retried yet: {why}"),
        until_ms,
        why: held_why,
    };
    let now = inner.clock.now_ms();
    let stop = crate::model::timeline::HeldWhy::Stopped;
    if super::step::draining(inner) {
        return Err(held(
            "herald began to shut down while it waited for a slot",
            now,
            stop,
        ));
    }
    let id = task_id.to_string();
    let state = offload::read(inner, move |i| Ok(i.store.get_task(&id)?.map(|t| t.state))).await;
    match state {
        Ok(Some(crate::model::TaskState::Cancelled | crate::model::TaskState::Paused)) => {
            return Err(held(
                "the task was cancelled or paused while it waited for a slot",
                now,
                stop,
            ));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(held(
                "its task could not be read after its wait for a slot",
                now,
                stop,
            ))
        }
    }
    super::step::quiet_after_wait(channel, rate_tick, quiet, now)?;
    if let Err(until_ms) = channel.recheck(now, probe) {
        return Err(super::step::breaker_held(until_ms));
    }
    match channel.retake_rate(rate_tick, now) {
        Ok(()) => Ok((permit, true)),
        Err(until_ms) => Err(held(
            "the channel's rate limit, counted when the send could start",
            until_ms,
            crate::model::timeline::HeldWhy::RateLimit,
        )),
    }
}

/// The send gate of a retry's task (`step::SendGate`), taken under the task's lock while it
/// is neither cancelled nor paused; `None` if it is (or cannot be read now). A task no longer
/// live is finished (a command reaches it only once a patch re-arms an expired one).
async fn retry_gate<'a>(inner: &'a Arc<Inner>, task_id: &str) -> Option<SendGate<'a>> {
    use crate::model::TaskState;
    let stop = |s: TaskState| matches!(s, TaskState::Cancelled | TaskState::Paused);
    match commit::lock(inner, task_id).await {
        Ok(Some(mut l)) => {
            let gate = (!stop(l.st().progress.state)).then(|| SendGate::new(inner, &l.id));
            l.release(inner);
            gate
        }
        Ok(None) => {
            // Cancelled since `stopped` looked (the task left the live map with it), or
            // finished: as the store says.
            let id = task_id.to_string();
            let state = offload::read(inner, move |i| Ok(i.store.get_task(&id)?.map(|t| t.state)));
            match state.await {
                Ok(Some(s)) if !stop(s) => Some(SendGate::new(inner, &Arc::from(task_id))),
                _ => None,
            }
        }
        Err(_) => None,
    }
}

/// A failure-list entry, read off the workers when the store's reads can block (`offload.rs`).
async fn read_failure(
    inner: &Arc<Inner>,
    id: &str,
) -> Result<Option<crate::model::Failure>, EngineError> {
    let id = id.to_string();
    offload::read(inner, move |i| Ok(i.store.get_failure(&id)?)).await
}

/// Why the task stops its failure-list retries, if it does: cancelled or paused (API.md: no
/// send of the task starts after the answer). A live task's state is read under its lock, so
/// a cancel or pause answered before this point is seen; a task not live is as the store
/// read it (`stored`).
async fn stopped(
    inner: &Arc<Inner>,
    task_id: &str,
    stored: crate::model::TaskState,
) -> Result<Option<String>, EngineError> {
    use crate::model::TaskState;
    let state = match commit::lock(inner, task_id).await? {
        Some(mut l) => {
            let s = l.st().progress.state;
            l.release(inner);
            s
        }
        None => stored,
    };
    Ok(matches!(state, TaskState::Cancelled | TaskState::Paused).then(|| {
        format!("not retried: the task was {state} (no send of it starts after that); ask for the retry again once it runs")
    }))
}

/// When the failed message's run was scheduled and its slot's wall (`None`: the run is gone),
/// read off the workers when the store's reads can block (`offload.rs`).
async fn run_fire(
    inner: &Arc<Inner>,
    f: &crate::model::Failure,
) -> Result<Option<(u64, Option<u64>)>, EngineError> {
    let (task_id, run) = (f.task_id.clone(), f.run);
    offload::read(inner, move |i| {
        let r = i.store.get_run(&task_id, run)?;
        Ok(r.map(|r| (r.scheduled_at_ms, r.slot_wall_ms)))
    })
    .await
}

/// When the message was due: its run's instant (`run_fire`; now if the run is gone), in
/// recipient time not before its own (`plan::due_no_earlier_than_own`).
fn due_of(
    spec: &crate::model::TaskSpec,
    tz: Option<&str>,
    run_fire: Option<(u64, Option<u64>)>,
    now: u64,
) -> u64 {
    run_fire.map_or(now, |fire| {
        super::plan::due_no_earlier_than_own(spec, tz, fire, fire.0)
    })
}

/// The attempt's delivery: the message rendered as its run's (due at `scheduled`), with the
/// next attempt number.
fn render(
    spec: &crate::model::TaskSpec,
    f: &crate::model::Failure,
    msg: crate::model::Message,
    scheduled: u64,
    now: u64,
) -> crate::deliver::Delivery {
    super::render::delivery(
        spec,
        msg,
        &super::render::Attempt {
            run: f.run,
            seq: f.seq,
            attempt: f.attempts + 1,
            due_ms: scheduled,
            run_at_ms: scheduled,
            now_ms: now,
        },
    )
}

/// After the send, under the failures lock again: the entry as it is now (it may have been
/// dismissed meanwhile) and what the outcome leads to.
async fn settle(
    inner: &Arc<Inner>,
    id: &str,
    delivery: &crate::deliver::Delivery,
    outcome: Outcome,
    report: &crate::deliver::AttemptReport,
    policy: &crate::model::RetryPolicy,
) -> Result<(), EngineError> {
    let _guard = inner.failures_lock.lock().await;
    let now = inner.clock.now_ms();
    let Some(f) = read_failure(inner, id).await? else {
        return Ok(()); // dismissed while sending
    };
    let seed = inner.config.jitter_seed;
    let attempt = TimelineEvent::attempt(
        now,
        f.run,
        f.seq,
        delivery.attempt,
        &outcome,
        report.status,
        report.duration_ms,
    );
    let plan = super::plan::failure_retry(
        &f,
        outcome,
        policy.max_attempts,
        |n| backoff::retry_delay_ms(policy, n, seed, &f.id),
        now,
    );
    commit_plan(inner, plan, attempt, now).await
}

/// Records what a retry's attempt led to (resolved, again later, or given up) in one write.
async fn commit_plan(
    inner: &Arc<Inner>,
    plan: RetryPlan,
    attempt: TimelineEvent,
    now: u64,
) -> Result<(), EngineError> {
    match plan {
        RetryPlan::Resolved(f) => {
            tracing::info!(failure = %f.id, attempts = f.attempts, "failure retried: sent");
            commit::failure_removed(inner, &f, "resolved", vec![attempt]).await?;
        }
        RetryPlan::Again { failure, at } => {
            let next = TimelineEvent::retry_scheduled(
                now,
                failure.run,
                failure.seq,
                failure.attempts + 1,
                at,
                &failure.last_error,
            );
            let steps = vec![attempt, next];
            commit::failure_saved(inner, &failure, RetryWheel::At(at), None, None, steps).await?;
        }
        RetryPlan::GaveUp(f) => {
            tracing::warn!(failure = %f.id, attempts = f.attempts, error = %crate::logsafe::Escaped(&f.last_error),
                "failure retry gave up; it stays in the failure list");
            commit::failure_saved(
                inner,
                &f,
                RetryWheel::Keep,
                Some("failed"),
                Some("failure_retry_failed"),
                vec![attempt],
            )
            .await?;
        }
    }
    Ok(())
}

async fn save(inner: &Arc<Inner>, f: &crate::model::Failure) -> Result<(), EngineError> {
    commit::failure_saved(inner, f, RetryWheel::Keep, None, None, Vec::new()).await?;
    Ok(())
}
