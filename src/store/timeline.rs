//! A task's timeline on disk (tree `timeline`, API.md "Trace and timeline"): one record per
//! event, keyed `task id ‖ 0x00 ‖ seq (u64 big-endian)`, so a prefix scan reads one task's
//! events in order and never another's (ids hold no 0x00).
//!
//! Events are written as ops of the batch that records their step ([`super::Batch::timeline`]),
//! so an event is durable exactly when its step is. Their `seq` is given here, at
//! [`super::Store::write`], from a per-task counter kept in memory ([`Seqs`]): a task's writes
//! are made under its lock, one after another, so the counter is read from disk (the task's
//! first and last keys) once per task, when it is first met, never per write. A write that
//! fails forgets the task's counter, which is read again next time, so seqs only grow (a
//! failed write may leave a gap; nothing relies on seqs being dense).
//!
//! A task keeps at most `[store] timeline_max` events: each write deletes the oldest keys
//! below `next - timeline_max`, blindly (no read), at most [`TRIM_PER_WRITE`] beyond one per
//! new event, so lowering the bound catches up over a few writes and no write grows without
//! bound. `timeline_max = 0` writes no events at all (the delivery bench's "off").
//!
//! The record is [`TimelineRecord`], a frozen on-disk type converted explicitly to and from
//! the model's [`TimelineEvent`]: the model may change its shape; the disk keeps `V1` readable.
//! The detail is kept as JSON text because bincode cannot decode a self-describing value.
//!
//! In cluster mode (several nodes on one PostgreSQL) a task moving to another node starts
//! that node's counter from disk; a node that had the task before and gets it back could hold
//! a stale counter. The counter is forgotten whenever the task's cell is loaded again
//! ([`super::Store::forget_timeline_seq`]) — the engine calls it when it loads a task.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::backend::{RawOp, TreeId};
use super::codec::{decode, encode};
use super::{bounded, id_prefix, Store, StoreError, SCAN_MAX};
use crate::model::timeline::{TimelineEvent, TimelineKind};

/// `[store] timeline_max` when the config does not say.
pub const DEFAULT_TIMELINE_MAX: u32 = 10_000;
/// Old events one write deletes beyond one per new event (catching up after the bound was
/// lowered, or after a task's counter was read again).
pub const TRIM_PER_WRITE: u64 = 64;
/// Tasks whose counter is kept in memory; past it the map starts afresh (each task then costs
/// one more read, at its next event).
const SEQS_MAX: usize = 65_536;

/// `task id ‖ 0x00 ‖ seq` (big-endian).
pub fn timeline_key(task_id: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(task_id.len() + 9);
    k.extend_from_slice(task_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The seq of a timeline key of `task_id` (`None`: not one).
pub fn seq_of_key(task_id: &str, key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(task_id.as_bytes())?.strip_prefix(&[0])?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

/// One event as stored. Frozen: a new shape is a new variant, and old ones stay readable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum TimelineRecord {
    V1 {
        at_ms: u64,
        /// [`kind_code`].
        kind: u8,
        run: Option<u32>,
        msg: Option<u32>,
        attempt: Option<u32>,
        /// The detail as JSON text; empty for none.
        detail: String,
    },
}

/// The kinds' codes on disk. Never renumber: append.
const KINDS: [TimelineKind; 17] = [
    TimelineKind::Created,
    TimelineKind::Patched,
    TimelineKind::Paused,
    TimelineKind::Resumed,
    TimelineKind::Triggered,
    TimelineKind::Cancelled,
    TimelineKind::Fired,
    TimelineKind::Skipped,
    TimelineKind::Expired,
    TimelineKind::Attempt,
    TimelineKind::RetryScheduled,
    TimelineKind::Delivered,
    TimelineKind::Failed,
    TimelineKind::FailureRetried,
    TimelineKind::FailureDismissed,
    TimelineKind::Held,
    TimelineKind::ResumedAfterRestart,
];

fn kind_code(k: TimelineKind) -> u8 {
    KINDS.iter().position(|x| *x == k).unwrap_or(0) as u8
}

impl TimelineRecord {
    pub fn of(e: &TimelineEvent) -> TimelineRecord {
        TimelineRecord::V1 {
            at_ms: e.at_ms,
            kind: kind_code(e.kind),
            run: e.run,
            msg: e.msg,
            attempt: e.attempt,
            detail: if e.detail.is_null() {
                String::new()
            } else {
                e.detail.to_string()
            },
        }
    }

    /// The event with its `seq`; a record naming an unknown kind or holding bad JSON is an
    /// error naming its key.
    pub fn into_event(self, seq: u64, key: &[u8]) -> Result<TimelineEvent, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            tree: "timeline".into(),
            key: String::from_utf8_lossy(key).into_owned(),
            detail,
        };
        let TimelineRecord::V1 {
            at_ms,
            kind,
            run,
            msg,
            attempt,
            detail,
        } = self;
        let kind = *KINDS
            .get(kind as usize)
            .ok_or_else(|| corrupt(format!("unknown event kind {kind}")))?;
        let detail = if detail.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&detail).map_err(|e| corrupt(format!("detail: {e}")))?
        };
        Ok(TimelineEvent {
            seq,
            at_ms,
            kind,
            run,
            msg,
            attempt,
            detail,
        })
    }
}

