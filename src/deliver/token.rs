//! Access tokens of platform channels (WeCom app messages and the like).
//!
//! A channel with a `token` endpoint fetches a token, keeps it in memory (never on disk, never
//! logged, never shown), and uses it as `{{ token }}` in its templates. It is refreshed before
//! it expires (within the last tenth of its lifetime, at most 5 minutes early) and when an
//! answer carries a refresh code (WeCom `42001` expired, `40014` invalid).
//!
//! Single flight: the cache is behind an async mutex held across the fetch, so however many
//! sends find the token missing or refused at once, one request goes to the token endpoint and
//! the others wait for its result. A refused token is dropped only if it is still the one the
//! refusing send used (its generation), so sends that were refused the same old token do not
//! cause a second refresh. After a failed fetch, sends within [`FAILED_FETCH_PAUSE_MS`] get
//! the same error without asking the endpoint again.

use std::future::Future;

use parking_lot::Mutex;
use serde_json::Value;

use super::success::one_line;

/// How long a failed fetch is remembered before the endpoint is asked again.
pub const FAILED_FETCH_PAUSE_MS: u64 = 1_000;
/// Longest early refresh.
const REFRESH_EARLY_MS_MAX: u64 = 5 * 60_000;

/// A validated `token = { ... }`.
#[derive(Clone, PartialEq)]
pub struct TokenSpec {
    pub method: String,
    /// After `${VAR}` expansion: holds secrets. Never printed.
    pub url: String,
    pub body: Option<String>,
    /// Pointer to the token in the answer.
    pub json: String,
    /// Pointer to its lifetime in seconds.
    pub expires_json: Option<String>,
    pub refresh_codes: Vec<i64>,
    /// Lifetime when the answer gives none.
    pub lifetime_ms: u64,
    /// Pointers to the platform's code and message, to say why a fetch failed.
    pub code_json: Option<String>,
    pub message_json: Option<String>,
}

impl std::fmt::Debug for TokenSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSpec")
            .field("method", &self.method)
            .field("url", &"<redacted>")
            .field("json", &self.json)
            .field("expires_json", &self.expires_json)
            .field("refresh_codes", &self.refresh_codes)
            .finish_non_exhaustive()
    }
}

/// What `GET /v1/channels` shows about a token (never the token).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenState {
    pub valid_until_ms: Option<u64>,
    pub refreshed_at_ms: Option<u64>,
    pub refreshes: u64,
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<u64>,
}

struct Slot {
    token: Option<Held>,
    generation: u64,
    failed: Option<(u64, String)>,
}

struct Held {
    value: String,
    refresh_at_ms: u64,
}

pub struct TokenCache {
    pub spec: TokenSpec,
    slot: tokio::sync::Mutex<Slot>,
    state: Mutex<TokenState>,
}

impl TokenCache {
    pub fn new(spec: TokenSpec) -> TokenCache {
        TokenCache {
            spec,
            slot: tokio::sync::Mutex::new(Slot {
                token: None,
                generation: 0,
                failed: None,
            }),
            state: Mutex::new(TokenState::default()),
        }
    }

    pub fn state(&self) -> TokenState {
        self.state.lock().clone()
    }

