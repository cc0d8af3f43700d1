//! Upgrading a large schema-5 database (`store/pg/schema.rs`): the fold of `herald_live` into
//! progress records runs in rounds inside the migration's transaction, with the server's
//! statement timeout off and no deadline for the whole, so a table whose fold takes longer than
//! the statement timeout (and than a call's deadline) is upgraded instead of rolled back.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pg::PgServer;
use herald::model::Limits;
use herald::request::{Context, TaskRequest};
use herald::store::pg::schema::SCHEMA_VERSION;
use herald::store::pg::{PgBackend, PgOptions};
use herald::store::{Inserted, Store};

/// Tasks in the schema-5 database: one statement over them all took ~3 s on a test server,
/// past the 1 s statement timeout below.
fn tasks() -> u64 {
    std::env::var("HERALD_TEST_FOLD_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150_000)
}

/// A schema-5 database of `n` pending tasks, as schema 5 kept them: a spec and a live row
/// each, no progress row (derived from the two), `schema_version` 5.
async fn schema_5(pg: &PgServer, url: &str, n: u64) {
    {
        let store = Store::with_backend(Arc::new(
            PgBackend::open(url, &PgOptions::default()).expect("open"),
        ))
        .unwrap();
        let req: TaskRequest = serde_json::from_value(serde_json::json!({
            "id": "seed", "schedule": {"after": "1h"}, "to": ["a"], "body": "hello"
        }))
        .unwrap();
        let (t, m) = req
            .into_task(&Context {
                now_ms: 1_800_000_000_000,
                limits: &Limits::default(),
                channel_exists: &|_| true,
            })
            .unwrap();
        assert!(matches!(
            store.insert_new_task(&t, &m, None).await.unwrap(),
            Inserted::Created
        ));
    }
    // The seed's spec and its live entry (a due entry's value is the encoded live entry),
    // copied under n ids; the seed itself goes.
    pg.psql(
        url,
        &format!(
            "INSERT INTO herald_specs (shard, key, value) \
               SELECT s.shard, convert_to('m' || i, 'UTF8'), s.value \
               FROM herald_specs s, generate_series(1, {n}) i WHERE s.key = 'seed'::bytea; \
             INSERT INTO herald_live (shard, key, value) \
               SELECT d.shard, convert_to('m' || i, 'UTF8'), d.value \
               FROM (SELECT * FROM herald_due LIMIT 1) d, generate_series(1, {n}) i; \
             DELETE FROM herald_specs WHERE key = 'seed'::bytea; \
             DELETE FROM herald_messages; DELETE FROM herald_due; \
             UPDATE herald_meta SET value = '5' WHERE name = 'schema_version'"
        ),
    );
    pg.psql(url, "VACUUM ANALYZE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_5_database_whose_fold_outlasts_the_statement_timeout_is_upgraded() {
    let Some(pg) =
        PgServer::shared("a_schema_5_database_whose_fold_outlasts_the_statement_timeout")
    else {
        return;
    };
    let url = pg.create_db("fold");
    let n = tasks();
    schema_5(&pg, &url, n).await;
    assert_eq!(
        pg.psql(&url, "SELECT count(*) FROM herald_live"),
        n.to_string()
    );

    let opts = PgOptions {
        statement_timeout: Duration::from_secs(1),
        ..PgOptions::default()
    };
    let started = Instant::now();
    let open_url = url.clone();
    let opened = tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &opts))
        .await
        .unwrap();
    let took = started.elapsed();
    let backend = opened.expect("the upgrade completes");
    eprintln!("{n} tasks folded in {took:?}");
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(pg.psql(&url, "SELECT count(*) FROM herald_live"), "0");
    assert_eq!(
        pg.psql(&url, "SELECT count(*) FROM herald_progress"),
        n.to_string()
    );
    assert_eq!(
        pg.psql(&url, "SELECT count(*) FROM herald_due"),
        n.to_string()
    );
    // A folded task reads back as it was.
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    for id in ["m1", &format!("m{n}")] {
        let t = store.get_task(id).unwrap().expect("the task is there");
        assert_eq!(t.state, herald::model::TaskState::Pending, "{id}");
    }
}

/// Review finding: with the statement timeout off for the migration, a DDL statement queued
/// behind another session's open transaction waited for good (the client's bound gave up,
/// then its connection waited for the server's answer), and start-up hung with no error. A
/// lock the migration waits for now fails it after the call's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waiting_for_a_table_lock_fails_instead_of_hanging() {
    let Some(pg) = PgServer::shared("a_migration_waiting_for_a_table_lock") else {
        return;
    };
    let url = pg.create_db("held");
    schema_5(&pg, &url, 10).await;
    // Another session's open transaction on `herald_node`, which version 7 alters.
    let (holder, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    holder
        .batch_execute("BEGIN; SELECT count(*) FROM herald_node")
        .await
        .expect("lock held");
    let opts = PgOptions {
        statement_timeout: Duration::from_secs(1),
        ..PgOptions::default()
    };
    let started = Instant::now();
    let open_url = url.clone();
    let opened = tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &opts));
    let opened = tokio::time::timeout(Duration::from_secs(30), opened).await;
    drop(holder);
    conn.abort();
    let opened = opened.expect("start-up did not hang").unwrap();
    let e = opened.err().expect("refused while the lock is held");
    assert!(format!("{e}").contains("lock timeout"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // Nothing was half-done: still schema 5, upgraded once the lock is free.
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        "5"
    );
    let opts = PgOptions {
        statement_timeout: Duration::from_secs(1),
        ..PgOptions::default()
    };
    let open_url = url.clone();
    tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &opts))
        .await
        .unwrap()
        .expect("upgraded");
}

/// Review finding: an export (no process lock) upgraded the schema under the herald serving
/// it, which then refused to start ("newer than this build's"). An open that does not
/// upgrade refuses an older schema and changes nothing; on this build's schema it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_without_upgrade_leaves_an_older_schema_as_it_is() {
    let Some(pg) = PgServer::shared("an_open_without_upgrade") else {
        return;
    };
    let url = pg.create_db("older");
    schema_5(&pg, &url, 3).await;
    let read_only = || PgOptions {
        upgrade: false,
        ..PgOptions::default()
    };
    let open_url = url.clone();
    let opened = tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &read_only()))
        .await
        .unwrap();
    let e = opened.err().expect("an older schema is refused");
    assert!(format!("{e}").contains("older than this build"), "{e}");
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        "5"
    );
    assert_eq!(pg.psql(&url, "SELECT count(*) FROM herald_live"), "3");
    // Upgraded by an open that may, then opened as it is.
    let open_url = url.clone();
    tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &PgOptions::default()))
        .await
        .unwrap()
        .expect("upgraded");
    let open_url = url.clone();
    tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &read_only()))
        .await
        .unwrap()
        .expect("this build's schema opens without an upgrade");
    // Schema 7 (schema 8 only moved the number) opens without an upgrade and stays 7: an
    // export leaves the herald that serves it able to start again.
    pg.psql(
        &url,
        "UPDATE herald_meta SET value = '7' WHERE name = 'schema_version'",
    );
    let open_url = url.clone();
    tokio::task::spawn_blocking(move || PgBackend::open(&open_url, &read_only()))
        .await
        .unwrap()
        .expect("schema 7 opens as it is");
    assert_eq!(
        pg.psql(
            &url,
            "SELECT value FROM herald_meta WHERE name = 'schema_version'"
        ),
        "7"
    );
}
