//! The grace defect of issue 28 on the real binary: a one-shot at T with `misfire_grace: "1s"`
//! is fired (armed) 2 s ahead of T; herald is killed (-9) at T − 1.5 s and started again at
//! T + 2.5 s. Its send would start 2.5 s after T, more than the grace: the run expires, the task
//! ends `expired`, nothing is sent. With a 5 s grace the same outage sends it at restart.

mod common;

use std::time::Duration;

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::Receiver;
use serde_json::{json, Value};

fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Waits (polling the wall clock) until it reads at least `t`.
async fn until_wall(t: i64) {
    poll(Duration::from_secs(30), || async {
        (wall_ms() >= t).then_some(())
    })
    .await
    .expect("the wall clock moves");
}

/// Creates the one-shot due 4 s from now, sees it armed, kills herald at T − 1.5 s and
/// restarts it at T + 2.5 s. The restarted process, the receiver, and T.
async fn outage_over_an_armed_one_shot(grace: &str) -> (Proc, Receiver, i64, tempfile::TempDir) {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));
    let mut p = Proc::spawn(&config, &data);
    let at = chrono::Utc::now() + chrono::Duration::milliseconds(4_000);
    let t = at.timestamp_millis();
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "once", "channel": "hook", "misfire_grace": grace,
                "schedule": {"at": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)},
                "messages": [{"to": "a", "body": "b"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Armed ahead of its instant: the fire was handled (a run, its first attempt in flight).
    let v = wait_state(&p.url, "once", "running", Duration::from_secs(10)).await;
    assert_eq!(v["progress"]["in_flight"], 1, "{v}");
    assert!(wall_ms() < t - 1_500, "the fire was armed 2 s ahead: {v}");
    until_wall(t - 1_500).await;
    p.kill9();
    assert_eq!(rx.count(), 0, "killed before its instant");
    until_wall(t + 2_500).await;
    let p = Proc::spawn(&config, &data);
    (p, rx, t, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_armed_before_an_outage_longer_than_its_grace_expires() {
    let (p, rx, _t, _dir) = outage_over_an_armed_one_shot("1s").await;
    let v = wait_state(&p.url, "once", "expired", Duration::from_secs(10)).await;
    assert_eq!(v["fires"]["expired"], 1, "{v}");
    let runs: Value = http::get(&format!("{}/v1/tasks/once/runs", p.url))
        .await
        .json();
    let run = &runs["runs"][0];
    assert_eq!(run["state"], "expired", "{runs}");
    let why = run["reason"].as_str().unwrap_or_default();
    assert!(why.contains("misfire_grace 1s"), "{why}");
    // Nothing went, and nothing will: the run is finished, not waiting.
    assert_eq!(rx.count(), 0);
    let listed: Value = http::get(&format!("{}/v1/tasks?state=expired", p.url))
        .await
        .json();
    assert_eq!(listed["tasks"][0]["id"], "once", "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_outage_within_a_5s_grace_sends_at_restart() {
    let (p, rx, t, _dir) = outage_over_an_armed_one_shot("5s").await;
    wait_state(&p.url, "once", "completed", Duration::from_secs(10)).await;
    let got = rx.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1);
    assert!(wall_ms() >= t + 2_500);
}
