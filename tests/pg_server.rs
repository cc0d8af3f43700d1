//! herald itself on PostgreSQL (`[store] url`): a task created over the API is delivered and
//! still there after a restart on the same database; a database that cannot be used ends
//! start-up with one line naming it without its password.

mod common;

use std::process::Command;
use std::time::Duration;

use common::herald::{poll, wait_state};
use common::http;
use common::pg::PgServer;
use herald::config::{Config, Overrides};
use serde_json::json;

async fn start(url: &str, dir: &std::path::Path) -> herald::server::Server {
    let config = format!(
        "[store]\nurl = \"{url}\"\n[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
        dir.join("out.jsonl").display()
    );
    let cfg = Config::from_toml(
        &config,
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.join("data")),
            token: None,
        },
    )
    .expect("config");
    herald::server::start(cfg)
        .await
        .expect("herald starts on postgres")
}

#[tokio::test]
async fn a_task_is_delivered_and_kept_across_a_restart_on_postgres() {
    let Some(pg) = PgServer::shared("a_task_is_delivered_and_kept_across_a_restart_on_postgres")
    else {
        return;
    };
    let url = pg.create_db("server");
    let dir = tempfile::tempdir().unwrap();
    let server = start(&url, dir.path()).await;
    let base = server.url();
    let r = http::post_json(
        &format!("{base}/v1/tasks"),
        &json!({"id": "pg-1", "schedule": {"after": "200ms"}, "channel": "out",
                "messages": [{"to": "a", "body": "one"}, {"to": "b", "body": "two"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&base, "pg-1", "completed", Duration::from_secs(20)).await;
    let out = dir.path().join("out.jsonl");
    let lines = poll(Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        (text.lines().count() == 2).then_some(text)
    })
    .await
    .expect("both messages delivered");
    assert!(lines.contains("one") && lines.contains("two"), "{lines}");
    let health = http::get(&format!("{base}/healthz")).await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(server.stop(Duration::from_secs(10)).await, "herald stopped");

    // A new herald on the same database: the task, its runs and its state are there.
    let server = start(&url, dir.path()).await;
    let base = server.url();
    let t = http::get(&format!("{base}/v1/tasks/pg-1")).await;
    assert_eq!(t.status, 200, "{}", t.text());
    assert_eq!(t.json()["state"], "completed");
    let dup = http::post_json(
        &format!("{base}/v1/tasks"),
        &json!({"id": "pg-1", "schedule": {"after": "1h"}, "messages": [{"to": "a", "body": "x"}]}),
    )
    .await;
    assert_eq!(dup.status, 409, "the id is taken: {}", dup.text());
    assert!(server.stop(Duration::from_secs(10)).await);
    let again = std::fs::read_to_string(&out).unwrap();
    assert_eq!(again.lines().count(), 2, "nothing was sent twice: {again}");
}

#[test]
fn a_missing_database_ends_start_up_with_one_line_without_the_password() {
    let Some(pg) = PgServer::shared("a_missing_database_ends_start_up_with_one_line") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/no_such_db",
        pg.port()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .env("HERALD_STORE_URL", &url)
        .env("HERALD_LOG", "warn")
        .output()
        .expect("run herald");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "herald must not start: {stderr}");
    assert!(
        stderr.contains("no_such_db") && stderr.contains("cannot connect"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "the password leaked: {stderr}");
}
