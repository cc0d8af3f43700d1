//! What a hostile or careless client meets at the HTTP edge: every error is a problem
//! document (414, 431, 408 included), the bearer scheme is case-insensitive and 401 carries a
//! challenge, `/healthz` answers GET and HEAD only, a public address needs a real token, and
//! user text cannot forge or colour log lines.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::herald::{wait_state, write_config, Proc, TestHerald};
use common::http;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "0123456789abcdef-token";

fn assert_problem(r: &http::Resp, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{status}"
    );
    let v = r.json();
    assert_eq!(v["status"], status);
    assert!(v["type"]
        .as_str()
        .unwrap()
        .starts_with("urn:herald:problem:"));
    v
}

#[tokio::test]
async fn bearer_is_case_insensitive_and_401_carries_a_challenge() {
    let h = TestHerald::start_with_token("", TOKEN).await;
    let url = h.url("/v1/tasks");
    for auth in [
        format!("Bearer {TOKEN}"),
        format!("bearer {TOKEN}"),
        format!("BEARER  {TOKEN}"),
    ] {
        let r = http::request("GET", &url, &[("authorization", &auth)], None).await;
        assert_eq!(r.status, 200, "{auth:?}: {}", r.text());
    }
    for auth in [None, Some("Basic abc"), Some("Bearer wrong-token-wrong")] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = http::request("GET", &url, &headers, None).await;
        assert_problem(&r, 401);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{auth:?}");
    }
}

#[tokio::test]
async fn healthz_answers_get_and_head_only() {
    let h = TestHerald::start("").await;
    let url = h.url("/healthz");
    assert_eq!(http::request("GET", &url, &[], None).await.status, 200);
    let head = http::request("HEAD", &url, &[], None).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    for m in ["TRACE", "POST", "DELETE", "PUT"] {
        let r = http::request(m, &url, &[], None).await;
        assert_problem(&r, 405);
        assert_eq!(r.header("allow"), Some("GET, HEAD"), "{m}");
    }
}

#[tokio::test]
async fn a_long_uri_and_large_headers_are_problem_documents() {
    let h = TestHerald::start("").await;
    let long = "a".repeat(herald::api::URI_BYTES_MAX + 10);
    let r = http::request("GET", &h.url(&format!("/v1/tasks?after={long}")), &[], None).await;
    assert_problem(&r, 414);
    let big = "b".repeat(herald::api::HEAD_BYTES_MAX + 10);
    let r = http::request("GET", &h.url("/v1/tasks"), &[("x-big", &big)], None).await;
    assert_problem(&r, 431);
    // The server is fine afterwards.
    assert_eq!(http::get(&h.url("/v1/tasks")).await.status, 200);
}

#[tokio::test]
async fn a_trickled_body_gets_408_and_the_connection_closes() {
    let h = TestHerald::start("[limits]\nbody_read_timeout = \"300ms\"").await;
    let mut s = tokio::net::TcpStream::connect(h.server.addr).await.unwrap();
    s.write_all(
        b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\"",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
        .await
        .expect("herald answers and closes instead of waiting for the body forever")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(text.contains("body_read_timeout"), "{text}");
}

#[test]
fn a_short_or_blank_token_is_refused_for_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    for token in ["short", "                    "] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--listen", "0.0.0.0:0", "--data"])
            .arg(dir.path().join("data"))
            .env("HERALD_TOKEN", token)
            .stdin(Stdio::null())
            .output()
            .expect("run herald");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{token:?}: {err}");
        assert!(err.starts_with("herald: token:"), "{token:?}: {err}");
        assert!(out.stdout.is_empty(), "it never listened");
    }
}

