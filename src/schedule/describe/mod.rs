//! Schedules and instants in words, in English (`en.rs`, the default) and Chinese (`zh.rs`):
//! "every weekday at 09:00 (Asia/Shanghai)" / "每个工作日 09:00（Asia/Shanghai）", and the next
//! fire relative to now, "tomorrow at 09:00 (Asia/Shanghai)" / "明天上午 9:00（Asia/Shanghai）".
//! Pure: `now` is an argument. What a cron expression says is read once (`shape.rs`) and
//! worded by each language, so the two always describe the same shapes.

mod en;
mod human;
mod shape;
mod zh;

use chrono_tz::Tz;

use super::local::{format_local, format_utc, parse_tz};
use crate::model::{DstPolicy, Lang, Schedule};

/// The zone a schedule is read in (UTC for `after` and when none is given).
pub fn zone_of(s: &Schedule) -> Tz {
    let name = match s {
        Schedule::At { tz, .. } | Schedule::Cron { tz, .. } | Schedule::Reminders { tz, .. } => {
            tz.as_deref()
        }
        Schedule::After { .. } => None,
    };
    name.and_then(|n| parse_tz(n).ok())
        .unwrap_or(chrono_tz::UTC)
}

/// A sentence for a schedule in `lang`, e.g. "once at 2026-12-01 09:00 (Asia/Shanghai)".
pub fn describe(schedule: &Schedule, lang: Lang) -> String {
    let tz = zone_of(schedule);
    // Chinese words a wall time's parts; English prints it as `format_local` does (and so
    // does Chinese, for an instant past chrono's range, which the horizon rules out).
    let zh_local = |ms: u64| match lang {
        Lang::Zh => human::local(ms, tz),
        Lang::En => None,
    };
    let body = match schedule {
        Schedule::Cron { cron, dst, .. } => {
            return match super::plan::cron_of(schedule) {
                Some(c) => c.describe_in(lang),
                // Not reachable for a validated task; still a true sentence.
                None => cron_sentence(None, cron, tz, *dst, lang),
            };
        }
        Schedule::At { at_ms, .. } => match zh_local(*at_ms) {
            Some(l) => zh::once(&l),
            None => en::once(&format_local(*at_ms, tz)),
        },
        Schedule::After {
            after_ms, at_ms, ..
        } => match zh_local(*at_ms) {
            Some(l) => zh::once_after(*after_ms, &l),
            None => en::once_after(*after_ms, &format_local(*at_ms, tz)),
        },
        Schedule::Reminders {
            event_ms,
            before_ms,
            ..
        } => match zh_local(*event_ms) {
            Some(l) => zh::reminders(before_ms, &l),
            None => en::reminders(before_ms, &format_local(*event_ms, tz)),
        },
    };
    [body, zone(tz, lang)].concat()
}

/// A cron schedule's sentence: `normalized` is croner's form of the expression (`None` when it
/// did not parse), `expr` the user's text, said as it is when no sentence covers its shape.
pub(super) fn cron_sentence(
    normalized: Option<&str>,
    expr: &str,
    tz: Tz,
    dst: DstPolicy,
    lang: Lang,
) -> String {
    let shape = normalized.and_then(shape::shape);
    let (body, policy) = match (lang, shape) {
        (Lang::En, Some(s)) => (en::cron(&s), en::dst(dst)),
        (Lang::En, None) => (en::cron_fallback(expr), en::dst(dst)),
        (Lang::Zh, Some(s)) => (zh::cron(&s), zh::dst(dst)),
        (Lang::Zh, None) => (zh::cron_fallback(expr), zh::dst(dst)),
    };
    [body, zone(tz, lang), policy].concat()
}

fn zone(tz: Tz, lang: Lang) -> String {
    match lang {
        Lang::En => en::zone(tz.name()),
        Lang::Zh => zh::zone(tz.name()),
    }
}

/// When `at_ms` is, seen at `now_ms` by someone in `tz`: "tomorrow at 09:00 (Asia/Shanghai)",
/// "明天上午 9:00（Asia/Shanghai）"; weekday names within the week, a date beyond.
pub fn next_fire_human(at_ms: u64, now_ms: u64, tz: Tz, lang: Lang) -> String {
    let (Some(at), Some(now)) = (human::local(at_ms, tz), human::local(now_ms, tz)) else {
        return [format_utc(at_ms), zone(tz, lang)].concat();
    };
    let day = human::day(at.date, now.date);
    let text = match lang {
        Lang::En => en::relative(day, &at),
        Lang::Zh => zh::relative(day, &at, now.date),
    };
    [text, zone(tz, lang)].concat()
}
