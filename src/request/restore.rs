//! A task read back from a backup (`backup/import.rs`), checked by the rules of a create: each
//! block of its spec is given back in the request's shape and read by the same functions a
//! create reads it with (`validate.rs`, `schedule.rs`), so a file edited by hand or damaged is
//! refused naming the field it got wrong, instead of being stored for the engine to trip over
//! (a body over the limit that the store cannot read back, a cron that never fires).
//!
//! Not checked here, on purpose:
//! - the rules about the moment a task is given (`schedule::check_timing`: past, horizon): a
//!   restored task's instants are as old as the task;
//! - its channels: an import reads no channels, and a channel missing when a task sends is a
//!   case the engine has anyway (a config changed after the create);
//! - its resolved instants against their text: a newer time-zone database may resolve a local
//!   time differently, and the stored instant is the one herald has been using.

use crate::model::{
    format_duration_ms, Backoff, Limits, Message, Notify, Pacing, QuietSetting, RetryPolicy, Task,
};
use crate::schedule::parse_tz;

use super::schedule::{read_schedule, recipient_zones, schedule_request};
use super::validate::{
    check_count, check_message, validate_metadata, validate_name, validate_notify, validate_pacing,
    validate_quiet, validate_retry,
};
use super::{Context, FieldError, NotifyRequest, PacingRequest, QuietHoursRequest, RetryRequest};

/// A task's spec (not its messages: [`restored_message`], [`check_zones`]) by the rules of a
/// create; errors name the field as a create names it (`schedule.cron`, `pacing.interval`).
pub fn check_task(task: &Task, limits: &Limits) -> Result<(), FieldError> {
    validate_name(task.name.as_deref(), limits)?;
    check_count(task.message_count as usize, "message_count", limits)?;
    for (i, z) in task.recipient_zones.iter().enumerate() {
        parse_tz(z).map_err(|e| FieldError::new(format!("recipient_zones[{i}]"), e))?;
    }
    // Read, not compared: an `after` counted from the create (a patch may have moved it), an
    // instant resolved by this build's zone database.
    read_schedule(
        &schedule_request(&task.schedule),
        task.created_at_ms,
        &task.recipient_zones,
    )?;
    validate_pacing(pacing_request(task.pacing), limits)?;
    if let Some(r) = task.retry {
        validate_retry(retry_request(r), "retry", limits)?;
    }
    validate_metadata(&task.metadata, limits)?;
    if let QuietSetting::Own(q) = &task.quiet_hours {
        validate_quiet(&Some(Some(QuietHoursRequest {
            from: hhmm(q.from_min),
            to: hhmm(q.to_min),
            tz: q.tz.clone(),
        })))?;
    }
    if let Some(n) = &task.notify {
        validate_notify(
            Some(notify_request(n)),
            &Context {
                now_ms: task.created_at_ms,
                limits,
                channel_exists: &|_| true,
            },
        )?;
    }
    Ok(())
}

/// One message of a task, as a create checks it: its sizes, its `data` a JSON object, its zone
/// a zone. Errors name the message's own field (`body`, `tz`).
pub fn restored_message(m: &Message, limits: &Limits) -> Result<(), FieldError> {
    check_message(m, &|part| part.to_string(), limits)?;
    if let Some(d) = &m.data {
        let object = serde_json::from_str::<serde_json::Value>(d).is_ok_and(|v| v.is_object());
        if !object {
            return Err(FieldError::new("data", "must be a JSON object"));
        }
    }
    if let Some(z) = &m.tz {
        parse_tz(z).map_err(|e| FieldError::new("tz", e))?;
    }
    Ok(())
}

/// A task's recipient zones are its messages' (in recipient time, where each message must
/// have one; none otherwise), as a create works them out.
pub fn check_zones(task: &Task, messages: &mut [Message]) -> Result<(), FieldError> {
    let zones = recipient_zones(&schedule_request(&task.schedule), messages, None)?;
    if zones == task.recipient_zones {
        return Ok(());
    }
    let differs = zones
        .iter()
        .chain(&task.recipient_zones)
        .find(|z| !(zones.contains(z) && task.recipient_zones.contains(z)))
        .map_or(String::new(), |z| format!(" (first difference: {z:?})"));
    Err(FieldError::new(
        "recipient_zones",
        format!(
            "lists {} zones, its messages have {}{differs}",
            task.recipient_zones.len(),
            zones.len()
        ),
    ))
}

/// `HH:MM` of minutes since midnight (a value of a day or more reads back as no time).
fn hhmm(min: u16) -> String {
    format!("{:02}:{:02}", min / 60, min % 60)
}

fn pacing_request(p: Pacing) -> PacingRequest {
    PacingRequest {
        interval: Some(format_duration_ms(p.interval_ms)),
        batch_size: p.batch_size,
        // A create keeps a pause only with a batch size: one without it is given back, and
        // refused as it would be.
        batch_pause: (p.batch_size.is_some() || p.batch_pause_ms > 0)
            .then(|| format_duration_ms(p.batch_pause_ms)),
    }
}

fn retry_request(r: RetryPolicy) -> RetryRequest {
    RetryRequest {
        max_attempts: Some(r.max_attempts),
        backoff: Some(
            match r.backoff {
                Backoff::Fixed => "fixed",
                Backoff::Exponential => "exponential",
            }
            .to_string(),
        ),
        initial: Some(format_duration_ms(r.initial_ms)),
        max: Some(format_duration_ms(r.max_ms)),
    }
}

fn notify_request(n: &Notify) -> NotifyRequest {
    NotifyRequest {
        channel: n.channel.clone(),
        to: n.to.clone(),
        on: Some(n.on.iter().map(|o| o.as_str().to_string()).collect()),
    }
}
