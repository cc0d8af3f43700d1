//! A tiny HTTP/1.1 client for tests (hyper-util legacy client, one fresh
//! connection per call so it is safe across per-test tokio runtimes).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Upper bound on one whole request (connect + send + read body). Wrap the
/// call in `tokio::time::timeout` for a shorter one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Resp {
    pub status: u16,
    /// Header names lower-cased; values lossily decoded as UTF-8.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON; panics with status and body text if it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}); status {}, body: {:?}",
                self.status,
                self.text()
            )
        })
    }

    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Error text with its whole `source()` chain (hyper's top-level messages are terse).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Sends one request. Sets `content-type: application/json` when a body is
/// given unless a content-type header is passed. Errors (bad URL, connection
/// refused/reset, timeout after [`DEFAULT_TIMEOUT`]) come back as `Err(text)`.
pub async fn try_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<Resp, String> {
    let what = format!("{method} {url}");
    let m = hyper::Method::from_bytes(method.as_bytes())
        .map_err(|e| format!("{what}: bad method: {e}"))?;
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{what}: bad url: {e}"))?;
    let has_ct = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    let mut builder = hyper::Request::builder().method(m).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    if body.is_some() && !has_ct {
        builder = builder.header("content-type", "application/json");
    }
    let req = builder
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("{what}: bad request: {}", error_chain(&e)))?;

    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("{what}: request failed: {}", error_chain(&e)))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("{what}: reading body failed: {}", error_chain(&e)))?
            .to_bytes();
        let headers = super::header_pairs(&parts.headers);
        Ok(Resp {
            status: parts.status.as_u16(),
            headers,
            body,
        })
    };
    match tokio::time::timeout(DEFAULT_TIMEOUT, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!("{what}: timed out after {DEFAULT_TIMEOUT:?}")),
    }
}

/// Like [`try_request`] but panics with a clear message on failure.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Resp {
    match try_request(method, url, headers, body).await {
        Ok(r) => r,
        Err(e) => panic!("HTTP request failed: {e}"),
    }
}

pub async fn get(url: &str) -> Resp {
    request("GET", url, &[], None).await
}

pub async fn delete(url: &str) -> Resp {
    request("DELETE", url, &[], None).await
}

pub async fn post_json(url: &str, v: &serde_json::Value) -> Resp {
    request("POST", url, &[], Some(v.to_string().into_bytes())).await
}

pub async fn put_json(url: &str, v: &serde_json::Value) -> Resp {
    request("PUT", url, &[], Some(v.to_string().into_bytes())).await
}

pub async fn patch_json(url: &str, v: &serde_json::Value) -> Resp {
    request("PATCH", url, &[], Some(v.to_string().into_bytes())).await
}
