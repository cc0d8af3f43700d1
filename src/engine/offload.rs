//! Store reads from async code. On PostgreSQL a read is a round trip, and in an outage or a
//! stalled server it lasts up to the statement timeout: made on a runtime worker it holds the
//! worker that long, and with both workers held nothing async runs (`/healthz`, the signal
//! handler, every other request). Such reads go to the blocking pool. On the embedded store a
//! read is memory or page cache and stays inline: a thread hop per command would cost more
//! than the read ([`crate::store::Store::reads_block`]).

use std::sync::Arc;

use super::{EngineError, Inner};

/// Runs `read` where a read may wait: inline on the embedded store, on the blocking pool when
/// the store's reads can block. A read cut off by the runtime's shutdown is
/// [`EngineError::Stopped`].
pub(crate) async fn read<T: Send + 'static>(
    inner: &Arc<Inner>,
    read: impl FnOnce(&Inner) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    if !inner.store.reads_block() {
        return read(inner);
    }
    let inner = inner.clone();
    match tokio::task::spawn_blocking(move || read(&inner)).await {
        Ok(r) => r,
        Err(e) if e.is_cancelled() => Err(EngineError::Stopped),
        Err(e) => Err(EngineError::Internal(format!("a store read failed: {e}"))),
    }
}
