//! The Docker backend: sandboxes are containers, created through the Engine API (bollard).
//!
//! Every hardening choice lives in [`DockerBackend::container_body`], so one place says what a
//! sandbox is allowed to do. The connection is made lazily and kept: a server started while the
//! daemon is down still starts, and works as soon as the daemon answers.

mod deaths;
pub mod image;
mod listing;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Ipam, IpamConfig, Mount, MountType,
    MountVolumeOptions, MountVolumeOptionsDriverConfig, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest, ResourcesUlimits,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, DownloadFromContainerOptions,
    KillContainerOptions, ListNetworksOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveVolumeOptions, UploadToContainerOptions,
};
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::Mutex;

use super::backend::{
    paths, Backend, BackendError, BackendInfo, EngineKind, ExitInfo, Limit, LimitsRecord,
    OutputChunk, RunnerStreams, SandboxId, SandboxRecord, SandboxSpec,
};
use crate::config::NetworkPolicy;

pub struct DockerBackend {
    client: Mutex<Option<Docker>>,
    /// CA bundle given to an image build that has to reach PyPI (see `image`).
    build_index: image::Index,
    /// Images already checked, so `ensure_image` costs one lookup per image per process.
    ready_images: Mutex<Vec<String>>,
    /// The engine is Podman (asked once): its Docker-compatible API needs a few detours.
    podman: tokio::sync::OnceCell<bool>,
    /// How sandboxes the engine removed by itself ended (see `deaths`).
    deaths: std::sync::Arc<deaths::Deaths>,
    /// On Podman, each sandbox's own tmpfs volumes, by container id: a sandbox the engine removed
    /// by itself (auto-removal) can no longer be asked for them, and they must go too.
    podman_volumes: std::sync::Mutex<HashMap<String, Vec<String>>>,
    /// A create was dropped before the engine answered it (see `Backend::abandoned_a_create`).
    abandoned_create: std::sync::atomic::AtomicBool,
}

/// A request under way: dropped before [`Unanswered::answered`], it marks its flag (the engine may
/// still carry the request out).
struct Unanswered<'a>(Option<&'a std::sync::atomic::AtomicBool>);

