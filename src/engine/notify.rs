//! Telling the person (issue 28, API.md "Telling the person"): the notifications a change
//! calls for, as task requests. Pure: `commit.rs` makes them tasks whose records go into the
//! change's own write.
//!
//! A notification is a task of its own (a one-shot due now on the named channel, one message
//! to `notify.to`), so it is delivered like any message: pacing, retries, the failure list.
//! It carries no `notify`, so it never notifies about itself; its id is derived from what it
//! is about (`{task}.notify.{run}.{seq|expired}`), so the same event never makes two.
//! Metadata `herald.kind = notify` and `herald.about.*` become the delivery's `kind` and
//! `about` (webhook body). It is durable with the event it is about (the same store write,
//! `commit.rs`): a crash keeps both or neither. One that cannot be made (its channel was
//! deleted, no room among the live tasks) is logged and counted, and never blocks the change.
use serde_json::json;

use super::change::Change;
use crate::model::{NotifyOn, RunState, TaskSpec};
use crate::request::{MessageRequest, ScheduleRequest, TaskRequest};
use crate::schedule::notify::{body, About, Due, Why};

/// Metadata key that marks a notification task.
pub const KIND_KEY: &str = "herald.kind";

/// The notifications `c` calls for, for `task` (as it is after the change): one per message
/// given up on (the failure list), and one per change that expired fires (the first of them).
pub fn requests(task: &TaskSpec, c: &Change) -> Vec<TaskRequest> {
    let Some(n) = &task.notify else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(f) = c
        .failure
        .as_ref()
        .filter(|_| n.on.contains(&NotifyOn::Failed))
    {
        let fired = c
            .runs
            .iter()
            .find(|r| r.run == f.run)
            .map(|r| (r.scheduled_at_ms, r.slot_wall_ms))
            .unwrap_or((f.failed_at_ms, None));
        let about = About {
            event: NotifyOn::Failed,
            task_id: &task.id,
            task_name: task.name.as_deref(),
            run: f.run,
            seq: Some(f.seq),
            to: Some(&f.to),
            due: message_due(task, fired, c.failure_tz.as_deref(), c.failure_due_ms),
            why: Why::Error(&f.last_error),
        };
        out.push(request(task, n, &about, &f.seq.to_string()));
    }
    let expired = c
        .runs
        .iter()
        .find(|r| r.state == RunState::Expired && n.on.contains(&NotifyOn::Expired));
    if let Some(r) = expired {
        // Said in the task's language from its kind; the stored reason is its English.
        let why = match c.expired_why.iter().find(|(n, _)| *n == r.run) {
            Some((_, kind)) => Why::Expired(*kind, crate::schedule::zone_of(&task.schedule)),
            None => Why::Other(r.reason.as_deref().unwrap_or("missed")),
        };
        let about = About {
            event: NotifyOn::Expired,
            task_id: &task.id,
            task_name: task.name.as_deref(),
            run: r.run,
            seq: None,
            to: None,
            due: fire_due(task, (r.scheduled_at_ms, r.slot_wall_ms)),
            why,
        };
        out.push(request(task, n, &about, "expired"));
    }
    out
}

/// When a message of the run that fired at `fired` (its instant and recorded slot wall,
/// `Run::slot_wall_ms`) was due, as its recipient reads it. `planned`: the instant its send
/// was planned for (`Change::failure_due_ms`: the pacing's for a later message of the run,
/// message 40 of a run paced one every 3 s is due about 2 min after the run's instant), the
/// run's instant when not known. In recipient time, the later of that and its own instant
/// (the slot's wall time in its zone `tz`; none for a run that is no slot's, a trigger), in
/// its zone: a message waits for its own instant without its run's plan saying so
/// (`plan::hold`), and is paced after it. Otherwise the planned instant in the schedule's
/// zone.
fn message_due(
    task: &TaskSpec,
    fired: (u64, Option<u64>),
    tz: Option<&str>,
    planned: Option<u64>,
) -> Due {
    let planned = planned.unwrap_or(fired.0);
    let zone = tz
        .filter(|_| !task.recipient_zones.is_empty())
        .and_then(|z| z.parse::<chrono_tz::Tz>().ok());
    match zone {
        Some(zone) => Due::At {
            ms: super::plan::due_no_earlier_than_own(task, tz, fired, planned),
            tz: zone,
        },
        // A message with no zone of its own in recipient time: the slot's wall time.
        None if !task.recipient_zones.is_empty() => fire_due(task, fired),
        None => Due::At {
            ms: planned,
            tz: crate::schedule::zone_of(&task.schedule),
        },
    }
}

