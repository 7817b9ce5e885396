//! `doctor`: what is really enforced, read from inside a probe sandbox rather than assumed.

use std::process::ExitCode;

use crate::config::{Config, NetworkPolicy};
use crate::engine::backend::BackendInfo;
use crate::engine::docker::image;
use crate::engine::{Engine, EngineError, RunOptions, Task};

/// Runs inside the probe sandbox and prints what the sandbox sees, as JSON.
const PROBE: &str = r#"
import json, os
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
try:
    open("/.doctor-probe", "w")
    root_writable = True
except OSError:
    root_writable = False
print(json.dumps({
    "uid": os.getuid(),
    "cap_eff": status.get("CapEff"),
    "no_new_privs": status.get("NoNewPrivs"),
    "pids_max": read("/sys/fs/cgroup/pids.max") or read("/sys/fs/cgroup/pids/pids.max"),
    "memory_max": read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "swap_max": read("/sys/fs/cgroup/memory.swap.max"),
    "cpu_max": read("/sys/fs/cgroup/cpu.max"),
    "cfs_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or read("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
    "cfs_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or read("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"),
    "nofile": list(__import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)),
    "memsw_max": read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "root_writable": root_writable,
    "workspace_writable": os.access("/workspace", os.W_OK),
    "kernel": (read("/proc/version") or "?")[:120],
}))
"#;

struct Report {
    failures: usize,
    /// A runtime such as gVisor hides some kernel facts from inside the sandbox.
    runtime: Option<String>,
}

impl Report {
    /// A check whose value the sandbox could not see: a failure with the default runtime, only
    /// a note under another one (which enforces it outside what the sandbox can read).
    fn unseen_or(&mut self, seen: bool, ok: bool, what: &str, detail: impl std::fmt::Display) {
        match (&self.runtime, seen) {
            (Some(runtime), false) => println!(
                "n/a  {what}: set on the sandbox by the engine, not visible from inside {runtime}"
            ),
            _ => self.line(ok, what, detail),
        }
    }

    fn line(&mut self, ok: bool, what: &str, detail: impl std::fmt::Display) {
        if !ok {
            self.failures += 1;
        }
        println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    }
}

