//! The storage boundary: the few operations the engine needs from a key-value store, so that a
//! second backend (a replicated one, say) can sit behind [`super::Store`] without touching the
//! engine. sled is the embedded default (`store/embedded/`: `SledBackend`); tests wrap it to inject
//! faults (`store/fault.rs`).
//!
//! The contract:
//! - [`Backend::apply`] applies a group of jobs; each job is atomic on its own (all of its
//!   writes or none) and guarded by its preconditions (keys that must be absent). The result
//!   says, per job, whether it was applied or which precondition failed.
//! - [`Backend::sync`] makes everything applied before it durable (survives power loss) and
//!   visible to reads. The commit thread calls `apply` then `sync` for each group.
//! - Point reads and ordered scans by tree.

use super::StoreError;

/// The trees. Keys are ordered byte strings (see `store/mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TreeId {
    Specs,
    Progress,
    Live,
    Messages,
    Runs,
    Failures,
    Idem,
    /// Secondary index of `Live` in start-up order (see `records::due_key`).
    Due,
    /// The runs that are `running`, keyed like `Runs`, with empty values (`store/mod.rs`).
    Active,
    /// A task's timeline events, `id ‖ 0x00 ‖ seq (u64)` (`store/timeline.rs`). Last: the
    /// log names trees by their place in [`TreeId::ALL`].
    Timeline,
}

/// How many trees there are.
pub const TREES: usize = 10;

impl TreeId {
    pub const ALL: [TreeId; TREES] = [
        TreeId::Specs,
        TreeId::Progress,
        TreeId::Live,
        TreeId::Messages,
        TreeId::Runs,
        TreeId::Failures,
        TreeId::Idem,
        TreeId::Due,
        TreeId::Active,
        TreeId::Timeline,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TreeId::Specs => "specs",
            TreeId::Progress => "progress",
            TreeId::Live => "live",
            TreeId::Messages => "messages",
            TreeId::Runs => "runs",
            TreeId::Failures => "failures",
            TreeId::Idem => "idempotency",
            TreeId::Due => "due",
            TreeId::Active => "active_runs",
            TreeId::Timeline => "timeline",
        }
    }

    /// This tree's slot in a per-tree array.
    #[allow(
        clippy::indexing_slicing,
        reason = "a TreeId's place (its discriminant, its index in ALL) is below TREES"
    )]
    pub(crate) fn of<T>(self, per_tree: &[T; TREES]) -> &T {
        &per_tree[self as usize]
    }

    /// [`TreeId::of`], to change the slot.
    #[allow(
        clippy::indexing_slicing,
        reason = "a TreeId's place (its discriminant, its index in ALL) is below TREES"
    )]
    pub(crate) fn of_mut<T>(self, per_tree: &mut [T; TREES]) -> &mut T {
        &mut per_tree[self as usize]
    }
}

/// One write of a job, already encoded.
#[derive(Clone, Debug)]
pub enum RawOp {
    Put(TreeId, Vec<u8>, Vec<u8>),
    Delete(TreeId, Vec<u8>),
    /// Precondition: the job applies only if this key is absent.
    Absent(TreeId, Vec<u8>),
    /// Puts (`Some`) or deletes (`None`) `key` in `tree` and keeps a secondary index of that
    /// tree in step, in the same job: the index entry of the value being replaced is removed
    /// and the new value's is put (`IndexedWrite::entry` derives both). Rewriting a value
    /// unchanged writes nothing. The writer need not know the old value: the backend reads it.
    Indexed(Box<IndexedWrite>),
    /// The job creates the task with this id (cluster mode, HA.md "Creates and commands on
    /// any node"): its rows may go to a shard this process does not hold, unfenced, and the
    /// shard's owner hears of it through the inbox. Writes nothing itself; a backend without
    /// shards ignores it.
    Born(String),
    /// The idempotency key `.0` this job deletes names task `.1` (its stored record does): a
    /// backend with shards fences the delete on that task's shard, where the key's row lives
    /// (`store/pg/shard.rs`). Writes nothing itself.
    ///
    /// And a precondition: the job applies only if the key is absent or its record still
    /// names `.1` ([`idem_names`]). A key freed because its task is gone may have been taken
    /// again meanwhile (a create freed it and wrote its own task's record): a delete that did
    /// not look would remove that new record, and the next create with the key would make a
    /// second task (review finding).
    IdemOf(Vec<u8>, String),
    /// The job writes from task `.0`'s memory, read from the store while this process held
    /// the task's shard at epoch `.1` (cluster mode, `engine/cells.rs`): a backend with shards
    /// refuses the job unless the shard is held at that epoch still (`store/pg/fence.rs`).
    /// Held at a newer one, it was let go and held again since, and another owner may have
    /// written the task in between. Writes nothing itself; a backend without shards ignores it.
    LoadedAt(String, u64),
}

