//! Files an execution made: copied out of the sandbox, checked, saved on the host, returned.
//!
//! The sandboxed code controls everything in `/workspace`, so this module trusts nothing it gets:
//! the runner's list of changed paths is only a hint of what to fetch. Each file is read by the
//! runner, as the sandbox's user, through descriptors opened without following links, so a file
//! leaves the sandbox only if the code itself could read it (the engine's archive API reads as
//! root, and resolves links). Pieces are counted as they arrive: limits hold on the bytes actually
//! received, hard links to one file count once, and a file too large to return inline streams to
//! disk instead of memory. On the host it is written below the run's own directory, its name made
//! safe, each directory checked and the file opened without following links.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use std::collections::HashMap;

use super::files_dir::{self, Retention};
use super::outcome::{Artifact, Changes};
use super::protocol::is_safe_relative_path;
use super::roots::{self, RootSet};
use super::sandbox::{Sandbox, WorkspacePath};
use super::EngineError;
use crate::config::FilePolicy;
use crate::text;

/// Where an execution's files are saved: its run (or session) directory, and the retention that
/// must spare that directory while they are written.
#[derive(Clone, Copy)]
pub struct Destination<'a> {
    pub run_dir: &'a str,
    pub retention: Option<&'a Retention>,
}

/// Copies out what an execution changed and applies the policy. Never fails: a file that cannot
/// be fetched or saved is reported with the reason.
pub async fn collect(
    sandbox: &mut Sandbox,
    changes: Changes,
    policy: &FilePolicy,
    destination: Destination<'_>,
) -> Vec<Artifact> {
    let Destination { run_dir, retention } = destination;
    // No sweep removes the run's directory while its files are written (streamed, then figures).
    let saving = policy
        .persist_dir
        .as_ref()
        .and_then(|_| retention.map(|r| r.saving(run_dir)));
    let (max_file, max_total, max_count) = policy.copy_limits();
    let mut artifacts = Vec::new();
    let mut copied_bytes = 0u64;
    let mut copied_files = 0usize;
    // device:inode → the path it was copied under: hard links to one file are one file.
    let mut copied_inodes: HashMap<String, String> = HashMap::new();
    let save_root = policy.persist_dir.as_deref();
    for entry in &changes.entries {
        let mut artifact = Artifact {
            path: entry.path.clone(),
            size: entry.size,
            mime_type: mime_from_name(&entry.path).to_string(),
            content: None,
            saved_to: None,
            note: None,
            figure: false,
        };
        if entry.kind != "file" || !is_safe_relative_path(&entry.path) {
            let what = match entry.kind.as_str() {
                "symlink" => "a symbolic link",
                "special" => "a special file (FIFO, socket or device)",
                _ => "not a regular file",
            };
            artifact.note = Some(format!("not copied: {what}"));
            artifact.mime_type = String::new();
        } else if copied_files >= max_count {
            artifact.note = Some(format!("not copied: more than {max_count} files changed"));
        } else if entry.size > max_file {
            // The runner's size is a hint, but one that saves a useless copy.
            artifact.note = Some(format!(
                "not copied: larger than the {} limit",
                text::bytes(max_file)
            ));
        } else {
            let budget = Budget {
                file: max_file,
                total_left: max_total - copied_bytes,
                total: max_total,
                in_memory: policy.return_max_file_bytes,
            };
            let target = save_root.map(|root| (root, run_dir));
            match fetch(sandbox, &WorkspacePath::of(entry), &budget, target).await {
                Err(reason) => artifact.note = Some(format!("not copied: {reason}")),
                Ok(fetched) => {
                    if let Some(first) = copied_inodes.get(&fetched.inode) {
                        artifact.note = Some(format!(
                            "not copied again: a hard link to {}, which was",
                            display_path(first)
                        ));
                        if let Some(saved) = fetched.saved_to {
                            let _ = fs::remove_file(saved);
                        }
                    } else {
                        copied_inodes.insert(fetched.inode, entry.path.clone());
                        copied_bytes += fetched.size;
                        copied_files += 1;
                        artifact.size = fetched.size;
                        artifact.mime_type = sniff_mime(&fetched.head, &entry.path).to_string();
                        artifact.content = fetched.content;
                        artifact.saved_to = fetched.saved_to;
                        artifact.note = fetched.note;
                    }
                }
            }
        }
        artifacts.push(artifact);
    }

    for (n, png) in changes.figures.into_iter().enumerate() {
        artifacts.push(Artifact {
            path: format!("figures/figure-{}.png", n + 1),
            size: png.len() as u64,
            mime_type: "image/png".to_string(),
            content: Some(png),
            saved_to: None,
            note: None,
            figure: true,
        });
    }

    if let Some(root) = &policy.persist_dir {
        save_all(root, run_dir, &mut artifacts);
        drop(saving);
        if let Some(retention) = retention {
            if artifacts.iter().any(|a| a.saved_to.is_some()) {
                retention.saved();
            }
        }
    }
    apply_return_limits(policy, &mut artifacts);
    if changes.left_out > 0 {
        artifacts.push(Artifact::notice(format!(
            "{} more changed entries not listed (a result names at most {} entries and {} of paths)",
            changes.left_out,
            super::protocol::MAX_CHANGED_ENTRIES,
            text::bytes(super::protocol::MAX_CHANGED_PATH_BYTES as u64),
        )));
    }
    if changes.truncated {
        artifacts.push(Artifact::notice(format!(
            "more than {} workspace entries: changes beyond them were not tracked",
            super::protocol::MAX_TRACKED_ENTRIES
        )));
    }
    artifacts
}

