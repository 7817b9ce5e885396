//! MCP roots in sandboxes: which of the directories a client declares are mounted, where, and
//! why the others are not.
//!
//! A client lists roots as `file://` URIs (over HTTP, paths of its own machine, named here only
//! through the operator's `SANDBOX_ROOTS_MAP`). Each is resolved on the host, its symlinks
//! followed once, here, and then judged by what it *is*: the whole file system, the home
//! directory or one of its ancestors, a hidden directory of the home (keys, credentials), a
//! system directory, the engine's socket, the server's own state, or a place outside
//! `SANDBOX_ROOTS_ALLOW` are refused, each with its reason. What is accepted is bind-mounted at
//! `/mnt/roots/<name>`: a symlink inside it resolves in the sandbox's own file system, never the
//! host's. Just before a sandbox starts, each root is resolved again and must still be the
//! directory it was ([`RootSet::recheck`]), so a root replaced by a link since it was listed
//! (code writing to another root can do that) mounts nothing.
//!
//! A [`RootSet`] is what one listing came to; a session keeps the mounts it started with and
//! compares them ([`RootSet::key`]) with its client's current ones to know when they are stale.

mod container;
mod guards;
mod identity;

use std::path::{Component, Path, PathBuf};

use crate::config::{OperatorMount, RootMapping, RootsMode, RootsPolicy};

pub use container::mount_holder;
pub use guards::is_protected;
pub use identity::Handle;

/// Where roots appear in a sandbox.
pub const MOUNT_DIR: &str = "/mnt/roots";

/// The environment variable that tells the runner which roots are writable (their names,
/// comma-separated), so it reports what the code changed in them.
pub const WRITABLE_ENV: &str = "PCS_ROOTS_WRITABLE";

/// Why an HTTP client's root that no `SANDBOX_ROOTS_MAP` entry covers is refused.
pub const UNMAPPED: &str = "over HTTP a root is a path of the client's machine, and no \
                            SANDBOX_ROOTS_MAP entry names a directory of this machine for it";

/// The most roots one listing may mount; the rest are refused.
pub const MAX_ROOTS: usize = 32;

/// The longest name of a root's mount point.
const MAX_NAME: usize = 64;

/// What a URI or name from a client is shown as, at most (it is the client's text).
const MAX_SHOWN: usize = 300;

/// Directories of the operating system: never shared, nor anything inside them.
const SYSTEM_DIRS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var",
];

/// One root as the client listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub uri: String,
    pub name: Option<String>,
}

/// A root that is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// The mount point's name: `/mnt/roots/<name>`.
    pub name: String,
    /// The directory on the host, resolved (no symlink in it).
    pub host: PathBuf,
    pub read_only: bool,
    /// The directory as the host judged it, held open (see [`identity`]).
    pub handle: Handle,
    /// In a writable root, the places that make the host run things (`.git`, `.envrc`, ...),
    /// each mounted read-only over itself (see [`guards`]).
    pub guards: Vec<Guard>,
}

/// A place inside a writable root that is mounted over itself: read-only (a place the host runs
/// things from), or writable (a directory holding one, so that it cannot be moved away).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// Its path under the root (no link on the way).
    pub relative: PathBuf,
    pub handle: Handle,
    pub read_only: bool,
}

impl Root {
    /// Where the sandbox sees it.
    pub fn container_path(&self) -> String {
        format!("{MOUNT_DIR}/{}", self.name)
    }

    /// Every mount it makes: (the host's directory, the mount point, read-only, its handle).
    fn each_mount(&self) -> impl Iterator<Item = (PathBuf, String, bool, &Handle)> + '_ {
        let own = std::iter::once((
            self.host.clone(),
            self.container_path(),
            self.read_only,
            &self.handle,
        ));
        own.chain(self.guards.iter().map(|guard| {
            (
                self.host.join(&guard.relative),
                format!("{}/{}", self.container_path(), guard.relative.display()),
                guard.read_only,
                &guard.handle,
            )
        }))
    }
}

/// The roots one sandbox mounts. While it lives, and once it serves code (a prepared sandbox
/// only once it is handed out), the directories it can write are "written by a live sandbox":
/// a root judged then must stay apart from them (see [`Context::writable`]).
#[derive(Debug)]
pub struct Mounted {
    pub set: std::sync::Arc<RootSet>,
}

