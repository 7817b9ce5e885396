//! Installing dependencies outside the code's sandbox, into a shared cache.
//!
//! Nothing a package brings may reach another client, so the cache volume is written only by the
//! project's own maintenance script, never by an installer:
//!
//! - An install runs in its own short-lived sandbox (same image, user and limits, the only one
//!   with a network). It never mounts the cache: it installs into a staging tmpfs volume of its
//!   own (`SANDBOX_DEPS_INSTALL_MAX`, so its writes are bounded while it runs), with pip's
//!   `--only-binary :all:` / uv's `--no-build` unless the operator allows source builds (then
//!   without the shared download cache).
//! - A maintenance sandbox (root with only CHOWN, FOWNER and DAC_OVERRIDE, no network, our script
//!   only) then publishes the staged set: it copies it (regular files, directories and symlinks;
//!   nothing else) into the cache under a random name `s-<32 hex>`, makes it root's and
//!   read-only, measures its size and a SHA-256 digest over every path, type, mode, owner, link
//!   target and content, and records them in a manifest under `.meta/` (root only). The server
//!   keeps the digest too, under its cache directory.
//! - Before a set is first put on a sandbox's `sys.path` in this server process, a maintenance
//!   sandbox recomputes its digest: a set changed after publication is removed, never mounted,
//!   and installed again.
//! - Sandboxes mount the cache read-only. Its root is root's with mode 0711, so a sandbox can
//!   open the sets whose random names it was given, but cannot list the others.
//! - Every maintenance run removes what in the volume is no set (stray files, old layouts,
//!   staging left by a dead publisher). Sizes for eviction and `cache list` are the maintenance
//!   script's own measurement.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::backend::{paths, SandboxSpec, VolumeMount};
use super::deps::{self, IndexConfig, Installer, Requirement};
use super::{EngineError, Task};
use crate::config::{Config, DownloadCache, NetworkPolicy, OperatorMount};

/// Where the installer's staging volume is mounted (and where maintenance reads it).
const STAGE: &str = "/opt/stage";

/// Runs in the installer sandbox; reads its arguments (see [`installer_arguments`]) from the
/// environment variable [`INSTALL_ARGUMENTS_VAR`].
const INSTALL_SCRIPT: &str = include_str!("python/installer.py");

/// Carries the installer's arguments: a JSON document, data the script decodes, never source.
const INSTALL_ARGUMENTS_VAR: &str = "PCS_INSTALLER_ARGUMENTS";

/// Runs in a maintenance sandbox (root, no network): the only code that writes the cache volume.
/// Its operation (see `python/cache_maintenance.py`) arrives as a JSON document in the
/// environment variable [`MAINTENANCE_OPERATION_VAR`].
const MAINTENANCE_SCRIPT: &str = include_str!("python/cache_maintenance.py");

/// Carries the maintenance operation: a JSON document, data the script decodes, never source.
const MAINTENANCE_OPERATION_VAR: &str = "PCS_MAINTENANCE_OPERATION";

/// What a request's dependencies came to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DependencyReport {
    /// Canonical requirements in force for the execution.
    pub requirements: Vec<String>,
    pub key: String,
    /// Where the sandbox sees the set (`/opt/deps/s-<random>`), on its `sys.path`.
    pub path: String,
    /// An installer ran for this request (false: the cache had it).
    pub installed: bool,
}

/// One installed set, as `cache list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedSet {
    pub key: String,
    /// Bytes of its files, as the maintenance script measured them.
    pub size: u64,
    pub requirements: Vec<String>,
    /// Unix seconds of the last use this host recorded (or the install time).
    pub last_used: u64,
    /// The set's directory name in the volume (random).
    #[serde(default)]
    pub name: String,
    /// The digest recorded when it was published (the host's copy, checked before first use).
    #[serde(default)]
    pub digest: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct UsageIndex {
    sets: BTreeMap<String, CachedSet>,
}

/// Serializes installs per key, counts installer launches, and keeps the cache under its cap.
pub struct Dependencies {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    installs: AtomicU64,
    usage: Mutex<UsageIndex>,
    usage_file: PathBuf,
    /// Sets checked against their digest in this process: key -> directory name.
    verified: Mutex<HashMap<String, String>>,
}

