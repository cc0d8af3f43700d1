//! `GET /v1/tasks/{id}/runs?state=`: a cron that ran, was down over ten of its fires (expired
//! and coalesced ones) and ran again; each filter lists exactly the runs in those states, in
//! order, and paging under a filter reaches all of them with `next` null after the last.

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::{json, Value};

async fn page(h: &ManualHerald, query: &str) -> Value {
    let r = http::get(&h.url(&format!("/v1/tasks/c/runs?{query}"))).await;
    assert_eq!(r.status, 200, "{query}: {}", r.text());
    r.json()
}

/// Every run number in `states`, following `next` with pages of `limit`.
async fn paged(h: &ManualHerald, states: &str, limit: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut after = String::new();
    for _ in 0..100 {
        let v = page(h, &format!("state={states}&limit={limit}{after}")).await;
        let runs = v["runs"].as_array().unwrap();
        assert!(runs.len() <= limit, "{v}");
        out.extend(runs.iter().map(|r| r["run"].as_u64().unwrap()));
        match v["next"].as_str() {
            Some(n) => {
                // A page with a next is full: the filter never hands out short pages before
                // the end (far below the scan bound here).
                assert_eq!(runs.len(), limit, "{v}");
                after = format!("&after={n}");
            }
            None => return out,
        }
    }
    panic!("paging did not end");
}

#[tokio::test]
async fn runs_filtered_by_state_page_like_the_whole_list() {
    let t0 = utc_ms("2026-12-01T00:00:30Z");
    let mut h = ManualHerald::start(t0, "").await;
    h.post(
        &json!({"id": "c", "channel": "out", "schedule": {"cron": "* * * * *"},
                   "misfire_grace": "150s", "to": ["a"], "body": "x"}),
    )
    .await;
    // Three fires sent, then herald is down for ten minutes, then three more fires.
    h.run_until(t0 + 3 * 60_000).await;
    h.stop().await;
    h.clock.set(t0 + 13 * 60_000);
    h.restart().await;
    h.run_until(t0 + 16 * 60_000).await;

    let all = page(&h, "limit=1000").await;
    assert_eq!(all["next"], Value::Null);
    let all = all["runs"].as_array().unwrap().clone();
    let of = |states: &[&str]| -> Vec<u64> {
        all.iter()
            .filter(|r| states.contains(&r["state"].as_str().unwrap()))
            .map(|r| r["run"].as_u64().unwrap())
            .collect()
    };
    let (completed, expired, skipped) = (of(&["completed"]), of(&["expired"]), of(&["skipped"]));
    // The outage left runs of each kind (exact counts are the misfire tests' business).
    assert!(completed.len() >= 6, "{all:?}");
    assert!(expired.len() >= 5, "{all:?}");
    assert!(!skipped.is_empty(), "{all:?}");

    for limit in [1, 2, 3, 100] {
        assert_eq!(paged(&h, "expired", limit).await, expired, "limit {limit}");
        assert_eq!(
            paged(&h, "completed", limit).await,
            completed,
            "limit {limit}"
        );
        assert_eq!(
            paged(&h, "skipped,expired", limit).await,
            of(&["skipped", "expired"]),
            "limit {limit}"
        );
    }
    // A filter that matches nothing: one empty page.
    let v = page(&h, "state=cancelled").await;
    assert_eq!(
        (v["runs"].clone(), v["next"].clone()),
        (json!([]), Value::Null)
    );
    // Runs of the filtered view are whole runs, with their reason.
    let v = page(&h, "state=expired&limit=1").await;
    assert!(
        v["runs"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("misfire_grace"),
        "{v}"
    );
    // Filter after a run number in the middle.
    let mid = expired[expired.len() / 2];
    let v = page(&h, &format!("state=expired&after={mid}&limit=1000")).await;
    let got: Vec<u64> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_u64().unwrap())
        .collect();
    assert_eq!(
        got,
        expired
            .iter()
            .copied()
            .filter(|r| *r > mid)
            .collect::<Vec<_>>()
    );
    // An unknown state is 422 naming `state`.
    for q in ["state=late", "state=expired,late", "state=Expired"] {
        let r = http::get(&h.url(&format!("/v1/tasks/c/runs?{q}"))).await;
        assert_eq!(r.status, 422, "{q}: {}", r.text());
        assert_eq!(r.json()["field"], "state", "{q}");
    }
    // And on the task listing alike (it was 400 there); every task state is accepted.
    let r = http::get(&h.url("/v1/tasks?state=late")).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "state");
    for st in [
        "pending",
        "running",
        "paused",
        "completed",
        "cancelled",
        "failed",
        "expired",
    ] {
        let r = http::get(&h.url(&format!("/v1/tasks?state={st}"))).await;
        assert_eq!(r.status, 200, "{st}: {}", r.text());
    }
    // A task that does not exist is still 404 under a filter.
    let r = http::get(&h.url("/v1/tasks/nope/runs?state=expired")).await;
    assert_eq!(r.status, 404, "{}", r.text());
}