impl RawOp {
    /// About the bytes this write puts in a write-ahead log record (keys and values; the
    /// writes that hold no data count their names): what bounds a group's size
    /// (`commit.rs`).
    pub fn bytes(&self) -> usize {
        let opt = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, Vec::len);
        match self {
            RawOp::Put(_, k, v) => k.len() + v.len(),
            RawOp::Delete(_, k) | RawOp::Absent(_, k) => k.len(),
            RawOp::Indexed(w) => w.key.len() + opt(&w.value),
            RawOp::Born(s) | RawOp::LoadedAt(s, _) => s.len(),
            RawOp::IdemOf(k, s) => k.len() + s.len(),
        }
    }
}

/// [`RawOp::IdemOf`]'s precondition on the key's current value: absent, or a record that
/// names `task`. A record that does not decode names nobody (the job is refused).
pub fn idem_names(current: Option<&[u8]>, task: &str) -> bool {
    current.is_none_or(|v| {
        super::codec::decode::<super::IdemRecord>(TreeId::Idem.name(), b"", v)
            .is_ok_and(|r| r.task_id == task)
    })
}

/// See [`RawOp::Indexed`]. Format 7's only one: a task's progress record and its due entry.
#[derive(Clone, Debug)]
pub struct IndexedWrite {
    pub tree: TreeId,
    pub key: Vec<u8>,
    /// The new value (`None`: the key is deleted).
    pub value: Option<Vec<u8>>,
    /// Whether `value` is stored in `tree`. `false`: only its index entry is written, and the
    /// value is what [`IndexedWrite::derive`] gives back from then on (a new task's progress,
    /// derived from its spec). A value not stored leaves whatever `tree` holds untouched
    /// (nothing, for a new task).
    pub store: bool,
    pub index: TreeId,
    /// The index entry of a value (its key in `index` and the value it holds there); `None`:
    /// the value has none (a finished task).
    pub entry: fn(&[u8], &[u8]) -> Option<Kv>,
    /// Where the value comes from when `tree` holds none for `key`: `derive(key, v)` of the
    /// value `v` of `key` in `derived_from` as stored before the group (the progress of a
    /// task whose record is not stored, from its spec). The backend reads it only then. A job
    /// that rewrites the source in the same group must store the value (a patch does).
    pub derived_from: TreeId,
    pub derive: fn(&[u8], &[u8]) -> Option<Vec<u8>>,
    /// The writer knows the store holds no value of `key`, stored or derived, when the job's
    /// preconditions hold (a new task: the job requires its spec to be absent), so the backend
    /// need not read it.
    pub stored_absent: bool,
    /// The old value as the writer knows it, stored or derived (the engine's progress of a
    /// task it holds locked, which is the store's: a failed write unloads the task), so the
    /// backend need not read it: a herd's settles each read their task's spec from sled to
    /// derive the progress they replace, ~5 % of the herd's CPU. What the group itself wrote
    /// before still wins. Debug builds read the store anyway and assert that the index entry
    /// of what it holds is this one's (the simulation and the crash loops check the promise).
    /// The sled resolver trusts it; the PostgreSQL one reads anyway (`store/pg/resolve.rs`: a
    /// group answered as failed there may have committed).
    pub old: Option<Vec<u8>>,
}