impl Unanswered<'_> {
    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Default for DockerBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl DockerBackend {
    /// Creates a container of `spec` (and, on Podman, its tmpfs volumes first).
    async fn create_container(&self, spec: &SandboxSpec) -> Result<SandboxId, BackendError> {
        let docker = self.client().await?;
        self.deaths.watch(&docker).await;
        let name = format!("pcs-{}", uuid::Uuid::new_v4().simple());
        let mut body = Self::container_body(spec);
        label_own_volumes(&mut body, &name);
        let mut own_volumes = Vec::new();
        if self.is_podman(&docker).await? {
            for volume in podman_tmpfs_volumes(&mut body, &name) {
                let volume_name = volume.name.clone().unwrap_or_default();
                let created = create_volume_if_missing(&docker, volume).await;
                if volume_name.starts_with(&name) {
                    own_volumes.push(volume_name);
                }
                if let Err(e) = created {
                    remove_volumes(&docker, &own_volumes).await;
                    return Err(e);
                }
            }
        }
        let options = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        let created = docker.create_container(Some(options), body).await;
        if created.is_err() {
            // The engine may have made some of the container's volumes before it refused it, and
            // keeps them (Docker 20.10: a bind's source gone between its two checks).
            for volume in volumes_made_for(&docker, &name).await {
                if !own_volumes.contains(&volume) {
                    own_volumes.push(volume);
                }
            }
            remove_volumes(&docker, &own_volumes).await;
        }
        match created {
            Ok(created) => {
                if !own_volumes.is_empty() {
                    self.podman_volumes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(created.id.clone(), own_volumes);
                }
                Ok(SandboxId(created.id))
            }
            Err(e) if status_of(&e) == Some(404) => {
                // The image vanished since it was checked.
                self.ready_images.lock().await.retain(|i| i != &spec.image);
                Err(BackendError::ImageMissing {
                    image: spec.image.clone(),
                    hint: image::missing_hint(&spec.image),
                })
            }
            Err(e) => Err(classify(e)),
        }
    }

    /// One sample of a container's stats (`None` when the engine sent none).
    async fn stats_sample(
        &self,
        id: &SandboxId,
    ) -> Result<Option<bollard::models::ContainerStatsResponse>, BackendError> {
        let docker = self.client().await?;
        let options = bollard::query_parameters::StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stats = docker.stats(&id.0, Some(options));
        match stats.next().await {
            Some(sample) => sample.map(Some).map_err(|e| not_found_or(e, id)),
            None => Ok(None),
        }
    }

    pub fn new() -> Self {
        DockerBackend {
            client: Mutex::new(None),
            build_index: image::Index::default(),
            ready_images: Mutex::new(Vec::new()),
            podman: tokio::sync::OnceCell::new(),
            deaths: Default::default(),
            podman_volumes: Default::default(),
            abandoned_create: Default::default(),
        }
    }

    /// A backend set up from the configuration (the CA bundle for image builds).
    pub fn for_config(config: &crate::config::Config) -> Self {
        DockerBackend {
            build_index: image::Index::from_config(config),
            ..Self::new()
        }
    }

    /// The connected client; connects (honouring `DOCKER_HOST`) and negotiates the API version on
    /// first use, and again after a failed attempt.
    pub async fn client(&self) -> Result<Docker, BackendError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = Docker::connect_with_defaults()
            .map_err(|e| BackendError::unavailable(ConnectError::new(&e)))?
            .negotiate_version()
            .await
            .map_err(|e| BackendError::unavailable(ConnectError::new(&e)))?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// The container a sandbox is: every limit and hardening field is set here.
    pub fn container_body(spec: &SandboxSpec) -> ContainerCreateBody {
        let limits = &spec.limits;
        let memory = i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX);
        let labels: HashMap<String, String> = spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let networked = spec.network != NetworkPolicy::None || spec.network_name.is_some();
        let user = match spec.user {
            Some((uid, gid)) => format!("{uid}:{gid}"),
            None => paths::USER.to_string(),
        };

        // The bind mounts first, the volumes after them: Docker (20.10) makes each volume as it
        // reaches it in this list and checks a bind's source there too (again, after its first
        // check of the request); a source gone by then refuses the create, and a volume made
        // before that is kept. A bind refused first leaves nothing (see `create_container`
        // for what removes a volume made anyway).
        let mut mounts: Vec<Mount> = spec
            .mounts
            .iter()
            .map(|mount| Mount {
                target: Some(mount.container.clone()),
                source: Some(mount.host.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(mount.read_only),
                ..Default::default()
            })
            .collect();
        if let (true, Some(bundle)) = (networked, &spec.ca_bundle) {
            // Where libraries look: the system bundle's own path, and the variables they read.
            for target in [paths::CA_BUNDLE, paths::SYSTEM_CA_BUNDLE] {
                mounts.push(Mount {
                    target: Some(target.to_string()),
                    source: Some(bundle.display().to_string()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                });
            }
        }
        mounts.push(Mount {
            // An anonymous volume, removed with the container (remove with `v`), backed by a tmpfs
            // of the workspace's size: full, it fails writes with ENOSPC and the host's disk never
            // fills. Unlike a tmpfs mount it works with the archive API under a read-only root, and
            // it lives as long as the container: runner restarts keep the files.
            target: Some(paths::WORKSPACE.to_string()),
            typ: Some(MountType::VOLUME),
            volume_options: Some(tmpfs_volume(&labels, limits.workspace_bytes, &user)),
            ..Default::default()
        });
        for volume in &spec.volumes {
            let volume_options = volume
                .tmpfs_bytes
                .map(|bytes| tmpfs_volume(&labels, bytes, &user));
            mounts.push(Mount {
                target: Some(volume.target.clone()),
                source: Some(volume.name.clone()),
                typ: Some(MountType::VOLUME),
                read_only: Some(volume.read_only),
                volume_options,
                ..Default::default()
            });
        }
        let mut env = vec![
            format!("HOME={}", paths::HOME),
            "LANG=C.UTF-8".to_string(),
            "PYTHONIOENCODING=utf-8".to_string(),
            "PYTHONDONTWRITEBYTECODE=1".to_string(),
            // The home directory is on the read-only root: caches go to /tmp.
            format!("MPLCONFIGDIR={}/.matplotlib", paths::TMP),
            format!("XDG_CACHE_HOME={}/.cache", paths::TMP),
        ];
        if networked && spec.ca_bundle.is_some() {
            for var in [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "PIP_CERT",
                "CURL_CA_BUNDLE",
                "NODE_EXTRA_CA_CERTS",
                "GIT_SSL_CAINFO",
                "AWS_CA_BUNDLE",
            ] {
                env.push(format!("{var}={}", paths::CA_BUNDLE));
            }
        }

        // Maintenance of the dependency cache (our own scripts only) runs as root with just the
        // capabilities to take ownership of files and change them; everything else as uid 1000
        // with none.
        let (user, cap_add) = if spec.maintenance {
            (
                "0:0".to_string(),
                Some(
                    ["CHOWN", "FOWNER", "DAC_OVERRIDE"]
                        .map(String::from)
                        .to_vec(),
                ),
            )
        } else {
            (user, None)
        };
        env.extend(spec.env.iter().cloned());
        let host_config = HostConfig {
            cap_drop: Some(vec!["ALL".to_string()]),
            cap_add,
            security_opt: Some(vec!["no-new-privileges".to_string()]),
            pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
            memory: Some(memory),
            // Equal to memory: no swap at all.
            memory_swap: Some(memory),
            nano_cpus: Some((limits.cpus * 1e9).round() as i64),
            readonly_rootfs: Some(true),
            // `exec`: Docker's default for a tmpfs is noexec, but the runner's `pip` shim lives
            // in /tmp (python/runner/pip.py); noexec protected nothing, the code can run what it
            // writes to /workspace.
            tmpfs: Some(HashMap::from([(
                paths::TMP.to_string(),
                format!("rw,exec,nosuid,nodev,size={}", limits.tmp_bytes),
            )])),
            mounts: Some(mounts),
            network_mode: Some(
                spec.network_name
                    .clone()
                    .unwrap_or_else(|| spec.network.as_str().to_string()),
            ),
            runtime: spec.runtime.clone(),
            // On an egress network Docker's resolver answers nothing outside it (no query leaves):
            // a lookup fails in a second instead of the resolver's default ten.
            dns_options: (spec.network == NetworkPolicy::Allowlist)
                .then(|| vec!["timeout:1".to_string(), "attempts:1".to_string()]),
            // No init of Docker's: the runner's own supervisor is pid 1 (it reaps orphans, passes
            // the interrupt on, and outlives the runner; see python/runner/supervisor.py).
            init: Some(false),
            // Everything the sandbox writes goes to the attached host, never to a log file that
            // would grow on the host's disk.
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_string()),
                config: None,
            }),
            ipc_mode: Some("private".to_string()),
            ulimits: Some(sandbox_ulimits(limits.pids, spec.open_files)),
            // A sandbox that ended (its server gone, or killed) is removed by the engine with its
            // anonymous volumes: nothing is left for anyone to clean up.
            auto_remove: Some(true),
            sysctls: spec.no_forwarding.then(|| {
                HashMap::from([
                    ("net.ipv4.ip_forward".to_string(), "0".to_string()),
                    ("net.ipv6.conf.all.forwarding".to_string(), "0".to_string()),
                ])
            }),
            ..Default::default()
        };

        ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.command.clone()),
            entrypoint: Some(Vec::new()),
            user: Some(user),
            working_dir: Some(paths::WORKSPACE.to_string()),
            hostname: Some("sandbox".to_string()),
            env: Some(env),
            labels: Some(labels),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            // The engine closes the sandbox's stdin when the one attached client (this server)
            // goes: its supervisor then ends it (python/runner/supervisor.py), even after the
            // server was killed outright.
            stdin_once: Some(true),
            tty: Some(false),
            network_disabled: Some(!networked),
            host_config: Some(host_config),
            ..Default::default()
        }
    }
}

/// Open files a sandbox's process may have (soft: what Python gets by default; hard: what it may
/// raise itself to).
const NOFILE_SOFT: i64 = 1024;
const NOFILE_HARD: i64 = 4096;
/// Processes of the sandbox user, counted per uid across the whole host under runc (every sandbox
/// runs as uid 1000, so this budget is shared, unlike the pids cgroup limit which is per sandbox).
/// High enough that sandboxes never take it from each other (128 sandboxes at the default pids
/// limit), and no higher than the engine can grant: rootful Podman's own hard limit is 32768 on
/// hosts where root lacks CAP_SYS_RESOURCE, and a container asking for more does not start.
const NPROC: i64 = 32768;

/// Explicit resource limits for every sandbox. Left unset, the engine applies its own defaults:
/// Podman asks for limits above the host's hard limits, which runc cannot set without
/// CAP_SYS_RESOURCE ("error setting rlimit ... operation not permitted"), and Docker passes on its
/// daemon's limits, whatever they are.
fn sandbox_ulimits(pids: u64, open_files: Option<u64>) -> Vec<ResourcesUlimits> {
    let ulimit = |name: &str, soft: i64, hard: i64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(soft),
        hard: Some(hard),
    };
    // The pids cgroup limit is the per-sandbox bound: nproc is never the tighter one.
    let nproc = NPROC.max(i64::try_from(pids).unwrap_or(i64::MAX));
    vec![
        // No core dumps: they would land in the workspace.
        ulimit("core", 0, 0),
        match open_files.map(|n| i64::try_from(n).unwrap_or(i64::MAX)) {
            Some(n) => ulimit("nofile", n, n),
            None => ulimit("nofile", NOFILE_SOFT, NOFILE_HARD),
        },
        ulimit("nproc", nproc, nproc),
    ]
}

/// Why connecting to the engine failed, in words an operator can act on. bollard's own message for
/// a refused TLS handshake or a failed ssh is only "client error (SendRequest)": the cause (a bad
/// certificate, an unknown host key) is further down the error's chain, so the whole chain is
/// shown, with the endpoint and, for TLS and SSH, what to check.
#[derive(Debug)]
struct ConnectError(String);

