//! The sandbox engine: runs code in disposable sandboxes and in stateful sessions.
//!
//! Layers, each with one job:
//! - [`backend`]: the trait a container platform implements; [`docker`] is the Docker one.
//! - [`protocol`] and `runner.py`: how the host talks to the runner process inside a sandbox.
//! - [`sandbox`]: one sandbox's lifecycle as explicit states, with timeouts and recovery.
//! - [`owner`]: labels naming the server instance, to clean up what a dead server left.
//! - [`artifacts`]: files an execution made, copied out safely, saved and selected for return.
//! - [`deps`] and [`installer`]: validated requirements, installed in a separate sandbox into a
//!   shared read-only cache.
//! - [`pool`]: sandboxes started ahead of time.
//! - this module: the [`Engine`], which applies the configuration and tracks sessions.

pub mod artifacts;
pub mod backend;
pub mod deps;
pub mod docker;
pub mod installer;
pub mod owner;
pub mod pool;
pub mod protocol;
pub mod sandbox;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::{glob_matches, Config};
use backend::{Backend, BackendError, SandboxId, SandboxSpec};
pub use installer::DependencyReport;
use owner::{Owner, LABEL_INSTANCE, LABEL_MANAGED};
use protocol::ProtocolError;
use sandbox::{human, Sandbox};
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
    #[error("no session {0}: it was stopped or never created by this server; start one with sandbox_initialize")]
    UnknownSession(String),
    #[error("session {id} has expired ({reason}); start a new one with sandbox_initialize")]
    SessionExpired { id: String, reason: String },
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
                | EngineError::SessionExpired { .. }
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

/// A path the agent gave, as a safe path relative to the workspace. `/workspace/x` and `x` are the
/// same file; anything that would leave the workspace is refused.
pub fn workspace_relative(path: &str) -> Result<String, EngineError> {
    let trimmed = path.trim();
    let relative = trimmed
        .strip_prefix(backend::paths::WORKSPACE)
        .map(|rest| rest.trim_start_matches('/'))
        .unwrap_or(trimmed);
    let relative = relative.trim_start_matches("./");
    if relative.starts_with('/') || !protocol::is_safe_relative_path(relative) {
        return Err(EngineError::InvalidPath(protocol::truncate_chars(
            path, 200,
        )));
    }
    Ok(relative.to_string())
}

