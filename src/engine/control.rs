//! The control commands: cancel, pause, resume, trigger, patch. Each takes the task's lock,
//! asks `plan.rs` for the change (pure), and `commit.rs` makes it durable and only then
//! changes memory and the wheel — so once a command answers, the dispatcher (which checks
//! state under the same lock) acts on it.

use std::sync::Arc;

use super::cells::Locked;
use super::change::Change;
use super::commit;
use super::plan::{self, Refused};
use super::{derive_state, offload, Engine, EngineError, Inner, LiveState, TaskView};
use crate::model::timeline::TimelineKind;
use crate::model::TaskState;
use crate::request::{Context, FieldError, PatchRequest};

fn refused(r: Refused) -> EngineError {
    match r {
        Refused::Conflict(d) => EngineError::Conflict(d),
        Refused::Bug(e) => EngineError::Transition(e),
    }
}

impl Engine {
    /// The locked live task, or the right error: 404 if unknown, 409 if finished (every
    /// unfinished task is live). Refused while storage fails (nothing could be made durable).
    async fn locked(&self, id: &str) -> Result<Locked, EngineError> {
        self.check_storage()?;
        if let Some(l) = commit::lock(&self.inner, id).await? {
            return Ok(l);
        }
        let key = id.to_string();
        match offload::read(&self.inner, move |i| Ok(i.store.get_task(&key)?)).await? {
            None => Err(EngineError::NotFound(format!("task {id:?}"))),
            // Expired: the one finished state a command may move (a new schedule, a trigger);
            // the plans refuse the others with 409 and the task leaves the live map again.
            Some(t) if t.state == TaskState::Expired => {
                if let Some(l) = commit::lock_expired(&self.inner, id).await? {
                    return Ok(l);
                }
                // Deleted meanwhile (a retention sweep, a DELETE), or finished otherwise.
                let key = id.to_string();
                match offload::read(&self.inner, move |i| Ok(i.store.get_task(&key)?)).await? {
                    None => Err(EngineError::NotFound(format!("task {id:?}"))),
                    Some(t) => Err(EngineError::Conflict(format!(
                        "task {id:?} is already {}",
                        t.state
                    ))),
                }
            }
            Some(t) => Err(EngineError::Conflict(format!(
                "task {id:?} is already {}",
                t.state
            ))),
        }
    }

    /// Runs a command on the locked task. A bug it hits (an invalid transition) parks the task
    /// `failed` and answers 500, never 409.
    async fn command<T>(
        &self,
        id: &str,
        f: impl AsyncFnOnce(&Self, &mut Locked) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let mut l = self.locked(id).await?;
        let r = f(self, &mut l).await;
        let r = match r {
            Err(EngineError::Transition(e)) => {
                let reason = format!("bug: {e}");
                let parked = commit::park(&self.inner, &mut l, &reason).await;
                l.release(&self.inner);
                parked?;
                return Err(EngineError::Internal(reason));
            }
            r => r,
        };
        l.release(&self.inner);
        r
    }

    /// Cancels a task: no send of it starts after this returns. Durable before it returns.
    pub async fn cancel(&self, id: &str) -> Result<TaskView, EngineError> {
        let view = self
            .command(id, async |this, l| {
                let st = l.st();
                let now = this.inner.clock.now_ms();
                let p = plan::cancel(&st.spec, &st.progress, &st.runs, &st.sending, now).map_err(refused)?;
                let view_run = p.runs.iter().max_by_key(|r| r.run).cloned();
                // Sending runs stay in memory (their outcome is still settled): commit's rule.
                let c = with_event(p.change(), TimelineKind::Cancelled, now);
                stop_sends(&this.inner, l, c).await?;
                tracing::info!(task = %id, trace_id = %crate::model::timeline::hex(&l.st().spec.trace()), "task cancelled");
                Ok(TaskView {
                    task: l.st().task(),
                    run: view_run,
                })
            })
            .await?;
        Ok(match view.run {
            Some(_) => view,
            None => TaskView {
                run: self.last_run(id).await?,
                ..view
            },
        })
    }

