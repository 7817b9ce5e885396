//! What the engine tells an observer for operators: how long sandboxes took to start, how many
//! bytes of files were copied out of them, and which secrets the egress proxy added to requests. The engine only reports events; what counts them (the
//! server's Prometheus metrics) registers itself with [`observe`] and lives above the engine.
//!
//! Bytes copied out are also counted per call: code that runs a call inside [`counting_copied`]
//! learns how many bytes that call's sandbox work copied out (the engine does a call's work on
//! the caller's task).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Receives the engine's events. Called on the engine's hot paths: must not block.
pub trait Observer: Send + Sync {
    /// A sandbox was created and its runner answered, `took` after the request to create it.
    fn sandbox_started(&self, took: Duration);
    /// `bytes` of a workspace file were copied out of a sandbox.
    fn copied_out(&self, bytes: u64);
    /// The egress proxy added the secret `secret` (its name) to a request to `host`.
    fn secret_used(&self, _secret: &str, _host: &str) {}
}

static OBSERVER: OnceLock<Arc<dyn Observer>> = OnceLock::new();

/// Makes `observer` the process's observer; false if one was already set (it stays).
pub fn observe(observer: Arc<dyn Observer>) -> bool {
    OBSERVER.set(observer).is_ok()
}

tokio::task_local! {
    static CALL_COPIED: Arc<AtomicU64>;
}

/// Runs `future` counting the bytes it copies out of sandboxes; returns its output and the count.
pub async fn counting_copied<F: Future>(future: F) -> (F::Output, u64) {
    let counter = Arc::new(AtomicU64::new(0));
    let output = CALL_COPIED.scope(counter.clone(), future).await;
    (output, counter.load(Ordering::Relaxed))
}

pub(crate) fn sandbox_started(took: Duration) {
    if let Some(observer) = OBSERVER.get() {
        observer.sandbox_started(took);
    }
}

pub(crate) fn copied_out(bytes: u64) {
    if bytes == 0 {
        return;
    }
    let _ = CALL_COPIED.try_with(|counter| counter.fetch_add(bytes, Ordering::Relaxed));
    if let Some(observer) = OBSERVER.get() {
        observer.copied_out(bytes);
    }
}

pub(crate) fn secret_used(secret: &str, host: &str) {
    if let Some(observer) = OBSERVER.get() {
        observer.secret_used(secret, host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_counts_only_what_it_copied_out() {
        let ((), copied) = counting_copied(async {
            copied_out(10);
            copied_out(0);
            copied_out(5);
        })
        .await;
        assert_eq!(copied, 15);
        // Outside a counted call nothing is attributed, and nothing fails.
        copied_out(7);
        let ((), none) = counting_copied(async {}).await;
        assert_eq!(none, 0);
    }
}
