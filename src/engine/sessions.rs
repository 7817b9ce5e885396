//! Sessions: sandboxes whose runner keeps its state between executions, found by id, limited
//! in number and lifetime, and the file tools that work on their workspace.
//!
//! A session may belong to a client ([`ClientId`]): a server with several clients (MCP over
//! HTTP) tags each session with the client that created it, and calls made in that client's
//! [`Scope`] reach only its sessions; any other id gets the same error as an unknown one. The
//! methods without a scope act for the whole server (stdio has one client; the CLI and tests).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::backend::{self, BackendError, SandboxId};
use super::sandbox::Sandbox;
use super::{
    artifacts, deps, installer, protocol, sandbox, Engine, EngineError, Execution, RunOptions, Task,
};

/// The client a session belongs to; random, never shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientId(Arc<str>);

impl ClientId {
    /// A fresh, random client id.
    pub fn new() -> ClientId {
        ClientId(uuid::Uuid::new_v4().simple().to_string().into())
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
    fn admits(&self, owner: Option<&ClientId>) -> bool {
        match self {
            Scope::Server => true,
            Scope::Client(client) => owner == Some(*client),
        }
    }

    fn owner(&self) -> Option<ClientId> {
        match self {
            Scope::Server => None,
            Scope::Client(client) => Some((*client).clone()),
        }
    }
}

/// A live session: a sandbox whose runner keeps its state between executions.
pub(crate) struct Session {
    sandbox: Mutex<Sandbox>,
    image: String,
    /// The client that created it; `None` when it was created for the whole server.
    client: Option<ClientId>,
    created: Instant,
    last_used: std::sync::Mutex<Instant>,
    dependencies: std::sync::Mutex<SessionDependencies>,
}

/// The dependency set a session has on its `sys.path`.
#[derive(Debug, Clone, Default)]
struct SessionDependencies {
    requirements: Vec<deps::Requirement>,
    key: Option<String>,
    /// Where the sandbox sees the set (on its `sys.path`).
    path: Option<String>,
}

impl Session {
    fn dependencies(&self) -> SessionDependencies {
        self.dependencies
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    fn idle(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    fn touch(&self) {
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
    live: HashMap<String, Arc<Session>>,
    /// Sessions being created: they count against the limit already.
    starting: usize,
    ended: VecDeque<Ended>,
}

/// A session that ended on its own: its id, why, and whose it was.
struct Ended {
    id: String,
    reason: String,
    client: Option<ClientId>,
}

impl Sessions {
    fn remember_ended(&mut self, id: String, reason: String, client: Option<ClientId>) {
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
fn session_run_dir(id: &SandboxId) -> String {
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

impl Engine {
    /// Takes every live session out of the registry (shutdown).
    pub(crate) fn take_all_sessions(&self) -> Vec<Arc<Session>> {
        self.lock_sessions().live.drain().map(|(_, s)| s).collect()
    }

    /// Dependency sets live sessions use (never evicted).
    pub(crate) fn sessions_dependency_keys(&self) -> Vec<String> {
        self.lock_sessions()
            .live
            .values()
            .filter_map(|s| s.dependencies().key)
            .collect()
    }

    /// Starts a session sandbox and returns its id.
    pub async fn create_session(&self, options: &RunOptions) -> Result<String, EngineError> {
        self.create_session_for(Scope::Server, options).await
    }

    /// Starts a session sandbox that belongs to the scope's client, and returns its id.
    pub async fn create_session_for(
        &self,
        scope: Scope<'_>,
        options: &RunOptions,
    ) -> Result<String, EngineError> {
        let image = self.check_image(options.image.as_deref())?;
        {
            let mut sessions = self.lock_sessions();
            let max = self.config.sessions.max_sessions;
            if sessions.live.len() + sessions.starting >= max {
                return Err(EngineError::TooManySessions(max));
            }
            sessions.starting += 1;
        }
        let launched = {
            let _permit = self.permit().await;
            let options = RunOptions {
                image: Some(image.clone()),
                ..options.clone()
            };
            self.launch("session", &options, &[])
                .await
                .map(|(sandbox, _)| sandbox)
        };
        let mut sessions = self.lock_sessions();
        sessions.starting -= 1;
        let sandbox = launched?;
        let id = sandbox.id().0.clone();
        let now = Instant::now();
        let session = Session {
            sandbox: Mutex::new(sandbox),
            image,
            client: scope.owner(),
            created: now,
            last_used: std::sync::Mutex::new(now),
            dependencies: std::sync::Mutex::default(),
        };
        sessions.live.insert(id.clone(), Arc::new(session));
        Ok(id)
    }

    pub(crate) fn lock_sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // Every operation under this lock is a single map or counter update: a panic elsewhere
        // cannot leave it half-done, so a poisoned lock is still consistent.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Finds a session of the scope by its id, or by a unique prefix of at least 12 characters.
    /// Sessions outside the scope are treated as if they did not exist.
    fn session(&self, scope: Scope<'_>, id: &str) -> Result<(String, Arc<Session>), EngineError> {
        let id = id.trim();
        if id.len() < 12
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(EngineError::MalformedSessionId(
                id.chars().take(80).collect(),
            ));
        }
        let sessions = self.lock_sessions();
        let visible = |session: &Session| scope.admits(session.client.as_ref());
        if let Some(session) = sessions.live.get(id).filter(|s| visible(s)) {
            return Ok((id.to_string(), session.clone()));
        }
        let mut matches = sessions
            .live
            .iter()
            .filter(|(full, session)| full.starts_with(id) && visible(session));
        if let (Some((full, session)), None) = (matches.next(), matches.next()) {
            return Ok((full.clone(), session.clone()));
        }
        if let Some(ended) = sessions
            .ended
            .iter()
            .find(|e| e.id.starts_with(id) && scope.admits(e.client.as_ref()))
        {
            return Err(EngineError::SessionEnded {
                id: ended.id.clone(),
                reason: ended.reason.clone(),
            });
        }
        Err(EngineError::UnknownSession(id.to_string()))
    }

    /// Executes in a session; executions of one session run one at a time, in order.
    pub async fn execute_in_session(
        &self,
        id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        self.execute_in_session_for(Scope::Server, id, task, options)
            .await
    }

    /// [`Engine::execute_in_session`] on a session of the scope.
    pub async fn execute_in_session_for(
        &self,
        scope: Scope<'_>,
        id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        Self::check_task(task)?;
        let requested = self.requirements(&options.dependencies)?;
        let (full_id, session) = self.session(scope, id)?;
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let _permit = self.permit().await;
        let report = if requested.is_empty() {
            None
        } else {
            Some(
                self.add_session_dependencies(&session, &mut sandbox, &requested, options)
                    .await?,
            )
        };
        let mut result = self.execute_in(&mut sandbox, task, options).await;
        self.end_if_lost(&full_id, &result);
        if let Ok(execution) = &mut result {
            execution.dependencies = report;
            let run_dir = session_run_dir(sandbox.id());
            self.collect_files(&mut sandbox, execution, &run_dir).await;
        }
        session.touch();
        result
    }

    /// Adds requirements to a session's set: the union is installed (or found) as one set, which
    /// replaces the previous one on `sys.path`. The session's own sandbox never gets a network.
    async fn add_session_dependencies(
        &self,
        session: &Session,
        sandbox: &mut Sandbox,
        requested: &[deps::Requirement],
        options: &RunOptions,
    ) -> Result<installer::DependencyReport, EngineError> {
        let current = session.dependencies();
        let mut entries: Vec<String> = current
            .requirements
            .iter()
            .map(deps::Requirement::canonical)
            .collect();
        entries.extend(requested.iter().map(deps::Requirement::canonical));
        let union = self.requirements(&entries)?;
        let base = self.base_spec(session.image.clone(), "session").await;
        let previous = current.path.clone();
        let report = self
            .prepare_dependencies(sandbox, &base, &union, previous.as_deref(), options)
            .await?;
        if let Ok(mut deps) = session.dependencies.lock() {
            *deps = SessionDependencies {
                requirements: union,
                key: Some(report.key.clone()),
                path: Some(report.path.clone()),
            };
        }
        Ok(report)
    }

    /// Writes a file into a session's workspace (parents created), as the sandbox user.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<String, EngineError> {
        self.write_file_for(Scope::Server, id, path, content).await
    }

    /// [`Engine::write_file`] on a session of the scope.
    pub async fn write_file_for(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<String, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = workspace_relative(path)?;
        let limit = self.config.files.max_file_bytes;
        if content.len() as u64 > limit {
            return Err(EngineError::File {
                path,
                reason: format!(
                    "{} bytes is more than the {limit}-byte limit",
                    content.len()
                ),
            });
        }
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let written = artifacts::write_whole(&mut sandbox, &path, content).await;
        self.end_if_lost(&full_id, &written);
        match written? {
            Ok(_) => Ok(format!("{}/{path}", backend::paths::WORKSPACE)),
            Err(reason) => Err(EngineError::File { path, reason }),
        }
    }

    /// Reads one file of a session's workspace, within the return limit.
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
    ) -> Result<artifacts::Artifact, EngineError> {
        self.read_file_for(Scope::Server, id, path).await
    }

    /// [`Engine::read_file`] on a session of the scope.
    pub async fn read_file_for(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
    ) -> Result<artifacts::Artifact, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = workspace_relative(path)?;
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let limit = self.config.files.return_max_file_bytes;
        let read = artifacts::read_whole(&mut sandbox, &path, limit).await;
        self.end_if_lost(&full_id, &read);
        let content = read?.map_err(|reason| EngineError::File {
            path: path.clone(),
            reason,
        })?;
        Ok(artifacts::Artifact {
            size: content.len() as u64,
            mime_type: artifacts::sniff_mime(&content, &path).to_string(),
            path,
            content: Some(content),
            saved_to: None,
            note: None,
            figure: false,
        })
    }

    /// Lists a directory of a session's workspace (`""` for the workspace itself).
    pub async fn list_files(&self, id: &str, path: &str) -> Result<sandbox::Listing, EngineError> {
        self.list_files_for(Scope::Server, id, path).await
    }

    /// [`Engine::list_files`] on a session of the scope.
    pub async fn list_files_for(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
    ) -> Result<sandbox::Listing, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = if path.trim().trim_matches('/').is_empty() || path.trim() == "." {
            String::new()
        } else {
            workspace_relative(path)?
        };
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let result = sandbox.list(&path).await;
        self.end_if_lost(&full_id, &result);
        result
    }

    /// Stops a session and removes its sandbox.
    pub async fn stop_session(&self, id: &str) -> Result<String, EngineError> {
        self.stop_session_for(Scope::Server, id).await
    }

    /// [`Engine::stop_session`] on a session of the scope.
    pub async fn stop_session_for(
        &self,
        scope: Scope<'_>,
        id: &str,
    ) -> Result<String, EngineError> {
        let (full, _) = self.session(scope, id)?;
        let session = self
            .lock_sessions()
            .live
            .remove(&full)
            .ok_or_else(|| EngineError::UnknownSession(full.clone()))?;
        // An execution in flight is interrupted by killing the sandbox; its caller gets an error.
        if let Err(e) = self.backend.destroy(&SandboxId(full.clone())).await {
            tracing::warn!(sandbox = %full, "could not remove a stopped session: {e}");
        }
        session.sandbox.lock().await.forget();
        Ok(full)
    }

    /// This server's live sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions_for(Scope::Server)
    }

