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

/// The distributions' usual system CA bundles, in the order they are tried (Debian and Ubuntu,
/// Fedora and RHEL, openSUSE, RHEL 7's extracted store, Alpine).
pub const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A CA bundle the host can hand over: a non-empty regular file (through links: the host's own
/// configuration, as `SSL_CERT_FILE` and `/etc/ssl/cert.pem` often are).
pub(super) fn usable_bundle(path: &std::path::Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0)
}

/// The host's CA bundle and how it was found: `SSL_CERT_FILE` when it is an absolute path that
/// is `usable`, else the first usable of [`SYSTEM_CA_BUNDLES`].
pub(super) fn host_ca_bundle(
    ssl_cert_file: Option<String>,
    usable: impl Fn(&std::path::Path) -> bool,
) -> Option<(PathBuf, &'static str)> {
    let from_env = ssl_cert_file
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && usable(p));
    if let Some(path) = from_env {
        return Some((path, "SSL_CERT_FILE"));
    }
    SYSTEM_CA_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| usable(p))
        .map(|p| (p, "the system bundle"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_cert_file_wins_when_usable_else_the_first_usable_system_bundle() {
        let all = |_: &std::path::Path| true;
        assert_eq!(
            host_ca_bundle(Some("/opt/corp/ca.pem".into()), all),
            Some((PathBuf::from("/opt/corp/ca.pem"), "SSL_CERT_FILE"))
        );
        // Relative or unusable: the system's.
        for given in [Some("ca.pem".to_string()), None] {
            assert_eq!(
                host_ca_bundle(given, all),
                Some((PathBuf::from(SYSTEM_CA_BUNDLES[0]), "the system bundle"))
            );
        }
        let fedora = |p: &std::path::Path| p == std::path::Path::new(SYSTEM_CA_BUNDLES[1]);
        assert_eq!(
            host_ca_bundle(Some("/missing.pem".into()), fedora),
            Some((PathBuf::from(SYSTEM_CA_BUNDLES[1]), "the system bundle"))
        );
        assert_eq!(host_ca_bundle(None, |_| false), None);
    }
}
