//! Chunks of due sends to local channels: a herd's messages written, and settled, together.
//!
//! The timer hands over the keys due in a round in batches of up to 256 (so keys due together
//! arrive together); the run steps among them come here. The chunk's cells are found under
//! one hold of the live map's lock (`cells::cells_of`), and each is locked without waiting
//! ([`cells::try_lock_cell`]); when its run is armed, due now and on a local channel (file or
//! log: no round trip to wait for), its send is prepared as in the one-key path (`step.rs`).
//! Then the whole chunk is handed to each channel at once
//! ([`crate::deliver::Channel::send_local`]: one append for a file), every outcome is planned
//! with [`step::settle_plan`], and all the settles are made durable in one write
//! (`commit::apply_chunk`). Only then does memory follow and the locks go (`cells::release_all`,
//! one hold of the map's lock again).
//!
//! Any other key (a run to arm, a webhook, a cell someone else holds, a second run of a task
//! already in the chunk) takes the one-key path in a task of its own ([`step::spawn`],
//! or [`step::spawn_locked`] with the lock the chunk took). So the chunk never waits for a
//! cell while it holds others, and a chunk's settle waits only for chunks still before their
//! send, which never wait on a settle (no two chunks wait for each other); a slow receiver
//! never holds a chunk, and the rules of the one-key path hold
//! here too: a send starts only after its own in-flight mark is durable (it was armed before
//! it reached here); the settle is durable before the lock is released; a failed write
//! unloads every task of the chunk so that memory is read back from disk, and its in-flight
//! messages go again (same idempotency keys).
//!
//! The chunk holds its tasks' locks while it writes to the file, while its settle waits for
//! the sends of the chunks spawned before it ([`Ahead`], at most [`SETTLE_WAIT_MAX`]), and
//! while it commits: a cancel of one of them waits for that (in a herd, up to the herd's
//! sends; a stalled disk delays it by the stall), as it would for a settle. A drain that begins
//! while the chunk is prepared sends none of it (each item settles held, its mark taken back).
//!
//! A part of the chunk that had to wait for its channel's permits (another chunk, or a send,
//! writing to the same channel) asks again, once it has them, what its sends were admitted on
//! ([`after_wait`], as `step::slot` does for one send): a drain begun meanwhile, the shard's
//! trust, quiet hours, the breaker and the rate limit; a send that still goes moves its run's
//! pacing anchor to its start.

use std::collections::HashSet;
use std::sync::Arc;

use super::cells::Locked;
use super::commit::{self, TryLocked};
use super::step::{self, Prepared, SendInFlight, Step};
use super::timer::{RunKey, StepGuard};
use super::Inner;
use crate::deliver::Channel;
use crate::model::{Outcome, TaskState};

/// Chunk settles whose CPU-heavy parts run at a time, per part: the plans of a chunk before
/// its write (`settle_turns`), its memory after it (`settle_after_turns`, a semaphore of its
/// own, so a settle whose write is durable never queues for its locks' release behind a
/// herd's settles still to plan). Each part is ~256 tasks' worth, in polls of
/// [`commit::SLICE`] tasks. One per worker thread (the runtime's default: one per core).
///
/// Why: a herd's sends end together, and so its ~400 settles became runnable at once, and
/// again as their writes became durable (woken by the commit thread, so in tokio's global
/// queue, where the dispatcher also waits for the timer's due keys). Each took a worker for
/// a few ms per poll, and a send due meanwhile waited behind them: probes due 1 s after a
/// herd of 100 000 with a competing `fdatasync` writer were 0.19–0.74 s late at p99 (a log
/// of the dispatcher showed it receiving 34 rounds of due keys, 0–170 ms old, at once). A
/// settle waiting for its turn waits off the run queues, so what is queued ahead of a due
/// step is cheap polls and a few heavy ones (a permit handed on wakes its next holder in the
/// same worker's LIFO slot, which tokio polls up to three times in a row), p99 10–171 ms; with
/// the runtime taking its global queue first (`main.rs`), 10–90 ms, mostly tens; with the
/// parts yielding every [`commit::SLICE`] tasks, 1–5 ms (max 1–10) against 4–20 ms (max 5–35) for
/// the build before, six alternating runs each.
///
/// Not covered: the batch's encoding at the start of `Store::write` (after the turn is given
/// back), and a settle that parks a task (a bug) writes after its turn.
pub(crate) fn settles_at_once() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
}

