//! Cluster mode, the inbox when the store fails right after a take (HA.md "Creates and
//! commands on any node": a create answered 201 is armed on its owner). Taking the inbox
//! deletes its rows; an id taken out is the only thing left that tells the owner of its task.
//!
//! - The owner's read of a task taken out of the inbox fails (a database that went away for a
//!   moment; the store's backoff then refuses every later read of the round): the id is kept
//!   and read again, and the task is delivered once reads work (two engines in this process
//!   on one PostgreSQL, the owner's store wrapped by `FaultyBackend`).
//! - A take whose `COMMIT` committed but whose answer came past the call's deadline: the ids
//!   its `DELETE … RETURNING` gave come back with the next take (a real proxy holds the
//!   answer; a deferred trigger keeps the `COMMIT` running long enough to catch it).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::herald::{in_ms, poll};
use common::pg::PgServer;
use common::pgproxy::PgProxy;
use herald::clock::SystemClock;
use herald::cluster::lease::Timing;
use herald::cluster::node::{self, Identity, Ownership, Settings};
use herald::config::{Config, Overrides};
use herald::engine::cluster::ClusterHooks;
use herald::engine::{Created, Engine, EngineConfig};
use herald::request::TaskRequest;
use herald::store::backend::Backend;
use herald::store::fault::{Faults, FaultyBackend};
use herald::store::pg::fence::{shard_of_task, Fence};
use herald::store::pg::{PgBackend, PgOptions};
use herald::store::Store;
use serde_json::json;
use tokio_postgres::NoTls;

const SHARDS: u32 = 8;
const TIMING: Timing = Timing {
    ttl_ms: 1_500,
    renew_ms: 300,
    safety_ms: 300,
};

/// One engine in cluster mode on `url` (its store wrapped by `FaultyBackend`), its channel
/// `out` a file in `dir`.
async fn engine(url: &str, dir: &std::path::Path, name: &str) -> (Engine, Arc<Faults>) {
    let out = dir.join(format!("{name}.jsonl"));
    let config = Config::from_toml(
        &format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            out.display()
        ),
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.join(name)),
            token: None,
        },
    )
    .unwrap();
    let ownership = Arc::new(Ownership::new(TIMING));
    let opts = PgOptions {
        shards: SHARDS,
        ..PgOptions::default()
    };
    let pg = PgBackend::open(url, &opts)
        .unwrap()
        .with_fence(ownership.clone());
    let faults = Arc::new(Faults::default());
    let backend = FaultyBackend {
        inner: Arc::new(pg),
        faults: faults.clone(),
    };
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    let hooks = ClusterHooks {
        node_id: name.into(),
        ownership,
        shards: SHARDS,
        max_clock_offset_ms: 500,
        inbox_wake: Arc::default(),
    };
    let cfg = EngineConfig {
        cluster: Some(hooks),
        ..EngineConfig::default()
    };
    let channels = herald::server::build_channels(&config).unwrap();
    let engine = Engine::start(store, channels, Arc::new(SystemClock::new()), cfg)
        .await
        .unwrap();
    (engine, faults)
}

/// The lease loop of `engine` (its events followed by the engine), as the server starts it.
fn lease_loop(engine: &Engine, url: &str, name: &str) -> node::Handle {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    engine.follow_cluster(rx);
    let ownership = engine.cluster().unwrap().ownership.clone();
    node::start_with(
        Settings {
            url: url.into(),
            password: None,
            me: Identity {
                node_id: name.into(),
                incarnation: format!("{name}-{}", std::process::id()),
                advertise: None,
            },
            timing: TIMING,
            shards: SHARDS,
            max_clock_offset_ms: 500,
        },
        ownership,
        tx,
    )
}

