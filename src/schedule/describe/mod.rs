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
use super::recipient::{is_recipient, message_dst, slot_wall};
use crate::model::{DstPolicy, Lang, Schedule};

/// Where a schedule's wall times are read: in one zone, or each in its recipient's own
/// (`"tz": "recipient"`), which no single zone's name says.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Zone(Tz),
    Recipient,
}

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
    if let Some(sentence) = describe_recipient(schedule, lang) {
        return sentence;
    }
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
    [body, zone(Place::Zone(tz), lang)].concat()
}

/// A schedule in recipient time, in words: its wall time, with the DST policy its messages
/// follow (`message_dst`), "each recipient's local time" where a zone would be. `None` for a
/// schedule in a zone.
fn describe_recipient(schedule: &Schedule, lang: Lang) -> Option<String> {
    match schedule {
        Schedule::Cron { cron, tz, dst, .. } if is_recipient(tz.as_deref()) => {
            let normalized = normalized(cron);
            let dst = message_dst(*dst);
            let place = Place::Recipient;
            Some(cron_words(normalized.as_deref(), cron, place, dst, lang))
        }
        Schedule::At { tz, .. } if is_recipient(tz.as_deref()) => {
            // The `at` itself, a wall time (its `at_ms` is only where it comes first).
            let wall = slot_wall(schedule, &[], 0)?;
            let body = match (lang, human::local(wall, chrono_tz::UTC)) {
                (Lang::Zh, Some(l)) => zh::once(&l),
                _ => en::once(&format_local(wall, chrono_tz::UTC)),
            };
            Some([body, zone(Place::Recipient, lang)].concat())
        }
        _ => None,
    }
}

/// croner's form of a cron expression (upper case, names as numbers), which `shape.rs` reads;
/// parsed as `cron.rs` parses it (seconds optional). `None` if it does not parse.
fn normalized(expr: &str) -> Option<String> {
    use croner::parser::{CronParser, Seconds};
    let parser = CronParser::builder().seconds(Seconds::Optional).build();
    parser.parse(expr).ok().map(|c| c.as_str().to_string())
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
    cron_words(normalized, expr, Place::Zone(tz), dst, lang)
}

/// [`cron_sentence`], its wall times read in `place`.
fn cron_words(
    normalized: Option<&str>,
    expr: &str,
    place: Place,
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
    [body, zone(place, lang), policy].concat()
}

fn zone(place: Place, lang: Lang) -> String {
    match (place, lang) {
        (Place::Zone(tz), Lang::En) => en::zone(tz.name()),
        (Place::Zone(tz), Lang::Zh) => zh::zone(tz.name()),
        (Place::Recipient, Lang::En) => en::zone(en::RECIPIENT),
        (Place::Recipient, Lang::Zh) => zh::zone(zh::RECIPIENT),
    }
}

/// An instant as a person in `tz` reads it, with the zone: "2026-12-02 09:00 (Asia/Shanghai)",
/// "2026年12月2日 09:00（Asia/Shanghai）" (as [`describe`] writes a one-shot's time).
pub fn local_time(ms: u64, tz: Tz, lang: Lang) -> String {
    let at = match (lang, human::local(ms, tz)) {
        (Lang::Zh, Some(l)) => zh::date_time(&l),
        _ => format_local(ms, tz),
    };
    [at, zone(Place::Zone(tz), lang)].concat()
}

/// A duration as a person reads it in `lang`: "2s500ms" (as herald writes durations),
/// "2秒500毫秒".
pub fn duration(ms: u64, lang: Lang) -> String {
    match lang {
        Lang::En => crate::model::format_duration_ms(ms),
        Lang::Zh => zh::duration(ms),
    }
}

/// A wall time in recipient time, which each recipient has in their own zone (ms as if UTC,
/// `recipient.rs`): "2026-12-02 09:00 (each recipient's local time)",
/// "2026年12月2日 09:00（收件人当地时间）".
pub fn recipient_time(wall_ms: u64, lang: Lang) -> String {
    let at = match (lang, human::local(wall_ms, chrono_tz::UTC)) {
        (Lang::Zh, Some(l)) => zh::date_time(&l),
        _ => format_local(wall_ms, chrono_tz::UTC),
    };
    [at, zone(Place::Recipient, lang)].concat()
}

/// When `at_ms` is, seen at `now_ms` by someone in `tz`: "tomorrow at 09:00 (Asia/Shanghai)",
/// "明天上午 9:00（Asia/Shanghai）"; weekday names within the week, a date beyond.
pub fn next_fire_human(at_ms: u64, now_ms: u64, tz: Tz, lang: Lang) -> String {
    let (Some(at), Some(now)) = (human::local(at_ms, tz), human::local(now_ms, tz)) else {
        return [format_utc(at_ms), zone(Place::Zone(tz), lang)].concat();
    };
    let day = human::day(at.date, now.date);
    let text = match lang {
        Lang::En => en::relative(day, &at),
        Lang::Zh => zh::relative(day, &at, now.date),
    };
    [text, zone(Place::Zone(tz), lang)].concat()
}

