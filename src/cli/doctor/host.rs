//! The host kernel's side of a sandbox's limits: the cgroup that holds the sandbox's process on
//! the engine's machine, read there (only when that machine is this one), read-only.
//!
//! The process is the one the engine names (its init under runc, gVisor's sandbox process under
//! runsc); its `/proc/<pid>/cgroup` says where its cgroup is, and the limit files there are what
//! the kernel enforces. The cgroup's path must name the sandbox, so that a process of another PID
//! namespace (the doctor itself in a container) is never taken for it.

use std::path::{Path, PathBuf};

/// A limit as a cgroup file says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupValue {
    Max(u64),
    Unlimited,
}

impl std::fmt::Display for CgroupValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CgroupValue::Max(value) => write!(f, "{value}"),
            CgroupValue::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Swap as the cgroup bounds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostSwap {
    /// cgroup v1: memory and swap together (`memory.memsw.limit_in_bytes`).
    MemoryAndSwap(CgroupValue),
    /// cgroup v2: swap alone (`memory.swap.max`).
    Swap(CgroupValue),
}

/// The limits the host kernel enforces on the sandbox's cgroup; a field is `None` when its file
/// is not there (a controller the host lacks, swap accounting off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCgroup {
    pub memory: Option<CgroupValue>,
    pub swap: Option<HostSwap>,
    pub pids: Option<CgroupValue>,
    /// The CFS quota (`None` inside: unlimited) and its period, in microseconds.
    pub cpu: Option<(Option<u64>, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum HostCgroupError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "process {pid} is not in a cgroup of sandbox {id} (the doctor may run in another PID \
         namespace than the engine)"
    )]
    NotTheSandbox { pid: u32, id: String },
    #[error("{path} says {text:?}, which is not a limit")]
    Unreadable { path: PathBuf, text: String },
}

/// Reads the cgroup of process `pid`, which must hold the sandbox `id`, under `root` (the
/// cgroup file system, `/sys/fs/cgroup`) and `proc` (`/proc`).
pub fn read(proc: &Path, root: &Path, pid: u32, id: &str) -> Result<HostCgroup, HostCgroupError> {
    let listing = proc.join(pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&listing).map_err(|source| HostCgroupError::Io {
        path: listing.clone(),
        source,
    })?;
    let memberships = parse_memberships(&text);
    let not_the_sandbox = || HostCgroupError::NotTheSandbox {
        pid,
        id: id.to_string(),
    };
    let dir = |controller: &str| -> Result<Option<Dir>, HostCgroupError> {
        let Some(found) = cgroup_dir(&memberships, root, controller) else {
            return Ok(None);
        };
        if id.is_empty() || !found.cgroup.contains(id) {
            return Err(not_the_sandbox());
        }
        Ok(Some(found))
    };
    let mut host = HostCgroup::default();
    if let Some(memory) = dir("memory")? {
        host.memory = memory.value(if memory.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        })?;
        host.swap = if memory.v2 {
            memory.value("memory.swap.max")?.map(HostSwap::Swap)
        } else {
            memory
                .value("memory.memsw.limit_in_bytes")?
                .map(HostSwap::MemoryAndSwap)
        };
    }
    if let Some(pids) = dir("pids")? {
        host.pids = pids.value("pids.max")?;
    }
    if let Some(cpu) = dir("cpu")? {
        host.cpu = if cpu.v2 {
            match cpu.text("cpu.max")? {
                Some((path, text)) => {
                    Some(parse_cpu_max(&text).ok_or(HostCgroupError::Unreadable { path, text })?)
                }
                None => None,
            }
        } else {
            match (
                cpu.text("cpu.cfs_quota_us")?,
                cpu.text("cpu.cfs_period_us")?,
            ) {
                (Some((quota_path, quota)), Some((period_path, period))) => {
                    let quota = parse_quota(&quota).ok_or(HostCgroupError::Unreadable {
                        path: quota_path,
                        text: quota,
                    })?;
                    let period =
                        period
                            .parse::<u64>()
                            .map_err(|_| HostCgroupError::Unreadable {
                                path: period_path,
                                text: period.clone(),
                            })?;
                    Some((quota, period))
                }
                _ => None,
            }
        };
    }
    Ok(host)
}

/// One line of `/proc/<pid>/cgroup`: the v1 controllers of a hierarchy (none: the v2 one) and
/// the cgroup's path in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_memberships(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some(Membership {
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// Where a controller's files are for the cgroup: its v1 hierarchy when the process is in one
/// that has it (a hybrid host has both), else the v2 hierarchy.
struct Dir {
    path: PathBuf,
    /// The cgroup's path, to check that it is the sandbox's.
    cgroup: String,
    v2: bool,
}

fn cgroup_dir(memberships: &[Membership], root: &Path, controller: &str) -> Option<Dir> {
    let relative = |path: &str| path.trim_start_matches('/').to_string();
    if let Some(v1) = memberships
        .iter()
        .find(|m| m.controllers.iter().any(|c| c == controller))
    {
        // Mounted under its joined name (`cpu,cpuacct`) with each name a link to it, or under
        // its own name alone.
        let joined = root.join(v1.controllers.join(","));
        let base = if joined.is_dir() {
            joined
        } else {
            root.join(controller)
        };
        return Some(Dir {
            path: base.join(relative(&v1.path)),
            cgroup: v1.path.clone(),
            v2: false,
        });
    }
    let v2 = memberships.iter().find(|m| m.controllers.is_empty())?;
    let path = root.join(relative(&v2.path));
    // A v2 cgroup has the controller's files only where the controller is enabled.
    let probe = match controller {
        "memory" => "memory.max",
        "pids" => "pids.max",
        _ => "cpu.max",
    };
    path.join(probe).exists().then(|| Dir {
        path,
        cgroup: v2.path.clone(),
        v2: true,
    })
}

