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

/// Builds a fresh tag from `index_url` (offline base, the host's CA bundle as by default): the
/// build must fail, leave neither the tag nor a first-stage image, and never quote the recipe.
async fn failed_build(index_url: &str) -> ImageError {
    // One build at a time: the check for first-stage images left sees every build's.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
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
