//! Dependencies against the real engine and PyPI (the only outside traffic tests make): installed
//! outside the code's sandbox, cached, validated. Why an install failed is tested against a fake
//! index on this host's docker bridge address (never anything off this machine).

mod common;

use common::*;
use python_code_sandbox::engine::deps::{FailureKind, InstallFailure};
use python_code_sandbox::engine::outcome::{NoAnswer, Stopped};
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{EngineError, Execution, RunOptions, Task};

fn with_deps(deps: &[&str]) -> RunOptions {
    RunOptions {
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

async fn run_with(
    engine: &python_code_sandbox::engine::Engine,
    code: &str,
    deps: &[&str],
) -> Execution {
    engine
        .run_ephemeral(Task::Python(code), &with_deps(deps))
        .await
        .expect("the run completes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numpy_is_installed_once_then_comes_from_the_cache() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let code = "import numpy\nprint(numpy.arange(4).sum())";
        let first = run_with(&engine, code, &["numpy"]).await;
        assert_eq!(text(&first.stdout), "6\n", "{}", text(&first.stderr));
        assert!(first.dependencies.as_ref().expect("report").installed);
        assert_eq!(engine.installs_started(), 1);

        let second = run_with(&engine, code, &["NumPy"]).await;
        assert_eq!(text(&second.stdout), "6\n");
        assert!(!second.dependencies.as_ref().expect("report").installed);
        assert_eq!(
            engine.installs_started(),
            1,
            "the repeat starts no installer"
        );

        // The code's own sandbox still has no network.
        let isolated = run_with(
            &engine,
            "import os, numpy\nprint(sorted(os.listdir('/sys/class/net')))",
            &["numpy"],
        )
        .await;
        assert_eq!(text(&isolated.stdout), "['lo']\n");
        assert_eq!(engine.installs_started(), 1);

        let sets = request_sets(&engine).await;
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].requirements, ["numpy"]);
        assert!(sets[0].size > 1 << 20);
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_extras_are_honoured() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let pinned = run_with(
            &engine,
            "import six\nprint(six.__version__)",
            &["six==1.16.0"],
        )
        .await;
        assert_eq!(text(&pinned.stdout), "1.16.0\n", "{}", text(&pinned.stderr));
        let extras = run_with(
            &engine,
            "import urllib3, socks\nprint(urllib3.__version__)",
            &["urllib3[socks]==2.2.3"],
        )
        .await;
        assert_eq!(text(&extras.stdout), "2.2.3\n", "{}", text(&extras.stderr));
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_package_fails_clearly_and_leaves_nothing_in_the_cache() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let failed = engine
            .run_ephemeral(
                Task::Python("print(1)"),
                &with_deps(&["this-package-does-not-exist-pcs-7f3a"]),
            )
            .await;
        let Err(EngineError::InstallFailed(why)) = failed else {
            panic!("expected an install failure: {failed:?}")
        };
        let why = why.to_string();
        assert!(
            why.contains("this-package-does-not-exist-pcs-7f3a"),
            "{why}"
        );
        assert!(
            request_sets(&engine).await.is_empty(),
            "nothing is published"
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_attempts_are_refused_before_anything_starts() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        for entry in [
            "--index-url=http://x",
            "numpy; rm -rf /",
            "../x",
            "git+https://example.invalid/x/y",
            "numpy && id",
            "-r requirements.txt",
        ] {
            let refused = engine
                .run_ephemeral(Task::Python("print(1)"), &with_deps(&[entry]))
                .await;
            match refused {
                Err(EngineError::InvalidDependency(e)) => {
                    assert!(e.to_string().contains(entry), "{e}")
                }
                other => panic!("{entry}: {other:?}"),
            }
        }
        assert_eq!(engine.installs_started(), 0);
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_a_new_set_install_it_once() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let options = with_deps(&["six==1.16.0"]);
        let code = Task::Python("import six\nprint(six.__version__)");
        let (a, b) = tokio::join!(
            engine.run_ephemeral(code, &options),
            engine.run_ephemeral(code, &options)
        );
        for result in [a, b] {
            assert_eq!(text(&result.expect("run").stdout), "1.16.0\n");
        }
        assert_eq!(engine.installs_started(), 1);
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_gains_dependencies_after_it_started_and_keeps_them() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(&engine, &session, "x = 41").await;
        let added = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("import six\nx += 1\nprint(x, six.__version__)"),
                &with_deps(&["six==1.16.0"]),
            )
            .await
            .expect("run");
        assert_eq!(
            text(&added.stdout),
            "42 1.16.0\n",
            "{}",
            text(&added.stderr)
        );
        // A second package joins the set; the first stays importable, state is kept.
        let more = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("import six, idna\nprint(x, idna.__name__)"),
                &with_deps(&["idna"]),
            )
            .await
            .expect("run");
        assert_eq!(text(&more.stdout), "42 idna\n", "{}", text(&more.stderr));
        let later = in_session(&engine, &session, "import six, idna\nprint('still there')").await;
        assert_eq!(text(&later.stdout), "still there\n");
        // The session's own sandbox has no network.
        let net = in_session(
            &engine,
            &session,
            "import os\nprint(sorted(os.listdir('/sys/class/net')))",
        )
        .await;
        assert_eq!(text(&net.stdout), "['lo']\n");
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_cached_sets() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    // An image whose runner's IPython is in the cache too.
    let engine = engine_with(|c| {
        c.deps.volume = volume.clone();
        c.image = image_without_ipython();
    });
    no_hang(async {
        run_with(&engine, "import six", &["six==1.16.0"]).await;
        assert_eq!(request_sets(&engine).await.len(), 1);
        let removed = engine.prune_dependency_sets(true).await.expect("prune");
        assert_eq!(removed.len(), 1, "the runner's IPython is in use: kept");
        assert!(request_sets(&engine).await.is_empty());
        assert_eq!(
            engine.cached_dependency_sets().await.expect("list").len(),
            1
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

/// Runs `script` as root in a throwaway container with the cache volume at /v (the test plays an
/// attacker with the engine in hand, or inspects the volume); returns its stdout.
fn on_volume(engine: &python_code_sandbox::engine::Engine, volume: &str, script: &str) -> String {
    let out = std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "0",
            "--entrypoint",
            "sh",
        ])
        .args(["-v", &format!("{volume}:/v")])
        .arg(&engine.config().image)
        .args(["-c", script])
        .output()
        .expect("docker run");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_without_a_wheel_is_refused_unless_source_builds_are_allowed() {
    if skip_without_engine() {
        return;
    }
    // docopt 0.6.2 is published on PyPI as a source distribution only.
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let refused = engine
            .run_ephemeral(Task::Python("print(1)"), &with_deps(&["docopt==0.6.2"]))
            .await;
        let Err(EngineError::InstallFailed(why)) = refused else {
            panic!("expected a refusal: {refused:?}")
        };
        assert_eq!(why.kind, FailureKind::NoWheel, "{why}");
        let why = why.to_string();
        assert!(why.contains("docopt"), "{why}");
        assert!(why.contains("SANDBOX_ALLOW_SOURCE_BUILDS=true"), "{why}");
        assert!(request_sets(&engine).await.is_empty());
    })
    .await;
    assert_nothing_left(&engine).await;
    // Allowed by the operator, the same requirement builds and imports.
    let builder = engine_with(|c| {
        c.deps.volume = volume.clone();
        c.deps.allow_source_builds = true;
    });
    no_hang(async {
        let built = run_with(
            &builder,
            "import docopt\nprint(docopt.__version__)",
            &["docopt==0.6.2"],
        )
        .await;
        assert_eq!(text(&built.stdout), "0.6.2\n", "{}", text(&built.stderr));
    })
    .await;
    assert_nothing_left(&builder).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_sees_only_its_own_sets_and_cannot_change_them() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        // Another client's set.
        run_with(&engine, "import idna", &["idna==3.7"]).await;
        let probe = r#"
import os, sys, six
mine = [p for p in sys.path if p.startswith('/opt/deps/')]
print(len(mine), os.path.dirname(six.__file__) == mine[0])
for path in ['/opt/deps', '/opt/deps/.meta']:
    try:
        print(os.listdir(path))
    except OSError as e:
        print(path, type(e).__name__)
try:
    import idna
    print('idna importable')
except ImportError:
    print('no idna')
for path in [six.__file__, os.path.join(mine[0], 'new.py')]:
    try:
        open(path, 'a').close()
        print('wrote', path)
    except OSError:
        print('write refused')
"#;
        let seen = run_with(&engine, probe, &["six==1.16.0"]).await;
        assert_eq!(
            text(&seen.stdout),
            "1 True\n/opt/deps PermissionError\n/opt/deps/.meta PermissionError\nno idna\n\
             write refused\nwrite refused\n",
            "{}",
            text(&seen.stderr)
        );
        // The sets are root's, read-only, under random names; nothing else is in the volume.
        let listing = on_volume(
            &engine,
            &volume,
            "stat -c '%U %a %n' /v; for d in /v/s-*; do stat -c '%U %a' $d; done; ls -A /v | sort",
        );
        let lines: Vec<&str> = listing.lines().collect();
        assert_eq!(lines[0], "root 711 /v", "{listing}");
        assert_eq!(&lines[1..3], ["root 555", "root 555"], "{listing}");
        assert_eq!(lines[3], ".meta", "{listing}");
        assert!(
            lines[4..]
                .iter()
                .all(|n| n.len() == 34 && n.starts_with("s-")),
            "{listing}"
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_changed_after_publication_is_never_mounted() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let code = "import six\nprint(six.__version__, getattr(six, 'POISONED', 'clean'))";
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let first = run_with(&engine, code, &["six==1.16.0"]).await;
        assert_eq!(
            text(&first.stdout),
            "1.16.0 clean\n",
            "{}",
            text(&first.stderr)
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    // Someone with the engine in hand rewrites the published set, and leaves stray files.
    on_volume(
        &engine,
        &volume,
        "for f in /v/s-*/six.py; do echo 'POISONED = \"yes\"' >> $f; done && mkdir /v/d-0123456789abcdef0123456789abcdef \
         && echo x > /v/stray && echo x > /v/.meta/junk",
    );
    // The next server process checks the set before its first use: it is removed and
    // installed again, never mounted.
    let next = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let run = run_with(&next, code, &["six==1.16.0"]).await;
        assert_eq!(text(&run.stdout), "1.16.0 clean\n", "{}", text(&run.stderr));
        assert!(run.dependencies.as_ref().expect("report").installed);
        assert_eq!(next.installs_started(), 1);
        assert_eq!(request_sets(&next).await.len(), 1);
    })
    .await;
    let listing = on_volume(
        &next,
        &volume,
        "ls -A /v /v/.meta; grep -l POISONED -r /v || true",
    );
    assert!(
        !listing.contains("stray") && !listing.contains("d-0123"),
        "{listing}"
    );
    assert!(
        !listing.contains("junk") && !listing.contains("POISONED"),
        "{listing}"
    );
    assert_nothing_left(&next).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installer_reaches_only_the_index_through_its_proxy() {
    if skip_without_engine() {
        return;
    }
    let host = bridge_address();
    let listener = std::net::TcpListener::bind((host, 0)).expect("listen on the bridge address");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("port").port();
    let engine = engine();
    let probe = r#"
import os, socket
proxy = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)
proxy = (proxy[0], int(proxy[1]))
routes = [l.split()[1] for l in open('/proc/net/route').read().splitlines()[1:]]
print("default route", "00000000" in routes)
def direct(address):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(address)
        return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
print("listener", direct(("HOST", PORT)))
try:
    socket.getaddrinfo("pypi.org", 443)
    print("dns resolves")
except OSError:
    print("dns fails")
def connect_via_proxy(target):
    s = socket.create_connection(proxy, timeout=30)
    s.sendall(b"CONNECT " + target.encode() + b" HTTP/1.1\r\nHost: " + target.encode() + b"\r\n\r\n")
    answer = s.recv(200).split(b"\r\n")[0].decode()
    s.close()
    return answer
print("proxy to listener", connect_via_proxy("HOST:PORT"))
print("proxy to another host", connect_via_proxy("example.com:443"))
print("proxy to pypi", connect_via_proxy("pypi.org:443"))
print("plain http to listener", end=" ")
s = socket.create_connection(proxy, timeout=30)
s.sendall(b"GET http://HOST:PORT/ HTTP/1.1\r\nHost: x\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0].decode())
"#
    .replace("HOST", &host.to_string())
    .replace("PORT", &port.to_string());
    no_hang(async {
        let seen = engine.probe_installer_network(&probe).await.expect("probe");
        let out = text(&seen.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7, "{out}\n{}", text(&seen.stderr));
        assert!(
            lines[1] != "listener connected",
            "the host's listener was reached directly: {out}"
        );
        assert_eq!(
            lines[2], "dns fails",
            "the installer has no resolver: {out}"
        );
        assert_eq!(
            lines[3], "proxy to listener HTTP/1.1 403 Forbidden",
            "{out}"
        );
        assert_eq!(
            lines[4], "proxy to another host HTTP/1.1 403 Forbidden",
            "{out}"
        );
        assert_eq!(
            lines[5], "proxy to pypi HTTP/1.1 200 Connection established",
            "{out}"
        );
        assert_eq!(
            lines[6], "plain http to listener HTTP/1.1 403 Forbidden",
            "{out}"
        );
    })
    .await;
    assert!(
        listener.accept().is_err(),
        "nothing connected to the host's listener"
    );
    assert_nothing_left(&engine).await;
    assert_no_network_left(&engine);

    // Listed as an extra host, a private address is still refused; only an explicit
    // SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE lets it through (a local index).
    let only_listener = probe
        .split("print(\"proxy to another")
        .next()
        .unwrap()
        .to_string();
    for private in [false, true] {
        let engine = engine_with(|c| {
            c.deps.egress_allow = vec![(host.to_string(), port)];
            if private {
                c.deps.egress_allow_private = vec![host.to_string()];
            }
        });
        let seen = no_hang(engine.probe_installer_network(&only_listener))
            .await
            .expect("probe");
        let out = text(&seen.stdout);
        let expected = if private {
            "HTTP/1.1 200 Connection established"
        } else {
            "HTTP/1.1 403 Forbidden"
        };
        assert!(
            out.contains(&format!("proxy to listener {expected}")),
            "{out}"
        );
        assert_nothing_left(&engine).await;
        assert_no_network_left(&engine);
    }
    listener.set_nonblocking(false).expect("blocking");
    assert!(
        listener.accept().is_ok(),
        "the allowed private host was reached"
    );
}

/// A package index on this host's docker bridge address (the only kind of target these tests
/// reach), answering every request with `answer(path)`: a status and an HTML body.
struct FakeIndex {
    host: std::net::Ipv4Addr,
    port: u16,
}

impl FakeIndex {
    fn start(answer: fn(&str) -> (u16, String)) -> FakeIndex {
        use std::io::{Read, Write};
        let host = bridge_address();
        let listener =
            std::net::TcpListener::bind((host, 0)).expect("listen on the bridge address");
        let port = listener.local_addr().expect("port").port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(30)));
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                        match stream.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    let (status, body) = answer(&path);
                    let response = format!(
                        "HTTP/1.1 {status} Fake\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes());
                });
            }
        });
        FakeIndex { host, port }
    }

    fn url(&self) -> String {
        format!("http://{}:{}/simple/", self.host, self.port)
    }
}