/// What an execution changed in the client's writable roots: each file named where the sandbox
/// and the host see it, never read (the host would have to follow the code's links to do so;
/// the file is already where the user keeps it). Entries in no root of `roots` are dropped.
pub fn in_roots(changes: &Changes, roots: Option<&RootSet>) -> Vec<Artifact> {
    let Some(roots) = roots else {
        return Vec::new();
    };
    let mut artifacts = Vec::new();
    for root in roots.roots.iter().filter(|r| !r.read_only) {
        let (stripped, acl) = root.handle.tidy_itself();
        if stripped != 0 {
            artifacts.push(Artifact::notice(format!(
                "the code gave the user's root {} set-id or world-write bits ({stripped:04o}); \
                 the server removed them",
                root.container_path()
            )));
        }
        if acl {
            artifacts.push(Artifact::notice(format!(
                "the code gave the user's root {} a default ACL that lets everyone write what \
                 is made there; the server removed that write",
                root.container_path()
            )));
        }
    }
    for changed in &changes.roots {
        let (Some(root), entry) = (roots.named(&changed.root), &changed.entry) else {
            continue;
        };
        if root.read_only || !is_safe_relative_path(&entry.path) {
            continue;
        }
        // The host names a file only where a walk from the root it holds, following no link,
        // finds a regular file: the path is the code's, and so is what is on its way. What it
        // finds loses the set-id and world-write bits the code gave it.
        let found = match entry.kind.as_str() {
            "file" | "directory" => root.handle.tidy(Path::new(&entry.path)),
            _ => None,
        };
        let mut notes = Vec::new();
        match (entry.kind.as_str(), found) {
            // A directory is named only for what was removed from it.
            ("directory", Some(found)) if found.stripped != 0 || found.acl_removed => {}
            ("directory", _) => continue,
            ("file", Some(found)) if found.file => notes.push(format!(
                "written in place in the user's root {} (on the host: not copied)",
                root.container_path()
            )),
            ("file", _) => notes.push(
                "in the user's root, but not found at that path on the host (moved, or behind \
                 a link)"
                    .to_string(),
            ),
            ("symlink", _) => notes.push("a symbolic link, in the user's root".to_string()),
            _ => notes.push("a special file (FIFO, socket or device), in the user's root".into()),
        }
        if let Some(found) = found {
            if found.executable {
                notes.push(
                    "EXECUTABLE, new or changed in the user's root: read it before running it"
                        .to_string(),
                );
            }
            if found.stripped != 0 {
                notes.push(format!(
                    "the code gave it set-uid, set-gid or world-write bits ({:04o}); the server \
                     removed them",
                    found.stripped
                ));
            }
            if found.acl_removed {
                notes.push(
                    "the code gave it a default ACL that lets everyone write what is made in \
                     it; the server removed that write"
                        .to_string(),
                );
            }
        }
        if let Some(place) = Path::new(&entry.path)
            .components()
            .find_map(|c| c.as_os_str().to_str().filter(|n| roots::is_protected(n)))
        {
            notes.push(format!(
                "in {place}, a place the user's tools run things from (hooks, settings): made \
                 by the code, check it before they run it"
            ));
        }
        let on_host = found.is_some_and(|f| f.file) || entry.kind == "directory";
        artifacts.push(Artifact {
            path: format!("{}/{}", root.container_path(), entry.path),
            size: if entry.kind == "directory" {
                0
            } else {
                entry.size
            },
            mime_type: if entry.kind == "file" {
                mime_from_name(&entry.path).to_string()
            } else {
                String::new()
            },
            content: None,
            saved_to: on_host.then(|| root.host.join(&entry.path)),
            note: Some(notes.join("; ")),
            figure: false,
        });
    }
    if changes.roots_left_out > 0 {
        artifacts.push(Artifact::notice(format!(
            "{} more changed entries in the roots not listed",
            changes.roots_left_out
        )));
    }
    if changes.roots_truncated {
        artifacts.push(Artifact::notice(format!(
            "a root has more than {} entries: changes beyond them were not seen",
            super::protocol::MAX_TRACKED_ENTRIES
        )));
    }
    artifacts
}