pub async fn doctor(config: Config) -> ExitCode {
    let mut report = Report {
        failures: 0,
        runtime: None,
    };
    let engine = Engine::with_docker(config.clone());
    let backend = engine.backend();
    let platform = match engine.platform().await {
        Ok(platform) => platform,
        Err(EngineError::Refused(refusal)) => {
            if let Ok(info) = backend.info().await {
                describe_engine(&mut report, &info);
            }
            report.line(false, "sandboxes", refusal);
            return ExitCode::FAILURE;
        }
        Err(e) => {
            report.line(false, "engine", e);
            if config.remote_engine {
                println!(
                    "     check that {} answers: the network, and the TLS certificates \
                     (DOCKER_CERT_PATH) or the ssh login",
                    crate::engine::docker::endpoint()
                );
            } else {
                for line in super::setup::how_to_get_an_engine().lines() {
                    println!("     {line}");
                }
            }
            return ExitCode::FAILURE;
        }
    };
    describe_engine(&mut report, &platform.engine);
    report.line(
        true,
        "runtime",
        format!(
            "the agent's code runs under {}: {}",
            platform.code.label(&platform.engine),
            platform.code.why
        ),
    );
    if platform.installer != platform.code {
        report.line(
            true,
            "installer runtime",
            format!(
                "{}: {}",
                platform.installer.label(&platform.engine),
                platform.installer.why
            ),
        );
    }
    if platform.code.gvisor {
        report.runtime = platform.code.name.clone();
    }
    if backend.image_id(&config.image).await.is_err() {
        report.line(
            false,
            "image",
            format!(
                "{} is missing: {}",
                config.image,
                image::missing_hint(&config.image)
            ),
        );
        return ExitCode::FAILURE;
    }
    report.line(true, "image", &config.image);

    let execution = engine
        .run_ephemeral(Task::Python(PROBE), &RunOptions::default())
        .await;
    engine.settle().await;
    engine.stop_egress().await;
    let execution = match execution {
        Ok(execution) if execution.succeeded() => execution,
        Ok(execution) => {
            report.line(
                false,
                "probe sandbox",
                String::from_utf8_lossy(&execution.stderr),
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            report.line(false, "probe sandbox", e);
            return ExitCode::FAILURE;
        }
    };
    let seen: serde_json::Value = match serde_json::from_slice(&execution.stdout) {
        Ok(seen) => seen,
        Err(e) => {
            report.line(
                false,
                "probe sandbox",
                format!("unreadable probe output: {e}"),
            );
            return ExitCode::FAILURE;
        }
    };
    check_probe(&mut report, &config, &seen);
    if report.failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn check_probe(report: &mut Report, config: &Config, seen: &serde_json::Value) {
    let text = |key: &str| seen[key].as_str().unwrap_or("?").to_string();
    let uid = seen["uid"].as_i64().unwrap_or(-1);
    report.line(
        uid > 0,
        "user",
        format!("uid {uid}{}", if uid > 0 { " (not root)" } else { "" }),
    );
    let caps = text("cap_eff");
    report.line(
        caps.trim_start_matches('0').is_empty(),
        "capabilities",
        format!("effective set {caps}"),
    );
    let seen_text = |key: &str| seen[key].as_str().is_some();
    report.unseen_or(
        seen_text("no_new_privs"),
        text("no_new_privs") == "1",
        "no-new-privileges",
        text("no_new_privs"),
    );
    let pids = text("pids_max");
    report.unseen_or(
        seen_text("pids_max"),
        pids == config.limits.pids.to_string(),
        "pids limit",
        &pids,
    );
    let memory = text("memory_max");
    report.unseen_or(
        seen_text("memory_max"),
        memory == config.limits.memory_bytes.to_string(),
        "memory limit",
        format!("{memory} bytes"),
    );
    // cgroup v2 shows the swap limit itself; v1 shows memory+swap, which must equal memory.
    let (swap_ok, swap) = match (seen["swap_max"].as_str(), seen["memsw_max"].as_str()) {
        (Some(swap), _) => (swap == "0", format!("swap.max {swap}")),
        (None, Some(memsw)) => (memsw == memory, format!("memory+swap {memsw} bytes")),
        (None, None) => (false, "unknown".to_string()),
    };
    let swap_seen = seen_text("swap_max") || seen_text("memsw_max");
    report.unseen_or(swap_seen, swap_ok, "no swap", swap);
    // cgroup v2: "quota period"; v1: the two files.
    let cpu = match (
        seen["cpu_max"].as_str(),
        seen["cfs_quota"].as_str(),
        seen["cfs_period"].as_str(),
    ) {
        (Some(max), _, _) => max
            .split_once(' ')
            .map(|(q, p)| (q.to_string(), p.to_string())),
        (None, Some(quota), Some(period)) => Some((quota.to_string(), period.to_string())),
        _ => None,
    };
    let cpus = cpu.as_ref().and_then(|(quota, period)| {
        let (quota, period) = (quota.parse::<f64>().ok()?, period.parse::<f64>().ok()?);
        (quota > 0.0 && period > 0.0).then(|| quota / period)
    });
    report.unseen_or(
        cpu.is_some(),
        cpus.is_some_and(|cpus| (cpus - config.limits.cpus).abs() < 0.01),
        "CPU limit",
        cpus.map(|c| format!("{c:.2} CPUs"))
            .unwrap_or_else(|| "none".to_string()),
    );
    let nofile: Vec<i64> = seen["nofile"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_i64()).collect())
        .unwrap_or_default();
    report.line(
        nofile.len() == 2 && nofile.iter().all(|n| *n > 0),
        "open files",
        match nofile.as_slice() {
            [soft, hard] => format!("at most {soft} (hard {hard})"),
            _ => "unlimited".to_string(),
        },
    );
    report.line(true, "kernel", text("kernel"));
    let interfaces: Vec<String> = seen["interfaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let network_ok = match config.network {
        NetworkPolicy::None => interfaces == ["lo"],
        NetworkPolicy::Bridge | NetworkPolicy::Allowlist => interfaces.len() > 1,
    };
    report.line(
        network_ok,
        "network",
        format!(
            "{} (policy {})",
            interfaces.join(", "),
            config.network.as_str()
        ),
    );
    if config.network == NetworkPolicy::Allowlist {
        // The probe ran on an egress network of its own: the proxy started, and was asked.
        report.line(
            true,
            "egress",
            format!(
                "each sandbox on an internal network of its own (from {}) with the server's proxy \
                 (uplink {}); {} allow and {} ask entries",
                config.egress.subnets,
                config.egress.uplink,
                config.egress.allow.entries.len(),
                config.egress.ask.entries.len()
            ),
        );
    }
    let root_writable = seen["root_writable"].as_bool().unwrap_or(true);
    report.line(
        !root_writable,
        "read-only root",
        if root_writable { "writable!" } else { "yes" },
    );
    let workspace = seen["workspace_writable"].as_bool().unwrap_or(false);
    report.line(
        workspace,
        "workspace",
        if workspace {
            "/workspace writable"
        } else {
            "/workspace not writable"
        },
    );
}

/// The engine line: which engine, where, with or without root; and, for an engine on another
/// machine, which settings name paths there.
fn describe_engine(report: &mut Report, info: &BackendInfo) {
    report.line(
        true,
        "engine",
        format!(
            "{} (API {}), {}, {} at {}{}",
            info.name,
            info.api_version,
            if info.rootless { "rootless" } else { "rootful" },
            if info.remote { "remote" } else { "local" },
            info.endpoint,
            info.cgroup_version
                .as_deref()
                .map(|v| format!(", cgroup v{v}"))
                .unwrap_or_default()
        ),
    );
    if info.remote {
        println!(
            "     host paths in SANDBOX_MOUNTS, PIP_CACHE_PATH and SANDBOX_CA_BUNDLE are paths on \
             the engine's machine; SANDBOX_FILES_DIR and SANDBOX_SNAPSHOT_DIR are on this one"
        );
    }
}
