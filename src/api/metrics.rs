//! `GET /metrics`: Prometheus text exposition of herald's counters and gauges.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::deliver::breaker::BreakerState;
use crate::engine::Engine;

/// Label values are channel names ([A-Za-z0-9._:-], checked by config): nothing to escape.
pub fn render(engine: &Engine) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    metric(
        "herald_ready",
        "gauge",
        "1 once start-up recovery is done.",
        vec![(String::new(), u64::from(engine.is_ready()))],
    );
    metric(
        "herald_live_index_loading",
        "gauge",
        "1 while start-up still loads the live index in the background (after ready).",
        vec![(String::new(), u64::from(engine.index_loading()))],
    );
    metric(
        "herald_tasks_live",
        "gauge",
        "Tasks that are pending, running or paused.",
        vec![(String::new(), engine.live_tasks() as u64)],
    );
    let (raised, failed) = engine.alert_counts();
    metric(
        "herald_alerts_total",
        "counter",
        "Alerts raised (failure list entries, breaker transitions).",
        vec![(String::new(), raised)],
    );
    metric(
        "herald_alert_deliveries_failed_total",
        "counter",
        "Alerts that could not be delivered to the alert channel.",
        vec![(String::new(), failed)],
    );
    let stats = engine.store().commit_stats();
    metric(
        "herald_store_flushes_total",
        "counter",
        "Durable flushes (sled flush + fdatasync) done by the group commit.",
        vec![(String::new(), stats.flushes.load(Ordering::Relaxed))],
    );
    metric(
        "herald_store_flush_waiters_total",
        "counter",
        "Writes made durable by those flushes (waiters / flushes = batching).",
        vec![(String::new(), stats.waiters.load(Ordering::Relaxed))],
    );
    metric(
        "herald_store_busy_microseconds_total",
        "counter",
        "Time the commit thread spent applying and flushing groups (busy / flushes = mean flush).",
        vec![(String::new(), stats.busy_us.load(Ordering::Relaxed))],
    );
    metric(
        "herald_store_write_failures_total",
        "counter",
        "Write groups the storage refused (apply or flush failed).",
        vec![(String::new(), stats.failures.load(Ordering::Relaxed))],
    );
    metric(
        "herald_store_group_max",
        "gauge",
        "Largest number of writers made durable by one flush since start.",
        vec![(String::new(), stats.group_max.load(Ordering::Relaxed))],
    );
    metric(
        "herald_store_queue",
        "gauge",
        "Writes waiting for the commit thread now.",
        vec![(String::new(), engine.store().queued() as u64)],
    );
    metric(
        "herald_storage_failing",
        "gauge",
        "1 while storage fails (writes refused with 503, no new sends; /healthz 503).",
        vec![(String::new(), u64::from(engine.storage_failing().is_some()))],
    );
    let channels: Vec<_> = engine.channels().iter().cloned().collect();
    let per = |f: &dyn Fn(&crate::deliver::Channel) -> Vec<(String, u64)>| {
        channels.iter().flat_map(|c| f(c)).collect::<Vec<_>>()
    };
    metric(
        "herald_channel_attempts_total",
        "counter",
        "Delivery attempts by channel and outcome.",
        per(&|c| {
            let s = &c.stats;
            [
                ("sent", &s.sent),
                ("retryable", &s.retryable_failures),
                ("permanent", &s.permanent_failures),
            ]
            .into_iter()
            .map(|(o, v)| {
                (
                    format!("{{channel=\"{}\",outcome=\"{o}\"}}", c.name),
                    v.load(Ordering::Relaxed),
                )
            })
            .collect()
        }),
    );
    metric(
        "herald_channel_held_total",
        "counter",
        "Sends held by the rate limit, an open breaker or a local resource shortage (put back on the wheel).",
        per(&|c| {
            vec![(
                format!("{{channel=\"{}\"}}", c.name),
                c.stats.held.load(Ordering::Relaxed),
            )]
        }),
    );
    metric(
        "herald_channel_held_local_total",
        "counter",
        "Sends held because this host ran out of a resource (too many open files, no buffer space): no attempt counted, breaker not told.",
        per(&|c| {
            vec![(
                format!("{{channel=\"{}\"}}", c.name),
                c.stats.held_local.load(Ordering::Relaxed),
            )]
        }),
    );
    metric(
        "herald_channel_in_flight",
        "gauge",
        "Sends in flight.",
        per(&|c| vec![(format!("{{channel=\"{}\"}}", c.name), c.in_flight() as u64)]),
    );
    metric(
        "herald_channel_breaker_open",
        "gauge",
        "1 while the channel's breaker is open or half-open.",
        per(&|c| match c.breaker_state() {
            Some(s) => vec![(
                format!("{{channel=\"{}\"}}", c.name),
                u64::from(s != BreakerState::Closed),
            )],
            None => vec![],
        }),
    );
    let (rows, sum, count) = engine.lateness().snapshot();
    {
        let name = "herald_send_lateness_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} How late sends start: from the instant the schedule (or pacing) planned the message to the start of its attempt."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (le, c) in rows {
            let le = le.map_or("+Inf".to_string(), |ms| format!("{}", ms as f64 / 1000.0));
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_sum {}", sum as f64 / 1000.0);
        let _ = writeln!(out, "{name}_count {count}");
    }
    out
}
