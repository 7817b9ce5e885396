//! The sandbox engine: runs code in disposable sandboxes and in stateful sessions.
//!
//! Layers, each with one job:
//! - [`backend`]: the trait a container platform implements; [`docker`] is the Docker one.
//! - [`protocol`] and `python/runner/`: how the host talks to the runner process inside a sandbox.
//! - [`sandbox`]: one sandbox's lifecycle as explicit states, with timeouts and recovery.
//! - [`owner`]: labels naming the server instance, to clean up what a dead server left.
//! - [`artifacts`]: files an execution made, copied out safely, saved and selected for return.
//! - [`files_dir`]: the host directory they are saved in: checked at start-up, kept within its
//!   retention.
//! - [`deps`] and [`installer`]: validated requirements, installed in a separate sandbox into a
//!   shared read-only cache.
//! - [`pool`]: sandboxes started ahead of time.
//! - [`sessions`]: stateful sandboxes found by id, their limits, and the workspace file tools.
//! - this module: the [`Engine`], which applies the configuration, runs ephemeral code, and
//!   removes everything it made at shutdown.

pub mod artifacts;
pub mod backend;
pub mod deps;
pub mod docker;
pub mod egress;
pub mod files_dir;
pub mod installer;
pub mod owner;
pub mod pool;
pub mod protocol;
pub mod sandbox;
pub mod sessions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{glob_matches, Config};
use backend::{Backend, BackendError, SandboxId, SandboxSpec};
pub use installer::DependencyReport;
use owner::{Owner, LABEL_INSTANCE, LABEL_MANAGED};
use protocol::ProtocolError;
use sandbox::Sandbox;
pub use sandbox::{Execution, Task};
use sessions::Sessions;
pub use sessions::{workspace_relative, SessionInfo};

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
    #[error("the sandbox was lost: {0}")]
    SandboxLost(String),
    #[error("no session {0}: it was stopped or never created by this server; start one with sandbox_initialize")]
    UnknownSession(String),
    #[error("session {id} has ended: {reason}; start a new one with sandbox_initialize")]
    SessionEnded { id: String, reason: String },
    #[error("{0:?} is not a valid container_id: use the id sandbox_initialize returned")]
    MalformedSessionId(String),
    #[error("image {image} is not allowed; allowed: {allowed}")]
    ImageNotAllowed { image: String, allowed: String },
    #[error("the limit of {0} live sessions is reached; stop one with sandbox_stop first")]
    TooManySessions(usize),
    #[error("the code is {size} bytes, more than the {limit}-byte limit")]
    CodeTooLarge { size: usize, limit: usize },
    #[error("{0:?} is not a path inside /workspace: give a relative path without `..`")]
    InvalidPath(String),
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error(transparent)]
    InvalidDependency(#[from] deps::DependencyError),
    #[error("installing the dependencies failed:\n{0}")]
    Dependencies(String),
}

