//! OpenTelemetry export (issue 25): with `[telemetry] otlp_endpoint` pointing at a loopback
//! OTLP/HTTP receiver in the test, the spans herald exports decode as OTLP JSON, a task's
//! spans (its create request, its fire and every attempt) share its trace id and carry the attributes
//! an operator filters on; with the collector down, deliveries are on time and the dropped
//! spans are counted in `/metrics`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::herald::{in_ms, ms_of, poll, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// Every span the collector received, decoded from the OTLP JSON bodies.
fn spans(collector: &Receiver) -> Vec<Value> {
    let mut out = Vec::new();
    for r in collector.requests() {
        assert_eq!(r.path, "/v1/traces");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let doc = r.json.expect("an OTLP JSON body");
        for rs in doc["resourceSpans"].as_array().expect("resourceSpans") {
            let service = &rs["resource"]["attributes"][0];
            assert_eq!(service["key"], "service.name");
            assert_eq!(service["value"]["stringValue"], "herald");
            for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                out.extend(ss["spans"].as_array().expect("spans").iter().cloned());
            }
        }
    }
    out
}

/// A span's attributes as key → value (`stringValue` or `intValue`, both as text).
fn attrs(span: &Value) -> HashMap<String, String> {
    span["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let v = &a["value"];
            let text = v["stringValue"]
                .as_str()
                .or_else(|| v["intValue"].as_str())
                .unwrap_or_default()
                .to_string();
            (a["key"].as_str().unwrap().to_string(), text)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_spans_share_its_trace_id_and_carry_the_attributes() {
    let collector = Receiver::start().await;
    let rx = Receiver::start().await;
    rx.script(vec![
        Behavior::Status(500),
        Behavior::RetryAfter(429, "1".into()),
        Behavior::Ok,
    ]);
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{}\"\n",
        webhook_channel("hook", &rx.url(), ""),
        collector.base_url()
    );
    let h = TestHerald::start(&config).await;
    let r = http::request(
        "POST",
        &h.url("/v1/tasks"),
        &[("traceparent", &format!("00-{TRACE}-b7ad6b7169203331-01"))],
        Some(
            serde_json::to_vec(
                &json!({"id": "otel", "channel": "hook", "schedule": {"after": "0s"},
                "to": ["a"], "body": "hi",
                "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "100ms"}}),
            )
            .unwrap(),
        ),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let got = rx.wait_for(3, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 3);
    // The create span and the three attempt spans reach the collector.
    let all = poll(Duration::from_secs(20), || {
        let s = spans(&collector);
        let attempts = s.iter().filter(|s| s["kind"] == 3).count();
        let ready = attempts >= 3
            && s.iter().any(|s| s["name"] == "POST /v1/tasks")
            && s.iter().any(|s| s["name"] == "fire");
        async move { ready.then_some(s) }
    })
    .await
    .expect("the spans of the task were exported");
    for s in &all {
        assert_eq!(
            s["traceId"], TRACE,
            "every span of the task is in its trace: {s}"
        );
        assert!(
            s["startTimeUnixNano"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                > 0
        );
    }
    let fire = all.iter().find(|s| s["name"] == "fire").unwrap();
    assert_eq!(attrs(fire)["herald.task.id"], "otel");
    assert_eq!(attrs(fire)["herald.run"], "1");
    let create = all.iter().find(|s| s["name"] == "POST /v1/tasks").unwrap();
    assert_eq!(
        create["parentSpanId"], "b7ad6b7169203331",
        "a child of the caller's span"
    );
    assert_eq!(attrs(create)["herald.task.id"], "otel");
    assert_eq!(attrs(create)["http.response.status_code"], "201");
    let mut attempts: Vec<&Value> = all.iter().filter(|s| s["kind"] == 3).collect();
    attempts.sort_by_key(|s| attrs(s)["herald.attempt"].parse::<u32>().unwrap());
    let want = [("500", "retry"), ("429", "retry"), ("200", "sent")];
    for ((s, (status, outcome)), req) in attempts.iter().zip(want).zip(&got) {
        let a = attrs(s);
        assert_eq!(a["herald.task.id"], "otel");
        assert_eq!(a["herald.run"], "1");
        assert_eq!(a["herald.seq"], "0");
        assert_eq!(a["herald.channel"], "hook");
        assert_eq!(a["http.response.status_code"], status);
        assert_eq!(a["herald.outcome"], outcome);
        // The span the receiver was told about is the span exported for that attempt.
        let tp = req.header("traceparent").unwrap();
        assert_eq!(
            tp,
            format!("00-{TRACE}-{}-01", s["spanId"].as_str().unwrap())
        );
        assert_eq!(
            s["status"]["code"].as_u64().is_some(),
            outcome != "sent",
            "{s}"
        );
    }
    // Nothing dropped; the counters are in /metrics.
    let m = http::get(&h.url("/metrics")).await.text();
    assert!(m.contains("herald_otlp_spans_exported_total"), "{m}");
    assert!(m.contains("herald_otlp_spans_dropped_total 0"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_deliveries_are_on_time_and_dropped_spans_are_counted() {
    // A collector that takes the connection and never answers: each POST waits out its
    // timeout (a refused port would fail at once and prove less).
    let collector = Receiver::start().await;
    collector.set_default(Behavior::Hang);
    let rx = Receiver::start().await;
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{}\"\n",
        webhook_channel("hook", &rx.url(), ""),
        collector.base_url()
    );
    let h = TestHerald::start_on_tmpfs(&config).await;
    let due = in_ms(800);
    let messages: Vec<_> = (0..20)
        .map(|i| json!({"to": format!("u{i}"), "body": "x"}))
        .collect();
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "down", "channel": "hook", "schedule": {"at": due},
                "messages": messages, "pacing": {"interval": "50ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let got = rx.wait_for(20, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 20);
    // On time: message k is sent at due + k × 50 ms; allow the loaded-box slack the paced
    // tests allow, far below the exporter's 2 s POST timeout and 1 s pause it would add if
    // a send waited for it.
    let due_ms = ms_of(&due);
    for (k, req) in got.iter().enumerate() {
        let sent = ms_of(req.json.as_ref().unwrap()["sent_at"].as_str().unwrap());
        let planned = due_ms + 50.0 * k as f64;
        assert!(
            sent >= planned - 1.0,
            "message {k} sent {} ms early",
            planned - sent
        );
        assert!(
            sent - planned < 500.0,
            "message {k} sent {} ms late",
            sent - planned
        );
    }
    assert!(collector.count() > 0, "herald did try to export");
    // The failed export is counted as dropped spans, not retried forever or hidden.
    let m = poll(Duration::from_secs(20), || async {
        let m = http::get(&h.url("/metrics")).await.text();
        let dropped = m
            .lines()
            .find_map(|l| l.strip_prefix("herald_otlp_spans_dropped_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        (dropped > 0).then_some(m)
    })
    .await
    .expect("dropped spans are counted");
    assert!(m.contains("herald_otlp_export_failures_total"), "{m}");
}

/// `DELETE /v1/tasks/{id}` of an unfinished task is a cancel, and traced as the control calls
/// are: a span of its own in the task's trace, a child of the caller's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_is_traced_as_the_control_calls_are() {
    let collector = Receiver::start().await;
    let rx = Receiver::start().await;
    let config = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{}\"\n",
        webhook_channel("hook", &rx.url(), ""),
        collector.base_url()
    );
    let h = TestHerald::start(&config).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "del", "channel": "hook", "schedule": {"after": "1h"},
                "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let trace = r.json()["trace_id"].as_str().unwrap().to_string();
    let r = http::request(
        "DELETE",
        &h.url("/v1/tasks/del"),
        &[("traceparent", &format!("00-{TRACE}-c7ad6b7169203331-01"))],
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let span = poll(Duration::from_secs(20), || {
        let s = spans(&collector);
        async move { s.into_iter().find(|s| s["name"] == "DELETE /v1/tasks/{id}") }
    })
    .await
    .expect("the DELETE's span was exported");
    assert_eq!(span["traceId"], trace, "in the task's trace: {span}");
    assert_eq!(attrs(&span)["herald.task.id"], "del");
    assert_eq!(attrs(&span)["http.response.status_code"], "200");
}
