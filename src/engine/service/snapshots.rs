//! Snapshots of sessions: save one (`sandbox_snapshot`), start a session from one
//! (`sandbox_initialize {snapshot_id}`), fork a live session, list and delete them, and save a
//! session before it expires. The bytes travel through the runner protocol in pieces (the
//! engine's archive API cannot read a tmpfs under a read-only root) and are kept by the
//! [`SnapshotStore`]; they are made and unpacked only inside sandboxes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::sessions::call_begins;
use super::{Engine, RunOptions};
use crate::engine::error::{Work, WorkLost};
use crate::engine::protocol::{NotSaved, RawRestoreReport, RawSnapshotReport};
use crate::engine::roots::RootSet;
use crate::engine::sandbox::Sandbox;
use crate::engine::sessions::{Scope, Session};
use crate::engine::snapshots::{
    owner_of, SnapshotMeta, SnapshotReader, SnapshotStore, SnapshotWriter, WrittenSnapshot,
};
use crate::engine::EngineError;
use crate::text::{quoted, truncate_chars};

/// The largest piece of a snapshot one request carries (as the file tools' pieces).
const PIECE: u64 = 1 << 20;
/// Names (variables, modules) a report keeps, and the longest name and reason.
const MAX_NAMES: usize = 1000;
const MAX_NAME_CHARS: usize = 200;
const MAX_REASON_CHARS: usize = 300;
/// The longest error text of the sandbox's an error quotes ([`quoted`]: one line, escaped).
const MAX_ERROR_CHARS: usize = 500;

/// What a restore brought back, bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    pub snapshot_id: String,
    pub files: u64,
    pub file_bytes: u64,
    pub variables: Vec<String>,
    pub failed: Vec<NotSaved>,
    pub modules: Vec<String>,
    pub dependencies: Vec<String>,
}

/// A new session forked from a live one.
#[derive(Debug, Clone, PartialEq)]
pub struct Forked {
    pub container_id: String,
    pub image: String,
    /// The roots the new session mounts: its source's, rechecked before it started.
    pub roots: Option<Arc<RootSet>>,
    /// What the source session could not hand over, and why.
    pub unsaved: Vec<NotSaved>,
    pub restored: Restored,
}

fn bounded_names(names: Vec<String>) -> Vec<String> {
    let total = names.len();
    let mut kept: Vec<String> = names
        .into_iter()
        .take(MAX_NAMES)
        .map(|n| truncate_chars(&n, MAX_NAME_CHARS))
        .collect();
    if total > MAX_NAMES {
        kept.push(format!("(and {} more)", total - MAX_NAMES));
    }
    kept
}

fn bounded_reasons(list: Vec<NotSaved>) -> Vec<NotSaved> {
    let total = list.len();
    let mut kept: Vec<NotSaved> = list
        .into_iter()
        .take(MAX_NAMES)
        .map(|n| NotSaved {
            name: truncate_chars(&n.name, MAX_NAME_CHARS),
            reason: truncate_chars(&n.reason, MAX_REASON_CHARS),
        })
        .collect();
    if total > MAX_NAMES {
        kept.push(NotSaved {
            name: format!("(and {} more)", total - MAX_NAMES),
            reason: "not listed".into(),
        });
    }
    kept
}

/// The owner of a session's snapshots: its client's, or the server's.
fn session_owner(session: &Session) -> String {
    match &session.client {
        Some(client) => owner_of(Scope::Client(client)),
        None => owner_of(Scope::Server),
    }
}

/// A snapshot's name as the agent gave it: one line, at most 100 characters.
fn clean_name(name: Option<String>) -> Option<String> {
    let name = crate::text::one_line(&name?, 100);
    (!name.is_empty()).then_some(name)
}

impl Engine {
    fn snapshot_store(&self) -> Result<&SnapshotStore, EngineError> {
        self.snapshots.as_ref().ok_or(EngineError::SnapshotsOff)
    }

    /// Saves a session of the scope: its workspace, its variables as far as they can be
    /// saved, and its dependency set. The session goes on untouched.
    pub async fn snapshot_session(
        &self,
        scope: Scope<'_>,
        id: &str,
        name: Option<String>,
    ) -> Result<SnapshotMeta, EngineError> {
        let store = self.snapshot_store()?;
        let (full, session) = self.session(scope, id)?;
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let _permit = self.permit().await;
        let began = call_begins(&session);
        let mut saved = self
            .save_session(store, &session, &mut sandbox, &full, clean_name(name))
            .await;
        self.call_ends(&session, &sandbox, began);
        self.end_if_lost(&full, &mut saved);
        session.touch();
        saved
    }

