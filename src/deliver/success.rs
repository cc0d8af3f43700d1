//! Success rules of platform channels: what an answer means beyond its status line. Pure.
//!
//! Messaging platforms answer `HTTP 200` with `{"errcode":45009,"errmsg":"api freq out of limit"}`
//! (WeCom), `{"code":9499,"msg":"..."}` (Feishu) or `{"ok":false,"error_code":429,...}`
//! (Telegram). A rule says which statuses count (`status = "2xx"`), and for JSON answers which
//! value at a JSON pointer means success (`json = "/errcode"`, `equals = 0`). When the rule
//! fails, the platform's code (at `code`, default the `json` pointer) decides: a code in
//! `refresh_codes` means "the access token expired" (refresh once and send again), a code in
//! `retry_codes` is retried with backoff (or after `retry_after_json` seconds), any other code
//! is a permanent failure. The error names the platform's code and message
//! (`platform code 45009: api freq out of limit`).
//!
//! Statuses outside the success set are classified as for a plain webhook (`classify`), except
//! that a platform code in the answer may still ask for a retry or a token refresh.

use serde_json::Value;

use super::classify::{classify, parse_retry_after, RETRY_AFTER_MS_MAX};
use crate::model::Outcome;

/// Which HTTP statuses count as "the platform answered normally".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet {
    /// Inclusive ranges.
    ranges: Vec<(u16, u16)>,
    text: String,
}

impl StatusSet {
    /// `"2xx"`, `"200"`, `"200-204"`, or a comma-separated list of those.
    pub fn parse(s: &str) -> Result<StatusSet, String> {
        let mut ranges = Vec::new();
        for part in s.split(',').map(str::trim) {
            let bad = || {
                format!(
                    "{part:?} is not a status, a class like \"2xx\" or a range like \"200-204\""
                )
            };
            let code = |t: &str| -> Result<u16, String> {
                if t.len() != 3 || !t.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let n: u16 = t.parse().map_err(|_| bad())?;
                if !(100..=599).contains(&n) {
                    return Err(bad());
                }
                Ok(n)
            };
            let range =
                if let Some(class) = part.strip_suffix("xx").or_else(|| part.strip_suffix("XX")) {
                    match class.as_bytes() {
                        [d @ b'1'..=b'5'] => {
                            let base = u16::from(d - b'0') * 100;
                            (base, base + 99)
                        }
                        _ => return Err(bad()),
                    }
                } else if let Some((a, b)) = part.split_once('-') {
                    let (a, b) = (code(a.trim())?, code(b.trim())?);
                    if a > b {
                        return Err(bad());
                    }
                    (a, b)
                } else {
                    let c = code(part)?;
                    (c, c)
                };
            ranges.push(range);
        }
        Ok(StatusSet {
            ranges,
            text: s.to_string(),
        })
    }

    pub fn contains(&self, status: u16) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&status))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Default for StatusSet {
    fn default() -> StatusSet {
        StatusSet {
            ranges: vec![(200, 299)],
            text: "2xx".into(),
        }
    }
}

/// A JSON-pointer check on the answer: the value at `pointer` must equal `equals`.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonRule {
    pub pointer: String,
    pub equals: Value,
}

/// The whole rule of one channel.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SuccessRule {
    pub status: StatusSet,
    pub json: Option<JsonRule>,
    /// Where the platform's code is (default: the `json` pointer).
    pub code: Option<String>,
    /// Where the platform's message is (e.g. `/errmsg`).
    pub message: Option<String>,
    pub retry_codes: Vec<i64>,
    /// Codes that mean "the access token expired or is invalid".
    pub refresh_codes: Vec<i64>,
    /// Seconds to wait, read from the answer (like `Retry-After`).
    pub retry_after_json: Option<String>,
}

