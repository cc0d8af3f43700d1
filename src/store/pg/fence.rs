//! Cluster mode's fence on a commit group (HA.md "Fence every write"), the part that belongs
//! to the store: which shards each job writes, which jobs may go at all, and the inbox rows
//! of tasks created for shards this process does not hold. Pure; `backend.rs` runs the
//! statements (`SELECT … FOR KEY SHARE` on the shards' lease rows first in the group's
//! transaction, through `cluster::rows::fence`'s protocol).
//!
//! The rule, per job:
//! - every row it writes is in a shard this process holds and trusts now ([`Fence::epoch`]),
//!   checked again against the lease row inside the transaction; or
//! - the row belongs to a task the job creates ([`RawOp::Born`]) in a shard this process does
//!   not hold: written unfenced (nobody has the new task loaded, and its id is required
//!   absent), with an inbox row that tells the shard's owner to load it.
//!
//! A job that writes from a task's memory read at an epoch of its shard ([`RawOp::LoadedAt`],
//! the engine's cells in cluster mode) is fenced at that epoch, and refused unless the shard is
//! held at it still: a shard let go and held again is at a newer epoch, and another owner may
//! have written the task in between (the engine's `cells::superseded` stops a settle after a
//! send from such a cell; this stops every write from one, a write queued behind a slow group
//! included).
//!
//! A job that breaks the rule is answered `Rejected { lost_shard }` and nothing of it is
//! written; the rest of the group goes on.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::shard::{fnv1a64, task_id_of};
use crate::store::backend::{RawOp, TreeId};

/// What the store asks of the process's leases (implemented by `cluster::node::Ownership`).
pub trait Fence: Send + Sync {
    /// The epoch `shard` is held at, if this process holds and trusts it now.
    fn epoch(&self, shard: u32) -> Option<u64>;
    /// A fenced write at `epoch` found `shard` taken over (the fence refused it): stop acting
    /// on it, if it is still held at that epoch (a grant made since, at a newer one, stands: a
    /// late answer of an old group must not drop it).
    fn lost(&self, shard: u32, epoch: u64);
    /// A fenced write at `epoch` on `shard` failed with its outcome unknown: stop acting on
    /// it, as [`Fence::lost`], though the fence refused nothing (the process's counter of
    /// refused writes leaves it out).
    fn outcome_unknown(&self, shard: u32, epoch: u64) {
        self.lost(shard, epoch);
    }
    /// Every shard held and trusted now, with its epoch.
    fn held(&self) -> Vec<(u32, u64)>;
}

/// The shard of a task id.
pub fn shard_of_task(id: &str, shards: u32) -> u32 {
    u32::try_from(fnv1a64(id.as_bytes()) % u64::from(shards.max(1))).unwrap_or(0)
}

/// What one job needs of the fence.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct JobFence {
    /// Shards whose epochs must still be the ones held, by shard.
    pub epochs: BTreeMap<u32, u64>,
    /// Tasks this job creates in shards not held: `(shard, task id)`.
    pub inbox: Vec<(u32, String)>,
}

