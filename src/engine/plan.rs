//! The engine's decisions, as pure functions: from a task's progress, an event and `now` to a
//! plan, and from the plan to one [`Change`] (the records to write, the runs to put on the
//! wheel, the failure to list). No IO, no clock, no locks: `commit.rs` carries a change out
//! (write it durably, then change memory and the wheel), and the seeded simulation in
//! `tests/simulation.rs` drives these functions through the real engine on a manual clock.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{
    delivery_key, Failure, InvalidTransition, Outcome, Overlap, Pacing, Run, RunState, Task,
    TaskState,
};
use crate::schedule::misfire::{judge, Decision, MISSED_LIST_MAX};
use crate::schedule::plan::may_run_more;
use crate::schedule::{mark_fired, next_fire};

use super::change::{Change, WheelOp};
use super::derive_state;
use crate::model::timeline::{HeldWhy, TimelineEvent, TimelineKind};
use crate::schedule::format_utc;
use serde_json::json;

/// Expired fires recorded one by one per fire step; more are only counted (a year-long outage
/// of a per-minute cron must not write half a million records).
pub const EXPIRED_RECORDS_MAX: usize = 100;

/// What a fire step does.
#[derive(Debug, Clone)]
pub struct FirePlan {
    /// The task after the fire(s): counters, next fire, state.
    pub task: Task,
    /// Records of fires that did not start a run (skipped, expired), with their reasons.
    pub not_started: Vec<Run>,
    /// Runs started now, their first attempt armed (in-flight mark set): written with the
    /// task, then put on the wheel at their due instant.
    pub started: Vec<Run>,
    /// How many of the handled fires were missed (herald down or the task paused).
    pub missed: usize,
}

impl FirePlan {
    /// The change: the new runs (started ones armed, straight to their send at the instant)
    /// and the fires that did not start, the task, and the oldest history beyond `runs_max`
    /// trimmed (the store skips a run still running, and deletes at most `store::TRIM_MAX`).
    pub fn change(self, runs_max: Option<u32>) -> Change {
        let trim_runs_below = runs_max
            .filter(|max| self.task.fires > *max)
            .map(|max| self.task.fires - max + 1);
        let wheel = self.started.iter().map(|r| WheelOp::Step(r.run)).collect();
        let timeline = fire_events(&self.not_started, &self.started);
        let mut runs = self.not_started;
        runs.extend(self.started);
        Change {
            task: Some(self.task),
            runs,
            trim_runs_below,
            wheel,
            timeline,
            ..Change::default()
        }
    }
}

/// The timeline of a fire step: `fired` for each run started, `skipped` or `expired` (with
/// the run's reason) for each fire that did not start one.
pub fn fire_events(not_started: &[Run], started: &[Run]) -> Vec<TimelineEvent> {
    let mut out = Vec::with_capacity(not_started.len() + started.len());
    for r in not_started {
        let kind = match r.state {
            RunState::Expired => TimelineKind::Expired,
            _ => TimelineKind::Skipped,
        };
        out.push(
            TimelineEvent::run(kind, r.started_at_ms, r.run, None).with_detail(json!({
                "scheduled_at": format_utc(r.scheduled_at_ms),
                "reason": r.reason,
            })),
        );
    }
    for r in started {
        out.push(
            TimelineEvent::run(TimelineKind::Fired, r.started_at_ms, r.run, None).with_detail(
                json!({
                    "scheduled_at": format_utc(r.scheduled_at_ms),
                    "messages": r.total,
                }),
            ),
        );
    }
    out
}

