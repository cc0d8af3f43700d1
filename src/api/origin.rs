//! Loopback trust without a token is trust in the local user, not in every web page the local
//! user's browser opens. A page elsewhere can send requests to `http://127.0.0.1:7700` that
//! need no preflight (a form's POST, a `no-cors` fetch): herald would cancel, trigger or
//! create on its behalf (cross-site request forgery). And a name the page controls, made to
//! resolve to 127.0.0.1 (DNS rebinding), even lets it read the answers, an export included.
//! So without a token a request must name a loopback host (`Host`), and a browser's request
//! must come from that same origin (`Origin`). With a token neither applies: a browser never
//! adds the bearer token by itself.

use hyper::header::{HeaderMap, HOST, ORIGIN};
use hyper::StatusCode;

use super::problem::Problem;

/// Refuses a request that names a host other than a loopback one (421), or that a browser sent
/// from another origin (403).
pub fn check(headers: &HeaderMap) -> Result<(), Problem> {
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    if let Some(h) = host {
        if !is_loopback(host_of(h)) {
            return Err(Problem::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected",
                "Misdirected Request",
                format!(
                    "Host {h:?} is not a loopback name: without a token herald answers only to localhost, 127.0.0.1 or [::1] (configure a token to reach it by another name)"
                ),
            )
            .with_field("Host"));
        }
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let same = match (origin.to_str().ok(), host) {
        (Some(o), Some(h)) => o
            .strip_prefix("http://")
            .is_some_and(|rest| rest.eq_ignore_ascii_case(h)),
        _ => false,
    };
    if same {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::FORBIDDEN,
        "cross-origin",
        "Forbidden",
        "a request from another origin (a web page elsewhere) is refused when herald has no token",
    )
    .with_field("Origin"))
}

/// The host part of a `Host` value: `name`, `name:port`, `[v6]`, `[v6]:port`.
fn host_of(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(v6, _)| v6);
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(hyper::header::HeaderName, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn loopback_hosts_pass_and_others_are_misdirected() {
        for h in [
            "127.0.0.1:7700",
            "localhost:7700",
            "LOCALHOST",
            "[::1]:7700",
            "127.0.0.2",
        ] {
            assert!(check(&headers(&[(HOST, h)])).is_ok(), "{h}");
        }
        assert!(check(&HeaderMap::new()).is_ok(), "no Host (HTTP/1.0)");
        for h in [
            "evil.example:7700",
            "10.0.0.1:7700",
            "[::2]:7700",
            "localhost.evil.example",
        ] {
            let e = check(&headers(&[(HOST, h)])).unwrap_err();
            assert_eq!(e.status, StatusCode::MISDIRECTED_REQUEST, "{h}");
        }
    }

    #[test]
    fn only_the_same_origin_passes() {
        let ok = headers(&[(HOST, "127.0.0.1:7700"), (ORIGIN, "http://127.0.0.1:7700")]);
        assert!(check(&ok).is_ok());
        for o in [
            "https://evil.example",
            "null",
            "http://127.0.0.1:7701",
            "http://localhost:7700",
        ] {
            let e = check(&headers(&[(HOST, "127.0.0.1:7700"), (ORIGIN, o)])).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN, "{o}");
        }
    }
}
