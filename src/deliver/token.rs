//! Access tokens of platform channels (WeCom app messages and the like).
//!
//! A channel with a `token` endpoint fetches a token, keeps it in memory (never on disk, never
//! logged, never shown), and uses it as `{{ token }}` in its templates. It is refreshed before
//! it expires (within the last tenth of its lifetime, at most 5 minutes early) and when an
//! answer carries a refresh code (WeCom `42001` expired, `40014` invalid).
//!
//! Single flight: a fetch holds an async mutex of its own, so however many sends find the
//! token missing or refused at once, one request goes to the token endpoint and the others wait
//! for its result (each no longer than its own budget). The token itself is read without
//! waiting: while an early refresh is under way, sends keep using the unexpired token, so a
//! slow or silent token endpoint does not stall them (and open the breaker) while the token
//! is still good. A refused token is dropped only if it is still the one the
//! refusing send used (its generation), so sends that were refused the same old token do not
//! cause a second refresh. After a failed fetch, sends within [`FAILED_FETCH_PAUSE_MS`] get
//! the same error without asking the endpoint again.

use std::future::Future;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::time::Instant;

use super::success::one_line;

/// How long a failed fetch is remembered before the endpoint is asked again.
pub const FAILED_FETCH_PAUSE_MS: u64 = 1_000;
/// Longest token accepted.
const TOKEN_BYTES_MAX: usize = 4096;
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

/// Shortest budget worth a fetch. With less left, a fetch could only time out: it would record
/// a failure of an endpoint that was never given a chance and pause every send's fetches for
/// [`FAILED_FETCH_PAUSE_MS`].
pub const FETCH_BUDGET_MIN: Duration = Duration::from_millis(50);

pub struct TokenCache {
    pub spec: TokenSpec,
    /// The token, its generation and the last failure. Locked only briefly, never across an
    /// await: a send finds a usable token without waiting for a fetch under way.
    slot: Mutex<Slot>,
    /// Held by the one fetch under way (single flight); waited for only by sends that have no
    /// unexpired token to use meanwhile.
    fetching: tokio::sync::Mutex<()>,
    state: Mutex<TokenState>,
}

impl TokenCache {
    pub fn new(spec: TokenSpec) -> TokenCache {
        TokenCache {
            spec,
            slot: Mutex::new(Slot {
                token: None,
                generation: 0,
                failed: None,
            }),
            fetching: tokio::sync::Mutex::new(()),
            state: Mutex::new(TokenState::default()),
        }
    }

    pub fn state(&self) -> TokenState {
        self.state.lock().clone()
    }

    /// The current token and its generation, fetching one (once, for all waiters) when there
    /// is none or it is due for refresh. `fetch` performs the request and returns the answer's
    /// status and body. `deadline` is the end of the caller's budget: a send never waits past
    /// it for another send's fetch, and starts no fetch with less than [`FETCH_BUDGET_MIN`] of
    /// it left. While a refresh is under way, a token that has not expired serves at once.
    pub async fn get<F, Fut>(
        &self,
        now_ms: impl Fn() -> u64,
        deadline: Instant,
        fetch: F,
    ) -> Result<(String, u64), String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(u16, Vec<u8>), String>>,
    {
        if let Some(r) = self.cached(now_ms()) {
            return r;
        }
        let guard = match self.fetching.try_lock() {
            Ok(g) => g,
            Err(_) => {
                // Another send is fetching (an early refresh, say): the token it is replacing
                // serves until it expires; without one, wait for that fetch's result.
                let held = self.unexpired(&self.slot.lock(), now_ms());
                if let Some(t) = held {
                    return Ok(t);
                }
                match tokio::time::timeout_at(deadline, self.fetching.lock()).await {
                    Ok(g) => g,
                    Err(_) => return Err("timed out waiting for the token endpoint".into()),
                }
            }
        };
        // The fetch this send waited for may have brought a token, or just failed.
        if let Some(r) = self.cached(now_ms()) {
            return r;
        }
        if deadline.saturating_duration_since(Instant::now()) < FETCH_BUDGET_MIN {
            // Not the endpoint's fault: nothing recorded, no pause.
            let held = self.unexpired(&self.slot.lock(), now_ms());
            return held.ok_or_else(|| "no time left in this attempt to fetch it".into());
        }
        // An early refresh (the token still serves): the send that starts it keeps half its
        // budget for its own request, so a silent endpoint costs it a late send, not the send
        // (on a quiet channel every send of the refresh window would otherwise fail).
        let early = self.unexpired(&self.slot.lock(), now_ms()).is_some();
        let fetched = if early {
            let half = Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2;
            tokio::time::timeout_at(half, fetch())
                .await
                .unwrap_or_else(|_| {
                    Err("timed out (an early refresh keeps half the attempt for its send)".into())
                })
        } else {
            fetch().await
        };
        let result = match fetched {
            Ok((status, body)) => self.parse(status, &body, now_ms()),
            Err(e) => Err(format!("token endpoint: {e}")),
        };
        let r = self.store(result, now_ms());
        drop(guard);
        r
    }

