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

/// A send that waits for a free slot of its channel (`concurrency`) waits outside the task's
/// lock, so a cancel or a pause can be answered during the wait; once it is, the send must not
/// go when the slot frees. It is held (`held`, why `stopped`) with its attempt unspent: the
/// cancelled run ends, the paused one sends on resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_waiting_for_a_channel_slot_does_not_go_after_a_cancel_or_a_pause() {
    use common::herald::{poll, wait_state};
    use common::receiver::Behavior;
    let rx = Receiver::start().await;
    // Long enough for two creates, their durable marks, the polls and two commands on a
    // loaded machine, all while the slot is held.
    rx.set_default(Behavior::Slow(Duration::from_secs(6)));
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "concurrency = 1")).await;
    let one = |id: &str| json!({"id": id, "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"});
    // `hold`'s request takes the channel's one slot for 6 s.
    assert_eq!(
        http::post_json(&h.url("/v1/tasks"), &one("hold"))
            .await
            .status,
        201
    );
    rx.wait_for(1, Duration::from_secs(10)).await;
    for id in ["cancelled", "paused"] {
        assert_eq!(
            http::post_json(&h.url("/v1/tasks"), &one(id)).await.status,
            201
        );
    }
    // Both armed (their in-flight marks are durable) and waiting for the slot.
    for id in ["cancelled", "paused"] {
        poll(Duration::from_secs(10), || async {
            let v = http::get(&h.url(&format!("/v1/tasks/{id}"))).await.json();
            (v["progress"]["in_flight"] == 1).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{id} armed"));
    }
    assert_eq!(rx.count(), 1, "the slot is still held: nothing else went");
    let r = http::request("POST", &h.url("/v1/tasks/cancelled/cancel"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::request("POST", &h.url("/v1/tasks/paused/pause"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The slot frees when `hold` is answered; the two waiting sends then decide, and say so.
    wait_state(&h.url(""), "hold", "completed", Duration::from_secs(20)).await;
    for id in ["cancelled", "paused"] {
        poll(Duration::from_secs(10), || async {
            let t = http::get(&h.url(&format!("/v1/tasks/{id}/timeline")))
                .await
                .json();
            t["events"]
                .as_array()?
                .iter()
                .any(|e| e["kind"] == "held" && e["detail"]["why"] == "stopped")
                .then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{id}: a held event, why stopped"));
    }
    assert_eq!(
        rx.count(),
        1,
        "neither went after its cancel or pause was answered"
    );
    let v = http::get(&h.url("/v1/tasks/cancelled")).await.json();
    assert_eq!(v["state"], "cancelled");
    // The paused one goes on resume, as its first attempt.
    let r = http::request("POST", &h.url("/v1/tasks/paused/resume"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = rx.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].idempotency_key(), Some("paused:1:0"));
    let attempt = got[1].json.as_ref().map(|j| j["attempt"].clone());
    assert_eq!(attempt, Some(json!(1)), "the held attempt was not spent");
    wait_state(&h.url(""), "paused", "completed", Duration::from_secs(10)).await;
}

/// A cancelled task whose last send is still out is deleted only once that send is settled: on
/// disk its run already reads cancelled, and the delete went ahead, after which the settle
/// wrote a run record and timeline events of a task that no longer existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_is_deleted_only_after_its_last_send_is_settled() {
    use common::herald::poll;
    use common::receiver::Behavior;
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Slow(Duration::from_millis(1_000)));
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "")).await;
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "s", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201);
    // The send is out: the receiver holds it 1 s.
    rx.wait_for(1, Duration::from_secs(10)).await;
    let r = http::request("POST", &h.url("/v1/tasks/s/cancel"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::delete(&h.url("/v1/tasks/s")).await;
    assert_eq!(r.status, 409, "deleted under its send: {}", r.text());
    assert!(r.text().contains("still settling"), "{}", r.text());
    // Once the answer is settled, the delete goes through and nothing of the task is left.
    poll(Duration::from_secs(10), || async {
        (http::delete(&h.url("/v1/tasks/s")).await.status == 200).then_some(())
    })
    .await
    .expect("deleted once the send settled");
    assert_eq!(http::get(&h.url("/v1/tasks/s")).await.status, 404);
    assert_eq!(http::get(&h.url("/v1/tasks/s/runs")).await.status, 404);
    assert_eq!(http::get(&h.url("/v1/tasks/s/timeline")).await.status, 404);
}

/// A failure-list retry that waits for a free slot of its channel (`concurrency = 1`, held by
/// a slow send) does not go once its task's cancel has been answered meanwhile: it looked at
/// the task before its wait, so it looks again after it. The entry stays, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_retry_waiting_for_a_channel_slot_does_not_go_after_a_cancel() {
    use common::herald::{poll, wait_state};
    use common::receiver::Behavior;
    let rx = Receiver::start().await;
    rx.script_key("victim:1:0", vec![Behavior::Status(400)]);
    let h = TestHerald::start(&webhook_channel("hook", &rx.url(), "concurrency = 1")).await;
    // Two messages 10 minutes apart: the first fails for good, the task stays running.
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "victim", "channel": "hook", "schedule": {"after": "0s"},
                "to": ["a", "b"], "body": "x", "pacing": {"interval": "10m"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let entry = || async {
        let r = http::get(&h.url("/v1/failures?task=victim")).await;
        r.json()["failures"].as_array()?.first().cloned()
    };
    poll(Duration::from_secs(10), entry)
        .await
        .expect("the first message is on the failure list");
    rx.set_default(Behavior::Slow(Duration::from_millis(1_500)));
    let r = http::post_json(
        &h.url("/v1/tasks"),
        &json!({"id": "hold", "channel": "hook", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    rx.wait_for(2, Duration::from_secs(10)).await;
    let r = http::request("POST", &h.url("/v1/failures/victim:1:0/retry"), &[], None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let r = http::request("POST", &h.url("/v1/tasks/victim/cancel"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_state(&h.url(""), "hold", "completed", Duration::from_secs(10)).await;
    let entry = poll(Duration::from_secs(10), || async {
        let v = entry().await?;
        (v["retrying"] == false).then_some(v)
    })
    .await
    .expect("the retry stopped");
    assert!(
        entry["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("cancelled")),
        "{entry}"
    );
    let sent = rx
        .requests()
        .iter()
        .filter(|r| r.idempotency_key() == Some("victim:1:0"))
        .count();
    assert_eq!(sent, 1, "the retry went after the cancel was answered");
}