impl Dependencies {
    pub fn new(config: &Config) -> Self {
        // One index per cache volume: keys of one volume say nothing about another.
        let usage_file = config
            .cache_dir
            .join(format!("deps-usage-{}.json", config.deps.volume));
        let usage = std::fs::read(&usage_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Dependencies {
            locks: Mutex::default(),
            installs: AtomicU64::new(0),
            usage: Mutex::new(usage),
            usage_file,
            verified: Mutex::default(),
        }
    }

    /// How many installers this engine started (tests assert a cached run starts none).
    pub fn installs_started(&self) -> u64 {
        self.installs.load(Ordering::Relaxed)
    }

    fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    fn verified_name(&self, key: &str) -> Option<String> {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified.get(key).cloned()
    }

    fn set_verified(&self, key: &str, name: Option<&str>) {
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            Some(name) => verified.insert(key.to_string(), name.to_string()),
            None => verified.remove(key),
        };
    }

    /// The digest this host recorded for `key` when it was published or first verified.
    fn recorded_digest(&self, key: &str) -> Option<String> {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        usage
            .sets
            .get(key)
            .map(|s| s.digest.clone())
            .filter(|d| !d.is_empty())
    }

    /// Records what maintenance measured of a set (size, name, digest).
    fn record(&self, key: &str, requirements: &[String], measured: &Measured) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let entry = usage
            .sets
            .entry(key.to_string())
            .or_insert_with(|| CachedSet {
                key: key.to_string(),
                size: 0,
                requirements: requirements.to_vec(),
                last_used: now(),
                name: String::new(),
                digest: String::new(),
            });
        entry.size = measured.size;
        entry.name = measured.name.clone();
        entry.digest = measured.digest.clone();
        self.save_usage(&usage);
    }

    /// Records a use, for least-recently-used eviction; returns the cache's total size.
    fn touch(&self, key: &str) -> u64 {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = usage.sets.get_mut(key) {
            entry.last_used = now();
        }
        let total = usage.sets.values().map(|s| s.size).sum();
        self.save_usage(&usage);
        total
    }

    fn save_usage(&self, usage: &UsageIndex) {
        let Ok(bytes) = serde_json::to_vec_pretty(usage) else {
            return;
        };
        if let Some(dir) = self.usage_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let temp = self
            .usage_file
            .with_extension(format!("tmp-{}", std::process::id()));
        if std::fs::write(&temp, bytes).is_ok() {
            let _ = std::fs::rename(&temp, &self.usage_file);
        }
    }

    fn forget(&self, keys: &[String]) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            usage.sets.remove(key);
            self.set_verified(key, None);
        }
        self.save_usage(&usage);
    }

    fn usage_snapshot(&self) -> Vec<CachedSet> {
        self.usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sets
            .values()
            .cloned()
            .collect()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What the maintenance script measured of a published set.
#[derive(Debug, Clone, Deserialize)]
struct Measured {
    name: String,
    digest: String,
    size: u64,
}

/// The index configuration that goes into keys and installer arguments (never into sandboxes).
pub fn index_config(config: &Config) -> IndexConfig {
    let ca_bundle_digest = config
        .ca_bundle
        .as_ref()
        .and_then(|path| std::fs::read(path).ok())
        .map(|bytes| {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(&bytes);
            digest
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        });
    IndexConfig {
        index_url: config.deps.index_url.clone(),
        extra_index_urls: config.deps.extra_index_urls.clone(),
        ca_bundle_digest,
        allow_source_builds: config.deps.allow_source_builds,
    }
}

/// Volumes every sandbox gets: the dependency cache, read-only (its root lists nothing to them).
pub fn sandbox_volumes(config: &Config) -> Vec<VolumeMount> {
    vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: true,
        tmpfs_bytes: None,
    }]
}

/// An installer: a network, its own staging tmpfs read-write, the download cache only when no
/// package code runs (wheels only), never the cache volume nor the operator's mounts.
fn installer_spec(base: &SandboxSpec, config: &Config, staging: &str) -> SandboxSpec {
    let mut volumes = vec![VolumeMount {
        name: staging.to_string(),
        target: STAGE.to_string(),
        read_only: false,
        tmpfs_bytes: Some(config.deps.install_max_bytes),
    }];
    let mut mounts = Vec::new();
    if !config.deps.allow_source_builds {
        match &config.deps.download_cache {
            DownloadCache::Volume(name) => volumes.push(VolumeMount {
                name: name.clone(),
                target: paths::DOWNLOAD_CACHE.to_string(),
                read_only: false,
                tmpfs_bytes: None,
            }),
            DownloadCache::HostPath(path) => mounts.push(OperatorMount {
                host: path.clone(),
                container: paths::DOWNLOAD_CACHE.to_string(),
                read_only: false,
            }),
            DownloadCache::Off => {}
        }
    }
    let mut spec = base.clone();
    spec.network = NetworkPolicy::Bridge;
    spec.volumes = volumes;
    spec.mounts = mounts;
    spec.maintenance = false;
    spec
}

