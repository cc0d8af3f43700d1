//! Ids with work out right now, counted, each mark let go by dropping its guard: which tasks
//! have a send out outside their lock (a delete waits for them, `retention.rs`), which
//! failure-list entries have an attempt out (no second attempt overlaps it, `retry.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

#[derive(Default)]
pub(crate) struct Marks(Mutex<HashMap<Arc<str>, u32>>);

impl Marks {
    /// Marks `id` until the guard is dropped (on every path, early returns included).
    pub(crate) fn mark(&self, id: &Arc<str>) -> Mark<'_> {
        *self.0.lock().entry(id.clone()).or_default() += 1;
        Mark {
            marks: self,
            id: id.clone(),
        }
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.0.lock().contains_key(id)
    }
}

pub(crate) struct Mark<'a> {
    marks: &'a Marks,
    id: Arc<str>,
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        let mut m = self.marks.0.lock();
        if let Some(n) = m.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_marked_until_its_last_guard_goes() {
        let m = Marks::default();
        let id: Arc<str> = Arc::from("t");
        let a = m.mark(&id);
        let b = m.mark(&id);
        drop(a);
        assert!(m.contains("t"), "one guard is left");
        drop(b);
        assert!(!m.contains("t"));
    }
}
