//! herald `Wheel` vs `tokio_util::time::DelayQueue` vs `std::collections::BinaryHeap`.
//!
//! All contenders get the same 1 000 000 pseudo-random deadlines in
//! `now+1 ..= now+3_600_000` ms (inline xorshift64). Each measured iteration
//! builds its container from scratch (same for all three), so allocation of
//! the container is included everywhere.
//!
//! * `schedule_cancel`: insert all, then cancel all (in insertion order).
//! * `schedule_expire`: insert all, then advance past the last deadline and
//!   fire/pop everything.
//!
//! BinaryHeap is a min-heap of `Reverse((deadline, id))`; cancel is lazy
//! deletion: an O(1) tombstone in a `Vec<bool>` indexed by id, and popped
//! entries are skipped if tombstoned. Tombstoned entries stay in the heap
//! (the cost of removing them is paid when they would be popped, which
//! `schedule_cancel` never does), so the heap's cancel figure is a lower
//! bound of its real cost.
//!
//! DelayQueue runs in a current-thread tokio runtime with paused time, built
//! once outside the measurement; each iteration runs in `block_on` wrapped in
//! `unconstrained` (so tokio's coop budget does not force yields while
//! draining). Expiry is `tokio::time::advance(1h + 1ms)` then `poll_expired`
//! until `None`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use herald::wheel::Wheel;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::time::Duration;
use tokio_util::time::DelayQueue;

const N: usize = 1_000_000;
const SPREAD_MS: u64 = 3_600_000;
/// An absolute Unix-ms "now", as herald uses.
const NOW: u64 = 1_700_000_000_000;

/// Offsets in 1..=SPREAD_MS, identical for every contender.
fn offsets() -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..N)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + x % SPREAD_MS
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(N as u64))
        .sample_size(10)
        // Iterations take 10s-100s of ms: flat sampling keeps it at ~10 runs.
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    g
}

fn schedule_cancel(c: &mut Criterion) {
    let offs = offsets();
    let rt = runtime();
    let mut g = group(c, "schedule_cancel");

    g.bench_function("wheel", |b| {
        b.iter(|| {
            let mut w = Wheel::with_capacity(NOW, N);
            let mut handles = Vec::with_capacity(N);
            for (id, &o) in offs.iter().enumerate() {
                handles.push(w.insert(NOW + o, id as u32));
            }
            for h in handles {
                black_box(w.cancel(h));
            }
            assert!(w.is_empty());
        })
    });

    g.bench_function("delay_queue", |b| {
        b.iter(|| {
            rt.block_on(tokio::task::unconstrained(async {
                let mut q = DelayQueue::with_capacity(N);
                let mut keys = Vec::with_capacity(N);
                for (id, &o) in offs.iter().enumerate() {
                    keys.push(q.insert(id as u32, Duration::from_millis(o)));
                }
                for k in keys {
                    black_box(q.remove(&k));
                }
                assert!(q.is_empty());
            }))
        })
    });

    g.bench_function("binary_heap", |b| {
        b.iter(|| {
            let mut heap = BinaryHeap::with_capacity(N);
            let mut cancelled = vec![false; N];
            for (id, &o) in offs.iter().enumerate() {
                heap.push(Reverse((NOW + o, id as u32)));
            }
            // The "handle" is the id; cancel = tombstone.
            for id in 0..N {
                cancelled[black_box(id)] = true;
            }
            black_box((&heap, &cancelled));
        })
    });
    g.finish();
}

fn schedule_expire(c: &mut Criterion) {
    let offs = offsets();
    let rt = runtime();
    let mut g = group(c, "schedule_expire");

    g.bench_function("wheel", |b| {
        b.iter(|| {
            let mut w = Wheel::with_capacity(NOW, N);
            for (id, &o) in offs.iter().enumerate() {
                w.insert(NOW + o, id as u32);
            }
            let mut fired = 0usize;
            w.advance(NOW + SPREAD_MS + 1, &mut |_, v| {
                black_box(v);
                fired += 1;
            });
            assert_eq!(fired, N);
        })
    });

    g.bench_function("delay_queue", |b| {
        b.iter(|| {
            rt.block_on(tokio::task::unconstrained(async {
                let mut q = DelayQueue::with_capacity(N);
                for (id, &o) in offs.iter().enumerate() {
                    q.insert(id as u32, Duration::from_millis(o));
                }
                tokio::time::advance(Duration::from_millis(SPREAD_MS + 1)).await;
                let mut fired = 0usize;
                while let Some(e) = poll_fn(|cx| q.poll_expired(cx)).await {
                    black_box(e.into_inner());
                    fired += 1;
                }
                assert_eq!(fired, N);
            }))
        })
    });

    g.bench_function("binary_heap", |b| {
        b.iter(|| {
            let mut heap = BinaryHeap::with_capacity(N);
            let cancelled = vec![false; N];
            for (id, &o) in offs.iter().enumerate() {
                heap.push(Reverse((NOW + o, id as u32)));
            }
            let until = NOW + SPREAD_MS + 1;
            let mut fired = 0usize;
            while let Some(&Reverse((d, id))) = heap.peek() {
                if d > until {
                    break;
                }
                heap.pop();
                if !cancelled[id as usize] {
                    black_box(id);
                    fired += 1;
                }
            }
            assert_eq!(fired, N);
        })
    });
    g.finish();
}

criterion_group!(benches, schedule_cancel, schedule_expire);
criterion_main!(benches);
