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

/// An export of task `t` (its lines changed by `edit`) between a header and its end line.
fn export_of(edit: impl FnOnce(&mut Vec<herald::backup::Line>)) -> String {
    let mut lines = task_lines("t");
    edit(&mut lines);
    let mut out = vec![header_line()];
    out.extend(lines.iter().map(|l| serde_json::to_string(l).unwrap()));
    let lines = out.len() as u64 + 1;
    out.push(serde_json::to_string(&herald::backup::Line::End { tasks: 1, lines }).unwrap());
    out.join("\n") + "\n"
}

/// The body of the one message of `export_of`'s task set to `body`.
fn with_body(lines: &mut [herald::backup::Line], body: String) {
    for l in lines {
        if let herald::backup::Line::Message { message, .. } = l {
            message.body = body.clone();
        }
    }
}

/// A task that breaks a rule of a create, or a file that is no export (`/dev/zero`: read only
/// up to the longest line an export can hold, not into memory whole), is refused naming its
/// line and field, and nothing is kept: a new directory is gone, an empty one left empty.
#[test]
fn an_invalid_task_or_an_endless_line_is_refused_and_leaves_nothing() {
    use herald::backup::Line;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let garbage_cron = export_of(|lines| {
        if let Some(Line::Task { task }) = lines.first_mut() {
            task.schedule = herald::model::Schedule::Cron {
                cron: "garbage cron".into(),
                tz: None,
                dst: Default::default(),
                start: None,
                start_ms: None,
                end: None,
                end_ms: None,
                max_runs: None,
            };
        }
    });
    let big_body = export_of(|lines| with_body(lines, "x".repeat(64 * 1024 + 1)));
    let cases: [(&[&str], Option<&str>, &str); 3] = [
        (&[], Some(&garbage_cron), "line 2: task.schedule.cron: "),
        (
            &[],
            Some(&big_body),
            "line 3: message.body: must be at most 65536 bytes",
        ),
        (
            &["-f", "/dev/zero"],
            None,
            "line 1: longer than 4593664 bytes",
        ),
    ];
    for (args, text, says) in cases {
        for target in [dir.path().join("new"), empty.clone()] {
            let mut all = vec!["import", "--data", data(&target)];
            all.extend_from_slice(args);
            let o = herald(&all, text.map(str::as_bytes));
            let said = stderr(&o);
            assert!(!o.status.success(), "{says}: imported: {said}");
            assert!(said.contains(says), "{says}: {said}");
            assert!(said.contains("nothing was kept"), "{said}");
            if target == empty {
                let left: Vec<_> = std::fs::read_dir(&target).unwrap().collect();
                assert!(left.is_empty(), "{says}: left behind {left:?}");
            } else {
                assert!(
                    !target.exists(),
                    "{says}: a failed import left its directory"
                );
            }
        }
    }
}

/// The limits a task is checked against are those of the herald that will serve it: a body
/// over the default limit is refused, and imports with `--config` naming a higher one.
#[test]
fn import_checks_against_the_limits_of_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let text = export_of(|lines| with_body(lines, "x".repeat(100_000)));
    let target = dir.path().join("data");
    let o = herald(&["import", "--data", data(&target)], Some(text.as_bytes()));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("line 3: message.body: must be at most 65536 bytes"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("give --config"), "{}", stderr(&o));
    let config = write_config(dir.path(), "[limits]\nmessage_body_bytes_max = 200000\n");
    let o = herald(
        &[
            "import",
            "--data",
            data(&target),
            "--config",
            config.to_str().unwrap(),
        ],
        Some(text.as_bytes()),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("imported 1 tasks"), "{}", stderr(&o));
}

/// `task_lines(id)` fired once: its one run finished, its one message failed (the failure
/// list's entry `id:1:0`), and its idempotency key `key-ID` (both returned apart: they come
/// after every task).
fn fired_task_lines(id: &str) -> (Vec<herald::backup::Line>, [herald::backup::Line; 2]) {
    use herald::backup::Line;
    use herald::model::{delivery_key, Failure, Run, RunState};
    const T0: u64 = 1_800_000_000_000;
    let mut lines = task_lines(id);
    if let Some(Line::Task { task }) = lines.first_mut() {
        task.fires = 1;
        task.runs = 1;
    }
    let mut run = Run::new(1, T0, T0, 1);
    run.state = RunState::Completed;
    run.cursor = 1;
    run.failed = 1;
    run.finished_at_ms = Some(T0);
    run.next_at_ms = None;
    lines.push(Line::Run {
        task_id: id.into(),
        run,
    });
    let failure = Failure {
        id: delivery_key(id, 1, 0),
        task_id: id.into(),
        run: 1,
        seq: 0,
        to: format!("to-{id}"),
        channel: "log".into(),
        attempts: 1,
        last_error: "refused".into(),
        failed_at_ms: T0,
        retrying: false,
        retries: 0,
    };
    let key = Line::Idempotency {
        key: format!("key-{id}"),
        task_id: id.into(),
        body_sha256: "ab".repeat(32),
    };
    (lines, [Line::Failure { failure }, key])
}

