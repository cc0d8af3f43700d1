//! The cluster history checker (issue 24, HA.md "Tests"): a pure function over what a nemesis
//! run recorded — acknowledged creates, cancels with the instant their answer came back, every
//! delivery the receiver saw, the failure list, and the epochs sampled per shard — answering
//! every violation of the cluster's promises as one line. No IO and no clock here, so the
//! checker itself is tested on hand-made histories (`tests/history_check.rs`), good and bad.
//!
//! Instants are Unix milliseconds: the receiver's arrival clock and the test's clock for
//! answers are the same machine's wall clock.

use std::collections::{BTreeMap, HashMap, HashSet};

/// One message an acknowledged create promises: its idempotency key (`task:run:seq`), when it
/// is due, and the shard its task lives on.
#[derive(Clone, Debug)]
pub struct Expected {
    pub key: String,
    pub due_ms: f64,
    pub shard: u32,
}

/// One request the receiver saw.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub key: String,
    /// The `herald-epoch` header, where the delivery carried one.
    pub epoch: Option<u64>,
    /// Arrival at the receiver.
    pub at_ms: f64,
    /// When the receiver's answer went back, if recorded: with `at_ms`, the attempt's span.
    pub done_ms: Option<f64>,
}

/// A cancel whose 2xx answer came back at `answered_ms`.
#[derive(Clone, Debug)]
pub struct Cancel {
    pub task: String,
    pub answered_ms: f64,
}

/// Everything a run recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub expected: Vec<Expected>,
    pub deliveries: Vec<Delivery>,
    pub cancels: Vec<Cancel>,
    /// Keys in the failure list at the end.
    pub failed: HashSet<String>,
    /// `(shard, epoch)` samples in the order they were taken (from `/v1/cluster`).
    pub epochs: Vec<(u32, u64)>,
    /// `[cluster] max_clock_offset`.
    pub max_clock_offset_ms: f64,
    /// What the measurement itself may be off by: a request in flight when a cancel answered
    /// may arrive just after it; two clocks read by two processes.
    pub slack_ms: f64,
}

/// The task id of an idempotency key `task:run:seq`.
pub fn task_of(key: &str) -> &str {
    key.split(':').next().unwrap_or(key)
}

/// `(task:run, seq)` of an idempotency key, where it has that shape.
fn run_seq(key: &str) -> Option<(&str, u64)> {
    let (run, seq) = key.rsplit_once(':')?;
    Some((run, seq.parse().ok()?))
}

/// Every violation in `h`, one line each; empty when the history keeps every promise.
pub fn check(h: &History) -> Vec<String> {
    let mut out = Vec::new();
    let cancelled: HashMap<&str, f64> = h
        .cancels
        .iter()
        .map(|c| (c.task.as_str(), c.answered_ms))
        .collect();
    let mut per_key: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &h.deliveries {
        per_key.entry(d.key.as_str()).or_default().push(d);
    }
    for ds in per_key.values_mut() {
        ds.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    }

    // Epochs per shard: samples never go back, and each distinct epoch is one ownership.
    let mut owners: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for &(shard, epoch) in &h.epochs {
        let seen = owners.entry(shard).or_default();
        if let Some(&last) = seen.last() {
            if epoch < last {
                out.push(format!(
                    "shard {shard}: epoch {epoch} sampled after epoch {last}"
                ));
            }
        }
        if seen.last() != Some(&epoch) {
            seen.push(epoch);
        }
    }

    for e in &h.expected {
        let ds = per_key
            .get(e.key.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let task = task_of(&e.key);
        // 1. Every acknowledged create delivered, in the failure list, or cancelled.
        if ds.is_empty() && !h.failed.contains(&e.key) && !cancelled.contains_key(task) {
            out.push(format!(
                "{}: acknowledged, never delivered, not failed, not cancelled",
                e.key
            ));
        }
        // 2. At most one delivery more per change of owner. Each acquisition raises the
        // epoch by one, so the span of epochs seen (sampled or on a delivery) counts the
        // changes, also those that happened between two samples.
        let seen = owners
            .get(&e.shard)
            .into_iter()
            .flatten()
            .copied()
            .chain(ds.iter().filter_map(|d| d.epoch));
        let (lo, hi) = seen.fold((u64::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let changes = hi.saturating_sub(lo) as usize;
        if ds.len() > 1 + changes {
            out.push(format!(
                "{}: delivered {} times, shard {} changed owner {changes} times",
                e.key,
                ds.len(),
                e.shard
            ));
        }
        // 5. Nothing before it is due, but for the clock offset the cluster allows.
        if let Some(first) = ds.first() {
            let earliest = e.due_ms - h.max_clock_offset_ms - h.slack_ms;
            if first.at_ms < earliest {
                out.push(format!(
                    "{}: arrived {:.0} ms before it was due",
                    e.key,
                    e.due_ms - first.at_ms
                ));
            }
        }
    }

    for (key, ds) in &per_key {
        // 2b. No two attempts of one key at once.
        for w in ds.windows(2) {
            if let Some(done) = w[0].done_ms {
                if w[1].at_ms < done {
                    out.push(format!(
                        "{key}: two attempts overlap ({:.0}..{done:.0} and {:.0})",
                        w[0].at_ms, w[1].at_ms
                    ));
                }
            }
        }
        // 4. A later attempt never carries an older epoch.
        let epochs: Vec<u64> = ds.iter().filter_map(|d| d.epoch).collect();
        if epochs.windows(2).any(|w| w[1] < w[0]) {
            out.push(format!("{key}: epochs go back across attempts: {epochs:?}"));
        }
        // 6. Nothing after a cancel's answer.
        if let Some(&answered) = cancelled.get(task_of(key)) {
            if let Some(late) = ds.iter().find(|d| d.at_ms > answered + h.slack_ms) {
                out.push(format!(
                    "{key}: arrived {:.0} ms after its cancel was answered",
                    late.at_ms - answered
                ));
            }
        }
    }

    // 3. Within a run, each seq first arrives after the one before it.
    let mut runs: HashMap<&str, Vec<(u64, f64)>> = HashMap::new();
    for (key, ds) in &per_key {
        if let Some((run, seq)) = run_seq(key) {
            runs.entry(run).or_default().push((seq, ds[0].at_ms));
        }
    }
    for (run, mut firsts) in runs {
        firsts.sort_by_key(|&(seq, _)| seq);
        for w in firsts.windows(2) {
            if w[1].1 < w[0].1 {
                out.push(format!(
                    "{run}: seq {} arrived before seq {}",
                    w[1].0, w[0].0
                ));
            }
        }
    }
    out.sort();
    out
}

/// Keys delivered more than once among `deliveries` at or after `from_ms`: a rolling SIGTERM
/// restart must leave this empty.
pub fn duplicates_since(deliveries: &[Delivery], from_ms: f64) -> Vec<String> {
    let mut n: HashMap<&str, usize> = HashMap::new();
    for d in deliveries.iter().filter(|d| d.at_ms >= from_ms) {
        *n.entry(d.key.as_str()).or_default() += 1;
    }
    let mut dup: Vec<String> = n
        .into_iter()
        .filter(|(_, c)| *c > 1)
        .map(|(k, _)| k.to_string())
        .collect();
    dup.sort();
    dup
}