    /// Pauses a task: nothing of it is sent until resumed; a sequence stops after its in-flight
    /// message. Durable before it returns, and survives restarts.
    pub async fn pause(&self, id: &str) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            let now = this.inner.clock.now_ms();
            let p = plan::pause(&st.spec, &st.progress, &st.runs, &st.sending, now).map_err(refused)?;
            let c = with_event(p.change(), TimelineKind::Paused, now);
            stop_sends(&this.inner, l, c).await?;
            tracing::info!(task = %id, trace_id = %crate::model::timeline::hex(&l.st().spec.trace()), "task paused");
            Ok(this.view_of(l.st()).await)
        })
        .await
    }

    /// Resumes a paused task: sequences continue at their cursor; fire times missed while
    /// paused are judged by the misfire policy.
    pub async fn resume(&self, id: &str) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            let now = this.inner.clock.now_ms();
            let p = plan::resume(&st.spec, &st.progress, &st.runs, &st.sending, now)
                .map_err(refused)?;
            let c = with_event(p.change(), TimelineKind::Resumed, now);
            commit::apply(&this.inner, l, c).await?;
            // Sends prepared before the pause and still out may go again (`stop_sends`).
            this.inner.live.lock().open_gate(&l.id);
            // The fires missed while paused are judged now, not by the fire step a moment
            // later: the answer, and a PATCH, trigger or backfill right after it, see the
            // task's real next fire. The resume is durable already; a fire step that fails
            // here is left to the timer, whose entry for it stays.
            if let Err(e) = fire_if_due(&this.inner, l).await {
                tracing::warn!(task = %id, error = %e, "the fire due at resume is left to its step");
            }
            tracing::info!(task = %id, state = %l.st().progress.state, "task resumed");
            Ok(this.view_of(l.st()).await)
        })
        .await
    }

    /// Starts a run now ("send now"). For a one-shot task this replaces its scheduled time.
    pub async fn trigger(&self, id: &str) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            let now = this.inner.clock.now_ms();
            let p = plan::trigger(&st.spec, &st.progress, now).map_err(refused)?;
            tracing::info!(task = %id, run = p.progress.fires, "run triggered");
            let mut c = with_event(p.change(), TimelineKind::Triggered, now);
            // The run the trigger started, as a fire would record it.
            let started: Vec<_> = c
                .runs
                .iter()
                .filter(|r| r.started_at_ms == now && r.state == crate::model::RunState::Running)
                .cloned()
                .collect();
            c.timeline.extend(plan::fire_events(&[], &started));
            commit::apply(&this.inner, l, c).await?;
            Ok(this.view_of(l.st()).await)
        })
        .await
    }

    /// Changes a pending or paused task; its next fire is recomputed.
    pub async fn patch(&self, id: &str, req: PatchRequest) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            if st.progress.state == TaskState::Expired && req.schedule.is_none() {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is expired; give a new schedule to re-arm it (or trigger it)"
                )));
            }
            let re_arm = st.progress.state == TaskState::Expired;
            if !re_arm && !matches!(st.progress.state, TaskState::Pending | TaskState::Paused) {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is {}; only pending or paused tasks can be changed",
                    st.progress.state
                )));
            }
            if req.changes_messages() && !st.runs.is_empty() {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is paused in the middle of a run; its messages cannot change until the run ends"
                )));
            }
            // A one-shot's new time would start a second run of the same messages (new
            // idempotency keys) while its paused run still goes on at resume.
            if req.schedule.is_some() && st.spec.schedule.is_one_shot() && !st.runs.is_empty() {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is a one-shot paused in the middle of its run; its schedule cannot change until the run ends (resume it, or cancel it and create another)"
                )));
            }
            let inner = &this.inner;
            let channels = inner.channels.clone();
            let exists = move |c: &str| channels.contains(c);
            let now = inner.clock.now_ms();
            // `apply` sets `watched_since_ms` for a new schedule (now, or its first fire if
            // earlier: one validation accepted within the grace is not missed).
            let (task, messages) = req.apply(
                &st.task(),
                &Context {
                    now_ms: now,
                    limits: &inner.config.limits,
                    channel_exists: &exists,
                },
            )?;
            let (spec, mut progress) = task.split();
            if let Some(run) = hold_moved(&st.spec, &spec, st.runs.values()) {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is paused in the middle of run {run}, whose messages wait for \
                     their slot's time in each recipient's zone; the new schedule would move \
                     that time, so it cannot change until the run ends (resume it, or change \
                     only what keeps the slot: start, end, max_runs)"
                )));
            }
            let to = derive_state(&progress, !st.runs.is_empty());
            progress.set_state(to, now)?;
            let change = with_event(
                Change {
                    progress: Some(progress),
                    spec: Some(Arc::new(spec)),
                    messages,
                    ..Change::default()
                },
                TimelineKind::Patched,
                now,
            );
            commit::apply(&this.inner, l, change).await?;
            let st = l.st();
            tracing::info!(task = %id, next_fire_at = %crate::schedule::format_opt(st.progress.next_fire_at_ms), "task changed");
            Ok(this.view_of(st).await)
        })
        .await
    }

    /// Backfill (issue 28): one run for each slot of the task's schedule in `[from, to]` that
    /// it has not handled (no completed run, nor one running or queued), in slot order with the
    /// task's pacing; the run numbers. Refused (422) rather than sent twice: more than
    /// `BACKFILL_SLOTS_MAX` slots or a `to` the schedule will reach itself (`to`), a slot that a
    /// run trimmed from the history may have sent (`from`).
    pub async fn backfill(&self, id: &str, from: u64, to: u64) -> Result<Vec<u32>, EngineError> {
        use crate::schedule::backfill::{to_backfill, Handled};
        self.command(id, async |this, l| {
            // A fire already due is judged first, as its step would a moment later: the slots
            // it stands for are the schedule's (sent, or skipped by its misfire policy), and
            // the next fire it leaves bounds the range. (Before, a backfill that came before
            // the step was refused as "the schedule's own to send" even where the misfire
            // policy skipped them: a race found by CI, right after a resume.)
            fire_if_due(&this.inner, l).await?;
            let now = this.inner.clock.now_ms();
            let st = l.st();
            // The store keeps only the newest `[store] runs_max` runs: the progress says
            // whether a started run's record is gone (its slot then unknown).
            let key = id.to_string();
            let runs = offload::read(&this.inner, move |i| Ok(i.store.runs_of(&key)?)).await?;
            let handled = Handled::of(&runs, &st.progress, now, super::herd::HERD_LEAD_MAX_MS);
            let slots = to_backfill(&st.spec, from, to, &handled).map_err(backfill_refused)?;
            let active = plan::earliest_slot(st.runs.values());
            let (p, numbers) =
                plan::backfill(&st.spec, &st.progress, active, &slots, now).map_err(refused)?;
            commit::apply(&this.inner, l, p.change()).await?;
            tracing::info!(task = %id, runs = ?numbers, "backfill");
            Ok(numbers)
        })
        .await
    }

    /// The answer's view of a task just changed; with its last run read from the store when
    /// none is active (off the workers on PostgreSQL: `offload.rs`).
    async fn view_of(&self, st: &LiveState) -> TaskView {
        let mut v = st.view();
        if v.run.is_none() {
            v.run = self.last_run(&st.spec.id).await.ok().flatten();
        }
        v
    }

    async fn last_run(&self, id: &str) -> Result<Option<crate::model::Run>, EngineError> {
        let id = id.to_string();
        offload::read(&self.inner, move |i| Ok(i.store.last_run(&id)?)).await
    }
}