/// A maintenance sandbox: no network, the cache volume read-write, a staging volume read-only.
fn maintenance_spec(base: &SandboxSpec, config: &Config, staging: Option<&str>) -> SandboxSpec {
    let mut volumes = vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: false,
        tmpfs_bytes: None,
    }];
    if let Some(staging) = staging {
        volumes.push(VolumeMount {
            name: staging.to_string(),
            target: STAGE.to_string(),
            read_only: true,
            tmpfs_bytes: None,
        });
    }
    let mut spec = base.clone();
    spec.network = NetworkPolicy::None;
    spec.volumes = volumes;
    spec.mounts = Vec::new();
    spec.maintenance = true;
    spec
}

/// Whether the installer downloads through the shared cache.
fn uses_download_cache(config: &Config) -> bool {
    !config.deps.allow_source_builds && config.deps.download_cache != DownloadCache::Off
}

/// The installer's arguments, as the environment entry its script reads: where to stage, and
/// uv's and pip's argv (the script picks the one the image has). Each requirement is its own
/// argv element, after `--`.
fn installer_arguments(requirements: &[Requirement], index: &IndexConfig, cache: bool) -> String {
    let cache_dir = |sub: &str| cache.then(|| format!("{}/{sub}", paths::DOWNLOAD_CACHE));
    let target = format!("{STAGE}/target");
    let uv = deps::installer_argv(
        requirements,
        &target,
        Installer::Uv,
        index,
        cache_dir("uv").as_deref(),
    );
    let pip = deps::installer_argv(
        requirements,
        &target,
        Installer::Pip,
        index,
        cache_dir("pip").as_deref(),
    );
    let arguments = serde_json::json!({
        "target": target,
        "build": format!("{STAGE}/build"),
        "uv": uv,
        "pip": pip,
    });
    format!("{INSTALL_ARGUMENTS_VAR}={arguments}")
}

/// The maintenance operation `op`, as the environment entry its script reads.
fn maintenance_operation(op: &serde_json::Value) -> String {
    format!("{MAINTENANCE_OPERATION_VAR}={op}")
}

/// One install's way out: its internal network and the proxy on it.
struct Egress {
    network: String,
    proxy: Option<super::backend::SandboxId>,
    address: String,
}

/// What verifying a set found.
enum Verified {
    Ok(Measured),
    Missing,
    Tampered,
}

impl super::Engine {
    /// Makes `requirements` importable in `sandbox`: finds their set in the cache (checked
    /// against its digest once per process) or installs it (once, whoever else asks at the same
    /// time), then puts it on the runner's `sys.path`. `replaces` is the path of a set the
    /// sandbox used before (a session's previous one).
    pub(crate) async fn prepare_dependencies(
        &self,
        sandbox: &mut super::sandbox::Sandbox,
        base: &SandboxSpec,
        requirements: &[Requirement],
        replaces: Option<&str>,
        options: &super::RunOptions,
    ) -> Result<DependencyReport, EngineError> {
        let image_id = self.backend.image_id(&base.image).await?;
        let index = index_config(&self.config);
        let key = deps::cache_key(&image_id, requirements, &index, "auto");
        let canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
        let mut report = DependencyReport {
            requirements: canonical.clone(),
            key: key.clone(),
            path: String::new(),
            installed: false,
        };
        let path_of = |name: &str| format!("{}/{name}", paths::DEPS);

        if let Some(name) = self.deps.verified_name(&key) {
            if self.use_set(sandbox, &path_of(&name), replaces).await? {
                self.deps.touch(&key);
                report.path = path_of(&name);
                return Ok(report);
            }
            // Gone (evicted by another server): look again under the lock.
            self.deps.set_verified(&key, None);
        }
        let lock = self.deps.lock_for(&key);
        let _installing = lock.lock().await;
        let name = match self.deps.verified_name(&key) {
            Some(name) => name,
            None => match self.verify_set(base, &key).await? {
                Verified::Ok(measured) => {
                    self.deps.record(&key, &canonical, &measured);
                    measured.name
                }
                found => {
                    if matches!(found, Verified::Tampered) {
                        tracing::warn!(
                            key,
                            "a cached dependency set was changed after it was published: \
                             removed, installing it again"
                        );
                        options
                            .report("the cached set was changed after publication; reinstalling");
                    }
                    options.report(&format!("installing {}", canonical.join(" ")));
                    let measured = self
                        .install(base, &key, requirements, &index, options)
                        .await?;
                    report.installed = true;
                    self.deps.record(&key, &canonical, &measured);
                    options.report("dependencies ready");
                    measured.name
                }
            },
        };
        self.deps.set_verified(&key, Some(&name));
        if !self.use_set(sandbox, &path_of(&name), replaces).await? {
            self.deps.set_verified(&key, None);
            return Err(EngineError::Dependencies(
                "the dependencies were installed but the sandbox cannot see them".into(),
            ));
        }
        report.path = path_of(&name);
        let total = self.deps.touch(&key);
        if report.installed && total > self.config.deps.cache_max_bytes {
            self.evict(base, std::slice::from_ref(&key)).await;
        }
        Ok(report)
    }

