//! Plain text tables and times for people: local wall time and "in 5m" / "3h ago".

use chrono::{DateTime, Local, Utc};

/// A table with a header row; columns are as wide as their widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width = vec![0usize; n];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(columns(c));
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (c, w)) in r.iter().zip(&width).enumerate() {
                line.push_str(c);
                if i + 1 != n {
                    let pad = w.saturating_sub(columns(c)) + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Terminal columns `s` takes: East Asian wide characters (Chinese descriptions, full-width
/// parentheses) and emoji take two, combining and zero-width characters none, so a column of
/// them lines up (Unicode's East Asian Width and emoji presentation, as terminals draw them).
fn columns(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// An RFC 3339 instant from the API.
pub fn parse(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// "in 5m", "in 2h10m", "3d ago", "now": coarse, two units at most.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (t - now).num_seconds();
    let a = secs.unsigned_abs();
    if a < 1 {
        return "now".into();
    }
    let (d, h, m, s) = (a / 86_400, a % 86_400 / 3_600, a % 3_600 / 60, a % 60);
    let text = if d > 0 {
        if h > 0 {
            format!("{d}d{h}h")
        } else {
            format!("{d}d")
        }
    } else if h > 0 {
        if m > 0 {
            format!("{h}h{m}m")
        } else {
            format!("{h}h")
        }
    } else if m > 0 {
        if s > 0 && m < 10 {
            format!("{m}m{s}s")
        } else {
            format!("{m}m")
        }
    } else {
        format!("{s}s")
    };
    if secs > 0 {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// The viewer's local wall time with its zone: `2026-12-01 09:00:00 +08:00`, or `... UTC`.
/// The label matters: without it a time in a table reads as the task's zone or as UTC.
pub fn local(t: DateTime<Utc>) -> String {
    let l = t.with_timezone(&Local);
    let label = if l.offset().local_minus_utc() == 0 {
        "UTC".to_string()
    } else {
        l.format("%:z").to_string()
    };
    format!("{} {label}", l.format("%Y-%m-%d %H:%M:%S"))
}

/// The wall time in an IANA zone with its abbreviation: `2026-12-01 09:00:00 CST`; `None`
/// for a zone chrono-tz does not know (the server accepted it, so that is a newer zone).
pub fn in_zone(t: DateTime<Utc>, tz: &str) -> Option<String> {
    let zone: chrono_tz::Tz = tz.parse().ok()?;
    Some(
        t.with_timezone(&zone)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
    )
}

/// "2026-12-01 09:00:00 (in 5m)", or "-" when there is no instant.
pub fn when(v: &serde_json::Value, now: DateTime<Utc>) -> String {
    match v.as_str().and_then(parse) {
        Some(t) => format!("{} ({})", local(t), relative(t, now)),
        None => "-".into(),
    }
}

/// "57/200" with failures and in-flight noted: "57/200 (1 failed)".
pub fn progress(p: &serde_json::Value) -> String {
    if p.is_null() {
        return "-".into();
    }
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    let mut s = format!("{}/{}", n("sent") + n("failed"), n("total"));
    if n("failed") > 0 {
        s.push_str(&format!(" ({} failed)", n("failed")));
    }
    s
}

/// A text progress bar: `[#######-------------]`.
pub fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((done.min(total) as u128 * width as u128) / total as u128) as usize
    };
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

/// A cell from a JSON value: strings bare, null as "-".
pub fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        // Text from the server can carry what a receiver answered: control characters are
        // shown escaped, never sent to the terminal (an escape sequence could repaint it or
        // set its clipboard).
        serde_json::Value::String(s) => crate::logsafe::Escaped(s).to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_in_a_cell_are_shown_escaped() {
        let c = cell(&serde_json::json!("a\u{1b}[2Jb\u{7}"));
        assert!(!c.chars().any(char::is_control), "{c:?}");
        assert_eq!(c, "a\\u{1b}[2Jb\\u{7}");
    }

    #[test]
    fn chinese_cells_line_up_by_terminal_columns() {
        assert_eq!(columns("每天 09:00（UTC）"), 2 * 2 + 1 + 5 + 2 + 3 + 2);
        let mut t = Table::new(&["DESCRIPTION", "ID"]);
        t.row(vec!["每天 09:00（UTC）".into(), "a".into()]);
        t.row(vec!["every day at 09:00 (UTC)".into(), "b".into()]);
        let out = t.render();
        let at: Vec<usize> = out
            .lines()
            .map(|l| {
                let i = l.rfind(' ').unwrap() + 1;
                columns(&l[..i])
            })
            .collect();
        assert_eq!(at, [26, 26, 26], "{out}");
    }

    /// Emoji take two columns, a combining accent and a zero-width space none: a column of
    /// them lines up with plain text (before, each counted one column per `char`).
    #[test]
    fn emoji_combining_and_zero_width_characters_line_up() {
        assert_eq!(columns("📨 sent"), 2 + 1 + 4);
        assert_eq!(columns("cafe\u{301}"), 4);
        assert_eq!(columns("a\u{200b}b"), 2);
        let mut t = Table::new(&["NAME", "ID"]);
        t.row(vec!["📨📨 mail".into(), "a".into()]);
        t.row(vec!["cafe\u{301}\u{200b}".into(), "b".into()]);
        t.row(vec!["plain text".into(), "c".into()]);
        let out = t.render();
        let at: Vec<usize> = out
            .lines()
            .map(|l| {
                let i = l.rfind(' ').unwrap() + 1;
                columns(&l[..i])
            })
            .collect();
        assert_eq!(at, [12, 12, 12, 12], "{out}");
    }

    /// Bidi overrides and isolates in a cell are shown escaped: they would reorder what the
    /// terminal shows after them ("Trojan Source"), and a table of them would not line up.
    #[test]
    fn bidi_controls_in_a_cell_are_shown_escaped() {
        let c = cell(&serde_json::json!(
            "invoice\u{202e}fdp.exe\u{2066}x\u{2069}"
        ));
        assert_eq!(c, "invoice\\u{202e}fdp.exe\\u{2066}x\\u{2069}");
    }

    #[test]
    fn relative_times_read_naturally() {
        let now = parse("2026-12-01T00:00:00Z").unwrap();
        let at = |s: &str| relative(parse(s).unwrap(), now);
        assert_eq!(at("2026-12-01T00:05:00Z"), "in 5m");
        assert_eq!(at("2026-12-01T00:02:30Z"), "in 2m30s");
        assert_eq!(at("2026-12-01T02:10:00Z"), "in 2h10m");
        assert_eq!(at("2026-12-04T00:00:00Z"), "in 3d");
        assert_eq!(at("2026-11-30T23:59:15Z"), "45s ago");
        assert_eq!(at("2026-12-01T00:00:00Z"), "now");
    }

    #[test]
    fn times_carry_their_zone() {
        let t = parse("2026-12-01T01:00:00Z").unwrap();
        assert_eq!(
            in_zone(t, "Asia/Shanghai").as_deref(),
            Some("2026-12-01 09:00:00 CST")
        );
        assert_eq!(
            in_zone(t, "America/New_York").as_deref(),
            Some("2026-11-30 20:00:00 EST")
        );
        assert_eq!(in_zone(t, "Not/AZone"), None);
        // The viewer's zone is the machine's; whatever it is, the time says which it is.
        let l = local(t);
        assert!(
            l.ends_with(" UTC") || l.contains('+') || l.contains(" -"),
            "{l}"
        );
    }

    #[test]
    fn bars_fill_in_proportion() {
        assert_eq!(bar(0, 10, 10), "[----------]");
        assert_eq!(bar(5, 10, 10), "[#####-----]");
        assert_eq!(bar(10, 10, 4), "[####]");
        assert_eq!(bar(3, 0, 4), "[----]");
    }

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["ID", "STATE"]);
        t.row(vec!["a-long-id".into(), "running".into()]);
        t.row(vec!["b".into(), "pending".into()]);
        assert_eq!(
            t.render(),
            "ID         STATE\na-long-id  running\nb          pending\n"
        );
    }
}
