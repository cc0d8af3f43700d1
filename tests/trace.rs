//! W3C trace context end to end (issue 25): a `traceparent` given on create is the task's
//! trace (its view says so) and arrives at the receiver on every attempt with the same trace
//! id and a span id of each attempt's own; without one herald starts a trace; a malformed one
//! is ignored, never refused; platform templates see `traceparent`.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::herald::{in_ms, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// `(trace id, span id)` of a `traceparent` value `00-T-S-01`, checked for shape.
fn parts(tp: &str) -> (String, String) {
    let f: Vec<&str> = tp.split('-').collect();
    assert_eq!(f.len(), 4, "{tp}");
    assert_eq!((f[0], f[3]), ("00", "01"), "{tp}");
    assert_eq!((f[1].len(), f[2].len()), (32, 16), "{tp}");
    assert!(f[1]
        .bytes()
        .chain(f[2].bytes())
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    (f[1].to_string(), f[2].to_string())
}

async fn create(
    h: &TestHerald,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> serde_json::Value {
    let r = http::request(
        "POST",
        &h.url("/v1/tasks"),
        headers,
        Some(serde_json::to_vec(&body).unwrap()),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_given_on_create_arrives_on_every_attempt_with_a_new_span_each() {
    let rx = Receiver::start().await;
    rx.script(vec![
        Behavior::Status(500),
        Behavior::RetryAfter(429, "1".into()),
        Behavior::Ok,
    ]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let caller = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let view = create(
        &h,
        json!({"id": "traced", "channel": "hook", "schedule": {"after": "0s"},
               "to": ["a"], "body": "hi",
               "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "100ms"}}),
        &[
            ("traceparent", &caller),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(view["trace_id"], TRACE, "the caller's trace is the task's");
    let got = rx.wait_for(3, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 3, "500, 429, then 200");
    let mut spans = HashSet::new();
    for (i, r) in got.iter().enumerate() {
        let tp = r
            .header("traceparent")
            .unwrap_or_else(|| panic!("attempt {i} has no traceparent"));
        let (trace, span) = parts(tp);
        assert_eq!(trace, TRACE, "attempt {i}");
        assert_ne!(
            span, "00f067aa0ba902b7",
            "an attempt's span is herald's, not the caller's"
        );
        assert!(spans.insert(span), "attempt {i} reuses a span id");
        assert_eq!(r.json.as_ref().unwrap()["attempt"], i as u64 + 1);
    }
    // The view after the fact still says the same trace.
    let v = http::get(&h.url("/v1/tasks/traced")).await.json();
    assert_eq!(v["trace_id"], TRACE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_traceparent_herald_starts_a_trace_and_a_malformed_one_is_ignored() {
    let rx = Receiver::start().await;
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let plain = create(
        &h,
        json!({"id": "plain", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
        &[],
    )
    .await;
    let bad = create(
        &h,
        json!({"id": "bad", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
        &[("traceparent", "00-nothex-00f067aa0ba902b7-01")],
    )
    .await;
    let (t1, t2) = (
        plain["trace_id"].as_str().unwrap(),
        bad["trace_id"].as_str().unwrap(),
    );
    for t in [t1, t2] {
        assert_eq!(t.len(), 32);
        assert_ne!(t, "0".repeat(32));
    }
    assert_ne!(t1, t2, "each task starts a trace of its own");
    let got = rx.wait_for(2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2);
    for r in &got {
        let task = r.json.as_ref().unwrap()["task_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (trace, _) = parts(r.header("traceparent").expect("traceparent"));
        let want = if task == "plain" { t1 } else { t2 };
        assert_eq!(trace, want, "task {task}");
    }
    // A control call with a malformed header is not refused either.
    let r = http::request(
        "POST",
        &h.url("/v1/tasks/plain/cancel"),
        &[("traceparent", "garbage")],
        None,
    )
    .await;
    assert!(
        r.status == 200 || r.status == 409,
        "{} {}",
        r.status,
        r.text()
    );
    // A body cannot set the trace.
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "sneaky", "schedule": {"after": "1h"}, "to": ["a"], "body": "x",
                "trace_id": TRACE}),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_templates_see_the_attempts_traceparent() {
    let rx = Receiver::start().await;
    let config = format!(
        r#"
[channels.tpl]
kind = "webhook"
url = "{}"
body = '{{"tp":{{{{ traceparent | tojson }}}},"to":{{{{ to | tojson }}}}}}'
"#,
        rx.url()
    );
    let h = TestHerald::start(&config).await;
    let caller = format!("00-{TRACE}-00f067aa0ba902b7-01");
    create(
        &h,
        json!({"id": "p", "channel": "tpl", "schedule": {"at": in_ms(0)}, "to": ["a"], "body": "x"}),
        &[("traceparent", &caller)],
    )
    .await;
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    let body = got[0].json.as_ref().expect("JSON body");
    let tp = body["tp"].as_str().expect("traceparent in the template");
    assert_eq!(parts(tp).0, TRACE);
    assert_eq!(
        Some(tp),
        got[0].header("traceparent"),
        "the header and the variable agree"
    );
}

async fn timeline(h: &TestHerald, id: &str) -> Vec<serde_json::Value> {
    let r = http::get(&h.url(&format!("/v1/tasks/{id}/timeline?limit=1000"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["events"].as_array().cloned().unwrap_or_default()
}

/// A failure-list retry is an attempt like any other: it carries the task's trace with a span
/// of its own, and the timeline records it (`attempt`, then `delivered`) in the retry's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_list_retry_is_traced_and_on_the_timeline() {
    let rx = Receiver::start().await;
    rx.script(vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let caller = format!("00-{TRACE}-00f067aa0ba902b7-01");
    create(
        &h,
        json!({"id": "fr", "channel": "hook", "schedule": {"after": "0s"},
               "to": ["a"], "body": "hi"}),
        &[("traceparent", &caller)],
    )
    .await;
    common::herald::poll(Duration::from_secs(10), || async {
        let r = http::get(&h.url("/v1/failures?task=fr")).await.json();
        (r["failures"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await
    .expect("the 400 put the message in the failure list");
    let r = http::request("POST", &h.url("/v1/failures/fr:1:0/retry"), &[], None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let got = rx.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 2, "the attempt and the retry");
    let (t0, s0) = parts(got[0].header("traceparent").expect("first attempt traced"));
    let (t1, s1) = parts(got[1].header("traceparent").expect("the retry is traced"));
    assert_eq!((t0.as_str(), t1.as_str()), (TRACE, TRACE));
    assert_ne!(s0, s1, "the retry has a span of its own");
    let events = common::herald::poll(Duration::from_secs(10), || async {
        let ev = timeline(&h, "fr").await;
        ev.iter().any(|e| e["kind"] == "delivered").then_some(ev)
    })
    .await
    .expect("the retry's delivery is on the timeline");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    let at = kinds
        .iter()
        .position(|k| *k == "failure_retried")
        .unwrap_or_else(|| panic!("failure_retried in {kinds:?}"));
    assert_eq!(
        &kinds[at..],
        ["failure_retried", "attempt", "delivered"],
        "{kinds:?}"
    );
    let retry_attempt = &events[at + 1];
    assert_eq!(retry_attempt["attempt"], 2, "{retry_attempt}");
    assert_eq!(retry_attempt["detail"]["status"], 200, "{retry_attempt}");
    assert_eq!(
        retry_attempt["detail"]["outcome"], "sent",
        "{retry_attempt}"
    );
}

/// A task made before a restart: its deliveries carry its trace from its own spec (there is no
/// map of traces in memory that a restart would empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_deliveries_still_carry_the_tasks_trace() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = webhook_channel("hook", &rx.url(), "");
    let server = common::herald::start_in(dir.path(), &config).await;
    let caller = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let r = http::request(
        "POST",
        &format!("{}/v1/tasks", server.url()),
        &[("traceparent", &caller)],
        Some(
            serde_json::to_vec(&json!({"id": "later", "channel": "hook",
                "schedule": {"at": in_ms(60_000)}, "to": ["a"], "body": "hi"}))
            .unwrap(),
        ),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(server.stop(Duration::from_secs(10)).await, "herald stopped");
    let server = common::herald::start_in(dir.path(), &config).await;
    let r = http::post_json(
        &format!("{}/v1/tasks/later/trigger", server.url()),
        &json!({}),
    )
    .await;
    assert!(r.status < 300, "{}", r.text());
    let got = rx.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let (trace, _) = parts(got[0].header("traceparent").expect("traced"));
    assert_eq!(trace, TRACE, "the trace survives the restart");
    assert!(server.stop(Duration::from_secs(10)).await);
}