/// Longest a chunk's settle waits for the sends ahead of it ([`Ahead::wait_for`]); a herd
/// of 100 000 sends in about a third of that on two cores.
const SETTLE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// The chunks not yet past their send, by ticket (handed out in spawn order).
///
/// A settle waits only for the chunks spawned before its own send was over, never for
/// later ones: in a herd the first chunk's settle waits for the whole herd's sends, while
/// under a steady stream of chunks a settle waits for the few in flight at that moment.
///
/// A ticket covers the chunk's whole prepare, also the part that sends nothing: a send held
/// by a rate limit, a breaker or quiet hours writes its hold (one durable write each, in
/// turn), so a herd to a held channel makes the settles before it wait up to the bound.
/// Every lowest ticket that goes wakes every waiting settle to look again (a few hundred
/// in a herd, each woken about once per chunk ahead of it: cheap beside a chunk's work).
#[derive(Default)]
pub(crate) struct Ahead {
    /// Invariant: `outstanding` holds the ticket of every live [`AheadGuard`], and `next` is
    /// above all of them.
    state: parking_lot::Mutex<Tickets>,
    /// Woken whenever the lowest outstanding ticket goes.
    moved: tokio::sync::Notify,
}

#[derive(Default)]
struct Tickets {
    next: u64,
    outstanding: std::collections::BTreeSet<u64>,
}

/// One chunk counted in [`Ahead`] until dropped.
pub(super) struct AheadGuard(Arc<Ahead>, u64);

impl Drop for AheadGuard {
    fn drop(&mut self) {
        let lowest = {
            let mut t = self.0.state.lock();
            let lowest = t.outstanding.first() == Some(&self.1);
            t.outstanding.remove(&self.1);
            lowest
        };
        if lowest {
            self.0.moved.notify_waiters();
        }
    }
}

impl Ahead {
    /// Counts a chunk just spawned, with the next ticket.
    pub(super) fn enter(self: &Arc<Self>) -> AheadGuard {
        let mut t = self.state.lock();
        let ticket = t.next;
        t.next += 1;
        t.outstanding.insert(ticket);
        AheadGuard(self.clone(), ticket)
    }

    /// The last ticket handed out so far.
    fn last(&self) -> Option<u64> {
        self.state.lock().next.checked_sub(1)
    }

    /// Waits until every chunk up to ticket `upto` is past its send, or `max` has passed.
    async fn wait_for(&self, upto: u64, max: std::time::Duration) {
        let wait = async {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                // Registered before the tickets are read: a guard dropped in between wakes it.
                moved.as_mut().enable();
                if self
                    .state
                    .lock()
                    .outstanding
                    .first()
                    .is_none_or(|t| *t > upto)
                {
                    return;
                }
                moved.await;
            }
        };
        let _ = tokio::time::timeout(max, wait).await;
    }
}

/// One prepared send of the chunk, its task locked.
struct Item {
    key: RunKey,
    l: Locked,
    p: Prepared,
    channel: Arc<Channel>,
    _guard: StepGuard,
}

impl Item {
    /// The item is not sent after all: a breaker probe its admission carried is given back
    /// (else the channel stays half-open, every send held, until the probe's lease runs out).
    fn unsent(&self) {
        if let Some(c) = &self.p.channel {
            c.unsent(self.p.probe);
        }
    }
}