impl EngineError {
    /// Whether the caller's request was at fault (as opposed to the engine or the sandbox).
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            EngineError::UnknownSession(_)
                | EngineError::SessionEnded { .. }
                | EngineError::MalformedSessionId(_)
                | EngineError::ImageNotAllowed { .. }
                | EngineError::TooManySessions(_)
                | EngineError::CodeTooLarge { .. }
                | EngineError::InvalidPath(_)
                | EngineError::File { .. }
                | EngineError::InvalidDependency(_)
                | EngineError::Dependencies(_)
        )
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The host directory name of an ephemeral run: sortable by time, unique.
fn ephemeral_run_dir() -> String {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = stamp
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    format!(
        "run-{stamp}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The largest code (or shell command) accepted for one execution.
pub const MAX_CODE_BYTES: usize = 8 << 20;

/// Receives short progress messages ("starting the sandbox", ...).
pub type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Per-call options that override the configuration.
#[derive(Clone, Default)]
pub struct RunOptions {
    pub timeout: Option<Duration>,
    /// Another image than the configured one; it must be allowed.
    pub image: Option<String>,
    /// Fires to interrupt the execution (an MCP `notifications/cancelled`).
    pub cancel: Option<CancellationToken>,
    pub progress: Option<ProgressSink>,
    /// PyPI requirements to make importable first (PEP 508 strings, validated here).
    pub dependencies: Vec<String>,
}

impl RunOptions {
    fn report(&self, message: &str) {
        if let Some(progress) = &self.progress {
            progress(message);
        }
    }
}

pub struct Engine {
    backend: Arc<dyn Backend>,
    config: Config,
    owner: Owner,
    sessions: std::sync::Mutex<Sessions>,
    executions: Semaphore,
    deps: installer::Dependencies,
    pub(crate) pool: pool::Pool,
    /// Sandbox removals running after their result was returned.
    background: tokio_util::task::TaskTracker,
    /// Set once the server has looked for its own container (see `identified`).
    identified: tokio::sync::OnceCell<()>,
    /// The pool's refill task, awaited at shutdown so no sandbox is left half-started.
    pool_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The retention of saved files (`None` when nothing is saved).
    retention: Option<Arc<files_dir::Retention>>,
}

impl Engine {
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Engine {
        let executions = Semaphore::new(config.max_concurrent.max(1));
        let deps = installer::Dependencies::new(&config);
        Engine {
            deps,
            pool: pool::Pool::new(config.pool_size),
            background: tokio_util::task::TaskTracker::new(),
            identified: tokio::sync::OnceCell::new(),
            pool_task: std::sync::Mutex::new(None),
            retention: files_dir::Retention::new(&config.files),
            backend,
            config,
            owner: Owner::current(),
            sessions: Default::default(),
            executions,
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

    /// The image a request may use: the configured one, or one the operator allowed.
    pub fn check_image(&self, requested: Option<&str>) -> Result<String, EngineError> {
        let image = match requested.map(str::trim).filter(|i| !i.is_empty()) {
            None => return Ok(self.config.image.clone()),
            Some(image) => image,
        };
        if image == self.config.image
            || self
                .config
                .allowed_images
                .iter()
                .any(|p| glob_matches(p, image))
        {
            return Ok(image.to_string());
        }
        let mut allowed = vec![self.config.image.clone()];
        allowed.extend(self.config.allowed_images.iter().cloned());
        Err(EngineError::ImageNotAllowed {
            image: image.to_string(),
            allowed: allowed.join(", "),
        })
    }

    /// What every sandbox of this server is made from. Waits, once, for the server to find its
    /// own container, so every sandbox's labels name it (see [`Engine::remove_leftovers`]).
    pub(crate) async fn base_spec(&self, image: String, kind: &str) -> SandboxSpec {
        self.identified().await;
        SandboxSpec {
            image,
            limits: self.config.limits.clone(),
            network: self.config.network,
            ca_bundle: self.config.ca_bundle.clone(),
            mounts: self.config.mounts.clone(),
            volumes: installer::sandbox_volumes(&self.config),
            runtime: self.config.runtime.clone(),
            command: protocol::bootstrap_command(),
            labels: self.owner.labels(kind),
            network_name: None,
            env: Vec::new(),
            maintenance: false,
        }
    }

    /// A sandbox for a request, with its dependencies on `sys.path`: from the warm pool when the
    /// request uses the default image, else started now.
    async fn launch(
        &self,
        kind: &str,
        options: &RunOptions,
        requirements: &[deps::Requirement],
    ) -> Result<(Sandbox, Option<installer::DependencyReport>), EngineError> {
        let image = self.check_image(options.image.as_deref())?;
        let spec = self.base_spec(image, kind).await;
        let mut sandbox = match self.take_pooled(&spec.image).await {
            Some(sandbox) => sandbox,
            None => {
                options.report(&format!("preparing image {}", spec.image));
                self.backend.ensure_image(&spec.image).await?;
                options.report("starting the sandbox");
                Sandbox::launch(self.backend.clone(), &spec).await?
            }
        };
        if requirements.is_empty() {
            return Ok((sandbox, None));
        }
        match self
            .prepare_dependencies(&mut sandbox, &spec, requirements, None, options)
            .await
        {
            Ok(report) => Ok((sandbox, Some(report))),
            Err(e) => {
                self.retire(sandbox);
                Err(e)
            }
        }
    }

    /// A live pooled sandbox for `image`, if the pool serves it and has one.
    async fn take_pooled(&self, image: &str) -> Option<Sandbox> {
        if image != self.config.image {
            return None;
        }
        while let Some(mut sandbox) = self.pool.take() {
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
        let spec = self.base_spec(self.config.image.clone(), "pool").await;
        self.backend.ensure_image(&spec.image).await?;
        Sandbox::launch(self.backend.clone(), &spec).await
    }

    /// Starts keeping the warm pool full (`SANDBOX_POOL_SIZE`), in the background, until
    /// `shutdown`.
    pub fn start_pool(self: &Arc<Self>) {
        if let Some(task) = pool::spawn_refill(self) {
            *self.pool_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
    }

    /// Starts keeping the saved files within their retention, in the background (a sweep now,
    /// after saves, and hourly); `None` when nothing is saved. Abort the handle to stop.
    pub fn spawn_file_retention(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.retention.as_ref().map(|retention| retention.spawn())
    }

    pub(crate) fn pool_wake(&self) -> Arc<tokio::sync::Notify> {
        self.pool.wake()
    }

    /// Round trips to the runner of a fresh sandbox (the benchmark's floor for a session call).
    pub async fn runner_round_trips(&self, count: usize) -> Result<Vec<Duration>, EngineError> {
        let spec = self.base_spec(self.config.image.clone(), "ephemeral").await;
        self.backend.ensure_image(&spec.image).await?;
        let mut sandbox = Sandbox::launch(self.backend.clone(), &spec).await?;
        let mut samples = Vec::with_capacity(count);
        let mut outcome = Ok(());
        for _ in 0..count {
            let started = Instant::now();
            if let Err(e) = sandbox.add_paths(&[], &[]).await {
                outcome = Err(e);
                break;
            }
            samples.push(started.elapsed());
        }
        sandbox.destroy().await;
        outcome.map(|()| samples)
    }

    /// Sandboxes waiting in the pool now.
    pub fn pool_ready(&self) -> usize {
        self.pool.ready()
    }

    /// Removes a sandbox in the background; `shutdown` waits for these removals.
    pub(crate) fn retire(&self, sandbox: Sandbox) {
        self.background.spawn(async move {
            let started = Instant::now();
            let id = sandbox.id().clone();
            sandbox.destroy().await;
            tracing::debug!(sandbox = %id, destroy_ms = started.elapsed().as_millis() as u64, "sandbox removed");
        });
    }

    /// Validates a request's dependencies (before anything starts).
    fn requirements(&self, entries: &[String]) -> Result<Vec<deps::Requirement>, EngineError> {
        Ok(deps::parse_requirements(
            entries,
            self.config.deps.allow_urls,
        )?)
    }

    /// How many installers this engine started.
    pub fn installs_started(&self) -> u64 {
        self.deps.installs_started()
    }

    fn check_task(task: Task<'_>) -> Result<(), EngineError> {
        let size = match task {
            Task::Python(code) => code.len(),
            Task::Shell(command) => command.len(),
        };
        if size > MAX_CODE_BYTES {
            return Err(EngineError::CodeTooLarge {
                size,
                limit: MAX_CODE_BYTES,
            });
        }
        Ok(())
    }

    async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        // The semaphore is never closed, so acquiring cannot fail; a closed one would mean shutdown.
        match self.executions.acquire().await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the execution semaphore is never closed"),
        }
    }

    /// Runs code in a fresh sandbox that is removed, with its workspace, before this returns.
    pub async fn run_ephemeral(
        &self,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        Self::check_task(task)?;
        let requirements = self.requirements(&options.dependencies)?;
        let _permit = self.permit().await;
        let started = Instant::now();
        let (mut sandbox, report) = self.launch("ephemeral", options, &requirements).await?;
        let acquired = started.elapsed();
        options.report("running");
        let mut result = self.execute_in(&mut sandbox, task, options).await;
        let executed = started.elapsed();
        if let Ok(execution) = &mut result {
            execution.dependencies = report;
            self.collect_files(&mut sandbox, execution, &ephemeral_run_dir())
                .await;
        }
        let collected = started.elapsed();
        // The result goes back now; the sandbox is removed in the background.
        self.retire(sandbox);
        tracing::debug!(
            acquire_ms = ms(acquired),
            execute_ms = ms(executed - acquired),
            collect_ms = ms(collected - executed),
            total_ms = ms(collected),
            "ephemeral run"
        );
        result
    }

    /// Waits until sandboxes removed in the background are gone (the CLI does before it exits).
    pub async fn settle(&self) {
        self.background.close();
        self.background.wait().await;
        self.background.reopen();
    }

    /// Copies out, saves and selects the files an execution made.
    async fn collect_files(&self, sandbox: &mut Sandbox, execution: &mut Execution, run_dir: &str) {
        let changes = std::mem::take(&mut execution.changes);
        if changes.entries.is_empty()
            && changes.figures.is_empty()
            && !changes.truncated
            && changes.left_out == 0
        {
            return;
        }
        execution.files = artifacts::collect(
            sandbox,
            changes,
            &self.config.files,
            artifacts::Destination {
                run_dir,
                retention: self.retention.as_deref(),
            },
        )
        .await;
    }

    /// One execution with the configured limits and the call's overrides.
    async fn execute_in(
        &self,
        sandbox: &mut Sandbox,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        sandbox
            .execute(
                task,
                timeout,
                self.config.limits.max_output_bytes,
                options.cancel.as_ref(),
            )
            .await
    }

    /// Finds whether this server runs in a container of the engine it uses, and labels what it
    /// creates from now on with that container: then, if the server is killed outright, another
    /// server can tell it is gone although its pid is in another namespace. Outside a container
    /// this costs nothing; inside, one inspection.
    async fn identified(&self) {
        self.identified
            .get_or_init(|| async {
                // Bounded: an engine that does not answer must not hold up the first sandbox.
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), self.identify_server_container())
                        .await;
            })
            .await;
    }

    async fn identify_server_container(&self) {
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
    /// until a listing comes back empty, a few times at most.
    async fn sweep(&self) {
        for round in 0..5 {
            let records = match self
                .backend
                .list(LABEL_INSTANCE, &self.owner.instance)
                .await
            {
                Ok(records) => records,
                Err(e) => {
                    tracing::warn!("could not list this server's sandboxes at shutdown: {e}");
                    return;
                }
            };
            if records.is_empty() {
                return;
            }
            let removals = records.iter().map(|r| self.backend.destroy(&r.id));
            for (record, result) in records
                .iter()
                .zip(futures_util::future::join_all(removals).await)
            {
                if let Err(e) = result {
                    tracing::warn!(sandbox = %record.id, round, "could not remove at shutdown: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Removes every sandbox of this server instance (sessions and any in flight), all at once:
    /// an MCP client gives a closing server only a moment before it kills it.
    pub async fn shutdown(&self) {
        for sandbox in self.pool.close() {
            self.retire(sandbox);
        }
        // A refill may be starting sandboxes: let it finish (it retires them once closed).
        let refill = self
            .pool_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(refill) = refill {
            if tokio::time::timeout(Duration::from_secs(60), refill)
                .await
                .is_err()
            {
                tracing::warn!("the pool refill did not stop in time");
            }
        }
        self.settle().await;
        let sessions = self.take_all_sessions();
        self.sweep().await;
        remove_unused_storage(self.backend.as_ref(), &self.owner.instance).await;
        sessions::forget(sessions);
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
