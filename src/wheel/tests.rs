//! Unit tests: level boundaries, past/`now`/`u64::MAX` deadlines, big jumps,
//! stale handles, `next_deadline`, clamping, panic safety.

use super::level::{LEVELS, LEVEL_BITS};
use super::*;

const UNIX_NOW: u64 = 1_800_000_000_123;

/// Advances to `to` and returns the fired values in firing order.
fn fire_to<T>(w: &mut Wheel<T>, to: u64) -> Vec<T> {
    let mut out = Vec::new();
    w.advance(to, &mut |_, v| out.push(v));
    out
}

/// Offsets that sit on every level boundary: 64^k - 1, 64^k, 64^k + 1.
fn boundary_offsets() -> Vec<u64> {
    let mut offs = vec![0, 1, 2, 62, 63];
    for k in 1..LEVELS as u32 {
        let p = 1u64 << (k * LEVEL_BITS);
        offs.extend([p - 1, p, p + 1]);
    }
    offs.push(u64::MAX);
    offs
}

#[test]
fn each_boundary_fires_exactly_on_its_tick() {
    // Aligned, unaligned, and near-the-top starting ticks.
    for base in [
        0,
        UNIX_NOW,
        UNIX_NOW - (UNIX_NOW % 4096),
        (1 << 60) - 1,
        u64::MAX - (1 << 40),
    ] {
        for off in boundary_offsets() {
            let Some(d) = base.checked_add(off) else {
                continue;
            };
            let mut w = Wheel::new(base);
            let h = w.insert(d, d);
            assert_eq!(w.deadline(h), Some(d));
            assert_eq!(w.len(), 1);
            assert_eq!(w.next_deadline(), Some(d), "base {base} off {off}");
            if d > base {
                assert!(
                    fire_to(&mut w, d - 1).is_empty(),
                    "early: base {base} off {off}"
                );
                assert_eq!(w.now(), d - 1);
                assert_eq!(w.next_deadline(), Some(d));
            }
            assert_eq!(fire_to(&mut w, d), vec![d], "base {base} off {off}");
            assert!(w.is_empty());
            assert_eq!(w.next_deadline(), None);
            assert_eq!(w.deadline(h), None);
            assert_eq!(w.cancel(h), None);
        }
    }
}

#[test]
fn all_boundaries_in_one_jump_fire_in_order() {
    for base in [0, UNIX_NOW, u64::MAX - (1 << 50)] {
        let mut w = Wheel::new(base);
        let mut expect: Vec<u64> = boundary_offsets()
            .into_iter()
            .filter_map(|o| base.checked_add(o))
            .collect();
        // Insert in reverse so list order cannot accidentally give the order.
        for &d in expect.iter().rev() {
            w.insert(d, d);
        }
        expect.sort_unstable();
        assert_eq!(w.next_deadline(), Some(base));
        assert_eq!(fire_to(&mut w, u64::MAX), expect);
        assert_eq!(w.now(), u64::MAX);
        assert!(w.is_empty());
    }
}

#[test]
fn boundaries_relative_to_unaligned_now_after_advancing() {
    // Insert after the wheel has moved, so `now` has non-zero low digits.
    let mut w = Wheel::new(UNIX_NOW);
    w.advance(UNIX_NOW + 4095 + 17, &mut |_, _: u64| unreachable!());
    let now = w.now();
    let mut inserted = 0;
    for off in boundary_offsets() {
        if let Some(d) = now.checked_add(off) {
            w.insert(d, d);
            inserted += 1;
        }
    }
    let mut fired = Vec::new();
    let mut wakeups = 0;
    while let Some(nd) = w.next_deadline() {
        wakeups += 1;
        let before = w.len();
        w.advance(nd, &mut |_, v| {
            assert!(v <= nd, "fired {v} early at {nd}");
            fired.push(v);
        });
        // No cancels: next_deadline is exact, so every wakeup fires.
        assert!(w.len() < before);
    }
    assert!(wakeups <= inserted);
    assert!(fired.windows(2).all(|p| p[0] <= p[1]));
    assert_eq!(fired.len(), inserted);
}

#[test]
fn deadline_now_and_past_fire_on_next_advance_in_order() {
    let mut w = Wheel::new(UNIX_NOW);
    w.insert(UNIX_NOW - 3, "past3");
    w.insert(UNIX_NOW, "now");
    w.insert(UNIX_NOW - 5, "past5");
    w.insert(0, "zero");
    w.insert(UNIX_NOW + 1, "future");
    assert_eq!(w.next_deadline(), Some(0));
    // Even advancing to the current tick fires them, sorted by deadline.
    assert_eq!(fire_to(&mut w, UNIX_NOW), ["zero", "past5", "past3", "now"]);
    assert_eq!(w.next_deadline(), Some(UNIX_NOW + 1));
    assert_eq!(fire_to(&mut w, UNIX_NOW + 1), ["future"]);
}

