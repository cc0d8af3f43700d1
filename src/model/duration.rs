//! Durations as people write them: `"250ms"`, `"3s"`, `"15m"`, `"2h"`, `"1h30m"`, `"7d"`.
//!
//! The grammar is strict on purpose: one or more `<digits><unit>` parts, units in descending
//! order without repeats, no spaces, no signs, no fractions. A typo is an error, never a guess.

/// Parses a duration into milliseconds. The error says what was wrong, without the field name
/// (the caller knows the field).
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    const UNITS: [(&str, u64); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    if s.is_empty() {
        return Err("empty duration; expected e.g. \"250ms\", \"3s\", \"1h30m\"".into());
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total: u64 = 0;
    // Index into UNITS of the last unit seen; the next must come strictly later.
    let mut last_unit: Option<usize> = None;
    while i < bytes.len() {
        let start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return Err(format!(
                "invalid duration {s:?}: expected a number at position {start}"
            ));
        }
        let digits = s.get(start..i).unwrap_or_default();
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: number {digits} is too large"))?;
        let ustart = i;
        while bytes.get(i).is_some_and(u8::is_ascii_alphabetic) {
            i += 1;
        }
        let unit = s.get(ustart..i).unwrap_or_default();
        if unit.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: expected a unit (ms, s, m, h, d) right after {digits}"
            ));
        }
        let Some((idx, &(_, size))) = UNITS.iter().enumerate().find(|(_, (u, _))| *u == unit)
        else {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m, h, d)"
            ));
        };
        if let Some(prev) = last_unit {
            if idx <= prev {
                return Err(format!(
                    "invalid duration {s:?}: units must go from largest to smallest without repeats"
                ));
            }
        }
        last_unit = Some(idx);
        let part = n
            .checked_mul(size)
            .ok_or_else(|| format!("invalid duration {s:?}: too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("invalid duration {s:?}: too large"))?;
    }
    Ok(total)
}

/// Formats milliseconds in the same grammar, largest units first (`5400000` → `"1h30m"`).
pub fn format_duration_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut rest = ms;
    let mut out = String::with_capacity(12);
    for (unit, size) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        let n = rest / size;
        if n > 0 {
            // Digits pushed directly, not through `fmt`: every task view formats a few.
            push_digits(&mut out, n, 1);
            out.push_str(unit);
            rest -= n * size;
        }
    }
    out
}

/// Appends `n` in decimal, zero-padded to at least `width` digits (at most 20). The task view
/// formats a few durations and instants per create; `write!` costs more than the digits.
pub fn push_digits(out: &mut String, mut n: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    // Every slot is written right to left; a u64 has at most 20 digits, so `i` never wraps.
    for slot in buf.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        i -= 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let start = i.min(buf.len() - width.min(buf.len()));
    // Only ASCII digits are in `buf`.
    let digits = buf.get(start..).unwrap_or_default();
    out.push_str(std::str::from_utf8(digits).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("3s"), Ok(3_000));
        assert_eq!(parse_duration_ms("15m"), Ok(900_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("1m500ms"), Ok(60_500));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "3",
            "s",
            "3 s",
            "-3s",
            "1.5s",
            "3sec",
            "30m1h",
            "1m1m",
            "3S",
            " 3s",
            "99999999999999999999s",
            "213503982335d",
        ] {
            assert!(
                parse_duration_ms(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn digits_are_padded_to_the_width_and_never_cut() {
        for (n, w, want) in [
            (0, 1, "0"),
            (7, 2, "07"),
            (2026, 4, "2026"),
            (12345, 4, "12345"),
            (5, 3, "005"),
            (u64::MAX, 1, "18446744073709551615"),
            (0, 20, "00000000000000000000"),
            (1, 25, "00000000000000000001"),
        ] {
            let mut s = String::from("x");
            push_digits(&mut s, n, w);
            assert_eq!(s, format!("x{want}"), "{n} width {w}");
        }
    }

    #[test]
    fn format_round_trips() {
        for ms in [0, 1, 250, 1_000, 60_500, 5_400_000, 604_800_000, 90_061_001] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
        assert_eq!(format_duration_ms(5_400_000), "1h30m");
    }
}
