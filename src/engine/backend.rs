//! The boundary between the engine and a container platform.
//!
//! The engine speaks only in these terms: a sandbox is created from a [`SandboxSpec`], started with
//! its runner's stdin/stdout attached, interrupted, killed, inspected and destroyed. Docker is one
//! implementation ([`super::docker::DockerBackend`]); a Kubernetes backend can be another, so
//! nothing Docker-specific appears here.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::Stream;
use tokio::io::AsyncWrite;

use crate::config::{Limits, NetworkPolicy, OperatorMount};

/// The id of a sandbox as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(pub String);

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything a backend needs to create one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub image: String,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// Host CA bundle, mounted read-only when the sandbox has a network.
    pub ca_bundle: Option<PathBuf>,
    /// Host directories the operator chose to mount (never the agent).
    pub mounts: Vec<OperatorMount>,
    /// Named volumes shared between sandboxes (the dependency cache).
    pub volumes: Vec<VolumeMount>,
    /// The OCI runtime (`None`: the engine's default).
    pub runtime: Option<String>,
    /// The runner's argv.
    pub command: Vec<String>,
    /// Labels that identify the owning server instance (see `engine::owner`).
    pub labels: BTreeMap<String, String>,
    /// Attach to this engine network instead of `network` (the installer's egress network).
    pub network_name: Option<String>,
    /// Extra environment variables (`NAME=value`), e.g. the installer's proxy.
    pub env: Vec<String>,
    /// A maintenance sandbox of the dependency cache: runs as root with only the capabilities
    /// to own and change any file (CHOWN, FOWNER, DAC_OVERRIDE), and only ever the project's own
    /// scripts, never package or agent code.
    pub maintenance: bool,
    /// The `nofile` limit instead of a sandbox's (the egress proxy: its connection caps).
    pub open_files: Option<u64>,
    /// The `uid:gid` the sandbox runs as instead of [`paths::USER`]: the server's own, with
    /// writable MCP roots (`SANDBOX_ROOTS=rw`), so what the code writes there is the user's.
    /// Its workspace belongs to that user too.
    pub user: Option<(u32, u32)>,
    /// The client's roots its `mounts` hold: checked before every create of its container, and
    /// verified in the container as it starts (see `engine::roots`).
    pub roots: Option<std::sync::Arc<super::roots::Mounted>>,
    /// The container's network namespace never forwards packets between its interfaces
    /// (`net.ipv4.ip_forward=0`, `net.ipv6.conf.all.forwarding=0`): the egress proxy, which sits on
    /// the sandboxes' networks and its uplink, so only Squid ever carries anything between them.
    /// (A new namespace copies the host's IPv4 forwarding, which Docker turns on.)
    pub no_forwarding: bool,
}

/// A named volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub name: String,
    pub target: String,
    pub read_only: bool,
    /// Create the volume (if it does not exist) as a tmpfs of this many bytes, labelled like the
    /// sandbox: its content lives while a sandbox mounting it runs.
    pub tmpfs_bytes: Option<u64>,
}

/// Where sandboxed processes see things; the same in every backend.
pub mod paths {
    pub const WORKSPACE: &str = "/workspace";
    pub const TMP: &str = "/tmp";
    pub const CA_BUNDLE: &str = "/etc/ssl/certs/sandbox-ca-bundle.crt";
    /// The image's system bundle (Debian's), which the same bundle is mounted over.
    pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    /// Installed dependency sets, one directory per cache key (read-only in sandboxes).
    pub const DEPS: &str = "/opt/deps";
    /// The runner's IPython set where the sandbox image carries it (`image build` puts it there).
    pub const BAKED_IPYTHON: &str = "/opt/sandbox-ipython";
    /// The installers' download cache.
    pub const DOWNLOAD_CACHE: &str = "/opt/pip-cache";
    pub const HOME: &str = "/home/sandbox";
    /// uid:gid of the unprivileged user every sandbox runs as.
    pub const USER: &str = "1000:1000";
}