/// A root that is not mounted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The URI as listed, bounded and with control characters escaped.
    pub uri: String,
    pub reason: String,
}

/// What one listing of a client's roots came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RootSet {
    pub roots: Vec<Root>,
    pub refused: Vec<Refused>,
}

/// Where the server's own things are: never shared, nor what holds them.
#[derive(Debug, Clone, Default)]
pub struct Protected {
    /// The home directory of the server's user.
    pub home: Option<PathBuf>,
    /// The engine's sockets (resolved when they exist).
    pub sockets: Vec<PathBuf>,
    /// The server's state: the files, snapshot and cache directories, each with its setting.
    pub state: Vec<(&'static str, PathBuf)>,
}

impl Protected {
    /// From the configuration and this process's environment: `HOME`, `DOCKER_HOST` and the
    /// engines' usual sockets (Docker's, rootful and rootless Podman's).
    pub fn of(config: &crate::config::Config) -> Protected {
        let mut sockets = vec![
            PathBuf::from("/var/run/docker.sock"),
            PathBuf::from("/run/docker.sock"),
            PathBuf::from("/run/podman/podman.sock"),
        ];
        if let Some(path) = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        {
            sockets.push(path);
        }
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            sockets.push(runtime.join("docker.sock"));
            sockets.push(runtime.join("podman/podman.sock"));
        }
        let mut state = vec![("SANDBOX_CACHE_DIR", config.cache_dir.clone())];
        if let Some(dir) = &config.files.persist_dir {
            state.push(("SANDBOX_FILES_DIR", dir.clone()));
        }
        if let Some(dir) = &config.snapshots.dir {
            state.push(("SANDBOX_SNAPSHOT_DIR", dir.clone()));
        }
        Protected {
            home: std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|h| h.is_absolute()),
            sockets: sockets.into_iter().map(|s| resolved(&s)).collect(),
            state: state.into_iter().map(|(k, p)| (k, resolved(&p))).collect(),
        }
    }
}

/// A path with its symlinks resolved when it exists, else as given.
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A client's text, fit to show and log: one line, bounded ([`crate::text::one_line`]).
pub fn shown(text: &str) -> String {
    crate::text::one_line(text, MAX_SHOWN)
}

/// What a listing is judged against besides the operator's policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context<'a> {
    /// Over HTTP, the mapping through which the client's paths name this machine's directories
    /// (its principal's own, see `config::roots`); `None` over stdio, where they are this
    /// machine's.
    pub map: Option<&'a [RootMapping]>,
    /// Directories code in sandboxes can write: the writable `SANDBOX_MOUNTS` when a listing is
    /// judged, and with them the writable roots of live sandboxes when a sandbox is about to
    /// serve code ([`RootSet::apart_from`]). A root may be one of them, never inside one nor
    /// holding one: code writing there could put a link where the root's path leads.
    pub writable: &'a [PathBuf],
}

