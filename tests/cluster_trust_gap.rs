//! Cluster mode, a moment without trust on a shard still held (HA.md "Leases"): between the
//! end of a shard's trust and the lease loop's next look, a renewal answered late can extend
//! the trust, and then the shard is never dropped and never loaded again. A one-shot that
//! fell due in such a moment was dropped from the wheel as "not held" and stayed pending for
//! good (nemesis seed 2912079). Now its key comes back a little later. The moment is made
//! here through the test knob `HERALD_TEST_TRUST_GAP` (a file: while it exists, the engine
//! reads every shard as held but not trusted), the shards held all along.

mod common;

use std::time::Duration;

use common::cluster::owned;
use common::herald::{in_ms, poll};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_due_while_the_trust_is_out_goes_once_it_is_back() {
    let Some(pg) = PgServer::start("cluster_trust_gap") else {
        return;
    };
    let url = pg.create_db("gap");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gap = dir.path().join("trust-out");
    let a = common::cluster::lone_node_with_knob(
        &url,
        dir.path(),
        SHARDS,
        &rx.url(),
        herald::engine::cluster::TRUST_GAP_ENV,
        &gap,
    )
    .await;

    // Due in 3 s: its fire step runs 2 s ahead (`arm::ONE_SHOT_LEAD_MS`), inside the gap.
    let task = json!({"id": "in-the-gap", "channel": "hook", "schedule": {"at": in_ms(3_000)},
        "to": ["r"], "body": "late but once"});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    std::fs::write(&gap, b"out").unwrap();
    // Past the instant, with the trust out (the fault's length): nothing goes, the task is
    // not fired, and the shards stay held.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(rx.count(), 0, "nothing sent while the trust was out");
    let v = http::get(&format!("{}/v1/tasks/in-the-gap", a.url))
        .await
        .json();
    assert_eq!(v["state"], "pending", "{v}");
    assert_eq!(
        owned(&a.url).await,
        u64::from(SHARDS),
        "the shards stayed held: nothing will load them again"
    );

    std::fs::remove_file(&gap).unwrap();
    let got = rx.wait_for(1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1, "the one-shot goes once the trust is back");
    poll(Duration::from_secs(15), || async {
        let v = http::get(&format!("{}/v1/tasks/in-the-gap", a.url))
            .await
            .json();
        (v["state"] == "completed").then_some(())
    })
    .await
    .expect("the task completes");
    assert_eq!(rx.count(), 1, "sent once");
}