/// A chunk of what the runner process wrote.
#[derive(Debug, Clone)]
pub enum OutputChunk {
    /// The protocol stream (the runner's original stdout).
    Stdout(Bytes),
    /// Diagnostics the runner or Python itself printed before the runner took over (e.g. "python3:
    /// not found"); shown to the user when a sandbox fails to start.
    Stderr(Bytes),
}

pub type OutputStream = Pin<Box<dyn Stream<Item = Result<OutputChunk, BackendError>> + Send>>;
pub type InputSink = Pin<Box<dyn AsyncWrite + Send>>;

/// The runner's attached standard streams.
pub struct RunnerStreams {
    pub input: InputSink,
    pub output: OutputStream,
}

/// How a sandbox's main process ended, when it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitInfo {
    pub running: bool,
    pub exit_code: Option<i64>,
    /// The kernel killed a process of the sandbox for exceeding its memory limit.
    pub oom_killed: bool,
    /// When the main process last started, as the engine reports it.
    pub started_at: Option<String>,
}

/// What the platform itself recorded of a sandbox's limits and hardening when it created it (its
/// own record, never the sandbox's word): `doctor` compares it with the configuration. A field is
/// `None` when the record does not have it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitsRecord {
    /// The OCI runtime the sandbox runs under, as recorded (`None`: not recorded).
    pub runtime: Option<String>,
    /// The memory limit in bytes (`0` or absent: none).
    pub memory_bytes: Option<i64>,
    /// The memory+swap limit in bytes (equal to the memory limit: no swap; `-1`: unlimited swap).
    pub memory_swap_bytes: Option<i64>,
    /// The limit on processes and threads (`0` or `-1`: none).
    pub pids: Option<i64>,
    /// CPUs in billionths (`0` or absent: none; the CFS fields may say it instead).
    pub nano_cpus: Option<i64>,
    /// A CFS quota in microseconds per period (`0` or absent: none).
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<i64>,
    /// The security options as recorded (e.g. `no-new-privileges`).
    pub security_options: Vec<String>,
    /// The process on the engine's machine that holds the sandbox (its init under runc, gVisor's
    /// sandbox process under runsc), while it runs; `None` when the platform does not say.
    pub host_pid: Option<u32>,
}

impl LimitsRecord {
    /// The record says no process of the sandbox may gain privileges (setuid, file capabilities).
    pub fn no_new_privileges(&self) -> bool {
        self.security_options.iter().any(|option| {
            matches!(
                option.as_str(),
                "no-new-privileges" | "no-new-privileges:true" | "no-new-privileges=true"
            )
        })
    }
}

/// A sandbox found by [`Backend::list`].
#[derive(Debug, Clone)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub labels: BTreeMap<String, String>,
}

/// Which container engine answers behind the Docker-compatible API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Docker,
    Podman,
    /// The in-process fake of the unit tests.
    Fake,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Docker => "Docker",
            EngineKind::Podman => "Podman",
            EngineKind::Fake => "fake",
        }
    }
}

/// A resource limit the engine itself says it cannot enforce (from its `/info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    Memory,
    Swap,
    Pids,
    Cpu,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory (SANDBOX_MEMORY_LIMIT)",
            Limit::Swap => "swap (none allowed)",
            Limit::Pids => "processes (SANDBOX_PIDS_LIMIT)",
            Limit::Cpu => "CPU (SANDBOX_CPU_LIMIT)",
        }
    }
}

/// The engine daemon's identity and what it can enforce, for runtime choice, refusals and
/// `doctor`.
#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// What the engine calls itself and its version, e.g. `Docker 20.10.24`.
    pub name: String,
    pub kind: EngineKind,
    pub version: String,
    pub api_version: String,
    /// The daemon runs without root (rootless Docker or Podman).
    pub rootless: bool,
    /// Containers' uids are mapped to others on the host (Docker's `userns-remap`): a file a
    /// sandbox writes to a bind mount is not owned by the uid it ran as.
    pub userns_remap: bool,
    /// `1` or `2`, when the engine says.
    pub cgroup_version: Option<String>,
    /// Runtimes registered with the engine, each with the arguments it was registered with.
    pub runtimes: BTreeMap<String, Vec<String>>,
    /// The binary each registered runtime runs, as the engine names it (a path on the engine's
    /// machine, or a name it looks up on its PATH); absent where the engine does not say.
    pub runtime_paths: BTreeMap<String, String>,
    pub default_runtime: Option<String>,
    /// Limits the engine says it cannot enforce on this host.
    pub unenforced: Vec<Limit>,
    /// Where the engine is: `unix:///var/run/docker.sock`, `tcp://host:2376`, `ssh://user@host`.
    pub endpoint: String,
    /// On another machine (TCP or SSH): host paths in settings are paths on that machine.
    pub remote: bool,
    /// The memory and CPUs of the engine's host, when it says.
    pub memory_bytes: Option<u64>,
    pub cpus: Option<usize>,
}