/// The answer's body as far as it was read.
#[derive(Clone, Copy, Debug)]
pub enum Answer<'a> {
    /// Not read: the rule did not need it.
    Unread,
    /// Read completely (within the bound).
    Complete(&'a [u8]),
    /// Cut short: larger than the bound, or not complete within its own timeout.
    Partial(&'a [u8], &'a str),
}

/// What the rule says about one answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Done(Outcome),
    /// The token was refused (code in `refresh_codes`): refresh it and send again.
    RefreshToken {
        error: String,
    },
}

/// Checks a pointer's syntax (RFC 6901: empty or starting with `/`).
pub fn check_pointer(p: &str) -> Result<(), String> {
    if p.is_empty() || p.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is not a JSON pointer (RFC 6901): it starts with \"/\", e.g. \"/errcode\""
        ))
    }
}

/// Equality that does not care how a number is written (`0`, `0.0`) or whether a code comes as
/// a string (`"0"`).
pub fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) => {
            match (s.trim().parse::<i64>(), n.as_i64()) {
                (Ok(i), Some(j)) => i == j,
                _ => false,
            }
        }
        _ => a == b,
    }
}

/// An answer as a failure verdict reads it.
struct Reading<'a> {
    status: u16,
    retry_after: Option<&'a str>,
    now_ms: u64,
    json: Option<Value>,
    /// Why the answer was cut short, if it was.
    partial: Option<&'a str>,
    /// The answer's start on one line, for error texts.
    excerpt: String,
    code: Option<i64>,
    /// "platform code …: message (HTTP n)" when the answer has a code.
    platform_error: Option<String>,
    /// The delay the body asks for (`retry_after_json`), as an instant.
    body_delay: Option<u64>,
    /// The delay the `Retry-After` header asks for, as an instant.
    header_delay: Option<u64>,
}

