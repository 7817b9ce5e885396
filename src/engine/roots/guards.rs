//! The places inside a writable root that make the host run things, mounted read-only over
//! themselves so that code writing in the root cannot plant what runs later as the user.
//!
//! A version-control directory runs its hooks at the next commit (`.git/hooks`, `.hg`'s
//! `hgrc`); `direnv` runs `.envrc` on `cd`; editors and agents run tasks, interpreters and
//! servers that their project settings name (`.vscode`, `.idea`, `.devcontainer`, `.claude`,
//! `.cursor`, `.mcp.json`); `pre-commit` and `husky` run the hooks their files name. Each such
//! place that exists when the client lists the root, at its top or in its directories down to
//! [`DEPTH`] levels below, is mounted read-only over itself. One created by the code does not
//! exist on the host before: it is flagged in the result as a place the host runs (see
//! `engine::artifacts::in_roots`). A root whose places cannot all be guarded (too many
//! entries to look through, too many places, or a place that is a link, which a mount would
//! follow) is mounted read-only instead, and the listing says why.
//!
//! Git also runs hooks from where a repository's `.git` says they are: `core.hooksPath` in its
//! config, and the directory a `.git` file names (`gitdir:`, with its `commondir`). Those inside
//! the root are guarded too, for the repositories found and for one the root is inside; one that
//! does not exist, or is reached through a link, makes the root read-only.
//!
//! A guard below the root's top sits in directories the code could move: renamed away with the
//! guard in it, and a `.git` of the code's made at the old path. So each directory between the
//! root's top and a guard is mounted over itself too, writable: a mount point cannot be moved
//! or removed.

use std::path::{Component, Path, PathBuf};

use super::identity::Handle;
use super::Guard;

/// Names of the places the host runs things from (documented in docs/security.md).
const PROTECTED_NAMES: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    ".husky",
    ".envrc",
    ".direnv",
    ".vscode",
    ".idea",
    ".devcontainer",
    ".pre-commit-config.yaml",
    ".claude",
    ".cursor",
    ".mcp.json",
];

/// How many directory levels below the root's top are looked through (a workspace of
/// repositories: `repos/<name>/.git`).
const DEPTH: usize = 2;
/// Entries looked at, at most, per root.
const MAX_LOOKED: usize = 4096;
/// Places guarded, at most, per root.
const MAX_GUARDS: usize = 64;

/// The most bytes of a git config or `.git` file read.
const MAX_GIT_FILE: u64 = 64 << 10;

/// Whether `name` is one of the places the host runs things from.
pub fn is_protected(name: &str) -> bool {
    PROTECTED_NAMES.contains(&name)
}

/// For a writable root: the place the host runs things from that the root itself is, or is
/// inside (a root listed as `proj/.git/hooks` would be the hooks directory, writable).
pub(super) fn inside_protected(host: &Path) -> Option<String> {
    host.components()
        .filter_map(|c| match c {
            Component::Normal(name) => name.to_str(),
            _ => None,
        })
        .find(|name| is_protected(name))
        .map(|name| {
            format!(
                "it is, or is inside, {name}, a place the host runs things from (hooks, \
                 settings), which a writable root mounts read-only"
            )
        })
}

