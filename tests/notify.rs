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

/// Review finding: a fire of a Chinese task that expired was told in Chinese around an English
/// reason ("missed by 20m (more than misfire_grace 10m)"). The reason is said in Chinese; the
/// run's `reason` in the API stays English.
#[tokio::test]
async fn a_chinese_expiry_says_why_in_chinese() {
    let mut h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    h.post(
        &json!({"id": "late", "channel": "out", "schedule": {"after": "1m"}, "lang": "zh",
        "to": ["a"], "body": "x", "notify": {"channel": "out", "to": "zhangsan"}}),
    )
    .await;
    h.stop().await;
    h.clock.set(utc_ms("2026-12-01T00:21:00Z"));
    h.restart().await;
    h.run_until(utc_ms("2026-12-01T00:25:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 1, "{:?}", h.sent());
    let body = got[0]["body"].as_str().unwrap();
    assert!(
        body.contains("错过发送时间 20分钟，超过了宽限时间 10分钟"),
        "{body}"
    );
    assert!(
        !body.contains("missed") && !body.contains("misfire"),
        "{body}"
    );
    let runs = h.runs("late").await;
    let reason = runs[0]["reason"].as_str().unwrap();
    assert_eq!(reason, "missed by 20m (more than misfire_grace 10m)");
}

/// The same for a one-shot armed ahead of its instant before an outage (the grace of issue
/// 28: judged on when its first send would start).
#[tokio::test]
async fn a_chinese_expiry_of_a_run_armed_before_an_outage_says_why_in_chinese() {
    let mut h = ManualHerald::start(utc_ms("2026-12-01T00:00:00Z"), "").await;
    h.post(
        &json!({"id": "armed", "channel": "out", "schedule": {"after": "1m"},
        "misfire_grace": "1s", "lang": "zh", "to": ["a"], "body": "x",
        "notify": {"channel": "out", "to": "zhangsan"}}),
    )
    .await;
    // Armed 2 s ahead; down from 1.5 s before the instant to 2.5 s after it.
    h.run_until(utc_ms("2026-12-01T00:00:58.500Z")).await;
    h.stop().await;
    h.clock.set(utc_ms("2026-12-01T00:01:02.500Z"));
    h.restart().await;
    h.run_until(utc_ms("2026-12-01T00:05:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 1, "{:?}", h.sent());
    let body = got[0]["body"].as_str().unwrap();
    assert!(
        body.contains("第一条消息将晚 2秒500毫秒 才能开始发送，超过了宽限时间 1秒"),
        "{body}"
    );
    assert!(
        !body.contains("first message") && !body.contains("misfire"),
        "{body}"
    );
    let runs = h.runs("armed").await;
    assert!(
        runs[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("its first message would have started 2s500ms late"),
        "{runs:?}"
    );
}

/// Review finding: the failure notification of a paced run named the run's time (09:00) for
/// its third message, due two minutes of pacing later (09:02).
#[tokio::test]
async fn a_paced_messages_failure_names_its_own_due_time() {
    let rx = Receiver::start().await;
    rx.script_key("paced:1:2", vec![Behavior::Status(400)]);
    let h = ManualHerald::start(
        utc_ms("2026-12-01T00:00:00Z"),
        &webhook_channel("hook", &rx.url(), ""),
    )
    .await;
    h.post(&json!({"id": "paced", "channel": "hook",
        "schedule": {"at": "2026-12-01T09:00:00", "tz": "Asia/Shanghai"},
        "pacing": {"interval": "1m"},
        "messages": [{"to": "a", "body": "1"}, {"to": "b", "body": "2"}, {"to": "c", "body": "3"}],
        "notify": {"channel": "out", "to": "boss"}}))
        .await;
    h.run_until(utc_ms("2026-12-01T01:10:00Z")).await;
    let got = notifications(&h);
    assert_eq!(got.len(), 1, "{got:?}");
    let body = got[0]["body"].as_str().unwrap();
    assert!(
        body.contains("message 3 to c, due 2026-12-01 09:02 (Asia/Shanghai)"),
        "{body}"
    );
}
