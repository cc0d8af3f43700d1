//! Moving a sled data dir to PostgreSQL with the real binary (README "Run on PostgreSQL"):
//! `herald export --data` of a stopped herald, `herald import --store-url` into an empty
//! database, herald started on it finds every task and idempotency key; `herald export
//! --store-url` reads it back. An import into a database holding tasks is refused; a cut-short
//! file leaves herald's tables empty.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::herald::{wait_state, write_config, Proc};
use common::http;
use common::pg::PgServer;
use serde_json::{json, Value};

fn herald(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env_remove("HERALD_TOKEN")
        .env_remove("HERALD_STORE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("herald ran")
}

fn ids(export: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(export)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|l| l["kind"] == "task")
        .map(|l| l["task"]["id"].as_str().unwrap().to_string())
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_data_dir_moves_to_postgres_by_export_and_import() {
    let Some(pg) = PgServer::shared("a_sled_data_dir_moves_to_postgres") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("out.jsonl");
    let config = write_config(
        dir.path(),
        &format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            out.display()
        ),
    );
    // On sled (whatever HERALD_TEST_STORE says: this test is about the move).
    let mut cmd = Proc::command(&config, &data);
    cmd.env_remove("HERALD_STORE_URL");
    let mut p = Proc::start(cmd);
    let later = json!({"id": "later", "channel": "out", "schedule": {"after": "30d"},
        "to": ["x"], "body": "later"});
    let r = http::request(
        "POST",
        &format!("{}/v1/tasks", p.url),
        &[("idempotency-key", "key-later")],
        Some(later.to_string().into_bytes()),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "done", "channel": "out", "schedule": {"after": "0s"},
                "to": ["d"], "body": "done"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&p.url, "done", "completed", Duration::from_secs(20)).await;
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(20)).await, Some(0));

    let exported = herald(&["export", "--data", data.to_str().unwrap()], b"");
    assert!(exported.status.success(), "{}", stderr(&exported));
    let file = exported.stdout;
    let want = BTreeSet::from(["done".to_string(), "later".to_string()]);
    assert_eq!(ids(&file), want);

    let url = pg.create_db("moved");
    let o = herald(&["import", "--store-url", &url], &file);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("imported 2 tasks"), "{}", stderr(&o));
    // Twice is refused: the database holds tasks now.
    let o = herald(&["import", "--store-url", &url], &file);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("already holds herald tasks"),
        "{}",
        stderr(&o)
    );
    let back = herald(&["export", "--store-url", &url], b"");
    assert!(back.status.success(), "{}", stderr(&back));
    assert_eq!(ids(&back.stdout), want);

    // herald on the database carries on: tasks, states and idempotency keys are there.
    let mut cmd = Proc::command(&config, &dir.path().join("unused"));
    cmd.env("HERALD_STORE_URL", &url);
    let p = Proc::start(cmd);
    let t = http::get(&format!("{}/v1/tasks/later", p.url)).await;
    assert_eq!(t.status, 200, "{}", t.text());
    assert_eq!(t.json()["state"], "pending");
    let t = http::get(&format!("{}/v1/tasks/done", p.url)).await;
    assert_eq!(t.json()["state"], "completed");
    let replay = http::request(
        "POST",
        &format!("{}/v1/tasks", p.url),
        &[("idempotency-key", "key-later")],
        Some(later.to_string().into_bytes()),
    )
    .await;
    assert_eq!(replay.status, 200, "the key replays: {}", replay.text());
    drop(p);

    // A file cut short: refused, and nothing of it kept.
    let url2 = pg.create_db("cut");
    let text = String::from_utf8_lossy(&file);
    let cut: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    let o = herald(&["import", "--store-url", &url2], cut.as_bytes());
    assert!(
        !o.status.success(),
        "a file without its end line is refused"
    );
    assert!(stderr(&o).contains("nothing was kept"), "{}", stderr(&o));
    assert_eq!(pg.psql(&url2, "SELECT count(*) FROM herald_specs"), "0");
    assert_eq!(pg.psql(&url2, "SELECT count(*) FROM herald_messages"), "0");
}
