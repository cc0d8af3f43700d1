//! The live map and its cells: loading a task into memory when a step or command needs it,
//! and letting it go again when it is idle.
//!
//! Invariants:
//! - The live map has a key for every unfinished task and for no finished one, but those a
//!   delete holds off while it reads and writes them ([`LiveMap::hold`]: kept apart, never
//!   counted as live).
//! - A cell is only cloned out of the map under the map's lock, so a cell whose only holders
//!   are the map and one guard cannot gain another holder while that lock is held: that is when
//!   [`Locked::release`] may unload it (the next user reloads it from the store, which equals
//!   memory because every change is durable before its lock is released).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;

use super::{offload, EngineError, Inner, LiveState, LiveTask, Slot};
use crate::deliver::webhook::Gate;
use crate::model::{RunState, TaskState};
use crate::store::records::LiveEntry;

/// The live map: every unfinished task by id, with its cell while it is loaded.
///
/// Start-up loads the running tasks and those due soon, reports ready, and loads the rest of
/// the live index in the background (`recovery.rs`). Meanwhile `loading` is `Some`: a task the
/// loader has not reached yet is *adopted* by the first command or create that names it
/// ([`adopt`]), and every id put in the map by anyone but the loader is recorded there, so the
/// loader (which may have read an older entry) leaves those alone.
///
/// Memory: at a million pending tasks this is the engine's biggest table, so the ids are a set
/// (16 bytes a slot) and the few loaded cells a map of their own.
#[derive(Default)]
pub(crate) struct LiveMap {
    ids: IdSet,
    /// Invariant: every key is in `ids`.
    cells: HashMap<Arc<str>, Arc<LiveTask>, foldhash::fast::RandomState>,
    /// The finished tasks a delete holds off (`retention.rs`), up to a sweep's group of them:
    /// in `ids` so a command that would bring one back waits for the delete's cell, but not
    /// live, so [`LiveMap::len`] (the `live_tasks_max` check, `herald_tasks_live`) leaves
    /// them out. Invariant: every id here is in `ids`.
    held: IdSet,
    pub loading: Option<IdSet>,
    /// The send gate of each task with a send under way (`step.rs`, `SendGate`), by id. Kept
    /// apart from the cells: a cancelled task leaves the map while its send is still out.
    /// An entry lives while a send holds it (it is removed by the last one's
    /// [`LiveMap::gate_done`]); its clones are only handed to sends, under this map's lock.
    /// Invariant, under the task's lock and outside a command's write: a gate is closed
    /// exactly when its task is paused or cancelled.
    gates: HashMap<Arc<str>, Arc<Gate>, foldhash::fast::RandomState>,
}

/// A set of task ids, hashed with foldhash (randomly seeded per process, as the timer's table
/// of fire keys): every step and create looks its id up here under the map's one lock, and
/// SipHash was most of that lookup.
pub(crate) type IdSet = HashSet<Arc<str>, foldhash::fast::RandomState>;

impl LiveMap {
    /// Inserts on behalf of a command or a create (not the loader).
    pub fn claim(&mut self, id: Arc<str>, cell: Option<Arc<LiveTask>>) {
        self.held.remove(&id);
        if let Some(set) = &mut self.loading {
            set.insert(id.clone());
        }
        match cell {
            Some(c) => {
                self.cells.insert(id.clone(), c);
            }
            None => {
                self.cells.remove(&id);
            }
        }
        self.ids.insert(id);
    }

    /// Claims finished task `id` with `cell` for a delete ([`LiveMap::claim`], not counted by
    /// [`LiveMap::len`]); `false`, and nothing done, if it is in the map already.
    pub fn hold(&mut self, id: Arc<str>, cell: Arc<LiveTask>) -> bool {
        if self.ids.contains(&id) {
            return false;
        }
        self.claim(id.clone(), Some(cell));
        self.held.insert(id);
        true
    }

    /// A task held off by a delete, found unfinished on disk (`retention.rs`, `Held::release`):
    /// live from now on, unloaded (its next user makes a cell).
    pub fn unhold(&mut self, id: &str) {
        if self.held.remove(id) {
            self.cells.remove(id);
        }
    }

    /// Inserts on behalf of the start-up loader: only a task nobody has claimed.
    pub fn load(&mut self, id: &Arc<str>) -> bool {
        if self.ids.contains(id) || self.loading.as_ref().is_some_and(|s| s.contains(id)) {
            return false;
        }
        self.ids.insert(id.clone());
        true
    }

