//! JSON views of tasks, runs and failures, as API.md shows them. Instants are RFC 3339 UTC.

use std::sync::atomic::Ordering;

use serde::Serialize;
use serde_json::{json, Value};

use crate::deliver::breaker::BreakerState;
use crate::deliver::success::SuccessRule;
use crate::deliver::token::TokenState;
use crate::deliver::{Channel, Sink};

use crate::engine::TaskView;
use crate::model::{
    format_duration_ms, Backoff, DstGap, DstPolicy, DstRepeat, Failure, Lang, Misfire, Overlap,
    Pacing, RetryPolicy, Run, RunState, Schedule, TaskState,
};
use crate::schedule::plan::next_fire_wall;
use crate::schedule::recipient::next_fire_human;
use crate::schedule::{describe_in, format_utc};

fn instant(ms: Option<u64>) -> Value {
    ms.map(|m| json!(format_utc(m))).unwrap_or(Value::Null)
}

fn dst(d: &DstPolicy) -> Value {
    json!({
        "gap": match d.gap { DstGap::Shift => "shift", DstGap::Skip => "skip" },
        "repeat": match d.repeat {
            DstRepeat::First => "first", DstRepeat::Last => "last", DstRepeat::Both => "both"
        },
    })
}

/// Sets `key` of a JSON object (the views build objects with `json!({..})`; anything else
/// is left as it is).
pub(crate) fn put(v: &mut Value, key: &str, x: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.to_string(), x);
    }
}

/// The schedule as created (optional parts only when given), plus the DST policy in force.
pub fn schedule(s: &Schedule) -> Value {
    match s {
        Schedule::At { at, tz, dst: d, .. } => {
            let mut v = json!({ "at": at, "dst": dst(d) });
            if let Some(tz) = tz {
                put(&mut v, "tz", json!(tz));
            }
            v
        }
        Schedule::After { after, .. } => json!({ "after": after }),
        Schedule::Cron {
            cron,
            tz,
            dst: d,
            start,
            end,
            max_runs,
            ..
        } => {
            let mut v =
                json!({ "cron": cron, "tz": tz.as_deref().unwrap_or("UTC"), "dst": dst(d) });
            if let Some(x) = start {
                put(&mut v, "start", json!(x));
            }
            if let Some(x) = end {
                put(&mut v, "end", json!(x));
            }
            if let Some(x) = max_runs {
                put(&mut v, "max_runs", json!(x));
            }
            v
        }
        Schedule::Reminders {
            event_at,
            tz,
            dst: d,
            before,
            ..
        } => {
            let mut r = json!({ "event_at": event_at, "before": before });
            if let Some(tz) = tz {
                put(&mut r, "tz", json!(tz));
            }
            json!({ "reminders": r, "dst": dst(d) })
        }
    }
}

/// Progress of a run; `eta` is when its last message is due to start, from pacing.
pub fn progress(r: &Run, pacing: &Pacing, now_ms: u64) -> Value {
    let eta = match r.state {
        RunState::Running => {
            // The next message at `next_at`, then one gap (interval or batch pause) before
            // each of the rest. Rate limits and retries can only make it later.
            let next = r.next_at_ms.unwrap_or(now_ms).max(now_ms);
            let gaps = pacing.gaps_between(r.cursor.saturating_add(1), r.total);
            Some(next.saturating_add(gaps))
        }
        _ => r.finished_at_ms,
    };
    json!({
        "run": r.run,
        "total": r.total,
        "sent": r.sent,
        "failed": r.failed,
        "in_flight": u32::from(r.in_flight.is_some()),
        "eta": instant(eta),
    })
}

/// A task's retry policy as the view shows it (fields in the order the JSON has them).
#[derive(Serialize)]
pub struct RetryDoc {
    backoff: &'static str,
    initial: String,
    max: String,
    max_attempts: u32,
}

fn retry_doc(r: &RetryPolicy) -> RetryDoc {
    RetryDoc {
        backoff: match r.backoff {
            Backoff::Fixed => "fixed",
            Backoff::Exponential => "exponential",
        },
        initial: format_duration_ms(r.initial_ms),
        max: format_duration_ms(r.max_ms),
        max_attempts: r.max_attempts,
    }
}

#[derive(Serialize)]
pub struct FiresDoc {
    expired: u32,
    handled: u32,
    queued: usize,
    skipped: u32,
}

/// Pacing as the view shows it: the batch fields only when batches are set.
#[derive(Serialize)]
pub struct PacingDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_pause: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_size: Option<u32>,
    interval: String,
}

fn pacing_doc(p: &Pacing) -> PacingDoc {
    PacingDoc {
        batch_pause: p.batch_size.map(|_| format_duration_ms(p.batch_pause_ms)),
        batch_size: p.batch_size,
        interval: format_duration_ms(p.interval_ms),
    }
}