impl Artifact {
    /// A line of the file list that is no file: what was left out of it, and why.
    fn notice(note: String) -> Artifact {
        Artifact {
            path: "…".to_string(),
            size: 0,
            mime_type: String::new(),
            content: None,
            saved_to: None,
            note: Some(note),
            figure: false,
        }
    }
}

/// How much one file may bring: its own limit, what is left of the execution's total, and how
/// much of it is worth keeping in memory (only what could be returned inline).
struct Budget {
    file: u64,
    total_left: u64,
    total: u64,
    in_memory: u64,
}

/// A file copied out of the sandbox.
struct Fetched {
    /// Bytes actually received.
    size: u64,
    /// Its first bytes, to tell its type.
    head: Vec<u8>,
    /// The whole content, when it is small enough to be returned inline.
    content: Option<Vec<u8>>,
    saved_to: Option<PathBuf>,
    note: Option<String>,
    inode: String,
}

/// The piece of a file asked for at once (the runner's own cap).
const CHUNK: u64 = 1 << 20;

/// Copies one file out, piece by piece, as the sandbox's user (see `read_chunk`): what is kept in
/// memory and written to the host is bounded by the bytes actually received, never by what the
/// sandbox says of the file. With a `target` the file is streamed to `<root>/<run_dir>/<path>`
/// (its name made safe for the host); a partial file is removed when the copy fails.
async fn fetch(
    sandbox: &mut Sandbox,
    path: &WorkspacePath,
    budget: &Budget,
    target: Option<(&Path, &str)>,
) -> Result<Fetched, String> {
    let limit = budget.file.min(budget.total_left);
    let mut received = 0u64;
    let mut head = Vec::new();
    let mut memory: Option<Vec<u8>> = Some(Vec::new());
    let mut inode: Option<String> = None;
    let mut saving: Option<(fs::File, PathBuf)> = None;
    let mut save_error: Option<String> = None;
    let outcome: Result<(), String> = loop {
        let want = CHUNK.min(limit + 1 - received);
        let chunk = match sandbox.read_chunk(path, received, want).await {
            Err(e) => break Err(e.to_string()),
            Ok(Err(reason)) => break Err(reason),
            Ok(Ok(chunk)) => chunk,
        };
        match &inode {
            None => inode = Some(chunk.inode.clone()),
            Some(first) if *first != chunk.inode => {
                break Err("the file was replaced while it was being copied".to_string())
            }
            Some(_) => {}
        }
        let last = (chunk.data.len() as u64) < want;
        received += chunk.data.len() as u64;
        if received > limit {
            break Err(if limit == budget.file {
                format!("larger than the {} limit", text::bytes(budget.file))
            } else {
                format!("over the {} total limit", text::bytes(budget.total))
            });
        }
        if head.len() < 16 {
            head.extend(chunk.data.iter().take(16 - head.len()));
        }
        if let Some(kept) = memory.as_mut() {
            if received <= budget.in_memory {
                kept.extend_from_slice(&chunk.data);
            } else {
                memory = None;
            }
        }
        if let (Some((root, run_dir)), None) = (target, &save_error) {
            if saving.is_none() {
                match create_saved(root, run_dir, &host_relative(&path.text)) {
                    Ok(created) => saving = Some(created),
                    Err(e) => save_error = Some(format!("not saved on the host: {e}")),
                }
            }
            if let Some((file, _)) = saving.as_mut() {
                if let Err(e) = file.write_all(&chunk.data) {
                    save_error = Some(format!("not saved on the host: {e}"));
                }
            }
        }
        if last {
            break Ok(());
        }
    };
    let saved_to = match (saving, &save_error) {
        (Some((_, path)), Some(_)) => {
            let _ = fs::remove_file(path);
            None
        }
        (Some((_, path)), None) => Some(path),
        (None, _) => None,
    };
    if let Err(reason) = outcome {
        if let Some(path) = saved_to {
            let _ = fs::remove_file(path);
        }
        return Err(reason);
    }
    if let Some(e) = &save_error {
        tracing::warn!(file = %path.text, "{e}");
    }
    let note = save_error.or_else(|| {
        memory.is_none().then(|| {
            format!(
                "not returned: larger than the {} limit",
                text::bytes(budget.in_memory)
            )
        })
    });
    Ok(Fetched {
        size: received,
        head,
        content: memory,
        saved_to,
        note,
        inode: inode.unwrap_or_default(),
    })
}