/// When the run that fired at `fired` (as in [`message_due`]) was due: in recipient time its slot's wall time,
/// which each recipient has in their own zone (a run spans the zones; its instant is only
/// where the slot comes first); otherwise its instant in the schedule's zone (UTC without one,
/// and for a run that is no slot's).
fn fire_due(task: &TaskSpec, fired: (u64, Option<u64>)) -> Due {
    use crate::schedule::recipient::{parse_zones, run_wall};
    let (fired_ms, recorded) = fired;
    let wall = (!task.recipient_zones.is_empty())
        .then(|| {
            run_wall(
                &task.schedule,
                &parse_zones(&task.recipient_zones),
                fired_ms,
                recorded,
            )
        })
        .flatten();
    match wall {
        Some(w) => Due::Wall(w),
        None => Due::At {
            ms: fired_ms,
            tz: crate::schedule::zone_of(&task.schedule),
        },
    }
}

fn request(task: &TaskSpec, n: &crate::model::Notify, a: &About<'_>, what: &str) -> TaskRequest {
    let mut id = format!("{}.notify.{}.{what}", task.id, a.run);
    // Ids are at most 128 bytes; a long task id keeps its notification ids unique by run.
    if id.len() > 128 {
        id = format!("notify.{:x}.{}.{what}", fnv(&task.id), a.run);
    }
    let mut metadata = std::collections::BTreeMap::new();
    metadata.insert(KIND_KEY.to_owned(), "notify".to_owned());
    metadata.insert("herald.about.task_id".to_owned(), task.id.clone());
    metadata.insert("herald.about.run".to_owned(), a.run.to_string());
    if let Some(seq) = a.seq {
        metadata.insert("herald.about.seq".to_owned(), seq.to_string());
    }
    metadata.insert("herald.about.event".to_owned(), a.event.as_str().to_owned());
    // Built typed (not parsed from JSON), so there is no shape that could fail; validation
    // (`into_task` in `commit.rs`) still checks it like any request.
    TaskRequest {
        id: Some(id),
        name: None,
        channel: Some(n.channel.clone()),
        schedule: ScheduleRequest {
            after: Some("0s".to_owned()),
            ..ScheduleRequest::default()
        },
        messages: Some(vec![MessageRequest {
            to: n.to.clone(),
            body: body(task.lang, a),
            data: None,
            tz: None,
        }]),
        to: None,
        body: None,
        pacing: None,
        retry: None,
        misfire: None,
        misfire_grace: None,
        overlap: None,
        metadata: Some(metadata),
        lang: Some(task.lang.as_str().to_owned()),
        default_tz: None,
        quiet_hours: None,
        notify: None,
        trace_id: None,
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A delivery's `kind` and `about` (webhook body) from a notification task's metadata.
pub fn about_of(
    metadata: &std::collections::BTreeMap<String, String>,
) -> Option<(&'static str, serde_json::Value)> {
    (metadata.get(KIND_KEY).map(String::as_str) == Some("notify")).then(|| {
        let get = |k: &str| metadata.get(&format!("herald.about.{k}"));
        let num = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
        (
            "notify",
            json!({"task_id": get("task_id"), "run": num("run"), "seq": num("seq"),
                "event": get("event")}),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Failure, Limits, Run};
    use crate::request::Context;

    const NOW: u64 = 1_796_083_200_000;

    fn task(v: serde_json::Value) -> TaskSpec {
        crate::request::test_task(v, NOW).split().0
    }

    #[test]
    fn a_failure_and_an_expiry_each_make_one_notification_and_none_about_itself() {
        let t = task(
            json!({"id": "t", "schedule": {"after": "1m"}, "to": ["a", "b"],
            "body": "x", "notify": {"channel": "log", "to": "boss"}}),
        );
        let f = Failure {
            id: "t:1:1".into(),
            task_id: "t".into(),
            run: 1,
            seq: 1,
            to: "b".into(),
            channel: "log".into(),
            attempts: 1,
            last_error: "HTTP 400".into(),
            failed_at_ms: NOW,
            retrying: false,
            retries: 0,
        };
        let mut expired = Run::new(2, NOW, NOW, 2);
        expired.state = RunState::Expired;
        let mut expired2 = expired.clone();
        expired2.run = 3;
        let c = Change {
            failure: Some(f),
            runs: vec![expired, expired2],
            ..Change::default()
        };
        let reqs = requests(&t, &c);
        assert_eq!(
            reqs.len(),
            2,
            "one for the failure, one for the expired fires"
        );
        let (n, _) = reqs[0]
            .clone()
            .into_task(&Context {
                now_ms: NOW,
                limits: &Limits::default(),
                channel_exists: &|_| true,
            })
            .unwrap();
        assert_eq!(n.id, "t.notify.1.1");
        assert!(n.notify.is_none(), "a notification never notifies");
        let (kind, about) = about_of(&n.metadata).unwrap();
        assert_eq!(kind, "notify");
        assert_eq!(
            about,
            json!({"task_id": "t", "run": 1, "seq": 1, "event": "failed"})
        );
        // And a notification's own failure makes none.
        assert!(requests(&n.split().0, &c).is_empty());
    }

    /// Review finding: notifications of a task in recipient time named the due time in UTC.
    /// A failed message's is its own instant in its recipient's zone; an expired fire's is
    /// the slot's wall time, each recipient's own.
    #[test]
    fn in_recipient_time_the_due_time_is_the_recipients() {
        let t = task(
            json!({"id": "rt", "schedule": {"at": "2026-12-02T09:00:00", "tz": "recipient"},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                {"to": "s", "body": "x", "tz": "Asia/Shanghai"}],
            "notify": {"channel": "log", "to": "boss"}}),
        );
        let crate::model::Schedule::At { at_ms, .. } = t.schedule else {
            panic!("an at")
        };
        let f = Failure {
            id: "rt:1:0".into(),
            task_id: "rt".into(),
            run: 1,
            seq: 0,
            to: "b".into(),
            channel: "log".into(),
            attempts: 1,
            last_error: "HTTP 400".into(),
            failed_at_ms: at_ms + 7 * 3_600_000,
            retrying: false,
            retries: 0,
        };
        let mut expired = Run::new(2, at_ms, at_ms, 2);
        expired.state = RunState::Expired;
        let c = Change {
            failure: Some(f),
            failure_tz: Some("Europe/Berlin".into()),
            runs: vec![Run::new(1, at_ms, at_ms, 2), expired],
            ..Change::default()
        };
        let reqs = requests(&t, &c);
        let body = |r: &TaskRequest| r.messages.as_ref().unwrap()[0].body.clone();
        let failed = body(&reqs[0]);
        assert!(
            failed.contains("due 2026-12-02 09:00 (Europe/Berlin)"),
            "{failed}"
        );
        let expired = body(&reqs[1]);
        assert!(
            expired.contains("due 2026-12-02 09:00 (each recipient's local time)"),
            "{expired}"
        );
    }

    /// Review finding: a failure notification of a paced run named the run's instant, not
    /// the failed message's own (`Change::failure_due_ms`, the instant its attempt was
    /// planned for); without it, the run's instant as before.
    #[test]
    fn a_paced_message_is_due_at_its_own_instant() {
        let t = task(
            json!({"id": "p", "schedule": {"at": "2026-12-02T09:00:00", "tz": "Asia/Shanghai"},
            "to": ["a", "b", "c"], "body": "x", "pacing": {"interval": "1m"},
            "notify": {"channel": "log", "to": "boss"}}),
        );
        let crate::model::Schedule::At { at_ms, .. } = t.schedule else {
            panic!("an at")
        };
        let f = Failure {
            id: "p:1:2".into(),
            task_id: "p".into(),
            run: 1,
            seq: 2,
            to: "c".into(),
            channel: "log".into(),
            attempts: 1,
            last_error: "HTTP 400".into(),
            failed_at_ms: at_ms + 120_500,
            retrying: false,
            retries: 0,
        };
        let mut c = Change {
            failure: Some(f),
            failure_due_ms: Some(at_ms + 120_002),
            runs: vec![Run::new(1, at_ms, at_ms, 3)],
            ..Change::default()
        };
        let body = |c: &Change| {
            requests(&t, c)[0].messages.as_ref().unwrap()[0]
                .body
                .clone()
        };
        let b = body(&c);
        assert!(b.contains("due 2026-12-02 09:02 (Asia/Shanghai)"), "{b}");
        c.failure_due_ms = None;
        let b = body(&c);
        assert!(b.contains("due 2026-12-02 09:00 (Asia/Shanghai)"), "{b}");
    }

    /// In recipient time a message is due at the later of its own instant and the one its
    /// attempt was planned for: its run's plan can be the first zone's (it waits for its own
    /// instant in memory only), and a message paced after its own instant is due then.
    #[test]
    fn in_recipient_time_a_paced_message_is_due_at_the_later_instant() {
        let t = task(
            json!({"id": "rt", "schedule": {"at": "2026-12-02T09:00:00", "tz": "recipient"},
            "messages": [{"to": "s", "body": "x", "tz": "Asia/Shanghai"},
                {"to": "b", "body": "x", "tz": "Europe/Berlin"},
                {"to": "b2", "body": "x", "tz": "Europe/Berlin"}],
            "pacing": {"interval": "1m"}, "notify": {"channel": "log", "to": "boss"}}),
        );
        let crate::model::Schedule::At { at_ms, .. } = t.schedule else {
            panic!("an at")
        };
        // Shanghai's 09:00 is the run's instant; Berlin's is 7 h later.
        let berlin = at_ms + 7 * 3_600_000;
        let f = |seq: u32| Failure {
            id: format!("rt:1:{seq}"),
            task_id: "rt".into(),
            run: 1,
            seq,
            to: "b".into(),
            channel: "log".into(),
            attempts: 1,
            last_error: "HTTP 400".into(),
            failed_at_ms: berlin + 60_000,
            retrying: false,
            retries: 0,
        };
        let body = |seq: u32, planned: u64| {
            let c = Change {
                failure: Some(f(seq)),
                failure_tz: Some("Europe/Berlin".into()),
                failure_due_ms: Some(planned),
                runs: vec![Run::new(1, at_ms, at_ms, 3)],
                ..Change::default()
            };
            requests(&t, &c)[0].messages.as_ref().unwrap()[0]
                .body
                .clone()
        };
        // Planned a minute after Shanghai's message, held for Berlin's 09:00.
        let b = body(1, at_ms + 60_001);
        assert!(b.contains("due 2026-12-02 09:00 (Europe/Berlin)"), "{b}");
        // Paced a minute after Berlin's first.
        let b = body(2, berlin + 60_001);
        assert!(b.contains("due 2026-12-02 09:01 (Europe/Berlin)"), "{b}");
    }

    /// Review finding: an expiry of a Chinese task said its English reason. The kind the
    /// change carries (`Change::expired_why`) is said in Chinese; a run with none (no kind
    /// known) is said to be missed, never in English.
    #[test]
    fn a_chinese_expiry_says_its_kind_in_chinese() {
        use crate::schedule::misfire::Expiry;
        let t = task(
            json!({"id": "z", "schedule": {"after": "1m"}, "to": ["a"], "body": "x",
            "lang": "zh", "notify": {"channel": "log", "to": "boss"}}),
        );
        let why = Expiry::Missed {
            late_ms: 1_200_000,
            grace_ms: 600_000,
        };
        let mut expired = Run::not_started(1, NOW, NOW, 1, RunState::Expired, why.reason());
        expired.run = 1;
        let mut c = Change {
            runs: vec![expired],
            expired_why: vec![(1, why)],
            ..Change::default()
        };
        let body = |c: &Change| {
            requests(&t, c)[0].messages.as_ref().unwrap()[0]
                .body
                .clone()
        };
        let b = body(&c);
        assert!(
            b.contains("未发送：错过发送时间 20分钟，超过了宽限时间 10分钟。"),
            "{b}"
        );
        assert!(!b.contains("missed"), "{b}");
        c.expired_why.clear();
        let b = body(&c);
        assert!(b.contains("未发送：错过了发送时间。"), "{b}");
    }
}
