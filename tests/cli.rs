//! The `herald` CLI client, run as the real binary against a real herald (in-process server on
//! port 0, a real webhook receiver): output, `--json`, exit codes, one-line errors.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::{poll, wait_state, webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }

    fn ok(self) -> Out {
        assert_eq!(
            self.code, 0,
            "exit {}; stdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// A failure: non-zero exit, exactly one line on stderr, which is returned.
    fn fails(self) -> String {
        assert_ne!(self.code, 0, "expected a failure; stdout: {}", self.stdout);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr, got: {:?}", self.stderr);
        lines[0].to_string()
    }
}

/// Runs `herald ARGS` with `HERALD_URL=url` (and `HERALD_TOKEN` if given), feeding `stdin`;
/// kills it if it has not finished within `deadline`.
fn run_with(
    url: &str,
    token: Option<&str>,
    args: &[&str],
    stdin: Option<&str>,
    deadline: Duration,
) -> Out {
    run_in_env(url, token, args, stdin, deadline, &[])
}

/// [`run_with`] with `env` set. The locale is cleared first, so the CLI's texts are English
/// unless a test sets one.
fn run_in_env(
    url: &str,
    token: Option<&str>,
    args: &[&str],
    stdin: Option<&str>,
    deadline: Duration,
    env: &[(&str, &str)],
) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(args)
        .env("HERALD_URL", url)
        .env_remove("HERALD_TOKEN")
        .env_remove("LC_ALL")
        .env_remove("LC_MESSAGES")
        .env_remove("LANG")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("HERALD_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("spawn herald");
    if let Some(input) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(input.as_bytes()).expect("write stdin");
    }
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "herald {args:?} did not finish within {deadline:?}; stdout so far: {}",
                t_out.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        code: status.code().unwrap_or(-1),
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

async fn herald(url: &str, args: &[&str]) -> Out {
    herald_in(url, None, args, None).await
}

async fn herald_in(url: &str, token: Option<&str>, args: &[&str], stdin: Option<&str>) -> Out {
    let url = url.to_string();
    let token = token.map(str::to_string);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        run_with(
            &url,
            token.as_deref(),
            &a,
            stdin.as_deref(),
            Duration::from_secs(60),
        )
    })
    .await
    .expect("join")
}

