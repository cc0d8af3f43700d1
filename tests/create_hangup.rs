//! A create whose client hangs up before the answer, and the client's retry of it (nemesis
//! seed 2912089). hyper drops a request's future when its client closes the connection; a
//! create dropped after its write went to the store left the task durable but never armed,
//! and its cell in the live map, where the retry took it for a task that exists and answered
//! 409 at once, before anything was stored. The client, told "it exists", cancelled it and
//! got 404. Now a request that changes something runs to its end on its own, and a create
//! that finds another create of its id in progress waits for it before it answers.
//!
//! The database is slowed by a proxy (every byte 700 ms late each way), so the create's
//! write takes seconds and the client's 1 s patience runs out while it is on its way.

mod common;

use std::time::{Duration, Instant};

use common::herald::in_ms;
use common::http;
use common::pgproxy::ProxiedNode;
use common::receiver::Receiver;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_client_hung_up_is_stored_armed_and_sent_once() {
    let rx = Receiver::start().await;
    let hook = common::herald::webhook_channel("hook", &rx.url(), "timeout = \"1s\"");
    let Some(t) = ProxiedNode::start("create_hangup", "hangup", &hook) else {
        return;
    };
    let (node, proxy) = (&t.node, &t.proxy);
    let tasks = format!("{}/v1/tasks", node.url);

    // Due well after the slowed write is in: its instant is the one thing that sends it.
    let task = json!({"id": "hung-up", "channel": "hook", "schedule": {"at": in_ms(20_000)},
        "to": ["r"], "body": "once"});
    let body = serde_json::to_vec(&task).unwrap();
    proxy.delay(Duration::from_millis(700));

    // The first try: the client gives up after 1 s and closes the connection.
    let first = tokio::time::timeout(
        Duration::from_secs(1),
        http::try_request("POST", &tasks, &[], Some(body.clone())),
    )
    .await;
    assert!(
        first.is_err(),
        "the slowed create answered within the client's patience: {first:?}; the test proves nothing"
    );

    // The retry, at once, while the first try's write is still on its way.
    let asked = Instant::now();
    let retry = http::request("POST", &tasks, &[], Some(body)).await;
    let answered = asked.elapsed();
    assert_eq!(
        retry.status,
        409,
        "the retry finds the first try's task: {}",
        retry.text()
    );
    // A 409 says the task exists: it must be readable now (before the fix: 404, it was
    // still on its way, and without the first try's end it was never armed).
    let got = http::get(&format!("{tasks}/hung-up")).await;
    assert_eq!(
        got.status,
        200,
        "409 was answered {answered:?} after the retry was sent, and then the task is not there: {}",
        got.text()
    );
    let state = got.json()["state"].clone();
    assert!(state == "pending" || state == "running", "{}", got.text());

    // The database at speed again: the task goes at its instant, once.
    proxy.delay(Duration::ZERO);
    let sent = rx.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(sent.len(), 1, "the first try's task is sent");
    common::herald::wait_state(&node.url, "hung-up", "completed", Duration::from_secs(15)).await;
    assert_eq!(rx.count(), 1, "sent once");
}

/// herald's connections now, from `/metrics` (the scrape's own connection included).
async fn open_connections(base: &str) -> f64 {
    common::cluster::metric(base, "herald_http_connections_open").await
}

/// A request whose client hung up runs to its end, and until then it keeps its connection's
/// slot taken: such requests count against `connections_max` and cannot pile up past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_client_hung_up_holds_its_connection_slot_to_its_end() {
    let config = "[limits]\nconnections_max = 16\n";
    let Some(t) = ProxiedNode::start("create_hangup_slot", "hangup_slot", config) else {
        return;
    };
    let (node, proxy) = (&t.node, &t.proxy);
    let tasks = format!("{}/v1/tasks", node.url);
    let task = json!({"id": "slot", "schedule": {"after": "1h"}, "to": ["r"], "body": "x"});
    // A scrape before the delay: its task census (from the database) is then cached, and
    // the scrapes below answer from memory.
    assert_eq!(open_connections(&node.url).await, 1.0);
    proxy.delay(Duration::from_millis(300));

    let first = tokio::time::timeout(
        Duration::from_secs(1),
        http::try_request(
            "POST",
            &tasks,
            &[],
            Some(serde_json::to_vec(&task).unwrap()),
        ),
    )
    .await;
    assert!(
        first.is_err(),
        "answered within the client's patience: {first:?}"
    );
    let hung_up = Instant::now();

    // The create's write takes several round trips to the database, 0.6 s each: it ends
    // seconds after its client left, and until then its slot stays taken (before the fix it
    // was freed a few ms after the client left). Every scrape in the first 0.9 s must count it.
    let mut scrapes = 0;
    let freed = loop {
        let started = hung_up.elapsed();
        let open = open_connections(&node.url).await;
        let took = hung_up.elapsed() - started;
        assert!(
            took < Duration::from_millis(500),
            "a scrape took {took:?}: it reads the delayed database, and the timing proves nothing"
        );
        if open == 1.0 {
            break started;
        }
        scrapes += 1;
        assert!(
            started < Duration::from_secs(30),
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        freed >= Duration::from_millis(900),
        "the slot was free {freed:?} after the client left, before its create could end ({scrapes} scrapes counted it)"
    );
    // And the create did end: the task is stored.
    proxy.delay(Duration::ZERO);
    let got = http::get(&format!("{tasks}/slot")).await;
    assert_eq!(got.status, 200, "{}", got.text());
}