    /// The live sessions of the scope.
    pub fn sessions_for(&self, scope: Scope<'_>) -> Vec<SessionInfo> {
        let mut list: Vec<SessionInfo> = self
            .lock_sessions()
            .live
            .iter()
            .filter(|(_, s)| scope.admits(s.client.as_ref()))
            .map(|(id, s)| SessionInfo {
                id: id.clone(),
                image: s.image.clone(),
                age: s.created.elapsed(),
                idle: s.idle(),
            })
            .collect();
        list.sort_by_key(|s| std::cmp::Reverse(s.age));
        list
    }

    /// Stops every session of a client that is gone (its MCP session ended). The sessions leave
    /// the registry at once; their sandboxes are removed in the background (`shutdown` waits for
    /// that). Needs a Tokio runtime. Returns how many sessions were stopped.
    pub fn end_client(&self, client: &ClientId) -> usize {
        let ended: Vec<(String, Arc<Session>)> = {
            let mut sessions = self.lock_sessions();
            let ids: Vec<String> = sessions
                .live
                .iter()
                .filter(|(_, s)| s.client.as_ref() == Some(client))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| {
                    let session = sessions.live.remove(&id)?;
                    sessions.remember_ended(
                        id.clone(),
                        "the client that started it disconnected".to_string(),
                        Some(client.clone()),
                    );
                    Some((id, session))
                })
                .collect()
        };
        for (id, session) in &ended {
            tracing::info!(session = %id, "stopping: its client disconnected");
            let backend = self.backend.clone();
            let (id, session) = (id.clone(), session.clone());
            self.background.spawn(async move {
                // An execution in flight is interrupted by killing the sandbox.
                if let Err(e) = backend.destroy(&SandboxId(id.clone())).await {
                    tracing::warn!(sandbox = %id, "could not remove a disconnected client's session: {e}");
                }
                session.sandbox.lock().await.forget();
            });
        }
        ended.len()
    }

