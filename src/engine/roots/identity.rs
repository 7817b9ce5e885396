//! What the host holds of a directory it judged, and how it knows later that a path, or a mount
//! in a sandbox, is still that directory.
//!
//! Judging resolves a path once; the engine is handed the path and resolves it again when it
//! starts the container, later. Between the two, code that can write where the path leads could
//! put a link in its place (a root nested in a writable one, a `.git` inside a writable root).
//! So the host opens the resolved path itself, component by component, never following a link
//! (`O_PATH | O_NOFOLLOW`), and keeps the handle ([`Handle`]):
//! - before each container create the walk is made again ([`Handle::still_at`]) and must reach
//!   the same directory;
//! - once the container has started, before any code runs, the host reads the container's
//!   mount table (`super::container`), which must show this directory at each mount point
//!   ([`Handle::is_mounted_at`]);
//! - a file the code wrote in a writable root is named on the host only once a walk from the
//!   handle, never following a link, finds it there, and loses the set-id and world-write bits
//!   the code gave it ([`Handle::tidy`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::Arc;

/// A directory the host judged: its handle, opened without following a link, and its identity.
#[derive(Debug, Clone)]
pub struct Handle {
    fd: Arc<OwnedFd>,
    dev: u64,
    ino: u64,
    /// A regular file may be what it holds, not only a directory.
    any: bool,
    /// Its permission bits when it was opened.
    mode: u32,
    /// Whether its default ACL let everyone write what is made in it, when it was opened.
    acl_other_write: bool,
}