/// Runs the real binary with `HERALD_LOG_FORMAT=format`, sends one message whose `to` and
/// `body` carry a newline and an ANSI escape through the `log` channel, stops it with
/// SIGTERM, and returns what it logged.
async fn log_of_a_hostile_message(format: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let log = dir.path().join("herald.log");
    let mut cmd = Proc::command(&cfg, &dir.path().join("data"));
    cmd.env("HERALD_LOG", "info")
        .env("HERALD_LOG_FORMAT", format)
        .stderr(std::fs::File::create(&log).unwrap());
    let mut p = Proc::start(cmd);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "evil", "schedule": {"after": "0s"},
                "messages": [{"to": "a\nINFO forged line", "body": "\u{1b}[31mred\u{1b}[0m"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&p.url, "evil", "completed", Duration::from_secs(20)).await;
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    std::fs::read_to_string(&log).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_text_cannot_forge_or_colour_log_lines() {
    let text = log_of_a_hostile_message("text").await;
    assert!(!text.contains('\u{1b}'), "raw escape in the log:\n{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("INFO forged")),
        "a forged line:\n{text}"
    );
    assert!(text.contains("a\\nINFO forged line"), "{text}");
    assert!(
        !text.contains("Some("),
        "instants and options print as values:\n{text}"
    );

    let json_log = log_of_a_hostile_message("json").await;
    let lines: Vec<Value> = json_log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let delivered = lines
        .iter()
        .find(|v| v["fields"]["message"] == "delivered to log")
        .unwrap_or_else(|| panic!("no delivery line in:\n{json_log}"));
    assert_eq!(delivered["fields"]["to"], "a\\nINFO forged line");
    assert_eq!(delivered["fields"]["body"], "\\u{1b}[31mred\\u{1b}[0m");
    // Timestamps are RFC 3339.
    let ts = delivered["timestamp"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(ts).is_ok(), "{ts}");
    assert!(lines.iter().any(|v| v["fields"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("draining"))));
}

/// Writes `request` on a fresh connection and reads the answer until herald closes it.
async fn raw(h: &TestHerald, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(h.server.addr).await.unwrap();
    // hyper may answer (and close) before it has read all of a request that is too large.
    let _ = s.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
        .await
        .expect("herald answers and closes");
    String::from_utf8_lossy(&answer).into_owned()
}

fn problem_of(answer: &str, status: u16) {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "{answer}"
    );
    let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{head}"
    );
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["status"], status);
}

#[tokio::test]
async fn what_hyper_rejects_itself_is_a_problem_document_too() {
    let h = TestHerald::start("").await;
    problem_of(
        &raw(&h, b"GET /v1/tasks HTTP/1.1\r\nBad Header\r\n\r\n").await,
        400,
    );
    problem_of(&raw(&h, b"BR@KEN / HTTP/1.1\r\n\r\n").await, 400);
    let huge = format!(
        "GET /v1/tasks HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n",
        "h".repeat(100 * 1024)
    );
    problem_of(&raw(&h, huge.as_bytes()).await, 431);
    // A normal request on a normal connection is untouched.
    assert_eq!(http::get(&h.url("/healthz")).await.status, 200);
}

/// Without a token, loopback trust is the local user's, not every web page's: a browser's
/// request from another origin is 403 and changes nothing (cross-site request forgery: a
/// form's POST needs no preflight), a Host that is not a loopback name is 421 (DNS rebinding:
/// a page's own name resolving to 127.0.0.1 could read the export). The same origin, and a
/// client that is no browser (no Origin), go through.
#[tokio::test]
async fn without_a_token_another_origin_or_host_is_refused() {
    let h = TestHerald::start("").await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "t", "channel": "log", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let host = h.server.addr.to_string();
    let cancel = |origin: &str, host: &str| {
        format!(
            "POST /v1/tasks/t/cancel HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    problem_of(
        &raw(&h, cancel("https://evil.example", &host).as_bytes()).await,
        403,
    );
    problem_of(&raw(&h, cancel("null", &host).as_bytes()).await, 403);
    let export = "GET /v1/export HTTP/1.1\r\nHost: evil.example:7700\r\nConnection: close\r\n\r\n";
    problem_of(&raw(&h, export.as_bytes()).await, 421);
    assert_eq!(
        http::get(&h.url("/v1/tasks/t")).await.json()["state"],
        "pending",
        "nothing changed"
    );
    // The dashboard's own requests carry its origin: they go through.
    let same = raw(&h, cancel(&format!("http://{host}"), &host).as_bytes()).await;
    assert!(same.starts_with("HTTP/1.1 200 "), "{same}");
    assert_eq!(
        http::get(&h.url("/v1/tasks/t")).await.json()["state"],
        "cancelled"
    );
}
