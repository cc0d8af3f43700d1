//! The storage boundary on PostgreSQL against a private server (`common/pg.rs`): the same
//! contract as sled (`common/contract.rs`), the schema created on first open and a newer one
//! refused, and a task written and read back through the `Store` API.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::contract::contract;
use common::pg::PgServer;
use herald::model::{Limits, Message, Run, Task, TaskState};
use herald::request::{Context, TaskRequest};
use herald::store::backend::{Backend, RawOp, TreeId};
use herald::store::embedded::SledBackend;
use herald::store::pg::backend::scan_sql;
use herald::store::pg::schema::SCHEMA_VERSION;
use herald::store::pg::{PgBackend, PgOptions};
use herald::store::{Batch, Inserted, Store, StoreError};

fn open_pg(url: &str) -> PgBackend {
    PgBackend::open(url, &PgOptions::default()).expect("open the postgres backend")
}

#[test]
fn sled_meets_the_backend_contract() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    contract(&|| Arc::new(SledBackend::open(&data, 8 << 20).unwrap()) as Arc<dyn Backend>);
}

#[test]
fn postgres_meets_the_backend_contract() {
    let Some(pg) = PgServer::shared("postgres_meets_the_backend_contract") else {
        return;
    };
    let url = pg.create_db("contract");
    contract(&|| Arc::new(open_pg(&url)) as Arc<dyn Backend>);
}

#[test]
fn the_schema_is_made_on_first_open_and_a_newer_one_is_refused() {
    let Some(pg) = PgServer::shared("the_schema_is_made_on_first_open_and_a_newer_one_is_refused")
    else {
        return;
    };
    let url = pg.create_db("schema");
    let opts = PgOptions {
        shards: 16,
        ..PgOptions::default()
    };
    let b = PgBackend::open(&url, &opts).unwrap();
    assert_eq!(b.shards(), 16);
    drop(b);
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        SCHEMA_VERSION.to_string()
    );
    // Every shard has its lease row, unowned, at epoch 0.
    assert_eq!(
        pg.psql(
            &url,
            "SELECT count(*), min(shard_id), max(shard_id), max(epoch) FROM herald_shard WHERE owner_node IS NULL"
        ),
        "16|0|15|0"
    );
    // S is fixed when the schema is made: a later open asking for another keeps it.
    assert_eq!(open_pg(&url).shards(), 16);

    let newer = SCHEMA_VERSION + 1;
    pg.psql(
        &url,
        &format!("UPDATE herald_meta SET value = '{newer}' WHERE name = 'schema_version'"),
    );
    let err = PgBackend::open(&url, &PgOptions::default())
        .err()
        .expect("a newer schema must be refused");
    let line = err.to_string();
    assert!(matches!(err, StoreError::Database(_)), "{err:?}");
    assert!(
        line.contains(&format!("schema version {newer}")) && line.contains(&url),
        "{line}"
    );
    // Refused means untouched.
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        newer.to_string()
    );
}

#[test]
fn a_bad_url_or_a_missing_database_is_one_clear_line_without_the_password() {
    let Some(pg) = PgServer::shared("a_bad_url_or_a_missing_database_is_one_clear_line") else {
        return;
    };
    let err = PgBackend::open(
        "postgres://herald:pw@127.0.0.1:notaport/x",
        &PgOptions::default(),
    )
    .err()
    .expect("a malformed URL");
    let line = err.to_string();
    assert!(
        line.contains("not a PostgreSQL URL") && !line.contains("pw@"),
        "{line}"
    );
    let missing = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/no_such_db",
        pg.port()
    );
    let err = PgBackend::open(&missing, &PgOptions::default())
        .err()
        .expect("a missing database");
    let line = err.to_string();
    assert!(
        line.contains("no_such_db") && line.contains("cannot connect"),
        "{line}"
    );
    assert!(!line.contains("hunter2"), "the password leaked: {line}");
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = PgBackend::open(
        &format!("postgres://postgres@127.0.0.1:{port}/x"),
        &PgOptions::default(),
    )
    .err()
    .expect("no server");
    assert!(err.to_string().contains("cannot connect"), "{err}");
}

#[test]
fn writes_fail_while_the_database_is_down_and_work_again_once_it_is_back() {
    // A server of its own: this test crashes it.
    let Some(pg) = PgServer::start("writes_fail_while_the_database_is_down") else {
        return;
    };
    let url = pg.create_db("outage");
    let b = open_pg(&url);
    let put = |k: &[u8]| vec![vec![RawOp::Put(TreeId::Specs, k.to_vec(), b"v".to_vec())]];
    assert!(b.apply(put(b"before")).unwrap()[0].is_ok());
    pg.stop_now("immediate");
    let err = b.apply(put(b"during")).expect_err("no database, no commit");
    assert!(err.is_storage(), "{err:?}");
    assert!(err.to_string().contains(&url), "names the store: {err}");
    assert!(b.get(TreeId::Specs, b"before").is_err());
    pg.start_again();
    // The pool drops the dead connections and makes new ones by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match b.apply(put(b"after")) {
            Ok(r) => {
                assert!(r[0].is_ok());
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the backend did not recover: {e}"),
        }
    }
    // Acknowledged before the crash: still there; refused during it: not there.
    assert!(b.get(TreeId::Specs, b"before").unwrap().is_some());
    assert!(b.get(TreeId::Specs, b"during").unwrap().is_none());
    assert!(b.get(TreeId::Specs, b"after").unwrap().is_some());
}

