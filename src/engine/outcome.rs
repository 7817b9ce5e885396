//! What an execution comes to: its output and status, the files it made and the dependencies it
//! ran with. Plain data, below everything that produces it (the sandbox, the file collection,
//! the installer), so none of those depend on each other for it.

use std::path::PathBuf;
use std::time::Duration;

pub use super::displays::{Discarded, Metadata, MimeBundle, Output, StreamName};
use super::protocol::{ChangedEntry, RaisedException, RootChangedEntry, RunnerResult};

/// The outcome of one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Execution {
    /// Each stream as kept: whole, or (over its share of `SANDBOX_MAX_OUTPUT`) its head and tail
    /// with the line of [`Discarded::marker`] between them (`discarded` says where).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The code's exit status: 0, `sys.exit(n)`, 1 for an uncaught exception, 130 when interrupted,
    /// 137 when the sandbox was killed.
    pub exit_code: i32,
    /// Time the code ran, as measured inside the sandbox (or on the host when the runner died).
    pub duration: Duration,
    /// Bytes of output beyond the cap: counted, not kept (both streams).
    pub truncated_bytes: u64,
    /// What was dropped from the middle of stdout and of stderr (a stream over its share of the
    /// cap keeps its head and tail): `stdout`/`stderr` have a line saying so where it was.
    pub discarded: [Option<Discarded>; 2],
    /// The wall-clock limit expired.
    pub timed_out: bool,
    /// The caller cancelled the execution.
    pub cancelled: bool,
    /// The runner was restarted: variables and imports of earlier executions are gone.
    pub state_lost: bool,
    /// The whole sandbox was restarted: the workspace's files are gone too.
    pub workspace_lost: bool,
    /// The sandbox ran out of memory.
    pub out_of_memory: bool,
    /// The exception that ended the code, if one did.
    pub error: Option<RaisedException>,
    /// What the execution changed in the workspace (consumed when files are collected).
    pub changes: Changes,
    /// The files collected from the workspace, and figures.
    pub files: Vec<Artifact>,
    /// The dependencies made importable for this execution, if any were requested.
    pub dependencies: Option<DependencyReport>,
    /// Where the whole output is kept, when its reader sees only part of it
    /// (`RunOptions::keep_whole_output`).
    pub whole_output: Option<WholeOutput>,
    /// What the code showed, in order: streams, displays, its last expression's value, the error
    /// (nbformat v4 outputs). Empty when the runner did not report them (a shell command, a
    /// runner that died).
    pub outputs: Vec<Output>,
    /// Outputs the runner dropped over their bounds.
    pub outputs_dropped: u64,
    /// The code cleared its output (`clear_output`): `outputs` is what a notebook shows after
    /// the cell; `stdout` and `stderr` stay whole.
    pub outputs_cleared: bool,
    /// The connections the code tried through the egress proxy during this execution
    /// (`SANDBOX_NETWORK=allowlist`; `None` in the other modes).
    pub network: Option<Vec<NetworkEntry>>,
    /// A Python execution's count (`In [n]`) as the runner's shell counted it (in a session, as
    /// its history keeps it).
    pub execution_count: Option<u64>,
    /// A session's roots (those it started with) are no longer its client's roots: new
    /// sandboxes mount the new ones, this session keeps its own.
    pub roots_stale: bool,
}

impl Execution {
    /// The outcome the runner reported (checked), before files and dependencies are added.
    pub fn from_result(result: RunnerResult) -> Execution {
        Execution {
            stdout: result.stdout,
            stderr: result.stderr,
            exit_code: result.exit_code,
            duration: Duration::from_secs_f64(result.duration_ms / 1000.0),
            truncated_bytes: result.dropped_bytes,
            discarded: result.discarded,
            error: result.error,
            outputs: result.outputs,
            outputs_dropped: result.outputs_dropped,
            outputs_cleared: result.outputs_cleared,
            execution_count: result.execution_count,
            changes: Changes {
                entries: result.changed,
                left_out: result.changed_left_out,
                truncated: result.changed_truncated,
                figures: result.figures,
                roots: result.root_changed,
                roots_left_out: result.root_changed_left_out,
                roots_truncated: result.root_changed_truncated,
            },
            ..Default::default()
        }
    }

    /// Whether the code ran through: status 0 and no error (a `SystemExit` is an error even with
    /// status 0, as a Jupyter kernel reports it), not stopped by a limit or the caller.
    pub fn succeeded(&self) -> bool {
        self.exit_code == 0
            && self.error.is_none()
            && !self.timed_out
            && !self.cancelled
            && !self.out_of_memory
    }
}

