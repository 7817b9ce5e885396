//! `setup --gvisor`: registering gVisor (`runsc`) with a local, rootful Docker engine, with the
//! user's consent (the flag is it), so that the agent's code runs under the strongest runtime.
//!
//! What it does, each step said as it happens, the first that cannot be done stopping with why:
//! 1. checks that it can: Linux, a Docker engine on this machine (a unix socket), rootful, and
//!    this program running as root (it writes the engine's configuration and signals it);
//! 2. installs the newest `runsc` Debian's archive offers this machine, or upgrades an older one,
//!    with the same step as `scripts/runsc.sh` ([`INSTALL_SCRIPT`], `src/cli/install-runsc.sh`):
//!    on bookworm from bookworm-backports (added as a source when missing, pinned so that only
//!    runsc comes from there), on trixie and later the release's own; without apt-get, the
//!    `runsc` on the PATH as it is;
//! 3. finds the `dockerd` serving the endpoint (its `-H`/`--host` arguments) and its
//!    configuration file (`--config-file`, else `/etc/docker/daemon.json`);
//! 4. merges two entries into that file (every other key kept, the old file backed up, replaced
//!    atomically), like `scripts/runsc.sh`: `runsc` with `--network=none`, for the code's
//!    sandboxes without a network (the default policy), and `runsc-net` for networked sandboxes
//!    and installers (an entry that exists keeps its arguments; only its path is written);
//! 5. sends `dockerd` SIGHUP (it reloads its runtimes without stopping a container) and waits,
//!    bounded, until the engine lists both at that path;
//! 6. starts one container under `runsc-net` on the default bridge ([`PROBE_SCRIPT`],
//!    `src/cli/probe-runsc-network.sh`): gVisor's own network stack is kept where it works; where
//!    runsc refuses it on this host ("cannot run with network enabled in root network
//!    namespace") the entry is written again in host-network mode (`--network=host`) and probed
//!    again; an entry that starts nothing is removed, so networked sandboxes run under runc.
//!
//! Where both are registered already, steps 3 to 6 are done only when step 2 installed or
//! upgraded runsc (a reload, so that new sandboxes run it) or it is at another path than the one
//! registered. Where it cannot be installed here (another machine, Podman, not root), a
//! registered runsc is left as it is, and said so.
//!
//! Everything else (Podman, a remote engine, Docker Desktop) gets the instructions instead:
//! [`platform::how_to_get_gvisor`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::replace;
use crate::engine::backend::{Backend, BackendInfo};
use crate::engine::platform::{self, GVISOR_INSTALL_GUIDE};

/// The name gVisor is registered under for sandboxes without a network (what
/// `SANDBOX_RUNTIME=runsc` and the platform look for).
pub const RUNTIME_NAME: &str = "runsc";
/// The arguments it is registered with (see the module's documentation).
pub const RUNTIME_ARGS: &[&str] = &["--network=none"];
/// The name of gVisor's entry for networked sandboxes and installers.
pub const NETWORKED_NAME: &str = "runsc-net";
/// Its arguments where runsc refuses its own network stack on the host.
pub const HOST_NETWORK_ARGS: &[&str] = &["--network=host"];
/// The probe of a networked entry, shared with `scripts/runsc.sh`: stdout is `works`,
/// `netstack-refused` or `failed REASON` (the script's header says more).
pub const PROBE_SCRIPT: &str = include_str!("probe-runsc-network.sh");
/// Where dockerd reads its configuration when no `--config-file` is given.
const DEFAULT_DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The socket dockerd listens on when no `-H` is given.
const DEFAULT_SOCKET: &str = "unix:///var/run/docker.sock";
/// How long dockerd gets to list the runtime after SIGHUP.
const RELOAD_WAIT: Duration = Duration::from_secs(20);
/// The install step, shared with `scripts/runsc.sh`: stdout is `key=value` lines, the exit status
/// names the cause of a failure (the script's header lists them).
pub const INSTALL_SCRIPT: &str = include_str!("install-runsc.sh");

