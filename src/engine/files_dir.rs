//! The host directory saved files go to (`SANDBOX_FILES_DIR`): made safe at start-up, and kept
//! within its retention (`SANDBOX_FILES_MAX_AGE`, `SANDBOX_FILES_MAX_BYTES`).
//!
//! Start-up ([`prepare`]) creates the directory, and each missing parent, private to the server's
//! user (0700), and refuses a directory it cannot trust: a symbolic link, not a directory, owned by
//! another user, writable by group or others, or below a directory another user could rename it
//! from (owned by another user other than root, or writable by others without the sticky bit; a
//! link on the way that another user owns; these are judged before anything is created below them).
//! Someone who prepared the directory first could read the saved files or swap them; the server
//! refuses to start rather than save less safely than configured.
//!
//! Retention ([`Retention`]) removes whole `run-…` and `session-…` directories: those whose newest
//! entry is older than the maximum age, then the oldest until the total fits. It runs in the
//! background, off the call path: at start-up, after executions that saved something (at most
//! once per pause, which grows with the time a sweep takes), and hourly. It never follows a link,
//! neither while measuring nor while deleting, and never removes a directory an execution is
//! saving into right now: a directory is renamed away under the lock saves register under, then
//! deleted. Entries of other names are never touched.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::config::FilePolicy;

/// Prefix of a directory being deleted (left over if the server died meanwhile; removed later).
const TRASH_PREFIX: &str = ".trash-";
/// The start of an owner's directory: a principal's runs are saved in one of their own.
const OWNER_PREFIX: &str = "principal-";

/// The directory of an owner's (a principal's) runs under the files directory: its name when
/// that is a plain file name of at most 64 characters, else a digest of it (an OAuth subject can
/// be anything); never the name of a run, a session or trash.
pub fn owner_dir_name(owner: &str) -> String {
    use sha2::{Digest, Sha256};
    let plain = !owner.is_empty()
        && owner.len() <= 64
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        format!("{OWNER_PREFIX}{owner}")
    } else {
        let digest: String = Sha256::digest(owner.as_bytes())
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{OWNER_PREFIX}~{digest}")
    }
}
/// The shortest pause between two sweeps.
const MIN_PAUSE: Duration = Duration::from_secs(2);
/// A sweep happens at least this often, saves or not (for the age limit).
const PERIODIC: Duration = Duration::from_secs(60 * 60);

