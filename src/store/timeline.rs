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
//! failed write may leave a gap; nothing relies on seqs being dense). The fire pump reads the
//! counters of the tasks it is about to fire, many in one round trip
//! ([`Store::prime_timeline_seqs`], `engine/prefetch.rs`), so a herd's first events on
//! PostgreSQL need no read of their own.
//!
//! **The `created` event is derived, not stored** (issue 29: ~300 of a pending one-shot's
//! bytes on disk). Its seq is [`CREATED_SEQ`] (1) and a new task's counter starts at 2; a
//! read of the timeline (the page, [`Store::timeline_all`], an export) puts it first, made
//! from the task ([`TimelineEvent::created`]: creation time, trace id, message count), when
//! it would still be kept: nothing is stored at seq 1 and the bound has not trimmed it (the
//! first stored seq is 2 or there is none, and the last is at most `timeline_max`:
//! [`created_shows`]). Data dirs written before this hold a `created` record at seq 1; it is
//! read as stored, never twice. A patch can change the message count the event reports, so
//! the first patch of a task whose `created` is still derived stores it as it was (one
//! record, written with the patch, from the task before it).
//!
//! **A sent message's two events are one record** (issue 29: half the timeline keys a
//! delivery writes): an attempt and the `delivered` event right after it, at the same instant
//! for the same message and attempt, are stored as [`TimelineRecord::Delivered`] at the
//! second's seq and read back as the two events ([`TimelineRecord::into_events`]); a page
//! that ended between them starts the next one with the second (the scan starts at the key
//! past `after` and drops what is at or below it). Every other event is a record of its own.
//!
//! A task keeps at most `[store] timeline_max` events (one more while its oldest record kept
//! is such a pair whose attempt is below the bound): each write deletes the oldest keys
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
use crate::model::timeline::{TimelineEvent, TimelineKind, CREATED_SEQ};
use crate::model::Task;

/// `[store] timeline_max` when the config does not say.
pub const DEFAULT_TIMELINE_MAX: u32 = 10_000;
/// Old events one write deletes beyond one per new event (catching up after the bound was
/// lowered, or after a task's counter was read again).
pub const TRIM_PER_WRITE: u64 = 64;
/// Tasks whose counter is kept in memory, in two generations of half as many: when the newer
/// is full it becomes the older and the older is dropped (each task dropped then costs one
/// more read, at its next event), so a counter read ahead for a herd is never dropped before
/// its fire unless 131 072 newer tasks came in between. Sized for a herd of 100 000 on
/// PostgreSQL (issue 23): at 65 536 the tasks past ~65 000 had their counters dropped between
/// their fire and their settle and each settle read its counter again (two round trips per
/// task): the herd's last send came 14–25 s after its instant, 1.3 s with the counters kept.
/// At most ~20 MiB (an id and 16 bytes per counter).
const SEQS_MAX: usize = 1 << 18;

/// The counter of a task being created, before its first event.
const NEW: Seq = Seq {
    next: CREATED_SEQ,
    oldest: CREATED_SEQ,
};

/// The counter of a stored task with no stored event: seq 1 is its derived `created` event.
const FIRST: Seq = Seq {
    next: CREATED_SEQ + 1,
    oldest: CREATED_SEQ,
};

/// A task's derived `created` event as the engine writes it ([`TimelineEvent::created`]:
/// numbered 1 already): never stored. A `created` event given without a seq is stored like
/// any other (a fixture's, a test's).
fn is_derived(e: &TimelineEvent) -> bool {
    e.kind == TimelineKind::Created && e.seq == CREATED_SEQ
}

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
    /// A message's attempt and the `delivered` event that follows it, one record for the two
    /// (issue 29: a sent message's timeline is one key, not two). Stored at the `delivered`
    /// event's seq; the attempt is the seq before it, with the same instant, run, message and
    /// attempt number (what [`TimelineEvent::delivered`] holds), and `detail` is the
    /// attempt's. Written only for an attempt at seq 3 or later, so seq 2, the first after
    /// the derived `created`, is always a record of its own when stored, and a task's first
    /// stored key tells whether its `created` event shows ([`created_shows`]) without
    /// reading the record.
    Delivered {
        at_ms: u64,
        run: Option<u32>,
        msg: Option<u32>,
        attempt: Option<u32>,
        /// The attempt's detail as JSON text; empty for none.
        detail: String,
    },
}

/// The first seq an attempt may have to share a record with its `delivered` event
/// ([`TimelineRecord::Delivered`]).
const PAIRED_FROM: u64 = CREATED_SEQ + 2;

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

