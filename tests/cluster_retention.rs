//! Retention in cluster mode (issue 24, HA.md "Fence every write": retention and cleanup are
//! fenced too), on real nodes and a private PostgreSQL:
//! - every node's sweep deletes the finished tasks of its own shards, and only those, so
//!   finished tasks on every shard go once past `[store] retention`;
//! - a stale owner's delayed retention delete: node `a` claims the finished task and reads it
//!   again, is stopped (SIGSTOP) inside the test knob's hold between that read and the
//!   delete's write, node `b` takes every shard over, and when `a` goes on its delete, fenced
//!   at the epoch its read was made under, is refused; the task is still there, on `b`.
//!
//! The sweep's period and hold are test knobs (`engine/retention.rs`: `SWEEP_EVERY_ENV`,
//! `HOLD_ENV`), not configuration.

mod common;

use std::time::Duration;

use common::cluster::{node_command, owned, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 6;

/// A node whose retention is 1 s, swept every `sweep_ms` (its log in `log` when given).
fn start(
    url: &str,
    dir: &std::path::Path,
    name: &str,
    rx: &Receiver,
    sweep_ms: Option<u64>,
    hold_ms: Option<u64>,
    log: Option<&std::path::Path>,
) -> Proc {
    let hook = format!("url = \"{}\"\ntimeout = \"1s\"\n", rx.url());
    let mut cmd = node_command(url, dir, name, name, SHARDS, &hook, TEST_TIMING);
    cmd.env("HERALD_STORE_RETENTION", "1s");
    if let Some(ms) = sweep_ms {
        cmd.env("HERALD_TEST_RETENTION_SWEEP_MS", ms.to_string());
    }
    if let Some(ms) = hold_ms {
        cmd.env("HERALD_TEST_RETENTION_HOLD_MS", ms.to_string());
    }
    if let Some(path) = log {
        cmd.stderr(std::fs::File::create(path).unwrap());
    }
    Proc::start(cmd)
}

async fn state(base: &str, id: &str) -> (u16, String) {
    let r = http::get(&format!("{base}/v1/tasks/{id}")).await;
    let s = r.json()["state"].as_str().unwrap_or_default().to_string();
    (r.status, s)
}

async fn create(base: &str, id: &str, idem: Option<&str>) {
    let body = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(300)},
        "messages": [{"to": "x", "body": id}]});
    let r = match idem {
        Some(k) => {
            http::request(
                "POST",
                &format!("{base}/v1/tasks"),
                &[("content-type", "application/json"), ("idempotency-key", k)],
                Some(body.to_string().into_bytes()),
            )
            .await
        }
        None => http::post_json(&format!("{base}/v1/tasks"), &body).await,
    };
    assert_eq!(r.status, 201, "create {id} via {base}: {}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_owner_sweeps_the_finished_tasks_of_its_own_shards() {
    let Some(pg) = PgServer::start("cluster_retention_sweep") else {
        return;
    };
    let url = pg.create_db("sweep");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Proc> = ["a", "b"]
        .iter()
        .map(|n| start(&url, dir.path(), n, &rx, Some(500), None, None))
        .collect();
    let split = poll(Duration::from_secs(30), || async {
        let (a, b) = (owned(&nodes[0].url).await, owned(&nodes[1].url).await);
        (a + b == SHARDS as u64 && a > 0 && b > 0).then_some(())
    })
    .await;
    assert!(split.is_some(), "a and b share the {SHARDS} shards");
    // The database's own view of the fence (tests/common/audit.rs): every delete of the
    // sweeps, idempotency keys included, holds the lease row of the shard its row is in.
    common::audit::install(&url).await;

    let ids: Vec<String> = (0..12).map(|i| format!("done-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let key = format!("key-{i}");
        create(&nodes[i % 2].url, id, (i % 3 == 0).then_some(key.as_str())).await;
    }
    let shards: std::collections::HashSet<u32> = ids
        .iter()
        .map(|id| herald::store::pg::fence::shard_of_task(id, SHARDS))
        .collect();
    assert!(
        shards.len() > 2,
        "the tasks span several shards: {shards:?}"
    );
    let delivered = poll(Duration::from_secs(30), || async {
        (rx.requests().len() >= ids.len()).then_some(())
    })
    .await;
    assert!(delivered.is_some(), "{} sends", rx.requests().len());

    // Finished, then gone once past retention, whichever node owns its shard.
    let left = std::sync::Mutex::new(Vec::new());
    let gone = poll(Duration::from_secs(30), || async {
        let mut now = Vec::new();
        for id in &ids {
            let (status, s) = state(&nodes[0].url, id).await;
            if status != 404 {
                now.push(format!("{id}: {status} {s}"));
            }
        }
        let done = now.is_empty();
        *left.lock().unwrap() = now;
        done.then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "finished tasks past retention on every shard are deleted: left {left:?}"
    );
    // The idempotency keys of the deleted tasks go too (each swept by the owner of its key's
    // shard): the same key with another body creates a new task instead of a 409.
    // Each key's body is made once: a poll after some keys were freed replays the ones
    // already used (200), which a body with a later `at` would turn into a 409 for good.
    let again: Vec<(usize, Vec<u8>)> = (0..ids.len())
        .step_by(3)
        .map(|i| {
            let body = json!({"id": format!("again-{i}"), "channel": "hook",
                "schedule": {"at": in_ms(60_000)},
                "messages": [{"to": "y", "body": "again"}]});
            (i, body.to_string().into_bytes())
        })
        .collect();
    let answers = std::sync::Mutex::new(Vec::new());
    let freed = poll(Duration::from_secs(30), || async {
        let mut now = Vec::new();
        for (i, body) in &again {
            let r = http::request(
                "POST",
                &format!("{}/v1/tasks", nodes[i % 2].url),
                &[("idempotency-key", &format!("key-{i}"))],
                Some(body.clone()),
            )
            .await;
            now.push(r.status);
        }
        let done = now.iter().all(|s| *s == 201 || *s == 200);
        *answers.lock().unwrap() = now;
        // 201 the first time a key is free, 200 (the replay) on the next polls; 409 while
        // the old key is kept.
        done.then_some(())
    })
    .await;
    assert!(
        freed.is_some(),
        "the stale idempotency keys are swept on every shard: answers {answers:?}"
    );
    let audit = common::audit::check(&url).await;
    assert!(
        audit.is_empty(),
        "the database saw writes outside the fence:\n{}",
        audit.join("\n")
    );
    for p in &nodes {
        assert_eq!(
            common::cluster::metric(&p.url, "herald_fence_rejected_total").await,
            0.0,
            "no sweep wrote to a shard it does not hold ({})",
            p.url
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_delayed_retention_delete_is_refused() {
    let Some(pg) = PgServer::start("cluster_retention_stale") else {
        return;
    };
    let url = pg.create_db("stale");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.log");
    // a sweeps every 500 ms and holds its delete 6 s (three leases) after reading it again.
    let mut a = start(
        &url,
        dir.path(),
        "a",
        &rx,
        Some(500),
        Some(6_000),
        Some(&log),
    );
    let all = poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == SHARDS as u64).then_some(())
    })
    .await;
    assert!(all.is_some(), "a takes every shard");
    create(&a.url, "kept", None).await;
    let read = poll(Duration::from_secs(30), || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .any(|l| l.contains("retention delete is held") && l.contains("\"kept\""))
            .then_some(())
    })
    .await;
    assert!(
        read.is_some(),
        "a's sweep reads the finished task and holds its delete: state {:?}, log:\n{}",
        state(&a.url, "kept").await,
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // a stops inside the hold; b (whose own sweep runs only after a minute) takes over.
    a.signal(libc::SIGSTOP);
    let b = start(&url, dir.path(), "b", &rx, None, None, None);
    let taken = poll(Duration::from_secs(30), || async {
        (owned(&b.url).await == SHARDS as u64).then_some(())
    })
    .await;
    assert!(
        taken.is_some(),
        "b takes every shard after a's leases ran out"
    );
    a.signal(libc::SIGCONT);

    // a's hold ends and its delete goes to the store: refused, and a owns nothing.
    let refused = poll(Duration::from_secs(30), || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .any(|l| l.contains("retention sweep stopped"))
            .then_some(())
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        refused.is_some(),
        "a's delayed delete ended in an error, not a commit; log:\n{text}"
    );
    let (status, s) = state(&b.url, "kept").await;
    assert_eq!(
        (status, s.as_str()),
        (200, "completed"),
        "the task is still there for its new owner"
    );
    assert_eq!(
        rx.requests().len(),
        1,
        "one send of the task, by a, before the pause"
    );
    a.kill9();
}
