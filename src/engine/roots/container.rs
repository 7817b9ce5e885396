//! A started container's mounts, as the host sees them before any code runs there: the mount
//! table (`/proc/<pid>/mountinfo`) of a process in the container's mount namespace says, for
//! each mount point, which file system (`major:minor`) and which directory of it (its path from
//! that file system's root) is mounted. The host compares that with the same two facts of the
//! directory it judged, read through the handle it holds ([`source_of`]): the kernel writes both
//! from the mounted directory itself, so a link put in the path's place, or another directory
//! moved there, shows as another path or another file system.
//!
//! Under runc and the runtimes like it that process is the container's init, the process the
//! engine names. Under gVisor the engine names the sandbox process (the Sentry), which mounts
//! nothing; the container's mounts are made in the mount namespace of its gofer (`runsc-gofer`),
//! the sandbox process's sibling, which serves the container's files from there. The gofer is
//! found by its parent, its name and the container's id on its command line. A mount table is
//! readable by any user, so a server that is not root checks a sandbox whose processes run as
//! root (gVisor's) too.

use std::os::unix::ffi::OsStrExt;

/// What a gVisor gofer process is called (its first argument).
const GOFER: &str = "runsc-gofer";

/// The lines of a mount table read, at most.
const MAX_MOUNTS: usize = 100_000;

/// Which directory of which file system a mount shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file system's device, as the mount table writes it (`major:minor`).
    pub device: String,
    /// The directory's path from that file system's root, unescaped.
    pub root: Vec<u8>,
}

/// The process whose mount table holds the started container `id`'s mounts, the engine naming
/// `pid` as its process on this machine; else why there is none.
pub fn mount_holder(pid: Option<u32>, gvisor: bool, id: &str) -> Result<u32, String> {
    let Some(pid) = pid else {
        return Err(
            "the engine names no process of the sandbox on this machine, so its mounts \
                    cannot be checked"
                .into(),
        );
    };
    if gvisor {
        gofer_of(pid, id)
    } else {
        Ok(pid)
    }
}

/// What is mounted at `mount_point` (an absolute path in the container) in the mount table of
/// `pid`: the last mount there, the one that is seen.
pub fn mounted_at(pid: u32, mount_point: &str) -> Result<Source, String> {
    let table = std::fs::read(format!("/proc/{pid}/mountinfo")).map_err(|e| {
        format!("the mount table of the sandbox's process {pid} cannot be read ({e})")
    })?;
    let wanted = mount_point.as_bytes();
    let mut found = None;
    for line in table.split(|b| *b == b'\n').take(MAX_MOUNTS) {
        if let Some((point, source)) = parse_line(line) {
            if point == wanted {
                found = Some(source);
            }
        }
    }
    found.ok_or_else(|| "nothing is mounted there".to_string())
}

/// What the open directory or file `fd` of this process is, as a mount of it would show: its
/// mount's file system and its path from that file system's root.
pub fn source_of(fd: std::os::fd::RawFd) -> Result<Source, String> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .map_err(|e| format!("the host cannot read its handle's details ({e})"))?;
    let mount_id = info
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .map(|v| v.trim().to_string())
        .ok_or("the host's kernel does not say its handle's mount")?;
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| format!("the host cannot read its handle's path ({e})"))?;
    let table = std::fs::read("/proc/self/mountinfo")
        .map_err(|e| format!("the host cannot read its own mount table ({e})"))?;
    for line in table.split(|b| *b == b'\n').take(MAX_MOUNTS) {
        let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        if fields.first() != Some(&mount_id.as_bytes()) {
            continue;
        }
        let (Some(point), Some((_, source))) = (fields.get(4), parse_line(line)) else {
            break;
        };
        let point = unescape(point);
        let path = path.as_os_str().as_bytes();
        let Some(rest) = path.strip_prefix(point.as_slice()) else {
            break;
        };
        // The path below the mount point, joined to the mount's own root.
        let rest = if point == b"/" { path } else { rest };
        let mut root = source.root.clone();
        if root.last() == Some(&b'/') && rest.first() == Some(&b'/') {
            root.pop();
        }
        root.extend_from_slice(rest);
        return Ok(Source {
            device: source.device,
            root,
        });
    }
    Err("the host cannot find its handle's mount in its own mount table".into())
}

