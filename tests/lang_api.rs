//! The language of task views and previews over HTTP (manual clock, so relative times are
//! fixed): `?lang=`, `Accept-Language`, a task's own `lang`, and 422 for unknown languages.

mod common;

use common::herald::{utc_ms, ManualHerald};
use common::http;
use serde_json::{json, Value};

const EN_DESC: &str = "every weekday at 09:00 (Asia/Shanghai)";
const ZH_DESC: &str = "每个工作日 09:00（Asia/Shanghai）";
const EN_NEXT: &str = "tomorrow at 09:00 (Asia/Shanghai)";
const ZH_NEXT: &str = "明天上午 9:00（Asia/Shanghai）";

async fn get(url: &str, accept: Option<&str>) -> http::Resp {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("accept-language", a)).into_iter().collect();
    http::request("GET", url, &headers, None).await
}

fn texts(v: &Value) -> (&str, &str) {
    (
        v["description"].as_str().unwrap_or("<none>"),
        v["next_fire_human"].as_str().unwrap_or("<none>"),
    )
}

/// Tuesday 2026-12-01, one second before midnight in Shanghai: the weekday cron's next fire is
/// tomorrow 09:00.
async fn herald_with_weekday_task() -> ManualHerald {
    let h = ManualHerald::start(utc_ms("2026-12-01T15:59:59Z"), "").await;
    let v = h
        .post(&json!({"id": "wd", "channel": "out",
                      "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai"},
                      "to": ["a"], "body": "x"}))
        .await;
    assert_eq!(texts(&v), (EN_DESC, EN_NEXT), "{v}");
    assert_eq!(v["lang"], "en");
    assert_eq!(v["next_fire_at"], "2026-12-02T01:00:00Z");
    h
}