/// The timeline of a settled attempt (pure): the `attempt` with its answer, then what
/// followed: `delivered`, `failed` (to the failure list) or `retry_scheduled` (when and
/// why). A send held for a local resource shortage never left the host: `held` instead.
pub fn settle_events(
    plan: &SettlePlan,
    seq: u32,
    attempt: u32,
    outcome: &Outcome,
    status: Option<u16>,
    duration_ms: u64,
    now: u64,
) -> Vec<TimelineEvent> {
    let run = plan.run.run;
    if let Outcome::Held { until_ms, .. } = outcome {
        return vec![TimelineEvent::held(
            now,
            run,
            seq,
            *until_ms,
            HeldWhy::LocalResource,
        )];
    }
    let mut out = vec![TimelineEvent::attempt(
        now,
        run,
        seq,
        attempt,
        outcome,
        status,
        duration_ms,
    )];
    let (error, not_before) = match outcome {
        Outcome::Sent => {
            out.push(TimelineEvent::delivered(now, run, seq, attempt));
            return out;
        }
        Outcome::Retry {
            error,
            not_before_ms,
        } => (error, *not_before_ms),
        Outcome::Permanent { error } | Outcome::Held { error, .. } => (error, None),
    };
    if let Some(f) = &plan.failure {
        out.push(TimelineEvent::failed(
            now,
            run,
            seq,
            f.attempts,
            &f.last_error,
        ));
    } else if let (Some(at), false) = (plan.run.next_at_ms, plan.finished) {
        let reason = match not_before {
            Some(_) => format!("Retry-After ({error})"),
            None => error.clone(),
        };
        out.push(TimelineEvent::retry_scheduled(
            now, run, seq, attempt, at, &reason,
        ));
    }
    out
}

/// Handles the fire due at `due` (and, if it was missed, every fire missed with it).
///
/// A fire is *missed* only if it was due before `watched_ms`: the later of herald's start and
/// the task's own `watched_since_ms` (creation, resume, schedule change). Then, and only then,
/// the misfire policy and `misfire_grace` judge it, by how long before `watched_ms` it was due.
/// A fire due while herald was watching is never missed, however late it is handled (herald's
/// own backlog, a wall-clock jump): it runs.
pub fn fire(
    task: &Task,
    active_runs: usize,
    due: u64,
    now: u64,
    watched_ms: u64,
) -> Result<FirePlan, InvalidTransition> {
    let mut task = task.clone();
    let total = task.message_count;
    let (decisions, missed) = if due < watched_ms {
        let mut missed = vec![due];
        let mut probe = task.clone();
        mark_fired(&mut probe, due);
        while missed.len() < MISSED_LIST_MAX {
            match next_fire(&probe, now) {
                Some(n) if n < watched_ms => {
                    missed.push(n);
                    mark_fired(&mut probe, n);
                }
                _ => break,
            }
        }
        let n = missed.len();
        (
            judge(task.misfire, task.misfire_grace_ms, &missed, watched_ms),
            n,
        )
    } else {
        (vec![Decision::Run(due)], 0)
    };

    let mut not_started = Vec::new();
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
                    not_started.push(Run::not_started(
                        run_no,
                        t,
                        now,
                        total,
                        RunState::Expired,
                        why,
                    ));
                }
            }
            Decision::Skip(t, why) => {
                mark_fired(&mut task, t);
                not_started.push(skip(&mut task, run_no, t, now, why));
            }
            Decision::Run(t) => {
                mark_fired(&mut task, t);
                if !may_run_more(&task) {
                    not_started.push(skip(&mut task, run_no, t, now, "max_runs reached".into()));
                    continue;
                }
                let busy = active_runs > 0 || !started.is_empty();
                if busy && task.overlap != Overlap::Allow {
                    // Misfire catch-up (several runs from one outage) queues behind the first
                    // whatever the policy; a regular fire follows the overlap policy.
                    let catching_up = !started.is_empty();
                    if catching_up || (task.overlap == Overlap::Queue && task.queued.is_empty()) {
                        task.queued.push((run_no, t));
                    } else {
                        let why = if task.overlap == Overlap::Queue {
                            "overlap queue: a run is already waiting".to_string()
                        } else {
                            "overlap skip: the previous run was still sending".to_string()
                        };
                        not_started.push(skip(&mut task, run_no, t, now, why));
                    }
                    continue;
                }
                started.push(start_run(&mut task, run_no, t, now));
            }
        }
    }
    task.next_fire_at_ms = next_fire(&task, now);
    let to = derive_state(&task, active_runs > 0 || !started.is_empty());
    task.set_state(to, now)?;
    // Arm the first attempt of each new run in the same durable write.
    for r in &mut started {
        r.begin_attempt(now);
    }
    Ok(FirePlan {
        task,
        not_started,
        started,
        missed,
    })
}

fn skip(task: &mut Task, run_no: u32, t: u64, now: u64, why: String) -> Run {
    task.skipped += 1;
    Run::not_started(run_no, t, now, task.message_count, RunState::Skipped, why)
}