/// Carries out the steps of `keys` (run keys, in deadline order). `ahead` counts the chunk
/// among those not yet past their send ([`Ahead`]) until its send is over.
pub(super) async fn run(inner: Arc<Inner>, mut keys: Vec<(RunKey, StepGuard)>, ahead: AheadGuard) {
    // Cluster mode: nothing is armed or sent on a shard being handed over (as the one-key
    // path, `step.rs`); the key comes back, and is dropped once the shard is released.
    keys.retain(|(k, _)| {
        let releasing = inner.releasing(&k.task);
        if releasing {
            step::window_closed(&inner, k.key());
        }
        !releasing
    });
    let mut items = prepare(&inner, keys).await;
    // Cluster mode: a task whose shard's trust is ending is not sent (a local send is over
    // at once, so a window still open is wide enough); its step comes back later, and sends
    // if the trust was renewed, or its next owner sends it (`step::window_closed`).
    // The windows are kept until the settle: each counts its send on its shard until its
    // outcome is written, so a handover of the shard waits for it (`cluster/node.rs`).
    let mut windows = Vec::new();
    items.retain_mut(|it| {
        let window = inner.send_window(&it.key.task);
        let open = !matches!(window, super::cluster::Window::Closed);
        if open {
            // The epoch it goes under, looked at again if it waits for the channel's permits.
            if let super::cluster::Window::Within(_, _, epoch) = &window {
                it.p.delivery.epoch = Some(*epoch);
            }
            windows.push(window);
        } else {
            it.unsent();
            it.l.unload(it.key.run);
            step::window_closed(&inner, it.key.key());
        }
        open
    });
    // A cell found at the chunk's start may have left the map while the chunk prepared
    // (cluster mode: its shard dropped and taken again, a fresh cell made for it): its memory
    // may be stale, and the map's cell is the one that counts. Such a task is not sent here;
    // whoever holds the map's cell steps it.
    let stale: Vec<Item> = {
        let live = inner.live.lock();
        let (kept, stale) = std::mem::take(&mut items).into_iter().partition(|it| {
            live.cell(&it.key.task)
                .is_some_and(|c| Arc::ptr_eq(c, &it.l.cell()))
        });
        items = kept;
        stale
    };
    for mut it in stale {
        it.unsent();
        it.l.unload(it.key.run);
    }
    if items.is_empty() {
        return;
    }
    let _in_flight: Vec<SendInFlight> = items.iter().map(|_| SendInFlight::new(&inner)).collect();
    let (items, outcomes) = if step::draining(&inner) {
        // A drain began while the chunk was being prepared: nothing is sent. Each item is
        // held (no attempt counted), and its settle, during the drain, arms nothing: its mark
        // is taken back in the chunk's write, so the next boot sends it at its time as its
        // next attempt, not as a send cut short.
        let outcomes = items
            .iter()
            .map(|it| {
                it.unsent();
                step::drain_held(&inner)
            })
            .collect();
        (items, outcomes)
    } else {
        inner
            .chunked_sends
            .fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        send(&inner, items).await
    };
    // Sends before settles: the settle (plans, records, the commit: more CPU than the
    // prepare and the send) waits until the chunks spawned so far are past their sends, at
    // most [`SETTLE_WAIT_MAX`] ([`Ahead`]). So a herd's messages all leave first, and its
    // settles follow.
    //
    // Why: a herd's ~400 chunks were spawned at once, and the settles of the first ones ran
    // between the prepares of the rest. With a `yield_now` between send and settle (tokio
    // runs a yielded task again at its worker's next maintenance tick, every 61 polls), the
    // settles still came in bursts: 100–300 ms with no send at all, in 9 of 15 herds (the
    // load bench's sends per 100 ms, and a profile cut to such a gap: the workers settling).
    //
    // The cost: a chunk's settle comes later by the sends ahead of it, up to the bound. The
    // locks are held until it is durable (a cancel of one of its tasks waits that much
    // longer), and a crash meanwhile sends each unsettled message once more (same
    // idempotency key), as it would any message in flight. In cluster mode the settle is one
    // fenced write: if any shard of the chunk changed hands meanwhile, the whole write is
    // refused and every message of the chunk goes again (as before, over a longer window).
    let upto = inner.chunks_ahead.last();
    drop(ahead);
    if let Some(upto) = upto {
        inner.chunks_ahead.wait_for(upto, SETTLE_WAIT_MAX).await;
    }
    settle(&inner, items, outcomes).await;
    drop(windows);
}