/// A task's counter: the next seq to give and the oldest seq that may still be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seq {
    pub next: u64,
    pub oldest: u64,
}

/// The per-task counters (see the module doc).
#[derive(Default)]
pub(crate) struct Seqs {
    map: parking_lot::Mutex<HashMap<String, Seq>>,
}

impl Seqs {
    fn get(&self, id: &str) -> Option<Seq> {
        self.map.lock().get(id).copied()
    }

    fn put(&self, id: &str, s: Seq) {
        let mut m = self.map.lock();
        if m.len() >= SEQS_MAX && !m.contains_key(id) {
            m.clear();
        }
        m.insert(id.to_string(), s);
    }

    pub fn forget(&self, id: &str) {
        self.map.lock().remove(id);
    }
}

/// The writes of `events` for a task whose counter is `s` (seqs `s.next..` for events not
/// numbered yet; an event with a seq keeps it, see [`Store::write_numbered`]), and the counter
/// after them: a put per event, then the deletes that keep at most `max` events. Pure.
pub(crate) fn plan_writes(
    task_id: &str,
    events: &[TimelineEvent],
    s: Seq,
    max: u32,
    ops: &mut Vec<RawOp>,
) -> Result<Seq, StoreError> {
    let mut next = s.next;
    for e in events {
        let seq = if e.seq == 0 { next } else { e.seq };
        ops.push(RawOp::Put(
            TreeId::Timeline,
            timeline_key(task_id, seq),
            encode(&TimelineRecord::of(e))?,
        ));
        next = next.max(seq + 1);
    }
    // Keep seqs `next - max ..`; delete from the oldest stored, a bounded number per write.
    let keep_from = next.saturating_sub(u64::from(max));
    let budget = events.len() as u64 + TRIM_PER_WRITE;
    let mut oldest = s.oldest;
    while oldest < keep_from && oldest < s.oldest + budget {
        ops.push(RawOp::Delete(
            TreeId::Timeline,
            timeline_key(task_id, oldest),
        ));
        oldest += 1;
    }
    Ok(Seq { next, oldest })
}

