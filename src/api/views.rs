//! JSON views of tasks, runs and failures, as API.md shows them. Instants are RFC 3339 UTC.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use crate::deliver::breaker::BreakerState;
use crate::deliver::Channel;

use crate::engine::TaskView;
use crate::model::{
    format_duration_ms, Backoff, DstGap, DstPolicy, DstRepeat, Failure, Misfire, Overlap, Pacing,
    RetryPolicy, Run, RunState, Schedule, TaskState,
};
use crate::schedule::{describe, format_utc};

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

/// The schedule as created (optional parts only when given), plus the DST policy in force.
pub fn schedule(s: &Schedule) -> Value {
    match s {
        Schedule::At { at, tz, dst: d, .. } => {
            let mut v = json!({ "at": at, "dst": dst(d) });
            if let Some(tz) = tz {
                v["tz"] = json!(tz);
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
                v["start"] = json!(x);
            }
            if let Some(x) = end {
                v["end"] = json!(x);
            }
            if let Some(x) = max_runs {
                v["max_runs"] = json!(x);
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
                r["tz"] = json!(tz);
            }
            json!({ "reminders": r, "dst": dst(d) })
        }
    }
}

pub fn pacing(p: &Pacing) -> Value {
    let mut v = json!({ "interval": format_duration_ms(p.interval_ms) });
    if let Some(b) = p.batch_size {
        v["batch_size"] = json!(b);
        v["batch_pause"] = json!(format_duration_ms(p.batch_pause_ms));
    }
    v
}

pub fn retry(r: &RetryPolicy) -> Value {
    json!({
        "max_attempts": r.max_attempts,
        "backoff": match r.backoff { Backoff::Fixed => "fixed", Backoff::Exponential => "exponential" },
        "initial": format_duration_ms(r.initial_ms),
        "max": format_duration_ms(r.max_ms),
    })
}

/// Progress of a run; `eta` is when its last message is due to start, from pacing.
pub fn progress(r: &Run, pacing: &Pacing, now_ms: u64) -> Value {
    let eta = match r.state {
        RunState::Running => {
            // The next message at `next_at`, then one gap (interval or batch pause) before
            // each of the rest. Rate limits and retries can only make it later.
            let next = r.next_at_ms.unwrap_or(now_ms).max(now_ms);
            let gaps: u64 = (r.cursor + 1..r.total)
                .map(|i| pacing.gap_before(i))
                .fold(0u64, |a, g| a.saturating_add(g));
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

/// The task view. `channel_retry` is the channel's default, shown when the task has none.
pub fn task(v: &TaskView, channel_retry: RetryPolicy, now_ms: u64) -> Value {
    let t = &v.task;
    json!({
        "id": t.id,
        "name": t.name,
        "channel": t.channel,
        "state": t.state.as_str(),
        "schedule": schedule(&t.schedule),
        "description": describe(&t.schedule),
        "next_fire_at": instant(t.next_fire_at_ms),
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
    })
}

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
    json!({
        "name": c.name,
        "kind": c.kind(),
        "concurrency": c.concurrency_max,
        "in_flight": c.in_flight(),
        "rate": rate,
        "breaker": breaker,
        "retry": retry(&c.retry),
        "sent": s.sent.load(Ordering::Relaxed),
        "retryable_failures": s.retryable_failures.load(Ordering::Relaxed),
        "permanent_failures": s.permanent_failures.load(Ordering::Relaxed),
        "held": s.held.load(Ordering::Relaxed),
    })
}

pub fn parse_state(s: &str) -> Option<TaskState> {
    TaskState::parse(s)
}
