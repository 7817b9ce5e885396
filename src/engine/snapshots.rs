//! The snapshot store: snapshots of sessions kept on the host, as opaque bytes.
//!
//! A snapshot is made and unpacked only inside sandboxes (`python/runner/snapshot.py`): the
//! variables are pickled there and unpickled there, never here. The host keeps each snapshot as
//! two files in its owner's directory: `<id>.snap`, the bytes exactly as the sandbox produced
//! them (bounded while they are written), and `<id>.json`, what the host knows of it: its owner,
//! the session it came from, the image and dependency set to restore it with, its size and its
//! SHA-256. A restore streams the bytes into the new sandbox while hashing them and lets the
//! runner unpack them only once the hash matches, so a file changed on disk is refused before any
//! of it is used.
//!
//! Owners: a snapshot belongs to whoever made it, not to the MCP session it came through (it is
//! made to outlive that): over stdio the local server's user (`local`), over HTTP the principal
//! (`client-principal:NAME`), or without principals the holder of the one shared token
//! (`http-token-` and a digest of the token; `http-open` on loopback without a token). Each
//! owner has a directory of its own (its key, or a digest of it when the key is not a plain file
//! name), and an id looked up as another owner's does not exist.
//!
//! Retention: per owner at most `SANDBOX_SNAPSHOT_MAX_COUNT` snapshots (its oldest go first);
//! the whole store, every owner's snapshots together, at most `SANDBOX_SNAPSHOT_MAX_TOTAL` bytes:
//! a new snapshot makes room by removing its owner's oldest ones, never another owner's, and is
//! refused ([`EngineError::SnapshotStoreFull`]) when even that would not make room. None is kept
//! older than `SANDBOX_SNAPSHOT_TTL`, and none is removed while it is being restored. (Snapshots
//! being written are not counted until they are recorded: at most one per session at a time,
//! each bounded by `SANDBOX_SNAPSHOT_MAX_SIZE`.)

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::protocol::NotSaved;
use super::sessions::Scope;
use super::EngineError;
use crate::config::SnapshotPolicy;

/// Prefix of every snapshot id.
const ID_PREFIX: &str = "snap-";
/// Prefix of a snapshot being written (removed when a write fails; a stale one is swept).
const PARTIAL_PREFIX: &str = ".partial-";
/// The largest metadata file read back (names and reasons are bounded when written).
const MAX_META_BYTES: u64 = 4 << 20;
/// A partial file untouched this long belongs to a server that died while writing it.
const PARTIAL_STALE: Duration = Duration::from_secs(60 * 60);

/// What the host records of one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub id: String,
    pub name: Option<String>,
    pub owner: String,
    /// The session it was made from.
    pub session: String,
    pub image: String,
    /// The session's dependency set, as requirements: installed again (or found) at restore.
    pub dependencies: Vec<String>,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub size: u64,
    pub sha256: String,
    pub files: u64,
    pub file_bytes: u64,
    pub saved: Vec<String>,
    pub unsaved: Vec<NotSaved>,
    pub modules: Vec<String>,
}

impl SnapshotMeta {
    pub fn age(&self, now: SystemTime) -> Duration {
        let created = UNIX_EPOCH + Duration::from_millis(self.created_ms);
        now.duration_since(created).unwrap_or_default()
    }
}

/// The owner of the server's one client (stdio, the command line).
pub const LOCAL_OWNER: &str = "local";
/// The owner of every HTTP client when there are no principals and no token (loopback only).
const OPEN_OWNER: &str = "http-open";
/// The longest owner key used as a directory name as it is.
const MAX_PLAIN_DIR: usize = 100;

/// The owner key of a scope's snapshots: who may list and restore them.
pub fn owner_of(scope: Scope<'_>) -> String {
    match scope {
        Scope::Server => LOCAL_OWNER.to_string(),
        Scope::Client(client) => client.snapshot_owner().to_string(),
    }
}

/// The owner of the snapshots of an HTTP client that is no principal: the holder of the one
/// shared token (`SANDBOX_HTTP_TOKEN`), whichever MCP session it comes through; another token
/// (a rotated one) is another owner. Without a token (loopback only), every client is the same
/// owner. Never a principal's key (`client-…`), nor `local`.
pub fn shared_owner(token: Option<&str>) -> String {
    match token {
        Some(token) => {
            let digest = Sha256::new()
                .chain_update(b"python-code-sandbox snapshot owner\0")
                .chain_update(token.as_bytes())
                .finalize();
            format!("http-token-{}", hex(&digest[..16]))
        }
        None => OPEN_OWNER.to_string(),
    }
}