/// The task view, serialized straight from borrowed fields: every create answers one, and
/// building it as a `serde_json::Value` first (a map insert and a string per field) was ~17 %
/// of herald's CPU per create. Fields are in alphabetical order, the order a `Value`'s map
/// prints them in, so the bytes are those the `json!` view printed (a unit test holds the two
/// equal).
#[derive(Serialize)]
pub struct TaskDoc<'a> {
    channel: &'a str,
    created_at: String,
    description: String,
    failed_reason: Option<&'a str>,
    fires: FiresDoc,
    id: &'a str,
    lang: &'static str,
    messages: u32,
    metadata: &'a std::collections::BTreeMap<String, String>,
    misfire: &'static str,
    misfire_grace: String,
    name: Option<&'a str>,
    next_fire_at: Option<String>,
    next_fire_human: Option<String>,
    /// Only when the task has one (the bytes of other tasks' views stay as they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    notify: Option<Value>,
    overlap: &'static str,
    pacing: PacingDoc,
    progress: Option<Value>,
    /// The task's own window, or `null` when it opted out; absent: the channel's.
    #[serde(skip_serializing_if = "Option::is_none")]
    quiet_hours: Option<Value>,
    retry: RetryDoc,
    runs: u32,
    schedule: Value,
    state: &'static str,
    /// The task's W3C trace id (32 hex digits); from its id for tasks made before traces.
    trace_id: String,
    updated_at: String,
}

/// The task view. `channel_retry` is the channel's default, shown when the task has none. The
/// texts for people (`description`, `next_fire_human`) are in `want` (the request's language),
/// or else the task's own.
pub fn task_doc(
    v: &TaskView,
    channel_retry: RetryPolicy,
    now_ms: u64,
    want: Option<Lang>,
) -> TaskDoc<'_> {
    let t = &v.task;
    let lang = want.unwrap_or(t.lang);
    TaskDoc {
        channel: &t.channel,
        created_at: format_utc(t.created_at_ms),
        description: describe_in(&t.schedule, lang),
        failed_reason: t.failed_reason.as_deref(),
        fires: FiresDoc {
            expired: t.expired,
            handled: t.fires,
            queued: t.queued.len(),
            skipped: t.skipped,
        },
        id: &t.id,
        lang: t.lang.as_str(),
        messages: t.message_count,
        metadata: &t.metadata,
        misfire: match t.misfire {
            Misfire::FireNow => "fire_now",
            Misfire::Skip => "skip",
            Misfire::FireAll => "fire_all",
        },
        misfire_grace: format_duration_ms(t.misfire_grace_ms),
        name: t.name.as_deref(),
        next_fire_at: t.next_fire_at_ms.map(format_utc),
        next_fire_human: t.next_fire_at_ms.map(|at| {
            let fire = (at, next_fire_wall(t));
            next_fire_human(&t.schedule, &t.recipient_zones, fire, now_ms, lang)
        }),
        notify: t.notify.as_ref().map(|n| {
            json!({"channel": n.channel, "to": n.to,
                "on": n.on.iter().map(|o| o.as_str()).collect::<Vec<_>>()})
        }),
        overlap: match t.overlap {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
            Overlap::Allow => "allow",
        },
        pacing: pacing_doc(&t.pacing),
        progress: v.run.as_ref().map(|r| progress(r, &t.pacing, now_ms)),
        quiet_hours: match &t.quiet_hours {
            crate::model::QuietSetting::Channel => None,
            crate::model::QuietSetting::Off => Some(Value::Null),
            crate::model::QuietSetting::Own(q) => Some(json!({
                "from": format!("{:02}:{:02}", q.from_min / 60, q.from_min % 60),
                "to": format!("{:02}:{:02}", q.to_min / 60, q.to_min % 60),
                "tz": q.tz,
            })),
        },
        retry: retry_doc(&t.retry.unwrap_or(channel_retry)),
        runs: t.runs,
        schedule: schedule(&t.schedule),
        state: t.state.as_str(),
        trace_id: crate::model::timeline::hex(&trace_id_of(t)),
        updated_at: format_utc(t.updated_at_ms),
    }
}

pub use crate::model::timeline::trace_id_of;

pub fn run(r: &Run) -> Value {
    json!({
        "run": r.run,
        "state": match r.state {
            RunState::Running => "running",
            RunState::Completed => "completed",
            RunState::Cancelled => "cancelled",
            RunState::Skipped => "skipped",
            RunState::Expired => "expired",
        },
        "reason": r.reason,
        "scheduled_at": format_utc(r.scheduled_at_ms),
        "started_at": format_utc(r.started_at_ms),
        "finished_at": instant(r.finished_at_ms),
        "total": r.total,
        "cursor": r.cursor,
        "in_flight": r.in_flight,
        "attempts": r.attempts,
        "sent": r.sent,
        "failed": r.failed,
        "next_at": instant(r.next_at_ms),
    })
}

