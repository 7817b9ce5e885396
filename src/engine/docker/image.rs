//! The sandbox image: how it is built, online or offline, and fetched at first use.
//!
//! One recipe ([`RECIPE`], a Dockerfile) adds what the engine relies on (uid 1000 with a home,
//! `/workspace`, a `python` alias) on top of a base. Online the base is `python:3.11-slim`. Offline
//! (no registry reachable) the base is a Debian bookworm rootfs made with debootstrap and imported;
//! it is kept under [`OFFLINE_BASE`] so rebuilding the recipe later takes seconds. Flavours
//! ([`flavour`]) are derived images with a pinned set of packages baked in. The egress proxy's
//! image ([`PROXY_IMAGE`]) is a rootfs of its own, Debian's Squid and Python, made the same way
//! ([`ensure_proxy`]): no registry is needed for it either.

pub mod fetch;
pub mod flavour;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;

use bollard::models::BuildInfo;
use bollard::query_parameters::{BuildImageOptions, CreateImageOptions};
use bollard::Docker;
use futures_util::{Stream, StreamExt};
use tokio_util::io::ReaderStream;

use crate::config::DEFAULT_IMAGE;
use crate::engine::backend::BackendError;
use crate::engine::egress::PROXY_IMAGE;
use crate::engine::progress::{self, ProgressSink};
pub use fetch::Index;

/// The recipe applied on top of either base.
pub const RECIPE: &str = include_str!("Dockerfile");
/// The online base.
pub const ONLINE_BASE: &str = "python:3.11-slim";
/// The tag of the imported debootstrap rootfs.
pub const OFFLINE_BASE: &str = "python-code-sandbox-base:bookworm";
/// Packages of the offline rootfs (curl: agents' code and shell cells expect it).
const DEBOOTSTRAP_INCLUDE: &str = "python3,python3-pip,python3-venv,ca-certificates,curl";
/// Packages of the egress proxy's image: Debian's Squid built with OpenSSL (it bumps the TLS of
/// hosts a secret is bound to), OpenSSL's tool (the proxy makes its CA with it), and Python for its
/// relay.
const PROXY_INCLUDE: &str = "squid-openssl,openssl,python3";
/// The egress proxy's online base: the same Debian release, its packages from apt.
const PROXY_ONLINE_BASE: &str = "debian:bookworm-slim";
/// Label carrying a hash of the recipe, so a stale image is recognisable.
pub const RECIPE_LABEL: &str = "io.python-code-sandbox.recipe";
/// The runner's IPython set (pinned and hashed), installed by the recipe.
use crate::engine::runner_set::LOCK as IPYTHON_SET;

/// Why the image could not be built or fetched; the tool or client error is kept as the source.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Engine(#[from] bollard::errors::Error),
    /// A step of the engine's build or import failed.
    #[error("{what}: {source}")]
    Step {
        what: &'static str,
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine reported an error in its progress stream.
    #[error("{what}: {message}")]
    Refused { what: &'static str, message: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot run debootstrap ({0}); install it (apt-get install debootstrap) and run as root"
    )]
    NoDebootstrap(#[source] std::io::Error),
    #[error("debootstrap failed ({status}); it needs root. Last lines:\n{last_lines}")]
    Debootstrap {
        status: std::process::ExitStatus,
        last_lines: String,
    },
    #[error("tar of the rootfs failed ({0})")]
    Tar(std::process::ExitStatus),
    /// The first stage could not install from the package index: why, as the installers'
    /// failures are classified, with pip's own last lines.
    #[error("the image build could not install {what} from the package index: {failure}")]
    Index {
        what: &'static str,
        #[source]
        failure: Box<crate::engine::deps::InstallFailure>,
    },
}

impl ImageError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
        let what = what.into();
        move |source| ImageError::Io { what, source }
    }
}

/// How to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildMode {
    /// Online, falling back to offline when the base cannot be pulled.
    Auto,
    /// Offline only.
    Offline,
}

