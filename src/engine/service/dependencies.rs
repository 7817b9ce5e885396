//! Dependencies for a request: found in the cache or installed by an installer sandbox, then put
//! on the sandbox's `sys.path`; and the cache's maintenance (listing, eviction, pruning).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;

use super::Engine;
use crate::engine::backend::{paths, SandboxSpec};
use crate::engine::deps::{self, IndexConfig, Requirement};
use crate::engine::installer::{
    index_config, installer_arguments, installer_spec, maintenance_operation, maintenance_spec,
    preparer_spec, uses_download_cache, CachedSet, Install, Measured, Verified, INSTALL_SCRIPT,
    MAINTENANCE_SCRIPT, PREPARE_SCRIPT, SET_LAYOUT,
};
use crate::engine::outcome::{DependencyReport, Execution};
use crate::engine::sandbox::Task;
use crate::engine::{artifacts, EngineError};

/// A set to find in the cache or install (see [`Engine::find_or_install`]): a request's
/// dependencies, or the runner's own IPython (`engine::runner_set`).
pub(super) struct WantedSet<'a> {
    pub(super) key: String,
    /// What the cache lists it as (`cache list`, the manifest).
    pub(super) listed: Vec<String>,
    pub(super) install: Install<'a>,
    /// The normalized names of its projects, for the words of a failed install.
    pub(super) projects: Vec<String>,
    /// What progress says while it installs, and once it is installed.
    pub(super) installing: String,
    pub(super) installed: &'static str,
    /// Counts its installs.
    pub(super) counter: &'a std::sync::atomic::AtomicU64,
}

impl Engine {
    /// Makes `requirements` importable in `sandbox`: finds their set in the cache (checked
    /// against its digest once per process) or installs it (once, whoever else asks at the same
    /// time), then puts it on the runner's `sys.path`. `replaces` is the path of a set the
    /// sandbox used before (a session's previous one).
    pub(crate) async fn prepare_dependencies(
        &self,
        sandbox: &mut crate::engine::sandbox::Sandbox,
        base: &SandboxSpec,
        requirements: &[Requirement],
        replaces: Option<&str>,
        options: &super::RunOptions,
    ) -> Result<DependencyReport, EngineError> {
        let key = self.dependency_key(&base.image, requirements).await?;
        if let Some(name) = self.deps.verified_name(&key) {
            let path = format!("{}/{name}", paths::DEPS);
            if self.use_set(sandbox, &path, replaces).await? {
                self.deps.touch(&key);
                return Ok(DependencyReport {
                    requirements: requirements.iter().map(Requirement::canonical).collect(),
                    key,
                    path,
                    installed: false,
                    prepared: false,
                });
            }
            // Gone (evicted by another server): look again under the lock.
            self.deps.set_verified(&key, None);
        }
        let limit = self.config.deps.install_timeout;
        let report = self
            .dependency_set(base, &key, requirements, options, limit)
            .await?;
        if !self.use_set(sandbox, &report.path, replaces).await? {
            self.deps.set_verified(&key, None);
            return Err(EngineError::Dependencies(
                "the dependencies were installed but the sandbox cannot see them".into(),
            ));
        }
        Ok(report)
    }

    /// The set of `requirements` for `base`'s image, found in the cache or installed (the
    /// installer within `limit`), without putting it on any sandbox's `sys.path`: for a sandbox
    /// whose runner is busy executing (`pip` from the code, see `service::pip`).
    pub(crate) async fn find_dependency_set(
        &self,
        base: &SandboxSpec,
        requirements: &[Requirement],
        options: &super::RunOptions,
        limit: Duration,
    ) -> Result<DependencyReport, EngineError> {
        let key = self.dependency_key(&base.image, requirements).await?;
        if let Some(name) = self.deps.verified_name(&key) {
            self.deps.touch(&key);
            return Ok(DependencyReport {
                requirements: requirements.iter().map(Requirement::canonical).collect(),
                key,
                path: format!("{}/{name}", paths::DEPS),
                installed: false,
                prepared: false,
            });
        }
        self.dependency_set(base, &key, requirements, options, limit)
            .await
    }