#[tokio::test]
async fn task_views_and_listings_follow_lang_and_accept_language() {
    let h = herald_with_weekday_task().await;
    let one = h.url("/v1/tasks/wd");
    let cases = [
        ("", None, (EN_DESC, EN_NEXT)),
        ("?lang=zh", None, (ZH_DESC, ZH_NEXT)),
        ("?lang=zh-CN", None, (ZH_DESC, ZH_NEXT)),
        ("", Some("zh-CN"), (ZH_DESC, ZH_NEXT)),
        ("", Some("zh-CN,zh;q=0.9,en;q=0.8"), (ZH_DESC, ZH_NEXT)),
        ("", Some("en-US,en;q=0.9,zh-CN;q=0.8"), (EN_DESC, EN_NEXT)),
        ("", Some("fr-FR"), (EN_DESC, EN_NEXT)),
        // The query wins over the header.
        ("?lang=en", Some("zh-CN"), (EN_DESC, EN_NEXT)),
    ];
    for (q, accept, want) in cases {
        let r = get(&format!("{one}{q}"), accept).await;
        assert_eq!(r.status, 200, "{q} {accept:?}: {}", r.text());
        assert_eq!(texts(&r.json()), want, "{q} {accept:?}");
        let r = get(&format!("{}{q}", h.url("/v1/tasks")), accept).await;
        assert_eq!(r.status, 200, "list {q} {accept:?}: {}", r.text());
        assert_eq!(texts(&r.json()["tasks"][0]), want, "list {q} {accept:?}");
    }
    // Commands answer the view in the language asked for.
    let r = http::request("POST", &h.url("/v1/tasks/wd/pause?lang=zh"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["description"], ZH_DESC);
    // A language herald does not write is 422 naming `lang`; a header is never an error.
    for url in [format!("{one}?lang=fr"), h.url("/v1/tasks?lang=xx")] {
        let r = get(&url, None).await;
        assert_eq!(r.status, 422, "{url}: {}", r.text());
        assert_eq!(r.json()["field"], "lang", "{url}");
    }
}

#[tokio::test]
async fn a_task_carries_its_own_language() {
    let h = herald_with_weekday_task().await;
    let v = h
        .post(&json!({"id": "zh", "channel": "out", "lang": "zh",
                      "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai"},
                      "to": ["a"], "body": "x"}))
        .await;
    assert_eq!(v["lang"], "zh");
    assert_eq!(texts(&v), (ZH_DESC, ZH_NEXT));
    // Asked for, another language wins; unasked, the task's own.
    let r = get(&h.url("/v1/tasks/zh?lang=en"), None).await;
    assert_eq!(texts(&r.json()), (EN_DESC, EN_NEXT));
    let r = get(&h.url("/v1/tasks"), None).await;
    let tasks = r.json()["tasks"].as_array().cloned().unwrap_or_default();
    let by_id = |id: &str| tasks.iter().find(|t| t["id"] == id).cloned().unwrap();
    assert_eq!(texts(&by_id("wd")), (EN_DESC, EN_NEXT));
    assert_eq!(texts(&by_id("zh")), (ZH_DESC, ZH_NEXT));
    // PATCH changes it, validated like a create.
    let r = http::patch_json(&h.url("/v1/tasks/zh"), &json!({"lang": "en"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        (r.json()["lang"].clone(), r.json()["description"].clone()),
        (json!("en"), json!(EN_DESC))
    );
    for (method, url, body) in [
        ("PATCH", h.url("/v1/tasks/zh"), json!({"lang": "zh-CN"})),
        (
            "POST",
            h.url("/v1/tasks"),
            json!({"channel": "out", "lang": "fr",
            "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
        ),
    ] {
        let r = http::request(method, &url, &[], Some(body.to_string().into_bytes())).await;
        assert_eq!(r.status, 422, "{method} {body}: {}", r.text());
        assert_eq!(r.json()["field"], "lang");
    }
    // The language is stored with the task: it survives a restart.
    let mut h = h;
    let r = http::patch_json(&h.url("/v1/tasks/zh"), &json!({"lang": "zh"})).await;
    assert_eq!(r.status, 200);
    h.restart().await;
    let v = h.task("zh").await;
    assert_eq!(
        (v["lang"].clone(), texts(&v).0.to_string()),
        (json!("zh"), ZH_DESC.to_string())
    );
}

#[tokio::test]
async fn preview_is_written_in_the_language_asked_for() {
    let h = ManualHerald::start(utc_ms("2026-12-01T15:59:59Z"), "").await;
    let body = json!({"schedule": {"cron": "0 15 * * 5", "tz": "Asia/Shanghai"}, "n": 2})
        .to_string()
        .into_bytes();
    for (q, accept, desc, human) in [
        (
            "",
            None,
            "every Friday at 15:00 (Asia/Shanghai)",
            [
                "on Friday at 15:00 (Asia/Shanghai)",
                "on 2026-12-11 at 15:00 (Asia/Shanghai)",
            ],
        ),
        (
            "?lang=zh",
            None,
            "每周五 15:00（Asia/Shanghai）",
            [
                "本周五下午 3:00（Asia/Shanghai）",
                "12月11日下午 3:00（Asia/Shanghai）",
            ],
        ),
        (
            "",
            Some("zh-CN"),
            "每周五 15:00（Asia/Shanghai）",
            [
                "本周五下午 3:00（Asia/Shanghai）",
                "12月11日下午 3:00（Asia/Shanghai）",
            ],
        ),
    ] {
        let headers: Vec<(&str, &str)> =
            accept.map(|a| ("accept-language", a)).into_iter().collect();
        let url = format!("{}{q}", h.url("/v1/schedules/preview"));
        let r = http::request("POST", &url, &headers, Some(body.clone())).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["description"], desc, "{q} {accept:?}");
        let got: Vec<&str> = v["fires"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["human"].as_str().unwrap())
            .collect();
        assert_eq!(got, human, "{q} {accept:?}");
        assert_eq!(v["fires"][0]["local"], "2026-12-04T15:00:00+08:00");
    }
    let r = http::request(
        "POST",
        &format!("{}?lang=de", h.url("/v1/schedules/preview")),
        &[],
        Some(body),
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["field"], "lang");
}

/// `next_fire_human` on the manual clock across the spring change in two zones, before and
/// after a fire, in both languages.
#[tokio::test]
async fn next_fire_human_moves_with_the_clock_across_dst() {
    let ms = |s: &str| {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .timestamp_millis() as u64
    };
    // (start, cron, zone, next fire, en, zh, after the fire: next fire, en, zh)
    let cases = [
        (
            "2026-03-07T23:30:00-05:00",
            "0 3 * * *",
            "America/New_York",
            "2026-03-08T03:00:00-04:00",
            "tomorrow at 03:00 (America/New_York)",
            "明天凌晨 3:00（America/New_York）",
            "2026-03-09T03:00:00-04:00",
            "tomorrow at 03:00 (America/New_York)",
            "明天凌晨 3:00（America/New_York）",
        ),
        // 02:30 does not exist in Berlin on 2026-03-29: shifted to 03:00 CEST.
        (
            "2026-03-28T23:00:00+01:00",
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-29T03:00:00+02:00",
            "tomorrow at 03:00 (Europe/Berlin)",
            "明天凌晨 3:00（Europe/Berlin）",
            "2026-03-30T02:30:00+02:00",
            "tomorrow at 02:30 (Europe/Berlin)",
            "明天凌晨 2:30（Europe/Berlin）",
        ),
    ];
    for (start, expr, tz, next, en, zh, then, en2, zh2) in cases {
        let h = ManualHerald::start(ms(start), "").await;
        h.post(
            &json!({"id": "c", "channel": "out", "schedule": {"cron": expr, "tz": tz},
                       "to": ["a"], "body": "x"}),
        )
        .await;
        let both = |v: Value, w: Value| {
            (
                v["next_fire_human"].as_str().unwrap_or("").to_string(),
                w["next_fire_human"].as_str().unwrap_or("").to_string(),
                utc_ms(v["next_fire_at"].as_str().unwrap_or("")),
            )
        };
        let read = || async {
            let en = get(&h.url("/v1/tasks/c"), None).await.json();
            let zh = get(&h.url("/v1/tasks/c?lang=zh"), None).await.json();
            both(en, zh)
        };
        assert_eq!(
            read().await,
            (en.into(), zh.into(), ms(next)),
            "{tz} before"
        );
        h.run_until(ms(next) + 1_000).await;
        assert_eq!(h.sent().len(), 1, "{tz}: the fire was sent");
        assert_eq!(
            read().await,
            (en2.into(), zh2.into(), ms(then)),
            "{tz} after"
        );
    }
}
