//! The tools' structured results (`structuredContent`), beside the text every result has; their
//! schemas are the tools' output schemas. Executions and files have theirs in [`super::render`].

use schemars::JsonSchema;
use serde::Serialize;

use crate::engine::protocol::DirEntry;
use crate::pypi::PackageInfo;

#[derive(Debug, Serialize, JsonSchema)]
pub struct WriteFileOutput {
    /// The absolute path inside the sandbox.
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListFilesOutput {
    pub path: String,
    pub entries: Vec<DirEntry>,
    /// More than 1000 entries: the rest are not listed.
    pub truncated: bool,
}

/// A client root the sandbox mounts (`SANDBOX_ROOTS`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct RootOutput {
    /// The mount point's name.
    pub name: String,
    /// Where the code sees it: `/mnt/roots/<name>`.
    pub path: String,
    /// The directory on the server's machine.
    pub host_path: String,
    pub read_only: bool,
}

impl RootOutput {
    /// The roots a session mounts (none when `set` is `None`).
    pub fn listed(set: Option<&crate::engine::roots::RootSet>) -> Vec<RootOutput> {
        set.map(|set| set.roots.iter().map(RootOutput::of).collect())
            .unwrap_or_default()
    }

    /// A text line each: `root: /mnt/roots/<name> = <host path> (read-only)`.
    pub fn lines(roots: &[RootOutput]) -> String {
        roots
            .iter()
            .map(|root| {
                let access = if root.read_only {
                    "read-only"
                } else {
                    "read-write"
                };
                format!("\nroot: {} = {} ({access})", root.path, root.host_path)
            })
            .collect()
    }

    pub fn of(root: &crate::engine::roots::Root) -> RootOutput {
        RootOutput {
            name: root.name.clone(),
            path: root.container_path(),
            host_path: root.host.display().to_string(),
            read_only: root.read_only,
        }
    }
}

/// A root the client listed that is not mounted, and why.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RefusedRootOutput {
    pub uri: String,
    pub reason: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionOutput {
    /// The session's id: pass it to run_python, sandbox_exec and sandbox_stop.
    pub container_id: String,
    pub image: String,
    /// The client's roots this session mounts, for as long as it lives (empty when
    /// `SANDBOX_ROOTS` is off or the client lists none).
    pub roots: Vec<RootOutput>,
    /// Roots the client listed that are not mounted, and why: shown once, in the first result
    /// after the client listed them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roots_refused: Vec<RefusedRootOutput>,
    /// What came back from the snapshot, when the session started from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored: Option<RestoredOutput>,
    /// What became of the hosts asked for in `network`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Vec<HostOutput>>,
    /// The secrets the session's code may use (none: absent): the egress proxy adds each to
    /// requests to its hosts; the code's variable holds a placeholder, never the value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretOutput>,
}

/// A secret the code may use: its name, the variable holding its placeholder, its hosts.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SecretOutput {
    pub name: String,
    /// The environment variable the code reads (and sends as usual).
    pub env: String,
    /// `host` (port 443) or `host:port`; `*.suffix` for any name below suffix.
    pub hosts: Vec<String>,
}

impl SecretOutput {
    pub fn listed(secrets: &crate::config::secrets::Secrets) -> Vec<SecretOutput> {
        secrets
            .entries
            .iter()
            .map(|s| SecretOutput {
                name: s.name.clone(),
                env: s.env.clone(),
                hosts: s.hosts.iter().map(ToString::to_string).collect(),
            })
            .collect()
    }
}

/// A host a session asked for, and what became of it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HostOutput {
    pub host: String,
    pub port: u16,
    /// `allowed`, `declined` (by the user, for this session), `pending` (not answered yet: asked
    /// again on the code's next attempt) or `refused` (by the policy).
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A name that could not be saved or brought back, and why.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NotSavedOutput {
    pub name: String,
    pub reason: String,
}

impl From<crate::engine::protocol::NotSaved> for NotSavedOutput {
    fn from(n: crate::engine::protocol::NotSaved) -> Self {
        NotSavedOutput {
            name: n.name,
            reason: n.reason,
        }
    }
}

