//! Backfill on the manual clock (issue 28, API.md "Missed runs and backfill"): a cron paused
//! over three of its slots (misfire `skip`) is backfilled: one run for each slot without a
//! completed run, sent in slot order; a range of more than 1000 slots is 422. No slot is ever
//! sent twice: not one whose run was trimmed from the history (`[store] runs_max`), nor one
//! the schedule has still to fire.

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::{json, Value};

async fn backfill(h: &ManualHerald, id: &str, from: &str, to: &str) -> http::Resp {
    http::post_json(
        &h.url(&format!("/v1/tasks/{id}/backfill")),
        &json!({"from": from, "to": to}),
    )
    .await
}

/// The slots a task's deliveries were for (each run's first message), in send order.
fn slots_sent(sent: &[Value], id: &str) -> Vec<String> {
    sent.iter()
        .filter(|v| v["task_id"] == id && v["seq"] == 0)
        .map(|v| v["scheduled_at"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_cron_paused_for_three_slots_is_backfilled_in_slot_order() {
    let h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    h.post(
        &json!({"id": "tick", "channel": "out", "schedule": {"cron": "*/10 * * * *"},
        "misfire": "skip", "to": ["a", "b"], "body": "x"}),
    )
    .await;
    h.run_until(utc_ms("2026-12-01T00:05:00Z")).await; // its first slot is 00:10
    assert_eq!(h.action("tick", "pause").await.status, 200);
    h.run_until(utc_ms("2026-12-01T00:35:00Z")).await;
    assert_eq!(h.action("tick", "resume").await.status, 200);
    h.run_until(utc_ms("2026-12-01T00:36:00Z")).await;
    let before = h.sent().len();
    assert_eq!(before, 0, "every slot fell in the pause");
    let skipped = h.runs("tick").await;
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    let r = http::post_json(
        &h.url("/v1/tasks/tick/backfill"),
        &json!({"from": "2026-12-01T00:01:00Z", "to": "2026-12-01T00:36:00Z"}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let runs: Vec<u64> = r.json()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "00:10, 00:20, 00:30: {runs:?}");
    h.run_until(utc_ms("2026-12-01T00:37:00Z")).await;
    let sent = h.sent();
    // In slot order, each run whole before the next; a run's first message carries its
    // slot as `scheduled_at` (the rest the instant pacing planned).
    let filled: Vec<(u64, &str)> = sent[before..]
        .iter()
        .map(|v| (v["run"].as_u64().unwrap(), v["to"].as_str().unwrap()))
        .collect();
    assert_eq!(
        filled,
        vec![
            (runs[0], "a"),
            (runs[0], "b"),
            (runs[1], "a"),
            (runs[1], "b"),
            (runs[2], "a"),
            (runs[2], "b"),
        ]
    );
    let slots: Vec<&str> = sent[before..]
        .iter()
        .filter(|v| v["seq"] == 0)
        .map(|v| v["scheduled_at"].as_str().unwrap())
        .collect();
    assert_eq!(
        slots,
        [
            "2026-12-01T00:10:00Z",
            "2026-12-01T00:20:00Z",
            "2026-12-01T00:30:00Z"
        ]
    );
    // Filled: a second backfill of the same range has nothing to do.
    let r = http::post_json(
        &h.url("/v1/tasks/tick/backfill"),
        &json!({"from": "2026-12-01T00:01:00Z", "to": "2026-12-01T00:36:00Z"}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["runs"], json!([]));
    // More than 1000 slots (a week of 10-minute slots is 1008): refused, naming the range.
    let r = http::post_json(
        &h.url("/v1/tasks/tick/backfill"),
        &json!({"from": "2026-11-24T00:00:00Z", "to": "2026-12-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "to");
    let r = http::post_json(
        &h.url("/v1/tasks/nope/backfill"),
        &json!({"from": "2026-12-01T00:00:00Z", "to": "2026-12-01T00:10:00Z"}),
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn slots_whose_runs_were_trimmed_from_the_history_are_never_sent_again() {
    let h = ManualHerald::start(utc_ms("2026-12-01T00:00:30Z"), "[store]\nruns_max = 5").await;
    h.post(
        &json!({"id": "min", "channel": "out", "schedule": {"cron": "* * * * *"},
        "to": ["a"], "body": "x"}),
    )
    .await;
    h.run_until(utc_ms("2026-12-01T00:12:30Z")).await;
    assert_eq!(slots_sent(&h.sent(), "min").len(), 12, "00:01 … 00:12");
    let kept = h.runs("min").await;
    assert!(kept[0]["run"].as_u64().unwrap() > 1, "trimmed: {kept:?}");
    let fires = h.task("min").await["fires"].clone();
    // 00:01 … 00:03 were sent, their runs trimmed: refused (naming `from`), nothing queued.
    let r = backfill(&h, "min", "2026-12-01T00:00:00Z", "2026-12-01T00:03:00Z").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "from", "{}", r.text());
    assert_eq!(h.task("min").await["fires"], fires, "nothing changed");
    // Where the runs are kept they decide: every slot was sent, nothing to do.
    let r = backfill(&h, "min", "2026-12-01T00:10:00Z", "2026-12-01T00:12:00Z").await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["runs"], json!([]));
    h.run_until(utc_ms("2026-12-01T00:13:30Z")).await;
    let slots = slots_sent(&h.sent(), "min");
    let mut once = slots.clone();
    once.dedup();
    assert_eq!(slots.len(), 13, "only 00:13 more: {slots:?}");
    assert_eq!(once, slots, "no slot sent twice");
}

#[tokio::test]
async fn a_range_past_now_is_refused_so_no_slot_is_sent_twice() {
    let h = ManualHerald::start(utc_ms("2026-12-01T12:00:00Z"), "").await;
    h.post(
        &json!({"id": "daily", "channel": "out", "schedule": {"cron": "0 9 * * *"},
        "to": ["a"], "body": "x"}),
    )
    .await;
    h.post(
        &json!({"id": "once", "channel": "out", "schedule": {"at": "2026-12-01T13:00:00Z"},
        "to": ["a"], "body": "x"}),
    )
    .await;
    // Tomorrow's 09:00 and the one-shot's 13:00 are the schedule's to send: 422 naming `to`.
    let r = backfill(&h, "daily", "2026-11-30T00:00:00Z", "2026-12-02T23:59:00Z").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "to", "{}", r.text());
    let r = backfill(&h, "once", "2026-12-01T00:00:00Z", "2026-12-01T14:00:00Z").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "to", "{}", r.text());
    assert_eq!(
        h.task("daily").await["fires"]["handled"],
        0,
        "nothing changed"
    );
    assert_eq!(
        h.task("once").await["fires"]["handled"],
        0,
        "nothing changed"
    );
    // Up to now: the slots before the task was created.
    let r = backfill(&h, "daily", "2026-11-30T00:00:00Z", "2026-12-01T12:00:00Z").await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["runs"].as_array().unwrap().len(), 2);
    h.run_until(utc_ms("2026-12-02T10:00:00Z")).await;
    let sent = h.sent();
    assert_eq!(
        slots_sent(&sent, "daily"),
        [
            "2026-11-30T09:00:00Z",
            "2026-12-01T09:00:00Z",
            "2026-12-02T09:00:00Z"
        ]
    );
    assert_eq!(slots_sent(&sent, "once"), ["2026-12-01T13:00:00Z"]);
}

/// Review finding: backfilled runs did not count toward a cron's `max_runs`: a backfill took
/// the task past it, and a task whose backfill reached it waited for a next fire only to skip
/// it. A range with more slots than runs left is 422 `to`; one that reaches the count ends the
/// schedule, and the task completes when its last run ends.
#[tokio::test]
async fn backfilled_runs_count_toward_max_runs() {
    let h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    h.post(&json!({"id": "two", "channel": "out",
        "schedule": {"cron": "*/10 * * * *", "max_runs": 2},
        "misfire": "skip", "to": ["a"], "body": "x"}))
        .await;
    h.run_until(utc_ms("2026-12-01T00:05:00Z")).await;
    assert_eq!(h.action("two", "pause").await.status, 200);
    h.run_until(utc_ms("2026-12-01T00:35:00Z")).await;
    assert_eq!(h.action("two", "resume").await.status, 200);
    h.run_until(utc_ms("2026-12-01T00:36:00Z")).await;
    assert_eq!(h.runs("two").await.len(), 3, "00:10, 00:20, 00:30 skipped");
    // Three slots, two runs left: refused, nothing changed.
    let r = backfill(&h, "two", "2026-12-01T00:01:00Z", "2026-12-01T00:36:00Z").await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "to", "{}", r.text());
    assert!(r.text().contains("max_runs"), "{}", r.text());
    assert_eq!(h.task("two").await["fires"]["handled"], 3);
    // Two slots: accepted, and with them the task has its two runs.
    let r = backfill(&h, "two", "2026-12-01T00:15:00Z", "2026-12-01T00:36:00Z").await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["runs"].as_array().unwrap().len(), 2);
    h.run_until(utc_ms("2026-12-01T00:37:00Z")).await;
    let t = h.task("two").await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(t["next_fire_at"], Value::Null, "{t}");
    h.run_until(utc_ms("2026-12-01T01:00:00Z")).await;
    assert_eq!(
        slots_sent(&h.sent(), "two"),
        ["2026-12-01T00:20:00Z", "2026-12-01T00:30:00Z"]
    );
    let runs = h.runs("two").await;
    assert_eq!(
        runs.len(),
        5,
        "3 skipped, 2 backfilled, none more: {runs:?}"
    );
}
