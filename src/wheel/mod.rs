//! Hierarchical timing wheel: O(1) insert and cancel of timers keyed by an
//! absolute `u64` tick (milliseconds), and an `advance` that fires due
//! entries in deadline order while skipping empty time with bitmaps.
//!
//! A pure data structure: no clock, no IO, no threads, no `unsafe`, no deps.
//!
//! # Scheme
//!
//! Ticks are read as base-64 numbers: level `L` is digit `L` (bits
//! `6L..6L+6`). Each level has 64 slots, each slot an intrusive doubly-linked
//! list of entries, and a `u64` bitmap of its non-empty slots; a further
//! 16-bit summary says which levels are non-empty. A level `L` slot spans
//! `64^L` ticks, so level 0 slots hold exactly one tick.
//!
//! There are 11 levels (`ceil(64/6)`), the top one using only 4 bits, so
//! *every* `u64` deadline, up to `u64::MAX`, has an exact home. We chose
//! this over tokio's 6 levels plus clamping/overflow handling because
//! deadlines here are absolute Unix milliseconds supplied by users: an
//! overflow list would have to be rescanned (O(n)) whenever the top level
//! wraps, and clamping would break "never fires early". The extra levels cost
//! ~4 KB of memory and nothing at run time: empty levels are skipped through
//! the summary bitmap, and an entry only visits levels between its own and 0.
//!
//! Entries live in a slab (arena, `slab.rs`) addressed by `u32` index with a
//! LIFO free list; a [`Handle`] is `(index, generation)` and the generation is
//! bumped on every removal, so stale handles (fired, cancelled, or whose index
//! was reused) are detected in O(1) and are harmless.
//!
//! Entries whose deadline is `<= now` at insertion (or that become due while
//! advancing) go to the *pending* list, which is fired first by the next
//! `advance`. It is a FIFO that is sorted (stable, by deadline) before firing
//! only if pushes arrived out of order, which only happens for deadlines in
//! the past.
//!
//! # Invariants
//!
//! With `now` the wheel's current tick:
//!
//! 1. An entry with `deadline <= now` is in the pending list; every other live
//!    entry is at level `L = level_for(now, deadline)` — the 6-bit group of the
//!    highest bit where `deadline` and `now` differ — in slot
//!    `slot_for(deadline, L)`, its digit at that level. Consequently the
//!    deadline agrees with `now` on all digits above `L`, and its digit at `L`
//!    is *strictly greater* than `now`'s.
//! 2. This stays true as `now` moves forward up to (excluding) the start of
//!    the earliest occupied slot: such a `now` still shares the higher digits
//!    and has a smaller digit at `L`. `advance` therefore steps `now` to each
//!    occupied slot's start in time order and re-files ("cascades") that
//!    slot's entries relative to the new `now`: each goes to a strictly lower
//!    level, or to pending if its deadline equals the slot start.
//! 3. Because of (1), every occupied slot at level `L` has digit `>= 1`, and
//!    all its ticks lie before the next level-`L+1` boundary, while every
//!    level-`L+1` slot starts at or after it. Hence the earliest entry is in
//!    the lowest occupied slot of the lowest occupied level — two
//!    `trailing_zeros`, no scanning, no rotation — and no two occupied slots
//!    share a start tick.
//! 4. `slab.len()` counts live entries; each is on exactly one list, and the
//!    `(level, slot)` stored in it names that list.
//!
//! # Complexity
//!
//! * `insert`, `cancel`, `reschedule`, `deadline`, `get`: O(1).
//! * `next_deadline`: O(1) (two bitmap `trailing_zeros`).
//! * `advance`: O(occupied slots visited + cascades + fired), where each entry
//!   cascades at most `level_at_insert <= 10` times over its life (an entry
//!   an hour out starts at level 3). Empty stretches of time cost nothing,
//!   so a jump of ten years with few entries is a few dozen steps. Firing out
//!   of order past deadlines adds an O(k log k) sort of those k entries.
//!
//! # `next_deadline` semantics
//!
//! A lower bound that is exact in the common case: it returns
//! `max(start of the earliest occupied slot, that slot's min_hint)`, where
//! `min_hint` is the minimum deadline ever pushed into the slot since it was
//! last empty. That is exactly the earliest deadline unless the slot's
//! earliest entry was cancelled/rescheduled away (we don't rescan the slot on
//! cancel). It is never later than the earliest live deadline, and it is
//! always `>=` the slot start, so `advance(next_deadline())` always makes
//! progress (fires or cascades that slot): a "sleep until next_deadline;
//! advance" loop wakes at most once per level per entry and never spins.
//! With pending entries it returns a lower bound of their deadlines (`<=
//! now()`), i.e. "advance right away".
//!
//! # Panics in the `fire` callback
//!
//! Each entry is unlinked and freed before its callback runs and no callback
//! runs while a slot is half processed, so a panicking callback leaves the
//! wheel consistent: not-yet-fired due entries stay pending and fire at the
//! next `advance`, and `now()` may stop short of the requested tick.
//!
//! # Limits
//!
//! At most `2^32 - 1` live entries (`u32` indices keep entries small). A stale
//! handle could only alias a new entry after `2^32` reuses of the same index
//! while the caller still holds it.