impl Dir {
    /// A file's content, trimmed; `None` when the file does not exist.
    fn text(&self, file: &str) -> Result<Option<(PathBuf, String)>, HostCgroupError> {
        let path = self.path.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, text.trim().to_string()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(HostCgroupError::Io { path, source }),
        }
    }

    fn value(&self, file: &str) -> Result<Option<CgroupValue>, HostCgroupError> {
        match self.text(file)? {
            Some((path, text)) => parse_value(&text)
                .map(Some)
                .ok_or(HostCgroupError::Unreadable { path, text }),
            None => Ok(None),
        }
    }
}

/// Values at or above this are v1's way of saying "unlimited" (`PAGE_COUNTER_MAX` in bytes, about
/// 2^63, or a pids limit no host reaches).
const UNLIMITED_FROM: u64 = 1 << 62;

/// `max`, or a number (v1 writes unlimited as a huge one).
pub fn parse_value(text: &str) -> Option<CgroupValue> {
    if text == "max" {
        return Some(CgroupValue::Unlimited);
    }
    let value = text.parse::<u64>().ok()?;
    Some(if value >= UNLIMITED_FROM {
        CgroupValue::Unlimited
    } else {
        CgroupValue::Max(value)
    })
}

/// v1's `cpu.cfs_quota_us`: `-1` for none.
fn parse_quota(text: &str) -> Option<Option<u64>> {
    match text.parse::<i64>().ok()? {
        quota if quota < 0 => Some(None),
        quota => Some(Some(u64::try_from(quota).ok()?)),
    }
}

/// v2's `cpu.max`: `QUOTA PERIOD`, the quota `max` for none.
pub fn parse_cpu_max(text: &str) -> Option<(Option<u64>, u64)> {
    let (quota, period) = text.split_once(' ')?;
    let period = period.trim().parse::<u64>().ok()?;
    let quota = match quota {
        "max" => None,
        quota => Some(quota.parse::<u64>().ok()?),
    };
    Some((quota, period))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "cf1a1b9fd4c68c081940c5dadfe3211f33610bc842fc38b9b492fb981d508281";

    /// A fake `/proc` and `/sys/fs/cgroup` with the given files.
    fn tree(files: &[(&str, &str)]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("pcs-doctor-host-{}", uuid::Uuid::new_v4().simple()));
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        root
    }

    #[test]
    fn a_v1_hybrid_host_is_read_per_controller() {
        let cgroup = format!(
            "8:pids:/docker/{ID}\n4:memory:/docker/{ID}\n2:cpuacct:/docker/{ID}\n\
             1:cpu:/docker/{ID}\n0::/\n"
        );
        let root = tree(&[
            ("proc/42/cgroup", &cgroup),
            (
                &format!("cg/memory/docker/{ID}/memory.limit_in_bytes"),
                "536870912\n",
            ),
            (
                &format!("cg/memory/docker/{ID}/memory.memsw.limit_in_bytes"),
                "536870912\n",
            ),
            (&format!("cg/pids/docker/{ID}/pids.max"), "256\n"),
            (&format!("cg/cpu/docker/{ID}/cpu.cfs_quota_us"), "50000\n"),
            (&format!("cg/cpu/docker/{ID}/cpu.cfs_period_us"), "100000\n"),
        ]);
        let host = read(&root.join("proc"), &root.join("cg"), 42, ID).expect("read");
        assert_eq!(host.memory, Some(CgroupValue::Max(536870912)));
        assert_eq!(
            host.swap,
            Some(HostSwap::MemoryAndSwap(CgroupValue::Max(536870912)))
        );
        assert_eq!(host.pids, Some(CgroupValue::Max(256)));
        assert_eq!(host.cpu, Some((Some(50000), 100000)));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_v2_host_is_read_from_the_unified_hierarchy() {
        let path = format!("system.slice/docker-{ID}.scope");
        let root = tree(&[
            ("proc/7/cgroup", &format!("0::/{path}\n")),
            (&format!("cg/{path}/memory.max"), "536870912\n"),
            (&format!("cg/{path}/memory.swap.max"), "0\n"),
            (&format!("cg/{path}/pids.max"), "max\n"),
            (&format!("cg/{path}/cpu.max"), "max 100000\n"),
        ]);
        let host = read(&root.join("proc"), &root.join("cg"), 7, ID).expect("read");
        assert_eq!(host.memory, Some(CgroupValue::Max(536870912)));
        assert_eq!(host.swap, Some(HostSwap::Swap(CgroupValue::Max(0))));
        assert_eq!(host.pids, Some(CgroupValue::Unlimited));
        assert_eq!(host.cpu, Some((None, 100000)));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_process_outside_the_sandboxs_cgroup_is_refused() {
        let root = tree(&[("proc/9/cgroup", "4:memory:/user.slice\n")]);
        let read = read(&root.join("proc"), &root.join("cg"), 9, ID);
        assert!(
            matches!(read, Err(HostCgroupError::NotTheSandbox { pid: 9, .. })),
            "{read:?}"
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn values_and_unlimited() {
        assert_eq!(parse_value("max"), Some(CgroupValue::Unlimited));
        assert_eq!(
            parse_value("9223372036854771712"),
            Some(CgroupValue::Unlimited)
        );
        assert_eq!(parse_value("256"), Some(CgroupValue::Max(256)));
        assert_eq!(parse_value("lots"), None);
        assert_eq!(parse_cpu_max("150000 100000"), Some((Some(150000), 100000)));
        assert_eq!(parse_cpu_max("garbage"), None);
    }
}