    /// Writes a session's snapshot into the store (its sandbox locked by the caller).
    async fn save_session(
        &self,
        store: &SnapshotStore,
        session: &Session,
        sandbox: &mut Sandbox,
        full_id: &str,
        name: Option<String>,
    ) -> Result<SnapshotMeta, EngineError> {
        let owner = session_owner(session);
        let writer = store.writer(&owner)?;
        let (written, report) = self.copy_out(sandbox, writer, Work::Snapshot).await?;
        let meta = SnapshotMeta {
            id: String::new(),
            name,
            owner,
            session: full_id.to_string(),
            image: session.image.clone(),
            dependencies: session.requirement_strings(),
            created_ms: 0,
            size: 0,
            sha256: String::new(),
            files: report.files,
            file_bytes: report.file_bytes,
            saved: bounded_names(report.saved),
            unsaved: bounded_reasons(report.unsaved),
            modules: bounded_names(report.modules),
        };
        let meta = store.commit(written, meta)?;
        tracing::info!(session = %full_id, snapshot = %meta.id, size = meta.size, "session snapshot saved");
        Ok(meta)
    }

    /// Has the runner make a snapshot and copies it into `writer`, piece by piece; the runner's
    /// copy is discarded whatever happens.
    ///
    /// Making it runs the session's own code (its values' `__reduce__`): it is bounded by the
    /// call's timeout (`SANDBOX_TIMEOUT`) as an execution is, and stopped as one is.
    async fn copy_out(
        &self,
        sandbox: &mut Sandbox,
        mut writer: SnapshotWriter,
        work: Work,
    ) -> Result<(WrittenSnapshot, RawSnapshotReport), EngineError> {
        let max = self.config.snapshots.max_size;
        let report = match sandbox.snapshot(max, self.config.limits.timeout).await {
            Ok(report) => report,
            Err(EngineError::WorkTimedOut { timeout, lost, .. }) => {
                if lost == WorkLost::Nothing {
                    // The runner may have finished just as it was interrupted.
                    if let Err(e) = sandbox.discard_snapshot().await {
                        tracing::warn!("could not discard a snapshot stopped at its timeout: {e}");
                    }
                }
                return Err(EngineError::WorkTimedOut {
                    work,
                    timeout,
                    lost,
                });
            }
            Err(e) => return Err(e),
        };
        let copied = async {
            if let Some(error) = &report.error {
                return Err(EngineError::Snapshot(format!(
                    "the sandbox said {}",
                    quoted(error, MAX_ERROR_CHARS)
                )));
            }
            if report.size > max {
                return Err(EngineError::Snapshot(format!(
                    "it is larger than the {} limit (SANDBOX_SNAPSHOT_MAX_SIZE)",
                    crate::text::bytes(max)
                )));
            }
            while writer.size() < report.size {
                let want = PIECE.min(report.size - writer.size());
                let piece =
                    sandbox
                        .snapshot_chunk(writer.size(), want)
                        .await?
                        .map_err(|reason| {
                            EngineError::Snapshot(format!(
                                "the sandbox could not hand it over: {}",
                                quoted(&reason, MAX_ERROR_CHARS)
                            ))
                        })?;
                if piece.is_empty() {
                    return Err(EngineError::Snapshot(
                        "the sandbox handed over less than it announced".into(),
                    ));
                }
                writer.write(&piece)?;
            }
            writer.finish()
        }
        .await;
        let discarded = sandbox.discard_snapshot().await;
        let written = copied?;
        discarded?;
        Ok((written, report))
    }

