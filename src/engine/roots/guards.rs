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

use std::path::{Path, PathBuf};

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

/// Whether `name` is one of the places the host runs things from.
pub fn is_protected(name: &str) -> bool {
    PROTECTED_NAMES.contains(&name)
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
                });
                continue;
            }
            if kind.is_dir() && depth < DEPTH {
                pending.push((child, depth + 1));
            }
        }
    }
    // The root itself must not have moved meanwhile.
    if !root.still_at(host) {
        return Err("it moved while it was looked through".into());
    }
    guards.sort_by(|a, b| a.relative.cmp(&b.relative));
    Ok(guards)
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
        // `repos/b/deep/er/.git` is deeper than looked.
        assert_eq!(
            found,
            [".envrc", ".git", ".vscode", "repos/a/.git", "src/.mcp.json"]
        );
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
