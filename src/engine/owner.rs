//! Which server instance owns a sandbox, and whether that owner is gone.
//!
//! Every sandbox carries labels naming its server instance, host, boot and process. Several servers
//! may share one engine (Claude Desktop and an editor each start one), so a server removes only
//! sandboxes whose owner is provably dead: same machine (host name and machine id: machines that
//! share a remote engine may share a host name), and either another boot or no live process with
//! that pid and start time. Sandboxes of other machines are never touched.
//!
//! A pid means something only in its pid namespace: a server in a container (with the host's
//! Docker socket) is pid 1 of its own. So the namespace is a label too, and a pid is checked only
//! when the sandbox was made in this server's namespace; otherwise its owner cannot be proven
//! dead and the sandbox is left alone (its server removes it when it exits).

use std::collections::BTreeMap;

pub const LABEL_MANAGED: &str = "io.python-code-sandbox.managed";
pub const LABEL_INSTANCE: &str = "io.python-code-sandbox.instance";
pub const LABEL_HOST: &str = "io.python-code-sandbox.host";
/// The machine's id (`/etc/machine-id`): host names repeat across machines that share a remote
/// engine; machine ids do not.
pub const LABEL_MACHINE: &str = "io.python-code-sandbox.machine";
pub const LABEL_BOOT: &str = "io.python-code-sandbox.boot";
pub const LABEL_PID: &str = "io.python-code-sandbox.pid";
pub const LABEL_PID_START: &str = "io.python-code-sandbox.pid-start";
pub const LABEL_PID_NAMESPACE: &str = "io.python-code-sandbox.pid-namespace";
/// How Linux names the initial pid namespace (the host's): its inode number is fixed.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";
pub const LABEL_KIND: &str = "io.python-code-sandbox.kind";
/// On a sandbox's own volumes: the name of the container they were made for, so that a create
/// the engine refused after making them can remove them (see `engine::docker`).
pub const LABEL_VOLUME_OF: &str = "io.python-code-sandbox.volume-of";
/// The container the owning server runs in (only when that container is on the same engine), and
/// when that container started: a server in a container is dead when its container is gone,
/// stopped, or started again since.
pub const LABEL_SERVER_CONTAINER: &str = "io.python-code-sandbox.server-container";
pub const LABEL_SERVER_CONTAINER_STARTED: &str = "io.python-code-sandbox.server-container-started";

/// The container a server runs in, as its engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerContainer {
    pub id: String,
    pub started_at: String,
}

/// What the engine says of the containers sandboxes name as their server's: id → `Some(start
/// time)` while it runs, `None` when it is stopped or gone. Ids missing here are unknown.
pub type ServerContainers = std::collections::HashMap<String, Option<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub instance: String,
    pub host: String,
    /// The machine's id, or the host name where the machine has none.
    pub machine: String,
    pub boot: String,
    pub pid: u32,
    /// The process's start time in clock ticks since boot: tells a reused pid apart.
    pub pid_start: u64,
    /// The pid namespace the pid belongs to (`pid:[inode]`), when it can be read.
    pub pid_namespace: Option<String>,
    /// Set once the server has found itself in a container of the engine it uses (shared by the
    /// clones the engine's parts hold).
    pub container: std::sync::Arc<std::sync::OnceLock<ServerContainer>>,
}

