//! The [`Engine`]: the one object the layers above talk to. It applies the configuration to every
//! request and composes the parts below it (sandboxes, the warm pool, sessions, dependencies,
//! file collection) without any of them knowing about it. Its methods are grouped by what they
//! do, one file each:
//!
//! - this file: construction, the sandbox a request runs in, and what every execution shares;
//! - `run`: code in a disposable sandbox;
//! - `sessions`: stateful sandboxes: start, execute, stop, list, expire, a client's end;
//! - `files`: the workspace file tools of a session;
//! - `snapshots`: saving a session, starting one from a snapshot, forking one;
//! - `dependencies`: installing and finding dependency sets, and the cache's maintenance;
//! - `pip`: `pip` asked for by the code during an execution, answered through the installer;
//! - `pool`: keeping the warm pool full and drawing from it;
//! - `recycle`: a run's sandbox emptied for its caller's next run, or removed; shares of the
//!   capacity taken back from idle sandboxes when a call waits for one;
//! - `prepared`: sandboxes prepared per dependency set, in the background, and handed out;
//! - `lifecycle`: finding the server's own container, removing what dead servers left, and
//!   removing everything at shutdown.

mod dependencies;
mod egress;
mod files;
mod host_paths;
mod lifecycle;
mod pip;
mod pool;
mod prepared;
mod recycle;
mod run;
mod runner_set;
mod sessions;
mod snapshots;

pub use egress::{HostRequest, HostStatus};
pub use snapshots::{Forked, Restored};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::admission::{self, Admission};
use super::artifacts;
use super::backend::{Backend, SandboxSpec};
use super::deps;
use super::egress::{Attachment, Gateway, Role};
use super::files_dir::{self, Retention};
use super::installer::{self, Dependencies};
use super::outcome::{DependencyReport, Execution};
use super::owner::Owner;
use super::platform::{self, Platform, Refusal};
use super::pool::Pool;
use super::prepared::Prepared;
use super::protocol;
use super::recycled::Recycled;
use super::roots::{self, RootSet};
use super::sandbox::{LiveOutputSink, Sandbox, Task};
use super::sessions::{ClientId, Sessions};
use super::whole_output;
use super::EngineError;
use crate::config::{glob_matches, Config, NetworkPolicy};

/// The largest code (or shell command) accepted for one execution.
pub const MAX_CODE_BYTES: usize = 8 << 20;

pub use super::progress::ProgressSink;

/// Per-call options that override the configuration.
#[derive(Clone, Default)]
pub struct RunOptions {
    pub timeout: Option<Duration>,
    /// Another image than the configured one; it must be allowed.
    pub image: Option<String>,
    /// Fires to interrupt the execution (an MCP `notifications/cancelled`).
    pub cancel: Option<CancellationToken>,
    pub progress: Option<ProgressSink>,
    /// Receives the code's output while it runs (the result still carries all of it). `None`
    /// costs nothing: the runner is not asked for it.
    pub live_output: Option<LiveOutputSink>,
    /// PyPI requirements to make importable first (PEP 508 strings, validated here).
    pub dependencies: Vec<String>,
    /// The result's reader (a model) sees only `SANDBOX_MODEL_OUTPUT` characters of output: when
    /// there is more, keep the whole where it can be read ([`whole_output`]).
    pub keep_whole_output: bool,
    /// Asks the user about hosts that need consent (`SANDBOX_EGRESS_ASK`), for a session this call
    /// creates: the MCP client's elicitation.
    pub consent: Option<Arc<dyn super::egress::ConsentAsker>>,
    /// The caller's own directory under `SANDBOX_FILES_DIR` (a principal's, see
    /// [`super::files_dir::owner_dir_name`]); `None`: runs are saved at its top.
    pub files_owner: Option<String>,
    /// Who the call comes from, for recycling (`SANDBOX_RECYCLE`): a run's sandbox serves only
    /// runs with the same key (a principal, an MCP session, the stdio client); `None`: never
    /// recycled.
    pub reuse: Option<String>,
    /// The server's own work ahead of demand (the pool, prepared sandboxes): it never waits for
    /// a share of the capacity, and starts only when one is free.
    pub background: bool,
    /// The client's MCP roots to mount into a sandbox this call starts (`SANDBOX_ROOTS`); a
    /// session keeps those it started with.
    pub roots: Option<Arc<RootSet>>,
    /// The secrets the egress adds to the requests of a sandbox this call starts (a principal's
    /// own set over HTTP); `None`: the server's (`SANDBOX_SECRETS_FILE`).
    pub secrets: Option<Arc<crate::config::secrets::Secrets>>,
}