    /// The set of `key` verified in the cache, or installed (once, whoever else asks at the same
    /// time) with the installer's time bounded by `limit`; then the cache kept within its cap.
    async fn dependency_set(
        &self,
        base: &SandboxSpec,
        key: &str,
        requirements: &[Requirement],
        options: &super::RunOptions,
        limit: Duration,
    ) -> Result<DependencyReport, EngineError> {
        let index = index_config(&self.config);
        let canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
        let wanted = WantedSet {
            key: key.to_string(),
            listed: canonical.clone(),
            install: Install::Requirements(requirements),
            projects: requirements.iter().map(|r| r.normalized.clone()).collect(),
            installing: format!("installing {}", canonical.join(" ")),
            installed: "dependencies ready",
            counter: &self.deps.installs,
        };
        let (name, installed) = self
            .find_or_install(base, &wanted, &index, options, limit)
            .await?;
        let report = DependencyReport {
            requirements: canonical,
            key: key.to_string(),
            path: format!("{}/{name}", paths::DEPS),
            installed,
            prepared: false,
        };
        let total = self.deps.touch(key);
        if report.installed && total > self.config.deps.cache_max_bytes {
            self.evict(base, &[key.to_string()]).await;
        }
        Ok(report)
    }

    /// Finds `wanted` in the cache (checked against its digest once per process: a set changed
    /// after publication is removed and installed again) or installs and publishes it, once
    /// whoever else asks for it at the same time. Returns its directory's name in the cache, and
    /// whether this call installed it.
    pub(super) async fn find_or_install(
        &self,
        base: &SandboxSpec,
        wanted: &WantedSet<'_>,
        index: &IndexConfig,
        options: &super::RunOptions,
        limit: Duration,
    ) -> Result<(String, bool), EngineError> {
        let key = &wanted.key;
        let lock = self.deps.lock_for(key);
        let _installing = lock.lock().await;
        if let Some(name) = self.deps.verified_name(key) {
            return Ok((name, false));
        }
        let (name, installed) = match self.verify_set(base, key).await? {
            Verified::Ok(measured) => {
                self.deps.record(key, &wanted.listed, &measured);
                (measured.name, false)
            }
            found => {
                if matches!(found, Verified::Tampered) {
                    tracing::warn!(
                        key,
                        "a cached dependency set was changed after it was published: \
                         removed, installing it again"
                    );
                    options.report("the cached set was changed after publication; reinstalling");
                }
                options.report(&wanted.installing);
                let measured = self.install(base, wanted, index, options, limit).await?;
                self.deps.record(key, &wanted.listed, &measured);
                options.report(wanted.installed);
                (measured.name, true)
            }
        };
        self.deps.set_verified(key, Some(&name));
        Ok((name, installed))
    }

    /// The key `requirements` are cached under for `image`.
    pub(super) async fn dependency_key(
        &self,
        image: &str,
        requirements: &[Requirement],
    ) -> Result<String, EngineError> {
        let image_id = self.backend.image_id(image).await?;
        let index = index_config(&self.config);
        Ok(deps::cache_key(&image_id, requirements, &index, SET_LAYOUT))
    }

