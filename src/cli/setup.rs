//! `setup`: from nothing to a first result, then the client wired up. Each step says what it
//! does; the first of steps 1 to 5 that fails stops it with what to do about it.
//!
//! 1. an engine answers (else: how to get one, exit [`EXIT_INFRA`]);
//! 2. the runtime the code will get: gVisor when it is registered (with `--gvisor`, registered
//!    first where it is not: [`super::gvisor`]), else runc and how to get gVisor;
//! 3. the sandbox image is there (else it is built, or pulled, with progress shown);
//! 4. the doctor's checks pass;
//! 5. a hello world runs in a sandbox;
//! 6. a small pinned dependency installs through the server's own installer (its egress proxy,
//!    the index): where it fails, the failure's cause and the setting that fixes it
//!    ([`deps::remedy`]); setup goes on to step 7 and ends with a warning (exit 0: only agents'
//!    `dependencies` fail); an installer that does not run at all stops it (exit
//!    [`EXIT_INFRA`]);
//! 7. the client's configuration: printed, or merged into its file with `--write`, with the fix
//!    of step 6 in its `env`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::client_config::{self, Client, Home, Launch, Merged};
use super::{doctor, progress::Progress, replace, EXIT_CONFIG, EXIT_INFRA};
use crate::config::settings::{SANDBOX_CA_BUNDLE, SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE};
use crate::config::{redact_url, Config, DEFAULT_IMAGE};
use crate::engine::backend::Backend;
use crate::engine::deps::{self, CaBundles, Remedy};
use crate::engine::docker::{image, DockerBackend};
use crate::engine::platform;
use crate::engine::{Engine, EngineError, RunOptions, Task};

/// The name the server is listed under in a client's configuration (the seed's).
pub const DEFAULT_SERVER_NAME: &str = "python-sandbox";

/// What `setup` was asked to do.
#[derive(Debug, Clone)]
pub struct SetupRequest {
    pub client: Option<Client>,
    pub write: bool,
    pub name: String,
    /// Only the client's configuration (the engine, image and checks are skipped).
    pub config_only: bool,
    /// How the client starts the server; `None`: as this program was started (see [`launch`]).
    pub via: Option<Via>,
    /// Register gVisor with the local engine when it is not (the user's consent).
    pub gvisor: bool,
}

/// How a client's configuration starts the server.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The absolute path of this program.
    Path,
    /// `uvx python-code-sandbox-mcp` (the published wheel; uv fetches it on first use).
    Uvx,
}

/// How to get a container engine, for a machine that has none answering.
pub fn how_to_get_an_engine() -> &'static str {
    "Get a container engine, then run `python-code-sandbox setup` again:\n\
     - Linux: Docker Engine (`sudo apt-get install docker.io` or https://docs.docker.com/engine/install/), \
     started (`sudo systemctl start docker`), your user in the `docker` group; or rootful Podman \
     (`sudo podman system service --time=0 unix:///run/podman/podman.sock &` and \
     DOCKER_HOST=unix:///run/podman/podman.sock).\n\
     - macOS: Docker Desktop, or Colima (`colima start`; DOCKER_HOST=unix://$HOME/.colima/default/docker.sock).\n\
     - An engine on another machine: DOCKER_HOST=tcp://HOST:2376 with DOCKER_TLS_VERIFY=1 and \
     DOCKER_CERT_PATH, or DOCKER_HOST=ssh://USER@HOST."
}

/// The dependency step 6 installs: a pinned pure-Python wheel, small, and what the code that
/// checks it is importable prints.
pub const PROBE_DEPENDENCY: &str = "six==1.16.0";
const PROBE_CODE: &str = "import six; print(six.__version__)";
const PROBE_PRINTS: &str = "1.16.0";