fn task_file(dir: &std::path::Path, name: &str, v: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).expect("write task file");
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_show_runs_and_control_tasks() {
    let h = TestHerald::start("").await;
    let url = h.server.url();
    // create -f FILE
    let file = task_file(
        h.dir.path(),
        "cron.json",
        &json!({"id": "digest", "name": "Morning digest",
                "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai"},
                "to": ["a", "b"], "body": "Good morning"}),
    );
    let out = herald(&url, &["tasks", "create", "-f", &file]).await.ok();
    assert!(
        out.stdout
            .starts_with("created digest (pending): every weekday at 09:00 (Asia/Shanghai)"),
        "{}",
        out.stdout
    );
    // create -f - (standard input), with --json
    let body = json!({"id": "later", "schedule": {"after": "1h"}, "to": ["c"], "body": "x"});
    let out = herald_in(
        &url,
        None,
        &["tasks", "create", "-f", "-", "--json"],
        Some(&body.to_string()),
    )
    .await
    .ok();
    assert_eq!(out.json()["id"], "later");
    assert_eq!(out.json()["state"], "pending");

    // list: a table with the schedule in words and the next fire, relative
    let out = herald(&url, &["tasks", "list"]).await.ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("ID"), "{}", out.stdout);
    for h in ["STATE", "SCHEDULE", "NEXT FIRE", "PROGRESS"] {
        assert!(lines[0].contains(h), "header {h}: {}", lines[0]);
    }
    let digest = lines.iter().find(|l| l.starts_with("digest")).expect("row");
    assert!(
        digest.contains("pending") && digest.contains("every weekday at 09:00 (Asia/Shanghai)")
    );
    assert!(digest.contains("(in "), "relative next fire: {digest}");
    // NEXT FIRE says which zone its wall time is in: `2026-12-01 09:00:00 +08:00 (in 5m)`.
    let label = digest
        .split(" (in ")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .unwrap_or("");
    assert!(
        label == "UTC" || (label.len() == 6 && (label.starts_with('+') || label.starts_with('-'))),
        "zone label on NEXT FIRE, got {label:?}: {digest}"
    );
    let later = lines.iter().find(|l| l.starts_with("later")).expect("row");
    assert!(
        later.contains("(in 59m") || later.contains("(in 1h"),
        "{later}"
    );
    // list --json, filters and paging
    let v = herald(&url, &["tasks", "list", "--json", "--limit", "1"])
        .await
        .ok()
        .json();
    assert_eq!(v["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(v["tasks"][0]["id"], "digest");
    assert_eq!(v["next"], "digest");
    let v = herald(&url, &["tasks", "list", "--json", "--after", "digest"])
        .await
        .ok()
        .json();
    assert_eq!(v["tasks"][0]["id"], "later");
    let v = herald(&url, &["tasks", "list", "--json", "--state", "paused"])
        .await
        .ok()
        .json();
    assert_eq!(v["tasks"], json!([]));
    let out = herald(&url, &["tasks", "list", "--channel", "nope"])
        .await
        .ok();
    assert_eq!(out.stdout.trim(), "no tasks");

    // show
    let out = herald(&url, &["tasks", "show", "digest"]).await.ok();
    assert!(
        out.stdout.contains("name:       Morning digest"),
        "{}",
        out.stdout
    );
    assert!(out
        .stdout
        .contains("schedule:   every weekday at 09:00 (Asia/Shanghai)"));
    // The next fire also in the schedule's own zone, labelled.
    assert!(
        out.stdout.contains(" 09:00:00 CST in Asia/Shanghai"),
        "{}",
        out.stdout
    );
    let v = herald(&url, &["tasks", "show", "digest", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(v["messages"], 2);

    // pause / resume / trigger / cancel, each checked through the API
    let out = herald(&url, &["tasks", "pause", "digest"]).await.ok();
    assert!(
        out.stdout.starts_with("paused digest: state paused"),
        "{}",
        out.stdout
    );
    assert_eq!(
        http::get(&h.url("/v1/tasks/digest")).await.json()["state"],
        "paused"
    );
    // resuming twice: the second is a 409, one line, non-zero
    herald(&url, &["tasks", "resume", "digest"]).await.ok();
    let err = herald(&url, &["tasks", "resume", "digest"]).await.fails();
    assert!(
        err.starts_with("herald: POST /v1/tasks/digest/resume: HTTP 409:"),
        "{err}"
    );
    let v = herald(&url, &["tasks", "trigger", "digest", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(v["runs"], 1);
    wait_state(&url, "digest", "pending", Duration::from_secs(10)).await;
    let v = herald(&url, &["tasks", "runs", "digest", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(v["runs"][0]["state"], "completed");
    assert_eq!(v["runs"][0]["sent"], 2);
    let out = herald(&url, &["tasks", "runs", "digest"]).await.ok();
    assert!(
        out.stdout
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("1    completed"),
        "{}",
        out.stdout
    );
    let out = herald(&url, &["tasks", "cancel", "later"]).await.ok();
    assert!(out.stdout.starts_with("cancelled later: state cancelled"));
    assert_eq!(
        http::get(&h.url("/v1/tasks/later")).await.json()["state"],
        "cancelled"
    );
    // delete does what the API's DELETE does: an unfinished task is cancelled (it stays
    // readable), a finished one is deleted (404 afterwards).
    let out = herald(&url, &["tasks", "delete", "later"]).await.ok();
    assert!(
        out.stdout.starts_with("deleted later (it was cancelled)"),
        "{}",
        out.stdout
    );
    assert_eq!(http::get(&h.url("/v1/tasks/later")).await.status, 404);
    let out = herald(&url, &["tasks", "delete", "digest"]).await.ok();
    assert!(
        out.stdout.starts_with("cancelled digest (it was pending;"),
        "{}",
        out.stdout
    );
    assert_eq!(
        http::get(&h.url("/v1/tasks/digest")).await.json()["state"],
        "cancelled",
        "DELETE of an unfinished task cancels it, as the API's does"
    );
    let out = herald(&url, &["tasks", "delete", "digest"]).await.ok();
    assert!(
        out.stdout.starts_with("deleted digest (it was cancelled)"),
        "{}",
        out.stdout
    );
    assert_eq!(http::get(&h.url("/v1/tasks/digest")).await.status, 404);

    // errors: unknown task (404), bad request (422 naming the field), bad file
    let err = herald(&url, &["tasks", "show", "nope"]).await.fails();
    assert!(err.contains("HTTP 404") && err.contains("nope"), "{err}");
    let bad = task_file(
        h.dir.path(),
        "bad.json",
        &json!({"schedule": {"cron": "0 9 *"}, "to": ["a"], "body": "x"}),
    );
    let err = herald(&url, &["tasks", "create", "-f", &bad]).await.fails();
    assert!(
        err.contains("HTTP 422: schedule.cron: expected 5 or 6 fields, got 3"),
        "{err}"
    );
    let err = herald(&url, &["tasks", "create", "-f", "/nonexistent/task.json"])
        .await
        .fails();
    assert!(err.starts_with("herald: /nonexistent/task.json:"), "{err}");
    let err = herald_in(
        &url,
        None,
        &["tasks", "create", "-f", "-"],
        Some("{not json"),
    )
    .await
    .fails();
    assert!(err.contains("not JSON"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_a_paced_sequence_to_the_end() {
    let h = TestHerald::start("").await;
    let url = h.server.url();
    let n = 8;
    let to: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "seq", "schedule": {"after": "300ms"}, "pacing": {"interval": "100ms"},
                "to": to, "body": "hi"}),
    )
    .await;
    // --json: one line per event; progress only moves forward and ends at the total.
    let out = herald(&url, &["tasks", "watch", "seq", "--json"])
        .await
        .ok();
    let events: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events[0]["event"], "ready", "{}", out.stdout);
    let progress: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "progress")
        .map(|e| &e["data"])
        .collect();
    assert!(progress.len() >= 2, "{}", out.stdout);
    let done: Vec<u64> = progress
        .iter()
        .map(|p| p["sent"].as_u64().unwrap() + p["failed"].as_u64().unwrap())
        .collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    let last = progress.last().unwrap();
    assert_eq!(
        (
            &last["sent"],
            &last["total"],
            &last["state"],
            &last["task_state"]
        ),
        (
            &json!(n),
            &json!(n),
            &json!("completed"),
            &json!("completed")
        )
    );
    // The task really is done when watch returns.
    assert_eq!(
        http::get(&h.url("/v1/tasks/seq")).await.json()["state"],
        "completed"
    );
    // Watching a finished task shows it and returns at once.
    let out = herald(&url, &["tasks", "watch", "seq"]).await.ok();
    assert!(
        out.stdout.contains("state:      completed"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "progress:   [####################] run 1: 8 sent, 0 failed, 0 in flight of 8"
        ),
        "{}",
        out.stdout
    );

    // Human output: started, then the summary line.
    http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "seq2", "schedule": {"after": "300ms"}, "pacing": {"interval": "50ms"},
                "to": ["a", "b", "c"], "body": "hi"}),
    )
    .await;
    let out = herald(&url, &["tasks", "watch", "seq2"]).await.ok();
    assert!(
        out.stdout
            .contains("seq2 run 1: completed, 3 sent, 0 failed of 3"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_list_retry_dismiss_and_channels() {
    let rx = Receiver::start().await;
    // Message 0 of each task is refused once (400: permanent), then accepted.
    rx.script_key("f1:1:0", vec![Behavior::Status(400)]);
    rx.script_key("f2:1:0", vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let url = h.server.url();
    for id in ["f1", "f2"] {
        http::post_json(
            &h.url("/v1/tasks"),
            &json!({"id": id, "channel": "hook", "schedule": {"after": "0s"},
                    "to": ["x", "y"], "body": "hi"}),
        )
        .await;
        wait_state(&url, id, "completed", Duration::from_secs(10)).await;
    }
    let v = herald(&url, &["failures", "list", "--json"])
        .await
        .ok()
        .json();
    let ids: Vec<&str> = v["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["f1:1:0", "f2:1:0"]);
    let out = herald(&url, &["failures", "list", "--task", "f1"])
        .await
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(
        lines[1].starts_with("f1:1:0") && lines[1].contains("HTTP 400"),
        "{}",
        lines[1]
    );

    // retry: delivered this time, and gone from the list
    let out = herald(&url, &["failures", "retry", "f1:1:0"]).await.ok();
    assert_eq!(out.stdout.trim(), "retrying f1:1:0 (to x)");
    poll(Duration::from_secs(10), || async {
        let v = http::get(&h.url("/v1/failures?task=f1")).await.json();
        v["failures"].as_array().unwrap().is_empty().then_some(())
    })
    .await
    .expect("the retried failure leaves the list");
    let keys: Vec<String> = rx
        .requests()
        .iter()
        .filter_map(|r| r.idempotency_key().map(str::to_string))
        .filter(|k| k == "f1:1:0")
        .collect();
    assert_eq!(keys.len(), 2, "sent twice with the same key");

    // dismiss
    let out = herald(&url, &["failures", "dismiss", "f2:1:0", "--json"])
        .await
        .ok();
    assert_eq!(out.json()["id"], "f2:1:0");
    let out = herald(&url, &["failures", "list"]).await.ok();
    assert_eq!(out.stdout.trim(), "no failures");
    let err = herald(&url, &["failures", "dismiss", "f2:1:0"])
        .await
        .fails();
    assert!(err.contains("HTTP 404"), "{err}");

    // channels
    let v = herald(&url, &["channels", "--json"]).await.ok().json();
    let names: Vec<&str> = v["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"hook") && names.contains(&"log"),
        "{names:?}"
    );
    let out = herald(&url, &["channels"]).await.ok();
    let hook = out
        .stdout
        .lines()
        .find(|l| l.starts_with("hook"))
        .expect("hook row");
    let cells: Vec<&str> = hook.split_whitespace().collect();
    // NAME KIND BREAKER SUCCESS RATE IN-FLIGHT SENT FAILED HELD: 3 sent (f1:1:1, f2:1:1, retry), 2 failed
    assert_eq!(cells[0..2], ["hook", "webhook"], "{hook}");
    assert_eq!(cells[6..8], ["3", "2"], "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_server_and_the_token() {
    // Nothing listens on port 1: the error names the URL.
    let err = herald("http://127.0.0.1:1", &["tasks", "list"])
        .await
        .fails();
    assert!(
        err.starts_with("herald: cannot reach herald at http://127.0.0.1:1:"),
        "{err}"
    );
    let err = herald("not a url", &["channels"]).await.fails();
    assert!(
        err.contains("not a URL") || err.contains("expected http"),
        "{err}"
    );

    let h = TestHerald::start_with_token("", "s3cret").await;
    let url = h.server.url();
    let err = herald(&url, &["tasks", "list"]).await.fails();
    assert!(
        err.contains("HTTP 401") && err.contains("set HERALD_TOKEN"),
        "{err}"
    );
    let err = herald_in(&url, Some("wrong"), &["tasks", "list"], None)
        .await
        .fails();
    assert!(
        err.contains("HTTP 401") && err.contains("check HERALD_TOKEN"),
        "{err}"
    );
    let v = herald_in(&url, Some("s3cret"), &["tasks", "list", "--json"], None)
        .await
        .ok()
        .json();
    assert_eq!(v["tasks"], json!([]));
    // --url beats HERALD_URL.
    let out = herald_in(
        "http://127.0.0.1:1",
        Some("s3cret"),
        &["channels", "--url", &url],
        None,
    )
    .await
    .ok();
    assert!(out.stdout.starts_with("NAME"), "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_for_three_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let out = herald("http://127.0.0.1:1", &["completions", shell])
            .await
            .ok();
        for word in ["tasks", "failures", "watch", "completions"] {
            assert!(out.stdout.contains(word), "{shell}: {word}");
        }
    }
    let out = herald("http://127.0.0.1:1", &["completions", "tcsh"]).await;
    assert_ne!(out.code, 0);
}

/// `herald ARGS` with standard output a pipe whose reader has already gone: every write
/// fails with EPIPE, deterministically (a `| head -1` only does when the writer outlasts it).
fn run_into_closed_pipe(url: &str, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env("HERALD_URL", url)
        .env_remove("HERALD_TOKEN")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run herald");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_every_command_quietly_with_status_0() {
    // What the issue saw: `herald completions zsh | head -1` panicked with exit 101.
    let shell = Command::new("bash")
        .args([
            "-o",
            "pipefail",
            "-c",
            "\"$0\" completions zsh | head -1",
            env!("CARGO_BIN_EXE_herald"),
        ])
        .output()
        .expect("bash");
    assert!(
        shell.status.success(),
        "herald completions zsh | head -1: {:?}, stderr: {}",
        shell.status,
        String::from_utf8_lossy(&shell.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&shell.stdout).lines().count(), 1);
    assert!(
        shell.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&shell.stderr)
    );

    let h = TestHerald::start("").await;
    let url = h.server.url();
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "t", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    let commands: &[&[&str]] = &[
        &["completions", "zsh"],
        &["completions", "bash"],
        &["--help"],
        &["tasks", "list"],
        &["tasks", "list", "--json"],
        &["tasks", "show", "t"],
        &["tasks", "runs", "t"],
        &["failures", "list"],
        &["channels"],
        &["next", "0 9 * * *", "-n", "50"],
        &["export", "--url", url.as_str()],
    ];
    for args in commands {
        let (code, stderr) = tokio::task::block_in_place(|| run_into_closed_pipe(&url, args));
        assert_eq!(
            code,
            Some(0),
            "herald {args:?} into a closed pipe; stderr: {stderr}"
        );
        assert!(
            stderr.is_empty(),
            "herald {args:?}: nothing on stderr, got: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tasks_run_reads_paused() {
    let h = TestHerald::start("").await;
    let url = h.server.url();
    // A sequence that sends its first message at once and the next an hour later.
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "slow", "schedule": {"after": "0s"}, "to": ["a", "b", "c"], "body": "x",
                "pacing": {"interval": "1h"}}),
    )
    .await;
    assert_eq!(r.status, 201);
    poll(Duration::from_secs(10), || async {
        let v = http::get(&h.url("/v1/tasks/slow")).await.json();
        (v["state"] == "running" && v["progress"]["sent"] == 1).then_some(())
    })
    .await
    .expect("the first message sent, the run waiting an hour for the next");
    herald(&url, &["tasks", "pause", "slow"]).await.ok();
    let out = herald(&url, &["tasks", "runs", "slow"]).await.ok();
    let row = out.stdout.lines().nth(1).unwrap_or("");
    assert!(row.starts_with("1    paused"), "{}", out.stdout);
    let out = herald(&url, &["tasks", "show", "slow"]).await.ok();
    assert!(
        out.stdout.contains("run 1 (paused): 1 sent"),
        "{}",
        out.stdout
    );
    // --json stays the API's answer.
    let v = herald(&url, &["tasks", "runs", "slow", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(v["runs"][0]["state"], "running");
    herald(&url, &["tasks", "resume", "slow"]).await.ok();
    let out = herald(&url, &["tasks", "runs", "slow"]).await.ok();
    let row = out.stdout.lines().nth(1).unwrap_or("");
    assert!(row.starts_with("1    running"), "{}", out.stdout);
}

// ---- herald next: offline, against instants computed by hand from UTC offsets -------------

fn next_json(args: &[&str]) -> Value {
    run_with(
        "http://127.0.0.1:1",
        None,
        &[&["next", "--json"], args].concat(),
        None,
        Duration::from_secs(30),
    )
    .ok()
    .json()
}

fn fires(v: &Value) -> Vec<(String, String)> {
    v["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["at"].as_str().unwrap().to_string(),
                f["local"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn next_applies_new_york_dst_gap_and_repeat() {
    // 2027: DST starts Sunday 14 March 02:00 EST (-05:00) -> 03:00 EDT (-04:00); it ends Sunday
    // 7 November 02:00 EDT -> 01:00 EST. 02:30 on 14 March does not exist; 01:30 on 7 November
    // happens twice.
    let v = next_json(&[
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "-n",
        "3",
        "--from",
        "2027-03-13T00:00:00Z",
    ]);
    assert_eq!(v["description"], "every day at 02:30 (America/New_York)");
    assert_eq!(
        fires(&v),
        [
            (
                "2027-03-13T07:30:00Z".into(),
                "2027-03-13T02:30:00-05:00".into()
            ),
            // shift (default): the first valid instant after the gap, 03:00 EDT
            (
                "2027-03-14T07:00:00Z".into(),
                "2027-03-14T03:00:00-04:00".into()
            ),
            (
                "2027-03-15T06:30:00Z".into(),
                "2027-03-15T02:30:00-04:00".into()
            ),
        ]
    );
    let v = next_json(&[
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "-n",
        "2",
        "--gap",
        "skip",
        "--from",
        "2027-03-13T00:00:00Z",
    ]);
    let at: Vec<String> = fires(&v).into_iter().map(|f| f.0).collect();
    assert_eq!(at, ["2027-03-13T07:30:00Z", "2027-03-15T06:30:00Z"]);

    let repeat = |policy: &str| {
        let v = next_json(&[
            "30 1 * * *",
            "--tz",
            "America/New_York",
            "-n",
            "3",
            "--repeat",
            policy,
            "--from",
            "2027-11-06T12:00:00Z",
        ]);
        fires(&v).into_iter().map(|f| f.0).collect::<Vec<_>>()
    };
    // 01:30 EDT = 05:30Z, 01:30 EST = 06:30Z; the next day 01:30 EST = 06:30Z.
    assert_eq!(
        repeat("first"),
        [
            "2027-11-07T05:30:00Z",
            "2027-11-08T06:30:00Z",
            "2027-11-09T06:30:00Z"
        ]
    );
    assert_eq!(
        repeat("last"),
        [
            "2027-11-07T06:30:00Z",
            "2027-11-08T06:30:00Z",
            "2027-11-09T06:30:00Z"
        ]
    );
    assert_eq!(
        repeat("both"),
        [
            "2027-11-07T05:30:00Z",
            "2027-11-07T06:30:00Z",
            "2027-11-08T06:30:00Z"
        ]
    );
    // A one-shot local time in the gap, with --at.
    let v = next_json(&[
        "--at",
        "2027-03-14T02:30:00",
        "--tz",
        "America/New_York",
        "--from",
        "2027-01-01T00:00:00Z",
    ]);
    assert_eq!(
        fires(&v),
        [(
            "2027-03-14T07:00:00Z".into(),
            "2027-03-14T03:00:00-04:00".into()
        )]
    );
}

#[test]
fn next_in_lord_howe_with_its_half_hour_shift() {
    // Australia/Lord_Howe: +10:30 standard, +11:00 in summer, a 30-minute change. 2027: summer
    // time ends Sunday 4 April 02:00 (+11) -> 01:30 (+10:30), so 01:45 happens twice; it starts
    // Sunday 3 October 02:00 (+10:30) -> 02:30 (+11), so 02:15 does not exist.
    let v = next_json(&[
        "45 1 * * *",
        "--tz",
        "Australia/Lord_Howe",
        "-n",
        "3",
        "--repeat",
        "both",
        "--from",
        "2027-04-03T00:00:00Z",
    ]);
    assert_eq!(
        fires(&v),
        [
            (
                "2027-04-03T14:45:00Z".into(),
                "2027-04-04T01:45:00+11:00".into()
            ),
            (
                "2027-04-03T15:15:00Z".into(),
                "2027-04-04T01:45:00+10:30".into()
            ),
            (
                "2027-04-04T15:15:00Z".into(),
                "2027-04-05T01:45:00+10:30".into()
            ),
        ]
    );
    let v = next_json(&[
        "15 2 * * *",
        "--tz",
        "Australia/Lord_Howe",
        "-n",
        "3",
        "--from",
        "2027-10-01T00:00:00Z",
    ]);
    assert_eq!(
        fires(&v),
        [
            (
                "2027-10-01T15:45:00Z".into(),
                "2027-10-02T02:15:00+10:30".into()
            ),
            // 02:15 is in the gap: shifted to the transition, 02:00 +10:30 = 02:30 +11:00
            (
                "2027-10-02T15:30:00Z".into(),
                "2027-10-03T02:30:00+11:00".into()
            ),
            (
                "2027-10-03T15:15:00Z".into(),
                "2027-10-04T02:15:00+11:00".into()
            ),
        ]
    );
}

#[test]
fn next_prints_a_table_and_refuses_bad_input_in_one_line() {
    let out = run_with(
        "http://127.0.0.1:1",
        None,
        &[
            "next",
            "0 9 * * 1-5",
            "--tz",
            "Asia/Shanghai",
            "-n",
            "2",
            "--from",
            "2027-01-01T00:00:00Z",
        ],
        None,
        Duration::from_secs(30),
    )
    .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "every weekday at 09:00 (Asia/Shanghai)");
    assert!(lines[1].contains("UTC") && lines[1].contains("Asia/Shanghai"));
    // 2027-01-01 is a Friday: 09:00 +08:00 = 01:00Z, then Monday the 4th.
    assert!(
        lines[2].contains("2027-01-01T01:00:00Z")
            && lines[2].contains("2027-01-01 09:00:00 CST (+08:00)"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains("2027-01-04T01:00:00Z"), "{}", lines[3]);

    for (args, expect) in [
        (
            vec!["next", "0 9 *"],
            "herald: CRON: expected 5 or 6 fields, got 3",
        ),
        (
            vec!["next", "0 9 * * *", "--tz", "Mars/Base"],
            "herald: --tz: unknown time zone",
        ),
        (
            vec!["next", "0 9 * * *", "-n", "0"],
            "herald: -n: must be 1 to 100",
        ),
        (
            vec!["next", "0 9 * * *", "--gap", "later"],
            "herald: --gap: unknown value",
        ),
    ] {
        let err = run_with(
            "http://127.0.0.1:1",
            None,
            &args,
            None,
            Duration::from_secs(30),
        )
        .fails();
        assert!(err.starts_with(expect), "{args:?}: {err}");
    }
}

// ---- languages: --lang, the locale, Accept-Language ------------------------------------------

#[test]
fn next_speaks_the_language_of_lang_or_the_locale() {
    let next = |extra: &[&str], env: &[(&str, &str)]| {
        let args = [
            &[
                "next",
                "0 9 * * 1-5",
                "--tz",
                "Asia/Shanghai",
                "-n",
                "2",
                "--from",
                "2027-01-01T00:00:00Z",
            ][..],
            extra,
        ]
        .concat();
        run_in_env(
            "http://127.0.0.1:1",
            None,
            &args,
            None,
            Duration::from_secs(30),
            env,
        )
        .ok()
    };
    let first = |o: Out| o.stdout.lines().next().unwrap_or("").to_string();
    let zh = "每个工作日 09:00（Asia/Shanghai）";
    let en = "every weekday at 09:00 (Asia/Shanghai)";
    assert_eq!(first(next(&["--lang", "zh"], &[])), zh);
    assert_eq!(first(next(&[], &[("LANG", "zh_CN.UTF-8")])), zh);
    assert_eq!(
        first(next(
            &[],
            &[("LANG", "en_US.UTF-8"), ("LC_ALL", "zh_CN.UTF-8")]
        )),
        zh
    );
    assert_eq!(
        first(next(&["--lang", "en"], &[("LANG", "zh_CN.UTF-8")])),
        en
    );
    assert_eq!(first(next(&[], &[("LANG", "fr_FR.UTF-8")])), en);
    // JSON: the preview's shape, with each fire relative to --from. 2027-01-01 08:00 in Shanghai
    // is a Friday; Monday the 4th is in the next week.
    let v = next(&["--json"], &[("LC_ALL", "zh_CN.UTF-8")]).json();
    assert_eq!(v["description"], zh);
    assert_eq!(v["fires"][0]["human"], "今天上午 9:00（Asia/Shanghai）");
    assert_eq!(v["fires"][1]["human"], "下周一上午 9:00（Asia/Shanghai）");
    let v = next(&["--json"], &[]).json();
    assert_eq!(v["fires"][0]["human"], "today at 09:00 (Asia/Shanghai)");
    assert_eq!(v["fires"][1]["human"], "on Monday at 09:00 (Asia/Shanghai)");
    let err = run_with(
        "http://127.0.0.1:1",
        None,
        &["next", "0 9 * * *", "--lang", "fr"],
        None,
        Duration::from_secs(30),
    )
    .fails();
    assert_eq!(
        err,
        "herald: --lang: unknown language \"fr\"; expected en or zh"
    );
}

#[tokio::test]
async fn task_commands_ask_herald_for_the_language() {
    let h = TestHerald::start("").await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "wd", "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai"},
                "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let url = h.server.url();
    let run = |args: Vec<&'static str>, env: Vec<(&'static str, &'static str)>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            run_in_env(&url, None, &args, None, Duration::from_secs(60), &env).ok()
        })
    };
    let zh = "每个工作日 09:00（Asia/Shanghai）";
    let v = run(
        vec!["tasks", "show", "wd", "--json", "--lang", "zh"],
        vec![],
    )
    .await
    .unwrap()
    .json();
    assert_eq!(v["description"], zh);
    let v = run(
        vec!["tasks", "show", "wd", "--json"],
        vec![("LANG", "zh_CN.UTF-8")],
    )
    .await
    .unwrap()
    .json();
    assert_eq!(v["description"], zh);
    assert!(
        v["next_fire_human"]
            .as_str()
            .is_some_and(|s| s.ends_with("9:00（Asia/Shanghai）")),
        "{v}"
    );
    let out = run(vec!["tasks", "list", "--lang", "zh"], vec![])
        .await
        .unwrap();
    assert!(out.stdout.contains(zh), "{}", out.stdout);
    let v = run(vec!["tasks", "show", "wd", "--json"], vec![])
        .await
        .unwrap()
        .json();
    assert_eq!(v["description"], "every weekday at 09:00 (Asia/Shanghai)");
}

/// A `HERALD_LOG` that is not a filter is refused in one line, as a bad `HERALD_LOG_FORMAT`
/// is: before, it was taken for unset and herald ran at `info`, silently.
#[test]
fn serve_refuses_a_log_filter_that_does_not_parse() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
    ];
    let deadline = Duration::from_secs(20);
    for (var, value) in [
        ("HERALD_LOG", "herald=loud"),
        ("HERALD_LOG", "[unclosed"),
        ("HERALD_LOG_FORMAT", "xml"),
    ] {
        let out = run_in_env("", None, &serve, None, deadline, &[(var, value)]);
        assert_eq!(out.code, 1, "{var}={value:?}: {}", out.stderr);
        let line = out.fails();
        assert!(
            line.starts_with(&format!("herald: {var}: ")),
            "{var}={value:?}: {line}"
        );
    }
}

/// `herald tasks reschedule` PATCHes the schedule to an `at`: for a one-shot a new time, for a
/// cron a different task. Review finding: a cron was turned into a one-shot without a word. It
/// reads the task first and refuses (one line, non-zero exit, nothing changed) unless --force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_refuses_a_cron_unless_forced() {
    let h = TestHerald::start("").await;
    let url = h.server.url();
    for body in [
        json!({"id": "daily", "schedule": {"cron": "0 9 * * *"}, "to": ["a"], "body": "x"}),
        json!({"id": "once", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    ] {
        let r = http::post_json(&h.url("/v1/tasks"), &body).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let at = "2030-12-02T09:00:00Z";
    let err = herald(&url, &["tasks", "reschedule", "daily", "--at", at])
        .await
        .fails();
    assert!(err.contains("cron") && err.contains("--force"), "{err}");
    let v = http::get(&h.url("/v1/tasks/daily")).await.json();
    assert_eq!(v["schedule"]["cron"], "0 9 * * *", "unchanged: {v}");
    // A one-shot takes its new time as before.
    let out = herald(&url, &["tasks", "reschedule", "once", "--at", at])
        .await
        .ok();
    assert!(out.stdout.starts_with("rescheduled once"), "{}", out.stdout);
    let v = http::get(&h.url("/v1/tasks/once")).await.json();
    assert_eq!(v["next_fire_at"], at, "{v}");
    // --force does what it says.
    herald(
        &url,
        &["tasks", "reschedule", "daily", "--at", at, "--force"],
    )
    .await
    .ok();
    let v = http::get(&h.url("/v1/tasks/daily")).await.json();
    assert!(
        v["schedule"]["at"] == at && v["schedule"]["cron"].is_null(),
        "{v}"
    );
    // The help says what each command does (delete cancels an unfinished task).
    let help = herald(&url, &["tasks", "reschedule", "--help"]).await.ok();
    assert!(help.stdout.contains("--force"), "{}", help.stdout);
    let help = herald(&url, &["tasks", "delete", "--help"]).await.ok();
    assert!(
        help.stdout.contains("cancelled instead") && !help.stdout.contains("cancelled first"),
        "{}",
        help.stdout
    );
}

/// `herald cluster` against a stand-in for a node's `GET /v1/cluster`: the header line, then
/// each table starting on a line of its own. Review finding: the header had no newline, so
/// the node table's header ran on after it (`... read 2026-...)NODE  LIVE ...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_prints_its_header_on_a_line_of_its_own() {
    let view = json!({"shards": 2, "shards_total": 2, "shards_owned": 1, "node_id": "a",
        "clock_offset_ms": 3, "read_at": "2026-12-01T00:00:00Z", "epochs": {"0": 1, "1": 1},
        "nodes": [{"node_id": "a", "incarnation": "i1", "advertise": "http://a", "shards": [0],
                   "heartbeat_at": "2026-12-01T00:00:00Z", "clock_offset_ms": 3, "live": true,
                   "shards_owned": 1}],
        "leases": [{"shard": 0, "epoch": 1, "owner_node": "a", "lease_expires": null, "free": false},
                   {"shard": 1, "epoch": 1, "owner_node": null, "lease_expires": null, "free": true}]});
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = view.to_string();
    // Answers every connection with the view, until the test ends.
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = herald(&url, &["cluster"]).await.ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("node a holds 1 of 2 shards")
                && l.ends_with("read 2026-12-01T00:00:00Z)")),
        "{}",
        out.stdout
    );
    assert!(
        lines.get(1).is_some_and(|l| l.starts_with("NODE")),
        "{}",
        out.stdout
    );
    assert!(
        lines.iter().any(|l| l.starts_with("SHARD")),
        "{}",
        out.stdout
    );
}

/// A request as a fake herald saw it: method, path (with query) and body.
struct Req {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// Reads one request (head and a `content-length` body) off `conn`; `None` if it ends first.
fn read_request(conn: &mut std::net::TcpStream) -> Option<Req> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut words = head.split_whitespace();
    let method = words.next()?.to_string();
    let path = words.next()?.to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).ok()?;
    Some(Req { method, path, body })
}

/// A fake herald on loopback: each connection on a thread of its own, its first request read
/// and handed to `answer` with the connection (which answers, or not). Runs until the test ends.
fn fake_herald(answer: impl Fn(Req, std::net::TcpStream) + Send + Sync + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let answer = answer.clone();
            std::thread::spawn(move || {
                if let Some(req) = read_request(&mut conn) {
                    answer(req, conn);
                }
            });
        }
    });
    url
}

