//! A forward scan over the memtable merged with sled.

use std::ops::Bound;

use super::super::backend::{Kv, TreeId};
use super::super::memtable;
use super::super::StoreError;
use super::SledBackend;

/// How many memtable entries a scan copies at a time.
pub(super) const SCAN_CHUNK: usize = 256;

/// How many sled entries a scan's first read takes; each further read takes twice as many, up
/// to [`SCAN_CHUNK`]. One: many callers only look at the first entry (a prefix's bounds, the
/// last sequence number), and a listing of a page reads little more than it shows.
const SLED_FIRST_CHUNK: usize = 1;

/// A forward scan over the memtable merged with sled. Both are read in chunks: the memtable
/// under its lock, sled through a hold on its handle and an iterator made from `lower`, and
/// neither is kept between `next` calls. A scan whose reader stops (an export whose client
/// stops reading) so holds nothing: a reopen after an I/O error closes the old handle without
/// waiting for it (see `SledHold`). A layer's entry wins over sled's for the same key and a
/// deletion hides it.
///
/// Why it sees every key that was there for the whole scan: a key moves from the memtable to
/// sled-only when its frozen layer is dropped, which happens after the layer is in sled and
/// bumps [`Mem::gen`]. Each memtable chunk is read with the generation; when it changed since
/// sled's chunk was read (which may have read a leaf before the layer got there), that chunk
/// is dropped and read again from the last key returned.
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
    /// sled's entries after `lower`, in order, read at generation `gen`.
    sled: std::collections::VecDeque<Kv>,
    /// `sled` holds every sled entry left in the range.
    sled_complete: bool,
    /// How many entries the next read of sled takes.
    sled_chunk: usize,
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
            sled: Default::default(),
            sled_complete: false,
            sled_chunk: SLED_FIRST_CHUNK,
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
            self.sled.clear();
            self.sled_complete = false;
        }
    }

    /// Reads sled's next chunk after `lower`; the hold and the iterator are dropped before
    /// it returns (the iterator first: it holds a clone of the tree).
    fn pull_sled(&mut self) -> Result<(), StoreError> {
        let hold = self.backend.tree(self.tree)?;
        let mut it = hold.range::<Vec<u8>, _>((self.lower.clone(), Bound::Unbounded));
        for _ in 0..self.sled_chunk {
            let Some(item) = it.next() else {
                self.sled_complete = true;
                break;
            };
            let (k, v) = item?;
            if self.prefix.as_ref().is_some_and(|p| !k.starts_with(p)) {
                self.sled_complete = true;
                break;
            }
            self.sled.push_back((k.to_vec(), v.to_vec()));
        }
        drop(it);
        drop(hold);
        self.sled_chunk = (self.sled_chunk * 2).min(SCAN_CHUNK);
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
            if self.sled.is_empty() && !self.sled_complete {
                if let Err(e) = self.pull_sled() {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
            let mem_key = self.mem.front().map(|(k, _)| k.as_slice());
            let sled_key = self.sled.front().map(|(k, _)| k.as_slice());
            let from_mem = memtable::layer_first(mem_key, sled_key)?;
            if from_mem {
                let (k, v) = self.mem.pop_front()?;
                if self.sled.front().is_some_and(|(s, _)| *s == k) {
                    self.sled.pop_front();
                }
                self.lower = Bound::Excluded(k.clone());
                if let Some(v) = v {
                    return Some(Ok((k, v)));
                }
            } else {
                let (k, v) = self.sled.pop_front()?;
                self.lower = Bound::Excluded(k.clone());
                return Some(Ok((k, v)));
            }
        }
    }
}
