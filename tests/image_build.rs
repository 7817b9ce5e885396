//! A sandbox image build that cannot install from its package index says why, as the installers'
//! failures are classified (engine::deps::failure), with pip's own lines and never the recipe's
//! shell script; it leaves no image behind, not even its first stage. The indexes are on this
//! host's docker bridge address, made by the test (never anything off this machine).

mod common;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use common::*;
use python_code_sandbox::engine::deps::FailureKind;
use python_code_sandbox::engine::docker::image::{self, BuildMode, ImageError, Index};
use python_code_sandbox::engine::outcome::NoAnswer;

/// An HTTPS server whose certificate nobody trusts (self-signed, made here), on the bridge
/// address; killed when dropped.
struct UntrustedIndex {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

const TLS_SERVER: &str = r#"
import http.server, ssl, sys
server = http.server.HTTPServer((sys.argv[1], 0), http.server.BaseHTTPRequestHandler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

impl UntrustedIndex {
    fn start(host: std::net::Ipv4Addr) -> UntrustedIndex {
        let dir = std::env::temp_dir().join(format!("pcs-untrusted-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", &format!("/CN={host}")])
            .args(["-addext", &format!("subjectAltName=IP:{host}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(made.success(), "openssl made a certificate");
        let mut child = Command::new("python3")
            .args(["-c", TLS_SERVER, &host.to_string()])
            .arg(&cert)
            .arg(&key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("its stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's port");
        let port = line.trim().parse().expect("a port");
        UntrustedIndex { child, port, dir }
    }
}

impl Drop for UntrustedIndex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One build of this file's tests at a time: the check for first-stage images left sees every
/// build's, a build under way in another test included.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Builds a fresh tag from `index_url` (offline base, the host's CA bundle as by default): the
/// build must fail, leave neither the tag nor a first-stage image, and never quote the recipe.
async fn failed_build(index_url: &str) -> ImageError {
    let _turn = ONE_AT_A_TIME.lock().await;
    let docker = docker().await;
    let tag = format!("pcs-test-build-{}:1", uuid::Uuid::new_v4().simple());
    let config = python_code_sandbox::config::Config::from_lookup(|_| None).expect("defaults");
    let index = Index {
        index_url: Some(index_url.to_string()),
        ..Index::from_config(&config)
    };
    let progress: python_code_sandbox::engine::ProgressSink = std::sync::Arc::new(|_: &str| {});
    let built = no_hang(image::build(
        &docker,
        &tag,
        BuildMode::Offline,
        &index,
        &progress,
    ))
    .await;
    let Err(error) = built else {
        panic!("the build from {index_url} must fail")
    };
    let text = error.to_string();
    eprintln!("{index_url}:\n{text}\n");
    assert!(docker.inspect_image(&tag).await.is_err(), "{tag} was made");
    for shell in [
        "/bin/sh",
        "set -eu",
        "pcs-flavour-error",
        "returned a non-zero code",
    ] {
        assert!(
            !text.contains(shell),
            "the recipe is quoted ({shell}): {text}"
        );
    }
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec!["io.python-code-sandbox.fetch-build".to_string()],
    )]);
    let left = docker
        .list_images(Some(bollard::query_parameters::ListImagesOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .expect("list images");
    assert!(left.is_empty(), "first-stage images left: {left:?}");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_with_an_untrusted_certificate_is_named_with_the_setting() {
    if skip_without_engine() {
        return;
    }
    let host = bridge_address();
    let server = UntrustedIndex::start(host);
    let url = format!("https://{host}:{}/simple/", server.port);
    let error = failed_build(&url).await;
    let ImageError::Index { failure, .. } = &error else {
        panic!("expected an index failure: {error}")
    };
    assert_eq!(failure.kind, FailureKind::UntrustedCertificate, "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "the image build could not install the runner's IPython from the package index: \
             the index {url} presented a TLS certificate the image build does not trust"
        )),
        "{text}"
    );
    assert!(text.contains("SANDBOX_CA_BUNDLE"), "{text}");
    assert!(text.contains("\npip said:\n"), "pip's own lines: {text}");
    assert!(text.contains("CERTIFICATE_VERIFY_FAILED"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_that_does_not_answer_is_named_with_what_to_check() {
    if skip_without_engine() {
        return;
    }
    // A port nothing listens on (bound, then closed).
    let host = bridge_address();
    let port = std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://{host}:{port}/simple/");
    let error = failed_build(&url).await;
    let ImageError::Index { failure, .. } = &error else {
        panic!("expected an index failure: {error}")
    };
    assert_eq!(
        failure.kind,
        FailureKind::NoAnswer {
            host: host.to_string(),
            port,
            how: NoAnswer::Refused,
        },
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "the index {url} did not answer the image build: it could not connect to \
             {host}:{port} (the connection was refused)"
        )),
        "{text}"
    );
    assert!(text.contains("PIP_INDEX_URL"), "{text}");
    assert!(text.contains("\npip said:\n"), "pip's own lines: {text}");
}

/// An index on the bridge address whose `uv` is a wheel of its own: its scripts are a `python3`
/// and a `uv` that say so; every other project is the default index's (a redirect). It prints
/// its port, and a line `auth <header>` for each request.
const HOSTILE_UV_INDEX: &str = r##"
import base64, hashlib, http.server, io, socketserver, sys, zipfile
host, upstream = sys.argv[1], sys.argv[2].rstrip("/")
def wheel():
    name = "uv-99.0.0"
    files = {
        name + ".data/scripts/python3": b"#!/bin/sh\necho planted-by-the-index\nexec /usr/bin/python3 \"$@\"\n",
        name + ".data/scripts/uv": b"#!/bin/sh\necho planted-uv\n",
        name + ".dist-info/METADATA": b"Metadata-Version: 2.1\nName: uv\nVersion: 99.0.0\n",
        name + ".dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += "%s,sha256=%s,%d\n" % (path, digest, len(data))
    record += name + ".dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = (0o100755 if "/scripts/" in path else 0o100644) << 16
            z.writestr(info, data)
        z.writestr(name + ".dist-info/RECORD", record)
    return out.getvalue()
WHEEL = wheel()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("auth", self.headers.get("Authorization", ""), flush=True)
        if self.path.rstrip("/") == "/simple/uv":
            body = ('<a href="/files/uv-99.0.0-py3-none-any.whl#sha256=%s">uv-99.0.0-py3-none-any.whl</a>'
                    % hashlib.sha256(WHEEL).hexdigest()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        elif self.path.startswith("/files/uv-99"):
            body = WHEEL
            self.send_response(200)
        elif self.path.startswith("/simple/"):
            body = b""
            self.send_response(302)
            self.send_header("Location", upstream + self.path[len("/simple"):])
        else:
            body = b""
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = socketserver.ThreadingTCPServer((host, 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"##;

/// What an index gives beyond the runner's pinned IPython (the optional `uv`) cannot put a
/// program of its own on the sandbox's PATH: of the `uv` wheel's scripts only `uv` and `uvx`
/// reach the image (the sandbox's `python3` stays the image's own), and the index URL's
/// credentials reach neither the image, its history nor its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_cannot_put_a_python3_of_its_own_on_the_sandboxes_path() {
    if skip_without_engine() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let host = bridge_address();
    let mut child = Command::new("python3")
        .args([
            "-c",
            HOSTILE_UV_INDEX,
            &host.to_string(),
            "https://pypi.org/simple/",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 runs");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let port: u16 = lines
        .next()
        .and_then(Result::ok)
        .and_then(|l| l.trim().parse().ok())
        .expect("the index's port");
    let secret = format!("pcs-secret-{}", uuid::Uuid::new_v4().simple());
    let docker = docker().await;
    let tag = format!("pcs-test-build-{}:1", uuid::Uuid::new_v4().simple());
    let config = python_code_sandbox::config::Config::from_lookup(|_| None).expect("defaults");
    let index = Index {
        index_url: Some(format!("http://user:{secret}@{host}:{port}/simple/")),
        ..Index::from_config(&config)
    };
    let progress: python_code_sandbox::engine::ProgressSink = std::sync::Arc::new(|_: &str| {});
    let built = no_hang(image::build(
        &docker,
        &tag,
        BuildMode::Offline,
        &index,
        &progress,
    ))
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let seen: Vec<String> = lines.map_while(Result::ok).collect();
    if let Err(e) = &built {
        if matches!(e, ImageError::Index { .. }) {
            eprintln!("skipped: the default index (pypi.org) does not serve the runner's IPython here: {e}");
            return;
        }
        panic!("the build failed: {e}");
    }
    assert!(
        seen.iter().any(|l| l.starts_with("auth Basic ")),
        "pip did not use the index: {seen:?}"
    );
    let run = |script: &str| {
        let out = Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--user", "1000:1000"])
            .args(["--entrypoint", "/bin/sh", &tag, "-c", script])
            .output()
            .expect("docker run");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let on_path = run("command -v python3; ls /usr/local/bin");
    let history = Command::new("docker")
        .args(["history", "--no-trunc", &tag])
        .output()
        .expect("docker history");
    let inspect = docker.inspect_image(&tag).await.expect("the image");
    let _ = docker
        .remove_image(
            &tag,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await;
    assert!(
        !on_path.contains("/usr/local/bin/python3") && !on_path.contains("planted"),
        "the index's python3 is on the sandboxes' PATH: {on_path}"
    );
    let listed: Vec<&str> = on_path.lines().skip(1).collect();
    assert!(
        listed
            .iter()
            .all(|name| ["python", "uv", "uvx"].contains(name)),
        "/usr/local/bin holds {listed:?}"
    );
    assert!(
        !String::from_utf8_lossy(&history.stdout).contains(&secret)
            && !format!("{inspect:?}").contains(&secret),
        "the index's credentials are in the image"
    );
}
