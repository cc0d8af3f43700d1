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
