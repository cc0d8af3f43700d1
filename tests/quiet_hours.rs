//! Quiet hours on the manual clock (issue 28, API.md "People's time"): a sequence limited by
//! its channel's rate reaches 22:00 in the channel's quiet zone, stops, and goes on at 08:00 at
//! the channel's rate (no burst of what waited); nothing fails for it. A task's own window wins
//! over the channel's, and `"quiet_hours": null` opts out.

mod common;

use common::herald::{poll, utc_ms, webhook_channel, ManualHerald};
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

fn sent_at(v: &Value) -> u64 {
    utc_ms(v["sent_at"].as_str().unwrap())
}

const CHANNEL: &str =
    "rate = \"1/1m\"\nquiet_hours = { from = \"22:00\", to = \"08:00\", tz = \"Asia/Shanghai\" }\n";

/// The night in Shanghai, as a channel's config line.
const NIGHT: &str = "quiet_hours = { from = \"22:00\", to = \"08:00\", tz = \"Asia/Shanghai\" }";

/// The `held` events of a task's timeline whose reason is quiet hours.
async fn quiet_holds(h: &ManualHerald, id: &str) -> Vec<Value> {
    let tl = common::http::get(&h.url(&format!("/v1/tasks/{id}/timeline")))
        .await
        .json();
    tl["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "held" && e["detail"]["why"] == "quiet_hours")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_sequence_reaching_22_00_stops_and_resumes_at_08_00_at_the_channels_rate() {
    // 21:50 in Shanghai.
    let h = ManualHerald::start(utc_ms("2026-12-01T13:50:00Z"), CHANNEL).await;
    h.post(
        &json!({"id": "seq", "channel": "out", "schedule": {"after": "0s"},
        "to": (0..20).map(|i| format!("u{i}")).collect::<Vec<_>>(), "body": "b"}),
    )
    .await;
    // Into the night: ten sends (21:50 .. 21:59, one a minute), then nothing.
    h.run_until(utc_ms("2026-12-01T23:59:59Z")).await;
    let night = h.sent();
    assert_eq!(night.len(), 10, "{night:?}");
    assert!(night
        .iter()
        .all(|v| sent_at(v) < utc_ms("2026-12-01T14:00:00Z")));
    let t = h.task("seq").await;
    assert_eq!(t["state"], "running", "held, not failed: {t}");
    assert_eq!(t["progress"]["failed"], 0);
    // The hold is on the timeline, once, with the window's end (review finding: no `held`
    // event was written for quiet hours).
    let tl = common::http::get(&h.url("/v1/tasks/seq/timeline"))
        .await
        .json();
    let held: Vec<&Value> = tl["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "held" && e["detail"]["why"] == "quiet_hours")
        .collect();
    assert_eq!(held.len(), 1, "{tl}");
    assert_eq!(held[0]["detail"]["until"], "2026-12-02T00:00:00Z", "{tl}");
    assert_eq!(held[0]["msg"], 10, "{tl}");
    // The eta counts from the window's end: the 10 left, one a minute from 08:00.
    assert!(
        utc_ms(t["progress"]["eta"].as_str().unwrap()) >= utc_ms("2026-12-02T00:00:00Z"),
        "{t}"
    );
    h.run_until(utc_ms("2026-12-02T01:00:00Z")).await;
    let all = h.sent();
    assert_eq!(all.len(), 20);
    let morning: Vec<u64> = all[10..].iter().map(sent_at).collect();
    assert_eq!(
        morning[0],
        utc_ms("2026-12-02T00:00:00Z"),
        "08:00 in Shanghai"
    );
    for w in morning.windows(2) {
        assert!(
            w[1] - w[0] >= 60_000,
            "the channel's rate holds: {morning:?}"
        );
    }
    let seqs: Vec<u64> = all.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..20).collect::<Vec<u64>>(), "in order");
    assert_eq!(h.task("seq").await["state"], "completed");
}

