//! The egress proxy: one HTTPS request to a local endpoint through `allowlist` against `bridge`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::client::{call, field_str, plot_server};

/// The host's address on Docker's default bridge, where the egress benchmark's endpoint listens.
pub(crate) fn bridge_address() -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "docker0"])
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| "docker0 has no IPv4 address".to_string())
}

/// The code each egress series runs: `runs` HTTPS requests on new connections (after one to warm
/// up), each timed inside the sandbox; prints the sorted seconds as JSON.
pub(crate) fn egress_probe(url: &str, runs: usize) -> String {
    format!(
        "import json, ssl, time, urllib.request\n\
         ctx = ssl._create_unverified_context()\n\
         samples = []\n\
         for i in range({}):\n\
         \x20   t = time.perf_counter()\n\
         \x20   urllib.request.urlopen('{url}', context=ctx, timeout=10).read()\n\
         \x20   samples.append(time.perf_counter() - t)\n\
         print(json.dumps(sorted(samples[1:])))\n",
        runs + 1
    )
}

/// One HTTPS request to an endpoint on this machine (a self-signed TLS server on the bridge
/// address): p50 of `runs` with `SANDBOX_NETWORK=bridge` (direct) and with `allowlist` (through
/// the egress proxy, which asks the server about each connection).
pub(crate) async fn egress(runs: usize, json_out: bool) -> Result<(), String> {
    step!("egress proxy, {runs} requests each");
    let address = bridge_address()?;
    let dir = std::env::temp_dir().join(format!("pcs-bench-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
        ])
        .arg("/CN=bench.test")
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("openssl: {e}"))?;
    if !made.success() {
        return Err("openssl could not make a certificate".into());
    }
    let listener = std::net::TcpListener::bind((address.as_str(), 0))
        .map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    drop(listener);
    let server = format!(
        "import http.server, ssl\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'ok')\n\
         \x20   def log_message(self, *a): pass\n\
         s = http.server.ThreadingHTTPServer(('{address}', {port}), H)\n\
         c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain('{}', '{}')\n\
         s.socket = c.wrap_socket(s.socket, server_side=True)\n\
         s.serve_forever()\n",
        cert.display(),
        key.display()
    );
    let mut endpoint = tokio::process::Command::new("python3")
        .args(["-c", &server])
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the endpoint: {e}"))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut figures = Vec::new();
    let allow = format!("bench.test:{port},{address}/32:{port}");
    let resolve = format!("bench.test={address}");
    for (mode, url, env) in [
        (
            "bridge",
            format!("https://{address}:{port}/"),
            vec![("SANDBOX_NETWORK", "bridge")],
        ),
        (
            "allowlist",
            format!("https://bench.test:{port}/"),
            vec![
                ("SANDBOX_NETWORK", "allowlist"),
                ("SANDBOX_EGRESS_ALLOW", allow.as_str()),
                ("SANDBOX_EGRESS_RESOLVE", resolve.as_str()),
            ],
        ),
    ] {
        let client = plot_server(&env).await?;
        let measured = async {
            let started = call(&client, "sandbox_initialize", json!({})).await?;
            let id = field_str(&started, "container_id")?;
            let ran = call(
                &client,
                "run_python",
                json!({"container_id": id, "code": egress_probe(&url, runs)}),
            )
            .await?;
            let stdout = field_str(&ran, "stdout")?;
            let samples: Vec<f64> = serde_json::from_str(stdout.trim())
                .map_err(|e| format!("{mode}: unreadable samples ({e}): {stdout}"))?;
            call(&client, "sandbox_stop", json!({"container_id": id})).await?;
            Ok::<_, String>(samples)
        }
        .await;
        let _ = client.cancel().await;
        let samples = measured?;
        let p50 = samples.get(samples.len() / 2).copied().unwrap_or(0.0) * 1000.0;
        let p95 = samples
            .get(samples.len() * 95 / 100)
            .copied()
            .unwrap_or(0.0)
            * 1000.0;
        figures.push((mode, p50, p95));
    }
    let _ = endpoint.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    let added = figures[1].1 - figures[0].1;
    if json_out {
        println!(
            "{}",
            json!({"egress_https_request": {
                "bridge_ms_p50": figures[0].1, "bridge_ms_p95": figures[0].2,
                "allowlist_ms_p50": figures[1].1, "allowlist_ms_p95": figures[1].2,
                "added_ms_p50": added}})
        );
    } else {
        for (mode, p50, p95) in &figures {
            println!("one HTTPS request (new connection, TLS) with {mode}: p50 {p50:.2} ms, p95 {p95:.2} ms");
        }
        println!("added by the egress proxy (p50): {added:.2} ms");
    }
    Ok(())
}
