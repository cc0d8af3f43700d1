//! A validated create or patch as the task it makes: the blocks checked (`validate.rs`,
//! `schedule.rs`), the task's fields filled in, its first fire worked out and checked.

use crate::model::{
    format_duration_ms, Lang, Message, Schedule, Task, TaskState, DEFAULT_MISFIRE_GRACE_MS,
};

use super::schedule::{recipient_zones, retime_recipient_at, schedule_request, validate_schedule};
use super::validate::{
    choice, duration, validate_channel, validate_id, validate_messages, validate_metadata,
    validate_misfire, validate_name, validate_notify, validate_overlap, validate_pacing,
    validate_quiet, validate_retry,
};
use super::{Context, FieldError, PatchRequest, ScheduleRequest, TaskRequest};

impl TaskRequest {
    /// Validates the request into a new pending task and its messages. Nothing is stored here.
    pub fn into_task(self, cx: &Context) -> Result<(Task, Vec<Message>), FieldError> {
        let limits = cx.limits;
        let id = validate_id(self.id, cx.now_ms)?;
        validate_name(self.name.as_deref(), limits)?;
        let channel = validate_channel(self.channel, cx)?;
        let misfire_grace_ms = match &self.misfire_grace {
            Some(s) => duration("misfire_grace", s)?,
            None => DEFAULT_MISFIRE_GRACE_MS,
        };
        let misfire = validate_misfire(self.misfire.as_deref())?;
        let overlap = validate_overlap(self.overlap.as_deref())?;
        let mut messages = validate_messages(self.messages, self.to, self.body, limits)?;
        let zones = recipient_zones(&self.schedule, &mut messages, self.default_tz.as_deref())?;
        let schedule = validate_schedule(&self.schedule, cx, misfire_grace_ms, &zones)?;
        overlap_only_with_cron(self.overlap.is_some(), &schedule)?;
        let pacing = validate_pacing(self.pacing.unwrap_or_default(), limits)?;
        let retry = self
            .retry
            .map(|r| validate_retry(r, "retry", limits))
            .transpose()?;
        let metadata = self.metadata.unwrap_or_default();
        validate_metadata(&metadata, limits)?;
        let lang = choice("lang", self.lang.as_deref(), &Lang::NAMES)?;
        let quiet_hours = validate_quiet(&self.quiet_hours)?;
        let notify = validate_notify(self.notify, cx)?;
        let mut task = Task {
            id,
            name: self.name,
            channel,
            schedule,
            message_count: messages.len() as u32,
            pacing,
            retry,
            misfire,
            misfire_grace_ms,
            overlap,
            metadata,
            state: TaskState::Pending,
            created_at_ms: cx.now_ms,
            updated_at_ms: cx.now_ms,
            next_fire_at_ms: None,
            runs: 0,
            fires: 0,
            last_fire_ms: None,
            last_slot_wall_ms: None,
            done_offsets_ms: Vec::new(),
            queued: Vec::new(),
            skipped: 0,
            expired: 0,
            watched_since_ms: cx.now_ms,
            failed_reason: None,
            lang,
            recipient_zones: zones,
            quiet_hours,
            notify,
            trace_id: self.trace_id,
        };
        task.next_fire_at_ms = crate::schedule::next_fire(&task, cx.now_ms);
        task.watched_since_ms = watched_since(&task, cx.now_ms);
        check_fires(&task, cx)?;
        sort_by_instant(&task, &mut messages);
        Ok((task, messages))
    }
}

/// Overlap is about a run still going when the next fire comes: a cron's next slot, or a
/// reminders task's next reminder (a paced run of the 30-minute reminder still sending when
/// the 15-minute one fires). API.md says "cron only"; reminders read it too (`plan::place`),
/// so it is refused only with a one-shot (`at`, `after`), where it would be kept and never read.
fn overlap_only_with_cron(named: bool, schedule: &Schedule) -> Result<(), FieldError> {
    if named && schedule.is_one_shot() {
        return Err(FieldError::new(
            "overlap",
            "only allowed with a cron or reminders schedule (a one-shot fires once)",
        ));
    }
    Ok(())
}

