//! Misfire is judged on real outage only (manual clock): a fire due while herald was running is
//! never "missed", however late herald gets to it (its own backlog, a wall-clock jump), and
//! `misfire_grace` means exactly what the task says, with no hidden tolerance.

mod common;

use common::herald::{utc_ms, ManualHerald};
use serde_json::{json, Value};

fn sent_at(v: &Value) -> u64 {
    utc_ms(v["sent_at"].as_str().unwrap())
}

#[tokio::test]
async fn a_wall_clock_jump_while_running_never_expires_or_skips_a_fire() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let h = ManualHerald::start(t0, "").await;
    for (id, misfire) in [("skip", "skip"), ("now", "fire_now")] {
        h.post(
            &json!({"id": id, "channel": "out", "schedule": {"after": "20m"},
            "misfire": misfire, "misfire_grace": "1m", "to": ["a"], "body": id}),
        )
        .await;
    }
    // The wall clock jumps forward by an hour in one step while herald runs: both fires are
    // 40 minutes "late", far beyond their 1 minute grace, but herald never stopped watching.
    h.clock.set(t0 + 3_600_000);
    h.server().engine.wake();
    h.run_until(t0 + 3_600_000 + 1_000).await;
    let sent = h.sent();
    let mut bodies: Vec<&str> = sent.iter().map(|s| s["body"].as_str().unwrap()).collect();
    bodies.sort();
    assert_eq!(bodies, ["now", "skip"], "both sent once");
    for id in ["skip", "now"] {
        let t = h.task(id).await;
        assert_eq!(t["state"], "completed", "{t}");
        assert_eq!(t["fires"]["expired"], 0);
        assert_eq!(t["fires"]["skipped"], 0);
    }
}

/// A one-shot due at `t0 + 10 s` with `grace`; herald is down over the due time and comes
/// back `late_ms` after it.
async fn down_over_the_fire(grace: &str, late_ms: u64) -> (ManualHerald, Value) {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let mut h = ManualHerald::start(t0, "").await;
    h.post(
        &json!({"id": "once", "channel": "out", "schedule": {"after": "10s"},
        "misfire_grace": grace, "to": ["a"], "body": "x"}),
    )
    .await;
    h.stop().await;
    h.clock.set(t0 + 10_000 + late_ms);
    h.restart().await;
    h.run_until(t0 + 10_000 + late_ms + 60_000).await;
    let t = h.task("once").await;
    (h, t)
}

#[tokio::test]
async fn a_grace_of_1s_expires_a_fire_missed_by_2_5s() {
    let (h, t) = down_over_the_fire("1s", 2_500).await;
    assert!(h.sent().is_empty(), "{:?}", h.sent());
    assert_eq!(t["fires"]["expired"], 1, "{t}");
    let runs = h.runs("once").await;
    assert_eq!(runs[0]["state"], "expired");
    assert!(
        runs[0]["reason"].as_str().unwrap().contains("2s500ms"),
        "{}",
        runs[0]
    );
}

#[tokio::test]
async fn a_grace_of_3s_sends_a_fire_missed_by_2_5s_at_restart() {
    let (h, t) = down_over_the_fire("3s", 2_500).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent_at(&sent[0]), utc_ms("2026-12-01T00:00:12.500Z"));
    assert_eq!(t["fires"]["expired"], 0);
}

