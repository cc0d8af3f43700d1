//! A future that runs to its end even when whoever awaits it goes away (`api::changing`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that, dropped before its end, is handed to the runtime to finish on its own. Not
/// a task of its own from the start: a spawn per request cost 14 % of the create rate (A/B,
/// 8 rounds each); this costs one allocation, and a spawn only when the client hung up.
pub struct Finish<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> Finish<F> {
    pub fn new(f: F) -> Self {
        Finish(Some(Box::pin(f)))
    }
}

impl<F: Future + Send + 'static> Future for Finish<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Out while it is polled: one that panics is not handed on (polled again, it would
        // panic again).
        let Some(mut f) = this.0.take() else {
            return Poll::Pending; // polled after its end: never by `await`
        };
        let out = f.as_mut().poll(cx);
        if out.is_pending() {
            this.0 = Some(f);
        }
        out
    }
}

impl<F: Future + Send + 'static> Drop for Finish<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                tracing::debug!("the client went away; its request runs to its end");
                rt.spawn(async move {
                    drop(f.await);
                });
            }
        }
    }
}
