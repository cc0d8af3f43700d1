//! Model-based property test: random insert / cancel / reschedule / advance
//! sequences checked against a `BTreeMap` model after every operation.

use super::level::LEVEL_BITS;
use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

/// How far from `now` a deadline lands; mixes every level and the past.
#[derive(Clone, Debug)]
enum Offset {
    Past(u64),
    Near(u64),
    Mid(u64),
    Far(u64),
    /// 64^k + delta: right on a level boundary.
    Boundary(u32, i8),
}

#[derive(Clone, Debug)]
enum Step {
    Back(u64),
    Small(u64),
    Medium(u64),
    Huge(u64),
    /// To `next_deadline()` (exercises the lower bound's progress).
    NextDeadline,
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Offset),
    /// Index into every handle ever issued (live or stale).
    Cancel(usize),
    Reschedule(usize, Offset),
    Advance(Step),
}

fn offset() -> impl Strategy<Value = Offset> {
    prop_oneof![
        1 => (0u64..=5).prop_map(Offset::Past),
        3 => (0u64..200).prop_map(Offset::Near),
        2 => (0u64..300_000).prop_map(Offset::Mid),
        2 => (0u64..(1 << 40)).prop_map(Offset::Far),
        1 => (1u32..8, -1i8..=1).prop_map(|(k, d)| Offset::Boundary(k, d)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0u64..100).prop_map(Step::Back),
        3 => (0u64..100).prop_map(Step::Small),
        2 => (0u64..100_000).prop_map(Step::Medium),
        1 => (0u64..(1 << 41)).prop_map(Step::Huge),
        2 => Just(Step::NextDeadline),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => offset().prop_map(Op::Insert),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => (any::<usize>(), offset()).prop_map(|(i, o)| Op::Reschedule(i, o)),
        3 => step().prop_map(Op::Advance),
    ]
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1_700_000_000_000u64..1_900_000_000_000,
        1 => 0u64..10_000,
        // Near the end of time: deadlines saturate at u64::MAX.
        1 => (0u64..(1 << 42)).prop_map(|d| u64::MAX - d),
    ]
}

fn deadline(now: u64, o: &Offset) -> u64 {
    match *o {
        Offset::Past(d) => now.saturating_sub(d),
        Offset::Near(d) | Offset::Mid(d) | Offset::Far(d) => now.saturating_add(d),
        Offset::Boundary(k, delta) => {
            let p = 1u64 << (k * LEVEL_BITS);
            now.saturating_add(p).saturating_add_signed(delta as i64)
        }
    }
}

/// Reference implementation: ordered map of live entries.
#[derive(Default)]
struct Model {
    now: u64,
    /// (deadline, seq) -> value (== seq).
    live: BTreeMap<(u64, u64), u64>,
    /// seq -> deadline, for live entries.
    by_seq: HashMap<u64, u64>,
}

impl Model {
    fn remove(&mut self, seq: u64) -> Option<u64> {
        let d = self.by_seq.remove(&seq)?;
        self.live.remove(&(d, seq))
    }
}

fn run(start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut w: Wheel<u64> = Wheel::new(start);
    let mut m = Model {
        now: start,
        ..Model::default()
    };
    // Every handle ever issued, with its seq (its value).
    let mut handles: Vec<(Handle, u64)> = Vec::new();
    let mut seq = 0u64;
    // next_deadline is exact until a cancel/reschedule removes a slot minimum;
    // we only assert exactness while nothing has been removed that way.
    let mut removed_any = false;

    for op in &ops {
        match op {
            Op::Insert(o) => {
                let d = deadline(m.now, o);
                let h = w.insert(d, seq);
                prop_assert_eq!(w.deadline(h), Some(d));
                m.live.insert((d, seq), seq);
                m.by_seq.insert(seq, d);
                handles.push((h, seq));
                seq += 1;
            }
            Op::Cancel(i) if !handles.is_empty() => {
                let (h, s) = handles[i % handles.len()];
                let got = w.cancel(h);
                prop_assert_eq!(got, m.remove(s));
                removed_any = true;
            }
            Op::Reschedule(i, o) if !handles.is_empty() => {
                let (h, s) = handles[i % handles.len()];
                let d = deadline(m.now, o);
                let live = m.remove(s).is_some();
                prop_assert_eq!(w.reschedule(h, d), live);
                if live {
                    m.live.insert((d, s), s);
                    m.by_seq.insert(s, d);
                    prop_assert_eq!(w.deadline(h), Some(d));
                }
                removed_any = true;
            }
            Op::Cancel(_) | Op::Reschedule(..) => {}
            Op::Advance(s) => {
                let target = match *s {
                    Step::Back(d) => m.now.saturating_sub(d),
                    Step::Small(d) | Step::Medium(d) | Step::Huge(d) => m.now.saturating_add(d),
                    Step::NextDeadline => w.next_deadline().unwrap_or(m.now),
                };
                let before = (w.len(), w.next_deadline());
                let mut fired: Vec<(Handle, u64)> = Vec::new();
                w.advance(target, &mut |h, v| fired.push((h, v)));
                m.now = m.now.max(target);
                prop_assert_eq!(w.now(), m.now);

                // Same set as the model's due entries...
                let due: Vec<(u64, u64)> = m
                    .live
                    .range(..=(m.now, u64::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                let mut fired_seqs: Vec<u64> = fired.iter().map(|&(_, v)| v).collect();
                fired_seqs.sort_unstable();
                let mut due_seqs: Vec<u64> = due.iter().map(|&(_, s)| s).collect();
                due_seqs.sort_unstable();
                prop_assert_eq!(&fired_seqs, &due_seqs);
                // ...in non-decreasing deadline order, with the right handles.
                let mut last = 0;
                for &(h, v) in &fired {
                    let d = m.by_seq[&v];
                    prop_assert!(d >= last, "out of order: {} after {}", d, last);
                    prop_assert!(d <= m.now);
                    last = d;
                    prop_assert_eq!(handles[v as usize], (h, v));
                    prop_assert_eq!(w.deadline(h), None);
                }
                for (d, s) in due {
                    m.live.remove(&(d, s));
                    m.by_seq.remove(&s);
                }
                // Advancing to next_deadline always makes progress.
                if matches!(s, Step::NextDeadline) && before.1.is_some() {
                    prop_assert!(before != (w.len(), w.next_deadline()), "no progress");
                }
            }
        }

        prop_assert_eq!(w.len(), m.live.len());
        prop_assert_eq!(w.is_empty(), m.live.is_empty());
        let model_min = m.live.keys().next().map(|&(d, _)| d);
        match (w.next_deadline(), model_min) {
            (None, None) => {}
            (Some(nd), Some(min)) => {
                prop_assert!(nd <= min, "next_deadline {} > earliest {}", nd, min);
                if !removed_any {
                    prop_assert_eq!(nd, min, "inexact without removals");
                }
            }
            (nd, min) => prop_assert!(false, "next_deadline {:?} vs model {:?}", nd, min),
        }
    }

    // Finally drain everything: nothing may be lost.
    let mut rest = Vec::new();
    w.advance(u64::MAX, &mut |_, v| rest.push(v));
    let mut expect: Vec<u64> = m.live.values().copied().collect();
    rest.sort_unstable();
    expect.sort_unstable();
    prop_assert_eq!(rest, expect);
    prop_assert!(w.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn matches_btreemap_model(start in start(), ops in prop::collection::vec(op(), 1..200)) {
        run(start, ops)?;
    }
}
