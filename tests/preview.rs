//! `POST /v1/schedules/preview` against instants computed here from the zones' legal rules and
//! UTC offsets (not from herald's or chrono-tz's code): New York's DST gap and repeat, and Lord
//! Howe's half-hour shift. And: it refuses exactly what a task creation refuses.

mod common;

use chrono::{Datelike, Duration as D, NaiveDate, NaiveDateTime, Utc};
use common::herald::TestHerald;
use common::http;
use serde_json::{json, Value};

/// The `n`th Sunday (1-based) of a month.
fn sunday(year: i32, month: u32, n: u32) -> NaiveDate {
    let first = NaiveDate::from_ymd_opt(year, month, 1).unwrap();
    let offset = (7 - first.weekday().num_days_from_sunday()) % 7;
    first + D::days(i64::from(offset) + 7 * i64::from(n - 1))
}

/// A local wall time with a fixed UTC offset in minutes, as RFC 3339 UTC.
fn utc(local: NaiveDateTime, offset_min: i64) -> String {
    (local - D::minutes(offset_min))
        .and_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn local(local: NaiveDateTime, offset_min: i64) -> String {
    let sign = if offset_min < 0 { '-' } else { '+' };
    let a = offset_min.abs();
    format!(
        "{}{sign}{:02}:{:02}",
        local.format("%Y-%m-%dT%H:%M:%S"),
        a / 60,
        a % 60
    )
}

fn at(d: NaiveDate, h: u32, m: u32) -> NaiveDateTime {
    d.and_hms_opt(h, m, 0).unwrap()
}

/// A year whose dates are all ahead of now (and within the 10-year horizon).
fn year() -> i32 {
    Utc::now().year() + 1
}

async fn preview(h: &TestHerald, body: Value) -> Value {
    let r = http::post_json(&h.url("/v1/schedules/preview"), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

fn fires(v: &Value) -> Vec<(String, String)> {
    v["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["at"].as_str().unwrap().to_string(),
                f["local"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

const EST: i64 = -5 * 60;
const EDT: i64 = -4 * 60;

#[tokio::test]
async fn new_york_spring_gap_shifts_or_skips() {
    let h = TestHerald::start("").await;
    let y = year();
    // DST starts the second Sunday of March at 02:00 EST -> 03:00 EDT.
    let gap = sunday(y, 3, 2);
    let (before, after) = (gap - D::days(1), gap + D::days(1));
    let schedule = |dst: Value| {
        json!({"cron": "30 2 * * *", "tz": "America/New_York",
               "start": at(before, 0, 0).format("%Y-%m-%dT%H:%M:%S").to_string(), "dst": dst})
    };
    let v = preview(&h, json!({"schedule": schedule(json!({})), "n": 3})).await;
    assert_eq!(v["description"], "every day at 02:30 (America/New_York)");
    assert_eq!(v["tz"], "America/New_York");
    assert_eq!(
        fires(&v),
        [
            (utc(at(before, 2, 30), EST), local(at(before, 2, 30), EST)),
            // 02:30 does not exist: the first valid instant after it is the transition, 03:00 EDT.
            (utc(at(gap, 3, 0), EDT), local(at(gap, 3, 0), EDT)),
            (utc(at(after, 2, 30), EDT), local(at(after, 2, 30), EDT)),
        ]
    );
    // `dst` may also be given beside the schedule.
    let v = preview(
        &h,
        json!({"schedule": schedule(Value::Null).as_object().map(|o| {
            let mut o = o.clone();
            o.remove("dst");
            Value::Object(o)
        }).unwrap(), "dst": {"gap": "skip"}, "n": 2}),
    )
    .await;
    // The policy is said, in either language.
    assert_eq!(
        v["description"],
        "every day at 02:30 (America/New_York), not sent when DST skips the time"
    );
    assert_eq!(
        v["fires"][1]["human"]
            .as_str()
            .map(|h| h.ends_with("at 02:30 (America/New_York)")),
        Some(true),
        "{v}"
    );
    let body = json!({"schedule": schedule(json!({"gap": "skip"})), "n": 2});
    let r = http::post_json(&h.url("/v1/schedules/preview?lang=zh"), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["description"],
        "每天 02:30（America/New_York），夏令时跳过该时刻时不发送"
    );
    assert_eq!(fires(&r.json()), fires(&v));
    assert_eq!(
        fires(&v),
        [
            (utc(at(before, 2, 30), EST), local(at(before, 2, 30), EST)),
            (utc(at(after, 2, 30), EDT), local(at(after, 2, 30), EDT)),
        ]
    );
}

#[tokio::test]
async fn new_york_fall_repeat_first_last_both() {
    let h = TestHerald::start("").await;
    let y = year();
    // DST ends the first Sunday of November at 02:00 EDT -> 01:00 EST: 01:30 happens twice.
    let fold = sunday(y, 11, 1);
    let next = fold + D::days(1);
    let start = at(fold - D::days(1), 12, 0)
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let first = utc(at(fold, 1, 30), EDT);
    let last = utc(at(fold, 1, 30), EST);
    let then = utc(at(next, 1, 30), EST);
    for (repeat, expect) in [
        ("first", vec![first.clone(), then.clone()]),
        ("last", vec![last.clone(), then.clone()]),
        ("both", vec![first.clone(), last.clone()]),
    ] {
        let v = preview(
            &h,
            json!({"schedule": {"cron": "30 1 * * *", "tz": "America/New_York", "start": start,
                                "dst": {"repeat": repeat}}, "n": 2}),
        )
        .await;
        let got: Vec<String> = fires(&v).into_iter().map(|f| f.0).collect();
        assert_eq!(got, expect, "repeat {repeat}");
    }
    // The local side tells the two 01:30s apart by their offsets.
    let v = preview(
        &h,
        json!({"schedule": {"cron": "30 1 * * *", "tz": "America/New_York", "start": start,
                            "dst": {"repeat": "both"}}, "n": 2}),
    )
    .await;
    assert_eq!(
        fires(&v).into_iter().map(|f| f.1).collect::<Vec<_>>(),
        [local(at(fold, 1, 30), EDT), local(at(fold, 1, 30), EST)]
    );
}

#[tokio::test]
async fn lord_howe_half_hour_shift() {
    let h = TestHerald::start("").await;
    let y = year();
    const LHST: i64 = 10 * 60 + 30;
    const LHDT: i64 = 11 * 60;
    // Summer time ends the first Sunday of April at 02:00 LHDT -> 01:30 LHST: 01:45 twice.
    let fold = sunday(y, 4, 1);
    let v = preview(
        &h,
        json!({"schedule": {"cron": "45 1 * * *", "tz": "Australia/Lord_Howe",
                            "start": at(fold - D::days(1), 12, 0).format("%Y-%m-%dT%H:%M:%S").to_string(),
                            "dst": {"repeat": "both"}}, "n": 3}),
    )
    .await;
    let next = fold + D::days(1);
    assert_eq!(
        fires(&v),
        [
            (utc(at(fold, 1, 45), LHDT), local(at(fold, 1, 45), LHDT)),
            (utc(at(fold, 1, 45), LHST), local(at(fold, 1, 45), LHST)),
            (utc(at(next, 1, 45), LHST), local(at(next, 1, 45), LHST)),
        ]
    );
    // It starts the first Sunday of October at 02:00 LHST -> 02:30 LHDT: 02:15 does not exist
    // and shifts to the transition (02:00 LHST, shown as 02:30 LHDT).
    let gap = sunday(y, 10, 1);
    let before = gap - D::days(1);
    let v = preview(
        &h,
        json!({"schedule": {"cron": "15 2 * * *", "tz": "Australia/Lord_Howe",
                            "start": at(before, 0, 0).format("%Y-%m-%dT%H:%M:%S").to_string()}, "n": 3}),
    )
    .await;
    let after = gap + D::days(1);
    assert_eq!(
        fires(&v),
        [
            (utc(at(before, 2, 15), LHST), local(at(before, 2, 15), LHST)),
            (utc(at(gap, 2, 0), LHST), local(at(gap, 2, 30), LHDT)),
            (utc(at(after, 2, 15), LHDT), local(at(after, 2, 15), LHDT)),
        ]
    );
    // A one-shot in the gap, `skip`: it would never fire, which is refused as a create would.
    let r = http::post_json(
        &h.url("/v1/schedules/preview"),
        &json!({"schedule": {"at": at(gap, 2, 15).format("%Y-%m-%dT%H:%M:%S").to_string(),
                             "tz": "Australia/Lord_Howe", "dst": {"gap": "skip"}}}),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "schedule.at");
}

#[tokio::test]
async fn one_shots_reminders_and_the_number_of_fires() {
    let h = TestHerald::start("").await;
    let y = year();
    let event = format!("{y}-06-01T10:00:00");
    let v = preview(
        &h,
        json!({"schedule": {"reminders": {"event_at": event, "tz": "Asia/Shanghai",
                                          "before": ["30m", "15m", "5m"]}}}),
    )
    .await;
    assert_eq!(
        v["description"],
        format!("30, 15 and 5 minutes before {y}-06-01 10:00 (Asia/Shanghai)")
    );
    let got: Vec<String> = fires(&v).into_iter().map(|f| f.1).collect();
    assert_eq!(
        got,
        [
            format!("{y}-06-01T09:30:00+08:00"),
            format!("{y}-06-01T09:45:00+08:00"),
            format!("{y}-06-01T09:55:00+08:00")
        ]
    );
    // n defaults to 5 and goes up to 100; max_runs bounds it.
    let every = json!({"cron": "*/5 * * * *"});
    assert_eq!(
        preview(&h, json!({"schedule": every})).await["fires"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    let v = preview(&h, json!({"schedule": every, "n": 100})).await;
    let at: Vec<f64> = v["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| common::herald::ms_of(f["at"].as_str().unwrap()))
        .collect();
    assert_eq!(at.len(), 100);
    assert!(at.windows(2).all(|w| w[1] - w[0] == 300_000.0));
    let v = preview(
        &h,
        json!({"schedule": {"cron": "*/5 * * * *", "max_runs": 3}, "n": 10}),
    )
    .await;
    assert_eq!(v["fires"].as_array().unwrap().len(), 3);
    let v = preview(&h, json!({"schedule": {"after": "90m"}})).await;
    assert_eq!(v["fires"].as_array().unwrap().len(), 1);
    assert_eq!(v["tz"], "UTC");
}

/// Bad schedules get the very answer a task creation gets; preview-only fields are checked too.
#[tokio::test]
async fn refuses_what_a_create_refuses_with_the_same_problem() {
    let h = TestHerald::start("").await;
    for schedule in [
        json!({"cron": "0 9 *"}),
        json!({"cron": "61 9 * * *"}),
        json!({"cron": "0 9 * * *", "tz": "Mars/Base"}),
        json!({"cron": "0 9 * * *", "dst": {"gap": "later"}}),
        json!({"at": "2020-01-01T00:00:00Z"}),
        json!({"at": "2026-12-01T09:00:00"}),
        json!({"cron": "0 9 * * *", "at": "2030-01-01T00:00:00Z"}),
        json!({"cron": "0 9 * * *", "colour": "red"}),
        json!({"cron": "0 0 31 2 *"}),
    ] {
        let create = http::post_json(
            &h.url("/v1/tasks"),
            &json!({"schedule": schedule, "to": ["a"], "body": "x"}),
        )
        .await;
        let prev = http::post_json(
            &h.url("/v1/schedules/preview"),
            &json!({"schedule": schedule}),
        )
        .await;
        assert!(create.status == 422 || create.status == 400, "{schedule}");
        assert_eq!(prev.status, create.status, "{schedule}: {}", prev.text());
        assert_eq!(
            prev.header("content-type"),
            Some("application/problem+json")
        );
        let (p, c) = (prev.json(), create.json());
        // The same words; a JSON syntax position (" at line 1 column N") differs with the body.
        let words = |v: &Value| {
            let d = v["detail"].as_str().unwrap_or_default();
            d.split(" at line ").next().unwrap_or_default().to_string()
        };
        assert_eq!(
            (&p["field"], words(&p)),
            (&c["field"], words(&c)),
            "{schedule}"
        );
        assert!(p["field"].is_string(), "{schedule}: {p}");
    }
    for (body, field) in [
        (json!({"schedule": {"cron": "0 9 * * *"}, "n": 0}), "n"),
        (json!({"schedule": {"cron": "0 9 * * *"}, "n": 101}), "n"),
        (
            json!({"schedule": {"cron": "0 9 * * *", "dst": {}}, "dst": {}}),
            "dst",
        ),
        (
            json!({"schedule": {"cron": "0 9 * * *"}, "extra": 1}),
            "extra",
        ),
        (json!({"n": 3}), "schedule"),
    ] {
        let r = http::post_json(&h.url("/v1/schedules/preview"), &body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.json()["field"], field, "{body}");
    }
    let r = http::request(
        "POST",
        &h.url("/v1/schedules/preview"),
        &[],
        Some(b"{not json".to_vec()),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = http::get(&h.url("/v1/schedules/preview")).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    // Nothing was created by any of this.
    let v = http::get(&h.url("/v1/tasks")).await.json();
    assert_eq!(v["tasks"], json!([]));
}

#[tokio::test]
async fn needs_the_token_like_the_rest() {
    let h = TestHerald::start_with_token("", "tok").await;
    let body = json!({"schedule": {"cron": "0 9 * * *"}})
        .to_string()
        .into_bytes();
    let url = h.url("/v1/schedules/preview");
    let r = http::request("POST", &url, &[], Some(body.clone())).await;
    assert_eq!(r.status, 401);
    let r = http::request("POST", &url, &[("authorization", "Bearer tok")], Some(body)).await;
    assert_eq!(r.status, 200);
}