impl RootSet {
    /// Resolves a listing with the operator's policy.
    pub fn resolve(
        listed: &[Listed],
        policy: &RootsPolicy,
        protected: &Protected,
        context: Context<'_>,
    ) -> RootSet {
        let mut set = RootSet::default();
        let writable = policy.mode == RootsMode::ReadWrite;
        for item in listed {
            let refuse = |reason: String| Refused {
                uri: shown(&item.uri),
                reason,
            };
            if set.roots.len() >= MAX_ROOTS {
                set.refused.push(refuse(format!(
                    "more than {MAX_ROOTS} roots are listed; only the first {MAX_ROOTS} are mounted"
                )));
                continue;
            }
            let host = match path_of(&item.uri)
                .and_then(|path| mapped(path, context.map))
                .and_then(|(path, base)| {
                    let host = judge(&path, policy, protected)?;
                    inside_mapping(&host, base.as_deref()).map(|()| host)
                })
                .and_then(|host| apart(&host, &set, writable, context.writable).map(|()| host))
            {
                Ok(host) => host,
                Err(reason) => {
                    set.refused.push(refuse(reason));
                    continue;
                }
            };
            if let Some(same) = set.roots.iter().find(|r| r.host == host) {
                set.refused.push(refuse(format!(
                    "the same directory as the root mounted at {}",
                    same.container_path()
                )));
                continue;
            }
            let handle = match Handle::open(&host) {
                Ok(handle) => handle,
                Err(e) => {
                    set.refused.push(refuse(format!(
                        "cannot be opened here without following a link ({e})"
                    )));
                    continue;
                }
            };
            let (read_only, guards) = if writable {
                match guards::inside_protected(&host)
                    .map_or_else(|| guards::find(&host, &handle), Err)
                {
                    Ok(guards) => (false, guards),
                    Err(why) => {
                        set.refused
                            .push(refuse(format!("mounted read-only: {why}")));
                        (true, Vec::new())
                    }
                }
            } else {
                (true, Vec::new())
            };
            let wanted = item
                .name
                .as_deref()
                .filter(|n| !n.trim().is_empty())
                .map(str::to_string)
                .or_else(|| host.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default();
            let name = unique(&safe_name(&wanted), &set.roots);
            set.roots.push(Root {
                name,
                host,
                read_only,
                handle,
                guards,
            });
        }
        set
    }

    /// Whether each of these roots stays apart from `writable` (what other live sandboxes can
    /// write); else why not, naming the root.
    pub fn apart_from(&self, writable: &[PathBuf]) -> Result<(), String> {
        for root in &self.roots {
            if let Err(why) = apart(&root.host, &RootSet::default(), false, writable) {
                return Err(format!(
                    "the root mounted at {}: {why}",
                    root.container_path()
                ));
            }
        }
        Ok(())
    }

    /// The writable directories these roots give sandboxes.
    pub fn writable_dirs(&self) -> impl Iterator<Item = &Path> {
        self.roots
            .iter()
            .filter(|r| !r.read_only)
            .map(|r| r.host.as_path())
    }

    /// What the mounts are, as one string: equal for equal mounts (a session's own against its
    /// client's current ones; a recycled sandbox's against a call's).
    pub fn key(&self) -> String {
        let mut key = String::new();
        for root in &self.roots {
            let mode = if root.read_only { "ro" } else { "rw" };
            key.push_str(&format!("{}\0{}\0{mode}\0", root.name, root.host.display()));
            for guard in &root.guards {
                let mode = if guard.read_only { "ro" } else { "rw" };
                key.push_str(&format!("guard\0{}\0{mode}\0", guard.relative.display()));
            }
        }
        key
    }

    /// A name for these mounts that is fit for a log field: `roots-` and 32 hex digits of
    /// [`RootSet::key`]'s SHA-256 (the key holds host paths and NUL bytes).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.key().as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("roots-{hex}")
    }