#[tokio::test]
async fn a_tasks_own_window_wins_and_null_opts_out() {
    let h = ManualHerald::start(utc_ms("2026-12-01T14:30:00Z"), CHANNEL).await; // 22:30 Shanghai
                                                                                // Opted out: sent at once, in the channel's quiet hours.
    h.post(
        &json!({"id": "urgent", "channel": "out", "schedule": {"after": "0s"},
        "quiet_hours": null, "to": ["a"], "body": "b"}),
    )
    .await;
    // Its own window (Berlin, where it is 15:30): not quiet there, so it goes now too.
    h.post(
        &json!({"id": "berlin", "channel": "out", "schedule": {"after": "0s"},
        "quiet_hours": {"from": "22:00", "to": "08:00", "tz": "Europe/Berlin"},
        "to": ["c"], "body": "b"}),
    )
    .await;
    // The channel's window: waits for 08:00 in Shanghai.
    h.post(
        &json!({"id": "quiet", "channel": "out", "schedule": {"after": "0s"},
        "to": ["d"], "body": "b"}),
    )
    .await;
    h.run_until(utc_ms("2026-12-01T14:40:00Z")).await;
    let mut now: Vec<String> = h
        .sent()
        .iter()
        .map(|v| v["task_id"].as_str().unwrap().to_string())
        .collect();
    now.sort();
    assert_eq!(now, ["berlin", "urgent"]);
    let t = h.task("urgent").await;
    // Shown as null (opted out), which is not the same as absent (the channel's).
    assert_eq!(t.get("quiet_hours"), Some(&Value::Null), "{t}");
    assert_eq!(h.task("quiet").await.get("quiet_hours"), None);
    h.run_until(utc_ms("2026-12-02T00:01:00Z")).await;
    let last = h.sent().pop().unwrap();
    assert_eq!(
        (last["task_id"].as_str(), sent_at(&last)),
        (Some("quiet"), utc_ms("2026-12-02T00:00:00Z"))
    );
}

/// How herald stops watching a held send in the night, in the review's finding.
#[derive(Clone, Copy, Debug)]
enum Interrupt {
    Restart,
    PauseResume,
}

