//! A notification is durable with the event it is about (issue 28): the write that lists a
//! message in the failure list holds the notification's task too, so no crash keeps the one
//! and loses the other.
//!
//! - On the real binary: SIGKILL as soon as the failure is listed, restart: exactly one
//!   notification reaches the person (a real local receiver), never none, never two.
//! - Deterministically, in process: storage fails from the write right after the one that
//!   lists the failure (`FaultyBackend`); once it works again, the notification is delivered.
//!   When the notification was a write of its own after the event's, it was lost here.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::{Behavior, Receiver};
use herald::clock::ManualClock;
use herald::config::{Config, Overrides};
use herald::engine::{Engine, EngineConfig};
use herald::request::TaskRequest;
use herald::store::embedded::SledBackend;
use herald::store::fault::{Faults, FaultyBackend};
use herald::store::Store;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_right_after_the_failure_is_listed_one_notification_is_delivered() {
    let rx = Receiver::start().await;
    rx.script_key("doc:1:0", vec![Behavior::Status(400)]);
    let person = Receiver::start().await;
    // While the first process lives, the notification's send (if it starts) never settles:
    // only the process after the kill can deliver it.
    person.set_default(Behavior::Hang);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(
        dir.path(),
        &format!(
            "{}{}",
            webhook_channel("hook", &rx.url(), ""),
            webhook_channel("tell", &person.url(), "")
        ),
    );
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "doc", "channel": "hook", "schedule": {"after": "0s"},
            "to": ["lisi"], "body": "a",
            "notify": {"channel": "tell", "to": "zhangsan"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let listed = poll(Duration::from_secs(20), || {
        let url = format!("{}/v1/failures", p.url);
        async move {
            let v = http::get(&url).await.json();
            (!v["failures"].as_array()?.is_empty()).then_some(())
        }
    })
    .await;
    assert!(listed.is_some(), "the failure is listed");
    p.kill9();

    person.set_default(Behavior::Ok);
    let p = Proc::spawn(&config, &data);
    wait_state(
        &p.url,
        "doc.notify.1.0",
        "completed",
        Duration::from_secs(30),
    )
    .await;
    let answered: Vec<String> = person
        .answers()
        .into_iter()
        .filter(|(_, status)| *status == 200)
        .map(|(key, _)| key)
        .collect();
    assert_eq!(answered, ["doc.notify.1.0:1:0"], "{:?}", person.answers());
    // Whatever reached the receiver is that one notification (a hung attempt of the first
    // process carries the same key).
    for r in person.requests() {
        assert_eq!(r.idempotency_key(), Some("doc.notify.1.0:1:0"));
        let body = r.json.as_ref().expect("json body");
        assert_eq!(body["kind"], "notify");
        assert_eq!(body["about"]["task_id"], "doc");
    }
    let v = http::get(&format!("{}/v1/tasks?limit=100", p.url))
        .await
        .json();
    let ids: Vec<&str> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        ["doc", "doc.notify.1.0"],
        "no second notification task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_whose_channel_was_deleted_is_counted_and_blocks_nothing() {
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Status(400));
    let person = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let hook = webhook_channel("hook", &rx.url(), "");
    let config = write_config(
        dir.path(),
        &format!("{hook}{}", webhook_channel("tell", &person.url(), "")),
    );
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "doc", "channel": "hook", "schedule": {"after": "1h"},
            "to": ["lisi"], "body": "a",
            "notify": {"channel": "tell", "to": "zhangsan"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    p.kill9();
    // The operator removes the channel the notification names.
    let config = write_config(dir.path(), &hook);
    let p = Proc::spawn(&config, &data);
    let r = http::post_json(&format!("{}/v1/tasks/doc/trigger", p.url), &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let done = wait_state(&p.url, "doc", "completed", Duration::from_secs(30)).await;
    assert_eq!(done["progress"]["failed"], 1, "{done}");
    let v = http::get(&format!("{}/v1/failures", p.url)).await.json();
    assert_eq!(v["failures"].as_array().unwrap().len(), 1, "{v}");
    let text = http::get(&format!("{}/metrics", p.url)).await.text();
    let refused: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("herald_notifications_refused_total")?
                .trim()
                .parse()
                .ok()
        })
        .expect("herald_notifications_refused_total in /metrics");
    assert_eq!(refused, 1.0);
    let r = http::get(&format!("{}/v1/tasks/doc.notify.1.0", p.url)).await;
    assert_eq!(r.status, 404);
    assert_eq!(person.count(), 0);
}

const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

/// A webhook that answers one request 400, after telling storage to fail from the write
/// after the next one on: the next write is the settle that lists the failure.
async fn failing_hook(faults: Arc<Faults>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The whole request: headers, then the body its content-length names.
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ends early");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if got.len() >= end + 4 + len {
                    break;
                }
            }
        }
        faults.fail_after(1);
        conn.write_all(
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    });
    url
}

#[tokio::test]
async fn storage_failing_right_after_the_failure_is_listed_loses_no_notification() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let faults = Arc::new(Faults::default());
    let hook = failing_hook(faults.clone()).await;
    let config = Config::from_toml(
        &format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n{}",
            out.display(),
            webhook_channel("hook", &hook, "")
        ),
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().join("data")),
            token: None,
        },
    )
    .unwrap();
    let sled = SledBackend::open(&dir.path().join("data"), 8 << 20).unwrap();
    let backend = FaultyBackend {
        inner: Arc::new(sled),
        faults: faults.clone(),
    };
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::start(store, channels, clock.clone(), EngineConfig::default())
        .await
        .unwrap();
    let req: TaskRequest = serde_json::from_value(json!({"id": "doc", "channel": "hook",
        "schedule": {"after": "1s"}, "to": ["lisi"], "body": "a",
        "notify": {"channel": "out", "to": "zhangsan"}}))
    .unwrap();
    engine.create(req, None).await.unwrap();

    let run_until = |t: u64| {
        let engine = &engine;
        let clock = &clock;
        async move {
            for _ in 0..100_000 {
                match engine.idle().await {
                    Some(d) if d <= t => {
                        clock.set(d);
                        engine.wake();
                    }
                    _ => {
                        clock.set(t);
                        engine.wake();
                        engine.idle().await;
                        return;
                    }
                }
            }
            panic!("run_until did not converge");
        }
    };
    // The message is sent and refused; the failure is listed; every write after fails.
    run_until(T0 + 5_000).await;
    let (failures, _) = engine.failures(Some("doc"), None, 10).unwrap();
    assert_eq!(failures.len(), 1, "the failure is listed");
    assert!(
        faults.refused.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "a write after the failure's was refused"
    );

    // Storage works again: the notification, durable with the failure, goes out.
    faults.set(false, false);
    run_until(T0 + 60_000).await;
    let sent: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let notes: Vec<&Value> = sent.iter().filter(|v| v["kind"] == "notify").collect();
    assert_eq!(notes.len(), 1, "{sent:?}");
    assert_eq!(notes[0]["to"], "zhangsan");
    assert_eq!(
        notes[0]["about"],
        json!({"task_id": "doc", "run": 1, "seq": 0, "event": "failed"})
    );
}