#[test]
fn advance_backwards_is_clamped() {
    let mut w = Wheel::new(UNIX_NOW);
    w.insert(UNIX_NOW - 1, 1);
    w.insert(UNIX_NOW + 1, 2);
    assert_eq!(fire_to(&mut w, UNIX_NOW - 1000), vec![1]);
    assert_eq!(w.now(), UNIX_NOW);
    assert_eq!(fire_to(&mut w, 0), Vec::<i32>::new());
    assert_eq!(w.now(), UNIX_NOW);
    assert_eq!(fire_to(&mut w, UNIX_NOW + 1), vec![2]);
}

#[test]
fn u64_max_deadlines() {
    let mut w = Wheel::new(0);
    w.insert(u64::MAX, "max");
    w.insert(u64::MAX - 1, "max-1");
    w.insert(1 << 63, "half");
    assert_eq!(w.next_deadline(), Some(1 << 63));
    assert_eq!(fire_to(&mut w, u64::MAX - 2), ["half"]);
    assert_eq!(w.next_deadline(), Some(u64::MAX - 1));
    assert_eq!(fire_to(&mut w, u64::MAX), ["max-1", "max"]);
    // At the end of time everything is "in the past".
    w.insert(u64::MAX, "again");
    assert_eq!(w.next_deadline(), Some(u64::MAX));
    assert_eq!(fire_to(&mut w, u64::MAX), ["again"]);
}

#[test]
fn huge_jumps_skip_empty_time() {
    const YEAR: u64 = 365 * 24 * 3600 * 1000;
    let mut w = Wheel::new(UNIX_NOW);
    let ds = [UNIX_NOW + 10 * YEAR, UNIX_NOW + 3 * YEAR + 7, UNIX_NOW + 1];
    for d in ds {
        w.insert(d, d);
    }
    // If advance looped per tick this would never finish.
    assert_eq!(
        fire_to(&mut w, UNIX_NOW + 20 * YEAR),
        vec![ds[2], ds[1], ds[0]]
    );
    assert_eq!(w.now(), UNIX_NOW + 20 * YEAR);
    w.insert(u64::MAX, 0);
    assert_eq!(fire_to(&mut w, u64::MAX - 1), Vec::<u64>::new());
    assert_eq!(fire_to(&mut w, u64::MAX), vec![0]);
}

#[test]
fn cancel_live_fired_cancelled_and_stale() {
    let mut w = Wheel::new(UNIX_NOW);
    let a = w.insert(UNIX_NOW + 100, "a");
    let b = w.insert(UNIX_NOW + 5000, "b");
    assert_eq!(w.cancel(a), Some("a"));
    assert_eq!(w.cancel(a), None, "double cancel");
    assert_eq!(w.deadline(a), None);
    assert_eq!(w.len(), 1);
    // `a`'s index is reused by `c` with a new generation: the old handle
    // must not touch it.
    let c = w.insert(UNIX_NOW + 100, "c");
    assert_eq!(c.index, a.index);
    assert_ne!(c, a);
    assert_eq!(w.cancel(a), None);
    assert!(!w.reschedule(a, 0));
    assert_eq!(w.get(a), None);
    assert_eq!(w.deadline(c), Some(UNIX_NOW + 100));
    assert_eq!(w.len(), 2);
    // Fired handles are stale too, also after their index is reused.
    assert_eq!(fire_to(&mut w, UNIX_NOW + 100), ["c"]);
    assert_eq!(w.cancel(c), None);
    let d = w.insert(UNIX_NOW + 200, "d");
    assert_eq!(d.index, c.index);
    assert_eq!(w.cancel(c), None);
    assert_eq!(w.cancel(a), None);
    assert_eq!(w.len(), 2);
    assert_eq!(w.cancel(d), Some("d"));
    assert_eq!(w.cancel(b), Some("b"));
    assert!(w.is_empty());
    assert_eq!(w.next_deadline(), None);
    assert!(fire_to(&mut w, u64::MAX).is_empty());
}

#[test]
fn cancel_from_every_list_position() {
    // Head, middle and tail of a slot list, and of the pending list.
    for deadline in [UNIX_NOW + 70_000, UNIX_NOW - 1] {
        for victim in 0..3 {
            let mut w = Wheel::new(UNIX_NOW);
            let hs: Vec<_> = (0..3).map(|i| w.insert(deadline, i)).collect();
            assert_eq!(w.cancel(hs[victim]), Some(victim));
            let mut rest = fire_to(&mut w, UNIX_NOW + 70_000);
            rest.sort_unstable();
            let expect: Vec<_> = (0..3).filter(|&i| i != victim).collect();
            assert_eq!(rest, expect);
        }
    }
}

