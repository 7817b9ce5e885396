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
//! Owners: a snapshot belongs to whoever made it (over stdio the local server's user, over HTTP
//! the MCP client); each owner has a directory of its own, and an id looked up in another
//! owner's directory does not exist. Retention: per owner at most `SANDBOX_SNAPSHOT_MAX_COUNT`
//! snapshots and `SANDBOX_SNAPSHOT_MAX_TOTAL` bytes (the oldest go first), none older than
//! `SANDBOX_SNAPSHOT_TTL`, and never one being restored.

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

/// The owner key of a scope: the directory its snapshots live in.
pub fn owner_of(scope: Scope<'_>) -> String {
    match scope {
        Scope::Server => "local".to_string(),
        Scope::Client(client) => format!("client-{}", client.as_str()),
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
}

impl SnapshotStore {
    /// The store of the configured directory (`None` when snapshots are off). The directory was
    /// checked at start-up (`files_dir::prepare`).
    pub fn new(policy: &SnapshotPolicy) -> Option<SnapshotStore> {
        Some(SnapshotStore {
            dir: policy.dir.clone()?,
            policy: policy.clone(),
            restoring: Default::default(),
        })
    }

    pub fn policy(&self) -> &SnapshotPolicy {
        &self.policy
    }

    fn owner_dir(&self, owner: &str) -> PathBuf {
        self.dir.join(owner)
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
        let mut list: Vec<SnapshotMeta> = fs::read_dir(self.owner_dir(owner))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|entry| read_meta(&entry.path()))
            .filter(|meta| meta.owner == owner && check_id(&meta.id).is_ok())
            .collect();
        list.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
        list
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

    /// Applies retention to `owner` (its count and total) and to every owner (age); returns the
    /// ids removed. Never removes a snapshot being restored, nor `keep`.
    pub fn enforce(&self, owner: Option<&str>, keep: Option<&str>, now: SystemTime) -> Vec<String> {
        let restoring = self.restoring.lock().map(|r| r.clone()).unwrap_or_default();
        let protected = |meta: &SnapshotMeta| {
            restoring.contains(&meta.id) || keep.is_some_and(|k| k == meta.id)
        };
        let mut removed = Vec::new();
        for dir in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let Some(name) = dir.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !dir.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            sweep_partials(&dir.path(), now);
            let mut list = self.list(&name);
            list.reverse(); // oldest first
            let mut count = list.len();
            let mut total: u64 = list.iter().map(|m| m.size).sum();
            let mine = owner == Some(name.as_str());
            for meta in list {
                let expired = meta.age(now) > self.policy.ttl;
                let over = mine && (count > self.policy.max_count || total > self.policy.max_total);
                if (expired || over) && !protected(&meta) {
                    let why = if expired {
                        "older than SANDBOX_SNAPSHOT_TTL"
                    } else {
                        "beyond its owner's count or size limit"
                    };
                    tracing::info!(snapshot = %meta.id, owner = %name, "removing a snapshot: {why}");
                    self.remove(&meta);
                    count -= 1;
                    total = total.saturating_sub(meta.size);
                    removed.push(meta.id);
                }
            }
        }
        removed
    }

    /// Records a finished snapshot: its bytes take their final name, then its metadata is
    /// written (a snapshot is listed only once both exist). Applies the owner's retention.
    pub fn commit(
        &self,
        written: WrittenSnapshot,
        mut meta: SnapshotMeta,
    ) -> Result<SnapshotMeta, EngineError> {
        let dir = self.owner_dir(&meta.owner);
        meta.id = new_id();
        meta.size = written.size;
        meta.sha256 = written.sha256.clone();
        meta.created_ms = now_ms(SystemTime::now());
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
        self.enforce(Some(&meta.owner), Some(&meta.id), SystemTime::now());
        Ok(meta)
    }

    /// Where a fork's snapshot is held until it is restored: never listed, removed after.
    pub fn held_writer(&self) -> Result<SnapshotWriter, EngineError> {
        let dir = self.dir.join(".held");
        create_private_dir(&dir).map_err(|e| disk_error("create", &dir, e))?;
        SnapshotWriter::create(dir, self.policy.max_size)
    }
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
        SnapshotStore::new(&SnapshotPolicy {
            dir: Some(dir.to_path_buf()),
            max_size: 1 << 20,
            ttl: Duration::from_secs(3600),
            max_count,
            max_total: 10 << 20,
            on_expiry: true,
        })
        .unwrap()
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
