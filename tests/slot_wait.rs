//! A send that had to wait for a free slot of its channel (`concurrency`) keeps the channel's
//! rate limit and its task's pacing: both count from when a send starts, not from when it was
//! admitted before the wait. A slow receiver holding the channel's one slot must not make the
//! sends admitted behind it go out together.

mod common;

use std::time::Duration;

use common::herald::{wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver, Recorded};
use serde_json::json;

fn task_of(r: &Recorded) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    v["task_id"].as_str().unwrap_or_default().to_string()
}

/// Arrival gaps between consecutive requests, in ms.
fn gaps(got: &[Recorded]) -> Vec<f64> {
    got.windows(2).map(|w| w[1].at_ms - w[0].at_ms).collect()
}

async fn create(h: &TestHerald, body: serde_json::Value) {
    let r = http::post_json(&h.url("/v1/tasks"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_admitted_while_the_channel_was_busy_still_keep_its_rate() {
    let rx = Receiver::start().await;
    // The first request holds the channel's one slot for 3 s.
    rx.script(vec![Behavior::Slow(Duration::from_secs(3))]);
    let h = TestHerald::start(&webhook_channel(
        "hook",
        &rx.url(),
        "concurrency = 1\nrate = \"1/1s\"",
    ))
    .await;
    let one = |id: &str| json!({"id": id, "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"});
    create(&h, one("hold")).await;
    rx.wait_for(1, Duration::from_secs(10)).await;
    // Admitted 1 s apart by the limiter, each then waits for the slot `hold` keeps.
    create(&h, one("b")).await;
    create(&h, one("c")).await;
    let got = rx.wait_for(3, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 3, "every task sent once");
    let tasks: Vec<String> = got.iter().map(task_of).collect();
    assert_eq!(tasks[0], "hold");
    for (i, gap) in gaps(&got).into_iter().enumerate().skip(1) {
        assert!(
            gap >= 950.0,
            "{} and {} arrived {gap:.0} ms apart: the rate is 1 per second ({tasks:?})",
            tasks[i],
            tasks[i + 1]
        );
    }
    // A request's arrival comes before its settle: each task completes a moment later.
    for id in ["hold", "b", "c"] {
        wait_state(&h.url(""), id, "completed", Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_paced_behind_a_busy_channel_counts_its_interval_from_the_send() {
    let rx = Receiver::start().await;
    // The first request holds the channel's one slot for 2 s.
    rx.script(vec![Behavior::Slow(Duration::from_secs(2))]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "concurrency = 1")).await;
    create(
        &h,
        json!({"id": "hold", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    rx.wait_for(1, Duration::from_secs(10)).await;
    // Its first message is admitted now and waits ~2 s for the slot; the second is paced 3 s
    // after the first one's start.
    create(
        &h,
        json!({"id": "paced", "channel": "hook", "schedule": {"after": "0s"},
               "to": ["p1", "p2"], "body": "x", "pacing": {"interval": "3s"}}),
    )
    .await;
    let got = rx.wait_for(3, Duration::from_secs(20)).await;
    let paced: Vec<&Recorded> = got.iter().filter(|r| task_of(r) == "paced").collect();
    assert_eq!(paced.len(), 2, "both messages sent once");
    let gap = paced[1].at_ms - paced[0].at_ms;
    assert!(
        gap >= 2_950.0,
        "the paced messages arrived {gap:.0} ms apart; the interval is 3 s"
    );
}