/// Why gVisor could not be registered; each says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum GvisorError {
    #[error("{0}")]
    Unsupported(String),
    #[error("registering gVisor changes the engine's configuration and signals it: run as root (sudo python-code-sandbox setup --gvisor)")]
    NotRoot,
    #[error("runsc is not installed and this machine has no apt-get: install gVisor (https://gvisor.dev/docs/user_guide/install/), then run setup --gvisor again")]
    NoRunsc,
    #[error("apt-get update failed (its output is above): the mirror or one of the machine's apt sources is unreachable or broken; fix that, or install gVisor by hand (https://gvisor.dev/docs/user_guide/install/)")]
    AptUpdate,
    #[error("the package archive offers this machine no runsc: install gVisor from its own release channel (https://gvisor.dev/docs/user_guide/install/), then run setup --gvisor again")]
    NotInArchive,
    #[error("apt-get install runsc failed (its output is above): install gVisor by hand (https://gvisor.dev/docs/user_guide/install/)")]
    Install,
    #[error(
        "cannot write apt's configuration under /etc/apt (the backports source or the runsc pin)"
    )]
    AptConfig,
    #[error("installing runsc failed ({status}; its output is above)")]
    InstallStep { status: String },
    #[error("the runsc install step said something unexpected: {why}")]
    InstallOutput { why: String },
    #[error("cannot run bash for the runsc install step: {source}")]
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
    #[error("dockerd did not list runsc and runsc-net as {} has them within {}s of reloading it: see its log (a syntax error in the file, or an older dockerd that reloads no runtimes: restart it)", path.display(), RELOAD_WAIT.as_secs())]
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

/// Registers gVisor with the engine `backend` speaks to, installing or upgrading runsc first (see
/// the module's documentation). `say` is told each step.
pub async fn register(
    backend: &dyn Backend,
    engine: &BackendInfo,
    say: &dyn Fn(&str),
) -> Result<Registered, GvisorError> {
    let registered = engine.runtimes.contains_key(RUNTIME_NAME);
    if let Err(why) = platform::gvisor_registrable(engine) {
        if registered {
            say(&format!("runsc is not checked for a newer version: {why}"));
            return Ok(Registered::Already);
        }
        return Err(GvisorError::Unsupported(why));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        if registered {
            say("runsc is not checked for a newer version: that needs root (sudo python-code-sandbox setup --gvisor)");
            return Ok(Registered::Already);
        }
        return Err(GvisorError::NotRoot);
    }
    let installed = install_newest()?;
    say(&installed.said());
    let same_path = |name: &str| {
        engine
            .runtime_paths
            .get(name)
            .is_some_and(|path| same_binary(path, &installed.path))
    };
    if registered && same_path(RUNTIME_NAME) && same_path(NETWORKED_NAME) && !installed.changed {
        return Ok(Registered::Already);
    }
    let daemon = find_daemon(&engine.endpoint)?;
    let file = daemon.config_file.clone();
    say(&format!(
        "dockerd (pid {}) reads {}",
        daemon.pid,
        file.display()
    ));
    write_entries(&file, &installed.path, Networked::Keep, true, say)?;
    let mut info = reload(backend, &daemon, &file, say).await?;
    let mut probe = probe_networked(&engine.endpoint);
    if probe == Probe::NetstackRefused {
        say("runsc-net: runsc refuses gVisor's own network stack on this host (\"cannot run with network enabled in root network namespace\"): host-network mode (--network=host) instead");
        write_entries(&file, &installed.path, Networked::Host, false, say)?;
        info = reload(backend, &daemon, &file, say).await?;
        probe = probe_networked(&engine.endpoint);
    }
    match probe {
        Probe::Works => {
            let args = info
                .runtimes
                .get(NETWORKED_NAME)
                .map(|args| platform::GvisorNetwork::of(args))
                .unwrap_or(platform::GvisorNetwork::Netstack);
            say(&format!(
                "runsc-net starts networked sandboxes with {}",
                args.describe()
            ));
        }
        Probe::NetstackRefused | Probe::Failed(_) => {
            let why = match probe {
                Probe::Failed(why) => why,
                _ => "runsc refuses its network on this host in both modes".to_string(),
            };
            say(&format!(
                "runsc-net starts no networked sandbox here ({why}): removed, so networked \
                 sandboxes run under runc"
            ));
            write_entries(&file, &installed.path, Networked::Remove, false, say)?;
            info = reload(backend, &daemon, &file, say).await?;
        }
    }
    Ok(Registered::Now(Box::new(info)))
}