impl Owner {
    /// This process, as a new server instance.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            instance: uuid::Uuid::new_v4().simple().to_string(),
            host: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
            machine: ["/etc/machine-id", "/var/lib/dbus/machine-id"]
                .into_iter()
                .find_map(read_trimmed)
                .filter(|id| !id.is_empty())
                .map(|id| format!("machine-id:{id}"))
                .unwrap_or_else(|| {
                    format!(
                        "host:{}",
                        read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default()
                    )
                }),
            boot: read_trimmed("/proc/sys/kernel/random/boot_id")
                .unwrap_or_else(|| "unknown".into()),
            pid,
            pid_start: process_start_time(pid).unwrap_or(0),
            pid_namespace: pid_namespace(),
            container: Default::default(),
        }
    }

    pub fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_INSTANCE.to_string(), self.instance.clone()),
            (LABEL_HOST.to_string(), self.host.clone()),
            (LABEL_MACHINE.to_string(), self.machine.clone()),
            (LABEL_BOOT.to_string(), self.boot.clone()),
            (LABEL_PID.to_string(), self.pid.to_string()),
            (LABEL_PID_START.to_string(), self.pid_start.to_string()),
            (LABEL_KIND.to_string(), kind.to_string()),
        ]);
        if let Some(namespace) = &self.pid_namespace {
            labels.insert(LABEL_PID_NAMESPACE.to_string(), namespace.clone());
        }
        if let Some(container) = self.container.get() {
            labels.insert(LABEL_SERVER_CONTAINER.to_string(), container.id.clone());
            labels.insert(
                LABEL_SERVER_CONTAINER_STARTED.to_string(),
                container.started_at.clone(),
            );
        }
        labels
    }

    /// Whether a sandbox with these labels belongs to a server that no longer runs.
    pub fn is_leftover(
        &self,
        labels: &BTreeMap<String, String>,
        servers: &ServerContainers,
    ) -> bool {
        self.is_leftover_with(labels, servers, |pid, start| {
            process_start_time(pid) == Some(start) && !process_has_ended(pid)
        })
    }

    /// [`Owner::is_leftover`] with the liveness check supplied (for tests).
    pub fn is_leftover_with(
        &self,
        labels: &BTreeMap<String, String>,
        servers: &ServerContainers,
        alive: impl Fn(u32, u64) -> bool,
    ) -> bool {
        let get = |key: &str| labels.get(key).map(String::as_str);
        if get(LABEL_INSTANCE) == Some(self.instance.as_str()) {
            return false; // ours
        }
        if let Some(container) = get(LABEL_SERVER_CONTAINER) {
            let started = get(LABEL_SERVER_CONTAINER_STARTED);
            match servers.get(container) {
                None => return false,      // not asked of the engine: we cannot know
                Some(None) => return true, // its container is stopped or gone
                Some(Some(now)) if Some(now.as_str()) != started => return true, // restarted since
                // Still running: only a server in that same container can judge the pid below.
                Some(Some(_)) => {
                    if self.container.get().map(|c| c.id.as_str()) != Some(container) {
                        return false;
                    }
                }
            }
        }
        if get(LABEL_HOST) != Some(self.host.as_str()) {
            return false; // another host's server: we cannot know, so we leave it
        }
        // Same host name, but maybe another machine sharing this engine: its boot and pids mean
        // nothing here. (A sandbox without the label comes from an older server.)
        if get(LABEL_MACHINE).is_some_and(|machine| machine != self.machine) {
            return false;
        }
        if get(LABEL_BOOT) != Some(self.boot.as_str()) {
            return true; // made before this boot: its server is gone
        }
        // A sandbox without the label was made by an older server, on the host: its pid can be
        // checked only from the host's (initial) namespace.
        let theirs = get(LABEL_PID_NAMESPACE).unwrap_or(INITIAL_PID_NAMESPACE);
        if self
            .pid_namespace
            .as_deref()
            .is_some_and(|ours| ours != theirs)
        {
            return false; // its pid is another namespace's: we cannot check it
        }
        let pid = get(LABEL_PID).and_then(|p| p.parse::<u32>().ok());
        let start = get(LABEL_PID_START).and_then(|s| s.parse::<u64>().ok());
        match (pid, start) {
            (Some(pid), Some(start)) => !alive(pid, start),
            _ => false, // unreadable labels: not provably ours to remove
        }
    }
}

/// The id of the Docker container this process runs in, read from the bind mounts Docker makes of
/// the container's own `hostname`, `hosts` and `resolv.conf` files; `None` outside one.
pub fn own_container_id() -> Option<String> {
    container_id_in(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

fn container_id_in(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let root = line.split_whitespace().nth(3)?;
        let (before, file) = root.rsplit_once('/')?;
        let id = before.rsplit_once("/containers/")?.1;
        let is_id = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
        (is_id && matches!(file, "hostname" | "hosts" | "resolv.conf")).then(|| id.to_string())
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This process's pid namespace, as `/proc/self/ns/pid` names it (`pid:[4026531836]`).
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|name| !name.is_empty())
}

/// The process has ended but is not yet reaped (a zombie, state `Z` or `X` in `/proc/PID/stat`):
/// a server killed with SIGKILL whose parent has not waited for it yet must count as gone, or
/// the next server would leave its sandboxes running.
pub fn process_has_ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = &stat[stat.rfind(')')? + 1..];
            after_name
                .split_whitespace()
                .next()
                .map(|state| state == "Z" || state == "X")
        })
        .unwrap_or(false)
}