impl RunOptions {
    /// Where a run's files are saved under `SANDBOX_FILES_DIR`: `run` in the caller's directory.
    pub(crate) fn run_dir(&self, run: String) -> String {
        match &self.files_owner {
            Some(owner) => format!("{owner}/{run}"),
            None => run,
        }
    }

    /// Whether a sandbox of this call needs secrets other than the server's: then no sandbox
    /// the server started ahead (the pool, prepared ones) serves it.
    pub(crate) fn own_secrets(&self, server: &Arc<crate::config::secrets::Secrets>) -> bool {
        self.secrets
            .as_ref()
            .is_some_and(|own| !Arc::ptr_eq(own, server) && own.as_ref() != server.as_ref())
    }

    /// The roots a sandbox of this call mounts, when there are any.
    pub(crate) fn mounted_roots(&self) -> Option<&Arc<RootSet>> {
        self.roots.as_ref().filter(|roots| !roots.is_empty())
    }

    /// Who may be served a sandbox this call's run leaves: the caller, with the same roots
    /// mounted (a sandbox's mounts are its own for good).
    pub(crate) fn reuse_key(&self) -> Option<String> {
        let key = self.reuse.as_deref()?;
        Some(match self.mounted_roots() {
            Some(roots) => format!("{key}\u{0}roots\u{0}{}", roots.key()),
            None => key.to_string(),
        })
    }

    fn report(&self, message: &str) {
        if let Some(progress) = &self.progress {
            progress(message);
        }
    }
}

/// The engine: applies the configuration to every request, runs code in sandboxes and sessions,
/// and removes everything it made at shutdown.
pub struct Engine {
    backend: Arc<dyn Backend>,
    config: Config,
    owner: Owner,
    sessions: std::sync::Mutex<Sessions>,
    executions: Semaphore,
    deps: Dependencies,
    pool: Arc<Pool>,
    /// Sandboxes runs used, emptied, waiting for their caller's next run.
    recycled: Arc<Recycled<Sandbox>>,
    /// The bounds on live sandboxes and starts, set once the engine first answers.
    admission: tokio::sync::OnceCell<Arc<Admission>>,
    /// Starts tried again after a passing failure.
    start_retries: AtomicU64,
    /// Sandbox removals running after their result was returned.
    background: tokio_util::task::TaskTracker,
    /// Set once the server has looked for its own container (see `identified`).
    identified: tokio::sync::OnceCell<()>,
    /// The engine's description and the runtimes chosen from it (or why no sandbox may start),
    /// decided once the engine first answers (see `engine::platform`).
    platform: tokio::sync::OnceCell<Result<Arc<Platform>, Refusal>>,
    /// The pool's refill task, awaited at shutdown so no sandbox is left half-started.
    pool_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Sandboxes prepared per dependency set, the task preparing them, and its wake-up.
    prepared: Prepared<prepared::PreparedSandbox>,
    /// The mounts of each client's roots the pool prepares for, under their set's key
    /// ([`RootSet::digest`]); pruned to the sets the pool still knows.
    prepared_roots: std::sync::Mutex<HashMap<String, Arc<RootSet>>>,
    /// The roots of every sandbox that serves code (see [`Engine::claim_roots`]).
    live_roots: std::sync::Mutex<Vec<std::sync::Weak<roots::Mounted>>>,
    prepared_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    prepared_wake: Arc<tokio::sync::Notify>,
    /// A preparation ended (kept, refused or failed): a call waiting for one looks again.
    prepared_done: tokio::sync::Notify,
    /// The retention of saved files (`None` when nothing is saved).
    retention: Option<Arc<Retention>>,
    /// Where session snapshots are kept (`None` when they are off).
    snapshots: Option<super::snapshots::SnapshotStore>,
    /// The egress proxy, once started (see `engine::egress`).
    egress: tokio::sync::Mutex<Option<Arc<Gateway>>>,
    /// Cancelled at shutdown: what the engine does in the background for itself (the pool's
    /// starts, the runner's IPython installed at start-up) stops.
    closing: CancellationToken,
    /// The CPU time principals' sessions used outside calls, measured and not yet taken for
    /// their quotas (see `engine::sessions::CpuAccount`).
    cpu_between_calls: Arc<std::sync::Mutex<HashMap<ClientId, Duration>>>,
    /// What a client's roots may never be (see `engine::roots`).
    protected: roots::Protected,
}

