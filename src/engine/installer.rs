//! Installing dependencies outside the code's sandbox, into a shared cache.
//!
//! Nothing a package brings may reach another client, so the cache volume is written only by the
//! project's own maintenance script, never by an installer:
//!
//! - An install runs in its own short-lived sandbox (same image, user and limits, the only one
//!   with a network). It never mounts the cache: it installs into a staging tmpfs volume of its
//!   own (`SANDBOX_DEPS_INSTALL_MAX`, so its writes are bounded while it runs), with pip's
//!   `--only-binary :all:` / uv's `--no-build` unless the operator allows source builds (then
//!   without the shared download cache).
//! - A maintenance sandbox (root with only CHOWN, FOWNER and DAC_OVERRIDE, no network, our script
//!   only) then publishes the staged set: it copies it (regular files, directories and symlinks;
//!   nothing else) into the cache under a random name `s-<32 hex>`, makes it root's and
//!   read-only, measures its size and a SHA-256 digest over every path, type, mode, owner, link
//!   target and content, and records them in a manifest under `.meta/` (root only). The server
//!   keeps the digest too, under its cache directory.
//! - Before a set is first put on a sandbox's `sys.path` in this server process, a maintenance
//!   sandbox recomputes its digest: a set changed after publication is removed, never mounted,
//!   and installed again.
//! - Sandboxes mount the cache read-only. Its root is root's with mode 0711, so a sandbox can
//!   open the sets whose random names it was given, but cannot list the others.
//! - Every maintenance run removes what in the volume is no set (stray files, old layouts,
//!   staging left by a dead publisher). Sizes for eviction and `cache list` are the maintenance
//!   script's own measurement.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::backend::{paths, SandboxSpec, VolumeMount};
use super::deps::{self, IndexConfig, Installer, Requirement};
use crate::config::{Config, DownloadCache, NetworkPolicy, OperatorMount};

/// Where the installer's staging volume is mounted (and where maintenance reads it).
pub(super) const STAGE: &str = "/opt/stage";

/// Runs in the installer sandbox. Arguments arrive as JSON literals spliced into the source (the
/// code never goes through a shell; each requirement is its own argv element).
const INSTALL_SCRIPT: &str = r#"
import json, os, shutil, subprocess, sys
UV_ARGV = json.loads(__UV_ARGV__)
PIP_ARGV = json.loads(__PIP_ARGV__)
target = "/opt/stage/target"
build = "/opt/stage/build"
os.makedirs(target)
os.makedirs(build)
argv = UV_ARGV if shutil.which("uv") else PIP_ARGV
argv = [target if a == "{TARGET}" else a for a in argv]
print("installer:", os.path.basename(argv[0]), flush=True)
env = dict(os.environ, TMPDIR=build, PIP_NO_INPUT="1", UV_LINK_MODE="copy")
code = subprocess.run(argv, env=env, cwd=build, stdin=subprocess.DEVNULL).returncode
if code != 0:
    raise SystemExit(code)
print("staged", flush=True)
"#;

/// Runs in a maintenance sandbox (root, no network): the only code that writes the cache volume.
/// `OP` says what to do: `publish` the staged set of a key, `verify` a key's set, or `list` the
/// sets after removing `remove`. Every run first puts the volume's root in order and removes
/// whatever is no set. Prints one JSON object.
const MAINTENANCE_SCRIPT: &str = r#"
import hashlib, json, os, re, secrets, shutil, stat, time
OP = json.loads(__OP__)
ROOT = "/opt/deps"
META = os.path.join(ROOT, ".meta")
STAGED = "/opt/stage/target"
KEY = re.compile(r"d-[0-9a-f]{32}\Z")
NAME = re.compile(r"s-[0-9a-f]{32}\Z")
YOUNG = 600  # seconds a publisher may take between its steps

def remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for top, dirs, files in os.walk(path):
            os.chmod(top, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)