    /// The current token and its generation, fetching one (once, for all waiters) when there
    /// is none or it is due for refresh. `fetch` performs the request and returns the answer's
    /// status and body.
    pub async fn get<F, Fut>(
        &self,
        now_ms: impl Fn() -> u64,
        fetch: F,
    ) -> Result<(String, u64), String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(u16, Vec<u8>), String>>,
    {
        let mut slot = self.slot.lock().await;
        let now = now_ms();
        if let Some(t) = &slot.token {
            if now < t.refresh_at_ms {
                return Ok((t.value.clone(), slot.generation));
            }
        }
        if let Some((at, e)) = &slot.failed {
            if now < at.saturating_add(FAILED_FETCH_PAUSE_MS) {
                // The pause after a failed refresh: a token due for refresh but not expired
                // still serves, as it did for the send whose fetch failed.
                return self.unexpired(&slot, now).ok_or_else(|| e.clone());
            }
        }
        let result = match fetch().await {
            Ok((status, body)) => self.parse(status, &body, now_ms()),
            Err(e) => Err(format!("token endpoint: {e}")),
        };
        let now = now_ms();
        match result {
            Ok((value, lifetime_ms)) => {
                slot.generation += 1;
                slot.failed = None;
                let early = (lifetime_ms / 10).min(REFRESH_EARLY_MS_MAX);
                slot.token = Some(Held {
                    value: value.clone(),
                    refresh_at_ms: now.saturating_add(lifetime_ms - early),
                });
                let mut st = self.state.lock();
                st.valid_until_ms = Some(now.saturating_add(lifetime_ms));
                st.refreshed_at_ms = Some(now);
                st.refreshes += 1;
                tracing::info!(valid_ms = lifetime_ms, "access token refreshed");
                Ok((value, slot.generation))
            }
            Err(e) => {
                // A token that is due for refresh but not expired yet may still be used.
                slot.failed = Some((now, e.clone()));
                let mut st = self.state.lock();
                st.last_error = Some(e.clone());
                st.last_error_at_ms = Some(now);
                tracing::warn!(error = %crate::logsafe::Escaped(&e.to_string()), "access token refresh failed");
                drop(st);
                self.unexpired(&slot, now).ok_or(e)
            }
        }
    }

    /// The token held and its generation, if it has not expired at `now` (it may be due for
    /// refresh).
    fn unexpired(&self, slot: &Slot, now: u64) -> Option<(String, u64)> {
        let until = self.state.lock().valid_until_ms?;
        let t = slot.token.as_ref()?;
        (now < until).then(|| (t.value.clone(), slot.generation))
    }

    /// The platform refused the token of `generation`: drop it, unless a newer one is already
    /// there. The next [`TokenCache::get`] fetches.
    pub async fn refused(&self, generation: u64) {
        let mut slot = self.slot.lock().await;
        if slot.generation == generation {
            slot.token = None;
            slot.failed = None;
            self.state.lock().valid_until_ms = None;
        }
    }