impl Store {
    /// How many events a task keeps (`[store] timeline_max`; 0 writes none).
    pub fn timeline_max(&self) -> u32 {
        self.timeline_max.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets `[store] timeline_max` (the server does, for every backend).
    pub fn set_timeline_max(&self, max: u32) {
        self.timeline_max
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Forgets a task's event counter: its next event reads it from disk again. Call it when
    /// a task's records may have been written by someone else (a cell loaded again in
    /// cluster mode, an import).
    pub fn forget_timeline_seq(&self, task_id: &str) {
        self.seqs.forget(task_id);
    }

    /// A task's counter: from memory, else from its first and last stored keys.
    fn timeline_seq(&self, task_id: &str, new_task: bool) -> Result<Seq, StoreError> {
        if let Some(s) = self.seqs.get(task_id) {
            return Ok(s);
        }
        if new_task {
            // The job requires the task's spec absent, and a task's events go with it.
            return Ok(Seq { next: 1, oldest: 1 });
        }
        let p = id_prefix(task_id);
        let first = bounded(self.backend.scan(TreeId::Timeline, &p, Some(&p)))
            .next()
            .transpose()?;
        let last = self.backend.last_with_prefix(TreeId::Timeline, &p)?;
        let seq = |kv: Option<(Vec<u8>, Vec<u8>)>| kv.and_then(|(k, _)| seq_of_key(task_id, &k));
        Ok(match (seq(first), seq(last)) {
            (Some(f), Some(l)) => Seq {
                next: l + 1,
                oldest: f,
            },
            _ => Seq { next: 1, oldest: 1 },
        })
    }

    /// The writes of a task's new events, their seqs given (see the module doc). Answers the
    /// task's counter after them, to keep once the write is durable.
    pub(crate) fn push_timeline(
        &self,
        ops: &mut Vec<RawOp>,
        task_id: &str,
        events: &[TimelineEvent],
        new_task: bool,
    ) -> Result<(), StoreError> {
        let max = self.timeline_max();
        if events.is_empty() || max == 0 {
            return Ok(());
        }
        let s = self.timeline_seq(task_id, new_task)?;
        let after = plan_writes(task_id, events, s, max, ops)?;
        // Kept now, not after the write: the task's next write (under its lock) comes after
        // this one is answered, and a failed one forgets it ([`Store::write`]).
        self.seqs.put(task_id, after);
        Ok(())
    }

    /// Gives the timeline events of `batch` their seqs (in place), then writes it like
    /// [`Store::write`]: for a caller that publishes the events with their seqs once durable
    /// (the event bus).
    pub async fn write_numbered(&self, batch: &mut super::Batch) -> Result<(), StoreError> {
        if self.timeline_max() > 0 {
            for op in &mut batch.ops {
                if let super::Op::Timeline { task_id, events } = op {
                    let mut s = self.timeline_seq(task_id, false)?;
                    for e in events.iter_mut() {
                        e.seq = s.next;
                        s.next += 1;
                    }
                    // The counter goes on after these; the write below trims from `oldest`.
                    self.seqs.put(
                        task_id,
                        Seq {
                            next: s.next - events.len() as u64,
                            ..s
                        },
                    );
                }
            }
        }
        self.write(batch).await
    }

    /// The deletes of every event of a task (it is being deleted).
    pub(crate) fn push_timeline_delete(
        &self,
        ops: &mut Vec<RawOp>,
        task_id: &str,
    ) -> Result<(), StoreError> {
        let p = id_prefix(task_id);
        for item in bounded(self.backend.scan(TreeId::Timeline, &p, Some(&p))) {
            let (k, _) = item?;
            ops.push(RawOp::Delete(TreeId::Timeline, k));
        }
        self.seqs.forget(task_id);
        Ok(())
    }

    /// Up to `limit` events of a task after seq `after`, oldest first, optionally only those
    /// of run `run`, and the seq the next page starts after (`None`: no more). At most
    /// [`SCAN_MAX`] events are examined per page (a filtered page may then be short, with a
    /// `next`). A record that does not decode is an error naming its key.
    pub fn timeline(
        &self,
        task_id: &str,
        run: Option<u32>,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<TimelineEvent>, Option<u64>), StoreError> {
        let p = id_prefix(task_id);
        let start = match after {
            Some(u64::MAX) => return Ok((Vec::new(), None)),
            Some(a) => timeline_key(task_id, a + 1),
            None => p.clone(),
        };
        let mut out: Vec<TimelineEvent> = Vec::new();
        let mut last_seen = None;
        for (examined, item) in
            bounded(self.backend.scan(TreeId::Timeline, &start, Some(&p))).enumerate()
        {
            let (k, v) = item?;
            if examined == SCAN_MAX {
                return Ok((out, last_seen));
            }
            let seq = seq_of_key(task_id, &k).ok_or_else(|| StoreError::Corrupt {
                tree: "timeline".into(),
                key: String::from_utf8_lossy(&k).into_owned(),
                detail: "a timeline key must end in an 8-byte seq".into(),
            })?;
            let rec: TimelineRecord = decode("timeline", &k, &v)?;
            let e = rec.into_event(seq, &k)?;
            if run.is_none() || e.run == run {
                if out.len() == limit {
                    let next = out.last().map(|e| e.seq);
                    return Ok((out, next));
                }
                out.push(e);
            }
            last_seen = Some(seq);
        }
        Ok((out, None))
    }

    /// Every timeline record in the store and their key + value bytes (benches: what the
    /// timeline costs on disk per delivered message, before the storage engine's own overhead).
    pub fn timeline_footprint(&self) -> Result<(u64, u64), StoreError> {
        let (mut n, mut bytes) = (0u64, 0u64);
        for item in bounded(self.backend.scan(TreeId::Timeline, &[], None)) {
            let (k, v) = item?;
            n += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        Ok((n, bytes))
    }

    /// Every event of a task, oldest first (export; at most `timeline_max` of them).
    pub fn timeline_all(&self, task_id: &str) -> Result<Vec<TimelineEvent>, StoreError> {
        let p = id_prefix(task_id);
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Timeline, &p, Some(&p))) {
            let (k, v) = item?;
            let Some(seq) = seq_of_key(task_id, &k) else {
                continue;
            };
            let rec: TimelineRecord = decode("timeline", &k, &v)?;
            out.push(rec.into_event(seq, &k)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Batch, Op};
    use serde_json::json;

    fn ev(kind: TimelineKind, at: u64) -> TimelineEvent {
        TimelineEvent::task(kind, at)
    }

    #[test]
    fn records_round_trip_and_bad_ones_name_their_key() {
        let e = TimelineEvent::run(TimelineKind::Attempt, 7, 2, Some(3))
            .with_attempt(1)
            .with_detail(json!({"status": 500, "duration_ms": 12}));
        let bytes = encode(&TimelineRecord::of(&e)).unwrap();
        let back: TimelineRecord = decode("timeline", b"k", &bytes).unwrap();
        let back = back.into_event(9, b"k").unwrap();
        assert_eq!(back, TimelineEvent { seq: 9, ..e });
        let bad = TimelineRecord::V1 {
            at_ms: 1,
            kind: 200,
            run: None,
            msg: None,
            attempt: None,
            detail: String::new(),
        };
        let err = bad.into_event(1, b"t\0x").unwrap_err().to_string();
        assert!(
            err.contains("timeline") && err.contains("unknown event kind"),
            "{err}"
        );
        // Every kind has its own code.
        for (i, k) in KINDS.iter().enumerate() {
            assert_eq!(kind_code(*k) as usize, i);
        }
    }

    #[test]
    fn keys_order_by_seq_within_a_task_and_never_mix_tasks() {
        assert!(timeline_key("a", 2) < timeline_key("a", 256));
        assert_eq!(seq_of_key("a", &timeline_key("a", 300)), Some(300));
        assert_eq!(seq_of_key("a", &timeline_key("a:b", 1)), None);
        assert_eq!(seq_of_key("a", b"a\0short"), None);
    }

    #[test]
    fn the_bound_deletes_the_oldest_and_catches_up_a_bounded_amount_per_write() {
        let events: Vec<_> = (0..3).map(|i| ev(TimelineKind::Fired, i)).collect();
        let mut ops = Vec::new();
        let s = plan_writes("t", &events, Seq { next: 5, oldest: 1 }, 4, &mut ops).unwrap();
        // Seqs 5, 6, 7 put; keep 4..=7, so 1, 2, 3 go.
        assert_eq!(s, Seq { next: 8, oldest: 4 });
        let deleted: Vec<u64> = ops
            .iter()
            .filter_map(|o| match o {
                RawOp::Delete(_, k) => seq_of_key("t", k),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, [1, 2, 3]);
        // A bound lowered far below what is stored: one write deletes 1 + TRIM_PER_WRITE.
        let mut ops = Vec::new();
        let s = plan_writes(
            "t",
            &events[..1],
            Seq {
                next: 1_001,
                oldest: 1,
            },
            10,
            &mut ops,
        )
        .unwrap();
        assert_eq!(s.oldest, 1 + 1 + TRIM_PER_WRITE);
        assert_eq!(ops.len(), 1 + 1 + TRIM_PER_WRITE as usize);
    }

    #[tokio::test]
    async fn events_get_increasing_seqs_are_paged_trimmed_and_deleted_with_the_task() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.set_timeline_max(5);
        let (t, m) = crate::store::tests::task("t");
        s.insert_new_task_with(&t, &m, None, &[ev(TimelineKind::Created, 1)])
            .await
            .unwrap();
        for i in 0..3 {
            let mut b = Batch::new();
            b.timeline(
                "t",
                vec![TimelineEvent::run(
                    TimelineKind::Fired,
                    10 + i,
                    i as u32 + 1,
                    None,
                )],
            );
            s.write(&b).await.unwrap();
        }
        let (all, next) = s.timeline("t", None, None, 100).unwrap();
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(next, None);
        let (page, next) = s.timeline("t", None, None, 2).unwrap();
        assert_eq!((page.len(), next), (2, Some(2)));
        let (page, next) = s.timeline("t", None, Some(2), 2).unwrap();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(next, None);
        let (run2, _) = s.timeline("t", Some(2), None, 10).unwrap();
        assert_eq!(run2.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
        // Past the bound the oldest go first; a counter read again from disk goes on after
        // the last stored seq.
        s.forget_timeline_seq("t");
        let mut b = Batch::new();
        b.timeline(
            "t",
            (0..3).map(|i| ev(TimelineKind::Paused, 20 + i)).collect(),
        );
        s.write(&b).await.unwrap();
        let seqs: Vec<u64> = s.timeline_all("t").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5, 6, 7]);
        // Deleting the task takes its timeline.
        let fp = s.footprint("t").unwrap();
        let mut b = Batch::new();
        b.ops.push(Op::DeleteTask(fp));
        s.write(&b).await.unwrap();
        assert!(s.timeline_all("t").unwrap().is_empty());
        // A task made again with the same id starts at 1.
        s.insert_new_task_with(&t, &m, None, &[ev(TimelineKind::Created, 99)])
            .await
            .unwrap();
        let seqs: Vec<u64> = s.timeline_all("t").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1]);
    }