    /// Puts a set's directory on the sandbox's `sys.path`; false when it does not exist.
    async fn use_set(
        &self,
        sandbox: &mut super::sandbox::Sandbox,
        dir: &str,
        replaces: Option<&str>,
    ) -> Result<bool, EngineError> {
        let remove: Vec<String> = replaces
            .filter(|old| *old != dir)
            .map(|old| vec![old.to_string()])
            .unwrap_or_default();
        Ok(sandbox
            .add_paths(&[dir.to_string()], &remove)
            .await?
            .is_empty())
    }

    /// Recomputes a set's digest in a maintenance sandbox and compares it with the one recorded
    /// at publication (this host's copy when it has one); a changed set is removed.
    async fn verify_set(&self, base: &SandboxSpec, key: &str) -> Result<Verified, EngineError> {
        let op = serde_json::json!({
            "op": "verify",
            "key": key,
            "expected": self.deps.recorded_digest(key),
        });
        let answer = self.run_maintenance(base, None, &op).await?;
        match answer["status"].as_str() {
            Some("ok") => serde_json::from_value(answer)
                .map(Verified::Ok)
                .map_err(|e| EngineError::Dependencies(format!("unreadable verification: {e}"))),
            Some("tampered") => {
                self.deps.forget(&[key.to_string()]);
                Ok(Verified::Tampered)
            }
            _ => Ok(Verified::Missing),
        }
    }