/// A new run of `task` for the fire at `t` (run number already allocated by `mark_fired`).
pub fn start_run(task: &mut Task, run_no: u32, t: u64, now: u64) -> Run {
    task.runs += 1;
    Run::new(run_no, t, now, task.message_count)
}

/// A run read back from the store by a process that is not sending it (start-up, or a reload
/// after a failed write): its in-flight mark is an attempt that was interrupted. Armed for an
/// instant still to come, it cannot have been sent (sends start at their instant), so the
/// attempt is given back; otherwise nobody knows whether the channel got it, and it is sent
/// again now (or at its instant), with the next attempt number and the same key. Second value:
/// whether it is a resend.
pub fn reload_run(mut r: Run, now: u64) -> (Run, bool) {
    match (r.in_flight, r.next_at_ms) {
        (Some(_), Some(at)) if at > now => {
            r.disarm();
            (r, false)
        }
        (Some(_), _) => {
            r.in_flight = None;
            r.next_at_ms = Some(r.next_at_ms.unwrap_or(now).max(now));
            (r, true)
        }
        (None, _) => (r, false),
    }
}

/// What start-up does with a task that was running: the task to write (if it changed) and a
/// run to start.
#[derive(Debug, Clone)]
pub struct RecoverPlan {
    pub task: Task,
    /// Write `task` (and `started`): something changed.
    pub write: bool,
    /// A fire that was queued behind a run that has since finished: its run starts now.
    pub started: Option<Run>,
}

impl RecoverPlan {
    pub fn change(self) -> Change {
        if !self.write {
            return Change::default();
        }
        Change {
            task: Some(self.task),
            runs: self.started.into_iter().collect(),
            ..Change::default()
        }
    }
}

/// Start-up of a task whose live entry says `running`, with its active runs: a queued fire
/// whose run never started (the crash fell between the end of one run and the start of the
/// next) starts now, and the state is derived again from what is active.
pub fn recover_running(
    task: &Task,
    active_runs: usize,
    now: u64,
) -> Result<RecoverPlan, InvalidTransition> {
    let mut t = task.clone();
    let mut started = None;
    if active_runs == 0 && !t.queued.is_empty() {
        let (n, at) = t.queued.remove(0);
        started = Some(start_run(&mut t, n, at, now));
    }
    let to = derive_state(&t, active_runs > 0 || started.is_some());
    let write = to != t.state || started.is_some();
    if to != t.state {
        t.set_state(to, now)?;
    }
    Ok(RecoverPlan {
        task: t,
        write,
        started,
    })
}

/// What settling one attempt does.
#[derive(Debug, Clone)]
pub struct SettlePlan {
    pub task: Task,
    /// The run after the attempt (cursor, retry, counters); armed again if `armed_next`.
    pub run: Run,
    /// The run is done (every message sent or given up on, or it was cancelled).
    pub finished: bool,
    /// A queued fire that starts now that this run is done.
    pub next_run: Option<Run>,
    /// The message given up on, for the failure list.
    pub failure: Option<Failure>,
    /// The task's record changes (its state, or a queued run started): written with the run.
    pub task_changed: bool,
}

impl SettlePlan {
    /// The change: the run (and a queued run that starts now) written with the task when it
    /// changed (a settle that only moved a cursor writes no task record); the failure listed.
    pub fn change(self) -> Change {
        let task_changed = self.task_changed;
        let mut wheel = vec![WheelOp::Step(self.run.run)];
        let mut runs = vec![self.run];
        if let Some(r) = self.next_run {
            wheel.push(WheelOp::Step(r.run));
            runs.push(r);
        }
        Change {
            task: task_changed.then_some(self.task),
            runs,
            failure: self.failure,
            wheel,
            ..Change::default()
        }
    }
}

/// Facts about the attempt being settled that the plan needs.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub outcome: Outcome,
    pub max_attempts: u32,
    pub retry_delay_ms: u64,
    pub pacing: Pacing,
    pub to: &'a str,
    pub channel: &'a str,
}