/// Why the files directory cannot be used, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={dir:?} cannot be used: {reason}. Fix: {fix}; or set {setting}= (empty) to {turn_off}")]
pub struct FilesDirError {
    /// The setting that names the directory.
    pub setting: &'static str,
    /// What an empty setting does instead.
    pub turn_off: &'static str,
    pub dir: PathBuf,
    pub reason: String,
    pub fix: String,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The start-up check of the configured files directory, which says where files go (or that none
/// are saved) in the log.
pub fn prepare_configured(policy: &FilePolicy) -> Result<(), FilesDirError> {
    match &policy.persist_dir {
        Some(dir) => {
            prepare(dir, "SANDBOX_FILES_DIR", "save no files")?;
            tracing::info!(
                "saving files under {} (private to uid {}); run and session directories older than {} are removed, and the oldest first beyond {} bytes in total",
                dir.display(),
                euid(),
                humantime::format_duration(policy.max_age),
                policy.max_saved_bytes
            );
        }
        None => tracing::info!("SANDBOX_FILES_DIR is empty: files are returned, not saved"),
    }
    Ok(())
}

/// Creates a private state directory (the files directory, the snapshots directory) if missing
/// and checks it can be trusted (see the module docs). `setting` names it in errors, and
/// `turn_off` says what setting it empty does.
pub fn prepare(
    dir: &Path,
    setting: &'static str,
    turn_off: &'static str,
) -> Result<(), FilesDirError> {
    let refuse = |reason: String, fix: String| FilesDirError {
        setting,
        turn_off,
        dir: dir.to_path_buf(),
        reason,
        fix,
    };
    if !dir.is_absolute() {
        return Err(refuse(
            "not an absolute path".to_string(),
            "give an absolute path".to_string(),
        ));
    }
    let me = euid();
    // A link on the literal path may be changed by whoever owns it.
    let mut prefix = PathBuf::new();
    for component in dir.components() {
        prefix.push(component);
        if let Ok(meta) = fs::symlink_metadata(&prefix) {
            if meta.file_type().is_symlink() && meta.uid() != 0 && meta.uid() != me {
                return Err(refuse(
                    format!(
                        "{} on its path is a symbolic link owned by uid {}, who can point it elsewhere",
                        prefix.display(),
                        meta.uid()
                    ),
                    "use a path without links owned by other users".to_string(),
                ));
            }
        }
    }
    // Each existing directory above it, as resolved, judged before anything is created there:
    // another user must not be able to rename it away.
    let mut above = dir.parent();
    while let Some(path) = above {
        if fs::metadata(path).is_ok() {
            break;
        }
        above = path.parent();
    }
    if let Some(above) = above {
        let real = fs::canonicalize(above).map_err(|e| {
            refuse(
                format!("cannot resolve {}: {e}", above.display()),
                "check the path".to_string(),
            )
        })?;
        for ancestor in real.ancestors() {
            let Ok(meta) = fs::metadata(ancestor) else {
                continue;
            };
            let sticky = meta.mode() & 0o1000 != 0;
            if meta.uid() != 0 && meta.uid() != me {
                return Err(refuse(
                    format!(
                        "{}, a directory above it, belongs to uid {}, who could replace it",
                        ancestor.display(),
                        meta.uid()
                    ),
                    format!("choose a directory below ones owned by this user (uid {me}) or root"),
                ));
            }
            if meta.mode() & 0o002 != 0 && !sticky {
                return Err(refuse(
                    format!(
                        "{}, a directory above it, is writable by everyone (mode {:04o}) without the sticky bit, so anyone could replace it",
                        ancestor.display(),
                        meta.mode() & 0o7777
                    ),
                    format!("chmod o-w {} (or +t), or choose another directory", ancestor.display()),
                ));
            }
        }
    }
    let created = create_private(dir).map_err(|(path, e)| {
        refuse(
            format!("cannot create {}: {e}", path.display()),
            "create it yourself (mkdir -p, chmod 700) or choose a directory this user can create"
                .to_string(),
        )
    })?;
    // What we created must still be ours, private and real (no one swapped it meanwhile), and so
    // must the directory itself.
    for path in created.iter().chain(std::iter::once(&dir.to_path_buf())) {
        check_private_dir(path, me).map_err(|(reason, fix)| refuse(reason, fix))?;
    }
    Ok(())
}

/// Creates `dir` and each missing parent with mode 0700, one at a time (no `create_dir_all`, whose
/// parents get the umask's mode). Returns the directories it created.
pub fn create_private(dir: &Path) -> Result<Vec<PathBuf>, (PathBuf, io::Error)> {
    let mut created = Vec::new();
    let mut path = PathBuf::new();
    for component in dir.components() {
        path.push(component);
        match fs::symlink_metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => created.push(path.clone()),
                    // Made by someone else meanwhile: the checks that follow judge it.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err((path, e)),
                }
            }
            Err(e) => return Err((path, e)),
        }
    }
    Ok(created)
}

