//! Sandboxes prepared per dependency set (see `engine::prepared` for which sets and the bound):
//! prepared in the background, one at a time, and handed to a call that asks for exactly their
//! set. A prepared sandbox is a pool sandbox with the set on `sys.path` and the set's top-level
//! modules imported by the runner (never into the code's namespace), before any code ran in it;
//! like every sandbox it serves one call and is removed.
//!
//! A client's roots (`SANDBOX_ROOTS`) are a set of this pool too, learned when the client lists
//! them: a sandbox is prepared with exactly those mounts (checked again, as for any start), no
//! dependencies, and handed to a call without dependencies whose roots are the same; those that
//! did not change since it started are checked once more when it is handed out. The plain pool's
//! sandboxes mount no roots: without this, every session with roots would start cold.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Engine, RunOptions};
use crate::engine::backend::{paths, SandboxSpec};
use crate::engine::deps::Requirement;
use crate::engine::outcome::DependencyReport;
use crate::engine::prepared::{Wanted, FIRST_ESTIMATE};
use crate::engine::roots::RootSet;
use crate::engine::sandbox::Sandbox;
use crate::engine::EngineError;

/// What the plain pool's sandboxes are counted at against `SANDBOX_POOL_MAX_MEMORY` (an idle
/// one measures about 10.5 MiB as Docker counts it; they are not measured one by one).
pub(crate) const PLAIN_ESTIMATE: u64 = 16 << 20;

/// How long a prepared sandbox's imports may take.
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(180);

/// The longest a call with roots waits for the sandbox being prepared with them (it began
/// before the call, so it is ready before one the call would start; past this it starts one).
const PREPARATION_WAIT: Duration = Duration::from_secs(10);

/// A waiting prepared sandbox and its set.
pub struct PreparedSandbox {
    sandbox: Sandbox,
    /// The dependency set on its `sys.path`; `None` for one prepared for a client's roots.
    report: Option<DependencyReport>,
}

impl Engine {
    /// The dependency sets of `SANDBOX_PRELOAD`, each validated like a call's `dependencies`:
    /// the server refuses to start with an invalid one.
    pub fn preload_sets(&self) -> Result<Vec<Vec<Requirement>>, EngineError> {
        self.config
            .preload
            .iter()
            .map(|set| self.requirements(set))
            .collect()
    }

    /// Whether sandboxes are prepared per set (`SANDBOX_POOL_SIZE=0` disables every pool).
    fn prepares(&self) -> bool {
        self.config.pool_size > 0
    }

    /// A prepared sandbox for exactly this set, if one waits and its set is still the one the
    /// cache holds under its key (never one whose set was evicted or replaced meanwhile).
    pub(super) async fn take_prepared(
        &self,
        spec: &SandboxSpec,
        requirements: &[Requirement],
    ) -> Option<(Sandbox, DependencyReport)> {
        // Nothing waits: skip the key (an image inspection) on the way to the cold path.
        if !self.prepares()
            || spec.image != self.config.image
            || requirements.is_empty()
            || self.prepared.ready() == 0
        {
            return None;
        }
        let key = self.dependency_key(&spec.image, requirements).await.ok()?;
        while let Some(PreparedSandbox {
            mut sandbox,
            report,
        }) = self.prepared.take(&key, Instant::now())
        {
            self.prepared_wake.notify_one();
            let Some(mut report) = report else {
                self.retire(sandbox);
                continue;
            };
            let current = self
                .deps
                .verified_name(&key)
                .map(|name| format!("{}/{name}", paths::DEPS));
            if current.as_deref() != Some(report.path.as_str()) {
                tracing::info!(key, "a prepared sandbox's set left the cache; removing it");
                self.retire(sandbox);
                continue;
            }
            // A round trip: a sandbox that died while waiting is not handed out.
            if let Err(e) = sandbox.add_paths(&[], &[]).await {
                tracing::info!(sandbox = %sandbox.id(), "a prepared sandbox is dead ({e}); removing it");
                self.retire(sandbox);
                continue;
            }
            self.deps.touch(&key);
            report.installed = false;
            report.prepared = true;
            return Some((sandbox, report));
        }
        None
    }

    /// A sandbox prepared for exactly these roots (and no dependencies): one waiting, else the
    /// one being prepared once it is ready (at most [`PREPARATION_WAIT`]), if they are still the
    /// directories they were; else the roots are learned, so that the caller's next call finds
    /// one.
    pub(super) async fn take_prepared_roots(
        &self,
        spec: &SandboxSpec,
        roots: &Arc<RootSet>,
    ) -> Option<Sandbox> {
        if !self.prepares() || spec.image != self.config.image {
            return None;
        }
        let key = roots.digest();
        let deadline = tokio::time::Instant::now() + PREPARATION_WAIT;
        loop {
            // Registered before the look, so a preparation ending between the two is not missed.
            let done = self.prepared_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if let Some(PreparedSandbox { mut sandbox, .. }) =
                self.prepared.take(&key, Instant::now())
            {
                self.prepared_wake.notify_one();
                // As for a sandbox started now: a root moved or replaced since is not served
                // (the start that follows refuses it by name).
                let claimed = sandbox
                    .mounted_roots()
                    .map_or(Ok(()), |mounted| self.claim_roots(mounted));
                if roots.recheck().is_err() || claimed.is_err() {
                    self.retire(sandbox);
                    return None;
                }
                if let Err(e) = sandbox.add_paths(&[], &[]).await {
                    tracing::info!(sandbox = %sandbox.id(), "a prepared sandbox is dead ({e}); removing it");
                    self.retire(sandbox);
                    continue;
                }
                return Some(sandbox);
            }
            if self.prepared.starting_for(&key) == 0
                || tokio::time::timeout_at(deadline, done).await.is_err()
            {
                break;
            }
        }
        self.learn_roots(roots);
        None
    }

