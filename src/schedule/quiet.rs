//! Quiet hours (API.md "People's time"): a daily window, in a zone, inside which no send
//! starts. Pure: the engine asks [`held_until`] before a send and, inside the window, holds the
//! send (back on the wheel, still armed, a `held` timeline event) until the window ends; the
//! channel's rate limit and the run's pacing then apply from that instant as they would have,
//! so the morning is not a burst.

pub use crate::model::QuietHours;
use crate::model::{DstGap, DstPolicy, DstRepeat};
use chrono::{DateTime, Duration, NaiveTime, Timelike};
use chrono_tz::Tz;

use super::local::resolve_local;

/// Reads "HH:MM" (00:00–23:59) as minutes of the day.
pub fn parse_hhmm(s: &str) -> Result<u16, String> {
    let t = NaiveTime::parse_from_str(s, "%H:%M")
        .map_err(|_| format!("invalid time {s:?}: expected HH:MM like \"22:00\""))?;
    Ok((t.hour() * 60 + t.minute()) as u16)
}

impl QuietHours {
    /// The zone the window is read in for a message whose own zone is `message_tz`.
    pub fn zone_for(&self, message_tz: Option<&str>) -> Option<Tz> {
        let name = if super::recipient::is_recipient(Some(&self.tz)) {
            message_tz?
        } else {
            &self.tz
        };
        name.parse().ok()
    }
}

/// When a send due at `at_ms` may start: `None` if `at_ms` is outside the window in `zone`,
/// else the instant the window ends (the first local `to` after `at_ms`; a `to` in a DST gap
/// is the gap's end, a repeated one its first instant after `at_ms`: a send on the repeated
/// hour of a fall-back, inside the window by the wall clock, waits for the second `to`).
pub fn held_until(q: &QuietHours, zone: Tz, at_ms: u64) -> Option<u64> {
    let local = DateTime::from_timestamp_millis(i64::try_from(at_ms).ok()?)?
        .with_timezone(&zone)
        .naive_local();
    let minute = (local.hour() * 60 + local.minute()) as u16;
    if !q.inside(minute) {
        return None;
    }
    let to = NaiveTime::from_hms_opt(u32::from(q.to_min / 60), u32::from(q.to_min % 60), 0)?;
    let mut day = local.date();
    if local.time() >= to {
        day += Duration::days(1);
    }
    let policy = DstPolicy {
        gap: DstGap::Shift,
        repeat: DstRepeat::Both,
    };
    resolve_local(day.and_time(to), zone, policy)
        .into_iter()
        .find(|end| *end > at_ms)
}

/// The window that applies to a send: the task's own, none, or its channel's.
pub fn window<'a>(
    task: &'a crate::model::QuietSetting,
    channel: Option<&'a QuietHours>,
) -> Option<&'a QuietHours> {
    match task {
        crate::model::QuietSetting::Own(q) => Some(q),
        crate::model::QuietSetting::Off => None,
        crate::model::QuietSetting::Channel => channel,
    }
}