/// The directory name of an owner key: the key when it is a plain file name (ASCII letters,
/// digits, `.`, `_`, `-`, `:`, not starting with `.`, at most 100 bytes), else `~` and a digest
/// of it (an OAuth subject can hold `/` or `..`). A digest's name never is a plain key's.
pub fn owner_dir_name(owner: &str) -> String {
    let plain = !owner.is_empty()
        && owner.len() <= MAX_PLAIN_DIR
        && !owner.starts_with('.')
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
    if plain {
        owner.to_string()
    } else {
        format!("~{}", hex(&Sha256::digest(owner.as_bytes())[..16]))
    }
}

/// Checks the form of a snapshot id the agent gave (`snap-` and 32 hex digits).
pub fn check_id(id: &str) -> Result<&str, EngineError> {
    let id = id.trim();
    let hex = id.strip_prefix(ID_PREFIX).unwrap_or("");
    if hex.len() == 32
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        Ok(id)
    } else {
        Err(EngineError::MalformedSnapshotId(
            id.chars().take(80).collect(),
        ))
    }
}

fn new_id() -> String {
    format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

fn now_ms(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A write to the store failed: the disk is full, the directory went away...
fn disk_error(what: &str, path: &Path, e: io::Error) -> EngineError {
    EngineError::Snapshot(format!("cannot {what} {}: {e}", path.display()))
}

/// The snapshots of every owner, under one directory.
pub struct SnapshotStore {
    dir: PathBuf,
    policy: SnapshotPolicy,
    /// Snapshots being restored: retention leaves them alone.
    restoring: Arc<Mutex<HashSet<String>>>,
    /// Held while a snapshot is recorded: the store's total is checked and changed by one
    /// commit at a time.
    committing: Mutex<()>,
}

impl SnapshotStore {
    /// The store of the configured directory (`None` when snapshots are off). The directory was
    /// checked at start-up (`files_dir::prepare`).
    pub fn new(policy: &SnapshotPolicy) -> Option<SnapshotStore> {
        Some(SnapshotStore {
            dir: policy.dir.clone()?,
            policy: policy.clone(),
            restoring: Default::default(),
            committing: Mutex::new(()),
        })
    }

    pub fn policy(&self) -> &SnapshotPolicy {
        &self.policy
    }

    fn owner_dir(&self, owner: &str) -> PathBuf {
        self.dir.join(owner_dir_name(owner))
    }

    /// Starts writing a new snapshot of `owner`; nothing is listed until it is finished.
    pub fn writer(&self, owner: &str) -> Result<SnapshotWriter, EngineError> {
        let dir = self.owner_dir(owner);
        create_private_dir(&dir).map_err(|e| disk_error("create", &dir, e))?;
        SnapshotWriter::create(dir, self.policy.max_size)
    }

    /// The metadata of `id` if `owner` has it; any other owner's id is unknown.
    pub fn get(&self, owner: &str, id: &str) -> Result<SnapshotMeta, EngineError> {
        let id = check_id(id)?;
        let path = self.owner_dir(owner).join(format!("{id}.json"));
        match read_meta(&path) {
            Some(meta) if meta.id == id && meta.owner == owner => Ok(meta),
            _ => Err(EngineError::UnknownSnapshot(id.to_string())),
        }
    }

    /// `owner`'s snapshots, newest first.
    pub fn list(&self, owner: &str) -> Vec<SnapshotMeta> {
        let mut list: Vec<SnapshotMeta> = self
            .read_owner_dir(&self.owner_dir(owner))
            .into_iter()
            .filter(|meta| meta.owner == owner)
            .collect();
        newest_first(&mut list);
        list
    }

    /// The snapshots recorded in one owner directory (whoever's it is): each whose metadata
    /// reads, whose id is well formed, and which is in its owner's directory.
    fn read_owner_dir(&self, dir: &Path) -> Vec<SnapshotMeta> {
        fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|entry| read_meta(&entry.path()))
            .filter(|meta| check_id(&meta.id).is_ok() && self.owner_dir(&meta.owner) == dir)
            .collect()
    }

    /// Every owner's snapshots (partial files of dead servers swept on the way).
    fn all(&self, now: SystemTime) -> Vec<SnapshotMeta> {
        let mut all = Vec::new();
        for dir in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if !dir.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            sweep_partials(&dir.path(), now);
            all.extend(self.read_owner_dir(&dir.path()));
        }
        all
    }

    /// Bytes of every owner's recorded snapshots together: what `SANDBOX_SNAPSHOT_MAX_TOTAL`
    /// bounds.
    pub fn total(&self) -> u64 {
        self.all(SystemTime::now()).iter().map(|m| m.size).sum()
    }

    /// The newest snapshot `owner` has of `session`.
    pub fn latest_of_session(&self, owner: &str, session: &str) -> Option<SnapshotMeta> {
        self.list(owner).into_iter().find(|m| m.session == session)
    }

    /// Opens `meta`'s bytes for a restore: read through a [`SnapshotReader`] that checks the
    /// hash. Retention leaves the snapshot alone while the returned guard lives.
    pub fn open(&self, meta: &SnapshotMeta) -> Result<(SnapshotReader, RestoreGuard), EngineError> {
        let guard = RestoreGuard::new(self.restoring.clone(), &meta.id);
        let path = self
            .owner_dir(&meta.owner)
            .join(format!("{}.snap", meta.id));
        let file = fs::File::open(&path).map_err(|e| EngineError::SnapshotCorrupted {
            id: meta.id.clone(),
            reason: format!("its file cannot be opened: {e}"),
        })?;
        let reader = SnapshotReader::new(file, meta.id.clone(), meta.size, meta.sha256.clone());
        Ok((reader, guard))
    }

    /// Deletes `owner`'s snapshot `id`.
    pub fn delete(&self, owner: &str, id: &str) -> Result<(), EngineError> {
        let meta = self.get(owner, id)?;
        self.remove(&meta);
        Ok(())
    }

    fn remove(&self, meta: &SnapshotMeta) {
        let dir = self.owner_dir(&meta.owner);
        // The metadata first: a snapshot without it is not listed, and its bytes are swept.
        for suffix in ["json", "snap"] {
            let path = dir.join(format!("{}.{suffix}", meta.id));
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("could not remove {}: {e}", path.display());
                }
            }
        }
    }

    /// Applies retention: the age limit to every owner; with `owner`, its count limit and the
    /// store's total, by removing `owner`'s oldest snapshots (never another owner's). Never
    /// removes a snapshot being restored, nor `keep`. Returns the ids removed.
    pub fn enforce(&self, owner: Option<&str>, keep: Option<&str>, now: SystemTime) -> Vec<String> {
        let restoring = self.restoring();
        let protected = |meta: &SnapshotMeta| {
            restoring.contains(&meta.id) || keep.is_some_and(|k| k == meta.id)
        };
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for meta in self.all(now) {
            if meta.age(now) > self.policy.ttl && !protected(&meta) {
                self.remove_for(&meta, "older than SANDBOX_SNAPSHOT_TTL");
                removed.push(meta.id);
            } else {
                kept.push(meta);
            }
        }
        let Some(owner) = owner else {
            return removed;
        };
        let mut total: u64 = kept.iter().map(|m| m.size).sum();
        let mut own: Vec<SnapshotMeta> = kept.into_iter().filter(|m| m.owner == owner).collect();
        newest_first(&mut own);
        let mut count = own.len();
        for meta in own.into_iter().rev() {
            let over_count = count > self.policy.max_count;
            let over_total = total > self.policy.max_total;
            if !(over_count || over_total) {
                break;
            }
            if protected(&meta) {
                continue;
            }
            self.remove_for(
                &meta,
                if over_count {
                    "beyond its owner's SANDBOX_SNAPSHOT_MAX_COUNT"
                } else {
                    "making room within SANDBOX_SNAPSHOT_MAX_TOTAL for its owner's newer one"
                },
            );
            count -= 1;
            total = total.saturating_sub(meta.size);
            removed.push(meta.id);
        }
        removed
    }

    fn restoring(&self) -> HashSet<String> {
        self.restoring
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    fn remove_for(&self, meta: &SnapshotMeta, why: &str) {
        tracing::info!(snapshot = %meta.id, owner = %meta.owner, "removing a snapshot: {why}");
        self.remove(meta);
    }

    /// Whether a new snapshot of `size` bytes of `owner` fits within the store's total once
    /// `owner`'s own older snapshots (those not being restored) made room, expired ones gone.
    fn fits(&self, owner: &str, size: u64, now: SystemTime) -> bool {
        let restoring = self.restoring();
        let staying: u64 = self
            .all(now)
            .iter()
            .filter(|m| m.age(now) <= self.policy.ttl || restoring.contains(&m.id))
            .filter(|m| m.owner != owner || restoring.contains(&m.id))
            .map(|m| m.size)
            .sum();
        staying.saturating_add(size) <= self.policy.max_total
    }

    /// Records a finished snapshot: its bytes take their final name, then its metadata is
    /// written (a snapshot is listed only once both exist); then the owner's retention makes
    /// room for it. Refused, with nothing removed, when it does not fit within the store's total
    /// even in place of every older snapshot of its owner.
    pub fn commit(
        &self,
        written: WrittenSnapshot,
        mut meta: SnapshotMeta,
    ) -> Result<SnapshotMeta, EngineError> {
        let _one_at_a_time = self
            .committing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = SystemTime::now();
        if !self.fits(&meta.owner, written.size, now) {
            tracing::warn!(owner = %meta.owner, size = written.size, "a snapshot was refused: the store is at SANDBOX_SNAPSHOT_MAX_TOTAL");
            return Err(EngineError::SnapshotStoreFull {
                size: crate::text::bytes(written.size),
                limit: crate::text::bytes(self.policy.max_total),
            });
        }
        let dir = self.owner_dir(&meta.owner);
        meta.id = new_id();
        meta.size = written.size;
        meta.sha256 = written.sha256.clone();
        meta.created_ms = now_ms(now);
        let snap = dir.join(format!("{}.snap", meta.id));
        fs::rename(&written.path, &snap).map_err(|e| disk_error("store", &snap, e))?;
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| EngineError::Snapshot(format!("cannot record it: {e}")))?;
        let partial = dir.join(format!("{PARTIAL_PREFIX}{}.json", meta.id));
        let meta_path = dir.join(format!("{}.json", meta.id));
        let recorded = write_new(&partial, &json).and_then(|()| fs::rename(&partial, &meta_path));
        if let Err(e) = recorded {
            let _ = fs::remove_file(&partial);
            let _ = fs::remove_file(&snap);
            return Err(disk_error("record", &meta_path, e));
        }
        self.enforce(Some(&meta.owner), Some(&meta.id), now);
        Ok(meta)
    }

    /// Where a fork's snapshot is held until it is restored: never listed, removed after.
    pub fn held_writer(&self) -> Result<SnapshotWriter, EngineError> {
        let dir = self.dir.join(".held");
        create_private_dir(&dir).map_err(|e| disk_error("create", &dir, e))?;
        SnapshotWriter::create(dir, self.policy.max_size)
    }
}

