//! Graceful drain on the real binary: SIGTERM stops new sends and writes, waits (up to
//! `shutdown_timeout`) for the sends in flight to settle durably, then exits 0. Across the
//! restart every message arrives once, except a send whose answer never came before the
//! timeout, which goes once more with the next attempt number.

mod common;

use std::time::{Duration, Instant};

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

fn config(rx: &Receiver, shutdown_timeout: &str) -> String {
    format!(
        "shutdown_timeout = \"{shutdown_timeout}\"\n{}",
        webhook_channel("hook", &rx.url(), "timeout = \"60s\"")
    )
}

async fn create_one(p: &Proc, id: &str) {
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": id, "channel": "hook", "schedule": {"after": "0s"},
                "messages": [{"to": "a", "body": "hello"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// No `resumed_after_restart` on `id`'s timeline: no attempt of it was read back as a send
/// cut short by the drain.
async fn nothing_cut_short(url: &str, id: &str) {
    let r = http::get(&format!("{url}/v1/tasks/{id}/timeline?limit=1000")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.json()["events"].as_array().unwrap().clone();
    assert!(
        !events.iter().any(|e| e["kind"] == "resumed_after_restart"),
        "nothing was cut short by the drain: {events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_slow_send_waits_for_it_and_delivers_once() {
    let rx = Receiver::start().await;
    // Answered 1.5 s after it arrives: SIGTERM lands while the send is in flight.
    rx.script_key(
        "slow:1:0",
        vec![Behavior::Slow(Duration::from_millis(1500))],
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &config(&rx, "30s"));
    let mut p = Proc::spawn(&cfg, &data);
    create_one(&p, "slow").await;
    rx.wait_for(1, Duration::from_secs(20)).await;
    p.signal(libc::SIGTERM);

    // While it drains: /healthz says so, writes are refused with a problem document, reads work.
    let health = format!("{}/healthz", p.url);
    let draining = poll(Duration::from_secs(5), || {
        let health = health.clone();
        async move {
            let r = http::try_request("GET", &health, &[], None).await.ok()?;
            (r.status == 503).then_some(r)
        }
    })
    .await
    .expect("/healthz answers 503 while draining");
    assert_eq!(draining.json()["status"], "draining");
    if let Ok(r) = http::try_request(
        "POST",
        &format!("{}/v1/tasks", p.url),
        &[("content-type", "application/json")],
        Some(br#"{"schedule": {"after": "1h"}, "to": ["b"], "body": "x"}"#.to_vec()),
    )
    .await
    {
        // (The drain may already have finished and closed the listener: then nothing answers.)
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.json()["type"], "urn:herald:problem:draining");
    }

    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    let answers = rx.answers();
    assert_eq!(answers.len(), 1, "the slow send was answered: {answers:?}");

    let p = Proc::spawn(&cfg, &data);
    let v = wait_state(&p.url, "slow", "completed", Duration::from_secs(30)).await;
    assert_eq!(v["progress"]["sent"], 1);
    assert_eq!(rx.count(), 1, "delivered exactly once across the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_receiver_that_never_answers_exits_after_the_timeout_and_resends_once() {
    let rx = Receiver::start().await;
    rx.script_key("hang:1:0", vec![Behavior::Hang]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &config(&rx, "2s"));
    let mut p = Proc::spawn(&cfg, &data);
    create_one(&p, "hang").await;
    let first = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(first[0].json.as_ref().unwrap()["attempt"], 1);
    let signalled = Instant::now();
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    // It waited for the send (no upper bound asserted: the machine may be slow).
    assert!(
        signalled.elapsed() >= Duration::from_millis(1900),
        "exited {:?} after SIGTERM, before shutdown_timeout",
        signalled.elapsed()
    );

    let p = Proc::spawn(&cfg, &data);
    rx.wait_for(2, Duration::from_secs(30)).await;
    wait_state(&p.url, "hang", "completed", Duration::from_secs(30)).await;
    let got = rx.requests();
    assert_eq!(got.len(), 2, "sent once more after the restart, not more");
    assert_eq!(got[1].idempotency_key(), Some("hang:1:0"));
    assert_eq!(
        got[1].json.as_ref().unwrap()["attempt"],
        2,
        "the next attempt number"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Hang);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &config(&rx, "10m"));
    let mut p = Proc::spawn(&cfg, &data);
    create_one(&p, "stuck").await;
    rx.wait_for(1, Duration::from_secs(20)).await;
    p.signal(libc::SIGTERM);
    let health = format!("{}/healthz", p.url);
    poll(Duration::from_secs(5), || {
        let health = health.clone();
        async move {
            let r = http::try_request("GET", &health, &[], None).await.ok()?;
            (r.status == 503).then_some(())
        }
    })
    .await
    .expect("draining");
    p.signal(libc::SIGINT);
    // Far less than the 10 minute drain: the second signal cut it short.
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(130));
}

/// A send that waits for a free slot of its channel (`concurrency = 1`, the slot held by a
/// slow send) when SIGTERM comes does not start after it: the drain waits for the send in
/// flight only, and the next boot sends the other two, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_starts_no_send_waiting_for_a_channel_slot() {
    let rx = Receiver::start().await;
    for id in ["w1", "w2", "w3"] {
        rx.script_key(
            &format!("{id}:1:0"),
            vec![Behavior::Slow(Duration::from_millis(1500))],
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let channel = webhook_channel("hook", &rx.url(), "timeout = \"60s\"\nconcurrency = 1");
    let cfg = write_config(
        dir.path(),
        &format!("shutdown_timeout = \"30s\"\n{channel}"),
    );
    let mut p = Proc::spawn(&cfg, &data);
    for id in ["w1", "w2", "w3"] {
        create_one(&p, id).await;
    }
    rx.wait_for(1, Duration::from_secs(20)).await;
    // All three armed (their in-flight marks written): one sending, two waiting for the slot.
    for id in ["w1", "w2", "w3"] {
        let url = format!("{}/v1/tasks/{id}", p.url);
        let armed = poll(Duration::from_secs(10), || {
            let url = url.clone();
            async move {
                let v = http::get(&url).await.json();
                (v["progress"]["in_flight"] == 1).then_some(())
            }
        })
        .await;
        assert!(armed.is_some(), "{id} was not armed");
    }
    assert_eq!(rx.count(), 1, "the slot lets one send out at a time");
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    assert_eq!(
        rx.count(),
        1,
        "a send that waited for the slot started after SIGTERM"
    );

    let p = Proc::spawn(&cfg, &data);
    for id in ["w1", "w2", "w3"] {
        wait_state(&p.url, id, "completed", Duration::from_secs(30)).await;
    }
    assert_eq!(rx.count(), 3, "each message once across the restart");
}

/// A SIGTERM while start-up still waits for its store ends the process promptly, with a
/// non-zero status (it never became ready: nothing was acknowledged). The "database" accepts
/// connections and never says a word, so PostgreSQL's open waits for it up to the statement
/// timeout (5 minutes here). Before, the signal handler was installed first (the default
/// action gone) but read only once start-up returned: the signal was ignored for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_exits_promptly() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let (accepted, connected) = std::sync::mpsc::channel();
    // Holds every connection it accepts, unanswered (the thread ends with the test binary).
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().map_while(Result::ok) {
            held.push(s);
            let _ = accepted.send(());
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let mut cmd = Proc::command(&cfg, &dir.path().join("data"));
    let url = format!("postgres://herald@{addr}/herald");
    cmd.env("HERALD_STORE_URL", url)
        .env("HERALD_STORE_STATEMENT_TIMEOUT", "5m");
    let mut child = Killed(cmd.spawn().expect("spawn herald"));
    connected
        .recv_timeout(Duration::from_secs(30))
        .expect("herald connected to its store");
    let pid = libc::pid_t::try_from(child.0.id()).unwrap();
    // SAFETY: kill(2) on our own child, not reaped yet (we hold it).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "herald still running 5 s after SIGTERM during start-up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        status.code().is_some_and(|c| c != 0),
        "exited with {status:?}, not a non-zero status of its own"
    );
}

/// A child killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An unpaced sequence whose first message is out when SIGTERM comes: the drain waits for that
/// send and settles it, and the settle arms nothing (the next message is due at once, but no
/// send starts during a drain). Armed, its in-flight mark would be read at the next boot as a
/// send cut short: `resumed_after_restart` on the timeline and an attempt burned for a message
/// that never left. Left pending, the next boot sends it as its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_arms_no_next_message_of_a_sequence() {
    let rx = Receiver::start().await;
    rx.script_key(
        "seqd:1:0",
        vec![Behavior::Slow(Duration::from_millis(1500))],
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &config(&rx, "30s"));
    let mut p = Proc::spawn(&cfg, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "seqd", "channel": "hook", "schedule": {"after": "0s"},
                "messages": [{"to": "a", "body": "one"}, {"to": "b", "body": "two"},
                             {"to": "c", "body": "three"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    rx.wait_for(1, Duration::from_secs(20)).await;
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    assert_eq!(rx.count(), 1, "no send started during the drain");

    let p = Proc::spawn(&cfg, &data);
    wait_state(&p.url, "seqd", "completed", Duration::from_secs(30)).await;
    let got = rx.requests();
    let keys: Vec<&str> = got.iter().filter_map(|r| r.idempotency_key()).collect();
    assert_eq!(
        keys,
        ["seqd:1:0", "seqd:1:1", "seqd:1:2"],
        "each message once"
    );
    assert_eq!(
        got[1].json.as_ref().unwrap()["attempt"],
        1,
        "the next message's first attempt"
    );
    nothing_cut_short(&p.url, "seqd").await;
}

/// A one-shot armed ahead of its instant when SIGTERM comes (its fire is handled 2 s before
/// the instant, and its first attempt's in-flight mark written then): the drain starts no
/// send, and takes the mark back before the exit. Left armed, the next boot, past the
/// instant, read it as a send cut short: sent as attempt 2 with `resumed_after_restart` for a
/// message that never left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_takes_back_a_mark_armed_ahead_of_its_instant() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(dir.path(), &config(&rx, "30s"));
    let mut p = Proc::spawn(&cfg, &data);
    let ahead = Duration::from_secs(5);
    let due = Instant::now() + ahead;
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "ahead", "channel": "hook",
                "schedule": {"at": common::herald::in_ms(ahead.as_millis() as i64)},
                "messages": [{"to": "a", "body": "hello"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Armed ahead: its fire handled, its in-flight mark written, its instant still to come.
    let url = format!("{}/v1/tasks/ahead", p.url);
    let armed = poll(Duration::from_secs(10), || {
        let url = url.clone();
        async move {
            let v = http::get(&url).await.json();
            (v["progress"]["in_flight"] == 1).then_some(())
        }
    })
    .await;
    assert!(armed.is_some(), "the one-shot was not armed ahead");
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(Duration::from_secs(30)).await, Some(0));
    assert_eq!(rx.count(), 0, "nothing is sent during a drain");

    // Back after the instant: an armed mark then reads as a send cut short.
    tokio::time::sleep_until((due + Duration::from_millis(500)).into()).await;
    let p = Proc::spawn(&cfg, &data);
    wait_state(&p.url, "ahead", "completed", Duration::from_secs(30)).await;
    let got = rx.requests();
    assert_eq!(got.len(), 1, "sent once: {got:?}");
    assert_eq!(got[0].idempotency_key(), Some("ahead:1:0"));
    assert_eq!(
        got[0].json.as_ref().unwrap()["attempt"],
        1,
        "its first attempt: the drain took the mark back"
    );
    nothing_cut_short(&p.url, "ahead").await;
}
