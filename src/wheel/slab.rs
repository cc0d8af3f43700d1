//! Arena storage for wheel entries.
//!
//! Entries live in one `Vec` and refer to each other by `u32` index, so the
//! wheel's lists are intrusive (no per-node allocation, O(1) unlink) and a
//! steady insert/fire workload allocates nothing once the arena has grown.
//! Vacant entries form a LIFO free list threaded through `next`: reusing the
//! most recently freed entry keeps the working set cache-hot.
//!
//! Liveness is decided by the generation alone: `remove` bumps it, so every
//! handle issued for the previous occupant stops matching. No separate
//! "occupied" flag is needed (the `Option` around the value is only there so
//! the value can be moved out without `unsafe`).

#![allow(
    clippy::indexing_slicing,
    clippy::expect_used,
    reason = "indices come only from this arena (`alloc`, or a handle checked by `resolve`); a bad one is a bug in the wheel, never input, and must stop loudly"
)]

use super::Handle;

/// "No entry" marker for the intrusive links and list heads.
pub(crate) const NIL: u32 = u32::MAX;

pub(crate) struct Entry<T> {
    /// `Some` while live, `None` while on the free list.
    pub(crate) value: Option<T>,
    pub(crate) deadline: u64,
    /// Intrusive doubly-linked list through the arena (`NIL` terminated).
    /// While vacant, `next` links the free list and `prev` is unused.
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// Bumped on every removal; a `Handle` is live iff its generation matches.
    /// Wrapping: a stale handle could only alias after 2^32 reuses of the
    /// very same entry while the caller still holds it.
    pub(crate) generation: u32,
    /// Which list the entry is on: a wheel level (`0..LEVELS`) or
    /// `PENDING`. Stored (2 bytes that fit in padding) rather than
    /// recomputed, so `cancel` does not depend on the wheel's invariant being
    /// intact and debug builds can cross-check it.
    pub(crate) level: u8,
    pub(crate) slot: u8,
}

pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free_head: u32,
    len: usize,
}

impl<T> Slab<T> {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        Slab {
            entries: Vec::with_capacity(cap),
            free_head: NIL,
            len: 0,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value` and returns its index; links and location are left for
    /// the caller to set.
    #[inline]
    pub(crate) fn alloc(&mut self, deadline: u64, value: T) -> u32 {
        self.len += 1;
        if self.free_head != NIL {
            let idx = self.free_head;
            let e = &mut self.entries[idx as usize];
            self.free_head = e.next;
            e.value = Some(value);
            e.deadline = deadline;
            idx
        } else {
            let idx = self.entries.len();
            // NIL is reserved as the link terminator, hence the strict bound.
            assert!(
                idx < NIL as usize,
                "herald wheel: more than 2^32-1 live timers"
            );
            self.entries.push(Entry {
                value: Some(value),
                deadline,
                prev: NIL,
                next: NIL,
                generation: 0,
                level: 0,
                slot: 0,
            });
            idx as u32
        }
    }

    /// Frees a live entry (already unlinked by the caller) and returns its
    /// handle (with the generation it had) and value.
    #[inline]
    pub(crate) fn remove(&mut self, idx: u32) -> (Handle, T) {
        let free_head = self.free_head;
        let e = &mut self.entries[idx as usize];
        let handle = Handle {
            index: idx,
            generation: e.generation,
        };
        let value = e
            .value
            .take()
            .expect("herald wheel: removing a vacant entry");
        e.generation = e.generation.wrapping_add(1);
        e.next = free_head;
        self.free_head = idx;
        self.len -= 1;
        (handle, value)
    }

    #[inline]
    pub(crate) fn handle(&self, idx: u32) -> Handle {
        Handle {
            index: idx,
            generation: self.entries[idx as usize].generation,
        }
    }

    /// Index of the live entry `handle` refers to, or `None` if stale.
    #[inline]
    pub(crate) fn resolve(&self, handle: Handle) -> Option<u32> {
        match self.entries.get(handle.index as usize) {
            Some(e) if e.generation == handle.generation && e.value.is_some() => Some(handle.index),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get(&self, idx: u32) -> &Entry<T> {
        &self.entries[idx as usize]
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u32) -> &mut Entry<T> {
        &mut self.entries[idx as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_reuses_and_bumps_generation() {
        let mut s = Slab::with_capacity(0);
        let a = s.alloc(1, "a");
        let ha = s.handle(a);
        let b = s.alloc(2, "b");
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), (ha, "a"));
        assert_eq!(s.resolve(ha), None);
        // LIFO reuse of the freed index, with a new generation.
        let c = s.alloc(3, "c");
        assert_eq!(c, a);
        let hc = s.handle(c);
        assert_ne!(hc, ha);
        assert_eq!(s.resolve(hc), Some(c));
        assert_eq!(s.resolve(ha), None);
        assert_eq!(s.get(b).deadline, 2);
        assert_eq!(s.len(), 2);
        // Out-of-range index is simply stale.
        assert_eq!(
            s.resolve(Handle {
                index: 99,
                generation: 0
            }),
            None
        );
    }
}
