//! Cluster mode, a failure-list retry under way across a crash (HA.md: a shard's new owner
//! carries on its work; API.md `POST /v1/failures/{id}/retry`). Start-up holds no shard, so a
//! retry armed then would be dropped by the dispatcher: each shard's retries under way go on
//! when it is granted. Killed with `kill -9` while its retry backs off against a failing
//! receiver, the node comes back, takes its shards again once their leases ran out, and the
//! retry's next attempt reaches the healed receiver.

mod common;

use std::time::Duration;

use common::cluster::{node, owned, TEST_TIMING};
use common::herald::{in_ms, poll};
use common::http;
use common::pg::PgServer;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

const SHARDS: u32 = 4;

fn attempts(rx: &Receiver, key: &str) -> usize {
    rx.requests()
        .iter()
        .filter(|r| r.idempotency_key() == Some(key))
        .count()
}

async fn holds_all(base: &str, what: &str) {
    poll(Duration::from_secs(30), || async {
        (owned(base).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{what}: the node does not take every shard"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_under_way_goes_on_after_the_owner_is_killed_and_its_shards_taken_again() {
    let Some(pg) = PgServer::shared(
        "a_retry_under_way_goes_on_after_the_owner_is_killed_and_its_shards_taken_again",
    ) else {
        return;
    };
    let url = pg.create_db("failure_retry");
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start().await;
    // A permanent refusal: the message goes to the failure list at once.
    rx.set_default(Behavior::Status(400));
    let mut a = node(&url, dir.path(), "a", "a", SHARDS, &rx.url(), TEST_TIMING);
    holds_all(&a.url, "a").await;

    let key = "fr:1:0";
    let body = json!({"id": "fr", "channel": "hook", "schedule": {"at": in_ms(300)},
                      "messages": [{"to": "x", "body": "again"}],
                      "retry": {"max_attempts": 5, "backoff": "fixed", "initial": "3s"}});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let failures = format!("{}/v1/failures?task=fr", a.url);
    poll(Duration::from_secs(15), || async {
        let list = http::get(&failures).await.json();
        (list["failures"][0]["id"] == key).then_some(())
    })
    .await
    .expect("the message is on the failure list");

    // The retry meets a receiver that fails for now: it backs off, still `retrying`.
    rx.set_default(Behavior::Status(500));
    let r = http::post_json(&format!("{}/v1/failures/{key}/retry", a.url), &json!({})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    poll(Duration::from_secs(10), || async {
        (attempts(&rx, key) >= 2).then_some(())
    })
    .await
    .expect("the retry's first attempt arrives");
    a.kill9();
    rx.set_default(Behavior::Ok);
    let before = attempts(&rx, key);

    // The same node id again: its shards once their leases ran out.
    let a2 = node(&url, dir.path(), "a2", "a", SHARDS, &rx.url(), TEST_TIMING);
    holds_all(&a2.url, "a again").await;
    let resumed = poll(Duration::from_secs(20), || async {
        (attempts(&rx, key) > before).then_some(())
    })
    .await;
    assert!(
        resumed.is_some(),
        "the retry under way never went on after the restart: it stays `retrying` for good"
    );
    // Delivered: off the failure list.
    poll(Duration::from_secs(10), || async {
        let list = http::get(&format!("{}/v1/failures?task=fr", a2.url))
            .await
            .json();
        list["failures"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(())
    })
    .await
    .expect("the retried message leaves the failure list");
}