    /// [`RootSet::key`] of what a sandbox mounts (`None`: no roots).
    pub fn key_of(roots: Option<&RootSet>) -> String {
        roots.map(RootSet::key).unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The bind mounts a sandbox gets: each root, and each of its guards read-only over itself.
    pub fn mounts(&self) -> Vec<OperatorMount> {
        self.roots
            .iter()
            .flat_map(Root::each_mount)
            .map(|(host, container, read_only, _)| OperatorMount {
                host,
                container,
                read_only,
            })
            .collect()
    }

    /// Whether each mount shows, in the mount table of `holder` (a process in the started
    /// container's mount namespace, see [`mount_holder`]), the directory the host judged; else
    /// why not, naming the mount.
    pub fn verify(&self, holder: u32) -> Result<(), String> {
        for (host, container, _, handle) in self.roots.iter().flat_map(Root::each_mount) {
            if let Err(why) = handle.is_mounted_at(holder, &container) {
                return Err(format!(
                    "the mount at {container} is not the directory that was judged ({}): {why}; \
                     the sandbox was removed before any code ran",
                    host.display()
                ));
            }
        }
        Ok(())
    }

    /// The names of the writable roots, for [`WRITABLE_ENV`] (`None` when all are read-only).
    pub fn writable_names(&self) -> Option<String> {
        let names: Vec<&str> = self
            .roots
            .iter()
            .filter(|r| !r.read_only)
            .map(|r| r.name.as_str())
            .collect();
        (!names.is_empty()).then(|| names.join(","))
    }

    /// Just before each container create: every mount's path must still lead, without a link,
    /// to the directory the host judged, else it is named in the error.
    pub fn recheck(&self) -> Result<(), String> {
        for root in &self.roots {
            for (host, container, _, handle) in root.each_mount() {
                if !handle.still_at(&host) {
                    return Err(format!(
                        "the directory mounted at {container} ({}) is no longer the one it was \
                         when the client listed it (moved, removed, or replaced by a link); the \
                         client's next listing of roots decides again",
                        host.display()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The root mounted under `name`.
    pub fn named(&self, name: &str) -> Option<&Root> {
        self.roots.iter().find(|r| r.name == name)
    }
}

/// The local path of a `file://` URI (no host, or `localhost`), percent-decoded.
fn path_of(uri: &str) -> Result<PathBuf, String> {
    let Some(rest) = uri.strip_prefix("file://") else {
        return Err("not a file:// URI (only directories of a file system can be mounted)".into());
    };
    let path = match rest.strip_prefix("localhost") {
        Some(path) if path.starts_with('/') => path,
        _ if rest.starts_with('/') => rest,
        _ => {
            return Err(
                "a file:// URI naming another host (only this machine's directories can be \
                 mounted)"
                    .into(),
            )
        }
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(path).collect();
    if decoded.contains(&0) {
        return Err("the path holds a NUL byte".into());
    }
    use std::os::unix::ffi::OsStringExt;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(decoded)))
}

/// Over HTTP, the client's path through its mapping, and the directory the mapping names; over
/// stdio, itself.
fn mapped(
    path: PathBuf,
    map: Option<&[RootMapping]>,
) -> Result<(PathBuf, Option<PathBuf>), String> {
    let Some(map) = map else {
        return Ok((path, None));
    };
    for mapping in map {
        if let Ok(rest) = path.strip_prefix(&mapping.client) {
            if rest
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                break;
            }
            return Ok((mapping.host.join(rest), Some(mapping.host.clone())));
        }
    }
    Err(UNMAPPED.into())
}

/// Over HTTP, whether the resolved `host` is still inside the directory its mapping names
/// (`base`): a link there (its principal's to make, by hand or by code in a writable root) is
/// followed when the root is judged, and may lead into another principal's directory.
fn inside_mapping(host: &Path, base: Option<&Path>) -> Result<(), String> {
    let Some(base) = base else {
        return Ok(());
    };
    if within(host, &resolved(base)) {
        return Ok(());
    }
    Err(format!(
        "it leads, through a link, out of the directory its SANDBOX_ROOTS_MAP entry names ({}): \
         over HTTP a root stays inside its principal's own directory",
        base.display()
    ))
}

/// Whether `host` stays apart from what code can write: the writable roots accepted before it
/// in this listing (when `writable`, its own mode) and `elsewhere`. Being one of them is fine
/// (code cannot replace a mount point); being inside one, or holding one, is not: code writing
/// there could put a link where the other's path leads, and the engine would mount what the
/// link names.
fn apart(host: &Path, set: &RootSet, writable: bool, elsewhere: &[PathBuf]) -> Result<(), String> {
    let nested = |other: &Path| other != host && (within(host, other) || within(other, host));
    if writable {
        if let Some(root) = set.roots.iter().find(|r| nested(&r.host)) {
            let how = if within(host, &root.host) {
                "inside"
            } else {
                "holds"
            };
            return Err(format!(
                "{how} the writable root mounted at {} ({}): with SANDBOX_ROOTS=rw roots may \
                 not nest (code writing in one could replace the other with a link); list \
                 either one",
                root.container_path(),
                root.host.display()
            ));
        }
    }
    if elsewhere.iter().any(|other| nested(other)) {
        return Err(
            "inside or holding a directory that another sandbox can write now (a \
                    writable root of a live session, or a writable SANDBOX_MOUNTS entry): code \
                    writing there could replace it with a link"
                .into(),
        );
    }
    Ok(())
}

/// Whether `inner` is `outer` or inside it (component by component).
fn within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// The resolved directory a root path names, or why it may not be shared.
fn judge(path: &Path, policy: &RootsPolicy, protected: &Protected) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err("not an absolute path".into());
    }
    let host = match std::fs::canonicalize(path) {
        Ok(host) => host,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("does not exist on this machine".into())
        }
        Err(e) => return Err(format!("cannot be resolved here ({e})")),
    };
    if !host.is_dir() {
        return Err("not a directory (only directories are mounted)".into());
    }
    // The engine's API names a bind mount's source in UTF-8: another path would reach it
    // changed, naming a directory that is missing or was never judged.
    if host.to_str().is_none() {
        return Err("its path is not UTF-8, which the engine cannot be given".into());
    }
    if host == Path::new("/") {
        return Err("the whole file system (/)".into());
    }
    let allow: Vec<PathBuf> = policy.allow.iter().map(|a| resolved(a)).collect();
    if let Some(system) = SYSTEM_DIRS.iter().map(Path::new).find(|dir| {
        // An allowed directory the operator put inside a system directory is theirs to share.
        within(&host, dir) && !allow.iter().any(|a| within(a, dir) && within(&host, a))
    }) {
        return Err(format!(
            "a system directory ({}), which holds the machine's own files",
            system.display()
        ));
    }
    if let Some(home) = &protected.home {
        let home = resolved(home);
        if within(&home, &host) {
            return Err(if home == host {
                "the home directory itself (share a project directory inside it instead)".into()
            } else {
                format!("holds the home directory ({})", home.display())
            });
        }
        if let Ok(rest) = host.strip_prefix(&home) {
            let top = rest.components().next();
            if let Some(Component::Normal(top)) = top {
                if top.to_string_lossy().starts_with('.') {
                    return Err(format!(
                        "a hidden directory of the home (~/{}): such directories hold keys, \
                         credentials and settings",
                        top.to_string_lossy()
                    ));
                }
            }
        }
    }
    if let Some(socket) = protected.sockets.iter().find(|s| within(s, &host)) {
        return Err(format!(
            "holds the engine's socket ({}), which gives whoever reaches it the machine",
            socket.display()
        ));
    }
    if let Some((setting, dir)) = protected
        .state
        .iter()
        .find(|(_, dir)| within(dir, &host) || within(&host, dir))
    {
        return Err(format!(
            "the server's own state ({setting}, {}) is in it or it is in that",
            dir.display()
        ));
    }
    if !allow.iter().any(|a| within(&host, a) && host != *a) {
        let allowed: Vec<String> = allow.iter().map(|a| a.display().to_string()).collect();
        return Err(format!(
            "outside the directories roots may be in (SANDBOX_ROOTS_ALLOW: {})",
            allowed.join(", ")
        ));
    }
    Ok(host)
}

/// A mount point name: `[A-Za-z0-9._-]`, others as `_`, no leading dot, at most 64 characters.
fn safe_name(wanted: &str) -> String {
    let mut name: String = wanted
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME)
        .collect();
    if name.starts_with('.') {
        name.replace_range(..1, "_");
    }
    if name.is_empty() {
        name = "root".into();
    }
    name
}

/// `name`, or `name-2`, `name-3`... when a root already has it.
fn unique(name: &str, taken: &[Root]) -> String {
    let free = |candidate: &str| !taken.iter().any(|r| r.name == candidate);
    if free(name) {
        return name.to_string();
    }
    (2..)
        .map(|n| {
            let suffix = format!("-{n}");
            let head: String = name.chars().take(MAX_NAME - suffix.len()).collect();
            format!("{head}{suffix}")
        })
        .find(|candidate| free(candidate))
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// A directory tree of its own, removed at the end.
    struct Tree(PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    impl Tree {
        fn new() -> Tree {
            let dir = std::env::temp_dir().join(format!("pcs-roots-{}", uuid::Uuid::new_v4()));
            for d in ["home/me/proj", "home/me/data", "home/me/.ssh", "other"] {
                std::fs::create_dir_all(dir.join(d)).unwrap();
            }
            std::fs::write(dir.join("home/me/notes.txt"), "x").unwrap();
            std::os::unix::fs::symlink(dir.join("other"), dir.join("home/me/link")).unwrap();
            Tree(std::fs::canonicalize(&dir).unwrap())
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }

        fn uri(&self, rel: &str) -> Listed {
            Listed {
                uri: format!("file://{}", self.path(rel).display()),
                name: None,
            }
        }

        fn policy(&self) -> RootsPolicy {
            RootsPolicy {
                mode: RootsMode::ReadOnly,
                allow: vec![self.path("home/me")],
                map: Vec::new(),
            }
        }

        fn protected(&self) -> Protected {
            Protected {
                home: Some(self.path("home/me")),
                sockets: vec![self.path("home/me/data/engine.sock")],
                state: vec![("SANDBOX_FILES_DIR", self.path("home/me/proj/state"))],
            }
        }
    }

    /// An HTTP client's context, through the policy's mapping.
    fn http(policy: &RootsPolicy) -> Context<'_> {
        Context {
            map: Some(&policy.map),
            writable: &[],
        }
    }

    fn reason(set: &RootSet) -> &str {
        assert!(set.roots.is_empty(), "{:?}", set.roots);
        &set.refused[0].reason
    }

    #[test]
    fn an_allowed_directory_is_mounted_under_a_safe_unique_name() {
        let tree = Tree::new();
        let mut other = tree.protected();
        other.state.clear();
        other.sockets.clear();
        let listed = [
            Listed {
                name: Some("../My Project".into()),
                ..tree.uri("home/me/proj")
            },
            tree.uri("home/me/data"),
            Listed {
                name: Some("data".into()),
                uri: format!("file://localhost{}", tree.path("home/me/proj/").display()),
            },
        ];
        // The same directory twice is mounted once.
        let set = RootSet::resolve(&listed, &tree.policy(), &other, Context::default());
        let names: Vec<&str> = set.roots.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["_._My_Project", "data"]);
        assert!(set.refused[0].reason.contains("same directory"));
        assert!(set.roots.iter().all(|r| r.read_only));
        assert_eq!(set.mounts()[1].container, "/mnt/roots/data");
        assert_eq!(set.writable_names(), None);
        set.recheck().unwrap();

        let mut rw = tree.policy();
        rw.mode = RootsMode::ReadWrite;
        let set = RootSet::resolve(&listed[1..2], &rw, &other, Context::default());
        assert_eq!(set.writable_names().as_deref(), Some("data"));
        let again = RootSet::resolve(&listed[1..2], &rw, &other, Context::default());
        assert_eq!(again.key(), set.key());
        assert_ne!(
            again.key(),
            RootSet::resolve(&listed[..1], &rw, &other, Context::default()).key()
        );
        assert_eq!(RootSet::key_of(None), RootSet::default().key());
    }