/// The sandbox image's label: its recipe, the runner's IPython set and the offline base's
/// packages (a base made from another list makes another image).
pub fn recipe_hash() -> String {
    fnv(RECIPE
        .bytes()
        .chain(IPYTHON_SET.bytes())
        .chain(DEBOOTSTRAP_INCLUDE.bytes()))
}

/// Whether `image` exists and carries `label` (it was made from what `label` hashes).
async fn labelled(docker: &Docker, image: &str, label: &str) -> bool {
    docker
        .inspect_image(image)
        .await
        .ok()
        .and_then(|found| found.config)
        .and_then(|config| config.labels)
        .and_then(|labels| labels.get(RECIPE_LABEL).cloned())
        .is_some_and(|current| current == label)
}

/// FNV-1a: stable across Rust versions, unlike DefaultHasher.
fn fnv(bytes: impl Iterator<Item = u8>) -> String {
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016x}")
}

/// What to tell a user whose image is missing.
pub fn missing_hint(image: &str) -> String {
    if let Some(flavour) = flavour::for_tag(image) {
        format!(
            "build it with `python-code-sandbox image build --flavour {}` (it needs the package \
             index: PIP_INDEX_URL, SANDBOX_CA_BUNDLE)",
            flavour.name
        )
    } else if image == PROXY_IMAGE {
        "it is made on first use, or by `python-code-sandbox image build` (offline: it needs root \
         and debootstrap)"
            .to_string()
    } else if image == DEFAULT_IMAGE {
        "build it with `python-code-sandbox image build` (add `--offline` where no registry is \
         reachable; that needs root and debootstrap)"
            .to_string()
    } else {
        format!("pull it with `docker pull {image}`, or build it")
    }
}

/// Makes `image` available: present already, else built (the default image) or pulled.
pub async fn ensure(docker: &Docker, image: &str, index: &Index) -> Result<(), BackendError> {
    // The proxy's image is checked against its package list too: one made from an older list
    // (Squid without OpenSSL) is made again.
    if image != PROXY_IMAGE && docker.inspect_image(image).await.is_ok() {
        return Ok(());
    }
    if image == PROXY_IMAGE {
        return ensure_proxy(docker, &progress::logged("proxy image build"))
            .await
            .map_err(|e| BackendError::ImageMissing {
                image: image.to_string(),
                hint: format!(
                    "building it failed ({e}); build it with `python-code-sandbox image build` \
                     (it needs root and debootstrap)"
                ),
            });
    }
    if image == DEFAULT_IMAGE {
        tracing::info!(image, "sandbox image missing: building it (one time)");
        let progress = progress::logged("image build");
        return build(docker, image, BuildMode::Auto, index, &progress)
            .await
            .map_err(|e| BackendError::ImageMissing {
                image: image.to_string(),
                hint: format!("building it failed ({e}); {}", missing_hint(image)),
            });
    }
    if flavour::for_tag(image).is_some() {
        // Built here only: there is nothing to pull, and a build takes minutes and the index.
        return Err(BackendError::ImageMissing {
            image: image.to_string(),
            hint: missing_hint(image),
        });
    }
    tracing::info!(image, "sandbox image missing: pulling it");
    pull(docker, image, &progress::logged("image pull"))
        .await
        .map_err(|e| BackendError::ImageMissing {
            image: image.to_string(),
            hint: format!("pulling it failed ({e}); {}", missing_hint(image)),
        })
}

/// Pulls `image` from its registry, telling `progress` each layer's state.
pub async fn pull(docker: &Docker, image: &str, progress: &ProgressSink) -> Result<(), ImageError> {
    progress(&format!("pulling {image}"));
    let options = CreateImageOptions {
        from_image: Some(image.to_string()),
        ..Default::default()
    };
    let mut stream = docker.create_image(Some(options), None, None);
    while let Some(step) = stream.next().await {
        let step = step?;
        if let Some(status) = step.status {
            tracing::debug!(image, "{status}");
            if let Some(layer) = step.id {
                progress(&format!("pulling {image}: {layer} {status}"));
            }
        }
    }
    Ok(())
}