    /// What a send gets without fetching: the token if it is not due for refresh, or in the
    /// pause after a failed fetch, that failure (or a token due for refresh but unexpired,
    /// which still serves as it did for the send whose fetch failed). `None`: fetch.
    fn cached(&self, now: u64) -> Option<Result<(String, u64), String>> {
        let slot = self.slot.lock();
        if let Some(t) = &slot.token {
            if now < t.refresh_at_ms {
                return Some(Ok((t.value.clone(), slot.generation)));
            }
        }
        let (at, e) = slot.failed.as_ref()?;
        (now < at.saturating_add(FAILED_FETCH_PAUSE_MS))
            .then(|| self.unexpired(&slot, now).ok_or_else(|| e.clone()))
    }

    /// Keeps the result of a fetch that ended at `now`.
    fn store(
        &self,
        result: Result<(String, u64), String>,
        now: u64,
    ) -> Result<(String, u64), String> {
        let mut slot = self.slot.lock();
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
    /// there. The next [`TokenCache::get`] fetches (or waits for the fetch under way).
    pub fn refused(&self, generation: u64) {
        let mut slot = self.slot.lock();
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
        // The token goes into URLs and headers: one that cannot be rendered there would fail
        // every message permanently for its whole lifetime. Refused as a failed fetch
        // (retried), without echoing it.
        if token.len() > TOKEN_BYTES_MAX || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "token endpoint answered HTTP {status}: {} is not a token (visible ASCII, at most {TOKEN_BYTES_MAX} bytes)",
                self.spec.json
            ));
        }
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

    /// A budget no test reaches.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

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
                    far(),
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
        cache.refused(1);
        cache.refused(1);
        assert_eq!(
            get(cache.clone(), fetches.clone(), now.clone())
                .await
                .unwrap(),
            ("T2".into(), 2)
        );
        cache.refused(1);
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
        let e = cache.get(|| 5_000, far(), fetch).await.unwrap_err();
        assert_eq!(
            e,
            "token endpoint answered HTTP 200: platform code 40001: invalid credential"
        );
        let e2 = cache.get(|| 5_500, far(), fetch).await.unwrap_err();
        assert_eq!(e, e2);
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "paused after a failure");
        cache.get(|| 6_000, far(), fetch).await.unwrap_err();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        assert_eq!(cache.state().last_error.as_deref(), Some(e.as_str()));
        let e = cache
            .get(
                || 9_000,
                far(),
                || async { Err("connection refused".to_string()) },
            )
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
        assert_eq!(cache.get(|| 0, far(), ok).await.unwrap(), ("T1".into(), 1));
        // 7200 s lifetime, due for refresh 5 minutes before its end.
        let due = 7_200_000 - 300_000;
        assert_eq!(
            cache.get(|| due + 1, far(), down).await.unwrap(),
            ("T1".into(), 1)
        );
        assert_eq!(
            cache.get(|| due + 500, far(), down).await.unwrap(),
            ("T1".into(), 1)
        );
        // Expired: the failure is the answer.
        let e = cache.get(|| 7_200_000, far(), down).await.unwrap_err();
        assert_eq!(e, "token endpoint: timed out");
    }

    fn answer(token: &str, expires_in: u64) -> Result<(u16, Vec<u8>), String> {
        Ok((
            200,
            format!(r#"{{"errcode":0,"access_token":"{token}","expires_in":{expires_in}}}"#)
                .into_bytes(),
        ))
    }

    /// An early refresh stuck on a silent token endpoint: other sends still get the unexpired
    /// token at once (before, they queued behind the fetch until their own budget ran out).
    #[tokio::test]
    async fn a_pending_early_refresh_does_not_hold_other_sends() {
        let cache = Arc::new(TokenCache::new(spec()));
        let now = Arc::new(AtomicU64::new(0));
        let n = now.clone();
        let clock = move || n.load(Ordering::SeqCst);
        let got = cache.get(clock.clone(), far(), || async { answer("T1", 100) });
        assert_eq!(got.await.unwrap(), ("T1".into(), 1));
        // 100 s lifetime: due for refresh after 90 s.
        now.store(95_000, Ordering::SeqCst);
        let release = Arc::new(tokio::sync::Notify::new());
        let fetches = Arc::new(AtomicU64::new(0));
        let first = tokio::spawn({
            let (cache, clock, release, fetches) = (
                cache.clone(),
                clock.clone(),
                release.clone(),
                fetches.clone(),
            );
            async move {
                let fetch = || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    answer("T2", 100)
                };
                cache.get(clock, far(), fetch).await
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while fetches.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the first fetch never started");
            tokio::task::yield_now().await;
        }
        let second_fetched = Arc::new(AtomicU64::new(0));
        let sf = second_fetched.clone();
        let second = cache.get(clock.clone(), far(), || async move {
            sf.fetch_add(1, Ordering::SeqCst);
            Err("a second fetch while one is under way".to_string())
        });
        let second = tokio::time::timeout(Duration::from_secs(2), second).await;
        assert_eq!(
            second.expect("held behind the pending refresh").unwrap(),
            ("T1".into(), 1)
        );
        assert_eq!(
            second_fetched.load(Ordering::SeqCst),
            0,
            "a second fetch ran beside the first (single flight broken)"
        );
        release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), ("T2".into(), 2));
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    /// The send that starts an early refresh against a silent endpoint gives up on the fetch
    /// at half its budget and sends with the token that still serves.
    #[tokio::test]
    async fn an_early_refresh_keeps_half_the_budget_for_its_send() {
        let cache = TokenCache::new(spec());
        let now = Arc::new(AtomicU64::new(0));
        let n = now.clone();
        let clock = move || n.load(Ordering::SeqCst);
        let got = cache.get(clock.clone(), far(), || async { answer("T1", 100) });
        assert_eq!(got.await.unwrap(), ("T1".into(), 1));
        now.store(95_000, Ordering::SeqCst);
        let budget = Duration::from_millis(400);
        let deadline = Instant::now() + budget;
        let silent = || std::future::pending::<Result<(u16, Vec<u8>), String>>();
        let got = tokio::time::timeout(budget, cache.get(clock.clone(), deadline, silent)).await;
        assert_eq!(
            got.expect("the fetch took the whole budget").unwrap(),
            ("T1".into(), 1)
        );
        assert!(
            deadline.saturating_duration_since(Instant::now()) >= Duration::from_millis(100),
            "less than half the budget left for the send"
        );
        assert!(
            cache.state.lock().last_error.is_some(),
            "the timeout recorded"
        );
    }

    /// Without a usable token, a send waits for the fetch under way no longer than its own
    /// budget; and a send with too little budget left fetches nothing and records nothing.
    #[tokio::test]
    async fn waits_and_fetches_are_bounded_by_the_budget() {
        let cache = Arc::new(TokenCache::new(spec()));
        let release = Arc::new(tokio::sync::Notify::new());
        let first = tokio::spawn({
            let (cache, release) = (cache.clone(), release.clone());
            async move {
                let fetch = || async move {
                    release.notified().await;
                    answer("T1", 7200)
                };
                cache.get(|| 0, far(), fetch).await
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while cache.fetching.try_lock().is_ok() {
            assert!(Instant::now() < deadline, "the first fetch never started");
            tokio::task::yield_now().await;
        }
        let soon = Instant::now() + Duration::from_millis(100);
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            cache.get(|| 0, soon, || async { answer("X", 7200) }),
        )
        .await
        .expect("waited past its budget");
        assert_eq!(
            waited.unwrap_err(),
            "timed out waiting for the token endpoint"
        );
        release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), ("T1".into(), 1));

        // No budget left: no fetch, no failure recorded, no pause for the next send.
        let cache = TokenCache::new(spec());
        let fetches = AtomicU64::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            answer("T1", 7200)
        };
        let e = cache.get(|| 0, Instant::now(), fetch).await.unwrap_err();
        assert_eq!(e, "no time left in this attempt to fetch it");
        assert_eq!(fetches.load(Ordering::SeqCst), 0);
        assert_eq!(cache.state().last_error, None);
        assert_eq!(
            cache.get(|| 1, far(), fetch).await.unwrap(),
            ("T1".into(), 1)
        );
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    /// A token that could not go into a header or URL is a failed fetch, not a token that
    /// fails every message permanently; the error does not echo it.
    #[test]
    fn a_token_must_be_visible_ascii_of_bounded_length() {
        let cache = TokenCache::new(spec());
        let parse = |token: &str| {
            let body = serde_json::json!({"access_token": token, "expires_in": 7200});
            cache.parse(200, body.to_string().as_bytes(), 0)
        };
        assert_eq!(parse("abc-DEF_1.2~x").unwrap().0, "abc-DEF_1.2~x");
        assert_eq!(parse(&"a".repeat(4096)).unwrap().0.len(), 4096);
        for bad in [
            "abc\ndef",
            "abc def",
            "tökén",
            "abc\u{7f}",
            &"a".repeat(4097),
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(
                e,
                "token endpoint answered HTTP 200: /access_token is not a token (visible ASCII, at most 4096 bytes)"
            );
        }
    }
}
