//! Installing dependencies outside the code's sandbox, into a shared cache.
//!
//! An install runs in its own short-lived sandbox: the same image, user and limits, but the only
//! one with a network, and the only one that may write the cache volume. It installs into a
//! private temporary directory and publishes it with one rename as `/opt/deps/<key>`, so no
//! sandbox ever sees half an install; a failure leaves nothing behind. Sandboxes mount the cache
//! read-only and the runner puts `/opt/deps/<key>` first on `sys.path`. The key (see `deps`)
//! covers the image, the requirements and the index configuration, so a repeated request finds
//! its directory and installs nothing.

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

/// Runs in the installer sandbox. Arguments arrive as JSON literals spliced into the source (the
/// code never goes through a shell; each requirement is its own argv element).
const INSTALL_SCRIPT: &str = r#"
import json, os, shutil, subprocess, sys, uuid
KEY = json.loads(__KEY__)
UV_ARGV = json.loads(__UV_ARGV__)
PIP_ARGV = json.loads(__PIP_ARGV__)
REQUIREMENTS = json.loads(__REQUIREMENTS__)
root = "/opt/deps"
final = os.path.join(root, KEY)
if os.path.isdir(final):
    print("already installed")
    raise SystemExit(0)
work = os.path.join(root, ".tmp", KEY + "-" + uuid.uuid4().hex[:12])
target = os.path.join(work, "target")
build = os.path.join(work, "build")
os.makedirs(target)
os.makedirs(build)
try:
    argv = UV_ARGV if shutil.which("uv") else PIP_ARGV
    argv = [target if a == "{TARGET}" else a for a in argv]
    print("installer:", os.path.basename(argv[0]), flush=True)
    env = dict(os.environ, TMPDIR=build, PIP_NO_INPUT="1", UV_LINK_MODE="copy")
    code = subprocess.run(argv, env=env, cwd=build, stdin=subprocess.DEVNULL).returncode
    if code != 0:
        raise SystemExit(code)
    size = 0
    for directory, _, files in os.walk(target):
        for name in files:
            size += os.lstat(os.path.join(directory, name)).st_size
    with open(os.path.join(target, ".sandbox-deps.json"), "w") as f:
        json.dump({"requirements": REQUIREMENTS, "size": size}, f)
    try:
        os.rename(target, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    print(json.dumps({"installed": KEY, "size": size}))
finally:
    shutil.rmtree(work, ignore_errors=True)
"#;

/// Runs in a maintenance sandbox: lists the cache, or removes the given keys.
const MAINTENANCE_SCRIPT: &str = r#"
import json, os, re, shutil
REMOVE = json.loads(__REMOVE__)
root = "/opt/deps"
for key in REMOVE:
    if re.fullmatch(r"d-[0-9a-f]{32}", key):
        shutil.rmtree(os.path.join(root, key), ignore_errors=True)
entries = []
for key in sorted(os.listdir(root)):
    path = os.path.join(root, key)
    if not re.fullmatch(r"d-[0-9a-f]{32}", key) or not os.path.isdir(path):
        continue
    meta = {}
    try:
        with open(os.path.join(path, ".sandbox-deps.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        pass
    entries.append({"key": key, "size": meta.get("size", 0), "requirements": meta.get("requirements", []),
                    "mtime": int(os.stat(path).st_mtime)})
print(json.dumps(entries))
"#;

/// What a request's dependencies came to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DependencyReport {
    /// Canonical requirements in force for the execution.
    pub requirements: Vec<String>,
    pub key: String,
    /// An installer ran for this request (false: the cache had it).
    pub installed: bool,
}

/// One installed set, as `cache list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedSet {
    pub key: String,
    pub size: u64,
    pub requirements: Vec<String>,
    /// Unix seconds of the last use this host recorded (or the install time).
    pub last_used: u64,
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

    /// Records a use, for least-recently-used eviction; best effort.
    fn touch(&self, key: &str, requirements: &[String], size: Option<u64>) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let entry = usage
            .sets
            .entry(key.to_string())
            .or_insert_with(|| CachedSet {
                key: key.to_string(),
                size: 0,
                requirements: requirements.to_vec(),
                last_used: now,
            });
        entry.last_used = now;
        if let Some(size) = size {
            entry.size = size;
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
    }
}

/// Volumes every sandbox gets: the dependency cache, read-only.
pub fn sandbox_volumes(config: &Config) -> Vec<VolumeMount> {
    vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: true,
    }]
}

