//! Shared helpers for the tests that drive the real Docker engine.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::ListVolumesOptions;
use bollard::Docker;
use python_code_sandbox::config::Config;
use python_code_sandbox::engine::backend::Backend;
use python_code_sandbox::engine::docker::DockerBackend;
use python_code_sandbox::engine::owner::LABEL_INSTANCE;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{Engine, Execution, RunOptions, Task};

/// The configuration tests run with: the defaults, with a short timeout so a hang fails fast, and
/// what the test script configures for reaching PyPI from containers (`SANDBOX_CA_BUNDLE`) and
/// for the dependency cache (`SANDBOX_DEPS_VOLUME`, the download cache).
pub fn test_config() -> Config {
    let from_env = Config::from_lookup(|name| match name {
        "SANDBOX_CA_BUNDLE"
        | "SANDBOX_DEPS_VOLUME"
        | "PIP_CACHE_PATH"
        | "ENABLE_PIP_CACHE"
        | "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE" => std::env::var(name).ok(),
        _ => None,
    })
    .expect("the test environment's settings are valid");
    let mut config = Config {
        files: Config::default().files,
        ..from_env
    };
    config.limits.timeout = Duration::from_secs(30);
    config.runtime = suite_runtime();
    // Tests that look at saved files or snapshots set their own directory.
    config.files.persist_dir = None;
    config.snapshots.dir = None;
    config
}

/// The test binaries whose sandboxes run under the engine's own choice of runtime (gVisor where
/// registered, as the product runs by default): the lifecycle and hardening tests, and the egress
/// network's (networked code keeps gVisor through its networked entry, `runsc-net`). The others
/// (files, dependencies, flavours, preload, ...) test what does not depend on the runtime, under
/// runc: a sandbox start costs about 2 s of CPU under gVisor on this machine kind's ptrace
/// platform, and half the engine tests' time was gVisor's. `PCS_ENGINE_RUNTIME` says otherwise
/// for all of them (`default`: the engine's choice; a name: that runtime). The MCP suite does the
/// same (tests/mcp/conftest.py, `PCS_MCP_RUNTIME`).
const UNDER_DEFAULT_RUNTIME: &[&str] = &["engine", "egress"];

/// The runtime [`test_config`] names (see [`UNDER_DEFAULT_RUNTIME`]); `None` is the engine's choice.
pub fn suite_runtime() -> Option<String> {
    let named = std::env::var("PCS_ENGINE_RUNTIME").ok();
    let chosen = match named.as_deref() {
        Some(name) => name,
        None if UNDER_DEFAULT_RUNTIME.contains(&env!("CARGO_CRATE_NAME")) => "default",
        None => "runc",
    };
    (chosen != "default").then(|| chosen.to_string())
}

/// A dependency cache volume of the test's own, so installs are not found from earlier tests.
pub fn fresh_deps_volume() -> String {
    format!(
        "pcs-test-deps-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The sets of `engine`'s cache that requests installed (not the runner's own IPython, which
/// every image's code sandboxes need).
pub async fn request_sets(
    engine: &Engine,
) -> Vec<python_code_sandbox::engine::installer::CachedSet> {
    let sets = engine.cached_dependency_sets().await.expect("list");
    sets.into_iter()
        .filter(|s| !python_code_sandbox::engine::runner_set::is_listed_as(&s.requirements))
        .collect()
}

/// Installs the runner's IPython into the cache volume `volume` from the default index, for a
/// test whose engine then uses an index that cannot serve it (a fake one).
/// An image like the sandbox image but not labelled as carrying the runner's IPython (a
/// `python:3.11-slim`-style image as far as the engine knows): its code sandboxes get the set from
/// the dependency cache. Built once (a label on top of the configured image, nothing pulled).
pub fn image_without_ipython() -> String {
    static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            use std::io::Write;
            let tag = "pcs-test-plain:latest".to_string();
            let recipe = format!(
                "FROM {}\nLABEL {}=none\n",
                test_config().image,
                python_code_sandbox::engine::runner_set::IMAGE_LABEL
            );
            let mut build = std::process::Command::new("docker")
                .args(["build", "-q", "-t", &tag, "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("docker build starts");
            build
                .stdin
                .take()
                .expect("its stdin")
                .write_all(recipe.as_bytes())
                .expect("the recipe is written");
            assert!(build.wait().expect("docker build ends").success());
            tag
        })
        .clone()
}

pub async fn seed_runner_set(volume: &str) {
    let seeding = engine_with(|c| c.deps.volume = volume.to_string());
    seeding
        .runner_set_dir(None)
        .await
        .expect("the runner's IPython installs");
    assert_nothing_left(&seeding).await;
}

pub async fn remove_volume(name: &str) {
    let docker = docker().await;
    let _ = docker
        .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
        .await;
}

pub fn engine() -> Engine {
    engine_with(|_| {})
}

pub fn engine_with(adjust: impl FnOnce(&mut Config)) -> Engine {
    show_warnings();
    let mut config = test_config();
    adjust(&mut config);
    Engine::new(Arc::new(DockerBackend::new()), config)
}

/// The engine's warnings (and `RUST_LOG`'s choice) go to the test's captured output, so that a
/// failed test shows what the engine said on the way (a volume it could not remove, say).
pub fn show_warnings() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub async fn docker() -> Docker {
    Docker::connect_with_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("docker answers")
}

/// Containers and volumes labelled with `label=value`. The containers as the server lists them
/// (bollard's own list cannot read a container Podman reports in passing as `stopped`).
pub async fn labelled(label: &str, value: &str) -> (Vec<String>, Vec<String>) {
    let docker = docker().await;
    let filter = HashMap::from([("label".to_string(), vec![format!("{label}={value}")])]);
    let containers = DockerBackend::new()
        .list(label, value)
        .await
        .expect("list containers");
    let volumes = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: Some(filter),
        }))
        .await
        .expect("list volumes");
    (
        containers.into_iter().map(|c| c.id.0).collect(),
        volumes
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect(),
    )
}

