//! A chunk of due sends to a local channel (`engine/chunk.rs`) that had to wait for the
//! channel's permits asks again, once it has them, what its sends were admitted on — as one
//! send does after its wait for a slot (`tests/slot_wait.rs`): a drain begun meanwhile sends
//! nothing, the rate limit counts from when the sends start, and a run's pacing too.
//!
//! On the manual clock: the test holds every permit of the `out` file channel itself, moves
//! the clock while the chunk waits, then lets the permits go.

mod common;

use std::time::Duration;

use common::herald::{poll, utc_ms, ManualHerald};
use herald::schedule::format_utc;
use serde_json::{json, Value};

const START: &str = "2026-12-01T10:00:00Z";
/// The `out` channel's concurrency (every permit is held by the test while the chunk waits).
const PERMITS: u32 = 4;

fn sent_at(v: &Value) -> u64 {
    utc_ms(v["sent_at"].as_str().unwrap())
}

async fn one_shot(h: &ManualHerald, id: &str, at: u64) {
    h.post(
        &json!({"id": id, "channel": "out", "schedule": {"at": format_utc(at)},
        "to": ["a"], "body": id}),
    )
    .await;
}

/// Every permit of the `out` channel, held until dropped.
async fn hold_permits(h: &ManualHerald) -> tokio::sync::OwnedSemaphorePermit {
    h.hold_permits("out", PERMITS).await
}

/// Moves the clock to `at` and waits until `n` sends in all have gone to a chunk (each
/// chunk's sends are counted before it asks for the channel's permits).
async fn chunk_waits_at(h: &ManualHerald, at: u64, n: u64) {
    h.clock.set(at);
    h.server().engine.wake();
    let engine = &h.server().engine;
    let waiting = poll(Duration::from_secs(10), || async move {
        (engine.chunked_sends() >= n).then_some(())
    })
    .await;
    assert!(
        waiting.is_some(),
        "{} of {n} sends reached a chunk",
        engine.chunked_sends()
    );
}

/// Waits until no send is out (the chunks that waited are settled).
async fn settled(h: &ManualHerald) {
    let engine = &h.server().engine;
    let done = poll(Duration::from_secs(10), || async move {
        (engine.sends_in_flight() == 0).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "{} sends still out",
        engine.sends_in_flight()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_waited_for_permits_sends_nothing_once_a_drain_began() {
    let start = utc_ms(START);
    let mut h = ManualHerald::start(start, &format!("concurrency = {PERMITS}")).await;
    let due = start + 10_000;
    for id in ["a", "b"] {
        one_shot(&h, id, due).await;
    }
    h.run_until(due - 1).await;
    let permits = hold_permits(&h).await;
    chunk_waits_at(&h, due, 2).await;
    // The drain begins during the wait: nothing may start after it.
    h.server().engine.begin_drain();
    h.clock.set(due + 3_000);
    drop(permits);
    settled(&h).await;
    assert!(
        h.sent().is_empty(),
        "sent after the drain began: {:?}",
        h.sent()
    );

    // The next boot, past the instant, sends each once, as its first attempt (the held
    // settle took the mark back: not a send cut short).
    h.restart().await;
    h.run_until(due + 10_000).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    for s in &sent {
        assert_eq!(s["attempt"], 1, "{s}");
    }
    for id in ["a", "b"] {
        assert_eq!(h.task(id).await["state"], "completed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_waited_for_permits_keeps_the_channels_rate() {
    let start = utc_ms(START);
    let config = format!("concurrency = {PERMITS}\nrate = \"2/1s\"");
    let h = ManualHerald::start(start, &config).await;
    let due = start + 10_000;
    // Two chunks, 1.5 s apart: each admitted by the limiter at its own instant (2 a second),
    // both waiting for the permits the test holds until due + 2 s.
    for id in ["a1", "a2"] {
        one_shot(&h, id, due).await;
    }
    for id in ["b1", "b2"] {
        one_shot(&h, id, due + 1_500).await;
    }
    h.run_until(due - 1).await;
    let permits = hold_permits(&h).await;
    chunk_waits_at(&h, due, 2).await;
    chunk_waits_at(&h, due + 1_500, 4).await;
    h.clock.set(due + 2_000);
    drop(permits);
    settled(&h).await;
    h.run_until(due + 20_000).await;
    let mut at: Vec<u64> = h.sent().iter().map(sent_at).collect();
    at.sort_unstable();
    assert_eq!(at.len(), 4, "every task sent once: {at:?}");
    // 2 a second: no three sends within one second.
    for w in at.windows(3) {
        assert!(
            w[2] - w[0] >= 1_000,
            "three sends within a second at a rate of 2/1s: {:?}",
            at.iter().map(|t| t - due).collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_in_a_chunk_that_waited_counts_its_interval_from_the_send() {
    let start = utc_ms(START);
    let h = ManualHerald::start(start, &format!("concurrency = {PERMITS}")).await;
    let due = start + 10_000;
    h.post(
        &json!({"id": "seq", "channel": "out", "schedule": {"at": format_utc(due)},
        "messages": [{"to": "a", "body": "one"}, {"to": "b", "body": "two"}],
        "pacing": {"interval": "1s"}}),
    )
    .await;
    // A second task due with it, so the two sends go as a chunk.
    one_shot(&h, "other", due).await;
    h.run_until(due - 1).await;
    let permits = hold_permits(&h).await;
    chunk_waits_at(&h, due, 2).await;
    // The chunk waits 3 s for the permits: the sequence's first message starts then.
    h.clock.set(due + 3_000);
    drop(permits);
    settled(&h).await;
    h.run_until(due + 20_000).await;
    let seq: Vec<u64> = h
        .sent()
        .iter()
        .filter(|v| v["task_id"] == "seq")
        .map(sent_at)
        .collect();
    assert_eq!(seq.len(), 2, "{seq:?}");
    assert_eq!(
        seq[0],
        due + 3_000,
        "the first message went once the chunk had its permits"
    );
    assert!(
        seq[1] - seq[0] >= 1_000,
        "the second message {} ms after the first: the interval is 1 s from the first's start",
        seq[1] - seq[0]
    );
    assert_eq!(h.task("seq").await["state"], "completed");
}
