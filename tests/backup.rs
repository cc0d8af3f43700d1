//! `herald export` / `herald import` on the real binary: a data dir with a paced sequence
//! part-way through is exported (after `kill -9`, and from the running herald over the API),
//! imported into a new directory, and herald started on it carries on exactly where the
//! original stopped: the sequence resumes at its cursor, nothing before it is sent again, every
//! task and idempotency key is there. Bad imports are refused and leave nothing behind.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::herald::{wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::Receiver;
use serde_json::{json, Value};

fn herald(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env_remove("HERALD_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default())
        .expect("write stdin");
    drop(input);
    child.wait_with_output().expect("herald ran")
}

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn seq_of(r: &common::receiver::Recorded) -> u64 {
    r.json.as_ref().expect("json body")["seq"]
        .as_u64()
        .expect("seq")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn data(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_resumes_a_sequence_at_its_cursor() {
    const N: u64 = 40;
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (d1, d2) = (dir.path().join("one"), dir.path().join("two"));
    let config = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));
    let mut p = Proc::spawn(&config, &d1);
    let post = |body: Value, key: &'static str| {
        let url = format!("{}/v1/tasks", p.url);
        async move {
            http::request(
                "POST",
                &url,
                &[("idempotency-key", key)],
                Some(body.to_string().into_bytes()),
            )
            .await
        }
    };
    let later = json!({"id": "later", "channel": "hook", "schedule": {"after": "30d"},
        "to": ["x"], "body": "later"});
    assert_eq!(post(later.clone(), "key-later").await.status, 201);
    assert_eq!(
        post(
            json!({"id": "done", "channel": "hook", "schedule": {"after": "0s"},
            "to": ["d"], "body": "done"}),
            "key-done"
        )
        .await
        .status,
        201
    );
    wait_state(&p.url, "done", "completed", Duration::from_secs(20)).await;
    let r = post(
        json!({"id": "seq", "channel": "hook", "schedule": {"after": "0s"},
            "to": (0..N).map(|i| format!("u{i}")).collect::<Vec<_>>(), "body": "x",
            "pacing": {"interval": "150ms"}}),
        "key-seq",
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Part-way through the sequence (the `done` task's message is the first arrival).
    rx.wait_for(1 + 6, Duration::from_secs(30)).await;

    // While herald runs: its directory is locked, and the API streams the export.
    let o = herald(&["export", "--data", data(&d1)], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("herald export --url"), "{}", stderr(&o));
    let o = herald(&["export", "--url", &p.url], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let online = lines(&o.stdout);
    assert_eq!(online[0]["kind"], "header");
    assert_eq!(online.last().unwrap()["kind"], "end");
    let ids: BTreeSet<&str> = online
        .iter()
        .filter(|l| l["kind"] == "task")
        .map(|l| l["task"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from(["done", "later", "seq"]));

    p.kill9();
    let sent_before: Vec<u64> = rx
        .requests()
        .iter()
        .filter(|r| r.idempotency_key().is_some_and(|k| k.starts_with("seq:")))
        .map(seq_of)
        .collect();
    let o = herald(&["export", "--data", data(&d1)], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = o.stdout.clone();
    let exported = lines(&file);
    let run = exported
        .iter()
        .find(|l| l["kind"] == "run" && l["task_id"] == "seq")
        .expect("the sequence's run is exported");
    let cursor = run["run"]["cursor"].as_u64().unwrap();
    assert!(
        cursor > 0 && cursor < N,
        "exported part-way: cursor {cursor}"
    );
    // In flight means armed (the mark is written ahead of the send): sent, or not yet.
    let armed = u64::from(!run["run"]["in_flight"].is_null());
    assert!(
        (cursor..=cursor + armed).contains(&(sent_before.len() as u64)),
        "what was sent is what the cursor says: {sent_before:?}, cursor {cursor}"
    );
    assert!(exported
        .iter()
        .any(|l| l["kind"] == "idempotency" && l["key"] == "key-later"));

    // Import into a new directory; a second import into it (now not empty) is refused.
    let o = herald(&["import", "--data", data(&d2)], Some(&file));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = herald(&["import", "--data", data(&d2)], Some(&file));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));

    let p = Proc::spawn(&config, &d2);
    let v = wait_state(&p.url, "seq", "completed", Duration::from_secs(60)).await;
    assert_eq!(v["progress"]["sent"], N);
    let after: Vec<u64> = rx
        .requests()
        .iter()
        .filter(|r| r.idempotency_key().is_some_and(|k| k.starts_with("seq:")))
        .map(seq_of)
        .skip(sent_before.len())
        .collect();
    assert!(
        after.iter().all(|s| *s >= cursor),
        "nothing before the cursor {cursor} was sent again: {after:?}"
    );
    let all: BTreeSet<u64> = sent_before.iter().chain(&after).copied().collect();
    assert_eq!(all, (0..N).collect(), "every message delivered");
    assert_eq!(
        after.len() as u64,
        N - cursor,
        "from the cursor on, each once: {after:?}"
    );

    // Every task is there, and idempotency keys still replay.
    let t = http::get(&format!("{}/v1/tasks/later", p.url)).await.json();
    assert_eq!(t["state"], "pending");
    assert_eq!(
        http::get(&format!("{}/v1/tasks/done", p.url)).await.json()["state"],
        "completed"
    );
    let r = http::request(
        "POST",
        &format!("{}/v1/tasks", p.url),
        &[("idempotency-key", "key-later")],
        Some(later.to_string().into_bytes()),
    )
    .await;
    assert_eq!(r.status, 200, "the key replays: {}", r.text());
    assert_eq!(r.json()["id"], "later");
}

#[test]
fn a_cut_short_or_foreign_file_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("new");
    let cases: [(&str, &str); 3] = [
        (
            "{\"kind\":\"header\",\"format\":\"herald-export\",\"version\":1,\"exported_at\":\"2026-01-01T00:00:00Z\"}\n",
            "cut short",
        ),
        ("{\"kind\":\"end\",\"tasks\":0,\"lines\":1}\n", "header"),
        (
            "{\"kind\":\"header\",\"format\":\"herald-export\",\"version\":99,\"exported_at\":\"x\"}\n",
            "version 99",
        ),
    ];
    for (text, says) in cases {
        let o = herald(&["import", "--data", data(&target)], Some(text.as_bytes()));
        assert!(!o.status.success(), "{text}");
        assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
        assert!(
            !target.exists(),
            "a failed import leaves no directory behind"
        );
    }
    let o = herald(&["export", "--data", data(&target)], None);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no herald data directory"),
        "{}",
        stderr(&o)
    );
}