/// Sorts snapshots newest first (ties by id, so the order is stable).
fn newest_first(list: &mut [SnapshotMeta]) {
    list.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
}

/// Creates `dir` (and a missing parent, the store's own directory) private to this user.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn write_new(path: &Path, content: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(content)?;
    file.sync_all()
}

fn read_meta(path: &Path) -> Option<SnapshotMeta> {
    let file = fs::File::open(path).ok()?;
    let mut text = Vec::new();
    file.take(MAX_META_BYTES).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Removes partial files a dead server left, and snapshot bytes whose metadata is gone.
fn sweep_partials(dir: &Path, now: SystemTime) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .is_some_and(|modified| {
                now.duration_since(modified).unwrap_or_default() > PARTIAL_STALE
            });
        let orphan = name
            .strip_suffix(".snap")
            .is_some_and(|id| !dir.join(format!("{id}.json")).exists());
        if stale && (name.starts_with(PARTIAL_PREFIX) || orphan) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Marks a snapshot as being restored while it lives.
pub struct RestoreGuard {
    restoring: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl RestoreGuard {
    fn new(restoring: Arc<Mutex<HashSet<String>>>, id: &str) -> RestoreGuard {
        if let Ok(mut set) = restoring.lock() {
            set.insert(id.to_string());
        }
        RestoreGuard {
            restoring,
            id: id.to_string(),
        }
    }
}

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        if let Ok(mut set) = self.restoring.lock() {
            set.remove(&self.id);
        }
    }
}

