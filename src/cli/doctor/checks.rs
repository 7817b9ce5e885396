//! The doctor's judgement, as pure logic: each limit is compared with the configuration in every
//! source that has a word on it (the engine's record, the host cgroup, the sandbox's own view,
//! the overrun). A line is ok only when the engine's record agrees and no source disagrees; it
//! says which sources agreed, or what each that disagreed found.

use super::host::{CgroupValue, HostSwap};
use super::probe::{Findings, Overrun, Seen};
use crate::config::{Limits, NetworkPolicy};

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub ok: bool,
    pub what: &'static str,
    pub detail: String,
}

/// What the checks compare the findings with.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    pub limits: &'a Limits,
    /// The code runs under gVisor: the sandbox sees gVisor's kernel, not the host's.
    pub gvisor: bool,
    /// The runtime the sandboxes should run under (`None`: the engine's default, unnamed).
    pub runtime: Option<String>,
    /// Whether `runtime` was named by the platform's choice (rather than the engine's default).
    pub runtime_named: bool,
    /// Runtimes registered with the engine.
    pub registered: Vec<String>,
}

/// What one source says of a limit.
struct Word {
    source: String,
    /// `None`: it agrees; else what it found instead.
    found: Option<String>,
}

/// The words on one limit, gathered in order (the engine's record first).
struct Words(Vec<Word>);

impl Words {
    fn new() -> Words {
        Words(Vec::new())
    }

    fn say(&mut self, source: impl Into<String>, agrees: bool, found: impl FnOnce() -> String) {
        self.0.push(Word {
            source: source.into(),
            found: (!agrees).then(found),
        });
    }

    fn conclude(self, what: &'static str, value: String) -> Check {
        let against: Vec<String> = self
            .0
            .iter()
            .filter_map(|w| w.found.as_ref().map(|f| format!("{}: {f}", w.source)))
            .collect();
        if self.0.is_empty() || !against.is_empty() {
            let against = if against.is_empty() {
                "nothing verifies it".to_string()
            } else {
                against.join("; ")
            };
            return Check {
                ok: false,
                what,
                detail: format!("{value} configured, but {against}"),
            };
        }
        let sources: Vec<&str> = self.0.iter().map(|w| w.source.as_str()).collect();
        Check {
            ok: true,
            what,
            detail: format!("{value} ({})", sources.join("; ")),
        }
    }
}

const RECORD: &str = "engine record";
const HOST: &str = "host cgroup";

/// A byte limit as a cgroup holds it: the kernel rounds it down to whole pages.
fn bytes_match(found: u64, expected: u64) -> bool {
    found == expected || found == expected / 4096 * 4096
}

fn recorded(value: Option<i64>) -> String {
    match value {
        Some(v) if v > 0 => v.to_string(),
        Some(_) | None => "none".to_string(),
    }
}

/// Whether a value the sandbox's cgroup files show is gVisor's own, unconfigured cgroup: since
/// its 2023 releases gVisor mounts a cgroup file system of its own at `/sys/fs/cgroup` that
/// carries none of the container's limits (`max`, `-1`, or the largest page-rounded number); the
/// host's cgroup is what holds them, and is checked apart. Such a value is no word on the limit.
fn gvisor_unset(expected: &Expected, value: &str) -> bool {
    expected.gvisor
        && (value == "max"
            || value == "-1"
            || value.starts_with("max ")
            || value.parse::<u64>().is_ok_and(|v| v >= 1 << 62))
}

/// The sandbox's own source name: the host's kernel under runc, gVisor's under runsc.
fn inside(expected: &Expected, what: &str) -> String {
    if expected.gvisor {
        format!("gVisor's {what}")
    } else {
        format!("the sandbox's {what}")
    }
}

/// The limit and hardening lines, from every source.
pub fn limit_checks(expected: &Expected, findings: &Findings) -> Vec<Check> {
    vec![
        no_new_privileges(expected, findings),
        pids(expected, findings),
        memory(expected, findings),
        swap(expected, findings),
        cpu(expected, findings),
    ]
}

