//! `SANDBOX_NETWORK=allowlist` against the real engine: each sandbox on a network of its own with
//! the proxy, reaching an allowed name through it and nothing else (no peer sandbox, no host, no
//! resolver). Every target is a listener this test starts, on this machine.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use python_code_sandbox::config::egress::EgressRules;
use python_code_sandbox::config::NetworkPolicy;
use python_code_sandbox::engine::outcome::NetworkOutcome;
use python_code_sandbox::engine::owner::LABEL_INSTANCE;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{RunOptions, Task};

/// A tiny HTTP endpoint on the bridge address; counts the connections it accepted.
fn endpoint(address: &str) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((address, 0)).expect("listen");
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    (port, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandbox_reaches_only_what_is_allowed_and_never_its_peers() {
    if skip_without_engine() {
        return;
    }
    let host = bridge_address().to_string();
    let (port, accepted) = endpoint(&host);
    let engine = engine_with(|c| {
        c.network = NetworkPolicy::Allowlist;
        c.egress.allow =
            EgressRules::parse(&format!("data.test:{port},{host}/32:{port}")).expect("rules");
        c.egress.resolve = vec![("data.test".into(), host.parse().expect("address"))];
    });
    no_hang(async {
        let a = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session a");
        let b = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session b");
        // A listens on every interface, and says its address (the one it reaches the proxy from).
        let listening = in_session(
            &engine,
            &a,
            r#"
import os, socket, threading
server = socket.socket()
server.bind(("0.0.0.0", 5555))
server.listen()
threading.Thread(target=lambda: [server.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
proxy = os.environ["HTTP_PROXY"][len("http://"):].rsplit(":", 1)[0]
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect((proxy, 3128))
print(probe.getsockname()[0])
"#,
        )
        .await;
        let a_address = text(&listening.stdout).trim().to_string();
        assert!(
            a_address.parse::<std::net::Ipv4Addr>().is_ok(),
            "{a_address:?} {}",
            text(&listening.stderr)
        );
        let probe = r#"
import os, socket, urllib.request
def direct(address, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((address, port))
        return "connected"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
print("interfaces", sorted(name for _, name in socket.if_nameindex()))
print("kernel", open("/proc/version").read().split()[2])
print("peer", direct("A", 5555))
print("host", direct("HOST", PORT))
try:
    socket.getaddrinfo("pypi.org", 443)
    print("dns resolves")
except OSError:
    print("dns fails")
print("allowed", urllib.request.urlopen("http://data.test:PORT/", timeout=10).read().decode())
try:
    urllib.request.urlopen("http://other.test:PORT/", timeout=10)
    print("other reached")
except urllib.error.HTTPError as e:
    print("other", e.code, e.read().decode().strip())
"#
        .replace("HOST", &host)
        .replace("PORT", &port.to_string())
        .replace("\"A\"", &format!("{a_address:?}"));
        let before = accepted.load(Ordering::SeqCst);
        let seen = engine
            .execute_in_session(Scope::Server, &b, Task::Python(&probe), &RunOptions::default())
            .await
            .expect("probe");
        let out = text(&seen.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7, "{out}\n{}", text(&seen.stderr));
        assert_eq!(lines[0], "interfaces ['eth0', 'lo']", "{out}");
        // Networked code keeps gVisor where it is registered (scripts/test.sh registers it):
        // gVisor's kernel says 4.4.0 whatever the host runs.
        // (`PCS_ENGINE_RUNTIME=runc`: scripts/test.sh runs these tests again under runc.)
        if std::env::var("PCS_TEST_RUNTIME").ok().as_deref() == Some("runsc")
            && suite_runtime().is_none()
        {
            assert!(under_gvisor(&engine).await, "networked code left gVisor");
            assert_eq!(lines[1], "kernel 4.4.0", "{out}");
        }
        assert_ne!(lines[2], "peer connected", "a sandbox reached its peer: {out}");
        assert_ne!(lines[3], "host connected", "a sandbox reached the host: {out}");
        assert_eq!(lines[4], "dns fails", "{out}");
        assert_eq!(lines[5], "allowed hello", "{out}");
        assert!(
            lines[6].starts_with("other 403 refused by the sandbox's egress proxy: other.test"),
            "{out}"
        );
        // Exactly the allowed request reached the endpoint (not the direct attempt).
        assert_eq!(accepted.load(Ordering::SeqCst) - before, 1);
        // The execution's record: the allowed name reached with bytes both ways, the other refused.
        let record = seen.network.expect("a network record with allowlist");
        let reached = record
            .iter()
            .find(|e| e.host == "data.test")
            .expect("data.test in the record");
        assert_eq!(reached.outcome, NetworkOutcome::Reached, "{record:?}");
        assert!(reached.bytes_sent > 0 && reached.bytes_received > 0, "{record:?}");
        let refused = record
            .iter()
            .find(|e| e.host == "other.test")
            .expect("other.test in the record");
        assert_eq!(refused.outcome, NetworkOutcome::Refused, "{record:?}");
        // The proxy, on the sandboxes' networks and its uplink, forwards nothing between them
        // itself (a new namespace would copy the host's forwarding, which Docker turns on).
        let proxies = std::process::Command::new("docker")
            .args(["ps", "-q", "--filter"])
            .arg(format!("label={LABEL_INSTANCE}={}", engine.owner().instance))
            .args(["--filter", "ancestor=python-code-sandbox-proxy:bookworm"])
            .output()
            .expect("docker ps");
        let proxy = String::from_utf8_lossy(&proxies.stdout).trim().to_string();
        assert!(!proxy.is_empty() && !proxy.contains('\n'), "one proxy: {proxy:?}");
        let forwarding = std::process::Command::new("docker")
            .args(["exec", &proxy, "cat"])
            .args([
                "/proc/sys/net/ipv4/ip_forward",
                "/proc/sys/net/ipv6/conf/all/forwarding",
            ])
            .output()
            .expect("docker exec");
        assert_eq!(
            String::from_utf8_lossy(&forwarding.stdout),
            "0\n0\n",
            "{}",
            String::from_utf8_lossy(&forwarding.stderr)
        );
        engine.stop_session(Scope::Server, &a).await.expect("stop a");
        engine.stop_session(Scope::Server, &b).await.expect("stop b");
    })
    .await;
    assert_nothing_left(&engine).await;
    // The sandboxes' networks went with them.
    assert_no_network_left(&engine);
}

/// An HTTPS upstream on the bridge address with a CA of its own, for two names: it answers each
/// request with what its `Authorization` header held (the secret's value, a placeholder, another
/// value, none) and its `Host`, never the value itself.
const SECRET_UPSTREAM: &str = r#"
import http.server, json, ssl, sys
value = sys.argv[4]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        seen = self.headers.get_all("Authorization") or []
        if self.path == "/echo":
            # An upstream that echoes what it got (a debugging endpoint): the value comes back.
            body = json.dumps({"authorization": seen}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        kinds = ["value" if a == "Bearer " + value else "placeholder" if "pcs-placeholder-" in a else "other" for a in seen]
        body = json.dumps({"auth": kinds, "host": self.headers.get("Host"), "leaked": value in str(self.headers) and kinds != ["value"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((sys.argv[1], 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The CA and the upstream's certificate (for `names`), made with openssl in `dir`.
fn upstream_certificates(dir: &std::path::Path, names: &[&str]) {
    let openssl = |args: &[&str]| {
        let made = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(made.success(), "openssl {args:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=pcs test upstream CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=upstream",
        "-keyout",
        "key.pem",
        "-out",
        "req.pem",
    ]);
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    std::fs::write(
        dir.join("ext"),
        format!("subjectAltName={}\n", sans.join(",")),
    )
    .expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "req.pem",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext",
        "-out",
        "cert.pem",
    ]);
}

/// The HTTPS upstream of the secrets' tests, on the bridge's address: it answers which kind of
/// `Authorization` it got (the value, a placeholder, another), and `/echo` echoes it (the value
/// comes back to the code). Its certificate names `api.secret.test` and `other.secret.test`,
/// signed by a CA of the test's (`dir/ca.pem`).
struct SecretUpstream {
    host: String,
    dir: std::path::PathBuf,
    value: String,
    upstream: std::process::Child,
    port: u16,
}

impl SecretUpstream {
    fn start() -> SecretUpstream {
        let host = bridge_address().to_string();
        let dir = std::env::temp_dir().join(format!("pcs-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        upstream_certificates(&dir, &["api.secret.test", "other.secret.test"]);
        let value = format!("sk-test-{}", uuid::Uuid::new_v4().simple());
        let mut upstream = std::process::Command::new("python3")
            .args(["-c", SECRET_UPSTREAM, &host])
            .arg(dir.join("cert.pem"))
            .arg(dir.join("key.pem"))
            .arg(&value)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the upstream starts");
        let mut port_line = String::new();
        {
            use std::io::BufRead;
            let stdout = upstream.stdout.take().expect("its stdout");
            std::io::BufReader::new(stdout)
                .read_line(&mut port_line)
                .expect("its port");
        }
        let port: u16 = port_line.trim().parse().expect("a port");
        SecretUpstream {
            host,
            dir,
            value,
            upstream,
            port,
        }
    }
}

/// One secret, `name`, bound to `api.secret.test:port` (the upstream's name), sent as
/// `Authorization: Bearer <value>`, its placeholder in `env`.
fn bound_secret(
    name: &str,
    env: &str,
    value: &str,
    port: u16,
) -> python_code_sandbox::config::secrets::Secrets {
    use python_code_sandbox::config::secrets::{BoundHost, Secret, SecretValue, Secrets};
    Secrets {
        entries: vec![Secret {
            name: name.into(),
            value: SecretValue::new(value.into()),
            hosts: vec![BoundHost {
                pattern: "api.secret.test".into(),
                port,
            }],
            header: "Authorization".into(),
            format: "Bearer {value}".into(),
            env: env.into(),
        }],
        file: None,
    }
}

/// Secrets brokered at the egress (issue 46 B): the code holds a placeholder; the proxy bumps only
/// the tunnel to the bound name and puts the value in the header there, and nowhere else (another
/// host, a Host header or SNI that names another, an IP literal). The value is nowhere in the
/// sandbox, nor in the result; the record names the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_only_its_host_and_never_the_sandbox() {
    if skip_without_engine() {
        return;
    }
    let SecretUpstream {
        host,
        dir,
        value,
        mut upstream,
        port,
    } = SecretUpstream::start();
    let secrets = bound_secret("llm", "LLM_API_KEY", &value, port);
    let engine = engine_with(|c| {
        c.network = NetworkPolicy::Allowlist;
        // The other name is allowed by the policy, the bound one by its secret alone; the
        // address rule lets both resolve to the bridge address (and the IP literal through).
        c.egress.allow = EgressRules::parse(&format!("other.secret.test:{port},{host}/32:{port}"))
            .expect("rules");
        c.egress.resolve = vec![
            ("api.secret.test".into(), host.parse().expect("address")),
            ("other.secret.test".into(), host.parse().expect("address")),
        ];
        c.ca_bundle = Some(dir.join("ca.pem"));
        c.secrets = std::sync::Arc::new(secrets);
    });
    let code = r#"
import http.client, json, os, socket, ssl, urllib.request
key = os.environ["LLM_API_KEY"]
print("placeholder", key.startswith("pcs-placeholder-llm-"))
def call(host, headers):
    request = urllib.request.Request("https://%s:PORT/x" % host, headers=headers)
    return json.loads(urllib.request.urlopen(request, timeout=30).read())
print("bound", json.dumps(call("api.secret.test", {"Authorization": "Bearer " + key})))
print("bound-without", json.dumps(call("api.secret.test", {})))
print("bound-other-value", json.dumps(call("api.secret.test", {"Authorization": "Bearer mine"})))
print("unbound", json.dumps(call("other.secret.test", {"Authorization": "Bearer " + key})))
try:  # clear text, to a TLS port: the proxy sees the request, the upstream refuses it
    urllib.request.urlopen(urllib.request.Request("http://other.secret.test:PORT/plain", headers={"Authorization": "Bearer " + key}), timeout=30)
except Exception:
    pass
proxy = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)[0]
def tunnel(target, sni, host_header, verify=True):
    s = socket.create_connection((proxy, 3128), timeout=30)
    s.sendall(("CONNECT %s:PORT HTTP/1.1\r\nHost: %s:PORT\r\n\r\n" % (target, target)).encode())
    assert s.recv(4096).startswith(b"HTTP/1.1 200"), "the tunnel"
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    t = context.wrap_socket(s, server_hostname=sni)
    t.sendall(("GET /t HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % (host_header, key)).encode())
    data = b""
    while True:
        chunk = t.recv(65536)
        if not chunk:
            break
        data += chunk
    status = data.split(b"\r\n", 1)[0].decode()
    body = data.split(b"\r\n\r\n", 1)[1].decode()
    return status, (json.loads(body) if status.endswith(" 200 OK") else None)
print("host-other", json.dumps(tunnel("api.secret.test", "api.secret.test", "other.secret.test:PORT")))
print("sni-other", json.dumps(tunnel("api.secret.test", "other.secret.test", "api.secret.test:PORT")))
print("ip-literal", json.dumps(tunnel("HOST", "api.secret.test", "api.secret.test:PORT")))
bundle = open(os.environ["SSL_CERT_FILE"]).read()
print("bundle", "PRIVATE KEY" not in bundle and "egress proxy's CA" in bundle)
def environ(path):  # pid 1's is unreadable to the code under runc (another process's)
    try:
        return open(path, "rb").read()
    except OSError:
        return b""
environ = environ("/proc/self/environ") + environ("/proc/1/environ")
print("environ", b"sk-test-" not in environ)
echo = urllib.request.urlopen(urllib.request.Request("https://api.secret.test:PORT/echo", headers={"Authorization": "Bearer " + key}), timeout=30).read().decode()
print("echo", echo)
open("echo.txt", "w").write("x" * ((1 << 20) - 10 - echo.index("sk-test-")) + echo * 3)  # one value across 1 MiB
from IPython.display import HTML, display
display(HTML("<b>%s</b>" % echo))
raise ValueError(echo)
"#
    .replace("PORT", &port.to_string())
    .replace("HOST", &host);
    no_hang(async {
        let seen = engine
            .run_ephemeral(Task::Python(&code), &RunOptions::default())
            .await
            .expect("the run");
        let out = text(&seen.stdout);
        let err = text(&seen.stderr);
        assert!(
            !out.contains(&value) && !err.contains(&value),
            "the value came back: {out}"
        );
        let lines: std::collections::HashMap<&str, &str> =
            out.lines().filter_map(|l| l.split_once(' ')).collect();
        assert_eq!(lines.get("placeholder"), Some(&"True"), "{out}\n{err}");
        let auth = |name: &str| -> serde_json::Value {
            let line = lines
                .get(name)
                .unwrap_or_else(|| panic!("{name}: {out}\n{err}"));
            serde_json::from_str(line).expect("json")
        };
        // The bound host gets the value in place of the placeholder, or of another value, or
        // where the request had none: never doubled.
        for name in ["bound", "bound-without", "bound-other-value"] {
            assert_eq!(
                auth(name)["auth"],
                serde_json::json!(["value"]),
                "{name}: {out}"
            );
        }
        // Another host, another Host header, another SNI, an IP literal: the placeholder as sent.
        assert_eq!(
            auth("unbound")["auth"],
            serde_json::json!(["placeholder"]),
            "{out}"
        );
        for name in ["host-other", "sni-other", "ip-literal"] {
            let seen = auth(name);
            let body = &seen[1];
            assert!(
                body.is_null() || body["auth"] == serde_json::json!(["placeholder"]),
                "{name} got the secret: {out}"
            );
        }
        assert_eq!(lines.get("bundle"), Some(&"True"), "{out}");
        assert_eq!(lines.get("environ"), Some(&"True"), "{out}");
        // An upstream echoed the value: it is masked in what the code printed, showed and
        // raised, and in the file copied out of it (one value is across the edge between the
        // engine's first and second piece of it, at 1 MiB).
        let mask = "Bearer <redacted:llm>";
        assert!(lines.get("echo").is_some_and(|l| l.contains(mask)), "{out}");
        let shown = format!("{:?} {:?}", seen.outputs, seen.error);
        assert!(!shown.contains(&value) && shown.contains(mask), "{shown}");
        let file = seen
            .files
            .iter()
            .find(|f| f.path == "echo.txt")
            .unwrap_or_else(|| panic!("echo.txt: {:?}", seen.files));
        let bytes = match (&file.content, &file.saved_to) {
            (Some(content), _) => content.clone(),
            (None, Some(path)) => std::fs::read(path).expect("the saved file"),
            (None, None) => panic!("echo.txt neither returned nor saved: {file:?}"),
        };
        let saved = String::from_utf8_lossy(&bytes);
        assert!(
            !saved.contains(&value) && saved.matches(mask).count() == 3,
            "echo.txt: {} bytes, {} masks",
            saved.len(),
            saved.matches(mask).count()
        );
        // The record names the secret where it was sent, and only there.
        let record = seen.network.expect("a network record");
        let sent: Vec<_> = record.iter().filter(|e| e.secret.is_some()).collect();
        assert!(
            !sent.is_empty()
                && sent.iter().all(|e| e.host == "api.secret.test"
                    && e.secret.as_deref() == Some("llm")
                    && e.placeholder.is_none()),
            "{record:?}"
        );
        // A placeholder that went as written, where the proxy sees it: in clear text to another
        // host (the upstream refused it: a failure), and in a bumped tunnel whose Host names
        // another (the request is for that host: it reached the pinned upstream).
        let written = |outcome: NetworkOutcome| {
            record.iter().any(|e| {
                e.host == "other.secret.test"
                    && e.outcome == outcome
                    && e.placeholder.as_deref() == Some("llm")
            })
        };
        assert!(
            written(NetworkOutcome::Failed) && written(NetworkOutcome::Reached),
            "{record:?}"
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    assert_no_network_left(&engine);

    // A principal's own set over HTTP (the server has none; a tokens file says principals may
    // have theirs): a call that carries it gets its placeholder and its header, a call without
    // it neither.
    let own = std::sync::Arc::new(bound_secret("own", "OWN_KEY", &value, port));
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "").expect("a tokens file");
    let principals = engine_with(|c| {
        c.network = NetworkPolicy::Allowlist;
        c.egress.allow = EgressRules::parse(&format!("{host}/32:{port}")).expect("rules");
        c.egress.resolve = vec![("api.secret.test".into(), host.parse().expect("address"))];
        c.ca_bundle = Some(dir.join("ca.pem"));
        c.http.tokens_file = Some(tokens.clone());
    });
    let probe = r#"
import json, os, urllib.request
key = os.environ.get("OWN_KEY", "none")
request = urllib.request.Request("https://api.secret.test:PORT/p", headers={"Authorization": "Bearer " + key})
try:
    print("own", json.dumps(json.loads(urllib.request.urlopen(request, timeout=30).read())["auth"]))
except Exception as e:
    print("own", json.dumps(type(e).__name__))
"#
    .replace("PORT", &port.to_string());
    no_hang(async {
        let with_own = RunOptions {
            secrets: Some(own.clone()),
            ..RunOptions::default()
        };
        let seen = principals
            .run_ephemeral(Task::Python(&probe), &with_own)
            .await
            .expect("the run");
        assert_eq!(
            text(&seen.stdout).trim(),
            r#"own ["value"]"#,
            "{}",
            text(&seen.stderr)
        );
        // Without it: no placeholder, and the bound host is not even allowed to this call.
        let seen = principals
            .run_ephemeral(Task::Python(&probe), &RunOptions::default())
            .await
            .expect("the run");
        let out = text(&seen.stdout);
        assert!(!out.contains("value"), "{out}");
    })
    .await;
    let _ = upstream.kill();
    let _ = upstream.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_nothing_left(&principals).await;
    assert_no_network_left(&principals);
}

/// The HTTP clients agents' code uses get the secret the same way (issue 46 B): `requests` and
/// `httpx`, installed as the run's dependencies, and the image's `curl` read the proxy and the
/// bundle from the variables the sandbox has, and the bound host gets the value where they sent
/// the placeholder. HTTP/2 offered on the bumped connection is served as HTTP/1.1 (the header
/// added all the same), and HTTP/2 by prior knowledge is refused, never passed on.
/// The bundle the sandbox trusts is the host's (PyPI through this network's interception) plus
/// the test's CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_httpx_and_curl_get_the_secret_too() {
    if skip_without_engine() {
        return;
    }
    let SecretUpstream {
        host,
        dir,
        value,
        mut upstream,
        port,
    } = SecretUpstream::start();
    // The host's bundle (the index's interception) and the upstream's CA, as an operator would.
    let bundle = dir.join("bundle.pem");
    let mut pem = std::env::var("SANDBOX_CA_BUNDLE")
        .ok()
        .or_else(|| Some("/etc/ssl/certs/ca-certificates.crt".into()))
        .and_then(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_default();
    pem.push_str(&std::fs::read_to_string(dir.join("ca.pem")).expect("the test CA"));
    std::fs::write(&bundle, pem).expect("the bundle");
    let engine = engine_with(|c| {
        c.network = NetworkPolicy::Allowlist;
        c.egress.allow = EgressRules::parse(&format!("{host}/32:{port}")).expect("rules");
        c.egress.resolve = vec![("api.secret.test".into(), host.parse().expect("address"))];
        c.ca_bundle = Some(bundle.clone());
        c.secrets = std::sync::Arc::new(bound_secret("llm", "LLM_API_KEY", &value, port));
    });
    let code = r#"
import json, os
import httpx, requests
key = os.environ["LLM_API_KEY"]
url = "https://api.secret.test:PORT/x"
print("requests", json.dumps(requests.get(url, headers={"Authorization": "Bearer " + key}, timeout=30).json()["auth"]))
print("requests-none", json.dumps(requests.get(url, timeout=30).json()["auth"]))
with httpx.Client(timeout=30) as client:
    print("httpx", json.dumps(client.get(url, headers={"Authorization": "Bearer " + key}).json()["auth"]))
    print("httpx-again", json.dumps(client.get(url, headers={"Authorization": "Bearer " + key}).json()["auth"]))
import socket, ssl, subprocess
def curl(*args):
    done = subprocess.run(["curl", "-sS", "--max-time", "30", "-w", "\\n%{http_version}", *args, url], capture_output=True, text=True)
    if done.returncode != 0:
        return "failed: " + done.stderr.strip()
    body, version = done.stdout.rsplit("\n", 1)
    return json.dumps(json.loads(body)["auth"]) + " http/" + version
print("curl", curl("-H", "Authorization: Bearer " + key))
# HTTP/2 offered on a bumped connection: served as HTTP/1.1, the header added all the same.
print("curl-http2", curl("--http2", "-H", "Authorization: Bearer " + key))
proxy = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)[0]
s = socket.create_connection((proxy, 3128), timeout=30)
s.sendall(b"CONNECT api.secret.test:PORT HTTP/1.1\r\nHost: api.secret.test:PORT\r\n\r\n")
assert s.recv(4096).startswith(b"HTTP/1.1 200"), "the tunnel"
context = ssl.create_default_context()
context.set_alpn_protocols(["h2"])
t = context.wrap_socket(s, server_hostname="api.secret.test")
print("alpn", t.selected_alpn_protocol())
# HTTP/2 by prior knowledge (its preface, then a HEADERS frame naming the bound host): refused,
# never passed on.
t.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
answer = b""
try:
    while len(answer) < 65536:
        chunk = t.recv(65536)
        if not chunk:
            break
        answer += chunk
except OSError:
    pass
# The upstream (Python's http.server) answers a request of version 2.0 with "Invalid HTTP version".
print("h2-preface", "upstream" if b"Invalid HTTP version" in answer else "not-passed-on")
"#
    .replace("PORT", &port.to_string());
    no_hang(async {
        let options = RunOptions {
            dependencies: vec!["requests".into(), "httpx".into()],
            ..RunOptions::default()
        };
        let seen = engine
            .run_ephemeral(Task::Python(&code), &options)
            .await
            .expect("the run");
        let out = text(&seen.stdout);
        let err = text(&seen.stderr);
        assert!(!out.contains(&value) && !err.contains(&value), "{out}");
        let lines: std::collections::HashMap<&str, &str> =
            out.lines().filter_map(|l| l.split_once(' ')).collect();
        for client in ["curl", "curl-http2"] {
            assert_eq!(
                lines.get(client),
                Some(&r#"["value"] http/1.1"#),
                "{client}: {out}\n{err}"
            );
        }
        assert!(
            matches!(lines.get("alpn"), Some(&"None") | Some(&"http/1.1")),
            "HTTP/2 negotiated on a bumped connection: {out}"
        );
        assert_eq!(
            lines.get("h2-preface"),
            Some(&"not-passed-on"),
            "HTTP/2 by prior knowledge reached the upstream: {out}"
        );
        for client in ["requests", "requests-none", "httpx", "httpx-again"] {
            assert!(
                out.lines().any(|l| l == format!(r#"{client} ["value"]"#)),
                "{client}: {out}\n{err}\n{:?}",
                seen.dependencies
            );
        }
    })
    .await;
    let _ = upstream.kill();
    let _ = upstream.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_nothing_left(&engine).await;
    assert_no_network_left(&engine);
}

/// A fork and a restore are new sandboxes, with new placeholders (issue 46 B 5): the copy's
/// variable is not its source's, the bound host gets the value from the copy whichever
/// placeholder it sends (its own, or the source's kept in a variable), and neither the snapshot
/// store nor anything the copies return holds the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_or_a_restore_gets_new_placeholders_and_never_the_value() {
    if skip_without_engine() {
        return;
    }
    let SecretUpstream {
        host,
        dir,
        value,
        mut upstream,
        port,
    } = SecretUpstream::start();
    let store = dir.join("snapshots");
    let engine = engine_with(|c| {
        c.network = NetworkPolicy::Allowlist;
        c.egress.allow = EgressRules::parse(&format!("{host}/32:{port}")).expect("rules");
        c.egress.resolve = vec![("api.secret.test".into(), host.parse().expect("address"))];
        c.ca_bundle = Some(dir.join("ca.pem"));
        c.secrets = Arc::new(bound_secret("llm", "LLM_API_KEY", &value, port));
        c.snapshots.dir = Some(store.clone());
    });
    // Each cell defines what it calls (a function is not among what a copy carries).
    let cell = |body: &str| {
        format!(
            r#"
import json, os, urllib.request
def call(key):
    request = urllib.request.Request("https://api.secret.test:{port}/x", headers={{"Authorization": "Bearer " + key}})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["auth"]
{body}
"#
        )
    };
    // The file named after the value came back, under its masked name (the archive's header
    // holds the mask).
    let copy = cell(
        r#"print("env", os.environ["LLM_API_KEY"])
print("kept", kept)
print("masked-files", sum(1 for n in os.listdir() if n.startswith("<redacted:llm>")))
print("own", json.dumps(call(os.environ["LLM_API_KEY"])))
print("source's", json.dumps(call(kept)))"#,
    );
    // The lines `name rest` of a run's stdout (the value never among them).
    let lines = |seen: &python_code_sandbox::engine::Execution| {
        let out = text(&seen.stdout);
        assert!(
            !out.contains(&value) && !text(&seen.stderr).contains(&value),
            "the value came back: {out}"
        );
        out.lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::HashMap<String, String>>()
    };
    let placeholder = no_hang(async {
        let source = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("the source session");
        let seen = in_session(
            &engine,
            &source,
            &cell(
                r#"kept = os.environ["LLM_API_KEY"]
print("env", kept)
print("own", json.dumps(call(kept)))"#,
            ),
        )
        .await;
        let first = lines(&seen);
        let placeholder = first.get("env").cloned().unwrap_or_default();
        assert!(
            placeholder.starts_with("pcs-placeholder-llm-"),
            "{first:?} {}",
            text(&seen.stderr)
        );
        assert_eq!(first.get("own").map(String::as_str), Some(r#"["value"]"#));
        // The code keeps an echoed value: in a variable, as a variable's name, in a file and as a
        // file's name. Every name it shows and every archive made of it is masked.
        let kept = in_session(
            &engine,
            &source,
            &cell(&r#"echo = urllib.request.Request("https://api.secret.test:PORT/echo", headers={"Authorization": "Bearer x"})
V = json.loads(urllib.request.urlopen(echo, timeout=30).read())["authorization"][0].split(" ", 1)[1]
open(V, "w").write("named after the value")
open("holds.txt", "w").write("the value: " + V)
globals()[V] = 1
print("echoed", len(V))"#
                .replace("PORT", &port.to_string())),
        )
        .await;
        let echoed = lines(&kept);
        assert_eq!(
            echoed.get("echoed"),
            Some(&value.len().to_string()),
            "{echoed:?} {}",
            text(&kept.stderr)
        );
        let shown = format!("{:?} {:?}", kept.changes, kept.files);
        assert!(
            !shown.contains(&value) && shown.contains("<redacted:llm>"),
            "{shown}"
        );
        let holds = kept
            .files
            .iter()
            .find(|f| f.path == "holds.txt")
            .and_then(|f| f.content.clone())
            .unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&holds).starts_with("the value: <redacted:llm>"),
            "holds.txt: {holds:?}"
        );
        let listed = engine
            .list_files(Scope::Server, &source, "")
            .await
            .expect("the listing");
        let names: Vec<&str> = listed.entries.iter().map(|e| e.name.as_str()).collect();
        assert!(
            !names.iter().any(|n| n.contains(&value))
                && names.iter().any(|n| n.starts_with("<redacted:llm>")),
            "{names:?}"
        );

        let forked = engine
            .fork_session(Scope::Server, &source)
            .await
            .expect("the fork");
        let meta = engine
            .snapshot_session(Scope::Server, &source, Some("with a placeholder".into()))
            .await
            .expect("the snapshot");
        let (restored, restored_report) = engine
            .restore_session(Scope::Server, &meta.id, &RunOptions::default())
            .await
            .expect("the restore");
        let reported = format!("{:?} {meta:?} {forked:?}", restored_report);
        assert!(
            !reported.contains(&value) && reported.contains("<redacted:llm>"),
            "{reported}"
        );
        let mut seen_placeholders = vec![placeholder.clone()];
        for (what, id) in [("fork", &forked.container_id), ("restore", &restored)] {
            let seen = in_session(&engine, id, &copy).await;
            let got = lines(&seen);
            let own = got.get("env").cloned().unwrap_or_default();
            assert!(
                own.starts_with("pcs-placeholder-llm-") && !seen_placeholders.contains(&own),
                "{what}: a placeholder of its own, not {seen_placeholders:?}: {got:?} {}",
                text(&seen.stderr)
            );
            seen_placeholders.push(own);
            assert_eq!(got.get("kept"), Some(&placeholder), "{what}: {got:?}");
            assert_eq!(
                got.get("masked-files").map(String::as_str),
                Some("1"),
                "{what}: {got:?}"
            );
            for call in ["own", "source's"] {
                assert_eq!(
                    got.get(call).map(String::as_str),
                    Some(r#"["value"]"#),
                    "{what}, {call}: {got:?}"
                );
            }
            engine.stop_session(Scope::Server, id).await.expect("stop");
        }
        engine
            .stop_session(Scope::Server, &source)
            .await
            .expect("stop the source");
        placeholder
    })
    .await;
    // The store holds the source's placeholder (a variable), never the value.
    let mut holds_placeholder = false;
    let mut pending = vec![store.clone()];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("the store").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                holds_placeholder |= !placeholder.is_empty()
                    && bytes
                        .windows(placeholder.len())
                        .any(|w| w == placeholder.as_bytes());
                assert!(
                    !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                    "{} holds the value",
                    path.display()
                );
            }
        }
    }
    // The scan finds what is there: the source's placeholder, in its variable.
    assert!(holds_placeholder, "the store does not hold {placeholder:?}");
    let _ = upstream.kill();
    let _ = upstream.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_nothing_left(&engine).await;
    assert_no_network_left(&engine);
}
