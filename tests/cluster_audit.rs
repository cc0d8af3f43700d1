//! The database-side epoch audit (`tests/common/audit.rs`) can fail: on a real PostgreSQL
//! with herald's schema (made through its store, in-process) and herald's own lease
//! statements (`cluster::rows`), a write that did not hold its shard's lease row is reported,
//! and again if it committed after a takeover, while the fenced sequence (`FOR KEY SHARE`, write,
//! commit, then the takeover) is clean; epochs that go down or come back are reported; and a
//! task created through the inbox is exempt, but nothing else its transaction writes.

mod common;

use std::time::Duration;

use common::herald::poll;
use common::pg::{client, PgServer};
use herald::cluster::rows::{self, Grant};
use tokio_postgres::Client;

const SHARDS: u32 = 8;

/// A fresh database with herald's schema and the audit installed.
async fn database(pg: &PgServer, name: &str) -> String {
    let url = pg.create_herald_db(name, SHARDS);
    common::audit::install(&url).await;
    url
}

/// Writes a task's spec row as herald's commit groups do (`backend.rs`, `Stmt::Upsert`).
async fn put(c: &impl tokio_postgres::GenericClient, shard: i32, key: &str) {
    c.execute(
        "INSERT INTO herald_specs (shard, key, value) VALUES ($1, $2, $3) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        &[&shard, &key.as_bytes(), &&b"spec"[..]],
    )
    .await
    .expect("write a spec row");
}

/// Acquires `shard` for `node` with a lease of 300 ms, so that another may take it soon.
async fn hold(c: &Client, node: &str, shard: u32) -> Grant {
    let g = rows::acquire(c, node, &format!("inc-{node}"), 300, &[shard])
        .await
        .unwrap();
    assert_eq!(g.len(), 1, "{node} gets shard {shard}");
    g[0]
}