    /// Runs an installer sandbox into a staging volume, then publishes what it staged with a
    /// maintenance sandbox; returns what maintenance measured.
    async fn install(
        &self,
        base: &SandboxSpec,
        key: &str,
        requirements: &[Requirement],
        index: &IndexConfig,
        options: &super::RunOptions,
    ) -> Result<Measured, EngineError> {
        self.deps.installs.fetch_add(1, Ordering::Relaxed);
        let staging = format!("pcs-stage-{}", uuid::Uuid::new_v4().simple());
        let mut spec = installer_spec(base, &self.config, &staging);
        spec.labels = self.owner.labels("installer");
        let arguments = installer_arguments(requirements, index, uses_download_cache(&self.config));
        let outcome = async {
            let egress = self.start_egress(base).await?;
            spec.network_name = Some(egress.network.clone());
            spec.env = super::egress::proxy_env(&egress.address);
            spec.env.push(arguments);
            let outcome = async {
                let mut installer =
                    super::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
                let outcome = installer
                    .execute(
                        Task::Python(INSTALL_SCRIPT),
                        self.config.deps.install_timeout,
                        256 << 10,
                        options.cancel.as_ref(),
                    )
                    .await;
                // The staging tmpfs lives while the installer runs: publish before removing it.
                let published = match outcome {
                    Ok(execution) if execution.succeeded() => {
                        // Stop whatever the install left running before its staging is read.
                        let _ = self.backend.kill_processes(installer.id()).await;
                        let op = serde_json::json!({
                            "op": "publish",
                            "key": key,
                            "requirements": requirements.iter().map(Requirement::canonical).collect::<Vec<_>>(),
                        });
                        self.run_maintenance(base, Some(&staging), &op)
                            .await
                            .map(Ok)
                    }
                    Ok(execution) => Ok(Err(execution)),
                    Err(e) => Err(e),
                };
                installer.destroy().await;
                published
            }
            .await;
            self.stop_egress(egress).await;
            outcome
        }
        .await;
        if let Err(e) = self.backend.remove_volume(&staging).await {
            tracing::warn!("could not remove the staging volume {staging}: {e}");
        }
        match outcome? {
            Ok(answer) if answer["status"] == "exists" => {
                // Another server published it meanwhile: check it like any cached set.
                let lookup = self.verify_set(base, key).await?;
                match lookup {
                    Verified::Ok(measured) => Ok(measured),
                    _ => Err(EngineError::Dependencies(
                        "another server published this set, and it did not verify".into(),
                    )),
                }
            }
            Ok(answer) => serde_json::from_value(answer)
                .map_err(|e| EngineError::Dependencies(format!("unreadable publication: {e}"))),
            Err(execution) => {
                let stdout = String::from_utf8_lossy(&execution.stdout);
                let output = format!("{stdout}\n{}", String::from_utf8_lossy(&execution.stderr));
                tracing::debug!(key, "installer failed:\n{output}");
                let mut why = if execution.timed_out {
                    format!(
                        "the install did not finish within {}",
                        super::sandbox::human(self.config.deps.install_timeout)
                    )
                } else {
                    deps::installer_error_summary(&output)
                };
                if !index.allow_source_builds {
                    if let Some(hint) = deps::wheels_only_hint(&output) {
                        why.push('\n');
                        why.push_str(hint);
                    }
                }
                if output.contains("No space left on device") {
                    why.push_str(&format!(
                        "\nThe install is larger than SANDBOX_DEPS_INSTALL_MAX ({} bytes).",
                        self.config.deps.install_max_bytes
                    ));
                }
                Err(EngineError::Dependencies(why))
            }
        }
    }

    /// Runs `code` in a sandbox with an installer's network (its egress network and proxy, no
    /// cache, no staging): what package code in an install could reach. For tests and `doctor`.
    #[doc(hidden)]
    pub async fn probe_installer_network(
        &self,
        code: &str,
    ) -> Result<super::Execution, EngineError> {
        let base = self.base_spec(self.config.image.clone(), "installer").await;
        self.backend.ensure_image(&base.image).await?;
        let egress = self.start_egress(&base).await?;
        let mut spec = base.clone();
        spec.network = NetworkPolicy::Bridge;
        spec.network_name = Some(egress.network.clone());
        spec.env = super::egress::proxy_env(&egress.address);
        spec.volumes = Vec::new();
        spec.mounts = Vec::new();
        let outcome = async {
            let mut sandbox = super::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
            let outcome = sandbox
                .execute(Task::Python(code), Duration::from_secs(60), 1 << 20, None)
                .await;
            sandbox.destroy().await;
            outcome
        }
        .await;
        self.stop_egress(egress).await;
        outcome
    }

    /// Starts the install's egress: an internal network and the proxy on it (see `egress`).
    async fn start_egress(&self, base: &SandboxSpec) -> Result<Egress, EngineError> {
        let network = format!("pcs-egress-{}", uuid::Uuid::new_v4().simple());
        let labels = self.owner.labels("egress");
        self.backend.create_network(&network, true, &labels).await?;
        let mut spec = base.clone();
        spec.network = NetworkPolicy::Bridge;
        spec.network_name = None;
        spec.volumes = Vec::new();
        spec.mounts = Vec::new();
        spec.maintenance = false;
        spec.labels = labels;
        spec.command = super::egress::proxy_command(&super::egress::policy(&self.config));
        let mut egress = Egress {
            network,
            proxy: None,
            address: String::new(),
        };
        let started = async {
            let id = self.backend.create(&spec).await?;
            egress.proxy = Some(id.clone());
            self.backend.connect_network(&id, &egress.network).await?;
            let mut streams = self.backend.start(&id).await?;
            // Ready once it says so (a dead proxy ends the stream).
            let ready = tokio::time::timeout(Duration::from_secs(30), async {
                use futures_util::StreamExt;
                let mut seen = Vec::new();
                while let Some(Ok(chunk)) = streams.output.next().await {
                    if let super::backend::OutputChunk::Stdout(bytes) = chunk {
                        seen.extend_from_slice(&bytes);
                        if seen.windows(9).any(|w| w == b"listening") {
                            return true;
                        }
                    }
                }
                false
            })
            .await;
            if ready != Ok(true) {
                return Err(EngineError::Dependencies(
                    "the installer's egress proxy did not start".into(),
                ));
            }
            self.backend
                .address_on(&id, &egress.network)
                .await
                .map_err(EngineError::from)
        }
        .await;
        match started {
            Ok(address) => {
                egress.address = address;
                Ok(egress)
            }
            Err(e) => {
                self.stop_egress(egress).await;
                Err(e)
            }
        }
    }

