//! The engine's decisions, as pure functions: from a task's spec and progress, an event and
//! `now` to a plan, and from the plan to one [`Change`] (the records to write, the runs to put on the
//! wheel, the failure to list). No IO, no clock, no locks: `commit.rs` carries a change out
//! (write it durably, then change memory and the wheel), and the seeded simulation in
//! `tests/simulation.rs` drives these functions through the real engine on a manual clock.
//!
//! Invariant: a plan borrows the task's spec (`&TaskSpec`, shared in memory as an `Arc`) and
//! never copies it; it clones the small progress it changes and returns it in the plan.
use std::collections::{BTreeMap, BTreeSet};

use crate::model::Schedule;
use crate::model::{
    delivery_key, Failure, InvalidTransition, Outcome, Overlap, Pacing, Queued, Run, RunState,
    TaskProgress, TaskSpec, TaskState,
};
use crate::schedule::backfill::Slot;
use crate::schedule::misfire::{
    judge_outage, judge_started, Decision, Expiry, Rest, MISSED_COUNT_MAX, MISSED_LIST_MAX,
};
use crate::schedule::plan::{last_slot_sharing_of, mark_slot_fired_of, may_run_more, next_slot_of};
use crate::schedule::{mark_fired_of, next_fire_of};

use super::change::{Change, WheelOp};
use super::derive_state;
use crate::model::timeline::{TimelineEvent, TimelineKind};
use crate::schedule::format_utc;
use serde_json::json;

/// Expired fires recorded one by one per fire step; more are only counted (a year-long outage
/// of a per-minute cron must not write half a million records).
pub const EXPIRED_RECORDS_MAX: usize = 100;

/// What a fire step does.
#[derive(Debug, Clone)]
pub struct FirePlan {
    /// The task's progress after the fire(s): counters, next fire, state.
    pub progress: TaskProgress,
    /// Records of fires that did not start a run (skipped, expired), with their reasons.
    pub not_started: Vec<Run>,
    /// Runs started now, their first attempt armed (in-flight mark set): written with the
    /// task, then put on the wheel at their due instant.
    pub started: Vec<Run>,
    /// How many of the handled fires were missed (herald down or the task paused).
    pub missed: usize,
    /// Why each expired run of `not_started` expired, by run number ([`Change::expired_why`]).
    pub expired_why: Vec<(u32, Expiry)>,
}

impl FirePlan {
    /// The change: the new runs (started ones armed, straight to their send at the instant)
    /// and the fires that did not start, the task, and the oldest history beyond `runs_max`
    /// trimmed (the store skips a run still running, and deletes at most `store::TRIM_MAX`).
    pub fn change(self, runs_max: Option<u32>) -> Change {
        let trim_runs_below = runs_max
            .filter(|max| self.progress.fires > *max)
            .map(|max| self.progress.fires - max + 1);
        let wheel = self.started.iter().map(|r| WheelOp::Step(r.run)).collect();
        let timeline = fire_events(&self.not_started, &self.started);
        let mut runs = self.not_started;
        runs.extend(self.started);
        Change {
            progress: Some(self.progress),
            runs,
            trim_runs_below,
            wheel,
            timeline,
            expired_why: self.expired_why,
            ..Change::default()
        }
    }
}

