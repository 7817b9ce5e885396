//! The probe sandbox: a session of the doctor's own, in which a script reports what the sandbox
//! sees; while it exists the engine's record of it is read (and, on this machine, the host
//! cgroup that holds it); last, an allocation past the memory limit must be stopped.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::host::{self, CgroupValue, HostCgroup};
use crate::engine::backend::{BackendError, LimitsRecord, SandboxId};
use crate::engine::sessions::Scope;
use crate::engine::{Engine, EngineError, RunOptions, Task};

/// Runs inside the probe sandbox and prints what the sandbox sees, as JSON.
const PROBE: &str = r#"
import ctypes, json, os, resource, socket
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
status = {}
for line in open("/proc/self/status").read().splitlines():
    key, _, value = line.partition(":")
    status[key] = value.strip()
meminfo = {}
for line in (read("/proc/meminfo") or "").splitlines():
    key, _, value = line.partition(":")
    meminfo[key] = value.strip()
try:
    # PR_GET_NO_NEW_PRIVS: what the sandbox's kernel (the host's, or gVisor's) says of this process.
    prctl_nnp = ctypes.CDLL(None, use_errno=True).prctl(39, 0, 0, 0, 0)
except (OSError, AttributeError):
    prctl_nnp = None
try:
    open("/.doctor-probe", "w")
    root_writable = True
except OSError:
    root_writable = False
total = meminfo.get("MemTotal", "")
print(json.dumps({
    "uid": os.getuid(),
    "cap_eff": status.get("CapEff"),
    "no_new_privs": status.get("NoNewPrivs"),
    "prctl_no_new_privs": prctl_nnp,
    "pids_max": read("/sys/fs/cgroup/pids.max") or read("/sys/fs/cgroup/pids/pids.max"),
    "memory_max": read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "mem_total_kib": int(total.split()[0]) if total.endswith(" kB") else None,
    "swap_max": read("/sys/fs/cgroup/memory.swap.max"),
    "memsw_max": read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"),
    "cpu_max": read("/sys/fs/cgroup/cpu.max"),
    "cfs_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or read("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
    "cfs_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or read("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"),
    "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    # The kernel's own list (netlink): gVisor's sysfs has no /sys/class/net since its 2023
    # releases.
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "root_writable": root_writable,
    "workspace_writable": os.access("/workspace", os.W_OK),
    "kernel": (read("/proc/version") or "?")[:120],
}))
"#;

/// What the probe script saw inside the sandbox. Every field is the sandbox's word: absent or
/// unreadable values stay `None`, and each check says what that means.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Seen {
    pub uid: Option<i64>,
    pub cap_eff: Option<String>,
    /// `NoNewPrivs` of `/proc/self/status` (gVisor does not show it).
    pub no_new_privs: Option<String>,
    pub prctl_no_new_privs: Option<i64>,
    pub pids_max: Option<String>,
    pub memory_max: Option<String>,
    /// `MemTotal` of `/proc/meminfo`: gVisor sets it to the sandbox's memory limit.
    pub mem_total_kib: Option<u64>,
    pub swap_max: Option<String>,
    pub memsw_max: Option<String>,
    pub cpu_max: Option<String>,
    pub cfs_quota: Option<String>,
    pub cfs_period: Option<String>,
    pub nofile: Vec<i64>,
    pub interfaces: Vec<String>,
    pub root_writable: Option<bool>,
    pub workspace_writable: Option<bool>,
    pub kernel: Option<String>,
}

/// What became of an allocation past the memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrun {
    /// The process that allocated was killed (SIGKILL: the kernel's OOM killer), the rest of the
    /// sandbox went on (runc).
    ProcessKilled,
    /// The allocation was refused (MemoryError).
    Refused,
    /// The whole sandbox was stopped for memory (gVisor: its sandbox process is what the host's
    /// OOM killer sees).
    SandboxKilled,
    /// It was not stopped, or ended otherwise: what happened.
    NotStopped(String),
}

