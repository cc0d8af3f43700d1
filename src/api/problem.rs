//! RFC 9457 problem documents: every error the API answers is one of these, with
//! `Content-Type: application/problem+json` and, for bad input, the `field` it is about.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::json;

use crate::engine::EngineError;

#[derive(Debug, Clone)]
pub struct Problem {
    pub status: StatusCode,
    /// Short stable slug, e.g. `invalid-field`; becomes the `type` URN.
    pub kind: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
    /// For 405: the `Allow` header.
    pub allow: Option<&'static str>,
    /// For 503: the `Retry-After` header, in seconds.
    pub retry_after_s: Option<u32>,
    /// For 401: send the `WWW-Authenticate: Bearer` challenge (RFC 9110 §11.6.1).
    pub bearer_challenge: bool,
    /// Close the connection after this answer (`Connection: close`): the request was not read
    /// to its end, so the connection cannot carry another one.
    pub close: bool,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            kind,
            title,
            detail: detail.into(),
            field: None,
            allow: None,
            retry_after_s: None,
            bearer_challenge: false,
            close: false,
        }
    }

    /// The same problem with another `type` slug and title.
    pub fn kind(mut self, kind: &'static str, title: &'static str) -> Problem {
        self.kind = kind;
        self.title = title;
        self
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Problem {
        self.field = Some(field.into());
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Bad request",
            detail,
        )
    }

    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Problem {
        let field = field.into();
        let detail = detail.into();
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-field",
            "Invalid value",
            format!("{field}: {detail}"),
        )
        .with_field(field)
    }

    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "conflict", "Conflict", detail)
    }

    /// 503 with `Retry-After: 1`: nothing changed, the client may try again.
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        let mut p = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Unavailable",
            detail,
        );
        p.retry_after_s = Some(1);
        p
    }

    /// 503 while herald recovers its state at start (`Retry-After: 1`, as every 503).
    pub fn recovering() -> Problem {
        Problem::unavailable("herald is still recovering its state; try again shortly")
            .kind("recovering", "Recovering")
    }

    pub fn internal(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            detail,
        )
    }

    /// The RFC 9457 document.
    pub fn document(&self) -> serde_json::Value {
        let mut doc = json!({
            "type": format!("urn:herald:problem:{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Some(f) = &self.field {
            super::views::put(&mut doc, "field", json!(f));
        }
        doc
    }

    pub fn into_response(self) -> Response<Full<Bytes>> {
        let doc = self.document();
        let mut resp = Response::new(Full::new(Bytes::from(doc.to_string())));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after_s {
            resp.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from(s),
            );
        }
        if let Some(allow) = self.allow {
            resp.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static(allow),
            );
        }
        if self.bearer_challenge {
            resp.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
        }
        if self.close {
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        resp
    }
}

impl From<EngineError> for Problem {
    fn from(e: EngineError) -> Problem {
        match e {
            EngineError::Invalid(f) => Problem::invalid(f.field, f.detail),
            EngineError::NotFound(what) => Problem::not_found(format!("{what} does not exist")),
            EngineError::IdTaken(id) => {
                Problem::conflict(format!("a task with id {id:?} exists already")).with_field("id")
            }
            EngineError::KeyReused => {
                Problem::conflict("Idempotency-Key was used before with a different request body")
                    .with_field("Idempotency-Key")
            }
            EngineError::Conflict(d) => Problem::conflict(d),
            EngineError::Limit(d) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "limit",
                "Limit reached",
                d,
            ),
            // A step that is not allowed is a bug on herald's side, never the client's conflict.
            EngineError::Transition(t) => Problem::internal(format!("bug: {t}")),
            EngineError::Internal(d) => Problem::internal(d),
            EngineError::Storage(e) => Problem::unavailable(format!(
                "storage is failing ({e}); nothing was changed. Try again once /healthz answers 200"
            )),
            EngineError::Store(crate::store::StoreError::Busy) => Problem::unavailable(
                "the write queue is full; nothing was changed. Try again shortly",
            ),
            // Cluster mode: the task's shard moved to another node meanwhile.
            EngineError::Store(e @ crate::store::StoreError::OwnershipLost { .. }) => {
                Problem::unavailable(format!("{e}. Try again shortly"))
            }
            EngineError::Busy(d) => Problem::unavailable(d),
            // Another instance (a restart, another node) may answer the retry.
            EngineError::Stopped => Problem::unavailable("herald is shutting down"),
            // The write itself met the failure (a full disk, an I/O error): nothing was
            // acknowledged, and herald heals by itself, so it is "try again", not a bug.
            EngineError::Store(s) if s.is_storage() => Problem::unavailable(format!(
                "storage is failing ({s}); the change is not known to be applied. Try again once /healthz answers 200"
            )),
            EngineError::Store(s) => {
                tracing::error!(error = %s, "storage error answering a request");
                Problem::internal(format!("storage error: {s}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_trouble_recovery_and_shutdown_are_503_with_retry_after_and_bugs_are_500() {
        for p in [
            EngineError::Store(crate::store::StoreError::Busy),
            EngineError::Storage("No space left on device".into()),
            EngineError::Stopped,
        ]
        .map(Problem::from)
        .into_iter()
        .chain([Problem::recovering()])
        {
            let r = p.into_response();
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(r.headers()[hyper::header::RETRY_AFTER], "1");
            assert_eq!(
                r.headers()[hyper::header::CONTENT_TYPE],
                "application/problem+json"
            );
        }
        let bug = EngineError::Transition(crate::model::InvalidTransition {
            from: crate::model::TaskState::Completed,
            to: crate::model::TaskState::Running,
        });
        assert_eq!(
            Problem::from(bug).into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        // A record the store refused to write (too big to read back; the config keeps
        // message bodies under it, so a bug): a 500 saying so, not a retry.
        let big = EngineError::Store(crate::store::StoreError::Encode("too big".into()));
        let r = Problem::from(big).into_response();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.headers().get(hyper::header::RETRY_AFTER).is_none());
    }
}