fn task(id: &str) -> (Task, Vec<Message>) {
    let req: TaskRequest = serde_json::from_value(serde_json::json!({
        "id": id, "schedule": {"after": "1h"}, "to": ["a", "b"], "body": "hello"
    }))
    .unwrap();
    req.into_task(&Context {
        now_ms: 1_800_000_000_000,
        limits: &Limits::default(),
        channel_exists: &|_| true,
    })
    .unwrap()
}

#[tokio::test]
async fn a_task_is_created_read_and_updated_through_the_store_on_postgres() {
    let Some(pg) = PgServer::shared("a_task_is_created_read_and_updated_through_the_store") else {
        return;
    };
    let url = pg.create_db("store");
    {
        let store = Store::with_backend(Arc::new(open_pg(&url))).unwrap();
        let (t, m) = task("t1");
        let idem = Some(("key-1", [7u8; 32]));
        assert!(matches!(
            store.insert_new_task(&t, &m, idem).await.unwrap(),
            Inserted::Created
        ));
        assert!(matches!(
            store.insert_new_task(&t, &m, None).await.unwrap(),
            Inserted::IdTaken
        ));
        let (t2, m2) = task("t2");
        match store.insert_new_task(&t2, &m2, idem).await.unwrap() {
            Inserted::KeyUsed(rec) => assert_eq!(rec.task_id, "t1"),
            other => panic!("the idempotency key was used: {other:?}"),
        }
        let got = store.get_task("t1").unwrap().unwrap();
        assert_eq!((got.message_count, got.state), (2, TaskState::Pending));
        assert_eq!(store.get_message("t1", 1).unwrap().unwrap().to, "b");

        let mut running = got.clone();
        running.state = TaskState::Running;
        let mut b = Batch::new();
        b.progress(&running).run("t1", &Run::new(1, 5, 6, 2));
        store.write(&b).await.unwrap();
        assert_eq!(
            store.get_task("t1").unwrap().unwrap().state,
            TaskState::Running
        );
        assert_eq!(store.runs_of("t1").unwrap().len(), 1);
        assert_eq!(store.active_runs_of("t1").unwrap().len(), 1);
    }
    // A new process on the same database finds it all.
    let store = Store::with_backend(Arc::new(open_pg(&url))).unwrap();
    let t = store.get_task("t1").unwrap().unwrap();
    assert_eq!(t.state, TaskState::Running);
    assert_eq!(store.last_run("t1").unwrap().unwrap().run, 1);
    assert_eq!(store.idem_get("key-1").unwrap().unwrap().task_id, "t1");
    assert!(!store.task_exists("t2").unwrap());
}

/// Listings and start-up page through a tree with [`scan_sql`]: each page must be an index
/// range scan on the primary key, not a scan of the table (with a custom plan and with the
/// generic plan a prepared statement may switch to).
#[test]
fn a_scan_page_is_an_index_range_scan() {
    let Some(pg) = PgServer::shared("a_scan_page_is_an_index_range_scan") else {
        return;
    };
    let url = pg.create_db("explain");
    drop(open_pg(&url));
    pg.psql(
        &url,
        "INSERT INTO herald_due (shard, key, value) \
         SELECT 0, convert_to('k' || lpad(i::text, 6, '0'), 'UTF8'), '\\x00'::bytea \
         FROM generate_series(1, 20000) AS i; ANALYZE herald_due",
    );
    for (inclusive, bounded) in [(true, true), (false, true), (true, false), (false, false)] {
        let sql = scan_sql(TreeId::Due, inclusive, bounded);
        let (types, args) = if bounded {
            (
                "bytea, int8, bytea",
                "convert_to('k010000', 'UTF8'), 64, convert_to('k2', 'UTF8')",
            )
        } else {
            ("bytea, int8", "convert_to('k010000', 'UTF8'), 64")
        };
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let plan = pg.psql(
                &url,
                &format!(
                    "SET plan_cache_mode = {mode}; PREPARE page({types}) AS {sql}; EXPLAIN EXECUTE page({args})"
                ),
            );
            assert!(
                plan.contains("Index Scan using herald_due_pkey") && !plan.contains("Seq Scan"),
                "{sql} ({mode}):\n{plan}"
            );
        }
    }
}
