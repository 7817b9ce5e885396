//! The composition root: the engine on the container platform the binary uses.

use std::sync::Arc;

use super::docker::DockerBackend;
use super::Engine;
use crate::config::Config;

impl Engine {
    /// The engine on Docker, as the configuration sets it up: what the server, the command line
    /// and the benchmark run.
    pub fn with_docker(config: Config) -> Engine {
        Engine::new(Arc::new(DockerBackend::for_config(&config)), config)
    }
}