/// The timeline of a fire step: `fired` for each run started, `skipped` or `expired` (with
/// the run's reason) for each fire that did not start one, or run that ended so (at its end:
/// a run that had started and expired at a resume or a start-up ends then).
pub fn fire_events(not_started: &[Run], started: &[Run]) -> Vec<TimelineEvent> {
    let mut out = Vec::with_capacity(not_started.len() + started.len());
    for r in not_started {
        let kind = match r.state {
            RunState::Expired => TimelineKind::Expired,
            _ => TimelineKind::Skipped,
        };
        let at = r.finished_at_ms.unwrap_or(r.started_at_ms);
        out.push(
            TimelineEvent::run(kind, at, r.run, None).with_detail(json!({
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
    if let Outcome::Held { until_ms, why, .. } = outcome {
        return vec![TimelineEvent::held(now, run, seq, *until_ms, *why)];
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
/// own backlog): it runs. A forward wall-clock jump is the exception (issue 26): the fires it
/// jumped over are judged like an outage's, watched from the jump's end with its size added
/// to the grace ([`fire_with_grace`], called by `step.rs`).
pub fn fire(
    spec: &TaskSpec,
    progress: &TaskProgress,
    active_runs: usize,
    due: u64,
    now: u64,
    watched_ms: u64,
) -> Result<FirePlan, InvalidTransition> {
    let grace_ms = spec.misfire_grace_ms;
    fire_with_grace(spec, progress, active_runs, due, now, watched_ms, grace_ms)
}

/// [`fire`], with missed fires judged against `grace_ms` instead of the task's own grace (a
/// wall-clock jump adds its size to it: the jumped span is not lateness).
pub fn fire_with_grace(
    spec: &TaskSpec,
    progress: &TaskProgress,
    active_runs: usize,
    due: u64,
    now: u64,
    watched_ms: u64,
    grace_ms: u64,
) -> Result<FirePlan, InvalidTransition> {
    let mut progress = progress.clone();
    let total = spec.message_count;
    let (decisions, missed) = decide(spec, &progress, due, now, watched_ms, grace_ms);

    let mut not_started = Vec::new();
    let mut expired_why = Vec::new();
    let mut started: Vec<Run> = Vec::new();
    let mut expired_recorded = 0usize;
    for d in decisions {
        let run_no = progress.fires.saturating_add(1);
        match d {
            Decision::Expire((t, wall), why) => {
                mark_slot_fired_of(spec, &mut progress, t, wall);
                progress.expired += 1;
                if expired_recorded < EXPIRED_RECORDS_MAX {
                    expired_recorded += 1;
                    let state = RunState::Expired;
                    let wall = progress.last_slot_wall_ms;
                    let run = Run::not_started(run_no, t, now, total, state, why.reason());
                    not_started.push(run.of_slot(wall));
                    expired_why.push((run_no, why));
                }
            }
            Decision::SkipUnlisted(n) => {
                // Fires of the outage beyond the listed ones: counted, not recorded (misfire.rs).
                // The last fire and slot are the rest's last, whose decision follows and sets
                // them (with the wall it was listed with: the fires between are not walked).
                let n = u32::try_from(n).unwrap_or(u32::MAX);
                progress.fires = progress.fires.saturating_add(n);
                progress.skipped = progress.skipped.saturating_add(n);
            }
            Decision::Skip((t, wall), why) => {
                mark_slot_fired_of(spec, &mut progress, t, wall);
                let wall = progress.last_slot_wall_ms;
                not_started.push(skip(spec, &mut progress, run_no, (t, wall), now, why));
            }
            Decision::Run(t) => {
                let started_any = !started.is_empty();
                match place(
                    spec,
                    &mut progress,
                    active_runs,
                    started_any,
                    run_no,
                    t,
                    now,
                ) {
                    Placed::Started(r) => started.push(r),
                    Placed::NotStarted(r) => not_started.push(r),
                    Placed::Queued => {}
                }
            }
        }
    }
    progress.next_fire_at_ms = next_fire_of(spec, &progress, now);
    let to = finished_as(
        spec,
        &progress,
        derive_state(&progress, active_runs > 0 || !started.is_empty()),
    );
    progress.set_state(to, now)?;
    // Arm the first attempt of each new run in the same durable write.
    for r in &mut started {
        r.begin_attempt(now);
    }
    Ok(FirePlan {
        progress,
        not_started,
        started,
        missed,
        expired_why,
    })
}

/// A fire as the engine judges it: its instant and, for a cron in recipient time, its slot's
/// wall (`None`: worked out when it is marked fired, `schedule::plan::mark_slot_fired_of`).
type Fire = (u64, Option<u64>);

/// The fires a due time stands for, and what each leads to: just `due` when herald was
/// watching then; else the fires missed while it was not, judged by the misfire policy as one
/// outage, each with its slot's wall as the walk over them found it. Also returns how many
/// were missed.
///
/// A step lists at most `MISSED_LIST_MAX` fires. Expired ones are judged each on its own, so a
/// long stretch of them is left to the next steps, each listing the next ones; but the fires
/// within the grace are judged together, in one step: when they do not fit in its list, that
/// list starts at the first of them and the rest are counted (`count_rest`), never listed.
fn decide(
    spec: &TaskSpec,
    progress: &TaskProgress,
    due: u64,
    now: u64,
    watched_ms: u64,
    grace_ms: u64,
) -> (Vec<Decision<Fire>>, usize) {
    if due >= watched_ms {
        return (vec![Decision::Run((due, None))], 0);
    }
    let (mut missed, probe, more) = list_missed(spec, progress, due, now, watched_ms);
    // Missed by more than the grace (misfire.rs: lateness up to `watched_ms`): expired.
    let expire_before = watched_ms.saturating_sub(grace_ms);
    let mut rest = None;
    if let Some(next) = more {
        let expired = missed.iter().take_while(|f| f.0 < expire_before).count();
        if expired > 0 {
            // The expired ones only: the next step lists the others from the first.
            missed.truncate(expired);
        } else {
            let cap = MISSED_COUNT_MAX;
            rest = Some(count_rest(spec, probe, next, now, watched_ms, cap));
        }
    }
    let counted = rest.map_or(0, |r| usize::try_from(r.count).unwrap_or(usize::MAX));
    let n = missed.len().saturating_add(counted);
    let decisions = judge_outage(spec.misfire, grace_ms, &missed, rest, watched_ms);
    (decisions, n)
}

/// The fires missed before `watched_ms` from `due` on, at most `MISSED_LIST_MAX`, each with
/// its slot's wall; the progress with them handled; and the next missed fire after them, if
/// any.
fn list_missed(
    spec: &TaskSpec,
    progress: &TaskProgress,
    due: u64,
    now: u64,
    watched_ms: u64,
) -> (Vec<Fire>, TaskProgress, Option<u64>) {
    let mut probe = progress.clone();
    mark_fired_of(spec, &mut probe, due);
    let mut missed = vec![(due, probe.last_slot_wall_ms)];
    loop {
        match next_missed(spec, &probe, now, watched_ms) {
            Some(n) if missed.len() < MISSED_LIST_MAX => {
                mark_fired_of(spec, &mut probe, n);
                missed.push((n, probe.last_slot_wall_ms));
            }
            more => return (missed, probe, more),
        }
    }
}

/// The next fire after those `probe` has handled, if it was missed (due before `watched_ms`).
fn next_missed(spec: &TaskSpec, probe: &TaskProgress, now: u64, watched_ms: u64) -> Option<u64> {
    next_fire_of(spec, probe, now).filter(|n| *n < watched_ms)
}

/// The rest of an outage from `first`, a missed fire after the listed ones: counted one by one
/// up to `cap`, then straight to the latest missed fire ([`latest_missed`]), the ones between
/// skipped over uncounted (a bound on one step's work). Its last fire carries its slot's wall:
/// the decision on it sets it, as nothing walks the fires before it again.
fn count_rest(
    spec: &TaskSpec,
    mut probe: TaskProgress,
    first: u64,
    now: u64,
    watched_ms: u64,
    cap: u64,
) -> Rest<Fire> {
    mark_fired_of(spec, &mut probe, first);
    let mut rest = Rest {
        count: 1,
        last: (first, probe.last_slot_wall_ms),
    };
    while let Some(n) = next_missed(spec, &probe, now, watched_ms) {
        rest.count = rest.count.saturating_add(1);
        if rest.count > cap {
            rest.last = latest_missed(spec, &mut probe, n, now, watched_ms);
            break;
        }
        mark_fired_of(spec, &mut probe, n);
        rest.last = (n, probe.last_slot_wall_ms);
    }
    rest
}

/// The latest fire due before `watched_ms`, `missed` being one, in ~40 searches whatever the
/// schedule's frequency: a bisection over the instant the next fire is searched after (the
/// next fire after `x` never decreases with `x`). With its slot's wall in recipient time: the
/// last slot of its instant, as all slots sharing it (a gap of the earliest zone) are missed;
/// the first of them would leave the others to fire again (review finding).
fn latest_missed(
    spec: &TaskSpec,
    probe: &mut TaskProgress,
    missed: u64,
    now: u64,
    watched_ms: u64,
) -> Fire {
    let mut after = |x: u64| {
        probe.last_fire_ms = Some(x);
        // Not a slot's instant: the next slot is the first after it (no wall to go on from).
        probe.last_slot_wall_ms = None;
        next_slot_of(spec, probe, now).filter(|(n, _)| *n < watched_ms)
    };
    // A missed fire comes after `lo`, none after `hi`.
    let (mut lo, mut hi) = (missed.saturating_sub(1), watched_ms.saturating_sub(1));
    while hi.saturating_sub(lo) > 1 {
        let mid = lo + (hi - lo) / 2;
        if after(mid).is_some() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    match after(lo) {
        Some((at, first)) => (
            at,
            first.map(|w| last_slot_sharing_of(spec, w).unwrap_or(w)),
        ),
        None => (missed, None),
    }
}

/// Where a fire that is to run goes.
enum Placed {
    Started(Run),
    /// Recorded as not started (skipped: `max_runs`, or the overlap policy).
    NotStarted(Run),
    /// Waits behind the run already sending.
    Queued,
}

/// Places the fire at `t` (with its slot's wall, when known) as run `run_no`: started now,
/// skipped, or queued behind a run in progress (`started_any`: this fire's catch-up started one
/// already).
fn place(
    spec: &TaskSpec,
    progress: &mut TaskProgress,
    active_runs: usize,
    started_any: bool,
    run_no: u32,
    (t, wall): Fire,
    now: u64,
) -> Placed {
    mark_slot_fired_of(spec, progress, t, wall);
    let fire = (t, progress.last_slot_wall_ms);
    if !may_run_more(spec, progress) {
        let why = "max_runs reached".into();
        return Placed::NotStarted(skip(spec, progress, run_no, fire, now, why));
    }
    // In recipient time a slot's run spans its zones (a day and more for a daily
    // cron around the world): the next slot's run goes beside it, never an overlap.
    let others = active_runs > 0 && spec.recipient_zones.is_empty();
    let busy = others || started_any;
    if busy && spec.overlap != Overlap::Allow {
        // Misfire catch-up (several runs from one outage) queues behind the first
        // whatever the policy; a regular fire follows the overlap policy.
        let catching_up = started_any;
        if catching_up || (spec.overlap == Overlap::Queue && progress.queued.is_empty()) {
            progress.queued.push(Queued {
                run: run_no,
                at_ms: t,
                wall_ms: fire.1,
            });
            return Placed::Queued;
        }
        let why = if spec.overlap == Overlap::Queue {
            "overlap queue: a run is already waiting".to_string()
        } else {
            "overlap skip: the previous run was still sending".to_string()
        };
        return Placed::NotStarted(skip(spec, progress, run_no, fire, now, why));
    }
    Placed::Started(start_run(spec, progress, run_no, fire, now))
}

/// Whether the head of the task's queue (a fire of the slot at `head_at_ms`: backfill's runs,
/// a `misfire: fire_all` catch-up) may start now; `earliest_active`: the earliest slot instant
/// (`Run::scheduled_at_ms`) of the task's active runs, `None` when none is active.
///
/// Any active run holds the queue, except in recipient time (`recipient.rs`): there a run lasts
/// until its last zone's wall time and the schedule's next runs start beside it (an hourly cron
/// over Berlin and New York has about six active at any time), so "nothing active" would hold
/// the queue for as long as the schedule fires. There only a run of an earlier slot, or of the
/// head's own instant (slots tied in a DST gap of the earliest zone), holds it; the schedule's
/// newer runs do not. Fires are queued in slot order, so each still waits for the run of the
/// one before it (queued runs never overlap one another), and the wait is bounded: a
/// recipient-time run ends within about `recipient::SPAN_MS` of its slot, plus its retries.
pub fn queue_head_may_start(
    spec: &TaskSpec,
    head_at_ms: u64,
    earliest_active: Option<u64>,
) -> bool {
    match earliest_active {
        None => true,
        Some(at) => !spec.recipient_zones.is_empty() && at > head_at_ms,
    }
}

/// The earliest slot instant of `runs` (the task's active runs): what [`queue_head_may_start`]
/// judges by.
pub fn earliest_slot<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Option<u64> {
    runs.into_iter().map(|r| r.scheduled_at_ms).min()
}

/// Whether the queue's head may start beside the active runs (`earliest_active`).
fn head_free(spec: &TaskSpec, progress: &TaskProgress, earliest_active: Option<u64>) -> bool {
    progress
        .queued
        .first()
        .is_some_and(|q| queue_head_may_start(spec, q.at_ms, earliest_active))
}

/// A one-shot or reminders task that would complete without having sent anything because its
/// every fire expired ends `expired` instead, so a client can tell it from one that was sent
/// (and re-arm it). Every other state passes through.
///
/// "Every fire expired" (API.md "Expired"): none ran (`runs`: an expired run is given back)
/// and none was skipped (by the misfire policy `skip`, coalesced, an overlap): a task whose
/// policy skipped some of its fires ended as its policy said, `completed`, even if the others
/// expired. Each handled fire is counted once in `runs`, `skipped`, `expired` or `queued`.
pub fn finished_as(spec: &TaskSpec, progress: &TaskProgress, to: TaskState) -> TaskState {
    let once = matches!(
        spec.schedule,
        Schedule::At { .. } | Schedule::After { .. } | Schedule::Reminders { .. }
    );
    let every_fire_expired = progress.runs == 0 && progress.skipped == 0 && progress.expired > 0;
    if to == TaskState::Completed && once && every_fire_expired {
        TaskState::Expired
    } else {
        to
    }
}

/// Whether `r`'s first message has not been sent yet: nothing settled, and at most the one
/// attempt that was armed (an attempt that failed and is being retried has started its send).
fn first_send_pending(r: &Run) -> bool {
    r.state == RunState::Running
        && r.cursor == 0
        && r.sent == 0
        && r.failed == 0
        && (r.attempts == 0 || (r.attempts == 1 && r.in_flight == Some(0)))
}

/// A reminder's run whose first message would go only at or after the event it reminds of
/// (held by quiet hours or a rate limit's backlog, late within the grace after an outage)
/// expires instead of being sent: "5 minutes left" after the class began misleads, and
/// `{{minutes_left}}` would read 0. Only a reminder's own slot (before the event) of a task
/// made before its event: a trigger after it ("send now") and a task made after its event
/// (API.md: a reminder within the grace fires at once) are sent as asked. The change (the run
/// expired, the task's state derived again, a queued fire started) or `None` when the run
/// goes on. `active`: the task's active runs, this one among them.
pub fn expire_after_event(
    spec: &TaskSpec,
    progress: &TaskProgress,
    r: &Run,
    active: &BTreeMap<u32, Run>,
    now: u64,
) -> Result<Option<Change>, InvalidTransition> {
    let Schedule::Reminders { event_ms, .. } = &spec.schedule else {
        return Ok(None);
    };
    let slot = r.scheduled_at_ms < *event_ms && spec.created_at_ms < *event_ms;
    if now < *event_ms || !slot || !first_send_pending(r) {
        return Ok(None);
    }
    let mut t = progress.clone();
    let why = Expiry::EventBegan {
        event_ms: *event_ms,
    };
    let e = expired_run(&mut t, r, now, why);
    let others = earliest_slot(active.values().filter(|o| o.run != r.run));
    let p = recover_running(spec, &t, others, now)?;
    let mut c = p.change();
    c.progress = c.progress.or(Some(t));
    c.timeline = fire_events(std::slice::from_ref(&e), &c.runs);
    c.wheel = c.runs.iter().map(|r| WheelOp::Step(r.run)).collect();
    c.expired_why.push((e.run, why));
    c.runs.insert(0, e);
    Ok(Some(c))
}

/// Judges a started run whose first message has not left, when herald watches its task again
/// at `watched_ms` (start-up after an outage, resume): if that send would now start more than
/// `misfire_grace` after the later of the run's instant and the instant it was planned for as
/// written (`next_at`: a quiet-hours hold's end, a queued run's start, the pause), the run
/// expires (it turns from a run into an expired fire: `runs` gives it back, `expired` counts
/// it). Herald's own lateness while it watched is never counted (`judge_started`). `send_ms`:
/// when the send would start. The run record to write and why, or `None` when it goes on.
pub fn expire_started(
    spec: &TaskSpec,
    progress: &mut TaskProgress,
    r: &Run,
    send_ms: u64,
    watched_ms: u64,
    now: u64,
) -> Option<(Run, Expiry)> {
    if !first_send_pending(r) {
        return None;
    }
    let why = judge_started(
        r.scheduled_at_ms,
        r.next_at_ms.unwrap_or(r.scheduled_at_ms),
        send_ms,
        watched_ms,
        spec.misfire_grace_ms,
    )?;
    Some((expired_run(progress, r, now, why), why))
}

/// A started run whose first message never left, turned into an expired fire with its
/// reason: `progress` counts it expired, no longer a run.
fn expired_run(progress: &mut TaskProgress, r: &Run, now: u64, why: Expiry) -> Run {
    let mut r = r.clone();
    r.disarm();
    r.attempts = 0;
    r.state = RunState::Expired;
    r.finished_at_ms = Some(now);
    r.next_at_ms = None;
    r.reason = Some(why.reason());
    progress.runs = progress.runs.saturating_sub(1);
    progress.expired += 1;
    r
}

/// Start-up's judgement of a task's runs read back from the store (`watched_ms`: boot): each
/// started run whose first message would now be sent later than its grace after its instant
/// expires (the grace defect of issue 28: a one-shot armed 2 s ahead, herald down over its
/// instant, was sent at restart however late). The task (counters) and the expired runs; the
/// caller reloads the others with [`reload_run`] and then derives the state with
/// [`recover_running`] over the runs left (which also starts a queued fire that waited for
/// an expired run).
///
/// `alive_ms`: the last process's last life sign (`engine/alive.rs`; 0 if none). It watched
/// these runs until then, so, as a pause writes, a run's plan counts as not before it: a send
/// waiting in a rate limit's backlog when the process died is judged on the outage alone,
/// not on the backlog's wait before it.
pub fn recover_started(
    spec: &TaskSpec,
    progress: &TaskProgress,
    runs: &[Run],
    now: u64,
    watched_ms: u64,
    alive_ms: u64,
) -> (TaskProgress, Vec<(Run, Expiry)>) {
    let mut t = progress.clone();
    let mut expired = Vec::new();
    for r in runs {
        let send_ms = r.next_at_ms.unwrap_or(now).max(now);
        let seen = Run {
            next_at_ms: Some(r.next_at_ms.unwrap_or(r.scheduled_at_ms).max(alive_ms)),
            ..r.clone()
        };
        if let Some(e) = expire_started(spec, &mut t, &seen, send_ms, watched_ms, now) {
            expired.push(e);
        }
    }
    (t, expired)
}

/// `fire`: its instant and, in recipient time, its slot's wall (`Run::slot_wall_ms`).
fn skip(
    spec: &TaskSpec,
    progress: &mut TaskProgress,
    run_no: u32,
    fire: (u64, Option<u64>),
    now: u64,
    why: String,
) -> Run {
    progress.skipped += 1;
    let (t, wall) = fire;
    Run::not_started(run_no, t, now, spec.message_count, RunState::Skipped, why).of_slot(wall)
}

/// A new run of `task` for the fire at `fire.0` (run number already allocated by
/// `mark_fired`); `fire.1`: in recipient time, its slot's wall (`Run::slot_wall_ms`), so its
/// messages wait for that slot's time even when another slot shares its instant.
pub fn start_run(
    spec: &TaskSpec,
    progress: &mut TaskProgress,
    run_no: u32,
    fire: (u64, Option<u64>),
    now: u64,
) -> Run {
    progress.runs += 1;
    let (t, wall) = fire;
    Run::new(run_no, t, now, spec.message_count).of_slot(wall)
}

/// A queued fire as `start_run`/`skip` take it.
fn fire_of(q: Queued) -> (u32, (u64, Option<u64>)) {
    (q.run, (q.at_ms, q.wall_ms))
}

/// A run read back from the store by a process that is not sending it (start-up, or a reload
/// after a failed write): its in-flight mark is an attempt that was interrupted. Armed for an
/// instant still to come, it cannot have been sent (sends start at their instant), so the
/// attempt is given back; otherwise nobody knows whether the channel got it, and it is sent
/// again now (or at its instant, or at `not_before` when that is later: cluster mode's wait,
/// [`inherited_not_before`]), with the next attempt number and the same key. Second value:
/// whether it is a resend.
pub fn reload_run(mut r: Run, now: u64, not_before: Option<u64>) -> (Run, bool) {
    match (r.in_flight, r.next_at_ms) {
        (Some(_), Some(at)) if at > now => {
            r.disarm();
            (r, false)
        }
        (Some(_), _) => {
            r.in_flight = None;
            let at = r.next_at_ms.unwrap_or(now).max(now);
            r.next_at_ms = Some(not_before.map_or(at, |nb| at.max(nb)));
            (r, true)
        }
        (None, _) => (r, false),
    }
}

/// Cluster mode (HA.md "The send itself"): the earliest instant at which a node that inherits
/// `r`'s in-flight mark may send it again, so that its attempt never overlaps the one the
/// previous owner may still have had under way: the claim (`last_attempt_at_ms`, written
/// with the mark) or the instant the attempt was due, whichever is later (a mark is claimed
/// ahead of its instant and the send starts at the instant), plus the channel's send timeout
/// (`send_timeout_ms`, the attempt's own bound). Both instants are the claiming node's wall
/// clock and `now` is this node's: each is within `max_clock_offset_ms` of the database's, so
/// twice that is added to make it hold in database time. `None`: nothing in flight.
pub fn inherited_not_before(
    r: &Run,
    send_timeout_ms: u64,
    max_clock_offset_ms: u64,
) -> Option<u64> {
    r.in_flight?;
    let started = r.last_attempt_at_ms.max(r.next_at_ms)?;
    Some(
        started
            .saturating_add(send_timeout_ms)
            .saturating_add(max_clock_offset_ms.saturating_mul(2)),
    )
}

/// What start-up does with a task that was running: the task to write (if it changed) and a
/// run to start.
#[derive(Debug, Clone)]
pub struct RecoverPlan {
    /// The task's progress after start-up's judgement.
    pub progress: TaskProgress,
    /// Write `progress` (and `started`): something changed.
    pub write: bool,
    /// A fire that was queued behind a run that has since finished: its run starts now.
    pub started: Option<Run>,
}

impl RecoverPlan {
    pub fn change(self) -> Change {
        if !self.write {
            return Change::default();
        }
        // A queued fire that starts here is on the timeline as a fire step's would be (it
        // had none: a run that started at a start-up with nothing expired showed no `fired`).
        let runs: Vec<Run> = self.started.into_iter().collect();
        Change {
            progress: Some(self.progress),
            timeline: fire_events(&[], &runs),
            runs,
            ..Change::default()
        }
    }
}

/// Start-up of a task whose live entry says `running`, with its active runs (`earliest_active`:
/// the earliest of their slot instants, `None` if none): a queued fire whose run never started
/// (the crash fell between the end of one run and the start of the next) starts now if it may
/// ([`queue_head_may_start`]), and the state is derived again from what is active.
pub fn recover_running(
    spec: &TaskSpec,
    progress: &TaskProgress,
    earliest_active: Option<u64>,
    now: u64,
) -> Result<RecoverPlan, InvalidTransition> {
    let mut t = progress.clone();
    let mut started = None;
    if head_free(spec, &t, earliest_active) {
        let (n, fire) = fire_of(t.queued.remove(0));
        started = Some(start_run(spec, &mut t, n, fire, now));
    }
    let active = earliest_active.is_some() || started.is_some();
    let to = finished_as(spec, &t, derive_state(&t, active));
    let write = to != t.state || started.is_some();
    if to != t.state {
        t.set_state(to, now)?;
    }
    Ok(RecoverPlan {
        progress: t,
        write,
        started,
    })
}

/// Start-up of a running task after an outage: [`recover_started`] over its runs as they
/// are on disk (`raw`: before `reload_run` gave an interrupted attempt back), then
/// [`recover_running`] over the runs left. `active`: the task's active runs in memory;
/// `alive_ms`: the last process's last life sign (0 if none).
pub fn recover(
    spec: &TaskSpec,
    progress: &TaskProgress,
    raw: &[Run],
    active: &BTreeMap<u32, Run>,
    now: u64,
    boot_ms: u64,
    alive_ms: u64,
) -> Result<Change, InvalidTransition> {
    let watched = progress.watched_since_ms.max(boot_ms);
    let (t, expired) = recover_started(spec, progress, raw, now, watched, alive_ms);
    let left = active
        .values()
        .filter(|r| !expired.iter().any(|(e, _)| e.run == r.run));
    let p = recover_running(spec, &t, earliest_slot(left), now)?;
    if expired.is_empty() {
        return Ok(p.change());
    }
    let expired_why = expired.iter().map(|(e, why)| (e.run, *why)).collect();
    let mut runs: Vec<Run> = expired.into_iter().map(|(e, _)| e).collect();
    // On the timeline as a fire step's: each expired run, and the queued fire started after.
    let timeline = fire_events(&runs, p.started.as_slice());
    runs.extend(p.started);
    Ok(Change {
        progress: Some(p.progress),
        runs,
        timeline,
        expired_why,
        ..Change::default()
    })
}

/// What settling one attempt does.
#[derive(Debug, Clone)]
pub struct SettlePlan {
    /// The task's progress after the attempt (its state, a queued run started).
    pub progress: TaskProgress,
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
            progress: task_changed.then_some(self.progress),
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
/// `other_active`: the earliest slot instant of the task's active runs besides this one
/// (`None`: there are none), for [`queue_head_may_start`]. `arm_lead_ms`: a next attempt
/// due within this is armed in the same write; `None`: none is (a drain, or the task's shard
/// being handed over: no send starts here now, and a mark armed for it would be read by the
/// next boot, or the next owner, as a send cut short: sent as a later attempt, or waited out
/// as another node's; left pending, it goes as planned).
pub fn settle(
    spec: &TaskSpec,
    progress: &TaskProgress,
    run: &Run,
    other_active: Option<u64>,
    a: Attempt<'_>,
    now: u64,
    arm_lead_ms: Option<u64>,
) -> Result<SettlePlan, InvalidTransition> {
    let mut progress = progress.clone();
    let mut run = run.clone();
    let settled = run.settle(a.outcome, a.max_attempts, a.retry_delay_ms, &a.pacing, now);
    let failure = settled.gave_up.as_ref().map(|g| Failure {
        id: delivery_key(&spec.id, run.run, g.seq),
        task_id: spec.id.clone(),
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
    if progress.state.is_terminal() && run.state == RunState::Running {
        // The task ended (parked `failed`) while this send was out: the run ends with it, as
        // a cancel ends a sending run, so no `running` run outlives its task on disk.
        close(&mut run, &progress, now);
    }
    let finished = run.is_done() || run.state != RunState::Running;
    let armed_next = !finished
        && progress.state == TaskState::Running
        && arm_lead_ms.is_some_and(|lead| {
            settled
                .next_at_ms
                .is_some_and(|at| at.saturating_sub(lead) <= now)
        });
    if armed_next {
        // Due within `arm_lead_ms`: armed in this same write (a short interval then costs one
        // durable write per message, not two).
        run.begin_attempt(now);
    }
    let mut next_run = None;
    let queue_free = spec.overlap == Overlap::Allow && !progress.queued.is_empty();
    if finished
        && (queue_free || head_free(spec, &progress, other_active))
        && !progress.state.is_terminal()
    {
        // A queued fire starts when the run it waited for is done.
        let (n, fire) = fire_of(progress.queued.remove(0));
        next_run = Some(start_run(spec, &mut progress, n, fire, now));
    }
    let mut task_changed = next_run.is_some();
    if progress.state == TaskState::Running {
        let active = other_active.is_some() || !finished || next_run.is_some();
        let to = derive_state(&progress, active);
        // Only a new state is a change of the task: a cursor that moved is the run's.
        if to != progress.state {
            progress.set_state(to, now)?;
            task_changed = true;
        }
    }
    Ok(SettlePlan {
        progress,
        run,
        finished,
        next_run,
        failure,
        task_changed,
    })
}

/// Ends `run` with its finished task: cancelled, with the task's failure as its reason.
fn close(run: &mut Run, progress: &TaskProgress, now: u64) {
    run.state = RunState::Cancelled;
    run.finished_at_ms = Some(now);
    run.next_at_ms = None;
    if let Some(why) = &progress.failed_reason {
        run.reason = Some(format!("task failed: {why}"));
    }
}

/// The fires queued behind a run (their run numbers taken) of a task that ends: each recorded
/// as a fire that did not start a run (skipped, with `why`), so `GET /runs` has no gap.
fn drop_queued(spec: &TaskSpec, progress: &mut TaskProgress, why: &str, now: u64) -> Vec<Run> {
    std::mem::take(&mut progress.queued)
        .into_iter()
        .map(|q| {
            let (n, fire) = fire_of(q);
            skip(spec, progress, n, fire, now, why.to_string())
        })
        .collect()
}

/// What a control command (cancel, pause, resume, trigger) writes: the task and the runs
/// whose records change. Runs in state `Running` stay active; the others leave memory.
#[derive(Debug, Clone)]
pub struct ControlPlan {
    /// The task's progress after the command.
    pub progress: TaskProgress,
    pub runs: Vec<Run>,
    /// Why each expired run of `runs` expired (a resume), by run number
    /// ([`Change::expired_why`]).
    pub expired_why: Vec<(u32, Expiry)>,
}

impl ControlPlan {
    /// The change: the task and its runs written; the runs' steps follow the task's state
    /// (on the wheel while it runs, off it otherwise).
    pub fn change(self) -> Change {
        let op = if self.progress.state == TaskState::Running {
            WheelOp::Steps
        } else {
            WheelOp::DropSteps
        };
        // Queued fires a cancel dropped (`drop_queued`): `skipped`, as a fire step records
        // them; runs a resume expired (`expire_started`): `expired`, with their reason.
        let ended: Vec<Run> = (self.runs.iter())
            .filter(|r| matches!(r.state, RunState::Skipped | RunState::Expired))
            .cloned()
            .collect();
        Change {
            progress: Some(self.progress),
            timeline: fire_events(&ended, &[]),
            runs: self.runs,
            wheel: vec![op],
            expired_why: self.expired_why,
            ..Change::default()
        }
    }
}

/// Parks a task `failed` with `reason` (a bug or a corrupt record): its runs stop (a run
/// sending right now is settled when its send returns), its fire is dropped. `None`: the task
/// is finished already.
pub fn park(
    spec: &TaskSpec,
    progress: &TaskProgress,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    reason: &str,
    now: u64,
) -> Option<Change> {
    let mut progress = progress.clone();
    let to = progress.state.park().ok()?;
    progress.state = to;
    progress.updated_at_ms = now;
    progress.failed_reason = Some(reason.to_string());
    progress.next_fire_at_ms = None;
    let dropped = drop_queued(spec, &mut progress, &format!("task failed: {reason}"), now);
    let mut out: Vec<Run> = runs
        .values()
        .filter(|r| !sending.contains(&r.run))
        .map(|r| {
            let mut r = r.clone();
            r.disarm();
            close(&mut r, &progress, now);
            r
        })
        .collect();
    let timeline = fire_events(&dropped, &[]);
    out.extend(dropped);
    Some(Change {
        progress: Some(progress),
        runs: out,
        timeline,
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
    spec: &TaskSpec,
    progress: &TaskProgress,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    now: u64,
) -> Result<ControlPlan, Refused> {
    if progress.state.is_terminal() {
        return Err(Refused::Conflict(format!(
            "task {:?} is already {}",
            spec.id, progress.state
        )));
    }
    let mut progress = progress.clone();
    progress.set_state(TaskState::Cancelled, now)?;
    progress.next_fire_at_ms = None;
    let dropped = drop_queued(spec, &mut progress, "task cancelled", now);
    let mut out = disarmed(runs, sending);
    out.extend(runs.values().filter(|r| sending.contains(&r.run)).cloned());
    for r in &mut out {
        r.state = RunState::Cancelled;
        r.finished_at_ms = Some(now);
        r.next_at_ms = None;
    }
    out.extend(dropped);
    Ok(ControlPlan {
        progress,
        runs: out,
        expired_why: Vec::new(),
    })
}

/// Pause: nothing more is sent; armed attempts are given back; cursors stay. A run's next step
/// is written as not before the pause: herald watched it until then, so a send still waiting
/// (a rate limit's backlog) is judged at resume only for the pause's span (`expire_started`).
pub fn pause(
    spec: &TaskSpec,
    progress: &TaskProgress,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    now: u64,
) -> Result<ControlPlan, Refused> {
    if !matches!(progress.state, TaskState::Pending | TaskState::Running) {
        return Err(Refused::Conflict(format!(
            "task {:?} is {}; only pending or running tasks can be paused",
            spec.id, progress.state
        )));
    }
    let mut progress = progress.clone();
    progress.set_state(TaskState::Paused, now)?;
    let mut out = disarmed(runs, sending);
    for r in &mut out {
        r.next_at_ms = r.next_at_ms.map(|at| at.max(now));
    }
    Ok(ControlPlan {
        progress,
        runs: out,
        expired_why: Vec::new(),
    })
}

/// Resume: runs go on at their cursor (not before now); fires due while paused count as missed
/// (judged by the misfire policy in the fire step the resume runs right after this plan's
/// write, `control.rs`). A run whose send is out right now
/// (`sending`: pause kept it) is left to its settle: neither re-armed nor judged for expiry.
pub fn resume(
    spec: &TaskSpec,
    progress: &TaskProgress,
    runs: &BTreeMap<u32, Run>,
    sending: &BTreeSet<u32>,
    now: u64,
) -> Result<ControlPlan, Refused> {
    if progress.state != TaskState::Paused {
        return Err(Refused::Conflict(format!(
            "task {:?} is {}; only paused tasks can be resumed",
            spec.id, progress.state
        )));
    }
    let mut progress = progress.clone();
    // A run whose first message had not left when the task was paused is judged now: sent
    // later than its grace after its instant, it expires (API.md "Expired").
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    let mut expired_why = Vec::new();
    // The earliest slot instant of the runs that stay active (`queue_head_may_start`).
    let mut active: Option<u64> = None;
    for r in runs.values() {
        let at = r.scheduled_at_ms;
        if sending.contains(&r.run) {
            active = Some(active.map_or(at, |a| a.min(at)));
            continue;
        }
        let send_ms = r.next_at_ms.unwrap_or(now).max(now);
        match expire_started(spec, &mut progress, r, send_ms, now, now) {
            Some((e, why)) => {
                expired_why.push((e.run, why));
                out.push(e);
            }
            None => {
                let mut r = r.clone();
                r.next_at_ms = Some(send_ms);
                out.push(r);
                active = Some(active.map_or(at, |a| a.min(at)));
            }
        }
    }
    let mut started = false;
    if head_free(spec, &progress, active) {
        // What the queued fire waited for expired (or, in recipient time, only newer slots'
        // runs are left): it starts now.
        let (n, fire) = fire_of(progress.queued.remove(0));
        out.push(start_run(spec, &mut progress, n, fire, now));
        started = true;
    }
    let busy = active.is_some() || started;
    let to = finished_as(spec, &progress, super::state_for(&progress, busy));
    if matches!(to, TaskState::Completed | TaskState::Expired) {
        // Nothing left to do (its last run ended while it was paused, e.g. a cron at its
        // `max_runs`): it finishes, by way of pending, as the transition table says.
        progress.set_state(TaskState::Pending, now)?;
    }
    progress.set_state(to, now)?;
    progress.watched_since_ms = now;
    Ok(ControlPlan {
        progress,
        runs: out,
        expired_why,
    })
}

/// Trigger ("send now"): a new run starts now; for a one-shot it replaces the scheduled time.
pub fn trigger(spec: &TaskSpec, progress: &TaskProgress, now: u64) -> Result<ControlPlan, Refused> {
    match progress.state {
        // An expired task is re-armed by a trigger: its message goes now (API.md "Expired").
        TaskState::Pending | TaskState::Expired => {}
        TaskState::Running if spec.overlap == Overlap::Allow => {}
        s => {
            return Err(Refused::Conflict(format!(
                "task {:?} is {s}; trigger needs a pending task (or overlap allow)",
                spec.id
            )))
        }
    }
    let mut progress = progress.clone();
    progress.fires += 1;
    let run_no = progress.fires;
    if spec.schedule.is_one_shot() {
        progress.last_fire_ms = Some(now);
    }
    // A trigger is no slot's run: its messages all go now (`recipient::run_slot_wall`).
    let run = start_run(spec, &mut progress, run_no, (now, None), now);
    progress.next_fire_at_ms = next_fire_of(spec, &progress, now);
    progress.set_state(TaskState::Running, now)?;
    Ok(ControlPlan {
        progress,
        runs: vec![run],
        expired_why: Vec::new(),
    })
}

/// Backfill (`POST /v1/tasks/{id}/backfill`): one run per slot, in slot order. Each slot gets
/// the next run number (so its idempotency keys are new) and waits in the task's queue; the
/// first starts now when nothing is active (a paused task starts them on resume), the others
/// each when the one before it ends, so the task's pacing holds within each run and runs never
/// overlap. In recipient time only the runs of earlier slots are waited for, not the
/// schedule's newer runs beside them (`queue_head_may_start`; `earliest_active`: the earliest
/// slot instant of the task's active runs, `None` if none). `last_fire_ms` stays: the schedule
/// goes on from where it was (the last slot's wall is raised to the largest backfilled one,
/// which moves no next fire, see below). A slot of a cron in recipient time carries its wall
/// to its queued fire and run (`Run::slot_wall_ms`), so its later zones' messages go at that
/// slot's wall, not at the first slot of its instant. The plan and the run numbers, in slot
/// order.
pub fn backfill(
    spec: &TaskSpec,
    progress: &TaskProgress,
    earliest_active: Option<u64>,
    slots: &[Slot],
    now: u64,
) -> Result<(ControlPlan, Vec<u32>), Refused> {
    if !matches!(
        progress.state,
        TaskState::Pending | TaskState::Running | TaskState::Paused
    ) {
        return Err(Refused::Conflict(format!(
            "task {:?} is {}; only pending, running or paused tasks can be backfilled",
            spec.id, progress.state
        )));
    }
    let mut progress = progress.clone();
    let mut numbers = Vec::with_capacity(slots.len());
    for s in slots {
        progress.fires += 1;
        numbers.push(progress.fires);
        progress.queued.push(Queued {
            run: progress.fires,
            at_ms: s.at_ms,
            wall_ms: s.wall_ms,
        });
    }
    // Slots the schedule skipped (new messages put a zone east of the others: `recipient.rs`)
    // are backfilled by wall above the last slot's. Left as it was, a later change of the zones
    // (that zone removed) moves them after the last fire again, and the schedule would fire
    // them a second time (`slot_after_wall`). So the last slot's wall is raised to the largest
    // backfilled one. That changes no next fire under the current zones: a backfilled wall
    // runs before the next fire (`Handled::latest`), so one above the last slot's runs before
    // the last fire (it is skipped by `slot_after_wall`'s bound), below the bound it raises.
    // (A progress without a wall, never fired or from before walls, is left as it is: its
    // next slot is found from an instant, and a wall would change which.)
    let top = slots.iter().filter_map(|s| s.wall_ms).max();
    if let (Some(top), Some(last)) = (top, progress.last_slot_wall_ms) {
        progress.last_slot_wall_ms = Some(last.max(top));
    }
    if !may_run_more(spec, &progress) {
        // Backfilled runs count toward `max_runs` as fired ones do (the range was checked
        // not to go past it, `schedule/backfill.rs`): at the count, the schedule fires no
        // more, and the task completes once the last of them ends, not at a next fire that
        // would only be skipped for `max_runs`.
        progress.next_fire_at_ms = None;
    }
    let mut runs = Vec::new();
    // A running task's queue waits for its runs, except in recipient time, where the head
    // waits only for the runs of earlier slots (`queue_head_may_start`).
    let open = match progress.state {
        TaskState::Pending => true,
        TaskState::Running => !spec.recipient_zones.is_empty(),
        _ => false,
    };
    if open && head_free(spec, &progress, earliest_active) {
        let (n, fire) = fire_of(progress.queued.remove(0));
        runs.push(start_run(spec, &mut progress, n, fire, now));
    }
    if progress.state == TaskState::Pending && !runs.is_empty() {
        progress.set_state(TaskState::Running, now)?;
    } else {
        progress.updated_at_ms = now;
    }
    let plan = ControlPlan {
        progress,
        runs,
        expired_why: Vec::new(),
    };
    Ok((plan, numbers))
}

/// Why a send that is due now waits (issue 28), and until when: a message in recipient time
/// waits for the slot's wall time in its own zone; a send inside quiet hours (the task's own
/// window, else its channel's; `"quiet_hours": null` none) waits for the window's end in its
/// zone. Both are holds, like the rate limit's: the attempt stays armed, nothing is burned,
/// and the rate limit and pacing apply when it goes. `fire`: the run's instant and its
/// recorded slot wall (`Run::slot_wall_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The message's own instant in recipient time.
    Recipient(u64),
    /// The end of quiet hours.
    Quiet(u64),
}

pub fn hold(
    spec: &TaskSpec,
    msg: &crate::model::Message,
    fire: (u64, Option<u64>),
    channel_quiet: Option<&crate::schedule::quiet::QuietHours>,
    now: u64,
) -> Option<Hold> {
    if let Some(at) = recipient_due(spec, msg.tz.as_deref(), fire).filter(|at| *at > now) {
        return Some(Hold::Recipient(at));
    }
    quiet_until(spec, msg.tz.as_deref(), channel_quiet, now).map(Hold::Quiet)
}

/// A message's own instant in recipient time: its run's slot (`fire`: the run's instant and
/// recorded slot wall) at the slot's wall time in the message's zone `msg_tz`. `None` outside
/// recipient time, for a message without a zone, or a run that is no slot's (a trigger). What
/// [`hold`] waits for, and what a delivery's `scheduled_at` and the lateness metric count
/// from (`step::render`: the run's own instant is the first zone's).
pub fn recipient_due(
    spec: &TaskSpec,
    msg_tz: Option<&str>,
    fire: (u64, Option<u64>),
) -> Option<u64> {
    use crate::schedule::recipient::{message_due, parse_zones};
    let tz = msg_tz.filter(|_| !spec.recipient_zones.is_empty())?;
    let zones = parse_zones(&spec.recipient_zones);
    message_due(&spec.schedule, &zones, fire.0, fire.1, tz)
}

/// When a message is due: `planned` (its run's instant, or what pacing or a retry planned it
/// for), in recipient time not before its own instant ([`recipient_due`]), which the run's
/// plan does not carry. A delivery's `scheduled_at`, the lateness metric and a failure's
/// notification all read it.
pub fn due_no_earlier_than_own(
    spec: &TaskSpec,
    msg_tz: Option<&str>,
    fire: (u64, Option<u64>),
    planned: u64,
) -> u64 {
    recipient_due(spec, msg_tz, fire).map_or(planned, |own| own.max(planned))
}

/// Until when quiet hours hold a send at `now` of a message of `spec` whose zone is `msg_tz`
/// (the task's own window, else its channel's `channel_quiet`; a `recipient` window for a
/// message without a zone read in the schedule's zone): `None` when it may go. The one quiet
/// hours decision of every send: a run's before its admission ([`hold`]), again once a send
/// that waited for a slot of its channel has one (`step::quiet_after_wait`), and each
/// attempt of a failure-list retry (`retry.rs`).
pub fn quiet_until(
    spec: &TaskSpec,
    msg_tz: Option<&str>,
    channel_quiet: Option<&crate::schedule::quiet::QuietHours>,
    now: u64,
) -> Option<u64> {
    let fallback = crate::schedule::zone_of(&spec.schedule);
    crate::schedule::quiet::hold(&spec.quiet_hours, channel_quiet, msg_tz, fallback, now)
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

    const NOW: u64 = 1_796_083_200_000;

    fn task(v: serde_json::Value) -> (TaskSpec, TaskProgress) {
        crate::request::test_task(v, NOW).split()
    }

    /// A reminder's slot held past its event expires; a trigger after the event ("send now")
    /// and a task made after its event (a reminder within the grace fires at once, API.md)
    /// are sent as asked (review finding on the first version, which expired them too).
    #[test]
    fn only_a_reminders_own_slot_expires_after_its_event() {
        let event = NOW + 3_600_000;
        let (s, p) = task(serde_json::json!({"schedule": {"reminders": {
            "event_at": crate::schedule::format_utc(event), "before": ["30m"]}},
            "to": ["a"], "body": "b"}));
        let slot = Run::new(1, event - 1_800_000, event - 1_800_000, 1);
        let after = event + 60_000;
        let one = BTreeMap::from([(slot.run, slot.clone())]);
        let c = expire_after_event(&s, &p, &slot, &one, after)
            .unwrap()
            .expect("expired");
        assert_eq!(c.runs[0].state, RunState::Expired);
        // Its kind rides with the change (its notification says it in the task's language).
        let why = Expiry::EventBegan { event_ms: event };
        assert_eq!(c.expired_why, [(1, why)]);
        assert_eq!(c.runs[0].reason, Some(why.reason()));
        assert_eq!(c.progress.as_ref().map(|p| p.expired), Some(p.expired + 1));
        assert!(expire_after_event(&s, &p, &slot, &one, event - 1)
            .unwrap()
            .is_none());
        let triggered = Run::new(2, after, after, 1);
        assert!(expire_after_event(&s, &p, &triggered, &one, after)
            .unwrap()
            .is_none());
        let mut late = s.clone();
        late.created_at_ms = event + 1;
        assert!(expire_after_event(&late, &p, &slot, &one, after)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_reloaded_run_resends_only_what_may_have_left() {
        let mut r = Run::new(1, NOW, NOW, 3);
        r.in_flight = Some(1);
        r.next_at_ms = Some(NOW + 5_000);
        let (back, resend) = reload_run(r.clone(), NOW, None);
        assert!(!resend, "armed for later: it cannot have been sent");
        assert_eq!(back.in_flight, None);
        r.next_at_ms = Some(NOW - 10);
        let (back, resend) = reload_run(r, NOW, None);
        assert!(resend);
        assert_eq!((back.in_flight, back.next_at_ms), (None, Some(NOW)));
    }

    /// HA.md "The send itself": an inherited in-flight mark goes again no earlier than its
    /// claim (or its instant, if later) + the send timeout + twice the clock offset bound;
    /// one armed for later is still given back, whatever `not_before` says.
    #[test]
    fn an_inherited_in_flight_mark_waits_for_claim_plus_send_timeout() {
        let mut r = Run::new(1, NOW, NOW, 3);
        r.next_at_ms = Some(NOW - 3_000);
        r.begin_attempt(NOW - 3_100); // claimed 100 ms ahead of its instant
        assert_eq!(r.last_attempt_at_ms, Some(NOW - 3_100));
        let nb = inherited_not_before(&r, 10_000, 500);
        // From the instant (later than the claim): NOW - 3 000 + 10 000 + 2 × 500.
        assert_eq!(nb, Some(NOW + 8_000));
        let (back, resend) = reload_run(r.clone(), NOW, nb);
        assert!(resend);
        assert_eq!((back.in_flight, back.next_at_ms), (None, Some(NOW + 8_000)));
        // A claim made after the instant (the wheel handed the key over late): the claim.
        let mut late = r.clone();
        late.last_attempt_at_ms = Some(NOW - 1_000);
        assert_eq!(
            inherited_not_before(&late, 10_000, 0),
            Some(NOW + 9_000),
            "the later of claim and instant"
        );
        // Long past: not_before is already behind now, so it goes now, as without it.
        let nb = inherited_not_before(&r, 1_000, 0);
        assert_eq!(reload_run(r.clone(), NOW, nb).0.next_at_ms, Some(NOW));
        // Armed for later: never sent, given back; nothing in flight: no wait at all.
        let mut ahead = Run::new(2, NOW, NOW, 1);
        ahead.next_at_ms = Some(NOW + 5_000);
        ahead.begin_attempt(NOW);
        let nb = inherited_not_before(&ahead, 10_000, 500);
        let (back, resend) = reload_run(ahead, NOW, nb);
        assert!(!resend && back.in_flight.is_none());
        assert_eq!(back.next_at_ms, Some(NOW + 5_000));
        assert_eq!(inherited_not_before(&back, 10_000, 500), None);
    }

    #[test]
    fn a_running_task_with_nothing_active_starts_its_queued_fire_or_settles_its_state() {
        let (s, mut t) =
            task(serde_json::json!({"schedule": {"cron": "* * * * *"}, "to": ["a"], "body": "b"}));
        t.state = TaskState::Running;
        t.queued = vec![crate::model::Queued::at(7, NOW)];
        let p = recover_running(&s, &t, None, NOW + 1).unwrap();
        assert!(p.write);
        assert_eq!(p.started.as_ref().map(|r| r.run), Some(7));
        assert_eq!(p.progress.state, TaskState::Running);
        assert!(p.progress.queued.is_empty());
        // The run started here is on the timeline as a fire step's would be.
        let c = p.change();
        let kinds: Vec<_> = c.timeline.iter().map(|e| (e.kind, e.run)).collect();
        assert_eq!(kinds, vec![(TimelineKind::Fired, Some(7))]);
        // Nothing queued, nothing active: back to pending (it has a next fire).
        t.queued.clear();
        let p = recover_running(&s, &t, None, NOW + 1).unwrap();
        assert!(p.write && p.started.is_none());
        assert_eq!(p.progress.state, TaskState::Pending);
        // A run still active: nothing to change.
        let p = recover_running(&s, &t, Some(NOW), NOW + 1).unwrap();
        assert!(!p.write);
    }

    #[test]
    fn a_fire_due_while_watching_runs_however_late() {
        let (s, t) = task(
            serde_json::json!({"schedule": {"after": "1m"}, "misfire": "skip",
            "misfire_grace": "1s", "to": ["a"], "body": "b"}),
        );
        let due = NOW + 60_000;
        // Handled an hour late (a wall-clock jump, a backlog): not missed.
        let p = fire(&s, &t, 0, due, due + 3_600_000, NOW).unwrap();
        assert_eq!((p.missed, p.started.len(), p.not_started.len()), (0, 1, 0));
        assert_eq!(p.started[0].in_flight, Some(0), "armed in the same write");
        // Due before herald came back (boot after the due time): missed by 2.5 s, grace 1 s.
        let p = fire(&s, &t, 0, due, due + 2_600, due + 2_500).unwrap();
        assert_eq!((p.missed, p.started.len()), (1, 0));
        assert_eq!(p.not_started[0].state, RunState::Expired);
        let why = Expiry::Missed {
            late_ms: 2_500,
            grace_ms: 1_000,
        };
        assert_eq!(p.expired_why, [(1, why)]);
        assert_eq!(p.not_started[0].reason, Some(why.reason()));
        assert_eq!(p.progress.state, TaskState::Expired, "nothing was sent");
    }

    /// The grace defect of issue 28, as plans: a one-shot at T with a 1 s grace is armed 2 s
    /// ahead; herald is down from T − 1.5 s to T + 2.5 s.
    #[test]
    fn a_run_armed_before_an_outage_is_judged_on_when_its_send_would_start() {
        let at = NOW + 60_000;
        let once = |grace: &str| {
            task(
                serde_json::json!({"schedule": {"after": "1m"}, "misfire_grace": grace,
                "to": ["a", "b"], "body": "b"}),
            )
        };
        let (s, t) = once("1s");
        let p = fire(&s, &t, 0, at, at - 2_000, NOW).unwrap();
        assert_eq!(p.started[0].in_flight, Some(0), "armed ahead, durable");
        let boot = at + 2_500;
        let (t2, expired) = recover_started(&s, &p.progress, &p.started, boot, boot, 0);
        assert_eq!(expired.len(), 1);
        let (e, why) = &expired[0];
        assert_eq!(
            (e.state.clone(), e.in_flight, e.attempts),
            (RunState::Expired, None, 0)
        );
        assert!(e.reason.as_deref().unwrap().contains("2s500ms"), "{e:?}");
        assert_eq!(
            e.reason,
            Some(why.reason()),
            "the stored reason is its kind's"
        );
        assert_eq!((t2.runs, t2.expired), (0, 1));
        let r = recover_running(&s, &t2, None, boot).unwrap();
        assert!(r.write && r.started.is_none());
        assert_eq!(r.progress.state, TaskState::Expired);
        // With a 3 s grace the same outage sends it at restart.
        let (s, t) = once("3s");
        let p = fire(&s, &t, 0, at, at - 2_000, NOW).unwrap();
        let (t2, expired) = recover_started(&s, &p.progress, &p.started, boot, boot, 0);
        assert!(expired.is_empty());
        assert_eq!(t2.runs, 1);
        // Back before the instant: nothing was missed.
        let (_, expired) = recover_started(&s, &p.progress, &p.started, at - 500, at - 500, 0);
        assert!(expired.is_empty());
        // A run that has sent its first message is never expired (a sequence goes on).
        let mut sending = p.started[0].clone();
        sending.cursor = 1;
        sending.sent = 1;
        sending.in_flight = Some(1);
        let (_, expired) = recover_started(
            &s,
            &p.progress,
            &[sending],
            at + 3_600_000,
            at + 3_600_000,
            0,
        );
        assert!(expired.is_empty());
    }

    #[test]
    fn a_cron_run_armed_before_an_outage_expires_and_the_schedule_goes_on() {
        let (s, t) = task(serde_json::json!({"schedule": {"cron": "* * * * *"},
            "misfire_grace": "1s", "to": ["a"], "body": "b"}));
        let due = t.next_fire_at_ms.unwrap();
        let p = fire(&s, &t, 0, due, due - 100, NOW).unwrap();
        let boot = due + 5_000;
        let (t2, expired) = recover_started(&s, &p.progress, &p.started, boot, boot, 0);
        assert_eq!(expired.len(), 1);
        let r = recover_running(&s, &t2, None, boot).unwrap();
        assert_eq!(
            r.progress.state,
            TaskState::Pending,
            "a cron goes on to its next fire"
        );
        assert_eq!(r.progress.next_fire_at_ms, Some(due + 60_000));
    }

    #[test]
    fn an_expired_task_is_re_armed_by_a_trigger_and_a_pause_over_the_instant_expires_it() {
        let (s, t) = task(
            serde_json::json!({"schedule": {"after": "0s"}, "misfire_grace": "1s",
            "to": ["a"], "body": "b"}),
        );
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let runs: BTreeMap<u32, Run> = p.started.iter().map(|r| (r.run, r.clone())).collect();
        let paused = pause(&s, &p.progress, &runs, &BTreeSet::new(), NOW + 1).unwrap();
        let again: BTreeMap<u32, Run> = paused.runs.iter().map(|r| (r.run, r.clone())).collect();
        // Resumed within the grace: it goes on.
        let r = resume(&s, &paused.progress, &again, &BTreeSet::new(), NOW + 900).unwrap();
        assert_eq!(r.progress.state, TaskState::Running);
        // Resumed 5 s after its instant: it expires, nothing is sent.
        let r = resume(&s, &paused.progress, &again, &BTreeSet::new(), NOW + 5_000).unwrap();
        assert_eq!(r.progress.state, TaskState::Expired);
        assert_eq!(r.runs[0].state, RunState::Expired);
        assert!(
            matches!(
                r.expired_why[..],
                [(
                    1,
                    Expiry::StartedLate {
                        grace_ms: 1_000,
                        ..
                    }
                )]
            ),
            "{:?}",
            r.expired_why
        );
        // Its first message being sent right now (held past the grace by a rate limit, say):
        // resumed, it is left to its settle, not expired under the send.
        let sending = BTreeSet::from([again.values().next().unwrap().run]);
        let out = resume(&s, &paused.progress, &again, &sending, NOW + 5_000).unwrap();
        assert_eq!(out.progress.state, TaskState::Running);
        assert!(
            out.runs.is_empty(),
            "the sending run is not rewritten: {:?}",
            out.runs
        );
        // A trigger re-arms it: a new run, now.
        let tr = trigger(&s, &r.progress, NOW + 6_000).unwrap();
        assert_eq!(tr.progress.state, TaskState::Running);
        assert_eq!(
            (tr.runs[0].run, tr.runs[0].scheduled_at_ms),
            (2, NOW + 6_000)
        );
    }

    #[test]
    fn settle_is_o1_and_arms_the_next_attempt_when_due_soon() {
        let (s, mut t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a", "b", "c"], "body": "b", "pacing": {"interval": "50ms"}}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        t = p.progress;
        let run = p.started[0].clone();
        let a = Attempt {
            outcome: Outcome::Sent,
            max_attempts: 3,
            retry_delay_ms: 1_000,
            pacing: s.pacing,
            to: "a",
            channel: "log",
        };
        let s = settle(&s, &t, &run, None, a, NOW + 1, Some(100)).unwrap();
        assert!(!s.finished);
        assert_eq!((s.run.cursor, s.run.in_flight), (1, Some(1)));
        assert_eq!(s.progress.state, TaskState::Running);
    }

    /// Review finding: a settle during a drain (or a handover) armed the next message, due at
    /// once; nothing sent it, and the next boot (or owner) read the mark as a send cut short.
    #[test]
    fn a_settle_with_no_lead_arms_nothing_and_leaves_the_next_message_pending() {
        let (s, t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a", "b"], "body": "b"}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let run = p.started[0].clone();
        for outcome in [
            Outcome::Sent,
            Outcome::Held {
                error: "not sent: a drain".into(),
                until_ms: NOW + 1,
                why: crate::model::timeline::HeldWhy::Stopped,
            },
        ] {
            let a = Attempt {
                outcome: outcome.clone(),
                max_attempts: 3,
                retry_delay_ms: 1_000,
                pacing: s.pacing,
                to: "a",
                channel: "log",
            };
            let st = settle(&s, &p.progress, &run, None, a, NOW + 1, None).unwrap();
            assert!(!st.finished);
            assert_eq!(st.progress.state, TaskState::Running);
            let r = &st.run;
            let cursor = u32::from(outcome == Outcome::Sent);
            assert_eq!(
                (r.cursor, r.in_flight, r.attempts, r.next_at_ms),
                (cursor, None, 0, Some(NOW + 1)),
                "{outcome:?}: pending, due now, no attempt counted"
            );
            let c = st.change();
            assert_eq!(
                c.wheel,
                vec![WheelOp::Step(run.run)],
                "its step stays on the wheel"
            );
        }
    }

    #[test]
    fn a_backfill_queues_one_run_per_slot_in_order_and_starts_the_first() {
        let (s, t) =
            task(serde_json::json!({"schedule": {"cron": "* * * * *"}, "to": ["a"], "body": "b"}));
        let slots = [NOW - 180_000, NOW - 120_000, NOW - 60_000].map(Slot::at);
        let (p, numbers) = backfill(&s, &t, None, &slots, NOW).unwrap();
        assert_eq!(numbers, vec![1, 2, 3]);
        assert_eq!(p.progress.state, TaskState::Running);
        assert_eq!(
            (p.runs[0].run, p.runs[0].scheduled_at_ms),
            (1, NOW - 180_000)
        );
        assert_eq!(
            p.runs[0].next_at_ms,
            Some(NOW),
            "sent now, not at its old instant"
        );
        assert_eq!(
            p.progress.queued,
            vec![
                crate::model::Queued::at(2, NOW - 120_000),
                crate::model::Queued::at(3, NOW - 60_000)
            ]
        );
        assert_eq!(p.progress.last_fire_ms, t.last_fire_ms);
        // A paused task keeps them queued for its resume; a finished one refuses.
        let mut paused = t.clone();
        paused.state = TaskState::Paused;
        let (p, _) = backfill(&s, &paused, None, &slots, NOW).unwrap();
        assert!(p.runs.is_empty() && p.progress.queued.len() == 3);
        let mut done = t.clone();
        done.state = TaskState::Completed;
        assert!(matches!(
            backfill(&s, &done, None, &slots, NOW),
            Err(Refused::Conflict(_))
        ));
    }

    /// Review finding: a queued fire (backfill, a `fire_all` catch-up) started only when no
    /// other run was active, and a recipient-time cron always has the schedule's newer runs
    /// active beside each other: its queue never moved while the schedule fired. There only a
    /// run of an earlier slot (or of the head's own instant) holds the head; any other
    /// schedule's queue waits for every active run, as before. Checked at the four places a
    /// queued fire starts: backfill, settle, start-up (`recover_running`) and resume.
    #[test]
    fn a_queued_fire_in_recipient_time_waits_only_for_runs_of_earlier_slots() {
        const H: u64 = 3_600_000;
        let (rt, rp) = task(serde_json::json!({"schedule": {"cron": "0 * * * *",
            "tz": "recipient"}, "messages": [{"to": "a", "body": "b", "tz": "Europe/Berlin"}]}));
        let (plain, pp) =
            task(serde_json::json!({"schedule": {"cron": "0 * * * *"}, "to": ["a"], "body": "b"}));
        let head = NOW - 4 * H;
        for (spec, recipient) in [(&rt, true), (&plain, false)] {
            assert!(queue_head_may_start(spec, head, None));
            assert!(!queue_head_may_start(spec, head, Some(head - H)));
            assert!(!queue_head_may_start(spec, head, Some(head)), "a tie holds");
            assert_eq!(queue_head_may_start(spec, head, Some(head + H)), recipient);
        }
        for (spec, p, recipient) in [(&rt, &rp, true), (&plain, &pp, false)] {
            // The schedule's newer run (slot NOW - H) is active: the task is running.
            let newer = Some(NOW - H);
            let running = TaskProgress {
                state: TaskState::Running,
                ..p.clone()
            };
            let slots = [head, head + H].map(Slot::at);
            let (b, _) = backfill(spec, &running, newer, &slots, NOW).unwrap();
            assert_eq!(b.runs.len(), usize::from(recipient), "backfill");
            let (b, _) = backfill(spec, &running, Some(head - H), &slots, NOW).unwrap();
            assert!(b.runs.is_empty(), "an earlier slot's run holds it");
            let queued = TaskProgress {
                queued: vec![Queued::at(7, head), Queued::at(8, head + H)],
                ..running.clone()
            };
            // Start-up: one started, the next still waiting for it.
            let r = recover_running(spec, &queued, newer, NOW).unwrap();
            assert_eq!(r.started.is_some(), recipient, "start-up");
            assert_eq!(r.progress.queued.len(), 2 - usize::from(recipient));
            // Settle: the run of an older slot (head - H) finishes beside the newer run.
            let mut older = Run::new(6, head - H, NOW - H, 1);
            older.begin_attempt(NOW);
            let a = Attempt {
                outcome: Outcome::Sent,
                max_attempts: 1,
                retry_delay_ms: 0,
                pacing: spec.pacing,
                to: "a",
                channel: "log",
            };
            let st = settle(spec, &queued, &older, newer, a.clone(), NOW, None).unwrap();
            assert!(st.finished);
            assert_eq!(st.next_run.map(|r| r.run), recipient.then_some(7), "settle");
            // Resume: the newer run, its first message sent, stays active (not judged late).
            let paused = TaskProgress {
                state: TaskState::Paused,
                ..queued.clone()
            };
            let mut active = Run::new(9, NOW - H, NOW - H, 2);
            active.cursor = 1;
            let runs = BTreeMap::from([(9, active)]);
            let r = resume(spec, &paused, &runs, &BTreeSet::new(), NOW).unwrap();
            let started: Vec<u32> = r.runs.iter().map(|r| r.run).filter(|n| *n != 9).collect();
            assert_eq!(started, if recipient { vec![7] } else { vec![] }, "resume");
        }
    }

    /// Review finding: backfill left the last slot's wall as it was. An hourly cron for London
    /// fired its 10:00 at 10:00Z; new messages in Kolkata (+05:30) made the schedule skip the
    /// walls 11:00 to 15:00 (Kolkata's 05:30Z to 09:30Z, before the last fire). Backfilled,
    /// then Kolkata removed again, the schedule fired them a second time from 11:00Z. The
    /// backfill raises the last slot's wall to the largest backfilled one; under the current
    /// zones no next fire changes (each backfilled wall runs before the last fire).
    #[test]
    fn a_backfill_raises_the_last_slot_wall_without_moving_the_next_fire() {
        const H: u64 = 3_600_000;
        let (s, p) = task(serde_json::json!({"schedule": {"cron": "0 * * * *",
            "tz": "recipient"}, "messages": [
            {"to": "l", "body": "x", "tz": "Europe/London"},
            {"to": "k", "body": "y", "tz": "Asia/Kolkata"}]}));
        // Walls as if UTC: 10:00 on 1 December is NOW + 10 h; Kolkata's instant 5 h 30 earlier.
        let wall = |h: u64| NOW + h * H;
        let p = TaskProgress {
            fires: 6,
            runs: 6,
            last_fire_ms: Some(wall(10)),
            last_slot_wall_ms: Some(wall(10)),
            ..p
        };
        let now = wall(10) + H / 6;
        let next = next_slot_of(&s, &p, now);
        assert_eq!(
            next,
            Some((wall(10) + H / 2, Some(wall(16)))),
            "Kolkata's 16:00"
        );
        let p = TaskProgress {
            next_fire_at_ms: next.map(|n| n.0),
            ..p
        };
        let slot = |h: u64| Slot {
            at_ms: wall(h) - 11 * H / 2,
            wall_ms: Some(wall(h)),
        };
        let mut london = s.clone();
        london.recipient_zones = vec!["Europe/London".into()];
        // Without the raise, Kolkata removed: London's 11:00 again, backfilled already.
        assert_eq!(
            next_slot_of(&london, &p, now),
            Some((wall(11), Some(wall(11))))
        );
        for range in [&[11][..], &[11, 12, 13, 14, 15], &[13, 14]] {
            let slots: Vec<Slot> = range.iter().map(|h| slot(*h)).collect();
            let (b, _) = backfill(&s, &p, None, &slots, now).unwrap();
            let top = range.iter().max().map(|h| wall(*h));
            assert_eq!(b.progress.last_slot_wall_ms, top, "{range:?}");
            assert_eq!(next_slot_of(&s, &b.progress, now), next, "{range:?}");
            let after = next_slot_of(&london, &b.progress, now);
            assert!(after.is_some_and(|(_, w)| w > top), "{range:?}: {after:?}");
        }
        // A wall below the last slot's changes nothing.
        let (b, _) = backfill(&s, &p, None, &[slot(9)], now).unwrap();
        assert_eq!(b.progress.last_slot_wall_ms, Some(wall(10)));
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
        let (s, t) =
            task(serde_json::json!({"schedule": {"after": "0s"}, "to": ["a", "b"], "body": "b"}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let runs: BTreeMap<u32, Run> = p.started.iter().map(|r| (r.run, r.clone())).collect();
        let none = BTreeSet::new();
        // Pause gives the armed attempt back; resume continues at the cursor.
        let paused = pause(&s, &p.progress, &runs, &none, NOW + 1).unwrap();
        assert_eq!(paused.progress.state, TaskState::Paused);
        assert_eq!(
            (paused.runs[0].in_flight, paused.runs[0].attempts),
            (None, 0)
        );
        let again: BTreeMap<u32, Run> = paused.runs.iter().map(|r| (r.run, r.clone())).collect();
        let resumed = resume(&s, &paused.progress, &again, &BTreeSet::new(), NOW + 5).unwrap();
        assert_eq!(resumed.progress.state, TaskState::Running);
        assert_eq!(resumed.progress.watched_since_ms, NOW + 5);
        assert_eq!(resumed.runs[0].next_at_ms, Some(NOW + 5));
        // A sending run keeps its attempt when cancelled.
        let sending: BTreeSet<u32> = runs.keys().copied().collect();
        let c = cancel(&s, &p.progress, &runs, &sending, NOW + 2).unwrap();
        assert_eq!(c.progress.state, TaskState::Cancelled);
        assert_eq!(c.runs[0].state, RunState::Cancelled);
        assert_eq!(c.runs[0].in_flight, Some(0));
        assert!(matches!(
            cancel(&s, &c.progress, &runs, &none, NOW + 3),
            Err(Refused::Conflict(_))
        ));
        assert!(matches!(
            resume(&s, &p.progress, &runs, &BTreeSet::new(), NOW),
            Err(Refused::Conflict(_))
        ));
        // A paused task with nothing left completes on resume (found by simulation seed 1018).
        let mut done = paused.progress.clone();
        done.next_fire_at_ms = None;
        let r = resume(&s, &done, &BTreeMap::new(), &BTreeSet::new(), NOW + 6).unwrap();
        assert_eq!(r.progress.state, TaskState::Completed);
        // Trigger on a pending task starts a new run now.
        let tr = trigger(&s, &t, NOW + 7).unwrap();
        assert_eq!((tr.runs[0].run, tr.runs[0].scheduled_at_ms), (1, NOW + 7));
    }

    /// Review finding: a send held by quiet hours until the window's end (written as the run's
    /// `next_at`), herald restarted or the task paused and resumed in the night: the run was
    /// judged by its instant and expired, nothing sent at the window's end.
    #[test]
    fn a_held_send_is_judged_from_its_hold_not_its_instant() {
        let (s, t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let until = NOW + 9 * 3_600_000;
        let mut held = p.started[0].clone();
        held.next_at_ms = Some(until);
        // A restart 10 s in: the hold is still ahead, nothing was missed.
        let boot = NOW + 10_000;
        let (_, expired) = recover_started(&s, &p.progress, &[held.clone()], boot, boot, 0);
        assert!(expired.is_empty(), "{expired:?}");
        // Back 30 min after the hold's end (an outage past it, more than the 10 min grace).
        let late = until + 30 * 60_000;
        let (_, expired) = recover_started(&s, &p.progress, &[held.clone()], late, late, 0);
        assert_eq!(expired.len(), 1);
        // Paused and resumed in the night: it goes on, at the window's end.
        let runs = BTreeMap::from([(1, held)]);
        let none = BTreeSet::new();
        let paused = pause(&s, &p.progress, &runs, &none, NOW + 1_000).unwrap();
        let again: BTreeMap<u32, Run> = paused.runs.iter().map(|r| (r.run, r.clone())).collect();
        let r = resume(&s, &paused.progress, &again, &none, NOW + 2_000).unwrap();
        assert_eq!(r.progress.state, TaskState::Running);
        assert_eq!(
            (r.runs[0].state.clone(), r.runs[0].next_at_ms),
            (RunState::Running, Some(until))
        );
        // A send waiting in a backlog (its `next_at` its instant), paused 15 min after its
        // instant for 1 s: judged for the pause only, within the grace.
        let runs: BTreeMap<u32, Run> = p.started.iter().map(|r| (r.run, r.clone())).collect();
        let at = NOW + 15 * 60_000;
        let paused = pause(&s, &p.progress, &runs, &none, at).unwrap();
        assert_eq!(paused.runs[0].next_at_ms, Some(at), "not before the pause");
        let again: BTreeMap<u32, Run> = paused.runs.iter().map(|r| (r.run, r.clone())).collect();
        let r = resume(&s, &paused.progress, &again, &none, at + 1_000).unwrap();
        assert_eq!(r.progress.state, TaskState::Running, "{:?}", r.runs);
    }

    /// Last stop's "left as found": a send waiting in a rate limit's backlog 15 min after its
    /// instant (10 min grace), the process killed and back 20 s later. Its last life sign
    /// (1 s before the kill) says herald watched the run until then: judged on the outage
    /// alone, it goes on. With no life sign it is judged from its instant, as before.
    #[test]
    fn a_send_in_a_backlog_is_judged_on_the_outage_after_the_last_life_sign() {
        let (s, t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let killed = NOW + 15 * 60_000;
        let boot = killed + 20_000;
        let alive = killed - 1_000;
        let (_, expired) = recover_started(&s, &p.progress, &p.started, boot, boot, alive);
        assert!(expired.is_empty(), "{expired:?}");
        let (_, expired) = recover_started(&s, &p.progress, &p.started, boot, boot, 0);
        assert_eq!(expired.len(), 1, "no life sign: judged from its instant");
        // An outage longer than the grace after the life sign expires it.
        let late = alive + 11 * 60_000;
        let (_, expired) = recover_started(&s, &p.progress, &p.started, late, late, alive);
        assert_eq!(expired.len(), 1);
    }

    /// Review finding: a task parked `failed` while a send was out kept its run `running` on
    /// disk for ever (retention never deleted it, DELETE answered 409).
    #[test]
    fn a_send_settled_after_its_task_was_parked_closes_its_run() {
        let (s, t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a", "b"], "body": "b"}));
        let p = fire(&s, &t, 0, NOW, NOW, NOW).unwrap();
        let run = p.started[0].clone();
        let runs = BTreeMap::from([(run.run, run.clone())]);
        let sending = BTreeSet::from([run.run]);
        let c = park(&s, &p.progress, &runs, &sending, "bug: x", NOW + 1).unwrap();
        assert!(c.runs.is_empty(), "the sending run is left to its settle");
        let parked = c.progress.unwrap();
        assert_eq!(parked.state, TaskState::Failed);
        for outcome in [
            Outcome::Sent,
            Outcome::Retry {
                error: "HTTP 500".into(),
                not_before_ms: None,
            },
        ] {
            let a = Attempt {
                outcome,
                max_attempts: 3,
                retry_delay_ms: 1_000,
                pacing: s.pacing,
                to: "a",
                channel: "log",
            };
            let st = settle(&s, &parked, &run, None, a, NOW + 2, Some(100)).unwrap();
            assert!(st.finished);
            assert_eq!(st.run.state, RunState::Cancelled);
            assert_eq!(
                (st.run.finished_at_ms, st.run.next_at_ms),
                (Some(NOW + 2), None)
            );
            assert_eq!(st.run.in_flight, None);
            assert_eq!(st.run.reason.as_deref(), Some("task failed: bug: x"));
            assert!(st.next_run.is_none());
        }
    }

    /// Review finding: cancel and park cleared the queue of fires waiting behind a run, whose
    /// run numbers were taken: `GET /runs` showed gaps with no reason.
    #[test]
    fn cancel_and_park_record_the_queued_fires_they_drop() {
        let (s, t) = task(serde_json::json!({"schedule": {"cron": "* * * * *"},
            "overlap": "queue", "to": ["a"], "body": "b"}));
        let slots = [NOW - 180_000, NOW - 120_000, NOW - 60_000].map(Slot::at);
        let (p, numbers) = backfill(&s, &t, None, &slots, NOW).unwrap();
        assert_eq!(numbers, [1, 2, 3]);
        let runs: BTreeMap<u32, Run> = p.runs.iter().map(|r| (r.run, r.clone())).collect();
        let none = BTreeSet::new();
        let c = cancel(&s, &p.progress, &runs, &none, NOW + 1).unwrap();
        let got: Vec<_> = (c.runs.iter())
            .map(|r| (r.run, r.state.clone(), r.reason.clone(), r.finished_at_ms))
            .collect();
        assert_eq!(
            got,
            [
                (1, RunState::Cancelled, None, Some(NOW + 1)),
                (
                    2,
                    RunState::Skipped,
                    Some("task cancelled".into()),
                    Some(NOW + 1)
                ),
                (
                    3,
                    RunState::Skipped,
                    Some("task cancelled".into()),
                    Some(NOW + 1)
                ),
            ]
        );
        assert_eq!(c.runs[1].scheduled_at_ms, NOW - 120_000);
        assert!(c.progress.queued.is_empty());
        assert_eq!(c.progress.skipped, p.progress.skipped + 2);
        let change = c.change();
        let kinds: Vec<_> = change.timeline.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [TimelineKind::Skipped, TimelineKind::Skipped]);
        // Parked: the same, with the task's failure as the reason.
        let sending = BTreeSet::from([1]);
        let c = park(&s, &p.progress, &runs, &sending, "bug: y", NOW + 1).unwrap();
        let got: Vec<_> = (c.runs.iter())
            .map(|r| (r.run, r.state.clone(), r.reason.clone()))
            .collect();
        let why = Some("task failed: bug: y".to_string());
        assert_eq!(
            got,
            [
                (2, RunState::Skipped, why.clone()),
                (3, RunState::Skipped, why)
            ]
        );
        assert!(c.progress.as_ref().unwrap().queued.is_empty());
        assert_eq!(c.timeline.len(), 2);
    }

    /// Review finding: a trigger ("send now") of a one-shot in recipient time held each
    /// message to the `at` in its own zone: only the slot's own run (fired at `at_ms`) is held.
    #[test]
    fn a_triggered_run_in_recipient_time_is_not_held_to_the_slot() {
        let (s, t) = task(serde_json::json!({"schedule": {"at": "2026-12-02T09:00:00",
            "tz": "recipient"}, "messages": [
            {"to": "a", "body": "b", "tz": "Europe/Berlin"},
            {"to": "c", "body": "d", "tz": "America/New_York"}]}));
        let msg = |tz: &str| crate::model::Message {
            to: "x".into(),
            body: "y".into(),
            data: None,
            tz: Some(tz.into()),
        };
        let now = NOW + 60_000;
        let tr = trigger(&s, &t, now).unwrap();
        for tz in ["Europe/Berlin", "America/New_York"] {
            assert_eq!(
                hold(&s, &msg(tz), (tr.runs[0].scheduled_at_ms, None), None, now),
                None
            );
        }
        // The slot's own run (fired at the `at`'s first instant) holds each to its zone.
        let Schedule::At { at_ms, .. } = s.schedule else {
            panic!("an at")
        };
        let p = fire(&s, &t, 0, at_ms, at_ms, NOW).unwrap();
        let ny = hold(
            &s,
            &msg("America/New_York"),
            (p.started[0].scheduled_at_ms, p.started[0].slot_wall_ms),
            None,
            at_ms,
        );
        assert_eq!(
            ny,
            Some(Hold::Recipient(
                crate::schedule::parse_instant("2026-12-02T14:00:00Z", None, Default::default())
                    .unwrap()[0]
            ))
        );
    }

    /// Review finding: `expired` means what API.md says, every fire expired without sending.
    /// Reminders whose first fire expired and whose second the misfire policy skipped end
    /// `completed` (their policy decided); one whose every fire expired ends `expired`; one
    /// that sent a run never does.
    #[test]
    fn only_a_task_whose_every_fire_expired_ends_expired() {
        let event = NOW + 60 * 60_000;
        let reminders = |misfire: &str| {
            task(serde_json::json!({"schedule": {"reminders": {
                "event_at": crate::schedule::format_utc(event), "before": ["30m", "15m"]}},
                "misfire": misfire, "to": ["a"], "body": "b"}))
        };
        // Back 20 min after the 30-minute reminder (beyond the 10 min grace) and 5 min after
        // the 15-minute one (within it).
        let back = event - 10 * 60_000;
        let (s, t) = reminders("skip");
        let p = fire(&s, &t, 0, event - 30 * 60_000, back, back).unwrap();
        assert_eq!((p.progress.expired, p.progress.skipped), (1, 1));
        assert_eq!(p.progress.state, TaskState::Completed);
        // Back after both were missed by more than the grace: every fire expired.
        let late = event + 60_000;
        let p = fire(&s, &t, 0, event - 30 * 60_000, late, late).unwrap();
        assert_eq!((p.progress.expired, p.progress.skipped), (2, 0));
        assert_eq!(p.progress.state, TaskState::Expired);
        // fire_now: the first expired, the second sent: completed.
        let (s, t) = reminders("fire_now");
        let p = fire(&s, &t, 0, event - 30 * 60_000, back, back).unwrap();
        assert_eq!((p.progress.expired, p.progress.runs), (1, 1));
        let r = &p.started[0];
        let a = Attempt {
            outcome: Outcome::Sent,
            max_attempts: 3,
            retry_delay_ms: 1_000,
            pacing: s.pacing,
            to: "a",
            channel: "log",
        };
        let st = settle(&s, &p.progress, r, None, a, back + 1, Some(100)).unwrap();
        assert_eq!(st.progress.state, TaskState::Completed);
    }

    /// What the engine starts for `schedule`, created at `now`: each fire step's started
    /// runs, the next one planned from the last (misfire judged as for a task created then).
    fn started_by_the_engine(schedule: serde_json::Value, now: u64) -> Vec<u64> {
        let (spec, mut progress) = crate::request::test_task(
            serde_json::json!({"schedule": schedule, "to": ["a"], "body": "b"}),
            now,
        )
        .split();
        let mut started = Vec::new();
        while let Some(due) = progress.next_fire_at_ms {
            let p = fire(&spec, &progress, 0, due, due.max(now), now).unwrap();
            started.extend(p.started.iter().map(|r| r.scheduled_at_ms));
            progress = p.progress;
        }
        started
    }

    /// Review finding: reminders 30 and 25 minutes before an event 20 minutes away were both
    /// previewed, while the engine folds the two past ones into one run (misfire fire_now).
    #[test]
    fn a_preview_shows_the_runs_the_engine_starts() {
        use crate::schedule::preview::{preview, PreviewRequest};
        let schedule = serde_json::json!({"reminders": {"event_at": "2026-12-01T00:20:00Z",
            "before": ["30m", "25m", "5m"]}});
        let req: PreviewRequest =
            serde_json::from_value(serde_json::json!({"schedule": schedule.clone(), "n": 10}))
                .unwrap();
        let p = preview(req, NOW, &crate::model::Limits::default()).unwrap();
        assert_eq!(p.fires, started_by_the_engine(schedule, NOW));
        assert_eq!(p.fires, [NOW - 5 * 60_000, NOW + 15 * 60_000]);
    }

    /// A per-minute cron with a day's grace, last fired at NOW, herald back 1 200 minutes later:
    /// fire steps as the engine takes them, each from the progress the last one left, its
    /// runs still active. The runs started or queued, and the progress at the end.
    fn catch_up(misfire: &str, overlap: &str) -> (Vec<u64>, TaskProgress) {
        let (s, mut t) = task(serde_json::json!({"schedule": {"cron": "* * * * *"},
            "misfire": misfire, "misfire_grace": "1d", "overlap": overlap,
            "to": ["a"], "body": "b"}));
        t.last_fire_ms = Some(NOW);
        t.next_fire_at_ms = next_fire_of(&s, &t, NOW);
        let watched = NOW + 1_200 * 60_000;
        let (mut runs, mut active) = (Vec::new(), 0);
        let mut steps = 0;
        while let Some(due) = t.next_fire_at_ms.filter(|d| *d < watched) {
            let queued_before = t.queued.len();
            let p = fire(&s, &t, active, due, watched, watched).unwrap();
            runs.extend(p.started.iter().map(|r| r.scheduled_at_ms));
            runs.extend(p.progress.queued[queued_before..].iter().map(|q| q.at_ms));
            active += p.started.len();
            t = p.progress;
            steps += 1;
            assert!(steps < 100, "catch-up does not end");
        }
        (runs, t)
    }

    /// Review finding: the outage was judged in chunks of 1 000 missed fires, so fire_now
    /// started one run per chunk, fire_all replayed FIRE_ALL_MAX per chunk, and with overlap
    /// skip the latest fire was recorded as an overlap.
    #[test]
    fn a_long_outage_is_judged_as_one() {
        use crate::schedule::misfire::FIRE_ALL_MAX;
        let latest = NOW + 1_199 * 60_000;
        for overlap in ["queue", "allow", "skip"] {
            let (runs, t) = catch_up("fire_now", overlap);
            assert_eq!(runs, [latest], "overlap {overlap}");
            assert_eq!((t.fires, t.runs, t.skipped), (1_199, 1, 1_198), "{overlap}");
            assert_eq!(t.next_fire_at_ms, Some(latest + 60_000));
        }
        let (runs, t) = catch_up("fire_all", "queue");
        let first: Vec<u64> = (1..=FIRE_ALL_MAX as u64)
            .map(|i| NOW + i * 60_000)
            .collect();
        assert_eq!(runs, first, "the first {FIRE_ALL_MAX} of the outage, once");
        assert_eq!((t.fires, t.skipped), (1_199, 1_199 - FIRE_ALL_MAX as u32));
        let (runs, t) = catch_up("skip", "queue");
        assert!(runs.is_empty());
        assert_eq!((t.fires, t.skipped), (1_199, 1_199));
    }

    /// Review finding: decisions carried instants only, so the latest fire of an outage past
    /// its list took its wall from the fires before it, or else the first slot of its instant.
    /// Berlin's 02:00 to 03:00 of 28 March 2027 all run at 01:00Z (spring forward): an
    /// outage of a per-minute cron in recipient time ending there, fire_now, ran its latest as
    /// the 02:00 slot, and the next fire, 02:01's, was at 01:00Z again: a second run for one
    /// outage. Walked one by one (20 h: 1 260 fires) or reached by the bisection past the
    /// count's bound (200 h), the latest is the 03:00 slot, run once; the schedule goes on at
    /// 03:01 (01:01Z).
    #[test]
    fn an_outage_ending_in_a_gap_runs_its_last_slot_once() {
        let utc = |s: &str| crate::schedule::parse_instant(s, None, Default::default()).unwrap()[0];
        let gap = utc("2027-03-28T01:00:00Z");
        let watched = gap + 30_000;
        for hours in [20, 200] {
            let (s, mut t) = task(serde_json::json!({"schedule": {"cron": "* * * * *",
                "tz": "recipient"}, "misfire_grace": "30d",
                "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"}]}));
            t.last_fire_ms = Some(gap - hours * 3_600_000);
            t.next_fire_at_ms = next_fire_of(&s, &t, NOW);
            let mut runs = Vec::new();
            let mut steps = 0;
            while let Some(due) = t.next_fire_at_ms.filter(|d| *d < watched) {
                let p = fire(&s, &t, runs.len(), due, watched, watched).unwrap();
                runs.extend(
                    p.started
                        .iter()
                        .map(|r| (r.scheduled_at_ms, r.slot_wall_ms)),
                );
                t = p.progress;
                steps += 1;
                assert!(steps < 10, "{hours} h: catch-up does not end: {runs:?}");
            }
            let last = utc("2027-03-28T03:00:00Z");
            assert_eq!(runs, [(gap, Some(last))], "{hours} h");
            assert_eq!(t.last_slot_wall_ms, Some(last), "{hours} h");
            assert_eq!(t.next_fire_at_ms, Some(gap + 60_000), "{hours} h");
        }
        // Every fire of the shorter outage counted once: 20 h of minutes, and the 60 more
        // walls sharing 01:00Z.
        let (s, mut t) = task(serde_json::json!({"schedule": {"cron": "* * * * *",
            "tz": "recipient"}, "misfire_grace": "30d",
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"}]}));
        t.last_fire_ms = Some(gap - 20 * 3_600_000);
        let due = next_fire_of(&s, &t, NOW).unwrap();
        let p = fire(&s, &t, 0, due, watched, watched).unwrap();
        assert_eq!((p.progress.fires, p.progress.runs), (1_260, 1));
    }

    /// Beyond its count's bound the rest of an outage goes straight to its latest fire.
    #[test]
    fn the_rest_of_an_outage_is_counted_up_to_its_bound_then_skipped_over() {
        let (s, mut t) = task(serde_json::json!({"schedule": {"cron": "* * * * *"},
            "to": ["a"], "body": "b"}));
        t.last_fire_ms = Some(NOW);
        let watched = NOW + 1_200 * 60_000;
        let first = NOW + 60_000;
        let latest = watched - 60_000;
        let all = count_rest(&s, t.clone(), first, watched, watched, 10_000);
        assert_eq!((all.count, all.last), (1_199, (latest, None)));
        let bounded = count_rest(&s, t.clone(), first, watched, watched, 10);
        assert_eq!((bounded.count, bounded.last), (11, (latest, None)));
        // The latest missed fire found from any missed one, itself included.
        for from in [first, latest - 60_000, latest] {
            assert_eq!(
                latest_missed(&s, &mut t.clone(), from, watched, watched),
                (latest, None)
            );
        }
        // A one-shot has one fire: the search ends on it.
        let (once, t) = task(serde_json::json!({"schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}));
        assert_eq!(
            latest_missed(&once, &mut t.clone(), NOW, watched, watched),
            (NOW, None)
        );
    }
}