/// Reads one workspace file whole, within `limit` bytes, as the sandbox's user.
pub async fn read_whole(
    sandbox: &mut Sandbox,
    path: &str,
    limit: u64,
) -> Result<Result<Vec<u8>, String>, EngineError> {
    let path = WorkspacePath::text(path);
    let mut content = Vec::new();
    let mut inode = None;
    loop {
        let want = CHUNK.min(limit + 1 - content.len() as u64);
        let chunk = match sandbox
            .read_chunk(&path, content.len() as u64, want)
            .await?
        {
            Ok(chunk) => chunk,
            Err(reason) => return Ok(Err(reason)),
        };
        if *inode.get_or_insert_with(|| chunk.inode.clone()) != chunk.inode {
            return Ok(Err(
                "the file was replaced while it was being read".to_string()
            ));
        }
        let last = (chunk.data.len() as u64) < want;
        content.extend_from_slice(&chunk.data);
        if content.len() as u64 > limit {
            return Ok(Err(format!("larger than the {} limit", text::bytes(limit))));
        }
        if last {
            return Ok(Ok(content));
        }
    }
}

/// Writes a whole file into the workspace, piece by piece, as the sandbox's user.
pub async fn write_whole(
    sandbox: &mut Sandbox,
    path: &str,
    content: &[u8],
) -> Result<Result<u64, String>, EngineError> {
    let mut offset = 0u64;
    let mut pieces = content.chunks(CHUNK as usize).peekable();
    if pieces.peek().is_none() {
        return sandbox.write_chunk(path, b"", 0).await;
    }
    for piece in pieces {
        match sandbox.write_chunk(path, piece, offset).await? {
            Ok(size) => offset = size,
            Err(reason) => return Ok(Err(reason)),
        }
    }
    Ok(Ok(offset))
}

