//! A local resource shortage is not the receiver's fault (issue 9): when this host runs out of
//! file descriptors (`EMFILE`, "Too many open files"), a send is held and tried again — no
//! delivery attempt is burned and the breaker is not told. The limit is real: the test lowers
//! this process's `RLIMIT_NOFILE` and opens files until `open` fails with `EMFILE`, so herald's
//! next connect fails the same way. It is alone in this test binary because the limit is
//! process-wide.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::herald::{poll, start_with_env, wait_state};
use common::http;
use common::platform::{FakePlatform, Reply};
use serde_json::json;

/// Sets the soft `RLIMIT_NOFILE`; returns the previous (soft, hard).
fn set_nofile_soft(soft: libc::rlim_t) -> (libc::rlim_t, libc::rlim_t) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit");
    let old = (lim.rlim_cur, lim.rlim_max);
    let new = libc::rlimit {
        rlim_cur: soft.min(old.1),
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) };
    assert_eq!(rc, 0, "setrlimit");
    old
}

fn open_fds() -> libc::rlim_t {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as libc::rlim_t)
        .unwrap_or(64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_open_files_holds_the_send_without_burning_an_attempt() {
    let fake =
        FakePlatform::start(|_| Reply::json(200, json!({"errcode": 0, "errmsg": "ok"}))).await;
    let base = fake.base_url();
    // One attempt only, and a breaker that opens on the first failure: if EMFILE burned the
    // attempt the message would be in the failure list; if it counted as a failure the
    // breaker would open.
    let config = format!(
        r#"
[channels.hook]
kind = "webhook"
url = "{base}/cgi-bin/webhook/send?key=k"
preset = "wecom-robot"
retry = {{ max_attempts = 1 }}
breaker = {{ window = "60s", min_requests = 1, failure_ratio = 0.5, cool_down = "30s" }}
"#
    );
    let h = start_with_env(&config, &[]).await;
    let channel = h
        .server
        .engine
        .channels()
        .get("hook")
        .expect("channel hook")
        .clone();

    // The store's spare thread makes a spare log segment at start: let it finish, or the
    // descriptor it gives back afterwards could let the send (or the fake platform's accept)
    // through.
    let spare = h.dir.path().join("wal-spare.tmp");
    poll(Duration::from_secs(20), || {
        let ready = spare.exists();
        async move { ready.then_some(()) }
    })
    .await
    .expect("the spare log segment is made");
    // Exhaust the descriptors: a low soft limit, then /dev/null until EMFILE.
    let old = set_nofile_soft(open_fds() + 32);
    let hogs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // Takes every free descriptor. Called again while waiting: a descriptor herald's own
    // background work gives back (the store's spare thread closing a log segment, say)
    // must not let the send through.
    let top_up = {
        let hogs = hogs.clone();
        move || {
            let mut hogs = hogs.lock().unwrap();
            loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => hogs.push(f),
                    Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                    Err(e) => panic!("unexpected error while exhausting descriptors: {e}"),
                }
                assert!(hogs.len() < 100_000, "the limit did not apply");
            }
        }
    };
    top_up();
    // Create the task in-process (the HTTP API would need a socket).
    let req: herald::request::TaskRequest = serde_json::from_value(json!({
        "id": "e", "channel": "hook", "schedule": {"after": "0s"},
        "messages": [{"to": "room", "body": "sent once the descriptors are back"}]}))
    .expect("task request");
    let created = h.server.engine.create(req, None).await;
    // Wait until herald has met EMFILE on at least two tries (held, not failed).
    let held = poll(Duration::from_secs(20), || {
        top_up();
        let c = channel.clone();
        async move { (c.stats.held_local.load(Ordering::Relaxed) >= 2).then_some(()) }
    })
    .await;
    // Give the descriptors back before asserting anything.
    hogs.lock().unwrap().clear();
    set_nofile_soft(old.0);
    created.expect("task created while descriptors were exhausted");
    assert!(held.is_some(), "the send was held on EMFILE");
    assert_eq!(
        fake.requests().len(),
        0,
        "nothing reached the platform meanwhile"
    );
    assert_eq!(channel.stats.retryable_failures.load(Ordering::Relaxed), 0);

    let v = wait_state(&h.server.url(), "e", "completed", Duration::from_secs(20)).await;
    assert_eq!(v["progress"]["sent"], 1);
    let f = http::get(&h.url("/v1/failures?task=e")).await.json();
    assert_eq!(f["failures"], json!([]), "no attempt was burned");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].json.as_ref().map(|j| j["text"]["content"].clone()),
        Some(json!("sent once the descriptors are back"))
    );
    let chans = http::get(&h.url("/v1/channels")).await.json();
    let hook = chans["channels"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "hook").cloned())
        .expect("hook");
    assert_eq!(
        hook["breaker"]["state"], "closed",
        "EMFILE is not the channel's failure"
    );
    assert_eq!(hook["retryable_failures"], 0);
    assert!(hook["held_local"].as_u64().unwrap_or(0) >= 2);
    assert_eq!(hook["sent"], 1);
    let metrics = http::get(&h.url("/metrics")).await.text();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("herald_channel_held_local_total{channel=\"hook\"}"))
        .expect("held_local metric");
    let n: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(n >= 2, "{line}");
}
