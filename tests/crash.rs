//! Durability by killing the real process (SIGKILL, no shutdown code runs) and restarting it
//! on the same data directory.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::json;

fn seq_of(r: &common::receiver::Recorded) -> u64 {
    r.json.as_ref().expect("json body")["seq"]
        .as_u64()
        .expect("seq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_sequence_resumes_at_the_cursor() {
    const N: usize = 30;
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));

    // Message 10 is answered only after 10 s: the kill lands while it is in flight, so the
    // receiver has it but herald does not know. It must be sent again, once, with its key.
    rx.script_key("seq:1:10", vec![Behavior::Slow(Duration::from_secs(10))]);
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "seq", "channel": "hook", "schedule": {"after": "0s"},
                "to": (0..N).map(|i| format!("u{i}")).collect::<Vec<_>>(), "body": "x",
                "pacing": {"interval": "50ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(rx.wait_for(11, Duration::from_secs(20)).await.len(), 11);
    p.kill9();
    let before = rx.count();
    assert_eq!(before, 11, "nothing after the in-flight message was sent");

    let p = Proc::spawn(&config, &data);
    let v = wait_state(&p.url, "seq", "completed", Duration::from_secs(90)).await;
    assert_eq!(v["progress"]["sent"], N as u64);

    let got = rx.requests();
    let keys: HashSet<String> = got
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), N, "every message delivered");
    let seqs: Vec<u64> = got.iter().map(seq_of).collect();
    // In order, and the only repeat allowed is the one message that was in flight at the kill,
    // sent again with the same idempotency key, right at the restart.
    let mut repeats = 0;
    for (i, w) in seqs.windows(2).enumerate() {
        if w[1] == w[0] {
            repeats += 1;
            assert_eq!(
                i + 1,
                before,
                "a repeat only at the restart boundary: {seqs:?}"
            );
            assert_eq!(
                got[i].header("idempotency-key"),
                got[i + 1].header("idempotency-key")
            );
        } else {
            assert_eq!(
                w[1],
                w[0] + 1,
                "nothing before the cursor re-sent: {seqs:?}"
            );
        }
    }
    assert_eq!(repeats, 1, "the in-flight message went out again: {seqs:?}");
    assert_eq!(got[11].header("idempotency-key"), Some("seq:1:10"));
    assert_eq!(got[11].json.as_ref().unwrap()["attempt"], 2);
    assert_eq!(got.len(), N + repeats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_right_after_201s_loses_no_acknowledged_task() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), "");
    let mut p = Proc::spawn(&config, &data);
    let url = format!("{}/v1/tasks", p.url);

    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = url.clone();
        set.spawn(async move {
            let id = format!("t{i:03}");
            let r = http::post_json(
                &url,
                &json!({"id": id, "schedule": {"after": "1h"},
                        "messages": [{"to": "a", "body": "b"}]}),
            )
            .await;
            (id, r.status)
        });
    }
    let mut acked = Vec::new();
    while let Some(r) = set.join_next().await {
        let (id, status) = r.unwrap();
        assert_eq!(status, 201);
        acked.push(id);
    }
    p.kill9();

    let p = Proc::spawn(&config, &data);
    for id in &acked {
        let r = http::get(&format!("{}/v1/tasks/{id}", p.url)).await;
        assert_eq!(r.status, 200, "acknowledged task {id} lost");
        assert_eq!(r.json()["state"], "pending");
    }
    let all = http::get(&format!("{}/v1/tasks?limit=1000", p.url))
        .await
        .json();
    assert_eq!(all["tasks"].as_array().unwrap().len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_due_while_down_fires_at_once_on_restart() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &webhook_channel("hook", &rx.url(), ""));
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "late", "channel": "hook", "schedule": {"after": "1500ms"},
                "messages": [{"to": "a", "body": "b"}]}),
    )
    .await;
    assert_eq!(r.status, 201);
    p.kill9();
    // Stay down past the due time (poll the wall clock rather than guess a sleep).
    let due = common::herald::ms_of(r.json()["next_fire_at"].as_str().unwrap());
    poll(Duration::from_secs(10), || async {
        (chrono::Utc::now().timestamp_millis() as f64 > due + 200.0).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(rx.count(), 0);
    let p = Proc::spawn(&config, &data);
    wait_state(&p.url, "late", "completed", Duration::from_secs(10)).await;
    assert_eq!(rx.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_reported_and_skipped_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), "");
    let mut p = Proc::spawn(&config, &data);
    let r = http::post_json(
        &format!("{}/v1/tasks", p.url),
        &json!({"id": "good", "schedule": {"after": "1h"}, "messages": [{"to": "a", "body": "b"}]}),
    )
    .await;
    assert_eq!(r.status, 201);
    p.kill9();
    {
        // Plant garbage under a task key, as a torn or foreign write would leave it.
        let store = herald::store::Store::open(&data).unwrap();
        store
            .raw_insert_task_bytes("broken", &[1, 0xde, 0xad, 0xbe, 0xef])
            .await
            .unwrap();
        // And a live index entry that does not decode.
        store
            .raw_insert_live_bytes("garbled", &[0xff; 3])
            .await
            .unwrap();
    }
    let p = Proc::spawn(&config, &data);
    let h = http::get(&format!("{}/healthz", p.url)).await;
    assert_eq!(
        h.status, 200,
        "recovery finished despite the corrupt record"
    );
    let good = http::get(&format!("{}/v1/tasks/good", p.url)).await;
    assert_eq!(good.status, 200);
    assert_eq!(good.json()["state"], "pending");
    let list = http::get(&format!("{}/v1/tasks", p.url)).await.json();
    assert_eq!(
        list["tasks"].as_array().unwrap().len(),
        1,
        "the corrupt one is skipped"
    );
    let broken = http::get(&format!("{}/v1/tasks/broken", p.url)).await;
    assert_eq!(broken.status, 500);
    assert!(broken.json()["detail"].as_str().unwrap().contains("broken"));
    // The task census skips the record that does not decode, as recovery does: one such
    // record once kept every census from being taken (no by-state counts in /metrics).
    let m = http::get(&format!("{}/metrics", p.url)).await;
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(
        text.contains("herald_tasks{state=\"pending\"} 2\n"),
        "the good task and the broken one (its live entry reads) are counted:\n{text}"
    );
    assert!(text.contains("herald_tasks_census_age_seconds "), "{text}");
}
