//! The cap on HTTP connections, and who gives way when it is reached.
//!
//! Every connection takes a file descriptor; without a cap a client opening idle connections
//! (no token needed to open a TCP connection) would use up the process's descriptors and then
//! webhook sends and the store would fail for want of one. So at most `max` connections are
//! served at once, and a connection beyond it is closed at once rather than queued.
//!
//! "Closed at once" alone would let a flood of idle connections lock everyone else out: when
//! the table is full, the connection that has been *idle* longest (no request being handled:
//! waiting for its first request, or between keep-alive requests) is closed to make room.
//! Only when every connection is busy handling a request is the newcomer refused. An idle
//! flood therefore costs its own connections, not the API; a connection that streams events
//! (`GET /v1/events`, authenticated) is never evicted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// What happened to a connection that arrived.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections served.
    pub accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// Connections closed at once because every slot was busy.
    pub refused: AtomicU64,
}

struct Entry {
    /// `Some` while no request is being handled on it; `None` while one is.
    idle_since: Option<Instant>,
    /// Requests being handled (HTTP/1.1: 0 or 1, more only if a handler outlives its answer).
    busy: u32,
    /// Serves an event stream: never evicted.
    pinned: bool,
    close: Arc<Notify>,
}

pub struct Conns {
    max: usize,
    table: Mutex<(u64, HashMap<u64, Entry>)>,
    pub stats: ConnStats,
}

/// A served connection's slot; freed when dropped.
pub struct Slot {
    conns: Arc<Conns>,
    id: u64,
    /// Notified when the connection is evicted: its task then drops it (closing the socket).
    pub close: Arc<Notify>,
}

/// Marks the connection busy while a request is handled.
pub struct Busy {
    conns: Arc<Conns>,
    id: u64,
}

impl Conns {
    pub fn new(max: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max: max.max(1),
            table: Mutex::new((0, HashMap::new())),
            stats: ConnStats::default(),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections being served now.
    pub fn open(&self) -> usize {
        self.table.lock().1.len()
    }

    /// A slot for a new connection: free, or taken from the longest idle connection; `None`
    /// when every connection is busy (the caller closes the new one).
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut t = self.table.lock();
        if t.1.len() >= self.max {
            let victim =
                t.1.iter()
                    .filter(|(_, e)| !e.pinned && e.busy == 0)
                    .filter_map(|(id, e)| e.idle_since.map(|s| (s, *id)))
                    .min()
                    .map(|(_, id)| id);
            match victim.and_then(|id| t.1.remove(&id)) {
                // `notify_one` keeps a permit if the task is not waiting yet: never lost.
                Some(e) => {
                    e.close.notify_one();
                    self.stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        t.0 += 1;
        let id = t.0;
        let close = Arc::new(Notify::new());
        t.1.insert(
            id,
            Entry {
                idle_since: Some(Instant::now()),
                busy: 0,
                pinned: false,
                close: close.clone(),
            },
        );
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            conns: self.clone(),
            id,
            close,
        })
    }
}

impl Slot {
    /// Marks the connection busy until the returned guard drops.
    pub fn busy(&self) -> Busy {
        self.handle().busy()
    }

    /// A handle the request handler can use to pin or mark the connection.
    pub fn handle(&self) -> SlotHandle {
        SlotHandle {
            conns: self.conns.clone(),
            id: self.id,
        }
    }
}

/// What a request handler holds of its connection's slot.
#[derive(Clone)]
pub struct SlotHandle {
    conns: Arc<Conns>,
    id: u64,
}

impl SlotHandle {
    pub fn busy(&self) -> Busy {
        if let Some(e) = self.conns.table.lock().1.get_mut(&self.id) {
            e.busy += 1;
            e.idle_since = None;
        }
        Busy {
            conns: self.conns.clone(),
            id: self.id,
        }
    }

    /// The connection streams events from now on: never evicted.
    pub fn pin(&self) {
        if let Some(e) = self.conns.table.lock().1.get_mut(&self.id) {
            e.pinned = true;
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(e) = self.conns.table.lock().1.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            if e.busy == 0 {
                e.idle_since = Some(Instant::now());
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.table.lock().1.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_evicts_the_longest_idle_and_refuses_when_all_are_busy() {
        let c = Conns::new(2);
        let a = c.admit().expect("room");
        let b = c.admit().expect("room");
        let _busy_b = b.busy();
        // Full: `a` is idle, so it makes room.
        let third = c.admit().expect("evicts the idle one");
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
        assert_eq!(c.open(), 2);
        // `a` was told to close; its drop later must not free someone else's slot.
        drop(a);
        assert_eq!(c.open(), 2);
        let _busy_third = third.busy();
        assert!(c.admit().is_none(), "every connection busy: refused");
        assert_eq!(c.stats.refused.load(Ordering::Relaxed), 1);
        drop(_busy_b);
        assert!(
            c.admit().is_some(),
            "b idle again: evicted for the newcomer"
        );
    }

    #[test]
    fn pinned_connections_are_never_evicted() {
        let c = Conns::new(1);
        let a = c.admit().unwrap();
        a.handle().pin();
        assert!(c.admit().is_none());
        drop(a);
        assert!(c.admit().is_some());
    }
}
