//! The failure list commands: retry (the work is in `retry.rs`) and dismiss.

use super::commit::{self, RetryWheel};
use super::{offload, Engine, EngineError};
use crate::model::Failure;

impl Engine {
    /// Retries a message from the failure list (202): new attempts, same idempotency key.
    pub async fn retry_failure(&self, id: &str) -> Result<Failure, EngineError> {
        // Refused while storage fails, as every command is: nothing could be made durable.
        self.check_storage()?;
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let mut f = self.failure(id).await?;
        // Saved again even when a retry is under way already: the step goes on the wheel now.
        f.retries = if f.retrying { f.retries } else { 0 };
        f.retrying = true;
        let now = inner.clock.now_ms();
        commit::failure_saved(
            inner,
            &f,
            RetryWheel::At(now),
            Some("retrying"),
            None,
            Vec::new(),
        )
        .await?;
        tracing::info!(failure = %id, "failure retry requested");
        Ok(f)
    }

    /// Removes a message from the failure list (and stops a retry of it).
    pub async fn dismiss_failure(&self, id: &str) -> Result<Failure, EngineError> {
        // Refused while storage fails, as every command is: nothing could be made durable.
        self.check_storage()?;
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let f = self.failure(id).await?;
        commit::failure_removed(inner, &f, "dismissed", Vec::new()).await?;
        tracing::info!(failure = %id, "failure dismissed");
        Ok(f)
    }

    /// The failure-list entry `id` for a command on it, read as every command reads: off the
    /// runtime's workers where a read may wait (`offload.rs`: on PostgreSQL a stalled server
    /// would otherwise hold a worker until the statement timeout).
    async fn failure(&self, id: &str) -> Result<Failure, EngineError> {
        let key = id.to_string();
        offload::read(&self.inner, move |i| Ok(i.store.get_failure(&key)?))
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("failure {id:?}")))
    }
}
