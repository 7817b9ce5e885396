//! The warm pool: sandboxes of the default configuration, created and started ahead of time, with
//! the runner up and Python initialised, waiting for their first request.
//!
//! A pooled sandbox is handed out once and destroyed after use like any other: the pool saves the
//! start-up, never reuses a sandbox, so isolation is unchanged. Each one is checked with a runner
//! round trip when it is taken; a dead one is removed, not handed out. Refilling happens in the
//! background and never delays a request or the server's start.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::sandbox::Sandbox;

/// Sandboxes started at once while refilling.
pub(super) const REFILL_CONCURRENCY: usize = 2;

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

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Counts `n` sandboxes being started for the pool (they count against its target).
    pub(super) fn starting(&self, n: usize) {
        self.starting.fetch_add(n, Ordering::SeqCst);
    }

    /// `n` of the sandboxes being started are done (ready or failed).
    pub(super) fn started(&self, n: usize) {
        self.starting.fetch_sub(n, Ordering::SeqCst);
    }

    /// Adds a started sandbox; hands it back when the pool is closed (to be removed).
    #[must_use]
    pub(super) fn put(&self, sandbox: Sandbox) -> Option<Sandbox> {
        let mut ready = self.lock();
        if self.is_closed() {
            return Some(sandbox);
        }
        ready.push_back(sandbox);
        None
    }

    /// How many more sandboxes the pool needs to reach its target.
    pub(super) fn deficit(&self) -> usize {
        self.target
            .saturating_sub(self.ready() + self.starting.load(Ordering::SeqCst))
    }
}