/// Removes a sandbox and logs how long it took since `started` (`destroy_ms`).
async fn remove(sandbox: Sandbox, started: Instant) {
    let id = sandbox.id().clone();
    sandbox.destroy().await;
    tracing::debug!(sandbox = %id, destroy_ms = started.elapsed().as_millis() as u64, "sandbox removed");
}

impl Engine {
    pub fn new(backend: Arc<dyn Backend>, config: Config) -> Engine {
        let executions = Semaphore::new(config.max_concurrent.max(1));
        let deps = installer::Dependencies::new(&config);
        let plain_cap = pool::plain_cap(config.pool_size, config.pool_max_memory);
        Engine {
            deps,
            pool: Arc::new(Pool::new(config.pool_size, plain_cap)),
            recycled: Arc::new(Recycled::default()),
            admission: tokio::sync::OnceCell::new(),
            start_retries: AtomicU64::new(0),
            background: tokio_util::task::TaskTracker::new(),
            identified: tokio::sync::OnceCell::new(),
            platform: tokio::sync::OnceCell::new(),
            pool_task: std::sync::Mutex::new(None),
            // The plain pool's share of the bound, grown to its cap, is set aside; the rest is
            // the prepared ones'.
            prepared: Prepared::new(
                config
                    .pool_max_memory
                    .saturating_sub(plain_cap as u64 * prepared::PLAIN_ESTIMATE),
            ),
            prepared_roots: Default::default(),
            live_roots: Default::default(),
            prepared_task: std::sync::Mutex::new(None),
            prepared_wake: Arc::new(tokio::sync::Notify::new()),
            prepared_done: tokio::sync::Notify::new(),
            retention: files_dir::Retention::new(&config.files),
            snapshots: super::snapshots::SnapshotStore::new(&config.snapshots),
            egress: tokio::sync::Mutex::new(None),
            closing: CancellationToken::new(),
            cpu_between_calls: Arc::default(),
            protected: roots::Protected::of(&config),
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

    /// What a client's listing of roots comes to under the operator's policy. `map`: over
    /// HTTP, the mapping of the client's principal (its paths are another machine's); `None`
    /// over stdio. What live sandboxes write is judged when a sandbox is about to serve code
    /// with these roots ([`Engine::claim_roots`]): a listing outlives the sandboxes of its time.
    pub fn resolve_roots(
        &self,
        listed: &[roots::Listed],
        map: Option<&[crate::config::RootMapping]>,
    ) -> Arc<RootSet> {
        Arc::new(RootSet::resolve(
            listed,
            &self.config.roots,
            &self.protected,
            roots::Context {
                map,
                writable: &self.operator_writable(),
            },
        ))
    }

    /// The writable `SANDBOX_MOUNTS`: every sandbox can write them.
    fn operator_writable(&self) -> Vec<PathBuf> {
        self.config
            .mounts
            .iter()
            .filter(|m| !m.read_only)
            .map(|m| m.host.clone())
            .collect()
    }

    /// What live sandboxes can write now: the writable roots of those that serve code, and the
    /// writable `SANDBOX_MOUNTS` (forgets the sandboxes that went).
    fn written_now(&self, live: &mut Vec<std::sync::Weak<roots::Mounted>>) -> Vec<PathBuf> {
        live.retain(|mounted| mounted.strong_count() > 0);
        let mut writable: Vec<PathBuf> = live
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .flat_map(|mounted| {
                let dirs: Vec<PathBuf> =
                    mounted.set.writable_dirs().map(Path::to_path_buf).collect();
                dirs
            })
            .collect();
        writable.extend(self.operator_writable());
        writable
    }

    /// A sandbox with `mounted` is about to serve code: its roots must stay apart from what
    /// other live sandboxes can write (judged under one lock, so two claims cannot nest in
    /// each other), and from then on what it can write counts too.
    pub(super) fn claim_roots(&self, mounted: &Arc<roots::Mounted>) -> Result<(), EngineError> {
        let mut live = self.live_roots.lock().unwrap_or_else(|p| p.into_inner());
        if live
            .iter()
            .any(|other| std::ptr::eq(other.as_ptr(), Arc::as_ptr(mounted)))
        {
            return Ok(());
        }
        let writable = self.written_now(&mut live);
        mounted
            .set
            .apart_from(&writable)
            .map_err(EngineError::RootChanged)?;
        live.push(Arc::downgrade(mounted));
        Ok(())
    }

    /// A code sandbox's spec with the call's roots mounted: checked again first (each must still
    /// be the directory it was when listed, and is again before each create of its container).
    /// Mounted, the code runs as the server's user (unless that is root, which only read-only
    /// roots allow; see `config::validate`), so it reads what the user can and what it writes
    /// to a writable root is theirs. The caller claims the roots ([`Engine::claim_roots`])
    /// before code runs there.
    fn with_roots(spec: &SandboxSpec, roots: &Arc<RootSet>) -> Result<SandboxSpec, EngineError> {
        roots.recheck().map_err(EngineError::RootChanged)?;
        let mut spec = spec.clone();
        spec.mounts.extend(roots.mounts());
        spec.roots = Some(Arc::new(roots::Mounted { set: roots.clone() }));
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if uid != 0 {
            spec.user = Some((uid, gid));
        }
        if let Some(names) = roots.writable_names() {
            spec.env.push(format!("{}={names}", roots::WRITABLE_ENV));
        }
        Ok(spec)
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

    /// The egress proxy, started on first use (at start-up with `SANDBOX_NETWORK=allowlist`, by
    /// the first install otherwise); a failed start is tried again by the next caller.
    pub(crate) async fn gateway(&self) -> Result<Arc<Gateway>, EngineError> {
        let mut egress = self.egress.lock().await;
        if let Some(gateway) = egress.as_ref() {
            return Ok(gateway.clone());
        }
        // An engine refused for sandboxes gets no proxy either.
        self.platform().await?;
        self.identified().await;
        let base = self.plain_spec(self.config.image.clone(), "egress");
        self.backend.ensure_image(&base.image).await?;
        // The proxy's own image, made here on first use like the sandbox image (a newcomer's
        // first install comes before any `image build`).
        self.backend
            .ensure_image(crate::engine::egress::PROXY_IMAGE)
            .await?;
        let gateway = Gateway::start(self.backend.clone(), &base, &self.config).await?;
        tracing::info!(uplink = %self.config.egress.uplink, "egress proxy started");
        *egress = Some(gateway.clone());
        Ok(gateway)
    }

    /// Starts the egress proxy now when the code's sandboxes need it (`SANDBOX_NETWORK=allowlist`),
    /// so that a proxy that cannot start stops the server at start-up.
    pub async fn start_egress(&self) -> Result<(), EngineError> {
        if self.config.network == NetworkPolicy::Allowlist {
            self.gateway().await?;
        }
        Ok(())
    }

    /// Removes the egress proxy and its network (at shutdown, after the sandboxes on it; tests
    /// too). A later sandbox that needs it starts it again.
    pub async fn stop_egress(&self) {
        if let Some(gateway) = self.egress.lock().await.take() {
            gateway.stop().await;
        }
    }

    /// What every sandbox of this server is made from. Waits, once, for the server to find its
    /// own container, so every sandbox's labels name it (see [`Engine::remove_leftovers`]).
    pub(crate) async fn base_spec(
        &self,
        image: String,
        kind: &str,
    ) -> Result<SandboxSpec, EngineError> {
        let platform = self.platform().await?;
        self.identified().await;
        let mut spec = self.plain_spec(image, kind);
        spec.runtime = platform.code.name.clone();
        Ok(spec)
    }

    /// The engine as described by itself, and the runtimes chosen for it; an engine that cannot
    /// enforce the configured isolation is refused here, before any sandbox starts. Asked again
    /// while the engine does not answer.
    pub async fn platform(&self) -> Result<Arc<Platform>, EngineError> {
        let decided = self
            .platform
            .get_or_try_init(|| async {
                let engine = self.backend.info().await?;
                let mut decided = platform::decide(&self.config, engine).map(Arc::new);
                if decided.is_ok() {
                    match self.check_engine_paths().await {
                        Ok(()) => {}
                        Err(EngineError::Refused(refusal)) => decided = Err(refusal),
                        Err(e) => return Err(e),
                    }
                }
                if decided.is_ok() {
                    tracing::info!(
                        "CA bundle of the containers that reach a package index: {}",
                        self.config.ca_bundle_summary()
                    );
                    if let Some(secrets) = self.config.secrets_summary() {
                        tracing::info!("secrets brokered at the egress: {secrets}");
                    }
                }
                match &decided {
                    Ok(platform) => tracing::info!(
                        engine = %platform.engine.name,
                        endpoint = %platform.engine.endpoint,
                        remote = platform.engine.remote,
                        rootless = platform.engine.rootless,
                        runtime = %platform.code.label(&platform.engine),
                        why = %platform.code.why,
                        "the agent's code runs under {}",
                        platform.code.label(&platform.engine)
                    ),
                    Err(refusal) => tracing::error!("{refusal}"),
                }
                if let Ok(platform) = &decided {
                    if platform.installer != platform.code {
                        tracing::info!(
                            runtime = %platform.installer.label(&platform.engine),
                            why = %platform.installer.why,
                            "installers run under {}",
                            platform.installer.label(&platform.engine)
                        );
                    }
                }
                Ok::<_, EngineError>(decided)
            })
            .await?;
        decided.clone().map_err(EngineError::from)
    }

    /// Puts a sandbox spec on an egress network of its own (started with the proxy if need
    /// be): the proxy's environment, and the attachment to launch it with.
    async fn on_egress(
        &self,
        spec: &mut SandboxSpec,
        role: Role,
        secrets: Option<&Arc<crate::config::secrets::Secrets>>,
    ) -> Result<Attachment, EngineError> {
        let gateway = self.gateway().await?;
        let network = gateway.open().await?;
        spec.network_name = Some(network.name.clone());
        spec.env
            .extend(super::egress::proxy_env(&network.proxy_address));
        // The code's secrets: a placeholder of its own in each variable (the proxy adds the
        // value on the way out), and the proxy's CA among those it trusts.
        let secrets = match role {
            Role::Code(_) => secrets.unwrap_or(&self.config.secrets).clone(),
            Role::Installer => Arc::default(),
        };
        if !secrets.is_empty() {
            spec.env.extend(super::egress::placeholders(&secrets));
            if let Some(bundle) = gateway.trust_bundle() {
                spec.ca_bundle = Some(bundle);
            }
        }
        Ok(Attachment {
            gateway,
            network,
            role,
            secrets,
        })
    }

    /// Starts a sandbox on the egress (see [`Engine::on_egress`]); its network is removed when
    /// the sandbox is, or now if it does not start.
    pub(crate) async fn launch_on_egress(
        &self,
        spec: &SandboxSpec,
        role: Role,
        secrets: Option<&Arc<crate::config::secrets::Secrets>>,
    ) -> Result<Sandbox, EngineError> {
        let mut spec = spec.clone();
        let attachment = self.on_egress(&mut spec, role, secrets).await?;
        let (gateway, network) = (attachment.gateway.clone(), attachment.network.clone());
        let launched =
            Sandbox::launch_attached(self.backend.clone(), &spec, Some(attachment)).await;
        if launched.is_err() {
            gateway.close(&network).await;
        }
        launched
    }

    /// Starts a sandbox for the agent's code from a [`Engine::base_spec`] (its image ensured):
    /// its runner's IPython found or installed first and named in its environment (see
    /// [`Engine::code_spec`]); with `SANDBOX_NETWORK=allowlist` on an egress network of its own,
    /// adopted there as code.
    ///
    /// Every such sandbox holds a share of the server's capacity (see `engine::admission`): a
    /// call waits for one in turn, for its time limit and at least `Config::admission_wait`;
    /// the server's own work takes one only when it is free. A start that fails for a passing reason is tried once more on a new sandbox.
    pub(crate) async fn launch_code_sandbox(
        &self,
        spec: &SandboxSpec,
        options: &RunOptions,
    ) -> Result<Sandbox, EngineError> {
        let admission = self.admission().await?;
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        let deadline = Instant::now() + timeout.max(self.config.admission_wait);
        let mut failed: Option<EngineError> = None;
        loop {
            let (admitted, starting) = if options.background {
                admission
                    .try_admit()
                    .ok_or(EngineError::AtCapacity(admission::Refusal::Busy))?
            } else {
                if admission.wanted() || admission.live() >= admission.capacity().sandboxes {
                    self.give_up_idle();
                }
                admission.admit(deadline).await?
            };
            let launched = self.launch_code_sandbox_once(spec, options).await;
            drop(starting);
            match launched {
                Ok(mut sandbox) => {
                    sandbox.admit(admitted);
                    return Ok(sandbox);
                }
                Err(e)
                    if failed.is_none()
                        && e.is_transient_start()
                        && !self.closing.is_cancelled() =>
                {
                    tracing::warn!(
                        "a sandbox failed to start ({e}); trying once more on a new one"
                    );
                    self.start_retries.fetch_add(1, Ordering::SeqCst);
                    failed = Some(e);
                }
                Err(e) if failed.is_some() && e.is_transient_start() => {
                    return Err(EngineError::StartFailedTwice(Box::new(e)))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The bounds of this server, computed once the engine has described its host.
    pub(crate) async fn admission(&self) -> Result<Arc<Admission>, EngineError> {
        let platform = self.platform().await?;
        Ok(self
            .admission
            .get_or_init(|| async {
                let engine = &platform.engine;
                let host = admission::Host {
                    memory_bytes: engine.memory_bytes,
                    cpus: engine.cpus,
                    tasks: (!engine.remote)
                        .then(admission::Host::local_tasks)
                        .flatten(),
                };
                let cost = admission::Cost::of(
                    self.config.limits.memory_bytes,
                    self.config.limits.pids,
                    platform.code.name.as_deref(),
                );
                let capacity = admission::Capacity::of(&host, &cost, self.config.max_sandboxes);
                tracing::info!(
                    sandboxes = capacity.sandboxes,
                    starts = capacity.starts,
                    why = %capacity.why,
                    "at most {} sandboxes at once, {} starting at once",
                    capacity.sandboxes,
                    capacity.starts
                );
                Arc::new(Admission::new(capacity))
            })
            .await
            .clone())
    }

    /// The admission's state for `/metrics` and `doctor`, once the engine has answered.
    pub fn admission_state(&self) -> Option<admission::State> {
        let admission = self.admission.get()?;
        Some(admission::State {
            live: admission.live(),
            limit: admission.capacity().sandboxes,
            waiting: admission.waiting(),
            refused: admission.refused(),
            retried: self.start_retries.load(Ordering::SeqCst),
            recycled: self.recycled.len(),
        })
    }

    async fn launch_code_sandbox_once(
        &self,
        spec: &SandboxSpec,
        options: &RunOptions,
    ) -> Result<Sandbox, EngineError> {
        let (spec, key) = self.code_spec(spec, options).await?;
        let launched = if self.config.network == NetworkPolicy::Allowlist {
            self.launch_on_egress(&spec, Role::Code(None), options.secrets.as_ref())
                .await
        } else {
            Sandbox::launch(self.backend.clone(), &spec).await
        };
        if let (Err(EngineError::RunnerIpython(_)), Some(key)) = (&launched, &key) {
            // The set may be gone from the cache (pruned meanwhile): looked up again next time.
            self.deps.set_verified(key, None);
        }
        launched
    }

    /// The options of what the engine starts for itself in the background: cancelled at
    /// shutdown.
    pub(crate) fn background_options(&self) -> RunOptions {
        RunOptions {
            cancel: Some(self.closing.child_token()),
            background: true,
            ..RunOptions::default()
        }
    }

    fn plain_spec(&self, image: String, kind: &str) -> SandboxSpec {
        SandboxSpec {
            image,
            limits: self.config.limits.clone(),
            network: self.config.network,
            ca_bundle: self.config.ca_bundle.clone(),
            mounts: self.config.mounts.clone(),
            volumes: installer::sandbox_volumes(&self.config),
            // Chosen by `base_spec` from what the engine has (see `engine::platform`).
            runtime: None,
            command: protocol::bootstrap_command(),
            labels: self.owner.labels(kind),
            network_name: None,
            env: Vec::new(),
            maintenance: false,
            open_files: None,
            user: None,
            roots: None,
            no_forwarding: false,
        }
    }

    /// A sandbox for a request, with its dependencies on `sys.path`: from the warm pool when the
    /// request uses the default image, else started now. An ephemeral run's pooled sandbox is
    /// checked by its execution ([`Sandbox::check_on_first_execution`]).
    async fn launch(
        &self,
        kind: &str,
        options: &RunOptions,
        requirements: &[deps::Requirement],
    ) -> Result<(Sandbox, Option<DependencyReport>), EngineError> {
        let image = self.check_image(options.image.as_deref())?;
        let spec = self.base_spec(image, kind).await?;
        // A call with roots is served a sandbox prepared for exactly its roots, the one its
        // caller's last run with the same roots left, or one it starts: the pools have none.
        let roots = options.mounted_roots();
        // A principal's own secrets: its sandbox holds their placeholders, started for it.
        let ahead = !options.own_secrets(&self.config.secrets);
        if roots.is_none() && ahead {
            if let Some((sandbox, report)) = self.take_prepared(&spec, requirements).await {
                return Ok((sandbox, Some(report)));
            }
        }
        let execute_next = kind == "ephemeral" && requirements.is_empty();
        if execute_next && spec.image == self.config.image {
            // One kept, else the caller's last one once its recycle under way is done: before
            // the pool, whose sandbox would cost a start to replace (a recycle is several times
            // cheaper, and a caller's next call often comes before its last one is recycled).
            if let Some(mut sandbox) = self.await_recycled(options).await {
                // It may have died while it waited: checked on the way, like a pooled one.
                sandbox.check_on_first_execution();
                return Ok((sandbox, None));
            }
        }
        let pooled = match roots {
            _ if !ahead => None,
            None => self.take_pooled(&spec.image, execute_next).await,
            Some(roots) if requirements.is_empty() => self.take_prepared_roots(&spec, roots).await,
            Some(_) => None,
        };
        let mut sandbox = match pooled {
            Some(sandbox) => sandbox,
            None => {
                let code_spec = match roots {
                    Some(roots) => Self::with_roots(&spec, roots)?,
                    None => spec.clone(),
                };
                if let Some(mounted) = &code_spec.roots {
                    self.claim_roots(mounted)?;
                }
                options.report(&format!("preparing image {}", spec.image));
                self.backend.ensure_image(&spec.image).await?;
                options.report("starting the sandbox");
                self.launch_code_sandbox(&code_spec, options).await?
            }
        };
        if requirements.is_empty() {
            return Ok((sandbox, None));
        }
        match self
            .prepare_dependencies(&mut sandbox, &spec, requirements, None, options)
            .await
        {
            Ok(report) => {
                if spec.image == self.config.image {
                    self.learn_set(&report);
                }
                Ok((sandbox, Some(report)))
            }
            Err(e) => {
                self.retire(sandbox);
                Err(e)
            }
        }
    }

    /// Removes a sandbox in the background; `shutdown` waits for these removals.
    pub(crate) fn retire(&self, sandbox: Sandbox) {
        self.background.spawn(remove(sandbox, Instant::now()));
    }

    /// Validates a request's dependencies (before anything starts).
    fn requirements(&self, entries: &[String]) -> Result<Vec<deps::Requirement>, EngineError> {
        Ok(deps::parse_requirements(
            entries,
            self.config.deps.allow_urls,
        )?)
    }

    /// How many installers this engine started (a counter for operators and tests: a cached
    /// request starts none, concurrent equal requests start one).
    pub fn installs_started(&self) -> u64 {
        self.deps.installs_started()
    }

    fn check_task(task: Task<'_>) -> Result<(), EngineError> {
        let size = match task {
            Task::Python(code) | Task::Script(code) => code.len(),
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

    /// One execution with the configured limits and the call's overrides.
    async fn execute_in(
        &self,
        sandbox: &mut Sandbox,
        task: Task<'_>,
        options: &RunOptions,
        pip: Option<&dyn super::pip::PipHandler>,
    ) -> Result<Execution, EngineError> {
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        let mut result = sandbox
            .execute_live(
                task,
                timeout,
                self.config.limits.max_output_bytes,
                options.cancel.as_ref(),
                options.live_output.as_ref(),
                pip,
            )
            .await;
        if let (Ok(execution), Some(lease)) = (&mut result, sandbox.egress()) {
            execution.network = Some(lease.record().await);
        }
        result
    }

    /// Copies out, saves and selects the files an execution made; names those it wrote in the
    /// client's writable `roots` (the sandbox's).
    async fn collect_files(
        &self,
        sandbox: &mut Sandbox,
        execution: &mut Execution,
        run_dir: &str,
        roots: Option<&RootSet>,
    ) {
        let mut changes = std::mem::take(&mut execution.changes);
        let in_roots = artifacts::in_roots(&changes, roots);
        changes.roots.clear();
        if changes.entries.is_empty()
            && changes.figures.is_empty()
            && !changes.truncated
            && changes.left_out == 0
        {
            execution.files = in_roots;
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
        execution.files.extend(in_roots);
    }

    /// Keeps the whole output of an execution whose reader sees only part of it: on the host, and
    /// in the workspace of a session's `sandbox`.
    async fn keep_whole_output(
        &self,
        sandbox: Option<&mut Sandbox>,
        execution: &mut Execution,
        run_dir: &str,
        options: &RunOptions,
    ) {
        let budget = self.config.limits.model_output_chars;
        if !options.keep_whole_output
            || !whole_output::is_cut(&execution.stdout, &execution.stderr, budget)
        {
            return;
        }
        let kept = whole_output::keep(
            sandbox,
            &execution.stdout,
            &execution.stderr,
            &self.config.files,
            artifacts::Destination {
                run_dir,
                retention: self.retention.as_deref(),
            },
        )
        .await;
        execution.whole_output = Some(kept);
    }

    /// Waits until sandboxes removed in the background are gone (the CLI does before it exits).
    pub async fn settle(&self) {
        self.background.close();
        self.background.wait().await;
        self.background.reopen();
    }

    /// Round trips to the runner of a fresh sandbox (the benchmark's floor for a session call).
    #[cfg(feature = "bench")]
    pub async fn runner_round_trips(&self, count: usize) -> Result<Vec<Duration>, EngineError> {
        let spec = self
            .base_spec(self.config.image.clone(), "ephemeral")
            .await?;
        self.backend.ensure_image(&spec.image).await?;
        let mut sandbox = self
            .launch_code_sandbox(&spec, &RunOptions::default())
            .await?;
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
}
