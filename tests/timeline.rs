//! A task's timeline through the API, the CLI and a backup (issue 25): `GET
//! /v1/tasks/{id}/timeline` pages events oldest first like runs (`limit`, `after`, `next`), keeps
//! one run's with `run`, answers bad parameters with problem documents naming them and an
//! unknown task with 404; `herald tasks timeline ID` prints them (and `--json`); an export
//! carries them with their seqs and an import restores them. Besides the engine's own
//! `created`, the events here are written through the store's batch path (the engine's are
//! tested in `tests/timeline_engine.rs`), so the pages hold known events.

mod common;

use std::process::{Command, Stdio};

use common::herald::TestHerald;
use common::http;
use herald::model::timeline::{TimelineEvent, TimelineKind};
use herald::store::{Batch, Store};
use serde_json::{json, Value};

/// Events of a task after its `created` (which the engine wrote): per run a fired, two
/// attempts (500, then 200) and delivered.
fn events(runs: u32) -> Vec<TimelineEvent> {
    let mut out = Vec::new();
    for run in 1..=runs {
        let at = 1_000 * u64::from(run) + 10_000;
        out.push(TimelineEvent::run(TimelineKind::Fired, at, run, None));
        out.push(
            TimelineEvent::run(TimelineKind::Attempt, at + 1, run, Some(0))
                .with_attempt(1)
                .with_detail(json!({"status": 500, "duration_ms": 3, "outcome": "retry", "error": "HTTP 500"})),
        );
        out.push(
            TimelineEvent::run(TimelineKind::Attempt, at + 2, run, Some(0))
                .with_attempt(2)
                .with_detail(json!({"status": 200, "duration_ms": 2, "outcome": "sent"})),
        );
        out.push(TimelineEvent::run(TimelineKind::Delivered, at + 2, run, Some(0)).with_attempt(2));
    }
    out
}

async fn with_timeline(h: &TestHerald, id: &str, runs: u32) {
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": id, "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let mut b = Batch::new();
    b.timeline(id, events(runs));
    h.server.engine.store().write(&b).await.unwrap();
}