/// Builds the sandbox image and tags it `tag`, telling `progress` each step.
pub async fn build(
    docker: &Docker,
    tag: &str,
    mode: BuildMode,
    index: &Index,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    let base = match mode {
        BuildMode::Auto => {
            if docker.inspect_image(ONLINE_BASE).await.is_ok() {
                ONLINE_BASE.to_string()
            } else {
                match pull(docker, ONLINE_BASE, progress).await {
                    Ok(()) => ONLINE_BASE.to_string(),
                    Err(e) => {
                        tracing::warn!("cannot pull {ONLINE_BASE} ({e}); building offline instead");
                        offline_base(docker, progress).await?
                    }
                }
            }
        }
        BuildMode::Offline => offline_base(docker, progress).await?,
    };
    build_recipe(docker, &base, tag, index, progress).await
}

/// The imported debootstrap rootfs, made when it is missing or was made from another package
/// list.
async fn offline_base(docker: &Docker, progress: &ProgressSink) -> Result<String, ImageError> {
    let label = fnv(DEBOOTSTRAP_INCLUDE.bytes());
    if labelled(docker, OFFLINE_BASE, &label).await {
        progress(&format!("using the existing offline base {OFFLINE_BASE}"));
        return Ok(OFFLINE_BASE.to_string());
    }
    let changes = vec![format!("LABEL {RECIPE_LABEL}={label}")];
    rootfs_image(docker, DEBOOTSTRAP_INCLUDE, OFFLINE_BASE, changes, progress).await?;
    Ok(OFFLINE_BASE.to_string())
}

/// The egress proxy's image, made (debootstrap, about a minute) when it is missing or was made
/// from another package list.
pub async fn ensure_proxy(docker: &Docker, progress: &ProgressSink) -> Result<(), ImageError> {
    let label = fnv(PROXY_INCLUDE.bytes());
    if labelled(docker, PROXY_IMAGE, &label).await {
        progress(&format!("using the existing {PROXY_IMAGE}"));
        return Ok(());
    }
    // Online when the base can be had (a registry, or the engine has it), offline otherwise.
    let online = docker.inspect_image(PROXY_ONLINE_BASE).await.is_ok()
        || pull(docker, PROXY_ONLINE_BASE, progress).await.is_ok();
    if online {
        let recipe = format!(
            "FROM {PROXY_ONLINE_BASE}\nRUN apt-get update && apt-get install -y \
             --no-install-recommends {} && rm -rf /var/lib/apt/lists/*\n",
            PROXY_INCLUDE.replace(',', " ")
        );
        let context = pack_context(&[("Dockerfile", recipe.as_bytes())])?;
        let options = BuildImageOptions {
            t: Some(PROXY_IMAGE.to_string()),
            dockerfile: "Dockerfile".to_string(),
            rm: true,
            forcerm: true,
            labels: Some(HashMap::from([(RECIPE_LABEL.to_string(), label)])),
            ..Default::default()
        };
        progress(&format!("building {PROXY_IMAGE} from {PROXY_ONLINE_BASE}"));
        let stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
        return follow_build(stream, progress)
            .await
            .map_err(|failure| failure.error);
    }
    let changes = vec![format!("LABEL {RECIPE_LABEL}={label}")];
    rootfs_image(docker, PROXY_INCLUDE, PROXY_IMAGE, changes, progress).await
}

/// A debootstrap rootfs with `include`, imported as `repo`.
async fn rootfs_image(
    docker: &Docker,
    include: &str,
    repo: &str,
    changes: Vec<String>,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    let workdir = tempdir()?;
    let rootfs = workdir.join("rootfs");
    let result = async {
        debootstrap(&rootfs, include, progress).await?;
        import_rootfs(docker, &rootfs, repo, changes, progress).await
    }
    .await;
    if let Err(e) = std::fs::remove_dir_all(&workdir) {
        tracing::warn!("could not remove {}: {e}", workdir.display());
    }
    result
}

