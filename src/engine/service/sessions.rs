//! Sessions: start one, execute in it (one execution at a time, in order), add dependencies,
//! stop it, list them, and end them when they expire, their client goes or their sandbox is lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::pip::CodePip;
use super::{Engine, RunOptions};
use crate::engine::backend::{Backend, BackendError, SandboxId};
use crate::engine::egress::SessionNetwork;
use crate::engine::outcome::{DependencyReport, Execution};
use crate::engine::roots::RootSet;
use crate::engine::sandbox::{Sandbox, Task};
use crate::engine::sessions::{
    session_run_dir, ClientId, CpuAccount, Scope, Session, SessionDependencies, SessionInfo,
    Sessions,
};
use crate::engine::{deps, EngineError};

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

    /// Starts a session sandbox that belongs to the scope's client, and returns its id.
    pub async fn create_session(
        &self,
        scope: Scope<'_>,
        options: &RunOptions,
    ) -> Result<String, EngineError> {
        let image = self.check_image(options.image.as_deref())?;
        // Validated before anything starts, like run_python's.
        let requirements = self.requirements(&options.dependencies)?;
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
            self.launch("session", &options, &requirements).await
        };
        self.pool_used();
        // A principal's session: its container's CPU time now is what its calls start from.
        let mut cpu = CpuAccount::default();
        let measured = match &launched {
            Ok((sandbox, _)) if scope.owner().is_some_and(|c| c.is_principal()) => {
                Some(sandbox.id().clone())
            }
            _ => None,
        };
        if let Some(id) = measured {
            if let Some(used) = cpu_usage(self.backend.as_ref(), &id).await {
                cpu.measured(&id, used);
            }
        }
        let mut sessions = self.lock_sessions();
        sessions.starting -= 1;
        let (sandbox, report) = launched?;
        // The session's set, as if its first run_python had asked for it: later requests add to it.
        let dependencies = match report {
            Some(report) => SessionDependencies {
                requirements,
                key: Some(report.key),
                path: Some(report.path),
            },
            None => SessionDependencies::default(),
        };
        let id = sandbox.id().0.clone();
        let now = Instant::now();
        let network = Arc::new(SessionNetwork::new(options.consent.clone()));
        if let Some(lease) = sandbox.egress() {
            lease.bind(&network);
        }
        let session = Session {
            container: sandbox.container(),
            network,
            sandbox: Mutex::new(sandbox),
            image,
            client: scope.owner(),
            created: now,
            last_used: std::sync::Mutex::new(now),
            dependencies: std::sync::Mutex::new(dependencies),
            pip_rate: Default::default(),
            history: std::sync::Mutex::default(),
            cpu: std::sync::Mutex::new(cpu),
            calls: AtomicU64::new(0),
            roots: options.mounted_roots().cloned(),
            secrets: options.secrets.clone(),
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
    pub(super) fn session(
        &self,
        scope: Scope<'_>,
        id: &str,
    ) -> Result<(String, Arc<Session>), EngineError> {
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
        drop(sessions);
        if let Some(snapshot) = self.snapshot_of_unknown_session(scope, id) {
            return Err(EngineError::UnknownSessionWithSnapshot {
                id: id.to_string(),
                snapshot,
            });
        }
        Err(EngineError::UnknownSession(id.to_string()))
    }

    /// Executes in a session of the scope; executions of one session run one at a time, in
    /// order.
    pub async fn execute_in_session(
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
        let began = call_begins(&session);
        let report = if requested.is_empty() {
            None
        } else {
            Some(
                self.add_session_dependencies(&session, &mut sandbox, &requested, options)
                    .await?,
            )
        };
        if let Some(lease) = sandbox.egress() {
            lease.bind(&session.network);
        }
        let pip = CodePip {
            engine: self,
            image: session.image.clone(),
            kind: "session",
            options,
            set: &session.dependencies,
            rate: Some(&session.pip_rate),
            report: std::sync::Mutex::new(None),
        };
        let mut result = self
            .execute_in(&mut sandbox, task, options, Some(&pip))
            .await;
        // A set the code put in place with pip is the one it ran with last.
        let report = pip.into_report().or(report);
        self.end_if_lost(&full_id, &mut result);
        if let Ok(execution) = &mut result {
            if let (Task::Python(code), Ok(mut history)) = (task, session.history.lock()) {
                execution.execution_count = history.record(code, execution);
            }
            execution.dependencies = report;
            let run_dir = options.run_dir(session_run_dir(sandbox.id()));
            self.collect_files(&mut sandbox, execution, &run_dir, session.roots.as_deref())
                .await;
            if let Some(current) = &options.roots {
                execution.roots_stale = RootSet::key_of(session.roots.as_deref()) != current.key();
            }
            self.keep_whole_output(Some(&mut sandbox), execution, &run_dir, options)
                .await;
        }
        self.call_ends(&session, &sandbox, began);
        session.touch();
        result
    }

    /// The CPU time `client`'s sessions used outside calls, measured since it was last taken:
    /// what its quota charges besides its calls (`mcp::quotas`).
    pub fn take_cpu_between_calls(&self, client: &ClientId) -> Duration {
        self.cpu_between_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(client)
            .unwrap_or_default()
    }

    /// A call on a session that pays for its time (an execution, a snapshot, a restore) ends,
    /// its sandbox still locked: its time × the CPUs is paid, and the session's CPU time is
    /// measured once the call has let go of it, so that what its code goes on using after the
    /// call is charged.
    pub(super) fn call_ends(&self, session: &Arc<Session>, sandbox: &Sandbox, began: Instant) {
        let charged = began.elapsed().mul_f64(self.config.limits.cpus.max(0.0));
        session
            .cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .call_paid(sandbox.id(), charged);
        self.measure_between_calls(session);
    }

    /// Measures a principal's session's CPU time in the background, as soon as no call holds
    /// it, and charges its client whatever its calls did not pay for.
    fn measure_between_calls(&self, session: &Arc<Session>) {
        if !session.client.as_ref().is_some_and(ClientId::is_principal) {
            return;
        }
        let backend = self.backend.clone();
        let ledger = self.cpu_between_calls.clone();
        let session = session.clone();
        self.background.spawn(async move {
            let calls = {
                let _idle = session.sandbox.lock().await;
                session.calls.load(Ordering::SeqCst)
            };
            measure_cpu(backend.as_ref(), &ledger, &session, calls).await;
        });
    }

    /// Measures a principal's session's CPU time before it ends, unless a call holds it (that
    /// call's time is paid).
    async fn measure_before_end(&self, session: &Session) {
        if !session.client.as_ref().is_some_and(ClientId::is_principal) {
            return;
        }
        let Ok(calls) = session
            .sandbox
            .try_lock()
            .map(|_idle| session.calls.load(Ordering::SeqCst))
        else {
            return;
        };
        measure_cpu(
            self.backend.as_ref(),
            &self.cpu_between_calls,
            session,
            calls,
        )
        .await;
    }

    /// Adds requirements to a session's set: the union is installed (or found) as one set, which
    /// replaces the previous one on `sys.path`. The session's own sandbox never gets a network.
    async fn add_session_dependencies(
        &self,
        session: &Session,
        sandbox: &mut Sandbox,
        requested: &[deps::Requirement],
        options: &RunOptions,
    ) -> Result<DependencyReport, EngineError> {
        let current = session.dependencies();
        let mut entries: Vec<String> = current
            .requirements
            .iter()
            .map(deps::Requirement::canonical)
            .collect();
        entries.extend(requested.iter().map(deps::Requirement::canonical));
        let union = self.requirements(&entries)?;
        let base = self.base_spec(session.image.clone(), "session").await?;
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

    /// Stops a session of the scope and removes its sandbox.
    pub async fn stop_session(&self, scope: Scope<'_>, id: &str) -> Result<String, EngineError> {
        let (full, _) = self.session(scope, id)?;
        let session = self
            .lock_sessions()
            .live
            .remove(&full)
            .ok_or_else(|| EngineError::UnknownSession(full.clone()))?;
        self.measure_before_end(&session).await;
        // An execution in flight is interrupted by killing the sandbox; its caller gets an error.
        if let Err(e) = self.backend.destroy(&session.container()).await {
            tracing::warn!(sandbox = %full, "could not remove a stopped session: {e}");
        }
        session.sandbox.lock().await.forget();
        Ok(full)
    }

    /// Reads a session's executed cells (its Python executions, oldest first) where they are:
    /// `read` gets the session's history under its lock, so that what it makes of them (a
    /// notebook) needs no copy of them all.
    pub fn with_session_cells<R>(
        &self,
        scope: Scope<'_>,
        id: &str,
        read: impl FnOnce(&crate::engine::history::History) -> R,
    ) -> Result<(String, R), EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        // Held while `read` runs (a recording waits for it); a history a panic left is not read.
        let read = match session.history.lock() {
            Ok(history) => read(&history),
            Err(_) => read(&crate::engine::history::History::default()),
        };
        Ok((full_id, read))
    }

    /// The live sessions of the scope.
    pub fn sessions(&self, scope: Scope<'_>) -> Vec<SessionInfo> {
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
                if let Err(e) = backend.destroy(&session.container()).await {
                    tracing::warn!(sandbox = %id, "could not remove a disconnected client's session: {e}");
                }
                session.sandbox.lock().await.forget();
            });
        }
        ended.len()
    }

    /// Stops sessions idle or alive for longer than the policy allows, each saved as a snapshot
    /// first when the configuration asks for it; returns how many.
    pub async fn reap_expired_sessions(&self) -> usize {
        let policy = &self.config.sessions;
        let expired: Vec<(String, String, Arc<Session>)> = self
            .lock_sessions()
            .live
            .iter()
            .filter_map(|(id, s)| {
                let reason = if s.created.elapsed() >= policy.max_lifetime {
                    format!(
                        "it expired at the maximum lifetime of {}",
                        crate::text::duration(policy.max_lifetime)
                    )
                } else if s.idle() >= policy.idle_timeout && s.sandbox.try_lock().is_ok() {
                    format!(
                        "it expired after being idle for more than {}",
                        crate::text::duration(policy.idle_timeout)
                    )
                } else {
                    return None;
                };
                Some((id.clone(), reason, s.clone()))
            })
            .collect();
        for (id, reason, session) in &expired {
            tracing::info!(session = %id, "stopping: {reason}");
            // A session busy with an execution (at its lifetime) cannot be saved: its state is
            // changing.
            let saved = match session.sandbox.try_lock() {
                Ok(mut sandbox) => self.snapshot_before_expiry(session, &mut sandbox, id).await,
                Err(_) => String::new(),
            };
            self.end_session(id, &format!("{reason}{saved}"));
            self.measure_before_end(session).await;
            if let Err(e) = self.backend.destroy(&session.container()).await {
                tracing::warn!(session = %id, "could not remove an expired session: {e}");
            }
        }
        self.expire_snapshots();
        // The CPU principals' sessions use while no call comes is charged as it goes, not only
        // at their next call or their end.
        let live: Vec<Arc<Session>> = self.lock_sessions().live.values().cloned().collect();
        for session in &live {
            self.measure_between_calls(session);
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
    /// The error this call returns says whether a snapshot can resume the session, as later
    /// calls on it will.
    pub(super) fn end_if_lost<T>(&self, id: &str, result: &mut Result<T, EngineError>) {
        let reason = match result {
            Err(EngineError::SandboxLost(reason)) => reason.clone(),
            Err(EngineError::Backend(BackendError::NotFound(_)))
            | Err(EngineError::SandboxGone) => {
                "its container was removed from outside the server".into()
            }
            Err(EngineError::Backend(BackendError::Unavailable { .. })) => {
                "it was lost when the container engine became unreachable during a call".into()
            }
            _ => return,
        };
        let Some(session) = self.lock_sessions().live.get(id).cloned() else {
            return; // stopped meanwhile
        };
        tracing::warn!(session = %id, "session lost: {reason}");
        let hint = self.snapshot_hint(&session, id);
        if let Err(EngineError::SandboxLost(lost)) = result {
            lost.push_str(&hint);
        }
        let reason = format!("{reason}{hint}");
        self.end_session(id, &reason);
        let backend = self.backend.clone();
        let sandbox = session.container();
        let instance = self.owner.instance.clone();
        // Tracked with the other background removals: `settle` and shutdown wait for it.
        self.background.spawn(async move {
            // The engine may be restarting: keep trying for a minute.
            for _ in 0..30 {
                match backend.destroy(&sandbox).await {
                    Ok(()) => {
                        // A container removed from outside may have left its workspace volume.
                        super::lifecycle::remove_unused_storage(backend.as_ref(), &instance).await;
                        return;
                    }
                    Err(BackendError::Unavailable { .. }) => {
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

/// A call on a session that pays for its time begins (its sandbox locked): counted, so that a
/// measurement it overlaps is not used; returns when.
pub(super) fn call_begins(session: &Session) -> Instant {
    session.calls.fetch_add(1, Ordering::SeqCst);
    Instant::now()
}

/// The container's CPU time, as the engine measures it (bounded: a stuck engine measures
/// nothing).
async fn cpu_usage(backend: &dyn Backend, id: &SandboxId) -> Option<Duration> {
    match tokio::time::timeout(MEASURE_LIMIT, backend.cpu_usage(id)).await {
        Ok(Ok(used)) => used,
        Ok(Err(e)) => {
            tracing::debug!(sandbox = %id, "could not measure a session's CPU time: {e}");
            None
        }
        Err(_) => None,
    }
}

/// How long a measurement of a container's CPU time may take (the engine samples every second).
const MEASURE_LIMIT: Duration = Duration::from_secs(5);

/// Measures a session's container and charges its client what its calls did not pay for, unless
/// a call started (`calls` counted them before) or runs since: that call's time is paid by it.
async fn measure_cpu(
    backend: &dyn Backend,
    ledger: &std::sync::Mutex<HashMap<ClientId, Duration>>,
    session: &Session,
    calls: u64,
) {
    let Some(client) = &session.client else {
        return;
    };
    let container = session.container();
    let Some(used) = cpu_usage(backend, &container).await else {
        return;
    };
    if session.calls.load(Ordering::SeqCst) != calls || session.sandbox.try_lock().is_err() {
        return;
    }
    let extra = session
        .cpu
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .measured(&container, used);
    tracing::debug!(sandbox = %container, extra_ms = extra.as_millis() as u64, "session CPU measured between calls");
    if !extra.is_zero() {
        *ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(client.clone())
            .or_default() += extra;
    }
}