/// A workspace path as a name on the host: every character that could confuse a reader of the
/// path (control characters, line breaks, the replacement character of undecodable bytes) is
/// replaced by `_`; the structure (`/`-separated, checked components) is kept.
pub fn host_relative(path: &str) -> String {
    path.chars()
        .map(|c| {
            if c.is_control() || c == '\u{FFFD}' || c == '\\' {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A workspace path as the model reads it: as it is when it is plain, quoted with escapes when
/// it holds anything that could pass for the text around it (line breaks, control characters,
/// undecodable bytes, leading or trailing spaces).
pub fn display_path(path: &str) -> std::borrow::Cow<'_, str> {
    let plain_char = |c: char| {
        !c.is_control() && c != '\u{FFFD}' && c != '"' && (c == ' ' || !c.is_whitespace())
    };
    let plain = !path.is_empty()
        && !path.starts_with(' ')
        && !path.ends_with(' ')
        && path.chars().all(plain_char);
    if plain {
        std::borrow::Cow::Borrowed(path)
    } else {
        std::borrow::Cow::Owned(format!("{path:?}"))
    }
}

/// Saves what is in memory and not saved yet (figures; workspace files are streamed to disk).
fn save_all(root: &Path, run_dir: &str, artifacts: &mut [Artifact]) {
    for artifact in artifacts.iter_mut() {
        let Some(content) = &artifact.content else {
            continue;
        };
        if artifact.saved_to.is_some() || !artifact.figure {
            continue;
        }
        let relative = if artifact.figure {
            // Figures of later executions of a session must not overwrite earlier ones.
            format!(
                "figures/{}-{}",
                unique_stamp(),
                artifact.path.trim_start_matches("figures/")
            )
        } else {
            artifact.path.clone()
        };
        match save(root, run_dir, &relative, content) {
            Ok(path) => artifact.saved_to = Some(path),
            Err(e) => {
                tracing::warn!(file = %artifact.path, "could not save: {e}");
                artifact.note = Some(format!("not saved on the host: {e}"));
            }
        }
    }
}

/// Keeps inline only what fits the return limits; the rest stays listed (and saved).
fn apply_return_limits(policy: &FilePolicy, artifacts: &mut [Artifact]) {
    let mut returned_bytes = 0u64;
    let mut returned = 0usize;
    for artifact in artifacts.iter_mut() {
        let Some(content) = &artifact.content else {
            continue;
        };
        let size = content.len() as u64;
        let refusal = if returned >= policy.return_max_count {
            Some(format!(
                "not returned: more than {} files",
                policy.return_max_count
            ))
        } else if size > policy.return_max_file_bytes {
            Some(format!(
                "not returned: larger than the {} limit",
                text::bytes(policy.return_max_file_bytes)
            ))
        } else if returned_bytes + size > policy.return_max_total_bytes {
            Some(format!(
                "not returned: over the {} total limit",
                text::bytes(policy.return_max_total_bytes)
            ))
        } else {
            None
        };
        match refusal {
            None => {
                returned += 1;
                returned_bytes += size;
            }
            Some(reason) => {
                artifact.content = None;
                artifact.note = Some(reason);
            }
        }
    }
}

/// Writes `content` at `root/run_dir/relative` without following any link, creating directories
/// as needed. Returns the path written.
pub fn save(
    root: &Path,
    run_dir: &str,
    relative: &str,
    content: &[u8],
) -> std::io::Result<PathBuf> {
    let (mut file, target) = create_saved(root, run_dir, relative)?;
    file.write_all(content)?;
    Ok(target)
}

/// Creates (or truncates) the file `root/run_dir/relative` for writing, without following any
/// link, creating directories as needed.
fn create_saved(
    root: &Path,
    run_dir: &str,
    relative: &str,
) -> std::io::Result<(fs::File, PathBuf)> {
    use std::io::{Error, ErrorKind};
    // A run's directory, or an owner's directory and a run's in it.
    if !is_safe_relative_path(run_dir)
        || run_dir.split('/').count() > 2
        || !is_safe_relative_path(relative)
    {
        return Err(Error::new(ErrorKind::InvalidInput, "unsafe path"));
    }
    prepare_root(root)?;
    let mut dir = root.to_path_buf();
    for part in run_dir.split('/') {
        dir.push(part);
        ensure_real_dir(&dir)?;
    }
    let components: Vec<&str> = relative.split('/').collect();
    let (file_name, parents) = components
        .split_last()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "empty path"))?;
    for part in parents {
        dir.push(part);
        ensure_real_dir(&dir)?;
    }
    let target = dir.join(file_name);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)?;
    Ok((file, target))
}