/// A simple-index page linking `files`.
fn listing(files: &[&str]) -> String {
    let links: String = files
        .iter()
        .map(|f| format!("<a href=\"/files/{f}\">{f}</a>\n"))
        .collect();
    format!("<!DOCTYPE html><html><body>\n{links}</body></html>\n")
}

/// Installs `dependency` from `url`, which must fail; its failure. The installer's whole output
/// must be saved under the files directory and named in the message.
async fn failed_install(url: &str, private: bool, dependency: &str) -> InstallFailure {
    let hosts = if private {
        vec![bridge_address().to_string()]
    } else {
        Vec::new()
    };
    failed_install_allowing(url, hosts, dependency).await
}

/// [`failed_install`], with `private` the hosts allowed to be non-public.
async fn failed_install_allowing(
    url: &str,
    private: Vec<String>,
    dependency: &str,
) -> InstallFailure {
    let volume = fresh_deps_volume();
    let files = std::env::temp_dir().join(format!("pcs-deps-files-{}", uuid::Uuid::new_v4()));
    // The runner's IPython comes from PyPI first: the fake index serves only the request.
    seed_runner_set(&volume).await;
    let engine = engine_with(|c| {
        c.deps.volume = volume.to_string();
        c.deps.index_url = Some(url.to_string());
        c.deps.egress_allow_private = private;
        c.files.persist_dir = Some(files.clone());
    });
    let failed =
        no_hang(engine.run_ephemeral(Task::Python("print(1)"), &with_deps(&[dependency]))).await;
    let Err(EngineError::InstallFailed(failure)) = failed else {
        panic!("expected an install failure: {failed:?}")
    };
    eprintln!(
        "{dependency} from {url}:\n{}\n",
        EngineError::InstallFailed(failure.clone())
    );
    assert!(
        !failure
            .to_string()
            .contains("SANDBOX_ALLOW_SOURCE_BUILDS=true")
            || failure.kind == FailureKind::NoWheel,
        "{failure}"
    );
    let saved = failure
        .saved_to
        .clone()
        .expect("the installer's output is saved");
    assert!(saved.starts_with(&files), "{}", saved.display());
    let whole = std::fs::read_to_string(&saved).expect("read the saved output");
    assert!(whole.contains("--- stderr ---"), "{whole}");
    assert!(
        failure
            .to_string()
            .contains(&format!("Its whole output: {}", saved.display())),
        "{failure}"
    );
    if !failure.summary.is_empty() {
        let first = failure.summary.lines().next().unwrap_or_default();
        assert!(whole.contains(first.trim()), "{first} in {whole}");
    }
    assert_nothing_left(&engine).await;
    assert_no_network_left(&engine);
    remove_volume(&volume).await;
    let _ = std::fs::remove_dir_all(&files);
    *failure
}

