//! The timeline as the engine writes it (issue 25), each event in the same durable write as
//! the step it records:
//! - a paced sequence against a receiver that answers 500, then 429 with `Retry-After`, then
//!   200: exactly those attempts in order, with their statuses and the delays between them,
//!   then `delivered`;
//! - `kill -9` while a send is in flight (the real binary): after the restart the timeline
//!   says `resumed_after_restart`, and has no event for the attempt whose outcome was never
//!   recorded;
//! - control calls, the event stream and `[store] timeline_max = 0`.

mod common;

use std::time::Duration;

use common::herald::{ms_of, wait_state, webhook_channel, write_config, Proc, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

async fn timeline(base: &str, id: &str) -> Vec<Value> {
    let r = http::get(&format!("{base}/v1/tasks/{id}/timeline?limit=1000")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["events"].as_array().unwrap().clone()
}

/// `kind`, or `kind:msg:attempt` for the events about one attempt of a message.
fn shape(e: &Value) -> String {
    match (e["msg"].as_u64(), e["attempt"].as_u64()) {
        (Some(m), Some(a)) => format!("{}:{m}:{a}", e["kind"].as_str().unwrap()),
        _ => e["kind"].as_str().unwrap().to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_sequence_through_500_then_429_then_200_is_on_the_timeline_in_order() {
    let rx = Receiver::start().await;
    rx.script(vec![
        Behavior::Status(500),
        Behavior::RetryAfter(429, "1".into()),
        Behavior::Ok,
        Behavior::Ok,
    ]);
    let h = TestHerald::start_on_tmpfs(&webhook_channel("hook", &rx.url(), "")).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "seq", "channel": "hook", "schedule": {"after": "0s"},
                "messages": [{"to": "a", "body": "one"}, {"to": "b", "body": "two"}],
                "pacing": {"interval": "100ms"},
                "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "200ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&h.server.url(), "seq", "completed", Duration::from_secs(20)).await;
    let events = timeline(&h.server.url(), "seq").await;
    let shapes: Vec<String> = events.iter().map(shape).collect();
    assert_eq!(
        shapes,
        [
            "created",
            "fired",
            "attempt:0:1",
            "retry_scheduled:0:1",
            "attempt:0:2",
            "retry_scheduled:0:2",
            "attempt:0:3",
            "delivered:0:3",
            "attempt:1:1",
            "delivered:1:1",
        ],
        "{events:#?}"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs grow: {seqs:?}");
    let d = |i: usize| &events[i]["detail"];
    // The answers, as the receiver gave them.
    assert_eq!(
        (d(2)["status"].clone(), d(2)["outcome"].clone()),
        (json!(500), json!("retry"))
    );
    assert!(
        d(2)["error"].as_str().unwrap().starts_with("HTTP 500"),
        "{}",
        d(2)
    );
    assert_eq!(
        (d(4)["status"].clone(), d(4)["outcome"].clone()),
        (json!(429), json!("retry"))
    );
    assert_eq!(
        (d(6)["status"].clone(), d(6)["outcome"].clone()),
        (json!(200), json!("sent"))
    );
    assert_eq!(d(8)["status"], 200);
    for i in [2, 4, 6, 8] {
        assert!(d(i)["duration_ms"].as_u64().is_some(), "{}", events[i]);
    }
    // The delays: the backoff's 200 ms after the 500, the Retry-After's second after the 429,
    // each retry_scheduled saying when, and the attempts really that far apart.
    let at = |i: usize| ms_of(events[i]["at"].as_str().unwrap());
    let planned = |i: usize| ms_of(d(i)["at"].as_str().unwrap());
    let after_500 = planned(3) - at(2);
    assert!(
        (150.0..=400.0).contains(&after_500),
        "backoff {after_500} ms"
    );
    assert!(
        d(3)["reason"].as_str().unwrap().contains("HTTP 500"),
        "{}",
        d(3)
    );
    let after_429 = planned(5) - at(4);
    assert!(
        after_429 >= 990.0,
        "Retry-After: 1 honoured: {after_429} ms"
    );
    assert!(
        d(5)["reason"].as_str().unwrap().starts_with("Retry-After"),
        "{}",
        d(5)
    );
    assert!(
        at(4) - at(2) >= 150.0,
        "{} ms between attempts 1 and 2",
        at(4) - at(2)
    );
    assert!(
        at(6) - at(4) >= 990.0,
        "{} ms between attempts 2 and 3",
        at(6) - at(4)
    );
    let got = rx.requests();
    assert_eq!(got.len(), 4, "exactly the attempts the timeline shows");
    // The same events went out on the event bus while it ran? Checked in the next test;
    // here: a run filter keeps run 1's events (all but `created`).
    let r = http::get(&h.url("/v1/tasks/seq/timeline?run=1"))
        .await
        .json();
    assert_eq!(r["events"].as_array().unwrap().len(), events.len() - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_calls_are_on_the_timeline_and_on_the_event_stream() {
    let h = TestHerald::start("").await;
    // A subscriber first: it hears the timeline events as they become durable.
    let url = h.url("/v1/events?task=c");
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let stream = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let resp = client.get(url.parse().unwrap()).await.unwrap();
        let mut body = resp.into_body();
        let mut text = String::new();
        let mut ready = Some(ready_tx);
        let end = tokio::time::Instant::now() + Duration::from_secs(20);
        while text.matches("event: timeline").count() < 5 {
            match tokio::time::timeout_at(end, body.frame()).await {
                Ok(Some(Ok(f))) => {
                    if let Some(d) = f.data_ref() {
                        text.push_str(&String::from_utf8_lossy(d));
                    }
                    if text.contains("event: ready") {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                _ => break,
            }
        }
        text
    });
    tokio::time::timeout(Duration::from_secs(10), ready_rx)
        .await
        .expect("the event stream is live")
        .unwrap();
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "c", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    for action in ["pause", "resume"] {
        let r = http::request("POST", &h.url(&format!("/v1/tasks/c/{action}")), &[], None).await;
        assert_eq!(r.status, 200, "{action}: {}", r.text());
    }
    let r = http::patch_json(&h.url("/v1/tasks/c"), &json!({"name": "renamed"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::request("POST", &h.url("/v1/tasks/c/cancel"), &[], None).await;
    assert_eq!(r.status, 200);
    let events = timeline(&h.server.url(), "c").await;
    let kinds: Vec<String> = events.iter().map(shape).collect();
    assert_eq!(
        kinds,
        ["created", "paused", "resumed", "patched", "cancelled"]
    );
    assert_eq!(events[0]["detail"]["trace_id"].as_str().unwrap().len(), 32);
    let text = stream.await.unwrap();
    let first: Vec<Value> = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("event: timeline\ndata: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(first.len(), 5, "{text}");
    for (got, want) in first.iter().zip(&events) {
        assert_eq!(got["task"], "c");
        assert_eq!(
            (got["seq"].clone(), got["kind"].clone()),
            (want["seq"].clone(), want["kind"].clone())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeline_max_zero_keeps_no_events() {
    let rx = Receiver::start().await;
    let h = TestHerald::start(&format!(
        "[store]\ntimeline_max = 0\n{}",
        webhook_channel("hook", &rx.url(), "")
    ))
    .await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "off", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    wait_state(&h.server.url(), "off", "completed", Duration::from_secs(20)).await;
    assert!(timeline(&h.server.url(), "off").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_send_shows_resumed_after_restart_and_no_event_for_the_cut_attempt() {
    let rx = Receiver::start().await;
    // The first attempt never gets an answer: herald is killed while it waits.
    rx.script(vec![Behavior::Hang]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(
        dir.path(),
        &webhook_channel("hook", &rx.url(), "timeout = \"30s\""),
    );
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "k", "channel": "hook", "schedule": {"after": "0s"},
                "messages": [{"to": "a", "body": "one"}, {"to": "b", "body": "two"}],
                "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "100ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "the first attempt is in flight");
    p.kill9();
    let before = rx.count();
    let p = Proc::spawn(&config, &data);
    wait_state(&p.url, "k", "completed", Duration::from_secs(30)).await;
    let events = timeline(&p.url, "k").await;
    let shapes: Vec<String> = events.iter().map(shape).collect();
    assert_eq!(
        shapes,
        [
            "created",
            "fired",
            "resumed_after_restart:0:2",
            "attempt:0:2",
            "delivered:0:2",
            "attempt:1:1",
            "delivered:1:1",
        ],
        "{events:#?}"
    );
    assert_eq!(events[2]["detail"]["message"], 0);
    assert!(
        !events
            .iter()
            .any(|e| e["kind"] == "attempt" && e["attempt"] == 1 && e["msg"] == 0),
        "no event for the attempt whose outcome was never recorded"
    );
    // The message in flight went again with the same key; nothing else was repeated.
    let keys: Vec<String> = rx
        .requests()
        .iter()
        .skip(before - 1)
        .map(|r| r.idempotency_key().unwrap().to_string())
        .collect();
    assert_eq!(keys, ["k:1:0", "k:1:0", "k:1:1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_rate_limit_holds_has_one_held_event_saying_until_when() {
    let rx = Receiver::start().await;
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "rate = \"1/400ms\"")).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "rl", "channel": "hook", "schedule": {"after": "0s"},
                "messages": [{"to": "a", "body": "1"}, {"to": "b", "body": "2"}, {"to": "c", "body": "3"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&h.server.url(), "rl", "completed", Duration::from_secs(20)).await;
    let events = timeline(&h.server.url(), "rl").await;
    for m in 1..3u64 {
        let held: Vec<&Value> = events
            .iter()
            .filter(|e| e["kind"] == "held" && e["msg"] == m)
            .collect();
        assert_eq!(held.len(), 1, "message {m}: one held event: {events:#?}");
        assert_eq!(held[0]["detail"]["why"], "rate_limit");
        let until = ms_of(held[0]["detail"]["until"].as_str().unwrap());
        let attempt = events
            .iter()
            .find(|e| e["kind"] == "attempt" && e["msg"] == m)
            .expect("then its attempt");
        assert!(held[0]["seq"].as_u64() < attempt["seq"].as_u64());
        assert!(
            ms_of(attempt["at"].as_str().unwrap()) + 1.0 >= until,
            "sent no earlier than the hold said"
        );
    }
    assert_eq!(
        events.iter().filter(|e| e["kind"] == "delivered").count(),
        3
    );
}
