//! The English sentences: "every weekday at 09:00 (Asia/Shanghai)", "tomorrow at 09:00
//! (Asia/Shanghai)".

use chrono::{Datelike, NaiveDate};

use super::human::{Day, Local};
use super::shape::{Clock, Days, Shape, Time};
use crate::model::{format_duration_ms, DstGap, DstPolicy, DstRepeat};

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// A day of the week by its number, Sunday 0 (7 is Sunday again, as cron reads it).
fn day_name(d: usize) -> &'static str {
    WEEKDAYS.get(d % 7).copied().unwrap_or_default()
}
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// What stands for the zone in recipient time: each message goes at the wall time in its
/// recipient's zone.
pub const RECIPIENT: &str = "each recipient's local time";

/// " (Asia/Shanghai)".
pub fn zone(name: &str) -> String {
    [" (", name, ")"].concat()
}

/// A cron shape as a sentence, without the zone.
pub fn cron(s: &Shape) -> String {
    let months = s.months.as_ref().map(|m| join(m.iter().map(|m| month(*m))));
    let in_months = months
        .as_ref()
        .map(|m| format!(" in {m}"))
        .unwrap_or_default();
    let time = time(&s.time);
    match (&s.days, time) {
        (Days::Every, Text::At(t)) => format!("every day at {t}{in_months}"),
        (Days::Every, Text::Every(e)) => format!("{e}{in_months}"),
        (d @ Days::Week(days), time) => {
            let names = join(days.iter().map(|d| day_name(*d as usize).to_string()));
            match (d.is_workweek(), days.len(), time) {
                (true, _, Text::At(t)) => format!("every weekday at {t}{in_months}"),
                (true, _, Text::Every(e)) => format!("{e} on weekdays{in_months}"),
                (_, 1, Text::At(t)) => format!("every {names} at {t}{in_months}"),
                (_, 1, Text::Every(e)) => format!("{e} on {names}s{in_months}"),
                (_, _, Text::At(t)) => format!("at {t} on {names}{in_months}"),
                (_, _, Text::Every(e)) => format!("{e} on {names}{in_months}"),
            }
        }
        (d @ (Days::Month(_) | Days::LastOfMonth), time) => {
            let days = match d {
                Days::Month(days) => join(days.iter().map(|d| ordinal(*d))),
                _ => "last day".into(),
            };
            let of = months.unwrap_or_else(|| "every month".into());
            match time {
                Text::At(t) => format!("at {t} on the {days} of {of}"),
                Text::Every(e) => format!("{e} on the {days} of {of}"),
            }
        }
    }
}

/// What a cron expression the sentences do not cover says: the expression itself.
pub fn cron_fallback(expr: &str) -> String {
    format!("cron {expr:?}")
}

/// The DST policy, when it is not the default: ", not sent when DST skips the time, twice
/// when DST repeats it". Empty for the default (shift, first), which needs no words.
pub fn dst(p: DstPolicy) -> String {
    let mut out = String::new();
    if p.gap == DstGap::Skip {
        out.push_str(", not sent when DST skips the time");
    }
    match p.repeat {
        DstRepeat::First => {}
        DstRepeat::Last => out.push_str(", the later one when DST repeats the time"),
        DstRepeat::Both => out.push_str(", both times when DST repeats the time"),
    }
    out
}

/// "once at 2026-12-01 09:00".
pub fn once(local: &str) -> String {
    ["once at ", local].concat()
}

/// "once, 1h30m after creation, at 2026-12-01 01:00". Pieces pushed, not `format!`: every
/// create's 201 body has a description.
pub fn once_after(after_ms: u64, local: &str) -> String {
    [
        "once, ",
        &format_duration_ms(after_ms),
        " after creation, at ",
        local,
    ]
    .concat()
}

