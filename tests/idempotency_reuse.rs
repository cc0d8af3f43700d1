//! An idempotency key freed because its task is gone (retention, DELETE) may be taken again
//! by a new create at any moment. Review finding: the key's delete was blind, so a second
//! freeing (another create with the same key, or the retention sweep that read the key
//! before the first create took it) removed the new task's record, and the next create with
//! the key made a second task. The delete now applies only while the key still names the
//! gone task (`RawOp::IdemOf`), on sled and on PostgreSQL alike (the suite runs on either).

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::json;

const KEY: &str = "digest-2026-12-01";

#[tokio::test]
async fn a_freed_keys_delete_leaves_the_task_that_took_it_again() {
    let h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    let body = json!({"id": "b", "channel": "out", "schedule": {"after": "1h"},
        "to": ["a"], "body": "x"});
    let url = h.url("/v1/tasks");
    let create = || {
        http::request(
            "POST",
            &url,
            &[
                ("Idempotency-Key", KEY),
                ("Content-Type", "application/json"),
            ],
            Some(body.to_string().into_bytes()),
        )
    };
    assert_eq!(create().await.status, 201);
    let store = h.server().engine.store();
    // A freeing of the key for task "a" (gone), arriving after "b" took the key: left.
    let deleted = store
        .delete_idem_keys(vec![(KEY.into(), "a".into())])
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    assert_eq!(
        store.idem_get(KEY).unwrap().map(|r| r.task_id),
        Some("b".into())
    );
    let again = create().await;
    assert_eq!(
        again.status,
        200,
        "replayed, not a second task: {}",
        again.text()
    );
    assert_eq!(again.json()["id"], "b");
    // The key's own task's delete goes.
    let deleted = store
        .delete_idem_keys(vec![(KEY.into(), "b".into())])
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(store.idem_get(KEY).unwrap().is_none());
}

/// POSTs `body` to `/v1/tasks` with `Idempotency-Key: key`.
async fn create_with_key(h: &ManualHerald, key: &str, body: &serde_json::Value) -> http::Resp {
    http::request(
        "POST",
        &h.url("/v1/tasks"),
        &[
            ("Idempotency-Key", key),
            ("Content-Type", "application/json"),
        ],
        Some(body.to_string().into_bytes()),
    )
    .await
}

/// A retry is answered from its key before its body is judged again. Review finding: the body
/// was validated first, so a retry whose `at` had meanwhile fallen further into the past than
/// `misfire_grace` (10 minutes by default) got 422 instead of its task.
#[tokio::test]
async fn a_replay_after_its_at_passed_beyond_grace_returns_the_original_task() {
    let h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    let body = json!({"id": "soon", "channel": "out",
        "schedule": {"at": "2026-12-01T00:01:00Z"}, "to": ["a"], "body": "x"});
    let first = create_with_key(&h, "soon-key", &body).await;
    assert_eq!(first.status, 201, "{}", first.text());
    h.run_until(utc_ms("2026-12-01T00:20:00Z")).await;
    assert_eq!(h.sent().len(), 1, "the task fired at 00:01");
    let again = create_with_key(&h, "soon-key", &body).await;
    assert_eq!(again.status, 200, "replayed: {}", again.text());
    assert_eq!(again.json()["id"], "soon");
    assert_eq!(again.json()["state"], "completed");
    // Another body under the key is still refused, and a new key still judges the body.
    let other = json!({"id": "other", "channel": "out",
        "schedule": {"at": "2026-12-01T00:01:00Z"}, "to": ["a"], "body": "x"});
    assert_eq!(create_with_key(&h, "soon-key", &other).await.status, 409);
    assert_eq!(create_with_key(&h, "new-key", &other).await.status, 422);
}

/// Likewise at `live_tasks_max`: the task the key made is what holds the last place, and its
/// retry is its 200, not the limit's 422. Without an id (herald makes one) the retry meets the
/// limit before anything else.
#[tokio::test]
async fn a_replay_at_live_tasks_max_returns_the_original_task() {
    let h = ManualHerald::start(
        utc_ms("2026-12-01T00:00:00Z"),
        "[limits]\nlive_tasks_max = 1",
    )
    .await;
    let body = json!({"channel": "out", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"});
    let first = create_with_key(&h, "full-key", &body).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let id = first.json()["id"].clone();
    let again = create_with_key(&h, "full-key", &body).await;
    assert_eq!(again.status, 200, "replayed: {}", again.text());
    assert_eq!(again.json()["id"], id);
    let other = create_with_key(&h, "another-key", &body).await;
    assert_eq!(other.status, 422, "{}", other.text());
    assert_eq!(other.json()["type"], "urn:herald:problem:limit");
}