pub async fn setup(config: Config, request: SetupRequest) -> ExitCode {
    let mut dependencies_fail = false;
    let mut fixes = Vec::new();
    if !request.config_only {
        if let Err(code) = first_result(&config, request.gvisor).await {
            eprintln!(
                "python-code-sandbox setup: stopped; not tried: the dependency install (step 6) \
                 and the client's configuration (step 7): fix the above and run setup again"
            );
            return code;
        }
        match dependency_step(&config).await {
            Ok(()) => {}
            // The index refused or failed the install: the client's configuration is still done
            // (with the fix, where one is known): the code runs; only agents' `dependencies`
            // would fail.
            Err(DependencyStep::Failed(fix)) => {
                dependencies_fail = true;
                fixes.extend(fix);
            }
            // The installer did not run at all, or what it installed does not import: this
            // installation is broken, not its network.
            Err(DependencyStep::Broken) => {
                eprintln!(
                    "python-code-sandbox setup: stopped; not tried: the client's configuration \
                     (step 7): fix the above and run setup again"
                );
                return ExitCode::from(EXIT_INFRA);
            }
        }
    }
    let configured = client_configuration(&config, &request, &fixes);
    if configured != ExitCode::SUCCESS {
        return configured;
    }
    if dependencies_fail {
        // A warning, not a failure: the server runs code; agents' `dependencies` would fail the
        // same way until the fix above is in the environment the server starts with.
        eprintln!(
            "python-code-sandbox setup: warning: the dependency install (step 6) failed: agents' \
             `dependencies` will fail the same way until it is fixed (see step 6); everything \
             else works"
        );
    }
    ExitCode::SUCCESS
}

/// How step 6 failed.
enum DependencyStep {
    /// The install failed for a cause of the index or the network, which the failure's words
    /// name; the setting that fixes it, when one does.
    Failed(Option<Remedy>),
    /// The installer did not run, or the package did not import: not a matter of settings.
    Broken,
}

