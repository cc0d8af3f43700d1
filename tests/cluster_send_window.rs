//! Cluster mode, a send window that closes while the shard stays held (HA.md "The send
//! itself"): a renewal answered late can leave too little trust to start a send and still
//! extend the trust before it ends, so the shard is never dropped and nothing loads it again.
//! A step that found the window closed must come back by itself; before it did, the message
//! stayed in flight for good (nemesis seed 2912061). The window is closed here through the
//! test knob `HERALD_TEST_WINDOW_GATE` (a file: while it exists, every send window reads
//! closed), the shards held all along.

mod common;

use std::time::Duration;

use common::cluster::{node_command, owned, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

const SHARDS: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_found_the_window_closed_sends_once_it_opens() {
    let Some(pg) = PgServer::start("cluster_send_window") else {
        return;
    };
    let url = pg.create_db("window");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("window-closed");
    let a = common::cluster::lone_node_with_knob(
        &url,
        dir.path(),
        SHARDS,
        &rx.url(),
        herald::engine::cluster::WINDOW_GATE_ENV,
        &gate,
    )
    .await;

    std::fs::write(&gate, b"closed").unwrap();
    let task = json!({"id": "held-back", "channel": "hook", "schedule": {"at": in_ms(800)},
        "to": ["r"], "body": "late but once"});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // It fires and its message is marked in flight (the mark is written before the window
    // is looked at); the send does not start.
    poll(Duration::from_secs(20), || async {
        let v = http::get(&format!("{}/v1/tasks/held-back", a.url))
            .await
            .json();
        (v["progress"]["in_flight"] == 1).then_some(())
    })
    .await
    .expect("the message is marked in flight");
    // The fault's length past that: the step has looked at the window and found it closed.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(rx.count(), 0, "no send started while the window was closed");
    assert_eq!(
        owned(&a.url).await,
        u64::from(SHARDS),
        "the shards stayed held: nothing will load them again"
    );

    std::fs::remove_file(&gate).unwrap();
    let got = rx.wait_for(1, Duration::from_secs(15)).await;
    assert_eq!(
        got.len(),
        1,
        "the held-back message goes once the window opens"
    );
    poll(Duration::from_secs(15), || async {
        let v = http::get(&format!("{}/v1/tasks/held-back", a.url))
            .await
            .json();
        (v["state"] == "completed").then_some(())
    })
    .await
    .expect("the task completes");
    assert_eq!(rx.count(), 1, "sent once");
}

/// The send window bounds the send, not its wait for a slot of the channel (HA.md "The send
/// itself": a send starts only with at least `safety` of trust left, its request deadline
/// inside the window). With one slot and a receiver slower than the timeout, the sends queue
/// for the slot far longer than the window; each one, once it has the slot, reads the window
/// again and goes. Before, the cut-off at the window's end (read before the wait) covered the
/// wait: a queued send was cut off while it waited, its only attempt burned, and it reached
/// the failure list without ever being sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_queued_for_a_slot_longer_than_the_window_is_still_sent() {
    let Some(pg) = PgServer::start("cluster_send_window_slot") else {
        return;
    };
    let url = pg.create_db("slot");
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Slow(Duration::from_secs(3)));
    let dir = tempfile::tempdir().unwrap();
    let hook = format!(
        "url = \"{}\"\ntimeout = \"1s\"\nconcurrency = 1\n",
        rx.url()
    );
    let a = Proc::start(node_command(
        &url,
        dir.path(),
        "a",
        "a",
        SHARDS,
        &hook,
        TEST_TIMING,
    ));
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");

    const N: usize = 8;
    for i in 0..N {
        let task = json!({"id": format!("q{i}"), "channel": "hook", "schedule": {"after": "0s"},
            "to": ["r"], "body": "x", "retry": {"max_attempts": 1}});
        let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // One attempt each, one at a time, each given up after the 1 s timeout.
    let listed = poll(Duration::from_secs(60), || async {
        let v = http::get(&format!("{}/v1/failures", a.url)).await.json();
        let list = v["failures"].as_array().cloned().unwrap_or_default();
        (list.len() == N).then_some(list)
    })
    .await
    .expect("every message in the failure list");
    let seen: Vec<String> = rx
        .requests()
        .iter()
        .filter_map(|r| r.idempotency_key().map(str::to_string))
        .collect();
    for f in &listed {
        let id = f["id"].as_str().unwrap_or_default();
        assert!(
            seen.iter().any(|k| k == id),
            "{id} was given up on without ever being sent ({} sent: {seen:?})",
            seen.len()
        );
        assert_eq!(f["attempts"], 1, "{f}");
    }
}