impl ConnectError {
    fn new(error: &(dyn std::error::Error + 'static)) -> Self {
        let mut causes: Vec<String> = Vec::new();
        let mut next = Some(error);
        while let Some(cause) = next {
            let text = cause.to_string();
            // Wrappers often repeat their source's words: keep each cause once.
            if !causes.iter().any(|seen| seen.contains(&text)) {
                causes.push(text);
            }
            next = cause.source();
        }
        let endpoint = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string());
        let hint = if endpoint.starts_with("ssh://") {
            " (over SSH: `ssh` on this machine's PATH must log in without a prompt, with the host's \
             key already known, and the far side must have `docker` on its PATH for \
             `docker system dial-stdio`)"
                .to_string()
        } else if std::env::var_os("DOCKER_TLS_VERIFY").is_some_and(|v| !v.is_empty()) {
            let dir = std::env::var("DOCKER_CERT_PATH").unwrap_or_else(|_| "~/.docker".to_string());
            format!(
                " (over TLS with the certificates in DOCKER_CERT_PATH={dir}: ca.pem must be the CA \
                 that signed the engine's certificate, and cert.pem/key.pem a client certificate \
                 from a CA the engine trusts (its --tlscacert))"
            )
        } else {
            String::new()
        };
        ConnectError(format!("{endpoint}: {}{hint}", causes.join(": ")))
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

/// An anonymous local volume backed by a tmpfs of `bytes`, labelled like its sandbox.
fn tmpfs_volume(labels: &HashMap<String, String>, bytes: u64, user: &str) -> MountVolumeOptions {
    MountVolumeOptions {
        labels: Some(labels.clone()),
        driver_config: Some(MountVolumeOptionsDriverConfig {
            name: Some("local".to_string()),
            options: Some(HashMap::from([
                ("type".to_string(), "tmpfs".to_string()),
                ("device".to_string(), "tmpfs".to_string()),
                ("o".to_string(), workspace_mount_options(bytes, user)),
            ])),
        }),
        ..Default::default()
    }
}

/// Labels each volume made for the container `name` alone (the anonymous ones) with that name.
fn label_own_volumes(body: &mut ContainerCreateBody, name: &str) {
    let mounts = body
        .host_config
        .as_mut()
        .and_then(|host| host.mounts.as_mut());
    for mount in mounts.into_iter().flatten() {
        if mount.typ != Some(MountType::VOLUME) || mount.source.is_some() {
            continue;
        }
        if let Some(options) = mount.volume_options.as_mut() {
            options.labels.get_or_insert_with(HashMap::new).insert(
                crate::engine::owner::LABEL_VOLUME_OF.to_string(),
                name.to_string(),
            );
        }
    }
}

/// The volumes labelled as made for the container `name` (none when the engine cannot list them:
/// the sweep of orphaned storage finds them later by their owner's labels).
async fn volumes_made_for(docker: &Docker, name: &str) -> Vec<String> {
    let filter = HashMap::from([(
        "label".to_string(),
        vec![format!("{}={name}", crate::engine::owner::LABEL_VOLUME_OF)],
    )]);
    let options = ListVolumesOptions {
        filters: Some(filter),
    };
    match docker.list_volumes(Some(options)).await {
        Ok(listed) => listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|volume| volume.name)
            .collect(),
        Err(e) => {
            tracing::warn!(container = %name, "could not list the volumes of a refused create: {e}");
            Vec::new()
        }
    }
}

/// Podman (4.3) ignores the driver options of a volume mount (an anonymous volume then is a
/// directory on the host's disk, unbounded), so on Podman each such volume is created first,
/// by name, and mounted by that name: the anonymous ones as `<container name>-v<n>` (removed
/// with the sandbox, see `destroy`). Podman also takes `size=` in a tmpfs volume's options for a
/// disk quota it refuses ("Filesystem does not support Project Quota"): the same size is given
/// as `nr_blocks`, in pages of 4 KiB.
fn podman_tmpfs_volumes(
    body: &mut ContainerCreateBody,
    container: &str,
) -> Vec<bollard::models::VolumeCreateRequest> {
    let mounts = body
        .host_config
        .as_mut()
        .and_then(|host| host.mounts.as_mut());
    let mut volumes = Vec::new();
    for (index, mount) in mounts.into_iter().flatten().enumerate() {
        if mount.typ != Some(MountType::VOLUME) {
            continue;
        }
        let Some(options) = mount.volume_options.take() else {
            continue;
        };
        let Some(driver) = options.driver_config else {
            mount.volume_options = Some(MountVolumeOptions {
                driver_config: None,
                ..options
            });
            continue;
        };
        let name = mount
            .source
            .clone()
            .unwrap_or_else(|| format!("{container}-v{index}"));
        let driver_opts = driver.options.map(|mut opts| {
            if let Some(o) = opts.get_mut("o") {
                *o = podman_tmpfs_options(o);
            }
            opts
        });
        volumes.push(bollard::models::VolumeCreateRequest {
            name: Some(name.clone()),
            driver: driver.name,
            driver_opts,
            labels: options.labels,
            ..Default::default()
        });
        mount.source = Some(name);
    }
    volumes
}

/// `size=BYTES` as `nr_blocks=PAGES` (rounded up), the other options unchanged.
fn podman_tmpfs_options(options: &str) -> String {
    options
        .split(',')
        .map(
            |option| match option.strip_prefix("size=").map(str::parse::<u64>) {
                Some(Ok(bytes)) => format!("nr_blocks={}", bytes.div_ceil(4096).max(1)),
                _ => option.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join(",")
}

/// Creates a volume unless one of that name exists (Podman refuses to create it twice; a named
/// volume shared by sandboxes, like an installer's staging area, is created by the first).
async fn create_volume_if_missing(
    docker: &Docker,
    volume: bollard::models::VolumeCreateRequest,
) -> Result<(), BackendError> {
    let name = volume.name.clone().unwrap_or_default();
    match docker.create_volume(volume).await {
        Ok(_) => Ok(()),
        Err(e) => match docker.inspect_volume(&name).await {
            Ok(_) => Ok(()),
            Err(_) => Err(classify(e)),
        },
    }
}

/// The volumes created for a sandbox on Podman: mounted by it, named after its container.
async fn podman_own_volumes(docker: &Docker, id: &SandboxId) -> Vec<String> {
    let Ok(inspected) = inspect(docker, &id.0).await else {
        return Vec::new();
    };
    let container = inspected.name.unwrap_or_default();
    let prefix = format!("{}-v", container.trim_start_matches('/'));
    inspected
        .mounts
        .unwrap_or_default()
        .into_iter()
        .filter_map(|mount| mount.name)
        .filter(|name| !container.is_empty() && name.starts_with(&prefix))
        .collect()
}

/// Removes volumes this backend created for a sandbox, once its container is gone. Each is named
/// after that one container and mounted by no other, so it is removed with force: Podman can
/// still count a tmpfs volume as in use for a moment after its container's removal returned
/// (its cleanup process unmounts it), which a removal without force refuses (409 or 500). A
/// failure is logged; the sweep of orphaned storage finds a volume left by its labels.
async fn remove_volumes(docker: &Docker, names: &[String]) {
    for name in names {
        let options = RemoveVolumeOptions { force: true };
        if let Err(e) = docker.remove_volume(name, Some(options)).await {
            if status_of(&e) != Some(404) {
                tracing::warn!(volume = %name, "a sandbox's volume was not removed: {e}");
            }
        }
    }
}

/// Mount options of the workspace tmpfs: its size, an inode count in proportion (empty files cost
/// memory too), owned by the sandbox's `uid:gid`.
fn workspace_mount_options(bytes: u64, user: &str) -> String {
    let inodes = (bytes / 4096).max(1024);
    let (uid, gid) = user.split_once(':').unwrap_or(("1000", "1000"));
    format!("size={bytes},nr_inodes={inodes},uid={uid},gid={gid},mode=0755,nosuid,nodev")
}

/// Where `DOCKER_HOST` points (the local socket when unset).
pub fn endpoint() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
}

/// What Podman adds to the Docker API's description: from its `/info`, a `Rootless` field of its
/// own (Podman 4.3 lists no `name=rootless` in `SecurityOptions`, and bollard's `SystemInfo` has
/// no such field), and from its libpod `/info` the cgroup controllers its containers get.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodmanHost {
    pub rootless: bool,
    /// `host.cgroupControllers` of `/libpod/info`: the controllers Podman can set limits with
    /// (none for rootless Podman on cgroup v1, the delegated ones on cgroup v2).
    pub cgroup_controllers: Option<Vec<String>>,
}

impl PodmanHost {
    /// Reads the fields from the raw JSON of `/info` and `/libpod/info`.
    fn from_json(info: &str, libpod_info: Option<&str>) -> Result<PodmanHost, serde_json::Error> {
        #[derive(serde::Deserialize)]
        struct Info {
            #[serde(rename = "Rootless", default)]
            rootless: bool,
        }
        #[derive(serde::Deserialize)]
        struct LibpodInfo {
            host: LibpodHost,
        }
        #[derive(serde::Deserialize)]
        struct LibpodHost {
            #[serde(rename = "cgroupControllers")]
            cgroup_controllers: Option<Vec<String>>,
        }
        let rootless = serde_json::from_str::<Info>(info)?.rootless;
        let cgroup_controllers = match libpod_info {
            Some(text) => {
                serde_json::from_str::<LibpodInfo>(text)?
                    .host
                    .cgroup_controllers
            }
            None => None,
        };
        Ok(PodmanHost {
            rootless,
            cgroup_controllers,
        })
    }
}

/// The engine as its `/version` and `/info` describe it: Docker or Podman (whose version lists
/// a "Podman Engine" component), rootless or not, and the limits it cannot enforce.
///
/// Podman's Docker-compatible `/info` says every limit is supported even where it ignores them
/// all (rootless on cgroup v1: `MemoryLimit`, `PidsLimit`, `CpuCfsQuota` all `true`), so for
/// Podman the cgroup controllers it has (from `/libpod/info`) decide. Of Podman's runtimes only
/// its default is listed: the only one a container created through this API gets.
fn describe_engine(
    version: bollard::models::SystemVersion,
    info: bollard::models::SystemInfo,
    podman: Option<PodmanHost>,
) -> BackendInfo {
    let kind = if is_podman(&version) {
        EngineKind::Podman
    } else {
        EngineKind::Docker
    };
    let version_text = version.version.unwrap_or_default();
    let rootless = info
        .security_options
        .iter()
        .flatten()
        .any(|option| option.split(',').any(|part| part == "name=rootless"))
        || podman.as_ref().is_some_and(|p| p.rootless);
    let userns_remap = info
        .security_options
        .iter()
        .flatten()
        .any(|option| option.split(',').any(|part| part == "name=userns"));
    let cgroup_version = info
        .cgroup_version
        .map(|v| v.to_string())
        .filter(|v| !v.is_empty());
    let endpoint = endpoint();
    let remote = crate::config::settings::is_remote_endpoint(&endpoint);
    let registered: Vec<(String, bollard::models::Runtime)> = info
        .runtimes
        .unwrap_or_default()
        .into_iter()
        // Podman's compatible API takes no runtime from a container's `HostConfig.Runtime`: a
        // container asked for under `runsc` runs under its default runtime (`OCIRuntime: runc`),
        // so only that one can be had. (It also lists every runtime of its configuration whether
        // installed or not, e.g. `kata` at a path that does not exist.)
        .filter(|(name, _)| {
            kind != EngineKind::Podman || info.default_runtime.as_deref() == Some(name.as_str())
        })
        .collect();
    let runtime_paths = registered
        .iter()
        .filter_map(|(name, runtime)| {
            let path = runtime.path.as_deref().filter(|p| !p.is_empty())?;
            Some((name.clone(), path.to_string()))
        })
        .collect();
    let runtimes = registered
        .into_iter()
        .map(|(name, runtime)| (name, runtime.runtime_args.unwrap_or_default()))
        .collect();
    let controllers = podman.and_then(|p| p.cgroup_controllers);
    let has = |controller: &str| {
        controllers
            .as_ref()
            .is_none_or(|list| list.iter().any(|c| c == controller))
    };
    let mut unenforced = Vec::new();
    for (supported, controller, limit) in [
        (info.memory_limit, "memory", Limit::Memory),
        (info.swap_limit, "memory", Limit::Swap),
        (info.pids_limit, "pids", Limit::Pids),
        (info.cpu_cfs_quota, "cpu", Limit::Cpu),
    ] {
        if supported == Some(false) || !has(controller) {
            unenforced.push(limit);
        }
    }
    BackendInfo {
        name: format!("{} {version_text}", kind.as_str()),
        kind,
        version: version_text,
        api_version: version.api_version.unwrap_or_default(),
        rootless,
        userns_remap,
        cgroup_version,
        runtimes,
        runtime_paths,
        default_runtime: info.default_runtime.filter(|r| !r.is_empty()),
        unenforced,
        remote,
        endpoint,
        memory_bytes: info
            .mem_total
            .and_then(|m| u64::try_from(m).ok())
            .filter(|&m| m > 0),
        cpus: info
            .ncpu
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0),
    }
}

