//! `pip` from the code inside a sandbox (`%pip install x`, `!pip list`, the `pip` on its PATH),
//! answered for the execution that asked (`engine::pip` bounds and passes the requests): the
//! line validated like `dependencies` ([`deps::parse_pip_line`]), the wanted set found or
//! installed by the server's installer outside the sandbox, and the sandbox told to put it on
//! `sys.path` in place of the one it had. A session's recorded set changes with it, so later
//! calls, snapshots and forks see it; an ephemeral run's only for that run.
//!
//! Who may: every caller that may pass `dependencies` (today every caller: no setting or
//! principal option restricts installs); what `dependencies` refuses (`name @ url` without
//! `SANDBOX_ALLOW_URL_DEPS`) is refused here too. An install is part of the call: its time counts
//! within the call's timeout (the installer gets what is left of it, at most
//! `SANDBOX_DEPS_TIMEOUT`), and a principal's CPU-seconds are charged for the whole call, install
//! included, as for `dependencies`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Engine, RunOptions};
use crate::engine::deps::{self, PipCommand, Requirement};
use crate::engine::outcome::DependencyReport;
use crate::engine::pip::{PipAnswer, PipFuture, PipHandler, PipRate};
use crate::engine::sessions::SessionDependencies;
use crate::engine::EngineError;

/// Less time than this left in the call: no install is started.
const LEAST_TIME: Duration = Duration::from_secs(3);

/// The pip requests of one execution in a sandbox whose set is `set`.
pub(super) struct CodePip<'a> {
    pub(super) engine: &'a Engine,
    pub(super) image: String,
    /// `session` or `ephemeral`: the labels of the installer's sandboxes.
    pub(super) kind: &'static str,
    pub(super) options: &'a RunOptions,
    /// The set the sandbox has on its `sys.path`: the session's record, or the run's own.
    pub(super) set: &'a Mutex<SessionDependencies>,
    /// A session's changes of its set from inside (none for an ephemeral run: one execution).
    pub(super) rate: Option<&'a Mutex<PipRate>>,
    /// The last set a request put in place, for the execution's report.
    pub(super) report: Mutex<Option<DependencyReport>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn listed(requirements: &[String]) -> String {
    if requirements.is_empty() {
        "none".to_string()
    } else {
        requirements.join(", ")
    }
}

impl PipHandler for CodePip<'_> {
    fn handle<'a>(&'a self, line: &'a str, deadline: Instant) -> PipFuture<'a> {
        Box::pin(self.answer(line, deadline))
    }
}