/// Step 6: one small pinned dependency through the engine's own dependency path (the installer
/// sandbox behind its egress proxy, the index, the cache), then imported in a sandbox.
async fn dependency_step(config: &Config) -> Result<(), DependencyStep> {
    let index = config
        .deps
        .index_url
        .as_deref()
        .map(redact_url)
        .unwrap_or_else(|| "PyPI".to_string());
    println!("6. a dependency through the server's installer: {PROBE_DEPENDENCY} from {index}");
    let engine = Engine::with_docker(config.clone());
    let progress = Progress::start(&format!("   installing {PROBE_DEPENDENCY}"));
    let options = RunOptions {
        dependencies: vec![PROBE_DEPENDENCY.to_string()],
        progress: Some(progress.sink()),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let outcome = engine
        .run_ephemeral(Task::Python(PROBE_CODE), &options)
        .await;
    let took = started.elapsed();
    progress.finish(if outcome.is_ok() { "done" } else { "failed" });
    // The sandbox goes, then the installers' egress proxy.
    engine.settle().await;
    engine.stop_egress().await;
    let execution = match outcome {
        Ok(execution) => execution,
        Err(EngineError::InstallFailed(failure)) => {
            eprintln!("python-code-sandbox setup: the dependency install failed: {failure}");
            let host = config.host_ca_bundle();
            let ca = CaBundles {
                in_use: config.ca_bundle.as_deref(),
                host: host.as_deref(),
            };
            let fix = deps::remedy(&failure.kind, &config.deps, ca);
            match &fix {
                Some(fix) => eprintln!("{}", how_to_set(fix)),
                None => eprintln!(
                    "   no setting alone fixes this (what to do is said above); fix it and run \
                     setup again"
                ),
            }
            return Err(DependencyStep::Failed(fix));
        }
        Err(e) => {
            eprintln!("python-code-sandbox setup: the dependency install did not run: {e}");
            return Err(DependencyStep::Broken);
        }
    };
    let printed = String::from_utf8_lossy(&execution.stdout);
    if execution.exit_code != 0 || printed.trim() != PROBE_PRINTS {
        eprintln!(
            "python-code-sandbox setup: {PROBE_DEPENDENCY} installed, but importing it exited {}: \
             {}",
            execution.exit_code,
            String::from_utf8_lossy(&execution.stderr).trim()
        );
        return Err(DependencyStep::Broken);
    }
    let how = match &execution.dependencies {
        Some(report) if !report.installed => {
            "found in the dependency cache (installed earlier; the index was not asked this time: \
             `python-code-sandbox cache prune --all` empties the cache)"
        }
        _ => "installed through the installer's egress proxy",
    };
    println!(
        "   ok: {how}, and imported in a sandbox, in {:.1}s",
        took.as_secs_f64()
    );
    Ok(())
}

/// The fix of a failed install, and how to set it.
fn how_to_set(fix: &Remedy) -> String {
    format!(
        "   the setting that fixes it: {fix}\n   \
         set it in the environment the server starts with: in your MCP client's entry for this \
         server, under `env` (`setup --client NAME --write` puts it there: see step 7), or \
         `export {fix}` in the shell that starts `python-code-sandbox`; then run setup again, \
         with it set, to check"
    )
}

/// Steps 1 to 5: engine, runtime, image, doctor, hello world.
async fn first_result(config: &Config, gvisor: bool) -> Result<(), ExitCode> {
    println!("1. engine at {}", crate::engine::docker::endpoint());
    let backend = DockerBackend::for_config(config);
    let docker = match backend.client().await {
        Ok(docker) => docker,
        Err(e) => {
            eprintln!("python-code-sandbox setup: no container engine answers: {e}");
            eprintln!("{}", how_to_get_an_engine());
            return Err(ExitCode::from(EXIT_INFRA));
        }
    };
    println!("   ok: it answers");

    println!("2. runtime of the agent's code");
    runtime(&backend, config, gvisor).await?;

    println!("3. sandbox image {}", config.image);
    println!("   CA bundle: {}", config.ca_bundle_summary());
    if docker.inspect_image(&config.image).await.is_ok() {
        println!("   ok: present");
    } else {
        // The default image and the flavours are built here; any other image is someone's to pull.
        let flavour = image::flavour::for_tag(&config.image);
        let buildable = config.image == DEFAULT_IMAGE || flavour.is_some();
        let verb = if buildable { "building" } else { "pulling" };
        let progress = Progress::start(&format!("   {verb} {}", config.image));
        let made = if buildable {
            let mode = image::BuildMode::Auto;
            super::build_tagged(
                &docker,
                config,
                &config.image,
                flavour,
                mode,
                &progress.sink(),
            )
            .await
        } else {
            image::pull(&docker, &config.image, &progress.sink()).await
        };
        progress.finish(if made.is_ok() { "done" } else { "failed" });
        if let Err(e) = made {
            eprintln!(
                "python-code-sandbox setup: {verb} {} failed: {e}",
                config.image
            );
            return Err(ExitCode::from(EXIT_INFRA));
        }
    }

    println!("4. doctor: what a sandbox enforces, seen from inside one");
    let checked = doctor::doctor(config.clone()).await;
    if checked != ExitCode::SUCCESS {
        eprintln!(
            "python-code-sandbox setup: the doctor found a problem (the FAIL lines above); fix it \
             and run setup again"
        );
        return Err(checked);
    }

    println!("5. hello world in a fresh sandbox");
    let engine = Engine::with_docker(config.clone());
    let hello = engine
        .run_ephemeral(
            Task::Python("print('Hello from the sandbox')"),
            &RunOptions::default(),
        )
        .await;
    engine.settle().await;
    match hello {
        Ok(execution) if execution.exit_code == 0 => {
            println!("   {}", String::from_utf8_lossy(&execution.stdout).trim());
            Ok(())
        }
        Ok(execution) => {
            eprintln!(
                "python-code-sandbox setup: the hello world exited {}: {}",
                execution.exit_code,
                String::from_utf8_lossy(&execution.stderr).trim()
            );
            Err(ExitCode::from(EXIT_INFRA))
        }
        Err(e) => {
            eprintln!("python-code-sandbox setup: the hello world did not run: {e}");
            Err(ExitCode::from(EXIT_INFRA))
        }
    }
}

/// Step 7: the entry that starts this server, printed or written into the client's file, with
/// `fixes` (step 6's) in its `env`.
fn client_configuration(config: &Config, request: &SetupRequest, fixes: &[Remedy]) -> ExitCode {
    let launch = match launch(config, request.via, fixes) {
        Ok(launch) => launch,
        Err(e) => {
            eprintln!("python-code-sandbox setup: {e}");
            return ExitCode::from(EXIT_INFRA);
        }
    };
    let fixed = fixes
        .iter()
        .map(Remedy::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let Some(client) = request.client else {
        println!(
            "7. ready. To wire up a client: python-code-sandbox setup --client \
             claude-desktop|claude-code|vscode|cursor [--write]"
        );
        if !fixes.is_empty() {
            println!("   (its entry's `env` then gets step 6's fix: {fixed})");
        }
        return ExitCode::SUCCESS;
    };
    let home = Home::from_env();
    let file = client.config_file(&home);
    let snippet = client.snippet(&request.name, &launch);
    let pretty = serde_json::to_string_pretty(&snippet).unwrap_or_default();
    let place = file
        .as_deref()
        .map(|f| f.display().to_string())
        .unwrap_or_else(|| "its configuration file".into());
    if !request.write {
        println!("7. {}: add this to {place}:", client.title());
        println!("{pretty}");
        if !fixes.is_empty() {
            println!("   (its `env` has step 6's fix: {fixed})");
        }
        if client == Client::ClaudeCode {
            println!(
                "   (or: claude mcp add --scope user {} -- {})",
                request.name,
                command_line(&launch)
            );
        }
        println!(
            "   or let setup merge it in: add --write (other servers are kept; a backup is made)"
        );
        return ExitCode::SUCCESS;
    }
    let Some(file) = file else {
        eprintln!(
            "python-code-sandbox setup: cannot find {}'s configuration file: HOME is not set",
            client.title()
        );
        return ExitCode::from(EXIT_CONFIG);
    };
    println!("7. {}: {}", client.title(), file.display());
    match write_entry(client, &file, &request.name, &launch) {
        Ok((merged, backup)) => {
            let what = match merged {
                Merged::Added => "added",
                Merged::Replaced => "updated (its previous entry replaced; other servers kept)",
                Merged::Unchanged => "already there, unchanged",
            };
            println!("   {}: {what}", request.name);
            if !launch.env.is_empty() {
                let names: Vec<&str> = launch.env.iter().map(|(name, _)| name.as_str()).collect();
                println!(
                    "   its `env` sets {} (variables of yours there are kept)",
                    names.join(", ")
                );
            }
            if !fixes.is_empty() {
                println!("   step 6's fix is written into its `env`: {fixed}");
            }
            if let Some(backup) = backup {
                println!("   the previous file is kept as {}", backup.display());
            }
            println!("   restart {} to pick it up", client.title());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{pretty}");
            eprintln!(
                "python-code-sandbox setup: not written to {}: {e}",
                file.display()
            );
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// Merges the entry into `file`: backup of the old file first, then an atomic replace.
fn write_entry(
    client: Client,
    file: &Path,
    name: &str,
    launch: &Launch,
) -> Result<(Merged, Option<PathBuf>), String> {
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    let (text, merged) = client_config::merge(client, existing.as_deref(), name, launch)
        .map_err(|e| e.to_string())?;
    if merged == Merged::Unchanged {
        return Ok((merged, None));
    }
    let backup =
        match &existing {
            Some(old) => Some(replace::keep_backup(file, old.as_bytes()).map_err(
                |(backup, e)| format!("cannot keep a backup as {}: {e}", backup.display()),
            )?),
            None => None,
        };
    // The client never reads half a file; the old file's permissions are kept (such files may
    // hold tokens), a new one is readable by its owner only.
    replace::replace(file, text.as_bytes(), 0o600).map_err(|e| e.to_string())?;
    Ok((merged, backup))
}

/// Step 2: which runtime the code will get, and why; with `--gvisor`, gVisor registered first
/// where it is not. An engine that refuses every sandbox stops setup here.
async fn runtime(backend: &DockerBackend, config: &Config, gvisor: bool) -> Result<(), ExitCode> {
    let mut info = backend.info().await.map_err(|e| {
        eprintln!("python-code-sandbox setup: the engine did not describe itself: {e}");
        ExitCode::from(EXIT_INFRA)
    })?;
    if gvisor {
        let say = |step: &str| println!("   {step}");
        match super::gvisor::register(backend, &info, &say).await {
            Ok(super::gvisor::Registered::Already) => {
                println!("   gVisor (runsc) is already registered with {}", info.name)
            }
            Ok(super::gvisor::Registered::Now(engine)) => {
                println!("   ok: gVisor (runsc) registered with {}", info.name);
                info = *engine;
            }
            Err(e) => {
                eprintln!("python-code-sandbox setup: gVisor: {e}");
                return Err(ExitCode::from(EXIT_INFRA));
            }
        }
    }
    match platform::decide(config, info) {
        Ok(platform) => {
            println!(
                "   the agent's code runs under {}: {}",
                platform.code.label(&platform.engine),
                platform.code.why
            );
            if config.network == crate::config::NetworkPolicy::None {
                if let Some(networked) = platform::networked_code(config, &platform.engine) {
                    println!(
                        "   with SANDBOX_NETWORK=allowlist or bridge it would run under {}: {}",
                        networked.label(&platform.engine),
                        networked.why
                    );
                }
            }
            Ok(())
        }
        Err(refusal) => {
            eprintln!("python-code-sandbox setup: no sandbox may start here: {refusal}");
            Err(ExitCode::from(EXIT_INFRA))
        }
    }
}

/// How the client should start this server: this program's path, or uvx when it runs from uv's
/// cache (a path that goes away) or when asked.
fn launch(config: &Config, via: Option<Via>, fixes: &[Remedy]) -> Result<Launch, String> {
    let this =
        std::env::current_exe().map_err(|e| format!("cannot tell where this program is: {e}"))?;
    let this = this.canonicalize().unwrap_or(this);
    let via = via.unwrap_or(if run_by_uvx(&this) {
        Via::Uvx
    } else {
        Via::Path
    });
    let (command, args) = match via {
        Via::Uvx => (
            "uvx".to_string(),
            vec!["python-code-sandbox-mcp".to_string()],
        ),
        Via::Path => (this.display().to_string(), vec![]),
    };
    // A client starts servers with its own environment: what locates the engine must be passed,
    // and what lets the installer reach the index (step 6 checked it with this environment).
    let passed = [
        "DOCKER_HOST",
        "DOCKER_TLS_VERIFY",
        "DOCKER_CERT_PATH",
        SANDBOX_CA_BUNDLE.name,
        SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE.name,
    ];
    let mut env: Vec<(String, String)> = passed
        .into_iter()
        .filter_map(|name| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
            Some((name.to_string(), value))
        })
        .chain(
            (config.image != DEFAULT_IMAGE)
                .then(|| ("SANDBOX_IMAGE".to_string(), config.image.clone())),
        )
        .collect();
    // A fix replaces the variable it names (its value keeps what the setting held).
    for fix in fixes {
        match env.iter_mut().find(|(name, _)| name == fix.name) {
            Some(set) => set.1.clone_from(&fix.value),
            None => env.push((fix.name.to_string(), fix.value.clone())),
        }
    }
    Ok(Launch { command, args, env })
}

/// uvx runs tools from an archive in uv's cache (`…/uv/archive-v0/…`), which uv may clean.
fn run_by_uvx(program: &Path) -> bool {
    program
        .components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with("archive-v"))
}

fn command_line(launch: &Launch) -> String {
    std::iter::once(launch.command.as_str())
        .chain(launch.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_in_uvs_cache_is_launched_through_uvx() {
        assert!(run_by_uvx(Path::new(
            "/home/a/.cache/uv/archive-v0/Xy12/bin/python-code-sandbox"
        )));
        assert!(!run_by_uvx(Path::new(
            "/home/a/.cargo/bin/python-code-sandbox"
        )));
    }
}