fn is_podman(version: &bollard::models::SystemVersion) -> bool {
    version
        .components
        .iter()
        .flatten()
        .any(|component| component.name.to_ascii_lowercase().contains("podman"))
}

/// A container's inspection. Podman reports a state Docker does not have (`stopped`: ended, not
/// yet cleaned up), which bollard cannot read; it is read here as `exited`, which it is.
async fn inspect(
    docker: &Docker,
    id: &str,
) -> Result<bollard::models::ContainerInspectResponse, DockerError> {
    match docker.inspect_container(id, None).await {
        Err(DockerError::JsonDataError { message, column }) => {
            let unreadable = || DockerError::JsonDataError {
                message: message.clone(),
                column,
            };
            // Read again as text. An error here is the engine's own answer: the container can be
            // gone by now (`stopped` is the state just before a removal completes), which the
            // caller must see as such, not as an answer it could not read.
            let text = get_text_as_is(docker, format!("/containers/{id}/json")).await?;
            let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&text) else {
                return Err(unreadable());
            };
            if let Some(status) = value.pointer_mut("/State/Status") {
                if status == "stopped" {
                    *status = serde_json::Value::from("exited");
                }
            }
            serde_json::from_value(value).map_err(|_| unreadable())
        }
        other => other,
    }
}

