//! `/metrics` of a running herald: the histograms and gauges an operator watches are there
//! with bounded labels, existing names stay, and `promtool check metrics` (Debian package
//! `prometheus`) finds nothing to complain about (missing promtool: `tools::require`).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::herald::{wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::Receiver;
use serde_json::json;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_latency_histograms_and_task_gauges_and_pass_promtool() {
    let rx = Receiver::start().await;
    let config = webhook_channel(
        "hook",
        &rx.url(),
        "breaker = { window = \"60s\", min_requests = 20, failure_ratio = 0.5, cool_down = \"30s\" }",
    );
    let h = TestHerald::start(&config).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "now", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a", "b"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "later", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    wait_state(&h.server.url(), "now", "completed", Duration::from_secs(20)).await;
    // The wheel gauge is as of the timer's last round, and a far-off entry is put on the wheel
    // up to ~10 ms after its create (the timer is not woken for it): wait for it to show.
    common::herald::poll(Duration::from_secs(5), || async {
        let t = http::get(&h.url("/metrics")).await.text();
        value(&t, "herald_wheel_entries")
            .is_some_and(|v| v >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(http::get(&h.url("/v1/tasks/nope")).await.status, 404);
    let m = http::get(&h.url("/metrics")).await;
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = m.text();

    // Names that README, tests and dashboards already use.
    for series in [
        "herald_ready",
        "herald_tasks_live",
        "herald_store_flushes_total",
        "herald_storage_failing",
        "herald_channel_attempts_total{channel=\"hook\",outcome=\"sent\"}",
        "herald_channel_held_local_total{channel=\"hook\"}",
        "herald_channel_breaker_open{channel=\"hook\"}",
    ] {
        assert!(value(&text, series).is_some(), "{series} missing:\n{text}");
    }
    assert_eq!(
        value(
            &text,
            "herald_channel_attempts_total{channel=\"hook\",outcome=\"sent\"}"
        ),
        Some(2.0)
    );
    // Histograms: fire lateness, delivery per channel and outcome, flush time and group
    // size, API requests by route template (never by raw path).
    assert_eq!(
        value(&text, "herald_send_lateness_seconds_count"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "herald_delivery_duration_seconds_count{channel=\"hook\",outcome=\"sent\"}"
        ),
        Some(2.0),
        "{text}"
    );
    assert!(value(&text, "herald_store_flush_duration_seconds_count").unwrap() >= 1.0);
    assert!(value(&text, "herald_store_group_writers_count").unwrap() >= 1.0);
    assert!(
        text.contains("herald_http_request_duration_seconds_count{route=\"/v1/tasks/{id}\",method=\"GET\",code=\"4xx\"} 1"),
        "{text}"
    );
    assert!(!text.contains("/v1/tasks/nope"), "raw paths are not labels");
    // Gauges: tasks by state, failure list, wheel.
    assert_eq!(
        value(&text, "herald_tasks{state=\"pending\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value(&text, "herald_tasks{state=\"running\"}"), Some(0.0));
    assert_eq!(value(&text, "herald_failures"), Some(0.0));
    assert!(
        value(&text, "herald_wheel_entries").unwrap() >= 1.0,
        "the pending task's fire"
    );

    let Some(promtool) = common::tools::require(
        "promtool",
        "sudo apt-get install -y --no-install-recommends prometheus",
        "metrics::metrics_show_latency_histograms_and_task_gauges_and_pass_promtool (promtool check)",
    ) else {
        return;
    };
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool was found on PATH but did not start");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n---\n{text}"
    );
}
