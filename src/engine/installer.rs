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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::backend::{paths, SandboxSpec, VolumeMount};
use super::deps::{self, IndexConfig, Installer, Requirement};
use crate::config::{Config, DownloadCache, NetworkPolicy, OperatorMount};

/// Where the installer's staging volume is mounted (and where maintenance reads it).
pub(super) const STAGE: &str = "/opt/stage";

/// Runs in the installer sandbox; reads its arguments (see [`installer_arguments`]) from the
/// environment variable [`INSTALL_ARGUMENTS_VAR`].
pub(super) const INSTALL_SCRIPT: &str = include_str!("python/installer.py");

/// Runs in a preparer sandbox after an install (see [`preparer_spec`]): the import-time work every
/// fresh process would repeat (bytecode, matplotlib's font cache), done once and published with
/// the set.
pub(super) const PREPARE_SCRIPT: &str = include_str!("python/prepare_set.py");

/// What sets are published as: part of their cache key, so that a set published before the
/// server prepared sets (no bytecode, no font cache) is never taken for a prepared one.
pub(super) const SET_LAYOUT: &str = "auto+prepared-v1";

/// Carries the installer's arguments: a JSON document, data the script decodes, never source.
const INSTALL_ARGUMENTS_VAR: &str = "PCS_INSTALLER_ARGUMENTS";

/// pip's verbose log, in the installer's build directory.
const PIP_LOG: &str = "pcs-pip.log";

/// Runs in a maintenance sandbox (root, no network): the only code that writes the cache volume.
/// Its operation (see `python/cache_maintenance.py`) arrives as a JSON document in the
/// environment variable [`MAINTENANCE_OPERATION_VAR`].
pub(super) const MAINTENANCE_SCRIPT: &str = include_str!("python/cache_maintenance.py");

/// Carries the maintenance operation: a JSON document, data the script decodes, never source.
const MAINTENANCE_OPERATION_VAR: &str = "PCS_MAINTENANCE_OPERATION";

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
pub(super) struct UsageIndex {
    pub(super) sets: BTreeMap<String, CachedSet>,
}