/// Review finding: a one-shot due at 23:00 in Shanghai has its send held (written) until
/// 08:00; herald restarted at 23:00:10 (or the task paused and resumed a moment later) judged
/// the run 9 h late against its 10 min grace and expired it: nothing went at 08:00. Only the
/// time nobody watched counts (DESIGN.md "Misfire is about outage, not lateness").
async fn a_send_held_for_the_night(how: Interrupt) {
    let start = utc_ms("2026-12-01T15:00:00Z"); // 23:00 in Shanghai
    let mut h = ManualHerald::start(start, CHANNEL).await;
    h.post(
        &json!({"id": "night", "channel": "out", "schedule": {"after": "0s"},
        "to": ["a"], "body": "b"}),
    )
    .await;
    h.run_until(start + 5_000).await;
    assert!(h.sent().is_empty(), "quiet hours: {:?}", h.sent());
    match how {
        Interrupt::Restart => {
            h.stop().await;
            h.clock.set(start + 10_000);
            h.restart().await;
        }
        Interrupt::PauseResume => {
            assert_eq!(h.action("night", "pause").await.status, 200);
            h.run_until(start + 10_000).await;
            let r = h.action("night", "resume").await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    let t = h.task("night").await;
    assert_eq!(
        t["state"], "running",
        "{how:?}: still held, not expired: {t}"
    );
    h.run_until(utc_ms("2026-12-02T00:00:05Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "{how:?}: {sent:?}");
    assert_eq!(sent_at(&sent[0]), utc_ms("2026-12-02T00:00:00Z"), "08:00");
    let t = h.task("night").await;
    assert_eq!(t["state"], "completed", "{how:?}: {t}");
    assert_eq!(t["fires"]["expired"], 0, "{t}");
}

#[tokio::test]
async fn a_restart_in_the_night_sends_a_held_one_shot_at_08_00() {
    a_send_held_for_the_night(Interrupt::Restart).await;
}

#[tokio::test]
async fn a_pause_and_resume_in_the_night_sends_a_held_one_shot_at_08_00() {
    a_send_held_for_the_night(Interrupt::PauseResume).await;
}

/// Review finding, with the rate limit: 20 one-shots due at 10:00 go one a minute; those still
/// waiting at 10:15, paused and resumed a second later, were judged 15 min late (more than
/// their 10 min grace) and expired. The pause lasted a second: they all go.
#[tokio::test]
async fn a_pause_in_a_rate_limits_backlog_expires_nothing() {
    let start = utc_ms("2026-12-01T02:00:00Z"); // 10:00 in Shanghai
    let h = ManualHerald::start(start, CHANNEL).await;
    let ids: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
    for id in &ids {
        h.post(
            &json!({"id": id, "channel": "out", "schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}),
        )
        .await;
    }
    let pause_at = start + 15 * 60_000 + 30_000;
    h.run_until(pause_at).await;
    let waiting = {
        let mut w = Vec::new();
        for id in &ids {
            if h.task(id).await["state"] == "running" {
                w.push(id.clone());
            }
        }
        w
    };
    assert_eq!(waiting.len(), 4, "16 went by 10:15:30: {waiting:?}");
    for id in &waiting {
        assert_eq!(h.action(id, "pause").await.status, 200);
    }
    h.run_until(pause_at + 1_000).await;
    for id in &waiting {
        let r = h.action(id, "resume").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    h.run_until(start + 30 * 60_000).await;
    assert_eq!(h.sent().len(), 20);
    for id in &ids {
        let t = h.task(id).await;
        assert_eq!(t["state"], "completed", "{t}");
    }
}

/// Last stop's "left as found", the restart: 20 one-shots due at 10:00 go one a minute; herald
/// is killed at 10:15:30 with four still waiting and is back 30 s later. They waited in herald's
/// own backlog until it stopped (its last life sign says so), and the outage was 30 s: they
/// all go, none expired. Without the life sign they were judged from 10:00 and expired.
#[tokio::test]
async fn a_restart_in_a_rate_limits_backlog_expires_nothing() {
    let start = utc_ms("2026-12-01T02:00:00Z"); // 10:00 in Shanghai
    let mut h = ManualHerald::start(start, CHANNEL).await;
    let ids: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
    for id in &ids {
        h.post(
            &json!({"id": id, "channel": "out", "schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}),
        )
        .await;
    }
    let stop_at = start + 15 * 60_000 + 30_000;
    h.run_until(stop_at).await;
    assert_eq!(h.sent().len(), 16, "16 went by 10:15:30");
    // The life sign is stamped once a second (real time) with the clock's reading: wait for
    // one at 10:15:30. `stop` then drops herald as a kill would (no drain, no last stamp).
    let running = &h;
    let stamped = common::herald::poll(std::time::Duration::from_secs(10), || async move {
        let at = running.server().engine.store().last_alive().ok()??;
        (at >= stop_at).then_some(())
    })
    .await;
    assert!(stamped.is_some(), "a life sign at 10:15:30");
    h.stop().await;
    h.clock.set(stop_at + 30_000);
    h.restart().await;
    h.run_until(start + 30 * 60_000).await;
    for id in &ids {
        let t = h.task(id).await;
        assert_eq!(t["state"], "completed", "{t} {:?}", h.runs(id).await);
    }
    assert_eq!(h.sent().len(), 20);
}

/// A send held for the quiet window's end, and the wall clock steps an hour forward in the
/// night (an NTP step; a resume from suspend): the end is a wall instant, 08:00 Shanghai, and
/// the send goes then, not an hour later (held to the monotonic clock, it waited the step).
#[tokio::test]
async fn a_wall_step_in_the_night_keeps_the_windows_end() {
    let h = ManualHerald::start(utc_ms("2026-12-01T14:30:00Z"), CHANNEL).await; // 22:30 Shanghai
    h.post(
        &json!({"id": "quiet", "channel": "out", "schedule": {"after": "0s"},
        "to": ["d"], "body": "b"}),
    )
    .await;
    h.run_until(utc_ms("2026-12-01T14:40:00Z")).await;
    assert!(h.sent().is_empty(), "held for the window");
    h.clock.jump_wall(3_600_000);
    h.server().engine.wake();
    h.run_until(utc_ms("2026-12-02T00:00:30Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "sent at the window's end: {sent:?}");
    assert_eq!(sent_at(&sent[0]), utc_ms("2026-12-02T00:00:00Z"));
}

/// Review finding: a reminder held by quiet hours past its event went out after the event
/// began ("0 min"). It expires instead, with its reason; one whose event is still ahead when
/// the window ends goes then, saying the minutes really left.
#[tokio::test]
async fn a_reminder_held_past_its_event_expires_and_one_before_it_says_the_minutes_left() {
    let h = ManualHerald::start(utc_ms("2026-12-01T14:30:00Z"), CHANNEL).await; // 22:30
    for (id, event) in [
        ("early", "2026-12-02T07:50:00"),
        ("later", "2026-12-02T08:10:00"),
    ] {
        h.post(&json!({"id": id, "channel": "out",
            "schedule": {"reminders": {"event_at": event, "tz": "Asia/Shanghai",
                                       "before": ["30m", "5m"]}},
            "to": ["s"], "body": "{{minutes_left}} min"}))
            .await;
    }
    h.run_until(utc_ms("2026-12-02T01:00:00Z")).await; // 09:00
    let sent: Vec<(u64, String)> = h
        .sent()
        .iter()
        .map(|s| (sent_at(s), s["body"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        sent,
        [
            (utc_ms("2026-12-02T00:00:00Z"), "10 min".to_string()),
            (utc_ms("2026-12-02T00:05:00Z"), "5 min".to_string()),
        ],
        "only the later class's reminders"
    );
    // The 30-minute one (07:20, held) expires at 08:00; the 5-minute one came while it was
    // still held and was skipped by the overlap rule, as any fire during a run.
    let runs = h.runs("early").await;
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["expired", "skipped"], "{runs:?}");
    let expired = runs.iter().find(|r| r["state"] == "expired").unwrap();
    assert!(
        expired["reason"]
            .as_str()
            .unwrap()
            .contains("the event began"),
        "{expired}"
    );
    let t = h.task("early").await;
    assert_ne!(t["state"], "running", "{t}");
}

/// Review finding: a failure-list retry (`POST /v1/failures/{id}/retry`) never asked quiet
/// hours: one asked for at 22:30, and the backoff attempt of one asked for at 21:59 (22:01),
/// went in the night. Each is held to 08:00 as a run's send is: nothing sent, no attempt
/// counted, the entry still retrying, a `held` event on its task's timeline; at 08:00 both go,
/// each as the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_retries_asked_for_or_backing_off_into_the_night_wait_for_08_00() {
    let rx = Receiver::start().await;
    // Refused for good at first (to the failure list); `later`'s retry at 21:59 gets a 503.
    rx.script_key("now:1:0", vec![Behavior::Status(400)]);
    rx.script_key(
        "later:1:0",
        vec![Behavior::Status(400), Behavior::Status(503)],
    );
    let hook = webhook_channel(
        "hook",
        &rx.url(),
        &format!("retry = {{ max_attempts = 3, initial = \"2m\" }}\n{NIGHT}"),
    );
    let h = ManualHerald::start(utc_ms("2026-12-01T13:00:00Z"), &hook).await; // 21:00
    for id in ["now", "later"] {
        h.post(
            &json!({"id": id, "channel": "hook", "schedule": {"after": "0s"},
            "to": ["a"], "body": "b"}),
        )
        .await;
    }
    h.run_until(utc_ms("2026-12-01T13:01:00Z")).await;
    assert_eq!(rx.count(), 2, "both refused");
    let failures = || async {
        let r = common::http::get(&h.url("/v1/failures")).await;
        r.json()["failures"].as_array().cloned().unwrap_or_default()
    };
    assert_eq!(failures().await.len(), 2);
    let retry = |id: &'static str| {
        let url = h.url(&format!("/v1/failures/{id}:1:0/retry"));
        async move {
            let r = common::http::request("POST", &url, &[], None).await;
            assert_eq!(r.status, 202, "{}", r.text());
        }
    };
    // 21:59: `later`'s retry goes, is answered 503, and backs off 2 min: to 22:01.
    h.run_until(utc_ms("2026-12-01T13:59:00Z")).await;
    retry("later").await;
    h.run_until(utc_ms("2026-12-01T14:30:00Z")).await; // 22:30
    retry("now").await;
    h.run_until(utc_ms("2026-12-01T23:59:59Z")).await; // 07:59:59
    assert_eq!(
        rx.count(),
        3,
        "nothing went in the night: {:?}",
        rx.requests()
    );
    let list = failures().await;
    for (id, attempts) in [("now", 1), ("later", 2)] {
        let f = list.iter().find(|f| f["task_id"] == id).unwrap();
        assert_eq!(f["retrying"], true, "{f}");
        assert_eq!(
            f["attempts"], attempts,
            "no attempt counted for the hold: {f}"
        );
        let held = quiet_holds(&h, id).await;
        assert_eq!(held.len(), 1, "{id}: {held:?}");
        assert_eq!(
            held[0]["detail"]["until"], "2026-12-02T00:00:00Z",
            "{held:?}"
        );
    }
    h.run_until(utc_ms("2026-12-02T00:00:05Z")).await;
    let got = rx.requests();
    assert_eq!(got.len(), 5, "both retries went at 08:00");
    for r in &got[3..] {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let attempt = if body["task_id"] == "now" { 2 } else { 3 };
        assert_eq!(body["sent_at"], "2026-12-02T00:00:00Z", "{body}");
        assert_eq!(body["attempt"], attempt, "{body}");
    }
    assert!(failures().await.is_empty(), "both delivered");
}

/// Sends of the `out` channel that waited for a free slot: every permit is held by the test.
const SLOTS: u32 = 2;

/// A one-shot to `out` due at `at`.
async fn one_shot(h: &ManualHerald, id: &str, at: u64) {
    h.post(
        &json!({"id": id, "channel": "out", "schedule": {"at": herald::schedule::format_utc(at)},
        "to": ["a"], "body": id}),
    )
    .await;
}

/// Moves the clock to `due` with every permit of `out` held; waits until `n` sends wait for
/// one (`chunked`: counted as they reach a chunk, else as sends in flight), then moves the
/// clock to `slot_at` and lets the permits go, and waits until the sends settled.
async fn wait_for_a_slot_until(h: &ManualHerald, due: u64, n: usize, chunked: bool, slot_at: u64) {
    let permits = h.hold_permits("out", SLOTS).await;
    h.clock.set(due);
    let engine = &h.server().engine;
    engine.wake();
    let waiting = poll(std::time::Duration::from_secs(10), || async move {
        let at = if chunked {
            engine.chunked_sends() as usize
        } else {
            engine.sends_in_flight()
        };
        (at >= n).then_some(())
    })
    .await;
    assert!(waiting.is_some(), "{n} sends wait for a slot");
    h.clock.set(slot_at);
    drop(permits);
    let settled = poll(std::time::Duration::from_secs(10), || async move {
        (engine.sends_in_flight() == 0).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the sends that waited settled");
}

/// Review finding: a send admitted at 21:59:59 that waited for a free slot of its channel
/// (`concurrency`) past 22:00 went in the night: after the wait the breaker and the rate limit
/// were asked again, quiet hours not. The one-key path (`step::slot`): a send due alone. It is
/// held to 08:00 (a `held` event, its attempt not spent), and its step comes back at 08:00 by
/// the wall: a +1 h wall step in the night does not make it 09:00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_waited_for_a_slot_into_the_night_is_held_to_08_00() {
    let due = utc_ms("2026-12-01T13:59:59Z"); // 21:59:59 in Shanghai
    let config = format!("concurrency = {SLOTS}\n{NIGHT}");
    let h = ManualHerald::start(due - 60_000, &config).await;
    one_shot(&h, "alone", due).await;
    h.run_until(due - 1).await;
    wait_for_a_slot_until(&h, due, 1, false, utc_ms("2026-12-01T14:00:05Z")).await;
    assert!(h.sent().is_empty(), "sent in the window: {:?}", h.sent());
    let t = h.task("alone").await;
    assert_eq!(t["state"], "running", "held, not failed: {t}");
    let held = quiet_holds(&h, "alone").await;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        held[0]["detail"]["until"], "2026-12-02T00:00:00Z",
        "{held:?}"
    );
    h.clock.jump_wall(3_600_000);
    h.server().engine.wake();
    h.run_until(utc_ms("2026-12-02T00:00:30Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent_at(&sent[0]), utc_ms("2026-12-02T00:00:00Z"), "08:00");
    assert_eq!(sent[0]["attempt"], 1, "the hold spent no attempt");
    assert_eq!(h.task("alone").await["state"], "completed");
}

/// The same finding on the chunk path (`chunk.rs` `after_wait`): two sends due together to
/// the file channel, their part waiting for its permits past 22:00. Both held to 08:00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_that_waited_for_its_permits_into_the_night_is_held_to_08_00() {
    let due = utc_ms("2026-12-01T13:59:59Z"); // 21:59:59 in Shanghai
    let config = format!("concurrency = {SLOTS}\n{NIGHT}");
    let h = ManualHerald::start(due - 60_000, &config).await;
    for id in ["a", "b"] {
        one_shot(&h, id, due).await;
    }
    h.run_until(due - 1).await;
    wait_for_a_slot_until(&h, due, 2, true, utc_ms("2026-12-01T14:00:05Z")).await;
    assert!(h.sent().is_empty(), "sent in the window: {:?}", h.sent());
    for id in ["a", "b"] {
        let held = quiet_holds(&h, id).await;
        assert_eq!(held.len(), 1, "{id}: {held:?}");
        assert_eq!(
            held[0]["detail"]["until"], "2026-12-02T00:00:00Z",
            "{held:?}"
        );
    }
    h.run_until(utc_ms("2026-12-02T00:00:30Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    for s in &sent {
        assert_eq!(sent_at(s), utc_ms("2026-12-02T00:00:00Z"), "{s}");
        assert_eq!(s["attempt"], 1, "{s}");
    }
}