/// Checks one directory is a real directory, owned by `me`, not writable by group or others.
/// The error holds the reason and the fix.
pub fn check_private_dir(path: &Path, me: u32) -> Result<(), (String, String)> {
    let meta = fs::symlink_metadata(path).map_err(|e| {
        (
            format!("cannot inspect {}: {e}", path.display()),
            "check the path and its permissions".to_string(),
        )
    })?;
    let shown = path.display();
    if meta.file_type().is_symlink() {
        let target = fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".to_string());
        return Err((
            format!("{shown} is a symbolic link (to {target})"),
            "set SANDBOX_FILES_DIR to a real directory (not through a link), or remove the link"
                .to_string(),
        ));
    }
    if !meta.is_dir() {
        return Err((
            format!("{shown} is not a directory"),
            "remove it or choose another path".to_string(),
        ));
    }
    if meta.uid() != me {
        return Err((
            format!(
                "{shown} belongs to uid {}, not to this server's uid {me}: whoever made it could read or replace the saved files",
                meta.uid()
            ),
            format!("remove it (it may have been planted) and let the server create it, or chown {me} it after checking its content"),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err((
            format!(
                "{shown} is writable by group or others (mode {:04o})",
                meta.mode() & 0o7777
            ),
            format!("chmod 700 {shown} after checking its content"),
        ));
    }
    Ok(())
}

/// Saved run and session directories, kept within the configured age and total size.
pub struct Retention {
    root: PathBuf,
    max_age: Duration,
    max_bytes: u64,
    /// Run/session directories being saved into now, with how many saves.
    saving: Mutex<HashMap<String, usize>>,
    wake: tokio::sync::Notify,
}

/// Marks a directory as being saved into until dropped: no sweep removes it meanwhile.
pub struct Saving<'a> {
    retention: &'a Retention,
    run_dir: String,
}

impl Drop for Saving<'_> {
    fn drop(&mut self) {
        let mut saving = self.retention.lock();
        if let Some(count) = saving.get_mut(&self.run_dir) {
            *count -= 1;
            if *count == 0 {
                saving.remove(&self.run_dir);
            }
        }
    }
}

/// What one sweep found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Directories removed, oldest first.
    pub removed: Vec<String>,
    pub freed_bytes: u64,
    /// The total left.
    pub total_bytes: u64,
}

struct Measured {
    name: String,
    bytes: u64,
    newest: SystemTime,
}

