//! The checks of each block of a request but the schedule (`schedule.rs`): messages, pacing,
//! retry, metadata, quiet hours, notify. Each error names its field.

use std::collections::BTreeMap;

use crate::model::{
    check_id, format_duration_ms, new_id, parse_duration_ms, Backoff, DstGap, DstPolicy, DstRepeat,
    Limits, Message, Misfire, Notify, NotifyOn, Overlap, Pacing, QuietHours, QuietSetting,
    RetryPolicy,
};
use crate::schedule::parse_tz;

use super::{
    Context, DstRequest, FieldError, MessageRequest, NotifyRequest, PacingRequest,
    QuietHoursRequest, RetryRequest,
};

/// Quiet hours as a task gives them.
pub fn validate_quiet(q: &Option<Option<QuietHoursRequest>>) -> Result<QuietSetting, FieldError> {
    use crate::schedule::quiet::parse_hhmm;
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

pub(super) fn validate_notify(
    n: Option<NotifyRequest>,
    cx: &Context,
) -> Result<Option<Notify>, FieldError> {
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
    // Checked as a message's recipient is: each notification is a send to it.
    if n.to.len() > cx.limits.recipient_bytes_max {
        return Err(FieldError::new(
            "notify.to",
            format!("must be at most {} bytes", cx.limits.recipient_bytes_max),
        ));
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

/// The task's id as given (checked), or a new one.
pub(super) fn validate_id(id: Option<String>, now_ms: u64) -> Result<String, FieldError> {
    match id {
        Some(id) => {
            check_id(&id).map_err(|e| FieldError::new("id", e))?;
            Ok(id)
        }
        None => Ok(new_id(now_ms)),
    }
}

pub(super) fn validate_name(name: Option<&str>, limits: &Limits) -> Result<(), FieldError> {
    match name {
        Some(name) if name.len() > limits.name_bytes_max => Err(FieldError::new(
            "name",
            format!("must be at most {} bytes", limits.name_bytes_max),
        )),
        _ => Ok(()),
    }
}

/// The channel named (`log` by default), which must exist.
pub(super) fn validate_channel(
    channel: Option<String>,
    cx: &Context,
) -> Result<String, FieldError> {
    let channel = channel.unwrap_or_else(|| "log".to_string());
    if !(cx.channel_exists)(&channel) {
        return Err(FieldError::new(
            "channel",
            format!("unknown channel {channel:?}; configure it under [channels.{channel}]"),
        ));
    }
    Ok(channel)
}

pub(super) fn validate_misfire(given: Option<&str>) -> Result<Misfire, FieldError> {
    choice(
        "misfire",
        given,
        &[
            ("fire_now", Misfire::FireNow),
            ("skip", Misfire::Skip),
            ("fire_all", Misfire::FireAll),
        ],
    )
}

pub(super) fn validate_overlap(given: Option<&str>) -> Result<Overlap, FieldError> {
    choice(
        "overlap",
        given,
        &[
            ("skip", Overlap::Skip),
            ("queue", Overlap::Queue),
            ("allow", Overlap::Allow),
        ],
    )
}

/// One of a fixed set of names; the first option is the default when the field is absent.
pub(super) fn choice<T: Copy>(
    field: &str,
    given: Option<&str>,
    options: &[(&str, T)],
) -> Result<T, FieldError> {
    let Some(name) = given else {
        // Every caller gives at least one option; none would be a default nobody can pick.
        return options
            .first()
            .map(|(_, v)| *v)
            .ok_or_else(|| FieldError::new(field, "has no value to default to"));
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

pub(super) fn duration(field: &str, s: &str) -> Result<u64, FieldError> {
    parse_duration_ms(s).map_err(|e| FieldError::new(field, e))
}

pub(super) fn within(field: &str, v: u64, max: u64, what: &str) -> Result<u64, FieldError> {
    if v > max {
        Err(FieldError::new(
            field,
            format!("{what} must be at most {}", format_duration_ms(max)),
        ))
    } else {
        Ok(v)
    }
}

pub(super) fn validate_dst(d: &Option<DstRequest>) -> Result<DstPolicy, FieldError> {
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

pub(super) fn validate_messages(
    messages: Option<Vec<MessageRequest>>,
    to: Option<Vec<String>>,
    body: Option<String>,
    limits: &Limits,
) -> Result<Vec<Message>, FieldError> {
    let (list, field) = messages_given(messages, to, body, limits)?;
    check_messages(&list, field, limits)?;
    Ok(list)
}

/// The broadcast shorthand checked before it is expanded: expanding copies the body once per
/// recipient, so a request within the body limit (many empty recipients, a large body) would
/// otherwise make gigabytes of copies before the limits refused it.
pub(super) fn check_broadcast(
    to: &[String],
    body: &str,
    limits: &Limits,
) -> Result<(), FieldError> {
    check_count(to.len(), "to", limits)?;
    for (i, r) in to.iter().enumerate() {
        check_recipient(r, || format!("to[{i}]"), limits)?;
    }
    if body.len() > limits.message_body_bytes_max {
        return Err(FieldError::new(
            "body",
            format!("must be at most {} bytes", limits.message_body_bytes_max),
        ));
    }
    let total = to.len().saturating_mul(body.len());
    if total > BROADCAST_BYTES_MAX {
        return Err(FieldError::new(
            "to",
            format!(
                "{} recipients of a {}-byte body are {total} bytes of messages, more than a \
                 broadcast may hold ({} MiB); send it as several tasks",
                to.len(),
                body.len(),
                BROADCAST_BYTES_MAX >> 20
            ),
        ));
    }
    Ok(())
}

/// Most bytes of messages a broadcast (`to` + `body`) may expand to: its body is copied once
/// per recipient, in memory and into one store write, which holds at most
/// `store::commit::JOB_BYTES_MAX` (1 GiB, with the task's keys and spec). Above the largest
/// broadcast the default limits allow (10 000 recipients of a 64 KiB body, 625 MiB), so it
/// only bites where `[limits]` were raised. The `messages` form is bounded by the request
/// body's own limit.
pub const BROADCAST_BYTES_MAX: usize = 768 << 20;

/// At least one message, at most `messages_max`.
pub(super) fn check_count(n: usize, field: &str, limits: &Limits) -> Result<(), FieldError> {
    if n == 0 {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if n > limits.messages_max {
        return Err(FieldError::new(
            field,
            format!("at most {} messages per task, got {n}", limits.messages_max),
        ));
    }
    Ok(())
}

/// A recipient: not empty, at most `recipient_bytes_max`.
fn check_recipient(
    to: &str,
    field: impl FnOnce() -> String,
    limits: &Limits,
) -> Result<(), FieldError> {
    if to.is_empty() {
        return Err(FieldError::new(field(), "must not be empty"));
    }
    if to.len() > limits.recipient_bytes_max {
        return Err(FieldError::new(
            field(),
            format!("must be at most {} bytes", limits.recipient_bytes_max),
        ));
    }
    Ok(())
}

/// The messages as given: a list, or the broadcast shorthand `to` + `body`; and the field
/// errors about them name (`messages` or `to`).
fn messages_given(
    messages: Option<Vec<MessageRequest>>,
    to: Option<Vec<String>>,
    body: Option<String>,
    limits: &Limits,
) -> Result<(Vec<Message>, &'static str), FieldError> {
    Ok(match (messages, to, body) {
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
        (None, Some(to), Some(body)) => {
            // Before the body is copied once per recipient.
            check_broadcast(&to, &body, limits)?;
            let list = to
                .into_iter()
                .map(|to| Message {
                    to,
                    body: body.clone(),
                    data: None,
                    tz: None,
                })
                .collect();
            (list, "to")
        }
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
    })
}

/// The count and sizes of the messages within the limits.
fn check_messages(list: &[Message], field: &str, limits: &Limits) -> Result<(), FieldError> {
    check_count(list.len(), field, limits)?;
    for (i, m) in list.iter().enumerate() {
        check_message(
            m,
            &|part| match (field, part) {
                ("to", "to") => format!("to[{i}]"),
                ("to", "body") => "body".to_string(),
                _ => format!("messages[{i}].{part}"),
            },
            limits,
        )?;
    }
    Ok(())
}

/// One message's sizes within the limits; `name` gives the field of a part of it (`to`,
/// `body`, `data`) as its errors name it.
pub(super) fn check_message(
    m: &Message,
    name: &dyn Fn(&str) -> String,
    limits: &Limits,
) -> Result<(), FieldError> {
    check_recipient(&m.to, || name("to"), limits)?;
    if m.body.len() > limits.message_body_bytes_max {
        return Err(FieldError::new(
            name("body"),
            format!("must be at most {} bytes", limits.message_body_bytes_max),
        ));
    }
    // `data` counts in the same limit as the body: together they are the message.
    if let Some(d) = &m.data {
        if m.body.len() + d.len() > limits.message_body_bytes_max {
            return Err(FieldError::new(
                name("data"),
                format!(
                    "body and data together must be at most {} bytes (body {}, data {} as JSON)",
                    limits.message_body_bytes_max,
                    m.body.len(),
                    d.len()
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn validate_pacing(p: PacingRequest, limits: &Limits) -> Result<Pacing, FieldError> {
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

pub(super) fn validate_metadata(
    m: &BTreeMap<String, String>,
    limits: &Limits,
) -> Result<(), FieldError> {
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