    /// Starts a session of the scope from one of its snapshots: the snapshot's image and
    /// dependency set (with `options.dependencies` added), then its files and variables. If
    /// anything fails, the new session is stopped: nothing half-restored is left running.
    pub async fn restore_session(
        &self,
        scope: Scope<'_>,
        snapshot_id: &str,
        options: &RunOptions,
    ) -> Result<(String, Restored), EngineError> {
        let store = self.snapshot_store()?;
        let meta = store.get(&owner_of(scope), snapshot_id)?;
        if let Some(image) = options.image.as_deref().map(str::trim) {
            if !image.is_empty() && image != meta.image {
                return Err(EngineError::Snapshot(format!(
                    "snapshot {} was made with image {}; leave `image` out to restore it",
                    meta.id, meta.image
                )));
            }
        }
        self.check_image(Some(&meta.image)).map_err(|e| match e {
            EngineError::ImageNotAllowed { image, allowed } => EngineError::Snapshot(format!(
                "its image {image} is no longer allowed on this server (allowed: {allowed})"
            )),
            other => other,
        })?;
        let (reader, _restoring) = store.open(&meta)?;
        let mut dependencies = meta.dependencies.clone();
        dependencies.extend(options.dependencies.iter().cloned());
        let options = RunOptions {
            image: Some(meta.image.clone()),
            dependencies,
            ..options.clone()
        };
        let id = self.create_session(scope, &options).await?;
        let timeout = options.timeout.unwrap_or(self.config.limits.timeout);
        let restored = self
            .restore_into(scope, &id, reader, &meta.id, (Work::Restore, timeout))
            .await;
        match restored {
            Ok(restored) => Ok((id, restored)),
            Err(e) => {
                if let Err(stop) = self.stop_session(scope, &id).await {
                    tracing::warn!(session = %id, "could not stop a session whose restore failed: {stop}");
                }
                Err(e)
            }
        }
    }

    /// Uploads a snapshot into a new session and has its runner unpack it, once every byte
    /// matched the recorded hash.
    async fn restore_into(
        &self,
        scope: Scope<'_>,
        id: &str,
        reader: SnapshotReader,
        snapshot_id: &str,
        (work, timeout): (Work, Duration),
    ) -> Result<Restored, EngineError> {
        let (_, session) = self.session(scope, id)?;
        let mut sandbox = session.sandbox.lock().await;
        let _permit = self.permit().await;
        let began = call_begins(&session);
        let restored = self
            .unpack_into(&session, &mut sandbox, reader, snapshot_id, (work, timeout))
            .await;
        self.call_ends(&session, &sandbox, began);
        restored
    }

    /// [`Engine::restore_into`]'s work, the session's sandbox locked.
    async fn unpack_into(
        &self,
        session: &Session,
        sandbox: &mut Sandbox,
        mut reader: SnapshotReader,
        snapshot_id: &str,
        (work, timeout): (Work, Duration),
    ) -> Result<Restored, EngineError> {
        let mut offset = 0u64;
        loop {
            let piece = reader.next_piece(PIECE as usize)?;
            if piece.is_empty() {
                break;
            }
            match sandbox.restore_chunk(&piece, offset).await? {
                Ok(size) if size == offset + piece.len() as u64 => offset = size,
                Ok(_) => {
                    return Err(EngineError::Snapshot(
                        "the sandbox did not take the snapshot whole".into(),
                    ))
                }
                Err(reason) => {
                    return Err(EngineError::Snapshot(format!(
                        "it could not be uploaded into the sandbox: {}",
                        quoted(&reason, MAX_ERROR_CHARS)
                    )))
                }
            }
        }
        // Nothing is unpacked before the bytes are known to be the ones recorded.
        reader.verify()?;
        // Unpacking runs the snapshot's code (unpickling, imports), bounded as an execution is.
        // Whatever stopping it cost, the caller stops this new session.
        let report: RawRestoreReport = match sandbox.restore(timeout).await {
            Ok(report) => report,
            Err(EngineError::WorkTimedOut { timeout, .. }) => {
                return Err(EngineError::WorkTimedOut {
                    work,
                    timeout,
                    lost: WorkLost::NewSession,
                })
            }
            Err(e) => return Err(e),
        };
        if let Some(error) = report.error {
            return Err(EngineError::Snapshot(format!(
                "the sandbox could not unpack it: {}",
                quoted(&error, MAX_ERROR_CHARS)
            )));
        }
        session.touch();
        Ok(Restored {
            snapshot_id: snapshot_id.to_string(),
            files: report.files,
            file_bytes: report.file_bytes,
            variables: bounded_names(report.variables),
            failed: bounded_reasons(report.failed),
            modules: bounded_names(report.modules),
            dependencies: session.requirement_strings(),
        })
    }

