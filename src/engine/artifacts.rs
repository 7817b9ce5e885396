//! Files an execution made: copied out of the sandbox, checked, saved on the host, returned.
//!
//! The sandboxed code controls everything in `/workspace`, so this module trusts nothing it gets:
//! the runner's list of changed paths is only a hint of what to fetch; each file is fetched as a
//! tar archive through the backend (which does not follow the sandbox's links), parsed in memory,
//! and accepted only as one regular file of the expected name within the size limits. On the host
//! it is written below the run's own directory, each directory checked and the file opened without
//! following links.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use futures_util::stream::{self, StreamExt};

use super::backend::{paths, Backend, SandboxId};
use super::files_dir::{self, Retention};
use super::protocol::{is_safe_relative_path, ChangedEntry};
use crate::config::FilePolicy;

/// Files fetched from a sandbox at once.
const FETCH_CONCURRENCY: usize = 8;

/// One file an execution produced, and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// Relative to `/workspace` (figures: `figures/figure-N.png`, which is not in the workspace).
    pub path: String,
    pub size: u64,
    pub mime_type: String,
    /// The bytes, when they are returned to the client.
    pub content: Option<Vec<u8>>,
    /// Where the file was saved on the host.
    pub saved_to: Option<PathBuf>,
    /// Why it was not returned (or not even copied out).
    pub note: Option<String>,
    /// A matplotlib figure rather than a workspace file.
    pub figure: bool,
}

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
    backend: &dyn Backend,
    sandbox: &SandboxId,
    changed: &[ChangedEntry],
    changed_truncated: bool,
    figures: Vec<Vec<u8>>,
    policy: &FilePolicy,
    destination: Destination<'_>,
) -> Vec<Artifact> {
    let Destination { run_dir, retention } = destination;
    let (max_file, max_total, max_count) = policy.copy_limits();
    let mut artifacts = Vec::new();
    let mut planned_bytes = 0u64;
    let mut to_fetch = Vec::new();
    for entry in changed {
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
        } else if to_fetch.len() >= max_count {
            artifact.note = Some(format!("not copied: more than {max_count} files changed"));
        } else if entry.size > max_file {
            artifact.note = Some(format!(
                "not copied: larger than the {} limit",
                human_bytes(max_file)
            ));
        } else if planned_bytes + entry.size > max_total {
            artifact.note = Some(format!(
                "not copied: over the {} total limit",
                human_bytes(max_total)
            ));
        } else {
            planned_bytes += entry.size;
            to_fetch.push(artifacts.len());
        }
        artifacts.push(artifact);
    }

    let fetched: Vec<(usize, Result<Vec<u8>, String>)> = stream::iter(to_fetch)
        .map(|index| {
            let path = artifacts[index].path.clone();
            async move { (index, fetch_file(backend, sandbox, &path, max_file).await) }
        })
        .buffered(FETCH_CONCURRENCY)
        .collect()
        .await;
    for (index, result) in fetched {
        let artifact = &mut artifacts[index];
        match result {
            Ok(content) => {
                artifact.size = content.len() as u64;
                artifact.mime_type = sniff_mime(&content, &artifact.path).to_string();
                artifact.content = Some(content);
            }
            Err(reason) => artifact.note = Some(format!("not copied: {reason}")),
        }
    }

    for (n, png) in figures.into_iter().enumerate() {
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
        // No sweep removes the run's directory while its files are written.
        let saving = retention.map(|r| r.saving(run_dir));
        save_all(root, run_dir, &mut artifacts);
        drop(saving);
        if let Some(retention) = retention {
            if artifacts.iter().any(|a| a.saved_to.is_some()) {
                retention.saved();
            }
        }
    }
    apply_return_limits(policy, &mut artifacts);
    if changed_truncated {
        artifacts.push(Artifact {
            path: "…".to_string(),
            size: 0,
            mime_type: String::new(),
            content: None,
            saved_to: None,
            note: Some(format!(
                "more than {} workspace entries: changes beyond them were not tracked",
                super::protocol::MAX_CHANGED_ENTRIES
            )),
            figure: false,
        });
    }
    artifacts
}