/// The places to guard in the writable root `host` (held open as `root`), or why the root
/// cannot be mounted writable.
pub(super) fn find(host: &Path, root: &Handle) -> Result<Vec<Guard>, String> {
    let mut guards = Vec::new();
    let mut looked = 0usize;
    // (its path under the root, its depth)
    let mut pending: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
    while let Some((relative, depth)) = pending.pop() {
        let dir = host.join(&relative);
        // The directory must still be the root's: a link put on the way is not followed.
        if !relative.as_os_str().is_empty() && Handle::open(&dir).is_err() {
            continue;
        }
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("its directory {} cannot be read ({e})", relative.display()))?;
        for entry in entries {
            looked += 1;
            if looked > MAX_LOOKED {
                return Err(format!(
                    "it has more than {MAX_LOOKED} entries in its top {} levels, looked through \
                     for places the host runs things from (.git, .envrc, ...), which a writable \
                     root mounts read-only",
                    DEPTH + 1
                ));
            }
            let entry = entry.map_err(|e| format!("it cannot be read ({e})"))?;
            let name = entry.file_name();
            let child = relative.join(&name);
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if name.to_str().is_some_and(is_protected) {
                if kind.is_symlink() {
                    return Err(format!(
                        "its {} is a link, and a writable root's {} is mounted read-only over \
                         itself, which a link would lead elsewhere",
                        child.display(),
                        name.to_string_lossy()
                    ));
                }
                if !kind.is_dir() && !kind.is_file() {
                    continue;
                }
                if guards.len() >= MAX_GUARDS {
                    return Err(format!(
                        "it holds more than {MAX_GUARDS} places the host runs things from \
                         (.git, .envrc, ...), each mounted read-only in a writable root"
                    ));
                }
                let handle = Handle::open_dir_or_file(&host.join(&child))
                    .map_err(|e| format!("its {} cannot be opened ({e})", child.display()))?;
                guards.push(Guard {
                    relative: child,
                    handle,
                    read_only: true,
                });
                continue;
            }
            if kind.is_dir() && depth < DEPTH {
                pending.push((child, depth + 1));
            }
        }
    }
    // Where git runs hooks from besides the `.git`s found: for each of them, and for a
    // repository the root is inside (its `.git` in one of the root's ancestors).
    let mut places: Vec<PathBuf> = Vec::new();
    for guard in &guards {
        if guard.relative.file_name() == Some(std::ffi::OsStr::new(".git")) {
            let repo = host.join(&guard.relative);
            places.extend(git_places(repo.parent().unwrap_or(host))?);
        }
    }
    for ancestor in host.ancestors().skip(1) {
        if std::fs::symlink_metadata(ancestor.join(".git")).is_ok() {
            places.extend(git_places(ancestor)?);
        }
    }
    for place in places {
        let Ok(relative) = place.strip_prefix(host) else {
            continue; // outside the root: not the code's to write
        };
        if relative.as_os_str().is_empty() {
            return Err(format!(
                "git runs hooks from the root itself ({}), which would be writable",
                place.display()
            ));
        }
        if guards.iter().any(|g| relative.starts_with(&g.relative)) {
            continue;
        }
        let handle = Handle::open_dir_or_file(&place).map_err(|e| {
            format!(
                "git runs hooks from its {}, which cannot be guarded (missing, or a link on the \
                 way: {e})",
                relative.display()
            )
        })?;
        guards.push(Guard {
            relative: relative.to_path_buf(),
            handle,
            read_only: true,
        });
    }
    // Each directory between the top and a guard, mounted over itself so it cannot be moved.
    let mut holders: Vec<PathBuf> = Vec::new();
    for guard in &guards {
        for above in guard.relative.ancestors().skip(1) {
            if !above.as_os_str().is_empty() && !holders.iter().any(|h| h == above) {
                holders.push(above.to_path_buf());
            }
        }
    }
    for above in holders {
        if guards
            .iter()
            .any(|g| g.read_only && above.starts_with(&g.relative))
        {
            continue;
        }
        let handle = Handle::open(&host.join(&above))
            .map_err(|e| format!("its {} cannot be opened ({e})", above.display()))?;
        guards.push(Guard {
            relative: above,
            handle,
            read_only: false,
        });
    }
    if guards.len() > MAX_GUARDS {
        return Err(format!(
            "it holds more than {MAX_GUARDS} places the host runs things from (.git, .envrc, \
             ...) and directories holding them, each mounted over itself in a writable root"
        ));
    }
    // The root itself must not have moved meanwhile.
    if !root.still_at(host) {
        return Err("it moved while it was looked through".into());
    }
    guards.sort_by(|a, b| a.relative.cmp(&b.relative));
    Ok(guards)
}