/// What an execution changed, as the runner reported it (checked, not yet copied out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    pub entries: Vec<ChangedEntry>,
    /// Changed entries the runner counted but did not name (over the listing's bounds).
    pub left_out: u64,
    pub truncated: bool,
    /// PNG images of matplotlib figures.
    pub figures: Vec<Vec<u8>>,
    /// What changed in the client's writable roots: reported where it is, never copied.
    pub roots: Vec<RootChangedEntry>,
    pub roots_left_out: u64,
    pub roots_truncated: bool,
}

/// One file an execution produced, and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// Relative to `/workspace` (figures: `figures/figure-N.png`, which is not in the workspace).
    pub path: String,
    pub size: u64,
    pub mime_type: String,
    /// The bytes, when they are returned to the client.
    pub content: Option<Vec<u8>>,
    /// Where the file was saved on the host.
    pub saved_to: Option<PathBuf>,
    /// Why it was not returned (or not even copied out).
    pub note: Option<String>,
    /// A matplotlib figure rather than a workspace file.
    pub figure: bool,
}

/// Where the whole of an execution's output is kept, stream by stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WholeOutput {
    pub stdout: KeptStream,
    pub stderr: KeptStream,
}

/// Where one whole stream of output is kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeptStream {
    /// The file on the host, beside the run's files.
    pub saved_to: Option<PathBuf>,
    /// In a session: the file in its workspace, relative to `/workspace`.
    pub workspace_path: Option<String>,
    /// Why it was not saved on the host, or not written in the workspace.
    pub notes: Vec<String>,
}

/// What a request's dependencies came to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DependencyReport {
    /// Canonical requirements in force for the execution.
    pub requirements: Vec<String>,
    pub key: String,
    /// Where the sandbox sees the set (`/opt/deps/s-<random>`), on its `sys.path`.
    pub path: String,
    /// An installer ran for this request (false: the cache had it).
    pub installed: bool,
    /// The sandbox was prepared for this set before the call (its modules imported, out of the
    /// code's sight until it imports them): what the host knows and the code cannot tell.
    pub prepared: bool,
}

/// What came of the code's attempts to reach one host and port, in one execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkEntry {
    pub host: String,
    pub port: u16,
    pub outcome: NetworkOutcome,
    /// Attempts counted here.
    pub connections: u32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Why it was refused, is pending, or failed.
    pub reason: Option<String>,
    /// The same as data, where the proxy or the installers' policy says it as such (the first
    /// attempt's, for entries that count several).
    pub stopped: Option<Stopped>,
    /// The secret the egress proxy added to these requests (its name; never its value).
    pub secret: Option<String>,
    /// The secrets whose placeholder these requests carried as written, to a host that gets no
    /// value for it (seen in clear text and in bumped tunnels only).
    pub placeholder: Option<String>,
}

/// What stopped a connection through the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// The host and port are not among those the sandbox may reach.
    NotAllowed,
    /// The address is on the sandboxes' own networks or next to the proxy on its uplink, which
    /// no sandbox may reach whatever the settings (a container on the engine's default bridge).
    OffLimits,
    /// The name resolved to an address that is not public, which no setting allows.
    NonPublic(std::net::IpAddr),
    /// The name does not resolve.
    Unresolved,
    /// Allowed, but what it names did not answer the proxy.
    NoAnswer(NoAnswer),
}

/// How an allowed host failed to answer the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    /// The connection was refused (nothing listens on that port).
    Refused,
    /// The connection timed out.
    TimedOut,
    /// The host or its network is unreachable, or the connection failed another way.
    Unreachable,
}

impl NoAnswer {
    pub fn as_str(self) -> &'static str {
        match self {
            NoAnswer::Refused => "the connection was refused",
            NoAnswer::TimedOut => "the connection timed out",
            NoAnswer::Unreachable => "it is unreachable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetworkOutcome {
    /// Connected (bytes may have flowed both ways).
    Reached,
    /// The policy refused it.
    Refused,
    /// Refused for now: the user is being asked.
    Pending,
    /// Allowed, but the connection could not be made.
    Failed,
}

impl NetworkOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkOutcome::Reached => "reached",
            NetworkOutcome::Refused => "refused",
            NetworkOutcome::Pending => "pending",
            NetworkOutcome::Failed => "failed",
        }
    }
}
