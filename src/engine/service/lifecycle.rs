//! The engine's life beyond single requests: finding the server's own container (so what it
//! starts names it), removing what dead servers left, and removing everything at shutdown.

use std::time::Duration;

use super::Engine;
use crate::engine::backend::{Backend, BackendError, SandboxId};
use crate::engine::owner::{self, LABEL_INSTANCE, LABEL_MANAGED};
use crate::engine::{sessions, EngineError};

impl Engine {
    /// Starts keeping the saved files within their retention, in the background (a sweep now,
    /// after saves, and hourly); `None` when nothing is saved. Abort the handle to stop.
    pub fn spawn_file_retention(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.retention.as_ref().map(|retention| retention.spawn())
    }

    /// Finds whether this server runs in a container of the engine it uses, and labels what it
    /// creates from now on with that container: then, if the server is killed outright, another
    /// server can tell it is gone although its pid is in another namespace. Outside a container
    /// this costs nothing; inside, one inspection.
    pub(super) async fn identified(&self) {
        self.identified
            .get_or_init(|| async {
                // Bounded: an engine that does not answer must not hold up the first sandbox.
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), self.identify_server_container())
                        .await;
            })
            .await;
    }

    pub(super) async fn identify_server_container(&self) {
        let Some(id) = owner::own_container_id() else {
            return;
        };
        match self.backend.exit_info(&SandboxId(id.clone())).await {
            Ok(info) if info.running => {
                if let Some(started_at) = info.started_at {
                    tracing::debug!(container = %id, "this server runs in a container of its engine");
                    let _ = self
                        .owner
                        .container
                        .set(owner::ServerContainer { id, started_at });
                }
            }
            // Another engine's container (the server uses a remote one): not ours to name.
            Ok(_) | Err(BackendError::NotFound(_)) => {}
            Err(e) => tracing::debug!("could not look up this server's own container: {e}"),
        }
    }

    /// Removes sandboxes left behind by server instances that are no longer running.
    pub async fn remove_leftovers(&self) -> Result<usize, EngineError> {
        self.identified().await;
        let records = self.backend.list(LABEL_MANAGED, "true").await?;
        let servers = self
            .server_containers(records.iter().map(|r| &r.labels))
            .await;
        let mut removed = 0;
        for record in records
            .into_iter()
            .filter(|r| self.owner.is_leftover(&r.labels, &servers))
        {
            tracing::info!(sandbox = %record.id, "removing a sandbox left by a server that is gone");
            self.backend.destroy(&record.id).await?;
            removed += 1;
        }
        let owner = &self.owner;
        removed += self
            .backend
            .remove_orphaned_storage(LABEL_MANAGED, "true", &|labels| {
                owner.is_leftover(labels, &servers)
            })
            .await?;
        Ok(removed)
    }

    /// The state of every server container the labels name (other than this server's own).
    async fn server_containers<'a>(
        &self,
        labels: impl Iterator<Item = &'a std::collections::BTreeMap<String, String>>,
    ) -> owner::ServerContainers {
        let ids: std::collections::BTreeSet<&String> = labels
            .filter_map(|l| l.get(owner::LABEL_SERVER_CONTAINER))
            .collect();
        let mut servers = owner::ServerContainers::new();
        for id in ids {
            let state = match self.backend.exit_info(&SandboxId(id.clone())).await {
                Ok(info) if info.running => Some(info.started_at.unwrap_or_default()),
                Ok(_) | Err(BackendError::NotFound(_)) => None,
                Err(_) => continue, // unknown: left alone
            };
            servers.insert(id.clone(), state);
        }
        servers
    }

    /// Removes everything carrying this instance's label. A request dropped mid-way (a signal,
    /// a cancelled call) may have a create still completing in the engine, so this looks again
    /// until a listing comes back empty, a few times at most. True when one did.
    async fn sweep(&self) -> bool {
        let instance = &self.owner.instance;
        for round in 0..5 {
            match self.remove_listed(instance).await {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(
                        round,
                        "could not list this server's sandboxes at shutdown: {e}"
                    );
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Removes, in parallel, every container the engine lists with `instance`'s label; how many
    /// it listed.
    async fn remove_listed(&self, instance: &str) -> Result<usize, BackendError> {
        let records = self.backend.list(LABEL_INSTANCE, instance).await?;
        let removals = records.iter().map(|r| self.backend.destroy(&r.id));
        for (record, result) in records
            .iter()
            .zip(futures_util::future::join_all(removals).await)
        {
            if let Err(e) = result {
                tracing::warn!(sandbox = %record.id, "could not remove: {e}");
            }
        }
        Ok(records.len())
    }

    /// Removes everything of another instance of this program, one known to be gone (the
    /// warden's work, see `engine::warden`): its containers, looking again every `every` until
    /// none was listed for `quiet` (a create it sent may still complete), for `at_most` in all;
    /// then its networks and volumes.
    pub(crate) async fn remove_instance(
        &self,
        instance: &str,
        quiet: Duration,
        every: Duration,
        at_most: Duration,
    ) {
        let started = tokio::time::Instant::now();
        let mut last_seen = started;
        while started.elapsed() < at_most && last_seen.elapsed() < quiet {
            // Containers found, or no answer (the engine restarting, say): not quiet yet.
            if !matches!(self.remove_listed(instance).await, Ok(0)) {
                last_seen = tokio::time::Instant::now();
            }
            tokio::time::sleep(every).await;
        }
        remove_unused_storage(self.backend.as_ref(), instance).await;
    }

    /// Removes every sandbox of this server instance (pooled, recycled, sessions and any in
    /// flight), all at once, first: an MCP client gives a closing server two seconds before it
    /// signals it (and the sandboxes end themselves once the server is gone, see
    /// `python/runner/supervisor.py`, should it be killed before this is done). True when the
    /// engine listed nothing of this instance at the end and no create was left unanswered (one
    /// the engine may still carry out: the warden then looks until the engine is quiet).
    pub async fn shutdown(&self) -> bool {
        self.closing.cancel();
        let idle: Vec<_> = self
            .pool
            .close()
            .into_iter()
            .chain(self.recycled.drain())
            .collect();
        let sessions = self.take_all_sessions();
        // Everything this instance's label names, in parallel, with what was idle.
        tokio::join!(
            futures_util::future::join_all(idle.into_iter().map(|s| s.destroy())),
            self.sweep()
        );
        self.close_prepared().await;
        // A refill may be starting sandboxes: it stops at its next step, or is dropped (what it
        // started is then removed by the sweep below).
        let refill = self
            .pool_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut refill) = refill {
            if tokio::time::timeout(Duration::from_secs(2), &mut refill)
                .await
                .is_err()
            {
                refill.abort();
                // Dropped once this returns: a create it had under way counts as abandoned.
                let _ = refill.await;
            }
        }
        self.settle().await;
        let mut clean = self.sweep().await;
        if clean && self.backend.abandoned_a_create() {
            tracing::info!(
                "a sandbox create was cancelled before the engine answered it: the warden looks \
                 for a sandbox that may still appear"
            );
            clean = false;
        }
        self.stop_egress().await;
        remove_unused_storage(self.backend.as_ref(), &self.owner.instance).await;
        sessions::forget(sessions);
        clean
    }

    /// This server instance's id, the label its sandboxes carry.
    pub fn instance(&self) -> &str {
        &self.owner.instance
    }
}

/// Removes an instance's storage no sandbox uses any more: the workspace of a sandbox that was
/// removed from outside without its volumes (`docker rm -f` without `-v`).
pub(crate) async fn remove_unused_storage(backend: &dyn Backend, instance: &str) {
    match backend
        .remove_orphaned_storage(LABEL_INSTANCE, instance, &|_| true)
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!("removed {n} workspace volume(s) left without a sandbox"),
        Err(e) => tracing::warn!("could not remove unused workspace volumes: {e}"),
    }
}