/// What a session started from a snapshot (or forked) got back.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RestoredOutput {
    pub snapshot_id: String,
    /// Regular files put back into /workspace, and their bytes.
    pub files: u64,
    pub file_bytes: u64,
    /// Variables restored under their names.
    pub variables: Vec<String>,
    /// Variables saved but not brought back, and why.
    pub failed: Vec<NotSavedOutput>,
    /// Names bound to modules, imported again.
    pub modules: Vec<String>,
    /// The dependency set on sys.path.
    pub dependencies: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotOutput {
    /// Pass it to sandbox_initialize {snapshot_id} to start a session from it.
    pub snapshot_id: String,
    pub name: Option<String>,
    /// The session it was made from.
    pub container_id: String,
    pub image: String,
    pub size_bytes: u64,
    /// Regular files of /workspace saved, and their bytes.
    pub files: u64,
    pub file_bytes: u64,
    /// Variables saved.
    pub saved: Vec<String>,
    /// Variables that could not be saved (open files, sockets, generators, threads...), and why.
    pub unsaved: Vec<NotSavedOutput>,
    /// Names bound to modules: imported again at restore.
    pub modules: Vec<String>,
    /// The dependency set, installed again (or found in the cache) at restore.
    pub dependencies: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ForkOutput {
    /// The new session's id.
    pub container_id: String,
    pub forked_from: String,
    pub image: String,
    pub files: u64,
    pub file_bytes: u64,
    /// Variables copied under their names.
    pub variables: Vec<String>,
    /// Variables the original holds that could not be copied, and why.
    pub unsaved: Vec<NotSavedOutput>,
    /// Variables saved but not brought back, and why.
    pub failed: Vec<NotSavedOutput>,
    pub modules: Vec<String>,
    pub dependencies: Vec<String>,
    /// The roots the new session mounts: those of the session it was forked from, for as long
    /// as it lives (empty when that session mounts none).
    pub roots: Vec<RootOutput>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotEntry {
    pub snapshot_id: String,
    pub name: Option<String>,
    /// The session it was made from.
    pub container_id: String,
    pub image: String,
    /// When it was made (RFC 3339, UTC).
    pub created: String,
    pub age_seconds: u64,
    pub size_bytes: u64,
    pub dependencies: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotListOutput {
    /// Newest first.
    pub snapshots: Vec<SnapshotEntry>,
    pub max_size_bytes: u64,
    /// Per owner: the oldest are removed beyond it.
    pub max_count: usize,
    /// Every owner's snapshots together: a new one makes room from its owner's oldest, else it
    /// is refused.
    pub max_total_bytes: u64,
    /// Snapshots older than this are removed.
    pub ttl_seconds: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotDeleteOutput {
    pub snapshot_id: String,
    pub deleted: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StopOutput {
    pub container_id: String,
    pub stopped: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListOutput {
    pub sessions: Vec<SessionEntry>,
    pub limits: LimitsOutput,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionEntry {
    pub container_id: String,
    pub image: String,
    pub age_seconds: u64,
    pub idle_seconds: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LimitsOutput {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
    pub timeout_seconds: f64,
    pub max_output_bytes: u64,
    pub network: String,
    pub max_sessions: usize,
    pub session_idle_timeout_seconds: u64,
    pub session_max_lifetime_seconds: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SearchOutput {
    pub query: String,
    pub results: Vec<PackageInfo>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExportNotebookOutput {
    /// The notebook's path in the sandbox (`/workspace/...`).
    pub path: String,
    /// The same file as a resource to read with `resources/read`.
    pub resource_uri: String,
    /// Code cells in the notebook (one per run_python call the session still keeps).
    pub cells: usize,
    /// Earlier cells the session no longer keeps (over its bounds), left out.
    pub dropped_cells: u64,
    pub size_bytes: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RunNotebookOutput {
    /// The session it ran in; absent when a session was started for the run (and stopped).
    pub container_id: Option<String>,
    /// Cells of the notebook (code, markdown, raw), parameters' cell included.
    pub cells: usize,
    pub code_cells: usize,
    /// Code cells executed.
    pub cells_run: usize,
    /// Code cells not executed: empty, or tagged `skip-execution`.
    pub cells_skipped: usize,
    /// Code cells never reached, after the run stopped.
    pub cells_not_run: usize,
    /// Every cell that failed, in order (the one the run stopped at last).
    pub failed: Vec<FailedCellOutput>,
    /// The run stopped at a failed cell (its index), or was cancelled.
    pub stopped_at: Option<usize>,
    /// Every cell ran, and none failed except those tagged `raises-exception` or run with
    /// `stop_on_error: false`.
    pub succeeded: bool,
    pub duration_ms: u64,
    /// The parameters injected, by name (in the order they are assigned).
    pub parameters: Vec<String>,
    /// Where the executed notebook was saved (`/workspace/...`), and as a resource.
    pub saved_path: Option<String>,
    pub resource_uri: Option<String>,
    /// Why it was not saved or not returned whole.
    pub note: Option<String>,
}

/// A cell that failed, and how.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FailedCellOutput {
    /// Its index among the notebook's cells (0 is the first).
    pub index: usize,
    pub execution_count: Option<u64>,
    /// The exception's type (`ZeroDivisionError`), `Timeout`, or why it could not run.
    pub ename: String,
    pub evalue: String,
    /// It was tagged `raises-exception`: the run went on.
    pub allowed: bool,
}
