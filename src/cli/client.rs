//! A small client of herald's HTTP API on hyper (http, or https behind a TLS proxy), with the
//! token from `HERALD_TOKEN`. Errors become one-line [`CliError`]s that say what to do.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of an error answer's body read for its `detail`: herald's problem documents are
/// far smaller, and a body past it (a proxy's page, a broken server) is not read on.
const ERROR_BODY_MAX: usize = 64 * 1024;

/// What went wrong, as one line for the operator.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No connection to herald at all.
    #[error("cannot reach herald at {url}: {reason} (is `herald serve` running there? set --url or HERALD_URL)")]
    Unreachable { url: String, reason: String },
    /// A change was sent and no answer came (the connection broke after the request went
    /// out, or the time ran out): herald may have made it. Never "cannot reach", which
    /// invites a re-run that would create or trigger a second time.
    #[error("{method} {path}: no answer from herald at {url} ({reason}); it may or may not have been done: check with `herald tasks show ID` or `herald tasks list` (`herald failures list` for the failure list) before repeating it (a create repeated with the same --idempotency-key is never made twice)")]
    Unknown {
        method: String,
        path: String,
        url: String,
        reason: String,
    },
    /// herald answered with an error (a problem document).
    #[error("{method} {path}: HTTP {status}: {detail}{hint}")]
    Api {
        method: String,
        path: String,
        status: u16,
        detail: String,
        hint: &'static str,
    },
    /// Something on this side: a file, an argument, an answer that is not what the API promises.
    #[error("{0}")]
    Local(String),
}

impl CliError {
    /// The HTTP status herald answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            CliError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub struct Client {
    base: String,
    token: Option<String>,
    lang: Option<crate::model::Lang>,
    http: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The innermost cause of an error chain, for "connection refused" instead of "client error".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    one_line(&cur.to_string())
}

impl Client {
    /// A client of the herald at `url` (e.g. `http://127.0.0.1:7700`), with `HERALD_TOKEN`.
    pub fn new(url: &str) -> Result<Client, CliError> {
        let token = std::env::var("HERALD_TOKEN").ok().filter(|t| !t.is_empty());
        Client::with_token(url, token)
    }

