//! Schedule descriptions and relative next-fire times in English and Chinese, for every
//! schedule kind and option the sentences cover, against strings written by hand. Schedules
//! go through the preview, i.e. the validation a task creation does, at a fixed `now`.
//! Relative times around midnight and across DST changes in two zones use instants written
//! with their UTC offsets by hand (not computed from the zone database under test).

use herald::model::{Lang, Limits};
use herald::schedule::preview::{preview, PreviewRequest};
use herald::schedule::{describe_in, next_fire_human};
use serde_json::{json, Value};

/// 2026-01-01T00:00:00Z: every schedule below is ahead of it.
const NOW: u64 = 1_767_225_600_000;

fn both(schedule: Value) -> (String, String) {
    let req: PreviewRequest = serde_json::from_value(json!({ "schedule": schedule }))
        .unwrap_or_else(|e| panic!("{schedule}: {e}"));
    let p = preview(req, NOW, &Limits::default()).unwrap_or_else(|e| panic!("{schedule}: {e:?}"));
    // The preview's English description is the English sentence.
    assert_eq!(p.description, describe_in(&p.schedule, Lang::En));
    (
        describe_in(&p.schedule, Lang::En),
        describe_in(&p.schedule, Lang::Zh),
    )
}

fn check(cases: &[(Value, &str, &str)]) {
    let mut wrong = Vec::new();
    for (schedule, en, zh) in cases {
        let got = both(schedule.clone());
        if got != (en.to_string(), zh.to_string()) {
            wrong.push(format!(
                "{schedule}\n  want {en:?} / {zh:?}\n  got  {:?} / {:?}",
                got.0, got.1
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn cron(expr: &str, tz: &str) -> Value {
    json!({ "cron": expr, "tz": tz })
}

#[test]
fn weekdays_and_weekday_ranges() {
    let sh = "Asia/Shanghai";
    check(&[
        (
            cron("0 9 * * 1-5", sh),
            "every weekday at 09:00 (Asia/Shanghai)",
            "每个工作日 09:00（Asia/Shanghai）",
        ),
        (
            cron("0 9 * * MON-FRI", sh),
            "every weekday at 09:00 (Asia/Shanghai)",
            "每个工作日 09:00（Asia/Shanghai）",
        ),
        (
            cron("0 15 * * 5", sh),
            "every Friday at 15:00 (Asia/Shanghai)",
            "每周五 15:00（Asia/Shanghai）",
        ),
        (
            cron("0 12 * * 0", sh),
            "every Sunday at 12:00 (Asia/Shanghai)",
            "每周日 12:00（Asia/Shanghai）",
        ),
        (
            cron("0 10 * * 7", sh),
            "every Sunday at 10:00 (Asia/Shanghai)",
            "每周日 10:00（Asia/Shanghai）",
        ),
        (
            cron("0 9 * * FRI,MON", sh),
            "at 09:00 on Monday and Friday (Asia/Shanghai)",
            "每周一和周五 09:00（Asia/Shanghai）",
        ),
        (
            cron("0 8 * * 1,3,5", sh),
            "at 08:00 on Monday, Wednesday and Friday (Asia/Shanghai)",
            "每周一、周三和周五 08:00（Asia/Shanghai）",
        ),
        (
            cron("0 10 * * 2-4", sh),
            "at 10:00 on Tuesday, Wednesday and Thursday (Asia/Shanghai)",
            "每周二、周三和周四 10:00（Asia/Shanghai）",
        ),
        (
            cron("0 10 * * 6,0", sh),
            "at 10:00 on Saturday and Sunday (Asia/Shanghai)",
            "每周六和周日 10:00（Asia/Shanghai）",
        ),
        (
            cron("0 9 * 12 1-5", sh),
            "every weekday at 09:00 in December (Asia/Shanghai)",
            "12月每个工作日 09:00（Asia/Shanghai）",
        ),
    ]);
}

#[test]
fn steps_minutes_hours_and_seconds() {
    let u = "UTC";
    check(&[
        (
            cron("* * * * *", u),
            "every minute (UTC)",
            "每分钟一次（UTC）",
        ),
        (
            cron("*/5 * * * *", u),
            "every 5 minutes (UTC)",
            "每 5 分钟一次（UTC）",
        ),
        (
            cron("0 * * * *", u),
            "every hour (UTC)",
            "每小时一次（UTC）",
        ),
        (
            cron("15 * * * *", u),
            "every hour at minute 15 (UTC)",
            "每小时的第 15 分钟（UTC）",
        ),
        (
            cron("0 */2 * * *", u),
            "every 2 hours (UTC)",
            "每 2 小时一次（UTC）",
        ),
        (
            cron("30 */6 * * *", u),
            "every 6 hours at minute 30 (UTC)",
            "每 6 小时的第 30 分钟（UTC）",
        ),
        (
            cron("0 9-17 * * *", u),
            "every hour from 09:00 to 17:00 (UTC)",
            "每天 09:00 至 17:00 每小时一次（UTC）",
        ),
        (
            cron("*/15 9-17 * * 1-5", u),
            "every 15 minutes from 09:00 to 17:45 on weekdays (UTC)",
            "每个工作日 09:00 至 17:45 每 15 分钟一次（UTC）",
        ),
        (
            cron("* 9 * * *", u),
            "every minute from 09:00 to 09:59 (UTC)",
            "每天 09:00 至 09:59 每分钟一次（UTC）",
        ),
        (
            cron("*/10 * * * 1", u),
            "every 10 minutes on Mondays (UTC)",
            "每周一，每 10 分钟一次（UTC）",
        ),
        (
            cron("*/5 * * * 1-5", u),
            "every 5 minutes on weekdays (UTC)",
            "每个工作日，每 5 分钟一次（UTC）",
        ),
        (
            cron("0 9,17 * * *", u),
            "every day at 09:00 and 17:00 (UTC)",
            "每天 09:00 和 17:00（UTC）",
        ),
        (
            cron("0 8,12,18 * * *", u),
            "every day at 08:00, 12:00 and 18:00 (UTC)",
            "每天 08:00、12:00 和 18:00（UTC）",
        ),
        (
            cron("* * * * * *", u),
            "every second (UTC)",
            "每秒一次（UTC）",
        ),
        (
            cron("*/10 * * * * *", u),
            "every 10 seconds (UTC)",
            "每 10 秒一次（UTC）",
        ),
        (
            cron("30 * * * * *", u),
            "every minute at second 30 (UTC)",
            "每分钟的第 30 秒（UTC）",
        ),
        (
            cron("15 */5 * * * *", u),
            "every 5 minutes at second 15 (UTC)",
            "每 5 分钟的第 15 秒（UTC）",
        ),
        (
            cron("10 30 * * * *", u),
            "every hour at minute 30, second 10 (UTC)",
            "每小时的第 30 分 10 秒（UTC）",
        ),
        (
            cron("30 0 9 * * *", u),
            "every day at 09:00:30 (UTC)",
            "每天 09:00:30（UTC）",
        ),
    ]);
}

#[test]
fn days_of_the_month_last_day_and_months() {
    let b = "Europe/Berlin";
    check(&[
        (
            cron("0 9 1 * *", b),
            "at 09:00 on the 1st of every month (Europe/Berlin)",
            "每月1日 09:00（Europe/Berlin）",
        ),
        (
            cron("0 9 1,15 * *", b),
            "at 09:00 on the 1st and 15th of every month (Europe/Berlin)",
            "每月1日和15日 09:00（Europe/Berlin）",
        ),
        (
            cron("0 12 11-13 * *", b),
            "at 12:00 on the 11th, 12th and 13th of every month (Europe/Berlin)",
            "每月11日、12日和13日 12:00（Europe/Berlin）",
        ),
        (
            cron("0 0 25 12 *", b),
            "at 00:00 on the 25th of December (Europe/Berlin)",
            "12月25日 00:00（Europe/Berlin）",
        ),
        (
            cron("0 0 22 JAN,JUL *", b),
            "at 00:00 on the 22nd of January and July (Europe/Berlin)",
            "1月和7月的22日 00:00（Europe/Berlin）",
        ),
        (
            cron("0 12 * 1,7 *", b),
            "every day at 12:00 in January and July (Europe/Berlin)",
            "1月和7月每天 12:00（Europe/Berlin）",
        ),
        (
            cron("0 0 L * *", b),
            "at 00:00 on the last day of every month (Europe/Berlin)",
            "每月最后一天 00:00（Europe/Berlin）",
        ),
        (
            cron("0 18 L 2,8 *", b),
            "at 18:00 on the last day of February and August (Europe/Berlin)",
            "2月和8月的最后一天 18:00（Europe/Berlin）",
        ),
        (
            cron("*/30 * 1 * *", b),
            "every 30 minutes on the 1st of every month (Europe/Berlin)",
            "每月1日，每 30 分钟一次（Europe/Berlin）",
        ),
        // Shapes no sentence covers are said as the expression, in both languages.
        (
            cron("0 9 * * 1#1", b),
            "cron \"0 9 * * 1#1\" (Europe/Berlin)",
            "cron 表达式 \"0 9 * * 1#1\"（Europe/Berlin）",
        ),
        (
            cron("0 9 1 * 1", b),
            "cron \"0 9 1 * 1\" (Europe/Berlin)",
            "cron 表达式 \"0 9 1 * 1\"（Europe/Berlin）",
        ),
    ]);
}

#[test]
fn dst_gap_and_repeat_policies() {
    let ny = |dst: Value| json!({"cron": "30 1 * * *", "tz": "America/New_York", "dst": dst});
    check(&[
        (
            ny(json!({})),
            "every day at 01:30 (America/New_York)",
            "每天 01:30（America/New_York）",
        ),
        (
            ny(json!({"gap": "shift", "repeat": "first"})),
            "every day at 01:30 (America/New_York)",
            "每天 01:30（America/New_York）",
        ),
        (
            ny(json!({"gap": "skip"})),
            "every day at 01:30 (America/New_York), not sent when DST skips the time",
            "每天 01:30（America/New_York），夏令时跳过该时刻时不发送",
        ),
        (
            ny(json!({"repeat": "last"})),
            "every day at 01:30 (America/New_York), the later one when DST repeats the time",
            "每天 01:30（America/New_York），夏令时重复该时刻时按后一次发送",
        ),
        (
            ny(json!({"gap": "skip", "repeat": "both"})),
            "every day at 01:30 (America/New_York), not sent when DST skips the time, both times when DST repeats the time",
            "每天 01:30（America/New_York），夏令时跳过该时刻时不发送，夏令时重复该时刻时两次都发送",
        ),
        // A fallback sentence says the policy too.
        (
            json!({"cron": "0 2 * * 0#2", "tz": "America/New_York", "dst": {"gap": "skip"}}),
            "cron \"0 2 * * 0#2\" (America/New_York), not sent when DST skips the time",
            "cron 表达式 \"0 2 * * 0#2\"（America/New_York），夏令时跳过该时刻时不发送",
        ),
        // A one-shot in the spring gap is shifted to the transition (03:00 EDT) when created:
        // the sentence says the instant it will fire at.
        (
            json!({"at": "2026-03-08T02:30:00", "tz": "America/New_York"}),
            "once at 2026-03-08 03:00 (America/New_York)",
            "仅一次：2026年3月8日 03:00（America/New_York）",
        ),
        // Reminders before an event in the gap: the event is at 03:00 EDT.
        (
            json!({"reminders": {"event_at": "2026-03-08T02:30:00", "tz": "America/New_York",
                                 "before": ["15m"]}}),
            "15 minutes before 2026-03-08 03:00 (America/New_York)",
            "在 2026年3月8日 03:00 前 15 分钟提醒（America/New_York）",
        ),
    ]);
}

#[test]
fn one_shots_and_reminders() {
    check(&[
        (
            json!({"at": "2026-12-01T09:00:00", "tz": "Asia/Shanghai"}),
            "once at 2026-12-01 09:00 (Asia/Shanghai)",
            "仅一次：2026年12月1日 09:00（Asia/Shanghai）",
        ),
        (
            json!({"at": "2026-12-01T01:00:30Z"}),
            "once at 2026-12-01 01:00:30 (UTC)",
            "仅一次：2026年12月1日 01:00:30（UTC）",
        ),
        (
            json!({"after": "90m"}),
            "once, 1h30m after creation, at 2026-01-01 01:30 (UTC)",
            "仅一次：创建后 1小时30分钟，2026年1月1日 01:30（UTC）",
        ),
        (
            json!({"after": "90s"}),
            "once, 1m30s after creation, at 2026-01-01 00:01:30 (UTC)",
            "仅一次：创建后 1分30秒，2026年1月1日 00:01:30（UTC）",
        ),
        (
            json!({"after": "2d"}),
            "once, 2d after creation, at 2026-01-03 00:00 (UTC)",
            "仅一次：创建后 2天，2026年1月3日 00:00（UTC）",
        ),
        (
            json!({"reminders": {"event_at": "2026-12-01T10:00:00", "tz": "Asia/Shanghai",
                                 "before": ["30m", "15m", "5m"]}}),
            "30, 15 and 5 minutes before 2026-12-01 10:00 (Asia/Shanghai)",
            "在 2026年12月1日 10:00 前 30、15 和 5 分钟提醒（Asia/Shanghai）",
        ),
        (
            json!({"reminders": {"event_at": "2026-12-01T10:00:00", "tz": "Asia/Shanghai",
                                 "before": ["1m"]}}),
            "1 minute before 2026-12-01 10:00 (Asia/Shanghai)",
            "在 2026年12月1日 10:00 前 1 分钟提醒（Asia/Shanghai）",
        ),
        (
            json!({"reminders": {"event_at": "2026-12-01T10:00:00", "tz": "Asia/Shanghai",
                                 "before": ["1d", "1h", "90s"]}}),
            "1d, 1h and 1m30s before 2026-12-01 10:00 (Asia/Shanghai)",
            "在 2026年12月1日 10:00 前 1天、1小时 和 1分30秒提醒（Asia/Shanghai）",
        ),
    ]);
}

/// Unix ms of an RFC 3339 instant written with its offset.
fn at(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .timestamp_millis() as u64
}

/// (now, fire, zone, English, Chinese).
fn check_human(cases: &[(&str, &str, &str, &str, &str)]) {
    let mut wrong = Vec::new();
    for (now, fire, tz, en, zh) in cases {
        let zone: chrono_tz::Tz = tz.parse().unwrap();
        let got = (
            next_fire_human(at(fire), at(now), zone, Lang::En),
            next_fire_human(at(fire), at(now), zone, Lang::Zh),
        );
        if got != (en.to_string(), zh.to_string()) {
            wrong.push(format!(
                "now {now}, fire {fire}\n  want {en:?} / {zh:?}\n  got  {:?} / {:?}",
                got.0, got.1
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn next_fire_human_around_midnight_in_shanghai() {
    // 2026-12-01 is a Tuesday.
    let sh = "Asia/Shanghai";
    check_human(&[
        (
            "2026-12-01T23:59:59+08:00",
            "2026-12-02T09:00:00+08:00",
            sh,
            "tomorrow at 09:00 (Asia/Shanghai)",
            "明天上午 9:00（Asia/Shanghai）",
        ),
        (
            "2026-12-01T23:59:59+08:00",
            "2026-12-02T00:00:00+08:00",
            sh,
            "tomorrow at 00:00 (Asia/Shanghai)",
            "明天凌晨 0:00（Asia/Shanghai）",
        ),
        (
            "2026-12-01T23:59:00+08:00",
            "2026-12-01T23:59:30+08:00",
            sh,
            "today at 23:59:30 (Asia/Shanghai)",
            "今天晚上 11:59:30（Asia/Shanghai）",
        ),
        (
            "2026-12-02T00:00:00+08:00",
            "2026-12-02T09:00:00+08:00",
            sh,
            "today at 09:00 (Asia/Shanghai)",
            "今天上午 9:00（Asia/Shanghai）",
        ),
        // Same UTC day (2026-12-01), the next local day.
        (
            "2026-12-01T08:00:00+08:00",
            "2026-12-02T07:30:00+08:00",
            sh,
            "tomorrow at 07:30 (Asia/Shanghai)",
            "明天上午 7:30（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2026-12-01T12:30:00+08:00",
            sh,
            "today at 12:30 (Asia/Shanghai)",
            "今天中午 12:30（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2026-12-03T20:15:30+08:00",
            sh,
            "on Thursday at 20:15:30 (Asia/Shanghai)",
            "后天晚上 8:15:30（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2026-12-04T15:00:00+08:00",
            sh,
            "on Friday at 15:00 (Asia/Shanghai)",
            "本周五下午 3:00（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2026-12-07T12:00:00+08:00",
            sh,
            "on Monday at 12:00 (Asia/Shanghai)",
            "下周一中午 12:00（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2026-12-25T09:00:00+08:00",
            sh,
            "on 2026-12-25 at 09:00 (Asia/Shanghai)",
            "12月25日上午 9:00（Asia/Shanghai）",
        ),
        (
            "2026-12-01T10:00:00+08:00",
            "2027-01-05T09:00:00+08:00",
            sh,
            "on 2027-01-05 at 09:00 (Asia/Shanghai)",
            "2027年1月5日上午 9:00（Asia/Shanghai）",
        ),
        // Overdue fires (herald catching up): earlier today, yesterday.
        (
            "2026-12-01T08:00:00+08:00",
            "2026-12-01T03:00:00+08:00",
            sh,
            "today at 03:00 (Asia/Shanghai)",
            "今天凌晨 3:00（Asia/Shanghai）",
        ),
        (
            "2026-12-02T00:10:00+08:00",
            "2026-12-01T18:00:00+08:00",
            sh,
            "yesterday at 18:00 (Asia/Shanghai)",
            "昨天晚上 6:00（Asia/Shanghai）",
        ),
    ]);
}

#[test]
fn next_fire_human_across_dst_in_new_york_and_berlin() {
    let ny = "America/New_York";
    let be = "Europe/Berlin";
    check_human(&[
        // New York springs forward on Sunday 2026-03-08 at 02:00 EST -> 03:00 EDT.
        (
            "2026-03-07T23:30:00-05:00",
            "2026-03-08T03:00:00-04:00",
            ny,
            "tomorrow at 03:00 (America/New_York)",
            "明天凌晨 3:00（America/New_York）",
        ),
        // 24 h after Saturday 23:30 EST is Monday 00:30 EDT: two local days on, not one.
        (
            "2026-03-07T23:30:00-05:00",
            "2026-03-09T00:30:00-04:00",
            ny,
            "on Monday at 00:30 (America/New_York)",
            "后天凌晨 0:30（America/New_York）",
        ),
        // Sunday 00:30 EST to Monday 00:30 EDT is 23 h: tomorrow.
        (
            "2026-03-08T00:30:00-05:00",
            "2026-03-09T00:30:00-04:00",
            ny,
            "tomorrow at 00:30 (America/New_York)",
            "明天凌晨 0:30（America/New_York）",
        ),
        // Falls back on Sunday 2026-11-01 at 02:00 EDT -> 01:00 EST: the second 01:30.
        (
            "2026-10-31T23:59:00-04:00",
            "2026-11-01T01:30:00-05:00",
            ny,
            "tomorrow at 01:30 (America/New_York)",
            "明天凌晨 1:30（America/New_York）",
        ),
        // 24.5 h on, across the repeated hour: tomorrow, at midnight.
        (
            "2026-11-01T00:30:00-04:00",
            "2026-11-02T00:00:00-05:00",
            ny,
            "tomorrow at 00:00 (America/New_York)",
            "明天凌晨 0:00（America/New_York）",
        ),
        // 23:30 EDT and 00:30 EST: in UTC the same day, locally today.
        (
            "2026-11-01T00:30:00-04:00",
            "2026-11-01T23:30:00-05:00",
            ny,
            "today at 23:30 (America/New_York)",
            "今天晚上 11:30（America/New_York）",
        ),
        // Berlin springs forward on Sunday 2026-03-29 at 02:00 CET -> 03:00 CEST.
        (
            "2026-03-28T23:00:00+01:00",
            "2026-03-29T03:00:00+02:00",
            be,
            "tomorrow at 03:00 (Europe/Berlin)",
            "明天凌晨 3:00（Europe/Berlin）",
        ),
        (
            "2026-03-29T23:30:00+02:00",
            "2026-03-30T00:00:00+02:00",
            be,
            "tomorrow at 00:00 (Europe/Berlin)",
            "明天凌晨 0:00（Europe/Berlin）",
        ),
        // Falls back on Sunday 2026-10-25 at 03:00 CEST -> 02:00 CET: 25 h on is tomorrow.
        (
            "2026-10-24T23:30:00+02:00",
            "2026-10-25T23:30:00+01:00",
            be,
            "tomorrow at 23:30 (Europe/Berlin)",
            "明天晚上 11:30（Europe/Berlin）",
        ),
        // Saturday 2026-10-24 to Thursday 2026-10-29, the next week (weeks start on Monday).
        (
            "2026-10-24T12:00:00+02:00",
            "2026-10-29T08:00:00+01:00",
            be,
            "on Thursday at 08:00 (Europe/Berlin)",
            "下周四上午 8:00（Europe/Berlin）",
        ),
    ]);
}
