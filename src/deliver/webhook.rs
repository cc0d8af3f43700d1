//! The `webhook` sink: POSTs the delivery as JSON with hyper's pooled client (connections are
//! reused across deliveries of a channel) under a per-channel timeout. `https://` URLs go over
//! rustls (ring) trusting the Mozilla roots plus the channel's `ca_file`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use super::classify::classify;
use super::sign::{Signer, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use crate::model::Outcome;

/// How much of a response body we read (for the failure list); the rest is dropped.
const EXCERPT_BYTES_MAX: usize = 512;

pub struct WebhookSink {
    url: Uri,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    signer: Option<Signer>,
}

/// Reads the PEM CA certificates of a `ca_file`: at least one, each usable as a trust anchor.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in it", path.display()));
    }
    let mut store = RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(certs)
}

/// TLS client settings: ring, TLS 1.2/1.3, webpki roots plus `extra_roots`, ALPN http/1.1.
fn tls_config(extra_roots: &[CertificateDer<'static>]) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra_roots {
        roots
            .add(cert.clone())
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// True if the error chain holds a rustls error (handshake: unknown CA, wrong name, alert).
fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // io::Error's source() skips the error it wraps (which may be another io::Error), so
        // look inside as well.
        let mut inner = Some(err);
        while let Some(i) = inner {
            if i.is::<rustls::Error>() {
                return true;
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|b| b as &(dyn std::error::Error + 'static));
        }
        cur = err.source();
    }
    false
}

impl WebhookSink {
    /// `url` is `http://` or `https://` (checked by config). `timeout_ms` bounds the whole
    /// attempt: connect, TLS handshake, send and reading the answer; `connect_timeout_ms` the
    /// TCP connect alone. `extra_roots` are trusted besides the webpki roots (`ca_file`).
    /// With a signer every request carries the Standard Webhooks headers.
    pub fn new(
        url: Uri,
        timeout_ms: u64,
        connect_timeout_ms: u64,
        extra_roots: &[CertificateDer<'static>],
        signer: Option<Signer>,
    ) -> Result<WebhookSink, String> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_millis(connect_timeout_ms)));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(extra_roots)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(WebhookSink {
            url,
            timeout: Duration::from_millis(timeout_ms),
            client,
            signer,
        })
    }

    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// POSTs `payload` as JSON. `key` is the idempotency key, also the Standard Webhooks
    /// message id, so it is the same on every attempt of one message.
    pub async fn post<T: serde::Serialize>(
        &self,
        payload: &T,
        key: &str,
        now_ms: impl Fn() -> u64,
    ) -> Outcome {
        let body = match serde_json::to_vec(payload) {
            Ok(b) => b,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("encode: {e}"),
                }
            }
        };
        let mut req = Request::post(self.url.clone())
            .header("content-type", "application/json")
            .header("user-agent", concat!("herald/", env!("CARGO_PKG_VERSION")))
            .header("idempotency-key", key);
        if let Some(signer) = &self.signer {
            let ts = now_ms() / 1_000;
            req = req
                .header(HEADER_ID, key)
                .header(HEADER_TIMESTAMP, ts.to_string())
                .header(HEADER_SIGNATURE, signer.signature_header(key, ts, &body));
        }
        let req = req.body(Full::new(Bytes::from(body)));
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("request: {e}"),
                }
            }
        };
        let attempt = async {
            let resp = self.client.request(req).await.map_err(|e| {
                // Show the root cause (refused, reset, ...) rather than hyper's wrapper.
                let mut msg = e.to_string();
                if is_tls_error(&e) {
                    let what = if e.is_connect() {
                        "TLS handshake failed"
                    } else {
                        "TLS error"
                    };
                    msg = format!("{what}: {msg}");
                }
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg = format!("{msg}: {s}");
                    src = s.source();
                }
                msg
            })?;
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let excerpt = read_excerpt(resp.into_body()).await;
            Ok::<_, String>((status, retry_after, excerpt))
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok((status, retry_after, excerpt))) => {
                classify(status, retry_after.as_deref(), &excerpt, now_ms())
            }
            Ok(Err(e)) => Outcome::Retry {
                error: e,
                not_before_ms: None,
            },
            Err(_) => Outcome::Retry {
                error: format!("timed out after {} ms", self.timeout.as_millis()),
                not_before_ms: None,
            },
        }
    }
}

/// Reads at most `EXCERPT_BYTES_MAX` bytes of a body as lossy UTF-8, single line.
async fn read_excerpt(mut body: Incoming) -> String {
    let mut buf = Vec::new();
    while buf.len() < EXCERPT_BYTES_MAX {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    buf.extend_from_slice(data);
                }
            }
            _ => break,
        }
    }
    buf.truncate(EXCERPT_BYTES_MAX);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
