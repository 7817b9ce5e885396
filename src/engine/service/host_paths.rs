//! Host paths in settings (`SANDBOX_MOUNTS`, `PIP_CACHE_PATH`, `SANDBOX_CA_BUNDLE`) are paths on
//! the engine's machine. With a local engine the configuration checked them; with one on another
//! machine only that engine can: a sandbox that would mount each is created (never started) and
//! removed, and a path the engine cannot see refuses sandboxes with the setting named, rather than
//! every call failing later with the engine's words (or a networked sandbox silently going
//! without the operator's CA bundle).

use crate::config::{DownloadCache, NetworkPolicy, OperatorMount};
use crate::engine::backend::SandboxSpec;
use crate::engine::platform::Refusal;
use crate::engine::EngineError;

use super::Engine;

impl Engine {
    /// Checks, on a remote engine, every host path the settings name; `Ok` on a local one.
    pub(super) async fn check_engine_paths(&self) -> Result<(), EngineError> {
        if !self.config.remote_engine {
            return Ok(());
        }
        let mut paths: Vec<(&str, &std::path::Path)> = self
            .config
            .mounts
            .iter()
            .map(|mount| ("SANDBOX_MOUNTS", mount.host.as_path()))
            .collect();
        if let DownloadCache::HostPath(path) = &self.config.deps.download_cache {
            paths.push(("PIP_CACHE_PATH", path));
        }
        if let Some(bundle) = &self.config.ca_bundle {
            paths.push(("SANDBOX_CA_BUNDLE", bundle));
        }
        if paths.is_empty() {
            return Ok(());
        }
        self.backend.ensure_image(&self.config.image).await?;
        let mut missing = Vec::new();
        for (setting, path) in paths {
            let mut spec: SandboxSpec = self.plain_spec(self.config.image.clone(), "path-check");
            spec.network = NetworkPolicy::None;
            spec.volumes = Vec::new();
            spec.mounts = vec![OperatorMount {
                host: path.to_path_buf(),
                container: "/engine-path-check".to_string(),
                read_only: true,
            }];
            spec.command = vec!["true".to_string()];
            match self.backend.create(&spec).await {
                Ok(id) => {
                    let _ = self.backend.destroy(&id).await;
                }
                Err(e @ crate::engine::backend::BackendError::Unavailable { .. }) => {
                    return Err(e.into())
                }
                Err(e) => missing.push(format!("{setting} {} ({e})", path.display())),
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(Refusal(format!(
            "refusing to start sandboxes: the engine at {} is on another machine, where host paths \
             in settings must exist, and it cannot use: {}. Create them there, or change the \
             settings (SANDBOX_FILES_DIR and SANDBOX_SNAPSHOT_DIR are the only paths on this \
             machine)",
            crate::engine::docker::endpoint(),
            missing.join("; ")
        ))
        .into())
    }
}