    /// A client's listing changed from `old` to `new`: sandboxes are prepared with the new
    /// roots from now on, and those prepared with the old ones go (the client will not ask for
    /// them again; another client listing the same ones learns them again).
    pub fn roots_changed(&self, old: Option<&RootSet>, new: &Arc<RootSet>) {
        if let Some(old) = old.filter(|old| old.key() != new.key()) {
            let key = old.digest();
            if self.prepared_roots_of(&key).is_some() {
                self.discard_prepared(std::slice::from_ref(&key));
            }
        }
        self.learn_roots(new);
    }

    /// Sandboxes are prepared with `roots` from now on (a learned set of the pool, kept while
    /// calls ask for it; see `engine::prepared`).
    fn learn_roots(&self, roots: &Arc<RootSet>) {
        if !self.prepares() || roots.is_empty() {
            return;
        }
        let key = roots.digest();
        let mut known = self
            .prepared_roots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        known.insert(key.clone(), roots.clone());
        for prepared in self.prepared.learn(&key, Vec::new(), Instant::now()) {
            self.retire(prepared.sandbox);
        }
        known.retain(|key, _| self.prepared.knows(key));
        drop(known);
        self.prepared_wake.notify_one();
    }

    /// The roots the pool's set under `key` mounts, when it is a set of roots.
    fn prepared_roots_of(&self, key: &str) -> Option<Arc<RootSet>> {
        self.prepared_roots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// A call's set was made ready without a prepared sandbox: prepare for it from now on.
    pub(super) fn learn_set(&self, report: &DependencyReport) {
        if !self.prepares() {
            return;
        }
        let displaced =
            self.prepared
                .learn(&report.key, report.requirements.clone(), Instant::now());
        for prepared in displaced {
            self.retire(prepared.sandbox);
        }
        self.prepared_wake.notify_one();
    }

    /// Sets that left the dependency cache: their prepared sandboxes go.
    pub(super) fn discard_prepared(&self, keys: &[String]) {
        for prepared in self.prepared.discard(keys) {
            self.retire(prepared.sandbox);
        }
    }

    /// Prepared sandboxes waiting now (all sets).
    pub fn prepared_ready(&self) -> usize {
        self.prepared.ready()
    }

    /// Each waiting prepared sandbox: its set's requirements and the memory Docker measured.
    pub fn prepared_sets(&self) -> Vec<(Vec<String>, u64)> {
        self.prepared.waiting()
    }

    /// What the prepared sandboxes use together now, as counted against the bound.
    pub fn prepared_memory(&self) -> u64 {
        self.prepared.used()
    }

    /// The bound the prepared sandboxes are kept within (`SANDBOX_POOL_MAX_MEMORY` less the
    /// plain pool's share).
    pub fn prepared_budget(&self) -> u64 {
        self.prepared.budget()
    }

    /// Starts one sandbox, puts the set on its `sys.path` (installing it if needed) and imports
    /// its modules; returns it with what the engine measured of its memory.
    async fn prepare_one(&self, wanted: &Wanted) -> Result<(PreparedSandbox, u64), EngineError> {
        if let Some(roots) = self.prepared_roots_of(&wanted.key) {
            return self.prepare_for_roots(&roots).await;
        }
        let requirements = self.requirements(&wanted.requirements)?;
        let spec = self.base_spec(self.config.image.clone(), "pool").await?;
        self.backend.ensure_image(&spec.image).await?;
        let mut sandbox = self
            .launch_code_sandbox(&spec, &self.background_options())
            .await?;
        let outcome = async {
            let report = self
                .prepare_dependencies(
                    &mut sandbox,
                    &spec,
                    &requirements,
                    None,
                    &RunOptions::default(),
                )
                .await?;
            if report.key != wanted.key {
                // The image changed since the set was learned: its key is another now.
                return Err(EngineError::Dependencies(
                    "the set's key changed while it was prepared".into(),
                ));
            }
            let names: Vec<String> = requirements.iter().map(|r| r.name.clone()).collect();
            let (imported, failed) = sandbox.preload(&names, PRELOAD_TIMEOUT).await?;
            if !failed.is_empty() {
                tracing::info!(
                    key = wanted.key,
                    ?failed,
                    "modules that did not import in a prepared sandbox"
                );
            }
            let bytes = match self.backend.memory_usage(sandbox.id()).await {
                Ok(Some(bytes)) => bytes,
                _ => FIRST_ESTIMATE,
            };
            tracing::debug!(
                key = wanted.key,
                ?imported,
                memory = bytes,
                "sandbox prepared"
            );
            Ok((report, bytes))
        }
        .await;
        match outcome {
            Ok((report, bytes)) => Ok((
                PreparedSandbox {
                    sandbox,
                    report: Some(report),
                },
                bytes,
            )),
            Err(e) => {
                self.retire(sandbox);
                Err(e)
            }
        }
    }

    /// Starts one sandbox with a client's roots mounted, as a call's would be (see
    /// `Engine::with_roots`); returns it with the memory it is counted at (the plain pool's
    /// estimate: it is a plain sandbox with mounts).
    async fn prepare_for_roots(
        &self,
        roots: &Arc<RootSet>,
    ) -> Result<(PreparedSandbox, u64), EngineError> {
        let spec = self.base_spec(self.config.image.clone(), "pool").await?;
        let spec = Self::with_roots(&spec, roots)?;
        self.backend.ensure_image(&spec.image).await?;
        let sandbox = self
            .launch_code_sandbox(&spec, &self.background_options())
            .await?;
        tracing::debug!(sandbox = %sandbox.id(), "sandbox prepared for a client's roots");
        // A plain sandbox with mounts: counted as the plain pool's are, unmeasured.
        Ok((
            PreparedSandbox {
                sandbox,
                report: None,
            },
            PLAIN_ESTIMATE,
        ))
    }

    /// Names the sets of `SANDBOX_PRELOAD` to the pool (their keys need the image's id).
    async fn configure_preload(&self) -> Result<(), EngineError> {
        let now = Instant::now();
        for set in self.preload_sets()? {
            let key = self.dependency_key(&self.config.image, &set).await?;
            let requirements = set.iter().map(Requirement::canonical).collect();
            self.prepared.configure(&key, requirements, now);
        }
        Ok(())
    }

    /// Stops preparing and removes the waiting prepared sandboxes (shutdown).
    pub(super) async fn close_prepared(&self) {
        for prepared in self.prepared.close() {
            self.retire(prepared.sandbox);
        }
        self.prepared_wake.notify_one();
        let task = self
            .prepared_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            // A preparation may be installing a set: give it a moment, then drop it (its sandbox
            // is removed when dropped, and the shutdown's sweep removes whatever is left).
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Starts preparing sandboxes per set in the background, unless every pool is disabled.
    pub(super) fn start_prepared(self: &Arc<Self>) {
        if !self.prepares() {
            return;
        }
        let task = spawn_preparation(self);
        *self.prepared_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }
}

/// Prepares sandboxes one at a time (each is a start, maybe an install, and imports under the
/// sandbox's CPU quota) until the pool is closed or the engine is gone.
fn spawn_preparation(engine: &Arc<Engine>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Engine> = Arc::downgrade(engine);
    tokio::spawn(async move {
        let mut configured = false;
        let mut backoff = Duration::from_secs(1);
        loop {
            let Some(engine) = weak.upgrade() else { return };
            if engine.prepared.is_closed() {
                return;
            }
            if !configured {
                match engine.configure_preload().await {
                    Ok(()) => configured = true,
                    Err(e) => tracing::warn!("cannot prepare the SANDBOX_PRELOAD sets yet: {e}"),
                }
            }
            for prepared in engine.prepared.retire_idle(Instant::now()) {
                engine.retire(prepared.sandbox);
            }
            let wanted = engine.prepared.next_wanted();
            let wake = engine.prepared_wake.clone();
            let Some(wanted) = wanted else {
                drop(engine);
                // Wake on a take or a learned set, or look again now and then (idle sets retire).
                let _ = tokio::time::timeout(Duration::from_secs(30), wake.notified()).await;
                continue;
            };
            let prepared = engine.prepare_one(&wanted).await;
            match prepared {
                Ok((prepared, bytes)) => {
                    backoff = Duration::from_secs(1);
                    let refused = engine.prepared.arrived(&wanted, prepared, bytes);
                    engine.prepared_done.notify_waiters();
                    if let Some(refused) = refused {
                        engine.retire(refused.sandbox);
                    }
                }
                Err(EngineError::AtCapacity(_)) => {
                    // The capacity is in use (or being started into) now: not the set's fault.
                    engine.prepared.failed(&wanted);
                    engine.prepared_done.notify_waiters();
                    drop(engine);
                    let _ = tokio::time::timeout(Duration::from_millis(500), wake.notified()).await;
                }
                Err(e) => {
                    engine.prepared.failed(&wanted);
                    engine.prepared_done.notify_waiters();
                    // At shutdown the server removes what it started, this sandbox too: no news.
                    if engine.prepared.is_closed() || engine.closing.is_cancelled() {
                        return;
                    }
                    tracing::warn!(
                        key = wanted.key,
                        "could not prepare a sandbox for a dependency set or a client's roots: {e}"
                    );
                    // A learned set that fails is forgotten; a configured one is tried again later.
                    engine.discard_prepared(std::slice::from_ref(&wanted.key));
                    drop(engine);
                    let _ = tokio::time::timeout(backoff, wake.notified()).await;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    })
}