fn tempdir() -> Result<std::path::PathBuf, ImageError> {
    // Under /var/tmp, not /tmp: a rootfs is a few hundred MB and /tmp may be a small tmpfs.
    let dir = Path::new("/var/tmp").join(format!(
        "python-code-sandbox-rootfs-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(ImageError::io(format!("cannot create {}", dir.display())))?;
    Ok(dir)
}

async fn debootstrap(
    rootfs: &Path,
    include: &str,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    let mirror = crate::config::settings::DEBOOTSTRAP_MIRROR.read_process_env();
    progress(&format!(
        "debootstrap bookworm into {} (about a minute)",
        rootfs.display()
    ));
    let mut command = tokio::process::Command::new("debootstrap");
    command
        .arg("--variant=minbase")
        .arg(format!("--include={include}"))
        .arg("bookworm")
        .arg(rootfs);
    if let Some(mirror) = mirror {
        command.arg(mirror);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(ImageError::NoDebootstrap)?;
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stdout);
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        return Err(ImageError::Debootstrap {
            status: output.status,
            last_lines: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(())
}

async fn import_rootfs(
    docker: &Docker,
    rootfs: &Path,
    repo: &str,
    changes: Vec<String>,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    progress(&format!("importing the rootfs as {repo}"));
    // The system tar handles every file type a rootfs has (device nodes included).
    let mut tar = tokio::process::Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["--numeric-owner", "-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(ImageError::io("cannot run tar"))?;
    let stdout = tar.stdout.take().ok_or_else(|| ImageError::Io {
        what: "cannot read tar's output".into(),
        source: std::io::ErrorKind::BrokenPipe.into(),
    })?;
    let body = ReaderStream::new(stdout).filter_map(|chunk| async move { chunk.ok() });
    // The whole reference as `repo`, no `tag`: Podman ignores `tag` on an import (the image
    // would be `:latest`); Docker reads a tagged `repo` the same way.
    let options = CreateImageOptions {
        from_src: Some("-".to_string()),
        repo: Some(repo.to_string()),
        changes,
        ..Default::default()
    };
    let mut stream = docker.create_image(Some(options), Some(bollard::body_stream(body)), None);
    while let Some(step) = stream.next().await {
        let step = step.map_err(|source| ImageError::Step {
            what: "import failed",
            source,
        })?;
        if let Some(message) = step.error_detail.and_then(|d| d.message) {
            return Err(ImageError::Refused {
                what: "import failed",
                message,
            });
        }
    }
    let status = tar
        .wait()
        .await
        .map_err(ImageError::io("waiting for tar"))?;
    if !status.success() {
        return Err(ImageError::Tar(status));
    }
    Ok(())
}

async fn build_recipe(
    docker: &Docker,
    base: &str,
    tag: &str,
    index: &Index,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    progress(&format!("building {tag} from {base}"));
    // The first stage reaches the index with this bundle (the host's own by default), which is
    // what lets the build through where TLS is intercepted.
    const BUNDLE_AT: &str = "/tmp/pcs-fetch/ca-bundle.crt";
    let bundle = index.bundle()?;
    let pip_conf = index.pip_conf((!bundle.is_empty()).then_some(BUNDLE_AT));
    let context = pack_context(&[
        ("Dockerfile", RECIPE.as_bytes()),
        ("fetch/pip.conf", pip_conf.as_bytes()),
        ("fetch/ca-bundle.crt", bundle.as_slice()),
        ("fetch/ipython-set.txt", IPYTHON_SET.as_bytes()),
    ])?;
    let build_id = fetch::build_id();
    let options = BuildImageOptions {
        t: Some(tag.to_string()),
        dockerfile: "Dockerfile".to_string(),
        rm: true,
        forcerm: true,
        buildargs: Some(HashMap::from([
            ("BASE".to_string(), base.to_string()),
            ("BUILD_ID".to_string(), build_id.clone()),
        ])),
        labels: Some(HashMap::from([
            (RECIPE_LABEL.to_string(), recipe_hash()),
            (
                crate::engine::runner_set::IMAGE_LABEL.to_string(),
                crate::engine::runner_set::digest(),
            ),
        ])),
        ..Default::default()
    };
    let stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    let built = follow_build(stream, progress).await;
    fetch::remove_first_stage(docker, &build_id).await;
    built.map_err(|failure| match failure.marked.as_deref() {
        Some(RUNNER_IPYTHON) => index_failure(index, "the runner's IPython", &failure.step_output),
        _ => failure.error,
    })
}

/// The mark the recipe writes when the runner's IPython could not be installed.
const RUNNER_IPYTHON: &str = "runner-ipython";

/// Why pip could not install `what` in a build's first stage, from pip's own lines: the
/// installers' classification (there is no egress proxy in a build: what pip said is all).
pub(super) fn index_failure(index: &Index, what: &'static str, pip_output: &str) -> ImageError {
    use crate::engine::deps::{classify, Evidence, Route, Setting};
    let config = index.as_index_config();
    let evidence = Evidence {
        route: Route::ImageBuild,
        output: pip_output,
        diagnosis: "",
        connections: &[],
        timed_out: false,
    };
    let setting = Setting {
        index: &config,
        projects: &[],
        timeout: std::time::Duration::ZERO,
        install_max_bytes: 0,
    };
    ImageError::Index {
        what,
        failure: Box::new(classify(&evidence, &setting)),
    }
}

/// A build context: a tar of `(path, content)` files, each readable by all.
fn pack_context(files: &[(&str, &[u8])]) -> Result<Vec<u8>, ImageError> {
    let mut archive = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive
            .append_data(&mut header, name, *content)
            .map_err(ImageError::io("cannot pack the build context"))?;
    }
    archive
        .into_inner()
        .map_err(ImageError::io("cannot pack the build context"))
}

/// Lines of a recipe's own output that are steps for people (`==> installing 18 packages`).
const STEP_MARK: &str = "==> ";
/// The line a recipe's script writes to say why it failed, in a form read here.
const ERROR_MARK: &str = "pcs-flavour-error: ";
/// Lines of output kept to explain a failed build.
const TAIL_LINES: usize = 12;

/// Why a build failed: the error, and the recipe's own account of it when it gave one.
struct BuildFailure {
    error: ImageError,
    /// What the recipe said failed (after [`ERROR_MARK`]).
    marked: Option<String>,
    /// The output of the step that failed (since the last step line), bounded.
    step_output: String,
}

/// The most of one step's output kept to explain its failure.
const STEP_OUTPUT_MAX: usize = 64 << 10;
/// The most of one line of build output kept, in characters (pip prints what the index gives it:
/// a list of versions can be megabytes on one line).
const LINE_MAX: usize = 2000;
/// Output without a line's end is taken as a line once this long (bytes).
const PENDING_MAX: usize = 1 << 20;

/// A line of build output as shown: without escapes or other control characters, trimmed and
/// bounded.
fn shown_line(raw: &str) -> String {
    let line: String = crate::engine::deps::strip_ansi(raw)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let line = line.trim();
    match line.char_indices().nth(LINE_MAX) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_string(),
    }
}

/// Follows the engine's build output: each `Step N/M : …` line and each line the recipe marks
/// with [`STEP_MARK`] is a step, the rest is logged; the last lines explain a failure, never the
/// recipe's shell script (which the engine's own error message quotes).
async fn follow_build(
    mut stream: impl Stream<Item = Result<BuildInfo, bollard::errors::Error>> + Unpin,
    progress: &ProgressSink,
) -> Result<(), BuildFailure> {
    let mut pending = String::new();
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut step_output = String::new();
    let mut marked = None;
    let failed = loop {
        let Some(step) = stream.next().await else {
            return Ok(());
        };
        let step = match step {
            Ok(step) => step,
            Err(e) => break e.to_string(),
        };
        if let Some(message) = step.error_detail.and_then(|d| d.message) {
            break message;
        }
        let Some(chunk) = step.stream else { continue };
        // The engine sends output in chunks that need not end at a line's end.
        pending.push_str(&chunk);
        loop {
            let raw: String = match pending.find('\n') {
                Some(end) => pending.drain(..=end).collect(),
                None if pending.len() > PENDING_MAX => std::mem::take(&mut pending),
                None => break,
            };
            // The engine colours stderr; what the build printed is shown, so it goes without
            // escapes or other control characters, and bounded.
            let line = shown_line(&raw);
            let line = line.as_str();
            if line.is_empty() {
                continue;
            }
            if line.starts_with("Step ") {
                progress(line);
                step_output.clear();
            } else if let Some(step) = line.strip_prefix(STEP_MARK) {
                progress(step);
            } else if let Some(reason) = line.strip_prefix(ERROR_MARK) {
                marked = Some(reason.to_string());
            } else if step_output.len() < STEP_OUTPUT_MAX {
                step_output.push_str(line);
                step_output.push('\n');
            }
            tracing::debug!("build: {line}");
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
    };
    let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
    Err(BuildFailure {
        error: ImageError::Refused {
            what: "build failed",
            message: format!(
                "{}; its last lines:\n{}",
                without_script(&failed),
                lines.join("\n")
            ),
        },
        marked,
        step_output,
    })
}

/// The engine's words for a failed step without the step's command: the classic builder says
/// "The command '/bin/sh -c …' returned a non-zero code: N" (bollard adds its own prefix).
fn without_script(message: &str) -> String {
    const QUOTED: &str = "The command '";
    const RETURNED: &str = "' returned a non-zero code: ";
    match (message.find(QUOTED), message.rfind(RETURNED)) {
        (Some(_), Some(end)) => {
            let code = message[end + RETURNED.len()..].trim();
            format!("a step of the recipe failed (exit code {code})")
        }
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(text: &str) -> Result<BuildInfo, bollard::errors::Error> {
        Ok(BuildInfo {
            stream: Some(text.to_string()),
            ..Default::default()
        })
    }

    fn failed(message: &str) -> Result<BuildInfo, bollard::errors::Error> {
        Ok(BuildInfo {
            error_detail: Some(bollard::models::ErrorDetail {
                message: Some(message.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// A hostile index makes pip print what it likes (a version list of megabytes, escapes in a
    /// reason phrase): a failed build's text shows none of the escapes and is bounded, whatever
    /// the lines' length, and so is the recipe's own account of the failure.
    #[tokio::test]
    async fn a_failed_build_shows_bounded_lines_without_escapes() {
        let huge = "9".repeat(4 << 20);
        let steps = vec![
            output("Step 5/20 : RUN something\n"),
            output(&format!("\u{1b}[31mERROR: versions: {huge}\u{1b}[0m\n")),
            output(&format!("pcs-flavour-error: pin installed {huge}\n")),
            output(&format!("{huge} without an end")),
            failed("The command '/bin/sh -c x' returned a non-zero code: 1"),
        ];
        let progress: ProgressSink = std::sync::Arc::new(|_: &str| {});
        let failure = follow_build(futures_util::stream::iter(steps), &progress)
            .await
            .expect_err("the build failed");
        let text = failure.error.to_string();
        assert!(text.len() < 64 << 10, "{} bytes shown", text.len());
        assert!(!text.contains('\u{1b}'), "an escape is shown");
        assert!(text.contains("ERROR: versions: 999"), "{}", &text[..200]);
        let marked = failure.marked.expect("the recipe's account");
        assert!(marked.len() <= 4 << 10, "{} bytes of account", marked.len());
        assert!(
            failure.step_output.len() <= STEP_OUTPUT_MAX + (4 << 10),
            "{} bytes of step output",
            failure.step_output.len()
        );
    }
}