/// Waits until `shard`'s lease has run out.
async fn expired(c: &Client, shard: u32) {
    poll(Duration::from_secs(10), || async {
        let t = rows::rows(c).await.unwrap();
        t.iter()
            .any(|r| r.shard == shard && r.takeable)
            .then_some(())
    })
    .await
    .expect("the lease runs out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_the_lock_committed_after_a_takeover_is_reported() {
    let Some(pg) =
        PgServer::shared("a_write_without_the_lock_committed_after_a_takeover_is_reported")
    else {
        return;
    };
    let url = database(&pg, "unfenced").await;
    let mut old = client(&url).await;
    let new = client(&url).await;
    let held = hold(&old, "old", 1).await;
    assert_eq!(held.epoch, 1);
    // The stale owner writes without taking the lease row FOR KEY SHARE...
    let tx = old.transaction().await.unwrap();
    put(&tx, 1, "t-stale").await;
    expired(&new, 1).await;
    // ...so the takeover does not wait for it, and it commits after the epoch moved.
    let taken = rows::acquire(&new, "new", "inc-new", 10_000, &[1])
        .await
        .unwrap();
    assert_eq!(taken, [Grant { shard: 1, epoch: 2 }]);
    tx.commit().await.expect("nothing stops an unfenced write");
    let bad = common::audit::check(&url).await;
    assert_eq!(bad.len(), 2, "unlocked, and late: {bad:#?}");
    assert!(
        bad[0].contains("shard 1: txid")
            && bad[0].contains("1 row(s) (herald_specs INSERT) at epoch 1 without holding"),
        "{bad:#?}"
    );
    for want in [
        "shard 1:",
        "1 row(s) (herald_specs INSERT) at epoch 1 and committed",
        "to epoch 2 (owner new)",
    ] {
        assert!(bad[1].contains(want), "{want:?} in {:?}", bad[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_the_lock_is_reported_even_with_no_takeover() {
    let Some(pg) = PgServer::shared("a_write_without_the_lock_is_reported_even_with_no_takeover")
    else {
        return;
    };
    let url = database(&pg, "nolock").await;
    let mut c = client(&url).await;
    let mut other = client(&url).await;
    let renewer = client(&url).await;
    let held = hold(&c, "a", 6).await;
    // Fenced, while another group also holds the row FOR KEY SHARE (a multixact) and a
    // renewal updates it (the lock carried to the new row version): found held every time.
    let tx = c.transaction().await.unwrap();
    rows::fence(&tx, &[held]).await.unwrap();
    let o = other.transaction().await.unwrap();
    rows::fence(&o, &[held]).await.unwrap();
    put(&tx, 6, "t-locked").await;
    let renewed = rows::renew(&renewer, "inc-a", 300, &[held]).await.unwrap();
    assert_eq!(renewed, [6], "a renewal does not wait for key-share locks");
    put(&tx, 6, "t-locked-2").await;
    tx.commit().await.unwrap();
    o.commit().await.unwrap();
    assert!(common::audit::check(&url).await.is_empty());
    // The owner itself, at its epoch, but without the fence: reported though nothing moved.
    put(&c, 6, "t-unlocked").await;
    let bad = common::audit::check(&url).await;
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(
        bad[0].contains("shard 6:")
            && bad[0].contains("(herald_specs INSERT) at epoch 1 without holding"),
        "{bad:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_before_a_takeover_is_clean() {
    let Some(pg) = PgServer::shared("a_fenced_write_before_a_takeover_is_clean") else {
        return;
    };
    let url = database(&pg, "fenced").await;
    let mut old = client(&url).await;
    let new = client(&url).await;
    let watch = client(&url).await;
    let held = hold(&old, "old", 2).await;
    // The fence (FOR KEY SHARE, epoch checked), the write, and the lease runs out meanwhile.
    let tx = old.transaction().await.unwrap();
    rows::fence(&tx, &[held]).await.expect("still the owner");
    put(&tx, 2, "t-fenced").await;
    tx.execute(
        "DELETE FROM herald_specs WHERE key = $1",
        &[&&b"t-fenced"[..]],
    )
    .await
    .unwrap();
    put(&tx, 2, "t-fenced").await;
    expired(&watch, 2).await;
    // A takeover skips the row the group holds (FOR UPDATE SKIP LOCKED against FOR KEY
    // SHARE)...
    let skipped = tokio::time::timeout(
        Duration::from_secs(5),
        rows::acquire(&new, "new", "inc-new", 10_000, &[2]),
    )
    .await
    .expect("a takeover does not wait for a fenced group")
    .unwrap();
    assert!(
        skipped.is_empty(),
        "taken under the fenced group: {skipped:?}"
    );
    // ...which commits first: its writes are stamped before the next round's takeover.
    tx.commit().await.expect("the fenced group commits");
    let g = rows::acquire(&new, "new", "inc-new", 10_000, &[2]).await;
    assert_eq!(g.unwrap(), [Grant { shard: 2, epoch: 2 }]);
    let bad = common::audit::check(&url).await;
    assert!(bad.is_empty(), "a fenced sequence is clean: {bad:#?}");
    let seen = common::audit::seen(&url).await;
    assert_eq!(
        (seen.writes, seen.epoch_changes),
        (3, 2),
        "the audit logged the group's rows and both grants: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_that_go_down_or_come_back_are_reported() {
    let Some(pg) = PgServer::shared("epochs_that_go_down_or_come_back_are_reported") else {
        return;
    };
    let url = database(&pg, "epochs").await;
    let c = client(&url).await;
    hold(&c, "a", 3).await; // 0 → 1: fine
    c.batch_execute(
        "UPDATE herald_shard SET epoch = 0 WHERE shard_id = 3; \
         UPDATE herald_shard SET epoch = 1 WHERE shard_id = 3; \
         UPDATE herald_shard SET lease_expires = now() WHERE shard_id = 3; \
         DELETE FROM herald_shard WHERE shard_id = 7",
    )
    .await
    .unwrap();
    let bad = common::audit::check(&url).await;
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(
        bad[0].contains("shard 3:")
            && bad[0].contains("from Some(1) to Some(0): epochs only go up"),
        "{bad:#?}"
    );
    assert!(
        bad[1].contains("shard 3:") && bad[1].contains("epoch 1 was reached before"),
        "{bad:#?}"
    );
    assert!(
        bad[2].contains("shard 7:") && bad[2].contains("never later"),
        "{bad:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_create_is_exempt_but_nothing_else_in_its_transaction() {
    let Some(pg) =
        PgServer::shared("an_inbox_create_is_exempt_but_nothing_else_in_its_transaction")
    else {
        return;
    };
    let url = database(&pg, "inbox").await;
    let mut w = client(&url).await;
    let new = client(&url).await;
    // An existing task, written fenced (shard 4 at its first epoch, 0: nobody held it yet).
    let tx = w.transaction().await.unwrap();
    rows::fence(&tx, &[Grant { shard: 4, epoch: 0 }])
        .await
        .unwrap();
    put(&tx, 4, "t-old").await;
    tx.commit().await.unwrap();
    // A node that holds neither shard 4 nor 5 creates a task in 4 with its inbox row (as
    // `backend.rs` does), and also changes a row of 4 and writes one in 5: those are not
    // a creation's and are judged like any write.
    let tx = w.transaction().await.unwrap();
    put(&tx, 4, "t-new").await;
    tx.execute(
        "INSERT INTO herald_inbox (shard, task_id) VALUES (4, 't-new') ON CONFLICT DO NOTHING",
        &[],
    )
    .await
    .unwrap();
    put(&tx, 4, "t-old").await;
    put(&tx, 5, "t-other").await;
    let taken = rows::acquire(&new, "new", "inc-new", 10_000, &[4, 5])
        .await
        .unwrap();
    assert_eq!(taken.len(), 2);
    tx.commit().await.unwrap();
    let bad = common::audit::check(&url).await;
    assert_eq!(bad.len(), 4, "{bad:#?}");
    // Unlocked, then late: the update in the inbox's shard, and the row of another shard.
    for (i, shard, what) in [
        (
            0,
            4,
            "1 row(s) (herald_specs UPDATE) at epoch 0 without holding",
        ),
        (
            1,
            5,
            "1 row(s) (herald_specs INSERT) at epoch 0 without holding",
        ),
        (
            2,
            4,
            "1 row(s) (herald_specs UPDATE) at epoch 0 and committed",
        ),
        (
            3,
            5,
            "1 row(s) (herald_specs INSERT) at epoch 0 and committed",
        ),
    ] {
        assert!(
            bad[i].contains(&format!("shard {shard}:")) && bad[i].contains(what),
            "{what:?} in {bad:#?}"
        );
    }
    let seen = common::audit::seen(&url).await;
    // The creation's spec row and its inbox row, both late, both excused.
    assert_eq!(
        (seen.inbox_marks, seen.exempt_late, seen.exempt_unlocked),
        (1, 2, 2),
        "{seen:?}"
    );
}
