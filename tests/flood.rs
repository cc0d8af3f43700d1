//! A connection flood on the real binary with few descriptors (`RLIMIT_NOFILE` 256, set for
//! the child only): far more idle and half-sent connections than herald may serve. herald
//! caps its connections below the limit (closing the longest idle to make room), keeps
//! descriptors for its webhook sends and store, so every scheduled delivery succeeds, and the
//! API keeps answering.

mod common;

use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::Receiver;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const NOFILE: libc::rlim_t = 256;
const FLOOD: usize = 600;
const TASKS: usize = 40;

/// Opens `n` connections that send nothing (every third sends half a request head).
async fn flood(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        if i % 3 == 0 {
            let _ = s
                .write_all(b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await;
        }
        out.push(s);
    }
    out
}

/// How many of `conns` herald has closed.
fn closed(conns: &[TcpStream]) -> usize {
    let mut buf = [0u8; 64];
    conns
        .iter()
        .filter(|s| match s.try_read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_over_the_cap_starves_neither_deliveries_nor_the_api() {
    // This process opens well over a thousand sockets itself.
    herald::fdlimit::raise_nofile().expect("raise this test's own limit");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));
    let mut cmd = Proc::command(&cfg, &data);
    // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let p = Proc::start(cmd);
    let addr = p.url.trim_start_matches("http://").to_string();

    let first = flood(&addr, FLOOD).await;
    // herald serves fewer than its 256 descriptors: it closed most of the flood.
    let want = FLOOD - NOFILE as usize;
    let n = poll(Duration::from_secs(30), || {
        let n = closed(&first);
        async move { (n >= want).then_some(n) }
    })
    .await;
    assert!(
        n.is_some(),
        "herald closed {} of {FLOOD} connections, want at least {want}",
        closed(&first)
    );

    // The API answers through the flood: creates for webhook sends due shortly.
    for i in 0..TASKS {
        let r = http::post_json(
            &format!("{}/v1/tasks", p.url),
            &json!({"id": format!("t{i:02}"), "channel": "hook", "schedule": {"after": "2s"},
                    "messages": [{"to": format!("u{i}"), "body": "through the flood"}]}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // More flood while they are sent.
    let second = flood(&addr, FLOOD).await;

    let got = rx.wait_for(TASKS, Duration::from_secs(60)).await;
    assert_eq!(got.len(), TASKS);
    for i in 0..TASKS {
        let v = wait_state(
            &p.url,
            &format!("t{i:02}"),
            "completed",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(v["progress"]["sent"], 1, "{v}");
    }
    let f = http::get(&format!("{}/v1/failures", p.url)).await;
    assert_eq!(f.status, 200);
    assert_eq!(f.json()["failures"], json!([]), "no delivery failed");
    let h = http::get(&format!("{}/healthz", p.url)).await;
    assert_eq!(h.status, 200, "{}", h.text());
    drop((first, second));
}
