//! 1 000 messages against a receiver that fails 30 % of requests at random: every message
//! ends delivered or in the failure list, none lost, none delivered twice. Alone in its test
//! binary: it keeps both cores busy.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::herald::{wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::Receiver;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_with_30_percent_500s_none_lost_none_twice() {
    let rx = Receiver::start().await;
    rx.fail_rate(0.3, 500, 7);
    let h = TestHerald::start_on_tmpfs(&webhook_channel(
        "hook",
        &rx.url(),
        "concurrency = 16\nretry = { max_attempts = 3, initial = \"10ms\" }",
    ))
    .await;
    for t in 0..10 {
        let r = http::post_json(
            &h.url("/v1/tasks"),
            &json!({"id": format!("t{t}"), "channel": "hook", "schedule": {"after": "0s"},
                   "to": (0..100).map(|i| format!("u{i}")).collect::<Vec<_>>(), "body": "x"}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let mut failed_total = 0;
    for t in 0..10 {
        let v = wait_state(
            &h.server.url(),
            &format!("t{t}"),
            "completed",
            Duration::from_secs(120),
        )
        .await;
        failed_total += v["progress"]["failed"].as_u64().unwrap();
        assert_eq!(
            v["progress"]["sent"].as_u64().unwrap() + v["progress"]["failed"].as_u64().unwrap(),
            100
        );
    }
    // What the receiver accepted, per key, and what herald gave up on.
    let mut accepted: HashMap<String, usize> = HashMap::new();
    for (key, status) in rx.answers() {
        if status == 200 {
            *accepted.entry(key).or_default() += 1;
        }
    }
    assert!(
        accepted.values().all(|n| *n == 1),
        "no message accepted twice"
    );
    let mut failed: HashSet<String> = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let q = match &after {
            Some(a) => format!("limit=1000&after={a}"),
            None => "limit=1000".into(),
        };
        let page = http::get(&h.url(&format!("/v1/failures?{q}"))).await.json();
        for f in page["failures"].as_array().unwrap() {
            assert_eq!(f["attempts"], 3, "{f}");
            assert!(f["last_error"].as_str().unwrap().contains("500"));
            failed.insert(f["id"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    assert_eq!(failed.len() as u64, failed_total);
    let all: HashSet<String> = (0..10)
        .flat_map(|t| (0..100).map(move |i| format!("t{t}:1:{i}")))
        .collect();
    let delivered: HashSet<String> = accepted.keys().cloned().collect();
    assert!(
        delivered.is_disjoint(&failed),
        "a message both delivered and failed"
    );
    let union: HashSet<String> = delivered.union(&failed).cloned().collect();
    assert_eq!(
        union, all,
        "every message ends delivered or in the failure list"
    );
    // About 0.3^3 = 2.7 % exhaust their three attempts.
    assert!(failed.len() < 80, "{} failed", failed.len());
}
