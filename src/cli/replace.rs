//! Replacing a file someone else reads (a client's configuration, the engine's `daemon.json`):
//! written in full beside it and renamed over it, so no reader ever sees half a file.
//!
//! The temporary file has an unpredictable name and is created exclusively (`O_EXCL`, mode 0600),
//! so a link planted beside the file under a guessable name is never written through. A file
//! that is itself a symlink (a dotfiles checkout) is written where the link points, on purpose,
//! and the link stays a link.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why a file could not be replaced, naming the path that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    #[error("cannot follow the link {}: {source}", path.display())]
    Link {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create {}: {source}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot replace {}: {source}", path.display())]
    Rename {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where writing `file` really writes: the file itself, or the end of its chain of symlinks
/// (relative links resolved against the link's directory; a dangling one names a new file).
pub fn target_of(file: &Path) -> Result<PathBuf, ReplaceError> {
    let mut current = file.to_path_buf();
    // As many hops as the kernel allows before ELOOP.
    for _ in 0..40 {
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = fs::read_link(&current).map_err(|source| ReplaceError::Link {
                    path: current.clone(),
                    source,
                })?;
                current = match current.parent() {
                    Some(parent) if link.is_relative() => parent.join(link),
                    _ => link,
                };
            }
            _ => return Ok(current),
        }
    }
    Err(ReplaceError::Link {
        path: file.to_path_buf(),
        source: io::Error::other("too many levels of symbolic links"),
    })
}

/// Writes `bytes` as the new content of `file` (see the module's documentation); the old file's
/// permissions are kept, a new file gets `mode`. Returns the path written.
pub fn replace(file: &Path, bytes: &[u8], mode: u32) -> Result<PathBuf, ReplaceError> {
    let target = target_of(file)?;
    let directory = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&directory).map_err(|source| ReplaceError::Directory {
        path: directory.clone(),
        source,
    })?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let temporary = directory.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = write_new(&temporary, bytes, &target, mode);
    if let Err(source) = written {
        let _ = fs::remove_file(&temporary);
        return Err(ReplaceError::Write {
            path: temporary,
            source,
        });
    }
    fs::rename(&temporary, &target).map_err(|source| {
        let _ = fs::remove_file(&temporary);
        ReplaceError::Rename {
            path: target.clone(),
            source,
        }
    })?;
    Ok(target)
}

/// Where a backup of `file` made at `stamp` (Unix seconds) goes: `FILE.backup-STAMP` beside it.
pub fn backup_path(file: &Path, stamp: u64) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".backup-{stamp}"));
    file.with_file_name(name)
}

/// Keeps `old`, the content `file` had before it is replaced, as `FILE.backup-NOW`: created,
/// never overwritten, so a link planted at that name is not followed. Returns its path; the
/// error names it.
pub fn keep_backup(file: &Path, old: &[u8]) -> Result<PathBuf, (PathBuf, io::Error)> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let backup = backup_path(file, stamp);
    match create_new(&backup, old) {
        Ok(()) => Ok(backup),
        Err(e) => Err((backup, e)),
    }
}

/// Creates `path` with `bytes`, mode 0600, failing if anything (a link too) is already there.
pub fn create_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    out.write_all(bytes)?;
    out.sync_all()
}

fn write_new(temporary: &Path, bytes: &[u8], target: &Path, mode: u32) -> io::Result<()> {
    create_new(temporary, bytes)?;
    let permissions = match fs::metadata(target) {
        Ok(old) => old.permissions(),
        Err(_) => std::os::unix::fs::PermissionsExt::from_mode(mode),
    };
    fs::set_permissions(temporary, permissions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pcs-replace-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    #[test]
    fn a_backup_sits_beside_the_file_and_is_never_written_through_a_link() {
        assert_eq!(
            backup_path(Path::new("/a/b.json"), 7),
            Path::new("/a/b.json.backup-7")
        );
        let dir = scratch();
        let file = dir.join("daemon.json");
        let backup = keep_backup(&file, b"old").expect("backup");
        assert_eq!(backup.parent(), Some(dir.as_path()));
        assert_eq!(fs::read(&backup).expect("read"), b"old");
        // A second one in the same second finds the name taken: refused, not overwritten.
        let (taken, _) = keep_backup(&file, b"newer").expect_err("name taken");
        assert_eq!(taken, backup);
        assert_eq!(fs::read(&backup).expect("read"), b"old");
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_new_file_gets_the_mode_and_an_old_one_keeps_its_permissions() {
        let dir = scratch();
        let file = dir.join("a.json");
        replace(&file, b"one", 0o640).expect("new file");
        assert_eq!(fs::read(&file).expect("read"), b"one");
        let mode = fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).expect("chmod");
        replace(&file, b"two", 0o644).expect("replaced");
        assert_eq!(fs::read(&file).expect("read"), b"two");
        let mode = fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = fs::read_dir(&dir).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_planted_link_at_the_old_temporary_name_is_not_written_through() {
        let dir = scratch();
        let file = dir.join("mcp.json");
        let victim = dir.join("victim");
        fs::write(&victim, b"untouched").expect("victim");
        symlink(&victim, dir.join("mcp.json.setup-tmp")).expect("planted link");
        replace(&file, b"config", 0o600).expect("replaced");
        assert_eq!(fs::read(&victim).expect("read"), b"untouched");
        assert_eq!(fs::read(&file).expect("read"), b"config");
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_symlinked_file_is_written_at_its_target_and_stays_a_link() {
        let dir = scratch();
        fs::create_dir_all(dir.join("dotfiles")).expect("dotfiles");
        let real = dir.join("dotfiles/mcp.json");
        fs::write(&real, b"old").expect("real");
        let link = dir.join("mcp.json");
        symlink("dotfiles/mcp.json", &link).expect("link");
        let written = replace(&link, b"new", 0o600).expect("replaced");
        assert_eq!(written, dir.join("dotfiles/mcp.json"));
        assert!(fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&real).expect("read"), b"new");
        fs::remove_dir_all(&dir).expect("clean up");
    }
}