/// Settles the attempt in flight on `run` (O(1) in the number of messages).
/// `other_active`: the task has active runs besides this one.
pub fn settle(
    task: &Task,
    run: &Run,
    other_active: bool,
    a: Attempt<'_>,
    now: u64,
    arm_lead_ms: u64,
) -> Result<SettlePlan, InvalidTransition> {
    let mut task = task.clone();
    let mut run = run.clone();
    let settled = run.settle(a.outcome, a.max_attempts, a.retry_delay_ms, &a.pacing, now);
    let failure = settled.gave_up.as_ref().map(|g| Failure {
        id: delivery_key(&task.id, run.run, g.seq),
        task_id: task.id.clone(),
        run: run.run,
        seq: g.seq,
        to: a.to.to_string(),
        channel: a.channel.to_string(),
        attempts: g.attempts,
        last_error: g.error.clone(),
        failed_at_ms: now,
        retrying: false,
        retries: 0,
    });
    let finished = run.is_done() || run.state != RunState::Running;
    let armed_next = !finished
        && task.state == TaskState::Running
        && settled
            .next_at_ms
            .is_some_and(|at| at.saturating_sub(arm_lead_ms) <= now);
    if armed_next {
        // Due within `arm_lead_ms`: armed in this same write (a short interval then costs one
        // durable write per message, not two).
        run.begin_attempt(now);
    }
    let mut next_run = None;
    if finished
        && !task.queued.is_empty()
        && (!other_active || task.overlap == Overlap::Allow)
        && !task.state.is_terminal()
    {
        // A queued fire starts when the run it waited for is done.
        let (n, at) = task.queued.remove(0);
        next_run = Some(start_run(&mut task, n, at, now));
    }
    let mut task_changed = next_run.is_some();
    if task.state == TaskState::Running {
        let active = other_active || !finished || next_run.is_some();
        let to = derive_state(&task, active);
        // Only a new state is a change of the task: a cursor that moved is the run's.
        if to != task.state {
            task.set_state(to, now)?;
            task_changed = true;
        }
    }
    Ok(SettlePlan {
        task,
        run,
        finished,
        next_run,
        failure,
        task_changed,
    })
}

/// What a control command (cancel, pause, resume, trigger) writes: the task and the runs
/// whose records change. Runs in state `Running` stay active; the others leave memory.
#[derive(Debug, Clone)]
pub struct ControlPlan {
    pub task: Task,
    pub runs: Vec<Run>,
}

impl ControlPlan {
    /// The change: the task and its runs written; the runs' steps follow the task's state
    /// (on the wheel while it runs, off it otherwise).
    pub fn change(self) -> Change {
        let op = if self.task.state == TaskState::Running {
            WheelOp::Steps
        } else {
            WheelOp::DropSteps
        };
        Change {
            task: Some(self.task),
            runs: self.runs,
            wheel: vec![op],
            ..Change::default()
        }
    }
}

/// Parks a task `failed` with `reason` (a bug or a corrupt record): its runs stop (a run
/// sending right now is settled when its send returns), its fire is dropped. `None`: the task
/// is finished already.
pub fn park(
    task: &Task,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    reason: &str,
    now: u64,
) -> Option<Change> {
    let mut task = task.clone();
    let to = task.state.park().ok()?;
    task.state = to;
    task.updated_at_ms = now;
    task.failed_reason = Some(reason.to_string());
    task.next_fire_at_ms = None;
    task.queued.clear();
    let runs = runs
        .values()
        .filter(|r| !sending.contains(&r.run))
        .map(|r| {
            let mut r = r.clone();
            r.disarm();
            r.state = RunState::Cancelled;
            r.finished_at_ms = Some(now);
            r.next_at_ms = None;
            r.reason = Some(format!("task failed: {reason}"));
            r
        })
        .collect();
    Some(Change {
        task: Some(task),
        runs,
        parked: Some(reason.to_string()),
        wheel: vec![WheelOp::DropSteps],
        ..Change::default()
    })
}

/// Why a control command does not apply: a conflict with the task's state (409), or a bug
/// (an invalid transition: the task is parked, 500).
#[derive(Debug, Clone)]
pub enum Refused {
    Conflict(String),
    Bug(InvalidTransition),
}

impl From<InvalidTransition> for Refused {
    fn from(e: InvalidTransition) -> Refused {
        Refused::Bug(e)
    }
}

