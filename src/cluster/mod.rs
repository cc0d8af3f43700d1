//! Cluster mode on PostgreSQL (`../shared/HA.md`, issue 24): the pure decisions first —
//! how long a lease may be trusted (`lease.rs`), which shards a node takes and hands over
//! (`balance.rs`), and this node's clock against the database's (`offset.rs`); then the lease
//! rows' statements on PostgreSQL: acquire, renew, release, the commit group's fence, the
//! database's clock (`rows.rs`); and one process's lease loop that carries them out on its own
//! connection and reports each shard gained or lost (`node.rs`); the unpooled `LISTEN`
//! connection that wakes the engine's inbox drain on each `NOTIFY herald_inbox`
//! (`listen.rs`). The engine's use of it (load and unload by shard, the inbox, the fence in
//! the commit path) is `src/engine/cluster.rs`.

pub mod balance;
pub mod lease;
pub mod listen;
pub mod node;
pub mod offset;
pub mod rows;