    #[test]
    fn names_are_bounded_and_unique() {
        assert_eq!(safe_name(".ssh"), "_ssh");
        assert_eq!(safe_name(""), "root");
        assert_eq!(safe_name(&"x".repeat(100)).len(), 64);
        let taken = |names: &[&str]| -> Vec<Root> {
            names
                .iter()
                .map(|n| Root {
                    name: n.to_string(),
                    host: "/".into(),
                    read_only: true,
                    handle: Handle::open(Path::new("/")).unwrap(),
                    guards: Vec::new(),
                })
                .collect()
        };
        assert_eq!(unique("a", &taken(&["a", "a-2"])), "a-3");
        let long = "y".repeat(64);
        assert_eq!(unique(&long, &taken(&[&long])).len(), 64);
    }

    #[test]
    fn what_a_user_would_not_mean_to_share_is_refused_with_its_reason() {
        let tree = Tree::new();
        let check = |rel: &str, expected: &str| {
            let set = RootSet::resolve(
                &[tree.uri(rel)],
                &tree.policy(),
                &tree.protected(),
                Context::default(),
            );
            let why = reason(&set);
            assert!(why.contains(expected), "{rel}: {why}");
        };
        check("home/me/missing", "does not exist");
        check("home/me/notes.txt", "not a directory");
        check("home/me", "home directory itself");
        check("home", "holds the home directory");
        check("home/me/.ssh", "hidden directory");
        check("home/me/data", "engine's socket");
        check("home/me/proj", "server's own state");
        // A link is judged by where it leads.
        check("home/me/link", "SANDBOX_ROOTS_ALLOW");
        check("other", "SANDBOX_ROOTS_ALLOW");
        // A directory whose name is not UTF-8 (a client can percent-encode any byte).
        std::fs::create_dir(
            tree.path("home/me")
                .join(std::ffi::OsStr::from_bytes(b"caf\xe9")),
        )
        .unwrap();
        let set = RootSet::resolve(
            &[Listed {
                uri: format!("file://{}/caf%E9", tree.path("home/me").display()),
                name: None,
            }],
            &tree.policy(),
            &tree.protected(),
            Context::default(),
        );
        assert!(reason(&set).contains("not UTF-8"), "{set:?}");
        let protected = tree.protected();
        let one = |uri: &str| {
            let listed = [Listed {
                uri: uri.into(),
                name: None,
            }];
            RootSet::resolve(&listed, &tree.policy(), &protected, Context::default())
        };
        assert!(reason(&one("https://example.com/x")).contains("file://"));
        assert!(reason(&one("file://elsewhere/home")).contains("another host"));
        assert!(reason(&one("file:///")).contains("whole file system"));
        assert!(reason(&one("file:///etc")).contains("system directory"));
        assert!(reason(&one("file:///usr/lib")).contains("system directory"));
        assert!(reason(&one("file:///a%00b")).contains("NUL"));
        // The client's text is escaped and bounded where it is shown.
        let set = one(&format!("ftp://\n{}", "z".repeat(1000)));
        assert!(!set.refused[0].uri.contains('\n'));
        assert!(
            set.refused[0].uri.chars().count() <= MAX_SHOWN + 2,
            "{}",
            set.refused[0].uri
        );
    }