    pub fn with_token(url: &str, token: Option<String>) -> Result<Client, CliError> {
        let base = url.trim_end_matches('/').to_string();
        let uri: Uri = base
            .parse()
            .map_err(|e| CliError::Local(format!("--url {url:?} is not a URL: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(CliError::Local(format!(
                "--url {url:?}: expected http://HOST:PORT or https://HOST"
            )));
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| CliError::Local(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client {
            base,
            token,
            lang: None,
            http: HyperClient::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `Accept-Language` for `lang` (herald's default, or the task's language, without).
    pub fn lang(mut self, lang: Option<crate::model::Lang>) -> Client {
        self.lang = lang;
        self
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends a request and returns the response head and body stream, or the error herald
    /// answered with.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Result<hyper::Response<Incoming>, CliError> {
        let mut b = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.base));
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("accept"))
        {
            b = b.header("accept", "application/json");
        }
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        if let Some(l) = self.lang {
            b = b.header("accept-language", l.as_str());
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let has_body = body.is_some();
        if has_body {
            b = b.header("content-type", "application/json");
        }
        let req = b
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CliError::Local(format!("building the request for {path}: {e}")))?;
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(req)).await {
            Err(_) => {
                let reason = format!("no answer within {}s", REQUEST_TIMEOUT.as_secs());
                return Err(self.no_answer(&method, path, reason));
            }
            // No connection was made: nothing was sent.
            Ok(Err(e)) if e.is_connect() => {
                return Err(CliError::Unreachable {
                    url: self.base.clone(),
                    reason: root_cause(&e),
                })
            }
            Ok(Err(e)) => return Err(self.no_answer(&method, path, root_cause(&e))),
            Ok(Ok(r)) => r,
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.refusal(method, path, resp).await)
    }

    /// The error for a request that may have been sent and got no answer: a read is simply
    /// not answered ("cannot reach"), a change's outcome is unknown ([`CliError::Unknown`]).
    fn no_answer(&self, method: &Method, path: &str, reason: String) -> CliError {
        if matches!(*method, Method::GET | Method::HEAD) {
            return CliError::Unreachable {
                url: self.base.clone(),
                reason,
            };
        }
        CliError::Unknown {
            method: method.to_string(),
            path: path.to_string(),
            url: self.base.clone(),
            reason,
        }
    }

    /// The error for an answer that is not a success: the problem's `detail` (or the body's
    /// first line, or the status's reason) and a hint about the token. The body is read for
    /// [`REQUEST_TIMEOUT`] and [`ERROR_BODY_MAX`] bytes at most (else the status's reason
    /// stands in), and the text is shown with control characters escaped: it comes from
    /// whatever answered, and an escape sequence could repaint the terminal or set its
    /// clipboard (OSC 52).
    #[allow(
        clippy::indexing_slicing,
        reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
    )]
    async fn refusal(
        &self,
        method: Method,
        path: &str,
        resp: hyper::Response<Incoming>,
    ) -> CliError {
        let status = resp.status();
        let limited = Limited::new(resp.into_body(), ERROR_BODY_MAX).collect();
        let bytes = match tokio::time::timeout(REQUEST_TIMEOUT, limited).await {
            Ok(Ok(c)) => c.to_bytes(),
            _ => Bytes::new(),
        };
        let detail = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["detail"].as_str().map(one_line))
            .unwrap_or_else(|| {
                let text = one_line(&String::from_utf8_lossy(&bytes));
                if text.is_empty() {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    text.chars().take(200).collect()
                }
            });
        let detail = crate::logsafe::Escaped(&detail).to_string();
        let hint = match status {
            StatusCode::UNAUTHORIZED if self.token.is_none() => {
                " (herald wants a token: set HERALD_TOKEN)"
            }
            StatusCode::UNAUTHORIZED => " (check HERALD_TOKEN)",
            _ => "",
        };
        CliError::Api {
            method: method.to_string(),
            path: path.to_string(),
            status: status.as_u16(),
            detail,
            hint,
        }
    }

    /// A request whose answer is JSON.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Result<Value, CliError> {
        let resp = self.request(method.clone(), path, body, headers).await?;
        let status = resp.status().as_u16();
        // A change answered with a success was made, whatever became of the answer's body.
        let broke = |reason: String| match method {
            Method::GET | Method::HEAD => CliError::Unreachable {
                url: self.base.clone(),
                reason,
            },
            _ => CliError::Local(format!(
                "{method} {path}: herald answered HTTP {status} (done) but its answer broke \
                 off ({reason}); see the result with `herald tasks show ID` or `herald tasks list`"
            )),
        };
        let bytes = tokio::time::timeout(REQUEST_TIMEOUT, read_all(resp.into_body()))
            .await
            .map_err(|_| broke("the answer stalled".into()))?
            .map_err(broke)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| CliError::Local(format!("{path}: herald answered with bad JSON: {e}")))
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.json(Method::GET, path, None, &[]).await
    }

    pub async fn post(&self, path: &str) -> Result<Value, CliError> {
        self.json(Method::POST, path, None, &[]).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        self.json(Method::DELETE, path, None, &[]).await
    }

    /// A streaming answer (`GET /v1/events`): the body, read frame by frame by the caller.
    pub async fn stream(&self, path: &str) -> Result<Incoming, CliError> {
        let resp = self
            .request(Method::GET, path, None, &[("accept", "text/event-stream")])
            .await?;
        Ok(resp.into_body())
    }
}

async fn read_all(body: Incoming) -> Result<Bytes, String> {
    body.collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| root_cause(&e))
}

/// Percent-encodes one path segment or query value.
pub fn enc(s: &str) -> String {
    crate::deliver::platform::percent_encode(s)
}
