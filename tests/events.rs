//! `GET /v1/events`: server-sent events of task changes, run progress and failure-list
//! changes, read off a real connection as a client would.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::herald::{webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

/// An open event stream.
struct Stream {
    body: Incoming,
    buf: String,
}

async fn open(url: &str, token: Option<&str>) -> (u16, Vec<(String, String)>, Stream) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = hyper::Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer in time")
    .expect("request");
    let status = resp.status().as_u16();
    let headers = common::header_pairs(resp.headers());
    (
        status,
        headers,
        Stream {
            body: resp.into_body(),
            buf: String::new(),
        },
    )
}

impl Stream {
    /// The next event (name, data), waiting at most `deadline`; `None` if the stream ended.
    async fn next(&mut self, deadline: Duration) -> Option<(String, Value)> {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let mut name = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(v).expect("data is JSON"));
                    }
                }
                if let (Some(n), Some(d)) = (name, data) {
                    return Some((n, d));
                }
                continue;
            }
            let frame = tokio::time::timeout_at(end, self.body.frame())
                .await
                .unwrap_or_else(|_| {
                    panic!("no event within {deadline:?}; buffered: {:?}", self.buf)
                });
            match frame {
                None => return None,
                Some(f) => {
                    if let Ok(d) = f.expect("stream frame").into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&d));
                    }
                }
            }
        }
    }

    /// Events until one satisfies `stop` (included).
    async fn until(&mut self, stop: impl Fn(&str, &Value) -> bool) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        loop {
            let (n, d) = self
                .next(Duration::from_secs(15))
                .await
                .expect("stream still open");
            let done = stop(&n, &d);
            out.push((n, d));
            if done {
                return out;
            }
        }
    }
}

#[tokio::test]
async fn a_paced_sequence_streams_its_progress_to_the_end() {
    let h = TestHerald::start("").await;
    let (status, headers, mut s) = open(&h.url("/v1/events"), None).await;
    assert_eq!(status, 200);
    let ct = headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v.as_str());
    assert_eq!(ct, Some("text/event-stream"));
    let (name, ready) = s.next(Duration::from_secs(10)).await.expect("ready");
    assert_eq!(name, "ready");
    assert!(ready["now"].is_string());

    let n = 6u64;
    let to: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "seq", "schedule": {"after": "200ms"}, "pacing": {"interval": "50ms"},
                "to": to, "body": "hi"}),
    )
    .await;
    assert_eq!(r.status, 201);
    let events = s
        .until(|n, d| n == "progress" && d["state"] == "completed")
        .await;
    // created (pending), started (running), then the cursor moving to the end
    assert_eq!(events[0].0, "task");
    assert_eq!(
        (&events[0].1["id"], &events[0].1["state"]),
        (&json!("seq"), &json!("pending"))
    );
    let progress: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "progress")
        .map(|(_, d)| d)
        .collect();
    let sent: Vec<u64> = progress
        .iter()
        .map(|p| p["sent"].as_u64().unwrap())
        .collect();
    assert_eq!(sent.first(), Some(&0), "the run's start: {sent:?}");
    assert_eq!(sent.last(), Some(&n));
    assert!(sent.windows(2).all(|w| w[1] >= w[0]), "{sent:?}");
    assert!(sent.contains(&(n / 2)), "every step is reported: {sent:?}");
    for p in &progress {
        assert_eq!(
            (&p["task"], &p["run"], &p["total"]),
            (&json!("seq"), &json!(1), &json!(n))
        );
    }
    let last = progress.last().unwrap();
    assert_eq!(last["task_state"], "completed");
    assert!(events
        .iter()
        .any(|(n, d)| n == "task" && d["state"] == "running"));
    documented(&[("ready".to_string(), ready)]);
    documented(&events);
}

/// Each event's data has exactly the fields its `Event*` schema in the OpenAPI document lists.
fn documented(events: &[(String, Value)]) {
    let doc: Value = serde_json::from_str(herald::api::OPENAPI).unwrap();
    for (name, data) in events {
        let schema = format!("Event{}{}", name[..1].to_uppercase(), &name[1..]);
        let props = doc["components"]["schemas"][&schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} is not documented"));
        let mut documented: Vec<&String> = props.keys().collect();
        let mut sent: Vec<&String> = data.as_object().expect("an object").keys().collect();
        documented.sort();
        sent.sort();
        assert_eq!(sent, documented, "{name}: {data}");
    }
}