/// Fails when the engine's instance still owns any container or volume.
pub async fn assert_nothing_left(engine: &Engine) {
    // Sandboxes are removed in the background after their result: wait for that first.
    engine.settle().await;
    // The egress proxy serves the server's whole life (installs start it): stop it first (the
    // next install starts it again).
    engine.stop_egress().await;
    let (containers, volumes) = labelled(LABEL_INSTANCE, &engine.owner().instance).await;
    assert!(
        containers.is_empty(),
        "containers left behind: {containers:?}"
    );
    assert!(volumes.is_empty(), "volumes left behind: {volumes:?}");
}

/// Runs code in a fresh sandbox with the configured timeout.
pub async fn run(engine: &Engine, code: &str) -> Execution {
    engine
        .run_ephemeral(Task::Python(code), &RunOptions::default())
        .await
        .expect("the engine runs the code")
}

pub async fn run_with_timeout(engine: &Engine, code: &str, timeout: Duration) -> Execution {
    engine
        .run_ephemeral(
            Task::Python(code),
            &RunOptions {
                timeout: Some(timeout),
                ..Default::default()
            },
        )
        .await
        .expect("the engine runs the code")
}

pub async fn in_session(engine: &Engine, id: &str, code: &str) -> Execution {
    engine
        .execute_in_session(
            Scope::Server,
            id,
            Task::Python(code),
            &RunOptions::default(),
        )
        .await
        .expect("the session runs the code")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Guards a test against hanging (not a timing assertion: the bound is generous).
pub async fn no_hang<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(240), future)
        .await
        .expect("the test hung")
}

/// Whether this test must be skipped because no Docker engine answers. Call it first in every
/// test that needs the engine: `if skip_without_engine() { return; }`.
///
/// Without an engine, `cargo test` still runs every test that needs none and names each skipped
/// one on stderr with the reason. With `PCS_REQUIRE_ENGINE=1` (set by `scripts/test.sh`, so CI
/// never skips silently) a missing engine fails the test instead.
pub fn skip_without_engine() -> bool {
    use std::io::Write as _;
    static ANSWER: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let answer = ANSWER.get_or_init(|| {
        // A runtime of its own, on a thread of its own: the caller may be inside a runtime.
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let docker = Docker::connect_with_defaults().map_err(|e| e.to_string())?;
                match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("no answer within 10 s".to_string()),
                }
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the engine check panicked".to_string()))
    });
    let Err(reason) = answer else {
        return false;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("a test that needs the engine")
        .to_string();
    if std::env::var("PCS_REQUIRE_ENGINE").is_ok_and(|v| v == "1") {
        panic!(
            "{test}: no Docker engine answers ({reason}), and PCS_REQUIRE_ENGINE=1 requires one"
        );
    }
    // Written to stderr directly, past the test harness's capture, so the skip is visible.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: no Docker engine answers ({reason}); start one with scripts/dev-env.sh"
    );
    true
}

/// The host's address on Docker's default bridge (read from the interface).
pub fn bridge_address() -> std::net::Ipv4Addr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "docker0"])
        .output()
        .expect("ip");
    let text = String::from_utf8_lossy(&out.stdout);
    let cidr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .expect("docker0 has an IPv4 address");
    cidr.split('/').next().unwrap().parse().expect("an address")
}

/// No network of this engine's instance is left (egress networks go with their sandboxes).
pub fn assert_no_network_left(engine: &Engine) {
    let out = std::process::Command::new("docker")
        .args(["network", "ls", "-q", "--filter"])
        .arg(format!(
            "label={LABEL_INSTANCE}={}",
            engine.owner().instance
        ))
        .output()
        .expect("docker network ls");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "",
        "networks left"
    );
}

/// The engine runs the code under gVisor (the default where the engine has it): the tests that
/// read what the host kernel shows from inside (errno of a write, mount types, `/proc` fields
/// gVisor does not have) expect gVisor's own answers then.
pub async fn under_gvisor(engine: &Engine) -> bool {
    engine
        .platform()
        .await
        .expect("the engine is usable")
        .code
        .gvisor
}
