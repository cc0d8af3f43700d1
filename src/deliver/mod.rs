//! Channels: where messages go. A channel is operator-configured (never a raw URL in a task)
//! and has a sink — `log`, `file` (JSON lines) or `webhook` — plus its own timeout, default
//! retry policy and concurrency cap.
//!
//! Sinks turn one [`Delivery`] into an [`Outcome`]; they never touch the store and never
//! decide about retries beyond classifying what happened (the run's cursor does that).

pub mod backoff;
pub mod breaker;
pub mod classify;
pub mod file;
pub mod ratelimit;
pub mod sign;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::Semaphore;

use crate::model::{Outcome, RetryPolicy};

/// One attempt to hand one message to a channel.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub task_id: String,
    pub run: u32,
    pub seq: u32,
    pub to: String,
    pub body: String,
    /// RFC 3339 UTC instant this message was due.
    pub scheduled_at: String,
    pub attempt: u32,
    pub idempotency_key: String,
    /// RFC 3339 UTC instant (ms) this attempt started: lets a receiver see herald's own pacing.
    pub sent_at: String,
}

/// Where a channel sends.
pub enum Sink {
    /// Writes each delivery to the log (tracing, target `herald::delivery`). Always succeeds.
    Log,
    File(file::FileSink),
    Webhook(webhook::WebhookSink),
}

pub struct Channel {
    pub name: String,
    pub sink: Sink,
    /// Default retry policy for tasks on this channel that do not bring their own.
    pub retry: RetryPolicy,
    /// Caps sends in flight at once on this channel.
    pub concurrency: Arc<Semaphore>,
    pub concurrency_max: usize,
}

impl Channel {
    pub fn kind(&self) -> &'static str {
        match self.sink {
            Sink::Log => "log",
            Sink::File(_) => "file",
            Sink::Webhook(_) => "webhook",
        }
    }

    /// Delivers once; waits for a concurrency permit first.
    pub async fn send(&self, d: &Delivery, now_ms: impl Fn() -> u64) -> Outcome {
        let _permit = match self.concurrency.acquire().await {
            Ok(p) => p,
            Err(_) => {
                return Outcome::Retry {
                    error: "channel closed".into(),
                    not_before_ms: None,
                }
            }
        };
        match &self.sink {
            Sink::Log => {
                tracing::info!(target: "herald::delivery", channel = %self.name, task = %d.task_id,
                    run = d.run, seq = d.seq, to = %d.to, attempt = d.attempt, body = %d.body, "delivered to log");
                Outcome::Sent
            }
            Sink::File(f) => f.write(d).await,
            Sink::Webhook(w) => w.post(d, now_ms).await,
        }
    }
}

/// The configured channels by name. `log` always exists.
#[derive(Clone)]
pub struct Channels {
    map: Arc<BTreeMap<String, Arc<Channel>>>,
}

impl Channels {
    pub fn new(list: Vec<Channel>) -> Channels {
        let mut map = BTreeMap::new();
        for c in list {
            map.insert(c.name.clone(), Arc::new(c));
        }
        map.entry("log".to_string()).or_insert_with(|| {
            Arc::new(Channel {
                name: "log".into(),
                sink: Sink::Log,
                retry: RetryPolicy::default(),
                concurrency: Arc::new(Semaphore::new(64)),
                concurrency_max: 64,
            })
        });
        Channels { map: Arc::new(map) }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Channel>> {
        self.map.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Channel>> {
        self.map.values()
    }
}
