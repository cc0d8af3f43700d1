//! The inbox's wake-up (HA.md "Creates and commands on any node"): one unpooled connection
//! that `LISTEN`s on `herald_inbox` and wakes the engine's inbox drain
//! (`engine/cluster.rs::drain_inbox`) on every notification. The `NOTIFY` is sent once per
//! commit group that wrote an inbox row (`store/pg/backend.rs`).
//!
//! The drain keeps its own timer as the floor (HA.md: at least every 500 ms), so this
//! connection only makes a create through the inbox quick; nothing is lost while it is down.
//! A notification that arrives while nobody waits leaves a permit on the [`Notify`], so one
//! between two drains is never missed, and many coalesce into one drain.
//!
//! Lost connections: a closed or failed one ends its session at once; one the network dropped
//! silently (no FIN, no RST) is found by a ping every [`PING_EVERY`] that must answer within
//! [`PING_WITHIN`]. Then it is made again after a doubling wait (`store/pg/backoff.rs`), and
//! once listening again the drain is woken: rows written while nobody listened are read now.
//! Everything here is async on the process's runtime: no tokio worker blocks on IO.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::pg::backoff::Backoff;

/// The channel `store/pg/backend.rs` notifies.
pub const CHANNEL: &str = "herald_inbox";
/// The connection's `application_name`, so an operator (or a test) can find it in
/// `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "herald inbox listener";
/// How often the connection is checked while nothing arrives.
pub const PING_EVERY: Duration = Duration::from_secs(5);
/// How long a ping (and the connect and the `LISTEN`) may take before the connection is
/// given up as lost.
pub const PING_WITHIN: Duration = Duration::from_secs(5);

/// Where to listen.
#[derive(Clone)]
pub struct Settings {
    pub url: String,
    /// `HERALD_STORE_PASSWORD`/`PGPASSWORD`, when the URL has none.
    pub password: Option<String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings").finish_non_exhaustive()
    }
}

/// Listens until `stopped` turns true or the engine (the owner of `wake`) is gone, making
/// the connection again whenever it is lost.
pub async fn run(s: Settings, wake: Weak<Notify>, mut stopped: watch::Receiver<bool>) {
    let mut fails = 0u32;
    loop {
        if *stopped.borrow() || wake.strong_count() == 0 {
            return;
        }
        let why = match session(&s, &wake, &mut stopped, &mut fails).await {
            Ended::Stopped => return,
            Ended::Lost(why) => why,
        };
        fails = fails.saturating_add(1);
        let wait = Backoff::delay(fails);
        tracing::warn!(error = %why, retry_in_ms = wait.as_millis() as u64,
            "inbox LISTEN connection lost; the inbox is read on its timer meanwhile");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = stopped.changed() => if r.is_err() {
                return; // the server is gone
            },
        }
    }
}

enum Ended {
    Stopped,
    Lost(String),
}

/// Aborts the connection's task when the session ends, however it ends.
struct Driver(tokio::task::JoinHandle<Result<(), String>>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One connection: connect, `LISTEN`, wake the drain once, then wake it on each notification
/// until the connection is lost or the process stops. `fails` is reset once listening.
async fn session(
    s: &Settings,
    wake: &Weak<Notify>,
    stopped: &mut watch::Receiver<bool>,
    fails: &mut u32,
) -> Ended {
    let mut cfg = match s.url.parse::<tokio_postgres::Config>() {
        Ok(c) => c,
        Err(e) => return Ended::Lost(format!("the store URL does not parse: {e}")),
    };
    if let (None, Some(p)) = (cfg.get_password(), &s.password) {
        cfg.password(p.as_bytes());
    }
    cfg.application_name(APPLICATION_NAME);
    let (client, mut conn) = match tokio::time::timeout(PING_WITHIN, cfg.connect(NoTls)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Ended::Lost(error_text(&e)),
        Err(_) => return Ended::Lost("connect timed out".into()),
    };
    // The connection's own task reads every message; only notifications matter here (a
    // `Connection` awaited as a plain future drops them).
    let w = wake.clone();
    let mut driver = Driver(tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => match w.upgrade() {
                    Some(n) => n.notify_one(),
                    None => return Ok(()),
                },
                Some(Ok(_)) => {} // a notice
                Some(Err(e)) => return Err(error_text(&e)),
                None => return Err("the server closed the connection".into()),
            }
        }
    }));
    let listen = format!("LISTEN {CHANNEL}");
    match tokio::time::timeout(PING_WITHIN, client.batch_execute(&listen)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Ended::Lost(format!("LISTEN failed: {}", error_text(&e))),
        Err(_) => return Ended::Lost("LISTEN timed out".into()),
    }
    *fails = 0;
    tracing::info!(channel = CHANNEL, "inbox LISTEN connection up");
    // Rows written while nobody listened (start-up, a reconnect) are read now.
    if let Some(n) = wake.upgrade() {
        n.notify_one();
    }
    loop {
        tokio::select! {
            r = &mut driver.0 => return match r {
                Ok(Ok(())) => Ended::Stopped, // the engine is gone
                Ok(Err(e)) => Ended::Lost(e),
                Err(e) => Ended::Lost(e.to_string()),
            },
            _ = tokio::time::sleep(PING_EVERY) => {
                if wake.strong_count() == 0 {
                    return Ended::Stopped;
                }
                match tokio::time::timeout(PING_WITHIN, client.batch_execute("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Ended::Lost(format!("ping failed: {}", error_text(&e))),
                    Err(_) => return Ended::Lost("ping unanswered".into()),
                }
            }
            _ = stopped.changed() => return Ended::Stopped,
        }
    }
}

/// The server's own words when it sent an error (`db error` alone says nothing).
fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {}", d.code().code(), d.message()),
        None => e.to_string(),
    }
}

/// Starts [`run`] on the current runtime.
pub fn start(
    s: Settings,
    wake: &Arc<Notify>,
    stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(s, Arc::downgrade(wake), stopped))
}