pub fn failure(f: &Failure) -> Value {
    json!({
        "id": f.id,
        "task_id": f.task_id,
        "run": f.run,
        "seq": f.seq,
        "to": f.to,
        "channel": f.channel,
        "attempts": f.attempts,
        "last_error": f.last_error,
        "failed_at": format_utc(f.failed_at_ms),
        "retrying": f.retrying,
    })
}

/// A channel with its limiter, concurrency and breaker state.
pub fn channel(c: &Channel, now_ms: u64) -> Value {
    let rate = c.limiter.as_ref().map(|l| {
        let l = l.lock();
        let r = l.rate();
        let next = l.next_free_ms(now_ms);
        json!({
            "limit": format!("{}/{}", r.count, format_duration_ms(r.period_ms)),
            "next_free_at": format_utc(next.max(now_ms)),
        })
    });
    let breaker = c.breaker.as_ref().map(|b| {
        let b = b.lock();
        let (state, until) = match b.state() {
            BreakerState::Closed => ("closed", None),
            BreakerState::Open { until_ms } => ("open", Some(until_ms)),
            BreakerState::HalfOpen => ("half_open", None),
        };
        json!({
            "state": state,
            "open_until": instant(until),
            "success_ratio": b.success_ratio(now_ms),
        })
    });
    let s = &c.stats;
    let (preset, success, token, sign, templates) = delivery_rules(c, now_ms);
    json!({
        "name": c.name,
        "kind": c.kind(),
        "preset": preset,
        "success": success,
        "token": token,
        "sign": sign,
        "templates": templates,
        "held_local": s.held_local.load(Ordering::Relaxed),
        "concurrency": c.concurrency_max,
        "in_flight": c.in_flight(),
        "rate": rate,
        "breaker": breaker,
        "retry": retry_doc(&c.retry),
        "sent": s.sent.load(Ordering::Relaxed),
        "retryable_failures": s.retryable_failures.load(Ordering::Relaxed),
        "permanent_failures": s.permanent_failures.load(Ordering::Relaxed),
        "held": s.held.load(Ordering::Relaxed),
    })
}

/// A channel's preset, success rule, token, signing and templated fields (a webhook's; null
/// for other sinks).
fn delivery_rules(c: &Channel, now_ms: u64) -> (Value, Value, Value, Value, Value) {
    match &c.sink {
        Sink::Webhook(w) => match w.platform() {
            Some(p) => (
                json!(p.spec.preset),
                success_rule(&p.spec.success),
                p.token
                    .as_ref()
                    .map(|t| token_state(&t.state(), now_ms))
                    .unwrap_or(Value::Null),
                json!(p.spec.sign.as_str()),
                json!(p.templated_fields()),
            ),
            None => (
                Value::Null,
                success_rule(&SuccessRule::default()),
                Value::Null,
                json!(if w.signed() {
                    "standard-webhooks"
                } else {
                    "none"
                }),
                json!([]),
            ),
        },
        _ => (
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ),
    }
}

/// A channel's success rule (platform channels: API.md "Platform channels").
fn success_rule(r: &SuccessRule) -> Value {
    json!({
        "status": r.status.as_str(),
        "json": r.json.as_ref().map(|j| j.pointer.clone()),
        "equals": r.json.as_ref().map(|j| j.equals.clone()),
        "code": r.code,
        "message": r.message,
        "retry_codes": r.retry_codes,
        "refresh_codes": r.refresh_codes,
        "retry_after_json": r.retry_after_json,
    })
}

/// An access token's state: never the token itself.
fn token_state(t: &TokenState, now_ms: u64) -> Value {
    let state = match (t.valid_until_ms, &t.last_error) {
        (Some(until), _) if until > now_ms => "valid",
        (_, Some(_)) => "error",
        (Some(_), None) => "expired",
        (None, None) => "none",
    };
    json!({
        "state": state,
        "valid_until": instant(t.valid_until_ms),
        "refreshed_at": instant(t.refreshed_at_ms),
        "refreshes": t.refreshes,
        "last_refresh_error": t.last_error,
        "last_refresh_error_at": instant(t.last_error_at_ms),
    })
}

