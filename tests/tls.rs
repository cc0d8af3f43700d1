//! HTTPS webhooks against a real local TLS receiver (tokio-rustls + hyper) whose certificate
//! is issued at test time by a throwaway CA (rcgen): trusted through `ca_file` it delivers,
//! untrusted the handshake fails and is retried, then failed with a TLS error.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::herald::{poll, wait_state, webhook_channel, TestHerald};
use common::http;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A CA and a server certificate it signed for `localhost` and `127.0.0.1`.
struct Pki {
    ca_pem: String,
    server_cert: CertificateDer<'static>,
    server_key: PrivatePkcs8KeyDer<'static>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "herald test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();

    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        server_cert: cert.der().clone(),
        server_key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    }
}

/// One request that came over TLS.
struct Got {
    headers: hyper::HeaderMap,
    json: Value,
}

/// HTTPS receiver on 127.0.0.1:0: answers 200 to every request and records it; counts TLS
/// handshakes that completed and that failed. Stops when dropped.
struct TlsReceiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
    handshakes: Arc<AtomicU64>,
    handshake_failures: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsReceiver {
    async fn start(pki: &Pki) -> TlsReceiver {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![pki.server_cert.clone()],
                PrivateKeyDer::Pkcs8(pki.server_key.clone_key()),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let handshakes = Arc::new(AtomicU64::new(0));
        let handshake_failures = Arc::new(AtomicU64::new(0));
        let (g, ok, bad) = (got.clone(), handshakes.clone(), handshake_failures.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, g, ok, bad) = (acceptor.clone(), g.clone(), ok.clone(), bad.clone());
                conns.spawn(async move {
                    let tls = match acceptor.accept(tcp).await {
                        Ok(s) => s,
                        Err(_) => {
                            bad.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    };
                    ok.fetch_add(1, Ordering::SeqCst);
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let g = g.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes());
                            let json = body
                                .ok()
                                .and_then(|b| serde_json::from_slice(&b).ok())
                                .unwrap_or(Value::Null);
                            g.lock().push(Got {
                                headers: parts.headers,
                                json,
                            });
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        TlsReceiver {
            addr,
            got,
            handshakes,
            handshake_failures,
            task,
        }
    }

    /// `https://127.0.0.1:PORT/hook` (the certificate names `localhost` and `127.0.0.1`).
    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/hook", self.addr.port())
    }
}

fn write_ca(dir: &tempfile::TempDir, pem: &str) -> PathBuf {
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, pem).unwrap();
    path
}

async fn create(h: &TestHerald, body: Value) {
    let r = http::post_json(&h.url("/v1/tasks"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
}

#[tokio::test]
async fn with_ca_file_the_message_is_delivered_over_tls() {
    let pki = pki();
    let rx = TlsReceiver::start(&pki).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = write_ca(&dir, &pki.ca_pem);
    let h = TestHerald::start(&webhook_channel(
        "secure",
        &rx.url(),
        &format!("ca_file = {:?}", ca.display().to_string()),
    ))
    .await;
    create(
        &h,
        json!({"id": "t", "channel": "secure", "schedule": {"after": "0s"},
               "to": ["a", "b", "c", "d"], "body": "over tls",
               "pacing": {"interval": "20ms"},
               "retry": {"max_attempts": 2, "initial": "10ms"}}),
    )
    .await;
    let v = wait_state(&h.server.url(), "t", "completed", Duration::from_secs(10)).await;
    assert_eq!(v["progress"]["sent"], 4);
    assert_eq!(v["progress"]["failed"], 0);
    let got = rx.got.lock();
    assert_eq!(got.len(), 4, "the receiver got every message over TLS");
    for (i, req) in got.iter().enumerate() {
        let key = format!("t:1:{i}");
        assert_eq!(
            req.headers
                .get("idempotency-key")
                .unwrap()
                .to_str()
                .unwrap(),
            key
        );
        assert_eq!(req.headers.get("content-type").unwrap(), "application/json");
        assert_eq!(req.json["idempotency_key"], key);
        assert_eq!(req.json["body"], "over tls");
        assert_eq!(req.json["task_id"], "t");
    }
    // Pooled: the TLS connection is reused rather than a handshake per message.
    let n = rx.handshakes.load(Ordering::SeqCst);
    assert!((1..=2).contains(&n), "{n} handshakes for 4 sends");
    assert_eq!(rx.handshake_failures.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn without_ca_file_the_handshake_fails_and_the_message_fails_with_a_tls_error() {
    let pki = pki();
    let rx = TlsReceiver::start(&pki).await;
    let h = TestHerald::start(&webhook_channel("secure", &rx.url(), "")).await;
    create(
        &h,
        json!({"id": "u", "channel": "secure", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "hi"}],
               "retry": {"max_attempts": 2, "initial": "10ms"}}),
    )
    .await;
    let f = poll(Duration::from_secs(10), || async {
        let r = http::get(&h.url("/v1/failures?task=u")).await;
        let f = r.json()["failures"].as_array().cloned().unwrap_or_default();
        (!f.is_empty()).then_some(f)
    })
    .await
    .expect("failure recorded");
    assert_eq!(f[0]["attempts"], 2, "a TLS failure is retried");
    let err = f[0]["last_error"].as_str().unwrap();
    assert!(err.starts_with("TLS handshake failed"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(rx.got.lock().is_empty(), "nothing was received");
    assert_eq!(rx.handshakes.load(Ordering::SeqCst), 0);
    // Both attempts reached the receiver and were refused in the handshake.
    let failed = poll(Duration::from_secs(5), || async {
        (rx.handshake_failures.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(failed.is_some(), "two handshakes attempted");
}

#[test]
fn a_missing_ca_file_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let text = webhook_channel(
        "secure",
        "https://localhost:1/hook",
        &format!("ca_file = {:?}", missing.display().to_string()),
    );
    let e = herald::config::Config::from_toml(&text, Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("channels.secure.ca_file:"), "{e}");
    assert!(e.contains("nope.pem"), "{e}");

    // A file that is not PEM certificates is refused too.
    let junk = write_ca(&dir, "not a certificate\n");
    let text = webhook_channel(
        "secure",
        "https://localhost:1/hook",
        &format!("ca_file = {:?}", junk.display().to_string()),
    );
    let e = herald::config::Config::from_toml(&text, Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("channels.secure.ca_file:"), "{e}");
}