    /// The ids `keep` accepts (cluster mode: a shard's tasks, to unload them).
    pub fn ids_where(&self, keep: impl Fn(&str) -> bool) -> Vec<Arc<str>> {
        self.ids.iter().filter(|id| keep(id)).cloned().collect()
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// Live tasks: the ids but those held off by a delete.
    pub fn len(&self) -> usize {
        self.ids.len().saturating_sub(self.held.len())
    }

    /// Every live task with a cell now (loaded, or being loaded), and its cell. Not those a
    /// delete holds off: finished, they have nothing armed, and their cells stay locked for
    /// the delete's reads and write (a drain's stand-down, `step::stand_down_all`, waited for
    /// each of them until its deadline).
    pub fn cells(&self) -> Vec<(Arc<str>, Arc<LiveTask>)> {
        self.cells
            .iter()
            .filter(|(id, _)| !self.held.contains(*id))
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect()
    }

    /// The task's cell, if it has one now.
    pub fn cell(&self, id: &str) -> Option<&Arc<LiveTask>> {
        self.cells.get(id)
    }

    /// The task's cell, made if it has none; `None` if the task is not live.
    fn cell_or_new(&mut self, id: &str) -> Option<Found> {
        let key = self.ids.get(id)?.clone();
        let cell = self
            .cells
            .entry(key.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Slot::unloaded())))
            .clone();
        Some((key, cell))
    }

    /// Drops the task's cell; the task stays live (unloaded).
    fn drop_cell(&mut self, id: &str) {
        self.cells.remove(id);
    }

    /// The task is no longer live.
    pub fn remove(&mut self, id: &str) {
        self.cells.remove(id);
        self.held.remove(id);
        self.ids.remove(id);
    }

    /// The send gate of task `id` for a send about to start, taken under the task's lock
    /// with the task running (so the gate is open); give it back with
    /// [`LiveMap::gate_done`].
    pub fn gate(&mut self, id: &Arc<str>) -> Arc<Gate> {
        self.gates.entry(id.clone()).or_default().clone()
    }

    /// A send is done with its gate: the entry goes with the last send holding it.
    pub fn gate_done(&mut self, id: &str, gate: Arc<Gate>) {
        let last = self
            .gates
            .get(id)
            .is_some_and(|g| Arc::ptr_eq(g, &gate) && Arc::strong_count(g) == 2);
        drop(gate);
        if last {
            self.gates.remove(id);
        }
    }

    /// Closes task `id`'s gate (a cancel or pause, under the task's lock, before its write);
    /// whether it was closed already (`true` too when no send is under way).
    pub fn close_gate(&mut self, id: &str) -> bool {
        self.gates.get(id).is_none_or(|g| g.close())
    }

    /// Opens task `id`'s gate (a resume, or a cancel or pause whose write failed: under the
    /// task's lock).
    pub fn open_gate(&mut self, id: &str) {
        if let Some(g) = self.gates.get(id) {
            g.open();
        }
    }
}

/// While the live index is still loading: a task the loader has not reached yet is taken
/// over from its live entry on disk (its fire goes on the wheel now, and the loader will skip
/// it). In cluster mode also a task of a held shard that another node created and whose inbox
/// row has not been read yet (`cluster.rs`). Whether `id`, not in the map, may be such a task:
/// not while nothing loads (alone), nor when its shard is not held (cluster mode).
pub(crate) fn may_adopt(inner: &Inner, live: &LiveMap, id: &str) -> bool {
    (live.loading.is_some() || inner.config.cluster.is_some())
        && !live.contains_key(id)
        && inner.owns(id)
}

/// `id`'s live entry for an adoption, read without the map's lock (a round trip on
/// PostgreSQL must not hold every worker off the map); `None` when the task is not live or its
/// entry cannot be read (logged).
fn live_entry(inner: &Inner, id: &str) -> Option<LiveEntry> {
    match inner.store.live_entry(id) {
        Ok(Some(entry)) if !entry.state.is_terminal() => Some(entry),
        Ok(_) => None,
        Err(e) => {
            tracing::error!(task = %id, error = %e, "live entry cannot be read");
            None
        }
    }
}