/// A detail as stored: JSON text, empty for none.
fn detail_text(detail: &serde_json::Value) -> String {
    if detail.is_null() {
        String::new()
    } else {
        // Straight into a buffer: `Value`'s `Display` goes through `fmt::Formatter` a write at
        // a time, ~1 µs per attempt event in a herd's profile. A `Value` always serializes
        // (its keys are strings); `Display` stays the fallback.
        serde_json::to_string(detail).unwrap_or_else(|_| detail.to_string())
    }
}

impl TimelineRecord {
    pub fn of(e: &TimelineEvent) -> TimelineRecord {
        TimelineRecord::V1 {
            at_ms: e.at_ms,
            kind: kind_code(e.kind),
            run: e.run,
            msg: e.msg,
            attempt: e.attempt,
            detail: detail_text(&e.detail),
        }
    }

    /// One record for an attempt at seq `seq` and the event after it at `seq + 1`, when that
    /// is the attempt's `delivered` event ([`TimelineRecord::Delivered`]); `None` otherwise.
    /// Pure.
    pub fn paired(
        attempt: &TimelineEvent,
        seq: u64,
        next: &TimelineEvent,
        next_seq: u64,
    ) -> Option<TimelineRecord> {
        let pairs = attempt.kind == TimelineKind::Attempt
            && next.kind == TimelineKind::Delivered
            && seq >= PAIRED_FROM
            && next_seq == seq + 1
            && (next.at_ms, next.run, next.msg, next.attempt)
                == (attempt.at_ms, attempt.run, attempt.msg, attempt.attempt)
            && next.detail.is_null();
        pairs.then(|| TimelineRecord::Delivered {
            at_ms: attempt.at_ms,
            run: attempt.run,
            msg: attempt.msg,
            attempt: attempt.attempt,
            detail: detail_text(&attempt.detail),
        })
    }

    /// The events of the record stored at `seq`, oldest first: one, or an attempt and its
    /// `delivered` event. A record naming an unknown kind, holding bad JSON or pairing an
    /// attempt below seq 3 is an error naming its key.
    pub fn into_events(
        self,
        seq: u64,
        key: &[u8],
    ) -> Result<(Option<TimelineEvent>, TimelineEvent), StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            tree: "timeline".into(),
            key: String::from_utf8_lossy(key).into_owned(),
            detail,
        };
        let parse = |detail: String| -> Result<serde_json::Value, StoreError> {
            if detail.is_empty() {
                Ok(serde_json::Value::Null)
            } else {
                serde_json::from_str(&detail).map_err(|e| corrupt(format!("detail: {e}")))
            }
        };
        match self {
            TimelineRecord::V1 {
                at_ms,
                kind,
                run,
                msg,
                attempt,
                detail,
            } => {
                let kind = *KINDS
                    .get(kind as usize)
                    .ok_or_else(|| corrupt(format!("unknown event kind {kind}")))?;
                let e = TimelineEvent {
                    seq,
                    at_ms,
                    kind,
                    run,
                    msg,
                    attempt,
                    detail: parse(detail)?,
                };
                Ok((None, e))
            }
            TimelineRecord::Delivered {
                at_ms,
                run,
                msg,
                attempt,
                detail,
            } => {
                if seq <= PAIRED_FROM {
                    return Err(corrupt(format!(
                        "an attempt and its delivery stored at seq {seq}, below {}",
                        PAIRED_FROM + 1
                    )));
                }
                let event = |seq, kind, detail| TimelineEvent {
                    seq,
                    at_ms,
                    kind,
                    run,
                    msg,
                    attempt,
                    detail,
                };
                Ok((
                    Some(event(seq - 1, TimelineKind::Attempt, parse(detail)?)),
                    event(seq, TimelineKind::Delivered, serde_json::Value::Null),
                ))
            }
        }
    }
}

/// The events of the stored record `(k, v)` of `task_id`, appended to `out` (oldest first).
/// A key without a seq is skipped (not one of the task's).
fn push_record(
    task_id: &str,
    k: &[u8],
    v: &[u8],
    out: &mut Vec<TimelineEvent>,
) -> Result<(), StoreError> {
    let Some(seq) = seq_of_key(task_id, k) else {
        return Ok(());
    };
    let rec: TimelineRecord = decode("timeline", k, v)?;
    let (first, e) = rec.into_events(seq, k)?;
    out.extend(first);
    out.push(e);
    Ok(())
}

/// A task's counter: the next seq to give and the oldest seq that may still be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seq {
    pub next: u64,
    pub oldest: u64,
}

