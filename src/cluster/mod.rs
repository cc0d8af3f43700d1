//! Cluster mode on PostgreSQL (`../shared/HA.md`, issue 24): the pure decisions first —
//! how long a lease may be trusted (`lease.rs`), which shards a node takes and hands over
//! (`balance.rs`), and this node's clock against the database's (`offset.rs`); then the lease
//! rows' statements on PostgreSQL: acquire, renew, release, the commit group's fence, the
//! database's clock (`rows.rs`). The lease loop, the fence in the commit path and the nodes'
//! forwarding build on these.

pub mod balance;
pub mod lease;
pub mod offset;
pub mod rows;
