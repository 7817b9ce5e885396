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
print("interfaces", sorted(os.listdir("/sys/class/net")))
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
        assert_eq!(lines.len(), 6, "{out}\n{}", text(&seen.stderr));
        assert_eq!(lines[0], "interfaces ['eth0', 'lo']", "{out}");
        assert_ne!(lines[1], "peer connected", "a sandbox reached its peer: {out}");
        assert_ne!(lines[2], "host connected", "a sandbox reached the host: {out}");
        assert_eq!(lines[3], "dns fails", "{out}");
        assert_eq!(lines[4], "allowed hello", "{out}");
        assert!(
            lines[5].starts_with("other 403 refused by the sandbox's egress proxy: other.test"),
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
        engine.stop_session(Scope::Server, &a).await.expect("stop a");
        engine.stop_session(Scope::Server, &b).await.expect("stop b");
    })
    .await;
    assert_nothing_left(&engine).await;
    // The sandboxes' networks went with them.
    assert_no_network_left(&engine);
}
