//! One level of the wheel: 64 slot lists plus a `u64` occupancy bitmap, and
//! the tick arithmetic that maps deadlines to (level, slot).

#![allow(
    clippy::indexing_slicing,
    clippy::expect_used,
    reason = "slots are `deadline >> shift & 63` or a bit of the occupancy bitmap: always < 64, the length of every array here"
)]

use super::slab::{Slab, NIL};

/// log2 of the slots per level.
pub(crate) const LEVEL_BITS: u32 = 6;
pub(crate) const SLOTS: usize = 1 << LEVEL_BITS;
/// ceil(64 / 6): levels 0..=9 cover bits 0..=59, level 10 covers bits 60..=63
/// (only its slots 0..=15 can ever be used). With these, every `u64` deadline
/// has a home and no overflow list is needed.
pub(crate) const LEVELS: usize = 64_usize.div_ceil(LEVEL_BITS as usize);

/// Level an entry belongs in, given the wheel's current tick: the 6-bit group
/// holding the highest bit in which `deadline` and `now` differ.
///
/// Requires `deadline > now`. Because the two agree on every bit above that
/// group, and `deadline` has the 1 at the highest differing bit, the
/// deadline's digit at that level is strictly greater than `now`'s.
#[inline]
pub(crate) fn level_for(now: u64, deadline: u64) -> usize {
    debug_assert!(deadline > now);
    let highest_bit = 63 - (now ^ deadline).leading_zeros();
    (highest_bit / LEVEL_BITS) as usize
}

/// The deadline's digit (6-bit group) at `level`.
#[inline]
pub(crate) fn slot_for(deadline: u64, level: usize) -> usize {
    ((deadline >> (level as u32 * LEVEL_BITS)) as usize) & (SLOTS - 1)
}

/// First tick covered by `slot` of `level` while the wheel is at `now`: the
/// bits of `now` above the level, the slot number as the level's digit, zeros
/// below.
#[inline]
pub(crate) fn slot_start(now: u64, level: usize, slot: usize) -> u64 {
    let shift = level as u32 * LEVEL_BITS;
    let above = shift + LEVEL_BITS;
    // checked_shr: the top level has no bits above it (66 > 64).
    let prefix = now.checked_shr(above).map_or(0, |p| p << above);
    prefix | ((slot as u64) << shift)
}

pub(crate) struct Level {
    /// Bit `s` set iff slot `s` is non-empty; lets `advance` and
    /// `next_deadline` skip empty slots with one `trailing_zeros`.
    occupied: u64,
    /// Head of each slot's intrusive list (`NIL` if empty).
    heads: [u32; SLOTS],
    /// Lower bound of the deadlines in each slot (`u64::MAX` when empty).
    /// Lowered on push, never raised by unlink (recomputing it would mean
    /// scanning the slot), reset when the slot empties. So it is exact unless
    /// the slot's earliest entry was cancelled, and always a valid bound.
    min_hint: [u64; SLOTS],
}

impl Level {
    pub(crate) fn new() -> Self {
        Level {
            occupied: 0,
            heads: [NIL; SLOTS],
            min_hint: [u64::MAX; SLOTS],
        }
    }

    /// Lowest occupied slot. Every occupied slot's digit is above `now`'s
    /// digit at this level (see `level_for`), so the lowest one is also the
    /// next one in time: no rotation by the current position is needed.
    #[inline]
    pub(crate) fn first_slot(&self) -> Option<usize> {
        if self.occupied == 0 {
            None
        } else {
            Some(self.occupied.trailing_zeros() as usize)
        }
    }

    #[inline]
    pub(crate) fn min_hint(&self, slot: usize) -> u64 {
        self.min_hint[slot]
    }

    /// Pushes entry `idx` (unlinked, deadline set) at the front of `slot`.
    /// Front insertion needs no tail pointer; order within a slot is
    /// irrelevant (level 0 slots hold a single tick, higher slots are
    /// re-sorted by cascading).
    #[inline]
    pub(crate) fn push<T>(&mut self, slab: &mut Slab<T>, idx: u32, level: usize, slot: usize) {
        let head = self.heads[slot];
        let e = slab.get_mut(idx);
        let deadline = e.deadline;
        e.prev = NIL;
        e.next = head;
        e.level = level as u8;
        e.slot = slot as u8;
        if head != NIL {
            slab.get_mut(head).prev = idx;
        }
        self.heads[slot] = idx;
        self.occupied |= 1 << slot;
        if deadline < self.min_hint[slot] {
            self.min_hint[slot] = deadline;
        }
    }

    /// Unlinks entry `idx` from `slot`. Returns true if the level became
    /// empty (the caller keeps a per-level summary bitmap).
    #[inline]
    pub(crate) fn unlink<T>(&mut self, slab: &mut Slab<T>, idx: u32, slot: usize) -> bool {
        let e = slab.get(idx);
        let (prev, next) = (e.prev, e.next);
        if prev != NIL {
            slab.get_mut(prev).next = next;
        } else {
            debug_assert_eq!(self.heads[slot], idx);
            self.heads[slot] = next;
        }
        if next != NIL {
            slab.get_mut(next).prev = prev;
        }
        if self.heads[slot] == NIL {
            self.occupied &= !(1 << slot);
            self.min_hint[slot] = u64::MAX;
            self.occupied == 0
        } else {
            false
        }
    }

    /// Detaches the whole list of `slot` and returns its head. Returns true
    /// in the second field if the level became empty.
    #[inline]
    pub(crate) fn take(&mut self, slot: usize) -> (u32, bool) {
        let head = std::mem::replace(&mut self.heads[slot], NIL);
        self.occupied &= !(1 << slot);
        self.min_hint[slot] = u64::MAX;
        (head, self.occupied == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants() {
        assert_eq!(SLOTS, 64);
        assert_eq!(LEVELS, 11);
    }

    #[test]
    fn level_and_slot_math() {
        assert_eq!(level_for(0, 1), 0);
        assert_eq!(level_for(0, 63), 0);
        assert_eq!(level_for(0, 64), 1);
        assert_eq!(level_for(0, 4095), 1);
        assert_eq!(level_for(0, 4096), 2);
        assert_eq!(level_for(0, u64::MAX), 10);
        assert_eq!(level_for(u64::MAX - 1, u64::MAX), 0);
        // Same digit above: only the low difference matters.
        assert_eq!(level_for(64, 127), 0);
        assert_eq!(level_for(63, 64), 1);
        for level in 0..LEVELS {
            let shift = level as u32 * LEVEL_BITS;
            let d = 1u64 << shift;
            assert_eq!(level_for(0, d), level);
            assert_eq!(slot_for(d, level), 1);
            assert_eq!(slot_start(0, level, 1), d);
        }
        assert_eq!(slot_for(u64::MAX, 10), 15);
        assert_eq!(slot_start(u64::MAX, 10, 15), 15 << 60);
        assert_eq!(slot_start(u64::MAX, 0, 63), u64::MAX);
        assert_eq!(slot_start(0x1234_5678, 1, 2), 0x1234_5000 | (2 << 6));
    }
}
