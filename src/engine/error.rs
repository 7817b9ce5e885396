//! The engine's one error type: what went wrong with a request, a sandbox, the backend or the
//! dependencies, with the underlying error kept as its source.

use super::backend::BackendError;
use super::deps;
use super::platform::NETSTACK_REFUSAL;
use super::protocol::ProtocolError;

/// A start the engine refused, explained where the cause is the runtime's registration: a
/// gVisor entry with its own network stack on a host where runsc refuses it (the registration's
/// probe would have chosen host-network mode) is a refusal naming the fix, not a passing failure
/// worth another try. The server never falls back to a weaker runtime on its own.
pub fn explain_start_failure(error: BackendError, runtime: Option<&str>) -> EngineError {
    match (&error, runtime) {
        (BackendError::Refused { message, .. }, Some(name))
            if super::platform::is_gvisor_name(name) && message.contains(NETSTACK_REFUSAL) =>
        {
            EngineError::Refused(super::platform::Refusal(format!(
                "gVisor's runtime {name} gives its sandboxes gVisor's own network stack, which \
                 runsc refuses on this host (\"{NETSTACK_REFUSAL}\"): register it in \
                 host-network mode (`sudo python-code-sandbox setup --gvisor` probes and does), \
                 or set SANDBOX_RUNTIME=runc to run networked code under runc"
            )))
        }
        _ => EngineError::Backend(error),
    }
}

impl EngineError {
    /// A start failure worth one more try on a new sandbox: the engine or the runtime failed
    /// (a shim that could not start, a process or thread limit reached for a moment, a timeout),
    /// not the request or the configuration.
    pub fn is_transient_start(&self) -> bool {
        match self {
            EngineError::Backend(BackendError::NotFound(_) | BackendError::ImageMissing { .. }) => {
                false
            }
            EngineError::Backend(_) | EngineError::SandboxStart(_) | EngineError::Protocol(_) => {
                true
            }
            _ => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The engine cannot provide the configured isolation (see `engine::platform`).
    #[error(transparent)]
    Refused(#[from] super::platform::Refusal),
    #[error("the sandbox failed to start: {0}")]
    SandboxStart(String),
    /// No sandbox could be had within the bounds of this server (see `engine::admission`).
    #[error(transparent)]
    AtCapacity(#[from] super::admission::Refusal),
    /// A start failed twice, the second time on a new sandbox, for a reason that is usually
    /// passing (the engine or the runtime short of something for a moment).
    #[error("no sandbox could be started (tried twice; the engine may be overloaded): {0}")]
    StartFailedTwice(#[source] Box<EngineError>),
    #[error("the sandbox broke the runner protocol and was stopped: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the sandbox has been removed")]
    SandboxGone,
    /// A sandbox taken from the warm pool was dead before the code reached it: the code never
    /// ran (the caller takes another sandbox).
    #[error("the sandbox died while it waited in the pool, before the code started")]
    DiedBeforeUse,
    /// The sandbox's runner was given the runner's IPython set (`PCS_IPYTHON`) and could not
    /// import it: no code runs there (see `engine::runner_set`).
    #[error("the sandbox's runner could not import its IPython, so it runs no code: {0}")]
    RunnerIpython(String),
    /// The server could not install its runner's own IPython set for an image: the cause, with
    /// what to set, as a dependency install's.
    #[error(
        "the server could not install its runner's IPython, which every sandbox needs to run code \
         (installed once per image from the package index, whether or not agents may install \
         dependencies):\n{0}"
    )]
    RunnerSetFailed(#[source] Box<deps::InstallFailure>),
    #[error("the sandbox was lost: {0}")]
    SandboxLost(String),
    /// A snapshot or a restore ran the session's own code past the call's timeout, and was
    /// stopped as an execution that timed out is.
    #[error(
        "the {work} was stopped at the call's timeout of {} (SANDBOX_TIMEOUT): it ran the \
         session's own code (such as a value's __reduce__, __setstate__ or a module's import) \
         that long, and that time counts as an execution's; {lost}",
        crate::text::duration(*timeout)
    )]
    WorkTimedOut {
        work: Work,
        timeout: std::time::Duration,
        lost: WorkLost,
    },
    #[error("no session {0}: it was stopped or never created by this server; start one with sandbox_initialize")]
    UnknownSession(String),
    #[error("session {id} has ended: {reason}; start a new one with sandbox_initialize")]
    SessionEnded { id: String, reason: String },
    #[error("no session {id} on this server (it ended, or the server restarted); its latest snapshot {snapshot} keeps its state: resume it with sandbox_initialize {{\"snapshot_id\": \"{snapshot}\"}}")]
    UnknownSessionWithSnapshot { id: String, snapshot: String },
    #[error("{0:?} is not a valid container_id: use the id sandbox_initialize returned")]
    MalformedSessionId(String),
    #[error("image {image} is not allowed; allowed: {allowed}")]
    ImageNotAllowed { image: String, allowed: String },
    /// A client's root changed on the host between its listing and a sandbox's start.
    #[error("{0}")]
    RootChanged(String),
    #[error("the limit of {0} live sessions is reached; stop one with sandbox_stop first")]
    TooManySessions(usize),
    #[error("the code is {size} bytes, more than the {limit}-byte limit")]
    CodeTooLarge { size: usize, limit: usize },
    #[error("{0:?} is not a path inside /workspace: give a relative path without `..`")]
    InvalidPath(String),
    #[error("Unknown snapshot {0}: it was deleted, expired, or was never made by you; sandbox_snapshots lists yours")]
    UnknownSnapshot(String),
    #[error("{0:?} is not a valid snapshot_id: use the id sandbox_snapshot returned (snap-…)")]
    MalformedSnapshotId(String),
    #[error("snapshot {id} is corrupted: {reason}; it cannot be restored (delete it with sandbox_snapshot_delete)")]
    SnapshotCorrupted { id: String, reason: String },
    #[error("the snapshot failed: {0}")]
    Snapshot(String),
    /// A new snapshot would take the store (every owner's snapshots together) beyond its bound,
    /// even once the owner's own older snapshots made room.
    #[error("the snapshot store is full: this snapshot ({size}) does not fit within SANDBOX_SNAPSHOT_MAX_TOTAL ({limit}, every owner's snapshots together), not even in place of all your older ones; it was not kept, and none of yours was removed. Free room with sandbox_snapshot_delete (sandbox_snapshots lists yours), or ask the operator to raise SANDBOX_SNAPSHOT_MAX_TOTAL")]
    SnapshotStoreFull { size: String, limit: String },
    #[error("snapshots are turned off on this server (SANDBOX_SNAPSHOT_DIR is empty)")]
    SnapshotsOff,
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error(transparent)]
    InvalidDependency(#[from] deps::DependencyError),
    /// The egress proxy (`SANDBOX_NETWORK=allowlist`, and the installers' way out) failed.
    #[error("the egress proxy failed: {0}")]
    Egress(String),
    #[error("installing the dependencies failed:\n{0}")]
    Dependencies(String),
    /// The installer ran and failed: why, as data (`deps::FailureKind`), with its own words.
    #[error("installing the dependencies failed:\n{0}")]
    InstallFailed(#[source] Box<deps::InstallFailure>),
    /// The installer or the cache's maintenance answered something that is not the JSON the
    /// project's own script prints.
    #[error("installing the dependencies failed:\nunreadable {what}: {source}")]
    UnreadableAnswer {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Sandbox work that runs the session's own code besides an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Snapshot,
    Fork,
    Restore,
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Work::Snapshot => "snapshot",
            Work::Fork => "fork",
            Work::Restore => "restore",
        })
    }
}

/// What stopping work at its timeout cost the session, as for an execution that timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkLost {
    /// The code stopped on the interrupt: the session keeps its variables and files.
    Nothing,
    /// The code ignored the interrupt: its processes were killed (the interpreter restarts).
    Variables,
    /// Not even that answered: the sandbox was killed (it restarts on the next call).
    Everything,
    /// The session being restored into was stopped.
    NewSession,
}

