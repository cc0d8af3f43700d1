//! Deleting finished tasks: the reads that find everything a task holds on disk (its
//! footprint), and the pages the retention sweep walks. The deletes themselves go through the
//! group commit like every other write ([`super::Op::DeleteTask`]; stale keys:
//! [`super::Store::delete_idem_keys`]).

use super::backend::TreeId;
use super::codec::decode;
use super::records::{ProgressRecord, SpecRecord};
use super::{after_key, bounded, id_prefix, IdemRecord, Store, StoreError};
use crate::model::{Failure, Run, RunState};

/// A page of `(key, record)` pairs and the key the next page starts after (`None` at the end).
pub type Page<T> = (Vec<(String, T)>, Option<String>);

/// Everything one task holds on disk, by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub id: String,
    /// Messages `0..messages` (from the spec; counted by a scan when the spec is gone).
    pub messages: u32,
    /// Run numbers with a record.
    pub runs: Vec<u32>,
    /// Failure-list entries of this task.
    pub failures: Vec<String>,
    /// A run is still `running` on disk: a send of a cancelled task may still be settling, and
    /// deleting now would let its settle write records back without their task.
    pub settling: bool,
}

impl Footprint {
    /// Backend writes a delete of it costs (spec, progress, live entry, then the rest).
    pub fn ops(&self) -> usize {
        3 + self.messages as usize + self.runs.len() + self.failures.len()
    }
}

impl Store {
    /// Everything task `id` holds on disk (an empty footprint if it has nothing).
    pub fn footprint(&self, id: &str) -> Result<Footprint, StoreError> {
        let prefix = id_prefix(id);
        let messages = match self.get_decoded::<SpecRecord>(TreeId::Specs, id.as_bytes())? {
            // A message inside the spec goes with it.
            Some(s) if s.message.is_some() => 0,
            Some(s) => s.message_count,
            // A spec-less leftover: count what is there.
            None => bounded(self.backend.scan(TreeId::Messages, &prefix, Some(&prefix)))
                .collect::<Result<Vec<_>, _>>()?
                .len() as u32,
        };
        let mut runs = Vec::new();
        let mut settling = false;
        for item in bounded(self.backend.scan(TreeId::Runs, &prefix, Some(&prefix))) {
            let (k, v) = item?;
            match decode::<Run>("runs", &k, &v) {
                Ok(r) => {
                    settling |= r.state == RunState::Running;
                    runs.push(r.run);
                }
                // An unreadable run record is deleted with its task all the same.
                Err(_) => {
                    if let Some(n) = k.get(prefix.len()..).and_then(|b| b.try_into().ok()) {
                        runs.push(u32::from_be_bytes(n));
                    }
                }
            }
        }
        // Failure ids are `{task}:{run}:{seq}`; the exact task check is needed because task
        // ids may contain ':' themselves.
        let fprefix = format!("{id}:").into_bytes();
        let mut failures = Vec::new();
        for item in bounded(
            self.backend
                .scan(TreeId::Failures, &fprefix, Some(&fprefix)),
        ) {
            let (k, v) = item?;
            let key = String::from_utf8_lossy(&k).into_owned();
            match decode::<Failure>("failures", &k, &v) {
                Ok(f) if f.task_id == id => failures.push(key),
                Ok(_) => {}
                Err(_) if is_failure_id_of(&key, id) => failures.push(key),
                Err(_) => {}
            }
        }
        Ok(Footprint {
            id: id.to_string(),
            messages,
            runs,
            failures,
            settling,
        })
    }

    /// Task `id`'s stored progress record. `None`: none is stored, so the task is gone, or
    /// unfinished with its progress still derived from its spec (a finished task always has
    /// one: `push_task`).
    pub fn stored_progress(&self, id: &str) -> Result<Option<ProgressRecord>, StoreError> {
        self.get_decoded(TreeId::Progress, id.as_bytes())
    }

