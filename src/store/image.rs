//! Reading a whole task as one consistent image (for `herald export`), and walking every
//! record of the other trees, while herald may be writing.
//!
//! A task's spec, progress, messages and runs are read in one atomic read
//! ([`super::backend::Backend::get_atomic`]), so the image is one the engine really wrote:
//! never a progress record from before a step next to a run from after it. Which keys to
//! read is learnt by a scan first; if the task grew a run (or a PATCH changed its messages) in
//! between, the read is done again.

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

/// One attempt at an image: done (the task, or `None`: it does not exist), or read again
/// (the task changed between the scan and the atomic read).
enum Read {
    Done(Option<Box<TaskImage>>),
    Again,
    /// The spec counts more messages than are stored: a delete or a patch raced the read
    /// (read again), or damage, if it stays so over every attempt.
    Unbacked(String),
}

/// Which keys the atomic read asks for, learnt by the scans before it.
struct Plan {
    /// Messages stored apart from the spec (none when the spec holds its only message).
    count: u32,
    run_nos: Vec<u32>,
    seqs: Vec<u64>,
}

/// The values of an atomic read in the order [`Store::image_keys`] asked for them.
/// Timeline keys probed past the last one scanned.
const NEXT_EVENTS: usize = 2;

struct Values<'a> {
    spec: &'a Option<Vec<u8>>,
    progress: &'a Option<Vec<u8>>,
    next_run: &'a Option<Vec<u8>>,
    messages: &'a [Option<Vec<u8>>],
    runs: &'a [Option<Vec<u8>>],
    /// The two seqs after the last event scanned (a step's events may start with an attempt
    /// and its delivery, one record at the second seq: `TimelineRecord::Delivered`).
    next_events: &'a [Option<Vec<u8>>],
    events: &'a [Option<Vec<u8>>],
}

impl<'a> Values<'a> {
    /// Splits `vals` as `plan` laid them out; `None` if the read answered fewer values.
    fn of(vals: &'a [Option<Vec<u8>>], plan: &Plan) -> Option<Values<'a>> {
        let (head, rest) = vals.split_at_checked(3)?;
        let [spec, progress, next_run] = head else {
            return None;
        };
        let (messages, rest) = rest.split_at_checked(plan.count as usize)?;
        let (runs, rest) = rest.split_at_checked(plan.run_nos.len())?;
        let (next_events, events) = rest.split_at_checked(NEXT_EVENTS)?;
        Some(Values {
            spec,
            progress,
            next_run,
            messages,
            runs,
            next_events,
            events,
        })
    }
}

impl Store {
    /// Every task id in id order (from the spec tree); a storage error ends the walk with it.
    /// A key that is not UTF-8 (damage: ids are UTF-8) is an error naming it: taken lossily,
    /// its task would read as deleted meanwhile and be left out of an export without a word.
    pub fn task_ids(&self) -> impl Iterator<Item = Result<String, StoreError>> + '_ {
        bounded(self.backend.scan(TreeId::Specs, &[], None)).map(|item| {
            let (k, _) = item?;
            String::from_utf8(k).map_err(|e| StoreError::Corrupt {
                tree: "specs".into(),
                key: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                detail: "a task id that is not UTF-8".into(),
            })
        })
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
        let mut unbacked = None;
        for _ in 0..ATTEMPTS {
            match self.read_image(id)? {
                Read::Done(image) => return Ok(image.map(|b| *b)),
                Read::Again => unbacked = None,
                Read::Unbacked(detail) => unbacked = Some(detail),
            }
        }
        Err(match unbacked {
            Some(detail) => StoreError::Corrupt {
                tree: "specs".into(),
                key: id.into(),
                detail,
            },
            None => StoreError::Write(format!(
                "task {id:?} kept changing while it was read ({ATTEMPTS} attempts)"
            )),
        })
    }