/// Locks and prepares the keys this chunk can send; hands every other key to the one-key path.
async fn prepare(inner: &Arc<Inner>, keys: Vec<(RunKey, StepGuard)>) -> Vec<Item> {
    let mut items = Vec::with_capacity(keys.len());
    let mut tasks: HashSet<Arc<str>> = HashSet::with_capacity(keys.len());
    // Every key's cell under one hold of the live map's lock (`cells::cells_of`).
    let cells = super::cells::cells_of(inner, keys.iter().map(|(k, _)| &*k.task));
    for ((key, guard), found) in keys.into_iter().zip(cells) {
        if !tasks.insert(key.task.clone()) {
            // Its task is locked by this chunk: the one-key path waits for it.
            step::spawn(inner, Step::Run(key), guard);
            continue;
        }
        let mut l = match commit::try_lock_cell(inner, found).await {
            Ok(TryLocked::Locked(l)) => l,
            Ok(TryLocked::Busy) => {
                step::spawn(inner, Step::Run(key), guard);
                continue;
            }
            Ok(TryLocked::Gone) => continue,
            Err(e) => {
                step::step_error(inner, key.key(), &e);
                continue;
            }
        };
        let Some(channel) = local_send_due(inner, &mut l, &key) else {
            step::spawn_locked(inner, key, guard, l);
            continue;
        };
        // Armed already: `prepare` writes nothing here, it checks and builds the delivery.
        match step::prepare(inner, &mut l, &key).await {
            Ok(Some(p)) => items.push(Item {
                key,
                l,
                p,
                channel,
                _guard: guard,
            }),
            Ok(None) => l.release(inner),
            Err(e) => {
                if let Err(e) = step::step_failed(inner, l, e).await {
                    step::step_error(inner, key.key(), &e);
                }
            }
        }
    }
    items
}

/// The channel of the run's send if it is armed, due now and goes to a local channel.
fn local_send_due(inner: &Inner, l: &mut Locked, key: &RunKey) -> Option<Arc<Channel>> {
    let now = inner.clock.now_ms();
    let st = l.st();
    if st.progress.state != TaskState::Running || st.sending.contains(&key.run) {
        return None;
    }
    let run = st.runs.get(&key.run)?;
    if run.in_flight.is_none() || run.next_at_ms.is_some_and(|at| at > now) {
        return None;
    }
    inner
        .channels
        .get(&st.spec.channel)
        .filter(|c| c.is_local())
        .cloned()
}

/// Sends every item, a channel's items together (in deadline order), and counts the outcomes.
async fn send(inner: &Arc<Inner>, mut items: Vec<Item>) -> (Vec<Item>, Vec<Outcome>) {
    // The chunk's channels, in the order their first item comes.
    let mut channels: Vec<Arc<Channel>> = Vec::new();
    for it in &items {
        if !channels.iter().any(|c| Arc::ptr_eq(c, &it.channel)) {
            channels.push(it.channel.clone());
        }
    }
    let mut outcomes: Vec<Option<Outcome>> = items.iter().map(|_| None).collect();
    for channel in channels {
        let mine: Vec<bool> = items
            .iter()
            .map(|it| Arc::ptr_eq(&it.channel, &channel))
            .collect();
        let sent = send_to(inner, &channel, &mut items, &mine).await;
        let mut sent = sent.into_iter();
        for ((slot, it), _) in outcomes
            .iter_mut()
            .zip(&mut items)
            .zip(&mine)
            .filter(|(_, m)| **m)
        {
            let (o, waited) = sent.next().unwrap_or_else(|| {
                let o = Outcome::Retry {
                    error: "no outcome for this send".into(),
                    not_before_ms: None,
                };
                (o, Waited::No)
            });
            match waited {
                // Not sent after its wait: counted as held by the checks, nothing recorded.
                Waited::Held => it.unsent(),
                Waited::No => step::record(inner, &channel, &o, it.p.probe),
                Waited::Went(at, mono) => {
                    step::record(inner, &channel, &o, it.p.probe);
                    // The run's pacing counts from when its send started, not from its
                    // admission before the wait (as `step::slot`): a sequence held back by a
                    // busy channel does not send its next message early to catch up. The
                    // settle counts it on the monotonic clock (`step::pacing_anchor`).
                    if let Some(r) = it.l.st().runs.get_mut(&it.key.run) {
                        r.last_attempt_at_ms = Some(at);
                    }
                    it.p.started_at(mono);
                }
            }
            *slot = Some(o);
        }
    }
    // Every item's channel was one of `channels`, so every slot is filled; a missing one
    // would settle as a retry rather than panic.
    let outcomes = outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| Outcome::Retry {
                error: "no outcome for this send".into(),
                not_before_ms: None,
            })
        })
        .collect();
    (items, outcomes)
}

