//! Where the server keeps its state when no setting says: per-user directories under the XDG
//! base directories (`XDG_CACHE_HOME`, `XDG_STATE_HOME`, else `HOME`). These variables are the
//! user's environment, not settings of this program: they only place the defaults of
//! `SANDBOX_CACHE_DIR`, `SANDBOX_FILES_DIR` and `SANDBOX_SNAPSHOT_DIR`, and `SANDBOX_ROOTS_ALLOW`
//! (`HOME`), whose documented defaults name them.

use std::path::PathBuf;

/// `$XDG_CACHE_HOME/python-code-sandbox`, else `~/.cache/python-code-sandbox`, else the temp dir.
pub(super) fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("python-code-sandbox")
}

/// Where files are saved by default: private to the user, never under a fixed name in the shared
/// temp dir. `$XDG_STATE_HOME/python-code-sandbox/files`, else
/// `~/.local/state/python-code-sandbox/files`, else (no home) a temp-dir directory named with the
/// uid, which start-up refuses if someone else made it.
pub(super) fn default_files_dir() -> PathBuf {
    default_state_dir("files")
}

/// A private state directory named `name`, placed as [`default_files_dir`] describes.
pub(super) fn default_state_dir(name: &str) -> PathBuf {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local").join("state"))
        });
    match state {
        Some(state) => state.join("python-code-sandbox").join(name),
        None => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            std::env::temp_dir()
                .join(format!("python-code-sandbox-{uid}"))
                .join(name)
        }
    }
}

/// MCP roots off, allowed under `$HOME` once turned on.
pub(super) fn default_roots() -> super::RootsPolicy {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    super::RootsPolicy::from_home(home.as_deref())
}
