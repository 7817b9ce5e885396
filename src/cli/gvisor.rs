//! `setup --gvisor`: registering gVisor (`runsc`) with a local, rootful Docker engine, with the
//! user's consent (the flag is it), so that the agent's code runs under the strongest runtime.
//!
//! What it does, each step said as it happens, the first that cannot be done stopping with why:
//! 1. checks that it can: Linux, a Docker engine on this machine (a unix socket), rootful, and
//!    this program running as root (it writes the engine's configuration and signals it);
//! 2. finds `runsc` on the PATH, or installs Debian's package with `apt-get` where there is one;
//! 3. finds the `dockerd` serving the endpoint (its `-H`/`--host` arguments) and its
//!    configuration file (`--config-file`, else `/etc/docker/daemon.json`);
//! 4. merges `runtimes.runsc` into that file (every other key kept, the old file backed up,
//!    replaced atomically), registered with `--network=none` like `scripts/runsc.sh`: the code's
//!    sandboxes have no network by default, and a networked policy runs under runc instead;
//! 5. sends `dockerd` SIGHUP (it reloads its runtimes without stopping a container) and waits,
//!    bounded, until the engine lists `runsc`.
//!
//! Everything else (Podman, a remote engine, Docker Desktop) gets the instructions instead:
//! [`platform::how_to_get_gvisor`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::replace;
use crate::engine::backend::{Backend, BackendInfo};
use crate::engine::platform::{self, GVISOR_INSTALL_GUIDE};

/// The name gVisor is registered under (what `SANDBOX_RUNTIME=runsc` and the platform look for).
pub const RUNTIME_NAME: &str = "runsc";
/// The arguments it is registered with (see the module's documentation).
pub const RUNTIME_ARGS: &[&str] = &["--network=none"];
/// Where dockerd reads its configuration when no `--config-file` is given.
const DEFAULT_DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The socket dockerd listens on when no `-H` is given.
const DEFAULT_SOCKET: &str = "unix:///var/run/docker.sock";
/// How long dockerd gets to list the runtime after SIGHUP.
const RELOAD_WAIT: Duration = Duration::from_secs(20);

/// Why gVisor could not be registered; each says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error("{0}")]
    Unsupported(String),
    #[error("registering gVisor changes the engine's configuration and signals it: run as root (sudo python-code-sandbox setup --gvisor)")]
    NotRoot,
    #[error("runsc is not installed and this machine has no apt-get: install gVisor (https://gvisor.dev/docs/user_guide/install/), then run setup --gvisor again")]
    NoRunsc,
    #[error("apt-get install runsc failed ({status}): install gVisor by hand (https://gvisor.dev/docs/user_guide/install/)")]
    Install { status: String },
    #[error("cannot run apt-get: {source}")]
    Spawn {
        #[source]
        source: std::io::Error,
    },
    #[error("no dockerd process serves {endpoint} on this machine (is the engine in a VM or a container?): register runsc where the engine runs ({hint})")]
    NoDaemon {
        endpoint: String,
        hint: &'static str,
    },
    #[error("several dockerd processes could serve {endpoint} (pids {pids}): register runsc by hand in the right one's daemon.json")]
    SeveralDaemons { endpoint: String, pids: String },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a JSON object ({why}): fix it, or add the runsc runtime by hand", path.display())]
    NotJson { path: PathBuf, why: String },
    #[error("cannot keep a backup of {}: {source}", path.display())]
    Backup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] replace::ReplaceError),
    #[error("cannot signal dockerd (pid {pid}): {source}")]
    Signal {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("dockerd did not list runsc within {}s of reloading {}: see its log (a syntax error in the file, or an older dockerd that reloads no runtimes: restart it)", RELOAD_WAIT.as_secs(), path.display())]
    NotReloaded { path: PathBuf },
}

/// What registration did.
#[derive(Debug)]
pub enum Registered {
    /// The engine already listed it: nothing was changed.
    Already,
    /// Written into the engine's configuration (the old file backed up, both said as they
    /// happened) and reloaded; how the engine describes itself since.
    Now(Box<BackendInfo>),
}