/// The per-task counters (see the module doc and [`SEQS_MAX`]).
#[derive(Default)]
pub(crate) struct Seqs {
    map: parking_lot::Mutex<Generations>,
}

/// The newer and the older generation of counters; a task is in at most one.
#[derive(Default)]
struct Generations {
    new: SeqMap,
    old: SeqMap,
}

/// foldhash, not SipHash: ids are the caller's, but a counter map's worst case is only a
/// slower lookup, and a herd looks every task up twice per write (~2 % of its profile).
type SeqMap = HashMap<String, Seq, foldhash::fast::RandomState>;

impl Seqs {
    fn get(&self, id: &str) -> Option<Seq> {
        let m = self.map.lock();
        m.new.get(id).or_else(|| m.old.get(id)).copied()
    }

    fn put(&self, id: &str, s: Seq) {
        let mut m = self.map.lock();
        // Most puts update a counter of the newer generation: no new key allocated for it.
        if let Some(c) = m.new.get_mut(id) {
            *c = s;
            return;
        }
        if m.old.remove(id).is_none() && m.new.len() >= SEQS_MAX / 2 {
            m.old = std::mem::take(&mut m.new);
        }
        m.new.insert(id.to_string(), s);
    }

    pub fn forget(&self, id: &str) {
        let mut m = self.map.lock();
        m.new.remove(id);
        m.old.remove(id);
    }

    /// Forgets the counters of every task `which` names.
    fn forget_where(&self, which: impl Fn(&str) -> bool) {
        let mut m = self.map.lock();
        m.new.retain(|id, _| !which(id));
        m.old.retain(|id, _| !which(id));
    }
}

/// A task's counter from its first and last stored keys (`None`: it has no event stored).
fn seq_of_bounds(task_id: &str, bounds: Option<(&[u8], &[u8])>) -> Seq {
    let seqs = bounds.and_then(|(f, l)| Some((seq_of_key(task_id, f)?, seq_of_key(task_id, l)?)));
    match seqs {
        Some((first, last)) => Seq {
            next: last + 1,
            oldest: first,
        },
        None => FIRST,
    }
}

/// Whether a task's derived `created` event is shown (module doc), from its first and last
/// stored seqs: nothing stored at seq 1 (an old data dir's record is shown as stored), and not
/// trimmed by the bound `max` (0: no timeline at all). Pure.
pub fn created_shows(first: Option<u64>, last: Option<u64>, max: u32) -> bool {
    if max == 0 {
        return false;
    }
    match (first, last) {
        (Some(f), Some(l)) => f == CREATED_SEQ + 1 && l <= u64::from(max),
        _ => true,
    }
}

/// The derived `created` event of `task` when it is shown beside the stored `events` (oldest
/// first), for a reader that has them all (an export). Pure.
pub fn derived_created(task: &Task, events: &[TimelineEvent], max: u32) -> Option<TimelineEvent> {
    let first = events.first().map(|e| e.seq);
    let last = events.last().map(|e| e.seq);
    created_shows(first, last, max).then(|| TimelineEvent::created(task))
}

