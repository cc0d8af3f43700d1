//! The write-behind memtable: the newest value (or deletion) of every key the write-ahead log
//! holds and sled may not yet, so that sled is applied off the write path and a key written
//! several times between checkpoints (a task's fire and settle) reaches sled once.
//!
//! Pure: no IO, no clocks but the age a layer is given. `store/backend.rs` owns the locking and
//! the thread that applies frozen layers to sled.
//!
//! Two layers:
//! - `active` takes every group right after its log record is durable;
//! - `frozen` (at most one) is being applied to sled by the applier thread.
//!
//! A read looks in `active`, then `frozen`, then sled. Invariant: a frozen layer is dropped only
//! after all of it is in sled *and* sled is flushed, so every write that sled may not hold is in
//! a layer, and every write the log still holds is in a layer or durable in sled. [`Mem::gen`]
//! counts dropped layers: a scan that read sled before a drop re-reads it after (see
//! `embedded::MergedScan`).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use super::backend::{TreeId, TREES};
use super::wal::Write;

/// A frozen layer is made once the active one holds this much ...
pub const FREEZE_BYTES: usize = 4 << 20;
/// ... or once its first write is this old (so that memory and replay stay small when idle).
pub const FREEZE_AGE: Duration = Duration::from_secs(1);
/// Over this, a group waits for the applier to finish the frozen layer (back-pressure).
///
/// 64 MiB, twice the soft slope's end and then some (`pace::admit`: delays from 16 MiB, the
/// most from 28): the slope is what holds a steady stream of writes, and the room above it
/// is for a herd's settles, ~58 MB for 100 000 one-shots written within a second of their
/// sends while the applier (idle priority) gets no CPU. At 32 MiB they met this bound every
/// time (83–155 writes per herd found it full), and each wall held every write for a whole
/// frozen layer (280 and 634 ms under a competing `fdatasync` writer): an arm due meanwhile,
/// and a create, answered 503 (docs/performance.md, "a send due while a herd settles"). The
/// slope still keeps a steady stream far below this (`tests/store_backpressure.rs`). A herd
/// of more than ~115 000 one-shots to a local channel meets it again, with the same wall.
pub const ACTIVE_MAX_BYTES: usize = 64 << 20;

/// A key's state in a layer: `Some(value)`, or `None` for a deletion that hides sled's value.
pub type Entry = (Vec<u8>, Option<Vec<u8>>);

/// Writes since a freeze, by tree, newest value per key.
#[derive(Default)]
pub struct Layer {
    trees: [BTreeMap<Vec<u8>, Option<Vec<u8>>>; TREES],
    /// Bytes of keys and values put in, with a fixed overhead per write; a bound on memory.
    pub bytes: usize,
    /// When the first write came (`None` while empty), in the caller's clock.
    pub since: Option<std::time::Instant>,
}

/// A fixed per-entry cost in [`Layer::bytes`]: the B-tree slot and the two allocations.
const ENTRY_OVERHEAD: usize = 64;

impl Layer {
    pub fn is_empty(&self) -> bool {
        self.trees.iter().all(|t| t.is_empty())
    }

    pub fn insert(&mut self, w: Write, now: std::time::Instant) {
        self.since.get_or_insert(now);
        self.bytes += w.key.len() + w.value.as_ref().map_or(0, |v| v.len()) + ENTRY_OVERHEAD;
        w.tree.of_mut(&mut self.trees).insert(w.key, w.value);
    }

    pub fn get(&self, tree: TreeId, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        tree.of(&self.trees).get(key)
    }

    /// The largest key of `tree` this layer holds, a deletion included.
    pub fn last_key(&self, tree: TreeId) -> Option<&[u8]> {
        tree.of(&self.trees)
            .last_key_value()
            .map(|(k, _)| k.as_slice())
    }

    /// Every entry of `tree` in key order (what the applier writes to sled).
    pub fn entries(&self, tree: TreeId) -> impl Iterator<Item = (&Vec<u8>, &Option<Vec<u8>>)> {
        tree.of(&self.trees).iter()
    }

    /// Distinct keys held, over all trees.
    pub fn len(&self) -> usize {
        self.trees.iter().map(|t| t.len()).sum()
    }

    fn range<'a>(
        &'a self,
        tree: TreeId,
        lower: &'a Bound<Vec<u8>>,
    ) -> impl DoubleEndedIterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)> + 'a {
        tree.of(&self.trees)
            .range::<Vec<u8>, _>((lower.as_ref(), Bound::Unbounded))
    }
}

/// The two layers and the count of layers dropped.
#[derive(Default)]
pub struct Mem {
    pub active: Layer,
    pub frozen: Option<Arc<Layer>>,
    /// Bumped each time a frozen layer is dropped (its writes then live in sled only).
    pub gen: u64,
    /// Bumped each time a group goes into the active layer: a read that let go of the lock
    /// in between knows by it whether any value changed meanwhile.
    pub groups: u64,
}

impl Mem {
    /// The newest state of `key`: `None` if no layer has it (ask sled), `Some(None)` if it was
    /// deleted.
    pub fn get(&self, tree: TreeId, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if let Some(v) = self.active.get(tree, key) {
            return Some(v.clone());
        }
        self.frozen.as_ref()?.get(tree, key).cloned()
    }

