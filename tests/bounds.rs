//! Bounds with their stated outcome, reached on the real server (issue 22, item 4).
//!
//! The failure list holds at most `[store] failures_max` entries: past it a message given up
//! on is not listed, its run still counts it failed, `herald_failures_unlisted_total` counts
//! it and one alert says the list is full; an entry that leaves makes room again.

mod common;

use std::time::Duration;

use common::herald::{wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

async fn failures(h: &TestHerald) -> Vec<String> {
    let v = http::get(&h.url("/v1/failures")).await.json();
    let mut ids: Vec<String> = v["failures"]
        .as_array()
        .unwrap_or_else(|| panic!("a failure page: {v}"))
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

async fn metric(h: &TestHerald, name: &str) -> f64 {
    let text = http::get(&h.url("/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test]
async fn a_full_failure_list_takes_no_more_and_says_so() {
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Status(400));
    let config = format!(
        "{}\n[store]\nfailures_max = 2\n",
        webhook_channel("hook", &rx.url(), "")
    );
    let h = TestHerald::start(&config).await;
    let alerts_before = metric(&h, "herald_alerts_total").await;

    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "f", "channel": "hook", "schedule": {"after": "0s"},
                "to": ["a", "b", "c", "d"], "body": "x", "pacing": {"interval": "10ms"},
                "retry": {"max_attempts": 1}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let task = wait_state(&h.url(""), "f", "completed", Duration::from_secs(20)).await;
    assert_eq!(
        task["progress"]["failed"], 4,
        "every message counts failed on its run: {task}"
    );
    assert_eq!(
        failures(&h).await,
        ["f:1:0", "f:1:1"],
        "the first two are listed"
    );
    assert_eq!(metric(&h, "herald_failures_unlisted_total").await, 2.0);
    // Two entries alerted as failures, and one alert that the list is full (not one per
    // message it refused).
    assert_eq!(metric(&h, "herald_alerts_total").await - alerts_before, 3.0);

    // A dismissed entry makes room: the next failure is listed again.
    let r = http::request("DELETE", &h.url("/v1/failures/f:1:0"), &[], None).await;
    assert!(r.status < 300, "dismiss: {} {}", r.status, r.text());
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "g", "channel": "hook", "schedule": {"after": "0s"},
                "to": ["a"], "body": "x", "retry": {"max_attempts": 1}}),
    )
    .await;
    assert_eq!(r.status, 201);
    wait_state(&h.url(""), "g", "completed", Duration::from_secs(20)).await;
    assert_eq!(failures(&h).await, ["f:1:1", "g:1:0"]);
    assert_eq!(metric(&h, "herald_failures_unlisted_total").await, 2.0);
}
