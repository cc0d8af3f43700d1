//! Backfill on the manual clock (issue 28, API.md "Missed runs and backfill"): a cron paused
//! over three of its slots (misfire `skip`) is backfilled: one run for each slot without a
//! completed run, sent in slot order; a range of more than 1000 slots is 422.

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::json;

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
