//! Per-recipient local time on the manual clock (issue 28, API.md "People's time"): each
//! message goes out at the schedule's wall time in its own zone, DST per zone, the messages of
//! a run in order of their instants. The expected instants are a table written by hand and
//! checked once against Python's zoneinfo (`datetime(2026, 4, 5, 9, tzinfo=ZoneInfo(z))`):
//! Lord Howe leaves DST (+11 → +10:30) at 02:00 on 5 April 2026, Berlin enters it on 29 March.

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::{json, Value};

fn sent_at(v: &Value) -> u64 {
    utc_ms(v["sent_at"].as_str().unwrap())
}

/// (recipient, its instant of 09:00 local on 5 April 2026).
const AT_0405: [(&str, &str); 5] = [
    ("lordhowe", "2026-04-04T22:30:00Z"), // +10:30, the day DST ended there
    // No tz: the task's default_tz, Asia/Shanghai; the same instant as the next, and given
    // before it (messages of one instant keep the order given).
    ("default", "2026-04-05T01:00:00Z"),
    ("shanghai", "2026-04-05T01:00:00Z"),
    ("berlin", "2026-04-05T07:00:00Z"),
    ("newyork", "2026-04-05T13:00:00Z"),
];

#[tokio::test]
async fn a_one_shot_at_09_00_in_four_zones_on_a_dst_change_day() {
    let h = ManualHerald::start(utc_ms("2026-04-04T00:00:00Z"), "").await;
    let t = h
        .post(&json!({"id": "notice", "channel": "out",
        "schedule": {"at": "2026-04-05T09:00:00", "tz": "recipient"},
        "default_tz": "Asia/Shanghai",
        "messages": [
            {"to": "newyork", "body": "b", "tz": "America/New_York"},
            {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
            {"to": "default", "body": "b"},
            {"to": "lordhowe", "body": "b", "tz": "Australia/Lord_Howe"},
            {"to": "shanghai", "body": "b", "tz": "Asia/Shanghai"},
        ]}))
        .await;
    // The run fires at the earliest zone's instant.
    assert_eq!(t["next_fire_at"], "2026-04-04T22:30:00Z", "{t}");
    h.run_until(utc_ms("2026-04-05T14:00:00Z")).await;
    let sent = h.sent();
    let got: Vec<(String, u64)> = sent
        .iter()
        .map(|v| (v["to"].as_str().unwrap().to_string(), sent_at(v)))
        .collect();
    let want: Vec<(String, u64)> = AT_0405
        .iter()
        .map(|(to, at)| (to.to_string(), utc_ms(at)))
        .collect();
    assert_eq!(got, want, "{sent:?}");
    // Each is due at its own instant (the lateness metric counts from it too): it read the
    // instant of the message before it, hours early for a later zone.
    let scheduled: Vec<(String, u64)> = sent
        .iter()
        .map(|v| {
            let at = utc_ms(v["scheduled_at"].as_str().unwrap());
            (v["to"].as_str().unwrap().to_string(), at)
        })
        .collect();
    assert_eq!(scheduled, want, "{sent:?}");
    let t = h.task("notice").await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(
        t["runs"], 1,
        "one run for the slot, whatever the zones: {t}"
    );
}

#[tokio::test]
async fn a_daily_cron_in_recipient_time_across_berlins_dst_change() {
    let h = ManualHerald::start(utc_ms("2026-03-27T12:00:00Z"), "").await;
    h.post(&json!({"id": "daily", "channel": "out",
    "schedule": {"cron": "0 9 * * *", "tz": "recipient"},
    "messages": [
        {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
        {"to": "shanghai", "body": "b", "tz": "Asia/Shanghai"},
        {"to": "lordhowe", "body": "b", "tz": "Australia/Lord_Howe"},
        {"to": "newyork", "body": "b", "tz": "America/New_York"},
    ]}))
    .await;
    h.run_until(utc_ms("2026-03-30T14:00:00Z")).await;
    // 09:00 local on 28, 29 and 30 March (Berlin +1 on the 28th, +2 from the 29th).
    let want = [
        ("lordhowe", "2026-03-27T22:00:00Z"),
        ("shanghai", "2026-03-28T01:00:00Z"),
        ("berlin", "2026-03-28T08:00:00Z"),
        ("newyork", "2026-03-28T13:00:00Z"),
        ("lordhowe", "2026-03-28T22:00:00Z"),
        ("shanghai", "2026-03-29T01:00:00Z"),
        ("berlin", "2026-03-29T07:00:00Z"),
        ("newyork", "2026-03-29T13:00:00Z"),
        ("lordhowe", "2026-03-29T22:00:00Z"),
        ("shanghai", "2026-03-30T01:00:00Z"),
        ("berlin", "2026-03-30T07:00:00Z"),
        ("newyork", "2026-03-30T13:00:00Z"),
    ];
    let sent = h.sent();
    let got: Vec<(String, u64)> = sent
        .iter()
        .map(|v| (v["to"].as_str().unwrap().to_string(), sent_at(v)))
        .collect();
    let want: Vec<(String, u64)> = want
        .iter()
        .map(|(to, at)| (to.to_string(), utc_ms(at)))
        .collect();
    assert_eq!(got, want, "{sent:?}");
    // One run per day (each spans 15 hours of zones), none skipped.
    let runs = h.runs("daily").await;
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["completed", "completed", "completed"], "{runs:?}");
}

#[tokio::test]
async fn validation_names_the_message_of_a_missing_or_unknown_zone() {
    let h = ManualHerald::start(utc_ms("2026-04-04T00:00:00Z"), "").await;
    let base = |messages: Value, extra: Value| {
        let mut v = json!({"channel": "out",
            "schedule": {"at": "2026-04-05T09:00:00", "tz": "recipient"}, "messages": messages});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        v
    };
    let cases = [
        (
            base(
                json!([{"to": "a", "body": "b", "tz": "Asia/Shanghai"}, {"to": "c", "body": "d"}]),
                json!({}),
            ),
            "messages[1].tz",
        ),
        (
            base(
                json!([{"to": "a", "body": "b", "tz": "Asia/Shanghai"}, {"to": "c", "body": "d", "tz": "Mars/Olympus"}]),
                json!({}),
            ),
            "messages[1].tz",
        ),
        (
            base(
                json!([{"to": "a", "body": "b"}]),
                json!({"default_tz": "Nowhere"}),
            ),
            "default_tz",
        ),
        (
            json!({"channel": "out", "schedule": {"after": "1m", "tz": "recipient"},
                "messages": [{"to": "a", "body": "b", "tz": "Asia/Shanghai"}]}),
            "schedule.tz",
        ),
        (
            json!({"channel": "out", "schedule": {"at": "2026-04-05T09:00:00+08:00", "tz": "recipient"},
                "messages": [{"to": "a", "body": "b", "tz": "Asia/Shanghai"}]}),
            "schedule.at",
        ),
    ];
    for (body, field) in cases {
        let r = http::post_json(&h.url("/v1/tasks"), &body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.json()["field"], field, "{body}: {}", r.text());
    }
}

/// Review finding: a trigger ("send now", API.md) of a one-shot in recipient time still held
/// each message to 09:00 in its own zone. Every message goes now, none at its zone's 09:00.
#[tokio::test]
async fn a_trigger_of_a_one_shot_in_recipient_time_sends_every_message_now() {
    let h = ManualHerald::start(utc_ms("2026-04-04T00:00:00Z"), "").await;
    h.post(&json!({"id": "now", "channel": "out",
    "schedule": {"at": "2026-04-05T09:00:00", "tz": "recipient"},
    "messages": [
        {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
        {"to": "newyork", "body": "b", "tz": "America/New_York"},
        {"to": "shanghai", "body": "b", "tz": "Asia/Shanghai"},
    ]}))
    .await;
    let r = h.action("now", "trigger").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A minute on, long before any zone's 09:00 (Shanghai's comes first, 5 April 01:00 UTC).
    h.run_until(utc_ms("2026-04-04T00:01:00Z")).await;
    let sent = h.sent();
    let got: Vec<(&str, u64)> = sent
        .iter()
        .map(|v| (v["to"].as_str().unwrap(), sent_at(v)))
        .collect();
    let now = utc_ms("2026-04-04T00:00:00Z");
    assert_eq!(
        got,
        // In the order of their zones' instants, as stored; all now.
        [("shanghai", now), ("berlin", now), ("newyork", now)],
        "{sent:?}"
    );
    let t = h.task("now").await;
    assert_eq!(t["state"], "completed", "{t}");
    // The `at` was replaced: nothing more goes at the zones' 09:00.
    h.run_until(utc_ms("2026-04-05T14:00:00Z")).await;
    assert_eq!(h.sent().len(), 3);
}

/// Review finding: a new schedule for a recipient-time cron paused in the middle of a run
/// dropped its hold: at resume the run's remaining recipients were sent at once, not at 09:00
/// in their zones. A schedule that moves the run's slot is refused (409) until the run ends;
/// one that keeps it (a new `max_runs`) is accepted, and the hold holds.
#[tokio::test]
async fn a_new_schedule_of_a_paused_run_keeps_its_recipients_wall_time() {
    let h = ManualHerald::start(utc_ms("2026-12-01T12:00:00Z"), "").await;
    h.post(&json!({"id": "mid", "channel": "out",
    "schedule": {"cron": "0 9 * * *", "tz": "recipient"},
    "messages": [
        {"to": "shanghai", "body": "b", "tz": "Asia/Shanghai"},
        {"to": "newyork", "body": "b", "tz": "America/New_York"},
    ]}))
    .await;
    // 2 Dec 09:00 in Shanghai is 01:00 UTC; in New York 14:00 UTC.
    h.run_until(utc_ms("2026-12-02T02:00:00Z")).await;
    assert_eq!(h.sent().len(), 1, "Shanghai's only");
    assert_eq!(h.action("mid", "pause").await.status, 200);
    let patch = |schedule: Value| {
        let url = h.url("/v1/tasks/mid");
        async move { http::patch_json(&url, &json!({ "schedule": schedule })).await }
    };
    let r = patch(json!({"cron": "0 10 * * *", "tz": "recipient"})).await;
    assert_eq!(r.status, 409, "{}", r.text());
    let r = patch(json!({"cron": "0 9 * * *", "tz": "UTC"})).await;
    assert_eq!(r.status, 409, "{}", r.text());
    let r = patch(json!({"cron": "0 9 * * *", "tz": "recipient", "max_runs": 5})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    h.run_until(utc_ms("2026-12-02T03:00:00Z")).await;
    assert_eq!(h.action("mid", "resume").await.status, 200);
    h.run_until(utc_ms("2026-12-02T13:59:00Z")).await;
    assert_eq!(
        h.sent().len(),
        1,
        "New York's waits for its 09:00: {:?}",
        h.sent()
    );
    h.run_until(utc_ms("2026-12-02T14:30:00Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1]["to"], "newyork");
    assert_eq!(sent_at(&sent[1]), utc_ms("2026-12-02T14:00:00Z"));
}

/// A cron every half hour from 01:00 to 03:30 in recipient time, for Berlin and New York.
/// On 28 March 2027 Berlin springs forward at 02:00: its 02:00, 02:30 and 03:00 all are
/// 03:00 CEST (01:00Z), one run instant for three slots; New York (EDT since 14 March) has
/// each at its own time. Every recipient gets each slot's message once.
async fn gap_task(h: &ManualHerald) {
    let t = h
        .post(&json!({"id": "gap", "channel": "out",
        "schedule": {"cron": "0,30 1-3 * * *", "tz": "recipient"},
        "messages": [
            {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
            {"to": "newyork", "body": "n", "tz": "America/New_York"},
        ]}))
        .await;
    assert_eq!(t["next_fire_at"], "2027-03-28T00:00:00Z", "{t}");
}

/// (recipient, instant) of every slot of 28 March 2027, sorted.
fn gap_day() -> Vec<(String, u64)> {
    let berlin = ["00:00", "00:30", "01:00", "01:00", "01:00", "01:30"];
    let newyork = ["05:00", "05:30", "06:00", "06:30", "07:00", "07:30"];
    let mut want: Vec<(String, u64)> = berlin
        .iter()
        .map(|t| ("berlin", t))
        .chain(newyork.iter().map(|t| ("newyork", t)))
        .map(|(to, t)| (to.to_string(), utc_ms(&format!("2027-03-28T{t}:00Z"))))
        .collect();
    want.sort();
    want
}

fn sent_sorted(h: &ManualHerald) -> Vec<(String, u64)> {
    let mut got: Vec<(String, u64)> = h
        .sent()
        .iter()
        .map(|v| (v["to"].as_str().unwrap().to_string(), sent_at(v)))
        .collect();
    got.sort();
    got
}

/// Review finding (the module's open limit): slots were known by their run instant, so after
/// the 02:00 slot's run (01:00Z) the next slot was the first whose instant is after it, 03:30:
/// the 02:30 and 03:00 slots were never sent to anyone (New York's 06:30Z and 07:00Z, and
/// Berlin's second and third 01:00Z). Known by their walls, each slot runs once.
#[tokio::test]
async fn slots_sharing_an_instant_in_a_dst_gap_each_go_to_every_recipient() {
    let h = ManualHerald::start(utc_ms("2027-03-27T23:50:00Z"), "").await;
    gap_task(&h).await;
    h.run_until(utc_ms("2027-03-28T08:00:00Z")).await;
    assert_eq!(sent_sorted(&h), gap_day());
    let runs = h.runs("gap").await;
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["completed"; 6], "one run per slot: {runs:?}");
}

/// The walls survive a restart: the three runs of 01:00Z are still waiting for New York's
/// 02:00, 02:30 and 03:00 when herald stops, and after it each goes at its own time (a run
/// read back by its instant alone would send all three at 06:00Z); the next day's first slot
/// comes once.
#[tokio::test]
async fn a_restart_keeps_each_slots_wall() {
    let mut h = ManualHerald::start(utc_ms("2027-03-27T23:50:00Z"), "").await;
    gap_task(&h).await;
    h.run_until(utc_ms("2027-03-28T05:45:00Z")).await;
    assert_eq!(
        h.sent().len(),
        8,
        "Berlin's six and New York's 01:00 and 01:30"
    );
    h.restart().await;
    h.run_until(utc_ms("2027-03-28T08:00:00Z")).await;
    assert_eq!(sent_sorted(&h), gap_day());
    // 29 March: Berlin's 01:00 CEST is 23:00Z on the 28th; once, not skipped nor repeated.
    h.restart().await;
    h.run_until(utc_ms("2027-03-28T23:10:00Z")).await;
    let mut want = gap_day();
    want.push(("berlin".into(), utc_ms("2027-03-28T23:00:00Z")));
    want.sort();
    assert_eq!(sent_sorted(&h), want);
}

/// Review finding: once a slot's wall was recorded, the next slot was the cron wall after it
/// whatever its instant, so new messages in a zone east of the others moved it into the
/// past. An hourly cron for London (UTC in December) fired its 10:00 slot at 10:00Z; at 10:10Z
/// a patch adds Kolkata (UTC+05:30), whose 11:00 to 15:00 are 05:30Z to 09:30Z: five stale
/// runs at once, Kolkata's messages hours late. The next slot now runs no earlier than the
/// last fire: 16:00 (Kolkata's 10:30Z), then each slot once, London's part at its own 16:00Z.
/// (The slots 11:00 to 15:00 are skipped for London too: a slot is one run, at its earliest
/// zone's instant.)
#[tokio::test]
async fn new_messages_in_a_zone_to_the_east_never_move_the_next_slot_into_the_past() {
    let h = ManualHerald::start(utc_ms("2026-12-01T04:00:00Z"), "").await;
    h.post(&json!({"id": "hourly", "channel": "out",
    "schedule": {"cron": "0 * * * *", "tz": "recipient"},
    "messages": [{"to": "london", "body": "b", "tz": "Europe/London"}]}))
        .await;
    h.run_until(utc_ms("2026-12-01T10:10:00Z")).await;
    assert_eq!(h.sent().len(), 6, "London's 05:00 to 10:00");
    let patched = utc_ms("2026-12-01T10:10:00Z");
    let r = http::patch_json(
        &h.url("/v1/tasks/hourly"),
        &json!({"messages": [
            {"to": "london", "body": "b", "tz": "Europe/London"},
            {"to": "kolkata", "body": "b", "tz": "Asia/Kolkata"},
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["next_fire_at"],
        "2026-12-01T10:30:00Z",
        "{}",
        r.text()
    );
    h.run_until(utc_ms("2026-12-01T16:10:00Z")).await;
    let at = |hour: u32, m: u32| utc_ms(&format!("2026-12-01T{hour:02}:{m:02}:00Z"));
    let mut want: Vec<(String, u64)> = (5..=10)
        .map(|hr| ("london".to_string(), at(hr, 0)))
        .chain((10..=15).map(|hr| ("kolkata".to_string(), at(hr, 30))))
        .chain([("london".to_string(), at(16, 0))])
        .collect();
    want.sort();
    assert_eq!(
        sent_sorted(&h),
        want,
        "each slot once, none before the patch"
    );
    let runs = h.runs("hourly").await;
    let scheduled: Vec<u64> = runs
        .iter()
        .map(|r| utc_ms(r["scheduled_at"].as_str().unwrap()))
        .collect();
    let want: Vec<u64> = (5..=10)
        .map(|hr| at(hr, 0))
        .chain((10..=15).map(|hr| at(hr, 30)))
        .collect();
    assert_eq!(scheduled, want, "{runs:?}");
    assert!(scheduled[6..].iter().all(|s| *s >= patched));
    let states: Vec<&str> = runs.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert!(
        states.iter().all(|s| matches!(*s, "completed" | "running")),
        "no run skipped or expired: {runs:?}"
    );
}

/// Review finding (the module's open limit): backfill listed a range's slots by instant, so
/// of the three sharing 01:00Z (Berlin's gap) it offered the 02:00 slot only: New York's 02:30
/// and 03:00 could not be backfilled. A task created at 01:10Z never fired them; a backfill of
/// 00:45Z–01:10Z is one run per slot, each carrying its wall, so New York's message of each
/// goes at that slot's own time (02:00, 02:30 and 03:00 EDT), Berlin's as its run starts
/// (backfilled runs go one after another). Backfilled again, the range has nothing left:
/// each slot is matched by its run's wall. (`max_runs` 3, reached by the backfill, keeps the
/// schedule's own 03:30 slot out: a run of it would be one the queued runs wait for.)
#[tokio::test]
async fn a_backfill_of_slots_sharing_an_instant_sends_each_at_its_own_wall() {
    let h = ManualHerald::start(utc_ms("2027-03-28T01:10:00Z"), "").await;
    let t = h
        .post(&json!({"id": "late", "channel": "out",
        "schedule": {"cron": "0,30 1-3 * * *", "tz": "recipient", "max_runs": 3},
        "messages": [
            {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
            {"to": "newyork", "body": "n", "tz": "America/New_York"},
        ]}))
        .await;
    assert_eq!(
        t["next_fire_at"], "2027-03-28T01:30:00Z",
        "the 03:30 slot: {t}"
    );
    let range = json!({"from": "2027-03-28T00:45:00Z", "to": "2027-03-28T01:10:00Z"});
    let url = h.url("/v1/tasks/late/backfill");
    let r = http::post_json(&url, &range).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let runs: Vec<u64> = r.json()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(runs, [1, 2, 3], "the 02:00, 02:30 and 03:00 slots");
    let r = http::post_json(&url, &range).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["runs"], json!([]), "{}", r.text());
    h.run_until(utc_ms("2027-03-28T08:00:00Z")).await;
    let sent = h.sent();
    let of = |to: &str| -> Vec<(u64, u64)> {
        sent.iter()
            .filter(|v| v["to"] == to)
            .map(|v| (v["run"].as_u64().unwrap(), sent_at(v)))
            .collect()
    };
    let at = |t: &str| utc_ms(&format!("2027-03-28T{t}:00Z"));
    let want = [(1, at("06:00")), (2, at("06:30")), (3, at("07:00"))];
    assert_eq!(of("newyork"), want, "{sent:?}");
    let want = [(1, at("01:10")), (2, at("06:00")), (3, at("06:30"))];
    assert_eq!(of("berlin"), want, "{sent:?}");
    let kept = h.runs("late").await;
    let filled: Vec<(&str, &str)> = kept
        .iter()
        .map(|r| {
            let at = r["scheduled_at"].as_str().unwrap();
            (at, r["state"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        filled,
        [("2027-03-28T01:00:00Z", "completed"); 3],
        "{kept:?}"
    );
    let t = h.task("late").await;
    assert_eq!(
        t["state"], "completed",
        "max_runs reached by the backfill: {t}"
    );
}

/// An hourly cron in recipient time over Berlin (UTC+1 in December) and New York (UTC−5): a
/// slot's run starts at Berlin's instant and lasts six hours, to New York's, so about six
/// runs are active at any time. Fires `05:00` (04:00Z) and `06:00` (05:00Z), then is paused
/// from 05:30Z to 08:30Z over the slots `07:00` to `09:00` (06:00Z to 08:00Z), with `misfire`
/// as given; resumed at 08:30Z, the schedule goes on with `10:00` (09:00Z).
async fn paused_hourly(h: &ManualHerald, misfire: &str) {
    h.post(&json!({"id": "hourly", "channel": "out",
    "schedule": {"cron": "0 * * * *", "tz": "recipient"},
    "misfire": misfire, "misfire_grace": "12h",
    "messages": [
        {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
        {"to": "newyork", "body": "n", "tz": "America/New_York"},
    ]}))
    .await;
    h.run_until(utc_ms("2026-12-01T05:30:00Z")).await;
    assert_eq!(h.sent().len(), 2, "Berlin's 05:00 and 06:00");
    assert_eq!(h.action("hourly", "pause").await.status, 200);
    h.run_until(utc_ms("2026-12-01T08:30:00Z")).await;
    assert_eq!(h.action("hourly", "resume").await.status, 200);
}

/// The messages of the runs `runs` (recipient, instant), sorted.
fn sent_of_runs(h: &ManualHerald, runs: &[u64]) -> Vec<(String, u64)> {
    let mut got: Vec<(String, u64)> = h
        .sent()
        .iter()
        .filter(|v| runs.contains(&v["run"].as_u64().unwrap()))
        .map(|v| (v["to"].as_str().unwrap().to_string(), sent_at(v)))
        .collect();
    got.sort();
    got
}

/// What the queued slots `07:00`, `08:00` and `09:00` send: one run after another, each
/// starting when the run of the slot before it ends (its New York message), with its
/// Berlin message then (its wall long past) and its New York one at its own wall. `first`:
/// when the `07:00` run starts.
fn queued_slots_sent(first: &str) -> Vec<(String, u64)> {
    let at = |t: &str| utc_ms(&format!("2026-12-01T{t}:00Z"));
    let mut want: Vec<(String, u64)> = [first, "12:00", "13:00"]
        .iter()
        .map(|t| ("berlin".to_string(), at(t)))
        .chain(
            ["12:00", "13:00", "14:00"]
                .iter()
                .map(|t| ("newyork".to_string(), at(t))),
        )
        .collect();
    want.sort();
    want
}

/// Review finding: a queued fire started only when its task had no other active run, and a
/// recipient-time cron over zones hours apart always has some (the schedule's newer runs,
/// beside each other): the backfill answered 202 with run numbers whose runs never started
/// while the schedule fired. Now only a run of an earlier slot (or of the head's own
/// instant) holds the queue: the backfilled `07:00` starts once `06:00`'s run ends (11:00Z),
/// the others each after the one before, while the schedule keeps firing beside them.
#[tokio::test]
async fn a_backfill_of_an_hourly_cron_runs_while_the_schedule_keeps_firing() {
    let h = ManualHerald::start(utc_ms("2026-12-01T03:50:00Z"), "").await;
    paused_hourly(&h, "skip").await;
    let r = http::post_json(
        &h.url("/v1/tasks/hourly/backfill"),
        &json!({"from": "2026-12-01T06:00:00Z", "to": "2026-12-01T08:00:00Z"}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let runs: Vec<u64> = r.json()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(runs.len(), 3, "{}", r.text());
    h.run_until(utc_ms("2026-12-01T16:30:00Z")).await;
    assert_eq!(sent_of_runs(&h, &runs), queued_slots_sent("11:00"));
    // The schedule went on beside them: every slot from `10:00` (09:00Z) to `17:00`
    // (16:00Z) sent its Berlin message on time.
    let berlin: Vec<u64> = sent_sorted(&h)
        .into_iter()
        .filter(|(to, _)| to == "berlin")
        .map(|(_, t)| t)
        .collect();
    for hour in 9..=16 {
        let t = utc_ms(&format!("2026-12-01T{hour:02}:00:00Z"));
        assert!(berlin.contains(&t), "{hour}:00Z: {berlin:?}");
    }
    let kept = h.runs("hourly").await;
    for n in &runs {
        let r = kept.iter().find(|r| r["run"].as_u64() == Some(*n)).unwrap();
        assert_eq!(r["state"], "completed", "{r}");
    }
}

/// The same for a `misfire: fire_all` catch-up: at resume the first missed slot (`07:00`)
/// runs at once and the two others are queued behind it; they went only when nothing else
/// was active, never while the schedule fired.
#[tokio::test]
async fn a_fire_all_catch_up_of_an_hourly_cron_runs_while_the_schedule_keeps_firing() {
    let h = ManualHerald::start(utc_ms("2026-12-01T03:50:00Z"), "").await;
    paused_hourly(&h, "fire_all").await;
    h.run_until(utc_ms("2026-12-01T16:30:00Z")).await;
    // Runs 1 and 2 are `05:00` and `06:00`; 3 to 5 the three missed slots.
    assert_eq!(sent_of_runs(&h, &[3, 4, 5]), queued_slots_sent("08:30"));
}

/// A failure-list retry of a later zone's message is due at that message's own instant, as
/// its first send was: its `scheduled_at` read the run's (Berlin's, six hours earlier).
#[tokio::test]
async fn a_retry_of_a_later_zones_failed_message_is_due_at_its_own_instant() {
    use common::herald::webhook_channel;
    use common::receiver::{Behavior, Receiver};
    let rx = Receiver::start().await;
    rx.script_key("rt:1:1", vec![Behavior::Status(400)]);
    let h = ManualHerald::start(
        utc_ms("2026-12-01T00:00:00Z"),
        &webhook_channel("hook", &rx.url(), ""),
    )
    .await;
    h.post(&json!({"id": "rt", "channel": "hook",
    "schedule": {"at": "2026-12-01T09:00:00", "tz": "recipient"},
    "messages": [
        {"to": "berlin", "body": "b", "tz": "Europe/Berlin"},
        {"to": "newyork", "body": "n", "tz": "America/New_York"},
    ]}))
    .await;
    h.run_until(utc_ms("2026-12-01T14:01:00Z")).await;
    assert_eq!(rx.count(), 2, "{:?}", rx.requests());
    let r = http::request("POST", &h.url("/v1/failures/rt:1:1/retry"), &[], None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    h.run_until(utc_ms("2026-12-01T14:06:00Z")).await;
    let got = rx.requests();
    assert_eq!(got.len(), 3, "{got:?}");
    let scheduled: Vec<String> = got
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            v["scheduled_at"].as_str().unwrap().to_string()
        })
        .collect();
    // Berlin's 09:00 (08:00Z); New York's 09:00 (14:00Z), first send and retry alike.
    assert_eq!(
        scheduled,
        [
            "2026-12-01T08:00:00Z",
            "2026-12-01T14:00:00Z",
            "2026-12-01T14:00:00Z"
        ]
    );
}