#![allow(
    clippy::indexing_slicing,
    clippy::expect_used,
    reason = "level and slot numbers are computed by `level.rs` within their fixed arrays; slab indices come from the slab"
)]

mod level;
mod slab;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use level::{level_for, slot_for, slot_start, Level, LEVELS};
use slab::{Slab, NIL};

/// `Entry::level` value for entries on the pending list.
const PENDING: u8 = LEVELS as u8;

/// Identifies a timer in a [`Wheel`]. Stays harmless after the timer fired or
/// was cancelled, even if its slab index is reused (generation check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    index: u32,
    generation: u32,
}

/// Hierarchical timing wheel. See the [module docs](self).
pub struct Wheel<T> {
    /// The tick the wheel has advanced to; never decreases.
    now: u64,
    slab: Slab<T>,
    /// Boxed: ~8.5 KB of heads and hints that should not be memcpy'd when
    /// the `Wheel` moves.
    levels: Box<[Level; LEVELS]>,
    /// Bit `L` set iff `levels[L]` has an occupied slot.
    occupied_levels: u16,
    /// FIFO of entries with `deadline <= now`, fired first by `advance`.
    pending_head: u32,
    pending_tail: u32,
    /// Lower bound of pending deadlines (like `Level::min_hint`).
    pending_min: u64,
    /// False once a push arrived with a deadline below the tail's.
    pending_sorted: bool,
    /// Reused buffer for sorting pending entries (avoids allocating per call).
    scratch: Vec<u32>,
}

impl<T> Wheel<T> {
    /// Empty wheel whose current tick is `now_tick`.
    pub fn new(now_tick: u64) -> Self {
        Self::with_capacity(now_tick, 0)
    }

    /// Like [`new`](Self::new), with room for `cap` entries before the slab
    /// reallocates.
    pub fn with_capacity(now_tick: u64, cap: usize) -> Self {
        Wheel {
            now: now_tick,
            slab: Slab::with_capacity(cap),
            levels: Box::new(std::array::from_fn(|_| Level::new())),
            occupied_levels: 0,
            pending_head: NIL,
            pending_tail: NIL,
            pending_min: u64::MAX,
            pending_sorted: true,
            scratch: Vec::new(),
        }
    }