/// Runs armed but not sending give their attempt back: nothing was sent.
fn disarmed(runs: &BTreeMap<u32, Run>, sending: &BTreeSet<u32>) -> Vec<Run> {
    runs.values()
        .filter(|r| !sending.contains(&r.run))
        .map(|r| {
            let mut r = r.clone();
            r.disarm();
            r
        })
        .collect()
}

/// Cancel: the task and every active run end; a run sending right now keeps its attempt (its
/// outcome is still settled) but is marked cancelled.
pub fn cancel(
    task: &Task,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    now: u64,
) -> Result<ControlPlan, Refused> {
    if task.state.is_terminal() {
        return Err(Refused::Conflict(format!(
            "task {:?} is already {}",
            task.id, task.state
        )));
    }
    let mut task = task.clone();
    task.set_state(TaskState::Cancelled, now)?;
    task.next_fire_at_ms = None;
    task.queued.clear();
    let mut out = disarmed(runs, sending);
    out.extend(runs.values().filter(|r| sending.contains(&r.run)).cloned());
    for r in &mut out {
        r.state = RunState::Cancelled;
        r.finished_at_ms = Some(now);
        r.next_at_ms = None;
    }
    Ok(ControlPlan { task, runs: out })
}

/// Pause: nothing more is sent; armed attempts are given back; cursors stay.
pub fn pause(
    task: &Task,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    now: u64,
) -> Result<ControlPlan, Refused> {
    if !matches!(task.state, TaskState::Pending | TaskState::Running) {
        return Err(Refused::Conflict(format!(
            "task {:?} is {}; only pending or running tasks can be paused",
            task.id, task.state
        )));
    }
    let mut task = task.clone();
    task.set_state(TaskState::Paused, now)?;
    Ok(ControlPlan {
        task,
        runs: disarmed(runs, sending),
    })
}

/// Resume: runs go on at their cursor (not before now); fires due while paused count as missed
/// (judged by the misfire policy at the next fire step).
pub fn resume(task: &Task, runs: &BTreeMap<u32, Run>, now: u64) -> Result<ControlPlan, Refused> {
    if task.state != TaskState::Paused {
        return Err(Refused::Conflict(format!(
            "task {:?} is {}; only paused tasks can be resumed",
            task.id, task.state
        )));
    }
    let mut task = task.clone();
    let to = super::state_for(&task, !runs.is_empty());
    if to == TaskState::Completed {
        // Nothing left to do (its last run ended while it was paused, e.g. a cron at its
        // `max_runs`): it completes, by way of pending, as the transition table says.
        task.set_state(TaskState::Pending, now)?;
    }
    task.set_state(to, now)?;
    task.watched_since_ms = now;
    let runs = runs
        .values()
        .map(|r| {
            let mut r = r.clone();
            r.next_at_ms = Some(r.next_at_ms.unwrap_or(now).max(now));
            r
        })
        .collect();
    Ok(ControlPlan { task, runs })
}

/// Trigger ("send now"): a new run starts now; for a one-shot it replaces the scheduled time.
pub fn trigger(task: &Task, now: u64) -> Result<ControlPlan, Refused> {
    match task.state {
        TaskState::Pending => {}
        TaskState::Running if task.overlap == Overlap::Allow => {}
        s => {
            return Err(Refused::Conflict(format!(
                "task {:?} is {s}; trigger needs a pending task (or overlap allow)",
                task.id
            )))
        }
    }
    let mut task = task.clone();
    task.fires += 1;
    let run_no = task.fires;
    if task.schedule.is_one_shot() {
        task.last_fire_ms = Some(now);
    }
    let run = start_run(&mut task, run_no, now, now);
    task.next_fire_at_ms = next_fire(&task, now);
    task.set_state(TaskState::Running, now)?;
    Ok(ControlPlan {
        task,
        runs: vec![run],
    })
}

/// What one attempt of a failure-list retry leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryPlan {
    /// Delivered: the entry leaves the failure list.
    Resolved(Failure),
    /// Failed, retries left: save and try again at `at`.
    Again { failure: Failure, at: u64 },
    /// Failed for good (or out of retries): save, alert; it stays in the list.
    GaveUp(Failure),
}

