//! What a cron expression says, in a form both languages put into words: the time of day, the
//! days and the months. Only shapes that read naturally are recognised; anything else (W, #,
//! day-of-month *and* day-of-week, steps that do not divide the hour or day evenly, ...) is
//! `None`, and the sentence falls back to the expression itself, which is always true. A
//! wrong sentence would be worse than none.

/// A time of day.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    pub h: u32,
    pub m: u32,
    pub s: u32,
}

/// The time-of-day part.
#[derive(Debug, PartialEq)]
pub enum Time {
    /// A handful of fixed times, in order.
    At(Vec<Clock>),
    /// Once an hour, at the same minute, from one hour to another.
    HourSpan { from: Clock, to: Clock },
    /// Every `every` hours (1: every hour) at minute `minute`, second `second`.
    Hours {
        every: u32,
        minute: u32,
        second: u32,
    },
    /// Every `every` minutes (1: every minute), all day at second `second`, or over a span of
    /// hours (second 0 then).
    Minutes {
        every: u32,
        second: u32,
        span: Option<(Clock, Clock)>,
    },
    /// Every `n` seconds (1: every second).
    Seconds(u32),
}

/// The days part.
#[derive(Debug, PartialEq)]
pub enum Days {
    Every,
    /// Days of the week, 0 = Sunday, listed Monday first, as people do.
    Week(Vec<u32>),
    /// Days of the month.
    Month(Vec<u32>),
    /// `L`: the last day of the month.
    LastOfMonth,
}

#[derive(Debug, PartialEq)]
pub struct Shape {
    pub time: Time,
    pub days: Days,
    /// Months 1-12; `None` for every month.
    pub months: Option<Vec<u32>>,
}

impl Days {
    /// Monday to Friday.
    pub fn is_workweek(&self) -> bool {
        matches!(self, Days::Week(d) if d.as_slice() == [1, 2, 3, 4, 5])
    }
}

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

/// Reads `normalized` (croner's upper-cased form with names replaced by numbers, 5 or 6
/// fields).
pub fn shape(normalized: &str) -> Option<Shape> {
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
        Field::Values(v) => Some(v),
        Field::Every(_) => return None,
    };
    let dow = day_field(dow, 0, 7)?;
    let days = match (dom, dow) {
        ("L", Field::Any) => Days::LastOfMonth,
        (dom, dow) => days(day_field(dom, 1, 31)?, dow)?,
    };
    Some(Shape { time, days, months })
}

/// The days two day fields (read by [`day_field`]) let through. croner ORs them when both are
/// restricted, so either one covering every day makes every day.
fn days(dom: Field, dow: Field) -> Option<Days> {
    let week = |days: &[u32]| {
        // 7 is Sunday too.
        let mut days: Vec<u32> = days.iter().map(|d| d % 7).collect();
        days.sort_by_key(|d| (d + 6) % 7);
        days.dedup();
        days
    };
    let whole_month = |d: &[u32]| d.len() == 31;
    Some(match (dom, dow) {
        (Field::Any, Field::Any) => Days::Every,
        (Field::Any, Field::Values(d)) => match week(&d) {
            d if d.len() == 7 => Days::Every,
            d => Days::Week(d),
        },
        (Field::Values(d), Field::Any) if whole_month(&d) => Days::Every,
        (Field::Values(d), Field::Any) => Days::Month(d),
        (Field::Values(m), Field::Values(w)) if whole_month(&m) || week(&w).len() == 7 => {
            Days::Every
        }
        // Both day fields restricted otherwise (ORed), or a stepped day field: too subtle.
        _ => return None,
    })
}

/// A day field as croner reads it: only a literal `*` (or `?`, which croner makes `*`) leaves
/// the day to the other field; anything else restricts it, `*/1` too (all of `lo..=hi`), and
/// two restricted day fields are ORed. (Vixie cron took any field starting with `*` as `*`.)
fn day_field(text: &str, lo: u32, hi: u32) -> Option<Field> {
    if text == "*" || text == "?" {
        return Some(Field::Any);
    }
    match field(text)? {
        Field::Any => Some(Field::Values((lo..=hi).collect())),
        f => Some(f),
    }
}

/// The time of day, from the second, minute and hour fields.
fn time(sec: Field, min: Field, hour: Field) -> Option<Time> {
    use Field::*;
    let sec_one = match &sec {
        Values(v) if v.len() == 1 => Some(first(v)),
        _ => None,
    };
    let clock = |h, m, s| Clock { h, m, s };
    Some(match (sec_one, min, hour) {
        // A handful of fixed times.
        (Some(s), Values(m), Values(h)) if m.len() * h.len() <= 6 => Time::At(
            h.iter()
                .flat_map(|h| m.iter().map(move |m| clock(*h, *m, s)))
                .collect(),
        ),
        // Once an hour over a span of hours.
        (Some(s), Values(m), Values(h)) if m.len() == 1 && contiguous(&h) => Time::HourSpan {
            from: clock(first(&h), first(&m), s),
            to: clock(last(&h), first(&m), s),
        },
        // Once an hour, or every n hours.
        (Some(s), Values(m), hour @ (Any | Every(_))) if m.len() == 1 => Time::Hours {
            every: match hour {
                Every(n) if 24 % n == 0 => n,
                Every(_) => return None,
                _ => 1,
            },
            minute: first(&m),
            second: s,
        },
        // Every n minutes, all day or over a span of hours.
        (Some(s), min @ (Any | Every(_)), hour) => {
            let n = match min {
                Every(n) if 60 % n == 0 => n,
                Every(_) => return None,
                _ => 1,
            };
            match hour {
                Any => Time::Minutes {
                    every: n,
                    second: s,
                    span: None,
                },
                Values(h) if s == 0 && (h.len() == 1 || contiguous(&h)) => Time::Minutes {
                    every: n,
                    second: 0,
                    span: Some((clock(first(&h), 0, 0), clock(last(&h), 60 - n, 0))),
                },
                _ => return None,
            }
        }
        // Every n seconds.
        (None, Any, Any) => match sec {
            Any => Time::Seconds(1),
            Every(n) if 60 % n == 0 => Time::Seconds(n),
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

/// The first of a field's values (the callers' guards know there is one; 0 otherwise).
fn first(v: &[u32]) -> u32 {
    v.first().copied().unwrap_or(0)
}

/// The last of a field's values (as [`first`]).
fn last(v: &[u32]) -> u32 {
    v.last().copied().unwrap_or(0)
}

fn contiguous(v: &[u32]) -> bool {
    v.len() >= 2 && v.windows(2).all(|w| matches!(w, [a, b] if *b == a + 1))
}