fn as_code(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn short(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    one_line(&s, 200)
}

/// `text` on one line, at most `max` bytes (cut at a char boundary).
pub fn one_line(text: &str, max: usize) -> String {
    // A receiver's answer goes into `last_error`, and from there to the CLI, the dashboard and
    // logs: control characters other than whitespace are kept escaped, never raw.
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s = crate::logsafe::Escaped(&joined).to_string();
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Bytes of an answer looked at for its excerpt: enough for [`EXCERPT_MAX`] once whitespace
/// runs are joined, without converting and splitting an answer of up to 16 MiB whole.
const EXCERPT_SCAN_BYTES: usize = 2048;
/// Longest excerpt of an answer in an error.
const EXCERPT_MAX: usize = 512;

/// An answer's start as one line for an error: [`one_line`] of its first
/// [`EXCERPT_SCAN_BYTES`] after any leading whitespace, cut before a character the cut would
/// split. (Without the skip, an answer padded with 2 KiB of blanks said nothing.)
pub fn excerpt(body: &[u8]) -> String {
    let body = body.get(text_start(body)..).unwrap_or_default();
    let head = body.get(..EXCERPT_SCAN_BYTES).unwrap_or(body);
    let head = match std::str::from_utf8(head) {
        // Only an incomplete character at the end (the cut's doing): leave it out.
        Err(e) if e.error_len().is_none() => head.get(..e.valid_up_to()).unwrap_or(head),
        _ => head,
    };
    one_line(&String::from_utf8_lossy(head), EXCERPT_MAX)
}

/// Where an answer's text starts: the offset of its first character that is not whitespace
/// (as `one_line` splits on) or not UTF-8; `body.len()` when it is all whitespace. Allocates
/// nothing; `utf8_chunks` checks each valid run whole, so it reads up to the body's length
/// (bounded by what was read of the answer), not only the whitespace.
fn text_start(body: &[u8]) -> usize {
    let mut at = 0;
    for chunk in body.utf8_chunks() {
        let valid = chunk.valid();
        if let Some(i) = valid.find(|c: char| !c.is_whitespace()) {
            return at + i;
        }
        at += valid.len();
        if !chunk.invalid().is_empty() {
            return at;
        }
    }
    at
}

impl SuccessRule {
    /// Does judging an answer with this status need its body?
    pub fn needs_body(&self, status: u16) -> bool {
        if self.status.contains(status) {
            self.json.is_some()
        } else {
            self.code_pointer().is_some() || self.retry_after_json.is_some()
        }
    }

    fn code_pointer(&self) -> Option<&str> {
        self.code
            .as_deref()
            .or(self.json.as_ref().map(|j| j.pointer.as_str()))
    }

    /// Judges one answer. `retry_after` is the raw header; `now_ms` anchors delays.
    pub fn judge(
        &self,
        status: u16,
        retry_after: Option<&str>,
        answer: Answer<'_>,
        now_ms: u64,
    ) -> Verdict {
        let (bytes, partial) = match answer {
            Answer::Unread => (None, None),
            Answer::Complete(b) => (Some(b), None),
            Answer::Partial(b, why) => (Some(b), Some(why)),
        };
        let json: Option<Value> = match (bytes, partial) {
            (Some(b), None) => serde_json::from_slice(b).ok(),
            _ => None,
        };
        // The common case first, without building the texts only a failure needs.
        if self.status.contains(status) {
            match (&self.json, &json) {
                (None, _) => return Verdict::Done(Outcome::Sent),
                (Some(rule), Some(j))
                    if j.pointer(&rule.pointer)
                        .is_some_and(|v| loose_eq(v, &rule.equals)) =>
                {
                    return Verdict::Done(Outcome::Sent)
                }
                _ => {}
            }
        }
        let r = self.read(status, retry_after, bytes, partial, json, now_ms);
        if !self.status.contains(status) {
            return self.outside_status(&r);
        }
        self.by_rule(&r)
    }

    /// What a verdict other than the common success needs from the answer.
    fn read<'a>(
        &self,
        status: u16,
        retry_after: Option<&'a str>,
        bytes: Option<&[u8]>,
        partial: Option<&'a str>,
        json: Option<Value>,
        now_ms: u64,
    ) -> Reading<'a> {
        let excerpt = bytes.map(excerpt).unwrap_or_default();
        let code_value = json
            .as_ref()
            .zip(self.code_pointer())
            .and_then(|(j, p)| j.pointer(p));
        let code = code_value.and_then(as_code);
        let message = json
            .as_ref()
            .zip(self.message.as_deref())
            .and_then(|(j, p)| j.pointer(p))
            .map(short);
        let platform_error = code_value.map(|c| {
            let mut e = format!("platform code {}", short(c));
            if let Some(m) = &message {
                e.push_str(": ");
                e.push_str(m);
            }
            e.push_str(&format!(" (HTTP {status})"));
            e
        });
        // A delay asked for in the body, else by the header (429/503 as for plain webhooks).
        let body_delay = json
            .as_ref()
            .zip(self.retry_after_json.as_deref())
            .and_then(|(j, p)| j.pointer(p))
            .and_then(|v| match v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            })
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| {
                let ms = (s * 1000.0).min(RETRY_AFTER_MS_MAX as f64) as u64;
                now_ms.saturating_add(ms)
            });
        Reading {
            status,
            retry_after,
            now_ms,
            partial,
            excerpt,
            code,
            platform_error,
            body_delay,
            header_delay: retry_after.and_then(|v| parse_retry_after(v, now_ms)),
            json,
        }
    }

    /// A platform code this channel retries on or refreshes its token for.
    fn by_code(&self, r: &Reading<'_>, error: String) -> Option<Verdict> {
        let c = r.code?;
        if self.refresh_codes.contains(&c) {
            return Some(Verdict::RefreshToken { error });
        }
        if self.retry_codes.contains(&c) {
            return Some(Verdict::Done(Outcome::Retry {
                error,
                not_before_ms: r.body_delay.or(r.header_delay),
            }));
        }
        None
    }

    /// A status outside the success set: the platform's code if it names a retry or refresh,
    /// else as a plain webhook's answer, with the platform's error text.
    fn outside_status(&self, r: &Reading<'_>) -> Verdict {
        let status = r.status;
        if let Some(e) = &r.platform_error {
            if let Some(v) = self.by_code(r, e.clone()) {
                return v;
            }
        }
        let mut outcome = classify(status, r.retry_after, &r.excerpt, r.now_ms);
        match &mut outcome {
            Outcome::Retry {
                error,
                not_before_ms,
            } => {
                if let Some(e) = &r.platform_error {
                    *error = e.clone();
                }
                if not_before_ms.is_none() {
                    *not_before_ms = r.body_delay;
                }
            }
            Outcome::Permanent { error } => {
                if let Some(e) = &r.platform_error {
                    *error = e.clone();
                }
            }
            // A status outside the set that `classify` takes for success (e.g. the set is
            // "200" and the answer 204): the operator said only the set counts.
            Outcome::Sent => {
                outcome = Outcome::Permanent {
                error: format!(
                    "HTTP {status} is not a success status for this channel (success.status = {:?})",
                    self.status.as_str()
                ),
            };
            }
            Outcome::Held { .. } => {}
        }
        Verdict::Done(outcome)
    }

    /// A success status: the JSON rule decides.
    fn by_rule(&self, r: &Reading<'_>) -> Verdict {
        let (status, excerpt) = (r.status, &r.excerpt);
        let Some(rule) = &self.json else {
            return Verdict::Done(Outcome::Sent);
        };
        let Some(json) = &r.json else {
            let error = match r.partial {
                // The platform accepted the request but its verdict could not be read: the
                // rule is unchecked, so try again rather than call it delivered.
                Some(why) => {
                    return Verdict::Done(Outcome::Retry {
                        error: format!(
                            "HTTP {status}, but the answer was cut short ({why}): success rule {} == {} not checked",
                            rule.pointer, rule.equals
                        ),
                        not_before_ms: None,
                    })
                }
                None if r.excerpt.is_empty() => {
                    format!("HTTP {status} with an empty answer; expected JSON with {}", rule.pointer)
                }
                None => format!("HTTP {status}, answer is not JSON: {excerpt}"),
            };
            return Verdict::Done(Outcome::Permanent { error });
        };
        match json.pointer(&rule.pointer) {
            Some(v) if loose_eq(v, &rule.equals) => Verdict::Done(Outcome::Sent),
            found => {
                let error = r.platform_error.clone().unwrap_or_else(|| match found {
                    Some(v) => format!(
                        "HTTP {status}: {} is {} (success needs {}): {excerpt}",
                        rule.pointer,
                        short(v),
                        rule.equals
                    ),
                    None => format!(
                        "HTTP {status}: the answer has no {} (success needs {} == {}): {excerpt}",
                        rule.pointer, rule.pointer, rule.equals
                    ),
                });
                self.by_code(r, error.clone())
                    .unwrap_or(Verdict::Done(Outcome::Permanent { error }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000;

    fn wecom() -> SuccessRule {
        SuccessRule {
            json: Some(JsonRule {
                pointer: "/errcode".into(),
                equals: json!(0),
            }),
            message: Some("/errmsg".into()),
            retry_codes: vec![-1, 45009],
            refresh_codes: vec![42001, 40014],
            ..SuccessRule::default()
        }
    }

    fn telegram() -> SuccessRule {
        SuccessRule {
            json: Some(JsonRule {
                pointer: "/ok".into(),
                equals: json!(true),
            }),
            code: Some("/error_code".into()),
            message: Some("/description".into()),
            retry_codes: vec![429],
            retry_after_json: Some("/parameters/retry_after".into()),
            ..SuccessRule::default()
        }
    }

    fn judge(r: &SuccessRule, status: u16, body: &str) -> Verdict {
        r.judge(status, None, Answer::Complete(body.as_bytes()), NOW)
    }

    #[test]
    fn an_answer_in_an_error_is_one_line_without_control_characters() {
        let e = one_line("oops\u{1b}]52;c;AAAA\u{7}\n  next", 200);
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert_eq!(e, "oops\\u{1b}]52;c;AAAA\\u{7} next");
    }

    #[test]
    fn status_sets() {
        let s = StatusSet::parse("2xx, 304,400-404").unwrap();
        for (c, ok) in [
            (200, true),
            (299, true),
            (304, true),
            (402, true),
            (405, false),
            (500, false),
        ] {
            assert_eq!(s.contains(c), ok, "{c}");
        }
        for bad in ["2x", "6xx", "20", "abc", "300-200", "", "99"] {
            assert!(StatusSet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errcode_in_200() {
        let r = wecom();
        assert_eq!(
            judge(&r, 200, r#"{"errcode":0,"errmsg":"ok"}"#),
            Verdict::Done(Outcome::Sent)
        );
        assert_eq!(
            judge(
                &r,
                200,
                r#"{"errcode":45009,"errmsg":"api freq out of limit"}"#
            ),
            Verdict::Done(Outcome::Retry {
                error: "platform code 45009: api freq out of limit (HTTP 200)".into(),
                not_before_ms: None
            })
        );
        assert_eq!(
            judge(
                &r,
                200,
                r#"{"errcode":93000,"errmsg":"invalid webhook url"}"#
            ),
            Verdict::Done(Outcome::Permanent {
                error: "platform code 93000: invalid webhook url (HTTP 200)".into()
            })
        );
        assert!(matches!(
            judge(&r, 200, r#"{"errcode":42001,"errmsg":"access_token expired"}"#),
            Verdict::RefreshToken { error } if error.starts_with("platform code 42001: access_token expired")
        ));
        // Codes as strings and numbers written differently still compare.
        assert_eq!(
            judge(&r, 200, r#"{"errcode":"0"}"#),
            Verdict::Done(Outcome::Sent)
        );
        assert_eq!(
            judge(&r, 200, r#"{"errcode":0.0}"#),
            Verdict::Done(Outcome::Sent)
        );
        // Not JSON, empty, missing pointer: permanent, readable.
        assert!(
            matches!(judge(&r, 200, "<html>"), Verdict::Done(Outcome::Permanent { error }) if error.contains("not JSON"))
        );
        assert!(
            matches!(judge(&r, 200, ""), Verdict::Done(Outcome::Permanent { error }) if error.contains("empty answer"))
        );
        assert!(
            matches!(judge(&r, 200, r#"{"x":1}"#), Verdict::Done(Outcome::Permanent { error }) if error.contains("has no /errcode"))
        );
        // A body cut short by its own bound: the rule is unchecked, so retry.
        assert!(matches!(
            r.judge(200, None, Answer::Partial(b"{\"errc", "timed out"), NOW),
            Verdict::Done(Outcome::Retry { error, .. }) if error.contains("cut short (timed out)")
        ));
    }

    #[test]
    fn telegram_retry_after_in_the_body() {
        let r = telegram();
        let body = r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 5","parameters":{"retry_after":5}}"#;
        assert_eq!(
            judge(&r, 429, body),
            Verdict::Done(Outcome::Retry {
                error: "platform code 429: Too Many Requests: retry after 5 (HTTP 429)".into(),
                not_before_ms: Some(NOW + 5_000)
            })
        );
        assert_eq!(
            judge(&r, 200, r#"{"ok":true,"result":{}}"#),
            Verdict::Done(Outcome::Sent)
        );
        assert_eq!(
            judge(
                &r,
                400,
                r#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#
            ),
            Verdict::Done(Outcome::Permanent {
                error: "platform code 400: Bad Request: chat not found (HTTP 400)".into()
            })
        );
        // A 5xx without JSON stays a plain retry with backoff.
        assert!(matches!(
            judge(&r, 502, "bad gateway"),
            Verdict::Done(Outcome::Retry {
                not_before_ms: None,
                ..
            })
        ));
        // A header and no body delay: the header wins as for plain webhooks.
        assert!(matches!(
            r.judge(429, Some("7"), Answer::Complete(b"{}"), NOW),
            Verdict::Done(Outcome::Retry { not_before_ms: Some(t), .. }) if t == NOW + 7_000
        ));
    }

    #[test]
    fn without_json_rule_status_alone_decides() {
        let r = SuccessRule::default();
        assert!(!r.needs_body(200));
        assert_eq!(
            r.judge(204, None, Answer::Unread, NOW),
            Verdict::Done(Outcome::Sent)
        );
        let only_200 = SuccessRule {
            status: StatusSet::parse("200").unwrap(),
            ..SuccessRule::default()
        };
        assert!(matches!(
            only_200.judge(204, None, Answer::Unread, NOW),
            Verdict::Done(Outcome::Permanent { .. })
        ));
        assert!(
            matches!(only_200.judge(503, Some("2"), Answer::Unread, NOW),
            Verdict::Done(Outcome::Retry { not_before_ms: Some(t), .. }) if t == NOW + 2_000)
        );
    }

    #[test]
    fn pointers_and_loose_eq() {
        assert!(check_pointer("/errcode").is_ok());
        assert!(check_pointer("").is_ok());
        assert!(check_pointer("errcode").is_err());
        assert!(loose_eq(&json!(0), &json!("0")));
        assert!(!loose_eq(&json!(true), &json!("true")));
        assert!(loose_eq(&json!(true), &json!(true)));
    }

    /// A large answer's excerpt is its first bytes as one line, as if the whole answer had
    /// been converted: a character split by the scan's cut is left out, not replaced.
    #[test]
    fn the_excerpt_of_a_large_answer_is_its_start() {
        let mut big = "é\n\t".repeat(400).into_bytes();
        big.extend(std::iter::repeat_n(b'x', 16 << 20));
        let whole = one_line(&String::from_utf8_lossy(&big), 512);
        assert_eq!(excerpt(&big), whole);
        assert!(whole.ends_with("é é é…"), "{whole}");
        // The scan's cut inside a character.
        let mut odd = vec![b'a'];
        odd.extend("é".repeat(1_500).as_bytes());
        let e = excerpt(&odd);
        assert!(!e.contains('\u{fffd}'), "{e}");
        assert_eq!(e, one_line(&String::from_utf8_lossy(&odd), 512));
        assert_eq!(excerpt(b"  short \x01 answer\n"), "short \\u{1} answer");
        assert_eq!(excerpt(b"\xff ok"), "\u{fffd} ok");
    }

    /// An answer that begins with more blanks than the excerpt scans still shows its text,
    /// bounded as any excerpt; one that is only blanks shows nothing.
    #[test]
    fn the_excerpt_skips_leading_whitespace() {
        let mut padded = " \r\n\t\u{3000}".repeat(1_000).into_bytes();
        padded.extend(b"{\"errcode\":45009,\n\"errmsg\":\"busy\"}");
        padded.extend(std::iter::repeat_n(b'x', 1 << 20));
        let e = excerpt(&padded);
        assert!(
            e.starts_with("{\"errcode\":45009, \"errmsg\":\"busy\"}xxx"),
            "{e}"
        );
        assert!(e.len() <= EXCERPT_MAX + '…'.len_utf8(), "{}", e.len());
        assert_eq!(excerpt(&b" \n".repeat(4_000)), "");
        assert_eq!(excerpt(b""), "");
        // Bytes that are not UTF-8 end the skip, as a character would.
        let mut odd = b" ".repeat(3_000);
        odd.extend(b"\xffok");
        assert_eq!(excerpt(&odd), "\u{fffd}ok");
        assert_eq!(text_start(b"  \xe3\x80\x80a"), 5);
    }
}