    /// Puts a set's directory on the sandbox's `sys.path`; false when it does not exist.
    async fn use_set(
        &self,
        sandbox: &mut crate::engine::sandbox::Sandbox,
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
                .map_err(|e| EngineError::UnreadableAnswer {
                    what: "verification",
                    source: e,
                }),
            Some("tampered") => {
                self.deps.forget(&[key.to_string()]);
                self.discard_prepared(&[key.to_string()]);
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
        wanted: &WantedSet<'_>,
        index: &IndexConfig,
        options: &super::RunOptions,
        limit: Duration,
    ) -> Result<Measured, EngineError> {
        let key = wanted.key.as_str();
        wanted.counter.fetch_add(1, Ordering::Relaxed);
        let staging = format!("pcs-stage-{}", uuid::Uuid::new_v4().simple());
        let mut spec = installer_spec(base, &self.config, &staging);
        spec.runtime = self.platform().await?.installer.name.clone();
        spec.labels = self.owner.labels("installer");
        let arguments =
            installer_arguments(wanted.install, index, uses_download_cache(&self.config));
        let outcome = async {
            spec.env.push(arguments);
            let outcome = async {
                // On an egress network of its own, where the proxy lets it reach the index hosts.
                let mut installer = self
                    .launch_on_egress(&spec, crate::engine::egress::Role::Installer, None)
                    .await?;
                let outcome = installer
                    .execute(
                        Task::Script(INSTALL_SCRIPT),
                        limit,
                        256 << 10,
                        options.cancel.as_ref(),
                    )
                    .await;
                // The staging tmpfs lives while the installer runs: publish before removing it.
                let published = match outcome {
                    Ok(execution) if execution.succeeded() => {
                        // Stop whatever the install left running before its staging is read.
                        let _ = self.backend.kill_processes(installer.id()).await;
                        options.report("preparing the dependencies (bytecode, caches)");
                        self.prepare_staged(base, &staging).await;
                        let op = serde_json::json!({
                            "op": "publish",
                            "key": key,
                            "requirements": wanted.listed,
                        });
                        self.run_maintenance(base, Some(&staging), &op)
                            .await
                            .map(Ok)
                    }
                    // What the proxy recorded of the installer's connections says why, before
                    // the installer is gone.
                    Ok(execution) => {
                        let connections = match installer.egress() {
                            Some(lease) => lease.record().await,
                            None => Vec::new(),
                        };
                        Ok(Err((execution, connections)))
                    }
                    Err(e) => Err(e),
                };
                installer.destroy().await;
                published
            }
            .await;
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
            Ok(answer) => {
                serde_json::from_value(answer).map_err(|e| EngineError::UnreadableAnswer {
                    what: "publication",
                    source: e,
                })
            }
            Err((execution, connections)) => {
                let stdout = String::from_utf8_lossy(&execution.stdout);
                let stderr = String::from_utf8_lossy(&execution.stderr);
                // The error has its summary; pip's or uv's whole text is saved (and logged).
                tracing::debug!(key, "installer failed:\n{stdout}\n{stderr}");
                let (said, diagnosis) = deps::split_diagnosis(&stdout);
                let output = format!("{said}\n{stderr}");
                let failure = deps::classify(
                    &deps::Evidence {
                        route: deps::Route::EgressProxy,
                        output: &output,
                        diagnosis,
                        connections: &connections,
                        timed_out: execution.timed_out,
                    },
                    &deps::Setting {
                        index,
                        projects: &wanted.projects,
                        timeout: limit,
                        install_max_bytes: self.config.deps.install_max_bytes,
                    },
                );
                let mut failure = failure;
                failure.saved_to = self.save_installer_output(&execution, options);
                tracing::info!(key, kind = ?failure.kind, "an install failed");
                Err(EngineError::InstallFailed(Box::new(failure)))
            }
        }
    }

    /// A failed installer's whole output (stdout, then stderr, as captured), saved under
    /// `SANDBOX_FILES_DIR` in a run directory of its own (`install-…`, in the caller's directory,
    /// kept within the files' retention like a run's). `None` when saving is off or failed
    /// (logged).
    fn save_installer_output(
        &self,
        execution: &Execution,
        options: &super::RunOptions,
    ) -> Option<std::path::PathBuf> {
        let root = self.config.files.persist_dir.as_ref()?;
        let run_dir = options.run_dir(format!("install-{}", artifacts::unique_stamp()));
        let mut text = execution.stdout.clone();
        text.extend_from_slice(b"\n--- stderr ---\n");
        text.extend_from_slice(&execution.stderr);
        let saving = self.retention.as_deref().map(|r| r.saving(&run_dir));
        let saved = artifacts::save(root, &run_dir, "installer-output.txt", &text);
        drop(saving);
        match saved {
            Ok(path) => {
                if let Some(retention) = self.retention.as_deref() {
                    retention.saved();
                }
                Some(path)
            }
            Err(e) => {
                tracing::warn!("could not save the installer's output: {e}");
                None
            }
        }
    }

    /// Does the import-time work of a staged set once (see `python/prepare_set.py`) in a preparer
    /// sandbox. The installer must still be running: the staging tmpfs lives while it is mounted.
    /// A failure leaves the set as installed (it works, only slower to import), and is logged.
    async fn prepare_staged(&self, base: &SandboxSpec, staging: &str) {
        let mut spec = preparer_spec(base, staging);
        spec.labels = self.owner.labels("preparer");
        let started = std::time::Instant::now();
        let outcome = async {
            let mut preparer =
                crate::engine::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
            let outcome = preparer
                .execute(
                    Task::Script(PREPARE_SCRIPT),
                    self.config.deps.install_timeout,
                    64 << 10,
                    None,
                )
                .await;
            preparer.destroy().await;
            outcome
        }
        .await;
        match outcome {
            Ok(execution) if execution.succeeded() => tracing::debug!(
                prepare_ms = started.elapsed().as_millis() as u64,
                "dependency set prepared: {}",
                crate::text::truncate_chars(String::from_utf8_lossy(&execution.stdout).trim(), 200)
            ),
            Ok(execution) => tracing::warn!(
                "could not prepare a dependency set (it is published unprepared): {}",
                deps::installer_error_summary(&String::from_utf8_lossy(&execution.stderr))
            ),
            Err(e) => tracing::warn!(
                "could not prepare a dependency set (it is published unprepared): {e}"
            ),
        }
    }

    /// Runs `code` in a sandbox with an installer's network (the egress network, as an
    /// installer; no cache, no staging): what package code in an install could reach. For tests
    /// and `doctor`.
    #[doc(hidden)]
    pub async fn probe_installer_network(&self, code: &str) -> Result<Execution, EngineError> {
        let mut spec = installer_spec(
            &self
                .base_spec(self.config.image.clone(), "installer")
                .await?,
            &self.config,
            "unused",
        );
        spec.runtime = self.platform().await?.installer.name.clone();
        self.backend.ensure_image(&spec.image).await?;
        spec.volumes = Vec::new();
        spec.mounts = Vec::new();
        let mut sandbox = self
            .launch_on_egress(&spec, crate::engine::egress::Role::Installer, None)
            .await?;
        let outcome = sandbox
            .execute(Task::Python(code), Duration::from_secs(60), 1 << 20, None)
            .await;
        sandbox.destroy().await;
        outcome
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
        let mut sandbox =
            crate::engine::sandbox::Sandbox::launch(self.backend.clone(), &spec).await?;
        let outcome = sandbox
            .execute(
                Task::Script(MAINTENANCE_SCRIPT),
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
            .map_err(|e| EngineError::UnreadableAnswer {
                what: "maintenance answer",
                source: e,
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
    pub(super) async fn evict(&self, base: &SandboxSpec, keep: &[String]) {
        let in_use: HashSet<String> = self
            .sessions_dependency_keys()
            .into_iter()
            .chain(self.deps.runner_set_keys())
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
        self.discard_prepared(remove);
        #[derive(Deserialize)]
        struct Listed {
            key: String,
            name: String,
            size: u64,
            digest: String,
            requirements: Vec<String>,
            mtime: u64,
        }
        let listed: Vec<Listed> = serde_json::from_value(answer["sets"].clone()).map_err(|e| {
            EngineError::UnreadableAnswer {
                what: "cache listing",
                source: e,
            }
        })?;
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
            .await?;
        self.backend.ensure_image(&base.image).await?;
        self.maintain(&base, &[]).await
    }

    /// Removes cached sets: all of them not in use (`all`), or the least recently used beyond
    /// the cap. Returns what was removed.
    pub async fn prune_dependency_sets(&self, all: bool) -> Result<Vec<CachedSet>, EngineError> {
        let sets = self.cached_dependency_sets().await?;
        let mut in_use: HashSet<String> = self.sessions_dependency_keys().into_iter().collect();
        // The runner's IPython is in use wherever code runs: its sets for the images this process
        // used, and the default image's (another process may be a server using it).
        in_use.extend(self.deps.runner_set_keys());
        if let Ok(key) = self.runner_set_key(&self.config.image).await {
            in_use.insert(key);
        }
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
                .await?;
            self.maintain(&base, &remove).await?;
        }
        Ok(sets
            .into_iter()
            .filter(|s| remove.contains(&s.key))
            .collect())
    }
}