/// An export from an older herald whose task `b` today's rules refuse (a `notify.to` over the
/// recipient cap) is refused whole, naming `--skip-invalid`; with it, `a` and `c` import with
/// their runs, failures and keys, `b` is named on stderr by its line and nothing of it is
/// kept, and the exit status is 0.
#[test]
fn skip_invalid_imports_the_rest_of_a_file_without_a_task_the_rules_refuse() {
    use herald::backup::Line;
    let dir = tempfile::tempdir().unwrap();
    // Lines: 1 header, 2-4 task a (message, run), 5-7 task b, 8-10 task c, 11-13 the
    // failures, 14-16 the keys, 17 the end line.
    let (mut tasks, mut failures, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    for id in ["a", "b", "c"] {
        let (mut lines, [failure, key]) = fired_task_lines(id);
        if id == "b" {
            if let Some(Line::Task { task }) = lines.first_mut() {
                task.notify = Some(herald::model::Notify {
                    channel: "log".into(),
                    to: "n".repeat(1025),
                    on: vec![herald::model::NotifyOn::Failed],
                });
            }
        }
        tasks.append(&mut lines);
        failures.push(failure);
        keys.push(key);
    }
    let mut out = vec![header_line()];
    for l in tasks.iter().chain(&failures).chain(&keys) {
        out.push(serde_json::to_string(l).unwrap());
    }
    let end = Line::End {
        tasks: 3,
        lines: out.len() as u64 + 1,
    };
    out.push(serde_json::to_string(&end).unwrap());
    let text = out.join("\n") + "\n";

    let target = dir.path().join("data");
    let o = herald(&["import", "--data", data(&target)], Some(text.as_bytes()));
    let said = stderr(&o);
    assert!(!o.status.success(), "imported: {said}");
    assert!(
        said.contains("line 5: task.notify.to: must be at most 1024 bytes"),
        "{said}"
    );
    assert!(said.contains("--skip-invalid"), "{said}");
    assert!(said.contains("nothing was kept"), "{said}");
    assert!(!target.exists(), "a refused import left its directory");

    let o = herald(
        &["import", "--data", data(&target), "--skip-invalid"],
        Some(text.as_bytes()),
    );
    let said = stderr(&o);
    assert!(o.status.success(), "{said}");
    let skipped: Vec<&str> = said.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(
        skipped.first().copied(),
        Some("herald: line 5: task \"b\" skipped: task.notify.to: must be at most 1024 bytes"),
        "{said}"
    );
    assert!(
        said.contains("imported 2 tasks (17 lines)") && said.contains("skipped 1 tasks"),
        "{said}"
    );

    let o = herald(&["export", "--data", data(&target)], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let back = lines(&o.stdout);
    let of = |kind: &str, id: &dyn Fn(&Value) -> &Value| -> Vec<String> {
        back.iter()
            .filter(|l| l["kind"] == kind)
            .map(|l| id(l).as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(of("task", &|l| &l["task"]["id"]), ["a", "c"]);
    assert_eq!(of("message", &|l| &l["task_id"]), ["a", "c"]);
    assert_eq!(of("run", &|l| &l["task_id"]), ["a", "c"]);
    assert_eq!(of("failure", &|l| &l["failure"]["id"]), ["a:1:0", "c:1:0"]);
    assert_eq!(of("idempotency", &|l| &l["key"]), ["key-a", "key-c"]);
}

/// A pending one-shot task due in a year, with its one message.
fn task_lines(id: &str) -> Vec<herald::backup::Line> {
    use herald::backup::Line;
    use herald::model::{
        DstPolicy, Lang, Message, Misfire, Overlap, Pacing, QuietSetting, Schedule, Task, TaskState,
    };
    const T0: u64 = 1_800_000_000_000;
    let due = T0 + 365 * 86_400_000;
    let task = Task {
        id: id.into(),
        name: None,
        channel: "log".into(),
        schedule: Schedule::At {
            at: herald::schedule::format_utc(due),
            tz: None,
            dst: DstPolicy::default(),
            at_ms: due,
        },
        message_count: 1,
        pacing: Pacing::default(),
        retry: None,
        misfire: Misfire::FireNow,
        misfire_grace_ms: 600_000,
        overlap: Overlap::Skip,
        metadata: Default::default(),
        state: TaskState::Pending,
        created_at_ms: T0,
        updated_at_ms: T0,
        next_fire_at_ms: Some(due),
        runs: 0,
        fires: 0,
        last_fire_ms: None,
        last_slot_wall_ms: None,
        done_offsets_ms: Vec::new(),
        queued: Vec::new(),
        skipped: 0,
        expired: 0,
        watched_since_ms: T0,
        failed_reason: None,
        lang: Lang::En,
        recipient_zones: Vec::new(),
        quiet_hours: QuietSetting::Channel,
        notify: None,
        trace_id: None,
    };
    vec![
        Line::Task {
            task: Box::new(task),
        },
        Line::Message {
            task_id: id.into(),
            seq: 0,
            message: Message {
                to: format!("to-{id}"),
                body: "hello".into(),
                data: None,
                tz: None,
            },
        },
    ]
}

fn header_line() -> String {
    serde_json::to_string(&herald::backup::Line::Header {
        format: herald::backup::FORMAT.into(),
        version: herald::backup::VERSION,
        exported_at: "2027-01-15T08:00:00Z".into(),
    })
    .unwrap()
}

/// An export of `n` tasks, as text, with or without its end line.
fn export_text(n: usize, end: bool) -> String {
    let mut out = vec![header_line()];
    for i in 0..n {
        for l in task_lines(&format!("t{i:06}")) {
            out.push(serde_json::to_string(&l).unwrap());
        }
    }
    if end {
        let lines = out.len() as u64 + 1;
        out.push(
            serde_json::to_string(&herald::backup::Line::End {
                tasks: n as u64,
                lines,
            })
            .unwrap(),
        );
    }
    out.join("\n") + "\n"
}

/// Waits (with a deadline) for `child` to exit on its own; `None` if it is still running then
/// (it is killed).
fn exit_within(child: &mut std::process::Child, deadline: Duration) -> Option<i32> {
    let end = std::time::Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status.code().unwrap_or(-1));
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `herald import` killed halfway (its batches are durable as it goes) leaves its marker:
/// `herald serve` refuses the directory instead of running part of the backup, and so do
/// `herald export --data` and another import, each naming the marker and what to do.
/// `herald serve` on `dir` (and on the database `url`, if given): its exit code within 30 s
/// (`None`: still running, killed) and what it said on stderr.
fn serve_refusal(dir: &std::path::Path, url: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir)
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match url {
        Some(u) => cmd.env("HERALD_STORE_URL", u),
        None => cmd.env_remove("HERALD_STORE_URL"),
    };
    let mut serve = cmd.spawn().expect("spawn herald serve");
    let code = exit_within(&mut serve, Duration::from_secs(30));
    let mut said = String::new();
    std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut said).unwrap();
    (code, said)
}

/// `herald` with `args`, reading the lines from a pipe the test writes (and may leave open),
/// without the variable `unset` in its environment.
fn spawn_import(
    args: &[&str],
    unset: Option<&str>,
) -> (std::process::Child, std::process::ChildStdin) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(v) = unset {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().expect("spawn herald import");
    let input = child.stdin.take().expect("stdin");
    (child, input)
}

#[test]
fn an_import_killed_halfway_is_refused_by_serve_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("data");
    let text = export_text(3_000, false);
    let (mut importer, mut input) = spawn_import(&["import", "--data", data(&target)], None);
    // Once this is written, the importer has read all but what the pipe and its buffer hold
    // (tens of KB of ~2 MB): the batches before that are durable. No end line comes; stdin
    // stays open, so the importer waits for more.
    input.write_all(text.as_bytes()).expect("write the lines");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !target.join("db").exists() {
        assert!(std::time::Instant::now() < end, "the import wrote nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    importer.kill().expect("kill -9");
    importer.wait().expect("reap");
    drop(input);
    {
        let s = common::herald::reopen(|| herald::store::Store::open(&target));
        let tasks = s.task_ids().count();
        assert!(
            (1_000..3_000).contains(&tasks),
            "the killed import left part of the file: {tasks} tasks"
        );
    }

    let (code, said) = serve_refusal(&target, None);
    assert!(
        code.is_some_and(|c| c != 0),
        "herald serve ran a half-imported directory: {said}"
    );
    for must in ["IMPORT-INCOMPLETE", "unfinished import", "import again"] {
        assert!(said.contains(must), "{must}: {said}");
    }

    let o = herald(&["export", "--data", data(&target)], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IMPORT-INCOMPLETE"), "{}", stderr(&o));
    let o = herald(
        &["import", "--data", data(&target)],
        Some(export_text(1, true).as_bytes()),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IMPORT-INCOMPLETE"), "{}", stderr(&o));
    assert!(
        target.join("db").exists(),
        "a refused import removes nothing"
    );

    // Deleted and imported again, it is whole and unmarked.
    std::fs::remove_dir_all(&target).unwrap();
    let o = herald(
        &["import", "--data", data(&target)],
        Some(export_text(3, true).as_bytes()),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!target.join("IMPORT-INCOMPLETE").exists());
}

/// On PostgreSQL the mark is a row of `herald_meta`: an import killed halfway leaves it, and
/// `herald serve` and another import refuse the database, naming it.
#[test]
fn an_import_into_postgres_killed_halfway_is_refused_by_serve() {
    let Some(pg) = common::pg::PgServer::shared("an_import_into_postgres_killed_halfway") else {
        return;
    };
    let url = pg.create_db("halfway");
    let text = export_text(3_000, false);
    let (mut importer, mut input) =
        spawn_import(&["import", "--store-url", &url], Some("HERALD_STORE_URL"));
    input.write_all(text.as_bytes()).expect("write the lines");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while pg.psql(&url, "SELECT count(*) FROM herald_specs") == "0" {
        assert!(std::time::Instant::now() < end, "the import wrote nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    importer.kill().expect("kill -9");
    importer.wait().expect("reap");
    drop(input);

    let dir = tempfile::tempdir().unwrap();
    let (code, said) = serve_refusal(&dir.path().join("unused"), Some(&url));
    assert!(
        code.is_some_and(|c| c != 0),
        "herald serve ran a half-imported database: {said}"
    );
    assert!(said.contains("unfinished import"), "{said}");
    assert!(said.contains("import_unfinished"), "{said}");

    let o = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["import", "--store-url", &url])
        .env_remove("HERALD_STORE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unfinished import"), "{}", stderr(&o));

    // A whole import leaves no mark.
    let url2 = pg.create_db("whole");
    let file = dir.path().join("three.jsonl");
    std::fs::write(&file, export_text(3, true)).unwrap();
    let o = herald(
        &["import", "--store-url", &url2, "-f", file.to_str().unwrap()],
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        pg.psql(
            &url2,
            "SELECT count(*) FROM herald_meta WHERE name = 'import_unfinished'"
        ),
        "0"
    );
}

/// A field this build does not know (a newer herald's setting) is refused naming its line and
/// field, not dropped; a file from an older herald, without the fields added since (their
/// defaults), still imports.
#[test]
fn an_unknown_field_is_refused_and_a_missing_new_field_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    let o = herald(
        &["import", "--data", data(&source)],
        Some(export_text(3, true).as_bytes()),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = herald(&["export", "--data", data(&source)], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = lines(&o.stdout);
    let at = exported
        .iter()
        .position(|l| l["kind"] == "task" && l["task"]["id"] == "t000001")
        .expect("task t000001");
    let text = |ls: &[Value]| -> Vec<u8> {
        ls.iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes()
    };

    let mut newer = exported.clone();
    newer[at]["task"]["future_setting"] = json!(true);
    let target = dir.path().join("newer");
    let o = herald(&["import", "--data", data(&target)], Some(&text(&newer)));
    assert!(!o.status.success(), "an unknown field was dropped");
    let line = format!("line {}: unknown field task.future_setting", at + 1);
    assert!(stderr(&o).contains(&line), "{line}: {}", stderr(&o));
    assert!(!target.exists(), "nothing kept");

    // Nested, and on a line of another kind.
    let mut newer = exported.clone();
    newer[at + 1]["message"]["priority"] = json!("high");
    let o = herald(&["import", "--data", data(&target)], Some(&text(&newer)));
    let line = format!("line {}: unknown field message.priority", at + 2);
    assert!(stderr(&o).contains(&line), "{line}: {}", stderr(&o));

    // Written before `lang`, `recipient_zones`, `quiet_hours`, `notify`, `trace_id` and a
    // message's `tz` existed: their defaults.
    let mut older = exported.clone();
    for l in older.iter_mut() {
        if l["kind"] == "task" {
            let t = l["task"].as_object_mut().unwrap();
            for f in [
                "lang",
                "recipient_zones",
                "quiet_hours",
                "notify",
                "trace_id",
            ] {
                assert!(t.remove(f).is_some(), "{f}");
            }
        }
        if l["kind"] == "message" {
            l["message"].as_object_mut().unwrap().remove("tz");
        }
    }
    let o = herald(&["import", "--data", data(&target)], Some(&text(&older)));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = herald(&["export", "--data", data(&target)], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let back = lines(&o.stdout);
    assert_eq!(back.len(), exported.len());
    for (b, e) in back.iter().zip(&exported).skip(1) {
        assert_eq!(b, e, "read back with the defaults");
    }
}

/// Every record of every sled tree of `dir` (the `meta` tree's format among them), read with
/// sled alone: what a herald of any format would find.
fn sled_records(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let db = common::herald::reopen(|| sled::Config::new().path(dir).open());
    let mut out = Vec::new();
    for name in db.tree_names() {
        for kv in db.open_tree(&name).unwrap().iter() {
            let (k, v) = kv.unwrap();
            out.push((name.to_vec(), k.to_vec(), v.to_vec()));
        }
    }
    out
}

/// `herald export --data` of a directory an older herald wrote (format 6) does not migrate it
/// (an export before an upgrade is the way back): it is refused, saying what to do, and every
/// record is as it was, the format too.
#[test]
fn export_of_an_older_format_leaves_it_as_it_was() {
    let dir = common::fixture_copy("v6-data");
    let before = sled_records(common::fixture_copy("v6-data").path());
    let format = |rs: &[(Vec<u8>, Vec<u8>, Vec<u8>)]| {
        rs.iter()
            .find(|(t, k, _)| t == b"meta" && k == b"format")
            .map(|(_, _, v)| v.clone())
    };
    assert_eq!(format(&before), Some(vec![6]));
    let o = herald(&["export", "--data", data(dir.path())], None);
    assert!(!o.status.success(), "exported (after migrating it)");
    for must in ["format 6", "older herald", "herald serve"] {
        assert!(stderr(&o).contains(must), "{must}: {}", stderr(&o));
    }
    assert!(o.stdout.is_empty());
    let after = sled_records(dir.path());
    assert_eq!(format(&after), Some(vec![6]), "still format 6");
    assert!(after == before, "the records are as they were");
    assert!(
        !std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("wal-")),
        "no write-ahead log of this build's added"
    );
}

/// `herald export --data` of a directory a newer herald wrote (a format above this build's)
/// is refused before anything in it changes, saying so: opening it would replay its log and
/// add a segment, and the herald that wrote it would find its directory changed.
#[test]
fn export_of_a_newer_format_is_refused_and_leaves_it_as_it_was() {
    let dir = common::fixture_copy("v7-data");
    let newer = herald::store::DIR_FORMAT + 1;
    {
        let db = common::herald::reopen(|| sled::Config::new().path(dir.path()).open());
        db.open_tree("meta")
            .unwrap()
            .insert("format", &[newer])
            .unwrap();
        db.flush().unwrap();
    }
    let before = sled_records(dir.path());
    let o = herald(&["export", "--data", data(dir.path())], None);
    assert!(!o.status.success(), "exported a newer format");
    for must in [format!("format {newer}"), "newer herald".to_string()] {
        assert!(stderr(&o).contains(&must), "{must}: {}", stderr(&o));
    }
    assert!(o.stdout.is_empty());
    assert!(
        sled_records(dir.path()) == before,
        "the records are as they were"
    );
    assert!(
        !std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("wal-")),
        "no write-ahead log of this build's added"
    );
}

/// `herald export --data` of a format-7 directory (the checked-in fixture): format 8 only moved
/// the number, so it is exported as it is and left at format 7, every record as it was, for the
/// herald that wrote it to open again.
#[test]
fn export_of_format_7_reads_it_as_it_is() {
    let dir = common::fixture_copy("v7-data");
    let before = sled_records(dir.path());
    let format = |rs: &[(Vec<u8>, Vec<u8>, Vec<u8>)]| {
        rs.iter()
            .find(|(t, k, _)| t == b"meta" && k == b"format")
            .map(|(_, _, v)| v.clone())
    };
    assert_eq!(format(&before), Some(vec![7]));
    let o = herald(&["export", "--data", data(dir.path())], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let kinds: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"].to_string())
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("\"header\""));
    assert_eq!(kinds.last().map(String::as_str), Some("\"end\""));
    assert!(
        kinds.iter().filter(|k| k.as_str() == "\"task\"").count() >= 4,
        "{out}"
    );
    let after = sled_records(dir.path());
    assert_eq!(format(&after), Some(vec![7]), "still format 7");
}
