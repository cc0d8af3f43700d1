//! The schedule block of a request: exactly one of `at`, `after`, `cron`, `reminders`, its zone
//! and DST policy, read into a [`Schedule`] that fires within the horizon; and recipient time
//! (each message in its own zone).

use crate::model::{format_duration_ms, DstGap, DstPolicy, DstRepeat, Message, Schedule};
use crate::schedule::{parse_instant, parse_tz};

use super::validate::{duration, validate_dst};
use super::{Context, DstRequest, FieldError, RemindersRequest, ScheduleRequest, REMINDERS_MAX};

/// Recipient time (`"tz": "recipient"`): every message's zone, from its own `tz` or the task's
/// `default_tz`, checked and filled in; the distinct zones, sorted (empty for any other
/// schedule). A message's zone is checked whatever the schedule, so a typo is never kept.
pub(super) fn recipient_zones(
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

/// A schedule given back in the shape of the request that made it (its text, zone and DST
/// policy): what [`recipient_zones`] reads of a kept one, and what a restored task is read
/// from again (`restore.rs`).
pub(super) fn schedule_request(schedule: &Schedule) -> ScheduleRequest {
    match schedule {
        Schedule::At { at, tz, dst, .. } => ScheduleRequest {
            at: Some(at.clone()),
            tz: tz.clone(),
            dst: Some(dst_request(*dst)),
            ..ScheduleRequest::default()
        },
        Schedule::After { after, .. } => ScheduleRequest {
            after: Some(after.clone()),
            ..ScheduleRequest::default()
        },
        Schedule::Cron {
            cron,
            tz,
            dst,
            start,
            end,
            max_runs,
            ..
        } => ScheduleRequest {
            cron: Some(cron.clone()),
            tz: tz.clone(),
            dst: Some(dst_request(*dst)),
            start: start.clone(),
            end: end.clone(),
            max_runs: *max_runs,
            ..ScheduleRequest::default()
        },
        Schedule::Reminders {
            event_at,
            tz,
            dst,
            before,
            ..
        } => ScheduleRequest {
            dst: Some(dst_request(*dst)),
            reminders: Some(RemindersRequest {
                event_at: event_at.clone(),
                tz: tz.clone(),
                before: before.clone(),
            }),
            ..ScheduleRequest::default()
        },
    }
}

/// A DST policy as a request names it.
fn dst_request(d: DstPolicy) -> DstRequest {
    DstRequest {
        gap: Some(
            match d.gap {
                DstGap::Shift => "shift",
                DstGap::Skip => "skip",
            }
            .to_string(),
        ),
        repeat: Some(
            match d.repeat {
                DstRepeat::First => "first",
                DstRepeat::Last => "last",
                DstRepeat::Both => "both",
            }
            .to_string(),
        ),
    }
}

/// The schedule block of a create or patch at `cx.now_ms`: read ([`read_schedule`]), then
/// timed ([`check_timing`]).
pub(super) fn validate_schedule(
    s: &ScheduleRequest,
    cx: &Context,
    misfire_grace_ms: u64,
    recipient_zones: &[String],
) -> Result<Schedule, FieldError> {
    let schedule = read_schedule(s, cx.now_ms, recipient_zones)?;
    check_timing(&schedule, cx, misfire_grace_ms)?;
    Ok(schedule)
}

/// The schedule block read into a [`Schedule`]: every rule but those about the moment it is
/// given (past, horizon: [`check_timing`]), so a task restored from a backup is read by the
/// same rules as its create (`restore.rs`). An `after` counts from `now_ms`.
pub(super) fn read_schedule(
    s: &ScheduleRequest,
    now_ms: u64,
    recipient_zones: &[String],
) -> Result<Schedule, FieldError> {
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
    if let Some(expr) = &s.cron {
        return cron(s, expr, dst);
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
        return reminders(s, r, dst);
    }
    if let Some(after) = &s.after {
        return after_now(s, after, now_ms);
    }
    at(s, dst, recipient_zones)
}

/// The rules about the moment a schedule is given: a one-shot not past by more than the
/// misfire grace, a reminder not all past by more than it, nothing beyond the horizon.
pub(super) fn check_timing(
    schedule: &Schedule,
    cx: &Context,
    misfire_grace_ms: u64,
) -> Result<(), FieldError> {
    let horizon_end = cx.now_ms.saturating_add(cx.limits.horizon_ms);
    let beyond = |field: &str| {
        FieldError::new(
            field,
            format!(
                "is beyond the scheduling horizon ({})",
                format_duration_ms(cx.limits.horizon_ms)
            ),
        )
    };
    match schedule {
        Schedule::Cron { .. } => Ok(()),
        Schedule::After { at_ms, .. } if *at_ms > horizon_end => Err(beyond("schedule.after")),
        Schedule::After { .. } => Ok(()),
        Schedule::At { at, at_ms, .. } => {
            if at_ms.saturating_add(misfire_grace_ms) < cx.now_ms {
                return Err(FieldError::new(
                    "schedule.at",
                    format!(
                        "{at:?} is in the past by more than misfire_grace ({})",
                        format_duration_ms(misfire_grace_ms)
                    ),
                ));
            }
            if *at_ms > horizon_end {
                return Err(beyond("schedule.at"));
            }
            Ok(())
        }
        Schedule::Reminders {
            event_ms,
            before_ms,
            ..
        } => {
            if *event_ms > horizon_end {
                return Err(beyond("schedule.reminders.event_at"));
            }
            // Reminders already past follow the misfire rules; but if every one of them is
            // past by more than the grace, nothing would ever be sent: that is a mistake to
            // report.
            let latest = event_ms.saturating_sub(before_ms.iter().min().copied().unwrap_or(0));
            if latest.saturating_add(misfire_grace_ms) < cx.now_ms {
                return Err(FieldError::new(
                    "schedule.reminders.event_at",
                    "every reminder is in the past by more than misfire_grace",
                ));
            }
            Ok(())
        }
    }
}

/// A zone field: `None` when absent, else an IANA name.
fn zone(field: &str, tz: &Option<String>) -> Result<Option<chrono_tz::Tz>, FieldError> {
    match tz {
        Some(name) => parse_tz(name)
            .map(Some)
            .map_err(|e| FieldError::new(field, e)),
        None => Ok(None),
    }
}

/// `cron`, with its optional `start`, `end` and `max_runs`.
fn cron(s: &ScheduleRequest, expr: &str, dst: DstPolicy) -> Result<Schedule, FieldError> {
    let recipient = crate::schedule::recipient::is_recipient(s.tz.as_deref());
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
    Ok(Schedule::Cron {
        cron: expr.to_string(),
        tz: s.tz.clone(),
        dst,
        start: s.start.clone(),
        start_ms,
        end: s.end.clone(),
        end_ms,
        max_runs: s.max_runs,
    })
}

/// `reminders`: offsets before an event, each fired once.
fn reminders(
    s: &ScheduleRequest,
    r: &RemindersRequest,
    dst: DstPolicy,
) -> Result<Schedule, FieldError> {
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
    Ok(Schedule::Reminders {
        event_at: r.event_at.clone(),
        tz: r.tz.clone(),
        dst,
        event_ms,
        before: r.before.clone(),
        before_ms,
    })
}

/// `after`: a delay from now.
fn after_now(s: &ScheduleRequest, after: &str, now_ms: u64) -> Result<Schedule, FieldError> {
    if s.tz.is_some() {
        return Err(FieldError::new("schedule.tz", "not allowed with after"));
    }
    // No local time to read, so no DST policy to follow: given, it would be kept and ignored.
    if s.dst.is_some() {
        return Err(FieldError::new("schedule.dst", "not allowed with after"));
    }
    let after_ms = duration("schedule.after", after)?;
    let at_ms = now_ms.saturating_add(after_ms);
    Ok(Schedule::After {
        after: after.to_string(),
        after_ms,
        at_ms,
    })
}

/// `at`: one instant, in a zone or in recipient time.
fn at(
    s: &ScheduleRequest,
    dst: DstPolicy,
    recipient_zones: &[String],
) -> Result<Schedule, FieldError> {
    let recipient = crate::schedule::recipient::is_recipient(s.tz.as_deref());
    let zones = crate::schedule::recipient::parse_zones(recipient_zones);
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
    Ok(Schedule::At {
        at: at.to_string(),
        tz: s.tz.clone(),
        dst,
        at_ms,
    })
}

/// A kept one-shot in recipient time whose messages, so zones, changed (a patch): its run
/// fires at the earliest of the new zones' instants of its wall time. Other schedules read
/// their zones as they fire.
pub(super) fn retime_recipient_at(
    schedule: &mut Schedule,
    recipient_zones: &[String],
) -> Result<(), FieldError> {
    let Schedule::At { at, tz, dst, at_ms } = schedule else {
        return Ok(());
    };
    if !crate::schedule::recipient::is_recipient(tz.as_deref()) {
        return Ok(());
    }
    let zones = crate::schedule::recipient::parse_zones(recipient_zones);
    *at_ms = recipient_at(at, &zones, *dst)?
        .first()
        .copied()
        .ok_or_else(|| FieldError::new("schedule.at", "has no instant in the messages' zones"))?;
    Ok(())
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
