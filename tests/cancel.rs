//! Cancel takes effect at once: after the answer no send of the task starts, the task reads
//! `cancelled`, and a pending task never fires.

mod common;

use std::time::{Duration, Instant};

use common::herald::{webhook_channel, TestHerald};
use common::http;
use common::receiver::Receiver;
use serde_json::json;

#[tokio::test]
async fn cancel_in_the_middle_of_a_sequence_stops_it() {
    let rx = Receiver::start().await;
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "c", "channel": "hook", "schedule": {"after": "0s"},
                "to": (0..30).map(|i| format!("u{i}")).collect::<Vec<_>>(), "body": "x",
                "pacing": {"interval": "100ms"}}),
    )
    .await;
    assert_eq!(r.status, 201);
    assert!(rx.wait_for(5, Duration::from_secs(10)).await.len() >= 5);

    let r = http::request("POST", &h.url("/v1/tasks/c/cancel"), &[], None).await;
    let answered = Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["state"], "cancelled");
    let sent = v["progress"]["sent"].as_u64().unwrap();
    let in_flight = v["progress"]["in_flight"].as_u64().unwrap();
    assert!((5..30).contains(&sent), "sent {sent}");

    // Observe for 5 intervals: nothing new may start. (A fixed window is the point here: we
    // are checking that something does *not* happen.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = rx.requests();
    let after_answer = got.iter().filter(|r| r.at > answered).count() as u64;
    assert!(
        after_answer <= in_flight,
        "{after_answer} sends arrived after the cancel answer; {in_flight} was in flight"
    );
    assert!(got.len() as u64 <= sent + in_flight);
    assert!(got.len() < 30);

    let v = http::get(&h.url("/v1/tasks/c")).await.json();
    assert_eq!(v["state"], "cancelled");
    let runs = http::get(&h.url("/v1/tasks/c/runs")).await.json();
    assert_eq!(runs["runs"][0]["state"], "cancelled");

    // Cancelling again is a conflict; the state does not change.
    let r = http::request("POST", &h.url("/v1/tasks/c/cancel"), &[], None).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

#[tokio::test]
async fn delete_cancels_an_unfinished_task_and_deletes_a_finished_one() {
    let rx = Receiver::start().await;
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "p", "channel": "hook", "schedule": {"after": "1h"},
                "messages": [{"to": "a", "body": "b"}]}),
    )
    .await;
    assert_eq!(r.status, 201);
    // The contract's first meaning: DELETE of an unfinished task cancels it; it stays readable.
    let r = http::delete(&h.url("/v1/tasks/p")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "cancelled");
    assert_eq!(
        http::get(&h.url("/v1/tasks/p")).await.json()["state"],
        "cancelled"
    );
    // Finished now: DELETE deletes it.
    let r = http::delete(&h.url("/v1/tasks/p")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["state"], "cancelled");
    assert_eq!(http::get(&h.url("/v1/tasks/p")).await.status, 404);
    assert_eq!(http::delete(&h.url("/v1/tasks/nope")).await.status, 404);
    assert_eq!(rx.count(), 0);
}