/// The body of `GET path` as text, for answers bollard has no call for or reads only in part.
/// bollard's ping (`GET /_ping`) returns the body as text, so a copy of the client whose request
/// to `/_ping` goes to `path` instead reads it, over whichever transport the client uses.
async fn get_text(docker: &Docker, path: String) -> Result<String, BackendError> {
    get_text_as_is(docker, path).await.map_err(classify)
}

/// [`get_text`] with the client's own error, for callers that tell its kinds apart.
async fn get_text_as_is(docker: &Docker, path: String) -> Result<String, DockerError> {
    let redirected = docker.clone().with_request_modifier(move |mut request| {
        let uri = request.uri().to_string();
        if let Some(base) = uri.strip_suffix("/_ping") {
            if let Ok(uri) = format!("{base}{path}").parse() {
                *request.uri_mut() = uri;
            }
        }
        request
    });
    redirected.ping().await
}

fn unreadable(what: &str, e: serde_json::Error) -> BackendError {
    BackendError::Unexpected(format!("the engine's {what} could not be read: {e}"))
}

/// Classifies a client error: the engine's own refusals, answers that could not be read, and
/// transport failures (the engine is unavailable).
fn classify(e: DockerError) -> BackendError {
    match e {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => BackendError::Refused {
            status: status_code,
            message,
        },
        DockerError::JsonDataError { .. } | DockerError::JsonSerdeError { .. } => {
            BackendError::Unreadable {
                source: std::sync::Arc::new(e),
            }
        }
        other => BackendError::unavailable(other),
    }
}

fn status_of(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the engine says the container does not exist: 404, or Podman's 500 "… does not exist
/// in database: no such container" for one removed while it was being looked up (auto-removal
/// racing a removal or an inspection).
fn container_gone(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404, ..
        } => true,
        DockerError::DockerResponseServerError {
            status_code: 500,
            message,
        } => message.contains("no such container"),
        _ => false,
    }
}

#[async_trait]
impl Backend for DockerBackend {
    async fn info(&self) -> Result<BackendInfo, BackendError> {
        let docker = self.client().await?;
        let version = docker.version().await.map_err(classify)?;
        let info_text = get_text(&docker, "/info".to_string()).await?;
        let info: bollard::models::SystemInfo =
            serde_json::from_str(&info_text).map_err(|e| unreadable("/info", e))?;
        let podman = if is_podman(&version) {
            // Podman serves its own API under a version prefix only (bollard sends none).
            let path = format!(
                "/v{}/libpod/info",
                version.version.as_deref().unwrap_or("4.0.0")
            );
            let libpod = get_text(&docker, path).await?;
            Some(
                PodmanHost::from_json(&info_text, Some(&libpod))
                    .map_err(|e| unreadable("/libpod/info", e))?,
            )
        } else {
            None
        };
        Ok(describe_engine(version, info, podman))
    }

    async fn ensure_image(&self, image: &str) -> Result<(), BackendError> {
        if self.ready_images.lock().await.iter().any(|i| i == image) {
            return Ok(());
        }
        let docker = self.client().await?;
        image::ensure(&docker, image, &self.build_index).await?;
        self.ready_images.lock().await.push(image.to_string());
        Ok(())
    }

    async fn image_id(&self, image: &str) -> Result<String, BackendError> {
        let docker = self.client().await?;
        match docker.inspect_image(image).await {
            Ok(inspected) => inspected
                .id
                .ok_or_else(|| BackendError::Unexpected(format!("image {image} has no id"))),
            Err(e) if status_of(&e) == Some(404) => Err(BackendError::ImageMissing {
                image: image.to_string(),
                hint: image::missing_hint(image),
            }),
            Err(e) => Err(classify(e)),
        }
    }

