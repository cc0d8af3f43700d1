//! One single-node herald per PostgreSQL database, as sled allows one process per directory
//! (`store/pg/lock.rs`): a second `herald serve` on the database of a running one ends
//! start-up naming the cause while the first keeps serving; an import into that database is
//! refused and an export still runs; a first whose lock's session is ended refuses writes
//! (and says why) until it holds the lock again.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::{poll, wait_state, write_config, Proc};
use common::http;
use common::pg::{someone_waits_on_a_lock, PgServer};
use herald::store::pg::lock::PROCESS_LOCK;
use serde_json::json;

const REFUSED: &str = "another herald serves this database; run several only in cluster mode";

fn config(dir: &std::path::Path, url: &str) -> std::path::PathBuf {
    write_config(
        dir,
        &format!(
            "[store]\nurl = \"{url}\"\n[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            dir.join("out.jsonl").display()
        ),
    )
}

fn serve(config: &std::path::Path, data: &std::path::Path, url: &str) -> Proc {
    let mut cmd = Proc::command(config, data);
    cmd.env("HERALD_STORE_URL", url);
    Proc::start(cmd)
}

/// Runs `herald args…` to its end (killed after `deadline`): exit status and stderr.
fn run(args: &[&str], url: &str, deadline: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env("HERALD_STORE_URL", url)
        .env("HERALD_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s.code();
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    (status, err)
}

async fn create(base: &str, id: &str) -> http::Resp {
    http::post_json(
        &format!("{base}/v1/tasks"),
        &json!({"id": id, "schedule": {"after": "100ms"}, "channel": "out",
                "messages": [{"to": "a", "body": id}]}),
    )
    .await
}

#[tokio::test]
async fn a_second_single_node_herald_on_one_database_is_refused_and_the_first_keeps_serving() {
    let Some(pg) = PgServer::shared("a_second_single_node_herald_on_one_database_is_refused")
    else {
        return;
    };
    let url = pg.create_db("exclusive");
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &url);
    let first = serve(&cfg, &dir.path().join("a"), &url);

    let second_data = dir.path().join("b");
    let (status, err) = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            cfg.to_str().unwrap(),
            "--data",
            second_data.to_str().unwrap(),
        ],
        &url,
        Duration::from_secs(30),
    );
    assert!(
        status.is_some_and(|c| c != 0),
        "the second herald must end with an error, not serve (status {status:?}): {err}"
    );
    assert!(err.contains(REFUSED), "{err}");

    // An import into the database it serves is refused; an export reads it.
    let file = dir.path().join("empty.jsonl");
    std::fs::write(&file, "").unwrap();
    let (status, err) = run(
        &["import", "--store-url", &url, "-f", file.to_str().unwrap()],
        &url,
        Duration::from_secs(30),
    );
    assert!(status.is_some_and(|c| c != 0), "import refused: {err}");
    assert!(err.contains(REFUSED), "{err}");
    let (status, err) = run(
        &["export", "--store-url", &url],
        &url,
        Duration::from_secs(30),
    );
    assert_eq!(status, Some(0), "export runs beside herald: {err}");

    // The first carries on.
    let r = create(&first.url, "still-1").await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&first.url, "still-1", "completed", Duration::from_secs(20)).await;
    let health = http::get(&format!("{}/healthz", first.url)).await;
    assert_eq!(health.status, 200, "{}", health.text());
}

#[tokio::test]
async fn a_lost_lock_refuses_writes_until_it_is_held_again() {
    let Some(pg) = PgServer::shared("a_lost_lock_refuses_writes_until_it_is_held_again") else {
        return;
    };
    let url = pg.create_db("lost_lock");
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &url);
    let p = serve(&cfg, &dir.path().join("a"), &url);
    let session = || async {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        c
    };
    let (c, w) = (std::sync::Arc::new(session().await), session().await);

    // Someone else waits for the lock; herald's session holding it is ended, and the waiter
    // gets it before herald can take it again (as a second process might, in that moment).
    let waiter = c.clone();
    let taken = tokio::spawn(async move {
        waiter
            .query_one("SELECT pg_advisory_lock($1)", &[&PROCESS_LOCK])
            .await
            .map(|_| ())
    });
    assert!(someone_waits_on_a_lock(&w).await, "the waiter waits");
    let ended = w
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'herald process lock' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(ended.get::<_, i64>(0), 1, "one session holds herald's lock");
    tokio::time::timeout(Duration::from_secs(10), taken)
        .await
        .expect("the lock is free once its session ended")
        .unwrap()
        .unwrap();

    let refused = poll(Duration::from_secs(10), || async {
        let h = http::get(&format!("{}/healthz", p.url)).await;
        (h.status == 503).then_some(h.text())
    })
    .await
    .expect("/healthz says storage fails while the lock is not held");
    assert!(refused.contains("process lock"), "{refused}");
    let r = create(&p.url, "while-lost").await;
    assert_eq!(
        r.status,
        503,
        "no write while the lock is not held: {}",
        r.text()
    );
    assert_eq!(
        pg.psql(&url, "SELECT count(*) FROM herald_specs"),
        "0",
        "nothing was written"
    );

    // Let go: herald takes it again and writes.
    c.query_one("SELECT pg_advisory_unlock($1)", &[&PROCESS_LOCK])
        .await
        .unwrap();
    let created = poll(Duration::from_secs(15), || async {
        let r = create(&p.url, "after").await;
        (r.status == 201).then_some(())
    })
    .await;
    assert!(
        created.is_some(),
        "writes resume once the lock is held again"
    );
    wait_state(&p.url, "after", "completed", Duration::from_secs(20)).await;
}
