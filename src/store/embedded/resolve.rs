//! A group's jobs resolved into plain writes: preconditions checked and secondary index keys
//! derived against the memtable, sled and the group's own earlier writes.

use std::collections::HashMap;

use super::super::backend::{
    idem_names, Backend, IndexedWrite, RawOp, Rejected, TreeId, Unstored, TREES,
};
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
    /// Values an indexed write of the group gave a key without storing them
    /// (`IndexedWrite::store` false): what a later job of the group reads as its old value.
    unstored: Unstored,
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
            unstored: HashMap::new(),
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
            let refused = match op {
                RawOp::Absent(t, k) => self.get(*t, k)?.is_some().then_some((*t, k)),
                RawOp::IdemOf(k, task) => {
                    let v = self.get(TreeId::Idem, k)?;
                    (!idem_names(v.as_deref(), task)).then_some((TreeId::Idem, k))
                }
                _ => None,
            };
            if let Some((tree, key)) = refused {
                return Ok(Err(Rejected {
                    tree,
                    key: key.clone(),
                    lost_shard: None,
                }));
            }
        }
        for op in ops {
            match op {
                RawOp::Put(t, k, v) => self.put(t, k, Some(v)),
                RawOp::Delete(t, k) => self.put(t, k, None),
                RawOp::Absent(..) | RawOp::Born(_) | RawOp::IdemOf(..) | RawOp::LoadedAt(..) => {}
                RawOp::Indexed(w) => self.indexed(*w)?,
            }
        }
        Ok(Ok(()))
    }

    /// An indexed write: the old value (the group's own, stored, or derived), then the index
    /// entries, then the value.
    fn indexed(&mut self, mut w: IndexedWrite) -> Result<(), StoreError> {
        let (tree, derived_from, derive) = (w.tree, w.derived_from, w.derive);
        let key = w.key.clone();
        let known = w.old.take();
        // The writer's promise covers what was stored before this group, not what an earlier
        // job of the group wrote. `stored`: the old value is in `tree` (not derived, not an
        // unstored value).
        let (old, stored) = match (
            self.unstored.get(&(tree, key.clone())),
            self.written(tree, &key),
        ) {
            (Some(v), _) => (v.clone(), false),
            (None, Some(v)) => (v, true),
            (None, None) if w.stored_absent => {
                debug_assert!(
                    self.backend.get(tree, &key)?.is_none(),
                    "a stored_absent promise was wrong"
                );
                (None, true)
            }
            // Known to the writer: not read (stored or derived, it is not said, so a value
            // unchanged is written again rather than skipped).
            (None, None) if known.is_some() => {
                if cfg!(debug_assertions) {
                    let (stored, _) = self.stored_or_derived(tree, &key, derived_from, derive)?;
                    w.check_known(&known, &stored);
                }
                (known, false)
            }
            (None, None) => self.stored_or_derived(tree, &key, derived_from, derive)?,
        };
        let mut puts = Vec::new();
        w.resolve(old, stored, &mut self.unstored, |t, k, v| {
            puts.push((t, k, v))
        });
        for (t, k, v) in puts {
            self.put(t, k, v);
        }
        Ok(())
    }

    /// The value of `key` as stored before the group (`true`), or derived from its source
    /// as stored then (`false`): a job that rewrites the source (a patch's spec) stores the
    /// value too, which the group's own writes answer before this is asked.
    fn stored_or_derived(
        &self,
        tree: TreeId,
        key: &[u8],
        derived_from: TreeId,
        derive: fn(&[u8], &[u8]) -> Option<Vec<u8>>,
    ) -> Result<(Option<Vec<u8>>, bool), StoreError> {
        Ok(match self.backend.get(tree, key)? {
            Some(v) => (Some(v), true),
            None => (
                self.backend
                    .get(derived_from, key)?
                    .and_then(|from| derive(key, &from)),
                false,
            ),
        })
    }
}
