//! The lease rows' statements on a real PostgreSQL (issue 24, HA.md "Lease rows" and "Fence
//! every write"): grants bump the epoch and go to one incarnation only; renewals extend only
//! matching, unexpired rows and never wait for writes; an expired lease is taken over at a new
//! epoch, but not while a fenced commit group in flight holds its row (skipped, not waited
//! for: taken in a later round, after the group), and a stale group after the takeover is
//! refused; an acquisition never waits for a row another transaction holds; concurrent
//! acquirers never share a shard; a node restarted under a new incarnation counts once, from
//! its first heartbeat.

mod common;

use std::time::Duration;

use common::herald::poll;
use common::pg::{client, PgServer};
use herald::cluster::rows::{self, FenceError, Grant};

const SHARDS: u32 = 8;

/// A fresh database with herald's schema and `SHARDS` shard rows.
fn database(pg: &PgServer, name: &str) -> String {
    pg.create_herald_db(name, SHARDS)
}

fn all() -> Vec<u32> {
    (0..SHARDS).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_bumps_the_epoch_and_goes_to_one_incarnation_only() {
    let Some(pg) = PgServer::shared("a_grant_bumps_the_epoch_and_goes_to_one_incarnation_only")
    else {
        return;
    };
    let url = database(&pg, "grant");
    let c = client(&url).await;
    let a = rows::acquire(&c, "node-a", "inc-a", 10_000, &[0, 1, 2])
        .await
        .unwrap();
    assert_eq!(
        a,
        [0, 1, 2].map(|shard| Grant { shard, epoch: 1 }),
        "first grants are epoch 1"
    );
    // The same node id in another process (another incarnation) gets nothing that is held.
    let b = rows::acquire(&c, "node-a", "inc-b", 10_000, &all())
        .await
        .unwrap();
    let b_shards: Vec<u32> = b.iter().map(|g| g.shard).collect();
    assert_eq!(b_shards, [3, 4, 5, 6, 7], "only the free ones");
    let table = rows::rows(&c).await.unwrap();
    assert_eq!(table.len(), SHARDS as usize);
    for r in &table {
        let want = if r.shard < 3 { "inc-a" } else { "inc-b" };
        assert_eq!(r.owner_incarnation.as_deref(), Some(want), "{r:?}");
        assert_eq!(r.owner_node.as_deref(), Some("node-a"));
        assert!(!r.takeable, "{r:?}");
    }
    // Released rows keep their epoch; the next grant bumps it.
    assert_eq!(rows::release(&c, "inc-a", &a[..1]).await.unwrap(), [0]);
    let again = rows::acquire(&c, "node-b", "inc-c", 10_000, &[0, 1])
        .await
        .unwrap();
    assert_eq!(
        again,
        [Grant { shard: 0, epoch: 2 }],
        "shard 1 is still held"
    );
    // Releasing what another incarnation holds, or at a stale epoch, does nothing.
    assert!(rows::release(&c, "inc-a", &again).await.unwrap().is_empty());
    assert!(rows::release(&c, "inc-c", &a[..1])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_extends_only_matching_unexpired_rows() {
    let Some(pg) = PgServer::shared("a_renewal_extends_only_matching_unexpired_rows") else {
        return;
    };
    let url = database(&pg, "renew");
    let c = client(&url).await;
    let held = rows::acquire(&c, "n", "inc-a", 10_000, &[0, 1])
        .await
        .unwrap();
    assert_eq!(
        rows::renew(&c, "inc-a", 10_000, &held).await.unwrap(),
        [0, 1]
    );
    let stale = [Grant { shard: 0, epoch: 7 }];
    assert!(rows::renew(&c, "inc-a", 10_000, &stale)
        .await
        .unwrap()
        .is_empty());
    assert!(rows::renew(&c, "inc-b", 10_000, &held)
        .await
        .unwrap()
        .is_empty());
    // A short lease runs out (database time); it is never renewed after that.
    let short = rows::acquire(&c, "n", "inc-a", 150, &[5]).await.unwrap();
    assert_eq!(short.len(), 1);
    poll(Duration::from_secs(10), || async {
        let t = rows::rows(&c).await.unwrap();
        t.iter().any(|r| r.shard == 5 && r.takeable).then_some(())
    })
    .await
    .expect("the 150 ms lease runs out");
    assert!(
        rows::renew(&c, "inc-a", 10_000, &short)
            .await
            .unwrap()
            .is_empty(),
        "an expired lease is re-acquired, never renewed"
    );
    // Its owner may acquire it again, at a new epoch.
    assert_eq!(
        rows::acquire(&c, "n", "inc-a", 10_000, &[5]).await.unwrap(),
        [Grant { shard: 5, epoch: 2 }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_skips_a_fenced_group_in_flight_and_a_stale_group_is_refused() {
    let Some(pg) =
        PgServer::shared("a_takeover_skips_a_fenced_group_in_flight_and_a_stale_group_is_refused")
    else {
        return;
    };
    let url = database(&pg, "fence");
    let mut old = client(&url).await;
    let new = client(&url).await;
    let watch = client(&url).await;
    let held = rows::acquire(&old, "old", "inc-old", 300, &[3])
        .await
        .unwrap();
    assert_eq!(held, [Grant { shard: 3, epoch: 1 }]);

    // A fenced group of the old owner is in flight when its lease runs out.
    let tx = old.transaction().await.unwrap();
    rows::fence(&tx, &held).await.expect("still the owner");
    poll(Duration::from_secs(10), || async {
        let t = rows::rows(&watch).await.unwrap();
        t.iter().any(|r| r.shard == 3 && r.takeable).then_some(())
    })
    .await
    .expect("the old lease runs out");
    // The takeover skips the row the group holds (FOR UPDATE SKIP LOCKED): no new epoch
    // while the group may still commit, and no wait either.
    let got = tokio::time::timeout(
        Duration::from_secs(5),
        rows::acquire(&new, "new", "inc-new", 10_000, &[3]),
    )
    .await
    .expect("a takeover does not wait for a fenced group")
    .unwrap();
    assert!(got.is_empty(), "granted under a fenced group: {got:?}");
    // The group commits before any new epoch exists: the new owner will load what it wrote.
    tx.commit().await.unwrap();
    let got = rows::acquire(&new, "new", "inc-new", 10_000, &[3])
        .await
        .unwrap();
    assert_eq!(
        got,
        [Grant { shard: 3, epoch: 2 }],
        "taken in the next round"
    );

    // The old owner's next group is refused: OwnershipLost, nothing committed after takeover.
    let tx = old.transaction().await.unwrap();
    match rows::fence(&tx, &held).await {
        Err(FenceError::OwnershipLost { shard, held, found }) => {
            assert_eq!((shard, held, found), (3, 1, Some(2)));
        }
        other => panic!("a stale owner's group must be refused, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    // The new owner's renewals do not queue behind its own or anyone's fenced groups.
    let mine = [Grant { shard: 3, epoch: 2 }];
    let tx = old.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM herald_shard WHERE shard_id = 3 FOR KEY SHARE",
        &[],
    )
    .await
    .unwrap();
    let renewed = tokio::time::timeout(
        Duration::from_secs(10),
        rows::renew(&new, "inc-new", 10_000, &mine),
    )
    .await
    .expect("a renewal does not wait for a KEY SHARE holder")
    .unwrap();
    assert_eq!(renewed, [3]);
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquirers_never_share_a_shard_and_epochs_only_grow() {
    let Some(pg) =
        PgServer::shared("concurrent_acquirers_never_share_a_shard_and_epochs_only_grow")
    else {
        return;
    };
    let url = database(&pg, "race");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let mut last_epoch = vec![0u64; SHARDS as usize];
    for round in 0..10 {
        let mut tasks = Vec::new();
        for (i, c) in clients.drain(..).enumerate() {
            tasks.push(tokio::spawn(async move {
                let inc = format!("inc-{i}");
                let g = rows::acquire(&c, "n", &inc, 10_000, &all()).await.unwrap();
                (c, inc, g)
            }));
        }
        let mut owner = vec![None::<String>; SHARDS as usize];
        let mut got = Vec::new();
        for t in tasks {
            let (c, inc, g) = t.await.unwrap();
            for gr in &g {
                let slot = &mut owner[gr.shard as usize];
                assert!(
                    slot.is_none(),
                    "round {round}: shard {} granted twice",
                    gr.shard
                );
                *slot = Some(inc.clone());
                assert!(
                    gr.epoch > last_epoch[gr.shard as usize],
                    "round {round}: epoch of shard {} did not grow",
                    gr.shard
                );
                last_epoch[gr.shard as usize] = gr.epoch;
            }
            got.push((c, inc, g));
        }
        assert!(
            owner.iter().all(Option::is_some),
            "round {round}: every shard granted"
        );
        for (c, inc, g) in got {
            let released = rows::release(&c, &inc, &g).await.unwrap();
            assert_eq!(released.len(), g.len());
            clients.push(c);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_clock_is_read_as_unix_ms() {
    let Some(pg) = PgServer::shared("the_database_clock_is_read_as_unix_ms") else {
        return;
    };
    let url = database(&pg, "clock");
    let c = client(&url).await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let db = rows::db_now_ms(&c).await.unwrap();
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Same machine, same clock: the database's reading lies between ours (1 ms rounding).
    assert!(
        before <= db + 1 && db <= after + 1,
        "{before} <= {db} <= {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_never_waits_for_a_row_another_transaction_holds() {
    let Some(pg) =
        PgServer::shared("an_acquisition_never_waits_for_a_row_another_transaction_holds")
    else {
        return;
    };
    let url = database(&pg, "skip");
    let mut other = client(&url).await;
    let c = client(&url).await;
    // Another node is in the middle of taking shards 2 and 5 (its transaction holds their
    // rows FOR UPDATE, as an acquisition does until it commits).
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM herald_shard WHERE shard_id IN (2, 5) FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let got = tokio::time::timeout(
        Duration::from_secs(5),
        rows::acquire(&c, "b", "inc-b", 10_000, &all()),
    )
    .await
    .expect("an acquisition skips rows another transaction holds instead of waiting")
    .unwrap();
    let shards: Vec<u32> = got.iter().map(|g| g.shard).collect();
    assert_eq!(
        shards,
        [0, 1, 3, 4, 6, 7],
        "every free row but the two held"
    );
    tx.rollback().await.unwrap();
    // Free again: the next round takes them.
    let shards: Vec<u32> = rows::acquire(&c, "b", "inc-b", 10_000, &all())
        .await
        .unwrap()
        .iter()
        .map(|g| g.shard)
        .collect();
    assert_eq!(shards, [2, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_counts_once_while_its_old_incarnation_lives_on() {
    let Some(pg) =
        PgServer::shared("a_restarted_node_counts_once_while_its_old_incarnation_lives_on")
    else {
        return;
    };
    let url = database(&pg, "nodes");
    let c = client(&url).await;
    const SUPERSEDED_MS: u64 = 4_000;
    let live = || async { rows::live_nodes(&c, SUPERSEDED_MS).await.unwrap() };
    rows::heartbeat(&c, "node-a", "a-1", None, 60_000, None)
        .await
        .unwrap();
    rows::heartbeat(&c, "node-b", "b-1", None, 60_000, None)
        .await
        .unwrap();
    assert_eq!(live().await, 2);
    // node-a restarted at once (a-1's heartbeat is fresh, well within SUPERSEDED_MS): a-2's
    // first heartbeat ends a-1's row, and node-a counts once from then (before, a-1 counted
    // until a-2's heartbeats were SUPERSEDED_MS newer than its last).
    rows::heartbeat(&c, "node-a", "a-2", None, 60_000, None)
        .await
        .unwrap();
    assert_eq!(
        live().await,
        2,
        "a restart's old incarnation counts as a live node"
    );
    let a1_live = |nodes: &[rows::NodeRow]| {
        nodes
            .iter()
            .find(|n| n.incarnation == "a-1")
            .map(|n| n.live)
    };
    assert_eq!(a1_live(&rows::nodes(&c).await.unwrap()), Some(false));
    // Two processes of one node id, both heartbeating: two processes (HA.md: the
    // incarnation keeps them apart), each aiming at its own share. a-1, alive, says so again
    // at its next heartbeat; a-2's later heartbeats (not its first) end nothing.
    rows::heartbeat(&c, "node-a", "a-1", None, 60_000, None)
        .await
        .unwrap();
    assert_eq!(live().await, 3);
    rows::heartbeat(&c, "node-a", "a-2", None, 60_000, None)
        .await
        .unwrap();
    assert_eq!(
        live().await,
        3,
        "only an incarnation's first heartbeat ends others"
    );
    assert_eq!(a1_live(&rows::nodes(&c).await.unwrap()), Some(true));
    // a-1 crashed 10 s ago (its last heartbeat), its row lives on until it runs out, and
    // a-2 is node-a restarted: node-a counts once.
    c.execute(
        "UPDATE herald_node SET heartbeat_at = now() - interval '10 seconds' \
         WHERE incarnation = 'a-1'",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        live().await,
        2,
        "an incarnation superseded by a newer one of its node id is not a live node"
    );
    assert_eq!(
        rows::nodes(&c).await.unwrap().len(),
        3,
        "GET /v1/cluster still lists every process"
    );
    // The share each node aims at is that of two nodes, not three.
    assert_eq!(herald::cluster::balance::target(64, live().await), 32);
    // A stale heartbeat alone supersedes nothing: b-1 has no newer incarnation.
    c.execute(
        "UPDATE herald_node SET heartbeat_at = now() - interval '10 seconds' \
         WHERE incarnation = 'b-1'",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(live().await, 2, "b-1 has no newer incarnation: still live");
    // A row whose lease ran out is not counted.
    rows::heartbeat(&c, "node-c", "c-1", None, 1, None)
        .await
        .unwrap();
    poll(Duration::from_secs(10), || async {
        (live().await == 2).then_some(())
    })
    .await
    .expect("node-c's 1 ms heartbeat runs out");
}