/// The error a backend's client library gave, kept as the source of a [`BackendError`] (shared,
/// so the error stays cheap to clone).
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The engine could not be reached at all (no socket, connection refused, a transport error).
    #[error("the container engine is not reachable: {source}")]
    Unavailable {
        #[source]
        source: Cause,
    },
    #[error("image {image} is not available: {hint}")]
    ImageMissing { image: String, hint: String },
    #[error("sandbox {0} no longer exists")]
    NotFound(SandboxId),
    /// The engine answered with an error status.
    #[error("container engine error {status}: {message}")]
    Refused { status: u16, message: String },
    /// The engine's answer could not be read.
    #[error("{source}")]
    Unreadable {
        #[source]
        source: Cause,
    },
    /// The engine or the sandbox did something the backend cannot work with (no id, no address,
    /// an archive over its limit, no answer in time).
    #[error("{0}")]
    Unexpected(String),
}

impl BackendError {
    /// The engine is unreachable because of `source`.
    pub fn unavailable(source: impl std::error::Error + Send + Sync + 'static) -> BackendError {
        BackendError::Unavailable {
            source: Arc::new(source),
        }
    }
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Checks that the engine answers.
    async fn info(&self) -> Result<BackendInfo, BackendError>;

    /// Makes sure `image` can be used, fetching or building it when that is possible.
    async fn ensure_image(&self, image: &str) -> Result<(), BackendError>;

    /// The content id of `image` (changes whenever the image is rebuilt).
    async fn image_id(&self, image: &str) -> Result<String, BackendError>;

    /// The labels of `image` (empty when it has none).
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<std::collections::HashMap<String, String>, BackendError>;

    /// Whether this backend gives the runner its IPython itself (a backend that runs the runner
    /// as a host process, for tests): then the engine installs no set for it (see
    /// `engine::runner_set`). A container platform does not.
    fn gives_runner_ipython(&self) -> bool {
        false
    }

    /// Creates (but does not start) a sandbox.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxId, BackendError>;

    /// Whether a [`create`](Backend::create) was dropped before the platform answered it (a call
    /// cancelled, a refill stopped at shutdown): the platform may still carry it out, so a
    /// sandbox of this server can appear after its last look. The server then leaves the final
    /// sweep to its warden, which looks until the platform has been quiet for a while.
    fn abandoned_a_create(&self) -> bool {
        false
    }

