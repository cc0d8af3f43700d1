//! Validation of creates and patches, field by field.

use super::*;
use crate::model::*;
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
    let d: serde_json::Value = serde_json::from_str(messages[0].data.as_deref().unwrap()).unwrap();
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
    assert!(
        task(json!({"schedule": {"at": five_ago}, "messages": [{"to": "a", "body": "b"}]})).is_ok()
    );
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

fn patch(t: &Task, v: serde_json::Value) -> Result<(Task, Option<Vec<Message>>), FieldError> {
    let p: PatchRequest = serde_json::from_value(v).expect("shape");
    let limits = Limits::default();
    p.apply(
        t,
        &Context {
            now_ms: NOW,
            limits: &limits,
            channel_exists: &|_| true,
        },
    )
}

#[test]
fn a_recipient_time_task_takes_new_messages_in_their_zones() {
    let t = task(
        json!({"schedule": {"at": "2026-12-02T09:00:00", "tz": "recipient"},
        "default_tz": "Asia/Shanghai", "messages": [{"to": "a", "body": "b"}]}),
    )
    .unwrap();
    assert_eq!(t.next_fire_at_ms, Some(1_796_173_200_000)); // 09:00 in Shanghai
    let (p, m) = patch(
        &t,
        json!({"messages": [{"to": "a", "body": "b", "tz": "Asia/Tokyo"}]}),
    )
    .unwrap();
    assert_eq!(p.recipient_zones, ["Asia/Tokyo"]);
    assert_eq!(m.unwrap()[0].tz.as_deref(), Some("Asia/Tokyo"));
    assert_eq!(p.next_fire_at_ms, Some(1_796_169_600_000)); // 09:00 in Tokyo
    let (p, m) = patch(
        &t,
        json!({"default_tz": "Europe/Paris", "messages": [{"to": "a", "body": "b"}]}),
    )
    .unwrap();
    assert_eq!(p.recipient_zones, ["Europe/Paris"]);
    assert_eq!(m.unwrap()[0].tz.as_deref(), Some("Europe/Paris"));
    let e = patch(&t, json!({"messages": [{"to": "a", "body": "b"}]})).unwrap_err();
    assert_eq!(e.field, "messages[0].tz");
}

#[test]
fn a_new_schedule_must_fire_within_the_horizon_as_on_create() {
    let m = json!([{"to": "a", "body": "b"}]);
    let mut t = task(json!({"schedule": {"after": "1h"}, "messages": m})).unwrap();
    for s in [
        json!({"cron": "0 9 * * *", "end": "2020-01-01T00:00:00Z"}),
        json!({"cron": "0 9 * * *", "start": "2045-01-01T00:00:00Z"}),
    ] {
        let create = task(json!({"schedule": s, "messages": m})).unwrap_err();
        let e = patch(&t, json!({"schedule": s})).unwrap_err();
        assert_eq!(e, create, "{s}");
    }
    // An expired one-shot (it fired) gets the same answer.
    t.state = TaskState::Expired;
    t.last_fire_ms = Some(NOW);
    t.runs = 1;
    let e = patch(
        &t,
        json!({"schedule": {"cron": "0 9 * * *", "end": "2020-01-01T00:00:00Z"}}),
    );
    assert_eq!(e.unwrap_err().field, "schedule.cron");
    let (p, _) = patch(&t, json!({"schedule": {"cron": "0 9 * * *"}})).unwrap();
    assert!(p.next_fire_at_ms.is_some());
}

