//! Reading requests: path ids, query parameters, bodies (with the size limit) and JSON (with
//! errors that name the field). Everything here answers bad input with a [`Problem`].

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::problem::Problem;
use super::ApiState;
use crate::model::check_id;

pub const LIST_LIMIT_DEFAULT: usize = 100;
pub const LIST_LIMIT_MAX: usize = 1_000;

pub use crate::model::id::FAILURE_ID_LEN_MAX;

/// Percent-decodes a path segment or query value; invalid escapes are an error.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

pub fn path_id(raw: &str) -> Result<String, Problem> {
    let id = percent_decode(raw).unwrap_or_else(|| raw.to_string());
    check_id(&id).map_err(|e| Problem::bad_request(format!("id: {e}")).with_field("id"))?;
    Ok(id)
}

pub fn failure_path_id(raw: &str) -> Result<String, Problem> {
    let id = percent_decode(raw).unwrap_or_else(|| raw.to_string());
    crate::model::id::check_id_len(&id, FAILURE_ID_LEN_MAX)
        .map_err(|e| Problem::bad_request(format!("id: {e}")).with_field("id"))?;
    Ok(id)
}

/// Query parameters; unknown ones are rejected like unknown JSON fields, and so is one given
/// twice (`?limit=10&limit=0`): which of the two a client meant is not for herald to guess.
pub fn query(req: &Request<Incoming>, allowed: &[&str]) -> Result<Vec<(String, String)>, Problem> {
    pairs(req.uri().query().unwrap_or(""), allowed, true)
}

/// The value of the one query parameter `name` (`None` when absent) for code that reads it on
/// every route, before the route reads its own (`lang::wanted`): given twice it is refused as
/// [`query`] refuses it, while the other parameters are left to the route (a route that reads
/// no query ignores them).
pub fn query_one(raw_query: &str, name: &str) -> Result<Option<String>, Problem> {
    let found = pairs(raw_query, &[name], false)?;
    Ok(found.into_iter().next().map(|(_, v)| v))
}

/// The decoded pairs of `raw_query` named in `allowed`, each at most once. The others are
/// refused (`refuse_others`) or skipped unread, a bad escape in their name included.
fn pairs(
    raw_query: &str,
    allowed: &[&str],
    refuse_others: bool,
) -> Result<Vec<(String, String)>, Problem> {
    let mut out = Vec::new();
    for pair in raw_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = match percent_decode(k) {
            Some(k) => k,
            None if !refuse_others => continue,
            None => return Err(Problem::bad_request("bad percent-encoding in query")),
        };
        if !allowed.contains(&k.as_str()) {
            if !refuse_others {
                continue;
            }
            return Err(Problem::bad_request(format!(
                "{k}: unknown query parameter (allowed: {})",
                allowed.join(", ")
            ))
            .with_field(k));
        }
        let v = percent_decode(v).ok_or_else(|| {
            Problem::bad_request(format!("{k}: bad percent-encoding")).with_field(k.clone())
        })?;
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(
                Problem::bad_request(format!("{k}: given more than once in the query"))
                    .with_field(k),
            );
        }
        out.push((k, v));
    }
    Ok(out)
}

pub fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `limit` and `after` (an id of at most `after_len_max` characters).
pub fn page_params(
    q: &[(String, String)],
    after_len_max: usize,
) -> Result<(usize, Option<String>), Problem> {
    let limit = match param(q, "limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
            .ok_or_else(|| {
                Problem::bad_request(format!(
                    "limit: must be a number from 1 to {LIST_LIMIT_MAX}"
                ))
                .with_field("limit")
            })?,
        None => LIST_LIMIT_DEFAULT,
    };
    let after = match param(q, "after") {
        Some(a) if !a.is_empty() => {
            crate::model::id::check_id_len(a, after_len_max)
                .map_err(|e| Problem::bad_request(format!("after: {e}")).with_field("after"))?;
            Some(a.to_string())
        }
        _ => None,
    };
    Ok((limit, after))
}

