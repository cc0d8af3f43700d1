//! The cluster history checker (`tests/common/history.rs`) on hand-made histories: a good one
//! passes, and each promise broken on its own is named — so a nemesis run that passes the
//! checker passed something that can fail.

mod common;

use common::history::{check, duplicates_since, Cancel, Delivery, Expected, History};

fn exp(key: &str, due_ms: f64, shard: u32) -> Expected {
    Expected {
        key: key.into(),
        due_ms,
        shard,
    }
}

fn del(key: &str, epoch: u64, at_ms: f64, done_ms: f64) -> Delivery {
    Delivery {
        key: key.into(),
        epoch: Some(epoch),
        at_ms,
        done_ms: Some(done_ms),
    }
}

/// A sequence of three on shard 1 (owned at epoch 1, then taken over at epoch 2, the message
/// in flight re-sent once), a one-shot on shard 2, a cancelled task and a failed one.
fn good() -> History {
    History {
        expected: vec![
            exp("a:r:0", 1_000.0, 1),
            exp("a:r:1", 1_500.0, 1),
            exp("a:r:2", 2_000.0, 1),
            exp("b:r:0", 1_000.0, 2),
            exp("c:r:0", 9_000.0, 2),
            exp("d:r:0", 1_000.0, 2),
        ],
        deliveries: vec![
            del("a:r:0", 1, 1_001.0, 1_010.0),
            del("a:r:1", 1, 1_501.0, 1_510.0),
            del("a:r:1", 2, 4_000.0, 4_010.0),
            del("a:r:2", 2, 4_500.0, 4_510.0),
            del("b:r:0", 1, 1_002.0, 1_004.0),
        ],
        cancels: vec![Cancel {
            task: "c".into(),
            answered_ms: 3_000.0,
        }],
        failed: ["d:r:0".to_string()].into(),
        epochs: vec![(1, 1), (2, 1), (1, 1), (1, 2), (2, 1)],
        max_clock_offset_ms: 500.0,
        slack_ms: 50.0,
    }
}

fn violations(h: &History) -> String {
    check(h).join("\n")
}

#[test]
fn a_history_that_keeps_every_promise_passes() {
    assert_eq!(check(&good()), Vec::<String>::new());
}

#[test]
fn an_acknowledged_message_that_never_arrives_is_named() {
    let mut h = good();
    h.deliveries.retain(|d| d.key != "b:r:0");
    assert!(violations(&h).contains("b:r:0: acknowledged, never delivered"));
}

#[test]
fn more_deliveries_than_owner_changes_allow_are_named() {
    let mut h = good();
    // Shard 2 never changed owner: a second delivery of b is a duplicate.
    h.deliveries.push(del("b:r:0", 1, 3_000.0, 3_001.0));
    assert!(violations(&h).contains("b:r:0: delivered 2 times, shard 2 changed owner 0 times"));
    // Shard 1 changed owner once: a third delivery of a:r:1 is one too many.
    let mut h = good();
    h.deliveries.push(del("a:r:1", 2, 6_000.0, 6_001.0));
    assert!(violations(&h).contains("a:r:1: delivered 3 times"));
}

#[test]
fn overlapping_attempts_are_named() {
    let mut h = good();
    h.deliveries[2].at_ms = 1_505.0; // starts while the first attempt is still answering
    assert!(violations(&h).contains("a:r:1: two attempts overlap"));
}

#[test]
fn seq_order_broken_within_a_run_is_named() {
    let mut h = good();
    h.deliveries[0].at_ms = 1_600.0; // seq 0 first arrives after seq 1
    h.deliveries[0].done_ms = Some(1_601.0);
    assert!(violations(&h).contains("a:r: seq 1 arrived before seq 0"));
}

#[test]
fn epochs_that_go_back_are_named() {
    let mut h = good();
    h.epochs.push((1, 1));
    assert!(violations(&h).contains("shard 1: epoch 1 sampled after epoch 2"));
    let mut h = good();
    h.deliveries[2].epoch = Some(0);
    assert!(violations(&h).contains("a:r:1: epochs go back across attempts"));
}

#[test]
fn a_send_before_due_beyond_the_offset_is_named() {
    let mut h = good();
    h.deliveries[4].at_ms = 400.0; // due at 1 000, offset 500, slack 50
    assert!(violations(&h).contains("b:r:0: arrived 600 ms before it was due"));
    // Within the offset the cluster allows, it is not a violation.
    let mut h = good();
    h.deliveries[4].at_ms = 600.0;
    h.deliveries[4].done_ms = Some(601.0);
    assert_eq!(check(&h), Vec::<String>::new());
}

#[test]
fn a_delivery_after_the_cancel_answer_is_named() {
    let mut h = good();
    h.deliveries.push(del("c:r:0", 1, 3_200.0, 3_201.0));
    assert!(violations(&h).contains("c:r:0: arrived 200 ms after its cancel was answered"));
}

#[test]
fn duplicates_after_an_instant_are_listed() {
    let h = good();
    assert_eq!(duplicates_since(&h.deliveries, 0.0), vec!["a:r:1"]);
    assert!(duplicates_since(&h.deliveries, 2_000.0).is_empty());
}
