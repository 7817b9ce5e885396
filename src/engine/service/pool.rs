//! Keeping the warm pool full, in the background, and drawing a live sandbox from it.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::prepared::PLAIN_ESTIMATE;
use super::Engine;
use crate::engine::pool::{Refill, GROWTH_CAP};
use crate::engine::sandbox::Sandbox;
use crate::engine::EngineError;

impl Engine {
    /// A live pooled sandbox for `image`, if the pool serves it and has one.
    ///
    /// With `execute_next`, the caller's next step is an execution: the check rides on it
    /// ([`Sandbox::check_on_first_execution`]) instead of costing a round trip of its own, and
    /// the caller takes another sandbox on [`EngineError::DiedBeforeUse`].
    pub(super) async fn take_pooled(&self, image: &str, execute_next: bool) -> Option<Sandbox> {
        if image != self.config.image {
            return None;
        }
        while let Some(mut sandbox) = self.pool.take(Instant::now()) {
            if execute_next {
                sandbox.check_on_first_execution();
                return Some(sandbox);
            }
            // A round trip to the runner: a sandbox that died while waiting is not handed out.
            match sandbox.add_paths(&[], &[]).await {
                Ok(_) => return Some(sandbox),
                Err(e) => {
                    tracing::info!(sandbox = %sandbox.id(), "a pool sandbox is dead ({e}); removing it");
                    self.retire(sandbox);
                }
            }
        }
        None
    }

    /// Starts a sandbox for the pool (the default image and configuration).
    pub(crate) async fn launch_pooled(&self) -> Result<Sandbox, EngineError> {
        let spec = self.base_spec(self.config.image.clone(), "pool").await?;
        self.backend.ensure_image(&spec.image).await?;
        self.launch_code_sandbox(&spec, &self.background_options())
            .await
    }

    /// Starts keeping the warm pool full (`SANDBOX_POOL_SIZE`), and preparing sandboxes per
    /// dependency set (`SANDBOX_PRELOAD` and the sets calls use), in the background, until
    /// `shutdown`; and finding or installing the runner's IPython for the default image now, so
    /// that the first call rarely waits for it.
    pub fn start_pool(self: &Arc<Self>) {
        self.warm_runner_set();
        if let Some(task) = spawn_refill(self) {
            *self.pool_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
        self.start_prepared();
    }

    /// A call that took a sandbox is done with the engine for now: the pool may refill.
    pub(super) fn pool_used(&self) {
        self.pool.used();
    }

    pub(crate) fn pool_wake(&self) -> Arc<tokio::sync::Notify> {
        self.pool.wake()
    }

    /// The memory the plain pool's waiting sandboxes use now, as Docker measures it (the
    /// benchmark's figure; the bound counts them at `PLAIN_ESTIMATE`).
    pub async fn pool_memory(&self) -> u64 {
        let mut total = 0;
        for id in self.pool.ready_ids() {
            if let Ok(Some(bytes)) = self.backend.memory_usage(&id).await {
                total += bytes;
            }
        }
        total
    }

    /// How many sandboxes the plain pool wants now (`SANDBOX_POOL_SIZE`, grown by demand).
    pub fn pool_target(&self) -> usize {
        self.pool.target()
    }

    /// Sandboxes waiting in the pool now.
    pub fn pool_ready(&self) -> usize {
        self.pool.ready()
    }
}

/// How far demand may grow the plain pool: a quarter of `SANDBOX_POOL_MAX_MEMORY` (at
/// `PLAIN_ESTIMATE` each), at most `GROWTH_CAP`, never below `SANDBOX_POOL_SIZE`; 0 when the pool is
/// disabled.
pub(super) fn plain_cap(base: usize, max_memory: u64) -> usize {
    if base == 0 {
        return 0;
    }
    let by_memory = (max_memory / 4 / PLAIN_ESTIMATE).min(GROWTH_CAP as u64) as usize;
    by_memory.max(base)
}

/// How often an idle refill looks at the pool without being woken.
const IDLE_LOOK: Duration = Duration::from_secs(5);

/// Keeps the pool full until it is closed or the engine is gone.
fn spawn_refill(engine: &Arc<Engine>) -> Option<tokio::task::JoinHandle<()>> {
    if engine.pool.base() == 0 {
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
            if pool.is_closed() {
                return;
            }
            let now = Instant::now();
            for sandbox in pool.shrink(now) {
                engine.retire(sandbox);
            }
            let wanted = match pool.refill(now) {
                Refill::Start(n) => n,
                Refill::After(pause) => {
                    drop(engine);
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Refill::Idle => {
                    // Wake on a miss or a call's end, when the target may step back, or now and
                    // then. The engine is not held meanwhile, so dropping it ends this task.
                    let wait = pool
                        .next_shrink(now)
                        .map_or(IDLE_LOOK, |d| d.min(IDLE_LOOK));
                    let wake = engine.pool_wake();
                    drop(engine);
                    let _ = tokio::time::timeout(wait, wake.notified()).await;
                    continue;
                }
            };
            pool.starting(wanted);
            let launches = (0..wanted).map(|_| engine.launch_pooled());
            let results = futures_util::future::join_all(launches).await;
            pool.started(wanted);
            let mut failed = false;
            for result in results {
                match result {
                    // A call waits for the share it holds: it goes.
                    Ok(sandbox) if engine.share_wanted() => engine.retire(sandbox),
                    Ok(sandbox) => {
                        if let Some(sandbox) = pool.put(sandbox) {
                            engine.retire(sandbox);
                        }
                    }
                    // The capacity is in use: the pool waits for a pause in the calls.
                    Err(crate::engine::EngineError::AtCapacity(_)) => failed = true,
                    Err(_) if pool.is_closed() => failed = true, // shutting down
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
