//! The registry of sessions: sandboxes whose runner keeps its state between executions, found by
//! id, counted against their limit, and remembered with a reason once they end. What the engine
//! does with them is in `service::sessions`.
//!
//! A session may belong to a client ([`ClientId`]): a server with several clients (MCP over
//! HTTP) tags each session with the client that created it, and calls made in that client's
//! [`Scope`] reach only its sessions; any other id gets the same error as an unknown one.
//! [`Scope::Server`] acts for the whole server (stdio has one client; the CLI and tests).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::backend::{self, SandboxId};
use super::sandbox::Sandbox;
use super::{deps, protocol, EngineError};

/// The client a session belongs to; random, never shown to clients. Two ids are the same
/// client when their ids are equal; the owner of their snapshots goes with them.
#[derive(Debug, Clone)]
pub struct ClientId {
    id: Arc<str>,
    /// The owner of the snapshots it makes ([`super::snapshots`]): they outlive the client, so
    /// this names who may restore them later, not the client itself.
    snapshot_owner: Arc<str>,
}

impl PartialEq for ClientId {
    fn eq(&self, other: &ClientId) -> bool {
        self.id == other.id
    }
}

impl Eq for ClientId {}

impl std::hash::Hash for ClientId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl ClientId {
    /// A fresh, random client id; its snapshots are its own until
    /// [`ClientId::with_snapshot_owner`] says whose they are.
    pub fn new() -> ClientId {
        let id: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        ClientId {
            snapshot_owner: format!("client-{id}").into(),
            id,
        }
    }

    /// The id as text (32 hex digits, or `principal:` and a name).
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The client that is a principal (named `name`): the same id on every request, so it
    /// reaches its sessions whichever MCP session, or none, it comes through; its snapshots are
    /// the principal's. Never equal to a [`ClientId::new`] (hex digits only).
    pub fn of_principal(name: &str) -> ClientId {
        let id: Arc<str> = format!("principal:{name}").into();
        ClientId {
            snapshot_owner: format!("client-{id}").into(),
            id,
        }
    }

    /// Whether the client is a principal ([`ClientId::of_principal`]): the one kind with quotas.
    pub fn is_principal(&self) -> bool {
        self.id.starts_with("principal:")
    }

    /// The same client, whose snapshots belong to `owner` (an owner key of
    /// [`super::snapshots`]): a client of one MCP session whose caller outlives it (the holder
    /// of the one shared token), so that its next MCP session restores them.
    pub fn with_snapshot_owner(self, owner: String) -> ClientId {
        ClientId {
            snapshot_owner: owner.into(),
            ..self
        }
    }

    /// Who owns the snapshots this client makes.
    pub fn snapshot_owner(&self) -> &str {
        &self.snapshot_owner
    }
}

impl Default for ClientId {
    fn default() -> Self {
        Self::new()
    }
}

/// Whose sessions a call may reach.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every session of this engine (a server with one client, the CLI, tests).
    Server,
    /// Only the sessions this client created.
    Client(&'a ClientId),
}

impl Scope<'_> {
    pub(super) fn admits(&self, owner: Option<&ClientId>) -> bool {
        match self {
            Scope::Server => true,
            Scope::Client(client) => owner == Some(*client),
        }
    }

    pub(super) fn owner(&self) -> Option<ClientId> {
        match self {
            Scope::Server => None,
            Scope::Client(client) => Some((*client).clone()),
        }
    }
}

