//! A group's jobs resolved into plain writes: preconditions checked and secondary index keys
//! derived against the memtable, sled and the group's own earlier writes.

use std::collections::HashMap;

use super::super::backend::{Backend, IndexedWrite, RawOp, Rejected, TreeId, TREES};
use super::super::wal::Write;
use super::super::StoreError;
use super::SledBackend;

/// A group's writes so far, over the memtable and sled: what the next job of the group reads.
pub(super) struct Resolver<'a> {
    backend: &'a SledBackend,
    /// Per tree, where the newest write of each key the group wrote is in `writes` (a value is
    /// not copied for it: most are never read again). One map per tree so that a read looks a
    /// key up by its slice, without copying it.
    seen: [HashMap<Vec<u8>, usize, foldhash::fast::RandomState>; TREES],
    pub(super) writes: Vec<Write>,
}

impl Resolver<'_> {
    pub(super) fn new(backend: &SledBackend, jobs: usize) -> Resolver<'_> {
        Resolver {
            backend,
            // Room for a create's writes per job: growing the maps was ~5 % of the thread.
            seen: std::array::from_fn(|_| {
                HashMap::with_capacity_and_hasher(jobs, Default::default())
            }),
            writes: Vec::with_capacity(jobs * 6),
        }
    }

    /// What the group wrote to `key`, if it did.
    fn written(&self, tree: TreeId, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let i = *tree.of(&self.seen).get(key)?;
        self.writes.get(i).map(|w| w.value.clone())
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.written(tree, key) {
            Some(v) => Ok(v),
            None => self.backend.get(tree, key),
        }
    }

    fn put(&mut self, tree: TreeId, key: Vec<u8>, value: Option<Vec<u8>>) {
        tree.of_mut(&mut self.seen)
            .insert(key.clone(), self.writes.len());
        self.writes.push(Write { tree, key, value });
    }

    /// One job: its preconditions, then its writes.
    pub(super) fn job(&mut self, ops: Vec<RawOp>) -> Result<Result<(), Rejected>, StoreError> {
        for op in &ops {
            if let RawOp::Absent(t, k) = op {
                if self.get(*t, k)?.is_some() {
                    return Ok(Err(Rejected {
                        tree: *t,
                        key: k.clone(),
                        lost_shard: None,
                    }));
                }
            }
        }
        for op in ops {
            match op {
                RawOp::Put(t, k, v) => self.put(t, k, Some(v)),
                RawOp::Delete(t, k) => self.put(t, k, None),
                RawOp::Absent(..) | RawOp::Born(_) | RawOp::IdemOf(..) => {}
                RawOp::Indexed(w) => {
                    let IndexedWrite {
                        tree,
                        key,
                        value,
                        index,
                        index_key,
                        stored_absent,
                    } = *w;
                    // The writer's promise covers what was stored before this group, not what
                    // an earlier job of the group wrote.
                    let old = match (self.written(tree, &key), stored_absent) {
                        (Some(v), _) => v,
                        (None, true) => {
                            debug_assert!(
                                self.backend.get(tree, &key)?.is_none(),
                                "a stored_absent promise was wrong"
                            );
                            None
                        }
                        (None, false) => self.backend.get(tree, &key)?,
                    };
                    if old == value {
                        continue;
                    }
                    if let Some(old) = &old {
                        self.put(index, index_key(&key, old), None);
                    }
                    if let Some(v) = &value {
                        self.put(index, index_key(&key, v), Some(v.clone()));
                    }
                    self.put(tree, key, value);
                }
            }
        }
        Ok(Ok(()))
    }
}
