//! Instants as responses and events show them: RFC 3339 in UTC. Here, below `schedule`, so the
//! model's own JSON (timeline events) can print its instants; `schedule` re-exports it.

use chrono::{DateTime, Datelike, NaiveDateTime, SecondsFormat, Timelike};

use super::duration::push_digits;

/// Formats an instant for responses: RFC 3339 in UTC (`Z`), with milliseconds only when non-zero.
pub fn format_utc(ms: u64) -> String {
    let Some(t) = i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
    else {
        return ms.to_string();
    };
    if t.year() > 9999 {
        return t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    }
    // The digits directly (every create's 201 body has two or three instants); the same bytes
    // as chrono's `to_rfc3339_opts(AutoSi, true)` (a test compares them).
    let mut s = String::with_capacity(24);
    push_date_time(&mut s, &t.naive_utc(), 'T');
    s.push(':');
    push_digits(&mut s, t.second().into(), 2);
    if !ms.is_multiple_of(1000) {
        s.push('.');
        push_digits(&mut s, ms % 1000, 3);
    }
    s.push('Z');
    s
}

/// `2026-12-01{sep}09:00`: a date and the hour and minute of a wall time (year 0–9999).
pub(crate) fn push_date_time(s: &mut String, t: &NaiveDateTime, sep: char) {
    push_digits(s, t.year().max(0) as u64, 4);
    s.push('-');
    push_digits(s, t.month().into(), 2);
    s.push('-');
    push_digits(s, t.day().into(), 2);
    s.push(sep);
    push_digits(s, t.hour().into(), 2);
    s.push(':');
    push_digits(s, t.minute().into(), 2);
}