    #[test]
    fn over_http_only_mapped_paths_are_roots() {
        let tree = Tree::new();
        let mut policy = tree.policy();
        let mut protected = tree.protected();
        protected.state.clear();
        let listed = [Listed {
            uri: "file:///Users/me/src/proj".into(),
            name: None,
        }];
        assert!(reason(&RootSet::resolve(
            &listed,
            &policy,
            &protected,
            http(&policy)
        ))
        .contains("SANDBOX_ROOTS_MAP"));
        policy.map = vec![RootMapping {
            client: "/Users/me/src".into(),
            host: tree.path("home/me"),
        }];
        let set = RootSet::resolve(&listed, &policy, &protected, http(&policy));
        assert_eq!(set.roots[0].host, tree.path("home/me/proj"));
        // A link in the mapped directory that leads out of it is refused, even to an allowed
        // directory.
        std::fs::create_dir(tree.path("home/me/theirs")).unwrap();
        std::os::unix::fs::symlink(tree.path("home/me/theirs"), tree.path("home/me/proj/l"))
            .unwrap();
        policy.map[0].host = tree.path("home/me/proj");
        let out = [Listed {
            uri: "file:///Users/me/src/l".into(),
            name: None,
        }];
        assert!(
            reason(&RootSet::resolve(&out, &policy, &protected, http(&policy)))
                .contains("out of the directory its SANDBOX_ROOTS_MAP entry names"),
        );
        policy.map[0].host = tree.path("home/me");
        // Over stdio the same URI is this machine's path, which does not exist.
        assert!(reason(&RootSet::resolve(
            &listed,
            &policy,
            &protected,
            Context::default()
        ))
        .contains("does not exist"));
    }

