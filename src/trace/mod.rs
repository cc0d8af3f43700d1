//! Trace context (issue 25, API.md "Trace and timeline"): W3C `traceparent`/`tracestate` read
//! from requests, fresh trace and span ids, the `traceparent` each delivery attempt carries,
//! and the OTLP/HTTP span export (`otlp.rs`).
//!
//! Parsing is pure; a malformed header is the caller's warning, never a refused request.

pub mod otlp;

use crate::model::timeline::{hex, unhex};

/// What the delivery layer needs to trace its attempts, shared by every channel: the exporter
/// (set once the server has started it). The trace of an attempt is its delivery's own
/// (`Delivery::trace_id`, rendered from the task by `engine/render.rs`).
#[derive(Default)]
pub struct Tracing {
    telemetry: std::sync::OnceLock<otlp::Telemetry>,
}

impl Tracing {
    pub fn set_telemetry(&self, t: otlp::Telemetry) {
        let _ = self.telemetry.set(t);
    }

    /// The exporter, if export is on.
    pub fn telemetry(&self) -> Option<&otlp::Telemetry> {
        self.telemetry.get().filter(|t| t.on())
    }
}

pub use crate::model::timeline::attempt_facts;

/// A W3C trace context as read from `traceparent` (and `tracestate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The caller's span: the parent of herald's span for the request.
    pub parent_span: [u8; 8],
    pub sampled: bool,
    /// `tracestate` as given, bounded ([`TRACESTATE_MAX`]): accepted as API.md asks, but not
    /// passed on (a delivery's `traceparent` is herald's own span; docs/API.md says so).
    pub state: Option<String>,
}

/// Longest `tracestate` kept (W3C: 32 members of at most 256 characters; 512 is what it
/// recommends propagating at least).
pub const TRACESTATE_MAX: usize = 512;

/// Reads a `traceparent` header value (W3C Trace Context level 1): `version-traceid-spanid-
/// flags`, lowercase hex; version `ff` and all-zero ids are invalid. A later version may add
/// fields after the flags, which are ignored, as the spec asks.
pub fn parse_traceparent(v: &str) -> Result<TraceContext, String> {
    let v = v.trim();
    let mut parts = v.split('-');
    let (Some(ver), Some(trace), Some(span), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("expected version-traceid-parentid-flags".into());
    };
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if ver.len() != 2 || !lower_hex(ver) || ver == "ff" {
        return Err(format!("version {ver:?} is not a valid version"));
    }
    if ver == "00" && parts.next().is_some() {
        return Err("version 00 has exactly four fields".into());
    }
    if !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags) {
        return Err("ids and flags must be lowercase hex".into());
    }
    let trace_id = unhex::<16>(trace).ok_or("trace-id must be 32 hex digits")?;
    let parent_span = unhex::<8>(span).ok_or("parent-id must be 16 hex digits")?;
    let flags = unhex::<1>(flags).ok_or("trace-flags must be 2 hex digits")?[0];
    if trace_id == [0; 16] {
        return Err("trace-id is all zeros".into());
    }
    if parent_span == [0; 8] {
        return Err("parent-id is all zeros".into());
    }
    Ok(TraceContext {
        trace_id,
        parent_span,
        sampled: flags & 1 == 1,
        state: None,
    })
}

/// The context of a request's headers: `Ok(None)` without `traceparent`, `Err(why)` for a
/// malformed one (the caller logs it and goes on as if there were none). A `tracestate`
/// longer than [`TRACESTATE_MAX`] or not text is dropped.
pub fn from_headers(h: &hyper::HeaderMap) -> Result<Option<TraceContext>, String> {
    let Some(tp) = h.get("traceparent") else {
        return Ok(None);
    };
    let tp = tp
        .to_str()
        .map_err(|_| "traceparent is not visible ASCII".to_string())?;
    let mut cx = parse_traceparent(tp)?;
    cx.state = h
        .get("tracestate")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= TRACESTATE_MAX)
        .map(str::to_string);
    Ok(Some(cx))
}

/// `00-{trace}-{span}-01`: what an attempt (or an exported span's child) carries.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8]) -> String {
    format!("00-{}-{}-01", hex(trace_id), hex(span_id))
}

/// 64 random bits: SipHash keyed by the OS's randomness (std's `RandomState`, seeded once per
/// thread and stepped per instance) over a process-wide counter and the time. Trace and span
/// ids need to be unique, not secret.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    h.write_u64(nanos);
    h.finish()
}

/// A fresh trace id (never all zeros).
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&random_u64().to_be_bytes());
        out[8..].copy_from_slice(&random_u64().to_be_bytes());
        if out != [0; 16] {
            return out;
        }
    }
}

/// A fresh span id (never all zeros).
pub fn new_span_id() -> [u8; 8] {
    loop {
        let v = random_u64();
        if v != 0 {
            return v.to_be_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_parses() {
        let cx = parse_traceparent(GOOD).unwrap();
        assert_eq!(hex(&cx.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&cx.parent_span), "00f067aa0ba902b7");
        assert!(cx.sampled);
        assert_eq!(traceparent(&cx.trace_id, &cx.parent_span), GOOD);
        // A later version may carry more fields.
        assert!(parse_traceparent(&format!("01{}-extra", &GOOD[2..])).is_ok());
    }

    #[test]
    fn malformed_ones_are_refused_with_a_reason() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse_traceparent(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn fresh_ids_differ() {
        let a: Vec<[u8; 8]> = (0..1000).map(|_| new_span_id()).collect();
        let set: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), a.len());
        assert_ne!(new_trace_id(), new_trace_id());
    }

    #[test]
    fn headers_carry_tracestate_and_junk_is_an_error_not_a_panic() {
        let mut h = hyper::HeaderMap::new();
        assert_eq!(from_headers(&h), Ok(None));
        h.insert("traceparent", GOOD.parse().unwrap());
        h.insert("tracestate", "congo=t61rcWkgMzE".parse().unwrap());
        let cx = from_headers(&h).unwrap().unwrap();
        assert_eq!(cx.state.as_deref(), Some("congo=t61rcWkgMzE"));
        h.insert("traceparent", "nonsense".parse().unwrap());
        assert!(from_headers(&h).is_err());
        h.insert(
            "traceparent",
            hyper::header::HeaderValue::from_bytes(b"00-\xff").unwrap(),
        );
        assert!(from_headers(&h).is_err());
    }
}