/// Field 22 of `/proc/PID/stat`, read after the command name (which may hold spaces and parens).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards; starttime is field 22.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            instance: "me".into(),
            host: "h".into(),
            machine: "machine-id:m".into(),
            boot: "b".into(),
            pid: 10,
            pid_start: 100,
            pid_namespace: Some(INITIAL_PID_NAMESPACE.into()),
            container: Default::default(),
        }
    }

    static NONE: std::sync::LazyLock<ServerContainers> =
        std::sync::LazyLock::new(ServerContainers::new);

    fn labels_of(
        instance: &str,
        host: &str,
        boot: &str,
        pid: &str,
        start: &str,
    ) -> BTreeMap<String, String> {
        let mut o = owner();
        o.instance = instance.into();
        o.host = host.into();
        o.boot = boot.into();
        let mut l = o.labels("session");
        l.insert(LABEL_PID.into(), pid.into());
        l.insert(LABEL_PID_START.into(), start.into());
        l
    }

    #[test]
    fn another_machine_with_the_same_host_name_is_never_judged() {
        let me = owner();
        let dead = |_: u32, _: u64| false;
        let mut theirs = labels_of("x", "h", "another-boot", "1", "1");
        theirs.insert(LABEL_MACHINE.into(), "machine-id:other".into());
        assert!(
            !me.is_leftover_with(&theirs, &NONE, dead),
            "another boot of another machine"
        );
        theirs.insert(LABEL_BOOT.into(), "b".into());
        assert!(
            !me.is_leftover_with(&theirs, &NONE, dead),
            "a dead pid of another machine"
        );
        theirs.insert(LABEL_MACHINE.into(), "machine-id:m".into());
        assert!(
            me.is_leftover_with(&theirs, &NONE, dead),
            "this machine's dead server"
        );
        theirs.remove(LABEL_MACHINE);
        assert!(
            me.is_leftover_with(&theirs, &NONE, dead),
            "an older server's label set"
        );
    }

    #[test]
    fn decides_leftovers_only_when_the_owner_is_provably_dead() {
        let me = owner();
        let alive = |pid: u32, start: u64| pid == 20 && start == 200;
        assert!(
            !me.is_leftover_with(&labels_of("me", "h", "b", "1", "1"), &NONE, alive),
            "ours"
        );
        assert!(
            !me.is_leftover_with(&labels_of("x", "other", "b", "1", "1"), &NONE, alive),
            "other host"
        );
        assert!(
            me.is_leftover_with(&labels_of("x", "h", "old", "20", "200"), &NONE, alive),
            "old boot"
        );
        assert!(
            !me.is_leftover_with(&labels_of("x", "h", "b", "20", "200"), &NONE, alive),
            "alive"
        );
        assert!(
            me.is_leftover_with(&labels_of("x", "h", "b", "20", "999"), &NONE, alive),
            "pid reused"
        );
        assert!(
            me.is_leftover_with(&labels_of("x", "h", "b", "21", "200"), &NONE, alive),
            "dead"
        );
        assert!(
            !me.is_leftover_with(&labels_of("x", "h", "b", "junk", "200"), &NONE, alive),
            "unreadable"
        );
    }

    #[test]
    fn a_pid_of_another_namespace_is_never_judged() {
        let me = owner();
        let dead = |_: u32, _: u64| false;
        let mut theirs = labels_of("x", "h", "b", "1", "1");
        theirs.insert(LABEL_PID_NAMESPACE.into(), "pid:[2]".into());
        assert!(
            !me.is_leftover_with(&theirs, &NONE, dead),
            "another namespace"
        );
        theirs.insert(LABEL_PID_NAMESPACE.into(), INITIAL_PID_NAMESPACE.into());
        assert!(
            me.is_leftover_with(&theirs, &NONE, dead),
            "same namespace, dead"
        );
        theirs.remove(LABEL_PID_NAMESPACE);
        assert!(
            me.is_leftover_with(&theirs, &NONE, dead),
            "unlabelled, from the host: judged"
        );
        let in_container = Owner {
            pid_namespace: Some("pid:[2]".into()),
            ..owner()
        };
        assert!(
            !in_container.is_leftover_with(&theirs, &NONE, dead),
            "unlabelled, judged from a container: left alone"
        );
        let mut old_boot = labels_of("x", "h", "old", "1", "1");
        old_boot.insert(LABEL_PID_NAMESPACE.into(), "pid:[2]".into());
        assert!(me.is_leftover_with(&old_boot, &NONE, dead), "another boot");
    }

    #[test]
    fn labels_name_this_process_namespace() {
        let me = Owner::current();
        assert!(me
            .pid_namespace
            .as_deref()
            .is_some_and(|n| n.starts_with("pid:[")));
        assert_eq!(
            me.labels("session").get(LABEL_PID_NAMESPACE),
            me.pid_namespace.as_ref()
        );
    }

    #[test]
    fn a_zombie_counts_as_ended_and_a_live_process_does_not() {
        assert!(!process_has_ended(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("true runs");
        let pid = child.id();
        // Not waited for: once it exits it is a zombie until `wait` below.
        let mut ended = false;
        for _ in 0..500 {
            if process_has_ended(pid) {
                ended = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(ended, "the exited child was not seen as a zombie");
        let _ = child.wait();
    }

    #[test]
    fn reads_this_process_start_time() {
        let start = process_start_time(std::process::id());
        assert!(start.is_some());
        assert_eq!(start, process_start_time(std::process::id()));
    }

    #[test]
    fn a_server_in_a_container_is_dead_when_its_container_is() {
        let me = owner();
        let alive = |_: u32, _: u64| true;
        let mut theirs = labels_of("x", "other-host", "b", "1", "1");
        theirs.insert(LABEL_PID_NAMESPACE.into(), "pid:[2]".into());
        theirs.insert(LABEL_SERVER_CONTAINER.into(), "c1".into());
        theirs.insert(LABEL_SERVER_CONTAINER_STARTED.into(), "t1".into());
        let engine_says = |state: Option<&str>| {
            ServerContainers::from([("c1".to_string(), state.map(str::to_string))])
        };
        assert!(
            !me.is_leftover(&theirs, &NONE),
            "not asked of the engine: left alone"
        );
        assert!(
            me.is_leftover(&theirs, &engine_says(None)),
            "container stopped or gone"
        );
        assert!(
            me.is_leftover(&theirs, &engine_says(Some("t2"))),
            "container restarted since"
        );
        assert!(
            !me.is_leftover(&theirs, &engine_says(Some("t1"))),
            "container running"
        );
        let beside = Owner {
            pid_namespace: Some("pid:[2]".into()),
            host: "other-host".into(),
            ..owner()
        };
        beside.container.get_or_init(|| ServerContainer {
            id: "c1".into(),
            started_at: "t1".into(),
        });
        assert!(
            !beside.is_leftover_with(&theirs, &engine_says(Some("t1")), alive),
            "same container, pid alive"
        );
        assert!(
            beside.is_leftover_with(&theirs, &engine_says(Some("t1")), |_, _| false),
            "same container, pid dead"
        );
    }

    #[test]
    fn finds_its_container_in_the_mount_table() {
        let id = "a".repeat(64);
        let line = format!("1226 1207 254:0 /var/lib/docker/containers/{id}/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw");
        assert_eq!(
            container_id_in(&format!("1 0 0:1 / / rw - overlay overlay rw\n{line}\n")),
            Some(id)
        );
        assert_eq!(container_id_in("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), None);
        assert_eq!(
            container_id_in("1 0 0:1 /containers/short/hostname /etc/hostname rw - ext4 x rw\n"),
            None
        );
    }
}