    /// The token and its lifetime from an answer of the token endpoint.
    fn parse(&self, status: u16, body: &[u8], _now: u64) -> Result<(String, u64), String> {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let token = json
            .as_ref()
            .and_then(|j| j.pointer(&self.spec.json))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            // Say why, from the platform's own code and message; never echo a whole answer
            // (it could hold a token under another name).
            let j = json.as_ref();
            let code = j
                .zip(self.spec.code_json.as_deref())
                .and_then(|(j, p)| j.pointer(p))
                .map(|v| one_line(&v.to_string(), 40));
            let msg = j
                .zip(self.spec.message_json.as_deref())
                .and_then(|(j, p)| j.pointer(p))
                .and_then(Value::as_str)
                .map(|m| one_line(m, 200));
            let why = match (code, msg) {
                (Some(c), Some(m)) => format!("platform code {c}: {m}"),
                (Some(c), None) => format!("platform code {c}"),
                (None, _) if json.is_none() => "answer is not JSON".to_string(),
                (None, _) => format!("no {} in the answer", self.spec.json),
            };
            return Err(format!("token endpoint answered HTTP {status}: {why}"));
        };
        let lifetime_ms = json
            .as_ref()
            .zip(self.spec.expires_json.as_deref())
            .and_then(|(j, p)| j.pointer(p))
            .and_then(|v| match v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse().ok(),
                _ => None,
            })
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| (s * 1000.0).min(365.0 * 86_400_000.0) as u64)
            .unwrap_or(self.spec.lifetime_ms)
            .max(1_000);
        Ok((token.to_string(), lifetime_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn spec() -> TokenSpec {
        TokenSpec {
            method: "GET".into(),
            url: "http://x/gettoken?corpsecret=S".into(),
            body: None,
            json: "/access_token".into(),
            expires_json: Some("/expires_in".into()),
            refresh_codes: vec![42001],
            lifetime_ms: 3_600_000,
            code_json: Some("/errcode".into()),
            message_json: Some("/errmsg".into()),
        }
    }

    #[tokio::test]
    async fn single_flight_refresh_and_generations() {
        let cache = Arc::new(TokenCache::new(spec()));
        let fetches = Arc::new(AtomicU64::new(0));
        let now = Arc::new(AtomicU64::new(1_000_000));
        let get = |cache: Arc<TokenCache>, fetches: Arc<AtomicU64>, now: Arc<AtomicU64>| async move {
            let n = now.clone();
            cache
                .get(
                    move || n.load(Ordering::SeqCst),
                    || async move {
                        let i = fetches.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::task::yield_now().await;
                        Ok((
                            200,
                            format!(r#"{{"errcode":0,"access_token":"T{i}","expires_in":7200}}"#)
                                .into_bytes(),
                        ))
                    },
                )
                .await
        };
        let mut joins = Vec::new();
        for _ in 0..20 {
            joins.push(tokio::spawn(get(
                cache.clone(),
                fetches.clone(),
                now.clone(),
            )));
        }
        for j in joins {
            assert_eq!(j.await.unwrap().unwrap(), ("T1".to_string(), 1));
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        // Refused twice with generation 1: one refresh.
        cache.refused(1).await;
        cache.refused(1).await;
        assert_eq!(
            get(cache.clone(), fetches.clone(), now.clone())
                .await
                .unwrap(),
            ("T2".into(), 2)
        );
        cache.refused(1).await;
        assert_eq!(
            get(cache.clone(), fetches.clone(), now.clone())
                .await
                .unwrap(),
            ("T2".into(), 2)
        );
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // Early refresh: 7200 s lifetime, refreshed 5 minutes before the end.
        now.fetch_add(7_200_000 - 300_000 - 1, Ordering::SeqCst);
        assert_eq!(
            get(cache.clone(), fetches.clone(), now.clone())
                .await
                .unwrap()
                .0,
            "T2"
        );
        now.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            get(cache.clone(), fetches.clone(), now.clone())
                .await
                .unwrap()
                .0,
            "T3"
        );
        let st = cache.state();
        assert_eq!(st.refreshes, 3);
        assert_eq!(st.last_error, None);
    }

    #[tokio::test]
    async fn failures_are_readable_and_paused() {
        let cache = TokenCache::new(spec());
        let fetches = AtomicU64::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Ok((
                200,
                br#"{"errcode":40001,"errmsg":"invalid credential"}"#.to_vec(),
            ))
        };
        let e = cache.get(|| 5_000, fetch).await.unwrap_err();
        assert_eq!(
            e,
            "token endpoint answered HTTP 200: platform code 40001: invalid credential"
        );
        let e2 = cache.get(|| 5_500, fetch).await.unwrap_err();
        assert_eq!(e, e2);
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "paused after a failure");
        cache.get(|| 6_000, fetch).await.unwrap_err();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        assert_eq!(cache.state().last_error.as_deref(), Some(e.as_str()));
        let e = cache
            .get(|| 9_000, || async { Err("connection refused".to_string()) })
            .await
            .unwrap_err();
        assert_eq!(e, "token endpoint: connection refused");
        assert!(!format!("{:?}", cache.spec).contains("corpsecret"));
    }

    /// A refresh that fails while the token is due for refresh but not expired: every send
    /// in the pause after it still gets the old token, not only the one whose fetch failed.
    #[tokio::test]
    async fn a_failed_early_refresh_keeps_serving_the_unexpired_token() {
        let cache = TokenCache::new(spec());
        let ok = || async {
            Ok((
                200,
                br#"{"errcode":0,"access_token":"T1","expires_in":7200}"#.to_vec(),
            ))
        };
        let down = || async { Err("timed out".to_string()) };
        assert_eq!(cache.get(|| 0, ok).await.unwrap(), ("T1".into(), 1));
        // 7200 s lifetime, due for refresh 5 minutes before its end.
        let due = 7_200_000 - 300_000;
        assert_eq!(cache.get(|| due + 1, down).await.unwrap(), ("T1".into(), 1));
        assert_eq!(
            cache.get(|| due + 500, down).await.unwrap(),
            ("T1".into(), 1)
        );
        // Expired: the failure is the answer.
        let e = cache.get(|| 7_200_000, down).await.unwrap_err();
        assert_eq!(e, "token endpoint: timed out");
    }
}