    #[tokio::test]
    async fn numbered_writes_say_the_seqs_they_were_given() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.set_timeline_max(3);
        for round in 0..3u64 {
            let mut b = Batch::new();
            b.timeline(
                "n",
                vec![ev(TimelineKind::Fired, 1), ev(TimelineKind::Paused, 2)],
            );
            s.write_numbered(&mut b).await.unwrap();
            let Op::Timeline { events, .. } = &b.ops[0] else {
                panic!("{b:?}")
            };
            assert_eq!(
                events.iter().map(|e| e.seq).collect::<Vec<_>>(),
                [2 * round + 1, 2 * round + 2]
            );
        }
        let seqs: Vec<u64> = s.timeline_all("n").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [4, 5, 6], "numbered or not, the bound holds");
        let mut b = Batch::new();
        b.timeline("n", vec![ev(TimelineKind::Fired, 3)]);
        s.write(&b).await.unwrap();
        let seqs: Vec<u64> = s.timeline_all("n").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [5, 6, 7]);
    }

    #[tokio::test]
    async fn timeline_max_zero_writes_no_events() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.set_timeline_max(0);
        let mut b = Batch::new();
        b.timeline("x", vec![ev(TimelineKind::Fired, 1)]);
        s.write(&b).await.unwrap();
        assert!(s.timeline_all("x").unwrap().is_empty());
    }
}
