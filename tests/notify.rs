//! Telling the person (issue 28, API.md "Telling the person") on the manual clock: a task with
//! `notify` whose message fails permanently sends exactly one notification naming that message;
//! a fire that expires sends one; a notification never notifies about itself.

mod common;

use common::herald::{utc_ms, webhook_channel, ManualHerald};
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

fn notifications(h: &ManualHerald) -> Vec<Value> {
    h.sent()
        .into_iter()
        .filter(|v| v["kind"] == "notify")
        .collect()
}

#[tokio::test]
async fn a_permanent_failure_sends_exactly_one_notification_naming_the_message() {
    let rx = Receiver::start().await;
    rx.script_key("doc:1:1", vec![Behavior::Status(400)]);
    let h = ManualHerald::start(
        utc_ms("2026-12-01T00:00:00Z"),
        &webhook_channel("hook", &rx.url(), ""),
    )
    .await;
    h.post(
        &json!({"id": "doc", "channel": "hook", "schedule": {"after": "0s"}, "lang": "zh",
        "messages": [{"to": "lisi", "body": "a"}, {"to": "wangwu", "body": "b"}],
        "notify": {"channel": "out", "to": "zhangsan", "on": ["failed", "expired"]}}),
    )
    .await;
    h.run_until(utc_ms("2026-12-01T00:05:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 1, "{got:?}");
    let n = &got[0];
    assert_eq!(n["to"], "zhangsan");
    assert_eq!(
        n["about"],
        json!({"task_id": "doc", "run": 1, "seq": 1, "event": "failed"})
    );
    let body = n["body"].as_str().unwrap();
    assert!(
        body.contains("wangwu") && body.contains("未能发出"),
        "{body}"
    );
    // The rest went: one send of each message.
    assert_eq!(rx.count(), 2);
}

#[tokio::test]
async fn an_expired_fire_sends_one_notification() {
    let mut h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    h.post(
        &json!({"id": "once", "channel": "out", "schedule": {"after": "1m"},
        "to": ["a"], "body": "x",
        "notify": {"channel": "out", "to": "zhangsan"}}),
    )
    .await;
    h.stop().await;
    h.clock.set(utc_ms("2026-12-01T00:21:00Z"));
    h.restart().await;
    h.run_until(utc_ms("2026-12-01T00:25:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 1, "{:?}", h.sent());
    assert_eq!(got[0]["about"]["event"], "expired");
    assert_eq!(got[0]["about"]["task_id"], "once");
    assert!(got[0]["body"].as_str().unwrap().contains("new time"));
    assert_eq!(h.sent().len(), 1, "the message itself was not sent");
}

/// Review finding: the notification of a task in recipient time named the due time in UTC.
/// A failed message's is 09:00 in its recipient's zone; an expired fire's is the slot's 09:00,
/// each recipient's local time.
#[tokio::test]
async fn in_recipient_time_a_notification_names_the_recipients_time() {
    let rx = Receiver::start().await;
    rx.script_key("rt:1:1", vec![Behavior::Status(400)]);
    let mut h = ManualHerald::start(
        utc_ms("2026-11-30T23:00:00Z"),
        &webhook_channel("hook", &rx.url(), ""),
    )
    .await;
    h.post(&json!({"id": "rt", "channel": "hook",
        "schedule": {"at": "2026-12-02T09:00:00", "tz": "recipient"},
        "messages": [{"to": "berlin", "body": "a", "tz": "Europe/Berlin"},
            {"to": "shanghai", "body": "b", "tz": "Asia/Shanghai"}],
        "notify": {"channel": "out", "to": "boss", "on": ["failed", "expired"]}}))
        .await;
    h.post(&json!({"id": "late", "channel": "out",
        "schedule": {"at": "2026-12-01T09:00:00", "tz": "recipient"},
        "messages": [{"to": "tokyo", "body": "a", "tz": "Asia/Tokyo"},
            {"to": "paris", "body": "b", "tz": "Europe/Paris"}],
        "notify": {"channel": "out", "to": "boss"}, "lang": "zh"}))
        .await;
    // Down over the first zone's 09:00 of `late` (Tokyo, 00:00 UTC) by more than the grace.
    h.run_until(utc_ms("2026-11-30T23:30:00Z")).await;
    h.stop().await;
    h.clock.set(utc_ms("2026-12-01T00:30:00Z"));
    h.restart().await;
    h.run_until(utc_ms("2026-12-02T09:00:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 2, "{got:?}");
    let expired = got[0]["body"].as_str().unwrap();
    assert_eq!(got[0]["about"]["task_id"], "late");
    assert!(
        expired.contains("2026年12月1日 09:00（收件人当地时间）"),
        "{expired}"
    );
    let failed = got[1]["body"].as_str().unwrap();
    assert_eq!(got[1]["about"]["task_id"], "rt");
    assert!(
        failed.contains("berlin") && failed.contains("due 2026-12-02 09:00 (Europe/Berlin)"),
        "{failed}"
    );
}