/// A herd: 3 000 one-shots due at the same instant with `misfire: skip`, and 50 more due one
/// second later, on a clock that jumps past both at once (everything is due together, as when
/// herald falls behind). All are sent once, none is judged missed, and the herd goes out in
/// deadline order: no task of the later group leaves before the earlier group is done.
#[tokio::test]
async fn a_herd_is_all_sent_in_deadline_order_and_none_is_missed() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    // 3 050 creates at once, each on its own connection: above the default connection cap
    // (1024), where herald would close the newcomers at once, as it does to a flood.
    let h = ManualHerald::start(
        t0,
        "[limits]\nlive_tasks_max = 100000\nconnections_max = 4096\n",
    )
    .await;
    let due = "2026-12-01T00:10:00Z";
    let later = "2026-12-01T00:10:01Z";
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..3_050u32 {
        let url = h.url("/v1/tasks");
        let at = if i < 3_000 { due } else { later };
        creates.spawn(async move {
            let body = json!({"id": format!("h{i:05}"), "channel": "out", "schedule": {"at": at},
                "misfire": "skip", "misfire_grace": "1s", "to": [format!("u{i}")], "body": "x"});
            common::http::post_json(&url, &body).await.status
        });
    }
    while let Some(s) = creates.join_next().await {
        assert_eq!(s.unwrap(), 201);
    }
    // Armed ahead: just before the base lead (2 s) of the herd's instant, every one-shot of
    // the herd but the first few counted in its second is already started (`engine/herd.rs`:
    // the n-th is fired n / FIRE_RATE_PER_S s earlier), and the later group is not.
    h.run_until(utc_ms("2026-12-01T00:09:57.998Z")).await;
    let mut running = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let q = match &next {
            Some(n) => format!("/v1/tasks?state=running&limit=500&after={n}"),
            None => "/v1/tasks?state=running&limit=500".into(),
        };
        let page = common::http::get(&h.url(&q)).await.json();
        for t in page["tasks"].as_array().unwrap() {
            running.push(t["id"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(n) => next = Some(n.to_string()),
            None => break,
        }
    }
    assert!(
        (2_900..3_000).contains(&running.len()),
        "{} of the herd started 2 s + 2 ms before its instant",
        running.len()
    );
    assert!(
        running.iter().all(|id| id.as_str() < "h03000"),
        "the later group waits"
    );
    // Every fire is handled before the sends fall due (the later group's at its 2 s lead, the
    // herd's last few at theirs), so that what comes due together below is the sends alone:
    // fires that come due together run concurrently, and their writes may finish in any order,
    // which would put a later task's send on the wheel before a herd task's (seen in 1 of ~15
    // runs under load when the jump below also covered the fires).
    h.run_until(utc_ms("2026-12-01T00:09:59.500Z")).await;
    h.clock.set(utc_ms("2026-12-01T00:10:05Z"));
    h.server().engine.wake();
    h.run_until(utc_ms("2026-12-01T00:11:00Z")).await;
    let sent = h.sent();
    assert_eq!(sent.len(), 3_050, "every task sent exactly once");
    let mut ids: Vec<&str> = sent
        .iter()
        .map(|s| s["task_id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3_050);
    let first_later = sent
        .iter()
        .position(|s| s["scheduled_at"] == later)
        .unwrap();
    let last_due = sent.iter().rposition(|s| s["scheduled_at"] == due).unwrap();
    assert!(
        last_due < first_later,
        "a task due at {later} left (#{first_later}) before the herd due at {due} was done (#{last_due})"
    );
    let r = common::http::get(&h.url("/v1/tasks?state=completed&limit=1")).await;
    assert_eq!(r.status, 200);
    for id in ["h00000", "h02999", "h03049"] {
        let t = h.task(id).await;
        assert_eq!(t["fires"]["skipped"], 0, "{t}");
        assert_eq!(t["fires"]["expired"], 0, "{t}");
    }
}

/// API.md: an `at` in the past by less than `misfire_grace` fires at once. With `misfire:
/// skip` it was judged missed (due before the task was watched, its creation) and skipped.
#[tokio::test]
async fn an_at_just_past_with_misfire_skip_fires_at_once() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    // herald has been up for a minute: the `at` is after its start.
    let h = ManualHerald::start(t0 - 60_000, "").await;
    h.run_until(t0).await;
    let at = "2026-11-30T23:59:59Z"; // t0 - 1 s
    for (id, path) in [("created", None), ("patched", Some(at))] {
        let schedule = match path {
            None => json!({"at": at}),
            Some(_) => json!({"after": "1h"}),
        };
        h.post(
            &json!({"id": id, "channel": "out", "schedule": schedule, "misfire": "skip",
            "to": ["a"], "body": id}),
        )
        .await;
        if let Some(at) = path {
            let r = common::http::patch_json(
                &h.url(&format!("/v1/tasks/{id}")),
                &json!({"schedule": {"at": at}}),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
    h.run_until(t0 + 5_000).await;
    let sent = h.sent();
    let mut bodies: Vec<&str> = sent.iter().map(|s| s["body"].as_str().unwrap()).collect();
    bodies.sort();
    assert_eq!(bodies, ["created", "patched"], "each sent once");
    for id in ["created", "patched"] {
        let t = h.task(id).await;
        assert_eq!(t["state"], "completed", "{t}");
        assert_eq!(t["fires"]["skipped"], 0, "{t}");
    }
}

/// The same `at` posted right at herald's start (herald started after it): the engine watches
/// no task from before its own start (an outage), but one created since is watched from its
/// own `watched_since_ms` (`engine/step.rs`).
#[tokio::test]
async fn an_at_before_herald_started_posted_since_with_misfire_skip_fires_at_once() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let h = ManualHerald::start(t0, "").await;
    h.post(
        &json!({"id": "b", "channel": "out", "schedule": {"at": "2026-11-30T23:59:59Z"},
        "misfire": "skip", "to": ["a"], "body": "b"}),
    )
    .await;
    h.run_until(t0 + 5_000).await;
    assert_eq!(h.sent().len(), 1, "{}", h.task("b").await);
}
