//! A started engine and what runs beside it, shared by the stdio and HTTP servers.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::error::ServeError;
use crate::config::Config;
use crate::engine::warden::Warden;
use crate::engine::Engine;
use crate::pypi::PypiSearch;

pub(crate) struct Running {
    pub engine: Arc<Engine>,
    pub pypi: Arc<PypiSearch>,
    reaper: JoinHandle<()>,
    cleanup: JoinHandle<()>,
    retention: Option<JoinHandle<()>>,
    /// Removes this server's sandboxes should the server die without doing so itself.
    warden: Option<Warden>,
}

impl Running {
    /// Starts the engine: the session reaper and (in the background) the removal
    /// of what dead servers left and the retention of saved files. Nothing here waits for Docker.
    /// A files or snapshots directory that cannot be trusted, an unusable package index, or an invalid
    /// `SANDBOX_PRELOAD` set stops start-up.
    pub(crate) fn start(config: Config) -> Result<Running, ServeError> {
        crate::engine::files_dir::prepare_configured(&config.files)?;
        if let Some(dir) = &config.snapshots.dir {
            crate::engine::files_dir::prepare(dir, "SANDBOX_SNAPSHOT_DIR", "turn snapshots off")?;
        }
        let pypi = Arc::new(PypiSearch::new(
            &config.pypi_url,
            config.cache_dir.join("pypi"),
            config.pypi_index_ttl,
        )?);
        tracing::info!("roots: {}", config.roots.summary());
        let engine = Arc::new(Engine::with_docker(config));
        // Before anything starts: an invalid set stops start-up with the entry named.
        engine.preload_sets().map_err(ServeError::Preload)?;
        let cleanup = {
            let engine = engine.clone();
            tokio::spawn(async move {
                // Says at start-up which engine and runtime run the code, and why (or why no
                // sandbox may start); logged by the engine, asked again if it does not answer.
                if let Err(e @ crate::engine::EngineError::Backend(_)) = engine.platform().await {
                    tracing::warn!("{e}");
                }
                match engine.remove_leftovers().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!("removed {n} sandbox(es) left by servers that are gone")
                    }
                    Err(e) => tracing::warn!("could not look for leftover sandboxes: {e}"),
                }
            })
        };
        let reaper = engine.spawn_reaper();
        let retention = engine.spawn_file_retention();
        let warden = match Warden::spawn(engine.instance()) {
            Ok(warden) => Some(warden),
            Err(e) => {
                tracing::warn!(
                    "could not start the warden that removes this server's sandboxes should it \
                     be killed (`cleanup` and the next server remain): {e}"
                );
                None
            }
        };
        Ok(Running {
            engine,
            pypi,
            reaper,
            cleanup,
            retention,
            warden,
        })
    }

    /// Starts what must run before the first call: the egress proxy with
    /// `SANDBOX_NETWORK=allowlist` (the only start-up step that waits for the engine), then the
    /// warm pool. On failure everything started is stopped.
    pub(crate) async fn ready(self) -> Result<Running, ServeError> {
        match self.engine.start_egress().await {
            Ok(()) => {
                // The pool's sandboxes need the proxy with allowlist: it starts after it.
                self.engine.start_pool();
                Ok(self)
            }
            Err(e) => {
                self.stop().await;
                Err(ServeError::Egress(e))
            }
        }
    }

    /// Stops the background tasks and removes every sandbox this server made.
    pub(crate) async fn stop(self) {
        self.reaper.abort();
        self.cleanup.abort();
        if let Some(retention) = &self.retention {
            retention.abort();
        }
        let clean = self.engine.shutdown().await;
        // Left to the warden when the engine could not confirm that nothing is left.
        if let (true, Some(warden)) = (clean, self.warden) {
            warden.release().await;
        }
    }
}
