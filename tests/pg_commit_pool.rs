//! Commits have connections of their own (`store/pg/backend.rs`, `COMMIT_CONNECTIONS`): reads
//! that keep every connection of the read pool busy do not hold a commit back, and in cluster
//! mode no shard is dropped for them.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::{someone_waits_on_a_lock, PgServer};
use herald::store::backend::{Backend, RawOp, TreeId};
use herald::store::pg::fence::Fence;
use herald::store::pg::{PgBackend, PgOptions};

/// Holds every shard at epoch 0 (a new schema's lease rows) and records what it is told lost.
#[derive(Default)]
struct AllAtZero {
    lost: Mutex<Vec<u32>>,
}

impl Fence for AllAtZero {
    fn epoch(&self, _: u32) -> Option<u64> {
        Some(0)
    }
    fn lost(&self, shard: u32, _: u64) {
        self.lost.lock().unwrap().push(shard);
    }
    fn held(&self) -> Vec<(u32, u64)> {
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_goes_through_while_reads_hold_every_read_connection() {
    let Some(pg) = PgServer::shared("a_commit_goes_through_while_reads_hold_every_read_connection")
    else {
        return;
    };
    let url = pg.create_db("commit_pool");
    let opts = PgOptions {
        pool_size: 2,
        connect_timeout: Duration::from_secs(3),
        statement_timeout: Duration::from_secs(20),
        ..PgOptions::default()
    };
    let fence = Arc::new(AllAtZero::default());
    let backend = Arc::new(
        PgBackend::open(&url, &opts)
            .expect("open")
            .with_fence(fence.clone()),
    );

    // Another session locks the runs table: every read of it waits, each on a read
    // connection, as reads do on a slow database.
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute("BEGIN; LOCK TABLE herald_runs IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let b = backend.clone();
            std::thread::spawn(move || b.get(TreeId::Runs, format!("r{i}").as_bytes()))
        })
        .collect();
    // Watched from another session: the locker's transaction would see one snapshot of
    // pg_stat_activity.
    let (watch, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    assert!(someone_waits_on_a_lock(&watch).await, "the reads wait");
    // Both read connections held (the pool's 2), polled rather than slept for.
    let both = common::herald::poll(Duration::from_secs(10), || async {
        let r = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0) >= 2).then_some(())
    })
    .await;
    assert!(both.is_some(), "both read connections wait");

    // A create's rows: committed at once, on the commit path's own connection.
    let b = backend.clone();
    let started = Instant::now();
    let r = tokio::task::spawn_blocking(move || {
        b.apply(vec![vec![
            RawOp::Absent(TreeId::Specs, b"t1".to_vec()),
            RawOp::Put(TreeId::Specs, b"t1".to_vec(), b"spec".to_vec()),
        ]])
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(
        matches!(r.as_deref(), Ok([Ok(())])),
        "the commit went through: {r:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "the commit waited {took:?} for a connection"
    );
    assert!(
        fence.lost.lock().unwrap().is_empty(),
        "no shard was dropped"
    );

    c.batch_execute("COMMIT").await.unwrap();
    for r in readers {
        assert!(
            r.join().unwrap().is_ok(),
            "the reads finish once the lock goes"
        );
    }
    assert_eq!(
        backend.get(TreeId::Specs, b"t1").unwrap().as_deref(),
        Some(&b"spec"[..])
    );
}
