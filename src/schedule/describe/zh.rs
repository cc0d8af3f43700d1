//! The Chinese sentences: "每个工作日 09:00（Asia/Shanghai）", "明天上午 9:00（Asia/Shanghai）".
//! The same shapes as the English ones (`en.rs`), each with its own wording: a schedule
//! says the 24-hour time ("每天 09:00"), a relative time says the part of the day as people
//! do ("明天上午 9:00").

use chrono::{Datelike, NaiveDate};

use super::human::{Day, Local};
use super::shape::{Clock, Days, Shape, Time};
use crate::model::{DstGap, DstPolicy, DstRepeat};

/// Sunday first, as chrono's `num_days_from_sunday` counts.
const WEEKDAYS: [&str; 7] = ["日", "一", "二", "三", "四", "五", "六"];

/// A day of the week by its number, Sunday 0 (7 is Sunday again, as cron reads it).
fn day_name(d: usize) -> &'static str {
    WEEKDAYS.get(d % 7).copied().unwrap_or_default()
}

/// What stands for the zone in recipient time (en.rs's `RECIPIENT`).
pub const RECIPIENT: &str = "收件人当地时间";

/// "（Asia/Shanghai）": full-width parentheses, no space before.
pub fn zone(name: &str) -> String {
    ["（", name, "）"].concat()
}

/// A cron shape as a sentence, without the zone.
pub fn cron(s: &Shape) -> String {
    let months = s
        .months
        .as_ref()
        .map(|m| join(m.iter().map(|m| format!("{m}月"))));
    let scope = match &s.days {
        Days::Every => format!("{}每天", months.as_deref().unwrap_or("")),
        d @ Days::Week(_) if d.is_workweek() => {
            format!("{}每个工作日", months.as_deref().unwrap_or(""))
        }
        Days::Week(days) => {
            let names = join(days.iter().map(|d| format!("周{}", day_name(*d as usize))));
            // "每周一和周五": one 每 for the list.
            format!("{}每{names}", months.as_deref().unwrap_or(""))
        }
        Days::Month(days) => {
            let days = join(days.iter().map(|d| format!("{d}日")));
            match (s.months.as_deref(), &months) {
                (Some([m]), Some(_)) => format!("{m}月{days}"),
                (_, Some(m)) => format!("{m}的{days}"),
                _ => format!("每月{days}"),
            }
        }
        Days::LastOfMonth => match &months {
            Some(m) => format!("{m}的最后一天"),
            None => "每月最后一天".into(),
        },
    };
    match time(&s.time) {
        Text::At(t) => format!("{scope} {t}"),
        // "每 5 分钟一次" needs no "every day" before it, as in English.
        Text::Every { text, .. } if s.days == Days::Every && s.months.is_none() => match s.time {
            Time::HourSpan { .. } | Time::Minutes { span: Some(_), .. } => {
                format!("每天 {text}")
            }
            _ => text,
        },
        Text::Every { text, span: true } => format!("{scope} {text}"),
        Text::Every { text, span: false } => format!("{scope}，{text}"),
    }
}

/// The expression itself, for shapes the sentences do not cover.
pub fn cron_fallback(expr: &str) -> String {
    format!("cron 表达式 {expr:?}")
}

/// The DST policy, when it is not the default (shift, first).
pub fn dst(p: DstPolicy) -> String {
    let mut out = String::new();
    if p.gap == DstGap::Skip {
        out.push_str("，夏令时跳过该时刻时不发送");
    }
    match p.repeat {
        DstRepeat::First => {}
        DstRepeat::Last => out.push_str("，夏令时重复该时刻时按后一次发送"),
        DstRepeat::Both => out.push_str("，夏令时重复该时刻时两次都发送"),
    }
    out
}

/// "仅一次：2026年12月1日 09:00".
pub fn once(at: &Local) -> String {
    format!("仅一次：{}", date_time(at))
}

/// "仅一次：创建后 1小时30分钟，2026年12月1日 01:00".
pub fn once_after(after_ms: u64, at: &Local) -> String {
    format!("仅一次：创建后 {}，{}", duration(after_ms), date_time(at))
}

/// "在 2026年12月1日 10:00 前 30、15 和 5 分钟提醒": the offsets in the order given.
pub fn reminders(before_ms: &[u64], event: &Local) -> String {
    let all_minutes = before_ms.iter().all(|o| o % 60_000 == 0);
    let list = if all_minutes {
        let n: Vec<String> = before_ms.iter().map(|o| (o / 60_000).to_string()).collect();
        format!("{} 分钟", join_spaced(n))
    } else {
        join_spaced(before_ms.iter().map(|o| duration(*o)).collect())
    };
    format!("在 {} 前 {list}提醒", date_time(event))
}