/// Takes `id` over from `entry` ([`may_adopt`]), read before the map's lock was taken here:
/// unless someone put it in the map meanwhile, or claimed it and it left again (finished:
/// the loading set remembers every claim), or its shard went.
fn adopt(inner: &Inner, id: &str, entry: Option<LiveEntry>) {
    let Some(entry) = entry else {
        return;
    };
    let mut live = inner.live.lock();
    let claimed_before = live.loading.as_ref().is_some_and(|s| s.contains(id));
    if may_adopt(inner, &live, id) && !claimed_before {
        let id: Arc<str> = Arc::from(id);
        super::arm::arm_entry(inner, &id, &entry);
        live.claim(id, None);
    }
}

/// [`adopt`] with the entry read off the workers when the store's reads can block.
pub(crate) async fn adopt_off(inner: &Arc<Inner>, id: &str) -> Result<(), EngineError> {
    let key = id.to_string();
    let entry = offload::read(inner, move |i| Ok(live_entry(i, &key))).await?;
    adopt(inner, id, entry);
    Ok(())
}

/// Under the map's lock: the cell of a task in the map (`Some(Some)`), `Some(None)` for one
/// that is not live, `None` when it may have to be adopted first.
fn in_map(inner: &Inner, live: &mut LiveMap, id: &str) -> Option<Option<Found>> {
    if may_adopt(inner, live, id) {
        return None;
    }
    Some(live.cell_or_new(id))
}

/// A task's cell, locked and loaded.
pub(crate) struct Locked {
    pub id: Arc<str>,
    pub(crate) guard: OwnedMutexGuard<Slot>,
}

impl Locked {
    pub fn st(&mut self) -> &mut LiveState {
        match &mut *self.guard {
            Slot::Loaded(s) => s,
            // `lock` only hands out loaded cells, and nothing unloads a cell it holds.
            Slot::Unloaded(_) => unreachable!("a Locked cell is always loaded"),
        }
    }

    pub fn is_loaded(&self) -> bool {
        matches!(&*self.guard, Slot::Loaded(_))
    }

    /// The cell itself, to lock it again after a send (see [`relock`]).
    pub fn cell(&self) -> Arc<LiveTask> {
        OwnedMutexGuard::mutex(&self.guard).clone()
    }

    /// Forgets what memory holds: the next user reads the task back from the store. Used when
    /// a write failed after a send, so memory never runs ahead of the disk, or when a prepared
    /// send is not made. `run` is the caller's own run, whose attempt is not (or no longer)
    /// out: it is armed again by the load. Any other run with a send out stays marked in the
    /// unloaded cell, so its load does not send it a second time meanwhile.
    pub fn unload(&mut self, run: u32) {
        let out = match &mut *self.guard {
            Slot::Loaded(st) => {
                let mut out = std::mem::take(&mut st.sending);
                out.remove(&run);
                out
            }
            Slot::Unloaded(out) => {
                let mut out = std::mem::take(out);
                out.remove(&run);
                out
            }
        };
        *self.guard = Slot::Unloaded(out);
    }

    /// Ends the lock. A finished task leaves the live map; an idle one is unloaded if nobody
    /// else is waiting for it.
    pub fn release(mut self, inner: &Inner) {
        if let Some(terminal) = self.leaving() {
            // Bound to a name: the map's lock (a temporary) ends with this statement, the
            // cell's own lock after it, as `release_in` says.
            let _cell = self.release_in(&mut inner.live.lock(), terminal);
        }
    }

    /// Whether [`Locked::release`] has anything to do in the live map: `Some(true)` for a
    /// finished task, `Some(false)` for an idle one, `None` for one that stays loaded.
    fn leaving(&mut self) -> Option<bool> {
        if !self.is_loaded() {
            return None;
        }
        let st = self.st();
        let terminal = st.progress.state.is_terminal();
        let idle = st.is_idle() && st.progress.state != TaskState::Running;
        (terminal || idle).then_some(terminal)
    }

    /// The live map's part of [`Locked::release`], with its lock held by the caller. The
    /// cell's own lock ends when `self` is dropped, after the caller lets go of the map.
    fn release_in(mut self, live: &mut LiveMap, terminal: bool) -> Locked {
        let ours = live
            .cell(&self.id)
            .is_some_and(|c| Arc::ptr_eq(c, OwnedMutexGuard::mutex(&self.guard)));
        if ours {
            if terminal {
                live.remove(&self.id);
            } else if Arc::strong_count(OwnedMutexGuard::mutex(&self.guard)) == 2 {
                *self.guard = Slot::unloaded();
                live.drop_cell(&self.id);
            }
        }
        self
    }
}