/// When herald starts watching a task whose schedule is new (a create, a patch's schedule):
/// now; for a one-shot whose instant is a little past, that instant. Validation accepts an
/// `at` up to `misfire_grace` in the past, and API.md says it fires at once: it must not be
/// judged missed (due before `watched_since_ms`), which `misfire: skip` would skip. Reminders
/// already past when the task is made stay missed, judged by the misfire policy as of now
/// (`tests/schedules.rs`): their lateness counts up to the moment watching began.
fn watched_since(task: &Task, now_ms: u64) -> u64 {
    match task.next_fire_at_ms {
        Some(first) if task.schedule.is_one_shot() => first.min(now_ms),
        _ => now_ms,
    }
}

/// A schedule must fire at least once, within the horizon.
fn check_fires(task: &Task, cx: &Context) -> Result<(), FieldError> {
    let field = match &task.schedule {
        Schedule::Cron { .. } => "schedule.cron",
        Schedule::Reminders { .. } => "schedule.reminders",
        _ => "schedule",
    };
    match task.next_fire_at_ms {
        None => Err(FieldError::new(
            field,
            "never fires (check start, end and max_runs)",
        )),
        Some(at) if at > cx.now_ms.saturating_add(cx.limits.horizon_ms) => Err(FieldError::new(
            if start_is_late(task, cx) {
                "schedule.start"
            } else {
                field
            },
            format!(
                "first fire is beyond the scheduling horizon ({})",
                format_duration_ms(cx.limits.horizon_ms)
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// Whether a cron's `start` is what puts its first fire beyond the horizon: without it the
/// cron would fire within the horizon. Worked out only for a schedule already refused.
fn start_is_late(task: &Task, cx: &Context) -> bool {
    let Schedule::Cron {
        start_ms: Some(_), ..
    } = &task.schedule
    else {
        return false;
    };
    let mut unbounded = task.clone();
    if let Schedule::Cron {
        start, start_ms, ..
    } = &mut unbounded.schedule
    {
        *start = None;
        *start_ms = None;
    }
    crate::schedule::next_fire(&unbounded, cx.now_ms)
        .is_some_and(|at| at <= cx.now_ms.saturating_add(cx.limits.horizon_ms))
}

impl PatchRequest {
    pub fn changes_messages(&self) -> bool {
        self.messages.is_some() || self.to.is_some() || self.body.is_some()
    }

    /// The task with the changes applied and its next fire recomputed, and the new messages if
    /// they change. Validated like a create.
    pub fn apply(
        self,
        task: &Task,
        cx: &Context,
    ) -> Result<(Task, Option<Vec<Message>>), FieldError> {
        let limits = cx.limits;
        let mut t = task.clone();
        if let Some(name) = self.name {
            validate_name(Some(&name), limits)?;
            t.name = Some(name);
        }
        let mut messages = None;
        if self.messages.is_some() || self.to.is_some() || self.body.is_some() {
            let m = validate_messages(self.messages, self.to, self.body, limits)?;
            t.message_count = m.len() as u32;
            messages = Some(m);
        }
        repatch_zones(
            &mut t,
            self.schedule.as_ref(),
            messages.as_mut(),
            self.default_tz.as_deref(),
        )?;
        if let Some(p) = self.pacing {
            t.pacing = validate_pacing(p, limits)?;
        }
        if let Some(r) = self.retry {
            t.retry = Some(validate_retry(r, "retry", limits)?);
        }
        if let Some(m) = self.metadata {
            validate_metadata(&m, limits)?;
            t.metadata = m;
        }
        if let Some(l) = self.lang.as_deref() {
            t.lang = choice("lang", Some(l), &Lang::NAMES)?;
        }
        let new_schedule = self.schedule.is_some();
        if let Some(s) = self.schedule {
            let new = validate_schedule(&s, cx, t.misfire_grace_ms, &t.recipient_zones)?;
            replace_schedule(&mut t, new);
        }
        t.updated_at_ms = cx.now_ms;
        t.next_fire_at_ms = next_fire_patched(&t, task, new_schedule, cx.now_ms);
        // A new schedule is checked as on create: it must fire, within the horizon. A change of
        // anything else keeps the schedule as it is, even one that has no fires left (a cron
        // whose `max_runs` were all started).
        if new_schedule {
            t.watched_since_ms = watched_since(&t, cx.now_ms);
            check_fires(&t, cx)?;
        }
        if let Some(m) = messages.as_mut() {
            sort_by_instant(&t, m);
        }
        Ok((t, messages))
    }
}

/// A patch's new schedule in place of the task's. A new one-shot time or cron expression starts
/// afresh; reminders keep the record of which offsets already fired, so a moved event re-plans
/// only the reminders that have not fired.
fn replace_schedule(t: &mut Task, new: Schedule) {
    let same_kind = std::mem::discriminant(&new) == std::mem::discriminant(&t.schedule);
    match (&new, same_kind) {
        (Schedule::Reminders { .. }, true) => {}
        _ => {
            t.last_fire_ms = None;
            t.last_slot_wall_ms = None;
            t.done_offsets_ms.clear();
        }
    }
    if t.schedule.is_one_shot() && new.is_one_shot() {
        t.last_fire_ms = None;
    }
    t.schedule = new;
}

/// A patched task's next fire. A new schedule starts from now. A patch of anything else keeps
/// the next fire as it was: worked out again from now, a cron that never fired would search
/// from now and lose a fire that came due while the task was paused (resume judges it by the
/// misfire policy). New messages may move the fires of a schedule in recipient time (their
/// zones): then it is worked out again, a never-fired cron searching from its old next fire.
fn next_fire_patched(t: &Task, old: &Task, new_schedule: bool, now_ms: u64) -> Option<u64> {
    if new_schedule {
        return crate::schedule::next_fire(t, now_ms);
    }
    if t.schedule == old.schedule && t.recipient_zones == old.recipient_zones {
        return old.next_fire_at_ms;
    }
    let from = old
        .next_fire_at_ms
        .map_or(now_ms, |n| n.saturating_sub(1).min(now_ms));
    crate::schedule::next_fire(t, from)
}

/// A patched task's recipient zones, checked as on create ([`recipient_zones`]: every zone
/// given, `default_tz` only in recipient time, and only with new messages, the ones it fills
/// in) against the new schedule, or the task's own when it is kept. A task in memory holds no messages: the zones are worked out again only from new
/// messages.
fn repatch_zones(
    t: &mut Task,
    schedule: Option<&ScheduleRequest>,
    messages: Option<&mut Vec<Message>>,
    default_tz: Option<&str>,
) -> Result<(), FieldError> {
    let kept;
    let s = match schedule {
        Some(s) => s,
        None => {
            kept = schedule_request(&t.schedule);
            &kept
        }
    };
    let Some(m) = messages else {
        recipient_zones(s, &mut [], default_tz)?;
        if !crate::schedule::recipient::is_recipient(s.tz.as_deref()) {
            t.recipient_zones.clear();
        } else if t.recipient_zones.is_empty() {
            return Err(FieldError::new(
                "messages",
                "required when the schedule changes to recipient time (each message's tz)",
            ));
        }
        // The task keeps no default zone: it was written into each message's tz when the
        // messages came. Alone it would change nothing, silently.
        if default_tz.is_some() {
            return Err(FieldError::new(
                "default_tz",
                "applies to the messages given with it (messages, or to and body): give them in the same request",
            ));
        }
        return Ok(());
    };
    t.recipient_zones = recipient_zones(s, m, default_tz)?;
    if schedule.is_none() {
        retime_recipient_at(&mut t.schedule, &t.recipient_zones)?;
    }
    Ok(())
}

/// In recipient time a run's messages go in order of their own instants: they are stored in
/// that order (stable: messages of one zone keep the order given), taken at the first fire.
/// Zones' offsets keep their order through DST almost everywhere, so later slots keep it too;
/// where two zones' offsets cross, a message may wait for the one before it (late, never early).
fn sort_by_instant(task: &Task, messages: &mut [Message]) {
    let (Some(fire), false) = (task.next_fire_at_ms, task.recipient_zones.is_empty()) else {
        return;
    };
    use crate::schedule::recipient::{instant_in, parse_zones, slot_wall};
    let (Schedule::At { dst, .. } | Schedule::Cron { dst, .. }) = &task.schedule else {
        return;
    };
    // The slot is found once, and each message's instant once (`message_due` per message, or
    // per comparison, searched the slot again every time).
    let zones = parse_zones(&task.recipient_zones);
    let Some(wall) = slot_wall(&task.schedule, &zones, fire) else {
        return;
    };
    messages.sort_by_cached_key(|m| {
        m.tz.as_deref()
            .and_then(|z| z.parse::<chrono_tz::Tz>().ok())
            .and_then(|z| instant_in(wall, z, *dst))
            .unwrap_or(fire)
    });
}