    async fn image_labels(&self, image: &str) -> Result<HashMap<String, String>, BackendError> {
        let docker = self.client().await?;
        match docker.inspect_image(image).await {
            Ok(inspected) => Ok(inspected.config.and_then(|c| c.labels).unwrap_or_default()),
            Err(e) if status_of(&e) == Some(404) => Err(BackendError::ImageMissing {
                image: image.to_string(),
                hint: image::missing_hint(image),
            }),
            Err(e) => Err(classify(e)),
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxId, BackendError> {
        let unanswered = Unanswered(Some(&self.abandoned_create));
        let created = self.create_container(spec).await;
        unanswered.answered();
        created
    }

    fn abandoned_a_create(&self) -> bool {
        self.abandoned_create
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn start(&self, id: &SandboxId) -> Result<RunnerStreams, BackendError> {
        let docker = self.client().await?;
        let options = AttachContainerOptions {
            stream: true,
            stdin: true,
            stdout: true,
            stderr: true,
            logs: false,
            ..Default::default()
        };
        let attached = docker
            .attach_container(&id.0, Some(options))
            .await
            .map_err(|e| not_found_or(e, id))?;
        docker
            .start_container(&id.0, None)
            .await
            .map_err(|e| not_found_or(e, id))?;
        let output = attached.output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    Some(Ok(OutputChunk::Stdout(message)))
                }
                Ok(LogOutput::StdErr { message }) => Some(Ok(OutputChunk::Stderr(message))),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(classify(e))),
            }
        });
        Ok(RunnerStreams {
            input: attached.input,
            output: Box::pin(output),
        })
    }

    async fn interrupt(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.signal(id, "SIGINT").await
    }

    async fn kill_processes(&self, id: &SandboxId) -> Result<(), BackendError> {
        // The supervisor (pid 1) kills every other process on SIGUSR1 and starts a new runner.
        self.signal(id, "SIGUSR1").await
    }

    async fn kill(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.signal(id, "SIGKILL").await
    }

    async fn recycle(&self, id: &SandboxId) -> Result<(), BackendError> {
        // The supervisor (pid 1) kills every other process on SIGUSR2, empties the places the
        // code can write, and starts a new runner.
        self.signal(id, "SIGUSR2").await
    }

    async fn memory_usage(&self, id: &SandboxId) -> Result<Option<u64>, BackendError> {
        let Some(sample) = self.stats_sample(id).await? else {
            return Ok(None);
        };
        let memory = sample.memory_stats.unwrap_or_default();
        // As `docker stats` counts it: the cgroup's usage without page cache it may drop
        // (cgroup v2 `inactive_file`, v1 `total_inactive_file`). Tmpfs pages stay counted.
        let inactive = memory.stats.as_ref().and_then(|stats| {
            stats
                .get("inactive_file")
                .or_else(|| stats.get("total_inactive_file"))
                .copied()
        });
        Ok(memory
            .usage
            .map(|usage| usage.saturating_sub(inactive.unwrap_or(0))))
    }

    async fn cpu_usage(&self, id: &SandboxId) -> Result<Option<Duration>, BackendError> {
        let Some(sample) = self.stats_sample(id).await? else {
            return Ok(None);
        };
        // The cgroup's cpuacct usage, in nanoseconds (under gVisor its sandbox's processes).
        Ok(sample
            .cpu_stats
            .and_then(|cpu| cpu.cpu_usage)
            .and_then(|usage| usage.total_usage)
            .filter(|&ns| ns > 0)
            .map(Duration::from_nanos))
    }

    async fn limits_record(&self, id: &SandboxId) -> Result<LimitsRecord, BackendError> {
        let docker = self.client().await?;
        let inspected = inspect(&docker, &id.0)
            .await
            .map_err(|e| not_found_or(e, id))?;
        let host = inspected.host_config.unwrap_or_default();
        let state = inspected.state.unwrap_or_default();
        Ok(LimitsRecord {
            runtime: host.runtime.filter(|runtime| !runtime.is_empty()),
            memory_bytes: host.memory,
            memory_swap_bytes: host.memory_swap,
            pids: host.pids_limit,
            nano_cpus: host.nano_cpus,
            cpu_quota: host.cpu_quota,
            cpu_period: host.cpu_period,
            security_options: host.security_opt.unwrap_or_default(),
            // 0 once the container has stopped.
            host_pid: state
                .pid
                .filter(|_| state.running == Some(true))
                .and_then(|pid| u32::try_from(pid).ok())
                .filter(|pid| *pid > 0),
        })
    }

    async fn oom_count(&self, id: &SandboxId) -> Option<u64> {
        self.deaths
            .following()
            .then(|| self.deaths.oom_count(&id.0))
    }

    async fn exit_info(&self, id: &SandboxId) -> Result<ExitInfo, BackendError> {
        let docker = self.client().await?;
        let inspected = match inspect(&docker, &id.0).await {
            Ok(inspected) => inspected,
            // Podman answers 500 "no such container" while its auto-removal is under way.
            Err(e) if container_gone(&e) => {
                // Removed by the engine once it ended: its events said how.
                return self
                    .deaths
                    .of(&id.0)
                    .await
                    .ok_or_else(|| not_found_or(e, id));
            }
            Err(e) => return Err(classify(e)),
        };
        let sandbox = inspected
            .config
            .and_then(|c| c.labels)
            .is_some_and(|labels| labels.contains_key(crate::engine::owner::LABEL_MANAGED));
        let state = inspected.state.unwrap_or_default();
        let running = state.running.unwrap_or(false);
        let mut oom_killed = state.oom_killed.unwrap_or(false);
        if sandbox && !running && !oom_killed && state.exit_code == Some(137) {
            // The engine may record the kernel's memory kill after the exit, or drop it (its
            // events of the server's sandboxes are followed; see `deaths`).
            oom_killed = self.deaths.killed_by_kernel(&id.0).await;
        }
        Ok(ExitInfo {
            running,
            exit_code: state.exit_code,
            oom_killed,
            started_at: state.started_at,
        })
    }

    async fn copy_in(&self, id: &SandboxId, dir: &str, archive: Bytes) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let options = UploadToContainerOptions {
            path: dir.to_string(),
            ..Default::default()
        };
        docker
            .upload_to_container(&id.0, Some(options), bollard::body_full(archive))
            .await
            .map_err(|e| not_found_or(e, id))
    }

    async fn copy_out(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: u64,
    ) -> Result<Bytes, BackendError> {
        let docker = self.client().await?;
        let options = DownloadFromContainerOptions {
            path: path.to_string(),
        };
        let mut stream = docker.download_from_container(&id.0, Some(options));
        let mut archive = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| not_found_or(e, id))?;
            if (archive.len() + chunk.len()) as u64 > max_bytes {
                return Err(BackendError::Unexpected(format!(
                    "{path} is larger than the {max_bytes}-byte limit for copying out"
                )));
            }
            archive.extend_from_slice(&chunk);
        }
        Ok(archive.freeze())
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), BackendError> {
        let docker = self.client().await?;
        // On Podman a sandbox's tmpfs volumes are named ones of ours (see podman_tmpfs_volumes):
        // their names are read while the container exists, and they go after it.
        let own_volumes = if self.is_podman(&docker).await? {
            let known = self
                .podman_volumes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id.0);
            match known {
                Some(names) => names,
                None => podman_own_volumes(&docker, id).await,
            }
        } else {
            Vec::new()
        };
        let removed = self.remove_container(&docker, id).await;
        if removed.is_ok() || matches!(removed, Err(BackendError::NotFound(_))) {
            remove_volumes(&docker, &own_volumes).await;
        } else if !own_volumes.is_empty() {
            // Still there: a later removal (or the sweep) needs the names again.
            self.podman_volumes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.0.clone(), own_volumes);
        }
        removed
    }

    async fn list(&self, label: &str, value: &str) -> Result<Vec<SandboxRecord>, BackendError> {
        let docker = self.client().await?;
        let body = get_text(&docker, listing::query(label, value)).await?;
        listing::records(&body)
    }

    async fn create_network(
        &self,
        name: &str,
        internal: bool,
        subnet: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let request = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".to_string()),
            internal: Some(internal),
            // An internal network still gives the host an address on its bridge, which the
            // containers could reach (traffic to the host is not forwarded, so Docker's isolation
            // rules do not see it): without it, the host is unreachable from the network.
            options: internal.then(|| {
                HashMap::from([(
                    "com.docker.network.bridge.inhibit_ipv4".to_string(),
                    "true".to_string(),
                )])
            }),
            labels: Some(labels.clone().into_iter().collect()),
            ipam: subnet.map(|subnet| Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        docker.create_network(request).await.map_err(classify)?;
        Ok(())
    }

    async fn remove_network(&self, name: &str) -> Result<(), BackendError> {
        let docker = self.client().await?;
        match docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn connect_network(&self, id: &SandboxId, network: &str) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let request = NetworkConnectRequest {
            container: id.0.clone(),
            endpoint_config: None,
        };
        docker
            .connect_network(network, request)
            .await
            .map_err(|e| not_found_or(e, id))
    }

    async fn disconnect_network(&self, id: &SandboxId, network: &str) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let request = NetworkDisconnectRequest {
            container: id.0.clone(),
            force: Some(true),
        };
        match docker.disconnect_network(network, request).await {
            Ok(()) => Ok(()),
            Err(e) if container_gone(&e) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn address_on(&self, id: &SandboxId, network: &str) -> Result<String, BackendError> {
        let docker = self.client().await?;
        let inspected = inspect(&docker, &id.0)
            .await
            .map_err(|e| not_found_or(e, id))?;
        inspected
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(network))
            .and_then(|endpoint| endpoint.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                BackendError::Unexpected(format!("sandbox {id} has no address on {network}"))
            })
    }

    async fn remove_volume(&self, name: &str) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let options = RemoveVolumeOptions { force: false };
        match docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn remove_orphaned_storage(
        &self,
        label: &str,
        value: &str,
        orphaned: &(dyn for<'l> Fn(&'l BTreeMap<String, String>) -> bool + Sync),
    ) -> Result<usize, BackendError> {
        let docker = self.client().await?;
        let filters = HashMap::from([
            ("label".to_string(), vec![format!("{label}={value}")]),
            ("dangling".to_string(), vec!["true".to_string()]),
        ]);
        let listed = docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(classify)?;
        let mut removed = 0;
        // Networks (the installers' egress networks): an attached container makes removal fail.
        let networks = docker
            .list_networks(Some(ListNetworksOptions {
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![format!("{label}={value}")],
                )])),
            }))
            .await
            .map_err(classify)?;
        for network in networks {
            let labels: BTreeMap<String, String> =
                network.labels.unwrap_or_default().into_iter().collect();
            if let (Some(name), true) = (network.name, orphaned(&labels)) {
                if docker.remove_network(&name).await.is_ok() {
                    removed += 1;
                }
            }
        }
        for volume in listed.volumes.unwrap_or_default() {
            let labels: BTreeMap<String, String> = volume.labels.into_iter().collect();
            if orphaned(&labels) {
                let options = RemoveVolumeOptions { force: false };
                if docker
                    .remove_volume(&volume.name, Some(options))
                    .await
                    .is_ok()
                {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

impl DockerBackend {
    /// Whether the container exists and runs (a failed inspection counts as running, so that
    /// the caller keeps the error it has).
    async fn is_running(&self, docker: &Docker, id: &SandboxId) -> bool {
        state_flag(docker, id, |state| state.running).await
    }

    /// Whether the engine is Podman, from its `/version` (asked once per backend).
    async fn is_podman(&self, docker: &Docker) -> Result<bool, BackendError> {
        self.podman
            .get_or_try_init(|| async {
                let version = docker.version().await.map_err(classify)?;
                Ok::<_, BackendError>(is_podman(&version))
            })
            .await
            .copied()
    }

    /// Removes a sandbox's container (and its anonymous volumes).
    async fn remove_container(&self, docker: &Docker, id: &SandboxId) -> Result<(), BackendError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match docker.remove_container(&id.0, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if container_gone(&e) => Ok(()),
            // 409: another caller is removing it already, or the engine is busy with it (a start
            // in progress). Podman answers 500 "container not running" when the container ends
            // while its forced removal kills it (it stays, exited). Done when it is gone; ask
            // again meanwhile.
            Err(e) if status_of(&e) == Some(409) || status_of(&e) == Some(500) => {
                for attempt in 0..200 {
                    match inspect(docker, &id.0).await {
                        Err(e) if container_gone(&e) => return Ok(()),
                        Err(e) => return Err(classify(e)),
                        Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                    }
                    if attempt % 10 == 9 {
                        let options = RemoveContainerOptions {
                            force: true,
                            v: true,
                            ..Default::default()
                        };
                        let _ = docker.remove_container(&id.0, Some(options)).await;
                    }
                }
                Err(BackendError::Unexpected(format!(
                    "sandbox {id} is still there 10s after its removal was asked: {}",
                    classify(e)
                )))
            }
            Err(e) => Err(classify(e)),
        }
    }

    async fn signal(&self, id: &SandboxId, signal: &str) -> Result<(), BackendError> {
        let docker = self.client().await?;
        let options = KillContainerOptions {
            signal: signal.to_string(),
        };
        match docker.kill_container(&id.0, Some(options)).await {
            Ok(()) => Ok(()),
            // 409: not running (it already ended): nothing left to signal.
            Err(e) if status_of(&e) == Some(409) => Ok(()),
            // Podman says the same with a 500 ("can only kill running containers ... container
            // state improper"): whether the container still runs decides.
            Err(e) if status_of(&e) == Some(500) && !self.is_running(&docker, id).await => Ok(()),
            Err(e) => Err(not_found_or(e, id)),
        }
    }
}

/// A container-scoped call's error: the container gone (see [`container_gone`]: Podman's 500 for
/// one auto-removed during the call included, so that a session whose container Podman removed
/// is ended and its storage removed, as on Docker), else the engine's answer.
fn not_found_or(e: DockerError, id: &SandboxId) -> BackendError {
    if container_gone(&e) {
        BackendError::NotFound(id.clone())
    } else {
        classify(e)
    }
}

/// One flag of a container's state; `true` when it cannot be read (see `is_running`).
async fn state_flag(
    docker: &Docker,
    id: &SandboxId,
    flag: impl Fn(bollard::models::ContainerState) -> Option<bool>,
) -> bool {
    match inspect(docker, &id.0).await {
        Ok(inspected) => inspected.state.and_then(flag).unwrap_or(true),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback engine that gives each request the next of `answers` (status, body), and
    /// closes the connection after it.
    async fn scripted_engine(answers: Vec<(u16, &'static str)>) -> Docker {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            for (status, body) in answers {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
        });
        Docker::connect_with_http(
            &format!("http://{address}"),
            10,
            bollard::API_DEFAULT_VERSION,
        )
        .expect("a client")
    }

    const STOPPED: &str =
        r#"{"Id":"e98d","Name":"/pcs-x","State":{"Status":"stopped","Running":false}}"#;

    #[tokio::test]
    async fn a_container_podman_reports_stopped_reads_as_exited() {
        let docker = scripted_engine(vec![(200, STOPPED), (200, STOPPED)]).await;
        let inspected = inspect(&docker, "e98d").await.expect("read");
        let status = inspected.state.and_then(|state| state.status);
        assert_eq!(
            status,
            Some(bollard::models::ContainerStateStatusEnum::EXITED)
        );
    }

    #[tokio::test]
    async fn a_stopped_container_removed_before_it_is_read_again_counts_as_gone() {
        // Podman's `stopped` comes just before a removal completes: by the second reading the
        // container was gone, and that was reported as an unreadable answer (the removal failed
        // and the sandbox's volume stayed: a CI failure on Podman).
        let gone = r#"{"message":"no such container","response":404}"#;
        let docker = scripted_engine(vec![(200, STOPPED), (404, gone)]).await;
        let answer = inspect(&docker, "e98d").await;
        assert!(matches!(&answer, Err(e) if container_gone(e)), "{answer:?}");
    }

    #[test]
    fn a_container_podman_no_longer_has_counts_as_gone() {
        let answer = |status_code, message: &str| DockerError::DockerResponseServerError {
            status_code,
            message: message.to_string(),
        };
        assert!(container_gone(&answer(404, "No such container: x")));
        // Podman 4.3, a container auto-removed while its removal was asked.
        assert!(container_gone(&answer(
            500,
            "container e98d does not exist in database: no such container"
        )));
        assert!(!container_gone(&answer(500, "container not running")));
        assert!(!container_gone(&answer(409, "removal in progress")));
        // Each container-scoped call says so as NotFound (an inspection racing the removal was
        // reported as a refusal: the session was never ended and its volume stayed).
        let id = SandboxId("e98d".into());
        let gone = not_found_or(
            answer(
                500,
                "container e98d does not exist in database: no such container",
            ),
            &id,
        );
        assert!(matches!(gone, BackendError::NotFound(_)), "{gone:?}");
        let refused = not_found_or(answer(500, "container not running"), &id);
        assert!(
            matches!(refused, BackendError::Refused { .. }),
            "{refused:?}"
        );
    }

    /// `/version` and `/info` as Podman 4.3.1 (Debian bookworm) answers them, trimmed to the
    /// fields read here; rootless on cgroup v1 says every limit is supported.
    const PODMAN_VERSION: &str = r#"{"Components":[{"Name":"Podman Engine","Version":"4.3.1"},
        {"Name":"Conmon","Version":"conmon version 2.1.6"}],"Version":"4.3.1","ApiVersion":"1.41"}"#;
    const PODMAN_ROOTLESS_INFO: &str = r#"{"CgroupVersion":"1","CgroupDriver":"cgroupfs",
        "MemoryLimit":true,"SwapLimit":true,"PidsLimit":true,"CpuCfsQuota":true,
        "SecurityOptions":["name=seccomp,profile=default"],"DefaultRuntime":"runc",
        "Runtimes":{"runc":{"path":"/usr/bin/runc"},"runsc":{"path":"/usr/bin/runsc"},
        "kata":{"path":"/usr/bin/kata-runtime"}},"Rootless":true,"Driver":"vfs"}"#;
    const PODMAN_ROOTLESS_LIBPOD: &str =
        r#"{"host":{"cgroupVersion":"v1","cgroupControllers":[],"security":{"rootless":true}}}"#;
    const PODMAN_ROOTFUL_LIBPOD: &str = r#"{"host":{"cgroupVersion":"v1","cgroupControllers":
        ["cpuset","cpu","cpuacct","blkio","memory","devices","freezer","pids"]}}"#;

    fn podman(info: &str, libpod: &str) -> BackendInfo {
        let version = serde_json::from_str(PODMAN_VERSION).expect("version");
        let host = PodmanHost::from_json(info, Some(libpod)).expect("podman fields");
        describe_engine(
            version,
            serde_json::from_str(info).expect("info"),
            Some(host),
        )
    }

    #[test]
    fn rootless_podman_on_cgroup_v1_is_rootless_and_enforces_nothing() {
        let engine = podman(PODMAN_ROOTLESS_INFO, PODMAN_ROOTLESS_LIBPOD);
        assert_eq!(engine.kind, EngineKind::Podman);
        assert_eq!(engine.name, "Podman 4.3.1");
        assert!(engine.rootless);
        assert_eq!(engine.cgroup_version.as_deref(), Some("1"));
        assert_eq!(
            engine.unenforced,
            vec![Limit::Memory, Limit::Swap, Limit::Pids, Limit::Cpu]
        );
        // Only the default runtime: the compatible API ignores HostConfig.Runtime.
        assert_eq!(engine.runtimes.keys().collect::<Vec<_>>(), vec!["runc"]);
    }

    #[test]
    fn rootful_podman_enforces_what_its_controllers_allow() {
        let info = PODMAN_ROOTLESS_INFO.replace(r#""Rootless":true"#, r#""Rootless":false"#);
        let engine = podman(&info, PODMAN_ROOTFUL_LIBPOD);
        assert!(!engine.rootless);
        assert!(engine.unenforced.is_empty(), "{:?}", engine.unenforced);
        let without_pids = PODMAN_ROOTFUL_LIBPOD.replace(r#","pids""#, "");
        assert_eq!(podman(&info, &without_pids).unenforced, vec![Limit::Pids]);
    }

    #[test]
    fn docker_rootless_is_read_from_its_security_options() {
        let version = serde_json::from_str(
            r#"{"Components":[{"Name":"Engine","Version":"20.10.24"}],"Version":"20.10.24"}"#,
        )
        .expect("version");
        let info = serde_json::from_str(
            r#"{"CgroupVersion":"2","MemoryLimit":true,"SwapLimit":false,"PidsLimit":true,
            "SecurityOptions":["name=seccomp,profile=builtin","name=rootless"],
            "Runtimes":{"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc",
            "runtimeArgs":["--network=none"]}}}"#,
        )
        .expect("info");
        let engine = describe_engine(version, info, None);
        assert_eq!(engine.kind, EngineKind::Docker);
        assert!(engine.rootless);
        assert_eq!(engine.unenforced, vec![Limit::Swap]);
        assert_eq!(
            engine.runtimes.get("runsc"),
            Some(&vec!["--network=none".to_string()])
        );
        assert_eq!(
            engine.runtime_paths.get("runsc").map(String::as_str),
            Some("/usr/bin/runsc")
        );
        assert_eq!(
            engine.runtime_paths.get("runc").map(String::as_str),
            Some("runc")
        );
    }

    #[test]
    fn every_sandbox_gets_explicit_ulimits_within_the_hosts() {
        let ulimits = sandbox_ulimits(256, None);
        let get = |name: &str| {
            ulimits
                .iter()
                .find(|u| u.name.as_deref() == Some(name))
                .map(|u| (u.soft.unwrap_or(-1), u.hard.unwrap_or(-1)))
        };
        assert_eq!(get("core"), Some((0, 0)));
        assert_eq!(get("nofile"), Some((1024, 4096)));
        assert_eq!(get("nproc"), Some((32768, 32768)));
        // nproc is never tighter than the pids limit.
        let big = sandbox_ulimits(40000, None);
        assert!(big
            .iter()
            .any(|u| u.name.as_deref() == Some("nproc") && u.hard == Some(40000)));
    }

    #[test]
    fn podman_gets_tmpfs_sizes_as_pages_and_named_volumes() {
        assert_eq!(
            podman_tmpfs_options("size=1048577,nr_inodes=1024,uid=1000,nosuid"),
            "nr_blocks=257,nr_inodes=1024,uid=1000,nosuid"
        );
        let mut body = ContainerCreateBody {
            host_config: Some(HostConfig {
                mounts: Some(vec![
                    Mount {
                        target: Some("/workspace".into()),
                        typ: Some(MountType::VOLUME),
                        volume_options: Some(tmpfs_volume(&HashMap::new(), 4096, paths::USER)),
                        ..Default::default()
                    },
                    Mount {
                        target: Some("/opt/deps".into()),
                        source: Some("deps".into()),
                        typ: Some(MountType::VOLUME),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let volumes = podman_tmpfs_volumes(&mut body, "pcs-x");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].name.as_deref(), Some("pcs-x-v0"));
        let o = volumes[0]
            .driver_opts
            .as_ref()
            .and_then(|opts| opts.get("o"))
            .cloned()
            .unwrap_or_default();
        assert!(o.starts_with("nr_blocks=1,"), "{o}");
        let mounts = body.host_config.and_then(|h| h.mounts).unwrap_or_default();
        assert_eq!(mounts[0].source.as_deref(), Some("pcs-x-v0"));
        assert!(mounts[0].volume_options.is_none());
        assert_eq!(mounts[1].source.as_deref(), Some("deps"));
    }
}