/// Whether a chunk's send waited for its channel's permits, and what came of it then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waited {
    /// Its part had its permits at once.
    No,
    /// It waited and went, starting at this instant (wall, then monotonic).
    Went(u64, u64),
    /// It waited and was held by what it was admitted on, asked again ([`after_wait`]).
    Held,
}

/// What a send was admitted on, asked again if it waits for its channel's permits.
struct Admitted {
    task: Arc<str>,
    /// Cluster mode: the shard's epoch it goes under.
    epoch: Option<u64>,
    probe: bool,
    rate_tick: Option<u64>,
    key: String,
    /// Its task and its message's zone: quiet hours, asked again (`step::quiet_after_wait`).
    spec: Arc<crate::model::TaskSpec>,
    tz: Option<String>,
}

/// The items of `mine` sent to `channel` at once: each outcome in order, with whether (and how)
/// it waited for its permits.
async fn send_to(
    inner: &Arc<Inner>,
    channel: &Channel,
    items: &mut [Item],
    mine: &[bool],
) -> Vec<(Outcome, Waited)> {
    let admitted: Vec<Admitted> = items
        .iter()
        .zip(mine)
        .filter(|(_, m)| **m)
        .map(|(it, _)| Admitted {
            task: it.key.task.clone(),
            epoch: it.p.delivery.epoch,
            probe: it.p.probe,
            rate_tick: it.p.rate_tick,
            key: it.p.delivery.idempotency_key.clone(),
            spec: it.p.spec.clone(),
            tz: it.p.tz.clone(),
        })
        .collect();
    let mut waited = vec![Waited::No; admitted.len()];
    let ds = items
        .iter_mut()
        .zip(mine)
        .filter(|(_, m)| **m)
        .map(|(it, _)| &mut it.p.delivery)
        .collect();
    let outcomes = channel
        .send_local(
            ds,
            || inner.clock.now_ms(),
            |i, now| {
                let held = after_wait(inner, channel, admitted.get(i)?, now);
                if let Some(w) = waited.get_mut(i) {
                    *w = if held.is_some() {
                        Waited::Held
                    } else {
                        Waited::Went(now, inner.clock.mono_ms())
                    };
                }
                held
            },
        )
        .await;
    outcomes.into_iter().zip(waited).collect()
}

/// A send of the chunk whose part waited for its channel's permits, asked again at `now`
/// before it goes, as `step::slot` asks one send after its wait: a drain begun meanwhile stops
/// it, cluster mode's trust must still be there (`step::trust_end`), quiet hours begun
/// meanwhile hold it to the window's end, the breaker is asked again and the rate slot taken
/// again (`step::readmit`). Its task cannot have been cancelled or paused meanwhile: the chunk
/// holds its lock. `Some`: held, not sent.
fn after_wait(inner: &Inner, channel: &Channel, a: &Admitted, now: u64) -> Option<Outcome> {
    if step::draining(inner) {
        return Some(step::drain_held(inner));
    }
    if let Err(o) = step::trust_end(inner, &a.task, a.epoch) {
        return Some(o);
    }
    let quiet = (&*a.spec, a.tz.as_deref());
    step::readmit(inner, channel, (a.probe, a.rate_tick, &a.key), quiet, now).err()
}

