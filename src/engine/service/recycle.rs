//! After an ephemeral run: its sandbox recycled for the same caller's next run, or removed; and
//! idle sandboxes given up when a call waits for their share of the capacity.

use std::time::{Duration, Instant};

use super::{Engine, RunOptions};
use crate::engine::outcome::Execution;
use crate::engine::recycled::{self, MAX_USES};
use crate::engine::sandbox::Sandbox;
use crate::engine::EngineError;

/// The longest a run waits for its caller's last sandbox to be recycled (a recycle's own bound,
/// `Sandbox::recycle`, is longer: past this the run starts a sandbox instead).
const RECYCLE_WAIT: Duration = Duration::from_secs(5);

impl Engine {
    /// A sandbox the caller's last run used, emptied since: one kept, else the one whose recycle
    /// is under way once it is done (at most [`RECYCLE_WAIT`]); `None` at once when neither: a
    /// recycle is several times quicker than a start (under gVisor here ~0.3 s against ~2 s of
    /// CPU), and a caller's next call usually comes before its last sandbox is recycled.
    pub(super) async fn await_recycled(&self, options: &RunOptions) -> Option<Sandbox> {
        let key = options.reuse_key()?;
        self.recycled.wait_for(&key, RECYCLE_WAIT).await
    }

    /// Done with the sandbox of an ephemeral run: recycled in the background for the caller's
    /// next run when `SANDBOX_RECYCLE` allows and the run left it usable (its runner answered,
    /// nothing lost, no memory kill, no dependencies or network, the default image), else
    /// removed. A run the limit or the caller stopped counts when its runner answered the
    /// interrupt: the recycle kills every other process and empties what the code could write,
    /// as after any run; one whose processes had to be killed lost its state and is removed.
    pub(super) fn retire_used(
        &self,
        mut sandbox: Sandbox,
        options: &RunOptions,
        result: &Result<Execution, EngineError>,
        plain: bool,
    ) {
        let usable = result
            .as_ref()
            .is_ok_and(|e| !e.state_lost && !e.workspace_lost && !e.out_of_memory);
        let key = match options.reuse_key() {
            Some(key)
                if self.config.recycle
                    && plain
                    && usable
                    && sandbox.egress().is_none()
                    && sandbox.recycles() < MAX_USES
                    && !self.closing.is_cancelled() =>
            {
                key
            }
            _ => return self.retire(sandbox),
        };
        let kept = self.recycled.clone();
        let closing = self.closing.clone();
        let admission = self.admission.get().cloned();
        // From now on the caller's next run waits for this one rather than start another.
        let under_way = self.recycled.begin(&key);
        self.background.spawn(async move {
            let started = Instant::now();
            if let Err(e) = sandbox.recycle().await {
                drop(under_way);
                // At shutdown the server removes sandboxes mid-recycle itself: no news.
                if closing.is_cancelled() {
                    tracing::debug!(sandbox = %sandbox.id(), "not recycled at shutdown ({e})");
                } else {
                    tracing::info!(sandbox = %sandbox.id(), "not recycled ({e}): removing it");
                }
                return sandbox.destroy().await;
            }
            tracing::debug!(sandbox = %sandbox.id(), recycle_ms = started.elapsed().as_millis() as u64, "recycled");
            // At shutdown, or when a call waits for its share: removed, not kept.
            if closing.is_cancelled() || admission.is_some_and(|a| a.wanted()) {
                drop(under_way);
                return sandbox.destroy().await;
            }
            let over = kept.put(key, sandbox, Instant::now());
            drop(under_way);
            if let Some(over) = over {
                over.destroy().await;
            }
            // Removed once it has waited too long, unless its caller took it meanwhile (at
            // shutdown every kept one is removed at once).
            tokio::select! {
                () = tokio::time::sleep(recycled::IDLE) => {}
                () = closing.cancelled() => return,
            }
            let expired = kept.expired(Instant::now());
            futures_util::future::join_all(expired.into_iter().map(Sandbox::destroy)).await;
        });
    }

    /// A call waits for a share of the capacity: removes a sandbox that holds one idly (a
    /// recycled one first, then one of the pool), so the share comes free.
    pub(super) fn give_up_idle(&self) {
        let idle = self.recycled.oldest().or_else(|| self.pool.evict());
        if let Some(sandbox) = idle {
            tracing::debug!(sandbox = %sandbox.id(), "removing an idle sandbox: a call needs its share");
            self.retire(sandbox);
        }
    }

    /// Whether a call waits for a share of the capacity (what is started or kept for later
    /// should give its share up).
    pub(super) fn share_wanted(&self) -> bool {
        self.admission.get().is_some_and(|a| a.wanted())
    }

    /// Sandboxes recycled and waiting now.
    pub fn recycled_waiting(&self) -> usize {
        self.recycled.len()
    }
}
