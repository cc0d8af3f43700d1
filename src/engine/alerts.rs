//! Alerts: a message entered the failure list, a channel's breaker opened or closed.
//!
//! Every alert is logged (warn) and counted; with `[alerts] channel = "..."` it is also
//! delivered to that channel, best effort, in a task of its own (never on a run's path). Alerts
//! cannot loop: they bypass the alert channel's breaker and rate limit (so their failures never
//! open a breaker that would alert again), an alert about the alert channel itself is only
//! logged, and a failed alert is logged and counted, never alerted.

use crate::logsafe::{Escaped, Opt};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Inner;
use crate::deliver::breaker::Transition;
use crate::deliver::Alert;
use crate::model::{Failure, Outcome};
use crate::schedule::format_utc;

/// Alert deliveries in flight at most. Past it an alert is logged and counted as failed, not
/// delivered: a storm of failures (a channel down for 100 000 messages) must not make a task
/// per alert, and the alert channel can only take so much anyway.
pub(crate) const DELIVERIES_MAX: usize = 64;

/// Attempts per alert delivery, and the pause between them.
const ALERT_ATTEMPTS: u32 = 3;
const ALERT_RETRY_PAUSE: Duration = Duration::from_millis(500);

pub(crate) fn failure(inner: &Arc<Inner>, f: &Failure, event: &'static str) {
    let now = inner.clock.now_ms();
    raise(
        inner,
        Alert {
            kind: "herald.alert",
            event,
            channel: f.channel.clone(),
            task_id: Some(f.task_id.clone()),
            failure_id: Some(f.id.clone()),
            to: Some(f.to.clone()),
            attempts: Some(f.attempts),
            error: Some(f.last_error.clone()),
            at: format_utc(now),
            id: format!("alert:{event}:{}:{}", f.id, f.attempts),
        },
    );
}

/// A task was parked `failed` (a bug or a corrupt record): it will not send again by itself.
pub(crate) fn parked(inner: &Arc<Inner>, task_id: &str, channel: &str, reason: &str) {
    let now = inner.clock.now_ms();
    raise(
        inner,
        Alert {
            kind: "herald.alert",
            event: "task_failed",
            channel: channel.to_string(),
            task_id: Some(task_id.to_string()),
            failure_id: None,
            to: None,
            attempts: None,
            error: Some(reason.to_string()),
            at: format_utc(now),
            id: format!("alert:task_failed:{task_id}"),
        },
    );
}

/// Storage failed or works again.
pub(crate) fn storage(inner: &Arc<Inner>, error: Option<&str>) {
    let now = inner.clock.now_ms();
    let event = if error.is_some() {
        "storage_failing"
    } else {
        "storage_recovered"
    };
    raise(
        inner,
        Alert {
            kind: "herald.alert",
            event,
            channel: String::new(),
            task_id: None,
            failure_id: None,
            to: None,
            attempts: None,
            error: error.map(str::to_string),
            at: format_utc(now),
            id: format!("alert:{event}:{now}"),
        },
    );
}

pub(crate) fn breaker(inner: &Arc<Inner>, channel: &str, t: Transition) {
    let now = inner.clock.now_ms();
    let event = match t {
        Transition::Opened => "breaker_opened",
        Transition::Closed => "breaker_closed",
    };
    raise(
        inner,
        Alert {
            kind: "herald.alert",
            event,
            channel: channel.to_string(),
            task_id: None,
            failure_id: None,
            to: None,
            attempts: None,
            error: None,
            at: format_utc(now),
            id: format!("alert:{event}:{channel}:{now}"),
        },
    );
}

fn raise(inner: &Arc<Inner>, alert: Alert) {
    inner.alerts_raised.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(event = alert.event, channel = %alert.channel,
        task = %Opt(alert.task_id.as_deref()), failure = %Opt(alert.failure_id.as_deref()),
        error = %Opt(alert.error.as_deref()), "alert");
    let Some(target) = inner
        .config
        .alerts_channel
        .as_deref()
        .and_then(|name| inner.channels.get(name))
        .cloned()
    else {
        return;
    };
    if target.name == alert.channel {
        return; // about the alert channel itself: logged only
    }
    let Ok(permit) = inner.alert_sends.clone().try_acquire_owned() else {
        inner.alerts_failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(event = alert.event, channel = %target.name, in_flight = DELIVERIES_MAX,
            "alert not delivered: too many alert deliveries in flight (it is logged above)");
        return;
    };
    let inner = inner.clone();
    tokio::spawn(async move {
        let _permit = permit;
        for attempt in 1..=ALERT_ATTEMPTS {
            match target.send_alert(&alert, || inner.clock.now_ms()).await {
                Outcome::Sent => return,
                Outcome::Retry { error, .. }
                | Outcome::Permanent { error }
                | Outcome::Held { error, .. } => {
                    tracing::warn!(event = alert.event, attempt, error = %Escaped(&error),
                        channel = %target.name, "alert delivery failed");
                }
            }
            if attempt < ALERT_ATTEMPTS {
                tokio::time::sleep(ALERT_RETRY_PAUSE).await;
            }
        }
        inner.alerts_failed.fetch_add(1, Ordering::Relaxed);
    });
}