    async fn stop_egress(&self, egress: Egress) {
        if let Some(proxy) = &egress.proxy {
            if let Err(e) = self.backend.destroy(proxy).await {
                tracing::warn!("could not remove the installer's egress proxy: {e}");
            }
        }
        if let Err(e) = self.backend.remove_network(&egress.network).await {
            tracing::warn!("could not remove the network {}: {e}", egress.network);
        }
    }

    /// Runs the maintenance script with `op` (see [`MAINTENANCE_SCRIPT`]); returns its answer.
    async fn run_maintenance(
        &self,
        base: &SandboxSpec,
        staging: Option<&str>,
        op: &serde_json::Value,
    ) -> Result<serde_json::Value, EngineError> {
        let mut spec = maintenance_spec(base, &self.config, staging);
        spec.labels = self.owner.labels("maintenance");
        spec.env.push(maintenance_operation(op));
        let mut sandbox = super::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
        let outcome = sandbox
            .execute(
                Task::Python(MAINTENANCE_SCRIPT),
                Duration::from_secs(600),
                16 << 20,
                None,
            )
            .await;
        sandbox.destroy().await;
        let execution = outcome?;
        if !execution.succeeded() {
            return Err(EngineError::Dependencies(format!(
                "the dependency cache's maintenance failed: {}",
                deps::installer_error_summary(&String::from_utf8_lossy(&execution.stderr))
            )));
        }
        let answer: serde_json::Value = serde_json::from_slice(execution.stdout.trim_ascii())
            .map_err(|e| {
                EngineError::Dependencies(format!("unreadable maintenance answer: {e}"))
            })?;
        if let Some(strays) = answer["strays"].as_array().filter(|s| !s.is_empty()) {
            tracing::info!(
                "removed {} entr(ies) of the dependency cache that were no set",
                strays.len()
            );
        }
        Ok(answer)
    }

    /// Removes least-recently-used sets until the cache fits its cap, never `keep` nor a set a
    /// live session uses.
    async fn evict(&self, base: &SandboxSpec, keep: &[String]) {
        let in_use: HashSet<String> = self
            .sessions_dependency_keys()
            .into_iter()
            .chain(keep.iter().cloned())
            .collect();
        let entries: Vec<deps::CacheEntry> = self
            .deps
            .usage_snapshot()
            .into_iter()
            .map(|s| deps::CacheEntry {
                in_use: in_use.contains(&s.key),
                key: s.key,
                size_bytes: s.size,
                last_used: UNIX_EPOCH + Duration::from_secs(s.last_used),
            })
            .collect();
        let evict = deps::select_evictions(&entries, self.config.deps.cache_max_bytes);
        if evict.is_empty() {
            return;
        }
        tracing::info!(
            "dependency cache over its cap: removing {} set(s)",
            evict.len()
        );
        if let Err(e) = self.maintain(base, &evict).await {
            tracing::warn!("could not evict dependency sets: {e}");
        }
    }

    /// Runs a maintenance sandbox that removes `remove` (and whatever is no set) and lists what
    /// the cache holds.
    async fn maintain(
        &self,
        base: &SandboxSpec,
        remove: &[String],
    ) -> Result<Vec<CachedSet>, EngineError> {
        let op = serde_json::json!({"op": "list", "remove": remove});
        let answer = self.run_maintenance(base, None, &op).await?;
        self.deps.forget(remove);
        #[derive(Deserialize)]
        struct Listed {
            key: String,
            name: String,
            size: u64,
            digest: String,
            requirements: Vec<String>,
            mtime: u64,
        }
        let listed: Vec<Listed> = serde_json::from_value(answer["sets"].clone())
            .map_err(|e| EngineError::Dependencies(format!("unreadable cache listing: {e}")))?;
        let usage = self.deps.usage_snapshot();
        Ok(listed
            .into_iter()
            .map(|l| CachedSet {
                last_used: usage
                    .iter()
                    .find(|u| u.key == l.key)
                    .map_or(l.mtime, |u| u.last_used),
                key: l.key,
                size: l.size,
                requirements: l.requirements,
                name: l.name,
                digest: l.digest,
            })
            .collect())
    }

