//! Cluster mode, the inherited in-flight mark (HA.md "The send itself"): "a new owner that
//! inherits an in-flight mark waits until claimed_at + send timeout before re-sending it with
//! the same key, so two attempts of one message never overlap".
//!
//! Two real nodes on one private PostgreSQL, the webhook's timeout (10 s) far longer than the
//! test's lease (2 s). The receiver holds node a's attempt open; a is killed with SIGKILL
//! while it waits; b takes the shard over after about one lease, finds the mark, and must not
//! send before the first attempt could have timed out — without the wait it sent ~3 s after
//! the first attempt, with it ≥ 10 s. Both instants are read at the receiver, on this one
//! machine's clock (the nodes' clock offset is ~0 here, so the 2 × `max_clock_offset` that
//! the wait adds for clocks that disagree is extra margin, not needed slack).

mod common;

use std::time::Duration;

use common::cluster::{balanced, metric, node_command, shards_of, TEST_TIMING};
use common::herald::{in_ms, poll, wait_state, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

const SHARDS: u32 = 8;
/// The hook's timeout: the longest an attempt may stay under way at the receiver.
const TIMEOUT_MS: f64 = 10_000.0;
/// What the measurement may be off by: the first arrival is stamped when its request was
/// read, a few ms after the send started; both are the receiver's clock.
const SLACK_MS: f64 = 100.0;

fn node(url: &str, dir: &std::path::Path, name: &str, hook: &str) -> Proc {
    let hook = format!("url = \"{hook}\"\ntimeout = \"{TIMEOUT_MS}ms\"\n");
    Proc::start(node_command(
        url,
        dir,
        name,
        name,
        SHARDS,
        &hook,
        TEST_TIMING,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_resends_an_inherited_mark_only_after_claim_plus_send_timeout() {
    let Some(pg) = PgServer::start("cluster_inherit") else {
        return;
    };
    let url = pg.create_db("inherit");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = node(&url, dir.path(), "a", &rx.url());
    let b = node(&url, dir.path(), "b", &rx.url());
    balanced(
        &[&a.url, &b.url],
        u64::from(SHARDS / 2),
        Duration::from_secs(60),
        "two nodes",
    )
    .await;
    // A one-shot on one of a's shards: a claims and sends it.
    let mine = shards_of(&b.url, "a").await;
    let id = common::cluster::id_in("held", &mine, SHARDS);
    let key = format!("{id}:1:0");
    // The first attempt is held open (never answered); any later one is answered 200.
    rx.script_key(&key, vec![Behavior::Hang]);
    let body = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(1_000)},
                      "messages": [{"to": "x", "body": "once"}]});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let arrivals = || {
        rx.requests()
            .into_iter()
            .filter(|r| r.idempotency_key() == Some(key.as_str()))
            .collect::<Vec<_>>()
    };
    let first = poll(Duration::from_secs(15), || async {
        arrivals().first().cloned()
    })
    .await
    .expect("a sends the first attempt");
    let open = rx.open_connections();
    assert!(open >= 1, "the first attempt is held open");
    a.kill9();
    // The first attempt ends when its connection does (the kernel closes a's sockets).
    let closed_ms = poll(Duration::from_secs(5), || async {
        (rx.open_connections() < open).then(now_ms)
    })
    .await
    .expect("the held connection closes with a");
    let second = poll(Duration::from_secs(40), || async {
        arrivals().get(1).cloned()
    })
    .await
    .unwrap_or_else(|| panic!("b never sent {key} again: {:?}", arrivals().len()));
    let gap = second.at_ms - first.at_ms;
    eprintln!(
        "first attempt at {:.0}, closed {:.0} ms later by the kill, second {gap:.0} ms after the first (timeout {TIMEOUT_MS} ms)",
        first.at_ms,
        closed_ms - first.at_ms
    );
    assert!(
        gap >= TIMEOUT_MS - SLACK_MS,
        "the new owner re-sent {gap:.0} ms after the first attempt, before its send timeout of {TIMEOUT_MS} ms could have ended it"
    );
    assert!(
        second.at_ms > closed_ms,
        "the two attempts overlap: the second arrived before the first's connection closed"
    );
    // Not a speed target, a bound: claim + timeout + 2 × max_clock_offset (1 s), reached
    // well after the takeover (~1 lease), plus generous room for a loaded machine.
    assert!(
        gap <= TIMEOUT_MS + 1_000.0 + 5_000.0,
        "the inherited mark waited {gap:.0} ms"
    );
    let epoch = |r: &common::receiver::Recorded| -> u64 {
        r.header("herald-epoch")
            .and_then(|e| e.parse().ok())
            .expect("herald-epoch")
    };
    assert!(
        epoch(&second) > epoch(&first),
        "the second attempt is the new owner's ({} then {})",
        epoch(&first),
        epoch(&second)
    );
    // Settled once by b: no third attempt, and b counts the mark it inherited.
    wait_state(&b.url, &id, "completed", Duration::from_secs(10)).await;
    assert_eq!(arrivals().len(), 2, "exactly two attempts of {key}");
    assert!(metric(&b.url, "herald_inflight_inherited_total").await >= 1.0);
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}