    /// Up to `limit` progress records in task-id order after `after`, and where the next page
    /// starts (`None` at the end). Unreadable records are skipped (and logged); a storage error
    /// ends the walk.
    pub fn progress_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProgressRecord>, StoreError> {
        let start = after.map(after_key).unwrap_or_default();
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Progress, &start, None)) {
            let (k, v) = item?;
            let id = String::from_utf8_lossy(&k).into_owned();
            if out.len() == limit {
                let next = out.last().map(|(id, _): &(String, _)| id.clone());
                return Ok((out, next));
            }
            match decode::<ProgressRecord>("progress", &k, &v) {
                Ok(p) => out.push((id, p)),
                Err(e) => {
                    tracing::error!(error = %e, "retention skips a progress record it cannot read")
                }
            }
        }
        Ok((out, None))
    }

    /// Up to `limit` idempotency keys after `after` with the task each one names, and where
    /// the next page starts.
    pub fn idem_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<IdemRecord>, StoreError> {
        let start = after.map(after_key).unwrap_or_default();
        let mut out = Vec::new();
        for item in bounded(self.backend.scan(TreeId::Idem, &start, None)) {
            let (k, v) = item?;
            if out.len() == limit {
                let next = out.last().map(|(k, _): &(String, _)| k.clone());
                return Ok((out, next));
            }
            let key = String::from_utf8_lossy(&k).into_owned();
            match decode::<IdemRecord>("idempotency", &k, &v) {
                Ok(r) => out.push((key, r)),
                Err(e) => {
                    tracing::error!(error = %e, "retention skips an idempotency record it cannot read")
                }
            }
        }
        Ok((out, None))
    }
}

/// `key` is `{id}:{run}:{seq}` with two numbers after `id`.
fn is_failure_id_of(key: &str, id: &str) -> bool {
    key.strip_prefix(id)
        .and_then(|r| r.strip_prefix(':'))
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;
    use crate::store::{Batch, Op};

    async fn insert(s: &Store, id: &str) {
        let (t, m) = crate::store::tests::task(id);
        s.insert_new_task(&t, &m, Some((&format!("key-{id}"), [1; 32])))
            .await
            .unwrap();
        let mut b = Batch::new();
        b.run(id, &Run::new(1, 5, 6, 2))
            .failure(crate::store::tests::failure_of(id));
        s.write(&b).await.unwrap();
    }

    #[tokio::test]
    async fn a_delete_takes_exactly_one_task_with_everything_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        // "t:1" is another task whose failure ids also start with "t:".
        insert(&s, "t").await;
        insert(&s, "t:1").await;
        let fp = s.footprint("t").unwrap();
        assert_eq!(
            (fp.messages, fp.runs.clone(), fp.failures.clone()),
            (2, vec![1], vec!["t:1:0".to_string()])
        );
        assert!(fp.settling, "run 1 is still running");
        let mut b = Batch::new();
        b.ops.push(Op::DeleteTask(fp));
        s.write(&b).await.unwrap();
        assert!(s.get_task("t").unwrap().is_none());
        assert!(s.get_message("t", 0).unwrap().is_none());
        assert!(s.runs_of("t").unwrap().is_empty());
        assert!(s.get_failure("t:1:0").unwrap().is_none());
        // The other task is untouched, and the deleted one's key is now stale.
        assert!(s.get_task("t:1").unwrap().is_some());
        assert!(s.get_failure("t:1:1:0").unwrap().is_some());
        assert_eq!(s.runs_of("t:1").unwrap().len(), 1);
        let (keys, next) = s.idem_page(None, 10).unwrap();
        assert_eq!(keys.len(), 2);
        assert!(next.is_none());
        let empty = s.footprint("t").unwrap();
        assert_eq!(
            (empty.messages, empty.runs.len(), empty.failures.len()),
            (0, 0, 0)
        );
    }
}