    /// The installed dependency sets (`cache list`); removes what in the volume is no set.
    pub async fn cached_dependency_sets(&self) -> Result<Vec<CachedSet>, EngineError> {
        let base = self
            .base_spec(self.config.image.clone(), "maintenance")
            .await;
        self.backend.ensure_image(&base.image).await?;
        self.maintain(&base, &[]).await
    }

    /// Removes cached sets: all of them not in use (`all`), or the least recently used beyond
    /// the cap. Returns what was removed.
    pub async fn prune_dependency_sets(&self, all: bool) -> Result<Vec<CachedSet>, EngineError> {
        let sets = self.cached_dependency_sets().await?;
        let in_use: HashSet<String> = self.sessions_dependency_keys().into_iter().collect();
        let remove: Vec<String> = if all {
            sets.iter()
                .filter(|s| !in_use.contains(&s.key))
                .map(|s| s.key.clone())
                .collect()
        } else {
            let entries: Vec<deps::CacheEntry> = sets
                .iter()
                .map(|s| deps::CacheEntry {
                    key: s.key.clone(),
                    size_bytes: s.size,
                    last_used: UNIX_EPOCH + Duration::from_secs(s.last_used),
                    in_use: in_use.contains(&s.key),
                })
                .collect();
            deps::select_evictions(&entries, self.config.deps.cache_max_bytes)
        };
        if !remove.is_empty() {
            let base = self
                .base_spec(self.config.image.clone(), "maintenance")
                .await;
            self.maintain(&base, &remove).await?;
        }
        Ok(sets
            .into_iter()
            .filter(|s| remove.contains(&s.key))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry's variable name and its decoded JSON document.
    fn decode(entry: &str) -> (&str, serde_json::Value) {
        let (name, document) = entry.split_once('=').unwrap();
        (name, serde_json::from_str(document).unwrap())
    }

    #[test]
    fn the_install_script_carries_arguments_as_data() {
        let requirements = deps::parse_requirements(&["six==1.16.0".to_string()], false).unwrap();
        let entry = installer_arguments(&requirements, &IndexConfig::default(), true);
        assert!(entry.contains("six==1.16.0"));
        assert!(entry.contains("--only-binary"), "wheels only by default");
        assert!(entry.contains("/opt/pip-cache/pip"));
        let (name, arguments) = decode(&entry);
        assert_eq!(name, INSTALL_ARGUMENTS_VAR);
        assert!(INSTALL_SCRIPT.contains(INSTALL_ARGUMENTS_VAR));
        assert_eq!(arguments["target"], "/opt/stage/target");
        assert_eq!(arguments["build"], "/opt/stage/build");
        for installer in ["uv", "pip"] {
            let argv = arguments[installer].as_array().unwrap();
            assert_eq!(argv.last().unwrap(), "six==1.16.0");
            assert!(argv.iter().any(|a| a == "/opt/stage/target"), "{argv:?}");
        }
    }

    #[test]
    fn arguments_cannot_break_out_of_the_document() {
        // Requirements are validated before they get here; the transport must not depend on it.
        let evil = Requirement {
            name: "x".into(),
            normalized: "\"); import os; os.system('x') #\n\0=".into(),
            extras: Vec::new(),
            specifier: String::new(),
            url: None,
            marker: None,
        };
        let entry =
            installer_arguments(std::slice::from_ref(&evil), &IndexConfig::default(), false);
        assert!(
            !entry.contains(['\n', '\0']),
            "one environment entry: {entry:?}"
        );
        let (_, arguments) = decode(&entry);
        assert_eq!(
            arguments["pip"].as_array().unwrap().last().unwrap(),
            &evil.canonical()
        );
        let op =
            serde_json::json!({"op": "publish", "key": "k", "requirements": [evil.canonical()]});
        let entry = maintenance_operation(&op);
        let (name, decoded) = decode(&entry);
        assert_eq!(name, MAINTENANCE_OPERATION_VAR);
        assert!(MAINTENANCE_SCRIPT.contains(MAINTENANCE_OPERATION_VAR));
        assert_eq!(decoded, op);
    }
}