/// Serializes installs per key, counts installer launches, and keeps the cache under its cap.
pub struct Dependencies {
    pub(super) locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) installs: AtomicU64,
    /// Installs of the runner's own IPython (see `engine::runner_set`), counted apart.
    pub(super) runner_installs: AtomicU64,
    /// The keys of the runner's sets this process uses: never evicted.
    pub(super) runner_sets: Mutex<std::collections::BTreeSet<String>>,
    pub(super) usage: Mutex<UsageIndex>,
    pub(super) usage_file: PathBuf,
    /// Sets checked against their digest in this process: key -> directory name.
    pub(super) verified: Mutex<HashMap<String, String>>,
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
            runner_installs: AtomicU64::new(0),
            runner_sets: Mutex::default(),
            usage: Mutex::new(usage),
            usage_file,
            verified: Mutex::default(),
        }
    }

    /// How many installers this engine started: a cached request starts none, concurrent equal
    /// requests start one.
    pub fn installs_started(&self) -> u64 {
        self.installs.load(Ordering::Relaxed)
    }

    /// How many installs of the runner's own IPython this engine started.
    pub fn runner_installs_started(&self) -> u64 {
        self.runner_installs.load(Ordering::Relaxed)
    }

    /// Keeps the runner's set of `key` from eviction in this process.
    pub(super) fn keep_runner_set(&self, key: &str) {
        let mut sets = self.runner_sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.insert(key.to_string());
    }

    /// The keys of the runner's sets this process uses.
    pub(super) fn runner_set_keys(&self) -> Vec<String> {
        let sets = self.runner_sets.lock().unwrap_or_else(|p| p.into_inner());
        sets.iter().cloned().collect()
    }

    pub(super) fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    pub(super) fn verified_name(&self, key: &str) -> Option<String> {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified.get(key).cloned()
    }

    pub(super) fn set_verified(&self, key: &str, name: Option<&str>) {
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            Some(name) => verified.insert(key.to_string(), name.to_string()),
            None => verified.remove(key),
        };
    }

    /// The digest this host recorded for `key` when it was published or first verified.
    pub(super) fn recorded_digest(&self, key: &str) -> Option<String> {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        usage
            .sets
            .get(key)
            .map(|s| s.digest.clone())
            .filter(|d| !d.is_empty())
    }

    /// Records what maintenance measured of a set (size, name, digest).
    pub(super) fn record(&self, key: &str, requirements: &[String], measured: &Measured) {
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
    pub(super) fn touch(&self, key: &str) -> u64 {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = usage.sets.get_mut(key) {
            entry.last_used = now();
        }
        let total = usage.sets.values().map(|s| s.size).sum();
        self.save_usage(&usage);
        total
    }

    pub(super) fn save_usage(&self, usage: &UsageIndex) {
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

    pub(super) fn forget(&self, keys: &[String]) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            usage.sets.remove(key);
            self.set_verified(key, None);
        }
        self.save_usage(&usage);
    }

    pub(super) fn usage_snapshot(&self) -> Vec<CachedSet> {
        self.usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sets
            .values()
            .cloned()
            .collect()
    }
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What the maintenance script measured of a published set.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Measured {
    pub(super) name: String,
    pub(super) digest: String,
    pub(super) size: u64,
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
pub(super) fn installer_spec(base: &SandboxSpec, config: &Config, staging: &str) -> SandboxSpec {
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
    // Its network is the egress network, as an installer (set by the engine, which starts it).
    spec.network = NetworkPolicy::Bridge;
    spec.network_name = None;
    spec.env = Vec::new();
    spec.volumes = volumes;
    spec.mounts = mounts;
    spec.user = None;
    spec.maintenance = false;
    spec
}

/// A preparer: the code's own sandbox (its user and limits) with no network, the staging volume
/// read-write and nothing else. Importing a package runs its code, so the download cache, which
/// other installs read, is never mounted here (only the set it prepares can be changed by it, and
/// that set's own packages could ship anything anyway).
pub(super) fn preparer_spec(base: &SandboxSpec, staging: &str) -> SandboxSpec {
    let mut spec = base.clone();
    spec.network = NetworkPolicy::None;
    spec.network_name = None;
    spec.env = Vec::new();
    spec.volumes = vec![VolumeMount {
        name: staging.to_string(),
        target: STAGE.to_string(),
        read_only: false,
        tmpfs_bytes: None,
    }];
    spec.mounts = Vec::new();
    spec.user = None;
    spec.env = Vec::new();
    spec.maintenance = false;
    spec
}

/// A maintenance sandbox: no network, the cache volume read-write, a staging volume read-only.
pub(super) fn maintenance_spec(
    base: &SandboxSpec,
    config: &Config,
    staging: Option<&str>,
) -> SandboxSpec {
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
    spec.network_name = None;
    spec.env = Vec::new();
    spec.volumes = volumes;
    spec.mounts = Vec::new();
    spec.roots = None;
    spec.maintenance = true;
    // Only the project's own scripts run here: the engine's default runtime, which can change
    // any file's owner on the volume whatever the code's runtime is.
    spec.runtime = None;
    spec
}

/// Whether the installer downloads through the shared cache.
pub(super) fn uses_download_cache(config: &Config) -> bool {
    !config.deps.allow_source_builds && config.deps.download_cache != DownloadCache::Off
}

/// What an installer installs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Install<'a> {
    /// A request's validated requirements: each its own argv element, after `--`.
    Requirements(&'a [Requirement]),
    /// A lock file's text (every entry pinned with its hashes: the runner's own set). It travels
    /// in the arguments' JSON document; the script writes it to [`LOCK_FILE`] in its build
    /// directory, and the installer reads it from there with `--require-hashes --no-deps`.
    Lock(&'a str),
}

/// Where the installer's script writes a lock file it was given (in its build directory).
const LOCK_FILE: &str = "pcs-lock.txt";

/// The installer's arguments, as the environment entry its script reads: where to stage, and
/// uv's and pip's argv (the script picks the one the image has), and a lock file's text when it
/// installs one.
pub(super) fn installer_arguments(
    install: Install<'_>,
    index: &IndexConfig,
    cache: bool,
) -> String {
    let cache_dir = |sub: &str| cache.then(|| format!("{}/{sub}", paths::DOWNLOAD_CACHE));
    let target = format!("{STAGE}/target");
    let build = format!("{STAGE}/build");
    let lock_path = format!("{build}/{LOCK_FILE}");
    let argv = |installer: Installer, cache: Option<String>| match install {
        Install::Requirements(requirements) => {
            deps::installer_argv(requirements, &target, installer, index, cache.as_deref())
        }
        Install::Lock(_) => {
            deps::locked_installer_argv(&lock_path, &target, installer, index, cache.as_deref())
        }
    };
    let uv = argv(Installer::Uv, cache_dir("uv"));
    let pip = argv(Installer::Pip, cache_dir("pip"));
    // pip keeps a verbose log (why it skipped each link, what each index answered): read after a
    // failure, and pip asked again in a dry run when uv failed (uv says less of why).
    let log = format!("{build}/{PIP_LOG}");
    let diagnose = deps::pip_with_options(&pip, &["--dry-run", "--log", &log]);
    let pip = deps::pip_with_options(&pip, &["--log", &log]);
    let lock = match install {
        Install::Lock(text) => serde_json::json!({"path": lock_path, "text": text}),
        Install::Requirements(_) => serde_json::Value::Null,
    };
    let arguments = serde_json::json!({
        "target": target,
        "build": build,
        "uv": uv,
        "pip": pip,
        "diagnose": diagnose,
        "log": log,
        "lock": lock,
    });
    format!("{INSTALL_ARGUMENTS_VAR}={arguments}")
}

/// The maintenance operation `op`, as the environment entry its script reads.
pub(super) fn maintenance_operation(op: &serde_json::Value) -> String {
    format!("{MAINTENANCE_OPERATION_VAR}={op}")
}

/// What verifying a set found.
pub(super) enum Verified {
    Ok(Measured),
    Missing,
    Tampered,
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
        let entry = installer_arguments(
            Install::Requirements(&requirements),
            &IndexConfig::default(),
            true,
        );
        assert!(entry.contains("six==1.16.0"));
        assert!(entry.contains("--only-binary"), "wheels only by default");
        assert!(entry.contains("/opt/pip-cache/pip"));
        let (name, arguments) = decode(&entry);
        assert_eq!(name, INSTALL_ARGUMENTS_VAR);
        assert!(INSTALL_SCRIPT.contains(INSTALL_ARGUMENTS_VAR));
        assert_eq!(arguments["target"], "/opt/stage/target");
        assert_eq!(arguments["build"], "/opt/stage/build");
        assert_eq!(arguments["log"], "/opt/stage/build/pcs-pip.log");
        assert!(arguments["diagnose"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--dry-run"));
        for installer in ["uv", "pip", "diagnose"] {
            let argv = arguments[installer].as_array().unwrap();
            assert_eq!(argv.last().unwrap(), "six==1.16.0");
            assert!(argv.iter().any(|a| a == "/opt/stage/target"), "{argv:?}");
        }
    }

    #[test]
    fn a_lock_travels_as_data_and_is_installed_from_the_build_directory() {
        let lock =
            "a==1 --hash=sha256:00\nb==2 ; python_version < \"3.12\" --hash=sha256:11\n\"); x\n";
        let entry = installer_arguments(Install::Lock(lock), &IndexConfig::default(), false);
        assert!(
            !entry.contains(['\n', '\0']),
            "one environment entry: {entry:?}"
        );
        let (_, arguments) = decode(&entry);
        assert_eq!(arguments["lock"]["text"], lock);
        assert_eq!(arguments["lock"]["path"], "/opt/stage/build/pcs-lock.txt");
        for installer in ["uv", "pip", "diagnose"] {
            let argv: Vec<&str> = arguments[installer]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            assert!(
                argv.ends_with(&[
                    "--require-hashes",
                    "--no-deps",
                    "-r",
                    "/opt/stage/build/pcs-lock.txt"
                ]),
                "{argv:?}"
            );
        }
        // A request's arguments carry no lock.
        let requirements = deps::parse_requirements(&["six".to_string()], false).unwrap();
        let entry = installer_arguments(
            Install::Requirements(&requirements),
            &IndexConfig::default(),
            false,
        );
        assert!(decode(&entry).1["lock"].is_null());
        assert!(INSTALL_SCRIPT.contains("\"lock\""));
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
        let entry = installer_arguments(
            Install::Requirements(std::slice::from_ref(&evil)),
            &IndexConfig::default(),
            false,
        );
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
