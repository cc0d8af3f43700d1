//! The failure list commands: retry (the work is in `retry.rs`) and dismiss.

use super::timer::{self, RunKey};
use super::{Engine, EngineError};
use crate::model::Failure;
use crate::store::{Batch, Op};

impl Engine {
    /// Retries a message from the failure list (202): new attempts, same idempotency key.
    pub async fn retry_failure(&self, id: &str) -> Result<Failure, EngineError> {
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let mut f = inner
            .store
            .get_failure(id)?
            .ok_or_else(|| EngineError::NotFound(format!("failure {id:?}")))?;
        if !f.retrying {
            f.retrying = true;
            f.retries = 0;
            let mut b = Batch::new();
            b.failure(f.clone());
            inner.store.write(&b).await?;
        }
        inner.timer.at(
            RunKey::new(id, timer::FAILURE_RETRY_RUN),
            inner.clock.now_ms(),
        );
        tracing::info!(failure = %id, "failure retry requested");
        inner.events.failure(&f, "retrying"); // events (issue 11)
        Ok(f)
    }

    /// Removes a message from the failure list (and stops a retry of it).
    pub async fn dismiss_failure(&self, id: &str) -> Result<Failure, EngineError> {
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let f = inner
            .store
            .get_failure(id)?
            .ok_or_else(|| EngineError::NotFound(format!("failure {id:?}")))?;
        let mut b = Batch::new();
        b.ops.push(Op::DeleteFailure(id.to_string()));
        inner.store.write(&b).await?;
        inner
            .timer
            .cancel(RunKey::new(id, timer::FAILURE_RETRY_RUN));
        tracing::info!(failure = %id, "failure dismissed");
        inner.events.failure(&f, "dismissed"); // events (issue 11)
        Ok(f)
    }
}