    /// The memory a running sandbox uses now, as the platform measures it (never the sandbox's
    /// own word): what the warm pool counts against `SANDBOX_POOL_MAX_MEMORY`. `None` when the
    /// platform does not say.
    async fn memory_usage(&self, _id: &SandboxId) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }

    /// The CPU time a running sandbox's processes have used so far, as the platform measures it
    /// (its cgroup's, never the sandbox's own word): what the CPU used between calls is charged
    /// from. `None` when the platform does not say.
    async fn cpu_usage(&self, _id: &SandboxId) -> Result<Option<Duration>, BackendError> {
        Ok(None)
    }

    /// What the platform recorded of an existing sandbox's limits and hardening (see
    /// [`LimitsRecord`]). A platform that keeps no such record says so with an error.
    async fn limits_record(&self, id: &SandboxId) -> Result<LimitsRecord, BackendError> {
        Err(BackendError::Unexpected(format!(
            "this engine keeps no record of sandbox {id}'s limits"
        )))
    }

    /// Starts the sandbox's main process (again, after [`Backend::kill`]) and attaches to its
    /// standard streams before it can write anything.
    async fn start(&self, id: &SandboxId) -> Result<RunnerStreams, BackendError>;

    /// Asks the runner to interrupt the code it is executing (SIGINT).
    async fn interrupt(&self, id: &SandboxId) -> Result<(), BackendError>;

    /// Kills every process of the sandbox but its supervisor, which then starts a new runner (an
    /// `exited` message says so); the sandbox and its workspace stay.
    async fn kill_processes(&self, id: &SandboxId) -> Result<(), BackendError>;

    /// Stops every process of the sandbox at once, supervisor included: the workspace is lost and
    /// only a new start brings a runner back.
    async fn kill(&self, id: &SandboxId) -> Result<(), BackendError>;

    /// How the main process ended, if it did. Works for any container of the engine, not only
    /// sandboxes (a server in a container asks it of its own).
    async fn exit_info(&self, id: &SandboxId) -> Result<ExitInfo, BackendError>;

    /// How many times the engine has said that the kernel stopped a process of the sandbox for
    /// memory (its `oom` events), where the engine's events are followed; `None` where they are
    /// not. Under gVisor the sandbox's own cgroup files do not show the host's memory kills.
    async fn oom_count(&self, _id: &SandboxId) -> Option<u64> {
        None
    }

    /// Unpacks a tar archive into `dir` inside the sandbox (a directory of the workspace).
    async fn copy_in(&self, id: &SandboxId, dir: &str, archive: Bytes) -> Result<(), BackendError>;

    /// Packs `path` inside the sandbox as a tar archive, refusing archives over `max_bytes`. The
    /// archive is the sandbox's content: untrusted, to be unpacked with care.
    async fn copy_out(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: u64,
    ) -> Result<Bytes, BackendError>;

    /// Asks the sandbox's supervisor to recycle it for another call: every other process killed,
    /// everything the code could write removed, a new runner started (the supervisor reports it
    /// with an `exited` frame saying what is left). An engine that cannot says so with an error,
    /// and the caller removes the sandbox instead.
    async fn recycle(&self, id: &SandboxId) -> Result<(), BackendError> {
        Err(BackendError::Unexpected(format!(
            "this engine cannot recycle sandbox {id}"
        )))
    }

    /// Removes the sandbox and its storage. Removing one that is already gone succeeds.
    async fn destroy(&self, id: &SandboxId) -> Result<(), BackendError>;

    /// Sandboxes (of any owner) carrying `label` = `value`, and storage left without a sandbox.
    async fn list(&self, label: &str, value: &str) -> Result<Vec<SandboxRecord>, BackendError>;

    /// Creates a labelled network; `internal`: with no route out of it and no address of the
    /// host on it (containers on it reach only each other).
    /// `subnet`: its IPv4 range (`None`: the engine picks one).
    async fn create_network(
        &self,
        name: &str,
        internal: bool,
        subnet: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), BackendError>;

    /// Removes a network (gone already: success).
    async fn remove_network(&self, name: &str) -> Result<(), BackendError>;

    /// Attaches a created sandbox to another network too; returns its IPv4 address there once
    /// it runs (see [`Backend::address_on`]).
    async fn connect_network(&self, id: &SandboxId, network: &str) -> Result<(), BackendError>;

    /// Detaches a sandbox from a network (either gone already: success).
    async fn disconnect_network(&self, id: &SandboxId, network: &str) -> Result<(), BackendError>;

    /// The running sandbox's IPv4 address on `network`.
    async fn address_on(&self, id: &SandboxId, network: &str) -> Result<String, BackendError>;

    /// Removes the named volume (gone already: success).
    async fn remove_volume(&self, name: &str) -> Result<(), BackendError>;

    /// Removes storage volumes (and networks) with `label` = `value` that no sandbox uses and
    /// whose owner labels satisfy `orphaned`.
    async fn remove_orphaned_storage(
        &self,
        label: &str,
        value: &str,
        orphaned: &(dyn for<'l> Fn(&'l BTreeMap<String, String>) -> bool + Sync),
    ) -> Result<usize, BackendError>;
}
