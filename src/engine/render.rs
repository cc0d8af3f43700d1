//! Rendering one attempt of one message as the [`Delivery`] a channel sends (pure: no IO, no
//! clock; the instants are given). The run's step (`step.rs`) and a failure-list retry
//! (`retry.rs`) both render through here, so an attempt carries the same fields, the same
//! `{{minutes_left}}` substitution (counted at the attempt's start) and the same trace whichever path sends it.

use crate::deliver::Delivery;
use crate::model::{delivery_key, Message, TaskSpec};
use crate::schedule::{format_utc, minutes_left};

/// Which attempt of which message, and when.
pub(crate) struct Attempt {
    pub run: u32,
    pub seq: u32,
    /// 1-based, counted over the message's whole life (a failure-list retry goes on counting).
    pub attempt: u32,
    /// The instant the message was due (`scheduled_at` of the delivery).
    pub due_ms: u64,
    /// The run's scheduled instant (`minutes_left` never counts from before it).
    pub run_at_ms: u64,
    /// When this attempt starts (`sent_at`).
    pub now_ms: u64,
}

/// The delivery of `msg` (message `a.seq` of `task`) for attempt `a`. Its idempotency key is
/// `{task}:{run}:{seq}` on every attempt, and its trace is the task's (DESIGN.md "Delivery
/// semantics", API.md "Trace and timeline").
pub(crate) fn delivery(task: &TaskSpec, msg: Message, a: &Attempt) -> Delivery {
    // What is left when it is sent: a reminder held by quiet hours, a rate limit or an outage
    // says so, not what was left at its slot.
    let minutes = minutes_left(&task.schedule, a.now_ms.max(a.run_at_ms));
    let body = match minutes {
        Some(m) => msg.body.replace("{{minutes_left}}", &m.to_string()),
        None => msg.body,
    };
    let about = super::notify::about_of(&task.metadata);
    Delivery {
        task_id: task.id.clone(),
        run: a.run,
        seq: a.seq,
        to: msg.to,
        body,
        scheduled_at: format_utc(a.due_ms),
        attempt: a.attempt,
        idempotency_key: delivery_key(&task.id, a.run, a.seq),
        sent_at: format_utc(a.now_ms),
        data: msg.data,
        scheduled_at_ms: a.due_ms,
        minutes_left: minutes,
        metadata: task.metadata.clone(),
        kind: about.as_ref().map(|a| a.0),
        about: about.map(|a| a.1),
        trace_id: task.trace(),
        epoch: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::test_task;

    #[test]
    fn an_attempt_carries_its_key_instants_and_the_tasks_trace() {
        let mut t = test_task(
            serde_json::json!({"id": "t1", "channel": "c", "schedule": {"after": "1m"},
                "to": ["u1"], "body": "hello"}),
            0,
        );
        t.trace_id = Some([7; 16]);
        let msg = || Message {
            to: "u1".into(),
            body: "hello".into(),
            data: None,
            tz: None,
        };
        let a = Attempt {
            run: 3,
            seq: 2,
            attempt: 4,
            due_ms: 60_000,
            run_at_ms: 0,
            now_ms: 61_000,
        };
        let d = delivery(&t.clone().split().0, msg(), &a);
        assert_eq!(d.idempotency_key, "t1:3:2");
        assert_eq!((d.run, d.seq, d.attempt), (3, 2, 4));
        assert_eq!(d.scheduled_at, "1970-01-01T00:01:00Z");
        assert_eq!(d.sent_at, "1970-01-01T00:01:01Z");
        assert_eq!(d.trace_id, [7; 16]);
        assert_eq!(d.kind, None);
        // A task made before traces existed gets the trace derived from its id, as its view.
        t.trace_id = None;
        let d = delivery(&t.clone().split().0, msg(), &a);
        assert_eq!(d.trace_id, crate::model::timeline::fallback_trace_id("t1"));
    }

    /// `{{minutes_left}}` is what is left when the attempt starts (review finding: a reminder
    /// held by quiet hours from 07:40 to 08:00 said "30" with 10 minutes left).
    #[test]
    fn minutes_left_counts_from_the_send_not_the_slot() {
        let t = test_task(
            serde_json::json!({"id": "r1", "channel": "c", "schedule": {"reminders":
                {"event_at": "2026-06-01T08:10:00Z", "before": ["30m"]}},
                "to": ["u1"], "body": "in {{minutes_left}} min"}),
            1_780_000_000_000,
        );
        let spec = t.split().0;
        let event = 1_780_301_400_000; // 2026-06-01T08:10:00Z
        let send = |now_ms: u64| {
            let a = Attempt {
                run: 1,
                seq: 0,
                attempt: 1,
                due_ms: event - 30 * 60_000,
                run_at_ms: event - 30 * 60_000,
                now_ms,
            };
            let msg = Message {
                to: "u1".into(),
                body: "in {{minutes_left}} min".into(),
                data: None,
                tz: None,
            };
            let d = delivery(&spec, msg, &a);
            (d.body, d.minutes_left)
        };
        // On time, a few ms late: 30.
        assert_eq!(
            send(event - 30 * 60_000 + 7),
            ("in 30 min".into(), Some(30))
        );
        // Held until 08:00: 10.
        assert_eq!(send(event - 10 * 60_000), ("in 10 min".into(), Some(10)));
        // After the event has begun: 0, never negative.
        assert_eq!(send(event + 5 * 60_000), ("in 0 min".into(), Some(0)));
    }
}