fn seqs(page: &Value) -> Vec<u64> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn the_timeline_pages_oldest_first_filters_by_run_and_names_bad_parameters() {
    let h = TestHerald::start("").await;
    with_timeline(&h, "t", 3).await;
    let page = |q: &str| {
        let url = h.url(&format!("/v1/tasks/t/timeline{q}"));
        async move { http::get(&url).await }
    };
    let all = page("").await;
    assert_eq!(all.status, 200, "{}", all.text());
    let all = all.json();
    assert_eq!(seqs(&all), (1..=13).collect::<Vec<_>>());
    assert_eq!(all["next"], Value::Null);
    let first = &all["events"][0];
    assert_eq!(first["kind"], "created");
    assert_eq!(all["events"][1]["at"], "1970-01-01T00:00:11Z");
    assert_eq!(
        (first["run"].clone(), first["msg"].clone()),
        (Value::Null, Value::Null)
    );
    let attempt = &all["events"][2];
    assert_eq!(
        (
            attempt["kind"].clone(),
            attempt["run"].clone(),
            attempt["msg"].clone(),
            attempt["attempt"].clone()
        ),
        (json!("attempt"), json!(1), json!(0), json!(1))
    );
    assert_eq!(attempt["detail"]["status"], 500);
    // Paged: `next` is the seq to go on after, null on the last page.
    let p1 = page("?limit=5").await.json();
    assert_eq!(seqs(&p1), [1, 2, 3, 4, 5]);
    assert_eq!(p1["next"], "5");
    let p2 = page("?limit=5&after=5").await.json();
    assert_eq!(seqs(&p2), [6, 7, 8, 9, 10]);
    let p3 = page(&format!("?limit=5&after={}", p2["next"].as_str().unwrap()))
        .await
        .json();
    assert_eq!(seqs(&p3), [11, 12, 13]);
    assert_eq!(p3["next"], Value::Null);
    // One run's events.
    let run2 = page("?run=2").await.json();
    assert_eq!(seqs(&run2), [6, 7, 8, 9]);
    assert!(run2["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["run"] == 2));
    // Bad parameters: problem documents naming them.
    for (q, field) in [
        ("?limit=0", "limit"),
        ("?limit=x", "limit"),
        ("?after=x", "after"),
        ("?run=-1", "run"),
        ("?after=1.5", "after"),
    ] {
        let r = page(q).await;
        assert_eq!(r.status, 400, "{q}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{q}"
        );
        assert_eq!(r.json()["field"], field, "{q}: {}", r.text());
    }
    let r = page("?colour=blue").await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = http::get(&h.url("/v1/tasks/nobody/timeline")).await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = http::post_json(&h.url("/v1/tasks/t/timeline"), &json!({})).await;
    assert_eq!(r.status, 405);
    // A task just made: its `created`, and past it an empty last page.
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "quiet", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    let q = http::get(&h.url("/v1/tasks/quiet/timeline")).await.json();
    assert_eq!(seqs(&q), [1]);
    let q = http::get(&h.url("/v1/tasks/quiet/timeline?after=1"))
        .await
        .json();
    assert_eq!(q, json!({"events": [], "next": null}));
}

/// Runs the CLI against `url`.
async fn cli(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let url = url.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(&args)
            .env("HERALD_URL", url)
            .env_remove("HERALD_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run herald");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_the_timeline_as_a_table_and_as_json() {
    let h = TestHerald::start("").await;
    with_timeline(&h, "t", 2).await;
    let url = h.server.url();
    let (code, out, err) = cli(&url, &["tasks", "timeline", "t"]).await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("SEQ"), "{out}");
    assert_eq!(
        lines.len(),
        1 + 9,
        "a header and one line per event:\n{out}"
    );
    assert!(
        lines[3].contains("attempt") && lines[3].contains("status=500"),
        "{out}"
    );
    assert!(
        lines[4].contains("status=200") && lines[4].contains("outcome=sent"),
        "{out}"
    );
    let (code, out, err) = cli(&url, &["tasks", "timeline", "t", "--limit", "3"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("more: herald tasks timeline t --after 3"),
        "{out}"
    );
    let (code, out, err) = cli(&url, &["tasks", "timeline", "t", "--run", "2", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(seqs(&v), [6, 7, 8, 9]);
    let (code, _, err) = cli(&url, &["tasks", "timeline", "nobody"]).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("nobody"), "{err}");
}

#[tokio::test]
async fn an_export_carries_the_timeline_and_an_import_restores_it_with_its_seqs() {
    let text = {
        let h = TestHerald::start("").await;
        with_timeline(&h, "t", 2).await;
        let mut out = Vec::new();
        herald::backup::export::export(h.server.engine.store(), 0, &mut |l| {
            out.extend(serde_json::to_vec(l).unwrap());
            out.push(b'\n');
            Ok(())
        })
        .unwrap();
        String::from_utf8(out).unwrap()
    };
    let kinds: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "timeline").count(),
        9,
        "{text}"
    );
    let dst = tempfile::tempdir().unwrap();
    let store = Store::open(dst.path()).unwrap();
    herald::backup::import::import(&store, std::io::BufReader::new(text.as_bytes()))
        .await
        .unwrap();
    let back = store.timeline_all("t").unwrap();
    let mut want = events(2);
    for (i, e) in want.iter_mut().enumerate() {
        e.seq = i as u64 + 2;
    }
    assert_eq!(back[0].kind, TimelineKind::Created);
    assert_eq!(back[1..], want[..]);
    // The next event of the restored task goes on after the imported ones.
    let mut b = Batch::new();
    b.timeline("t", vec![TimelineEvent::task(TimelineKind::Paused, 99)]);
    store.write(&b).await.unwrap();
    let (page, _) = store.timeline("t", None, Some(9), 10).unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [10]);
    // An export with events out of order is refused, naming the line.
    let bad: String = text
        .lines()
        .map(|l| l.replace("\"seq\":3,", "\"seq\":1,"))
        .collect::<Vec<_>>()
        .join("\n");
    let dst2 = tempfile::tempdir().unwrap();
    let store2 = Store::open(dst2.path()).unwrap();
    let e = herald::backup::import::import(&store2, std::io::BufReader::new(bad.as_bytes()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("out of order"), "{e}");
}
