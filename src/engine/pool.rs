//! The warm pool: sandboxes of the default configuration, created and started ahead of time, with
//! the runner up and Python initialised, waiting for their first request.
//!
//! A pooled sandbox is handed out once and destroyed after use like any other: the pool saves the
//! start-up, never reuses a sandbox, so isolation is unchanged. Each one is checked with a runner
//! round trip when it is taken; a dead one is removed, not handed out. Refilling happens in the
//! background and never delays a request or the server's start.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::sandbox::Sandbox;
use super::Engine;

/// Sandboxes started at once while refilling.
const REFILL_CONCURRENCY: usize = 2;

pub struct Pool {
    target: usize,
    ready: Mutex<VecDeque<Sandbox>>,
    starting: AtomicUsize,
    wake: Arc<Notify>,
    closed: AtomicBool,
}

impl Pool {
    pub fn new(target: usize) -> Self {
        Pool {
            target,
            ready: Mutex::new(VecDeque::new()),
            starting: AtomicUsize::new(0),
            wake: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
        }
    }

    pub fn target(&self) -> usize {
        self.target
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sandbox>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Sandboxes ready now.
    pub fn ready(&self) -> usize {
        self.lock().len()
    }

    /// The oldest ready sandbox, if any; the refill starts a replacement.
    pub fn take(&self) -> Option<Sandbox> {
        let sandbox = self.lock().pop_front();
        self.wake.notify_one();
        sandbox
    }

    /// Stops refilling and hands back what is ready (to be destroyed).
    pub fn close(&self) -> Vec<Sandbox> {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        self.lock().drain(..).collect()
    }

    fn deficit(&self) -> usize {
        self.target
            .saturating_sub(self.ready() + self.starting.load(Ordering::SeqCst))
    }
}

/// Keeps the pool full until it is closed or the engine is gone.
pub(crate) fn spawn_refill(engine: &Arc<Engine>) -> Option<tokio::task::JoinHandle<()>> {
    if engine.pool.target() == 0 {
        return None;
    }
    let weak: Weak<Engine> = Arc::downgrade(engine);
    Some(tokio::spawn(async move {
        // Pooled sandboxes must carry the server's container label, if it has one.
        if let Some(engine) = weak.upgrade() {
            let _ =
                tokio::time::timeout(Duration::from_secs(2), engine.identify_server_container())
                    .await;
        }
        let mut backoff = Duration::from_millis(500);
        loop {
            let Some(engine) = weak.upgrade() else { return };
            let pool = &engine.pool;
            if pool.closed.load(Ordering::SeqCst) {
                return;
            }
            let wanted = pool.deficit().min(REFILL_CONCURRENCY);
            if wanted == 0 {
                drop(engine);
                // Wake on a take, or look again now and then. The engine is not held meanwhile,
                // so dropping it ends this task.
                let Some(engine) = weak.upgrade() else { return };
                let wake = engine.pool_wake();
                drop(engine);
                let _ = tokio::time::timeout(Duration::from_secs(5), wake.notified()).await;
                continue;
            }
            pool.starting.fetch_add(wanted, Ordering::SeqCst);
            let launches = (0..wanted).map(|_| engine.launch_pooled());
            let results = futures_util::future::join_all(launches).await;
            pool.starting.fetch_sub(wanted, Ordering::SeqCst);
            let mut failed = false;
            for result in results {
                match result {
                    Ok(sandbox) if !pool.closed.load(Ordering::SeqCst) => {
                        pool.lock().push_back(sandbox)
                    }
                    Ok(sandbox) => engine.retire(sandbox),
                    Err(e) => {
                        tracing::warn!("could not start a pool sandbox: {e}");
                        failed = true;
                    }
                }
            }
            drop(engine);
            if failed {
                // The engine may be down: try again later, not in a tight loop (a close wakes us).
                let Some(engine) = weak.upgrade() else { return };
                let wake = engine.pool_wake();
                drop(engine);
                let _ = tokio::time::timeout(backoff, wake.notified()).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            } else {
                backoff = Duration::from_millis(500);
            }
        }
    }))
}