/// Reads the body up to the limit: 413 past it (checked on Content-Length first, so an
/// honest client with a huge body is refused before it is read).
pub async fn read_body(state: &ApiState, req: Request<Incoming>) -> Result<Bytes, Problem> {
    let too_big = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Payload too large",
            format!("request body is larger than {} bytes", state.body_bytes_max),
        )
    };
    if let Some(len) = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > state.body_bytes_max as u64 {
            let mut p = too_big();
            p.close = true; // the body is not read
            return Err(p);
        }
    }
    // A client that trickles its body would otherwise hold a connection (and a descriptor)
    // forever: the whole body must arrive within `limits.body_read_timeout`.
    let read = Limited::new(req.into_body(), state.body_bytes_max).collect();
    let Ok(result) = tokio::time::timeout(state.body_read_timeout, read).await else {
        let mut p = Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "Request body timeout",
            format!(
                "the request body did not arrive within {} ms (limits.body_read_timeout)",
                state.body_read_timeout.as_millis()
            ),
        );
        p.close = true;
        return Err(p);
    };
    match result {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            let mut p = too_big();
            p.close = true; // the rest of the body was not read
            Err(p)
        }
        Err(e) => Err(Problem::bad_request(format!(
            "could not read the body: {e}"
        ))),
    }
}

/// Parses JSON into `T`, naming the field of any error. Not JSON / wrong type → 400;
/// unknown or missing field → 422 (valid JSON, not an acceptable value).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    if body.is_empty() {
        return Err(Problem::bad_request(
            "the request body is empty; expected a JSON object",
        ));
    }
    // Valid bodies (nearly all) parse without tracking the path; only a body that fails is
    // parsed again with it, to name the field (the tracking wraps every value it visits).
    if let Ok(v) = serde_json::from_slice::<T>(body) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let r: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    if r.is_ok() {
        if let Err(e) = de.end() {
            return Err(Problem::bad_request(format!("not valid JSON: {e}")));
        }
    }
    match r {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.inner();
            let msg = inner.to_string();
            // serde's message ends with " at line L column C"; keep it, it helps.
            if matches!(
                inner.classify(),
                serde_json::error::Category::Syntax
                    | serde_json::error::Category::Eof
                    | serde_json::error::Category::Io
            ) {
                return Err(Problem::bad_request(format!("not valid JSON: {msg}")));
            }
            if let Some(rest) = msg.strip_prefix("unknown field `") {
                let name = rest.split('`').next().unwrap_or("");
                let field = join_path(&path, name);
                return Err(Problem::invalid(field, msg));
            }
            if let Some(rest) = msg.strip_prefix("missing field `") {
                let name = rest.split('`').next().unwrap_or("");
                let field = join_path(&path, name);
                return Err(Problem::invalid(field, "required"));
            }
            // A number out of the field's range (`-1` or `4294967296` for a u32): valid JSON,
            // an invalid value, 422 as API.md says (a string for a number stays a 400).
            let out_of_range = msg.starts_with("invalid value: integer")
                || msg.starts_with("invalid value: floating point")
                || msg.contains("out of range");
            if out_of_range && path != "." {
                return Err(Problem::invalid(path, msg));
            }
            let field = if path == "." { String::new() } else { path };
            let p = Problem::bad_request(format!(
                "{}wrong type: {msg}",
                if field.is_empty() {
                    String::new()
                } else {
                    format!("{field}: ")
                }
            ));
            Err(if field.is_empty() {
                p
            } else {
                p.with_field(field)
            })
        }
    }
}

/// serde_path_to_error reports the path of the struct holding an unknown/missing field; add
/// the field's own name.
pub fn join_path(path: &str, name: &str) -> String {
    // For unknown fields the path already ends with the field name.
    if path == "." || path.is_empty() {
        name.to_string()
    } else if path == name || path.ends_with(&format!(".{name}")) {
        path.to_string()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A number out of its field's range is a valid JSON document with an invalid value: 422
    /// naming the field (API.md); a string where a number goes stays a 400 (wrong type).
    #[test]
    fn a_number_out_of_range_is_422_naming_its_field() {
        for v in ["-1", "4294967296"] {
            let body = format!(
                r#"{{"channel":"c","to":["a"],"body":"x","schedule":{{"after":"1s"}},"retry":{{"max_attempts":{v}}}}}"#
            );
            let p = parse_json::<crate::request::TaskRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(p.status.as_u16(), 422, "{v}: {p:?}");
            assert_eq!(p.field.as_deref(), Some("retry.max_attempts"), "{v}");
        }
        let body = r#"{"channel":"c","to":["a"],"body":"x","schedule":{"after":"1s"},"retry":{"max_attempts":"3"}}"#;
        let p = parse_json::<crate::request::TaskRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(p.status.as_u16(), 400, "{p:?}");
    }

    #[test]
    fn percent_decoding_refuses_short_and_bad_escapes() {
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b c"));
        for bad in ["%", "%4", "a%", "%zz", "%c3"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }
}