/// A send under way follows the trust as renewals extend it (HA.md: no send the single node
/// would not also make). The window here is ~1.5 s (`TEST_TIMING`), renewed every 400 ms;
/// the receiver takes 2 s, inside the channel's 5 s timeout. Before, the send was cut off at
/// the trust end it saw when it started, and retried with the same key by the same owner:
/// every attempt was cut off, the receiver saw three, and the message reached the failure
/// list, although the shards were held all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_longer_than_the_window_goes_on_while_renewals_extend_the_trust() {
    let Some(pg) = PgServer::start("cluster_send_window_follow") else {
        return;
    };
    let url = pg.create_db("follow");
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Slow(Duration::from_secs(2)));
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("url = \"{}\"\ntimeout = \"5s\"\n", rx.url());
    let a = Proc::start(node_command(
        &url,
        dir.path(),
        "a",
        "a",
        SHARDS,
        &hook,
        TEST_TIMING,
    ));
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");

    let task = json!({"id": "slow", "channel": "hook", "schedule": {"after": "0s"},
        "to": ["r"], "body": "x",
        "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "1s"}});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let state = poll(Duration::from_secs(30), || async {
        let v = http::get(&format!("{}/v1/tasks/slow", a.url)).await.json();
        let s = v["state"].as_str().unwrap_or_default().to_string();
        (s == "completed" || s == "failed").then_some(s)
    })
    .await
    .expect("the task finishes");
    let failures = http::get(&format!("{}/v1/failures", a.url)).await.json();
    assert_eq!(
        failures["failures"].as_array().map_or(0, Vec::len),
        0,
        "no failure entry: {failures}"
    );
    assert_eq!(state, "completed");
    assert_eq!(
        rx.count(),
        1,
        "delivered once, no attempt cut off while the trust was renewed"
    );
}

/// A shard let go cuts its sends under way at once (`node.rs`: `Dropped` means "stop its
/// sends"), not at the end of the trust they last read. The epochs are moved on in the
/// database behind the node's back, so its next renewal (1 s) comes back without its shards
/// (`Dropped::Lost`), about 18 s before its trust (a 20 s lease) would end. The receiver never
/// answers; the channel's timeout is a minute. Before, the send ran on to the end of the
/// trust it saw when it began (~19 s), on a shard nobody here held any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_let_go_cuts_its_send_under_way_at_once() {
    let Some(pg) = PgServer::start("cluster_send_window_drop") else {
        return;
    };
    let url = pg.create_db("drop");
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Hang);
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("url = \"{}\"\ntimeout = \"60s\"\n", rx.url());
    let timing = "lease = \"20s\"\nrenew = \"1s\"\nsafety = \"1s\"\n";
    let a = Proc::start(node_command(
        &url,
        dir.path(),
        "a",
        "a",
        SHARDS,
        &hook,
        timing,
    ));
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");

    let task = json!({"id": "hung", "channel": "hook", "schedule": {"after": "0s"},
        "to": ["r"], "body": "x"});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let open = poll(Duration::from_secs(20), || async {
        let open = rx.open_connections();
        (rx.count() == 1 && open >= 1).then_some(open)
    })
    .await
    .expect("the attempt reaches the receiver and is held open");

    pg.psql(&url, "UPDATE herald_shard SET epoch = epoch + 1");
    let moved = std::time::Instant::now();
    poll(Duration::from_secs(10), || async {
        (rx.open_connections() < open).then_some(())
    })
    .await
    .expect("the attempt's connection is closed once the shard is let go");
    assert!(
        moved.elapsed() < Duration::from_secs(6),
        "cut off {:?} after the epochs moved: at the drop (the next renewal, 1 s), not at \
         the end of the 20 s trust",
        moved.elapsed()
    );
    assert_eq!(rx.count(), 1, "nothing sent again meanwhile");
}