/// A snapshot being written: bounded while it grows, hashed as it goes; removed if dropped
/// before it is finished.
pub struct SnapshotWriter {
    path: PathBuf,
    file: Option<fs::File>,
    hasher: Sha256,
    size: u64,
    max_size: u64,
}

impl SnapshotWriter {
    fn create(dir: PathBuf, max_size: u64) -> Result<SnapshotWriter, EngineError> {
        let path = dir.join(format!("{PARTIAL_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| disk_error("create", &path, e))?;
        Ok(SnapshotWriter {
            path,
            file: Some(file),
            hasher: Sha256::new(),
            size: 0,
            max_size,
        })
    }

    /// Appends a piece; refuses to grow beyond the size limit.
    pub fn write(&mut self, piece: &[u8]) -> Result<(), EngineError> {
        if self.size + piece.len() as u64 > self.max_size {
            return Err(EngineError::Snapshot(format!(
                "it is larger than the {} limit (SANDBOX_SNAPSHOT_MAX_SIZE)",
                crate::text::bytes(self.max_size)
            )));
        }
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| EngineError::Snapshot("it was already finished".into()))?;
        file.write_all(piece)
            .map_err(|e| disk_error("write", &self.path, e))?;
        self.hasher.update(piece);
        self.size += piece.len() as u64;
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Flushes the bytes to disk: what [`SnapshotStore::commit`] records, or what a fork reads
    /// back.
    pub fn finish(mut self) -> Result<WrittenSnapshot, EngineError> {
        let file = self
            .file
            .take()
            .ok_or_else(|| EngineError::Snapshot("it was already finished".into()))?;
        file.sync_all()
            .map_err(|e| disk_error("write", &self.path, e))?;
        let path = std::mem::take(&mut self.path);
        Ok(WrittenSnapshot {
            path,
            size: self.size,
            sha256: hex(&self.hasher.clone().finalize()),
        })
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A snapshot's bytes on disk, not yet recorded (or held for a fork); removed when dropped
/// unless [`SnapshotStore::commit`] renamed them.
pub struct WrittenSnapshot {
    path: PathBuf,
    pub size: u64,
    pub sha256: String,
}

impl WrittenSnapshot {
    /// Reads the held bytes back, checked against the hash they were written with.
    pub fn reader(&self) -> Result<SnapshotReader, EngineError> {
        let file = fs::File::open(&self.path).map_err(|e| disk_error("read", &self.path, e))?;
        Ok(SnapshotReader::new(
            file,
            "(held for a fork)".into(),
            self.size,
            self.sha256.clone(),
        ))
    }
}

impl Drop for WrittenSnapshot {
    fn drop(&mut self) {
        // After a commit the file has another name and this removal finds nothing.
        let _ = fs::remove_file(&self.path);
    }
}

/// Reads a snapshot's bytes in pieces, hashing them; [`SnapshotReader::verify`] says whether
/// they are the bytes that were recorded.
pub struct SnapshotReader {
    file: fs::File,
    id: String,
    expected_size: u64,
    expected_sha256: String,
    hasher: Sha256,
    read: u64,
}

impl SnapshotReader {
    fn new(file: fs::File, id: String, size: u64, sha256: String) -> SnapshotReader {
        SnapshotReader {
            file,
            id,
            expected_size: size,
            expected_sha256: sha256,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    fn corrupted(&self, reason: String) -> EngineError {
        EngineError::SnapshotCorrupted {
            id: self.id.clone(),
            reason,
        }
    }

    /// The next piece of at most `max` bytes; empty at the end. Never reads beyond the recorded
    /// size (a file grown on disk is found by [`SnapshotReader::verify`]).
    pub fn next_piece(&mut self, max: usize) -> Result<Vec<u8>, EngineError> {
        let want = (self.expected_size - self.read).min(max as u64) as usize;
        let mut piece = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            match self.file.read(&mut piece[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.corrupted(format!("its file cannot be read: {e}"))),
            }
        }
        piece.truncate(filled);
        self.hasher.update(&piece);
        self.read += filled as u64;
        Ok(piece)
    }

    /// Whether every byte was read and they hash to what was recorded.
    pub fn verify(mut self) -> Result<(), EngineError> {
        let mut extra = [0u8; 1];
        let longer = matches!(self.file.read(&mut extra), Ok(n) if n > 0);
        if self.read != self.expected_size || longer {
            return Err(self.corrupted(format!(
                "it is not the {} bytes that were recorded (truncated or grown)",
                self.expected_size
            )));
        }
        let actual = hex(&self.hasher.clone().finalize());
        if actual != self.expected_sha256 {
            return Err(self.corrupted(
                "its content does not match the SHA-256 recorded when it was made".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "pcs-snapshots-test-{}",
                uuid::Uuid::new_v4().simple()
            ));
            fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn store(dir: &Path, max_count: usize) -> SnapshotStore {
        store_of_total(dir, max_count, 10 << 20)
    }

    fn store_of_total(dir: &Path, max_count: usize, max_total: u64) -> SnapshotStore {
        SnapshotStore::new(&SnapshotPolicy {
            dir: Some(dir.to_path_buf()),
            max_size: 1 << 20,
            ttl: Duration::from_secs(3600),
            max_count,
            max_total,
            on_expiry: true,
        })
        .unwrap()
    }

    fn try_save(
        store: &SnapshotStore,
        owner: &str,
        bytes: &[u8],
    ) -> Result<SnapshotMeta, EngineError> {
        let mut writer = store.writer(owner)?;
        writer.write(bytes)?;
        // Distinct creation times, so "oldest" is well defined.
        std::thread::sleep(Duration::from_millis(3));
        store.commit(writer.finish()?, meta(owner))
    }

    fn ids(store: &SnapshotStore, owner: &str) -> Vec<String> {
        store.list(owner).into_iter().map(|m| m.id).collect()
    }

    #[test]
    fn snapshots_belong_to_the_principal_or_the_shared_token_not_to_the_mcp_session() {
        use crate::engine::sessions::ClientId;
        // Two MCP sessions of one principal: the same owner. Another principal: another.
        let alice = ClientId::of_principal("alice");
        assert_eq!(owner_of(Scope::Client(&alice)), "client-principal:alice");
        assert_eq!(
            owner_of(Scope::Client(&ClientId::of_principal("alice"))),
            owner_of(Scope::Client(&alice))
        );
        assert_ne!(
            owner_of(Scope::Client(&ClientId::of_principal("bob"))),
            owner_of(Scope::Client(&alice))
        );
        // Two MCP sessions of the one shared token: two clients (their sandbox sessions apart),
        // one owner of snapshots; another token is another owner; no token, one open owner.
        let token = "0123456789abcdef0123456789abcdef";
        let first = ClientId::new().with_snapshot_owner(shared_owner(Some(token)));
        let second = ClientId::new().with_snapshot_owner(shared_owner(Some(token)));
        assert_ne!(first, second);
        assert_eq!(
            owner_of(Scope::Client(&first)),
            owner_of(Scope::Client(&second))
        );
        let owner = shared_owner(Some(token));
        assert!(
            owner.starts_with("http-token-") && !owner.contains(token),
            "{owner}"
        );
        assert_ne!(shared_owner(Some("another token, rotated")), owner);
        assert_eq!(shared_owner(None), "http-open");
        // Never the stdio client's, nor a principal's.
        for shared in [owner.as_str(), "http-open"] {
            assert_ne!(shared, LOCAL_OWNER);
            assert!(!shared.starts_with("client-"));
        }
        assert_eq!(owner_of(Scope::Server), "local");
    }

    #[test]
    fn an_owner_key_that_is_no_plain_name_gets_a_digest_for_its_directory() {
        assert_eq!(
            owner_dir_name("client-principal:alice"),
            "client-principal:alice"
        );
        assert_eq!(owner_dir_name("local"), "local");
        for odd in [
            "client-principal:oauth:../../../etc",
            "client-principal:oauth:a/b",
            "..",
            ".held",
            "",
            &"x".repeat(101),
        ] {
            let name = owner_dir_name(odd);
            assert!(name.starts_with('~') && name.len() == 33, "{odd:?}: {name}");
            assert!(!name.contains('/'));
        }
        assert_ne!(
            owner_dir_name("client-principal:oauth:a/b"),
            owner_dir_name("client-principal:oauth:a/c")
        );
        // Stored and found under the digest, and only by its owner.
        let dir = Scratch::new();
        let store = store(dir.path(), 10);
        let odd = "client-principal:oauth:../../escape";
        let saved = save(&store, odd, b"x");
        assert!(dir
            .path()
            .join(owner_dir_name(odd))
            .join(format!("{}.snap", saved.id))
            .is_file());
        assert_eq!(ids(&store, odd), vec![saved.id.clone()]);
        assert!(store.get("client-principal:oauth:..", &saved.id).is_err());
    }

    #[test]
    fn the_total_bounds_the_whole_store_an_owner_makes_room_only_from_its_own() {
        let dir = Scratch::new();
        let store = store_of_total(dir.path(), 10, 10);
        let a1 = try_save(&store, "a", b"aaaa").unwrap();
        let b1 = try_save(&store, "b", b"bbbb").unwrap();
        // a's next one fits in place of a's oldest: that goes, b's stays.
        let a2 = try_save(&store, "a", b"AAAA").unwrap();
        assert_eq!(ids(&store, "a"), vec![a2.id.clone()]);
        assert_eq!(ids(&store, "b"), vec![b1.id.clone()]);
        assert_eq!(store.total(), 8);
        assert!(!ids(&store, "a").contains(&a1.id));
        // A third owner's would take the store beyond the total, and it has nothing to give:
        // refused, naming the setting; nobody's snapshot is removed.
        let refused = try_save(&store, "c", b"cccc").unwrap_err();
        assert!(
            matches!(refused, EngineError::SnapshotStoreFull { .. }),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("SANDBOX_SNAPSHOT_MAX_TOTAL"),
            "{refused}"
        );
        // Too large even in place of every one of a's: refused, and a keeps its snapshot.
        assert!(matches!(
            try_save(&store, "a", b"AAAAAAA"),
            Err(EngineError::SnapshotStoreFull { .. })
        ));
        assert_eq!(ids(&store, "a"), vec![a2.id.clone()]);
        assert!(ids(&store, "c").is_empty());
        assert_eq!(store.total(), 8);
        // Nothing of the refused ones is left on disk.
        let files: Vec<String> = ["a", "b", "c"]
            .iter()
            .flat_map(|o| {
                fs::read_dir(dir.path().join(o))
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files.len(), 4, "{files:?}");
        // One being restored cannot make room: its bytes stay counted.
        let (_reader, guard) = store.open(&a2).unwrap();
        assert!(matches!(
            try_save(&store, "a", b"AAA"),
            Err(EngineError::SnapshotStoreFull { .. })
        ));
        drop(guard);
        let a3 = try_save(&store, "a", b"AAA").unwrap();
        assert_eq!(ids(&store, "a"), vec![a3.id]);
        assert_eq!(store.total(), 7);
    }

    #[test]
    fn many_clients_of_one_owner_cannot_grow_the_store_beyond_its_total() {
        use crate::engine::sessions::ClientId;
        let dir = Scratch::new();
        let store = store_of_total(dir.path(), 50, 10);
        let owner = shared_owner(Some("the one shared token of the server"));
        // Six MCP sessions of the token, three bytes each: they are one owner, whose oldest go.
        for _ in 0..6 {
            let client = ClientId::new().with_snapshot_owner(owner.clone());
            try_save(&store, &owner_of(Scope::Client(&client)), b"xyz").unwrap();
            assert!(store.total() <= 10, "{}", store.total());
        }
        assert_eq!(store.list(&owner).len(), 3);
        assert_eq!(store.total(), 9);
    }

    fn meta(owner: &str) -> SnapshotMeta {
        SnapshotMeta {
            id: String::new(),
            name: None,
            owner: owner.into(),
            session: "s1".into(),
            image: "img".into(),
            dependencies: vec![],
            created_ms: 0,
            size: 0,
            sha256: String::new(),
            files: 0,
            file_bytes: 0,
            saved: vec![],
            unsaved: vec![],
            modules: vec![],
        }
    }

    fn save(store: &SnapshotStore, owner: &str, bytes: &[u8]) -> SnapshotMeta {
        let mut writer = store.writer(owner).unwrap();
        writer.write(bytes).unwrap();
        store.commit(writer.finish().unwrap(), meta(owner)).unwrap()
    }

    fn read_all(store: &SnapshotStore, meta: &SnapshotMeta) -> Result<Vec<u8>, EngineError> {
        let (mut reader, _guard) = store.open(meta)?;
        let mut all = Vec::new();
        loop {
            let piece = reader.next_piece(3)?;
            if piece.is_empty() {
                break;
            }
            all.extend(piece);
        }
        reader.verify()?;
        Ok(all)
    }

    #[test]
    fn a_snapshot_round_trips_and_belongs_to_its_owner() {
        let dir = Scratch::new();
        let store = store(dir.path(), 10);
        let saved = save(&store, "local", b"hello snapshot");
        assert!(check_id(&saved.id).is_ok());
        assert_eq!(store.get("local", &saved.id).unwrap(), saved);
        assert_eq!(read_all(&store, &saved).unwrap(), b"hello snapshot");
        assert!(matches!(
            store.get("client-x", &saved.id),
            Err(EngineError::UnknownSnapshot(_))
        ));
        assert!(store.list("client-x").is_empty());
        assert!(matches!(
            store.delete("client-x", &saved.id),
            Err(EngineError::UnknownSnapshot(_))
        ));
        store.delete("local", &saved.id).unwrap();
        assert!(store.list("local").is_empty());
    }

    #[test]
    fn changed_truncated_or_grown_bytes_are_found() {
        let dir = Scratch::new();
        let store = store(dir.path(), 10);
        let saved = save(&store, "local", b"0123456789");
        let snap = dir.path().join("local").join(format!("{}.snap", saved.id));
        for tampered in [&b"0123456788"[..], b"012345678", b"0123456789!"] {
            fs::write(&snap, tampered).unwrap();
            assert!(
                matches!(
                    read_all(&store, &saved),
                    Err(EngineError::SnapshotCorrupted { .. })
                ),
                "{tampered:?}"
            );
        }
    }

    #[test]
    fn the_size_limit_holds_while_writing_and_a_failed_write_leaves_nothing() {
        let dir = Scratch::new();
        let store = store(dir.path(), 10);
        let mut writer = store.writer("local").unwrap();
        writer.write(&vec![0u8; 1 << 20]).unwrap();
        assert!(matches!(writer.write(b"x"), Err(EngineError::Snapshot(_))));
        drop(writer);
        assert_eq!(fs::read_dir(dir.path().join("local")).unwrap().count(), 0);
    }

    #[test]
    fn retention_removes_the_oldest_first_but_never_one_being_restored() {
        let dir = Scratch::new();
        let store = store(dir.path(), 2);
        let first = save(&store, "local", b"1");
        // The oldest is being restored while two more are made: it stays, the next oldest goes.
        let (_reader, guard) = store.open(&first).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let second = save(&store, "local", b"2");
        std::thread::sleep(Duration::from_millis(5));
        let third = save(&store, "local", b"3");
        let ids: Vec<String> = store.list("local").into_iter().map(|m| m.id).collect();
        assert!(
            ids.contains(&first.id) && ids.contains(&third.id),
            "{ids:?}"
        );
        assert!(!ids.contains(&second.id));
        drop(guard);
        assert!(store
            .enforce(Some("local"), None, SystemTime::now())
            .is_empty());
        // Age: both are older than the TTL two hours from now.
        let later = SystemTime::now() + Duration::from_secs(7200);
        let mut expired = store.enforce(None, None, later);
        expired.sort();
        let mut expected = vec![first.id, third.id];
        expected.sort();
        assert_eq!(expired, expected);
        assert!(store.list("local").is_empty());
    }

    #[test]
    fn ids_are_checked_before_any_path_is_made_of_them() {
        for bad in [
            "",
            "snap-",
            "snap-../../etc",
            "snap-0123456789abcdef0123456789ABCDEF",
            "x",
        ] {
            assert!(
                matches!(check_id(bad), Err(EngineError::MalformedSnapshotId(_))),
                "{bad}"
            );
        }
        assert!(check_id("snap-0123456789abcdef0123456789abcdef").is_ok());
    }
}