def read_manifest(key):
    try:
        fd = os.open(os.path.join(META, key + ".json"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(1 << 20)
    try:
        m = json.loads(data)
    except ValueError:
        return None
    if not isinstance(m, dict) or not NAME.fullmatch(str(m.get("name", ""))):
        return None
    return m

def manifests():
    out = {}
    for entry in os.listdir(META):
        key = entry[:-5] if entry.endswith(".json") else ""
        m = read_manifest(key) if KEY.fullmatch(key) else None
        path = os.path.join(META, entry)
        if m is None or not os.path.isdir(os.path.join(ROOT, m["name"])) or os.path.islink(os.path.join(ROOT, m["name"])):
            if not (entry.startswith(".tmp-") and time.time() - os.lstat(path).st_mtime < YOUNG):
                remove(path)
            continue
        out[key] = m
    return out

def tidy():
    """The root is root's and only traversable; the manifests root's only; no stray entries."""
    os.chown(ROOT, 0, 0)
    os.chmod(ROOT, 0o711)
    if os.path.islink(META) or (os.path.exists(META) and not os.path.isdir(META)):
        remove(META)
    os.makedirs(META, exist_ok=True)
    os.chown(META, 0, 0)
    os.chmod(META, 0o700)
    sets = manifests()
    named = {m["name"] for m in sets.values()}
    removed = []
    for entry in os.listdir(ROOT):
        if entry == ".meta" or entry in named:
            continue
        path = os.path.join(ROOT, entry)
        publishing = NAME.fullmatch(entry) or (entry.startswith(".tmp-") and NAME.fullmatch(entry[5:]))
        if publishing and time.time() - os.lstat(path).st_mtime < YOUNG:
            continue
        remove(path)
        removed.append(entry)
    return sets, removed

def walk(top):
    """Every path under top (top included), relative, sorted; never follows a link."""
    paths = ["."]
    for directory, dirs, files in os.walk(top):
        rel = os.path.relpath(directory, top)
        for name in dirs + files:
            paths.append(os.path.normpath(os.path.join(rel, name)))
    return sorted(paths)

def measure(top):
    digest = hashlib.sha256()
    size = 0
    for rel in walk(top):
        path = os.path.join(top, rel)
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            content = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    content.update(chunk)
            extra = content.hexdigest()
            size += st.st_size
        elif stat.S_ISLNK(st.st_mode):
            extra = os.readlink(path)
        else:
            extra = ""
        kind = stat.S_IFMT(st.st_mode)
        digest.update(json.dumps([rel, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra]).encode() + b"\n")
    return "sha256:" + digest.hexdigest(), size

def copy(source, dest):
    """Regular files, directories and symlinks, owned by root, without write bits."""
    skipped = 0
    os.mkdir(dest, 0o700)
    for rel in walk(source)[1:]:
        src, dst = os.path.join(source, rel), os.path.join(dest, rel)
        st = os.lstat(src)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst, 0o700)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f, open(dst, "xb") as out:
                shutil.copyfileobj(f, out, 1 << 20)
            os.chmod(dst, 0o555 if st.st_mode & 0o111 else 0o444)
        else:
            skipped += 1
    for rel in reversed(walk(dest)):
        path = os.path.join(dest, rel)
        os.lchown(path, 0, 0)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o555)
    return skipped

def publish(key, requirements):
    existing = read_manifest(key)
    if existing is not None and os.path.isdir(os.path.join(ROOT, existing["name"])):
        return {"status": "exists"}
    name = "s-" + secrets.token_hex(16)
    staging = os.path.join(ROOT, ".tmp-" + name)
    try:
        skipped = copy(STAGED, staging)
        digest, size = measure(staging)
        os.rename(staging, os.path.join(ROOT, name))
    except BaseException:
        remove(staging)
        raise
    manifest = {"key": key, "name": name, "digest": digest, "size": size,
                "requirements": requirements, "published": int(time.time())}
    temp = os.path.join(META, ".tmp-" + name)
    with open(temp, "x") as f:
        json.dump(manifest, f)
    os.chmod(temp, 0o600)
    os.rename(temp, os.path.join(META, key + ".json"))
    return {"status": "published", "name": name, "digest": digest, "size": size, "skipped": skipped}

def verify(key, expected, sets):
    m = sets.get(key)
    if m is None:
        return {"status": "missing"}
    digest, size = measure(os.path.join(ROOT, m["name"]))
    if digest != (expected or m.get("digest")) or digest != m.get("digest"):
        remove(os.path.join(ROOT, m["name"]))
        remove(os.path.join(META, key + ".json"))
        return {"status": "tampered", "digest": digest}
    return {"status": "ok", "name": m["name"], "digest": digest, "size": size}

for key in OP.get("remove", []):
    m = read_manifest(key) if KEY.fullmatch(key) else None
    if m is not None:
        remove(os.path.join(ROOT, m["name"]))
        remove(os.path.join(META, key + ".json"))
sets, strays = tidy()
if OP["op"] == "publish":
    result = publish(OP["key"], OP["requirements"])
elif OP["op"] == "verify":
    result = verify(OP["key"], OP.get("expected"), sets)
else:
    result = {"sets": [{"key": k, "name": m["name"], "size": int(m.get("size", 0)), "digest": m.get("digest", ""),
                        "requirements": m.get("requirements", []), "mtime": int(m.get("published", 0))}
                       for k, m in sorted(sets.items())]}
result["strays"] = strays
print(json.dumps(result))
"#;