/// A job's fence, or the first shard it writes that this process does not hold.
///
/// A shard not held takes only rows of tasks the job creates there: a job that also writes
/// another task's rows in it (a settle whose notification task hashes to the settled task's
/// shard, after that shard was lost) is refused whole, or its other rows would be written
/// unfenced over the new owner's.
pub fn job_fence(ops: &[RawOp], shards: u32, fence: &dyn Fence) -> Result<JobFence, u32> {
    let born: BTreeSet<&[u8]> = ops
        .iter()
        .filter_map(|op| match op {
            RawOp::Born(id) => Some(id.as_bytes()),
            _ => None,
        })
        .collect();
    // An idempotency key's row is in its task's shard; a delete carries no record to read
    // the task from, so the job names it.
    let idem_of: BTreeMap<&[u8], &str> = ops
        .iter()
        .filter_map(|op| match op {
            RawOp::IdemOf(k, task) => Some((k.as_slice(), task.as_str())),
            _ => None,
        })
        .collect();
    // Per shard written: whether a row of a task not created here is among them, and the
    // created tasks with rows in it.
    let mut written: BTreeMap<u32, (bool, BTreeSet<String>)> = BTreeMap::new();
    for op in ops {
        // `freed`: an idempotency key's delete that applies only while the key still names
        // its gone task (`RawOp::IdemOf`, checked in the transaction): no owner's state is in
        // it, so it needs no fence of its own.
        let (task, freed): (Cow<'_, [u8]>, bool) = match op {
            RawOp::Put(t, k, v) => (task_id_of(*t, k, Some(v)), false),
            RawOp::Delete(t, k) => match idem_of.get(k.as_slice()) {
                Some(task) if *t == TreeId::Idem => (Cow::Borrowed(task.as_bytes()), true),
                _ => (task_id_of(*t, k, None), false),
            },
            RawOp::Indexed(w) => (task_id_of(w.tree, &w.key, w.value.as_deref()), false),
            // Preconditions and markers write nothing.
            RawOp::Absent(..) | RawOp::Born(_) | RawOp::IdemOf(..) | RawOp::LoadedAt(..) => {
                continue
            }
        };
        let shard = u32::try_from(fnv1a64(&task) % u64::from(shards.max(1))).unwrap_or(0);
        let entry = written.entry(shard).or_default();
        if born.contains(task.as_ref()) {
            entry.1.insert(String::from_utf8_lossy(&task).into_owned());
        } else if !freed {
            entry.0 = true;
        }
    }
    let mut out = JobFence::default();
    for (shard, (others, created)) in written {
        match fence.epoch(shard) {
            Some(e) => {
                out.epochs.insert(shard, e);
            }
            // Neither held nor only created tasks' rows (and freed keys): refused whole.
            None if others || created.is_empty() => return Err(shard),
            // Every task created there gets its inbox row: its owner loads it from that.
            None => out.inbox.extend(created.into_iter().map(|id| (shard, id))),
        }
    }
    // Asked last, and the job fenced at the marker's epoch: a grant at a newer one made since
    // the loop above asked is refused in the transaction, never taken for the marker's.
    for op in ops {
        if let RawOp::LoadedAt(task, loaded) = op {
            let shard = shard_of_task(task, shards);
            if fence.epoch(shard) != Some(*loaded) {
                return Err(shard);
            }
            out.epochs.insert(shard, *loaded);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::backend::TreeId;
    use parking_lot::Mutex;

    struct Held(Mutex<BTreeMap<u32, u64>>);
    impl Fence for Held {
        fn epoch(&self, shard: u32) -> Option<u64> {
            self.0.lock().get(&shard).copied()
        }
        fn lost(&self, shard: u32, epoch: u64) {
            let mut held = self.0.lock();
            if held.get(&shard) == Some(&epoch) {
                held.remove(&shard);
            }
        }
        fn held(&self) -> Vec<(u32, u64)> {
            self.0.lock().iter().map(|(s, e)| (*s, *e)).collect()
        }
    }

    /// The first `prefix`N whose shard among `shards` is (`same`) or is not `s`.
    fn id_where(prefix: &str, shards: u32, s: u32, same: bool) -> String {
        (0..10_000)
            .map(|i| format!("{prefix}{i}"))
            .find(|id| (shard_of_task(id, shards) == s) == same)
            .unwrap()
    }

    fn put(id: &str) -> RawOp {
        RawOp::Put(TreeId::Specs, id.as_bytes().to_vec(), b"v".to_vec())
    }

    #[test]
    fn a_held_shard_is_fenced_at_its_epoch_and_another_is_refused() {
        let s = shard_of_task("a", 8);
        let f = Held(Mutex::new(BTreeMap::from([(s, 7)])));
        let j = job_fence(&[put("a")], 8, &f).unwrap();
        assert_eq!(j.epochs, BTreeMap::from([(s, 7)]));
        assert!(j.inbox.is_empty());
        let other = id_where("t", 8, s, false);
        assert_eq!(
            job_fence(&[put(&other)], 8, &f),
            Err(shard_of_task(&other, 8))
        );
    }

    #[test]
    fn an_idempotency_key_delete_is_fenced_in_its_tasks_shard() {
        // A key whose own hash falls in another shard than its task's.
        let task = "t1";
        let s = shard_of_task(task, 8);
        let key = id_where("k", 8, s, false);
        let f = Held(Mutex::new(BTreeMap::from([(s, 3)])));
        let del = RawOp::Delete(TreeId::Idem, key.as_bytes().to_vec());
        let marked = [
            RawOp::IdemOf(key.as_bytes().to_vec(), task.into()),
            del.clone(),
        ];
        assert_eq!(
            job_fence(&marked, 8, &f).map(|j| j.epochs),
            Ok(BTreeMap::from([(s, 3)])),
            "held: fenced at the task's shard's epoch"
        );
        assert_eq!(
            job_fence(&[del], 8, &f),
            Err(shard_of_task(&key, 8)),
            "unmarked, the key's own shard (not held) refuses it"
        );
    }

    #[test]
    fn a_created_task_in_a_shard_not_held_goes_to_the_inbox() {
        let f = Held(Mutex::new(BTreeMap::new()));
        let ops = [
            RawOp::Absent(TreeId::Specs, b"new".to_vec()),
            RawOp::Born("new".into()),
            put("new"),
        ];
        let j = job_fence(&ops, 8, &f).unwrap();
        assert!(j.epochs.is_empty());
        assert_eq!(j.inbox, vec![(shard_of_task("new", 8), "new".to_string())]);
        // Held: fenced like any write, no inbox row.
        f.0.lock().insert(shard_of_task("new", 8), 3);
        let j = job_fence(&ops, 8, &f).unwrap();
        assert_eq!(j.epochs.len(), 1);
        assert!(j.inbox.is_empty());
        f.lost(shard_of_task("new", 8), 2);
        assert_eq!(
            f.held().len(),
            1,
            "a loss at an older epoch keeps the grant"
        );
        f.lost(shard_of_task("new", 8), 3);
        assert!(f.held().is_empty());
    }

    /// Review finding: a settle whose notification task hashes to the settled task's shard,
    /// after that shard was lost, went to the inbox whole: the settled task's rows unfenced
    /// over the new owner's.
    #[test]
    fn another_tasks_rows_beside_a_created_one_in_a_shard_not_held_are_refused() {
        let s = shard_of_task("parent", 64);
        let note = id_where("n", 64, s, true);
        let f = Held(Mutex::new(BTreeMap::new()));
        let ops = [
            RawOp::Put(TreeId::Progress, b"parent".to_vec(), b"v".to_vec()),
            RawOp::Absent(TreeId::Specs, note.as_bytes().to_vec()),
            RawOp::Born(note.clone()),
            put(&note),
        ];
        assert_eq!(job_fence(&ops, 64, &f), Err(s));
        // Held, the whole job is fenced at its epoch.
        f.0.lock().insert(s, 4);
        assert_eq!(
            job_fence(&ops, 64, &f).map(|j| j.epochs),
            Ok(BTreeMap::from([(s, 4)]))
        );
    }

    /// Review finding: the fence compared a write with the epoch held when it was made, not
    /// the one its task's memory was read at, so a shard let go and held again (a new epoch)
    /// let a write from memory read under the old one through.
    #[test]
    fn a_write_from_memory_read_at_an_older_epoch_is_refused() {
        let s = shard_of_task("a", 8);
        let f = Held(Mutex::new(BTreeMap::from([(s, 5)])));
        let from = |epoch| [RawOp::LoadedAt("a".into(), epoch), put("a")];
        assert_eq!(
            job_fence(&from(5), 8, &f).map(|j| j.epochs),
            Ok(BTreeMap::from([(s, 5)])),
            "read at the epoch held: fenced at it"
        );
        assert_eq!(
            job_fence(&from(4), 8, &f),
            Err(s),
            "read before the shard was let go and held again: refused"
        );
        assert_eq!(
            job_fence(&[put("a")], 8, &f).map(|j| j.epochs),
            Ok(BTreeMap::from([(s, 5)])),
            "no marker (a write from no task's memory): the epoch held"
        );
        f.lost(s, 5);
        assert_eq!(job_fence(&from(5), 8, &f), Err(s), "not held: refused");
        // Another task's marker in a chunk's job refuses the whole job.
        let b = id_where("b", 8, s, false);
        f.0.lock().insert(s, 6);
        f.0.lock().insert(shard_of_task(&b, 8), 2);
        let chunk = [
            RawOp::LoadedAt("a".into(), 6),
            put("a"),
            RawOp::LoadedAt(b.clone(), 1),
            put(&b),
        ];
        assert_eq!(job_fence(&chunk, 8, &f), Err(shard_of_task(&b, 8)));
    }

    #[test]
    fn two_tasks_created_in_one_shard_not_held_each_get_an_inbox_row() {
        let s = shard_of_task("a", 64);
        let b = id_where("b", 64, s, true);
        let f = Held(Mutex::new(BTreeMap::new()));
        let ops = [
            RawOp::Born("a".into()),
            put("a"),
            RawOp::Born(b.clone()),
            put(&b),
        ];
        let mut inbox = job_fence(&ops, 64, &f).unwrap().inbox;
        inbox.sort();
        let mut want = vec![(s, "a".to_string()), (s, b)];
        want.sort();
        assert_eq!(inbox, want);
    }
}
