//! A live task's history never slows its fires, and stays bounded.
//!
//! A per-second cron is given 100 000 finished runs (written into its store while herald is
//! down, as an import of an old task would), then fires on the manual clock: loading it for the
//! fire reads its active runs only (`active_runs` index), counted by the store. With
//! `[store] runs_max` the oldest finished runs are deleted as it fires, a bounded number per
//! fire, down to the bound.

mod common;

use std::time::{Duration, Instant};

use common::herald::ManualHerald;
use herald::model::{Run, RunState};
use herald::store::{Batch, Store};
use serde_json::json;

const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

/// Stops herald, gives task `id` `n` finished runs (numbers 1..=n, one per second before T0)
/// and counts them as fired, then starts herald again on the same data.
async fn give_history(h: &mut ManualHerald, id: &str, n: u32) {
    h.stop().await;
    let dir = h.dir.path().join("data");
    let store = common::herald::reopen(|| Store::open(&dir));
    let mut task = store.get_task(id).unwrap().expect("the task is stored");
    task.fires = n;
    task.runs = n;
    let mut batch = Batch::new();
    for run in 1..=n {
        let at = T0 - u64::from(n - run + 1) * 1000;
        let mut r = Run::new(run, at, at, 1);
        r.state = RunState::Completed;
        r.finished_at_ms = Some(at + 1);
        r.next_at_ms = None;
        r.cursor = 1;
        r.sent = 1;
        batch.run(id, &r);
        if batch.ops.len() == 5_000 {
            store.write(&std::mem::take(&mut batch)).await.unwrap();
        }
    }
    batch.progress(&task);
    store.write(&batch).await.unwrap();
    let closed = store.closed_flag();
    drop(store);
    let end = Instant::now() + Duration::from_secs(10);
    while !closed.load(std::sync::atomic::Ordering::Acquire) {
        assert!(Instant::now() < end, "the store did not close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.restart().await;
}

fn cron(id: &str) -> serde_json::Value {
    json!({"id": id, "channel": "out", "schedule": {"cron": "* * * * * *"},
           "to": ["a"], "body": "tick"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_with_100_000_finished_runs_fires_reading_only_its_active_runs() {
    let mut h = ManualHerald::start(T0, "[store]\nruns_max = 1000000\n").await;
    h.post(&cron("busy")).await;
    give_history(&mut h, "busy", 100_000).await;

    let store = h.server().engine.store();
    let before = store.run_records_read();
    h.run_until(T0 + 2_500).await;
    let read = store.run_records_read() - before;
    let sent = h.sent();
    assert!(sent.len() >= 2, "the cron fired and sent: {sent:?}");
    assert!(
        sent.iter().all(|s| s["run"].as_u64().unwrap() > 100_000),
        "new runs are numbered after the history: {sent:?}"
    );
    // A fire's load reads the task's running runs, never its finished ones: each fire here
    // reads at most the one run it started (when its send phase loads it again).
    assert!(
        read <= 2 * sent.len() as u64,
        "{read} run records read for {} fires (the history has 100 000)",
        sent.len()
    );
    let task = h.task("busy").await;
    assert!(task["runs"].as_u64().unwrap() > 100_000, "{task}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_max_trims_the_oldest_finished_runs_a_bounded_number_per_fire() {
    let mut h = ManualHerald::start(T0, "[store]\nruns_max = 10\n").await;
    h.post(&cron("trim")).await;
    give_history(&mut h, "trim", 100).await;
    let count = |h: &ManualHerald| {
        h.server()
            .engine
            .store()
            .runs_page("trim", None, 1_000)
            .unwrap()
            .0
    };
    assert_eq!(count(&h).len(), 100);

    // Fire 101 (at T0 + 1 s) may delete at most store::TRIM_MAX (64) of runs 1..=91.
    h.run_until(T0 + 1_500).await;
    let after_one = count(&h);
    assert_eq!(after_one.len(), 101 - herald::store::TRIM_MAX);
    assert_eq!(after_one[0].run, 1 + herald::store::TRIM_MAX as u32);

    // Two more fires bring it down to the newest 10, and it stays there.
    h.run_until(T0 + 3_500).await;
    let runs = count(&h);
    let numbers: Vec<u32> = runs.iter().map(|r| r.run).collect();
    assert_eq!(numbers, (94..=103).collect::<Vec<u32>>());
    h.run_until(T0 + 6_500).await;
    let numbers: Vec<u32> = count(&h).iter().map(|r| r.run).collect();
    assert_eq!(numbers, (97..=106).collect::<Vec<u32>>());
}