#[test]
fn a_patch_checks_zones_as_a_create_does() {
    let m = json!([{"to": "a", "body": "b", "tz": "Mars/Olympus"}]);
    let plain = task(json!({"schedule": {"after": "1h"}, "to": ["a"], "body": "b"})).unwrap();
    let recipient = task(
        json!({"schedule": {"at": "2026-12-02T09:00:00", "tz": "recipient"},
        "default_tz": "Asia/Shanghai", "to": ["a"], "body": "b"}),
    )
    .unwrap();
    for (t, schedule) in [
        (&plain, json!({"after": "1h"})),
        (
            &recipient,
            json!({"at": "2026-12-02T09:00:00", "tz": "recipient"}),
        ),
    ] {
        for (body, field) in [
            (json!({"messages": m}), "messages[0].tz"),
            (
                json!({"default_tz": "x", "to": ["a"], "body": "b"}),
                "default_tz",
            ),
            (json!({"default_tz": "x"}), "default_tz"),
        ] {
            let e = patch(t, body.clone()).unwrap_err();
            assert_eq!(e.field, field, "{body}");
            let mut create = body.clone();
            create["schedule"] = schedule.clone();
            if create.get("messages").is_none() && create.get("to").is_none() {
                create["messages"] = json!([{"to": "a", "body": "b"}]);
            }
            assert_eq!(task(create).unwrap_err(), e, "{body}");
        }
    }
    // Outside recipient time a default_tz means nothing: refused, as on create.
    let e = patch(&plain, json!({"default_tz": "Asia/Tokyo"})).unwrap_err();
    assert_eq!(e.field, "default_tz");
    // In recipient time it fills in the zones of the messages given with it: without them it
    // would change nothing (the task keeps no default zone), so it is refused, not dropped.
    let e = patch(&recipient, json!({"default_tz": "Asia/Tokyo"})).unwrap_err();
    assert_eq!(e.field, "default_tz");
    let (p, m) = patch(
        &recipient,
        json!({"default_tz": "Asia/Tokyo", "to": ["a"], "body": "b"}),
    )
    .unwrap();
    assert_eq!(p.recipient_zones, ["Asia/Tokyo"]);
    assert_eq!(m.unwrap()[0].tz.as_deref(), Some("Asia/Tokyo"));
}

#[test]
fn a_broadcast_is_checked_before_its_body_is_copied_per_recipient() {
    let big = "x".repeat(64 * 1024 + 1);
    let err = |to: serde_json::Value, body: &str| {
        task(json!({"schedule": {"after": "1s"}, "to": to, "body": body})).unwrap_err()
    };
    // Each recipient before the body (expanded first, the first message's body was refused).
    assert_eq!(err(json!(["a", ""]), &big).field, "to[1]");
    assert_eq!(err(json!(["a", "b".repeat(1025)]), &big).field, "to[1]");
    assert_eq!(err(json!(["a", "b"]), &big).field, "body");
    // The count before anything: 100 000 recipients and a 600 KB body (a request under 1 MiB)
    // would be 60 GB of copies.
    let e = err(json!(vec![""; 100_000]), &"x".repeat(600_000));
    assert_eq!(e.field, "to");
    assert!(e.detail.contains("at most 10000 messages"), "{e}");
    assert_eq!(err(json!([]), "b").field, "to");
}

/// With raised limits a broadcast could expand past what one store write holds (review
/// finding: one write-ahead log record whose lengths wrapped): 1 000 recipients of a 1 MiB
/// body are 1 000 MiB, refused before the body is copied; the bound itself is checked on
/// lengths alone (no copies made).
#[test]
fn a_broadcast_past_what_one_write_holds_is_refused_naming_to() {
    use super::validate::{check_broadcast, BROADCAST_BYTES_MAX};
    let limits = crate::model::Limits {
        message_body_bytes_max: 1 << 20,
        ..crate::model::Limits::default()
    };
    let to = vec!["r".to_string(); 1_000];
    let e = check_broadcast(&to, &"x".repeat(1 << 20), &limits).unwrap_err();
    assert_eq!(e.field, "to");
    assert!(e.detail.contains("several tasks"), "{e}");
    // Exactly at the bound it goes: 768 recipients of 1 MiB.
    let to = vec!["r".to_string(); BROADCAST_BYTES_MAX >> 20];
    assert!(check_broadcast(&to, &"x".repeat(1 << 20), &limits).is_ok());
}

#[test]
fn notify_to_is_checked_against_the_recipient_limit() {
    let with = |to: String| {
        task(
            json!({"schedule": {"after": "1s"}, "to": ["a"], "body": "b",
            "notify": {"channel": "log", "to": to}}),
        )
    };
    assert!(with("o".repeat(1024)).is_ok());
    let e = with("o".repeat(1025)).unwrap_err();
    assert_eq!(e.field, "notify.to");
    assert!(e.detail.contains("1024 bytes"), "{e}");
}