/// The first `MAX_GIT_FILE` bytes of a file, as text (`None` when it cannot be read or is not
/// a regular file: a link is not followed).
fn read_git_file(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_GIT_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// `value` (a path git reads from a file) made absolute against `base` (resolved: no link in
/// it); its leading `..` are taken from `base` here, and a `..` after a name is kept, so that a
/// place reached through a link and back is never guarded in the wrong place (its opening
/// fails). `None` for what git would take from elsewhere (`~`, empty).
fn git_path(base: &Path, value: &str) -> Option<PathBuf> {
    let value = value.trim();
    if value.is_empty() || value.starts_with('~') {
        return None;
    }
    let mut out = base.to_path_buf();
    let mut named = false;
    for component in Path::new(value).components() {
        match component {
            Component::RootDir => {
                out = PathBuf::from("/");
                named = false;
            }
            Component::ParentDir if !named => {
                out.pop();
            }
            Component::CurDir => {}
            Component::Normal(_) => {
                named = true;
                out.push(component);
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// The values of `core.hooksPath` in a git config's text (sections and keys are
/// case-insensitive; a value may be quoted).
fn hooks_paths(config: &str) -> Vec<String> {
    let mut core = false;
    let mut found = Vec::new();
    for line in config.lines() {
        let line = line.trim();
        if let Some(section) = line.strip_prefix('[') {
            let name = section
                .split([']', ' ', '"', '.'])
                .next()
                .unwrap_or_default();
            core = name.eq_ignore_ascii_case("core");
            // `[core] hooksPath = x` on one line.
            let rest = section.split_once(']').map(|(_, r)| r.trim()).unwrap_or("");
            if core && !rest.is_empty() {
                found.extend(hooks_path_of(rest));
            }
            continue;
        }
        if core {
            found.extend(hooks_path_of(line));
        }
    }
    found
}

fn hooks_path_of(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    if !key.trim().eq_ignore_ascii_case("hookspath") {
        return None;
    }
    let value = value.split([';', '#']).next().unwrap_or_default().trim();
    Some(value.trim_matches('"').to_string())
}

/// Where git runs the hooks of the repository whose working tree is `top` (its `.git` there)
/// from, besides `.git` itself: the directory a `.git` file names and its common directory,
/// and each `core.hooksPath` of their configs (relative to the working tree). Each absolute
/// and normalized; an unreadable `.git` file is an error (its gitdir cannot be known).
fn git_places(top: &Path) -> Result<Vec<PathBuf>, String> {
    let dot_git = top.join(".git");
    let mut dirs = vec![dot_git.clone()];
    let mut places = Vec::new();
    if std::fs::symlink_metadata(&dot_git).is_ok_and(|m| m.is_file()) {
        let text = read_git_file(&dot_git)
            .ok_or_else(|| format!("its {} cannot be read", dot_git.display()))?;
        if let Some(dir) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("gitdir:"))
            .and_then(|v| git_path(top, v))
        {
            places.push(dir.clone());
            dirs.push(dir);
        }
    }
    for dir in dirs.clone() {
        if let Some(common) = read_git_file(&dir.join("commondir"))
            .and_then(|t| t.lines().next().and_then(|l| git_path(&dir, l)))
        {
            places.push(common.clone());
            dirs.push(common);
        }
    }
    for dir in dirs {
        if let Some(config) = read_git_file(&dir.join("config")) {
            places.extend(hooks_paths(&config).iter().filter_map(|v| git_path(top, v)));
        }
    }
    Ok(places)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree(PathBuf);

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree() -> Tree {
        let dir = std::env::temp_dir().join(format!("pcs-guards-{}", uuid::Uuid::new_v4()));
        for d in [
            ".git/hooks",
            "src",
            "repos/a/.git",
            "repos/b/deep/er/.git",
            ".vscode",
        ] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join(".envrc"), "x").unwrap();
        std::fs::write(dir.join("src/.mcp.json"), "{}").unwrap();
        Tree(std::fs::canonicalize(&dir).unwrap())
    }

    #[test]
    fn the_places_the_host_runs_are_found_down_to_the_depth() {
        let tree = tree();
        let root = Handle::open(&tree.0).unwrap();
        let found: Vec<String> = find(&tree.0, &root)
            .unwrap()
            .iter()
            .map(|g| g.relative.display().to_string())
            .collect();
        // `repos/b/deep/er/.git` is deeper than looked; `repos`, `repos/a` and `src` hold
        // guards (mounted over themselves, writable).
        assert_eq!(
            found,
            [
                ".envrc",
                ".git",
                ".vscode",
                "repos",
                "repos/a",
                "repos/a/.git",
                "src",
                "src/.mcp.json"
            ]
        );
    }

    #[test]
    fn git_hooks_elsewhere_and_the_directories_above_guards_are_guarded() {
        let tree = tree();
        std::fs::write(
            tree.0.join(".git/config"),
            "[core]\n\tbare = false\n\tHooksPath = \"githooks\" ; mine\n",
        )
        .unwrap();
        std::fs::create_dir_all(tree.0.join("githooks")).unwrap();
        std::fs::create_dir_all(tree.0.join("src/lib")).unwrap();
        std::fs::write(tree.0.join("src/lib/.git"), "gitdir: ../../.lib-git\n").unwrap();
        std::fs::create_dir_all(tree.0.join(".lib-git")).unwrap();
        let root = Handle::open(&tree.0).unwrap();
        let found: Vec<(String, bool)> = find(&tree.0, &root)
            .unwrap()
            .iter()
            .map(|g| (g.relative.display().to_string(), g.read_only))
            .collect();
        assert_eq!(
            found,
            [
                (".envrc".into(), true),
                (".git".into(), true),
                (".lib-git".into(), true),
                (".vscode".into(), true),
                ("githooks".into(), true),
                ("repos".into(), false),
                ("repos/a".into(), false),
                ("repos/a/.git".into(), true),
                ("src".into(), false),
                ("src/.mcp.json".into(), true),
                ("src/lib".into(), false),
                ("src/lib/.git".into(), true),
            ]
        );
        // A hooks path that does not exist yet would be the code's to make.
        std::fs::remove_dir(tree.0.join("githooks")).unwrap();
        assert!(find(&tree.0, &root).unwrap_err().contains("githooks"));
        // The hooks of a repository the root is inside, when they are in the root.
        std::fs::write(tree.0.join(".git/config"), "[core] hooksPath = src/h\n").unwrap();
        std::fs::create_dir_all(tree.0.join("src/h")).unwrap();
        let inner = Handle::open(&tree.0.join("src")).unwrap();
        let found: Vec<String> = find(&tree.0.join("src"), &inner)
            .unwrap()
            .iter()
            .map(|g| g.relative.display().to_string())
            .collect();
        assert_eq!(found, [".mcp.json", "h", "lib", "lib/.git"]);
        assert!(inside_protected(&tree.0.join(".git/hooks")).is_some());
        assert!(inside_protected(&tree.0.join("src")).is_none());
    }

    #[test]
    fn a_place_that_is_a_link_or_too_many_entries_make_the_root_read_only() {
        let tree = tree();
        let root = Handle::open(&tree.0).unwrap();
        std::os::unix::fs::symlink("/tmp", tree.0.join("src/.claude")).unwrap();
        assert!(find(&tree.0, &root).unwrap_err().contains("is a link"));
        std::fs::remove_file(tree.0.join("src/.claude")).unwrap();
        for i in 0..MAX_LOOKED {
            std::fs::write(tree.0.join(format!("src/f{i}")), "").unwrap();
        }
        assert!(find(&tree.0, &root).unwrap_err().contains("entries"));
    }
}