    #[test]
    fn a_root_replaced_by_a_link_is_not_mounted() {
        let tree = Tree::new();
        let mut protected = tree.protected();
        protected.state.clear();
        let set = RootSet::resolve(
            &[tree.uri("home/me/proj")],
            &tree.policy(),
            &protected,
            Context::default(),
        );
        set.recheck().unwrap();
        std::fs::rename(tree.path("home/me/proj"), tree.path("home/me/moved")).unwrap();
        std::os::unix::fs::symlink(tree.path("other"), tree.path("home/me/proj")).unwrap();
        assert!(set.recheck().unwrap_err().contains("no longer"));
    }

    #[test]
    fn a_root_swapped_for_another_directory_is_not_mounted() {
        let tree = Tree::new();
        let mut protected = tree.protected();
        protected.state.clear();
        let set = RootSet::resolve(
            &[tree.uri("home/me/proj")],
            &tree.policy(),
            &protected,
            Context::default(),
        );
        // Same path, no link, another directory: the handle tells them apart.
        std::fs::rename(tree.path("home/me/proj"), tree.path("home/me/moved")).unwrap();
        std::fs::create_dir(tree.path("home/me/proj")).unwrap();
        assert!(set.recheck().unwrap_err().contains("no longer"));
    }

    #[test]
    fn writable_roots_never_nest_in_each_other_nor_in_what_others_write() {
        let tree = Tree::new();
        let mut protected = tree.protected();
        protected.state.clear();
        protected.sockets.clear();
        std::fs::create_dir_all(tree.path("home/me/proj/sub")).unwrap();
        let mut rw = tree.policy();
        rw.mode = RootsMode::ReadWrite;
        let listed = [
            tree.uri("home/me/proj"),
            tree.uri("home/me/proj/sub"),
            tree.uri("home/me/data"),
        ];
        let set = RootSet::resolve(&listed, &rw, &protected, Context::default());
        let names: Vec<&str> = set.roots.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["proj", "data"]);
        assert!(
            set.refused[0].reason.contains("inside the writable root"),
            "{set:?}"
        );
        // Listed the other way round, the outer one is refused.
        let set = RootSet::resolve(
            &[listed[1].clone(), listed[0].clone()],
            &rw,
            &protected,
            Context::default(),
        );
        assert!(
            set.refused[0].reason.contains("holds the writable root"),
            "{set:?}"
        );
        // Read-only roots may nest: no code writes there.
        let set = RootSet::resolve(&listed, &tree.policy(), &protected, Context::default());
        assert_eq!(set.roots.len(), 3);
        // What other live sandboxes write: the same directory is fine, nested is not, in
        // either mode.
        let writable = [tree.path("home/me/proj")];
        let context = Context {
            map: None,
            writable: &writable,
        };
        for policy in [&rw, &tree.policy()] {
            let set = RootSet::resolve(&listed, policy, &protected, context);
            let names: Vec<&str> = set.roots.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(names, ["proj", "data"]);
            let set = RootSet::resolve(&listed[1..], policy, &protected, context);
            let names: Vec<&str> = set.roots.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(names, ["data"]);
            assert!(
                set.refused[0].reason.contains("another sandbox can write"),
                "{set:?}"
            );
        }
        let set = RootSet::resolve(&listed[..1], &rw, &protected, Context::default());
        assert!(set.apart_from(&writable).is_ok());
        assert!(set
            .apart_from(&[tree.path("home/me/proj/sub")])
            .unwrap_err()
            .contains("/mnt/roots/proj"));
    }

    #[test]
    fn a_writable_root_mounts_the_places_the_host_runs_read_only() {
        let tree = Tree::new();
        let mut protected = tree.protected();
        protected.state.clear();
        std::fs::create_dir_all(tree.path("home/me/proj/.git/hooks")).unwrap();
        std::fs::write(tree.path("home/me/proj/.envrc"), "").unwrap();
        let mut rw = tree.policy();
        rw.mode = RootsMode::ReadWrite;
        let set = RootSet::resolve(
            &[tree.uri("home/me/proj")],
            &rw,
            &protected,
            Context::default(),
        );
        let mounts: Vec<(String, bool)> = set
            .mounts()
            .into_iter()
            .map(|m| (m.container, m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/mnt/roots/proj".to_string(), false),
                ("/mnt/roots/proj/.envrc".to_string(), true),
                ("/mnt/roots/proj/.git".to_string(), true),
            ]
        );
        set.recheck().unwrap();
        // A guard replaced by a link is caught like the root.
        std::fs::rename(
            tree.path("home/me/proj/.git"),
            tree.path("home/me/proj/git"),
        )
        .unwrap();
        std::os::unix::fs::symlink(tree.path("other"), tree.path("home/me/proj/.git")).unwrap();
        assert!(set.recheck().unwrap_err().contains("/mnt/roots/proj/.git"));
        // And a root with a place that is a link is mounted read-only, saying why.
        let set = RootSet::resolve(
            &[tree.uri("home/me/proj")],
            &rw,
            &protected,
            Context::default(),
        );
        assert!(set.roots[0].read_only);
        assert!(
            set.refused[0]
                .reason
                .starts_with("mounted read-only: its .git is a link"),
            "{set:?}"
        );
        // Read-only roots need no guards.
        let set = RootSet::resolve(
            &[tree.uri("home/me/proj")],
            &tree.policy(),
            &protected,
            Context::default(),
        );
        assert_eq!(set.mounts().len(), 1);
    }
}