/// The spec of an installer (`network: true`) or maintenance sandbox: the only ones that write
/// the cache.
fn tool_spec(base: &SandboxSpec, config: &Config, network: bool) -> SandboxSpec {
    let mut volumes = vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: false,
    }];
    let mut mounts = Vec::new();
    match &config.deps.download_cache {
        DownloadCache::Volume(name) => volumes.push(VolumeMount {
            name: name.clone(),
            target: paths::DOWNLOAD_CACHE.to_string(),
            read_only: false,
        }),
        DownloadCache::HostPath(path) => mounts.push(OperatorMount {
            host: path.clone(),
            container: paths::DOWNLOAD_CACHE.to_string(),
            read_only: false,
        }),
        DownloadCache::Off => {}
    }
    let mut spec = base.clone();
    spec.network = if network {
        NetworkPolicy::Bridge
    } else {
        NetworkPolicy::None
    };
    spec.volumes = volumes;
    spec.mounts = mounts;
    spec
}

fn json_literal(value: &impl Serialize) -> String {
    // A JSON string literal of the JSON text: valid Python source, decoded with json.loads.
    let inner = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    serde_json::to_string(&inner).unwrap_or_else(|_| "\"null\"".into())
}

fn install_script(
    key: &str,
    requirements: &[Requirement],
    index: &IndexConfig,
    cache: bool,
) -> String {
    let cache_dir = |sub: &str| cache.then(|| format!("{}/{sub}", paths::DOWNLOAD_CACHE));
    let uv = deps::installer_argv(
        requirements,
        "{TARGET}",
        Installer::Uv,
        index,
        cache_dir("uv").as_deref(),
    );
    let pip = deps::installer_argv(
        requirements,
        "{TARGET}",
        Installer::Pip,
        index,
        cache_dir("pip").as_deref(),
    );
    let canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
    INSTALL_SCRIPT
        .replace("__KEY__", &json_literal(&key))
        .replace("__UV_ARGV__", &json_literal(&uv))
        .replace("__PIP_ARGV__", &json_literal(&pip))
        .replace("__REQUIREMENTS__", &json_literal(&canonical))
}

impl super::Engine {
    /// Makes `requirements` importable in `sandbox`: finds their set in the cache or installs it
    /// (once, whoever else asks at the same time), then puts it on the runner's `sys.path`.
    /// `replaces` is a set the sandbox used before (a session's previous one).
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
        let dir = format!("{}/{key}", paths::DEPS);
        let remove: Vec<String> = replaces
            .filter(|old| *old != dir)
            .map(|old| vec![old.to_string()])
            .unwrap_or_default();
        let canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
        let mut report = DependencyReport {
            requirements: canonical.clone(),
            key: key.clone(),
            installed: false,
        };