/// The values of a group not stored in their tree (`IndexedWrite::store` false), by tree and
/// key: what a later job of the group reads as the old value. Both resolvers keep one.
pub type Unstored = std::collections::HashMap<(TreeId, Vec<u8>), Option<Vec<u8>>>;

impl IndexedWrite {
    /// Debug builds: panics unless the writer's `known` old value names the same index entry
    /// as `stored`, what the store holds (stored or derived). The sled resolver checks with it.
    pub fn check_known(&self, known: &Option<Vec<u8>>, stored: &Option<Vec<u8>>) {
        let entry_of = |v: &Option<Vec<u8>>| v.as_deref().and_then(|v| (self.entry)(&self.key, v));
        assert_eq!(
            entry_of(known),
            entry_of(stored),
            "the writer's old value of {:?} is not the store's",
            String::from_utf8_lossy(&self.key)
        );
    }

    /// The writes this indexed write makes once its old value is known (each resolver finds
    /// it in its own way): `old`, and `in_tree` whether it is stored in `tree` (not derived,
    /// not unstored). Index entries and the value go to `put`; a value not stored goes to
    /// `unstored`. Nothing when the value is unchanged and where it is to be; a derived value
    /// written to be stored is stored even unchanged (the writer may be rewriting its source).
    pub fn resolve(
        self,
        old: Option<Vec<u8>>,
        in_tree: bool,
        unstored: &mut Unstored,
        mut put: impl FnMut(TreeId, Vec<u8>, Option<Vec<u8>>),
    ) {
        let IndexedWrite {
            tree,
            key,
            value,
            store,
            index,
            entry,
            ..
        } = self;
        if old == value && (in_tree || !store) {
            return;
        }
        let old_entry = old.as_deref().and_then(|o| entry(&key, o));
        let new_entry = value.as_deref().and_then(|v| entry(&key, v));
        if old_entry != new_entry {
            if let Some((k, _)) = old_entry {
                if new_entry.as_ref().is_none_or(|(n, _)| *n != k) {
                    put(index, k, None);
                }
            }
            if let Some((k, v)) = new_entry {
                put(index, k, Some(v));
            }
        }
        if store {
            unstored.remove(&(tree, key.clone()));
            put(tree, key, value);
        } else {
            unstored.insert((tree, key), value);
        }
    }
}

/// Why a job was not applied: the first precondition that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub tree: TreeId,
    pub key: Vec<u8>,
    /// Not a precondition: the job writes to this shard, which this process no longer holds
    /// (cluster mode's fence, `store/pg/fence.rs`); nothing of it was written.
    pub lost_shard: Option<u32>,
}

/// A key and its value.
pub type Kv = (Vec<u8>, Vec<u8>);

pub type KvIter<'a> = Box<dyn Iterator<Item = Result<Kv, StoreError>> + Send + 'a>;