/// [`Locked::release`] of many (a chunk's tasks after its settle) under one hold of the live
/// map's lock: in a herd, the two workers took that lock once per task to find each cell and
/// once more to release it, and a worker preempted while holding it put the other to sleep.
pub(crate) fn release_all(inner: &Inner, ls: Vec<Locked>) {
    let mut kept = Vec::with_capacity(ls.len());
    {
        let mut live = inner.live.lock();
        for mut l in ls {
            kept.push(match l.leaving() {
                Some(terminal) => l.release_in(&mut live, terminal),
                None => l,
            });
        }
    }
    drop(kept);
}

/// The cell of an unfinished task (made on demand), or `None` if the task is not live.
pub(crate) fn cell_of(inner: &Inner, id: &str) -> Option<Found> {
    if let Some(found) = in_map(inner, &mut inner.live.lock(), id) {
        return found;
    }
    adopt(inner, id, live_entry(inner, id));
    inner.live.lock().cell_or_new(id)
}

/// [`cell_of`] from async code: an adoption's read is made off the workers when the store's
/// reads can block.
async fn cell_of_off(inner: &Arc<Inner>, id: &str) -> Result<Option<Found>, EngineError> {
    if let Some(found) = in_map(inner, &mut inner.live.lock(), id) {
        return Ok(found);
    }
    adopt_off(inner, id).await?;
    Ok(inner.live.lock().cell_or_new(id))
}

/// A task's id as the live map holds it, and its cell.
pub(crate) type Found = (Arc<str>, Arc<LiveTask>);

/// [`cell_of`] for many ids, those in the live map under one hold of its lock (a chunk's
/// keys). An id not in the map is looked up after, one [`cell_of`] each: adopting it may read
/// the store (a round trip on PostgreSQL), which must not hold every worker off the map.
pub(crate) fn cells_of<'a>(
    inner: &Inner,
    ids: impl Iterator<Item = &'a str>,
) -> Vec<Option<Found>> {
    let ids: Vec<&str> = ids.collect();
    let in_map: Vec<Option<Option<Found>>> = {
        let mut live = inner.live.lock();
        ids.iter()
            .map(|id| live.contains_key(id).then(|| live.cell_or_new(id)))
            .collect()
    };
    ids.iter()
        .zip(in_map)
        .map(|(id, found)| found.unwrap_or_else(|| cell_of(inner, id)))
        .collect()
}

/// What [`lock`] found.
pub(crate) enum Got {
    Ready(Locked),
    /// Loaded, but its runs cannot be read: the caller (`commit::lock`) parks it `failed`.
    Park(Locked, String),
    /// The task is not live (or it finished while we waited).
    Gone,
}

/// Locks a live task's cell and loads it if needed.
///
/// The cell waited for may have left the map by the time its lock is ours: a create that
/// failed forgets its cell, a shard let go takes its tasks'. Acted on, it would write for a
/// task not stored (or not this node's), so the map is asked again once the lock is held. A
/// cell replaced [`LOCK_TRIES`] times in a row (each time another request made progress on the
/// id) is a 503 to try again, not a "not live" that may be false.
pub(crate) async fn lock(inner: &Arc<Inner>, id: &str) -> Result<Got, EngineError> {
    for _ in 0..LOCK_TRIES {
        let Some((id, cell)) = cell_of_off(inner, id).await? else {
            return Ok(Got::Gone);
        };
        let guard = cell.clone().lock_owned().await;
        let current = inner
            .live
            .lock()
            .cell(&id)
            .is_some_and(|c| Arc::ptr_eq(c, &cell));
        if current {
            return loaded_off(inner, id, guard).await;
        }
    }
    Err(EngineError::Busy(format!(
        "task {id} changed hands {LOCK_TRIES} times while this request waited for it; try again"
    )))
}

/// How many times [`lock`] waits for a cell that then turns out replaced.
const LOCK_TRIES: usize = 4;