/// The writes of `events` for a task whose counter is `s` (seqs `s.next..` for events not
/// numbered yet; an event with a seq keeps it, see [`Store::write_numbered`]), and the counter
/// after them: a put per event but the derived `created` ([`is_derived`]), then the deletes
/// that keep at most `max` events. Pure.
pub(crate) fn plan_writes(
    task_id: &str,
    events: &[TimelineEvent],
    s: Seq,
    max: u32,
    ops: &mut Vec<RawOp>,
) -> Result<Seq, StoreError> {
    let mut next = s.next;
    let mut each = events.iter().peekable();
    while let Some(e) = each.next() {
        let seq = if e.seq == 0 { next } else { e.seq };
        next = next.max(seq + 1);
        if is_derived(e) {
            continue;
        }
        // An attempt and its `delivered` event: one record, at the second's seq.
        if let Some(after) = each.peek() {
            let after_seq = if after.seq == 0 { next } else { after.seq };
            if let Some(rec) = TimelineRecord::paired(e, seq, after, after_seq) {
                ops.push(RawOp::Put(
                    TreeId::Timeline,
                    timeline_key(task_id, after_seq),
                    encode(&rec)?,
                ));
                next = next.max(after_seq + 1);
                each.next();
                continue;
            }
        }
        ops.push(RawOp::Put(
            TreeId::Timeline,
            timeline_key(task_id, seq),
            encode(&TimelineRecord::of(e))?,
        ));
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

    /// Forgets the counters of every task `which` names (cluster mode: a shard let go, whose
    /// tasks' events the next owner writes; finished ones too, whose failure entries it
    /// retries and dismisses).
    pub fn forget_timeline_seqs_where(&self, which: impl Fn(&str) -> bool) {
        self.seqs.forget_where(which);
    }

    /// A task's counter: from memory, else from its first and last stored keys.
    fn timeline_seq(&self, task_id: &str, new_task: bool) -> Result<Seq, StoreError> {
        if new_task {
            // The job requires the task's spec absent, and a task's events go with it.
            return Ok(NEW);
        }
        if let Some(s) = self.seqs.get(task_id) {
            return Ok(s);
        }
        let p = id_prefix(task_id);
        let first = bounded(self.backend.scan(TreeId::Timeline, &p, Some(&p)))
            .next()
            .transpose()?;
        let last = self.backend.last_with_prefix(TreeId::Timeline, &p)?;
        Ok(seq_of_bounds(
            task_id,
            first
                .as_ref()
                .zip(last.as_ref())
                .map(|((f, _), (l, _))| (f.as_slice(), l.as_slice())),
        ))
    }

    /// Reads the counters of `ids` not in memory yet, all in one batched read
    /// ([`super::backend::Backend::prefix_bounds_many`]: one round trip on PostgreSQL), so
    /// their next events need no read of their own (a herd's fires, `engine/prefetch.rs`).
    /// The caller holds each task's lock: nobody writes the tasks meanwhile, so what is read
    /// is their counter as it is.
    pub fn prime_timeline_seqs(&self, ids: &[&str]) -> Result<(), StoreError> {
        if self.timeline_max() == 0 {
            return Ok(());
        }
        let unknown: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| self.seqs.get(id).is_none())
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let prefixes: Vec<Vec<u8>> = unknown.iter().map(|id| id_prefix(id)).collect();
        let bounds = self
            .backend
            .prefix_bounds_many(TreeId::Timeline, &prefixes)?;
        for (id, b) in unknown.iter().zip(bounds) {
            let b = b.as_ref().map(|(f, l)| (f.as_slice(), l.as_slice()));
            self.seqs.put(id, seq_of_bounds(id, b));
        }
        Ok(())
    }

    /// Whether a task's counter is in memory (its next event needs no read).
    pub fn timeline_seq_known(&self, task_id: &str) -> bool {
        self.timeline_max() == 0 || self.seqs.get(task_id).is_some()
    }

    /// The write of a task's derived `created` event as a record, before a patch changes what
    /// it is derived from (module doc): only while it is derived and shown after this write
    /// (counter `s`: nothing below seq 2 trimmed, at most `max` seqs given; nothing stored at
    /// seq 1), from the task as stored before the patch.
    fn keep_created(
        &self,
        ops: &mut Vec<RawOp>,
        task_id: &str,
        s: Seq,
        max: u32,
    ) -> Result<(), StoreError> {
        if s.oldest > CREATED_SEQ + 1 || s.next.saturating_sub(1) > u64::from(max) {
            return Ok(());
        }
        let key = timeline_key(task_id, CREATED_SEQ);
        if self.backend.get(TreeId::Timeline, &key)?.is_some() {
            return Ok(());
        }
        if let Some(task) = self.get_task(task_id)? {
            let e = TimelineEvent::created(&task);
            ops.push(RawOp::Put(
                TreeId::Timeline,
                key,
                encode(&TimelineRecord::of(&e))?,
            ));
        }
        Ok(())
    }

    /// A task's derived `created` event when it is shown (module doc), its first stored seq
    /// being `first`; reads its last stored key and the task.
    fn created_of(
        &self,
        task_id: &str,
        first: Option<u64>,
    ) -> Result<Option<TimelineEvent>, StoreError> {
        let max = self.timeline_max();
        let last = match first {
            None => None,
            Some(f) if f != CREATED_SEQ + 1 || max == 0 => return Ok(None),
            Some(_) => self
                .backend
                .last_with_prefix(TreeId::Timeline, &id_prefix(task_id))?
                .and_then(|(k, _)| seq_of_key(task_id, &k)),
        };
        if !created_shows(first, last, max) {
            return Ok(None);
        }
        Ok(self.get_task(task_id)?.map(|t| TimelineEvent::created(&t)))
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
        // A derived `created` event is only ever written with its task's first write.
        let created = events.iter().any(is_derived);
        let s = self.timeline_seq(task_id, new_task || created)?;
        let after = plan_writes(task_id, events, s, max, ops)?;
        if !new_task && !created && events.iter().any(|e| e.kind == TimelineKind::Patched) {
            self.keep_created(ops, task_id, after, max)?;
        }
        // Kept now, not after the write: the task's next write (under its lock) comes after
        // this one is answered, and a failed one forgets it ([`Store::write`]). A new task
        // with nothing stored but its derived `created` event is not kept: reading its
        // counter later finds no key and gives the same `FIRST` (one read, batched with its
        // fire's read-ahead), and a million creates do not fill the counters' bound and push
        // out the counters of the tasks being sent.
        if !(created && after == FIRST) {
            self.seqs.put(task_id, after);
        }
        Ok(())
    }

    /// Gives the timeline events of `batch` their seqs (in place), then writes it like
    /// [`Store::write`]: for a caller that publishes the events with their seqs once durable
    /// (the event bus).
    pub async fn write_numbered(&self, batch: &mut super::Batch) -> Result<(), StoreError> {
        if self.timeline_max() > 0 {
            for op in &mut batch.ops {
                if let super::Op::Timeline { task_id, events } = op {
                    // A derived `created` event (a task born in this write) keeps seq 1.
                    let created = events.iter().any(is_derived);
                    let mut s = self.timeline_seq(task_id, created)?;
                    for e in events.iter_mut() {
                        if is_derived(e) {
                            s.next = s.next.max(CREATED_SEQ + 1);
                        } else {
                            e.seq = s.next;
                            s.next += 1;
                        }
                    }
                    // The write below goes on from the seqs given; it trims from `oldest`
                    // (a new task's `FIRST` is not kept: `push_timeline`).
                    if !(created && s == FIRST) {
                        self.seqs.put(task_id, s);
                    }
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
        let mut scan = bounded(self.backend.scan(TreeId::Timeline, &start, Some(&p))).peekable();
        if run.is_none() && after.is_none_or(|a| a < CREATED_SEQ) && limit > 0 {
            // A stored record that fails to read is the scan's error, below.
            let first = match scan.peek() {
                Some(Ok((k, _))) => seq_of_key(task_id, k),
                _ => None,
            };
            if let Some(e) = self.created_of(task_id, first)? {
                last_seen = Some(e.seq);
                out.push(e);
            }
        }
        for (examined, item) in scan.enumerate() {
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
            let (first, e) = rec.into_events(seq, &k)?;
            // A record's attempt half is at or below `after` when the last page ended
            // between the two.
            for e in first.into_iter().chain([e]) {
                if after.is_some_and(|a| e.seq <= a) || run.is_some_and(|r| e.run != Some(r)) {
                    continue;
                }
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

    /// Every event of a task, oldest first, its derived `created` event with them (at most
    /// `timeline_max` of them).
    pub fn timeline_all(&self, task_id: &str) -> Result<Vec<TimelineEvent>, StoreError> {
        let mut out = self.timeline_stored(task_id)?;
        if let Some(e) = self.created_of(task_id, out.first().map(|e| e.seq))? {
            out.insert(0, e);
        }
        Ok(out)
    }

    /// The events stored for a task, oldest first (without its derived `created` event).
    pub fn timeline_stored(&self, task_id: &str) -> Result<Vec<TimelineEvent>, StoreError> {
        let p = id_prefix(task_id);
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Timeline, &p, Some(&p))) {
            let (k, v) = item?;
            push_record(task_id, &k, &v, &mut out)?;
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

    /// Review finding: a shard let go kept its finished tasks' counters; back on this node,
    /// they gave seqs its other owner had used. Forgotten by shard, others kept.
    #[test]
    fn counters_are_forgotten_by_the_ids_named() {
        let seqs = Seqs::default();
        for id in ["a1", "a2", "b1"] {
            seqs.put(id, NEW);
        }
        seqs.forget_where(|id| id.starts_with('a'));
        assert!(seqs.get("a1").is_none() && seqs.get("a2").is_none());
        assert!(seqs.get("b1").is_some());
    }

    #[test]
    fn records_round_trip_and_bad_ones_name_their_key() {
        let e = TimelineEvent::run(TimelineKind::Attempt, 7, 2, Some(3))
            .with_attempt(1)
            .with_detail(json!({"status": 500, "duration_ms": 12}));
        let bytes = encode(&TimelineRecord::of(&e)).unwrap();
        let back: TimelineRecord = decode("timeline", b"k", &bytes).unwrap();
        let back = back.into_events(9, b"k").unwrap();
        assert_eq!(back, (None, TimelineEvent { seq: 9, ..e }));
        let bad = TimelineRecord::V1 {
            at_ms: 1,
            kind: 200,
            run: None,
            msg: None,
            attempt: None,
            detail: String::new(),
        };
        let err = bad.into_events(1, b"t\0x").unwrap_err().to_string();
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

    /// A store on a fresh dir holding task `id` (its two messages returned too), created with its derived
    /// `created` event as the engine writes it; the dir lives as long as the first value.
    async fn store_with_created(
        id: &str,
    ) -> (tempfile::TempDir, Store, Task, Vec<crate::model::Message>) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (t, m) = crate::store::tests::task(id);
        s.insert_new_task_with(&t, &m, None, &[TimelineEvent::created(&t)])
            .await
            .unwrap();
        (dir, s, t, m)
    }

    fn sent(at: u64, run: u32, msg: u32) -> [TimelineEvent; 2] {
        [
            TimelineEvent::attempt(at, run, msg, 1, &crate::model::Outcome::Sent, Some(200), 3),
            TimelineEvent::delivered(at, run, msg, 1),
        ]
    }

    #[test]
    fn an_attempt_and_its_delivery_are_one_record_only_when_nothing_is_lost() {
        let [a, d] = sent(7, 1, 0);
        let rec = TimelineRecord::paired(&a, 3, &d, 4).expect("a pair");
        let back: TimelineRecord = decode("timeline", b"k", &encode(&rec).unwrap()).unwrap();
        assert_eq!(
            back.into_events(4, b"k").unwrap(),
            (
                Some(TimelineEvent {
                    seq: 3,
                    ..a.clone()
                }),
                TimelineEvent {
                    seq: 4,
                    ..d.clone()
                }
            )
        );
        // Not a pair: seqs apart, another instant, message or attempt, a failed attempt's
        // next event, seq 2 (the first after `created`), a delivery with a detail.
        assert!(TimelineRecord::paired(&a, 3, &d, 5).is_none());
        assert!(TimelineRecord::paired(&a, 2, &d, 3).is_none());
        assert!(TimelineRecord::paired(
            &a,
            3,
            &TimelineEvent {
                at_ms: 8,
                ..d.clone()
            },
            4
        )
        .is_none());
        assert!(TimelineRecord::paired(
            &a,
            3,
            &TimelineEvent {
                msg: Some(1),
                ..d.clone()
            },
            4
        )
        .is_none());
        assert!(TimelineRecord::paired(&a, 3, &d.clone().with_attempt(2), 4).is_none());
        assert!(TimelineRecord::paired(&d, 3, &a, 4).is_none());
        assert!(
            TimelineRecord::paired(&a, 3, &d.clone().with_detail(json!({"x": 1})), 4).is_none()
        );
        // A pair stored below seq 4 would put its attempt on `created`'s seq or below.
        let err = rec.into_events(3, b"t\0x").unwrap_err().to_string();
        assert!(err.contains("below 4"), "{err}");
    }

    #[tokio::test]
    async fn sent_messages_are_one_record_each_and_read_back_event_by_event() {
        let (_dir, s, _, _) = store_with_created("p").await;
        let mut b = Batch::new();
        let mut events = vec![TimelineEvent::run(TimelineKind::Fired, 5, 1, None)];
        events.extend(sent(6, 1, 0));
        b.timeline("p", events);
        s.write(&b).await.unwrap();
        for msg in 1..3 {
            let mut b = Batch::new();
            b.timeline("p", sent(6 + u64::from(msg), 1, msg).to_vec());
            s.write_numbered(&mut b).await.unwrap();
            let Op::Timeline { events, .. } = &b.ops[0] else {
                panic!("{b:?}")
            };
            assert_eq!(
                seqs_of(events),
                [2 + 2 * u64::from(msg) + 1, 2 + 2 * u64::from(msg) + 2]
            );
        }
        // created (derived), fired, then three messages of two events each, in four records.
        let all = s.timeline_all("p").unwrap();
        assert_eq!(seqs_of(&all), (1..=8).collect::<Vec<_>>());
        assert_eq!(s.timeline_footprint().unwrap().0, 4);
        let kinds: Vec<_> = all.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds[2..4],
            [TimelineKind::Attempt, TimelineKind::Delivered]
        );
        assert_eq!(all[3].detail, serde_json::Value::Null);
        assert_eq!(all[2].detail["outcome"], "sent");
        // Pages of every size see every event once, a page ending between the two halves of
        // a record too.
        for limit in 1..=9 {
            let (mut seen, mut after) = (Vec::new(), None);
            loop {
                let (page, next) = s.timeline("p", None, after, limit).unwrap();
                seen.extend(seqs_of(&page));
                match next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            assert_eq!(seen, (1..=8).collect::<Vec<_>>(), "limit {limit}");
        }
        // A counter read from disk again goes on after the pair's second seq.
        s.forget_timeline_seq("p");
        let mut b = Batch::new();
        b.timeline("p", vec![ev(TimelineKind::Paused, 20)]);
        s.write(&b).await.unwrap();
        assert_eq!(seqs_of(&s.timeline_all("p").unwrap()).last(), Some(&9));
        // The export's image reads the pairs too.
        let image = s.task_image("p").unwrap().unwrap();
        assert_eq!(seqs_of(&image.timeline), (2..=9).collect::<Vec<_>>());
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
                [2 * round + 2, 2 * round + 3],
                "seq 1 is a task's created event"
            );
        }
        let seqs: Vec<u64> = s.timeline_all("n").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [5, 6, 7], "numbered or not, the bound holds");
        let mut b = Batch::new();
        b.timeline("n", vec![ev(TimelineKind::Fired, 3)]);
        s.write(&b).await.unwrap();
        let seqs: Vec<u64> = s.timeline_all("n").unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [6, 7, 8]);
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

    fn seqs_of(events: &[TimelineEvent]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[tokio::test]
    async fn created_is_derived_not_stored_and_shown_first_until_the_bound_trims_it() {
        let (_dir, s, t, _) = store_with_created("t").await;
        s.set_timeline_max(3);
        assert_eq!(s.timeline_footprint().unwrap(), (0, 0), "nothing stored");
        let want = TimelineEvent::created(&t);
        assert_eq!(want.seq, 1);
        assert_eq!(
            want.detail,
            json!({"trace_id": crate::model::timeline::hex(&crate::model::timeline::trace_id_of(&t)), "messages": 2})
        );
        assert_eq!(s.timeline_all("t").unwrap(), std::slice::from_ref(&want));
        assert_eq!(
            s.timeline("t", None, None, 10).unwrap(),
            (vec![want.clone()], None)
        );
        // Paged: created is seq 1; `after` 1 starts past it; a run filter never has it.
        for i in 0..2u64 {
            let mut b = Batch::new();
            b.timeline(
                "t",
                vec![TimelineEvent::run(TimelineKind::Fired, 10 + i, 1, None)],
            );
            s.write(&b).await.unwrap();
        }
        assert_eq!(seqs_of(&s.timeline_all("t").unwrap()), [1, 2, 3]);
        let (page, next) = s.timeline("t", None, None, 1).unwrap();
        assert_eq!((seqs_of(&page), next), (vec![1], Some(1)));
        let (page, next) = s.timeline("t", None, Some(1), 5).unwrap();
        assert_eq!((seqs_of(&page), next), (vec![2, 3], None));
        let (page, _) = s.timeline("t", None, Some(0), 5).unwrap();
        assert_eq!(seqs_of(&page), [1, 2, 3]);
        assert_eq!(
            seqs_of(&s.timeline("t", Some(1), None, 5).unwrap().0),
            [2, 3]
        );
        // One more event: the bound keeps 3, so created (the oldest) goes.
        let mut b = Batch::new();
        b.timeline("t", vec![ev(TimelineKind::Paused, 20)]);
        s.write(&b).await.unwrap();
        assert_eq!(seqs_of(&s.timeline_all("t").unwrap()), [2, 3, 4]);
        assert_eq!(
            seqs_of(&s.timeline("t", None, None, 10).unwrap().0),
            [2, 3, 4]
        );
        // Read from disk again, the counter goes on after the last stored seq.
        s.forget_timeline_seq("t");
        let mut b = Batch::new();
        b.timeline("t", vec![ev(TimelineKind::Resumed, 21)]);
        s.write(&b).await.unwrap();
        assert_eq!(seqs_of(&s.timeline_all("t").unwrap()), [3, 4, 5]);
        // timeline_max 0: no timeline, not even created.
        let (u, mu) = crate::store::tests::task("u");
        s.set_timeline_max(0);
        s.insert_new_task_with(&u, &mu, None, &[TimelineEvent::created(&u)])
            .await
            .unwrap();
        assert!(s.timeline_all("u").unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_stored_created_record_of_an_old_data_dir_is_shown_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (t, m) = crate::store::tests::task("old");
        s.insert_new_task(&t, &m, None).await.unwrap();
        // As a data dir written before derivation holds it: created at seq 1, then events.
        let stored = TimelineEvent::task(TimelineKind::Created, 5);
        let mut b = Batch::new();
        b.ops.push(Op::PutTimeline {
            task_id: "old".into(),
            events: vec![
                TimelineEvent {
                    seq: 1,
                    ..stored.clone()
                },
                TimelineEvent {
                    seq: 2,
                    ..ev(TimelineKind::Fired, 6)
                },
            ],
        });
        s.write(&b).await.unwrap();
        let all = s.timeline_all("old").unwrap();
        assert_eq!(seqs_of(&all), [1, 2]);
        assert_eq!(all[0], TimelineEvent { seq: 1, ..stored });
        assert_eq!(s.timeline("old", None, None, 10).unwrap().0, all);
        // Its next event goes on at 3, read from disk.
        let mut b = Batch::new();
        b.timeline("old", vec![ev(TimelineKind::Paused, 7)]);
        s.write(&b).await.unwrap();
        assert_eq!(seqs_of(&s.timeline_all("old").unwrap()), [1, 2, 3]);
    }

    #[tokio::test]
    async fn a_patch_stores_created_as_it_was_once() {
        let (_dir, s, t, m) = store_with_created("p").await;
        let before = TimelineEvent::created(&t);
        assert_eq!(before.detail["messages"], 2);
        // Patches to one message and back to two, as the engine writes them.
        for (i, count) in [1u32, 2].into_iter().enumerate() {
            let mut t2 = t.clone();
            t2.message_count = count;
            let mut b = Batch::new();
            b.timeline("p", vec![ev(TimelineKind::Patched, 100 + i as u64)]);
            b.ops.push(Op::Messages {
                task_id: "p".into(),
                old_count: if i == 0 { 2 } else { 1 },
                messages: m[..count as usize].to_vec(),
            });
            b.task(&t2);
            s.write(&b).await.unwrap();
            let all = s.timeline_all("p").unwrap();
            assert_eq!(seqs_of(&all), (1..=2 + i as u64).collect::<Vec<_>>());
            assert_eq!(all[0], before, "created says what the task was made with");
        }
        assert_eq!(s.timeline_footprint().unwrap().0, 3, "created stored once");
    }

    #[tokio::test]
    async fn primed_counters_go_on_after_what_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.set_timeline_max(3);
        for id in ["a", "b"] {
            let mut b = Batch::new();
            b.timeline(id, (0..4).map(|i| ev(TimelineKind::Fired, i)).collect());
            s.write(&b).await.unwrap();
            s.forget_timeline_seq(id);
        }
        assert!(!s.timeline_seq_known("a"));
        s.prime_timeline_seqs(&["a", "b", "none"]).unwrap();
        assert!(s.timeline_seq_known("a") && s.timeline_seq_known("none"));
        for id in ["a", "b", "none"] {
            let mut b = Batch::new();
            b.timeline(id, vec![ev(TimelineKind::Paused, 9)]);
            s.write(&b).await.unwrap();
        }
        assert_eq!(seqs_of(&s.timeline_all("a").unwrap()), [4, 5, 6]);
        assert_eq!(seqs_of(&s.timeline_all("b").unwrap()), [4, 5, 6]);
        assert_eq!(seqs_of(&s.timeline_all("none").unwrap()), [2]);
    }

    #[test]
    fn counters_live_in_two_generations() {
        let seqs = Seqs::default();
        let s = Seq { next: 2, oldest: 1 };
        seqs.put("first", s);
        for i in 0..SEQS_MAX / 2 {
            seqs.put(&format!("t{i}"), s);
        }
        // "first" moved to the older generation, still there.
        assert_eq!(seqs.get("first"), Some(s));
        for i in 0..SEQS_MAX / 2 {
            seqs.put(&format!("u{i}"), s);
        }
        assert_eq!(seqs.get("first"), None, "dropped with its generation");
        assert_eq!(seqs.get("u0"), Some(s));
        seqs.forget("u0");
        assert_eq!(seqs.get("u0"), None);
    }

    #[test]
    fn created_shows_only_while_the_bound_keeps_it() {
        assert!(created_shows(None, None, 5));
        assert!(created_shows(Some(2), Some(5), 5));
        assert!(!created_shows(Some(2), Some(6), 5), "trimmed");
        assert!(!created_shows(Some(3), Some(4), 5), "trimmed");
        assert!(!created_shows(Some(1), Some(4), 5), "stored at seq 1");
        assert!(!created_shows(None, None, 0), "no timeline");
    }
}
