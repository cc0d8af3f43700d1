//! Every step publishes its events from the engine's one commit place (`engine/commit.rs`),
//! including the two that published none before: start-up's recovery of a running task, and
//! deleting a finished one. The real engine on a manual clock, a real sled store, a file
//! channel; the bus as `GET /v1/events` reads it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use herald::clock::{Clock, ManualClock};
use herald::config::{Config, Overrides};
use herald::engine::events::Event;
use herald::engine::{Engine, EngineConfig};
use herald::request::TaskRequest;
use herald::store::Store;
use serde_json::json;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::broadcast::Receiver;

const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

fn channels(dir: &std::path::Path) -> herald::deliver::Channels {
    let config = Config::from_toml(
        &format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            dir.join("out.jsonl").display()
        ),
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.join("data")),
            token: None,
        },
    )
    .unwrap();
    herald::server::build_channels(&config).unwrap()
}

async fn run_until(engine: &Engine, clock: &ManualClock, t: u64) {
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

/// Every event published so far (the engine is idle, so nothing is still on its way).
fn drain(rx: &mut Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(e) => out.push(e),
            Err(TryRecvError::Empty) | Err(TryRecvError::Closed) => return out,
            Err(TryRecvError::Lagged(n)) => panic!("lagged by {n}"),
        }
    }
}

/// Waits (with a deadline) until the store of a dropped engine can be opened again.
fn reopen(dir: &std::path::Path) -> Store {
    common::herald::reopen(|| Store::open(&dir.join("data")))
}

#[tokio::test]
async fn recovery_publishes_the_runs_it_resumes_and_delete_publishes_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let store = Store::open(&dir.path().join("data")).unwrap();
        let engine = Engine::start(
            store,
            channels(dir.path()),
            clock.clone(),
            EngineConfig::default(),
        )
        .await
        .unwrap();
        let req: TaskRequest = serde_json::from_value(json!({"id": "seq", "channel": "out",
            "schedule": {"after": "1s"}, "to": ["a", "b", "c"], "body": "x",
            "pacing": {"interval": "10s"}}))
        .unwrap();
        engine.create(req, None).await.unwrap();
        run_until(&engine, &clock, T0 + 2_000).await;
        let v = engine.get("seq").unwrap().unwrap();
        assert_eq!(v.run.map(|r| r.sent), Some(1), "one sent before the stop");
    }

    // A second life: subscribed before recovery, it hears the running task and its run.
    let engine = Engine::new(
        reopen(dir.path()),
        channels(dir.path()),
        clock.clone(),
        EngineConfig::default(),
    )
    .unwrap();
    let mut rx = engine.events().subscribe();
    engine.recover().await.unwrap();
    let resumed = drain(&mut rx);
    assert!(
        resumed.iter().any(|e| e.kind == "progress"
            && e.task == "seq"
            && e.data["run"] == 1
            && e.data["state"] == "running"
            && e.data["sent"] == 1),
        "recovery publishes the run it resumes: {resumed:?}"
    );

    // The rest of the run, then its end, each step published.
    run_until(&engine, &clock, T0 + 30_000).await;
    let rest = drain(&mut rx);
    let sent: Vec<u64> = rest
        .iter()
        .filter(|e| e.kind == "progress")
        .filter_map(|e| e.data["sent"].as_u64())
        .collect();
    assert_eq!(sent.last(), Some(&3), "{rest:?}");
    assert!(
        rest.iter()
            .any(|e| e.kind == "task" && e.data["state"] == "completed"),
        "{rest:?}"
    );

    // Deleting the finished task is published too.
    engine.delete("seq").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let deleted = loop {
        let got = drain(&mut rx);
        if let Some(e) = got.into_iter().find(|e| e.kind == "deleted") {
            break e;
        }
        assert!(tokio::time::Instant::now() < deadline, "no deleted event");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        (deleted.task.as_str(), &deleted.data),
        ("seq", &json!({"id": "seq"}))
    );
    assert!(clock.now_ms() >= T0 + 30_000);
}
