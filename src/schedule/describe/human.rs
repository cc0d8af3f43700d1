//! Where an instant falls for a person: its local date and time in a zone, and which day that
//! is from where they are now (today, tomorrow, a weekday within the week, a date). Both
//! languages word the same [`Day`].

use chrono::{Datelike, NaiveDate, TimeZone, Timelike};
use chrono_tz::Tz;

use super::shape::Clock;

/// An instant as a wall time in a zone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Local {
    pub date: NaiveDate,
    pub clock: Clock,
}

/// Which day a local date is, seen from another (now's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Day {
    Yesterday,
    Today,
    Tomorrow,
    /// Two days on (Chinese has a word for it, 后天; English says the weekday).
    InTwoDays,
    /// Three to six days on, in the same Monday-to-Sunday week.
    ThisWeek,
    /// Three to six days on, in the next week.
    NextWeek,
    /// Anything else: said as a date.
    Other,
}

/// `ms` as a wall time in `tz`; `None` past chrono's range (not a date a person would read).
pub fn local(ms: u64, tz: Tz) -> Option<Local> {
    let t = tz
        .timestamp_millis_opt(i64::try_from(ms).ok()?)
        .single()?
        .naive_local();
    Some(Local {
        date: t.date(),
        clock: Clock {
            h: t.hour(),
            m: t.minute(),
            s: t.second(),
        },
    })
}

/// The day `at` is, seen from `now` (both local dates in the same zone).
pub fn day(at: NaiveDate, now: NaiveDate) -> Day {
    match (at - now).num_days() {
        -1 => Day::Yesterday,
        0 => Day::Today,
        1 => Day::Tomorrow,
        2 => Day::InTwoDays,
        3..=6 if at.iso_week() == now.iso_week() => Day::ThisWeek,
        3..=6 => Day::NextWeek,
        _ => Day::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(y: i32, m: u32, day: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, day).unwrap()
    }

    #[test]
    fn days_from_a_tuesday() {
        let now = d(2026, 12, 1); // a Tuesday
        let cases = [
            (d(2026, 11, 30), Day::Yesterday),
            (d(2026, 11, 29), Day::Other),
            (d(2026, 12, 1), Day::Today),
            (d(2026, 12, 2), Day::Tomorrow),
            (d(2026, 12, 3), Day::InTwoDays),
            (d(2026, 12, 4), Day::ThisWeek),
            (d(2026, 12, 6), Day::ThisWeek), // Sunday ends the week
            (d(2026, 12, 7), Day::NextWeek),
            (d(2026, 12, 8), Day::Other),
        ];
        for (at, want) in cases {
            assert_eq!(day(at, now), want, "{at}");
        }
    }
}