pub trait Backend: Send + Sync + 'static {
    /// Takes the jobs by value: their keys and values move into the log and the memtable.
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError>;
    fn sync(&self) -> Result<(), StoreError>;
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keys `>= start` in order; with `prefix`, only keys that start with it.
    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a>;
    /// Called by the commit thread after a group failed: a backend whose failures stick (sled)
    /// starts afresh here. The default does nothing.
    fn recover(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The last key with `prefix`, if any.
    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError>;
    /// Several point reads that see one state: no group is applied half-way between them
    /// (an export reads each task this way). The default reads one by one, which is atomic
    /// only for a backend that applies nothing concurrently.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }
    /// Point reads of many keys at once, in `keys`' order, for a caller that knows the keys
    /// ahead (the engine's prefetch of a herd's tasks, `engine/prefetch.rs`): a backend over a
    /// network answers them in one round trip, not one per key. Unlike [`Backend::get_atomic`]
    /// the reads need not see one state. The default reads one by one (an embedded store
    /// answers a point read from memory or its page cache).
    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|(t, k)| self.get(*t, k)).collect()
    }
    /// Read round trips made to the store so far (point reads, batched reads, scan pages;
    /// not commits), for `/metrics` and tests; 0 for a backend that does not count (sled,
    /// whose reads are no round trips).
    fn read_round_trips(&self) -> u64 {
        0
    }
    /// Whether a read can block its thread for long: a round trip to a server, up to its
    /// statement timeout in an outage (PostgreSQL). Async callers then read on the blocking
    /// pool (`engine/offload.rs`), not on a runtime worker; the default (an embedded store,
    /// whose reads are memory or page cache) reads inline.
    fn reads_block(&self) -> bool {
        false
    }
    /// Why the backend cannot work right now, when it knows before a group fails (a
    /// database whose last COMMIT is being read back); `None` by default.
    fn failing(&self) -> Option<String> {
        None
    }
    /// The wall instant of herald's last life sign in this store ([`Backend::stamp_alive`]),
    /// `None` when there is none (never stamped, or a backend that keeps none). Start-up reads
    /// it before its first stamp: until about then the last process watched its runs, so only
    /// the time after it was an outage (`engine/alive.rs`).
    fn last_alive(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
    /// Records that herald runs at wall instant `ms`: a hint, not data (no sync, not through
    /// the log; one lost only makes the next start judge a longer outage, as if none had been
    /// written). The default keeps none.
    fn stamp_alive(&self, ms: u64) -> Result<(), StoreError> {
        let _ = ms;
        Ok(())
    }
    /// Bytes written and not yet in the backend's index (a write-behind memtable); 0 for a
    /// backend without one.
    fn memtable_bytes(&self) -> usize {
        0
    }
    /// Bytes in the memtable's active layer, the one writes go into (read on every write by
    /// the admission law, `store/pace.rs::admit`, so it must be cheap: no lock); 0 for a
    /// backend without a memtable, which is then never slowed.
    fn active_bytes(&self) -> usize {
        0
    }
    /// Cluster mode: the rows of `tree` in `shard`, in key order (a shard's live tasks, read
    /// when it is granted). A backend without shards answers every row.
    fn shard_rows(&self, tree: TreeId, shard: u32) -> Result<Vec<Kv>, StoreError> {
        let _ = shard;
        self.scan(tree, &[], None).collect()
    }
    /// Cluster mode: the tasks created on other nodes for shards this process holds since it
    /// last asked (the inbox), taken out of it. Empty for a backend without shards.
    fn take_inbox(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    /// The first and the last key with each of `prefixes`, in `prefixes`' order (`None`: no
    /// key has it), for a caller that needs many at once (the timeline counters of a herd's
    /// tasks, `engine/prefetch.rs`): a backend over a network answers them in one round trip.
    /// The default asks one prefix at a time (an embedded store answers from memory).
    #[allow(
        clippy::type_complexity,
        reason = "per prefix: its first key and its last key, spelled out"
    )]
    fn prefix_bounds_many(
        &self,
        tree: TreeId,
        prefixes: &[Vec<u8>],
    ) -> Result<Vec<Option<(Vec<u8>, Vec<u8>)>>, StoreError> {
        let mut out = Vec::with_capacity(prefixes.len());
        for p in prefixes {
            let first = self.scan(tree, p, Some(p)).next().transpose()?;
            let last = self.last_with_prefix(tree, p)?;
            out.push(first.map(|(k, _)| k).zip(last.map(|(k, _)| k)));
        }
        Ok(out)
    }
}
