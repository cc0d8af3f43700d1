//! Hostile time (issue 26): a wall clock that jumps while herald runs. On the manual clock
//! (`ManualClock::jump_wall` moves the wall alone, as an NTP step or a resumed VM does) and on
//! the real binary: a SIGSTOP across a send the receiver answers during the freeze.
//!
//! A forward jump is judged like an outage for misfire (each cron one coalesced run, by the
//! default `fire_now`), while durations keep to the monotonic clock: no paced gap shorter than
//! its interval, no limited channel over its rate.

mod common;

use std::time::Duration;

use common::herald::{
    ms_of, poll, utc_ms, wait_state, webhook_channel, write_config, ManualHerald, Proc,
};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

const JUMP_MS: u64 = 3_600_000;

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[tokio::test]
async fn a_forward_jump_coalesces_crons_and_keeps_every_gap() {
    let t0 = utc_ms("2026-12-01T00:00:30Z");
    let side = tempfile::tempdir().unwrap();
    let lim = side.path().join("lim.jsonl");
    let h = ManualHerald::start(
        t0,
        &format!(
            "[channels.lim]\nkind = \"file\"\npath = \"{}\"\nrate = \"1/2s\"\n",
            lim.display()
        ),
    )
    .await;
    let many: Vec<String> = (0..20).map(|i| format!("u{i}")).collect();
    for task in [
        json!({"id": "minute", "channel": "out", "schedule": {"cron": "* * * * *"}, "to": ["a"], "body": "m"}),
        json!({"id": "five", "channel": "out", "schedule": {"cron": "*/5 * * * * *"}, "to": ["a"], "body": "f"}),
        json!({"id": "paced", "channel": "out", "schedule": {"after": "1s"}, "to": many, "body": "p",
               "pacing": {"interval": "3s"}}),
        json!({"id": "limited", "channel": "lim", "schedule": {"after": "1s"}, "to": many, "body": "l"}),
    ] {
        h.post(&task).await;
    }
    h.run_until(t0 + 12_000).await;
    let before = h.sent().len();
    assert!(before > 0);

    // The wall jumps an hour ahead; the monotonic clock does not.
    h.clock.jump_wall(JUMP_MS);
    let jump_end = h.now();
    h.server().engine.wake();
    h.run_until(jump_end + 40_000).await;

    // Real (monotonic) time of a line: the wall minus the jump once it happened.
    let mono = |l: &Value| {
        let w = ms_of(l["sent_at"].as_str().expect("sent_at")) as u64;
        if w >= jump_end {
            w - JUMP_MS
        } else {
            w
        }
    };
    let sent = h.sent();
    let of = |task: &str| -> Vec<u64> {
        sent.iter()
            .filter(|l| l["task_id"] == task)
            .map(mono)
            .collect()
    };
    let after_jump = |ts: &[u64], within: u64| {
        ts.iter()
            .filter(|&&t| t >= jump_end - JUMP_MS && t < jump_end - JUMP_MS + within)
            .count()
    };
    // Each cron: one coalesced run for the jumped-over hour, not a burst (the wall is at
    // 01:00:42 after the jump: the minute cron's next regular fire is 18 s later, the 5 s
    // cron's 3 s later).
    assert_eq!(after_jump(&of("minute"), 15_000), 1, "{:?}", of("minute"));
    assert_eq!(after_jump(&of("five"), 2_500), 1, "{:?}", of("five"));
    let runs = h.runs("minute").await;
    assert!(
        runs.iter().any(|r| r["reason"]
            .as_str()
            .is_some_and(|s| s.contains("coalesced"))),
        "{runs:?}"
    );
    // The paced sequence: every gap at least its interval, across the jump too.
    let paced = of("paced");
    assert!(paced.len() >= 10, "{paced:?}");
    for w in paced.windows(2) {
        assert!(
            w[1] - w[0] >= 3_000,
            "paced gap {} ms: {paced:?}",
            w[1] - w[0]
        );
    }
    // The limited channel: never two sends within 2 s.
    let limited: Vec<u64> = lines(&lim).iter().map(mono).collect();
    assert!(limited.len() >= 10, "{limited:?}");
    for w in limited.windows(2) {
        assert!(
            w[1] - w[0] >= 2_000,
            "limited gap {} ms: {limited:?}",
            w[1] - w[0]
        );
    }
    let m = http::get(&h.url("/metrics")).await.text();
    assert!(m.contains("herald_wall_clock_jumps_total 1\n"), "{m}");
}

/// SIGSTOP while a send is in flight; the receiver answers during the freeze (after the
/// channel's timeout would have passed); SIGCONT: the answer is read, one attempt, sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_arrived_during_a_freeze_is_an_answer() {
    let rx = Receiver::start().await;
    // Answered 600 ms after the request arrives: by then herald is stopped.
    rx.set_default(Behavior::Slow(Duration::from_millis(600)));
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &webhook_channel(
            "hook",
            &rx.url(),
            "timeout = \"1s\"\nretry = { max_attempts = 3, initial = \"1s\" }",
        ),
    );
    let p = Proc::spawn(&cfg, &dir.path().join("data"));
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "frozen", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The request is in flight: stop herald before the answer comes.
    let got = poll(Duration::from_secs(30), || async {
        (rx.count() >= 1).then_some(())
    })
    .await;
    assert!(got.is_some(), "the send reached the receiver");
    let arrived = tokio::time::Instant::now();
    p.signal(libc::SIGSTOP);
    // Stopped until the receiver has answered (600 ms) and herald's 1 s timeout has passed:
    // the freeze's length is the condition under test, not a wait for a result.
    tokio::time::sleep_until(arrived + Duration::from_millis(1_600)).await;
    p.signal(libc::SIGCONT);
    let v = wait_state(&p.url, "frozen", "completed", Duration::from_secs(30)).await;
    assert_eq!(v["progress"]["sent"], 1, "{v}");
    assert_eq!(rx.count(), 1, "one attempt: {:?}", rx.answers());
    let runs = http::get(&format!("{}/v1/tasks/frozen/runs", p.url))
        .await
        .json();
    assert!(!runs.to_string().contains("timed out"), "{runs}");
}
