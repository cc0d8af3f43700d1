//! A forward scan over the memtable merged with sled.

use std::ops::Bound;

use super::super::backend::{Kv, TreeId};
use super::super::memtable;
use super::super::StoreError;
use super::SledBackend;

/// How many memtable entries a scan copies at a time.
pub(super) const SCAN_CHUNK: usize = 256;

/// A forward scan over the memtable merged with sled. The memtable is read in chunks (a lock
/// per chunk, never held between `next` calls); a layer's entry wins over sled's for the same
/// key and a deletion hides it.
///
/// Why it sees every key that was there for the whole scan: a key moves from the memtable to
/// sled-only when its frozen layer is dropped, which happens after the layer is in sled and
/// bumps [`Mem::gen`]. Each chunk is read with the generation; when it changed since sled's
/// iterator was made, that iterator (which may have read a leaf before the layer got there)
/// is made again from the last key returned.
pub(super) struct MergedScan<'a> {
    backend: &'a SledBackend,
    tree: TreeId,
    prefix: Option<Vec<u8>>,
    /// Everything up to here was returned (or skipped as deleted).
    lower: Bound<Vec<u8>>,
    mem: std::collections::VecDeque<memtable::Entry>,
    /// `mem` holds every memtable entry left in the range.
    mem_complete: bool,
    gen: Option<u64>,
    /// sled's iterator and the hold it came from, dropped in that order (see `SledHold`).
    sled: Option<(sled::Iter, super::SledHold)>,
    sled_head: Option<Kv>,
    sled_done: bool,
    failed: bool,
}

impl MergedScan<'_> {
    pub(super) fn new<'a>(
        backend: &'a SledBackend,
        tree: TreeId,
        start: &[u8],
        prefix: Option<&[u8]>,
    ) -> MergedScan<'a> {
        MergedScan {
            backend,
            tree,
            prefix: prefix.map(|p| p.to_vec()),
            lower: Bound::Included(start.to_vec()),
            mem: Default::default(),
            mem_complete: false,
            gen: None,
            sled: None,
            sled_head: None,
            sled_done: false,
            failed: false,
        }
    }

    fn refill(&mut self) {
        let m = self.backend.shared.mem.read();
        let (chunk, complete) = m.chunk(self.tree, &self.lower, self.prefix.as_deref(), SCAN_CHUNK);
        let gen = m.gen;
        drop(m);
        self.mem = chunk.into();
        self.mem_complete = complete;
        if self.gen != Some(gen) {
            self.gen = Some(gen);
            self.sled = None;
            self.sled_head = None;
            self.sled_done = false;
        }
    }

    fn pull_sled(&mut self) -> Result<(), StoreError> {
        if self.sled.is_none() {
            let t = self.backend.tree(self.tree)?;
            let it = t.range::<Vec<u8>, _>((self.lower.clone(), Bound::Unbounded));
            self.sled = Some((it, t));
        }
        let Some((it, _)) = self.sled.as_mut() else {
            return Ok(());
        };
        match it.next() {
            None => self.sled_done = true,
            Some(item) => {
                let (k, v) = item?;
                if self.prefix.as_ref().is_some_and(|p| !k.starts_with(p)) {
                    self.sled_done = true;
                } else {
                    self.sled_head = Some((k.to_vec(), v.to_vec()));
                }
            }
        }
        Ok(())
    }
}

impl Iterator for MergedScan<'_> {
    type Item = Result<Kv, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            if self.mem.is_empty() && !self.mem_complete {
                self.refill();
            }
            if self.sled_head.is_none() && !self.sled_done {
                if let Err(e) = self.pull_sled() {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
            let mem_key = self.mem.front().map(|(k, _)| k.as_slice());
            let sled_key = self.sled_head.as_ref().map(|(k, _)| k.as_slice());
            let from_mem = memtable::layer_first(mem_key, sled_key)?;
            if from_mem {
                let (k, v) = self.mem.pop_front()?;
                if self.sled_head.as_ref().is_some_and(|(s, _)| *s == k) {
                    self.sled_head = None;
                }
                self.lower = Bound::Excluded(k.clone());
                if let Some(v) = v {
                    return Some(Ok((k, v)));
                }
            } else {
                let (k, v) = self.sled_head.take()?;
                self.lower = Bound::Excluded(k.clone());
                return Some(Ok((k, v)));
            }
        }
    }
}