/// A tar archive holding `path` (and its parent directories) owned by the sandbox user.
fn upload_archive(path: &str, content: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut archive = tar::Builder::new(Vec::new());
    let parts: Vec<&str> = path.split('/').collect();
    for depth in 1..parts.len() {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_uid(1000);
        header.set_gid(1000);
        header.set_size(0);
        header.set_mtime(now_secs());
        archive.append_data(
            &mut header,
            format!("{}/", parts[..depth].join("/")),
            std::io::empty(),
        )?;
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_uid(1000);
    header.set_gid(1000);
    header.set_size(content.len() as u64);
    header.set_mtime(now_secs());
    archive.append_data(&mut header, path, content)?;
    archive.into_inner()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

/// The host directory name of a session: the same for all its executions.
fn session_run_dir(id: &SandboxId) -> String {
    let short: String =
        id.0.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
    format!("session-{short}")
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

/// A live session: a sandbox whose runner keeps its state between executions.
struct Session {
    sandbox: Mutex<Sandbox>,
    image: String,
    created: Instant,
    last_used: std::sync::Mutex<Instant>,
    dependencies: std::sync::Mutex<SessionDependencies>,
}

/// The dependency set a session has on its `sys.path`.
#[derive(Debug, Clone, Default)]
struct SessionDependencies {
    requirements: Vec<deps::Requirement>,
    key: Option<String>,
}

impl Session {
    fn dependencies(&self) -> SessionDependencies {
        self.dependencies
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    fn idle(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }
}

/// What `sandbox_list` shows of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub image: String,
    pub age: Duration,
    pub idle: Duration,
}

/// Ids of sessions that ended on their own, so a later call can say why.
const TOMBSTONES: usize = 1024;

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
    /// The pool's refill task, awaited at shutdown so no sandbox is left half-started.
    pool_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct Sessions {
    live: HashMap<String, Arc<Session>>,
    /// Sessions being created: they count against the limit already.
    starting: usize,
    ended: VecDeque<(String, String)>,
}

impl Engine {
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Engine {
        let executions = Semaphore::new(config.max_concurrent.max(1));
        let deps = installer::Dependencies::new(&config);
        Engine {
            deps,
            pool: pool::Pool::new(config.pool_size),
            background: tokio_util::task::TaskTracker::new(),
            pool_task: std::sync::Mutex::new(None),
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

    pub(crate) fn base_spec(&self, image: String, kind: &str) -> SandboxSpec {
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
        let spec = self.base_spec(self.check_image(options.image.as_deref())?, kind);
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
        let spec = self.base_spec(self.config.image.clone(), "pool");
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

    pub(crate) fn pool_wake(&self) -> Arc<tokio::sync::Notify> {
        self.pool.wake()
    }

    /// Round trips to the runner of a fresh sandbox (the benchmark's floor for a session call).
    pub async fn runner_round_trips(&self, count: usize) -> Result<Vec<Duration>, EngineError> {
        let spec = self.base_spec(self.config.image.clone(), "ephemeral");
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

    /// Dependency sets live sessions use (never evicted).
    pub(crate) fn sessions_dependency_keys(&self) -> Vec<String> {
        self.lock_sessions()
            .live
            .values()
            .filter_map(|s| s.dependencies().key)
            .collect()
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
            let id = sandbox.id().clone();
            self.collect_files(&id, execution, &ephemeral_run_dir())
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
    /// Takes the sandbox's id, not the sandbox: a `&Sandbox` held across an await is not `Send`.
    async fn collect_files(&self, sandbox: &SandboxId, execution: &mut Execution, run_dir: &str) {
        let changes = std::mem::take(&mut execution.changes);
        if changes.entries.is_empty() && changes.figures.is_empty() && !changes.truncated {
            return;
        }
        execution.files = artifacts::collect(
            self.backend.as_ref(),
            sandbox,
            &changes.entries,
            changes.truncated,
            changes.figures,
            &self.config.files,
            run_dir,
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

    /// Starts a session sandbox and returns its id.
    pub async fn create_session(&self, options: &RunOptions) -> Result<String, EngineError> {
        let image = self.check_image(options.image.as_deref())?;
        {
            let mut sessions = self.lock_sessions();
            let max = self.config.sessions.max_sessions;
            if sessions.live.len() + sessions.starting >= max {
                return Err(EngineError::TooManySessions(max));
            }
            sessions.starting += 1;
        }
        let launched = {
            let _permit = self.permit().await;
            let options = RunOptions {
                image: Some(image.clone()),
                ..options.clone()
            };
            self.launch("session", &options, &[])
                .await
                .map(|(sandbox, _)| sandbox)
        };
        let mut sessions = self.lock_sessions();
        sessions.starting -= 1;
        let sandbox = launched?;
        let id = sandbox.id().0.clone();
        let now = Instant::now();
        let session = Session {
            sandbox: Mutex::new(sandbox),
            image,
            created: now,
            last_used: std::sync::Mutex::new(now),
            dependencies: std::sync::Mutex::default(),
        };
        sessions.live.insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // Every operation under this lock is a single map or counter update: a panic elsewhere
        // cannot leave it half-done, so a poisoned lock is still consistent.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Finds a session by its id, or by a unique prefix of at least 12 characters.
    fn session(&self, id: &str) -> Result<(String, Arc<Session>), EngineError> {
        let id = id.trim();
        if id.len() < 12
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(EngineError::MalformedSessionId(
                id.chars().take(80).collect(),
            ));
        }
        let sessions = self.lock_sessions();
        if let Some(session) = sessions.live.get(id) {
            return Ok((id.to_string(), session.clone()));
        }
        let mut matches = sessions
            .live
            .iter()
            .filter(|(full, _)| full.starts_with(id));
        if let (Some((full, session)), None) = (matches.next(), matches.next()) {
            return Ok((full.clone(), session.clone()));
        }
        if let Some((full, reason)) = sessions.ended.iter().find(|(full, _)| full.starts_with(id)) {
            return Err(EngineError::SessionExpired {
                id: full.clone(),
                reason: reason.clone(),
            });
        }
        Err(EngineError::UnknownSession(id.to_string()))
    }

    /// Executes in a session; executions of one session run one at a time, in order.
    pub async fn execute_in_session(
        &self,
        id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        Self::check_task(task)?;
        let requested = self.requirements(&options.dependencies)?;
        let (_, session) = self.session(id)?;
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let _permit = self.permit().await;
        let report = if requested.is_empty() {
            None
        } else {
            Some(
                self.add_session_dependencies(&session, &mut sandbox, &requested, options)
                    .await?,
            )
        };
        let mut result = self.execute_in(&mut sandbox, task, options).await;
        if let Ok(execution) = &mut result {
            execution.dependencies = report;
            let id = sandbox.id().clone();
            self.collect_files(&id, execution, &session_run_dir(&id))
                .await;
        }
        session.touch();
        result
    }

    /// Adds requirements to a session's set: the union is installed (or found) as one set, which
    /// replaces the previous one on `sys.path`. The session's own sandbox never gets a network.
    async fn add_session_dependencies(
        &self,
        session: &Session,
        sandbox: &mut Sandbox,
        requested: &[deps::Requirement],
        options: &RunOptions,
    ) -> Result<installer::DependencyReport, EngineError> {
        let current = session.dependencies();
        let mut entries: Vec<String> = current
            .requirements
            .iter()
            .map(deps::Requirement::canonical)
            .collect();
        entries.extend(requested.iter().map(deps::Requirement::canonical));
        let union = self.requirements(&entries)?;
        let base = self.base_spec(session.image.clone(), "session");
        let previous = current
            .key
            .as_ref()
            .map(|k| format!("{}/{k}", backend::paths::DEPS));
        let report = self
            .prepare_dependencies(sandbox, &base, &union, previous.as_deref(), options)
            .await?;
        if let Ok(mut deps) = session.dependencies.lock() {
            *deps = SessionDependencies {
                requirements: union,
                key: Some(report.key.clone()),
            };
        }
        Ok(report)
    }

    /// Writes a file into a session's workspace (parents created), as the sandbox user.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<String, EngineError> {
        let (full_id, session) = self.session(id)?;
        let path = workspace_relative(path)?;
        let limit = self.config.files.max_file_bytes;
        if content.len() as u64 > limit {
            return Err(EngineError::File {
                path,
                reason: format!(
                    "{} bytes is more than the {limit}-byte limit",
                    content.len()
                ),
            });
        }
        let archive = upload_archive(&path, content).map_err(|e| EngineError::File {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        session.touch();
        self.backend
            .copy_in(
                &SandboxId(full_id),
                backend::paths::WORKSPACE,
                archive.into(),
            )
            .await?;
        Ok(format!("{}/{path}", backend::paths::WORKSPACE))
    }

    /// Reads one file of a session's workspace, within the return limit.
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
    ) -> Result<artifacts::Artifact, EngineError> {
        let (full_id, session) = self.session(id)?;
        let path = workspace_relative(path)?;
        session.touch();
        let limit = self.config.files.return_max_file_bytes;
        let content =
            artifacts::fetch_file(self.backend.as_ref(), &SandboxId(full_id), &path, limit)
                .await
                .map_err(|reason| EngineError::File {
                    path: path.clone(),
                    reason,
                })?;
        Ok(artifacts::Artifact {
            size: content.len() as u64,
            mime_type: artifacts::sniff_mime(&content, &path).to_string(),
            path,
            content: Some(content),
            saved_to: None,
            note: None,
            figure: false,
        })
    }

    /// Lists a directory of a session's workspace (`""` for the workspace itself).
    pub async fn list_files(&self, id: &str, path: &str) -> Result<sandbox::Listing, EngineError> {
        let (_, session) = self.session(id)?;
        let path = if path.trim().trim_matches('/').is_empty() || path.trim() == "." {
            String::new()
        } else {
            workspace_relative(path)?
        };
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        sandbox.list(&path).await
    }

    /// Stops a session and removes its sandbox.
    pub async fn stop_session(&self, id: &str) -> Result<String, EngineError> {
        let (full, _) = self.session(id)?;
        let session = self
            .lock_sessions()
            .live
            .remove(&full)
            .ok_or_else(|| EngineError::UnknownSession(full.clone()))?;
        // An execution in flight is interrupted by killing the sandbox; its caller gets an error.
        if let Err(e) = self.backend.destroy(&SandboxId(full.clone())).await {
            tracing::warn!(sandbox = %full, "could not remove a stopped session: {e}");
        }
        session.sandbox.lock().await.forget();
        Ok(full)
    }

    /// This server's live sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut list: Vec<SessionInfo> = self
            .lock_sessions()
            .live
            .iter()
            .map(|(id, s)| SessionInfo {
                id: id.clone(),
                image: s.image.clone(),
                age: s.created.elapsed(),
                idle: s.idle(),
            })
            .collect();
        list.sort_by_key(|s| std::cmp::Reverse(s.age));
        list
    }

    /// Stops sessions idle or alive for longer than the policy allows; returns how many.
    pub async fn reap_expired_sessions(&self) -> usize {
        let policy = &self.config.sessions;
        let expired: Vec<(String, String)> = self
            .lock_sessions()
            .live
            .iter()
            .filter_map(|(id, s)| {
                if s.created.elapsed() >= policy.max_lifetime {
                    Some((
                        id.clone(),
                        format!(
                            "it reached the maximum lifetime of {}",
                            human(policy.max_lifetime)
                        ),
                    ))
                } else if s.idle() >= policy.idle_timeout && s.sandbox.try_lock().is_ok() {
                    Some((
                        id.clone(),
                        format!("it was idle for more than {}", human(policy.idle_timeout)),
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, reason) in &expired {
            tracing::info!(session = %id, "stopping: {reason}");
            {
                let mut sessions = self.lock_sessions();
                sessions.live.remove(id);
                sessions.ended.push_back((id.clone(), reason.clone()));
                while sessions.ended.len() > TOMBSTONES {
                    sessions.ended.pop_front();
                }
            }
            if let Err(e) = self.backend.destroy(&SandboxId(id.clone())).await {
                tracing::warn!(session = %id, "could not remove an expired session: {e}");
            }
        }
        expired.len()
    }

    /// Runs [`Engine::reap_expired_sessions`] periodically until the engine is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let engine = Arc::downgrade(self);
        let policy = self.config.sessions.clone();
        let period = (policy.idle_timeout.min(policy.max_lifetime) / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                engine.reap_expired_sessions().await;
            }
        })
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
        let sessions: Vec<Arc<Session>> =
            self.lock_sessions().live.drain().map(|(_, s)| s).collect();
        self.sweep().await;
        for session in sessions {
            // A session busy with an execution is dropped later; removing it again then is harmless.
            if let Ok(mut sandbox) = session.sandbox.try_lock() {
                sandbox.forget();
            }
        }
    }
}