impl PartialEq for Handle {
    fn eq(&self, other: &Handle) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

impl Eq for Handle {}

/// `openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC | extra)`.
fn open_at(dir: RawFd, name: &std::ffi::OsStr, extra: libc::c_int) -> io::Result<OwnedFd> {
    let name =
        CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `name` is a valid C string; openat has no other precondition.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC | extra,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat` of an open descriptor.
fn stat_of(fd: &OwnedFd) -> io::Result<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `stat` is a writable buffer of the right type; the descriptor is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(unsafe { stat.assume_init() })
}

/// The directory (or, `any`, the directory or regular file) at `path` (absolute), reached from
/// `/` one component at a time without following a link: a link anywhere on the way fails.
fn open_no_follow(path: &Path, any: bool) -> io::Result<OwnedFd> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => names.push(name),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
    let mut at = open_at(libc::AT_FDCWD, std::ffi::OsStr::new("/"), libc::O_DIRECTORY)?;
    let last = names.len();
    for (i, name) in names.into_iter().enumerate() {
        let flags = if any && i + 1 == last {
            0
        } else {
            libc::O_DIRECTORY
        };
        at = open_at(at.as_raw_fd(), name, flags)?;
    }
    let kind = stat_of(&at)?.st_mode & libc::S_IFMT;
    if kind != libc::S_IFDIR && !(any && kind == libc::S_IFREG) {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    Ok(at)
}

impl Handle {
    /// Opens the directory `path` names (absolute, resolved) without following a link.
    pub fn open(path: &Path) -> io::Result<Handle> {
        Self::open_as(path, false)
    }

    /// Opens the directory or regular file `path` names, without following a link.
    pub fn open_dir_or_file(path: &Path) -> io::Result<Handle> {
        Self::open_as(path, true)
    }

    fn open_as(path: &Path, any: bool) -> io::Result<Handle> {
        let fd = open_no_follow(path, any)?;
        let stat = stat_of(&fd)?;
        let acl_other_write = default_acl_other_write(&fd).is_some();
        Ok(Handle {
            fd: Arc::new(fd),
            dev: stat.st_dev,
            ino: stat.st_ino,
            any,
            mode: stat.st_mode & 0o7777,
            acl_other_write,
        })
    }

    /// Whether `path` still leads, without a link, to what this handle holds.
    pub fn still_at(&self, path: &Path) -> bool {
        open_no_follow(path, self.any)
            .and_then(|fd| stat_of(&fd))
            .is_ok_and(|stat| (stat.st_dev, stat.st_ino) == (self.dev, self.ino))
    }

    /// Whether the mount at `mount_point` in the mount table of `holder` (a process in a started
    /// container's mount namespace, see [`super::container`]) shows this directory.
    pub fn is_mounted_at(&self, holder: u32, mount_point: &str) -> Result<(), String> {
        let ours = super::container::source_of(self.fd.as_raw_fd())?;
        let theirs = super::container::mounted_at(holder, mount_point)?;
        if ours == theirs {
            return Ok(());
        }
        Err(format!(
            "another directory is mounted there ({} {} instead of {} {})",
            theirs.device,
            crate::text::one_line(&String::from_utf8_lossy(&theirs.root), 300),
            ours.device,
            crate::text::one_line(&String::from_utf8_lossy(&ours.root), 300),
        ))
    }

    /// The entry at `relative` (a path the code reported, under this directory), reached on
    /// the host without following a link, with its status; `None` when nothing is there, a link
    /// is on the way, or the path is not a plain relative one.
    fn open_below(&self, relative: &Path) -> Option<(OwnedFd, libc::stat)> {
        let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
        for component in relative.components() {
            match component {
                Component::Normal(name) => parts.push(name),
                _ => return None,
            }
        }
        let (last, dirs) = parts.split_last()?;
        let mut dir: Option<OwnedFd> = None;
        for name in dirs {
            let at = dir.as_ref().map_or(self.fd.as_raw_fd(), |d| d.as_raw_fd());
            dir = Some(open_at(at, name, libc::O_DIRECTORY).ok()?);
        }
        let at = dir.as_ref().map_or(self.fd.as_raw_fd(), |d| d.as_raw_fd());
        let fd = open_at(at, last, 0).ok()?;
        let stat = stat_of(&fd).ok()?;
        Some((fd, stat))
    }

    /// The set-uid, set-gid and world-write bits this directory has now and had not when it
    /// was judged are removed (code running in it may change its mode), and so is the write its
    /// default ACL gives everyone when it did not then; returns the bits, and whether the ACL's
    /// write was removed.
    pub fn tidy_itself(&self) -> (u32, bool) {
        let acl = !self.acl_other_write && strip_default_acl_other_write(&self.fd);
        let Ok(stat) = stat_of(&self.fd) else {
            return (0, acl);
        };
        let mode = stat.st_mode & 0o7777;
        let unwanted = mode & (libc::S_ISUID | libc::S_ISGID | libc::S_IWOTH) & !self.mode;
        if unwanted == 0 {
            return (0, acl);
        }
        match chmod_through(&self.fd, mode & !unwanted) {
            Ok(()) => (unwanted, acl),
            Err(e) => {
                tracing::warn!("could not remove the bits {unwanted:o} from a root: {e}");
                (0, acl)
            }
        }
    }

    /// What the host finds of an entry the code created or changed in this writable root
    /// (`relative`, as the code reported it), walking from the handle without following a
    /// link; the set-uid, set-gid and world-write bits it finds on a file or directory there
    /// are removed (the code's work: the user's own entries are never reported). `None` when
    /// no file or directory is there.
    pub fn tidy(&self, relative: &Path) -> Option<Found> {
        let (fd, stat) = self.open_below(relative)?;
        let kind = stat.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFDIR {
            return None;
        }
        let mode = stat.st_mode & 0o7777;
        let unwanted = mode & (libc::S_ISUID | libc::S_ISGID | libc::S_IWOTH);
        let mut stripped = 0;
        if unwanted != 0 {
            match chmod_through(&fd, mode & !unwanted) {
                Ok(()) => stripped = unwanted,
                Err(e) => tracing::warn!(
                    "could not remove the bits {unwanted:o} from an entry the code made in a root: {e}"
                ),
            }
        }
        let acl_removed = kind == libc::S_IFDIR && strip_default_acl_other_write(&fd);
        Some(Found {
            file: kind == libc::S_IFREG,
            executable: kind == libc::S_IFREG && mode & 0o111 != 0,
            stripped,
            acl_removed,
        })
    }
}

/// A directory's default ACL: what its new entries' access ACLs start from (the mode shows
/// nothing of it; its `other` entry is what everyone may do with a file the user makes there
/// later, whatever their umask).
const DEFAULT_ACL: &std::ffi::CStr = c"system.posix_acl_default";
/// The tag of an ACL's `other` entry, and the write permission (linux/posix_acl_xattr.h).
const ACL_OTHER: u16 = 0x20;
const ACL_WRITE: u16 = 0x02;

/// The default ACL of what `fd` holds (through its `/proc/self/fd` entry), when it has one that
/// lets everyone write; the ACL's bytes with that write removed.
fn default_acl_other_write(fd: &OwnedFd) -> Option<Vec<u8>> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let mut value = vec![0u8; 4 + 8 * 64];
    // SAFETY: valid C strings and a writable buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            DEFAULT_ACL.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    value.truncate(n);
    // A version 2 header, then entries of (tag u16, permissions u16, id u32), little-endian.
    if n < 4 || (n - 4) % 8 != 0 || value[..4] != 2u32.to_le_bytes() {
        return None;
    }
    let mut granted = false;
    for entry in value[4..].chunks_exact_mut(8) {
        let tag = u16::from_le_bytes([entry[0], entry[1]]);
        let perm = u16::from_le_bytes([entry[2], entry[3]]);
        if tag == ACL_OTHER && perm & ACL_WRITE != 0 {
            entry[2..4].copy_from_slice(&(perm & !ACL_WRITE).to_le_bytes());
            granted = true;
        }
    }
    granted.then_some(value)
}

/// Removes the write a default ACL gives everyone on what `fd` holds; whether there was one.
fn strip_default_acl_other_write(fd: &OwnedFd) -> bool {
    let Some(value) = default_acl_other_write(fd) else {
        return false;
    };
    let Ok(path) = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return false;
    };
    // SAFETY: valid C strings and a buffer of the length given.
    let done = unsafe {
        libc::setxattr(
            path.as_ptr(),
            DEFAULT_ACL.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    } == 0;
    if !done {
        tracing::warn!(
            "could not remove the write everyone had through a default ACL the code set in a \
             root: {}",
            io::Error::last_os_error()
        );
    }
    done
}

/// `chmod` of what `fd` (an `O_PATH` handle) holds, through its `/proc/self/fd` entry: the entry
/// itself, whatever its path leads to now.
fn chmod_through(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string; chmod has no other precondition.
    if unsafe { libc::chmod(path.as_ptr(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What the host found of an entry the code changed in a writable root ([`Handle::tidy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// A regular file (else a directory).
    pub file: bool,
    /// A file anyone may execute.
    pub executable: bool,
    /// The set-uid, set-gid and world-write bits removed from it.
    pub stripped: u32,
    /// Whether the write its default ACL gave everyone was removed.
    pub acl_removed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree of its own, removed at the end.
    struct Tree(std::path::PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree() -> (Tree, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("pcs-identity-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let root = std::fs::canonicalize(&dir).unwrap();
        let dir = Tree(dir);
        std::fs::create_dir_all(root.join("proj/sub")).unwrap();
        std::fs::create_dir_all(root.join("secret")).unwrap();
        std::fs::write(root.join("proj/sub/f.txt"), "x").unwrap();
        (dir, root)
    }

    #[test]
    fn a_link_on_the_way_is_never_followed() {
        let (_dir, root) = tree();
        let handle = Handle::open(&root.join("proj/sub")).unwrap();
        assert!(handle.still_at(&root.join("proj/sub")));
        // Replaced by a link to another directory: the walk refuses the link.
        std::fs::rename(root.join("proj/sub"), root.join("proj/moved")).unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("proj/sub")).unwrap();
        assert!(!handle.still_at(&root.join("proj/sub")));
        assert!(Handle::open(&root.join("proj/sub")).is_err());
        // A link higher up is refused too, even to the same directory.
        std::os::unix::fs::symlink(root.join("proj"), root.join("alias")).unwrap();
        assert!(!handle.still_at(&root.join("alias/moved")));
        assert!(handle.still_at(&root.join("proj/moved")));
    }

    #[test]
    fn an_entry_is_found_only_where_it_is_without_a_link_and_loses_unwanted_bits() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, root) = tree();
        let handle = Handle::open(&root.join("proj")).unwrap();
        let found = handle.tidy(Path::new("sub/f.txt")).unwrap();
        assert!(found.file && !found.executable && found.stripped == 0);
        assert!(!handle.tidy(Path::new("sub")).unwrap().file);
        assert!(handle.tidy(Path::new("sub/missing")).is_none());
        assert!(handle.tidy(Path::new("../proj/sub/f.txt")).is_none());
        assert!(handle.tidy(Path::new("/etc/passwd")).is_none());
        std::fs::write(root.join("secret/key"), "k").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("proj/link")).unwrap();
        std::os::unix::fs::symlink(root.join("secret/key"), root.join("proj/key")).unwrap();
        assert!(handle.tidy(Path::new("link/key")).is_none());
        assert!(handle.tidy(Path::new("key")).is_none());
        // A set-id, world-writable program and a world-writable set-gid directory: the bits go.
        let tool = root.join("proj/tool");
        std::fs::write(&tool, "#!/bin/sh").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o6777)).unwrap();
        let found = handle.tidy(Path::new("tool")).unwrap();
        assert!(found.executable);
        assert_eq!(found.stripped, 0o6002);
        let mode = std::fs::metadata(&tool).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o775);
        let shared = root.join("proj/shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o2777)).unwrap();
        let found = handle.tidy(Path::new("shared")).unwrap();
        assert_eq!(found.stripped, 0o2002);
        let mode = std::fs::metadata(&shared).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o775);
        // The root itself loses only the bits it had not when it was judged.
        let proj = root.join("proj");
        std::fs::set_permissions(&proj, std::fs::Permissions::from_mode(0o757)).unwrap();
        let handle = Handle::open(&proj).unwrap();
        assert_eq!(handle.tidy_itself(), (0, false));
        std::fs::set_permissions(&proj, std::fs::Permissions::from_mode(0o2777)).unwrap();
        assert_eq!(handle.tidy_itself(), (0o2000, false));
        let mode = std::fs::metadata(&proj).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o777);
        // A default ACL that lets everyone write what is made there: that write goes, from a
        // directory the code made and from the root (which had none when it was judged).
        let acl: Vec<u8> = [2u32.to_le_bytes().to_vec()]
            .into_iter()
            .chain([0x01u16, 0x04, 0x20].map(|tag| {
                [tag.to_le_bytes(), 7u16.to_le_bytes()]
                    .concat()
                    .into_iter()
                    .chain(u32::MAX.to_le_bytes())
                    .collect()
            }))
            .flatten()
            .collect();
        let set = |path: &Path| {
            let path = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: valid C strings and a buffer of the length given.
            let rc = unsafe {
                libc::setxattr(
                    path.as_ptr(),
                    DEFAULT_ACL.as_ptr(),
                    acl.as_ptr().cast(),
                    acl.len(),
                    0,
                )
            };
            rc == 0
        };
        if set(&shared) && set(&proj) {
            assert!(handle.tidy(Path::new("shared")).unwrap().acl_removed);
            assert_eq!(handle.tidy_itself(), (0, true));
            let fd = open_no_follow(&shared, false).unwrap();
            assert!(default_acl_other_write(&fd).is_none());
            assert!(!handle.tidy(Path::new("shared")).unwrap().acl_removed);
        }
    }
}