/// The first run under way (a paused task's) whose recipient-time hold (its slot's wall time
/// in each message's zone, `recipient::run_hold`) a patch from `old` to `new` would change.
/// A cron's run records its slot's wall (`Run::slot_wall_ms`), which a new cron in recipient
/// time keeps; otherwise (an `at`, a run recorded before walls, a schedule no longer in
/// recipient time) the hold is read from the task's schedule at each send: a new schedule
/// that gives the run another slot, or none, would send its remaining messages at another
/// time, or at once at resume (review finding). Such a patch is refused
/// until the run ends, as a one-shot's new time is; one that keeps every run's slot (`end`,
/// `max_runs`, `start`) goes through.
fn hold_moved<'a>(
    old: &crate::model::TaskSpec,
    new: &crate::model::TaskSpec,
    runs: impl IntoIterator<Item = &'a crate::model::Run>,
) -> Option<u32> {
    use crate::schedule::recipient::run_hold;
    runs.into_iter()
        .find(|r| {
            let (at, wall) = (r.scheduled_at_ms, r.slot_wall_ms);
            run_hold(&old.schedule, &old.recipient_zones, at, wall)
                != run_hold(&new.schedule, &new.recipient_zones, at, wall)
        })
        .map(|r| r.run)
}

/// Runs the task's fire step now if its next fire is already due (`step::fire_locked`), as
/// the timer would a moment later, so a command's answer and its checks see the fire judged.
async fn fire_if_due(inner: &Arc<Inner>, l: &mut Locked) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    if l.st()
        .progress
        .next_fire_at_ms
        .is_some_and(|due| due <= now)
    {
        super::step::fire_locked(inner, l).await?;
    }
    Ok(())
}

