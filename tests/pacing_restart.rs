//! A paced sequence keeps its interval after a crash: the real binary is killed (SIGKILL)
//! mid-sequence, stays down past the next message's due instant, and is started again on the
//! same data directory. The remaining messages must arrive an interval apart, as before the
//! crash, not an interval plus the outage (the defect: the timer's continuity rule carried the
//! first resumed step's lateness into every later step, `engine/timer.rs` `Guards`).
//! Runs on sled, and on PostgreSQL with `HERALD_TEST_STORE=pg` (the real binary gets the
//! harness's database, `common/herald.rs` `Proc::command`).

mod common;

use std::time::{Duration, Instant};

use common::herald::{in_ms, ms_of, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::{Receiver, Recorded};
use serde_json::json;

const N: usize = 15;
const INTERVAL_MS: u64 = 400;
/// How long herald stays down after the last message it sent before the kill: well past the
/// next message's instant, so the resumed step is late by about a second.
const OUTAGE: Duration = Duration::from_millis(1_500);
/// One request's delivery jitter on a loaded 2-core machine (loopback, the receiver's task):
/// far below the second of lateness the defect added to every gap.
const JITTER_MS: f64 = 250.0;

fn seq_of(r: &Recorded) -> u64 {
    r.json.as_ref().expect("JSON body")["seq"]
        .as_u64()
        .expect("seq")
}

fn sent_at(r: &Recorded) -> f64 {
    ms_of(
        r.json.as_ref().expect("JSON body")["sent_at"]
            .as_str()
            .expect("sent_at"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_sequence_keeps_its_interval_after_kill_9_and_restart() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));
    let mut p = Proc::spawn(&config, &data);
    let messages: Vec<_> = (0..N)
        .map(|i| json!({"to": format!("r{i}"), "body": "s"}))
        .collect();
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "seq", "channel": "hook", "schedule": {"at": in_ms(500)},
                "pacing": {"interval": format!("{INTERVAL_MS}ms")}, "messages": messages}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());

    // Five messages out, then the kill: no shutdown code runs.
    let before = rx.wait_for(5, Duration::from_secs(30)).await;
    assert!(before.len() >= 5, "{} of 5 arrived before the kill", before.len());
    p.kill9();
    let last_before = rx.requests().last().expect("arrivals").at;
    // The outage itself (setup, not a wait for a result): herald stays down until well past
    // the instant its next message was due.
    let back = last_before + OUTAGE;
    if let Some(left) = back.checked_duration_since(Instant::now()) {
        tokio::time::sleep(left).await;
    }
    let restarted = Instant::now();
    let p = Proc::spawn(&config, &data);
    let v = wait_state(&p.url, "seq", "completed", Duration::from_secs(60)).await;
    assert_eq!(v["progress"]["sent"], N as u64, "{v}");

    let got = rx.requests();
    let seqs: Vec<u64> = got.iter().map(seq_of).collect();
    // Every message, in order; the only repeat allowed is a message in flight at the kill.
    let mut want = 0u64;
    for s in &seqs {
        assert!(
            *s == want || *s + 1 == want,
            "out of order or skipped: {seqs:?}"
        );
        want = s + 1;
    }
    assert_eq!(want, N as u64, "every message arrived: {seqs:?}");

    // The arrivals after the restart (monotonic stamps at the receiver; anything the killed
    // process had on the wire arrived long before it).
    let first_after = got
        .iter()
        .position(|r| r.at > restarted)
        .expect("messages after the restart");
    assert!(first_after >= 5, "{seqs:?}");
    let after = &got[first_after..];
    assert!(
        after.len() >= 5,
        "{} messages left for the restarted process: kill came too late",
        after.len()
    );
    let gaps: Vec<f64> = got[first_after - 1..]
        .windows(2)
        .map(|w| w[1].at.duration_since(w[0].at).as_secs_f64() * 1_000.0)
        .collect();
    eprintln!("pacing_restart: gaps across and after the restart (ms): {gaps:.1?}");
    // The first gap spans the outage; every later one is the interval, give or take one
    // request's delivery jitter: never the interval plus the outage.
    let interval = INTERVAL_MS as f64;
    assert!(
        gaps[0] >= interval,
        "the first resumed message came {:.1} ms after the last one before the kill",
        gaps[0]
    );
    for (k, g) in gaps.iter().enumerate().skip(1) {
        assert!(
            *g < interval + JITTER_MS,
            "gap {k} after the restart is {g:.1} ms (interval {INTERVAL_MS} ms): {gaps:.1?}"
        );
        assert!(
            *g > interval - JITTER_MS,
            "gap {k} after the restart is {g:.1} ms (interval {INTERVAL_MS} ms): {gaps:.1?}"
        );
    }
    // Never shorter than the interval as herald started them (its own send stamps, whole
    // ms): a repeat of the message in flight at the kill is the same attempt's successor and
    // is paced like any other.
    for (k, w) in after.windows(2).enumerate() {
        let d = sent_at(&w[1]) - sent_at(&w[0]);
        assert!(
            d >= interval,
            "sends {k} and {} after the restart started {d} ms apart (interval {INTERVAL_MS} ms)",
            k + 1
        );
    }
}