/// The runtime the engine recorded for the probe sandbox, against the one chosen.
pub fn runtime_check(expected: &Expected, findings: &Findings) -> Check {
    let recorded = findings.record.runtime.as_deref();
    let (ok, detail) = match (recorded, expected.runtime.as_deref()) {
        (Some(found), Some(wanted)) if found == wanted => (true, format!("{found} ({RECORD})")),
        // The engine's default, recorded under a name of the engine's own (not a registered
        // runtime that differs).
        (Some(found), _)
            if !expected.runtime_named && !expected.registered.iter().any(|r| r == found) =>
        {
            (
                true,
                format!("the engine's default, recorded as {found} ({RECORD})"),
            )
        }
        (Some(found), None) => (true, format!("{found} ({RECORD})")),
        (Some(found), Some(wanted)) => (
            false,
            format!("{wanted} chosen, but the {RECORD} says {found}"),
        ),
        (None, wanted) => (
            false,
            format!(
                "{} chosen, but the {RECORD} names no runtime",
                wanted.unwrap_or("the engine's default")
            ),
        ),
    };
    Check {
        ok,
        what: "probe runtime",
        detail,
    }
}

fn no_new_privileges(expected: &Expected, findings: &Findings) -> Check {
    let (record, seen) = (&findings.record, &findings.seen);
    let mut words = Words::new();
    words.say(RECORD, record.no_new_privileges(), || {
        format!("security options {:?}", record.security_options)
    });
    if let Some(prctl) = seen.prctl_no_new_privs {
        words.say(
            inside(expected, "prctl(PR_GET_NO_NEW_PRIVS)"),
            prctl == 1,
            || prctl.to_string(),
        );
    }
    if let Some(status) = &seen.no_new_privs {
        words.say(inside(expected, "/proc/self/status"), status == "1", || {
            format!("NoNewPrivs {status}")
        });
    }
    words.conclude("no-new-privileges", "set".to_string())
}

fn pids(expected: &Expected, findings: &Findings) -> Check {
    let limit = expected.limits.pids;
    let wanted = i64::try_from(limit).ok();
    let mut words = Words::new();
    words.say(
        RECORD,
        wanted.is_some() && findings.record.pids == wanted,
        || recorded(findings.record.pids),
    );
    if let Some(host) = findings.host.as_ref().and_then(|h| h.pids) {
        // Under gVisor the processes inside are gVisor's: the host counts its threads.
        let source = if expected.gvisor {
            format!("{HOST}, on gVisor's host threads")
        } else {
            HOST.to_string()
        };
        words.say(source, host == CgroupValue::Max(limit), || host.to_string());
    }
    if let Some(seen) = findings
        .seen
        .pids_max
        .as_ref()
        .filter(|v| !gvisor_unset(expected, v))
    {
        words.say(
            inside(expected, "cgroup"),
            seen == &limit.to_string(),
            || seen.clone(),
        );
    }
    words.conclude("pids limit", limit.to_string())
}

fn memory(expected: &Expected, findings: &Findings) -> Check {
    let limit = expected.limits.memory_bytes;
    let mut words = Words::new();
    words.say(
        RECORD,
        i64::try_from(limit).ok() == findings.record.memory_bytes,
        || recorded(findings.record.memory_bytes),
    );
    if let Some(host) = findings.host.as_ref().and_then(|h| h.memory) {
        words.say(
            HOST,
            matches!(host, CgroupValue::Max(bytes) if bytes_match(bytes, limit)),
            || host.to_string(),
        );
    }
    let seen = &findings.seen;
    if let Some(max) = seen
        .memory_max
        .as_ref()
        .filter(|v| !gvisor_unset(expected, v))
    {
        words.say(
            inside(expected, "cgroup"),
            max.parse::<u64>()
                .is_ok_and(|bytes| bytes_match(bytes, limit)),
            || max.clone(),
        );
    }
    // gVisor's kernel takes the limit for the machine's memory; the host's (runc) shows the host's.
    if let (true, Some(kib)) = (expected.gvisor, seen.mem_total_kib) {
        let total = kib.saturating_mul(1024);
        words.say(
            "gVisor's /proc/meminfo",
            total.abs_diff(limit) < 4096,
            || format!("MemTotal {total} bytes"),
        );
    }
    match &findings.overrun {
        Some(Overrun::ProcessKilled) => {
            words.say("a process allocating past it was killed", true, String::new)
        }
        Some(Overrun::SandboxKilled) => words.say(
            "an allocation past it ended the sandbox, killed for memory",
            true,
            String::new,
        ),
        Some(Overrun::Refused) => words.say("an allocation past it was refused", true, String::new),
        Some(Overrun::NotStopped(what)) => {
            words.say("an allocation past it", false, || what.clone())
        }
        None => {}
    }
    words.conclude("memory limit", format!("{limit} bytes"))
}