fn save_all(root: &Path, run_dir: &str, artifacts: &mut [Artifact]) {
    for artifact in artifacts.iter_mut() {
        let Some(content) = &artifact.content else {
            continue;
        };
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
                human_bytes(policy.return_max_file_bytes)
            ))
        } else if returned_bytes + size > policy.return_max_total_bytes {
            Some(format!(
                "not returned: over the {} total limit",
                human_bytes(policy.return_max_total_bytes)
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

/// Fetches one workspace file and checks the archive holds exactly that regular file.
pub async fn fetch_file(
    backend: &dyn Backend,
    sandbox: &SandboxId,
    path: &str,
    max_bytes: u64,
) -> Result<Vec<u8>, String> {
    let full = format!("{}/{path}", paths::WORKSPACE);
    // A tar of one file is the file plus headers (512-byte blocks, long-name extensions, padding).
    let archive = backend
        .copy_out(sandbox, &full, max_bytes.saturating_add(64 * 1024))
        .await
        .map_err(|e| e.to_string())?;
    let name = path.rsplit('/').next().unwrap_or(path);
    single_regular_file(&archive, name, max_bytes)
}

/// The content of the one regular file named `name` in `archive`; anything else is refused.
pub fn single_regular_file(archive: &[u8], name: &str, max_bytes: u64) -> Result<Vec<u8>, String> {
    let mut archive = tar::Archive::new(archive);
    let mut entries = archive
        .entries()
        .map_err(|e| format!("unreadable archive: {e}"))?;
    let mut entry = match entries.next() {
        Some(Ok(entry)) => entry,
        Some(Err(e)) => return Err(format!("unreadable archive: {e}")),
        None => return Err("the file vanished".to_string()),
    };
    let kind = entry.header().entry_type();
    if !kind.is_file() {
        let what = if kind.is_symlink() {
            "a symbolic link"
        } else if kind.is_hard_link() {
            "a hard link"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "a special file"
        };
        return Err(format!("{what}, not a regular file"));
    }
    let entry_path = entry
        .path()
        .map_err(|e| format!("unreadable name: {e}"))?
        .into_owned();
    if entry_path != Path::new(name) {
        return Err(format!(
            "unexpected entry {:?} in the archive",
            entry_path.display().to_string()
        ));
    }
    let size = entry
        .header()
        .size()
        .map_err(|e| format!("unreadable size: {e}"))?;
    if size > max_bytes {
        return Err(format!("larger than the {} limit", human_bytes(max_bytes)));
    }
    let mut content = Vec::with_capacity(size as usize);
    (&mut entry)
        .take(max_bytes + 1)
        .read_to_end(&mut content)
        .map_err(|e| format!("unreadable content: {e}"))?;
    if content.len() as u64 > max_bytes {
        return Err(format!("larger than the {} limit", human_bytes(max_bytes)));
    }
    match entries.next() {
        None => Ok(content),
        Some(_) => Err("more than one entry in the archive".to_string()),
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
    use std::io::{Error, ErrorKind};
    if !is_safe_relative_path(run_dir) || run_dir.contains('/') || !is_safe_relative_path(relative)
    {
        return Err(Error::new(ErrorKind::InvalidInput, "unsafe path"));
    }
    prepare_root(root)?;
    let mut dir = root.join(run_dir);
    ensure_real_dir(&dir)?;
    let components: Vec<&str> = relative.split('/').collect();
    let (file_name, parents) = components
        .split_last()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "empty path"))?;
    for part in parents {
        dir.push(part);
        ensure_real_dir(&dir)?;
    }
    let target = dir.join(file_name);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)?;
    file.write_all(content)?;
    Ok(target)
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

fn unique_stamp() -> String {
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

/// A size for people: `2 GiB`, `1.5 KiB`, `10 bytes` (binary units, like the settings).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            let value = n as f64 / size as f64;
            return if value.fract() == 0.0 {
                format!("{value:.0} {unit}")
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().unwrap()
    }

    fn file_header(size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        header
    }

    #[test]
    fn accepts_exactly_one_regular_file_of_the_expected_name() {
        let archive = tar_of(|b| {
            b.append_data(&mut file_header(5), "a.txt", &b"hello"[..])
                .unwrap()
        });
        assert_eq!(
            single_regular_file(&archive, "a.txt", 10).unwrap(),
            b"hello"
        );
        assert!(
            single_regular_file(&archive, "b.txt", 10).is_err(),
            "another name"
        );
        assert!(
            single_regular_file(&archive, "a.txt", 4).is_err(),
            "over the limit"
        );
    }

    #[test]
    fn refuses_links_devices_and_extra_entries() {
        let symlink = tar_of(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "leak.txt", "/etc/passwd").unwrap();
        });
        assert!(single_regular_file(&symlink, "leak.txt", 1 << 20)
            .unwrap_err()
            .contains("symbolic link"));
        let hardlink = tar_of(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Link);
            h.set_size(0);
            b.append_link(&mut h, "x", "etc/passwd").unwrap();
        });
        assert!(single_regular_file(&hardlink, "x", 1 << 20)
            .unwrap_err()
            .contains("hard link"));
        let fifo = tar_of(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Fifo);
            h.set_size(0);
            h.set_cksum();
            b.append_data(&mut h, "pipe", &b""[..]).unwrap();
        });
        assert!(single_regular_file(&fifo, "pipe", 1 << 20).is_err());
        let two = tar_of(|b| {
            b.append_data(&mut file_header(1), "a", &b"1"[..]).unwrap();
            b.append_data(&mut file_header(1), "b", &b"2"[..]).unwrap();
        });
        assert!(single_regular_file(&two, "a", 10)
            .unwrap_err()
            .contains("more than one"));
        assert!(single_regular_file(b"garbage that is not a tar archive", "a", 10).is_err());
    }

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
