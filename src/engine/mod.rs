//! The sandbox engine: runs code in disposable sandboxes and in stateful sessions.
//!
//! Layers, each with one job:
//! - [`backend`]: the trait a container platform implements; [`docker`] is the Docker one.
//! - [`protocol`] and `runner.py`: how the host talks to the runner process inside a sandbox.
//! - [`sandbox`]: one sandbox's lifecycle as explicit states, with timeouts and recovery.
//! - [`owner`]: labels naming the server instance, to clean up what a dead server left.
//! - this module: the [`Engine`], which applies the configuration and tracks sessions.

pub mod backend;
pub mod docker;
pub mod owner;
pub mod protocol;
pub mod sandbox;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::config::Config;
use backend::{Backend, BackendError, SandboxSpec};
use owner::{Owner, LABEL_INSTANCE, LABEL_MANAGED};
use protocol::ProtocolError;
use sandbox::Sandbox;
pub use sandbox::{Execution, Task};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the sandbox failed to start: {0}")]
    SandboxStart(String),
    #[error("the sandbox broke the runner protocol and was stopped: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the sandbox has been removed")]
    SandboxGone,
    #[error("no session {0}: it was stopped, expired, or never created by this server")]
    UnknownSession(String),
}

/// Per-call options that override the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub timeout: Option<Duration>,
}

/// A live session: a sandbox whose runner keeps its state between executions.
struct Session {
    sandbox: Mutex<Sandbox>,
    created: Instant,
}

pub struct Engine {
    backend: Arc<dyn Backend>,
    config: Config,
    owner: Owner,
    sessions: std::sync::Mutex<HashMap<String, Arc<Session>>>,
}

impl Engine {
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Engine {
        Engine {
            backend,
            config,
            owner: Owner::current(),
            sessions: Default::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn spec(&self, kind: &str) -> SandboxSpec {
        SandboxSpec {
            image: self.config.image.clone(),
            limits: self.config.limits.clone(),
            network: self.config.network,
            ca_bundle: self.config.ca_bundle.clone(),
            command: protocol::bootstrap_command(),
            labels: self.owner.labels(kind),
        }
    }

    async fn launch(&self, kind: &str) -> Result<Sandbox, EngineError> {
        let spec = self.spec(kind);
        self.backend.ensure_image(&spec.image).await?;
        Sandbox::launch(self.backend.clone(), &spec).await
    }

    /// Runs code in a fresh sandbox that is removed, with its workspace, before this returns.
    pub async fn run_ephemeral(
        &self,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        let mut sandbox = self.launch("ephemeral").await?;
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        let result = sandbox
            .execute(task, timeout, self.config.limits.max_output_bytes)
            .await;
        sandbox.destroy().await;
        result
    }

    /// Starts a session sandbox and returns its id.
    pub async fn create_session(&self) -> Result<String, EngineError> {
        let sandbox = self.launch("session").await?;
        let id = sandbox.id().0.clone();
        let session = Arc::new(Session {
            sandbox: Mutex::new(sandbox),
            created: Instant::now(),
        });
        self.lock_sessions().insert(id.clone(), session);
        Ok(id)
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single operations).
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, EngineError> {
        self.lock_sessions()
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::UnknownSession(id.to_string()))
    }

    /// Executes in a session; executions of one session run one at a time, in order.
    pub async fn execute_in_session(
        &self,
        id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        let session = self.session(id)?;
        let mut sandbox = session.sandbox.lock().await;
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        sandbox
            .execute(task, timeout, self.config.limits.max_output_bytes)
            .await
    }

    /// Stops a session and removes its sandbox.
    pub async fn stop_session(&self, id: &str) -> Result<(), EngineError> {
        let session = self
            .lock_sessions()
            .remove(id)
            .ok_or_else(|| EngineError::UnknownSession(id.to_string()))?;
        let mut sandbox = session.sandbox.lock().await;
        // The sandbox is owned by the session: destroy it through a placeholder-free path.
        destroy_locked(&mut sandbox).await;
        Ok(())
    }

    /// Ids and ages of the live sessions.
    pub fn sessions(&self) -> Vec<(String, Duration)> {
        self.lock_sessions()
            .iter()
            .map(|(id, s)| (id.clone(), s.created.elapsed()))
            .collect()
    }

    /// Removes sandboxes left behind by server instances that are no longer running.
    pub async fn remove_leftovers(&self) -> Result<usize, EngineError> {
        let records = self.backend.list(LABEL_MANAGED, "true").await?;
        let mut removed = 0;
        for record in records
            .into_iter()
            .filter(|r| self.owner.is_leftover(&r.labels))
        {
            tracing::info!(sandbox = %record.id, "removing a sandbox left by a server that is gone");
            self.backend.destroy(&record.id).await?;
            removed += 1;
        }
        let owner = &self.owner;
        removed += self
            .backend
            .remove_orphaned_storage(LABEL_MANAGED, "true", &|labels| owner.is_leftover(labels))
            .await?;
        Ok(removed)
    }

    /// Removes every sandbox of this server instance (sessions and any in flight).
    pub async fn shutdown(&self) {
        let sessions: Vec<Arc<Session>> = self.lock_sessions().drain().map(|(_, s)| s).collect();
        for session in sessions {
            // An execution in flight holds the lock; don't wait for it, the sweep below removes it.
            if let Ok(mut sandbox) = session.sandbox.try_lock() {
                destroy_locked(&mut sandbox).await;
            }
        }
        match self
            .backend
            .list(LABEL_INSTANCE, &self.owner.instance)
            .await
        {
            Ok(records) => {
                let removals = records.iter().map(|r| self.backend.destroy(&r.id));
                for (record, result) in records
                    .iter()
                    .zip(futures_util::future::join_all(removals).await)
                {
                    if let Err(e) = result {
                        tracing::warn!(sandbox = %record.id, "could not remove at shutdown: {e}");
                    }
                }
            }
            Err(e) => tracing::warn!("could not list this server's sandboxes at shutdown: {e}"),
        }
    }
}

async fn destroy_locked(sandbox: &mut Sandbox) {
    sandbox.destroy_in_place().await;
}