/// A mount table line's mount point and source: `ID PARENT MAJOR:MINOR ROOT POINT ...`.
fn parse_line(line: &[u8]) -> Option<(Vec<u8>, Source)> {
    let mut fields = line.split(|b| *b == b' ');
    let (_id, _parent) = (fields.next()?, fields.next()?);
    let device = String::from_utf8(fields.next()?.to_vec()).ok()?;
    let root = unescape(fields.next()?);
    let point = unescape(fields.next()?);
    Some((point, Source { device, root }))
}

/// A mount table's field with its octal escapes (`\040` for a space, ...) undone.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// The parent process of `pid` (the fourth field of `/proc/<pid>/stat`, after the name in
/// parentheses, which may hold anything).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// gVisor's gofer of the container `id`, whose sandbox process is `sandbox`.
fn gofer_of(sandbox: u32, id: &str) -> Result<u32, String> {
    let parent = parent_of(sandbox).ok_or_else(|| {
        format!("gVisor's sandbox process {sandbox} is not visible from this server, so its mounts cannot be checked")
    })?;
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc cannot be read ({e})"))?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == sandbox || parent_of(pid) != Some(parent) {
            continue;
        }
        // runsc runs itself again as the gofer, under the name its first argument gives.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0);
        if args.next() != Some(GOFER.as_bytes()) {
            continue;
        }
        if args.any(|arg| String::from_utf8_lossy(arg).contains(id)) {
            return Ok(pid);
        }
    }
    Err(format!(
        "gVisor's gofer of the sandbox (a process {GOFER} beside its sandbox process \
         {sandbox}) was not found, so its mounts cannot be checked"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn mount_table_fields_are_unescaped_and_parsed() {
        assert_eq!(unescape(br"/a\040b\134c\012"), b"/a b\\c\n");
        assert_eq!(unescape(br"\0"), b"\\0");
        let (point, source) =
            parse_line(br"95 78 254:0 /tmp/my\040proj /mnt/r rw,relatime - ext4 /dev/vda rw")
                .unwrap();
        assert_eq!(point, b"/mnt/r");
        assert_eq!(source.device, "254:0");
        assert_eq!(source.root, b"/tmp/my proj");
        assert!(parse_line(b"95 78").is_none());
    }

    #[test]
    fn a_process_parent_is_read_past_its_name() {
        let parent = parent_of(std::process::id()).expect("this process's parent");
        assert_eq!(parent, std::os::unix::process::parent_id());
        assert!(parent_of(u32::MAX).is_none());
        assert!(mount_holder(None, false, "x")
            .unwrap_err()
            .contains("no process"));
        assert!(
            mount_holder(Some(std::process::id()), true, "no-such-container")
                .unwrap_err()
                .contains("gofer")
        );
    }

    #[test]
    fn a_handle_source_is_what_its_mount_shows() {
        let dir = std::env::temp_dir().join(format!("pcs-source-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("a b")).unwrap();
        let file = std::fs::File::open(dir.join("a b")).unwrap();
        let source = source_of(file.as_raw_fd()).unwrap();
        assert!(source.root.ends_with(b"/a b"), "{source:?}");
        // The root of this process's file system shows as itself.
        let slash = std::fs::File::open("/").unwrap();
        let root = source_of(slash.as_raw_fd()).unwrap();
        assert!(mounted_at(std::process::id(), "/").unwrap().device == root.device);
        assert!(mounted_at(std::process::id(), "/no/such/mount")
            .unwrap_err()
            .contains("nothing is mounted"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
