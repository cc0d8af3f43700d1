//! Cron expressions as sentences: "every weekday at 09:00 (Asia/Shanghai)".
//!
//! Only shapes that read naturally are put into words; anything else (L, W, #, day-of-month *and*
//! day-of-week, steps that do not divide the hour or day evenly, ...) is shown as
//! `cron "<expr>" (<zone>)`, which is always true. A wrong sentence would be worse than none.

use chrono_tz::Tz;

/// One field, in the few forms the sentences cover.
#[derive(Debug, PartialEq)]
enum Field {
    /// `*` or `?`.
    Any,
    /// `*/n`, n > 1.
    Every(u32),
    /// Numbers and ranges (possibly stepped): the values, sorted, no duplicates.
    Values(Vec<u32>),
}

/// The time-of-day part of a sentence.
enum Time {
    /// Fixed times, to be said "at 09:00 and 17:00".
    At(Vec<String>),
    /// A repetition, e.g. "every 15 minutes".
    Every(String),
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
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

/// Describes `normalized` (croner's upper-cased form with names replaced by numbers, 5 or 6
/// fields); `expr` is the user's text for the fallback.
pub(super) fn describe_cron(normalized: &str, expr: &str, tz: Tz) -> String {
    match sentence(normalized) {
        Some(s) => format!("{s} ({})", tz.name()),
        None => format!("cron {expr:?} ({})", tz.name()),
    }
}

fn sentence(normalized: &str) -> Option<String> {
    let mut f: Vec<&str> = normalized.split_whitespace().collect();
    if f.len() == 5 {
        f.insert(0, "0");
    }
    let [sec, min, hour, dom, mon, dow] = f[..] else {
        return None;
    };
    let time = time(field(sec)?, field(min)?, field(hour)?)?;
    let months = match field(mon)? {
        Field::Any => None,
        Field::Values(v) => Some(join(v.iter().map(|m| MONTHS[*m as usize - 1].to_string()))),
        Field::Every(_) => return None,
    };
    let in_months = months
        .as_ref()
        .map(|m| format!(" in {m}"))
        .unwrap_or_default();
    let (dom, dow) = (field(dom)?, field(dow)?);
    Some(match (dom, dow, time) {
        (Field::Any, Field::Any, Time::At(t)) => format!("every day at {}{in_months}", join(t)),
        (Field::Any, Field::Any, Time::Every(e)) => format!("{e}{in_months}"),
        (Field::Any, Field::Values(days), time) => {
            // 7 is Sunday too; list Monday first, as people do.
            let mut days: Vec<u32> = days.iter().map(|d| d % 7).collect();
            days.sort_by_key(|d| (d + 6) % 7);
            days.dedup();
            let names = join(days.iter().map(|d| WEEKDAYS[*d as usize].to_string()));
            match (days.as_slice(), time) {
                ([1, 2, 3, 4, 5], Time::At(t)) => {
                    format!("every weekday at {}{in_months}", join(t))
                }
                ([1, 2, 3, 4, 5], Time::Every(e)) => format!("{e} on weekdays{in_months}"),
                ([_], Time::At(t)) => format!("every {names} at {}{in_months}", join(t)),
                ([_], Time::Every(e)) => format!("{e} on {names}s{in_months}"),
                (_, Time::At(t)) => format!("at {} on {names}{in_months}", join(t)),
                (_, Time::Every(e)) => format!("{e} on {names}{in_months}"),
            }
        }
        (Field::Values(days), Field::Any, time) => {
            let days = join(days.iter().map(|d| ordinal(*d)));
            let of = months.unwrap_or_else(|| "every month".into());
            match time {
                Time::At(t) => format!("at {} on the {days} of {of}", join(t)),
                Time::Every(e) => format!("{e} on the {days} of {of}"),
            }
        }
        // Both day fields restricted (cron ORs them), or a stepped day field: too subtle.
        _ => return None,
    })
}

/// The time of day, from the second, minute and hour fields.
fn time(sec: Field, min: Field, hour: Field) -> Option<Time> {
    use Field::*;
    let sec_one = match &sec {
        Values(v) if v.len() == 1 => Some(v[0]),
        _ => None,
    };
    let at_second = match sec_one {
        Some(0) => String::new(),
        Some(s) => format!(" at second {s}"),
        None => String::new(),
    };
    Some(match (sec_one, min, hour) {
        // A handful of fixed times.
        (Some(s), Values(m), Values(h)) if m.len() * h.len() <= 6 => Time::At(
            h.iter()
                .flat_map(|h| m.iter().map(move |m| clock(*h, *m, s)))
                .collect(),
        ),
        // Once an hour over a span of hours.
        (Some(s), Values(m), Values(h)) if m.len() == 1 && contiguous(&h) => Time::Every(format!(
            "every hour from {} to {}",
            clock(h[0], m[0], s),
            clock(h[h.len() - 1], m[0], s)
        )),
        // Once an hour, or every n hours.
        (Some(s), Values(m), hour @ (Any | Every(_))) if m.len() == 1 => {
            let every = match hour {
                Every(n) if 24 % n == 0 => format!("every {n} hours"),
                Every(_) => return None,
                _ => "every hour".to_string(),
            };
            match (m[0], s) {
                (0, 0) => Time::Every(every),
                (m, 0) => Time::Every(format!("{every} at minute {m}")),
                (m, s) => Time::Every(format!("{every} at minute {m}, second {s}")),
            }
        }
        // Every n minutes, all day or over a span of hours.
        (Some(s), min @ (Any | Every(_)), hour) => {
            let n = match min {
                Every(n) if 60 % n == 0 => n,
                Every(_) => return None,
                _ => 1,
            };
            let every = if n == 1 {
                "every minute".to_string()
            } else {
                format!("every {n} minutes")
            };
            match hour {
                Any => Time::Every(format!("{every}{at_second}")),
                Values(h) if s == 0 && (h.len() == 1 || contiguous(&h)) => Time::Every(format!(
                    "{every} from {} to {}",
                    clock(h[0], 0, 0),
                    clock(h[h.len() - 1], 60 - n, 0)
                )),
                _ => return None,
            }
        }
        // Every n seconds.
        (None, Any, Any) => match sec {
            Any => Time::Every("every second".into()),
            Every(n) if 60 % n == 0 => Time::Every(format!("every {n} seconds")),
            _ => return None,
        },
        _ => return None,
    })
}

/// Reads one normalized field; `None` for forms the sentences do not cover (L, W, #, +, names
/// left over, steps from a single number).
fn field(text: &str) -> Option<Field> {
    if text == "*" || text == "?" {
        return Some(Field::Any);
    }
    if let Some(n) = text.strip_prefix("*/") {
        let n: u32 = n.parse().ok()?;
        return Some(if n == 1 { Field::Any } else { Field::Every(n) });
    }
    let mut values = Vec::new();
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)?),
            None => (item, 1),
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = range.parse::<u32>().ok()?;
                (a, a)
            }
        };
        values.extend((a..=b).step_by(step as usize));
    }
    values.sort_unstable();
    values.dedup();
    Some(Field::Values(values))
}

fn contiguous(v: &[u32]) -> bool {
    v.len() >= 2 && v.windows(2).all(|w| w[1] == w[0] + 1)
}

fn clock(h: u32, m: u32, s: u32) -> String {
    if s == 0 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
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
    use super::super::cron::CronSchedule;
    use crate::model::DstPolicy;

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
            "0 0 L * *",                  // last day of the month
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