/// As above, with the engine's event loop busy while the shard is dropped: it loads granted
/// shards one after another, inline (seconds each during a failover), and handles a `Dropped`
/// only after the loads queued ahead of it. Here another shard is freed behind the node's back
/// and taken again, and its load held (`HERALD_TEST_LOAD_HOLD`) while the hung send's shard
/// is dropped. Before, the send was cut off only when the engine reached the drop (after the
/// held load, here never) or at the end of its trust (~19 s): the lease loop now lets the
/// shard go as it drops it (`node.rs`, `Loop::report`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_let_go_cuts_its_send_at_once_while_the_engine_loads_another() {
    let Some(pg) = PgServer::start("cluster_send_window_busy") else {
        return;
    };
    let url = pg.create_db("busy");
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Hang);
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("loads-held");
    let hook = format!("url = \"{}\"\ntimeout = \"60s\"\n", rx.url());
    let timing = "lease = \"20s\"\nrenew = \"1s\"\nsafety = \"1s\"\n";
    let mut cmd = node_command(&url, dir.path(), "a", "a", SHARDS, &hook, timing);
    cmd.env(herald::engine::cluster::LOAD_HOLD_ENV, &hold);
    let a = Proc::start(cmd);
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("a takes every shard");

    let task = json!({"id": "hung", "channel": "hook", "schedule": {"after": "0s"},
        "to": ["r"], "body": "x"});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &task).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let open = poll(Duration::from_secs(20), || async {
        let open = rx.open_connections();
        (rx.count() == 1 && open >= 1).then_some(open)
    })
    .await
    .expect("the attempt reaches the receiver and is held open");

    // Another shard freed behind a's back: its renewal drops it, a balancing round takes it
    // again at a new epoch, and that grant's load waits while the file exists.
    let sent_on = herald::store::pg::fence::shard_of_task("hung", SHARDS);
    let other = (sent_on + 1) % SHARDS;
    let epoch = |shard: u32| {
        pg.psql(
            &url,
            &format!(
                "SELECT epoch FROM herald_shard WHERE shard_id = {shard} \
                 AND owner_incarnation IS NOT NULL"
            ),
        )
    };
    let freed_at = epoch(other);
    std::fs::write(&hold, b"held").unwrap();
    pg.psql(
        &url,
        &format!(
            "UPDATE herald_shard SET epoch = epoch + 1, owner_node = NULL, \
             owner_incarnation = NULL, lease_expires = NULL WHERE shard_id = {other}"
        ),
    );
    poll(Duration::from_secs(10), || async {
        let now = epoch(other);
        (!now.is_empty() && now != freed_at).then_some(())
    })
    .await
    .expect("a takes the freed shard again; its load is held");

    pg.psql(
        &url,
        &format!("UPDATE herald_shard SET epoch = epoch + 1 WHERE shard_id = {sent_on}"),
    );
    let moved = std::time::Instant::now();
    let cut = poll(Duration::from_secs(10), || async {
        (rx.open_connections() < open).then_some(())
    })
    .await;
    let took = moved.elapsed();
    std::fs::remove_file(&hold).unwrap();
    cut.expect("the attempt's connection is closed once the shard is dropped, load or not");
    assert!(
        took < Duration::from_secs(6),
        "cut off {took:?} after the epoch moved: at the drop (the next renewal, 1 s), not \
         behind the held load or at the end of the 20 s trust"
    );
    assert_eq!(rx.count(), 1, "nothing sent again meanwhile");
}