/// "明天上午 9:00", "本周五下午 3:00", "12月25日上午 9:00".
pub fn relative(day: Day, at: &Local, now: NaiveDate) -> String {
    let when = match day {
        Day::Yesterday => "昨天".to_string(),
        Day::Today => "今天".into(),
        Day::Tomorrow => "明天".into(),
        Day::InTwoDays => "后天".into(),
        Day::ThisWeek => format!("本周{}", weekday(at.date)),
        Day::NextWeek => format!("下周{}", weekday(at.date)),
        Day::Other if at.date.year() == now.year() => {
            format!("{}月{}日", at.date.month(), at.date.day())
        }
        Day::Other => date(at.date),
    };
    format!("{when}{}", part_of_day(at.clock))
}

fn weekday(d: NaiveDate) -> &'static str {
    day_name(d.weekday().num_days_from_sunday() as usize)
}

/// The part of the day and a 12-hour time, as Chinese clocks and chat apps say it:
/// 凌晨 0:00–5:59, 上午 6:00–11:59, 中午 12:00–12:59, 下午 13:00–17:59, 晚上 18:00–23:59.
fn part_of_day(c: Clock) -> String {
    let (part, h) = match c.h {
        0..=5 => ("凌晨", c.h),
        6..=11 => ("上午", c.h),
        12 => ("中午", 12),
        13..=17 => ("下午", c.h - 12),
        _ => ("晚上", c.h - 12),
    };
    if c.s == 0 {
        format!("{part} {h}:{:02}", c.m)
    } else {
        format!("{part} {h}:{:02}:{:02}", c.m, c.s)
    }
}

/// "2026年12月1日".
fn date(d: NaiveDate) -> String {
    format!("{}年{}月{}日", d.year(), d.month(), d.day())
}

/// "2026年12月1日 09:00".
pub fn date_time(at: &Local) -> String {
    format!("{} {}", date(at.date), super::en::clock(at.clock))
}

/// A duration in Chinese units: "1小时30分钟", "1分30秒", "2天", "500毫秒".
pub fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0秒".into();
    }
    let units = [
        (86_400_000u64, "天"),
        (3_600_000, "小时"),
        (60_000, "分钟"),
        (1_000, "秒"),
        (1, "毫秒"),
    ];
    // Minutes followed by seconds are "分", as in "1分30秒".
    let has_seconds = !ms.is_multiple_of(60_000);
    let mut rest = ms;
    let mut out = String::new();
    for (size, unit) in units {
        let n = rest / size;
        if n > 0 {
            let unit = if size == 60_000 && has_seconds {
                "分"
            } else {
                unit
            };
            out.push_str(&format!("{n}{unit}"));
            rest -= n * size;
        }
    }
    out
}

/// The time-of-day part of a sentence.
enum Text {
    /// Fixed times: "09:00 和 17:00".
    At(String),
    /// A repetition; `span` when it names its hours ("09:00 至 17:00 每小时一次").
    Every { text: String, span: bool },
}

fn time(t: &Time) -> Text {
    let clock = |c: &Clock| super::en::clock(*c);
    let every = |text: String| Text::Every { text, span: false };
    match t {
        Time::At(clocks) => Text::At(join_spaced(clocks.iter().map(clock).collect())),
        Time::HourSpan { from, to } => Text::Every {
            text: format!("{} 至 {} 每小时一次", clock(from), clock(to)),
            span: true,
        },
        Time::Hours {
            every: n,
            minute,
            second,
        } => {
            let each = match n {
                1 => "每小时".to_string(),
                n => format!("每 {n} 小时"),
            };
            every(match (minute, second) {
                (0, 0) => format!("{each}一次"),
                (m, 0) => format!("{each}的第 {m} 分钟"),
                (m, s) => format!("{each}的第 {m} 分 {s} 秒"),
            })
        }
        Time::Minutes {
            every: n,
            second,
            span,
        } => {
            let each = match n {
                1 => "每分钟".to_string(),
                n => format!("每 {n} 分钟"),
            };
            match (span, second) {
                (Some((from, to)), _) => Text::Every {
                    text: format!("{} 至 {} {each}一次", clock(from), clock(to)),
                    span: true,
                },
                (None, 0) => every(format!("{each}一次")),
                (None, s) => every(format!("{each}的第 {s} 秒")),
            }
        }
        Time::Seconds(1) => every("每秒一次".into()),
        Time::Seconds(n) => every(format!("每 {n} 秒一次")),
    }
}

/// "a", "a和b", "a、b和c" (words: no spaces).
fn join(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{}和{last}", rest.join("、")),
    }
}

/// "09:00 和 17:00", "30、15 和 5" (numbers: spaced around 和).
fn join_spaced(items: Vec<String>) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} 和 {last}", rest.join("、")),
    }
}