    /// Starts a new session of the scope as a copy of a live one (files, variables,
    /// dependency set); the original goes on untouched. The copy is held on the host only until
    /// it is restored, never listed.
    pub async fn fork_session(&self, scope: Scope<'_>, id: &str) -> Result<Forked, EngineError> {
        let store = self.snapshot_store()?;
        let (full, session) = self.session(scope, id)?;
        let (written, report, dependencies) = {
            let mut sandbox = session.sandbox.lock().await;
            session.touch();
            let _permit = self.permit().await;
            let began = call_begins(&session);
            let mut copied = self
                .copy_out(&mut sandbox, store.held_writer()?, Work::Fork)
                .await;
            self.call_ends(&session, &sandbox, began);
            self.end_if_lost(&full, &mut copied);
            let (written, report) = copied?;
            let dependencies = session.requirement_strings();
            (written, report, dependencies)
        };
        // A copy of the session mounts what it mounts: the roots its source started with (its
        // code names their paths), not the client's current ones.
        let options = RunOptions {
            image: Some(session.image.clone()),
            dependencies,
            roots: session.roots.clone(),
            secrets: session.secrets.clone(),
            ..Default::default()
        };
        let new_id = self.create_session(scope, &options).await?;
        let restored = match written.reader() {
            Ok(reader) => {
                let timeout = self.config.limits.timeout;
                self.restore_into(scope, &new_id, reader, "", (Work::Fork, timeout))
                    .await
            }
            Err(e) => Err(e),
        };
        drop(written);
        match restored {
            Ok(restored) => Ok(Forked {
                container_id: new_id,
                image: session.image.clone(),
                roots: session.roots.clone(),
                unsaved: bounded_reasons(report.unsaved),
                restored,
            }),
            Err(e) => {
                if let Err(stop) = self.stop_session(scope, &new_id).await {
                    tracing::warn!(session = %new_id, "could not stop a fork that failed: {stop}");
                }
                Err(e)
            }
        }
    }

    /// The scope's snapshots, newest first.
    pub fn snapshots(&self, scope: Scope<'_>) -> Result<Vec<SnapshotMeta>, EngineError> {
        Ok(self.snapshot_store()?.list(&owner_of(scope)))
    }

    /// Deletes one of the scope's snapshots.
    pub fn delete_snapshot(&self, scope: Scope<'_>, id: &str) -> Result<String, EngineError> {
        let store = self.snapshot_store()?;
        store.delete(&owner_of(scope), id)?;
        Ok(id.trim().to_string())
    }

    /// Snapshots a session about to expire (its sandbox locked by the caller), when the
    /// configuration asks for it; returns what the later "expired" error adds.
    pub(super) async fn snapshot_before_expiry(
        &self,
        session: &Session,
        sandbox: &mut Sandbox,
        id: &str,
    ) -> String {
        let Some(store) = self
            .snapshots
            .as_ref()
            .filter(|_| self.config.snapshots.on_expiry)
        else {
            return String::new();
        };
        let _permit = self.permit().await;
        match self
            .save_session(store, session, sandbox, id, Some("saved before expiry".into()))
            .await
        {
            Ok(meta) => format!(
                "; its state was saved first as snapshot {id}: resume it with sandbox_initialize {{\"snapshot_id\": \"{id}\"}}",
                id = meta.id
            ),
            Err(e) => {
                tracing::warn!(session = %id, "could not snapshot an expiring session: {e}");
                format!("; saving it as a snapshot first failed: {e}")
            }
        }
    }

    /// What a session lost for good adds to its reason: whether a snapshot can resume it.
    pub(super) fn snapshot_hint(&self, session: &Session, id: &str) -> String {
        let Some(store) = self.snapshots.as_ref() else {
            return String::new();
        };
        match store.latest_of_session(&session_owner(session), id) {
            Some(meta) => format!(
                "; its latest snapshot {} (made {} ago) can resume it with sandbox_initialize",
                meta.id,
                crate::text::duration(meta.age(SystemTime::now()))
            ),
            None => "; it has no snapshot".to_string(),
        }
    }

    /// The newest snapshot the scope has of a session this server does not know (it ended
    /// long ago, or the server restarted since).
    pub(super) fn snapshot_of_unknown_session(&self, scope: Scope<'_>, id: &str) -> Option<String> {
        let store = self.snapshots.as_ref()?;
        store
            .list(&owner_of(scope))
            .into_iter()
            .find(|m| m.session == id || (id.len() >= 12 && m.session.starts_with(id)))
            .map(|m| m.id)
    }

    /// Applies the snapshots' age limit (the reaper calls it).
    pub(super) fn expire_snapshots(&self) {
        if let Some(store) = &self.snapshots {
            store.enforce(None, None, SystemTime::now());
        }
    }
}