/// Settles one attempt of a failure-list retry: the same retry rule as a run's (`Run::settle`:
/// retryable outcomes are retried while attempts remain, honouring `Retry-After`), counted in
/// the entry's `retries`. `delay_ms(n)` is the backoff before retry `n + 1`. A `Held` outcome
/// (local resource shortage) never reaches here: it burns no attempt and is simply tried again.
pub fn failure_retry(
    f: &Failure,
    outcome: Outcome,
    max_attempts: u32,
    delay_ms: impl Fn(u32) -> u64,
    now: u64,
) -> RetryPlan {
    let mut f = f.clone();
    f.attempts += 1;
    f.retries += 1;
    match outcome {
        Outcome::Sent => return RetryPlan::Resolved(f),
        Outcome::Retry {
            error,
            not_before_ms,
        } => {
            f.last_error = error;
            f.failed_at_ms = now;
            if f.retries < max_attempts {
                let at = now
                    .saturating_add(delay_ms(f.retries))
                    .max(not_before_ms.unwrap_or(0));
                return RetryPlan::Again { failure: f, at };
            }
        }
        Outcome::Permanent { error } | Outcome::Held { error, .. } => {
            f.last_error = error;
            f.failed_at_ms = now;
        }
    }
    f.retrying = false;
    RetryPlan::GaveUp(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Context, Limits, TaskRequest};

    const NOW: u64 = 1_796_083_200_000;

    fn task(v: serde_json::Value) -> Task {
        let req: TaskRequest = serde_json::from_value(v).unwrap();
        req.into_task(&Context {
            now_ms: NOW,
            limits: &Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap()
        .0
    }

    #[test]
    fn a_reloaded_run_resends_only_what_may_have_left() {
        let mut r = Run::new(1, NOW, NOW, 3);
        r.in_flight = Some(1);
        r.next_at_ms = Some(NOW + 5_000);
        let (back, resend) = reload_run(r.clone(), NOW);
        assert!(!resend, "armed for later: it cannot have been sent");
        assert_eq!(back.in_flight, None);
        r.next_at_ms = Some(NOW - 10);
        let (back, resend) = reload_run(r, NOW);
        assert!(resend);
        assert_eq!((back.in_flight, back.next_at_ms), (None, Some(NOW)));
    }

    #[test]
    fn a_running_task_with_nothing_active_starts_its_queued_fire_or_settles_its_state() {
        let mut t =
            task(serde_json::json!({"schedule": {"cron": "* * * * *"}, "to": ["a"], "body": "b"}));
        t.state = TaskState::Running;
        t.queued = vec![(7, NOW)];
        let p = recover_running(&t, 0, NOW + 1).unwrap();
        assert!(p.write);
        assert_eq!(p.started.as_ref().map(|r| r.run), Some(7));
        assert_eq!(p.task.state, TaskState::Running);
        assert!(p.task.queued.is_empty());
        // Nothing queued, nothing active: back to pending (it has a next fire).
        t.queued.clear();
        let p = recover_running(&t, 0, NOW + 1).unwrap();
        assert!(p.write && p.started.is_none());
        assert_eq!(p.task.state, TaskState::Pending);
        // A run still active: nothing to change.
        let p = recover_running(&t, 1, NOW + 1).unwrap();
        assert!(!p.write);
    }

    #[test]
    fn a_fire_due_while_watching_runs_however_late() {
        let t = task(
            serde_json::json!({"schedule": {"after": "1m"}, "misfire": "skip",
            "misfire_grace": "1s", "to": ["a"], "body": "b"}),
        );
        let due = NOW + 60_000;
        // Handled an hour late (a wall-clock jump, a backlog): not missed.
        let p = fire(&t, 0, due, due + 3_600_000, NOW).unwrap();
        assert_eq!((p.missed, p.started.len(), p.not_started.len()), (0, 1, 0));
        assert_eq!(p.started[0].in_flight, Some(0), "armed in the same write");
        // Due before herald came back (boot after the due time): missed by 2.5 s, grace 1 s.
        let p = fire(&t, 0, due, due + 2_600, due + 2_500).unwrap();
        assert_eq!((p.missed, p.started.len()), (1, 0));
        assert_eq!(p.not_started[0].state, RunState::Expired);
        assert_eq!(p.task.state, TaskState::Completed);
    }

    #[test]
    fn settle_is_o1_and_arms_the_next_attempt_when_due_soon() {
        let mut t = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a", "b", "c"], "body": "b", "pacing": {"interval": "50ms"}}));
        let p = fire(&t, 0, NOW, NOW, NOW).unwrap();
        t = p.task;
        let run = p.started[0].clone();
        let a = Attempt {
            outcome: Outcome::Sent,
            max_attempts: 3,
            retry_delay_ms: 1_000,
            pacing: t.pacing,
            to: "a",
            channel: "log",
        };
        let s = settle(&t, &run, false, a, NOW + 1, 100).unwrap();
        assert!(!s.finished);
        assert_eq!((s.run.cursor, s.run.in_flight), (1, Some(1)));
        assert_eq!(s.task.state, TaskState::Running);
    }

    #[test]
    fn failure_retries_follow_the_run_rule() {
        let f = Failure {
            id: "t:1:0".into(),
            task_id: "t".into(),
            run: 1,
            seq: 0,
            to: "a".into(),
            channel: "hook".into(),
            attempts: 3,
            last_error: "HTTP 500".into(),
            failed_at_ms: NOW,
            retrying: true,
            retries: 0,
        };
        let retry = |e: &str, nb| Outcome::Retry {
            error: e.into(),
            not_before_ms: nb,
        };
        match failure_retry(&f, retry("HTTP 503", Some(NOW + 9_000)), 2, |_| 1_000, NOW) {
            RetryPlan::Again { failure, at } => {
                assert_eq!((failure.attempts, failure.retries, at), (4, 1, NOW + 9_000));
                match failure_retry(&failure, retry("HTTP 500", None), 2, |_| 1_000, at) {
                    RetryPlan::GaveUp(g) => assert!(!g.retrying && g.retries == 2),
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            failure_retry(&f, Outcome::Sent, 2, |_| 0, NOW),
            RetryPlan::Resolved(_)
        ));
        assert!(matches!(
            failure_retry(
                &f,
                Outcome::Permanent {
                    error: "HTTP 400".into()
                },
                5,
                |_| 0,
                NOW
            ),
            RetryPlan::GaveUp(_)
        ));
    }

    #[test]
    fn control_plans() {
        let t =
            task(serde_json::json!({"schedule": {"after": "0s"}, "to": ["a", "b"], "body": "b"}));
        let p = fire(&t, 0, NOW, NOW, NOW).unwrap();
        let runs: BTreeMap<u32, Run> = p.started.iter().map(|r| (r.run, r.clone())).collect();
        let none = BTreeSet::new();
        // Pause gives the armed attempt back; resume continues at the cursor.
        let paused = pause(&p.task, &runs, &none, NOW + 1).unwrap();
        assert_eq!(paused.task.state, TaskState::Paused);
        assert_eq!(
            (paused.runs[0].in_flight, paused.runs[0].attempts),
            (None, 0)
        );
        let again: BTreeMap<u32, Run> = paused.runs.iter().map(|r| (r.run, r.clone())).collect();
        let resumed = resume(&paused.task, &again, NOW + 5).unwrap();
        assert_eq!(resumed.task.state, TaskState::Running);
        assert_eq!(resumed.task.watched_since_ms, NOW + 5);
        assert_eq!(resumed.runs[0].next_at_ms, Some(NOW + 5));
        // A sending run keeps its attempt when cancelled.
        let sending: BTreeSet<u32> = runs.keys().copied().collect();
        let c = cancel(&p.task, &runs, &sending, NOW + 2).unwrap();
        assert_eq!(c.task.state, TaskState::Cancelled);
        assert_eq!(c.runs[0].state, RunState::Cancelled);
        assert_eq!(c.runs[0].in_flight, Some(0));
        assert!(matches!(
            cancel(&c.task, &runs, &none, NOW + 3),
            Err(Refused::Conflict(_))
        ));
        assert!(matches!(
            resume(&p.task, &runs, NOW),
            Err(Refused::Conflict(_))
        ));
        // A paused task with nothing left completes on resume (found by simulation seed 1018).
        let mut done = paused.task.clone();
        done.next_fire_at_ms = None;
        let r = resume(&done, &BTreeMap::new(), NOW + 6).unwrap();
        assert_eq!(r.task.state, TaskState::Completed);
        // Trigger on a pending task starts a new run now.
        let tr = trigger(&t, NOW + 7).unwrap();
        assert_eq!((tr.runs[0].run, tr.runs[0].scheduled_at_ms), (1, NOW + 7));
    }
}