/// Registers gVisor with the engine `backend` speaks to (see the module's documentation).
/// `say` is told each step.
pub async fn register(
    backend: &dyn Backend,
    engine: &BackendInfo,
    say: &dyn Fn(&str),
) -> Result<Registered, GvisorError> {
    if engine.runtimes.contains_key(RUNTIME_NAME) {
        return Ok(Registered::Already);
    }
    platform::gvisor_registrable(engine).map_err(GvisorError::Unsupported)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(GvisorError::NotRoot);
    }
    let runsc = match find_on_path("runsc") {
        Some(path) => path,
        None => install_runsc(say)?,
    };
    say(&format!("runsc: {}", runsc.display()));
    let daemon = find_daemon(&engine.endpoint)?;
    let file = daemon.config_file.clone();
    say(&format!(
        "dockerd (pid {}) reads {}",
        daemon.pid,
        file.display()
    ));
    let old = match std::fs::read_to_string(&file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(GvisorError::Read {
                path: file.clone(),
                source,
            })
        }
    };
    let merged = with_runtime(old.as_deref(), &runsc).map_err(|why| GvisorError::NotJson {
        path: file.clone(),
        why,
    })?;
    let backup = match &old {
        Some(text) => Some(
            replace::keep_backup(&file, text.as_bytes())
                .map_err(|(path, source)| GvisorError::Backup { path, source })?,
        ),
        None => None,
    };
    replace::replace(&file, merged.as_bytes(), 0o644)?;
    say(&format!(
        "added runtimes.{RUNTIME_NAME} to {}{}",
        file.display(),
        backup
            .as_ref()
            .map(|b| format!(" (the old file kept as {})", b.display()))
            .unwrap_or_default()
    ));
    // SAFETY: kill with a pid read from /proc and a valid signal number.
    if unsafe { libc::kill(daemon.pid, libc::SIGHUP) } != 0 {
        return Err(GvisorError::Signal {
            pid: daemon.pid,
            source: std::io::Error::last_os_error(),
        });
    }
    say("dockerd reloads its configuration (SIGHUP)");
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        if let Ok(info) = backend.info().await {
            if info.runtimes.contains_key(RUNTIME_NAME) {
                return Ok(Registered::Now(Box::new(info)));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(GvisorError::NotReloaded { path: file });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `daemon.json`'s text with the runtime added (or its entry replaced), every other key kept.
fn with_runtime(old: Option<&str>, runsc: &Path) -> Result<String, String> {
    let mut config = match old.map(str::trim) {
        None | Some("") => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err("its top level is not an object".into()),
            Err(e) => return Err(e.to_string()),
        },
    };
    let runtimes = config
        .entry("runtimes")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(runtimes) = runtimes else {
        return Err("its \"runtimes\" is not an object".into());
    };
    runtimes.insert(
        RUNTIME_NAME.to_string(),
        json!({ "path": runsc.to_string_lossy(), "runtimeArgs": RUNTIME_ARGS }),
    );
    let mut text = serde_json::to_string_pretty(&Value::Object(config))
        .map_err(|e| format!("cannot write it back: {e}"))?;
    text.push('\n');
    Ok(text)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
}

fn install_runsc(say: &dyn Fn(&str)) -> Result<PathBuf, GvisorError> {
    if find_on_path("apt-get").is_none() {
        return Err(GvisorError::NoRunsc);
    }
    let apt = |args: &[&str]| {
        say(&format!("apt-get {}", args.join(" ")));
        std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|source| GvisorError::Spawn { source })
    };
    let mut status = apt(&["install", "-y", "-q", "runsc"])?;
    if !status.success() {
        // A machine that never updated its package lists knows no runsc yet.
        apt(&["update", "-q"])?;
        status = apt(&["install", "-y", "-q", "runsc"])?;
    }
    if !status.success() {
        return Err(GvisorError::Install {
            status: status.to_string(),
        });
    }
    find_on_path("runsc").ok_or(GvisorError::NoRunsc)
}