impl CodePip<'_> {
    /// The report of the set a request put in place, if one did.
    pub(super) fn into_report(self) -> Option<DependencyReport> {
        self.report
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn answer(&self, line: &str, deadline: Instant) -> PipAnswer {
        let command = match deps::parse_pip_line(line, self.engine.config.deps.allow_urls) {
            Ok(command) => command,
            Err(refusal) => return PipAnswer::refused(format!("pip: {refusal}")),
        };
        let current = lock(self.set).clone();
        let have: Vec<String> = current
            .requirements
            .iter()
            .map(Requirement::canonical)
            .collect();
        match command {
            PipCommand::List => PipAnswer::said(format!(
                "Packages installed by the server for this sandbox, as requested (their own \
                 dependencies are installed with them): {}\n",
                listed(&have)
            )),
            PipCommand::Show(names) => self.show(&current, &names),
            PipCommand::Install(new) => {
                // A name asked for again replaces its earlier entry (a new version, other extras).
                let mut wanted: Vec<String> = current
                    .requirements
                    .iter()
                    .filter(|r| !new.iter().any(|n| n.normalized == r.normalized))
                    .map(Requirement::canonical)
                    .collect();
                wanted.extend(new.iter().map(Requirement::canonical));
                let asked: Vec<String> = new.iter().map(Requirement::canonical).collect();
                if asked.iter().all(|a| have.contains(a)) {
                    return PipAnswer::said(format!(
                        "Requirement already satisfied (in this sandbox's set): {}\n",
                        asked.join(", ")
                    ));
                }
                self.change(
                    &current,
                    &wanted,
                    deadline,
                    &format!("installed {}", asked.join(", ")),
                )
                .await
            }
            PipCommand::Uninstall(names) => {
                let (gone, kept): (Vec<&Requirement>, Vec<&Requirement>) = current
                    .requirements
                    .iter()
                    .partition(|r| names.contains(&r.normalized));
                let mut text: String = names
                    .iter()
                    .filter(|n| !gone.iter().any(|g| &g.normalized == *n))
                    .map(|n| format!("WARNING: Skipping {n} as it is not in this sandbox's set.\n"))
                    .collect();
                if gone.is_empty() {
                    return PipAnswer::said(text);
                }
                let wanted: Vec<String> = kept.iter().map(|r| r.canonical()).collect();
                let removed: Vec<String> = gone.iter().map(|r| r.canonical()).collect();
                let mut answer = self
                    .change(
                        &current,
                        &wanted,
                        deadline,
                        &format!(
                            "removed {} (a module already imported stays loaded until the \
                             interpreter restarts)",
                            removed.join(", ")
                        ),
                    )
                    .await;
                text.push_str(&answer.text);
                answer.text = text;
                answer
            }
        }
    }

    fn show(&self, current: &SessionDependencies, names: &[String]) -> PipAnswer {
        let mut text = String::new();
        let mut missing = Vec::new();
        for name in names {
            match current.requirements.iter().find(|r| &r.normalized == name) {
                Some(r) => text.push_str(&format!(
                    "Name: {}\nRequested-as: {}\nLocation: {}\nInstaller: the server's (outside \
                     the sandbox)\n---\n",
                    r.normalized,
                    r.canonical(),
                    current.path.as_deref().unwrap_or("-"),
                )),
                None => missing.push(name.clone()),
            }
        }
        if missing.is_empty() {
            return PipAnswer::said(text);
        }
        text.push_str(&format!(
            "WARNING: Package(s) not found in this sandbox's set: {}\n",
            missing.join(", ")
        ));
        PipAnswer {
            ok: false,
            text,
            ..Default::default()
        }
    }

    /// Makes `wanted` the sandbox's set in place of `current`'s: found in the cache or installed
    /// within the call's time, then recorded; `done` says what that did.
    async fn change(
        &self,
        current: &SessionDependencies,
        wanted: &[String],
        deadline: Instant,
        done: &str,
    ) -> PipAnswer {
        let wanted = match self.engine.requirements(wanted) {
            Ok(wanted) => wanted,
            Err(e) => return PipAnswer::refused(format!("pip: {e}")),
        };
        if let Some(rate) = self.rate {
            if let Err(refusal) = lock(rate).admit(Instant::now()) {
                return refusal;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left < LEAST_TIME {
            return PipAnswer::refused(format!(
                "pip: only {} of the call's time is left, too little to install",
                crate::text::duration(left)
            ));
        }
        let old: Vec<String> = current.path.iter().cloned().collect();
        if wanted.is_empty() {
            *lock(self.set) = SessionDependencies::default();
            return PipAnswer {
                ok: true,
                text: format!("Successfully {done}. This sandbox's set is now empty.\n"),
                add: Vec::new(),
                remove: old,
            };
        }
        let limit = left.min(self.engine.config.deps.install_timeout);
        let installed = async {
            let base = self.engine.base_spec(self.image.clone(), self.kind).await?;
            self.engine
                .find_dependency_set(&base, &wanted, self.options, limit)
                .await
        }
        .await;
        match installed {
            Ok(report) => {
                *lock(self.set) = SessionDependencies {
                    requirements: wanted,
                    key: Some(report.key.clone()),
                    path: Some(report.path.clone()),
                };
                let how = if report.installed {
                    "installed by the server's installer"
                } else {
                    "found in the server's cache"
                };
                let text = format!(
                    "Successfully {done} ({how}). This sandbox's set is now: {}\n",
                    listed(&report.requirements)
                );
                let answer = PipAnswer {
                    ok: true,
                    text,
                    remove: old.into_iter().filter(|p| *p != report.path).collect(),
                    add: vec![report.path.clone()],
                };
                *lock(&self.report) = Some(report);
                answer
            }
            Err(e) => {
                let cut = if limit < self.engine.config.deps.install_timeout {
                    format!(
                        " (the installer had the {} left of the call's timeout)",
                        crate::text::duration(limit)
                    )
                } else {
                    String::new()
                };
                let why = match &e {
                    EngineError::InstallFailed(failure) => failure.to_string(),
                    other => other.to_string(),
                };
                PipAnswer::refused(format!("pip: nothing changed{cut}: {why}"))
            }
        }
    }
}