    /// One attempt: scan for the keys, read them atomically, decode.
    fn read_image(&self, id: &str) -> Result<Read, StoreError> {
        let Some(spec) = self.get_decoded::<SpecRecord>(TreeId::Specs, id.as_bytes())? else {
            return Ok(Read::Done(None));
        };
        let plan = match self.image_plan(id, &spec)? {
            Ok(plan) => plan,
            Err(detail) => return Ok(Read::Unbacked(detail)),
        };
        let vals = self.backend.get_atomic(&image_keys(id, &plan))?;
        let Some(v) = Values::of(&vals, &plan) else {
            return Ok(Read::Again);
        };
        // An event past the last one scanned means the task took a step meanwhile; so does a
        // run after the last one scanned, a run gone, or messages changed.
        let inline = spec.message.is_some();
        if v.next_events.iter().any(Option::is_some)
            || v.next_run.is_some()
            || v.runs.iter().any(Option::is_none)
            || (if inline { 0 } else { spec.message_count }) != plan.count
        {
            return Ok(Read::Again);
        }
        let Some(spec_bytes) = v.spec else {
            return Ok(Read::Done(None)); // deleted meanwhile
        };
        let spec: SpecRecord = decode("specs", id.as_bytes(), spec_bytes)?;
        let progress: ProgressRecord = match v.progress {
            Some(p) => decode("progress", id.as_bytes(), p)?,
            None => match ProgressRecord::initial(&spec) {
                Some(p) => p,
                None => return Ok(Read::Done(None)), // deleted meanwhile
            },
        };
        let messages = decode_messages(id, &spec, &plan, v.messages)?;
        let mut runs = Vec::with_capacity(plan.run_nos.len());
        for (n, v) in plan
            .run_nos
            .iter()
            .zip(v.runs)
            .filter_map(|(n, v)| Some((n, v.as_ref()?)))
        {
            runs.push(decode("runs", &run_key(id, *n), v)?);
        }
        let mut timeline = Vec::with_capacity(plan.seqs.len());
        for (seq, v) in plan
            .seqs
            .iter()
            .zip(v.events)
            .filter_map(|(s, v)| Some((s, v.as_ref()?)))
        {
            let key = timeline_key(id, *seq);
            let rec: TimelineRecord = decode("timeline", &key, v)?;
            let (first, e) = rec.into_events(*seq, &key)?;
            timeline.extend(first);
            timeline.push(e);
        }
        Ok(Read::Done(Some(Box::new(TaskImage {
            task: join(spec, progress),
            messages,
            runs,
            timeline,
        }))))
    }

    /// The task's run numbers and timeline seqs as the scans find them now. Inner `Err`: the
    /// spec counts more messages than are stored (see [`Read::Unbacked`]).
    fn image_plan(&self, id: &str, spec: &SpecRecord) -> Result<Result<Plan, String>, StoreError> {
        let prefix = id_prefix(id);
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
        let mut seqs = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Timeline, &prefix, Some(&prefix))) {
            let (k, _) = item?;
            if let Some(seq) = seq_of_key(id, &k) {
                seqs.push(seq);
            }
        }
        // A message inside the spec (format 6) is read with it.
        let count = if spec.message.is_some() {
            0
        } else {
            spec.message_count
        };
        // The count comes from disk and sizes the read: one the stored messages do not back
        // (a delete or a patch since the spec was read, or damage) is not used to ask for a
        // key per message it claims.
        if count > 0 {
            let last = self
                .backend
                .last_with_prefix(TreeId::Messages, &prefix)?
                .and_then(|(k, _)| k.get(prefix.len()..).map(<[u8]>::to_vec))
                .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
                .map(u32::from_be_bytes);
            if last.is_none_or(|l| count > l.saturating_add(1)) {
                return Ok(Err(format!(
                    "the task has {count} messages but the last one stored is {last:?}"
                )));
            }
        }
        Ok(Ok(Plan {
            count,
            run_nos,
            seqs,
        }))
    }
}

