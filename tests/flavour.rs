//! Image flavours through the command line, against the real Docker engine: `image build
//! --flavour datascience` (online through the configured index and CA bundle), its packages
//! imported with the network off and no install, a refusal when the index is unreachable, and
//! the allowed-images list applied to the flavour's tag as to any image.
//!
//! The default-tag image `python-code-sandbox:py3.11-datascience` is left for later tests; any
//! other image a test makes is removed.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use bollard::query_parameters::{ListImagesOptions, RemoveImageOptions};
use common::{docker, labelled, skip_without_engine, text};
use python_code_sandbox::engine::docker::image::flavour::{self, Flavour};

const BIN: &str = env!("CARGO_BIN_EXE_python-code-sandbox");
/// The label of a flavour build's first-stage images (removed after every build).
const BUILD_LABEL: &str = "io.python-code-sandbox.fetch-build";

/// The tests here share the flavour's tag: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn datascience() -> &'static Flavour {
    flavour::find("datascience").expect("the datascience flavour exists")
}

/// The binary with `args`, the test's environment (index, CA bundle) and `env` on top.
fn cli(args: &[&str], env: &[(&str, &str)], remove: &[&str]) -> (Output, u32) {
    let mut command = Command::new(BIN);
    command.args(args).envs(env.iter().copied());
    for name in remove {
        command.env_remove(name);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the binary");
    let pid = child.id();
    (child.wait_with_output().expect("wait"), pid)
}

/// Builds the flavour under its default tag; the first test to get here builds it.
fn build_datascience() -> String {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let tag = datascience().default_tag();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !*built {
        let (out, _) = cli(
            &["image", "build", "--flavour", "datascience"],
            &[],
            &["SANDBOX_IMAGE"],
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "the build failed:\n{stderr}");
        assert!(
            text(&out.stdout).contains(&format!("built {tag}")),
            "{}",
            text(&out.stdout)
        );
        // Every step was reported: the engine's steps and the recipe's own (the last stage's
        // own steps only when the engine does not reuse it from an earlier build of the same set).
        for step in [
            "Step 1/",
            "installing 18 pinned packages",
            "Downloading numpy-2.4.6",
            "flavour_build.py prepare",
        ] {
            assert!(stderr.contains(step), "no step {step:?} in:\n{stderr}");
        }
        *built = true;
    }
    tag
}

/// Image ids of a flavour build's first stage still on the engine.
async fn first_stage_images() -> Vec<String> {
    let filters = HashMap::from([("label".to_string(), vec![BUILD_LABEL.to_string()])]);
    docker()
        .await
        .list_images(Some(ListImagesOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .expect("list images")
        .into_iter()
        .map(|image| image.id)
        .collect()
}

/// The code the flavour must run with the network off: imports, versions, a PNG plot, whether
/// matplotlib read the baked font cache, and whether every loaded module had valid bytecode.
const CHECK: &str = r#"
import json, logging, os, socket, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
fonts_log = logging.getLogger("matplotlib.font_manager")
fonts_log.setLevel(logging.DEBUG)
fonts_log.addHandler(Keep())
import io, importlib.util
from importlib.metadata import version
import numpy, pandas, scipy.stats, sklearn.linear_model, PIL.Image
import matplotlib
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(numpy.arange(10), numpy.arange(10) ** 2)
ax.set_title("squares")
buffer = io.BytesIO()
fig.savefig(buffer, format="png")
plt.close(fig)
png = buffer.getvalue()
image = PIL.Image.open(io.BytesIO(png))
model = sklearn.linear_model.LinearRegression().fit(numpy.arange(10).reshape(-1, 1), numpy.arange(10) * 2.0)
frame = pandas.DataFrame({"x": [1, 2, 3]})
baked = "/opt/python-code-sandbox/flavour/matplotlib"
cache = matplotlib.get_cachedir()
same = [name for name in os.listdir(baked)
        if open(os.path.join(baked, name), "rb").read() == open(os.path.join(cache, name), "rb").read()]
checked, stale = 0, []
for module in list(sys.modules.values()):
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    if "-packages/" not in origin or not origin.endswith(".py"):
        continue
    checked += 1
    try:
        with open(importlib.util.cache_from_source(origin), "rb") as f:
            header = f.read(16)
        stat = os.stat(origin)
        valid = (int.from_bytes(header[4:8], "little") == 0
                 and int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
                 and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF)
    except OSError:
        valid = False
    if not valid:
        stale.append(origin)
print(json.dumps({
    "versions": {n: version(n) for n in ["numpy", "pandas", "matplotlib", "scipy", "scikit-learn", "pillow"]},
    "png": [png[:8] == b"\x89PNG\r\n\x1a\n", image.size[0] > 100],
    "fit": round(float(model.coef_[0]), 6),
    "rows": len(frame),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "cache": cache,
    "same_as_baked": same,
    "baked": sorted(os.listdir(baked)),
    "font_log": [r for r in records if "fontManager" in r],
    "bytecode_checked": checked,
    "bytecode_stale": stale[:5],
}))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_datascience_flavour_imports_its_set_with_the_network_off() {
    if skip_without_engine() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let flavour = datascience();
    let tag = build_datascience();

    // The image says what it is; nothing of the build's first stage is left, nor in its history.
    let docker = docker().await;
    let image = docker
        .inspect_image(&tag)
        .await
        .expect("the flavour exists");
    let labels = image.config.and_then(|c| c.labels).unwrap_or_default();
    assert_eq!(labels[flavour::FLAVOUR_LABEL], "datascience");
    assert_eq!(labels[flavour::PACKAGES_LABEL], flavour.pinned());
    assert_eq!(
        labels["io.python-code-sandbox.recipe"],
        flavour.recipe_hash()
    );
    assert_eq!(first_stage_images().await, Vec::<String>::new());
    let history = docker.image_history(&tag).await.expect("history");
    for entry in &history {
        assert!(
            !entry.created_by.contains("pcs-flavour") && !entry.created_by.contains("BUILD_ID"),
            "the first stage reached the image: {}",
            entry.created_by
        );
    }

    // Nor in its files: no pip configuration, CA bundle or staging directory anywhere.
    let found = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "0:0",
            tag.as_str(),
            "sh",
            "-c",
        ])
        .arg(
            "ls -A /tmp; find / -xdev \\( -name pip.conf -o -name ca-bundle.crt \
             -o -name pcs-flavour -o -name staging \\) -print",
        )
        .output()
        .expect("docker run");
    assert!(found.status.success(), "{}", text(&found.stderr));
    assert_eq!(
        text(&found.stdout),
        "",
        "the first stage's files reached the image"
    );

    // The network is off (the default SANDBOX_NETWORK=none) and nothing is installed.
    let script = std::env::temp_dir().join(format!("pcs-flavour-{}.py", std::process::id()));
    std::fs::write(&script, CHECK).expect("write the script");
    let (out, pid) = cli(
        &["run", script.to_str().expect("a UTF-8 path")],
        &[("SANDBOX_IMAGE", &tag)],
        &["SANDBOX_NETWORK", "SANDBOX_PRELOAD_DEPENDENCIES"],
    );
    let _ = std::fs::remove_file(&script);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = text(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("not the check's JSON ({e}): {line}\n{stderr}"));
    let pinned: HashMap<&str, &str> = flavour.packages.iter().copied().collect();
    for (name, version) in report["versions"].as_object().expect("versions") {
        assert_eq!(
            Some(&version.as_str().unwrap_or("")),
            pinned.get(name.as_str()),
            "{name}"
        );
    }
    assert_eq!(report["versions"].as_object().map(|v| v.len()), Some(6));
    assert_eq!(report["png"], serde_json::json!([true, true]), "{report}");
    assert_eq!(report["fit"], 2.0, "{report}");
    assert_eq!(report["rows"], 3);
    assert_eq!(report["interfaces"], serde_json::json!(["lo"]), "{report}");
    // Matplotlib read the font cache baked into the image (copied into the sandbox's
    // MPLCONFIGDIR at start-up), and built none of its own.
    assert_eq!(report["cache"], "/tmp/.matplotlib");
    assert!(
        !report["baked"].as_array().is_none_or(Vec::is_empty),
        "{report}"
    );
    assert_eq!(report["same_as_baked"], report["baked"], "{report}");
    let font_log = report["font_log"].to_string();
    assert!(
        font_log.contains("Using fontManager instance from /tmp/.matplotlib/fontlist-"),
        "{report}"
    );
    assert!(!font_log.contains("generated new fontManager"), "{report}");
    assert!(!stderr.contains("building the font cache"), "{stderr}");
    // Every module loaded from the packages had its bytecode compiled in the image and valid.
    assert!(report["bytecode_checked"].as_u64() > Some(200), "{report}");
    assert_eq!(report["bytecode_stale"], serde_json::json!([]), "{report}");

    let (containers, volumes) = labelled("io.python-code-sandbox.pid", &pid.to_string()).await;
    assert!(
        containers.is_empty() && volumes.is_empty(),
        "left behind: {containers:?} {volumes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_index_refuses_the_build_and_leaves_no_image() {
    if skip_without_engine() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let tag = format!(
        "pcs-test-flavour-closed:{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    // Port 9 on the build container's own loopback: refused at once, nothing leaves the machine.
    let (out, _) = cli(
        &["image", "build", "--flavour", "datascience", "--tag", &tag],
        &[("PIP_INDEX_URL", "http://127.0.0.1:9/simple")],
        &["PIP_EXTRA_INDEX_URL"],
    );
    let docker = docker().await;
    let exists = docker.inspect_image(&tag).await.is_ok();
    if exists {
        let _ = docker
            .remove_image(&tag, None::<RemoveImageOptions>, None)
            .await;
    }
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(!exists, "{tag} was built: {stderr}");
    // Explained as the installers' failures are, from pip's own lines.
    assert!(
        stderr.contains(
            "the image build could not install the flavour's packages from the package index: \
             the index http://127.0.0.1:9/simple did not answer the image build: it could not \
             connect to 127.0.0.1:9 (the connection was refused)"
        ) && stderr.contains("127.0.0.1 there is the build container itself")
            && stderr.contains("Check PIP_INDEX_URL")
            && stderr.contains("\npip said:\n"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("/bin/sh"),
        "the recipe is quoted: {stderr}"
    );
    assert_eq!(first_stage_images().await, Vec::<String>::new());

    // `image build` for a flavour's default tag (here from SANDBOX_IMAGE) builds that flavour,
    // never the plain image under its name; failing, it leaves the tag as it was.
    let flavour_tag = datascience().default_tag();
    let before = docker
        .inspect_image(&flavour_tag)
        .await
        .ok()
        .and_then(|i| i.id);
    let (out, _) = cli(
        &["image", "build"],
        &[
            ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
            ("SANDBOX_IMAGE", &flavour_tag),
        ],
        &["PIP_EXTRA_INDEX_URL"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("(flavour datascience)")
            && stderr.contains("did not answer the image build"),
        "{stderr}"
    );
    let after = docker
        .inspect_image(&flavour_tag)
        .await
        .ok()
        .and_then(|i| i.id);
    assert_eq!(before, after);
    assert_eq!(first_stage_images().await, Vec::<String>::new());
}

/// One MCP conversation over stdio: initialize, then `tools/call` `name` with `arguments`;
/// returns the call's response line.
fn mcp_call(env: &[(&str, &str)], name: &str, arguments: serde_json::Value) -> String {
    let mut child = Command::new(BIN)
        .arg("stdio")
        .envs(env.iter().copied())
        .env_remove("SANDBOX_IMAGE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the server");
    let mut input = child.stdin.take().expect("stdin");
    let output = child.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut send = |message: serde_json::Value| {
        writeln!(input, "{message}").expect("write to the server");
        input.flush().expect("flush");
    };
    let answer = |id: u64| loop {
        // Guards a hang only: a build-free call answers in seconds.
        let line = received
            .recv_timeout(Duration::from_secs(300))
            .expect("the server answers");
        let message: serde_json::Value = serde_json::from_str(&line).expect("JSON-RPC");
        if message["id"] == id {
            return line;
        }
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "flavour-test", "version": "0"}}}),
    );
    answer(1);
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}}),
    );
    let line = answer(2);
    drop(input);
    let status = child.wait().expect("the server ends when stdin closes");
    assert!(status.success(), "the server exited with {status}");
    line
}

#[tokio::test(flavor = "multi_thread")]
async fn the_allowed_images_list_applies_to_the_flavour() {
    if skip_without_engine() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let tag = build_datascience();
    let arguments = serde_json::json!({
        "code": "import numpy, sklearn\nprint('numpy', numpy.__version__)",
        "image": tag,
    });
    // Not in the list (the configured image is the default one): refused, naming what is allowed.
    let refused = mcp_call(
        &[("SANDBOX_ALLOWED_IMAGES", "python:3.12-slim")],
        "run_python_ephemeral",
        arguments.clone(),
    );
    assert!(
        refused.contains(&format!("image {tag} is not allowed"))
            && refused.contains("python:3.12-slim"),
        "{refused}"
    );
    assert!(!refused.contains("numpy 2.4.6"), "{refused}");
    // In the list: the flavour runs the code with its packages.
    let allowed = mcp_call(
        &[("SANDBOX_ALLOWED_IMAGES", "python-code-sandbox:py3.11-*")],
        "run_python_ephemeral",
        arguments,
    );
    assert!(allowed.contains("numpy 2.4.6"), "{allowed}");
}
