//! Cluster mode, the inbox's wake-up (HA.md "Creates and commands on any node": owners drain
//! their inbox on the notification and at least every 500 ms). A create on a node that does
//! not hold the task's shard is written with an inbox row and one `NOTIFY herald_inbox`; the
//! owner's `LISTEN` connection (`src/cluster/listen.rs`) wakes its drain.
//!
//! Both nodes run with the test knob `HERALD_TEST_INBOX_FLOOR_MS` at two minutes, so the
//! drain's timer cannot fire during the test: a create through the inbox is delivered in time
//! only thanks to the notification (a correctness check of the wake-up, not a speed target).
//! Then the listening sessions are ended from the server side (`pg_terminate_backend`): each
//! node makes its connection again, and the next create through the inbox is still woken.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{balanced, node_command, shards_of, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 8;
/// The drain's timer in this test: far beyond anything the test waits for.
const FLOOR: Duration = Duration::from_secs(120);
/// How long a create through the inbox may take to arrive (it is due 500 ms after the create).
const DELIVERED_WITHIN: Duration = Duration::from_secs(10);

fn node(url: &str, dir: &std::path::Path, name: &str, hook: &str) -> Proc {
    let hook = format!("url = \"{hook}\"\ntimeout = \"1s\"\n");
    let mut cmd = node_command(url, dir, name, name, SHARDS, &hook, TEST_TIMING);
    cmd.env(
        herald::engine::cluster::INBOX_FLOOR_ENV,
        FLOOR.as_millis().to_string(),
    );
    Proc::start(cmd)
}

/// The backends of the nodes' `LISTEN` connections, as the server sees them.
fn listeners(pg: &PgServer, url: &str) -> usize {
    pg.psql(
        url,
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'",
            herald::cluster::listen::APPLICATION_NAME
        ),
    )
    .trim()
    .parse()
    .unwrap_or(0)
}

/// Creates a one-shot through `via` for a shard `owner` holds (so through the inbox), and
/// waits for its delivery; how long it took from the create.
async fn through_inbox(rx: &Receiver, via: &str, owner: &str, name: &str) -> Duration {
    let theirs = shards_of(via, owner).await;
    let id = common::cluster::id_in(name, &theirs, SHARDS);
    let key = format!("{id}:1:0");
    let created = Instant::now();
    let body = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(500)},
                      "messages": [{"to": "x", "body": name}]});
    let r = http::post_json(&format!("{via}/v1/tasks"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    poll(DELIVERED_WITHIN, || async {
        rx.requests()
            .iter()
            .any(|r| r.idempotency_key() == Some(key.as_str()))
            .then(|| created.elapsed())
    })
    .await
    .unwrap_or_else(|| {
        panic!("{key}, created through {via} for {owner}'s shard, not delivered within {DELIVERED_WITHIN:?}: the owner was not woken")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_through_the_inbox_is_woken_by_notify_not_by_the_timer() {
    let Some(pg) = PgServer::start("cluster_inbox") else {
        return;
    };
    let url = pg.create_db("inbox");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let a = node(&url, dir.path(), "a", &rx.url());
    let b = node(&url, dir.path(), "b", &rx.url());
    balanced(
        &[&a.url, &b.url],
        u64::from(SHARDS / 2),
        Duration::from_secs(60),
        "two nodes",
    )
    .await;
    poll(Duration::from_secs(10), || async {
        (listeners(&pg, &url) == 2).then_some(())
    })
    .await
    .expect("each node holds one LISTEN connection");

    let ab = through_inbox(&rx, &b.url, "a", "to-a").await;
    let ba = through_inbox(&rx, &a.url, "b", "to-b").await;

    // The server ends both listening sessions; each node connects again (after its backoff)
    // and the inbox still wakes it.
    let ended = pg.psql(
        &url,
        &format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{}') t",
            herald::cluster::listen::APPLICATION_NAME
        ),
    );
    assert_eq!(ended.trim(), "2", "both LISTEN sessions ended");
    poll(Duration::from_secs(10), || async {
        (listeners(&pg, &url) == 2).then_some(())
    })
    .await
    .expect("each node makes its LISTEN connection again");
    let again = through_inbox(&rx, &b.url, "a", "again").await;
    eprintln!("through the inbox: b→a {ab:?}, a→b {ba:?}, after the reconnect {again:?} (due 500 ms after each create)");
    // Everything happened before either node's timer could have drained the inbox once.
    assert!(
        started.elapsed() < FLOOR,
        "the test ran past the inbox floor ({:?}): it proves nothing",
        started.elapsed()
    );
}