/// What becomes of the networked entry when the file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Networked {
    /// Its own arguments where it has some, else none (gVisor's own network stack).
    Keep,
    /// Host-network mode.
    Host,
    /// Dropped: it starts nothing here.
    Remove,
}

/// What the probe of the networked entry said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    Works,
    NetstackRefused,
    Failed(String),
}

/// Starts one container under the networked entry on the default bridge (see [`PROBE_SCRIPT`]).
fn probe_networked(endpoint: &str) -> Probe {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(PROBE_SCRIPT)
        .arg("probe-runsc-network")
        .arg(NETWORKED_NAME)
        .env("DOCKER_HOST", endpoint)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output();
    match out {
        Ok(out) if out.status.success() => read_probe(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => Probe::Failed(format!("the probe could not run ({})", out.status)),
        Err(e) => Probe::Failed(format!("cannot run bash for the probe: {e}")),
    }
}

/// The probe's one line, read.
fn read_probe(stdout: &str) -> Probe {
    let line = crate::text::one_line(stdout.trim(), 300);
    match line.as_str() {
        "works" => Probe::Works,
        "netstack-refused" => Probe::NetstackRefused,
        other => Probe::Failed(
            other
                .strip_prefix("failed ")
                .unwrap_or("the probe said nothing it should")
                .to_string(),
        ),
    }
}

/// Sends dockerd SIGHUP and waits, bounded, until the engine lists the runtimes as `file` has
/// them; how the engine describes itself then.
async fn reload(
    backend: &dyn Backend,
    daemon: &Daemon,
    file: &Path,
    say: &dyn Fn(&str),
) -> Result<BackendInfo, GvisorError> {
    // SAFETY: kill with a pid read from /proc and a valid signal number.
    if unsafe { libc::kill(daemon.pid, libc::SIGHUP) } != 0 {
        return Err(GvisorError::Signal {
            pid: daemon.pid,
            source: std::io::Error::last_os_error(),
        });
    }
    say("dockerd reloads its configuration (SIGHUP): new sandboxes run this runsc");
    let written = std::fs::read_to_string(file)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|value| value.get("runtimes").cloned())
        .unwrap_or(Value::Null);
    let args_of = |name: &str| -> Option<Vec<String>> {
        let entry = written.get(name)?;
        Some(
            entry
                .get("runtimeArgs")
                .and_then(Value::as_array)
                .map(|args| {
                    args.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        )
    };
    let expected = [
        (RUNTIME_NAME, args_of(RUNTIME_NAME)),
        (NETWORKED_NAME, args_of(NETWORKED_NAME)),
    ];
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        if let Ok(info) = backend.info().await {
            let listed = expected
                .iter()
                .all(|(name, args)| info.runtimes.get(*name) == args.as_ref());
            if listed {
                return Ok(info);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(GvisorError::NotReloaded {
                path: file.to_path_buf(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Writes the runtimes' entries into dockerd's configuration file (the old file backed up on
/// the first write of a registration: a backup is the file as it was before setup).
fn write_entries(
    file: &Path,
    runsc: &Path,
    networked: Networked,
    first: bool,
    say: &dyn Fn(&str),
) -> Result<(), GvisorError> {
    let old = match std::fs::read_to_string(file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(GvisorError::Read {
                path: file.to_path_buf(),
                source,
            })
        }
    };
    let merged =
        with_runtimes(old.as_deref(), runsc, networked).map_err(|why| GvisorError::NotJson {
            path: file.to_path_buf(),
            why,
        })?;
    if old.as_deref() == Some(merged.as_str()) {
        return Ok(());
    }
    let backup = match &old {
        Some(text) if first => Some(
            replace::keep_backup(file, text.as_bytes())
                .map_err(|(path, source)| GvisorError::Backup { path, source })?,
        ),
        _ => None,
    };
    replace::replace(file, merged.as_bytes(), 0o644)?;
    say(&format!(
        "wrote runtimes.{RUNTIME_NAME}{} ({}) into {}{}",
        match networked {
            Networked::Remove => format!(" (and removed runtimes.{NETWORKED_NAME})"),
            Networked::Host => format!(" and runtimes.{NETWORKED_NAME} in host-network mode"),
            Networked::Keep => format!(" and runtimes.{NETWORKED_NAME}"),
        },
        runsc.display(),
        file.display(),
        backup
            .as_ref()
            .map(|b| format!(" (the old file kept as {})", b.display()))
            .unwrap_or_default()
    ));
    Ok(())
}

/// Whether the engine's runtime path (absolute, or a name it looks up on its PATH) is `binary`.
fn same_binary(registered: &str, binary: &Path) -> bool {
    let registered = if registered.contains('/') {
        Some(PathBuf::from(registered))
    } else {
        find_on_path(registered)
    };
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    registered.is_some_and(|r| canonical(&r) == canonical(binary))
}

/// The runsc the install step left, as it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub path: PathBuf,
    /// What `runsc --version` says (empty when it said nothing).
    pub version: String,
    /// The archive suite and mirror it came from, or why that is unknown.
    pub from: String,
    /// The version before, when there was one.
    pub previous: Option<String>,
    /// This run installed or upgraded it.
    pub changed: bool,
}

impl Installed {
    fn said(&self) -> String {
        let version = if self.version.is_empty() {
            "(version unknown)"
        } else {
            &self.version
        };
        let what = match (&self.previous, self.changed) {
            (Some(previous), true) => format!("upgraded from {previous}"),
            (None, true) => "installed now".to_string(),
            (_, false) => "the newest offered, already installed".to_string(),
        };
        format!(
            "runsc {version} at {}, from {} ({what})",
            self.path.display(),
            self.from
        )
    }
}

/// The install step's stdout, read.
fn parse_installed(stdout: &str) -> Result<Installed, String> {
    let field = |key: &str| {
        stdout.lines().find_map(|line| {
            line.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix('='))
                .map(str::trim)
        })
    };
    let path = field("path")
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| format!("no absolute path= in {stdout:?}"))?;
    let changed = match field("changed") {
        Some("yes") => true,
        Some("no") => false,
        other => return Err(format!("changed={other:?} is neither yes nor no")),
    };
    Ok(Installed {
        path: PathBuf::from(path),
        version: field("version").unwrap_or_default().to_string(),
        from: field("from")
            .filter(|f| !f.is_empty())
            .unwrap_or("an unknown source")
            .to_string(),
        previous: field("previous")
            .filter(|p| !p.is_empty())
            .map(str::to_string),
        changed,
    })
}

/// The install step's failure, from its exit status (see the script's header).
fn install_failure(code: Option<i32>, status: String) -> GvisorError {
    match code {
        Some(10) => GvisorError::NotRoot,
        Some(11) => GvisorError::NoRunsc,
        Some(12) => GvisorError::AptUpdate,
        Some(13) => GvisorError::NotInArchive,
        Some(14) => GvisorError::Install,
        Some(15) => GvisorError::AptConfig,
        _ => GvisorError::InstallStep { status },
    }
}

/// Runs the install step: the newest runsc the archive offers, installed or upgraded. Its log
/// goes to this program's stderr as it happens.
fn install_newest() -> Result<Installed, GvisorError> {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(INSTALL_SCRIPT)
        .arg("install-runsc")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| GvisorError::Spawn { source })?;
    if !out.status.success() {
        return Err(install_failure(out.status.code(), out.status.to_string()));
    }
    parse_installed(&String::from_utf8_lossy(&out.stdout))
        .map_err(|why| GvisorError::InstallOutput { why })
}

/// `daemon.json`'s text with both runtimes added (or their entries' paths replaced), every
/// other key kept.
fn with_runtimes(old: Option<&str>, runsc: &Path, networked: Networked) -> Result<String, String> {
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
    // Arguments an entry has already (an administrator's) are kept; only the path is new.
    let kept = |runtimes: &Map<String, Value>, name: &str| {
        runtimes
            .get(name)
            .and_then(|entry| entry.get("runtimeArgs"))
            .filter(|args| args.is_array())
            .cloned()
    };
    let args = kept(runtimes, RUNTIME_NAME).unwrap_or_else(|| json!(RUNTIME_ARGS));
    runtimes.insert(
        RUNTIME_NAME.to_string(),
        json!({ "path": runsc.to_string_lossy(), "runtimeArgs": args }),
    );
    let networked_args = match networked {
        Networked::Remove => None,
        Networked::Host => Some(json!(HOST_NETWORK_ARGS)),
        Networked::Keep => Some(kept(runtimes, NETWORKED_NAME).unwrap_or_else(|| json!([]))),
    };
    match networked_args {
        Some(args) => {
            runtimes.insert(
                NETWORKED_NAME.to_string(),
                json!({ "path": runsc.to_string_lossy(), "runtimeArgs": args }),
            );
        }
        None => {
            runtimes.remove(NETWORKED_NAME);
        }
    }
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
        let merged = with_runtimes(
            Some(r#"{"log-level": "warn", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}"#),
            runsc,
            Networked::Keep,
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
            serde_json::from_str(&with_runtimes(None, runsc, Networked::Keep).expect("new"))
                .expect("json");
        assert_eq!(fresh["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert!(
            with_runtimes(Some("  \n"), runsc, Networked::Keep).is_ok(),
            "an empty file"
        );
        assert!(with_runtimes(Some("[1]"), runsc, Networked::Keep).is_err());
        assert!(with_runtimes(Some("{ // comment\n}"), runsc, Networked::Keep).is_err());
        assert!(with_runtimes(Some(r#"{"runtimes": []}"#), runsc, Networked::Keep).is_err());
        let kept: Value = serde_json::from_str(
            &with_runtimes(
                Some(r#"{"runtimes": {"runsc": {"path": "/usr/local/bin/runsc", "runtimeArgs": ["--network=none", "--platform=ptrace"]}}}"#),
                runsc,
                Networked::Keep,
            )
            .expect("merged"),
        )
        .expect("json");
        assert_eq!(kept["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert_eq!(
            kept["runtimes"]["runsc"]["runtimeArgs"],
            json!(["--network=none", "--platform=ptrace"]),
            "an existing entry's arguments are kept"
        );
    }

    #[test]
    fn the_networked_entry_is_kept_switched_to_host_mode_or_removed() {
        let runsc = Path::new("/usr/bin/runsc");
        let entry = |text: &str| -> Value {
            serde_json::from_str::<Value>(text).expect("json")["runtimes"].clone()
        };
        let fresh = entry(&with_runtimes(None, runsc, Networked::Keep).expect("new"));
        assert_eq!(fresh["runsc-net"]["path"], "/usr/bin/runsc");
        assert_eq!(
            fresh["runsc-net"]["runtimeArgs"],
            json!([]),
            "gVisor's own stack first"
        );
        let old = r#"{"runtimes": {"runsc": {"path": "/old/runsc", "runtimeArgs": ["--network=none"]},
                      "runsc-net": {"path": "/old/runsc", "runtimeArgs": ["--network=host", "--debug"]}}}"#;
        let kept = entry(&with_runtimes(Some(old), runsc, Networked::Keep).expect("kept"));
        assert_eq!(kept["runsc-net"]["path"], "/usr/bin/runsc");
        assert_eq!(
            kept["runsc-net"]["runtimeArgs"],
            json!(["--network=host", "--debug"])
        );
        let host = entry(&with_runtimes(Some(old), runsc, Networked::Host).expect("host"));
        assert_eq!(host["runsc-net"]["runtimeArgs"], json!(["--network=host"]));
        assert_eq!(host["runsc"]["runtimeArgs"], json!(["--network=none"]));
        let removed = entry(&with_runtimes(Some(old), runsc, Networked::Remove).expect("removed"));
        assert!(removed.get("runsc-net").is_none());
        assert_eq!(removed["runsc"]["path"], "/usr/bin/runsc");
    }

    #[test]
    fn the_probes_line_is_read() {
        assert_eq!(read_probe("works\n"), Probe::Works);
        assert_eq!(read_probe("netstack-refused\n"), Probe::NetstackRefused);
        assert_eq!(
            read_probe("failed docker: Error response from daemon: Unknown runtime\n"),
            Probe::Failed("docker: Error response from daemon: Unknown runtime".into())
        );
        assert!(matches!(read_probe(""), Probe::Failed(_)));
        assert!(matches!(read_probe("works\x1b[2J"), Probe::Failed(_)));
    }

    #[test]
    fn the_install_steps_output_is_read() {
        let upgraded = parse_installed(
            "path=/usr/bin/runsc\nversion=0.0~20240729.0\nfrom=bookworm-backports (http://deb.debian.org/debian)\nprevious=0.0~20221219.0\nchanged=yes\n",
        )
        .expect("read");
        assert_eq!(
            upgraded,
            Installed {
                path: PathBuf::from("/usr/bin/runsc"),
                version: "0.0~20240729.0".into(),
                from: "bookworm-backports (http://deb.debian.org/debian)".into(),
                previous: Some("0.0~20221219.0".into()),
                changed: true,
            }
        );
        assert!(upgraded.said().contains("upgraded from 0.0~20221219.0"));
        let fresh =
            parse_installed("path=/usr/bin/runsc\nversion=\nfrom=\nprevious=\nchanged=no\n")
                .expect("read");
        assert_eq!(fresh.previous, None);
        assert!(!fresh.changed);
        assert_eq!(fresh.from, "an unknown source");
        assert!(parse_installed("").is_err());
        assert!(
            parse_installed("path=runsc\nchanged=no\n").is_err(),
            "not absolute"
        );
        assert!(parse_installed("path=/usr/bin/runsc\nchanged=maybe\n").is_err());
    }

    #[test]
    fn each_exit_status_of_the_install_step_names_its_cause() {
        let cause = |code| install_failure(Some(code), format!("exit status: {code}"));
        assert!(matches!(cause(10), GvisorError::NotRoot));
        assert!(matches!(cause(11), GvisorError::NoRunsc));
        assert!(matches!(cause(12), GvisorError::AptUpdate));
        assert!(matches!(cause(13), GvisorError::NotInArchive));
        assert!(matches!(cause(14), GvisorError::Install));
        assert!(matches!(cause(15), GvisorError::AptConfig));
        assert!(matches!(cause(1), GvisorError::InstallStep { .. }));
        assert!(matches!(
            install_failure(None, "signal: 9".into()),
            GvisorError::InstallStep { .. }
        ));
        // The script exits with each of them somewhere (and lists them in its header).
        for code in 10..=15 {
            let exits = |end: &str| INSTALL_SCRIPT.contains(&format!("exit {code}{end}"));
            assert!(exits(";") || exits("\n"), "exit {code}");
        }
    }
}
