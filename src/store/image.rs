//! Reading a whole task as one consistent image (for `herald export`), and walking every
//! record of the other trees, while herald may be writing.
//!
//! A task's spec, progress, messages and runs are read in one atomic read
//! ([`super::backend::Backend::get_atomic`]), so the image is one the engine really wrote:
//! never a progress record from before a step next to a run from after it. Which keys to
//! read is learnt by a scan first; if the task grew a run (or a PATCH changed its messages) in
//! between, the read is done again.
#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::too_many_lines,
    reason = "lint pass pending: issue 22, files owned by another helper this session"
)]

use super::backend::TreeId;
use super::codec::decode;
use super::records::{join, ProgressRecord, SpecRecord};
use super::timeline::{seq_of_key, timeline_key, TimelineRecord};
use super::{bounded, id_prefix, run_key, IdemRecord, Store, StoreError};
use crate::model::{Message, Run};

/// A task with everything the engine needs to carry on with it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskImage {
    pub task: crate::model::Task,
    pub messages: Vec<Message>,
    pub runs: Vec<Run>,
    /// Its timeline events, oldest first (`store/timeline.rs`).
    pub timeline: Vec<crate::model::timeline::TimelineEvent>,
}

/// Times a task may change under the reader before the export gives up on it.
const ATTEMPTS: usize = 20;

impl Store {
    /// Every task id in id order (from the spec tree); a storage error ends the walk with it.
    pub fn task_ids(&self) -> impl Iterator<Item = Result<String, StoreError>> + '_ {
        bounded(self.backend.scan(TreeId::Specs, &[], None))
            .map(|item| item.map(|(k, _)| String::from_utf8_lossy(&k).into_owned()))
    }

    /// Every idempotency key with its record, in key order. Unreadable records are errors
    /// naming their key.
    pub fn idem_records(
        &self,
    ) -> impl Iterator<Item = Result<(String, IdemRecord), StoreError>> + '_ {
        bounded(self.backend.scan(TreeId::Idem, &[], None)).map(|item| {
            let (k, v) = item?;
            let rec: IdemRecord = decode("idempotency", &k, &v)?;
            Ok((String::from_utf8_lossy(&k).into_owned(), rec))
        })
    }

    /// Task `id` as one consistent image; `None` if it does not exist (any more).
    pub fn task_image(&self, id: &str) -> Result<Option<TaskImage>, StoreError> {
        let prefix = id_prefix(id);
        for _ in 0..ATTEMPTS {
            let Some(spec) = self.get_decoded::<SpecRecord>(TreeId::Specs, id.as_bytes())? else {
                return Ok(None);
            };
            let mut run_nos = Vec::new();
            for item in bounded(self.backend.scan(TreeId::Runs, &prefix, Some(&prefix))) {
                let (k, _) = item?;
                let n = k
                    .get(prefix.len()..)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map(u32::from_be_bytes)
                    .ok_or_else(|| StoreError::Corrupt {
                        tree: "runs".into(),
                        key: String::from_utf8_lossy(&k).into_owned(),
                        detail: "a run key must end in a 4-byte run number".into(),
                    })?;
                run_nos.push(n);
            }
            let next_run = run_nos.last().map_or(1, |n| n.saturating_add(1));
            let mut seqs = Vec::new();
            for item in bounded(self.backend.scan(TreeId::Timeline, &prefix, Some(&prefix))) {
                let (k, _) = item?;
                if let Some(seq) = seq_of_key(id, &k) {
                    seqs.push(seq);
                }
            }
            let next_seq = seqs.last().map_or(1, |n| n.saturating_add(1));
            // A message inside the spec (format 6) is read with it.
            let count = if spec.message.is_some() {
                0
            } else {
                spec.message_count
            };
            let mut keys = vec![
                (TreeId::Specs, id.as_bytes().to_vec()),
                (TreeId::Progress, id.as_bytes().to_vec()),
                (TreeId::Runs, run_key(id, next_run)),
                // The progress of a task that has none stored is derived from this.
                (TreeId::Live, id.as_bytes().to_vec()),
            ];
            keys.extend((0..count).map(|s| (TreeId::Messages, run_key(id, s))));
            keys.extend(run_nos.iter().map(|n| (TreeId::Runs, run_key(id, *n))));
            // The events after the runs: an event past the last one scanned means the task
            // took a step meanwhile (read again); one of those scanned may have been trimmed.
            keys.push((TreeId::Timeline, timeline_key(id, next_seq)));
            keys.extend(
                seqs.iter()
                    .map(|n| (TreeId::Timeline, timeline_key(id, *n))),
            );
            let vals = self.backend.get_atomic(&keys)?;
            // spec, progress, the next run, live; then messages and runs; then the events.
            let runs_end = 4 + count as usize + run_nos.len();
            let (vals, events_vals) = vals.split_at(runs_end.min(vals.len()));
            if events_vals.first().is_some_and(Option::is_some) {
                continue;
            }
            let Some(spec_bytes) = &vals[0] else {
                return Ok(None); // deleted meanwhile
            };
            let spec: SpecRecord = decode("specs", id.as_bytes(), spec_bytes)?;
            let progress: ProgressRecord = match (&vals[1], &vals[3]) {
                (Some(p), _) => decode("progress", id.as_bytes(), p)?,
                (None, Some(l)) => {
                    ProgressRecord::initial(&spec, &decode("live", id.as_bytes(), l)?)
                }
                (None, None) => return Ok(None), // deleted meanwhile
            };
            const HEAD: usize = 4;
            let runs_vals = &vals[HEAD + count as usize..];
            let inline = spec.message.is_some();
            // A run started or the messages changed between the scan and the read: again.
            if (if inline { 0 } else { spec.message_count }) != count
                || vals[2].is_some()
                || runs_vals.iter().any(Option::is_none)
            {
                continue;
            }
            let mut messages = Vec::with_capacity(spec.message_count as usize);
            messages.extend(spec.message.clone());
            for (seq, v) in vals[HEAD..HEAD + count as usize].iter().enumerate() {
                let key = run_key(id, seq as u32);
                let v = v.as_ref().ok_or_else(|| StoreError::Corrupt {
                    tree: "messages".into(),
                    key: format!("{id}/{seq}"),
                    detail: format!("the task has {count} messages but message {seq} is missing"),
                })?;
                messages.push(decode("messages", &key, v)?);
            }
            let mut runs = Vec::with_capacity(run_nos.len());
            for (n, v) in run_nos.iter().zip(runs_vals) {
                if let Some(v) = v {
                    runs.push(decode("runs", &run_key(id, *n), v)?);
                }
            }
            let mut timeline = Vec::with_capacity(seqs.len());
            for (seq, v) in seqs.iter().zip(&events_vals[1..]) {
                if let Some(v) = v {
                    let key = timeline_key(id, *seq);
                    let rec: TimelineRecord = decode("timeline", &key, v)?;
                    timeline.push(rec.into_event(*seq, &key)?);
                }
            }
            return Ok(Some(TaskImage {
                task: join(spec, progress),
                messages,
                runs,
                timeline,
            }));
        }
        Err(StoreError::Write(format!(
            "task {id:?} kept changing while it was read ({ATTEMPTS} attempts)"
        )))
    }
}