/// One installed set, as `cache list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedSet {
    pub key: String,
    /// Bytes of its files, as the maintenance script measured them.
    pub size: u64,
    pub requirements: Vec<String>,
    /// Unix seconds of the last use this host recorded (or the install time).
    pub last_used: u64,
    /// The set's directory name in the volume (random).
    #[serde(default)]
    pub name: String,
    /// The digest recorded when it was published (the host's copy, checked before first use).
    #[serde(default)]
    pub digest: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct UsageIndex {
    pub(super) sets: BTreeMap<String, CachedSet>,
}

/// Serializes installs per key, counts installer launches, and keeps the cache under its cap.
pub struct Dependencies {
    pub(super) locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) installs: AtomicU64,
    pub(super) usage: Mutex<UsageIndex>,
    pub(super) usage_file: PathBuf,
    /// Sets checked against their digest in this process: key -> directory name.
    pub(super) verified: Mutex<HashMap<String, String>>,
}

impl Dependencies {
    pub fn new(config: &Config) -> Self {
        // One index per cache volume: keys of one volume say nothing about another.
        let usage_file = config
            .cache_dir
            .join(format!("deps-usage-{}.json", config.deps.volume));
        let usage = std::fs::read(&usage_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Dependencies {
            locks: Mutex::default(),
            installs: AtomicU64::new(0),
            usage: Mutex::new(usage),
            usage_file,
            verified: Mutex::default(),
        }
    }

    /// How many installers this engine started (tests assert a cached run starts none).
    pub fn installs_started(&self) -> u64 {
        self.installs.load(Ordering::Relaxed)
    }

    pub(super) fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    pub(super) fn verified_name(&self, key: &str) -> Option<String> {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified.get(key).cloned()
    }

    pub(super) fn set_verified(&self, key: &str, name: Option<&str>) {
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        match name {
            Some(name) => verified.insert(key.to_string(), name.to_string()),
            None => verified.remove(key),
        };
    }

    /// The digest this host recorded for `key` when it was published or first verified.
    pub(super) fn recorded_digest(&self, key: &str) -> Option<String> {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        usage
            .sets
            .get(key)
            .map(|s| s.digest.clone())
            .filter(|d| !d.is_empty())
    }

    /// Records what maintenance measured of a set (size, name, digest).
    pub(super) fn record(&self, key: &str, requirements: &[String], measured: &Measured) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let entry = usage
            .sets
            .entry(key.to_string())
            .or_insert_with(|| CachedSet {
                key: key.to_string(),
                size: 0,
                requirements: requirements.to_vec(),
                last_used: now(),
                name: String::new(),
                digest: String::new(),
            });
        entry.size = measured.size;
        entry.name = measured.name.clone();
        entry.digest = measured.digest.clone();
        self.save_usage(&usage);
    }

    /// Records a use, for least-recently-used eviction; returns the cache's total size.
    pub(super) fn touch(&self, key: &str) -> u64 {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = usage.sets.get_mut(key) {
            entry.last_used = now();
        }
        let total = usage.sets.values().map(|s| s.size).sum();
        self.save_usage(&usage);
        total
    }

    pub(super) fn save_usage(&self, usage: &UsageIndex) {
        let Ok(bytes) = serde_json::to_vec_pretty(usage) else {
            return;
        };
        if let Some(dir) = self.usage_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let temp = self
            .usage_file
            .with_extension(format!("tmp-{}", std::process::id()));
        if std::fs::write(&temp, bytes).is_ok() {
            let _ = std::fs::rename(&temp, &self.usage_file);
        }
    }

    pub(super) fn forget(&self, keys: &[String]) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            usage.sets.remove(key);
            self.set_verified(key, None);
        }
        self.save_usage(&usage);
    }

    pub(super) fn usage_snapshot(&self) -> Vec<CachedSet> {
        self.usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sets
            .values()
            .cloned()
            .collect()
    }
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What the maintenance script measured of a published set.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Measured {
    pub(super) name: String,
    pub(super) digest: String,
    pub(super) size: u64,
}

/// The index configuration that goes into keys and installer arguments (never into sandboxes).
pub fn index_config(config: &Config) -> IndexConfig {
    let ca_bundle_digest = config
        .ca_bundle
        .as_ref()
        .and_then(|path| std::fs::read(path).ok())
        .map(|bytes| {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(&bytes);
            digest
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        });
    IndexConfig {
        index_url: config.deps.index_url.clone(),
        extra_index_urls: config.deps.extra_index_urls.clone(),
        ca_bundle_digest,
        allow_source_builds: config.deps.allow_source_builds,
    }
}

/// Volumes every sandbox gets: the dependency cache, read-only (its root lists nothing to them).
pub fn sandbox_volumes(config: &Config) -> Vec<VolumeMount> {
    vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: true,
        tmpfs_bytes: None,
    }]
}