#[test]
fn a_first_fire_in_the_past_within_the_grace_is_watched_from_it() {
    // Otherwise the engine judges it missed (due before `watched_since_ms`), and `misfire:
    // skip` skips a fire validation accepted as "fires at once".
    let ago = crate::schedule::format_utc(NOW - 1_000);
    let t = task(json!({"schedule": {"at": ago}, "misfire": "skip", "to": ["a"], "body": "b"}))
        .unwrap();
    assert_eq!(t.next_fire_at_ms, Some(NOW - 1_000));
    assert_eq!(t.watched_since_ms, NOW - 1_000);
    let later = task(json!({"schedule": {"after": "1h"}, "to": ["a"], "body": "b"})).unwrap();
    assert_eq!(later.watched_since_ms, NOW);
    // A patch's new schedule alike.
    let (p, _) = patch(&later, json!({"schedule": {"at": ago}})).unwrap();
    assert_eq!(p.watched_since_ms, NOW - 1_000);
    let (p, _) = patch(&t, json!({"schedule": {"after": "1m"}})).unwrap();
    assert_eq!(p.watched_since_ms, NOW);
    // A patch of anything else leaves it alone.
    let (p, _) = patch(&t, json!({"name": "n"})).unwrap();
    assert_eq!(p.watched_since_ms, t.watched_since_ms);
}

#[test]
fn a_patch_that_keeps_the_schedule_keeps_the_next_fire() {
    // A cron created at 00:30 that never fired (paused at 00:31) and is renamed at 01:05: its
    // 01:00 fire is still next (resume judges it by the misfire policy), not 02:00.
    let t0 = 1_780_014_600_000; // 2026-05-29T00:30:00Z
    let created = |v| {
        let req: TaskRequest = serde_json::from_value(v).unwrap();
        let limits = Limits::default();
        req.into_task(&Context {
            now_ms: t0,
            limits: &limits,
            channel_exists: &|_| true,
        })
        .unwrap()
        .0
    };
    let t = created(json!({"schedule": {"cron": "0 * * * *"}, "to": ["a"], "body": "b"}));
    let one = t0 + 30 * 60_000;
    assert_eq!(t.next_fire_at_ms, Some(one));
    let limits = Limits::default();
    let cx = Context {
        now_ms: one + 5 * 60_000,
        limits: &limits,
        channel_exists: &|_| true,
    };
    let p: PatchRequest = serde_json::from_value(json!({"name": "x"})).unwrap();
    assert_eq!(p.apply(&t, &cx).unwrap().0.next_fire_at_ms, Some(one));
    // New messages in the same zones keep it too; a new schedule starts from now.
    let p: PatchRequest = serde_json::from_value(json!({"to": ["c"], "body": "d"})).unwrap();
    assert_eq!(p.apply(&t, &cx).unwrap().0.next_fire_at_ms, Some(one));
    let p: PatchRequest =
        serde_json::from_value(json!({"schedule": {"cron": "0 * * * *"}})).unwrap();
    assert_eq!(
        p.apply(&t, &cx).unwrap().0.next_fire_at_ms,
        Some(one + 3_600_000)
    );
}

#[test]
fn a_recipient_time_create_over_a_per_second_cron_costs_a_few_cron_evaluations() {
    use crate::schedule::cron::evaluations;
    for (expr, n) in [
        ("* * * * *", 200usize),
        ("* * * * * *", 200),
        ("0 9 * * *", 50),
    ] {
        let msgs: Vec<_> = (0..n)
            .map(|i| {
                let tz = ["Asia/Shanghai", "Europe/Berlin", "America/New_York"][i % 3];
                json!({"to": format!("u{i}"), "body": "x", "tz": tz})
            })
            .collect();
        let v = json!({"schedule": {"cron": expr, "tz": "recipient"}, "messages": msgs});
        let (made, evals) = evaluations::of(|| task_and_messages(v));
        let (t, m) = made.expect("valid");
        assert!(t.next_fire_at_ms.is_some());
        // Stored in order of their instants: Shanghai, Berlin, New York.
        assert_eq!(
            m.first().and_then(|m| m.tz.as_deref()),
            Some("Asia/Shanghai")
        );
        assert_eq!(
            m.last().and_then(|m| m.tz.as_deref()),
            Some("America/New_York")
        );
        // Not per message nor per comparison, nor per wall of the cron.
        assert!(
            evals <= 8,
            "{expr}: {evals} cron evaluations for one create of {n}"
        );
    }
}