/// Locks an `expired` task to re-arm it (a PATCH with a new schedule, a trigger: issue 28).
/// It has no live entry, so it is put back in the live map here with a cell loaded from its
/// record (it has no active runs); if the command does not re-arm it, [`Locked::release`]
/// takes it out again (finished). A task live already is locked the usual way.
///
/// Claimed first, read after, as a delete does (`retention.rs::hold_off`): a locked, unloaded
/// cell goes in the map, and only then is the task read. Read before the claim, a whole delete
/// (claim, read, write, release) could run in between, and the cell built from the deleted
/// task would bring it back: a trigger writing progress and a run with no spec, a PATCH
/// answering for a task already answered as deleted. `Gone`: not on disk any more, or no
/// longer `expired` (finished otherwise; a task brought back meanwhile is in the map).
pub(crate) async fn lock_expired(inner: &Arc<Inner>, id: &str) -> Result<Got, EngineError> {
    let epoch = inner.load_epoch(id);
    let cell: Arc<LiveTask> = Arc::new(tokio::sync::Mutex::new(Slot::unloaded()));
    let Ok(guard) = cell.clone().try_lock_owned() else {
        // A new mutex is never locked.
        return lock(inner, id).await;
    };
    let key: Arc<str> = Arc::from(id);
    // The map's lock is a blocking one: taken and let go without an await in between.
    let claimed = {
        let mut live = inner.live.lock();
        let claimed = !live.contains_key(id);
        if claimed {
            live.claim(key.clone(), Some(cell.clone()));
        }
        claimed
    };
    if !claimed {
        return lock(inner, id).await;
    }
    let l = Locked { id: key, guard };
    let read = {
        let key = id.to_string();
        offload::read(inner, move |i| Ok(i.store.get_task(&key)?)).await
    };
    match read {
        Ok(Some(task)) if task.state == TaskState::Expired => {
            let mut l = l;
            *l.guard = Slot::Loaded(Box::new(LiveState::new(task, BTreeMap::new()).at(epoch)));
            Ok(Got::Ready(l))
        }
        other => {
            // Out of the map again before the cell's lock goes: a command that waited for it
            // finds the task as it is on disk.
            {
                let mut live = inner.live.lock();
                if is_current(&live, &l) {
                    live.remove(&l.id);
                }
            }
            drop(l);
            match other {
                Err(e) => Err(e),
                Ok(Some(t)) if !t.state.is_terminal() => lock(inner, id).await,
                Ok(_) => Ok(Got::Gone),
            }
        }
    }
}

/// What [`try_lock_cell`] found.
pub(crate) enum TryGot {
    Ready(Locked),
    Park(Locked, String),
    /// Someone else holds the cell now.
    Busy,
    Gone,
}

/// Like [`lock`], of a cell found already ([`cells_of`]), but never waits for the cell: a
/// caller that holds other cells (a chunk of sends, `chunk.rs`) must not wait for one, or two
/// such callers could wait for each other.
pub(crate) fn try_lock_cell(
    inner: &Arc<Inner>,
    found: Option<Found>,
) -> Result<TryGot, EngineError> {
    let Some((id, cell)) = found else {
        return Ok(TryGot::Gone);
    };
    let Ok(guard) = cell.try_lock_owned() else {
        return Ok(TryGot::Busy);
    };
    Ok(match loaded(inner, id, guard)? {
        Got::Ready(l) => TryGot::Ready(l),
        Got::Park(l, why) => TryGot::Park(l, why),
        Got::Gone => TryGot::Gone,
    })
}

/// [`loaded`] from async code: a cell to load is loaded off the workers when the store's reads
/// can block (`offload.rs`), its lock held meanwhile.
async fn loaded_off(
    inner: &Arc<Inner>,
    id: Arc<str>,
    guard: OwnedMutexGuard<Slot>,
) -> Result<Got, EngineError> {
    if !matches!(*guard, Slot::Unloaded(_)) {
        return loaded(inner, id, guard);
    }
    offload::read(inner, move |i| loaded(i, id, guard)).await
}

/// A cell's guard, loaded from the store if it was not (see [`lock`]).
fn loaded(
    inner: &Inner,
    id: Arc<str>,
    mut guard: OwnedMutexGuard<Slot>,
) -> Result<Got, EngineError> {
    let mut park = None;
    if let Slot::Unloaded(out) = &*guard {
        match load(inner, &id, out) {
            Ok(Some((st, why))) => {
                *guard = Slot::Loaded(Box::new(st));
                park = why;
            }
            Ok(None) => {
                forget(inner, &id);
                return Ok(Got::Gone);
            }
            Err(EngineError::Store(e)) if e.is_storage() => {
                // The store could not be read right now (a database outage, an I/O error, a
                // reopen under way), which says nothing about the record: the task stays live
                // and unloaded, and the step that wanted it is tried again
                // (`step::step_error`). Dropping it here lost a pending task for good when
                // Postgres went away (`tests/pg_outage.rs`). Only a record that does not
                // decode leaves the schedule.
                tracing::warn!(task = %id, error = %e, "task cannot be loaded while the store fails; trying again");
                return Err(EngineError::Store(e));
            }
            Err(e) => {
                // The task's own record cannot be read: it leaves the live map so that nothing
                // loops on it; listings report it as unreadable.
                forget(inner, &id);
                tracing::error!(task = %id, error = %e, "task record cannot be read; the task is dropped from the schedule");
                return Err(e);
            }
        }
    }
    let mut l = Locked { id, guard };
    if let Some(reason) = park {
        return Ok(Got::Park(l, reason));
    }
    if l.st().progress.state.is_terminal() {
        // Finished while we waited for the lock; the finisher took it out of the map.
        return Ok(Got::Gone);
    }
    Ok(Got::Ready(l))
}