/// The failure's text, after checking its kind and how the text begins.
fn said(failure: &InstallFailure, kind: FailureKind, opening: &str) -> String {
    assert_eq!(failure.kind, kind, "{failure}");
    let text = failure.to_string();
    assert!(
        text.starts_with(opening),
        "expected {opening:?} first: {text}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_refused_as_non_public_is_named_with_its_address_and_the_setting() {
    if skip_without_engine() {
        return;
    }
    let host = bridge_address();
    let listener = std::net::TcpListener::bind((host, 0)).expect("listen on the bridge address");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("port").port();
    let url = format!("http://{host}:{port}/simple/");
    let failure = failed_install(&url, false, "pcs-fake").await;
    let text = said(
        &failure,
        FailureKind::Refused {
            host: host.to_string(),
            port,
            stopped: Stopped::NonPublic(host.into()),
        },
        &format!(
            "the egress proxy refused {host}:{port} (for the index {url}): {host} is a \
             non-public address"
        ),
    );
    assert!(
        text.contains(&format!("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE={host}")),
        "{text}"
    );
    assert!(
        listener.accept().is_err(),
        "nothing was sent to the refused index"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_in_a_container_on_the_bridge_is_refused_for_where_it_is() {
    if skip_without_engine() {
        return;
    }
    use bollard::models::{ContainerCreateBody, HostConfig};
    // An index in a container on the engine's default bridge: the proxy's uplink neighbour,
    // which no sandbox may reach, even with its address allowed to be non-public.
    let docker = docker().await;
    let body = ContainerCreateBody {
        image: Some(python_code_sandbox::config::DEFAULT_IMAGE.to_string()),
        cmd: Some(
            ["python3", "-m", "http.server", "8765"]
                .map(String::from)
                .to_vec(),
        ),
        host_config: Some(HostConfig {
            network_mode: Some("bridge".into()),
            auto_remove: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            body,
        )
        .await
        .expect("the index's container");
    let id = created.id;
    docker
        .start_container(
            &id,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .expect("it starts");
    let address = docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .ok()
        .and_then(|c| {
            c.network_settings?
                .networks?
                .get("bridge")?
                .ip_address
                .clone()
        })
        .filter(|a| !a.is_empty())
        .expect("its address on the bridge");
    let url = format!("http://{address}:8765/simple/");
    let failure = failed_install_allowing(&url, vec![address.clone()], "pcs-fake").await;
    let _ = docker
        .remove_container(
            &id,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    let text = said(
        &failure,
        FailureKind::Refused {
            host: address.clone(),
            port: 8765,
            stopped: Stopped::OffLimits,
        },
        &format!(
            "the egress proxy refused {address}:8765 (the index {url}): that address is on the \
             sandboxes' own networks or next to the proxy on its uplink network"
        ),
    );
    assert!(text.contains("publish its port on the host"), "{text}");
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
    let failure = failed_install(&url, true, "pcs-fake").await;
    let text = said(
        &failure,
        FailureKind::NoAnswer {
            host: host.to_string(),
            port,
            how: NoAnswer::Refused,
        },
        &format!(
            "the index {url} did not answer: the egress proxy could not connect to \
             {host}:{port} (the connection was refused)"
        ),
    );
    assert!(
        text.contains("PIP_INDEX_URL") && text.contains("SANDBOX_CA_BUNDLE"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_that_wants_credentials_says_what_to_set() {
    if skip_without_engine() {
        return;
    }
    let unauthorized = FakeIndex::start(|_| (401, "no".into()));
    let forbidden = FakeIndex::start(|_| (403, "no".into()));
    let proxy = FakeIndex::start(|_| (407, "no".into()));
    for (index, status) in [(unauthorized, 401), (forbidden, 403), (proxy, 407)] {
        let failure = failed_install(&index.url(), true, "pcs-fake").await;
        assert_eq!(
            failure.kind,
            FailureKind::Credentials { status },
            "{failure}"
        );
        let text = failure.to_string();
        assert!(text.contains(&format!("(HTTP {status} ")), "{text}");
        assert!(
            text.contains("PIP_INDEX_URL=https://USER:TOKEN@HOST/simple"),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_the_index_does_not_have_is_named() {
    if skip_without_engine() {
        return;
    }
    let index = FakeIndex::start(|_| (404, "not found".into()));
    let failure = failed_install(&index.url(), true, "pcs-missing").await;
    said(
        &failure,
        FailureKind::UnknownProject {
            name: Some("pcs-missing".into()),
        },
        &format!(
            "the index {} has no project named pcs-missing (HTTP 404)",
            index.url()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_does_not_exist_names_those_that_do() {
    if skip_without_engine() {
        return;
    }
    let index = FakeIndex::start(|path| match path {
        "/simple/pcs-fake/" => (
            200,
            listing(&[
                "pcs_fake-1.0-py3-none-any.whl",
                "pcs_fake-2.0-py3-none-any.whl",
            ]),
        ),
        _ => (404, "not found".into()),
    });
    let failure = failed_install(&index.url(), true, "pcs-fake==9.9").await;
    said(
        &failure,
        FailureKind::NoSuchVersion {
            requirement: "pcs-fake==9.9".into(),
            versions: vec!["1.0".into(), "2.0".into()],
        },
        &format!(
            "no version of pcs-fake==9.9 exists on the index {}; it has 1.0, 2.0.",
            index.url()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_project_without_a_wheel_gets_the_source_build_text() {
    if skip_without_engine() {
        return;
    }
    let index = FakeIndex::start(|path| match path {
        "/simple/pcs-sdist/" => (200, listing(&["pcs-sdist-1.0.tar.gz"])),
        _ => (404, "not found".into()),
    });
    let failure = failed_install(&index.url(), true, "pcs-sdist").await;
    let text = said(
        &failure,
        FailureKind::NoWheel,
        &format!(
            "a requested project has no wheel for this platform on the index {}.",
            index.url()
        ),
    );
    assert!(text.contains("SANDBOX_ALLOW_SOURCE_BUILDS=true"), "{text}");
}