#[tokio::test]
async fn control_commands_failures_and_the_task_filter() {
    let rx = Receiver::start().await;
    rx.script_key("f:1:0", vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let (_, _, mut all) = open(&h.url("/v1/events"), None).await;
    let (_, _, mut only) = open(&h.url("/v1/events?task=f"), None).await;
    assert_eq!(all.next(Duration::from_secs(10)).await.unwrap().0, "ready");
    assert_eq!(only.next(Duration::from_secs(10)).await.unwrap().0, "ready");

    // Another task's pause and cancel are seen on the unfiltered stream only.
    http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "other", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    http::post_json(&h.url("/v1/tasks/other/pause"), &json!({})).await;
    http::post_json(&h.url("/v1/tasks/other/cancel"), &json!({})).await;
    let seen = all
        .until(|n, d| n == "task" && d["state"] == "cancelled")
        .await;
    let states: Vec<&str> = seen
        .iter()
        .filter(|(n, _)| n == "task")
        .map(|(_, d)| d["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "paused", "cancelled"]);

    // A message refused for good: `failure` added; a retry that succeeds: retrying, resolved.
    http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "f", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    let seen = only.until(|n, _| n == "failure").await;
    let (_, added) = seen.last().unwrap();
    assert_eq!(
        (&added["id"], &added["action"], &added["task"]),
        (&json!("f:1:0"), &json!("added"), &json!("f"))
    );
    assert!(added["last_error"]
        .as_str()
        .unwrap()
        .starts_with("HTTP 400"));
    let r = http::post_json(&h.url("/v1/failures/f:1:0/retry"), &json!({})).await;
    assert_eq!(r.status, 202);
    let seen = only
        .until(|n, d| n == "failure" && d["action"] == "resolved")
        .await;
    assert!(seen
        .iter()
        .any(|(n, d)| n == "failure" && d["action"] == "retrying"));
    documented(&seen);
    // The filtered stream never carried the other task.
    assert!(seen
        .iter()
        .all(|(_, d)| d["id"] != "other" && d["task"] != "other"));
}

#[tokio::test]
async fn authenticated_and_checked_like_the_rest() {
    let h = TestHerald::start_with_token("", "tok").await;
    let (status, headers, _) = open(&h.url("/v1/events"), None).await;
    assert_eq!(status, 401);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "content-type" && v == "application/problem+json"));
    let (status, _, _) = open(&h.url("/v1/events"), Some("wrong")).await;
    assert_eq!(status, 401);
    let (status, _, mut s) = open(&h.url("/v1/events"), Some("tok")).await;
    assert_eq!(status, 200);
    assert_eq!(s.next(Duration::from_secs(10)).await.unwrap().0, "ready");
    let (status, _, _) = open(&h.url("/v1/events?colour=red"), Some("tok")).await;
    assert_eq!(status, 400);
    let (status, _, _) = open(&h.url("/v1/events?task=bad%20id"), Some("tok")).await;
    assert_eq!(status, 400);
    let r = http::request(
        "POST",
        &h.url("/v1/events"),
        &[("authorization", "Bearer tok")],
        None,
    )
    .await;
    assert_eq!(r.status, 405);
}

/// An open stream does not keep herald alive: stopping ends it, and the data dir is released.
#[tokio::test]
async fn stopping_herald_ends_open_streams() {
    let h = TestHerald::start("").await;
    let (_, _, mut s) = open(&h.url("/v1/events"), None).await;
    assert_eq!(s.next(Duration::from_secs(10)).await.unwrap().0, "ready");
    let TestHerald { server, dir: _dir } = h;
    assert!(
        server.stop(Duration::from_secs(10)).await,
        "herald stopped with a stream open"
    );
    assert!(
        s.next(Duration::from_secs(10)).await.is_none(),
        "the stream ended"
    );
}