    /// Up to `max` entries of `tree` after `lower` (deletions included, `active` over `frozen`),
    /// stopping at the first key without `prefix`; and whether that was all of them.
    pub fn chunk(
        &self,
        tree: TreeId,
        lower: &Bound<Vec<u8>>,
        prefix: Option<&[u8]>,
        max: usize,
    ) -> (Vec<Entry>, bool) {
        let empty = Layer::default();
        let frozen = self.frozen.as_deref().unwrap_or(&empty);
        let mut a = self.active.range(tree, lower).peekable();
        let mut f = frozen.range(tree, lower).peekable();
        let mut out = Vec::new();
        loop {
            let next = match (a.peek(), f.peek()) {
                (None, None) => return (out, true),
                (Some(_), None) => a.next(),
                (None, Some(_)) => f.next(),
                (Some((ka, _)), Some((kf, _))) => {
                    if ka <= kf {
                        if ka == kf {
                            f.next();
                        }
                        a.next()
                    } else {
                        f.next()
                    }
                }
            };
            let Some((k, v)) = next else {
                return (out, true);
            };
            if prefix.is_some_and(|p| !k.starts_with(p)) {
                return (out, true);
            }
            if out.len() == max {
                return (out, false);
            }
            out.push((k.clone(), v.clone()));
        }
    }

    /// Every entry of `tree` with `prefix`, in key order (`active` over `frozen`).
    pub fn with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Vec<Entry> {
        self.chunk(
            tree,
            &Bound::Included(prefix.to_vec()),
            Some(prefix),
            usize::MAX,
        )
        .0
    }

    /// Makes `active` the frozen layer and starts an empty one. The caller checked that no
    /// layer is frozen.
    pub fn freeze(&mut self) -> Arc<Layer> {
        debug_assert!(self.frozen.is_none());
        let layer = Arc::new(std::mem::take(&mut self.active));
        self.frozen = Some(layer.clone());
        layer
    }

    /// The frozen layer is in sled and sled is durable: reads go to sled for it from now on.
    pub fn drop_frozen(&mut self) {
        self.frozen = None;
        self.gen += 1;
    }
}

/// Merges a layer's entries over sled's, both in key order: which comes next. `Less` takes
/// the layer's head (dropping sled's head too when the keys are equal: the layer is newer).
pub fn layer_first(layer_key: Option<&[u8]>, sled_key: Option<&[u8]>) -> Option<bool> {
    match (layer_key, sled_key) {
        (None, None) => None,
        (Some(_), None) => Some(true),
        (None, Some(_)) => Some(false),
        (Some(l), Some(s)) => Some(l <= s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn w(k: &str, v: Option<&str>) -> Write {
        Write {
            tree: TreeId::Runs,
            key: k.as_bytes().to_vec(),
            value: v.map(|v| v.as_bytes().to_vec()),
        }
    }

    fn keys(entries: &[Entry]) -> Vec<(String, Option<String>)> {
        entries
            .iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    v.as_ref().map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn the_active_layer_shadows_the_frozen_one_and_deletions_are_kept() {
        let now = Instant::now();
        let mut m = Mem::default();
        m.active.insert(w("a", Some("1")), now);
        m.active.insert(w("b", Some("1")), now);
        m.freeze();
        m.active.insert(w("b", None), now);
        m.active.insert(w("c", Some("2")), now);
        assert_eq!(m.get(TreeId::Runs, b"a"), Some(Some(b"1".to_vec())));
        assert_eq!(m.get(TreeId::Runs, b"b"), Some(None), "deleted since");
        assert_eq!(m.get(TreeId::Runs, b"z"), None, "not in memory: ask sled");
        assert_eq!(m.get(TreeId::Specs, b"a"), None, "trees are apart");
        let (all, complete) = m.chunk(TreeId::Runs, &Bound::Unbounded, None, 10);
        assert!(complete);
        assert_eq!(
            keys(&all),
            vec![
                ("a".into(), Some("1".into())),
                ("b".into(), None),
                ("c".into(), Some("2".into()))
            ]
        );
        m.drop_frozen();
        assert_eq!(m.get(TreeId::Runs, b"a"), None);
        assert_eq!(m.gen, 1);
    }

    #[test]
    fn chunks_resume_after_their_last_key_and_stop_at_the_prefix() {
        let now = Instant::now();
        let mut m = Mem::default();
        for k in ["p1", "p2", "p3", "q1"] {
            m.active.insert(w(k, Some("v")), now);
        }
        m.freeze();
        m.active.insert(w("p0", Some("v")), now);
        let (first, complete) = m.chunk(TreeId::Runs, &Bound::Unbounded, Some(b"p"), 2);
        assert_eq!(keys(&first).len(), 2);
        assert!(!complete);
        let after = Bound::Excluded(first[1].0.clone());
        let (rest, complete) = m.chunk(TreeId::Runs, &after, Some(b"p"), 2);
        assert!(complete, "q1 ends the prefix");
        let names: Vec<String> = keys(&first)
            .into_iter()
            .chain(keys(&rest))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(names, vec!["p0", "p1", "p2", "p3"]);
        assert_eq!(keys(&m.with_prefix(TreeId::Runs, b"q")).len(), 1);
    }

    #[test]
    fn a_layer_counts_its_bytes_and_its_first_write() {
        let mut l = Layer::default();
        assert!(l.is_empty() && l.since.is_none());
        let t0 = Instant::now();
        l.insert(w("k", Some("vv")), t0);
        l.insert(w("k", None), t0 + std::time::Duration::from_secs(1));
        assert_eq!(l.since, Some(t0));
        assert_eq!(l.len(), 1, "newest value per key");
        assert_eq!(l.bytes, 1 + 2 + ENTRY_OVERHEAD + 1 + ENTRY_OVERHEAD);
    }
}