/// Plans every settle, writes them all at once, then lets memory follow and the locks go.
async fn settle(inner: &Arc<Inner>, items: Vec<Item>, outcomes: Vec<Outcome>) {
    let (items, outcomes) = not_superseded(inner, items, outcomes);
    // A turn for the plans (see [`settles_at_once`]); the semaphore is never closed, and
    // without a turn the settle would still be right, only less polite.
    let turn = inner.settle_turns.acquire().await.ok();
    let mut planned = Vec::with_capacity(items.len());
    let mut failed = Vec::new();
    // Each step is outstanding until its settle is durable (`Engine::idle` counts on it).
    let mut guards = Vec::with_capacity(items.len());
    for (i, (mut it, outcome)) in items.into_iter().zip(outcomes).enumerate() {
        commit::breathe(i).await;
        guards.push(it._guard);
        match step::settle_plan(inner, &mut it.l, &it.key, &it.p, &outcome) {
            Ok(Some(change)) => planned.push((it.l, it.key, change)),
            Ok(None) => it.l.release(inner),
            Err(e) => failed.push((it.l, it.key, e)),
        }
    }
    commit::apply_chunk(inner, planned, turn).await;
    // A bug: these tasks are parked (a durable write each, so not under a turn); the others
    // settled.
    for (l, key, e) in failed {
        if let Err(e) = step::step_failed(inner, l, e).await {
            step::step_error(inner, key.key(), &e);
        }
    }
    drop(guards);
}

/// The items (with their outcomes) whose cells may still write, under one hold of the live
/// map's lock. A cell superseded while the chunk sent and waited for the chunks ahead
/// (`cells::superseded`: cluster mode, its shard let go and held again, its task loaded anew)
/// writes nothing: its memory is given up, and the message, in flight on disk, goes again from
/// there with the same key.
fn not_superseded(
    inner: &Inner,
    items: Vec<Item>,
    outcomes: Vec<Outcome>,
) -> (Vec<Item>, Vec<Outcome>) {
    let cluster = inner.config.cluster.is_some();
    let mut gone = Vec::new();
    let kept = {
        let live = inner.live.lock();
        items
            .into_iter()
            .zip(outcomes)
            .filter_map(|(it, o)| {
                if super::cells::superseded(&live, &it.l, cluster) {
                    gone.push(it);
                    return None;
                }
                Some((it, o))
            })
            .unzip()
    };
    for mut it in gone {
        tracing::warn!(task = %it.l.id, run = it.key.run,
            "a send's outcome is not written: its task was loaded anew while the send was out (its shard let go and held again); the message goes again, with the same idempotency key, from what is on disk");
        it.l.unload(it.key.run);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_settle_waits_for_the_chunks_ahead_and_not_for_later_ones() {
        let ahead = Arc::new(Ahead::default());
        let (first, second) = (ahead.enter(), ahead.enter());
        let upto = ahead.last().unwrap();
        let waiter = {
            let ahead = ahead.clone();
            tokio::spawn(async move { ahead.wait_for(upto, Duration::from_secs(60)).await })
        };
        drop(first);
        // One chunk ahead is still before its send: the settle keeps waiting.
        let mut waiter = std::pin::pin!(waiter);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut waiter)
                .await
                .is_err(),
            "a settle went while a chunk ahead of it had not sent"
        );
        // A chunk spawned later does not hold it; the last one ahead passing its send frees it.
        let _later = ahead.enter();
        drop(second);
        tokio::time::timeout(Duration::from_secs(10), &mut waiter)
            .await
            .expect("the settle waited for a chunk spawned after its send")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_settle_waits_no_longer_than_its_bound() {
        let ahead = Arc::new(Ahead::default());
        let _stuck = ahead.enter();
        let started = tokio::time::Instant::now();
        ahead.wait_for(0, SETTLE_WAIT_MAX).await;
        assert_eq!(started.elapsed(), SETTLE_WAIT_MAX);
    }

    #[tokio::test]
    async fn nothing_ahead_no_wait() {
        let ahead = Arc::new(Ahead::default());
        assert_eq!(ahead.last(), None);
        drop(ahead.enter());
        let upto = ahead.last().unwrap();
        tokio::time::timeout(
            Duration::from_secs(10),
            ahead.wait_for(upto, Duration::from_secs(60)),
        )
        .await
        .expect("no chunk is ahead: the settle goes at once");
    }
}