/// How far past the limit the overrun probe allocates: a quarter more, at least 64 MiB.
pub fn overrun_bytes(limit: u64) -> u64 {
    limit.saturating_add((limit / 4).max(64 << 20))
}

/// The overrun probe is run only up to this limit (it allocates past it: seconds at most).
pub const OVERRUN_UP_TO: u64 = 4 << 30;

/// A child process allocates (and touches) `bytes`; the parent reports how it ended.
fn overrun_script(bytes: u64) -> String {
    format!(
        r#"
import json, os
size, chunk = {bytes}, 16 << 20
pid = os.fork()
if pid == 0:
    held, total = [], 0
    try:
        while total < size:
            block = bytearray(chunk)
            block[::4096] = b"\x01" * len(range(0, chunk, 4096))
            held.append(block)
            total += chunk
    except MemoryError:
        os._exit(3)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({{
    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
}}))
"#
    )
}

/// Everything the probe found.
#[derive(Debug, Clone, Default)]
pub struct Findings {
    pub seen: Seen,
    pub record: LimitsRecord,
    /// The host cgroup, when the engine is on this machine and it could be read.
    pub host: Option<HostCgroup>,
    /// Why the host cgroup was not read (a remote engine, another PID namespace).
    pub host_missing: Option<String>,
    /// The allocation past the limit, when it was tried.
    pub overrun: Option<Overrun>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("the probe failed: {0}")]
    Failed(String),
    #[error("unreadable probe output: {0}")]
    Unreadable(#[from] serde_json::Error),
    #[error("the engine's record of the probe sandbox: {0}")]
    Record(#[from] BackendError),
}

/// The probe's time limit (the configured one may be shorter than a gVisor start needs, or long).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the doctor's session, probes, and stops it (whatever happened).
pub async fn run(engine: &Engine, local: bool) -> Result<Findings, ProbeError> {
    let options = RunOptions {
        timeout: Some(PROBE_TIMEOUT),
        ..RunOptions::default()
    };
    let id = engine.create_session(Scope::Server, &options).await?;
    let findings = probe(engine, &id, local, &options).await;
    match engine.stop_session(Scope::Server, &id).await {
        // An overrun that stopped the whole sandbox ended the session already.
        Ok(_) | Err(EngineError::SessionEnded { .. }) | Err(EngineError::UnknownSession(_)) => {}
        Err(e) => tracing::warn!(session = %id, "the doctor's session did not stop: {e}"),
    }
    findings
}

async fn probe(
    engine: &Engine,
    id: &str,
    local: bool,
    options: &RunOptions,
) -> Result<Findings, ProbeError> {
    let execution = engine
        .execute_in_session(Scope::Server, id, Task::Python(PROBE), options)
        .await?;
    if !execution.succeeded() {
        return Err(ProbeError::Failed(
            String::from_utf8_lossy(&execution.stderr).into_owned(),
        ));
    }
    let seen: Seen = serde_json::from_slice(&execution.stdout)?;
    let record = engine
        .backend()
        .limits_record(&SandboxId(id.to_string()))
        .await?;
    let mut findings = Findings {
        seen,
        record,
        ..Findings::default()
    };
    match (local, findings.record.host_pid) {
        (false, _) => {
            findings.host_missing =
                Some("the engine is on another machine: its host cgroup is not read".into())
        }
        (true, None) => {
            findings.host_missing = Some("the engine names no host process of the sandbox".into())
        }
        (true, Some(pid)) => {
            match host::read(Path::new("/proc"), Path::new("/sys/fs/cgroup"), pid, id) {
                Ok(cgroup) => findings.host = Some(cgroup),
                Err(e) => findings.host_missing = Some(format!("host cgroup not read: {e}")),
            }
        }
    }
    // Only where the host kernel is seen to hold the limit (so the allocation is stopped there
    // and never reaches the host's other memory), and a small one: then an allocation past it.
    let limit = engine.config().limits.memory_bytes;
    let held_by_host = findings
        .host
        .as_ref()
        .and_then(|host| host.memory)
        .is_some_and(|memory| matches!(memory, CgroupValue::Max(bytes) if bytes <= limit));
    if held_by_host && limit <= OVERRUN_UP_TO {
        findings.overrun = Some(overrun(engine, id, limit, options).await);
    }
    Ok(findings)
}

async fn overrun(engine: &Engine, id: &str, limit: u64, options: &RunOptions) -> Overrun {
    #[derive(Deserialize)]
    struct Ended {
        signal: Option<i32>,
        exit: Option<i32>,
    }
    let script = overrun_script(overrun_bytes(limit));
    let backend = engine.backend();
    let sandbox = SandboxId(id.to_string());
    let ooms_before = backend.oom_count(&sandbox).await;
    let result = engine
        .execute_in_session(Scope::Server, id, Task::Python(&script), options)
        .await;
    match result {
        Ok(execution) if execution.out_of_memory => Overrun::ProcessKilled,
        Ok(execution) if execution.succeeded() => {
            match serde_json::from_slice::<Ended>(&execution.stdout) {
                Ok(Ended {
                    signal: Some(9), ..
                }) => Overrun::ProcessKilled,
                Ok(Ended { exit: Some(3), .. }) => Overrun::Refused,
                Ok(Ended {
                    signal: Some(signal),
                    ..
                }) => {
                    Overrun::NotStopped(format!("the allocating process died of signal {signal}"))
                }
                // Under gVisor since its 2023 releases the kernel's kill takes one of gVisor's own
                // processes (a systrap stub), and the allocating process exits with 1: the
                // engine's `oom` event says what happened.
                Ok(Ended { exit, .. })
                    if exit != Some(0)
                        && memory_kill_said(backend.as_ref(), &sandbox, ooms_before).await =>
                {
                    Overrun::ProcessKilled
                }
                Ok(Ended { exit, .. }) => Overrun::NotStopped(format!(
                    "a process allocated {} bytes, past the limit, and exited with {}",
                    overrun_bytes(limit),
                    exit.map_or_else(|| "?".to_string(), |e| e.to_string())
                )),
                Err(e) => Overrun::NotStopped(format!("unreadable overrun probe output: {e}")),
            }
        }
        Ok(execution) => Overrun::NotStopped(format!(
            "the overrun probe failed: {}",
            String::from_utf8_lossy(&execution.stderr).trim()
        )),
        // The engine's word for a sandbox whose engine says it was killed for memory (the
        // engine's own tests hold it to these words).
        Err(EngineError::SandboxLost(reason)) if reason.contains("ran out of memory") => {
            Overrun::SandboxKilled
        }
        Err(e) => Overrun::NotStopped(e.to_string()),
    }
}

/// Whether the engine said (within two seconds: its events trail the exit) that the kernel
/// stopped a process of the sandbox for memory since it counted `before`.
async fn memory_kill_said(
    backend: &dyn crate::engine::backend::Backend,
    sandbox: &SandboxId,
    before: Option<u64>,
) -> bool {
    let Some(before) = before else {
        return false;
    };
    for _ in 0..10 {
        if backend
            .oom_count(sandbox)
            .await
            .is_some_and(|now| now > before)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_output_is_read_with_missing_fields_as_none() {
        let seen: Seen = serde_json::from_str(
            r#"{"uid": 1000, "prctl_no_new_privs": 1, "mem_total_kib": 524288,
                "nofile": [1024, 4096], "interfaces": ["lo"], "unknown": 3}"#,
        )
        .expect("readable");
        assert_eq!(seen.uid, Some(1000));
        assert_eq!(seen.mem_total_kib, Some(524288));
        assert_eq!(seen.pids_max, None);
        assert_eq!(seen.nofile, vec![1024, 4096]);
    }

    #[test]
    fn the_overrun_goes_past_the_limit() {
        assert_eq!(overrun_bytes(512 << 20), 640 << 20);
        assert_eq!(overrun_bytes(128 << 20), 192 << 20);
        assert!(overrun_script(1 << 30).contains("size, chunk = 1073741824, 16 << 20"));
    }
}