/// "30, 15 and 5 minutes before 2026-12-01 10:00": the offsets in the order given.
pub fn reminders(before_ms: &[u64], event_local: &str) -> String {
    let all_minutes = before_ms.iter().all(|o| o % 60_000 == 0);
    let list = join(before_ms.iter().map(|o| {
        if all_minutes {
            (o / 60_000).to_string()
        } else {
            format_duration_ms(*o)
        }
    }));
    let unit = match (all_minutes, before_ms) {
        (false, _) => "",
        (true, [60_000]) => " minute",
        (true, _) => " minutes",
    };
    format!("{list}{unit} before {event_local}")
}

/// "tomorrow at 09:00", "on Friday at 15:00", "on 2027-01-05 at 09:00".
pub fn relative(day: Day, at: &Local) -> String {
    let clock = clock(at.clock);
    match day {
        Day::Today => format!("today at {clock}"),
        Day::Tomorrow => format!("tomorrow at {clock}"),
        Day::Yesterday => format!("yesterday at {clock}"),
        Day::InTwoDays | Day::ThisWeek | Day::NextWeek => {
            let name = day_name(at.date.weekday().num_days_from_sunday() as usize);
            format!("on {name} at {clock}")
        }
        Day::Other => format!("on {} at {clock}", date(at.date)),
    }
}

fn date(d: NaiveDate) -> String {
    format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
}

/// The time-of-day part of a sentence.
enum Text {
    /// Fixed times, to be said "at 09:00 and 17:00".
    At(String),
    /// A repetition, e.g. "every 15 minutes".
    Every(String),
}

fn time(t: &Time) -> Text {
    match t {
        Time::At(clocks) => Text::At(join(clocks.iter().map(|c| clock(*c)))),
        Time::HourSpan { from, to } => Text::Every(format!(
            "every hour from {} to {}",
            clock(*from),
            clock(*to)
        )),
        Time::Hours {
            every,
            minute,
            second,
        } => {
            let every = match every {
                1 => "every hour".to_string(),
                n => format!("every {n} hours"),
            };
            Text::Every(match (minute, second) {
                (0, 0) => every,
                (m, 0) => format!("{every} at minute {m}"),
                (m, s) => format!("{every} at minute {m}, second {s}"),
            })
        }
        Time::Minutes {
            every,
            second,
            span,
        } => {
            let every = match every {
                1 => "every minute".to_string(),
                n => format!("every {n} minutes"),
            };
            Text::Every(match (span, second) {
                (Some((from, to)), _) => format!("{every} from {} to {}", clock(*from), clock(*to)),
                (None, 0) => every,
                (None, s) => format!("{every} at second {s}"),
            })
        }
        Time::Seconds(1) => Text::Every("every second".into()),
        Time::Seconds(n) => Text::Every(format!("every {n} seconds")),
    }
}

fn month(m: u32) -> String {
    MONTHS
        .get((m as usize).wrapping_sub(1))
        .map_or_else(|| format!("month {m}"), |n| n.to_string())
}