    /// Stops sessions idle or alive for longer than the policy allows; returns how many.
    pub async fn reap_expired_sessions(&self) -> usize {
        let policy = &self.config.sessions;
        let expired: Vec<(String, String)> = self
            .lock_sessions()
            .live
            .iter()
            .filter_map(|(id, s)| {
                if s.created.elapsed() >= policy.max_lifetime {
                    Some((
                        id.clone(),
                        format!(
                            "it expired at the maximum lifetime of {}",
                            crate::text::duration(policy.max_lifetime)
                        ),
                    ))
                } else if s.idle() >= policy.idle_timeout && s.sandbox.try_lock().is_ok() {
                    Some((
                        id.clone(),
                        format!(
                            "it expired after being idle for more than {}",
                            crate::text::duration(policy.idle_timeout)
                        ),
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, reason) in &expired {
            tracing::info!(session = %id, "stopping: {reason}");
            self.end_session(id, reason);
            if let Err(e) = self.backend.destroy(&SandboxId(id.clone())).await {
                tracing::warn!(session = %id, "could not remove an expired session: {e}");
            }
        }
        expired.len()
    }

    /// Takes a session out of the live ones; later calls on it are told `reason`.
    fn end_session(&self, id: &str, reason: &str) {
        let mut sessions = self.lock_sessions();
        let client = sessions.live.remove(id).and_then(|s| s.client.clone());
        sessions.remember_ended(id.to_string(), reason.to_string(), client);
    }

    /// Ends a session whose sandbox is lost (stopped or removed from outside, or the engine went
    /// away mid-call): it cannot be resumed, and restarting it silently would hide that its
    /// variables and files are gone. Its container is removed, once the engine answers again.
    fn end_if_lost<T>(&self, id: &str, result: &Result<T, EngineError>) {
        let reason = match result {
            Err(EngineError::SandboxLost(reason)) => reason.clone(),
            Err(EngineError::Backend(BackendError::NotFound(_)))
            | Err(EngineError::SandboxGone) => {
                "its container was removed from outside the server".into()
            }
            Err(EngineError::Backend(BackendError::Unavailable(_))) => {
                "it was lost when the container engine became unreachable during a call".into()
            }
            _ => return,
        };
        if !self.lock_sessions().live.contains_key(id) {
            return; // stopped meanwhile
        }
        tracing::warn!(session = %id, "session lost: {reason}");
        self.end_session(id, &reason);
        let backend = self.backend.clone();
        let sandbox = SandboxId(id.to_string());
        let instance = self.owner.instance.clone();
        // Tracked with the other background removals: `settle` and shutdown wait for it.
        self.background.spawn(async move {
            // The engine may be restarting: keep trying for a minute.
            for _ in 0..30 {
                match backend.destroy(&sandbox).await {
                    Ok(()) => {
                        // A container removed from outside may have left its workspace volume.
                        super::remove_unused_storage(backend.as_ref(), &instance).await;
                        return;
                    }
                    Err(BackendError::Unavailable(_)) => {
                        tokio::time::sleep(Duration::from_secs(2)).await
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %sandbox, "could not remove a lost session: {e}");
                        return;
                    }
                }
            }
        });
    }

    /// Runs [`Engine::reap_expired_sessions`] periodically until the engine is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let engine = Arc::downgrade(self);
        let policy = self.config.sessions.clone();
        let period = (policy.idle_timeout.min(policy.max_lifetime) / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                engine.reap_expired_sessions().await;
            }
        })
    }
}