#[test]
fn next_deadline_is_a_progressing_lower_bound() {
    let mut w = Wheel::new(UNIX_NOW);
    assert_eq!(w.next_deadline(), None);
    // Two entries in the same level-2 slot (64^2 = 4096 ticks wide).
    let base = UNIX_NOW - (UNIX_NOW % 4096) + 2 * 4096;
    let early = w.insert(base + 10, "early");
    w.insert(base + 20, "late");
    assert_eq!(w.next_deadline(), Some(base + 10), "exact without cancels");
    w.cancel(early);
    // The slot is not rescanned: a lower bound, no earlier than its start.
    let nd = w.next_deadline().unwrap();
    assert!(nd <= base + 20 && nd >= base, "{nd}");
    // Advancing to it cascades the slot, after which it is exact again.
    assert!(fire_to(&mut w, nd).is_empty());
    assert_eq!(w.next_deadline(), Some(base + 20));
    assert_eq!(fire_to(&mut w, base + 20), ["late"]);
    // Pending entries: a bound <= their deadlines, i.e. "now".
    w.insert(base, "past");
    assert_eq!(w.next_deadline(), Some(base));
}

#[test]
fn sleep_loop_wakes_at_most_once_per_level_per_entry() {
    let mut w = Wheel::new(UNIX_NOW);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut handles = Vec::new();
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let d = UNIX_NOW.saturating_add(x >> (x % 64));
        handles.push(w.insert(d, d));
    }
    // Cancel half, including many slot minima, to make the bound inexact.
    for h in handles.iter().step_by(2) {
        w.cancel(*h);
    }
    let n = w.len();
    let mut wakeups = 0;
    let mut last = 0;
    let mut fired = 0;
    while let Some(nd) = w.next_deadline() {
        assert!(nd >= w.now(), "no pending here, so no past bound");
        wakeups += 1;
        w.advance(nd, &mut |_, d| {
            assert!(d <= nd && d >= last, "{d} fired at {nd} after {last}");
            last = d;
            fired += 1;
        });
    }
    assert_eq!(fired, n);
    assert!(wakeups <= n * LEVELS, "{wakeups} wakeups for {n} entries");
}

#[test]
fn reschedule_and_get() {
    let mut w = Wheel::new(UNIX_NOW);
    let h = w.insert(UNIX_NOW + 1_000_000, 1);
    *w.get_mut(h).unwrap() += 41;
    assert_eq!(w.get(h), Some(&42));
    assert!(w.reschedule(h, UNIX_NOW + 5));
    assert_eq!(w.deadline(h), Some(UNIX_NOW + 5));
    assert_eq!(w.next_deadline(), Some(UNIX_NOW + 5));
    assert!(fire_to(&mut w, UNIX_NOW + 4).is_empty());
    assert!(w.reschedule(h, 0)); // into the past: fires next advance
    assert_eq!(fire_to(&mut w, 0), vec![42]);
    assert!(!w.reschedule(h, UNIX_NOW));
}

#[test]
fn panicking_callback_leaves_wheel_consistent() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let mut w = Wheel::new(0);
    for d in [10, 10, 10, 20, 5000] {
        w.insert(d, d);
    }
    let mut seen = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        w.advance(20, &mut |_, v| {
            seen.push(v);
            if seen.len() == 2 {
                panic!("boom");
            }
        })
    }));
    assert!(r.is_err());
    assert_eq!(w.len(), 3);
    assert!(w.now() <= 20);
    assert_eq!(fire_to(&mut w, 20), vec![10, 20]);
    assert_eq!(fire_to(&mut w, 5000), vec![5000]);
    assert!(w.is_empty());
}

#[test]
fn many_entries_same_tick_and_reuse() {
    let mut w = Wheel::with_capacity(UNIX_NOW, 16);
    for round in 0..3u64 {
        let t = w.now() + 300 + round;
        let hs: Vec<_> = (0..1000).map(|i| w.insert(t, i)).collect();
        for h in &hs[..500] {
            assert!(w.cancel(*h).is_some());
        }
        let mut got = fire_to(&mut w, t);
        got.sort_unstable();
        assert_eq!(got, (500..1000).collect::<Vec<_>>());
        assert!(hs.iter().all(|h| w.deadline(*h).is_none()));
    }
    assert!(format!("{w:?}").contains("len: 0"));
}

#[test]
fn wheel_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Wheel<String>>();
    check::<Handle>();
}
