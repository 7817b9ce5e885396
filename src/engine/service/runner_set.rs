//! The runner's own IPython (see `engine::runner_set`) for the code's sandboxes: found in the
//! dependency cache or installed there, once per image, before any code sandbox of that image
//! starts, through the same path as a request's dependencies; then named to the sandbox's runner
//! in its spec. Installing it is the server's own act, whatever agents may ask for.

use std::sync::Arc;

use super::dependencies::WantedSet;
use super::{Engine, RunOptions};
use crate::engine::backend::{paths, SandboxSpec};
use crate::engine::installer::{index_config, Install, SET_LAYOUT};
use crate::engine::runner_set::{self, LOCK};
use crate::engine::EngineError;

impl Engine {
    /// The spec of a code sandbox from `base` (a [`Engine::base_spec`] of an image that is
    /// there): its runner's IPython set found or installed first, and named in its environment
    /// (`PCS_IPYTHON`). Returns the set's key too; neither where the backend gives the runner its
    /// IPython itself.
    pub(super) async fn code_spec(
        &self,
        base: &SandboxSpec,
        options: &RunOptions,
    ) -> Result<(SandboxSpec, Option<String>), EngineError> {
        let mut spec = base.clone();
        if self.backend.gives_runner_ipython() {
            return Ok((spec, None));
        }
        if runner_set::carried_by(&self.backend.image_labels(&base.image).await?) {
            spec.env.push(runner_set::env_entry(paths::BAKED_IPYTHON));
            return Ok((spec, None));
        }
        let (key, dir) = self.runner_set(base, options).await?;
        spec.env.push(runner_set::env_entry(&dir));
        Ok((spec, Some(key)))
    }

    /// The key the runner's set of `image` is cached under.
    pub(super) async fn runner_set_key(&self, image: &str) -> Result<String, EngineError> {
        let image_id = self.backend.image_id(image).await?;
        Ok(runner_set::cache_key(&image_id, SET_LAYOUT, LOCK))
    }

    /// The runner's set of `base.image`: its key and its directory (`/opt/deps/s-…`). Verified
    /// once per process, or installed once (callers at the same time wait for that one install);
    /// a failed install is [`EngineError::RunnerSetFailed`], with its cause and what to set.
    async fn runner_set(
        &self,
        base: &SandboxSpec,
        options: &RunOptions,
    ) -> Result<(String, String), EngineError> {
        let key = self.runner_set_key(&base.image).await?;
        let name = match self.deps.verified_name(&key) {
            Some(name) => name,
            None => {
                self.deps.keep_runner_set(&key);
                let wanted = WantedSet {
                    key: key.clone(),
                    listed: runner_set::listed(LOCK),
                    install: Install::Lock(LOCK),
                    projects: runner_set::projects(LOCK),
                    installing: runner_set::INSTALLING.to_string(),
                    installed: "the runner's IPython is ready",
                    counter: &self.deps.runner_installs,
                };
                let index = index_config(&self.config);
                let (name, installed) = self
                    .find_or_install(
                        base,
                        &wanted,
                        &index,
                        options,
                        self.config.deps.install_timeout,
                    )
                    .await
                    .map_err(|e| match e {
                        EngineError::InstallFailed(failure) => {
                            EngineError::RunnerSetFailed(failure)
                        }
                        e => e,
                    })?;
                let total = self.deps.touch(&key);
                if installed && total > self.config.deps.cache_max_bytes {
                    self.evict(base, std::slice::from_ref(&key)).await;
                }
                name
            }
        };
        Ok((key, format!("{}/{name}", paths::DEPS)))
    }

    /// Finds or installs the default image's set in the background (at start-up), so that the
    /// first call rarely waits for it; a failure is logged (the first call then tries again, and
    /// says why). Stopped by shutdown.
    pub(super) fn warm_runner_set(self: &Arc<Self>) {
        if self.backend.gives_runner_ipython() {
            return;
        }
        let engine = Arc::downgrade(self);
        self.background.spawn(async move {
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let options = engine.background_options();
            let found = async {
                let base = engine
                    .base_spec(engine.config.image.clone(), "pool")
                    .await?;
                engine.backend.ensure_image(&base.image).await?;
                if runner_set::carried_by(&engine.backend.image_labels(&base.image).await?) {
                    return Ok((String::new(), paths::BAKED_IPYTHON.to_string()));
                }
                engine.runner_set(&base, &options).await
            }
            .await;
            match found {
                Ok((_, dir)) => tracing::debug!(dir, "the runner's IPython is ready"),
                Err(_) if engine.closing.is_cancelled() => {}
                Err(e) => tracing::warn!("{e}"),
            }
        });
    }

    /// How many installs of the runner's own IPython this engine started (tests: a cached set
    /// starts none, concurrent first uses start one).
    pub fn runner_set_installs_started(&self) -> u64 {
        self.deps.runner_installs_started()
    }

    /// The directory of the runner's IPython for `image` (the configured one when `None`), found
    /// or installed as a code sandbox's would be (the image's own when it carries the set). For
    /// tests and diagnostics.
    #[doc(hidden)]
    pub async fn runner_set_dir(&self, image: Option<&str>) -> Result<String, EngineError> {
        let image = self.check_image(image)?;
        let base = self.base_spec(image, "pool").await?;
        self.backend.ensure_image(&base.image).await?;
        if runner_set::carried_by(&self.backend.image_labels(&base.image).await?) {
            return Ok(paths::BAKED_IPYTHON.to_string());
        }
        Ok(self.runner_set(&base, &RunOptions::default()).await?.1)
    }
}
