//! Cluster mode, two nodes creating one id at once: a client's create to node a, whose
//! database traffic is slow, gets no answer in time, and the client (or another client) sends
//! a create of the same id, with another body, to node b. Any node writes creates (HA.md
//! "Creates and commands on any node"), and the writes are upserts: both read the id absent,
//! both wrote it, b answered 201 and a's later commit then put its task over b's. Now a
//! create locks the id for its transaction before it reads (`store/pg/backend.rs`,
//! `absent_locks`): one of the two is refused, and the task stored is the one answered 201.

mod common;

use std::time::Duration;

use common::cluster::{balanced, node, shards_of, TEST_TIMING};
use common::herald::in_ms;
use common::http;
use common::pg::PgServer;
use common::pgproxy::PgProxy;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_created_on_two_nodes_at_once_is_stored_once_as_answered() {
    let Some(pg) = PgServer::start("cluster_create_race") else {
        return;
    };
    let url = pg.create_db("race");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (PgProxy::start(pg.port()), PgProxy::start(pg.port()));
    let a = node(
        &pa.url(&url),
        dir.path(),
        "a",
        "a",
        SHARDS,
        &rx.url(),
        TEST_TIMING,
    );
    let b = node(
        &pb.url(&url),
        dir.path(),
        "b",
        "b",
        SHARDS,
        &rx.url(),
        TEST_TIMING,
    );
    balanced(
        &[&a.url, &b.url],
        u64::from(SHARDS / 2),
        Duration::from_secs(60),
        "the two nodes balance",
    )
    .await;
    // An id of a shard b holds: a's create is an inbox write, with no fence that a slow lease
    // could refuse.
    let theirs = common::herald::poll(Duration::from_secs(10), || async {
        let s = shards_of(&b.url, "b").await;
        (!s.is_empty()).then_some(s)
    })
    .await
    .expect("b holds shards");
    let id = common::cluster::id_in("race", &theirs, SHARDS);
    let body = |name: &str| {
        json!({"id": id, "name": name, "channel": "hook",
            "schedule": {"at": in_ms(60_000)}, "to": ["r"], "body": name})
    };
    let tasks = |node: &str| format!("{node}/v1/tasks");

    // 300 ms each way: the create takes seconds, and no statement waits past the idle-in-transaction
    // bound of cluster mode (half the lease, 1 s here).
    pa.delay(Duration::from_millis(300));
    // The client gives up after 2 s: a's transaction has read the id absent by then and has
    // not committed yet, so b's create comes in between.
    let first = tokio::time::timeout(
        Duration::from_secs(2),
        http::try_request(
            "POST",
            &tasks(&a.url),
            &[],
            Some(serde_json::to_vec(&body("from-a")).unwrap()),
        ),
    )
    .await;
    assert!(
        first.is_err(),
        "the slowed create answered within the client's patience: {first:?}; the test proves nothing"
    );
    let on_b = http::post_json(&tasks(&b.url), &body("from-b")).await;
    assert!(
        on_b.status == 201 || on_b.status == 409,
        "{}: {}",
        on_b.status,
        on_b.text()
    );
    // The first try's end: a retry of it on a waits for it (`engine::claim_id`).
    let again = http::post_json(&tasks(&a.url), &body("from-a")).await;
    assert_eq!(again.status, 409, "{}", again.text());

    let stored = http::get(&format!("{}/v1/tasks/{id}", b.url)).await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    let want = if on_b.status == 201 {
        "from-b"
    } else {
        "from-a"
    };
    assert_eq!(
        stored.json()["name"],
        want,
        "b answered {}: the task stored must be {want}'s: {}",
        on_b.status,
        stored.text()
    );
}
