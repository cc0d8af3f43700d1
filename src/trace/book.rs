//! Which trace a task's deliveries belong to, as the delivery layer sees it: a bounded map
//! from task id to trace id, filled when the API creates a task and, on a miss (a task made
//! before this boot), by a resolver the server sets that reads the task's spec once. A task
//! without a stored trace id (made before traces existed) gets the one derived from its id,
//! as its view shows.
//!
//! Why a map and not a field of `Delivery`: deliveries are built in the engine's send path,
//! which another change is restructuring (`engine/commit.rs`); once it carries the task's
//! trace id, the map is only a fallback.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::timeline::fallback_trace_id;

/// Tasks remembered at once; past it the map starts afresh (each task then costs one read).
const BOOK_MAX: usize = 65_536;

type Resolver = Box<dyn Fn(&str) -> Option<Option<[u8; 16]>> + Send + Sync>;

#[derive(Default)]
pub struct TraceBook {
    map: parking_lot::Mutex<HashMap<String, [u8; 16]>>,
    /// Reads a task's stored trace id: `Some(None)` for a task without one, `None` when the
    /// task cannot be read (not remembered then, so a later attempt reads again).
    resolver: OnceLock<Resolver>,
}

impl TraceBook {
    pub fn set_resolver(
        &self,
        f: impl Fn(&str) -> Option<Option<[u8; 16]>> + Send + Sync + 'static,
    ) {
        let _ = self.resolver.set(Box::new(f));
    }

    /// Remembers a task's trace (a create).
    pub fn note(&self, task_id: &str, trace_id: [u8; 16]) {
        let mut m = self.map.lock();
        if m.len() >= BOOK_MAX && !m.contains_key(task_id) {
            m.clear();
        }
        m.insert(task_id.to_string(), trace_id);
    }

    /// The trace of a task's deliveries.
    pub fn trace_of(&self, task_id: &str) -> [u8; 16] {
        if let Some(t) = self.map.lock().get(task_id) {
            return *t;
        }
        match self.resolver.get().and_then(|r| r(task_id)) {
            Some(stored) => {
                let t = stored.unwrap_or_else(|| fallback_trace_id(task_id));
                self.note(task_id, t);
                t
            }
            None => fallback_trace_id(task_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_task_is_read_once_and_one_without_a_trace_gets_its_derived_one() {
        let b = TraceBook::default();
        assert_eq!(b.trace_of("x"), fallback_trace_id("x"), "no resolver yet");
        let reads = Arc::new(AtomicUsize::new(0));
        let r = reads.clone();
        b.set_resolver(move |id| {
            r.fetch_add(1, Ordering::Relaxed);
            match id {
                "traced" => Some(Some([9; 16])),
                "old" => Some(None),
                _ => None,
            }
        });
        assert_eq!(b.trace_of("traced"), [9; 16]);
        assert_eq!(b.trace_of("traced"), [9; 16]);
        assert_eq!(b.trace_of("old"), fallback_trace_id("old"));
        assert_eq!(reads.load(Ordering::Relaxed), 2);
        b.note("new", [1; 16]);
        assert_eq!(b.trace_of("new"), [1; 16]);
        assert_eq!(reads.load(Ordering::Relaxed), 2);
    }
}