/// Locks `cell` again after run `run`'s send. Unlike [`lock`] it does not go through the live
/// map: a task cancelled during the send has left the map but its sending run must still be
/// settled. `Gone`: the cell was unloaded meanwhile (a failed write) and the task is
/// finished, or the cell was superseded during the send ([`superseded`]: the task loaded anew
/// elsewhere; this cell's memory is given up, nothing is written from it, and the message,
/// still in flight on disk, goes again from there with the same key). `Park`: read back, but
/// its runs' records do not decode (the caller parks it; its runs, empty in memory, could not
/// be settled). If the task cannot be read back now, `run`'s mark leaves the unloaded cell:
/// its outcome will never be settled, so the step's retry must find it interrupted and send
/// it again (same key), not take it for a send still out.
pub(crate) async fn relock(
    inner: &Arc<Inner>,
    id: &Arc<str>,
    cell: Arc<LiveTask>,
    run: u32,
) -> Result<Got, EngineError> {
    let mut l = Locked {
        id: id.clone(),
        guard: cell.lock_owned().await,
    };
    // The cell's lock first, then the map's (the order `Locked::release` takes them in).
    let cluster = inner.config.cluster.is_some();
    if superseded(&inner.live.lock(), &l, cluster) {
        tracing::warn!(task = %id, run,
            "a send's outcome is not written: its task was loaded anew while the send was out (its shard let go and held again); the message goes again, with the same idempotency key, from what is on disk");
        l.unload(run);
        return Ok(Got::Gone);
    }
    let mut park = None;
    if let Slot::Unloaded(out) = &*l.guard {
        let (key, out) = (id.clone(), out.clone());
        let read = offload::read(inner, move |i| load(i, &key, &out)).await;
        match read {
            Ok(Some((st, why))) => {
                *l.guard = Slot::Loaded(Box::new(st));
                park = why;
            }
            Ok(None) => return Ok(Got::Gone),
            Err(e) => {
                if let Slot::Unloaded(out) = &mut *l.guard {
                    out.remove(&run);
                }
                return Err(e);
            }
        }
    }
    Ok(match park {
        Some(reason) => Got::Park(l, reason),
        None => Got::Ready(l),
    })
}

/// Whether `l`'s cell is the live map's cell for its task now.
pub(crate) fn is_current(live: &LiveMap, l: &Locked) -> bool {
    live.cell(&l.id)
        .is_some_and(|c| Arc::ptr_eq(c, OwnedMutexGuard::mutex(&l.guard)))
}

/// Whether the cell `l` holds, locked again after a send (that went outside its lock), has
/// been superseded: its task was loaded anew meanwhile, so the cell's memory may be older than
/// what is on disk, and another cell may be acting on the task. Nothing may be written from
/// it. The store's fence refuses such a write too when the shard was let go and held again
/// (the cell's `LiveState::loaded_at` is an older epoch), but not when the task was loaded
/// anew under the same epoch, nor outside cluster mode: this check comes first.
///
/// A finished task's cell is never superseded: a cancel answered during the send takes the
/// task out of the map, and its sending run is settled from this cell. Any other is when the
/// map holds the task with another cell, or with none (the task left the map and came back:
/// its next user makes a new cell); and in cluster mode also when the map does not hold the
/// task at all (its shard let go since, and perhaps held by another node in between, whose
/// writes this memory has not seen). Alone, a live task leaves the map only by finishing.
pub(crate) fn superseded(live: &LiveMap, l: &Locked, cluster: bool) -> bool {
    if let Slot::Loaded(st) = &*l.guard {
        if st.progress.state.is_terminal() {
            return false;
        }
    }
    if is_current(live, l) {
        return false;
    }
    live.contains_key(&l.id) || cluster
}