/// An installer: a network, its own staging tmpfs read-write, the download cache only when no
/// package code runs (wheels only), never the cache volume nor the operator's mounts.
pub(super) fn installer_spec(base: &SandboxSpec, config: &Config, staging: &str) -> SandboxSpec {
    let mut volumes = vec![VolumeMount {
        name: staging.to_string(),
        target: STAGE.to_string(),
        read_only: false,
        tmpfs_bytes: Some(config.deps.install_max_bytes),
    }];
    let mut mounts = Vec::new();
    if !config.deps.allow_source_builds {
        match &config.deps.download_cache {
            DownloadCache::Volume(name) => volumes.push(VolumeMount {
                name: name.clone(),
                target: paths::DOWNLOAD_CACHE.to_string(),
                read_only: false,
                tmpfs_bytes: None,
            }),
            DownloadCache::HostPath(path) => mounts.push(OperatorMount {
                host: path.clone(),
                container: paths::DOWNLOAD_CACHE.to_string(),
                read_only: false,
            }),
            DownloadCache::Off => {}
        }
    }
    let mut spec = base.clone();
    spec.network = NetworkPolicy::Bridge;
    spec.volumes = volumes;
    spec.mounts = mounts;
    spec.maintenance = false;
    spec
}

/// A maintenance sandbox: no network, the cache volume read-write, a staging volume read-only.
pub(super) fn maintenance_spec(
    base: &SandboxSpec,
    config: &Config,
    staging: Option<&str>,
) -> SandboxSpec {
    let mut volumes = vec![VolumeMount {
        name: config.deps.volume.clone(),
        target: paths::DEPS.to_string(),
        read_only: false,
        tmpfs_bytes: None,
    }];
    if let Some(staging) = staging {
        volumes.push(VolumeMount {
            name: staging.to_string(),
            target: STAGE.to_string(),
            read_only: true,
            tmpfs_bytes: None,
        });
    }
    let mut spec = base.clone();
    spec.network = NetworkPolicy::None;
    spec.volumes = volumes;
    spec.mounts = Vec::new();
    spec.maintenance = true;
    spec
}

/// Whether the installer downloads through the shared cache.
pub(super) fn uses_download_cache(config: &Config) -> bool {
    !config.deps.allow_source_builds && config.deps.download_cache != DownloadCache::Off
}

fn json_literal(value: &impl Serialize) -> String {
    // A JSON string literal of the JSON text: valid Python source, decoded with json.loads.
    let inner = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    serde_json::to_string(&inner).unwrap_or_else(|_| "\"null\"".into())
}

pub(super) fn install_script(
    requirements: &[Requirement],
    index: &IndexConfig,
    cache: bool,
) -> String {
    let cache_dir = |sub: &str| cache.then(|| format!("{}/{sub}", paths::DOWNLOAD_CACHE));
    let uv = deps::installer_argv(
        requirements,
        "{TARGET}",
        Installer::Uv,
        index,
        cache_dir("uv").as_deref(),
    );
    let pip = deps::installer_argv(
        requirements,
        "{TARGET}",
        Installer::Pip,
        index,
        cache_dir("pip").as_deref(),
    );
    INSTALL_SCRIPT
        .replace("__UV_ARGV__", &json_literal(&uv))
        .replace("__PIP_ARGV__", &json_literal(&pip))
}

pub(super) fn maintenance_script(op: &serde_json::Value) -> String {
    MAINTENANCE_SCRIPT.replace("__OP__", &json_literal(op))
}

/// One install's way out: its internal network and the proxy on it.
pub(super) struct Egress {
    pub(super) network: String,
    pub(super) proxy: Option<super::backend::SandboxId>,
    pub(super) address: String,
}

/// What verifying a set found.
pub(super) enum Verified {
    Ok(Measured),
    Missing,
    Tampered,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_script_carries_arguments_as_data() {
        let requirements = deps::parse_requirements(&["six==1.16.0".to_string()], false).unwrap();
        let script = install_script(&requirements, &IndexConfig::default(), true);
        assert!(script.contains("six==1.16.0"));
        assert!(script.contains("--only-binary"), "wheels only by default");
        assert!(script.contains("/opt/pip-cache/pip"));
        assert!(!script.contains("__"), "every placeholder is filled");
    }

    #[test]
    fn json_literals_cannot_break_out_of_the_string() {
        let evil = vec!["\"); import os; os.system('x') #".to_string()];
        let literal = json_literal(&evil);
        assert!(literal.starts_with('"') && literal.ends_with('"'));
        let decoded: String = serde_json::from_str(&literal).unwrap();
        let back: Vec<String> = serde_json::from_str(&decoded).unwrap();
        assert_eq!(back, evil);
    }
}
