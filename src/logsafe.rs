//! Values from users and remote peers in log lines: a message's `to` and `body`, task names,
//! a receiver's error text. A newline in them would forge a log line, an ANSI escape would
//! repaint the operator's terminal, a bidi override or isolate (U+202A–U+202E, U+2066–U+2069)
//! would reorder what is shown after it; [`Escaped`] writes them as `\n`, `\r`, `\t`,
//! `\u{1b}` or `\u{202e}` instead, and leaves everything else (any language's text, the
//! implicit marks U+200E/U+200F right-to-left text uses) as it is.

use std::fmt;

/// Displays a string with its control characters escaped.
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(escaped) {
            f.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or('\0');
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c => write!(f, "\\u{{{:x}}}", c as u32)?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// Whether [`Escaped`] escapes `c`: a control character, or an explicit bidi embedding,
/// override or isolate.
fn escaped(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An optional user value for a log field: escaped, `none` when absent (never `Some("…")`).
pub struct Opt<'a>(pub Option<&'a str>);

impl fmt::Display for Opt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(s) => Escaped(s).fmt(f),
            None => f.write_str("none"),
        }
    }
}

/// Shows a URL as `scheme://host[:port]` only: its user info, path and query may hold secrets
/// (a key in the query, `${VAR}`s expanded into the path).
pub struct UriOrigin<'a>(pub &'a hyper::Uri);

impl fmt::Display for UriOrigin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.0.scheme_str().unwrap_or("?");
        let host = self.0.host().unwrap_or("");
        match self.0.port_u16() {
            Some(port) => write!(f, "{scheme}://{host}:{port}"),
            None => write!(f, "{scheme}://{host}"),
        }
    }
}

impl fmt::Debug for UriOrigin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// What a `Debug` shows in place of a secret.
pub const REDACTED: &str = "<redacted>";

/// An optional secret as a `Debug` field: whether it is set ([`REDACTED`]), never its value.
pub fn redacted<T>(v: &Option<T>) -> Option<&'static str> {
    v.as_ref().map(|_| REDACTED)
}

#[cfg(test)]
mod tests {
    use super::Escaped;

    #[test]
    fn control_characters_are_escaped_and_text_is_kept() {
        assert_eq!(
            Escaped("a\nINFO forged\r\x1b[31mred\x07 \u{85}").to_string(),
            "a\\nINFO forged\\r\\u{1b}[31mred\\u{7} \\u{85}"
        );
        assert_eq!(Escaped("早上好, café\t!").to_string(), "早上好, café\\t!");
    }

    #[test]
    fn bidi_overrides_and_isolates_are_escaped_and_marks_kept() {
        assert_eq!(
            Escaped("a\u{202a}b\u{202b}c\u{202c}d\u{202d}e\u{202e}f").to_string(),
            "a\\u{202a}b\\u{202b}c\\u{202c}d\\u{202d}e\\u{202e}f"
        );
        assert_eq!(
            Escaped("\u{2066}\u{2067}\u{2068}\u{2069}").to_string(),
            "\\u{2066}\\u{2067}\\u{2068}\\u{2069}"
        );
        assert_eq!(Escaped("שלום\u{200f}!").to_string(), "שלום\u{200f}!");
    }
}