pub fn parse_state(s: &str) -> Option<TaskState> {
    TaskState::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Limits;
    use crate::request::{Context, TaskRequest};

    const NOW: u64 = 1_796_083_200_000;

    fn pacing(p: &Pacing) -> Value {
        let mut v = json!({ "interval": format_duration_ms(p.interval_ms) });
        if let Some(b) = p.batch_size {
            put(&mut v, "batch_size", json!(b));
            put(
                &mut v,
                "batch_pause",
                json!(format_duration_ms(p.batch_pause_ms)),
            );
        }
        v
    }

    fn retry(r: &RetryPolicy) -> Value {
        json!({
            "max_attempts": r.max_attempts,
            "backoff": match r.backoff { Backoff::Fixed => "fixed", Backoff::Exponential => "exponential" },
            "initial": format_duration_ms(r.initial_ms),
            "max": format_duration_ms(r.max_ms),
        })
    }

    /// The view as it was built before `TaskDoc` (with the `json!` pacing and retry of then):
    /// the oracle the derived structs must match.
    fn task_value(v: &TaskView, channel_retry: RetryPolicy, now_ms: u64) -> Value {
        let t = &v.task;
        json!({
            "id": t.id,
            "name": t.name,
            "channel": t.channel,
            "state": t.state.as_str(),
            "schedule": schedule(&t.schedule),
            "description": describe_in(&t.schedule, t.lang),
            "lang": t.lang.as_str(),
            "next_fire_at": instant(t.next_fire_at_ms),
            "next_fire_human": t.next_fire_at_ms.map(|at| next_fire_human(&t.schedule, &t.recipient_zones, (at, next_fire_wall(t)), now_ms, t.lang)),
            "runs": t.runs,
            "fires": { "handled": t.fires, "skipped": t.skipped, "expired": t.expired, "queued": t.queued.len() },
            "messages": t.message_count,
            "progress": v.run.as_ref().map(|r| progress(r, &t.pacing, now_ms)),
            "created_at": format_utc(t.created_at_ms),
            "updated_at": format_utc(t.updated_at_ms),
            "pacing": pacing(&t.pacing),
            "retry": retry(&t.retry.unwrap_or(channel_retry)),
            "misfire": match t.misfire { Misfire::FireNow => "fire_now", Misfire::Skip => "skip", Misfire::FireAll => "fire_all" },
            "misfire_grace": format_duration_ms(t.misfire_grace_ms),
            "overlap": match t.overlap { Overlap::Skip => "skip", Overlap::Queue => "queue", Overlap::Allow => "allow" },
            "metadata": t.metadata,
            "failed_reason": t.failed_reason,
            "trace_id": crate::model::timeline::hex(&trace_id_of(t)),
        })
    }

    fn view(req: Value) -> TaskView {
        let req: TaskRequest = serde_json::from_value(req).unwrap();
        let (task, _) = req
            .into_task(&Context {
                now_ms: NOW,
                limits: &Limits::default(),
                channel_exists: &|_| true,
            })
            .unwrap();
        TaskView { task, run: None }
    }

    #[test]
    fn the_derived_task_view_prints_the_same_bytes_as_the_json_view() {
        let channel_retry = RetryPolicy::default();
        let mut views = vec![
            view(json!({"id": "a", "schedule": {"after": "48h"}, "to": ["x"], "body": "b"})),
            view(json!({"id": "b", "name": "digest \"q\"", "channel": "c",
                "schedule": {"at": "2027-01-01T09:00:00", "tz": "Asia/Shanghai"},
                "to": ["x", "y"], "body": "b", "metadata": {"k": "v", "a": "é"},
                "pacing": {"interval": "3s", "batch_size": 10, "batch_pause": "1m"},
                "retry": {"max_attempts": 7, "backoff": "fixed", "initial": "2s", "max": "1m"},
                "misfire": "skip", "misfire_grace": "1s", "lang": "zh"})),
            view(
                json!({"id": "c", "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai",
                "max_runs": 3}, "to": ["x"], "body": "b", "overlap": "queue"}),
            ),
            view(
                json!({"id": "d", "schedule": {"reminders": {"event_at": "2027-01-01T10:00:00Z",
                "before": ["30m", "15m", "5m"]}}, "to": ["x"], "body": "b"}),
            ),
        ];
        // A running view with progress, queued fires and a failure reason.
        let mut running = views[0].clone();
        running.task.state = crate::model::TaskState::Failed;
        running.task.failed_reason = Some("gave up".into());
        running.task.queued = vec![crate::model::Queued::at(2, NOW)];
        running.task.fires = 4;
        running.task.skipped = 1;
        let mut r = Run::new(1, NOW, NOW, 5);
        r.cursor = 2;
        r.sent = 2;
        r.next_at_ms = Some(NOW + 1_000);
        running.run = Some(r);
        views.push(running);
        for v in &views {
            let doc = serde_json::to_vec(&task_doc(v, channel_retry, NOW, None)).unwrap();
            let old = task_value(v, channel_retry, NOW);
            assert_eq!(
                String::from_utf8(doc).unwrap(),
                old.to_string(),
                "task {}",
                v.task.id
            );
        }
    }
}