fn swap(expected: &Expected, findings: &Findings) -> Check {
    let limit = expected.limits.memory_bytes;
    let record = &findings.record;
    let mut words = Words::new();
    words.say(
        RECORD,
        record.memory_bytes.is_some_and(|m| m > 0)
            && record.memory_swap_bytes == record.memory_bytes,
        || match record.memory_swap_bytes {
            Some(-1) => "swap unlimited".to_string(),
            other => format!("memory+swap {}", recorded(other)),
        },
    );
    match findings.host.as_ref().and_then(|h| h.swap) {
        Some(HostSwap::MemoryAndSwap(value)) => words.say(
            HOST,
            matches!(value, CgroupValue::Max(bytes) if bytes_match(bytes, limit)),
            || format!("memory+swap {value}"),
        ),
        Some(HostSwap::Swap(value)) => words.say(HOST, value == CgroupValue::Max(0), || {
            format!("swap {value}")
        }),
        None => {}
    }
    let seen = &findings.seen;
    match (&seen.swap_max, &seen.memsw_max) {
        (Some(swap), _) => words.say(inside(expected, "cgroup"), swap == "0", || {
            format!("swap {swap}")
        }),
        (None, Some(memsw)) => words.say(
            inside(expected, "cgroup"),
            memsw
                .parse::<u64>()
                .is_ok_and(|bytes| bytes_match(bytes, limit)),
            || format!("memory+swap {memsw}"),
        ),
        (None, None) => {}
    }
    words.conclude("no swap", "memory+swap = memory".to_string())
}

fn cpu(expected: &Expected, findings: &Findings) -> Check {
    let wanted = expected.limits.cpus;
    let near = |cpus: f64| (cpus - wanted).abs() < 0.01;
    let ratio = |quota: f64, period: f64| (quota > 0.0 && period > 0.0).then(|| quota / period);
    let record = &findings.record;
    let recorded_cpus = match (record.nano_cpus, record.cpu_quota, record.cpu_period) {
        (Some(nano), _, _) if nano > 0 => Some(nano as f64 / 1e9),
        (_, Some(quota), Some(period)) => ratio(quota as f64, period as f64),
        _ => None,
    };
    let shown =
        |cpus: Option<f64>| cpus.map_or_else(|| "none".to_string(), |c| format!("{c:.2} CPUs"));
    let mut words = Words::new();
    words.say(RECORD, recorded_cpus.is_some_and(near), || {
        shown(recorded_cpus)
    });
    if let Some((quota, period)) = findings.host.as_ref().and_then(|h| h.cpu) {
        let cpus = quota.and_then(|q| ratio(q as f64, period as f64));
        words.say(HOST, cpus.is_some_and(near), || shown(cpus));
    }
    let seen = &findings.seen;
    let inside_cpu = match (&seen.cpu_max, &seen.cfs_quota, &seen.cfs_period) {
        (Some(max), _, _) => max
            .split_once(' ')
            .map(|(q, p)| (q.to_string(), p.to_string())),
        (None, Some(quota), Some(period)) => Some((quota.clone(), period.clone())),
        _ => None,
    };
    if let Some((quota, period)) = inside_cpu.filter(|(quota, _)| !gvisor_unset(expected, quota)) {
        let cpus = match (quota.parse::<f64>(), period.parse::<f64>()) {
            (Ok(q), Ok(p)) => ratio(q, p),
            _ => None,
        };
        words.say(inside(expected, "cgroup"), cpus.is_some_and(near), || {
            shown(cpus)
        });
    }
    words.conclude("CPU limit", format!("{wanted:.2} CPUs"))
}

/// What only the sandbox can say of itself, first: who the code runs as, with which capabilities.
pub fn identity_checks(seen: &Seen) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut line =
        |ok: bool, what: &'static str, detail: String| checks.push(Check { ok, what, detail });
    match seen.uid {
        Some(uid) if uid > 0 => line(true, "user", format!("uid {uid} (not root)")),
        Some(uid) => line(false, "user", format!("uid {uid}")),
        None => line(false, "user", "unknown".to_string()),
    }
    let caps = seen.cap_eff.as_deref().unwrap_or("?");
    line(
        caps.trim_start_matches('0').is_empty(),
        "capabilities",
        format!("effective set {caps}"),
    );
    checks
}