impl std::fmt::Display for WorkLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkLost::Nothing => {
                "nothing was saved; the code was interrupted (KeyboardInterrupt) and the session \
                 keeps its variables and files"
            }
            WorkLost::Variables => {
                "nothing was saved; the code did not stop on interrupt, so its processes were \
                 killed and the interpreter restarted: the session's variables are lost, its \
                 /workspace files remain"
            }
            WorkLost::Everything => {
                "nothing was saved; the code did not stop on interrupt, so the sandbox was \
                 killed: the session's variables and /workspace files are lost (it restarts \
                 empty on the next call)"
            }
            WorkLost::NewSession => "the session it was restoring into was stopped",
        })
    }
}

impl EngineError {
    /// Whether the caller's request was at fault (as opposed to the engine or the sandbox).
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            EngineError::UnknownSession(_)
                | EngineError::SessionEnded { .. }
                | EngineError::UnknownSessionWithSnapshot { .. }
                | EngineError::UnknownSnapshot(_)
                | EngineError::MalformedSnapshotId(_)
                | EngineError::SnapshotCorrupted { .. }
                | EngineError::Snapshot(_)
                | EngineError::WorkTimedOut { .. }
                | EngineError::SnapshotStoreFull { .. }
                | EngineError::SnapshotsOff
                | EngineError::MalformedSessionId(_)
                | EngineError::ImageNotAllowed { .. }
                | EngineError::RootChanged(_)
                | EngineError::TooManySessions(_)
                | EngineError::CodeTooLarge { .. }
                | EngineError::InvalidPath(_)
                | EngineError::File { .. }
                | EngineError::InvalidDependency(_)
                | EngineError::Dependencies(_)
                | EngineError::InstallFailed(_)
                | EngineError::UnreadableAnswer { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_netstack_is_a_refusal_naming_the_fix() {
        let refused = || {
            BackendError::Refused {
            status: 500,
            message: format!(
                "OCI runtime start failed: starting container: setting up network: {NETSTACK_REFUSAL}: unknown"
            ),
        }
        };
        match explain_start_failure(refused(), Some("runsc-net")) {
            EngineError::Refused(refusal) => {
                assert!(refusal.0.contains("host-network mode"), "{refusal}");
                assert!(refusal.0.contains("setup --gvisor"), "{refusal}");
            }
            other => panic!("not a refusal: {other:?}"),
        }
        assert!(!explain_start_failure(refused(), Some("runsc-net")).is_transient_start());
        // Under another runtime, or for another reason, the engine's error is kept.
        assert!(matches!(
            explain_start_failure(refused(), None),
            EngineError::Backend(_)
        ));
        let other = BackendError::Refused {
            status: 500,
            message: "no space left on device".into(),
        };
        assert!(matches!(
            explain_start_failure(other, Some("runsc")),
            EngineError::Backend(_)
        ));
    }
}