fn inbox_rows(pg: &PgServer, url: &str) -> u64 {
    pg.psql(url, "SELECT count(*) FROM herald_inbox")
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_read_failed_after_its_inbox_row_was_taken_is_read_again() {
    let Some(pg) =
        PgServer::shared("a_task_whose_read_failed_after_its_inbox_row_was_taken_is_read_again")
    else {
        return;
    };
    let url = pg.create_db("inbox_reads");
    let dir = tempfile::tempdir().unwrap();
    // The owner, a, holds every shard; b holds none (no lease loop), so its creates go
    // through the inbox.
    let (a, faults) = engine(&url, dir.path(), "a").await;
    let loop_a = lease_loop(&a, &url, "a");
    poll(Duration::from_secs(30), || async {
        (a.cluster().unwrap().ownership.grants().len() == SHARDS as usize).then_some(())
    })
    .await
    .expect("a takes every shard");
    let (b, _) = engine(&url, dir.path(), "b").await;

    // From now on a's reads fail (its take of the inbox does not).
    faults.fail_reads.store(true, Ordering::SeqCst);
    let req: TaskRequest = serde_json::from_value(json!({
        "id": "through-inbox", "channel": "out", "schedule": {"at": in_ms(1_000)},
        "messages": [{"to": "x", "body": "armed on its owner"}]
    }))
    .unwrap();
    let created = b.create(req, None).await.expect("b creates");
    assert!(matches!(created, Created::New(_)));
    // a took the row out of the inbox and could not read the task.
    poll(Duration::from_secs(10), || async {
        (inbox_rows(&pg, &url) == 0 && faults.reads_refused.load(Ordering::SeqCst) > 0)
            .then_some(())
    })
    .await
    .expect("a takes the inbox row and fails to read its task");
    // The kept id is read again (and refused again) while reads still fail.
    let refused = faults.reads_refused.load(Ordering::SeqCst);
    poll(Duration::from_secs(10), || async {
        (faults.reads_refused.load(Ordering::SeqCst) > refused).then_some(())
    })
    .await
    .expect("the kept id is read again");
    faults.fail_reads.store(false, Ordering::SeqCst);

    let out = dir.path().join("a.jsonl");
    let sent = poll(Duration::from_secs(15), || async {
        std::fs::read_to_string(&out)
            .ok()
            .filter(|t| t.contains("through-inbox"))
    })
    .await;
    loop_a.abort();
    assert!(
        sent.is_some(),
        "the task taken out of the inbox was never armed on its owner once its read failed"
    );
    drop((a, b));
}

/// Holds the shards it was given, at their epochs.
struct Held(Vec<(u32, u64)>);

impl Fence for Held {
    fn epoch(&self, shard: u32) -> Option<u64> {
        self.0.iter().find(|(s, _)| *s == shard).map(|(_, e)| *e)
    }
    fn lost(&self, _: u32, _: u64) {}
    fn held(&self) -> Vec<(u32, u64)> {
        self.0.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_a_take_deleted_past_its_deadline_come_back_with_the_next_take() {
    let Some(pg) =
        PgServer::shared("ids_a_take_deleted_past_its_deadline_come_back_with_the_next_take")
    else {
        return;
    };
    let url = pg.create_db("inbox_deadline");
    let opts = PgOptions {
        shards: SHARDS,
        statement_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    drop(PgBackend::open(&url, &opts).expect("herald's schema is made"));
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let all: Vec<u32> = (0..SHARDS).collect();
    let grants = herald::cluster::rows::acquire(&c, "t", "t-1", 600_000, &all)
        .await
        .unwrap();
    let held = Held(grants.iter().map(|g| (g.shard, g.epoch)).collect());
    let proxy = PgProxy::start(pg.port());
    let backend = Arc::new(
        PgBackend::open(&proxy.url(&url), &opts)
            .unwrap()
            .with_fence(Arc::new(held)),
    );

    let id = "late-1";
    pg.psql(
        &url,
        &format!(
            "INSERT INTO herald_inbox (shard, task_id) VALUES ({}, '{id}')",
            shard_of_task(id, SHARDS)
        ),
    );
    // The COMMIT of a take runs 0.8 s (a deferred trigger), long enough to hold its answer.
    pg.psql(
        &url,
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.8); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER DELETE ON herald_inbox \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
    );
    let b = backend.clone();
    let take = std::thread::spawn(move || b.take_inbox());
    let committing = Instant::now() + Duration::from_secs(10);
    while pg.psql(
        &url,
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'COMMIT' AND wait_event = 'PgSleep'",
    ) != "1"
    {
        assert!(Instant::now() < committing, "the take's COMMIT never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Its answer is held past the call's deadline; the COMMIT itself goes through.
    proxy.blackhole(true);
    let first = take.join().unwrap();
    assert!(
        first.is_err(),
        "the take answered {first:?} past its deadline"
    );
    assert_eq!(inbox_rows(&pg, &url), 0, "the take's delete committed");
    proxy.blackhole(false);

    let end = Instant::now() + Duration::from_secs(30);
    let next = loop {
        // The store's backoff after the unanswered call refuses for a while.
        if let Ok(ids) = backend.take_inbox() {
            break ids;
        }
        assert!(Instant::now() < end, "the inbox cannot be read again");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        next,
        [id],
        "the id whose row the unanswered take deleted is lost"
    );
    assert!(backend.take_inbox().unwrap().is_empty(), "handed out once");
}

/// Review finding: the take deleted every inbox row of the shards held in one statement, so a
/// node taking over a shard with a huge inbox read it all at once (and one that outlasted the
/// statement timeout was never taken at all). Now it takes bounded batches until one comes
/// back short: more rows than one batch all come out, once each, in key order, in several
/// round trips; rows of a shard not held stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_inbox_is_taken_in_bounded_batches_in_key_order() {
    let Some(pg) = PgServer::shared("a_huge_inbox_is_taken_in_bounded_batches_in_key_order") else {
        return;
    };
    let url = pg.create_db("inbox_batches");
    let opts = PgOptions {
        shards: SHARDS,
        ..PgOptions::default()
    };
    drop(PgBackend::open(&url, &opts).expect("herald's schema is made"));
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let all: Vec<u32> = (0..SHARDS).collect();
    let grants = herald::cluster::rows::acquire(&c, "t", "t-1", 600_000, &all)
        .await
        .unwrap();
    // Shard 0 is not held here: its rows are another owner's.
    let held = Held(
        grants
            .iter()
            .filter(|g| g.shard != 0)
            .map(|g| (g.shard, g.epoch))
            .collect(),
    );
    let backend = PgBackend::open(&url, &opts)
        .unwrap()
        .with_fence(Arc::new(held));

    // 5 000 rows (the batch is 1 024), spread over every shard.
    const ROWS: u32 = 5_000;
    pg.psql(
        &url,
        &format!(
            "INSERT INTO herald_inbox (shard, task_id) \
             SELECT i % {SHARDS}, 'big-' || i FROM generate_series(1, {ROWS}) AS i"
        ),
    );
    let mut want: Vec<(u32, String)> = (1..=ROWS)
        .map(|i| (i % SHARDS, format!("big-{i}")))
        .filter(|(s, _)| *s != 0)
        .collect();
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, id)| id).collect();

    let trips = backend.read_round_trips();
    let b = Arc::new(backend);
    let b2 = b.clone();
    let ids = tokio::task::spawn_blocking(move || b2.take_inbox())
        .await
        .unwrap()
        .expect("the inbox is taken");
    let batches = b.read_round_trips() - trips;
    assert_eq!(ids.len(), want.len(), "every row of the shards held, once");
    assert!(ids == want, "in key order: shard, then task id");
    let least = (want.len() as u64).div_ceil(1_024);
    assert!(
        batches >= least,
        "taken in {batches} statement(s); bounded batches need at least {least}"
    );
    assert_eq!(
        inbox_rows(&pg, &url),
        u64::from(ROWS.div_ceil(SHARDS)),
        "the rows of the shard not held stay"
    );
    let b2 = b.clone();
    let again = tokio::task::spawn_blocking(move || b2.take_inbox())
        .await
        .unwrap()
        .unwrap();
    assert!(again.is_empty(), "handed out once: {} again", again.len());
}