    /// The tick the wheel has advanced to.
    #[inline]
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of live (not yet fired or cancelled) entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slab.len() == 0
    }

    /// Schedules `value` at `deadline_tick`. O(1). A deadline `<= now()` fires
    /// at the next [`advance`](Self::advance) call, even `advance(now())`.
    #[inline]
    pub fn insert(&mut self, deadline_tick: u64, value: T) -> Handle {
        let idx = self.slab.alloc(deadline_tick, value);
        self.link(idx);
        self.slab.handle(idx)
    }

    /// Removes a live entry and returns its value. O(1). A stale handle
    /// (fired, cancelled, or from a reused index) is a no-op returning `None`.
    #[inline]
    pub fn cancel(&mut self, handle: Handle) -> Option<T> {
        let idx = self.slab.resolve(handle)?;
        self.unlink(idx);
        Some(self.slab.remove(idx).1)
    }

    /// Moves a live entry to a new deadline, keeping its handle. O(1).
    /// Returns false (and does nothing) for a stale handle.
    pub fn reschedule(&mut self, handle: Handle, deadline_tick: u64) -> bool {
        let Some(idx) = self.slab.resolve(handle) else {
            return false;
        };
        self.unlink(idx);
        self.slab.get_mut(idx).deadline = deadline_tick;
        self.link(idx);
        true
    }

    /// Deadline of a live entry (`None` if the handle is stale).
    #[inline]
    pub fn deadline(&self, handle: Handle) -> Option<u64> {
        let idx = self.slab.resolve(handle)?;
        Some(self.slab.get(idx).deadline)
    }

    /// The value of a live entry.
    pub fn get(&self, handle: Handle) -> Option<&T> {
        let idx = self.slab.resolve(handle)?;
        self.slab.get(idx).value.as_ref()
    }

    /// The value of a live entry, mutably.
    pub fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        let idx = self.slab.resolve(handle)?;
        self.slab.get_mut(idx).value.as_mut()
    }

    /// Moves to `now_tick` (clamped: time never goes backwards) and calls
    /// `fire` for every entry whose deadline is `<= now_tick`, in
    /// non-decreasing deadline order (ties in insertion order for past
    /// deadlines, arbitrary otherwise). Never fires early; skips empty time
    /// via the bitmaps, so big jumps cost O(occupied slots), not O(ticks).
    pub fn advance(&mut self, now_tick: u64, fire: &mut impl FnMut(Handle, T)) {
        let target = now_tick.max(self.now);
        // Pending deadlines are <= now < every deadline in the levels.
        self.fire_pending(fire);
        while let Some((level, slot)) = self.first_slot() {
            let start = slot_start(self.now, level, slot);
            if start > target {
                break;
            }
            // By invariant 3 this is the unique earliest slot, so stepping
            // `now` here keeps every other entry's placement valid.
            self.now = start;
            self.cascade(level, slot);
            // Entries due exactly at `start` are the earliest remaining.
            self.fire_pending(fire);
        }
        self.now = target;
    }

    /// Earliest tick at which [`advance`](Self::advance) has work, or `None`
    /// when empty. A lower bound of the earliest live deadline, exact unless
    /// the earliest entry of the next slot was cancelled; advancing to it
    /// always makes progress. See the module docs. O(1).
    pub fn next_deadline(&self) -> Option<u64> {
        if self.pending_head != NIL {
            return Some(self.pending_min);
        }
        let (level, slot) = self.first_slot()?;
        let start = slot_start(self.now, level, slot);
        Some(start.max(self.levels[level].min_hint(slot)))
    }

    /// Lowest occupied slot of the lowest occupied level: the earliest one in
    /// time (invariant 3).
    #[inline]
    fn first_slot(&self) -> Option<(usize, usize)> {
        if self.occupied_levels == 0 {
            return None;
        }
        let level = self.occupied_levels.trailing_zeros() as usize;
        let slot = self.levels[level].first_slot()?;
        Some((level, slot))
    }

    /// Files an unlinked entry according to invariant 1.
    #[inline]
    fn link(&mut self, idx: u32) {
        let deadline = self.slab.get(idx).deadline;
        if deadline <= self.now {
            self.push_pending(idx, deadline);
        } else {
            let level = level_for(self.now, deadline);
            let slot = slot_for(deadline, level);
            self.levels[level].push(&mut self.slab, idx, level, slot);
            self.occupied_levels |= 1 << level;
        }
    }

    #[inline]
    fn push_pending(&mut self, idx: u32, deadline: u64) {
        let tail = self.pending_tail;
        let e = self.slab.get_mut(idx);
        e.prev = tail;
        e.next = NIL;
        e.level = PENDING;
        e.slot = 0;
        if tail == NIL {
            self.pending_head = idx;
        } else {
            let t = self.slab.get_mut(tail);
            if t.deadline > deadline {
                self.pending_sorted = false;
            }
            t.next = idx;
        }
        self.pending_tail = idx;
        self.pending_min = self.pending_min.min(deadline);
    }

    /// Removes a live entry from whichever list holds it. O(1).
    #[inline]
    fn unlink(&mut self, idx: u32) {
        let e = self.slab.get(idx);
        let (level, slot) = (e.level, e.slot as usize);
        if level == PENDING {
            debug_assert!(e.deadline <= self.now);
            let (prev, next) = (e.prev, e.next);
            if prev == NIL {
                self.pending_head = next;
            } else {
                self.slab.get_mut(prev).next = next;
            }
            if next == NIL {
                self.pending_tail = prev;
            } else {
                self.slab.get_mut(next).prev = prev;
            }
            if self.pending_head == NIL {
                self.pending_min = u64::MAX;
                self.pending_sorted = true;
            }
        } else {
            let level = level as usize;
            debug_assert_eq!(level, level_for(self.now, e.deadline));
            debug_assert_eq!(slot, slot_for(e.deadline, level));
            if self.levels[level].unlink(&mut self.slab, idx, slot) {
                self.occupied_levels &= !(1 << level);
            }
        }
    }

    /// Re-files every entry of a slot whose start is now `self.now`: each
    /// lands in a lower level, or in pending if due exactly now. Runs no user
    /// code, so it cannot be interrupted half way.
    fn cascade(&mut self, level: usize, slot: usize) {
        let (mut idx, level_empty) = self.levels[level].take(slot);
        if level_empty {
            self.occupied_levels &= !(1 << level);
        }
        while idx != NIL {
            let next = self.slab.get(idx).next;
            debug_assert!(self.slab.get(idx).deadline >= self.now);
            self.link(idx);
            debug_assert!({
                let new_level = self.slab.get(idx).level;
                new_level < level as u8 || new_level == PENDING
            });
            idx = next;
        }
    }

    /// Fires the whole pending list in deadline order, unlinking and freeing
    /// each entry before its callback runs (panic safety).
    fn fire_pending(&mut self, fire: &mut impl FnMut(Handle, T)) {
        if self.pending_head == NIL {
            return;
        }
        if !self.pending_sorted {
            self.sort_pending();
        }
        while self.pending_head != NIL {
            let idx = self.pending_head;
            let next = self.slab.get(idx).next;
            self.pending_head = next;
            if next == NIL {
                self.pending_tail = NIL;
            } else {
                self.slab.get_mut(next).prev = NIL;
            }
            let (handle, value) = self.slab.remove(idx);
            fire(handle, value);
        }
        self.pending_min = u64::MAX;
        self.pending_sorted = true;
    }

    /// Stable-sorts the pending list by deadline (only needed when past
    /// deadlines were inserted out of order).
    #[cold]
    fn sort_pending(&mut self) {
        let mut order = std::mem::take(&mut self.scratch);
        order.clear();
        let mut idx = self.pending_head;
        while idx != NIL {
            order.push(idx);
            idx = self.slab.get(idx).next;
        }
        order.sort_by_key(|&i| self.slab.get(i).deadline);
        let mut prev = NIL;
        for &i in &order {
            let e = self.slab.get_mut(i);
            e.prev = prev;
            e.next = NIL;
            if prev == NIL {
                self.pending_head = i;
            } else {
                self.slab.get_mut(prev).next = i;
            }
            prev = i;
        }
        self.pending_tail = prev;
        self.pending_sorted = true;
        self.scratch = order;
    }
}

impl<T> std::fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wheel")
            .field("now", &self.now)
            .field("len", &self.len())
            .field("next_deadline", &self.next_deadline())
            .finish()
    }
}
