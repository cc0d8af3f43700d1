//! The task creation request as it arrives (JSON shape of API.md) and its validation into a
//! [`Task`]. Validation is pure: `now` and the set of channels come from the caller. Every
//! error names the field it is about, in the dotted path clients see (`schedule.at`,
//! `messages[3].body`).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::duration::parse_duration_ms;
use super::id::{check_id, new_id};
use super::limits::Limits;
use super::state::TaskState;
use super::task::*;
use crate::schedule::{parse_instant, parse_tz};

/// A validation error: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub id: Option<String>,
    pub name: Option<String>,
    pub channel: Option<String>,
    pub schedule: ScheduleRequest,
    pub messages: Option<Vec<MessageRequest>>,
    /// Broadcast shorthand: one message per recipient with the same body.
    pub to: Option<Vec<String>>,
    pub body: Option<String>,
    pub pacing: Option<PacingRequest>,
    pub retry: Option<RetryRequest>,
    pub misfire: Option<String>,
    pub misfire_grace: Option<String>,
    pub overlap: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// `en` (default) or `zh`.
    pub lang: Option<String>,
    /// The zone of messages without their own `tz`, in recipient time.
    pub default_tz: Option<String>,
    /// Absent: the channel's; `null`: none; an object: the task's own window.
    #[serde(default, deserialize_with = "present")]
    pub quiet_hours: Option<Option<QuietHoursRequest>>,
    pub notify: Option<NotifyRequest>,
    /// The trace the task joins (the API sets it from `traceparent`, or starts one); never
    /// read from the body.
    #[serde(skip)]
    pub trace_id: Option<[u8; 16]>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct QuietHoursRequest {
    pub from: String,
    pub to: String,
    /// An IANA zone, or `recipient` (each message's own zone).
    pub tz: String,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct NotifyRequest {
    pub channel: String,
    pub to: String,
    pub on: Option<Vec<String>>,
}

/// A field that may be absent (outer `None`) or `null` (`Some(None)`): serde gives absent
/// fields their default and calls this only for present ones, `null` included.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Quiet hours as a task gives them.
pub fn validate_quiet(q: &Option<Option<QuietHoursRequest>>) -> Result<QuietSetting, FieldError> {
    use crate::schedule::quiet::{parse_hhmm, QuietHours};
    Ok(match q {
        None => QuietSetting::Channel,
        Some(None) => QuietSetting::Off,
        Some(Some(q)) => {
            let from_min =
                parse_hhmm(&q.from).map_err(|e| FieldError::new("quiet_hours.from", e))?;
            let to_min = parse_hhmm(&q.to).map_err(|e| FieldError::new("quiet_hours.to", e))?;
            if from_min == to_min {
                return Err(FieldError::new("quiet_hours.to", "must differ from from"));
            }
            if !crate::schedule::recipient::is_recipient(Some(&q.tz)) {
                parse_tz(&q.tz).map_err(|e| FieldError::new("quiet_hours.tz", e))?;
            }
            QuietSetting::Own(QuietHours {
                from_min,
                to_min,
                tz: q.tz.clone(),
            })
        }
    })
}

fn validate_notify(n: Option<NotifyRequest>, cx: &Context) -> Result<Option<Notify>, FieldError> {
    let Some(n) = n else { return Ok(None) };
    if !(cx.channel_exists)(&n.channel) {
        return Err(FieldError::new(
            "notify.channel",
            format!("unknown channel {:?}", n.channel),
        ));
    }
    if n.to.is_empty() {
        return Err(FieldError::new("notify.to", "must not be empty"));
    }
    let on = match n.on {
        None => vec![NotifyOn::Failed, NotifyOn::Expired],
        Some(list) => {
            let mut on = Vec::new();
            for (i, e) in list.iter().enumerate() {
                let v = choice(
                    &format!("notify.on[{i}]"),
                    Some(e),
                    &[("failed", NotifyOn::Failed), ("expired", NotifyOn::Expired)],
                )?;
                if !on.contains(&v) {
                    on.push(v);
                }
            }
            if on.is_empty() {
                return Err(FieldError::new("notify.on", "give failed, expired or both"));
            }
            on
        }
    };
    Ok(Some(Notify {
        channel: n.channel,
        to: n.to,
        on,
    }))
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    pub at: Option<String>,
    pub after: Option<String>,
    pub tz: Option<String>,
    pub dst: Option<DstRequest>,
    pub cron: Option<String>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub max_runs: Option<u32>,
    pub reminders: Option<RemindersRequest>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RemindersRequest {
    pub event_at: String,
    pub tz: Option<String>,
    pub before: Vec<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct DstRequest {
    pub gap: Option<String>,
    pub repeat: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    pub to: String,
    pub body: String,
    /// Free JSON object for the channel's templates (`{{ data.template_id }}`).
    pub data: Option<serde_json::Value>,
    /// The recipient's IANA zone (for a schedule in recipient time).
    pub tz: Option<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PacingRequest {
    pub interval: Option<String>,
    pub batch_size: Option<u32>,
    pub batch_pause: Option<String>,
}

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    pub max_attempts: Option<u32>,
    pub backoff: Option<String>,
    pub initial: Option<String>,
    pub max: Option<String>,
}

/// Most offsets in one reminders schedule.
pub const REMINDERS_MAX: usize = 100;

/// What validation needs to know about the world.
pub struct Context<'a> {
    pub now_ms: u64,
    pub limits: &'a Limits,
    pub channel_exists: &'a dyn Fn(&str) -> bool,
}

/// One of a fixed set of names; the first option is the default when the field is absent.
fn choice<T: Copy>(
    field: &str,
    given: Option<&str>,
    options: &[(&str, T)],
) -> Result<T, FieldError> {
    let Some(name) = given else {
        return Ok(options[0].1);
    };
    match options.iter().find(|(n, _)| *n == name) {
        Some((_, v)) => Ok(*v),
        None => {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            Err(FieldError::new(
                field,
                format!(
                    "unknown value {name:?}; expected one of {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn duration(field: &str, s: &str) -> Result<u64, FieldError> {
    parse_duration_ms(s).map_err(|e| FieldError::new(field, e))
}

fn within(field: &str, v: u64, max: u64, what: &str) -> Result<u64, FieldError> {
    if v > max {
        Err(FieldError::new(
            field,
            format!("{what} must be at most {}", super::format_duration_ms(max)),
        ))
    } else {
        Ok(v)
    }
}

impl TaskRequest {
    /// Validates the request into a new pending task and its messages. Nothing is stored here.
    pub fn into_task(self, cx: &Context) -> Result<(Task, Vec<Message>), FieldError> {
        let limits = cx.limits;
        let id = match self.id {
            Some(id) => {
                check_id(&id).map_err(|e| FieldError::new("id", e))?;
                id
            }
            None => new_id(cx.now_ms),
        };
        if let Some(name) = &self.name {
            if name.len() > limits.name_bytes_max {
                return Err(FieldError::new(
                    "name",
                    format!("must be at most {} bytes", limits.name_bytes_max),
                ));
            }
        }
        let channel = self.channel.unwrap_or_else(|| "log".to_string());
        if !(cx.channel_exists)(&channel) {
            return Err(FieldError::new(
                "channel",
                format!("unknown channel {channel:?}; configure it under [channels.{channel}]"),
            ));
        }
        let misfire_grace_ms = match &self.misfire_grace {
            Some(s) => duration("misfire_grace", s)?,
            None => DEFAULT_MISFIRE_GRACE_MS,
        };
        let misfire = choice(
            "misfire",
            self.misfire.as_deref(),
            &[
                ("fire_now", Misfire::FireNow),
                ("skip", Misfire::Skip),
                ("fire_all", Misfire::FireAll),
            ],
        )?;
        let overlap = choice(
            "overlap",
            self.overlap.as_deref(),
            &[
                ("skip", Overlap::Skip),
                ("queue", Overlap::Queue),
                ("allow", Overlap::Allow),
            ],
        )?;
        let mut messages = validate_messages(self.messages, self.to, self.body, limits)?;
        let zones = recipient_zones(&self.schedule, &mut messages, self.default_tz.as_deref())?;
        let schedule = validate_schedule(&self.schedule, cx, misfire_grace_ms, &zones)?;
        let pacing = validate_pacing(self.pacing.unwrap_or_default(), limits)?;
        let retry = self
            .retry
            .map(|r| validate_retry(r, "retry", limits))
            .transpose()?;
        let metadata = self.metadata.unwrap_or_default();
        validate_metadata(&metadata, limits)?;
        let lang = choice("lang", self.lang.as_deref(), &super::Lang::NAMES)?;
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
        check_fires(&task, cx)?;
        sort_by_instant(&task, &mut messages);
        Ok((task, messages))
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
            field,
            format!(
                "first fire is beyond the scheduling horizon ({})",
                super::format_duration_ms(cx.limits.horizon_ms)
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// A change to a task (`PATCH /v1/tasks/{id}`): only these fields may change.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    pub name: Option<String>,
    pub schedule: Option<ScheduleRequest>,
    pub messages: Option<Vec<MessageRequest>>,
    pub to: Option<Vec<String>>,
    pub body: Option<String>,
    pub pacing: Option<PacingRequest>,
    pub retry: Option<RetryRequest>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub lang: Option<String>,
    /// As on create: the zone of new messages without their own `tz`, in recipient time.
    pub default_tz: Option<String>,
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
            if name.len() > limits.name_bytes_max {
                return Err(FieldError::new(
                    "name",
                    format!("must be at most {} bytes", limits.name_bytes_max),
                ));
            }
            t.name = Some(name);
        }
        let mut messages = None;
        if self.messages.is_some() || self.to.is_some() || self.body.is_some() {
            let m = validate_messages(self.messages, self.to, self.body, limits)?;
            t.message_count = m.len() as u32;
            messages = Some(m);
        }
        // Recipient time needs every message's zone, and a task in memory holds no messages:
        // the zones are worked out again only from new messages.
        let recipient_after = match &self.schedule {
            Some(s) => crate::schedule::recipient::is_recipient(s.tz.as_deref()),
            None => !t.recipient_zones.is_empty(),
        };
        if recipient_after {
            match messages.as_mut() {
                Some(m) => {
                    let s = self.schedule.clone().unwrap_or_else(|| ScheduleRequest {
                        tz: Some(crate::schedule::recipient::RECIPIENT.into()),
                        ..ScheduleRequest::default()
                    });
                    t.recipient_zones = recipient_zones(&s, m, self.default_tz.as_deref())?;
                }
                None if t.recipient_zones.is_empty() => {
                    return Err(FieldError::new(
                        "messages",
                        "required when the schedule changes to recipient time (each message's tz)",
                    ))
                }
                None => {}
            }
        } else {
            t.recipient_zones.clear();
        }
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
            t.lang = choice("lang", Some(l), &super::Lang::NAMES)?;
        }
        let new_schedule = self.schedule.is_some();
        if let Some(s) = self.schedule {
            let new = validate_schedule(&s, cx, t.misfire_grace_ms, &t.recipient_zones)?;
            let same_kind = std::mem::discriminant(&new) == std::mem::discriminant(&t.schedule);
            // A new one-shot time or cron expression starts afresh from now; reminders keep
            // the record of which offsets already fired, so a moved event re-plans only the
            // reminders that have not fired.
            match (&new, same_kind) {
                (Schedule::Reminders { .. }, true) => {}
                _ => {
                    t.last_fire_ms = None;
                    t.done_offsets_ms.clear();
                }
            }
            if t.schedule.is_one_shot() && new.is_one_shot() {
                t.last_fire_ms = None;
            }
            t.schedule = new;
        }
        t.updated_at_ms = cx.now_ms;
        t.next_fire_at_ms = crate::schedule::next_fire(&t, cx.now_ms);
        // A new schedule must fire; a change of anything else keeps the schedule as it is, even
        // one that has no fires left (a cron whose `max_runs` were all started).
        if new_schedule && t.next_fire_at_ms.is_none() && !task.schedule.is_one_shot() {
            check_fires(&t, cx)?;
        }
        if let Some(m) = messages.as_mut() {
            sort_by_instant(&t, m);
        }
        Ok((t, messages))
    }
}

fn validate_dst(d: &Option<DstRequest>) -> Result<DstPolicy, FieldError> {
    let Some(d) = d else {
        return Ok(DstPolicy::default());
    };
    let gap = choice(
        "schedule.dst.gap",
        d.gap.as_deref(),
        &[("shift", DstGap::Shift), ("skip", DstGap::Skip)],
    )?;
    let repeat = choice(
        "schedule.dst.repeat",
        d.repeat.as_deref(),
        &[
            ("first", DstRepeat::First),
            ("last", DstRepeat::Last),
            ("both", DstRepeat::Both),
        ],
    )?;
    Ok(DstPolicy { gap, repeat })
}

/// Recipient time (`"tz": "recipient"`): every message's zone, from its own `tz` or the task's
/// `default_tz`, checked and filled in; the distinct zones, sorted (empty for any other
/// schedule). A message's zone is checked whatever the schedule, so a typo is never kept.
fn recipient_zones(
    s: &ScheduleRequest,
    messages: &mut [Message],
    default_tz: Option<&str>,
) -> Result<Vec<String>, FieldError> {
    use crate::schedule::recipient::is_recipient;
    if let Some(d) = default_tz {
        parse_tz(d).map_err(|e| FieldError::new("default_tz", e))?;
    }
    for (i, m) in messages.iter().enumerate() {
        if let Some(z) = &m.tz {
            parse_tz(z).map_err(|e| FieldError::new(format!("messages[{i}].tz"), e))?;
        }
    }
    if !is_recipient(s.tz.as_deref()) {
        if default_tz.is_some() {
            return Err(FieldError::new(
                "default_tz",
                "only with a schedule in recipient time (\"tz\": \"recipient\")",
            ));
        }
        return Ok(Vec::new());
    }
    if s.at.is_none() && s.cron.is_none() {
        return Err(FieldError::new(
            "schedule.tz",
            "recipient time is for at and cron schedules",
        ));
    }
    let mut zones = Vec::new();
    for (i, m) in messages.iter_mut().enumerate() {
        let zone = match (&m.tz, default_tz) {
            (Some(z), _) => z.clone(),
            (None, Some(d)) => d.to_string(),
            (None, None) => {
                return Err(FieldError::new(
                    format!("messages[{i}].tz"),
                    "required in recipient time (or give the task a default_tz)",
                ))
            }
        };
        if !zones.contains(&zone) {
            zones.push(zone.clone());
        }
        m.tz = Some(zone);
    }
    zones.sort();
    Ok(zones)
}

fn validate_schedule(
    s: &ScheduleRequest,
    cx: &Context,
    misfire_grace_ms: u64,
    recipient_zones: &[String],
) -> Result<Schedule, FieldError> {
    let recipient = crate::schedule::recipient::is_recipient(s.tz.as_deref());
    let zones = crate::schedule::recipient::parse_zones(recipient_zones);
    let kinds = [
        s.at.is_some(),
        s.after.is_some(),
        s.cron.is_some(),
        s.reminders.is_some(),
    ]
    .iter()
    .filter(|k| **k)
    .count();
    if kinds != 1 {
        return Err(FieldError::new(
            "schedule",
            "give exactly one of at, after, cron, reminders",
        ));
    }
    let dst = validate_dst(&s.dst)?;
    let zone = |field: &str, tz: &Option<String>| match tz {
        Some(name) => parse_tz(name)
            .map(Some)
            .map_err(|e| FieldError::new(field, e)),
        None => Ok(None),
    };
    if let Some(expr) = &s.cron {
        // In recipient time the cron's matches are wall times, read in each message's zone;
        // start and end are instants (with an offset).
        let tz = if recipient {
            None
        } else {
            zone("schedule.tz", &s.tz)?
        };
        crate::schedule::cron::CronSchedule::parse(expr, tz.unwrap_or(chrono_tz::UTC), dst)
            .map_err(|e| FieldError::new("schedule.cron", e))?;
        let instant = |field: &str, v: &Option<String>| -> Result<Option<u64>, FieldError> {
            match v {
                Some(text) => parse_instant(text, tz, dst)
                    .map_err(|e| FieldError::new(field, e))?
                    .first()
                    .copied()
                    .map(Some)
                    .ok_or_else(|| FieldError::new(field, "does not exist in the zone (DST gap)")),
                None => Ok(None),
            }
        };
        let start_ms = instant("schedule.start", &s.start)?;
        let end_ms = instant("schedule.end", &s.end)?;
        if let (Some(a), Some(b)) = (start_ms, end_ms) {
            if b <= a {
                return Err(FieldError::new("schedule.end", "must be after start"));
            }
        }
        if s.max_runs == Some(0) {
            return Err(FieldError::new("schedule.max_runs", "must be at least 1"));
        }
        return Ok(Schedule::Cron {
            cron: expr.clone(),
            tz: s.tz.clone(),
            dst,
            start: s.start.clone(),
            start_ms,
            end: s.end.clone(),
            end_ms,
            max_runs: s.max_runs,
        });
    }
    for (name, present) in [
        ("schedule.start", s.start.is_some()),
        ("schedule.end", s.end.is_some()),
        ("schedule.max_runs", s.max_runs.is_some()),
    ] {
        if present {
            return Err(FieldError::new(name, "only allowed with cron"));
        }
    }
    if let Some(r) = &s.reminders {
        if s.tz.is_some() {
            return Err(FieldError::new(
                "schedule.tz",
                "give the zone of reminders as schedule.reminders.tz",
            ));
        }
        let tz = zone("schedule.reminders.tz", &r.tz)?;
        let event_ms = *parse_instant(&r.event_at, tz, dst)
            .map_err(|e| FieldError::new("schedule.reminders.event_at", e))?
            .first()
            .ok_or_else(|| {
                FieldError::new(
                    "schedule.reminders.event_at",
                    "does not exist in the zone (DST gap) and dst.gap is skip",
                )
            })?;
        if r.before.is_empty() || r.before.len() > REMINDERS_MAX {
            return Err(FieldError::new(
                "schedule.reminders.before",
                format!("give 1 to {REMINDERS_MAX} offsets"),
            ));
        }
        let mut before_ms = Vec::with_capacity(r.before.len());
        for (i, b) in r.before.iter().enumerate() {
            let field = format!("schedule.reminders.before[{i}]");
            let ms = duration(&field, b)?;
            if ms == 0 || ms > event_ms {
                return Err(FieldError::new(
                    field,
                    "must be more than 0 and before the event",
                ));
            }
            if before_ms.contains(&ms) {
                return Err(FieldError::new(field, "appears twice"));
            }
            before_ms.push(ms);
        }
        if event_ms > cx.now_ms.saturating_add(cx.limits.horizon_ms) {
            return Err(FieldError::new(
                "schedule.reminders.event_at",
                format!(
                    "is beyond the scheduling horizon ({})",
                    super::format_duration_ms(cx.limits.horizon_ms)
                ),
            ));
        }
        // Reminders already past follow the misfire rules; but if every one of them is past
        // by more than the grace, nothing would ever be sent: that is a mistake to report.
        let latest = event_ms - before_ms.iter().min().copied().unwrap_or(0);
        if latest.saturating_add(misfire_grace_ms) < cx.now_ms {
            return Err(FieldError::new(
                "schedule.reminders.event_at",
                "every reminder is in the past by more than misfire_grace",
            ));
        }
        return Ok(Schedule::Reminders {
            event_at: r.event_at.clone(),
            tz: r.tz.clone(),
            dst,
            event_ms,
            before: r.before.clone(),
            before_ms,
        });
    }
    let horizon_end = cx.now_ms.saturating_add(cx.limits.horizon_ms);
    if let Some(after) = &s.after {
        if s.tz.is_some() {
            return Err(FieldError::new("schedule.tz", "not allowed with after"));
        }
        let after_ms = duration("schedule.after", after)?;
        let at_ms = cx.now_ms.saturating_add(after_ms);
        if at_ms > horizon_end {
            return Err(FieldError::new(
                "schedule.after",
                format!(
                    "is beyond the scheduling horizon ({})",
                    super::format_duration_ms(cx.limits.horizon_ms)
                ),
            ));
        }
        return Ok(Schedule::After {
            after: after.clone(),
            after_ms,
            at_ms,
        });
    }
    let at = s.at.as_deref().unwrap_or_default();
    let instants = if recipient {
        recipient_at(at, &zones, dst)?
    } else {
        let tz = match &s.tz {
            Some(name) => Some(parse_tz(name).map_err(|e| FieldError::new("schedule.tz", e))?),
            None => None,
        };
        parse_instant(at, tz, dst).map_err(|e| FieldError::new("schedule.at", e))?
    };
    // A one-shot fires once: with `repeat: both` it takes the first of the two instants.
    let Some(&at_ms) = instants.first() else {
        return Err(FieldError::new(
            "schedule.at",
            format!(
                "{at:?} does not exist in {} (DST gap) and dst.gap is skip",
                s.tz.as_deref().unwrap_or("UTC")
            ),
        ));
    };
    if at_ms.saturating_add(misfire_grace_ms) < cx.now_ms {
        return Err(FieldError::new(
            "schedule.at",
            format!(
                "{at:?} is in the past by more than misfire_grace ({})",
                super::format_duration_ms(misfire_grace_ms)
            ),
        ));
    }
    if at_ms > horizon_end {
        return Err(FieldError::new(
            "schedule.at",
            format!(
                "is beyond the scheduling horizon ({})",
                super::format_duration_ms(cx.limits.horizon_ms)
            ),
        ));
    }
    Ok(Schedule::At {
        at: at.to_string(),
        tz: s.tz.clone(),
        dst,
        at_ms,
    })
}

/// In recipient time a run's messages go in order of their own instants: they are stored in
/// that order (stable: messages of one zone keep the order given), taken at the first fire.
/// Zones' offsets keep their order through DST almost everywhere, so later slots keep it too;
/// where two zones' offsets cross, a message may wait for the one before it (late, never early).
fn sort_by_instant(task: &Task, messages: &mut [Message]) {
    let (Some(fire), false) = (task.next_fire_at_ms, task.recipient_zones.is_empty()) else {
        return;
    };
    use crate::schedule::recipient::{message_due, parse_zones};
    let zones = parse_zones(&task.recipient_zones);
    messages.sort_by_key(|m| {
        m.tz.as_deref()
            .and_then(|z| message_due(&task.schedule, &zones, fire, z))
            .unwrap_or(fire)
    });
}

/// A one-shot in recipient time: `at` is a wall time (no offset); its run fires at the
/// earliest of the zones' instants.
fn recipient_at(at: &str, zones: &[chrono_tz::Tz], dst: DstPolicy) -> Result<Vec<u64>, FieldError> {
    use crate::schedule::recipient::{first_instant, wall_of};
    if chrono::DateTime::parse_from_rfc3339(at).is_ok() {
        return Err(FieldError::new(
            "schedule.at",
            "in recipient time give a local time without offset (\"2026-12-02T09:00:00\"): each message goes at it in its own zone",
        ));
    }
    let naive = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(at, f).ok())
        .ok_or_else(|| {
            FieldError::new(
                "schedule.at",
                format!("invalid local time {at:?}: expected e.g. \"2026-12-02T09:00:00\""),
            )
        })?;
    let wall = wall_of(naive)
        .ok_or_else(|| FieldError::new("schedule.at", format!("{at:?} is before 1970")))?;
    Ok(first_instant(wall, zones, dst).into_iter().collect())
}

fn validate_messages(
    messages: Option<Vec<MessageRequest>>,
    to: Option<Vec<String>>,
    body: Option<String>,
    limits: &Limits,
) -> Result<Vec<Message>, FieldError> {
    let (list, field): (Vec<Message>, &str) = match (messages, to, body) {
        (Some(m), None, None) => {
            let mut list = Vec::with_capacity(m.len());
            for (i, m) in m.into_iter().enumerate() {
                let data = match m.data {
                    None | Some(serde_json::Value::Null) => None,
                    Some(v @ serde_json::Value::Object(_)) => Some(v.to_string()),
                    Some(_) => {
                        return Err(FieldError::new(
                            format!("messages[{i}].data"),
                            "must be a JSON object",
                        ))
                    }
                };
                list.push(Message {
                    to: m.to,
                    body: m.body,
                    data,
                    tz: m.tz,
                });
            }
            (list, "messages")
        }
        (None, Some(to), Some(body)) => (
            to.into_iter()
                .map(|to| Message {
                    to,
                    body: body.clone(),
                    data: None,
                    tz: None,
                })
                .collect(),
            "to",
        ),
        (None, Some(_), None) => return Err(FieldError::new("body", "required with to")),
        (None, None, Some(_)) => return Err(FieldError::new("to", "required with body")),
        (None, None, None) => {
            return Err(FieldError::new(
                "messages",
                "required (or the broadcast shorthand to + body)",
            ))
        }
        _ => {
            return Err(FieldError::new(
                "messages",
                "give either messages or to + body, not both",
            ))
        }
    };
    if list.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if list.len() > limits.messages_max {
        return Err(FieldError::new(
            field,
            format!(
                "at most {} messages per task, got {}",
                limits.messages_max,
                list.len()
            ),
        ));
    }
    for (i, m) in list.iter().enumerate() {
        let (to_field, body_field) = if field == "to" {
            (format!("to[{i}]"), "body".to_string())
        } else {
            (format!("messages[{i}].to"), format!("messages[{i}].body"))
        };
        if m.to.is_empty() {
            return Err(FieldError::new(to_field, "must not be empty"));
        }
        if m.to.len() > limits.recipient_bytes_max {
            return Err(FieldError::new(
                to_field,
                format!("must be at most {} bytes", limits.recipient_bytes_max),
            ));
        }
        if m.body.len() > limits.message_body_bytes_max {
            return Err(FieldError::new(
                body_field,
                format!("must be at most {} bytes", limits.message_body_bytes_max),
            ));
        }
        // `data` counts in the same limit as the body: together they are the message.
        if let Some(d) = &m.data {
            if m.body.len() + d.len() > limits.message_body_bytes_max {
                return Err(FieldError::new(
                    format!("messages[{i}].data"),
                    format!(
                        "body and data together must be at most {} bytes (body {}, data {} as JSON)",
                        limits.message_body_bytes_max,
                        m.body.len(),
                        d.len()
                    ),
                ));
            }
        }
    }
    Ok(list)
}

fn validate_pacing(p: PacingRequest, limits: &Limits) -> Result<Pacing, FieldError> {
    let interval_ms = match &p.interval {
        Some(s) => within(
            "pacing.interval",
            duration("pacing.interval", s)?,
            limits.interval_ms_max,
            "interval",
        )?,
        None => 0,
    };
    if p.batch_size == Some(0) {
        return Err(FieldError::new("pacing.batch_size", "must be at least 1"));
    }
    let batch_pause_ms = match (&p.batch_pause, p.batch_size) {
        (Some(_), None) => {
            return Err(FieldError::new(
                "pacing.batch_pause",
                "needs pacing.batch_size",
            ))
        }
        (Some(s), Some(_)) => within(
            "pacing.batch_pause",
            duration("pacing.batch_pause", s)?,
            limits.interval_ms_max,
            "batch_pause",
        )?,
        (None, _) => 0,
    };
    Ok(Pacing {
        interval_ms,
        batch_size: p.batch_size,
        batch_pause_ms,
    })
}

/// Validates a retry block; `prefix` is its path (`retry`, or `channels.x.retry` in config).
pub fn validate_retry(
    r: RetryRequest,
    prefix: &str,
    limits: &Limits,
) -> Result<RetryPolicy, FieldError> {
    let d = RetryPolicy::default();
    let max_attempts = r.max_attempts.unwrap_or(d.max_attempts);
    if max_attempts == 0 || max_attempts > limits.max_attempts_max {
        return Err(FieldError::new(
            format!("{prefix}.max_attempts"),
            format!("must be between 1 and {}", limits.max_attempts_max),
        ));
    }
    let backoff = choice(
        &format!("{prefix}.backoff"),
        r.backoff.as_deref(),
        &[
            ("fixed", Backoff::Fixed),
            ("exponential", Backoff::Exponential),
        ],
    )?;
    let field = format!("{prefix}.initial");
    let initial_ms = match &r.initial {
        Some(s) => within(
            &field,
            duration(&field, s)?,
            limits.backoff_ms_max,
            "backoff",
        )?,
        None => d.initial_ms,
    };
    let field = format!("{prefix}.max");
    let max_ms = match &r.max {
        Some(s) => within(
            &field,
            duration(&field, s)?,
            limits.backoff_ms_max,
            "backoff",
        )?,
        None => d.max_ms.max(initial_ms),
    };
    if max_ms < initial_ms {
        return Err(FieldError::new(field, "must not be less than initial"));
    }
    Ok(RetryPolicy {
        max_attempts,
        backoff,
        initial_ms,
        max_ms,
    })
}

fn validate_metadata(m: &BTreeMap<String, String>, limits: &Limits) -> Result<(), FieldError> {
    if m.len() > limits.metadata_entries_max {
        return Err(FieldError::new(
            "metadata",
            format!("at most {} entries", limits.metadata_entries_max),
        ));
    }
    for (k, v) in m {
        if k.is_empty() || k.len() > limits.metadata_key_bytes_max {
            return Err(FieldError::new(
                "metadata",
                format!(
                    "keys must be 1 to {} bytes, got {k:?}",
                    limits.metadata_key_bytes_max
                ),
            ));
        }
        if v.len() > limits.metadata_value_bytes_max {
            return Err(FieldError::new(
                format!("metadata.{k}"),
                format!("must be at most {} bytes", limits.metadata_value_bytes_max),
            ));
        }
    }
    Ok(())
}

/// A task as a create would make it from this JSON at `now_ms` (default limits, every channel
/// known): the fixture of the engine's and schedule's unit tests.
#[cfg(test)]
pub(crate) fn test_task(v: serde_json::Value, now_ms: u64) -> Task {
    let req: TaskRequest = serde_json::from_value(v).expect("a valid test request");
    req.into_task(&Context {
        now_ms,
        limits: &Limits::default(),
        channel_exists: &|_| true,
    })
    .expect("a valid test task")
    .0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_780_000_000_000; // 2026-05-28

    fn task(v: serde_json::Value) -> Result<Task, FieldError> {
        task_and_messages(v).map(|(t, _)| t)
    }

    fn task_and_messages(v: serde_json::Value) -> Result<(Task, Vec<Message>), FieldError> {
        let req: TaskRequest = serde_json::from_value(v).expect("shape");
        let limits = Limits::default();
        let exists = |c: &str| c == "log" || c == "hook";
        req.into_task(&Context {
            now_ms: NOW,
            limits: &limits,
            channel_exists: &exists,
        })
    }

    fn err_field(v: serde_json::Value) -> String {
        task(v).expect_err("should be invalid").field
    }

    #[test]
    fn minimal_task_gets_defaults() {
        let t = task(json!({"schedule": {"after": "5s"}, "messages": [{"to": "a", "body": "hi"}]}))
            .unwrap();
        assert_eq!(t.channel, "log");
        assert_eq!(t.state, TaskState::Pending);
        assert_eq!(t.next_fire_at_ms, Some(NOW + 5_000));
        assert_eq!(t.misfire_grace_ms, DEFAULT_MISFIRE_GRACE_MS);
        assert_eq!(t.retry, None);
        assert_eq!(t.id.len(), 20);
    }

    #[test]
    fn a_patch_that_keeps_the_schedule_is_fine_when_no_fires_are_left() {
        // Found by the simulation: a paused cron whose max_runs were all started.
        let mut t = task(json!({"schedule": {"cron": "*/5 * * * * *", "max_runs": 1},
            "to": ["a"], "body": "b"}))
        .unwrap();
        t.runs = 1;
        t.next_fire_at_ms = None;
        let limits = Limits::default();
        let cx = Context {
            now_ms: NOW,
            limits: &limits,
            channel_exists: &|_| true,
        };
        let p: PatchRequest = serde_json::from_value(json!({"metadata": {"k": "v"}})).unwrap();
        let (patched, messages) = p.apply(&t, &cx).unwrap();
        assert_eq!(patched.metadata.get("k").map(String::as_str), Some("v"));
        assert!(messages.is_none());
        // A new schedule that never fires is still refused.
        let p: PatchRequest = serde_json::from_value(json!({"schedule":
            {"cron": "*/5 * * * * *", "end": "2020-01-01T00:00:00Z"}}))
        .unwrap();
        assert!(p.apply(&t, &cx).is_err());
    }

    #[test]
    fn message_data_is_an_object_counted_in_the_size_limit() {
        let (_, messages) = task_and_messages(json!({"schedule": {"after": "1s"},
            "messages": [{"to": "a", "body": "b", "data": {"template_id": "T1", "n": [1, 2]}},
                         {"to": "c", "body": "d", "data": null}]}))
        .unwrap();
        let d: serde_json::Value =
            serde_json::from_str(messages[0].data.as_deref().unwrap()).unwrap();
        assert_eq!(d, json!({"template_id": "T1", "n": [1, 2]}));
        assert_eq!(messages[1].data, None);
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"},
                "messages": [{"to": "a", "body": "b"}, {"to": "a", "body": "b", "data": [1]}]})),
            "messages[1].data"
        );
        let big = "x".repeat(64 * 1024 - 10);
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"},
                "messages": [{"to": "a", "body": big, "data": {"k": "0123456789"}}]})),
            "messages[0].data"
        );
    }

    #[test]
    fn broadcast_shorthand_expands() {
        let (t, messages) = task_and_messages(
            json!({"schedule": {"after": "1s"}, "to": ["a", "b", "c"], "body": "x",
                            "pacing": {"interval": "3s"}}),
        )
        .unwrap();
        assert_eq!(t.message_count, 3);
        assert_eq!(
            messages[2],
            Message {
                to: "c".into(),
                body: "x".into(),
                data: None,
                tz: None,
            }
        );
        assert_eq!(t.pacing.interval_ms, 3_000);
    }

    #[test]
    fn at_with_zone_and_grace() {
        let t = task(
            json!({"schedule": {"at": "2026-12-01T09:00:00", "tz": "Asia/Shanghai"},
                            "messages": [{"to": "a", "body": "b"}]}),
        )
        .unwrap();
        assert_eq!(t.next_fire_at_ms, Some(1_796_086_800_000));
        // Five minutes ago is within the default 10m grace: accepted, fires at once.
        let five_ago = crate::schedule::format_utc(NOW - 300_000);
        assert!(task(
            json!({"schedule": {"at": five_ago}, "messages": [{"to": "a", "body": "b"}]})
        )
        .is_ok());
    }

    #[test]
    fn each_error_names_its_field() {
        let m = json!([{"to": "a", "body": "b"}]);
        assert_eq!(
            err_field(json!({"id": "a b", "schedule": {"after": "1s"}, "messages": m})),
            "id"
        );
        assert_eq!(
            err_field(json!({"channel": "nope", "schedule": {"after": "1s"}, "messages": m})),
            "channel"
        );
        assert_eq!(
            err_field(json!({"schedule": {"after": "soon"}, "messages": m})),
            "schedule.after"
        );
        assert_eq!(
            err_field(json!({"schedule": {"at": "2020-01-01T00:00:00Z"}, "messages": m})),
            "schedule.at"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"at": "2026-12-01T09:00:00", "tz": "Nowhere/X"}, "messages": m})
            ),
            "schedule.tz"
        );
        assert_eq!(
            err_field(json!({"schedule": {"at": "2100-01-01T00:00:00Z"}, "messages": m})),
            "schedule.at"
        );
        assert_eq!(
            err_field(json!({"schedule": {}, "messages": m})),
            "schedule"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"after": "1s", "at": "2026-12-01T00:00:00Z"}, "messages": m})
            ),
            "schedule"
        );
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "messages": []})),
            "messages"
        );
        assert_eq!(err_field(json!({"schedule": {"after": "1s"}})), "messages");
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "messages": [{"to": "", "body": "b"}]})),
            "messages[0].to"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"after": "1s"}, "messages": m, "pacing": {"interval": "3x"}})
            ),
            "pacing.interval"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"after": "1s"}, "messages": m, "retry": {"max_attempts": 0}})
            ),
            "retry.max_attempts"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"after": "1s"}, "messages": m, "retry": {"initial": "1m", "max": "1s"}})
            ),
            "retry.max"
        );
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "messages": m, "misfire": "later"})),
            "misfire"
        );
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "messages": m, "overlap": "x"})),
            "overlap"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"after": "1s"}, "messages": m, "metadata": {"k": "v".repeat(2000)}})
            ),
            "metadata.k"
        );
        assert_eq!(
            err_field(
                json!({"schedule": {"at": "2026-12-01T09:00:00", "tz": "UTC", "dst": {"gap": "x"}}, "messages": m})
            ),
            "schedule.dst.gap"
        );
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "to": ["a"]})),
            "body"
        );
        let big = "x".repeat(64 * 1024 + 1);
        assert_eq!(
            err_field(json!({"schedule": {"after": "1s"}, "messages": [{"to": "a", "body": big}]})),
            "messages[0].body"
        );
    }

    #[test]
    fn dst_gap_skip_on_a_one_shot_is_an_error() {
        let e = task(
            json!({"schedule": {"at": "2027-03-14T02:30:00", "tz": "America/New_York",
                                          "dst": {"gap": "skip"}},
                            "messages": [{"to": "a", "body": "b"}]}),
        )
        .unwrap_err();
        assert_eq!(e.field, "schedule.at");
        assert!(e.detail.contains("DST gap"), "{}", e.detail);
    }

    #[test]
    fn unknown_fields_are_rejected_by_shape() {
        let r: Result<TaskRequest, _> = serde_json::from_value(
            json!({"schedule": {"after": "1s"}, "messages": [], "colour": "red"}),
        );
        assert!(r.unwrap_err().to_string().contains("unknown field"));
    }
}
