//! A paced sequence of 50 messages to a real local webhook receiver: each arrives exactly once,
//! in order, consecutive sends at least 100 ms apart, the first on time.
//! Alone in its test binary so that no other test competes for the 2 cores while it measures.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::herald::{in_ms, ms_of, webhook_channel, TestHerald};
use common::http;
use common::receiver::Receiver;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_messages_paced_at_100ms_arrive_once_in_order_on_time() {
    let rx = Receiver::start().await;
    let h = TestHerald::start_on_tmpfs(&webhook_channel("hook", &rx.url(), "")).await;
    let due = in_ms(700);
    let messages: Vec<_> = (0..50)
        .map(|i| json!({"to": format!("user-{i}"), "body": format!("message {i}")}))
        .collect();
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "paced", "channel": "hook", "schedule": {"at": due},
                "messages": messages, "pacing": {"interval": "100ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());

    let got = rx.wait_for(50, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 50, "all 50 arrived");

    // Exactly once, in order, with the documented body and headers.
    let mut keys = HashSet::new();
    for (i, req) in got.iter().enumerate() {
        let body = req.json.as_ref().expect("JSON body");
        assert_eq!(body["seq"], i as u64, "in order");
        assert_eq!(body["to"], format!("user-{i}"));
        assert_eq!(body["body"], format!("message {i}"));
        assert_eq!(body["task_id"], "paced");
        assert_eq!(body["run"], 1);
        assert_eq!(body["attempt"], 1);
        let key = format!("paced:1:{i}");
        assert_eq!(body["idempotency_key"], key);
        assert_eq!(req.header("idempotency-key"), Some(key.as_str()));
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert!(keys.insert(key), "no duplicates");
    }

    // The webhook client reuses its connection instead of dialling per message.
    let conns: HashSet<u64> = got.iter().map(|r| r.conn).collect();
    assert!(conns.len() <= 2, "{} connections for 50 sends", conns.len());

    // Pacing as herald saw it: attempt starts (sent_at, ms) at least 100 ms apart.
    let sent: Vec<f64> = got
        .iter()
        .map(|r| ms_of(r.json.as_ref().unwrap()["sent_at"].as_str().unwrap()))
        .collect();
    for w in sent.windows(2) {
        assert!(w[1] - w[0] >= 100.0, "sends {} ms apart", w[1] - w[0]);
    }
    // Pacing as the receiver saw it. Each arrival is its send plus loopback latency, and that
    // latency varies with the machine's load (a fraction of a ms idle, tens of ms on a loaded
    // 2-core box), so a single gap between two arrivals can be shorter than the interval
    // without herald sending early. What must hold: nothing arrives before herald says it
    // sent it (sent_at has whole ms, hence the 1 ms), so arrival k is never before the first
    // send plus k intervals; and on average the arrivals are an interval apart.
    let arrivals: Vec<f64> = got.iter().map(|r| r.at_ms).collect();
    for (k, (a, s)) in arrivals.iter().zip(&sent).enumerate() {
        assert!(
            a + 1.0 >= *s,
            "message {k} arrived {} ms before its send",
            s - a
        );
        assert!(
            a + 1.0 >= sent[0] + 100.0 * k as f64,
            "message {k} arrived early: {} ms after the first send",
            a - sent[0]
        );
    }
    let mean = (arrivals[49] - arrivals[0]) / 49.0;
    assert!(mean >= 99.0, "mean gap {mean} ms");

    // The first message went out within a few ms of its due time.
    let due_ms = ms_of(&due);
    let min_gap = arrivals
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(f64::MAX, f64::min);
    eprintln!(
        "paced: first send {} ms after due, first arrival {:.2} ms after due; arrival gaps min {min_gap:.2} ms, mean {mean:.2} ms",
        sent[0] - due_ms,
        arrivals[0] - due_ms
    );
    assert!(sent[0] >= due_ms, "sent before due");
    // Typically 0-2 ms; the bound leaves room for a loaded 2-core CI machine.
    assert!(
        sent[0] - due_ms <= 25.0,
        "first send {} ms late",
        sent[0] - due_ms
    );
    assert!(
        arrivals[0] - due_ms <= 50.0,
        "first arrival {} ms late",
        arrivals[0] - due_ms
    );

    // The task completed with full progress, and nothing more arrives.
    let v = common::herald::wait_state(
        &h.server.url(),
        "paced",
        "completed",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(v["progress"]["sent"], 50);
    assert_eq!(v["progress"]["failed"], 0);
    assert_eq!(v["next_fire_at"], serde_json::Value::Null);
    assert_eq!(rx.count(), 50);
}