/// Writes a whole answer with `connection: close`.
fn answer(conn: &mut std::net::TcpStream, status: &str, content_type: &str, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `herald tasks watch T` through a node that does not own T (cluster mode: its event stream
/// carries `ready` and keep-alives, never T's events): the watch reads T again when no event
/// came for a while (shortened by the test knob) and ends once T is completed. Before, the
/// keep-alives kept it waiting for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_through_a_node_without_the_tasks_events_ends_with_the_task() {
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = reads.clone();
    let url = fake_herald(move |req, mut conn| {
        if req.path.starts_with("/v1/events") {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            );
            let mut chunk = |s: &str| write!(conn, "{:x}\r\n{s}\r\n", s.len()).is_ok();
            if !chunk("event: ready\ndata: {\"now\":\"2026-12-01T00:00:00Z\"}\n\n") {
                return;
            }
            // Only keep-alives from now on, faster than the CLI's idle limit.
            while chunk(": keep-alive\n\n") {
                std::thread::sleep(Duration::from_millis(100));
            }
        } else if req.path == "/v1/tasks/T" {
            // Running at the first read (the bar opens), completed at every later one.
            let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let (state, sent) = if first {
                ("running", 1)
            } else {
                ("completed", 3)
            };
            let view = json!({"id": "T", "state": state, "channel": "log", "runs": 1,
                "next_fire_at": null, "progress": {"run": 1, "state": state, "total": 3,
                "sent": sent, "failed": 0, "in_flight": 0}});
            answer(&mut conn, "200 OK", "application/json", &view.to_string());
        } else {
            answer(&mut conn, "404 Not Found", "application/json", "{}");
        }
    });
    let out = tokio::task::spawn_blocking(move || {
        run_in_env(
            &url,
            None,
            &["tasks", "watch", "T"],
            None,
            Duration::from_secs(30),
            &[("HERALD_TEST_WATCH_REFRESH_MS", "300")],
        )
    })
    .await
    .unwrap()
    .ok();
    assert!(out.stdout.contains("T is completed"), "{}", out.stdout);
    assert!(reads.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

/// An empty or malformed task id is refused by the argument parser (exit 2, naming the
/// argument) before any request: before, `tasks show ""` asked for `/v1/tasks/`, the list,
/// printed it as a task's detail and exited 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_malformed_id_is_refused_naming_the_argument() {
    let h = TestHerald::start("").await;
    let url = h.server.url();
    let long_failure = format!("{}:1:0", "a".repeat(150));
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (vec!["tasks", "show", ""], "<ID>", "must not be empty"),
        (vec!["tasks", "watch", ""], "<ID>", "must not be empty"),
        (vec!["tasks", "delete", ""], "<ID>", "must not be empty"),
        (vec!["tasks", "cancel", "a/b"], "<ID>", "'/' is not allowed"),
        (vec!["tasks", "runs", ""], "<ID>", "must not be empty"),
        (vec!["failures", "dismiss", ""], "<ID>", "must not be empty"),
        (
            vec!["failures", "retry", &long_failure],
            "<ID>",
            "at most 150 characters",
        ),
        (
            vec!["failures", "list", "--task", ""],
            "--task",
            "must not be empty",
        ),
        (
            vec!["tasks", "list", "--after", ""],
            "--after",
            "must not be empty",
        ),
    ];
    for (args, names, says) in cases {
        let out = herald(&url, &args).await;
        assert_eq!(
            out.code, 2,
            "{args:?}: stdout {}\nstderr {}",
            out.stdout, out.stderr
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        assert!(
            out.stderr.contains(names) && out.stderr.contains(says),
            "{args:?}: {}",
            out.stderr
        );
    }
}

/// A change whose answer never came (herald read the request and the connection closed) is
/// not "cannot reach herald", which invites a re-run that creates or triggers twice: its
/// outcome is unknown and the error says how to check. Nothing listening is still "cannot
/// reach".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_an_answer_is_reported_as_unknown_not_unreachable() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    // Reads each request whole, then closes without a word.
    let url = fake_herald(move |req, conn| {
        let body = String::from_utf8_lossy(&req.body).to_string();
        log.lock()
            .unwrap()
            .push((format!("{} {}", req.method, req.path), body));
        drop(conn);
    });
    let dir = tempfile::tempdir().unwrap();
    let file = task_file(
        dir.path(),
        "t.json",
        &json!({"id": "t", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    );
    for args in [
        vec!["tasks", "create", "-f", file.as_str()],
        vec!["tasks", "trigger", "t"],
    ] {
        let err = herald(&url, &args).await.fails();
        assert!(!err.contains("cannot reach"), "{args:?}: {err}");
        assert!(
            err.contains("no answer from herald") && err.contains("may or may not have been done"),
            "{args:?}: {err}"
        );
        assert!(err.contains("--idempotency-key"), "{err}");
    }
    // Each request was sent whole before the connection closed.
    let seen = seen.lock().unwrap().clone();
    let routes: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(routes, ["POST /v1/tasks", "POST /v1/tasks/t/trigger"]);
    let created: Value = serde_json::from_str(&seen[0].1).unwrap();
    assert_eq!(created["id"], "t");
    // Nothing listens on port 1: nothing was sent, so it is "cannot reach".
    let err = herald("http://127.0.0.1:1", &["tasks", "trigger", "t"])
        .await
        .fails();
    assert!(err.contains("cannot reach herald"), "{err}");
    // A success whose body broke off: done, and said so.
    let url = fake_herald(|_, mut conn| {
        let _ = write!(
            conn,
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"id\""
        );
    });
    let err = herald(&url, &["tasks", "create", "-f", file.as_str()])
        .await
        .fails();
    assert!(
        !err.contains("cannot reach") && err.contains("HTTP 201 (done)"),
        "{err}"
    );
}

/// `herald export --url` from a herald that answers 200 and a header line, then sends
/// nothing: it ends after the idle limit (shortened by the test knob) with a non-zero exit,
/// saying the output is incomplete. Before, it waited for the next bytes for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_from_a_stalled_herald_ends_saying_it_is_incomplete() {
    let url = fake_herald(|_, mut conn| {
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let line = "{\"kind\":\"header\",\"format\":\"herald-export\",\"version\":1}\n";
        let _ = write!(conn, "{:x}\r\n{line}\r\n", line.len());
        // Silence, the connection held open until the test ends.
        std::thread::sleep(Duration::from_secs(120));
    });
    let out = tokio::task::spawn_blocking(move || {
        run_in_env(
            &url,
            None,
            &["export", "--url", &url],
            None,
            Duration::from_secs(30),
            &[("HERALD_TEST_EXPORT_IDLE_MS", "500")],
        )
    })
    .await
    .unwrap();
    assert!(
        out.stdout.starts_with("{\"kind\":\"header\""),
        "{}",
        out.stdout
    );
    let err = out.fails();
    assert!(
        err.contains("the export stalled for 0.5 s; the output is incomplete"),
        "{err}"
    );
}

/// An error answer's text reaches the terminal with its control characters escaped (an OSC 52
/// sequence would set the clipboard, ESC [ repaint the screen), in a problem's `detail` and in
/// a plain-text body alike; a body past 64 KiB is not read, the status's reason stands in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_answer_is_bounded_and_printed_with_control_characters_escaped() {
    let url = fake_herald(|req, mut conn| match req.path.as_str() {
        "/v1/tasks/json" => {
            let body = json!({"detail": "boom \u{1b}]52;c;SGVsbG8=\u{7} and \u{1b}[2J done"});
            answer(
                &mut conn,
                "502 Bad Gateway",
                "application/problem+json",
                &body.to_string(),
            );
        }
        "/v1/tasks/text" => answer(
            &mut conn,
            "502 Bad Gateway",
            "text/plain",
            "proxy \u{1b}]52;c;SGVsbG8=\u{7} says no",
        ),
        _ => {
            let big = format!("{{\"detail\": \"{}\"}}", "x".repeat(200 * 1024));
            answer(&mut conn, "502 Bad Gateway", "application/json", &big);
        }
    });
    for (id, says) in [
        (
            "json",
            "boom \\u{1b}]52;c;SGVsbG8=\\u{7} and \\u{1b}[2J done",
        ),
        ("text", "proxy \\u{1b}]52;c;SGVsbG8=\\u{7} says no"),
        ("big", "HTTP 502: Bad Gateway"),
    ] {
        let out = herald(&url, &["tasks", "show", id]).await;
        assert!(
            !out.stderr
                .trim_end_matches('\n')
                .chars()
                .any(char::is_control),
            "{id}: {:?}",
            out.stderr
        );
        let err = out.fails();
        assert!(
            err.contains("HTTP 502") && err.contains(says),
            "{id}: {err}"
        );
    }
}