/// A live session: a sandbox whose runner keeps its state between executions.
pub(crate) struct Session {
    pub(super) sandbox: Mutex<Sandbox>,
    /// Its sandbox's container now (a restart replaces it), readable while an execution holds
    /// the sandbox: removing the container interrupts that execution.
    pub(super) container: super::sandbox::Container,
    pub(super) image: String,
    /// The client that created it; `None` when it was created for the whole server.
    pub(super) client: Option<ClientId>,
    pub(super) created: Instant,
    pub(super) last_used: std::sync::Mutex<Instant>,
    pub(super) dependencies: std::sync::Mutex<SessionDependencies>,
    /// The hosts its user approved or declined (`SANDBOX_NETWORK=allowlist`).
    pub(super) network: Arc<super::egress::SessionNetwork>,
    /// How often the code changed its set from inside (`pip install`; see `engine::pip`).
    pub(super) pip_rate: std::sync::Mutex<super::pip::PipRate>,
    /// Its executed cells (Python executions), for a notebook.
    pub(super) history: std::sync::Mutex<super::history::History>,
    /// What its container's CPU time has been paid for, to charge what the code's threads and
    /// processes use between calls (see [`CpuAccount`]).
    pub(super) cpu: std::sync::Mutex<CpuAccount>,
    /// Calls on it that measure their time (executions, snapshots), counted as they start: a
    /// measurement of its CPU that a call overlapped is not used.
    pub(super) calls: std::sync::atomic::AtomicU64,
    /// The client's roots its sandbox mounts, as they were when it started (kept for good).
    pub(super) roots: Option<Arc<super::roots::RootSet>>,
    /// The secrets its sandbox's requests get (a principal's own; `None`: the server's): a copy
    /// of the session gets the same, with placeholders of its own.
    pub(super) secrets: Option<Arc<crate::config::secrets::Secrets>>,
}

/// What one session's container has been paid for, so that the CPU its code uses outside calls
/// (a thread or a process that goes on after the call returned) is charged too.
///
/// A call pays its time × the sandbox's CPUs (its principal's execution permit, `mcp::quotas`):
/// at least what the container used meanwhile, since the cgroup holds it to those CPUs. A
/// measurement of the container's CPU time, as the engine counts it (the cgroup's, never the
/// sandbox's word), taken between calls, charges whatever it shows beyond what was paid. So a
/// principal is always charged at least the CPU its sessions used, up to the last measurement.
#[derive(Debug, Default)]
pub(crate) struct CpuAccount {
    /// The container measured (a restart replaces it), and its CPU time paid for.
    container: Option<super::backend::SandboxId>,
    paid: Duration,
}

impl CpuAccount {
    /// `container` has used `used` of CPU time: returns what is to be charged for it now (none
    /// the first time a container is measured: its baseline, taken as the session starts).
    pub(crate) fn measured(
        &mut self,
        container: &super::backend::SandboxId,
        used: Duration,
    ) -> Duration {
        if self.container.as_ref() != Some(container) {
            self.container = Some(container.clone());
            self.paid = used;
            return Duration::ZERO;
        }
        let extra = used.saturating_sub(self.paid);
        self.paid += extra;
        extra
    }

    /// A call on the session ended in `container` and paid `charged` (its time × the CPUs). A
    /// container new since the last measurement started within the call: all of its time is
    /// inside the call, and paid.
    pub(crate) fn call_paid(&mut self, container: &super::backend::SandboxId, charged: Duration) {
        if self.container.as_ref() == Some(container) {
            self.paid += charged;
        } else {
            self.container = Some(container.clone());
            self.paid = charged;
        }
    }
}

/// The dependency set a session has on its `sys.path`.
#[derive(Debug, Clone, Default)]
pub(super) struct SessionDependencies {
    pub(super) requirements: Vec<deps::Requirement>,
    pub(super) key: Option<String>,
    /// Where the sandbox sees the set (on its `sys.path`).
    pub(super) path: Option<String>,
}

impl Session {
    /// The container its sandbox runs in now.
    pub(super) fn container(&self) -> super::backend::SandboxId {
        self.container.now()
    }

    pub(super) fn dependencies(&self) -> SessionDependencies {
        self.dependencies
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    /// The session's dependency set as canonical requirement strings.
    pub(super) fn requirement_strings(&self) -> Vec<String> {
        self.dependencies()
            .requirements
            .iter()
            .map(deps::Requirement::canonical)
            .collect()
    }

    pub(super) fn idle(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    pub(super) fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }
}

/// What `sandbox_list` shows of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub image: String,
    pub age: Duration,
    pub idle: Duration,
}