/// Reads a task and its active runs from the store. A run that is in flight on disk and not
/// in `out` (the runs whose send is still under way: see [`Slot::Unloaded`]) is not sending
/// now, so its attempt was interrupted (a crash, a failed write): it is sent again, with the
/// next attempt number and the same key.
/// Second value: why the task must be parked `failed` (its runs cannot be read).
fn load(
    inner: &Inner,
    id: &str,
    out: &BTreeSet<u32>,
) -> Result<Option<(LiveState, Option<String>)>, EngineError> {
    // Asked before the read: held at this epoch then and at the write, the shard was held
    // all along, and nobody else wrote the task in between.
    let epoch = inner.load_epoch(id);
    let Some(task) = inner.store.get_task(id)? else {
        return Ok(None);
    };
    Ok(load_task(inner, id, task, out)?.map(|(st, why)| (st.at(epoch), why)))
}

/// [`load`] of a task already read from the store (`prefetch.rs` reads many in one batch):
/// its active runs, and the task's state as a cell holds it.
pub(crate) fn load_task(
    inner: &Inner,
    id: &str,
    task: crate::model::Task,
    out: &BTreeSet<u32>,
) -> Result<Option<(LiveState, Option<String>)>, EngineError> {
    let now_ms = inner.clock.now_ms();
    if task.state.is_terminal() {
        return Ok(None);
    }
    // Every run record is written with the fire that made it (and `fires` counted in the
    // same write): a task never fired has none, and its load skips the scan. Otherwise only
    // its running runs are read (the `active_runs` index): a cron's history never slows a fire.
    let runs = match if task.fires == 0 {
        Ok(Vec::new())
    } else {
        inner.store.active_runs_of(id)
    } {
        Ok(r) => r,
        // The store failing right now (a database outage, an I/O error, a reopen) says
        // nothing about the records: the caller keeps the task unloaded and tries again
        // (`loaded`), as for the task's own read. Parking it `failed` lost it for good.
        Err(e) if e.is_storage() => return Err(EngineError::Store(e)),
        Err(e) => {
            let reason = format!("its run records cannot be read: {e}");
            return Ok(Some((LiveState::new(task, BTreeMap::new()), Some(reason))));
        }
    };
    let mut resent_runs = std::collections::BTreeSet::new();
    // Cluster mode: the mark may be another node's whose attempt could still be under way
    // (HA.md "The send itself"); it goes again only once that attempt must be over. Alone
    // (no `[cluster]`), a mark on disk is this process's own from before a restart: nobody
    // else is sending it, so it goes at once, as ever.
    let wait = inner.config.cluster.as_ref().map(|c| {
        let timeout = inner
            .channels
            .get(&task.channel)
            .map_or(0, |ch| ch.send_timeout_ms());
        (timeout, c.max_clock_offset_ms)
    });
    let runs: BTreeMap<u32, _> = runs
        .into_iter()
        .filter(|r| r.state == RunState::Running)
        .map(|r| {
            if out.contains(&r.run) {
                // Its send is still under way (outside the lock): its own step settles it.
                return (r.run, r);
            }
            let not_before =
                wait.and_then(|(t, off)| super::plan::inherited_not_before(&r, t, off));
            let (r, resent) = super::plan::reload_run(r, now_ms, not_before);
            if resent {
                if let Some(c) = &inner.config.cluster {
                    // Cluster mode: most often one another node had in flight (its lease
                    // ran out, or its write failed), sent again here with the same key.
                    c.ownership
                        .inflight_inherited
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tracing::warn!(task = %id, run = r.run, seq = r.cursor,
                    in_ms = r.next_at_ms.unwrap_or(now_ms).saturating_sub(now_ms),
                    trace_id = %crate::model::timeline::hex(&crate::model::timeline::trace_id_of(&task)),
                    "message was in flight when herald stopped or a write failed; sending it again with the same idempotency key");
                resent_runs.insert(r.run);
            }
            (r.run, r)
        })
        .collect();
    let mut st = LiveState::new(task, runs);
    st.sending = out
        .iter()
        .filter(|r| st.runs.contains_key(r))
        .copied()
        .collect();
    st.resent = resent_runs;
    Ok(Some((st, None)))
}

/// Takes a task out of the live map (it finished, or its record is gone).
pub(crate) fn forget(inner: &Inner, id: &str) {
    inner.live.lock().remove(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(state: Option<TaskState>) -> Arc<LiveTask> {
        let slot = match state {
            Some(s) => {
                let mut task = crate::request::test_task(
                    serde_json::json!({"schedule": {"after": "0s"}, "to": ["a", "b"], "body": "x"}),
                    0,
                );
                task.state = s;
                Slot::Loaded(Box::new(LiveState::new(task, BTreeMap::new())))
            }
            None => Slot::unloaded(),
        };
        Arc::new(tokio::sync::Mutex::new(slot))
    }

    fn locked(id: &Arc<str>, c: &Arc<LiveTask>) -> Locked {
        Locked {
            id: id.clone(),
            guard: c.clone().try_lock_owned().unwrap(),
        }
    }

    /// Review finding: a delete's hold (up to a sweep's page of finished tasks) counted as
    /// live, so creates near `live_tasks_max` were refused and `herald_tasks_live` jumped.
    #[test]
    fn a_task_held_off_by_a_delete_is_in_the_map_but_not_counted_live() {
        let mut live = LiveMap::default();
        live.claim(Arc::from("live"), None);
        assert_eq!(live.len(), 1);
        let held: Arc<str> = Arc::from("done");
        let c = cell(None);
        assert!(live.hold(held.clone(), c.clone()));
        assert_eq!(live.len(), 1, "a held-off task is not live");
        assert!(
            live.contains_key("done"),
            "a command finds it, and waits for its cell"
        );
        assert!(live.cell("done").is_some_and(|x| Arc::ptr_eq(x, &c)));
        // Review finding: a drain's stand-down took every cell, waiting for a held one (locked
        // for its delete's reads and write) until its deadline.
        live.claim(Arc::from("loaded"), Some(cell(None)));
        let ids: Vec<String> = live.cells().iter().map(|(id, _)| id.to_string()).collect();
        assert_eq!(ids, ["loaded"], "a held-off task has nothing to stand down");
        live.remove("loaded");
        assert!(!live.hold(held.clone(), cell(None)), "held already");
        assert!(!live.hold(Arc::from("live"), cell(None)), "live already");
        live.remove("done");
        assert_eq!((live.len(), live.contains_key("done")), (1, false));
        // A claim of an id held (not made today: a claim asks the map first) makes it live.
        assert!(live.hold(held.clone(), cell(None)));
        live.claim(held.clone(), None);
        assert_eq!(live.len(), 2);
        live.remove("done");
        assert_eq!(live.len(), 1);
    }

    /// Review finding: a cell locked again after its send settled from its own memory even
    /// when its task had been loaded anew meanwhile (cluster mode: the shard let go and held
    /// again), and the write passed the fence at the new epoch.
    #[test]
    fn a_cell_whose_task_was_loaded_anew_is_superseded_and_a_finished_one_never() {
        let id: Arc<str> = Arc::from("t");
        let mut live = LiveMap::default();
        let c1 = cell(Some(TaskState::Running));
        live.claim(id.clone(), Some(c1.clone()));
        let l = locked(&id, &c1);
        for cluster in [false, true] {
            assert!(!superseded(&live, &l, cluster), "the map's own cell");
        }
        // Its shard let go: the task left the map. Alone a live task leaves it only finished.
        live.remove(&id);
        assert!(superseded(&live, &l, true));
        assert!(!superseded(&live, &l, false));
        // Held again: the task is back, with no cell yet, then with a new one.
        live.claim(id.clone(), None);
        for cluster in [false, true] {
            assert!(superseded(&live, &l, cluster), "back with no cell");
        }
        let c2 = cell(None);
        live.claim(id.clone(), Some(c2.clone()));
        for cluster in [false, true] {
            assert!(superseded(&live, &l, cluster), "back with another cell");
        }
        // An unloaded cell (a failed write) is judged by the map alone.
        let l2 = locked(&id, &c2);
        assert!(!superseded(&live, &l2, true), "the map's own, unloaded");
        drop(l2);
        let c3 = cell(None);
        assert!(superseded(&live, &locked(&id, &c3), false));
        // A cancel answered during the send: the task left the map (or its id went on to
        // something else), and its sending run is still settled from this cell.
        let done = cell(Some(TaskState::Cancelled));
        let l = locked(&id, &done);
        for cluster in [false, true] {
            assert!(
                !superseded(&live, &l, cluster),
                "finished, the map elsewhere"
            );
        }
        live.remove(&id);
        for cluster in [false, true] {
            assert!(!superseded(&live, &l, cluster), "finished, out of the map");
        }
    }
}