/// A backfill range refused, as a 422 naming the field to change.
fn backfill_refused(e: crate::schedule::backfill::BackfillError) -> EngineError {
    use crate::schedule::backfill::{BackfillError, BACKFILL_SLOTS_MAX};
    use crate::schedule::format_utc;
    let (field, detail) = match e {
        BackfillError::TooMany => (
            "to",
            format!("the range holds more than {BACKFILL_SLOTS_MAX} slots of the schedule"),
        ),
        BackfillError::Backwards => ("to", "must not be before from".to_string()),
        BackfillError::Ahead { latest } => (
            "to",
            format!(
                "must not be after {}: slots after now, or from the task's next fire on, are \
                 sent by its schedule",
                format_utc(latest)
            ),
        ),
        BackfillError::MaxRuns { slots, left, max } => (
            "to",
            format!(
                "the range holds {slots} slots to backfill, but the schedule's max_runs {max} \
                 leaves {left} more runs (backfilled runs count toward it)"
            ),
        ),
        BackfillError::Trimmed { through } => (
            "from",
            format!(
                "must be after {}: the run history up to then was trimmed to [store] runs_max, \
                 so which of its slots were sent is unknown (none is sent twice)",
                format_utc(through)
            ),
        ),
    };
    EngineError::Invalid(FieldError::new(field, detail))
}

/// Carries out a cancel's or a pause's change with the task's send gate closed first, under
/// its lock and before the write (`cells::LiveMap::close_gate`): a send prepared before the
/// command, whose request is not written yet (waiting for a slot of the channel, or for an
/// access token), starts none after the answer. A write that failed leaves the gate as it
/// was.
async fn stop_sends(inner: &Arc<Inner>, l: &mut Locked, c: Change) -> Result<(), EngineError> {
    let was_closed = inner.live.lock().close_gate(&l.id);
    let r = commit::apply(inner, l, c).await;
    if r.is_err() && !was_closed {
        inner.live.lock().open_gate(&l.id);
    }
    Ok(r?)
}

/// A control command's change with its timeline event (issue 25), written with it.
fn with_event(mut c: Change, kind: TimelineKind, now: u64) -> Change {
    c.timeline
        .insert(0, crate::model::TimelineEvent::task(kind, now));
    c
}

#[cfg(test)]
mod tests {
    use super::hold_moved;
    use crate::model::{Run, TaskSpec};

    fn utc(s: &str) -> u64 {
        crate::schedule::parse_instant(s, None, Default::default()).unwrap()[0]
    }

    fn spec(cron: &str) -> TaskSpec {
        crate::request::test_task(
            serde_json::json!({"schedule": {"cron": cron, "tz": "recipient"},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                         {"to": "n", "body": "y", "tz": "America/New_York"}]}),
            utc("2027-03-27T00:00:00Z"),
        )
        .split()
        .0
    }

    /// A paused run's recorded wall decides the patch: the run of the 02:30 slot, at 01:00Z
    /// with 02:00 and 03:00 (Berlin's spring-forward gap), keeps its slot under a cron that
    /// still has 02:30 (the patch goes through) and not under one without it (refused: its
    /// New York message would go at 02:00 EDT). The 02:00 slot's run keeps its slot under an
    /// hourly cron.
    #[test]
    fn a_patch_is_judged_by_each_paused_runs_recorded_wall() {
        let old = spec("*/30 * * * *");
        let fire = utc("2027-03-28T01:00:00Z");
        let run = |n, wall| Run::new(n, fire, fire, 2).of_slot(Some(utc(wall)));
        let (second, first) = (
            run(3, "2027-03-28T02:30:00Z"),
            run(2, "2027-03-28T02:00:00Z"),
        );
        assert_eq!(hold_moved(&old, &spec("0,30 * * * *"), [&second]), None);
        assert_eq!(hold_moved(&old, &spec("30 2 * * *"), [&second]), None);
        assert_eq!(hold_moved(&old, &spec("0 * * * *"), [&second]), Some(3));
        assert_eq!(hold_moved(&old, &spec("0 * * * *"), [&first]), None);
        assert_eq!(
            hold_moved(&old, &spec("0 * * * *"), [&first, &second]),
            Some(3)
        );
    }
}
