//! The embedded engine's lock order, asserted in debug builds.
//!
//! Each lock of [`super::Shared`] is an [`OMutex`] or [`ORwLock`]: a parking_lot lock with its
//! [`Rank`]. In a debug build, every thread keeps the ranks of the locks it holds (a
//! thread-local stack); a blocking acquire of a lock ranked at or before one the thread holds
//! panics, naming both, before it waits — so a would-be deadlock is a test failure with its
//! cause rather than a hang some day. `try_*` acquisitions are exempt (they never wait) but
//! what they take counts as held. Re-taking a lock already held is caught too (a second
//! `read` of an `RwLock` can deadlock behind a waiting writer).
//!
//! In a release build the wrappers are the bare locks: no stack, no check, no `Drop` of their
//! own (`#[cfg(debug_assertions)]` throughout).

use std::ops::{Deref, DerefMut};

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The locks in the order a thread may take them (see the top of `embedded/mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    Log,
    SledFences,
    Applier,
    Mem,
    /// Held by a reopen across its swap of `inner`.
    Closing,
    Inner,
    Pacer,
}

impl Rank {
    /// For the debug build's lock-order check (below), the only reader.
    #[cfg(debug_assertions)]
    fn name(self) -> &'static str {
        match self {
            Rank::Log => "log",
            Rank::SledFences => "sled_fences",
            Rank::Applier => "applier",
            Rank::Mem => "mem",
            Rank::Closing => "closing",
            Rank::Inner => "inner",
            Rank::Pacer => "pacer",
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Rank>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Before a blocking acquire of `rank`: panics if the thread holds a lock ranked at or after
/// it.
#[cfg(debug_assertions)]
fn check(rank: Rank) {
    let worst = HELD.with(|h| h.borrow().iter().copied().filter(|&r| r >= rank).max());
    if let Some(held) = worst {
        panic!(
            "lock order violated: taking `{}` while holding `{}` (the order is log → sled_fences → applier → mem → closing → inner → pacer)",
            rank.name(),
            held.name()
        );
    }
}

#[cfg(debug_assertions)]
fn push(rank: Rank) {
    HELD.with(|h| h.borrow_mut().push(rank));
}

/// Guards may be dropped in any order: the last entry of the rank goes.
#[cfg(debug_assertions)]
fn pop(rank: Rank) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|&r| r == rank) {
            h.remove(i);
        }
    });
}

/// A held lock: derefs to what it guards; in a debug build its drop takes the rank off the
/// thread's stack.
pub struct Held<G> {
    guard: G,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<G> Held<G> {
    fn new(guard: G, _rank: Rank) -> Held<G> {
        #[cfg(debug_assertions)]
        push(_rank);
        Held {
            guard,
            #[cfg(debug_assertions)]
            rank: _rank,
        }
    }

    /// The parking_lot guard itself, for a `Condvar` wait (which releases and re-takes the
    /// lock: the rank stays held meanwhile, the thread being asleep).
    pub fn guard_mut(&mut self) -> &mut G {
        &mut self.guard
    }
}

#[cfg(debug_assertions)]
impl<G> Drop for Held<G> {
    fn drop(&mut self) {
        pop(self.rank);
    }
}

impl<G: Deref> Deref for Held<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Held<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

/// A mutex with its rank.
pub struct OMutex<T> {
    lock: Mutex<T>,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<T> OMutex<T> {
    pub fn new(_rank: Rank, value: T) -> OMutex<T> {
        OMutex {
            lock: Mutex::new(value),
            #[cfg(debug_assertions)]
            rank: _rank,
        }
    }

    fn rank(&self) -> Rank {
        #[cfg(debug_assertions)]
        return self.rank;
        #[cfg(not(debug_assertions))]
        Rank::Log
    }

    pub fn lock(&self) -> Held<MutexGuard<'_, T>> {
        #[cfg(debug_assertions)]
        check(self.rank);
        Held::new(self.lock.lock(), self.rank())
    }

    pub fn try_lock(&self) -> Option<Held<MutexGuard<'_, T>>> {
        self.lock.try_lock().map(|g| Held::new(g, self.rank()))
    }
}

/// A readers-writer lock with its rank.
pub struct ORwLock<T> {
    lock: RwLock<T>,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<T> ORwLock<T> {
    pub fn new(_rank: Rank, value: T) -> ORwLock<T> {
        ORwLock {
            lock: RwLock::new(value),
            #[cfg(debug_assertions)]
            rank: _rank,
        }
    }

    fn rank(&self) -> Rank {
        #[cfg(debug_assertions)]
        return self.rank;
        #[cfg(not(debug_assertions))]
        Rank::Log
    }

    pub fn read(&self) -> Held<RwLockReadGuard<'_, T>> {
        #[cfg(debug_assertions)]
        check(self.rank);
        Held::new(self.lock.read(), self.rank())
    }

    pub fn write(&self) -> Held<RwLockWriteGuard<'_, T>> {
        #[cfg(debug_assertions)]
        check(self.rank);
        Held::new(self.lock.write(), self.rank())
    }

    pub fn try_read(&self) -> Option<Held<RwLockReadGuard<'_, T>>> {
        self.lock.try_read().map(|g| Held::new(g, self.rank()))
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "taking `log` while holding `mem`")]
    fn a_lock_taken_before_one_held_panics_naming_both() {
        let log = OMutex::new(Rank::Log, ());
        let mem = ORwLock::new(Rank::Mem, ());
        let _m = mem.read();
        let _l = log.lock();
    }

    #[test]
    #[should_panic(expected = "taking `mem` while holding `mem`")]
    fn a_second_read_of_a_held_lock_panics() {
        let mem = ORwLock::new(Rank::Mem, ());
        let _a = mem.read();
        let _b = mem.read();
    }

    #[test]
    fn the_order_forward_try_calls_and_any_drop_order_pass() {
        let log = OMutex::new(Rank::Log, 1);
        let mem = ORwLock::new(Rank::Mem, 2);
        let inner = ORwLock::new(Rank::Inner, 3);
        let pacer = OMutex::new(Rank::Pacer, 4);
        {
            let l = log.lock();
            let m = mem.write();
            let i = inner.read();
            // Out of order, but a try never waits.
            assert!(log.try_lock().is_none());
            drop(m);
            let p = pacer.lock();
            assert_eq!(*l + *i + *p, 8);
            drop(l);
        }
        // Everything released, whatever the drop order: any lock may be taken again.
        let _m = mem.write();
        let _l = std::thread::scope(|s| s.spawn(|| *log.lock()).join().unwrap());
        drop(_m);
        let _l = log.lock();
        let _m = mem.read();
    }

    #[test]
    fn a_try_taken_lock_counts_as_held() {
        let applier = OMutex::new(Rank::Applier, ());
        let fences = OMutex::new(Rank::SledFences, ());
        let _a = applier.try_lock().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _f = fences.lock();
        }));
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("taking `sled_fences` while holding `applier`"),
            "{msg}"
        );
    }
}