/// What only the sandbox can say of itself, after the limits: open files, kernel, network.
pub fn environment_checks(seen: &Seen, network: NetworkPolicy) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut line =
        |ok: bool, what: &'static str, detail: String| checks.push(Check { ok, what, detail });
    match seen.nofile.as_slice() {
        [soft, hard] if *soft > 0 && *hard > 0 => {
            line(true, "open files", format!("at most {soft} (hard {hard})"))
        }
        _ => line(false, "open files", "unlimited".to_string()),
    }
    line(
        true,
        "kernel",
        seen.kernel.clone().unwrap_or_else(|| "?".to_string()),
    );
    let network_ok = match network {
        NetworkPolicy::None => seen.interfaces == ["lo"],
        NetworkPolicy::Bridge | NetworkPolicy::Allowlist => seen.interfaces.len() > 1,
    };
    line(
        network_ok,
        "network",
        format!(
            "{} (policy {})",
            seen.interfaces.join(", "),
            network.as_str()
        ),
    );
    checks
}

/// The read-only root and the writable workspace (after the network lines).
pub fn storage_checks(seen: &Seen) -> Vec<Check> {
    let root_writable = seen.root_writable.unwrap_or(true);
    let workspace = seen.workspace_writable.unwrap_or(false);
    vec![
        Check {
            ok: !root_writable,
            what: "read-only root",
            detail: if root_writable { "writable!" } else { "yes" }.to_string(),
        },
        Check {
            ok: workspace,
            what: "workspace",
            detail: if workspace {
                "/workspace writable"
            } else {
                "/workspace not writable"
            }
            .to_string(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::super::host::HostCgroup;
    use super::*;
    use crate::config::Config;
    use crate::engine::backend::LimitsRecord;

    const MIB512: u64 = 512 << 20;

    fn limits() -> Limits {
        Limits {
            memory_bytes: MIB512,
            cpus: 1.0,
            pids: 256,
            ..Config::default().limits
        }
    }

    fn expected(limits: &Limits, gvisor: bool) -> Expected<'_> {
        Expected {
            limits,
            gvisor,
            runtime: Some(if gvisor { "runsc" } else { "runc" }.to_string()),
            runtime_named: true,
            registered: vec!["runc".into(), "runsc".into()],
        }
    }

    /// What a healthy gVisor sandbox gives: the engine's record, the host cgroup, gVisor's view.
    fn gvisor_findings() -> Findings {
        Findings {
            seen: Seen {
                prctl_no_new_privs: Some(1),
                mem_total_kib: Some(MIB512 / 1024),
                ..Seen::default()
            },
            record: LimitsRecord {
                runtime: Some("runsc".into()),
                memory_bytes: Some(MIB512 as i64),
                memory_swap_bytes: Some(MIB512 as i64),
                pids: Some(256),
                nano_cpus: Some(1_000_000_000),
                cpu_quota: Some(0),
                cpu_period: Some(0),
                security_options: vec!["no-new-privileges".into()],
                host_pid: Some(4242),
            },
            host: Some(HostCgroup {
                memory: Some(CgroupValue::Max(MIB512)),
                swap: Some(HostSwap::MemoryAndSwap(CgroupValue::Max(MIB512))),
                pids: Some(CgroupValue::Max(256)),
                cpu: Some((Some(100_000), 100_000)),
            }),
            host_missing: None,
            overrun: Some(Overrun::SandboxKilled),
        }
    }

    fn check<'c>(checks: &'c [Check], what: &str) -> &'c Check {
        checks
            .iter()
            .find(|c| c.what == what)
            .unwrap_or_else(|| panic!("no {what} line in {checks:?}"))
    }

    #[test]
    fn a_healthy_gvisor_sandbox_passes_every_limit_and_says_how() {
        let limits = limits();
        let findings = gvisor_findings();
        let checks = limit_checks(&expected(&limits, true), &findings);
        assert!(checks.iter().all(|c| c.ok), "{checks:#?}");
        assert_eq!(
            check(&checks, "memory limit").detail,
            "536870912 bytes (engine record; host cgroup; gVisor's /proc/meminfo; an allocation \
             past it ended the sandbox, killed for memory)"
        );
        assert_eq!(
            check(&checks, "pids limit").detail,
            "256 (engine record; host cgroup, on gVisor's host threads)"
        );
        assert_eq!(
            check(&checks, "no-new-privileges").detail,
            "set (engine record; gVisor's prctl(PR_GET_NO_NEW_PRIVS))"
        );
        assert_eq!(
            check(&checks, "CPU limit").detail,
            "1.00 CPUs (engine record; host cgroup)"
        );
        let runtime = runtime_check(&expected(&limits, true), &findings);
        assert!(runtime.ok);
        assert_eq!(runtime.detail, "runsc (engine record)");
    }

    #[test]
    fn gvisors_own_unconfigured_cgroup_is_no_word_on_a_limit() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.seen.pids_max = Some("max".into());
        findings.seen.memory_max = Some("9223372036854775807".into());
        findings.seen.cfs_quota = Some("-1".into());
        findings.seen.cfs_period = Some("100000".into());
        let checks = limit_checks(&expected(&limits, true), &findings);
        assert!(checks.iter().all(|c| c.ok), "{checks:#?}");
        assert_eq!(
            check(&checks, "pids limit").detail,
            "256 (engine record; host cgroup, on gVisor's host threads)"
        );
        // A number of its own in gVisor's cgroup still disagrees.
        findings.seen.pids_max = Some("100".into());
        let checks = limit_checks(&expected(&limits, true), &findings);
        let pids = check(&checks, "pids limit");
        assert!(
            !pids.ok && pids.detail.contains("gVisor's cgroup: 100"),
            "{pids:?}"
        );
        // Under runc the sandbox's cgroup is the host's: "max" there is no limit at all.
        findings.seen.pids_max = Some("max".into());
        let runc = limit_checks(&expected(&limits, false), &findings);
        assert!(!check(&runc, "pids limit").ok);
        assert!(!check(&runc, "memory limit").ok);
        assert!(!check(&runc, "CPU limit").ok);
    }

    #[test]
    fn a_record_without_the_pids_limit_fails() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.record.pids = None;
        let checks = limit_checks(&expected(&limits, true), &findings);
        let pids = check(&checks, "pids limit");
        assert!(!pids.ok, "{pids:?}");
        assert!(pids.detail.contains("engine record: none"), "{pids:?}");
        // -1 is Docker's "unlimited".
        findings.record.pids = Some(-1);
        assert!(
            !check(
                &limit_checks(&expected(&limits, true), &findings),
                "pids limit"
            )
            .ok
        );
    }

    #[test]
    fn a_host_cgroup_that_disagrees_with_the_record_fails() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.host = Some(HostCgroup {
            memory: Some(CgroupValue::Max(1 << 30)),
            swap: Some(HostSwap::MemoryAndSwap(CgroupValue::Unlimited)),
            pids: Some(CgroupValue::Unlimited),
            cpu: Some((None, 100_000)),
        });
        let checks = limit_checks(&expected(&limits, true), &findings);
        for what in ["memory limit", "no swap", "pids limit", "CPU limit"] {
            let line = check(&checks, what);
            assert!(
                !line.ok
                    && line.detail.contains("host cgroup")
                    && !line.detail.contains("engine record:"),
                "{line:?}"
            );
        }
    }

    #[test]
    fn a_limit_the_configuration_does_not_have_fails() {
        // The doctor's configuration asks for 1 GiB; the sandbox got 512 MiB everywhere.
        let limits = Limits {
            memory_bytes: 1 << 30,
            ..limits()
        };
        let checks = limit_checks(&expected(&limits, true), &gvisor_findings());
        let memory = check(&checks, "memory limit");
        assert!(!memory.ok);
        assert!(
            memory
                .detail
                .starts_with("1073741824 bytes configured, but engine record: 536870912"),
            "{memory:?}"
        );
    }

    #[test]
    fn swap_unlimited_no_new_privileges_missing_and_an_unstopped_overrun_fail() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.record.memory_swap_bytes = Some(-1);
        findings.record.security_options.clear();
        findings.overrun = Some(Overrun::NotStopped("it allocated 671088640 bytes".into()));
        let checks = limit_checks(&expected(&limits, true), &findings);
        let swap = check(&checks, "no swap");
        assert!(
            !swap.ok && swap.detail.contains("swap unlimited"),
            "{swap:?}"
        );
        assert!(!check(&checks, "no-new-privileges").ok);
        let memory = check(&checks, "memory limit");
        assert!(
            !memory.ok && memory.detail.contains("it allocated"),
            "{memory:?}"
        );
    }

    #[test]
    fn the_sandboxs_own_view_counts_too() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.seen.prctl_no_new_privs = Some(0);
        findings.seen.mem_total_kib = Some(24 << 20);
        let checks = limit_checks(&expected(&limits, true), &findings);
        assert!(!check(&checks, "no-new-privileges").ok);
        assert!(!check(&checks, "memory limit").ok);
    }

    #[test]
    fn under_runc_the_sandboxs_cgroup_files_are_sources() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.record.runtime = Some("runc".into());
        findings.overrun = Some(Overrun::ProcessKilled);
        findings.seen = Seen {
            no_new_privs: Some("1".into()),
            prctl_no_new_privs: Some(1),
            pids_max: Some("256".into()),
            memory_max: Some(MIB512.to_string()),
            memsw_max: Some(MIB512.to_string()),
            cfs_quota: Some("100000".into()),
            cfs_period: Some("100000".into()),
            // The host's memory: not a source under runc.
            mem_total_kib: Some(24 << 20),
            ..Seen::default()
        };
        let checks = limit_checks(&expected(&limits, false), &findings);
        assert!(checks.iter().all(|c| c.ok), "{checks:#?}");
        assert_eq!(
            check(&checks, "memory limit").detail,
            "536870912 bytes (engine record; host cgroup; the sandbox's cgroup; a process \
             allocating past it was killed)"
        );
        assert_eq!(
            check(&checks, "pids limit").detail,
            "256 (engine record; host cgroup; the sandbox's cgroup)"
        );
        findings.seen.pids_max = Some("max".into());
        assert!(
            !check(
                &limit_checks(&expected(&limits, false), &findings),
                "pids limit"
            )
            .ok
        );
    }

    #[test]
    fn the_recorded_runtime_must_be_the_chosen_one() {
        let limits = limits();
        let mut findings = gvisor_findings();
        findings.record.runtime = Some("runc".into());
        let runtime = runtime_check(&expected(&limits, true), &findings);
        assert!(!runtime.ok, "{runtime:?}");
        assert_eq!(
            runtime.detail,
            "runsc chosen, but the engine record says runc"
        );
        findings.record.runtime = None;
        assert!(!runtime_check(&expected(&limits, true), &findings).ok);
        // The engine's default under a name of the engine's own (Podman's "oci").
        findings.record.runtime = Some("oci".into());
        let default = Expected {
            runtime: Some("runc".into()),
            runtime_named: false,
            ..expected(&limits, false)
        };
        assert!(runtime_check(&default, &findings).ok);
    }

    #[test]
    fn cgroup_page_rounding_and_cfs_records_are_accepted() {
        let limits = Limits {
            memory_bytes: 500_000_001,
            ..limits()
        };
        let mut findings = gvisor_findings();
        findings.record.memory_bytes = Some(500_000_001);
        findings.record.memory_swap_bytes = Some(500_000_001);
        findings.record.nano_cpus = Some(0);
        findings.record.cpu_quota = Some(100_000);
        findings.record.cpu_period = Some(100_000);
        let rounded = 500_000_001 / 4096 * 4096;
        findings.host = Some(HostCgroup {
            memory: Some(CgroupValue::Max(rounded)),
            swap: Some(HostSwap::MemoryAndSwap(CgroupValue::Max(rounded))),
            ..findings.host.unwrap_or_default()
        });
        findings.seen.mem_total_kib = Some(rounded / 1024);
        let checks = limit_checks(&expected(&limits, true), &findings);
        assert!(checks.iter().all(|c| c.ok), "{checks:#?}");
    }

    #[test]
    fn with_no_source_beyond_a_failing_record_nothing_passes() {
        let limits = limits();
        let findings = Findings::default();
        let checks = limit_checks(&expected(&limits, true), &findings);
        assert!(checks.iter().all(|c| !c.ok), "{checks:#?}");
        assert!(!runtime_check(&expected(&limits, true), &findings).ok);
    }

    #[test]
    fn the_sandboxs_own_checks() {
        let seen = Seen {
            uid: Some(1000),
            cap_eff: Some("0000000000000000".into()),
            nofile: vec![1024, 4096],
            interfaces: vec!["lo".into()],
            root_writable: Some(false),
            workspace_writable: Some(true),
            ..Seen::default()
        };
        let mut checks = identity_checks(&seen);
        checks.extend(environment_checks(&seen, NetworkPolicy::None));
        checks.extend(storage_checks(&seen));
        assert!(checks.iter().all(|c| c.ok), "{checks:#?}");
        let root = Seen {
            uid: Some(0),
            root_writable: None,
            ..seen
        };
        assert!(!identity_checks(&root)[0].ok);
        assert!(!storage_checks(&root)[0].ok);
        assert!(!environment_checks(&root, NetworkPolicy::Bridge)
            .iter()
            .find(|c| c.what == "network")
            .is_some_and(|c| c.ok));
    }
}
