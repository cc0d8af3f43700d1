//! Start-up in two phases (manual clock): herald is ready once the running tasks and those due
//! within a minute are on the wheel; the rest of the live index loads in the background. A
//! command or create that names a task the background load has not reached yet must see it
//! exactly as if it were loaded, and the load must not undo what the command did.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::herald::{poll, utc_ms, ManualHerald};
use common::http;
use serde_json::json;

#[tokio::test]
async fn commands_reach_tasks_the_background_load_has_not_reached() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let mut h = ManualHerald::start(t0, "").await;
    let one = |id: &str, after: &str| json!({"id": id, "channel": "out", "schedule": {"after": after}, "to": ["a"], "body": id});
    h.post(&one("soon", "30s")).await;
    for id in ["far-cancel", "far-pause", "far-trigger", "far-keep"] {
        h.post(&one(id, "2h")).await;
    }
    for i in 0..50 {
        h.post(&one(&format!("filler-{i:02}"), "3h")).await;
    }
    h.stop().await;

    // Restart with the background load held: only `soon` (due within the minute) is loaded.
    let hold = Arc::new(AtomicBool::new(true));
    h.engine_config.hold_index_load = Some(hold.clone());
    h.clock.set(t0 + 1_000);
    h.restart().await;
    let engine = h.server().engine.clone();
    assert!(engine.is_ready());
    assert!(engine.index_loading());
    assert_eq!(engine.live_tasks(), 1, "only the task due soon is loaded");

    // Reads come from the store.
    assert_eq!(h.task("far-keep").await["state"], "pending");
    // Commands adopt the task from its entry on disk.
    let r = h.action("far-cancel", "cancel").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "cancelled");
    let r = h.action("far-pause", "pause").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "paused");
    let r = h.action("far-trigger", "trigger").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A create with the id of a live task not loaded yet is a conflict, and loses nothing.
    let r = http::post_json(&h.url("/v1/tasks"), &one("far-keep", "1m")).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(engine.index_loading(), "the load was held throughout");

    hold.store(false, Ordering::Release);
    poll(Duration::from_secs(30), || async {
        (!engine.index_loading()).then_some(())
    })
    .await
    .expect("the background load finishes");
    h.run_until(t0 + 4 * 3_600_000).await;

    let mut sent: Vec<String> = h
        .sent()
        .iter()
        .map(|s| s["body"].as_str().unwrap().to_string())
        .collect();
    sent.sort();
    let mut want: Vec<String> = ["soon", "far-trigger", "far-keep"]
        .iter()
        .map(|s| s.to_string())
        .chain((0..50).map(|i| format!("filler-{i:02}")))
        .collect();
    want.sort();
    assert_eq!(
        sent, want,
        "each task sent once; cancelled and paused ones not at all"
    );
    assert_eq!(h.task("far-cancel").await["state"], "cancelled");
    assert_eq!(h.task("far-pause").await["state"], "paused");
    assert_eq!(h.task("far-keep").await["state"], "completed");
    // Every far task was sent at its own instant, not when the load reached it.
    for s in h.sent() {
        let body = s["body"].as_str().unwrap();
        let at = utc_ms(s["sent_at"].as_str().unwrap());
        let due = match body {
            "soon" => t0 + 30_000,
            "far-trigger" => t0 + 1_000,
            b if b.starts_with("filler") => t0 + 3 * 3_600_000,
            _ => t0 + 2 * 3_600_000,
        };
        assert_eq!(at, due, "{body} sent at its due instant");
    }
    // Only the paused task is still live.
    assert_eq!(engine.live_tasks(), 1);
}

#[tokio::test]
async fn a_restart_with_nothing_beyond_the_horizon_loads_everything_before_ready() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let mut h = ManualHerald::start(t0, "").await;
    for i in 0..5 {
        h.post(&json!({"id": format!("t{i}"), "channel": "out",
            "schedule": {"after": "20s"}, "to": ["a"], "body": "x"}))
            .await;
    }
    h.restart().await;
    let engine = h.server().engine.clone();
    assert!(!engine.index_loading());
    assert_eq!(engine.live_tasks(), 5);
    h.run_until(t0 + 60_000).await;
    assert_eq!(h.sent().len(), 5);
}