/// [`next_fire_human`] of a slot in recipient time: its wall time `wall_ms`, which each
/// recipient has in their own zone, on its day as seen at `now_ms` in `first` (the zone where
/// the slot comes first): "tomorrow at 09:00 (each recipient's local time)".
pub(super) fn slot_human(wall_ms: u64, now_ms: u64, first: Tz, lang: Lang) -> Option<String> {
    let at = human::local(wall_ms, chrono_tz::UTC)?;
    let now = human::local(now_ms, first)?;
    let day = human::day(at.date, now.date);
    let text = match lang {
        Lang::En => en::relative(day, &at),
        Lang::Zh => zh::relative(day, &at, now.date),
    };
    Some([text, zone(Place::Recipient, lang)].concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Task;

    const NOW: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    fn task(schedule: serde_json::Value, zones: &[&str]) -> Task {
        let messages: Vec<_> = zones
            .iter()
            .map(|z| serde_json::json!({"to": "a", "body": "b", "tz": z}))
            .collect();
        crate::request::test_task(
            serde_json::json!({"schedule": schedule, "messages": messages}),
            NOW,
        )
    }

    /// Recipient time is each recipient's own zone, never UTC (review finding: "recipient"
    /// was read as a zone, failed, and the sentence said UTC).
    #[test]
    fn a_cron_in_recipient_time_says_each_recipients_local_time() {
        let t = task(
            serde_json::json!({"cron": "0 9 * * *", "tz": "recipient"}),
            &["Asia/Shanghai", "Europe/Berlin"],
        );
        assert_eq!(
            describe(&t.schedule, Lang::En),
            "every day at 09:00 (each recipient's local time)"
        );
        assert_eq!(
            describe(&t.schedule, Lang::Zh),
            "每天 09:00（收件人当地时间）"
        );
        // A gap is never skipped in recipient time: the policy said is the one messages follow.
        let skip = task(
            serde_json::json!({"cron": "0 9 * * 1-5", "tz": "recipient", "dst": {"gap": "skip"}}),
            &["Asia/Shanghai"],
        );
        assert_eq!(
            describe(&skip.schedule, Lang::En),
            "every weekday at 09:00 (each recipient's local time)"
        );
    }

    #[test]
    fn an_at_in_recipient_time_says_its_wall_time() {
        let t = task(
            serde_json::json!({"at": "2026-12-02T09:00:00", "tz": "recipient"}),
            &["Asia/Shanghai"],
        );
        // It comes first at 01:00Z (09:00 in Shanghai); the sentence says the wall time.
        assert_eq!(t.next_fire_at_ms, Some(1_796_173_200_000));
        assert_eq!(
            describe(&t.schedule, Lang::En),
            "once at 2026-12-02 09:00 (each recipient's local time)"
        );
        assert_eq!(
            describe(&t.schedule, Lang::Zh),
            "仅一次：2026年12月2日 09:00（收件人当地时间）"
        );
    }

    #[test]
    fn the_next_fire_in_recipient_time_says_its_wall_time() {
        let human = |t: &Task, lang| {
            let fire = (
                t.next_fire_at_ms.unwrap(),
                crate::schedule::plan::next_fire_wall(t),
            );
            crate::schedule::recipient::next_fire_human(
                &t.schedule,
                &t.recipient_zones,
                fire,
                NOW,
                lang,
            )
        };
        let at = task(
            serde_json::json!({"at": "2026-12-02T09:00:00", "tz": "recipient"}),
            &["Asia/Shanghai"],
        );
        assert_eq!(
            human(&at, Lang::En),
            "tomorrow at 09:00 (each recipient's local time)"
        );
        assert_eq!(human(&at, Lang::Zh), "明天上午 9:00（收件人当地时间）");
        // A cron's next slot: 09:00 on 1 Dec in Shanghai (08:00 there now) is today there.
        let cron = task(
            serde_json::json!({"cron": "0 9 * * *", "tz": "recipient"}),
            &["Asia/Shanghai", "America/New_York"],
        );
        assert_eq!(
            human(&cron, Lang::En),
            "today at 09:00 (each recipient's local time)"
        );
        assert_eq!(human(&cron, Lang::Zh), "今天上午 9:00（收件人当地时间）");
        // A schedule in a zone is said in it, as before.
        let zoned = task(
            serde_json::json!({"cron": "0 9 * * *", "tz": "Asia/Shanghai"}),
            &["Asia/Shanghai"],
        );
        assert_eq!(human(&zoned, Lang::En), "today at 09:00 (Asia/Shanghai)");
    }

    /// croner restricts a day field written `*/1` (only a literal `*` is unrestricted), so it
    /// ORs it with the other day field: the sentence says what fires (review finding: "0 9 */1
    /// * 1" was "every Monday" and fired every day).
    #[test]
    fn a_day_field_of_star_slash_one_is_described_as_croner_fires_it() {
        use crate::schedule::CronSchedule;
        let at =
            |s: &str| crate::schedule::parse_instant(s, None, DstPolicy::default()).unwrap()[0];
        let tuesday = at("2026-06-02T00:00:00Z");
        for (expr, en, zh) in [
            (
                "0 9 */1 * 1",
                "every day at 09:00 (UTC)",
                "每天 09:00（UTC）",
            ),
            (
                "0 9 5 * */1",
                "every day at 09:00 (UTC)",
                "每天 09:00（UTC）",
            ),
            (
                "0 9 */1 * *",
                "every day at 09:00 (UTC)",
                "每天 09:00（UTC）",
            ),
            (
                "0 9 * * */1",
                "every day at 09:00 (UTC)",
                "每天 09:00（UTC）",
            ),
            (
                "0 9 * * 1",
                "every Monday at 09:00 (UTC)",
                "每周一 09:00（UTC）",
            ),
        ] {
            let c = CronSchedule::parse(expr, chrono_tz::UTC, DstPolicy::default()).unwrap();
            assert_eq!(
                (
                    c.describe_in(Lang::En).as_str(),
                    c.describe_in(Lang::Zh).as_str()
                ),
                (en, zh),
                "{expr}"
            );
            let every_day = en.starts_with("every day");
            let next = if every_day {
                "2026-06-02T09:00:00Z"
            } else {
                "2026-06-08T09:00:00Z"
            };
            assert_eq!(
                c.next_after(tuesday),
                Some(at(next)),
                "{expr} fires as described"
            );
        }
    }
}