        if sandbox
            .add_paths(std::slice::from_ref(&dir), &remove)
            .await?
            .is_empty()
        {
            self.deps.touch(&key, &canonical, None);
            return Ok(report);
        }
        let lock = self.deps.lock_for(&key);
        let _installing = lock.lock().await;
        // Someone may have installed it while we waited.
        if !sandbox
            .add_paths(std::slice::from_ref(&dir), &remove)
            .await?
            .is_empty()
        {
            options.report(&format!("installing {}", canonical.join(" ")));
            let size = self
                .install(base, &key, requirements, &index, options)
                .await?;
            report.installed = true;
            if !sandbox
                .add_paths(std::slice::from_ref(&dir), &remove)
                .await?
                .is_empty()
            {
                return Err(EngineError::Dependencies(
                    "the dependencies were installed but the sandbox cannot see them".into(),
                ));
            }
            options.report("dependencies ready");
            let total = self.deps.touch(&key, &canonical, size);
            if total > self.config.deps.cache_max_bytes {
                self.evict(base, std::slice::from_ref(&key)).await;
            }
        } else {
            self.deps.touch(&key, &canonical, None);
        }
        Ok(report)
    }

    /// Runs an installer sandbox; returns the installed size when it reports one.
    async fn install(
        &self,
        base: &SandboxSpec,
        key: &str,
        requirements: &[Requirement],
        index: &IndexConfig,
        options: &super::RunOptions,
    ) -> Result<Option<u64>, EngineError> {
        self.deps.installs.fetch_add(1, Ordering::Relaxed);
        let mut spec = tool_spec(base, &self.config, true);
        spec.labels = self.owner.labels("installer");
        let cache = self.config.deps.download_cache != DownloadCache::Off;
        let script = install_script(key, requirements, index, cache);
        let mut installer = super::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
        let outcome = installer
            .execute(
                Task::Python(&script),
                self.config.deps.install_timeout,
                256 << 10,
                options.cancel.as_ref(),
            )
            .await;
        installer.destroy().await;
        let execution = outcome?;
        let stdout = String::from_utf8_lossy(&execution.stdout);
        if execution.succeeded() {
            let size = stdout
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find_map(|v| v["size"].as_u64());
            return Ok(size);
        }
        let output = format!("{stdout}\n{}", String::from_utf8_lossy(&execution.stderr));
        tracing::debug!(key, "installer failed:\n{output}");
        let why = if execution.timed_out {
            format!(
                "the install did not finish within {}",
                super::sandbox::human(self.config.deps.install_timeout)
            )
        } else {
            deps::installer_error_summary(&output)
        };
        Err(EngineError::Dependencies(why))
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

    /// Runs a maintenance sandbox that removes `remove` and lists what the cache holds.
    async fn maintain(
        &self,
        base: &SandboxSpec,
        remove: &[String],
    ) -> Result<Vec<CachedSet>, EngineError> {
        let mut spec = tool_spec(base, &self.config, false);
        spec.labels = self.owner.labels("maintenance");
        let script = MAINTENANCE_SCRIPT.replace("__REMOVE__", &json_literal(&remove));
        let mut sandbox = super::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
        let outcome = sandbox
            .execute(
                Task::Python(&script),
                Duration::from_secs(300),
                16 << 20,
                None,
            )
            .await;
        sandbox.destroy().await;
        let execution = outcome?;
        if !execution.succeeded() {
            return Err(EngineError::Dependencies(
                String::from_utf8_lossy(&execution.stderr).into_owned(),
            ));
        }
        self.deps.forget(remove);
        #[derive(Deserialize)]
        struct Listed {
            key: String,
            size: u64,
            requirements: Vec<String>,
            mtime: u64,
        }
        let listed: Vec<Listed> = serde_json::from_slice(execution.stdout.trim_ascii())
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
            })
            .collect())
    }

    /// The installed dependency sets (`cache list`).
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

    #[test]
    fn the_install_script_carries_arguments_as_data() {
        let requirements = deps::parse_requirements(&["six==1.16.0".to_string()], false).unwrap();
        let script = install_script("d-0123", &requirements, &IndexConfig::default(), true);
        assert!(
            script.contains(r#"KEY = json.loads("\"d-0123\"")"#),
            "{script}"
        );
        assert!(script.contains("six==1.16.0"));
        assert!(script.contains("/opt/pip-cache/pip"));
        assert!(!script.contains("__"), "every placeholder is filled");
    }

    #[test]
    fn json_literals_cannot_break_out_of_the_string() {
        let evil = vec!["\"); import os; os.system('x') #".to_string()];
        let literal = json_literal(&evil);
        assert!(literal.starts_with('"') && literal.ends_with('"'));
        let decoded: String = serde_json::from_str(&literal).unwrap();
        let back: Vec<String> = serde_json::from_str(&decoded).unwrap();
        assert_eq!(back, evil);
    }
}