/// The persistence root: checked at start-up ([`files_dir::prepare`]); here again before each
/// save, cheaply: created private to this user if it went missing, refused when it became a link,
/// someone else's directory or writable by others.
fn prepare_root(root: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    match fs::symlink_metadata(root) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            files_dir::create_private(root).map_err(|(_, e)| e)?;
        }
        Err(e) => return Err(e),
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    files_dir::check_private_dir(root, me)
        .map_err(|(reason, _)| Error::new(ErrorKind::PermissionDenied, reason))
}

fn ensure_real_dir(dir: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} is not a directory", dir.display()),
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => fs::create_dir(dir),
        Err(e) => Err(e),
    }
}

/// A name part that sorts by time and differs between saves into one directory.
pub(crate) fn unique_stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}{:03}", now.as_secs(), now.subsec_millis())
}

/// The media type of a file, from its bytes first (images), then its name.
pub fn sniff_mime(content: &[u8], name: &str) -> &'static str {
    if content.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if content.starts_with(b"\xff\xd8\xff") {
        "image/jpeg"
    } else if content.starts_with(b"GIF87a") || content.starts_with(b"GIF89a") {
        "image/gif"
    } else if content.len() >= 12 && &content[..4] == b"RIFF" && &content[8..12] == b"WEBP" {
        "image/webp"
    } else if content.starts_with(b"%PDF-") {
        "application/pdf"
    } else if content.starts_with(b"PK\x03\x04")
        && !name.ends_with(".docx")
        && !name.ends_with(".xlsx")
    {
        "application/zip"
    } else {
        match mime_from_name(name) {
            // A name claiming an image whose bytes are not one: don't call it an image.
            m if m.starts_with("image/") && m != "image/svg+xml" => "application/octet-stream",
            m => m,
        }
    }
}

/// The media type a file name suggests.
pub fn mime_from_name(name: &str) -> &'static str {
    let extension = name.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "json" => "application/json",
        "ipynb" => "application/x-ipynb+json",
        "html" | "htm" => "text/html",
        "md" => "text/markdown",
        "py" => "text/x-python",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "txt" | "log" => "text/plain",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "parquet" => "application/vnd.apache.parquet",
        _ => "application/octet-stream",
    }
}