/// Ids of sessions that ended on their own, so a later call can say why.
const TOMBSTONES: usize = 1024;

#[derive(Default)]
pub(crate) struct Sessions {
    pub(super) live: HashMap<String, Arc<Session>>,
    /// Sessions being created: they count against the limit already.
    pub(super) starting: usize,
    pub(super) ended: VecDeque<Ended>,
}

/// A session that ended on its own: its id, why, and whose it was.
pub(super) struct Ended {
    pub(super) id: String,
    pub(super) reason: String,
    pub(super) client: Option<ClientId>,
}

impl Sessions {
    pub(super) fn remember_ended(&mut self, id: String, reason: String, client: Option<ClientId>) {
        self.ended.push_back(Ended { id, reason, client });
        while self.ended.len() > TOMBSTONES {
            self.ended.pop_front();
        }
    }
}

/// A path the agent gave, as a safe path relative to the workspace. `/workspace/x` and `x` are the
/// same file; anything that would leave the workspace is refused.
pub fn workspace_relative(path: &str) -> Result<String, EngineError> {
    let trimmed = path.trim();
    let relative = trimmed
        .strip_prefix(backend::paths::WORKSPACE)
        .map(|rest| rest.trim_start_matches('/'))
        .unwrap_or(trimmed);
    let relative = relative.trim_start_matches("./");
    if relative.starts_with('/') || !protocol::is_safe_relative_path(relative) {
        return Err(EngineError::InvalidPath(crate::text::truncate_chars(
            path, 200,
        )));
    }
    Ok(relative.to_string())
}

/// The host directory name of a session: the same for all its executions.
pub(super) fn session_run_dir(id: &SandboxId) -> String {
    let short: String =
        id.0.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
    format!("session-{short}")
}

/// Marks the sandboxes of sessions already removed (by a sweep) as gone. A session busy with an
/// execution is dropped later; removing it again then is harmless.
pub(crate) fn forget(sessions: Vec<Arc<Session>>) {
    for session in sessions {
        if let Ok(mut sandbox) = session.sandbox.try_lock() {
            sandbox.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::backend::SandboxId;
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn cpu_beyond_what_calls_paid_is_charged_once() {
        let (a, b) = (SandboxId("a".into()), SandboxId("b".into()));
        let mut cpu = CpuAccount::default();
        // The baseline (the runner's start) is not charged.
        assert_eq!(cpu.measured(&a, secs(1.5)), Duration::ZERO);
        // A call of 1 s paid for up to 1 CPU-second: it used 0.2, so 0.8 is paid ahead.
        cpu.call_paid(&a, secs(1.0));
        assert_eq!(cpu.measured(&a, secs(1.7)), Duration::ZERO);
        // Then a thread it left ran 3 s past the call: 2.2 beyond what was paid.
        assert_eq!(cpu.measured(&a, secs(4.7)), secs(2.2));
        // Measured again with nothing new: nothing more.
        assert_eq!(cpu.measured(&a, secs(4.7)), Duration::ZERO);
        assert_eq!(cpu.measured(&a, secs(5.0)), secs(0.3));
        // A restart within a call: the new container's time is all inside it, and paid.
        cpu.call_paid(&b, secs(2.0));
        assert_eq!(cpu.measured(&b, secs(1.9)), Duration::ZERO);
        assert_eq!(cpu.measured(&b, secs(2.5)), secs(0.5));
        // A counter that went back (a new container under the same id) charges nothing.
        assert_eq!(cpu.measured(&b, secs(0.1)), Duration::ZERO);
    }

    #[test]
    fn a_principal_is_told_apart_from_an_mcp_session() {
        assert!(ClientId::of_principal("alice").is_principal());
        assert!(!ClientId::new().is_principal());
    }
}
