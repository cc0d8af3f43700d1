//! Cluster mode across a partition (HA.md "Tests": node ↔ database blackhole, then heal): two
//! real nodes on one private PostgreSQL, node a reaching it through a TCP proxy; a paced
//! sequence on a shard of a. The proxy then passes nothing either way: a's renewals go
//! unanswered and its trust ends, b takes a's shards over once their leases ran out and
//! carries the sequence on; then the partition heals, what a sent meanwhile arrives late, and
//! a must not have acted on what it lost (its late writes are fenced). The nodes balance
//! again. Every message arrives; at most the one in flight at the cut arrives twice; order is
//! kept.

mod common;

use std::time::Duration;

use common::cluster::{balanced, owned, sequence_delivered, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::http;
use common::pg::PgServer;
use common::pgproxy::PgProxy;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 8;

fn node(url: &str, dir: &std::path::Path, name: &str, hook: &str) -> Proc {
    common::cluster::node(url, dir, name, name, SHARDS, hook, TEST_TIMING)
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = http::get(&format!("{base}/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_owner_loses_its_shards_and_the_other_node_carries_on() {
    let Some(pg) = PgServer::start("cluster_partition") else {
        return;
    };
    let url = pg.create_db("partition");
    let proxy = PgProxy::start(pg.port());
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = node(&proxy.url(&url), dir.path(), "a", &rx.url());
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");
    let b = node(&url, dir.path(), "b", &rx.url());
    poll(Duration::from_secs(40), || async {
        (owned(&a.url).await == u64::from(SHARDS / 2)
            && owned(&b.url).await == u64::from(SHARDS / 2))
        .then_some(())
    })
    .await
    .expect("balanced");
    // A task id on one of a's shards, so that a is the one sending it.
    let view = http::get(&format!("{}/v1/cluster", a.url)).await.json();
    let a_shards: Vec<u32> = view["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["owner_node"] == "a")
        .map(|s| s["shard"].as_u64().unwrap() as u32)
        .collect();
    let id = (0..1000)
        .map(|i| format!("paced-{i}"))
        .find(|id| a_shards.contains(&herald::store::pg::fence::shard_of_task(id, SHARDS)))
        .unwrap();
    const N: usize = 24;
    let task = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(300)},
        "pacing": {"interval": "200ms"},
        "messages": (0..N).map(|i| json!({"to": format!("r{i}"), "body": "p"})).collect::<Vec<_>>()});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    rx.wait_for(5, Duration::from_secs(20)).await;

    proxy.blackhole(true);
    // b takes a's shards once their leases ran out, and sends on.
    poll(Duration::from_secs(20), || async {
        (owned(&b.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("b takes the partitioned node's shards");
    let before_wake = rx.count();
    poll(Duration::from_secs(20), || async {
        (rx.count() >= before_wake + 5).then_some(())
    })
    .await
    .expect("b carries the sequence on");
    proxy.blackhole(false);

    // Every message, in order; at most the one in flight at the cut twice.
    let keys = sequence_delivered(&rx, N, Duration::from_secs(90), "the cut").await;

    // a lost its trust: it rejoins and the two balance again, and nothing more came.
    balanced(
        &[&a.url, &b.url],
        u64::from(SHARDS / 2),
        Duration::from_secs(40),
        "the healed node rejoins and the shards balance again",
    )
    .await;
    assert_eq!(
        rx.count(),
        keys.len(),
        "nothing was sent after the sequence completed"
    );
    eprintln!(
        "after the heal: a's fenced writes {} (each dropped a shard)",
        metric(&a.url, "herald_fence_rejected_total").await
    );
}