pub(super) fn clock(c: Clock) -> String {
    if c.s == 0 {
        format!("{:02}:{:02}", c.h, c.m)
    } else {
        format!("{:02}:{:02}:{:02}", c.h, c.m, c.s)
    }
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// "a", "a and b", "a, b and c".
fn join(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use crate::model::DstPolicy;
    use crate::schedule::cron::CronSchedule;

    fn describe(expr: &str, tz: &str) -> String {
        CronSchedule::parse(expr, tz.parse().unwrap(), DstPolicy::default())
            .unwrap()
            .describe()
    }

    #[test]
    fn api_examples_with_zones() {
        let cases = [
            ("0 9 * * 1-5", "Asia/Shanghai", "every weekday at 09:00"),
            ("30 2 * * *", "America/New_York", "every day at 02:30"),
            ("*/15 * * * *", "UTC", "every 15 minutes"),
            ("30 * * * * *", "UTC", "every minute at second 30"),
            (
                "0 9 * * 1,5",
                "Europe/Berlin",
                "at 09:00 on Monday and Friday",
            ),
        ];
        for (expr, tz, want) in cases {
            assert_eq!(describe(expr, tz), format!("{want} ({tz})"), "{expr}");
        }
    }

    #[test]
    fn sentences() {
        // (expression, sentence in UTC without the zone suffix).
        let table = [
            // Weekdays: names, 7 for Sunday, Monday-first order.
            ("0 9 * * mon-fri", "every weekday at 09:00"),
            ("0 9 * * FRI,MON", "at 09:00 on Monday and Friday"),
            ("0 10 * * 0,6", "at 10:00 on Saturday and Sunday"),
            ("0 10 * * 7", "every Sunday at 10:00"),
            ("0 10 * * SUN", "every Sunday at 10:00"),
            ("0 8 * * 1,3,5", "at 08:00 on Monday, Wednesday and Friday"),
            // Minutes and hours.
            ("* * * * *", "every minute"),
            ("*/5 * * * *", "every 5 minutes"),
            ("*/1 * * * *", "every minute"),
            ("0 * * * *", "every hour"),
            ("15 * * * *", "every hour at minute 15"),
            ("0 */2 * * *", "every 2 hours"),
            ("30 */6 * * *", "every 6 hours at minute 30"),
            ("0 9-17 * * *", "every hour from 09:00 to 17:00"),
            (
                "*/15 9-17 * * 1-5",
                "every 15 minutes from 09:00 to 17:45 on weekdays",
            ),
            ("* 9 * * *", "every minute from 09:00 to 09:59"),
            ("*/10 * * * 1", "every 10 minutes on Mondays"),
            // Several fixed times.
            ("0 9,17 * * *", "every day at 09:00 and 17:00"),
            ("0,30 9 * * 1-5", "every weekday at 09:00 and 09:30"),
            // Days of the month, months.
            ("0 9 1 * *", "at 09:00 on the 1st of every month"),
            (
                "0 9 1,15 * *",
                "at 09:00 on the 1st and 15th of every month",
            ),
            ("0 0 25 12 *", "at 00:00 on the 25th of December"),
            (
                "0 0 22 JAN,JUL *",
                "at 00:00 on the 22nd of January and July",
            ),
            (
                "0 12 11-13 * *",
                "at 12:00 on the 11th, 12th and 13th of every month",
            ),
            ("0 12 * 1,7 *", "every day at 12:00 in January and July"),
            ("0 0 L * *", "at 00:00 on the last day of every month"),
            (
                "0 18 L 2,8 *",
                "at 18:00 on the last day of February and August",
            ),
            // Seconds.
            ("* * * * * *", "every second"),
            ("*/10 * * * * *", "every 10 seconds"),
            ("15 */5 * * * *", "every 5 minutes at second 15"),
            ("30 0 9 * * *", "every day at 09:00:30"),
            ("0 0 9 * * 1-5", "every weekday at 09:00"),
        ];
        for (expr, want) in table {
            assert_eq!(describe(expr, "UTC"), format!("{want} (UTC)"), "{expr}");
        }
    }

    #[test]
    fn unusual_shapes_fall_back_to_the_expression() {
        for expr in [
            "0 9 * * 1#1",                // first Monday
            "0 9 1 * 1",                  // the 1st OR a Monday
            "*/7 * * * *",                // :56 then :00, not "every 7 minutes"
            "0 */5 * * *",                // 20:00 then 00:00
            "0 9,12,15,18,21,23,1 * * *", // too many times to list
            "0 9 */2 * *",                // stepped days
        ] {
            let want = format!("cron {expr:?} (Europe/Berlin)");
            assert_eq!(describe(expr, "Europe/Berlin"), want);
        }
        // The user's text is kept, extra spaces aside.
        assert_eq!(
            describe(" 0  0 L * mon ", "UTC"),
            "cron \"0 0 L * mon\" (UTC)"
        );
    }

    #[test]
    fn ordinals() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31]
            .into_iter()
            .map(super::ordinal)
            .collect();
        let want = [
            "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st",
        ];
        assert_eq!(got, want);
    }
}