impl Retention {
    /// `None` when files are not saved.
    pub fn new(policy: &FilePolicy) -> Option<Arc<Retention>> {
        let root = policy.persist_dir.clone()?;
        Some(Arc::new(Retention {
            root,
            max_age: policy.max_age,
            max_bytes: policy.max_saved_bytes,
            saving: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.saving.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a save into `run_dir`; hold the guard while writing.
    pub fn saving(&self, run_dir: &str) -> Saving<'_> {
        *self.lock().entry(run_dir.to_string()).or_insert(0) += 1;
        Saving {
            retention: self,
            run_dir: run_dir.to_string(),
        }
    }

    /// Asks for a sweep soon (after a save).
    pub fn saved(&self) {
        self.wake.notify_one();
    }

    /// Sweeps in the background: now, when asked, and hourly. Abort the handle to stop.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        this.wake.notify_one();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = this.wake.notified() => {}
                    _ = tokio::time::sleep(PERIODIC) => {}
                }
                let started = Instant::now();
                let sweeper = this.clone();
                match tokio::task::spawn_blocking(move || sweeper.sweep(SystemTime::now())).await {
                    Ok(Ok(swept)) if !swept.removed.is_empty() => tracing::info!(
                        removed = swept.removed.len(),
                        freed_bytes = swept.freed_bytes,
                        total_bytes = swept.total_bytes,
                        "saved files removed: older than {} or beyond {} bytes in total, oldest first",
                        humantime::format_duration(this.max_age),
                        this.max_bytes
                    ),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(
                        dir = %this.root.display(),
                        "could not sweep the saved files: {e}"
                    ),
                    Err(e) => tracing::warn!("the sweep of saved files failed: {e}"),
                }
                // Rate limit: saves meanwhile leave one wake-up, served after the pause.
                tokio::time::sleep((started.elapsed() * 10).max(MIN_PAUSE)).await;
            }
        })
    }

    /// One pass: removes expired directories, then the oldest while the total is over the limit.
    /// Runs in an owner's directory ([`owner_dir_name`]) count like the others.
    pub fn sweep(&self, now: SystemTime) -> io::Result<Swept> {
        let mut found = Vec::new();
        self.measure_runs(&self.root, None, &mut found)?;
        found.sort_by(|a, b| a.newest.cmp(&b.newest).then_with(|| a.name.cmp(&b.name)));
        let mut swept = Swept {
            total_bytes: found.iter().map(|m| m.bytes).sum(),
            ..Swept::default()
        };
        for dir in found {
            let expired = now
                .duration_since(dir.newest)
                .is_ok_and(|age| age > self.max_age);
            if !expired && swept.total_bytes <= self.max_bytes {
                continue;
            }
            if self.remove(&dir.name) {
                swept.total_bytes -= dir.bytes;
                swept.freed_bytes += dir.bytes;
                swept.removed.push(dir.name);
            }
        }
        Ok(swept)
    }

    /// The run and session directories in `dir` (the root, or the owner's directory `owner` in
    /// it), named relative to the root; trash left by an interrupted removal is removed.
    fn measure_runs(
        &self,
        dir: &Path,
        owner: Option<&str>,
        found: &mut Vec<Measured>,
    ) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let Ok(entry) = entry else { continue };
            // The entry's own type: a link is never followed.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if !kind.is_dir() {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if name.starts_with(TRASH_PREFIX) && owner.is_none() {
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    tracing::warn!("could not remove {}: {e}", entry.path().display());
                }
                continue;
            }
            if owner.is_none() && name.starts_with(OWNER_PREFIX) {
                if let Err(e) = self.measure_runs(&entry.path(), Some(&name), found) {
                    tracing::warn!("could not sweep {}: {e}", entry.path().display());
                }
                continue;
            }
            if !(name.starts_with("run-") || name.starts_with("session-")) {
                continue;
            }
            let (bytes, newest) = measure(&entry.path());
            found.push(Measured {
                name: match owner {
                    Some(owner) => format!("{owner}/{name}"),
                    None => name,
                },
                bytes,
                newest,
            });
        }
        Ok(())
    }

    /// Removes one run/session directory unless a save into it is under way.
    fn remove(&self, name: &str) -> bool {
        let trash = self.root.join(format!(
            "{TRASH_PREFIX}{}-{}",
            name.replace('/', "-"),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        {
            let saving = self.lock();
            if saving.contains_key(name) {
                return false;
            }
            // Renamed under the lock: a save registering next writes into a fresh directory.
            if let Err(e) = fs::rename(self.root.join(name), &trash) {
                tracing::warn!("could not remove saved files {name}: {e}");
                return false;
            }
        }
        // remove_dir_all does not follow links (it deletes them).
        if let Err(e) = fs::remove_dir_all(&trash) {
            tracing::warn!("could not finish removing {}: {e}", trash.display());
        }
        true
    }
}

/// Bytes below `dir` and the newest modification time of it and anything in it; links are
/// counted as themselves, never followed.
fn measure(dir: &Path) -> (u64, SystemTime) {
    let mut bytes = 0u64;
    let mut newest = fs::symlink_metadata(dir)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            // DirEntry::metadata does not traverse links on Unix.
            let Ok(meta) = entry.metadata() else { continue };
            if let Ok(modified) = meta.modified() {
                newest = newest.max(modified);
            }
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                bytes = bytes.saturating_add(meta.len());
            }
        }
    }
    (bytes, newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pcs-files-dir-test-{}",
            uuid::Uuid::new_v4().simple()
        ));
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    fn retention(root: &Path, max_age: Duration, max_bytes: u64) -> Retention {
        Retention {
            root: root.to_path_buf(),
            max_age,
            max_bytes,
            saving: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn write(path: &Path, bytes: usize) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, vec![b'x'; bytes]).unwrap();
    }

    fn set_age(path: &Path, age: Duration) {
        let when = SystemTime::now() - age;
        let file = fs::File::options().read(true).open(path).unwrap();
        file.set_modified(when).unwrap();
    }

    fn aged(dir: &Path, age: Duration) {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                aged(&entry.path(), age);
            }
            set_age(&entry.path(), age);
        }
        set_age(dir, age);
    }

    #[test]
    fn runs_in_an_owners_directory_are_swept_like_the_others() {
        let root = scratch();
        let owner = owner_dir_name("alice");
        assert_eq!(owner, "principal-alice");
        write(&root.join(&owner).join("run-old/a.txt"), 10);
        aged(
            &root.join(&owner).join("run-old"),
            Duration::from_secs(7200),
        );
        write(&root.join(&owner).join("session-new/b.txt"), 10);
        write(&root.join("run-top/c.txt"), 10);
        let swept = retention(&root, Duration::from_secs(3600), u64::MAX)
            .sweep(SystemTime::now())
            .unwrap();
        assert_eq!(swept.removed, vec![format!("{owner}/run-old")]);
        assert!(!root.join(&owner).join("run-old").exists());
        assert!(root.join(&owner).join("session-new/b.txt").exists());
        assert!(root.join("run-top/c.txt").exists());
        // Over the size limit the oldest go first, wherever they are.
        let swept = retention(&root, Duration::from_secs(3600), 10)
            .sweep(SystemTime::now())
            .unwrap();
        assert_eq!(swept.removed.len(), 1, "{:?}", swept.removed);
        // No trash is left in an owner's directory.
        let left: Vec<_> = fs::read_dir(root.join(&owner))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            left.iter()
                .all(|n| !n.to_string_lossy().starts_with(TRASH_PREFIX)),
            "{left:?}"
        );
        assert_ne!(
            owner_dir_name("oauth:x/../y"),
            owner_dir_name("oauth:x/../z")
        );
        assert!(owner_dir_name("oauth:x/../y").starts_with("principal-~"));
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_missing_directory_is_created_private_with_its_parents() {
        let base = scratch();
        let dir = base.join("state/python-code-sandbox/files");
        prepare(&dir, "SANDBOX_FILES_DIR", "save no files").unwrap();
        for path in [
            base.join("state"),
            base.join("state/python-code-sandbox"),
            dir.clone(),
        ] {
            let mode = fs::metadata(&path).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
        // An existing good directory is accepted as it is.
        prepare(&dir, "SANDBOX_FILES_DIR", "save no files").unwrap();
        fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_symlink_a_file_and_a_shared_directory_are_refused() {
        let base = scratch();
        let real = base.join("real");
        fs::create_dir(&real).unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
        let link = base.join("link");
        symlink(&real, &link).unwrap();
        let e = prepare(&link, "SANDBOX_FILES_DIR", "save no files").unwrap_err();
        assert!(e.reason.contains("symbolic link"), "{e}");
        assert!(e.to_string().contains("SANDBOX_FILES_DIR="), "{e}");

        let file = base.join("file");
        fs::write(&file, "x").unwrap();
        assert!(prepare(&file, "SANDBOX_FILES_DIR", "save no files")
            .unwrap_err()
            .reason
            .contains("not a directory"));

        let shared = base.join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&shared, "SANDBOX_FILES_DIR", "save no files").unwrap_err();
        assert!(e.reason.contains("writable by group or others"), "{e}");
        assert!(e.fix.contains("chmod 700"), "{e}");

        // Below an everyone-writable directory without the sticky bit: refused, nothing created.
        let e = prepare(
            &shared.join("files/deeper"),
            "SANDBOX_FILES_DIR",
            "save no files",
        )
        .unwrap_err();
        assert!(e.reason.contains("without the sticky bit"), "{e}");
        assert!(!shared.join("files").exists());
        fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        let base = scratch();
        let planted = base.join("planted");
        fs::create_dir(&planted).unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o700)).unwrap();
        // Only root can give a directory away; as another user the check is the uid comparison.
        if std::os::unix::fs::chown(&planted, Some(4242), Some(4242)).is_err() {
            eprintln!("skipped: chown needs root");
            fs::remove_dir_all(base).unwrap();
            return;
        }
        let e = prepare(&planted, "SANDBOX_FILES_DIR", "save no files").unwrap_err();
        assert!(e.reason.contains("belongs to uid 4242"), "{e}");
        // And a directory below it: the other user could rename it away.
        let e = prepare(&planted.join("files"), "SANDBOX_FILES_DIR", "save no files").unwrap_err();
        assert!(e.reason.contains("belongs to uid 4242"), "{e}");
        assert!(
            !planted.join("files").exists(),
            "created in their directory"
        );
        fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn retention_removes_expired_then_oldest_until_the_total_fits() {
        let root = scratch();
        let day = Duration::from_secs(24 * 60 * 60);
        write(&root.join("run-old/a.txt"), 10);
        aged(&root.join("run-old"), 30 * day);
        write(&root.join("run-older-but-not-expired/a.txt"), 100);
        aged(&root.join("run-older-but-not-expired"), 3 * day);
        write(&root.join("session-middle/sub/b.txt"), 100);
        aged(&root.join("session-middle"), 2 * day);
        write(&root.join("run-new/c.txt"), 100);
        // Not ours: never touched, never counted.
        write(&root.join("notes/keep.txt"), 1000);
        aged(&root.join("notes"), 30 * day);
        write(&root.join("loose.txt"), 1000);

        let swept = retention(&root, 7 * day, 250)
            .sweep(SystemTime::now())
            .unwrap();
        assert_eq!(swept.removed, ["run-old", "run-older-but-not-expired"]);
        assert_eq!(swept.total_bytes, 200);
        assert_eq!(swept.freed_bytes, 110);
        assert!(root.join("session-middle/sub/b.txt").exists());
        assert!(root.join("run-new/c.txt").exists());
        assert!(root.join("notes/keep.txt").exists() && root.join("loose.txt").exists());
        // Nothing left behind by the removal itself.
        let names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(TRASH_PREFIX)),
            "{names:?}"
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn retention_never_follows_links() {
        let root = scratch();
        let outside = scratch();
        write(&outside.join("precious.txt"), 5000);
        write(&root.join("run-a/x.txt"), 10);
        symlink(&outside, root.join("run-a/link")).unwrap();
        symlink(outside.join("precious.txt"), root.join("run-a/file-link")).unwrap();
        // A link at the top named like a run: not a directory of ours.
        symlink(&outside, root.join("run-link")).unwrap();

        let swept = retention(&root, Duration::from_secs(3600), 1)
            .sweep(SystemTime::now())
            .unwrap();
        assert_eq!(swept.removed, ["run-a"]);
        // The links were counted as themselves (a few bytes), not as the 5000-byte target.
        assert!(swept.freed_bytes < 1000, "{swept:?}");
        assert!(outside.join("precious.txt").exists());
        assert_eq!(
            fs::metadata(outside.join("precious.txt")).unwrap().len(),
            5000
        );
        assert!(fs::symlink_metadata(root.join("run-link")).is_ok());
        fs::remove_dir_all(root).unwrap();
        fs::remove_dir_all(outside).unwrap();
    }

    #[test]
    fn retention_spares_a_directory_being_saved_into() {
        let root = scratch();
        write(&root.join("session-live/x.txt"), 100);
        write(&root.join("run-done/x.txt"), 100);
        let retention = retention(&root, Duration::from_secs(3600), 1);
        {
            let _saving = retention.saving("session-live");
            let swept = retention.sweep(SystemTime::now()).unwrap();
            assert_eq!(swept.removed, ["run-done"]);
            assert!(root.join("session-live/x.txt").exists());
        }
        let swept = retention.sweep(SystemTime::now()).unwrap();
        assert_eq!(swept.removed, ["session-live"]);
        assert!(retention.lock().is_empty());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn leftovers_of_an_interrupted_removal_are_cleared() {
        let root = scratch();
        write(&root.join(".trash-run-x-12345678/deep/y.txt"), 10);
        retention(&root, Duration::from_secs(3600), 1 << 30)
            .sweep(SystemTime::now())
            .unwrap();
        assert!(!root.join(".trash-run-x-12345678").exists());
        fs::remove_dir_all(root).unwrap();
    }
}