/// The dockerd that serves an endpoint, and the configuration file it reads.
#[derive(Debug, PartialEq, Eq)]
struct Daemon {
    pid: i32,
    config_file: PathBuf,
}

fn find_daemon(endpoint: &str) -> Result<Daemon, GvisorError> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
                continue;
            };
            if comm.trim() != "dockerd" {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if let Some(config_file) = serves(&args, endpoint) {
                found.push(Daemon { pid, config_file });
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(GvisorError::NoDaemon {
            endpoint: endpoint.to_string(),
            hint: GVISOR_INSTALL_GUIDE,
        }),
        _ => Err(GvisorError::SeveralDaemons {
            endpoint: endpoint.to_string(),
            pids: found
                .iter()
                .map(|d| d.pid.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Whether a dockerd started with `args` (its argv) listens on `endpoint`; if so, the
/// configuration file it reads.
fn serves(args: &[String], endpoint: &str) -> Option<PathBuf> {
    let mut hosts = Vec::new();
    let mut config_file = None;
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| rest.next().cloned());
        match flag {
            "-H" | "--host" => hosts.extend(value()),
            "--config-file" => config_file = value(),
            _ if flag.starts_with("-H") && flag.len() > 2 => hosts.push(flag[2..].to_string()),
            _ => {}
        }
    }
    if hosts.is_empty() {
        hosts.push(DEFAULT_SOCKET.to_string());
    }
    let normal = |h: &str| h.replace("unix:///run/", "unix:///var/run/");
    hosts
        .iter()
        .any(|h| normal(h) == normal(endpoint))
        .then(|| PathBuf::from(config_file.unwrap_or_else(|| DEFAULT_DAEMON_JSON.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_daemon_serving_an_endpoint_is_found_by_its_hosts() {
        let default = argv("dockerd");
        assert_eq!(
            serves(&default, "unix:///var/run/docker.sock"),
            Some(PathBuf::from("/etc/docker/daemon.json"))
        );
        assert_eq!(
            serves(&default, "unix:///run/docker.sock"),
            Some(PathBuf::from("/etc/docker/daemon.json")),
            "/run is /var/run"
        );
        assert_eq!(serves(&default, "unix:///tmp/other.sock"), None);
        let second = argv(
            "dockerd --config-file /tmp/e/daemon.json --data-root /tmp/e/data -H unix:///tmp/e/docker.sock -H tcp://10.0.0.1:2376",
        );
        assert_eq!(
            serves(&second, "unix:///tmp/e/docker.sock"),
            Some(PathBuf::from("/tmp/e/daemon.json"))
        );
        assert_eq!(serves(&second, "unix:///var/run/docker.sock"), None);
        let inline = argv("dockerd --host=unix:///tmp/x.sock --config-file=/tmp/x.json");
        assert_eq!(
            serves(&inline, "unix:///tmp/x.sock"),
            Some(PathBuf::from("/tmp/x.json"))
        );
    }

    #[test]
    fn the_runtime_is_merged_keeping_every_other_key() {
        let runsc = Path::new("/usr/bin/runsc");
        let merged = with_runtime(
            Some(r#"{"log-level": "warn", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}"#),
            runsc,
        )
        .expect("merged");
        let value: Value = serde_json::from_str(&merged).expect("json");
        assert_eq!(value["log-level"], "warn");
        assert_eq!(value["runtimes"]["crun"]["path"], "/usr/bin/crun");
        assert_eq!(value["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert_eq!(
            value["runtimes"]["runsc"]["runtimeArgs"],
            json!(["--network=none"])
        );
        let fresh: Value =
            serde_json::from_str(&with_runtime(None, runsc).expect("new")).expect("json");
        assert_eq!(fresh["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert!(with_runtime(Some("  \n"), runsc).is_ok(), "an empty file");
        assert!(with_runtime(Some("[1]"), runsc).is_err());
        assert!(with_runtime(Some("{ // comment\n}"), runsc).is_err());
        assert!(with_runtime(Some(r#"{"runtimes": []}"#), runsc).is_err());
    }
}
