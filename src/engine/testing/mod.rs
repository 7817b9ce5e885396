//! Docker-free tests of the engine: the sandbox state machine, sessions, the warm pool, expiry,
//! the reaper and shutdown, driven through [`fake_backend::FakeBackend`], which runs the real
//! runner as a host process (no container, no isolation; compiled only for `cargo test`).
//!
//! Run them with `cargo test --lib engine::testing`; they need `python3` on the host, and no
//! container engine.

pub mod fake_backend;

mod capture_tests;
mod engine_tests;
mod ipython_tests;
mod sandbox_tests;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::backend::SandboxSpec;
use crate::engine::Engine;
use fake_backend::FakeBackend;

/// The defaults, with nothing saved to disk (files, snapshots), no pool unless a test asks, and a short timeout.
pub fn test_config() -> Config {
    let mut config = Config::default();
    config.files.persist_dir = None;
    config.snapshots.dir = None;
    config.pool_size = 0;
    config.limits.timeout = Duration::from_secs(20);
    config
}

/// An engine on a fresh fake backend, with the test's adjustments to the configuration.
pub fn engine_with(adjust: impl FnOnce(&mut Config)) -> (Arc<Engine>, Arc<FakeBackend>) {
    let mut config = test_config();
    adjust(&mut config);
    let fake = Arc::new(FakeBackend::new());
    (Arc::new(Engine::new(fake.clone(), config)), fake)
}

/// What the engine would create a sandbox from (the real bootstrap command, no labels).
pub fn spec() -> SandboxSpec {
    let config = test_config();
    SandboxSpec {
        image: config.image,
        limits: config.limits,
        network: config.network,
        ca_bundle: None,
        mounts: Vec::new(),
        volumes: Vec::new(),
        runtime: None,
        command: crate::engine::protocol::bootstrap_command(),
        labels: Default::default(),
        network_name: None,
        env: Vec::new(),
        maintenance: false,
        open_files: None,
        user: None,
        roots: None,
        no_forwarding: false,
    }
}

/// Waits until `condition` holds, checking every 20 ms; panics with `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `future`, failing the test if it takes longer than `limit` (a hang is a failure).
pub async fn within<T>(limit: Duration, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("did not finish within {limit:?}"),
    }
}