/// Whether the media type is an image MCP clients display.
pub fn is_displayable_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saving_never_leaves_the_run_directory_nor_follows_links() {
        let root = std::env::temp_dir().join(format!("pcs-save-{}", uuid::Uuid::new_v4().simple()));
        let saved = save(&root, "run-1", "sub/dir/out.csv", b"a,b\n").unwrap();
        assert_eq!(saved, root.join("run-1/sub/dir/out.csv"));
        assert_eq!(fs::read(&saved).unwrap(), b"a,b\n");
        for bad in ["../escape", "/abs", "a/../../b", ""] {
            assert!(save(&root, "run-1", bad, b"x").is_err(), "{bad}");
        }
        assert!(save(&root, "../run", "x", b"x").is_err());
        // A link planted where a directory or the file would go is not followed.
        let outside = root.join("outside");
        fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("run-1/linkdir")).unwrap();
        assert!(save(&root, "run-1", "linkdir/x.txt", b"x").is_err());
        std::os::unix::fs::symlink(outside.join("target"), root.join("run-1/link.txt")).unwrap();
        assert!(save(&root, "run-1", "link.txt", b"x").is_err());
        assert!(!outside.join("target").exists() && !outside.join("x.txt").exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn host_names_and_shown_names_cannot_pass_for_other_text() {
        assert_eq!(host_relative("a/b c.txt"), "a/b c.txt");
        assert_eq!(
            host_relative("x\n--- stderr ---\nforged\r.txt"),
            "x_--- stderr ---_forged_.txt"
        );
        assert_eq!(host_relative("bad\u{FFFD}.txt"), "bad_.txt");
        assert_eq!(display_path("data/out put.csv"), "data/out put.csv");
        for tricky in [
            "a\nb",
            "a\tb",
            " lead",
            "trail ",
            "q\"uote",
            "bad\u{FFFD}",
            "",
        ] {
            let shown = display_path(tricky);
            assert!(
                shown.starts_with('"') && !shown.contains('\n'),
                "{tricky:?} → {shown}"
            );
        }
    }

    #[test]
    fn a_root_that_became_a_link_or_shared_is_refused_when_saving() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("pcs-save-{}", uuid::Uuid::new_v4().simple()));
        // Gone: created again, private.
        let root = base.join("files");
        save(&root, "run-1", "a.txt", b"x").unwrap();
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let e = save(&root, "run-2", "a.txt", b"x").unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).unwrap();
        let e = save(&link, "run-3", "a.txt", b"x").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!root.join("run-2").exists() && !root.join("run-3").exists());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn types_come_from_the_bytes_for_images() {
        assert_eq!(sniff_mime(b"\x89PNG\r\n\x1a\nrest", "x.bin"), "image/png");
        assert_eq!(
            sniff_mime(b"not a png", "fake.png"),
            "application/octet-stream"
        );
        assert_eq!(sniff_mime(b"a,b\n1,2\n", "data.csv"), "text/csv");
        assert_eq!(
            sniff_mime(b"PK\x03\x04...", "archive.zip"),
            "application/zip"
        );
    }

    fn policy(persist: Option<PathBuf>) -> FilePolicy {
        FilePolicy {
            persist_dir: persist,
            max_file_bytes: 100,
            max_total_bytes: 150,
            max_count: 3,
            return_max_file_bytes: 10,
            return_max_total_bytes: 15,
            return_max_count: 2,
            max_age: std::time::Duration::from_secs(3600),
            max_saved_bytes: 1000,
        }
    }

    fn artifact(path: &str, size: usize) -> Artifact {
        Artifact {
            path: path.into(),
            size: size as u64,
            mime_type: "text/plain".into(),
            content: Some(vec![b'x'; size]),
            saved_to: None,
            note: None,
            figure: false,
        }
    }

    #[test]
    fn return_limits_keep_the_rest_listed() {
        let mut artifacts = vec![
            artifact("a", 8),
            artifact("b", 11),
            artifact("c", 8),
            artifact("d", 1),
            artifact("e", 1),
        ];
        apply_return_limits(&policy(None), &mut artifacts);
        let returned: Vec<&str> = artifacts
            .iter()
            .filter(|a| a.content.is_some())
            .map(|a| a.path.as_str())
            .collect();
        assert_eq!(returned, ["a", "d"]);
        assert!(artifacts[1]
            .note
            .as_deref()
            .unwrap()
            .contains("larger than"));
        assert!(artifacts[2].note.as_deref().unwrap().contains("total"));
        assert!(artifacts[4]
            .note
            .as_deref()
            .unwrap()
            .contains("more than 2 files"));
    }

    #[test]
    fn without_persistence_only_what_can_be_returned_is_copied() {
        assert_eq!(policy(None).copy_limits(), (10, 15, 2));
        assert_eq!(policy(Some("/x".into())).copy_limits(), (100, 150, 3));
    }
}