/// Until when a send of a message (its zone `message_tz`, if any) due at `at_ms` waits for
/// quiet hours: `None` when it may go. A `recipient` window for a message without a zone is
/// read in `fallback` (the schedule's zone, else UTC).
pub fn hold(
    task: &crate::model::QuietSetting,
    channel: Option<&QuietHours>,
    message_tz: Option<&str>,
    fallback: Tz,
    at_ms: u64,
) -> Option<u64> {
    let q = window(task, channel)?;
    let zone = q.zone_for(message_tz).unwrap_or(fallback);
    held_until(q, zone, at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::parse_instant;

    fn utc(s: &str) -> u64 {
        parse_instant(s, None, DstPolicy::default()).unwrap()[0]
    }

    fn night(tz: &str) -> QuietHours {
        QuietHours {
            from_min: parse_hhmm("22:00").unwrap(),
            to_min: parse_hhmm("08:00").unwrap(),
            tz: tz.into(),
        }
    }

    #[test]
    fn a_window_over_midnight_holds_until_the_morning_in_its_zone() {
        let q = night("Asia/Shanghai");
        let z: Tz = "Asia/Shanghai".parse().unwrap();
        // 21:59:59 Shanghai (13:59:59 UTC): outside.
        assert_eq!(held_until(&q, z, utc("2026-12-01T13:59:59Z")), None);
        // 22:00 Shanghai: held until 08:00 the next day (00:00 UTC).
        assert_eq!(
            held_until(&q, z, utc("2026-12-01T14:00:00Z")),
            Some(utc("2026-12-02T00:00:00Z"))
        );
        // 03:00 Shanghai: held until 08:00 the same day.
        assert_eq!(
            held_until(&q, z, utc("2026-12-01T19:00:00Z")),
            Some(utc("2026-12-02T00:00:00Z"))
        );
        // 08:00 itself is outside (the window is [from, to)).
        assert_eq!(held_until(&q, z, utc("2026-12-02T00:00:00Z")), None);
    }

    #[test]
    fn the_window_follows_dst_and_a_daytime_window_works_too() {
        // Berlin falls back on 25 Oct 2026: the night is 25 hours; 08:00 is 07:00 UTC after it.
        let q = night("Europe/Berlin");
        let z: Tz = "Europe/Berlin".parse().unwrap();
        assert_eq!(
            held_until(&q, z, utc("2026-10-24T21:00:00Z")),
            Some(utc("2026-10-25T07:00:00Z"))
        );
        let lunch = QuietHours {
            from_min: parse_hhmm("12:00").unwrap(),
            to_min: parse_hhmm("13:30").unwrap(),
            tz: "UTC".into(),
        };
        assert_eq!(
            held_until(&lunch, chrono_tz::UTC, utc("2026-12-01T12:10:00Z")),
            Some(utc("2026-12-01T13:30:00Z"))
        );
        assert_eq!(
            held_until(&lunch, chrono_tz::UTC, utc("2026-12-01T13:30:00Z")),
            None
        );
    }

    #[test]
    fn a_tasks_window_wins_over_its_channels_and_off_means_none() {
        use crate::model::QuietSetting;
        let ch = night("Asia/Shanghai");
        let own = QuietSetting::Own(night("Europe/Berlin"));
        let at = utc("2026-12-01T14:30:00Z"); // 22:30 Shanghai, 15:30 Berlin
        let utc_zone = chrono_tz::UTC;
        assert_eq!(
            hold(&QuietSetting::Channel, Some(&ch), None, utc_zone, at),
            Some(utc("2026-12-02T00:00:00Z"))
        );
        assert_eq!(hold(&own, Some(&ch), None, utc_zone, at), None);
        assert_eq!(
            hold(&QuietSetting::Off, Some(&ch), None, utc_zone, at),
            None
        );
        assert_eq!(hold(&QuietSetting::Channel, None, None, utc_zone, at), None);
        // A recipient window reads the message's zone, or the fallback without one.
        let rec = QuietSetting::Own(night("recipient"));
        assert_eq!(
            hold(&rec, None, Some("Asia/Shanghai"), utc_zone, at),
            Some(utc("2026-12-02T00:00:00Z"))
        );
        assert_eq!(
            hold(&rec, None, None, utc_zone, at),
            None,
            "14:30 UTC is daytime"
        );
    }

    #[test]
    fn times_are_checked_and_recipient_windows_use_the_message_zone() {
        assert!(parse_hhmm("24:00").is_err());
        assert!(parse_hhmm("7:5x").is_err());
        assert_eq!(parse_hhmm("07:05"), Ok(425));
        let q = night("recipient");
        assert_eq!(
            q.zone_for(Some("Europe/Berlin")),
            "Europe/Berlin".parse().ok()
        );
        assert_eq!(q.zone_for(None), None);
        assert_eq!(
            night("Asia/Shanghai").zone_for(Some("Europe/Berlin")),
            "Asia/Shanghai".parse().ok()
        );
    }

    #[test]
    fn a_send_on_the_repeated_hour_of_a_fall_back_waits_for_the_second_end() {
        // New York falls back on 1 Nov 2026: 01:00–02:00 EDT, then 01:00–02:00 EST again.
        let q = QuietHours {
            from_min: parse_hhmm("22:00").unwrap(),
            to_min: parse_hhmm("01:30").unwrap(),
            tz: "America/New_York".into(),
        };
        let z: Tz = "America/New_York".parse().unwrap();
        // 01:15 EDT, the first pass: until 01:30 EDT.
        assert_eq!(
            held_until(&q, z, utc("2026-11-01T05:15:00Z")),
            Some(utc("2026-11-01T05:30:00Z"))
        );
        // 01:45 EDT is outside; 01:15 EST, the second pass, is inside again: until 01:30 EST.
        assert_eq!(held_until(&q, z, utc("2026-11-01T05:45:00Z")), None);
        assert_eq!(
            held_until(&q, z, utc("2026-11-01T06:15:00Z")),
            Some(utc("2026-11-01T06:30:00Z"))
        );
        assert_eq!(held_until(&q, z, utc("2026-11-01T06:30:00Z")), None);
    }
}
