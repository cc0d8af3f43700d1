//! Outcome classification and retries against a real receiver: 5xx retried, 4xx to the
//! failure list at once, transport errors retried, and a failed message never stops the task.

mod common;

use std::time::Duration;

use common::herald::{poll, wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

async fn create(h: &TestHerald, body: Value) {
    let r = http::post_json(&h.url("/v1/tasks"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
}

async fn failures(h: &TestHerald, task: &str) -> Vec<Value> {
    let r = http::get(&h.url(&format!("/v1/failures?task={task}"))).await;
    assert_eq!(r.status, 200);
    r.json()["failures"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn two_500s_then_200_is_delivered_on_attempt_3() {
    let rx = Receiver::start().await;
    rx.script_key("r:1:0", vec![Behavior::Status(500), Behavior::Status(500)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    create(
        &h,
        json!({"id": "r", "channel": "hook", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "hi"}],
               "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "100ms"}}),
    )
    .await;
    let v = wait_state(&h.server.url(), "r", "completed", Duration::from_secs(10)).await;
    let got = rx.requests();
    assert_eq!(got.len(), 3);
    for (i, req) in got.iter().enumerate() {
        assert_eq!(req.json.as_ref().unwrap()["attempt"], i as u64 + 1);
        assert_eq!(
            req.header("idempotency-key"),
            Some("r:1:0"),
            "same key on every attempt"
        );
    }
    // Fixed backoff of 100 ms between attempts.
    assert!(got[1].at_ms - got[0].at_ms >= 95.0);
    assert!(got[2].at_ms - got[1].at_ms >= 95.0);
    assert_eq!(
        rx.answers().iter().map(|a| a.1).collect::<Vec<_>>(),
        [500, 500, 200]
    );
    assert_eq!(v["progress"]["sent"], 1);
    assert_eq!(v["progress"]["failed"], 0);
    assert!(failures(&h, "r").await.is_empty());
}

#[tokio::test]
async fn a_400_goes_to_the_failure_list_after_one_attempt_and_the_sequence_goes_on() {
    let rx = Receiver::start().await;
    rx.script_key("p:1:0", vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    create(
        &h,
        json!({"id": "p", "channel": "hook", "schedule": {"after": "0s"},
               "to": ["bad-recipient", "good-recipient"], "body": "hi",
               "retry": {"max_attempts": 5, "initial": "50ms"}}),
    )
    .await;
    let v = wait_state(&h.server.url(), "p", "completed", Duration::from_secs(10)).await;
    assert_eq!(v["progress"]["sent"], 1);
    assert_eq!(v["progress"]["failed"], 1);
    let keys: Vec<_> = rx
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert_eq!(keys, ["p:1:0", "p:1:1"], "no retry of a permanent failure");
    let f = failures(&h, "p").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["id"], "p:1:0");
    assert_eq!(f[0]["task_id"], "p");
    assert_eq!(f[0]["seq"], 0);
    assert_eq!(f[0]["to"], "bad-recipient");
    assert_eq!(f[0]["attempts"], 1);
    assert!(
        f[0]["last_error"].as_str().unwrap().starts_with("HTTP 400"),
        "{}",
        f[0]
    );
    // The task is still there to read.
    let r = http::get(&h.url("/v1/tasks/p")).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn retries_are_bounded_and_exhaustion_lands_in_the_failure_list() {
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Status(503));
    let h = TestHerald::start(&webhook_channel(
        "hook",
        &rx.url(),
        "retry = { max_attempts = 3, initial = \"50ms\" }",
    ))
    .await;
    create(
        &h,
        json!({"id": "x", "channel": "hook", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "hi"}]}),
    )
    .await;
    wait_state(&h.server.url(), "x", "completed", Duration::from_secs(10)).await;
    assert_eq!(
        rx.count(),
        3,
        "the channel's retry policy applies: 3 attempts"
    );
    let f = failures(&h, "x").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["attempts"], 3);
    assert!(f[0]["last_error"].as_str().unwrap().contains("503"));
}

#[tokio::test]
async fn connection_refused_is_retried_then_failed() {
    // Bind and drop a listener to get a port where nothing listens.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/hook");
    let h = TestHerald::start(&webhook_channel("dead", &url, "timeout = \"500ms\"")).await;
    create(
        &h,
        json!({"id": "d", "channel": "dead", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "hi"}],
               "retry": {"max_attempts": 2, "initial": "50ms"}}),
    )
    .await;
    let f = poll(Duration::from_secs(10), || async {
        let f = failures(&h, "d").await;
        (!f.is_empty()).then_some(f)
    })
    .await
    .expect("failure recorded");
    assert_eq!(f[0]["attempts"], 2);
    let err = f[0]["last_error"].as_str().unwrap();
    assert!(
        err.to_lowercase().contains("refused") || err.contains("connect"),
        "{err}"
    );
}

#[tokio::test]
async fn file_and_log_channels_deliver() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sent.jsonl");
    let h = TestHerald::start(&format!(
        "[channels.audit]\nkind = \"file\"\npath = \"{}\"\n",
        path.display()
    ))
    .await;
    create(
        &h,
        json!({"id": "f", "channel": "audit", "schedule": {"after": "0s"},
               "to": ["a", "b"], "body": "hello"}),
    )
    .await;
    create(
        &h,
        json!({"id": "l", "schedule": {"after": "0s"}, "to": ["a"], "body": "hello"}),
    )
    .await;
    wait_state(&h.server.url(), "f", "completed", Duration::from_secs(10)).await;
    let v = wait_state(&h.server.url(), "l", "completed", Duration::from_secs(10)).await;
    assert_eq!(v["channel"], "log");
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["to"], "a");
    assert_eq!(lines[1]["idempotency_key"], "f:1:1");
}

#[tokio::test]
async fn a_task_with_a_128_character_id_has_reachable_failures() {
    let rx = Receiver::start().await;
    let id = "x".repeat(128);
    let key = format!("{id}:1:0");
    rx.script_key(&key, vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    create(
        &h,
        json!({"id": id, "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    wait_state(&h.server.url(), &id, "completed", Duration::from_secs(10)).await;
    let f = failures(&h, &id).await;
    assert_eq!(f[0]["id"], key.as_str());
    let page = http::get(&h.url(&format!("/v1/failures?after={key}"))).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let r = http::delete(&h.url(&format!("/v1/failures/{key}"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // 405 names the allowed methods.
    let r = http::request("PUT", &h.url("/v1/failures"), &[], None).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET"));
}