/// The keys of one atomic read: spec, progress, the run after the last one scanned;
/// then the messages, the runs, the two events after the last one scanned and the events.
fn image_keys(id: &str, plan: &Plan) -> Vec<(TreeId, Vec<u8>)> {
    let next_run = plan.run_nos.last().map_or(1, |n| n.saturating_add(1));
    let next_seq = plan.seqs.last().map_or(1, |n| n.saturating_add(1));
    let mut keys = vec![
        (TreeId::Specs, id.as_bytes().to_vec()),
        (TreeId::Progress, id.as_bytes().to_vec()),
        (TreeId::Runs, run_key(id, next_run)),
    ];
    keys.extend((0..plan.count).map(|s| (TreeId::Messages, run_key(id, s))));
    keys.extend(plan.run_nos.iter().map(|n| (TreeId::Runs, run_key(id, *n))));
    keys.extend((0..NEXT_EVENTS as u64).map(|i| {
        (
            TreeId::Timeline,
            timeline_key(id, next_seq.saturating_add(i)),
        )
    }));
    keys.extend(
        plan.seqs
            .iter()
            .map(|n| (TreeId::Timeline, timeline_key(id, *n))),
    );
    keys
}

/// The task's messages: the one inside its spec, or those stored apart, every one present.
fn decode_messages(
    id: &str,
    spec: &SpecRecord,
    plan: &Plan,
    vals: &[Option<Vec<u8>>],
) -> Result<Vec<Message>, StoreError> {
    // Sized by what was read, not by the count the record states: a damaged count must not
    // ask for gigabytes before the missing message is found.
    let mut messages = Vec::with_capacity(
        vals.len().min(plan.count as usize) + usize::from(spec.message.is_some()),
    );
    messages.extend(spec.message.clone());
    for (seq, v) in (0..plan.count).zip(vals) {
        let key = run_key(id, seq);
        let v = v.as_ref().ok_or_else(|| StoreError::Corrupt {
            tree: "messages".into(),
            key: format!("{id}/{seq}"),
            detail: format!(
                "the task has {} messages but message {seq} is missing",
                plan.count
            ),
        })?;
        messages.push(decode("messages", &key, v)?);
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use crate::model::TimelineEvent;
    use crate::store::{Batch, Store, StoreError};

    /// A spec key that is not UTF-8 (damage: herald writes ids of UTF-8 only) is an error
    /// naming it, not a lossy id that then reads as "deleted meanwhile" and is left out of
    /// an export without a word.
    #[tokio::test]
    async fn a_spec_key_that_is_not_utf8_is_corrupt_not_skipped() {
        use crate::store::backend::{RawOp, TreeId};
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (t, m) = crate::store::tests::task("t");
        s.insert_new_task(&t, &m, None).await.unwrap();
        let spec = s.backend.get(TreeId::Specs, b"t").unwrap().unwrap();
        let put = RawOp::Put(TreeId::Specs, b"s\xffx".to_vec(), spec);
        s.commit.write(vec![put], true).await.unwrap().unwrap();
        let ids: Vec<_> = s.task_ids().collect();
        match ids.as_slice() {
            [Err(StoreError::Corrupt { tree, detail, .. }), Ok(t)] => {
                assert_eq!(tree, "specs");
                assert!(detail.contains("UTF-8"), "{detail}");
                assert_eq!(t, "t");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A message count that the stored messages do not back (damage on disk) is refused as
    /// corrupt before the read asks for a key per message it claims (four billion here).
    #[tokio::test]
    async fn a_damaged_message_count_is_corrupt_not_a_huge_read() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (t, m) = crate::store::tests::task("t");
        s.insert_new_task_with(&t, &m, None, &[TimelineEvent::created(&t)])
            .await
            .unwrap();
        assert_eq!(s.task_image("t").unwrap().unwrap().messages.len(), 2);
        let mut damaged = t.clone();
        damaged.message_count = u32::MAX;
        let mut b = Batch::new();
        b.task(&damaged);
        s.write(&b).await.unwrap();
        match s.task_image("t") {
            Err(StoreError::Corrupt { detail, .. }) => {
                assert!(detail.contains("4294967295"), "{detail}")
            }
            other => panic!("{:?}", other.map(|i| i.map(|i| i.messages.len()))),
        }
    }
}
