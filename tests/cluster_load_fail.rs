//! Cluster mode, a granted shard whose load fails (review finding): a load that panicked was
//! dropped silently, and the shard stayed held, renewed by the lease loop, with none of its
//! tasks on the wheel: nothing of it was ever sent. Now the shard is let go like a load whose
//! read failed (`engine/cluster.rs`, `let_shard_go`), and its next grant loads it whole.
//! The test knob `HERALD_TEST_LOAD_PANIC` (a file: the load that finds it deletes it and
//! panics) makes exactly one shard's load fail; it is counted in
//! `herald_shard_load_failed_total`, not in `herald_fence_rejected_total` (nothing was refused).

mod common;

use std::time::Duration;

use common::cluster::{id_in, metric, owned, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_load_panicked_is_let_go_and_loaded_again() {
    let Some(pg) = PgServer::start("cluster_load_fail") else {
        return;
    };
    let url = pg.create_db("load_fail");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = common::cluster::node(&url, dir.path(), "a", "a", SHARDS, &rx.url(), TEST_TIMING);
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");
    // A one-shot in every shard, due after the restart below: each is on disk, to be loaded
    // with its shard by the next process.
    let ids: Vec<String> = (0..SHARDS).map(|s| id_in("load", &[s], SHARDS)).collect();
    for id in &ids {
        let task = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(6_000)},
            "to": ["r"], "body": "sent once its shard is loaded"});
        let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // SIGTERM: a frees its shards, so the next process is granted them at once.
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(20)).await;

    let knob = dir.path().join("load-panics");
    std::fs::write(&knob, b"once").unwrap();
    let hook = format!("url = \"{}\"\ntimeout = \"1s\"\n", rx.url());
    let mut cmd =
        common::cluster::node_command(&url, dir.path(), "b", "b", SHARDS, &hook, TEST_TIMING);
    cmd.env(herald::engine::cluster::LOAD_PANIC_ENV, &knob);
    let b = Proc::start(cmd);
    poll(Duration::from_secs(30), || async {
        (!knob.exists()).then_some(())
    })
    .await
    .expect("one shard's load panicked (the knob's file is gone)");

    // Every task is sent, the one in the shard whose load panicked too: its shard was let go,
    // granted again after its lease ran out, and loaded.
    let got = rx.wait_for(ids.len(), Duration::from_secs(30)).await;
    let mut sent: Vec<String> = got
        .iter()
        .filter_map(|r| r.idempotency_key())
        .map(|k| k.split(':').next().unwrap_or_default().to_string())
        .collect();
    sent.sort();
    sent.dedup();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sent, want, "a shard whose load panicked was never loaded");
    poll(Duration::from_secs(30), || async {
        (owned(&b.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("b holds every shard again");
    for id in &ids {
        let v = http::get(&format!("{}/v1/tasks/{id}", b.url)).await.json();
        assert_eq!(v["state"], "completed", "{v}");
    }
    assert_eq!(rx.count(), ids.len(), "each sent once");
    // The shard let go is counted as a failed load, not as a write the fence refused (the
    // load's let-go once counted in `herald_fence_rejected_total`): b is alone, nothing of
    // it was refused.
    assert_eq!(
        metric(&b.url, "herald_shard_load_failed_total").await,
        1.0,
        "one load failed"
    );
    assert_eq!(
        metric(&b.url, "herald_fence_rejected_total").await,
        0.0,
        "no write was refused by the fence"
    );
}
