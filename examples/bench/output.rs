//! Output throughput: many short lines through the server against the same code under
//! `docker run --cpus`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, NumberOrString, ProgressToken, RequestMetaObject};
use serde_json::{json, Value};

use crate::client::{call, Client};
use crate::measure::{ms, rss_kib};

/// The output-throughput case: code printing many short lines, through the server (an ephemeral
/// call, without and with live output) against the same code under `docker run` of the same image
/// with the same CPU quota (and runtime, when one is named), its stdout piped to a counter. Also the server's memory around it: the
/// capture path keeps only the cap, whatever the code prints.
pub(crate) struct OutputThroughput {
    lines: u64,
    floor: Duration,
    floor_bytes: u64,
    plain: Duration,
    live: Duration,
    rss_before_kib: u64,
    rss_after_kib: u64,
}

impl OutputThroughput {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "lines": self.lines, "floor_ms": ms(self.floor), "floor_bytes": self.floor_bytes,
            "sandbox_ms": ms(self.plain), "sandbox_live_ms": ms(self.live),
            "ratio": ms(self.plain) / ms(self.floor).max(0.001),
            "ratio_live": ms(self.live) / ms(self.floor).max(0.001),
            "rss_before_kib": self.rss_before_kib, "rss_after_kib": self.rss_after_kib,
        })
    }

    pub(crate) fn print(&self) {
        println!(
            "output throughput, {} lines ({:.1} MB): MCP ephemeral {:.2} s, with live output {:.2} s; floor (docker run --rm --cpus, piped to a counter) {:.2} s; ratio {:.2} / {:.2}; server RSS {:.1} → {:.1} MiB",
            self.lines,
            self.floor_bytes as f64 / 1e6,
            self.plain.as_secs_f64(),
            self.live.as_secs_f64(),
            self.floor.as_secs_f64(),
            ms(self.plain) / ms(self.floor).max(0.001),
            ms(self.live) / ms(self.floor).max(0.001),
            self.rss_before_kib as f64 / 1024.0,
            self.rss_after_kib as f64 / 1024.0,
        );
    }
}

pub(crate) async fn output_throughput(
    client: &Client,
    server_pid: u32,
    image: &str,
    cpus: f64,
    lines: u64,
    runtime: Option<&str>,
) -> Result<OutputThroughput, String> {
    use tokio::io::AsyncReadExt;
    let code = format!("for i in range({lines}):\n    print('line', i)\n");
    let cpus = cpus.to_string();
    let mut args = vec!["run", "--rm", "--cpus", &cpus, "--network", "none"];
    if let Some(runtime) = runtime {
        args.extend(["--runtime", runtime]);
    }
    args.extend([image, "python3", "-c", &code]);

    let started = Instant::now();
    let mut child = tokio::process::Command::new("docker")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run the docker CLI for the floor: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut buffer = vec![0u8; 1 << 16];
    let mut floor_bytes = 0u64;
    loop {
        match stdout.read(&mut buffer).await {
            Ok(0) => break,
            Ok(n) => floor_bytes += n as u64,
            Err(e) => return Err(format!("reading the floor's output: {e}")),
        }
    }
    let status = child.wait().await.map_err(|e| e.to_string())?;
    let floor = started.elapsed();
    if !status.success() {
        return Err(format!("the output floor failed ({status})"));
    }

    let rss_before_kib = rss_kib(server_pid).unwrap_or(0);
    let arguments = json!({"code": code});
    let started = Instant::now();
    call(client, "run_python_ephemeral", arguments.clone()).await?;
    let plain = started.elapsed();
    // With a progress token: the live-output path runs too (this client ignores the notices).
    let Value::Object(arguments) = arguments else {
        return Err("arguments".into());
    };
    let mut request = CallToolRequestParams::new("run_python_ephemeral").with_arguments(arguments);
    request.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
        NumberOrString::String("bench-output".into()),
    )));
    let started = Instant::now();
    let result = client
        .call_tool(request)
        .await
        .map_err(|e| format!("run_python_ephemeral (live): {e}"))?;
    let live = started.elapsed();
    if result.is_error == Some(true) {
        return Err("the live output run failed".into());
    }
    Ok(OutputThroughput {
        lines,
        floor,
        floor_bytes,
        plain,
        live,
        rss_before_kib,
        rss_after_kib: rss_kib(server_pid).unwrap_or(0),
    })
}

/// `--only-output`: the output-throughput case alone, through a server whose sandboxes run under
/// `runtime`, against the floor under the same runtime.
pub(crate) async fn only_output(
    config: &python_code_sandbox::config::Config,
    runtime: &str,
    lines: u64,
    json: bool,
) -> Result<(), String> {
    let (client, mut server) = crate::client::owned_server(&[("SANDBOX_RUNTIME", runtime)]).await?;
    let measured = output_throughput(
        &client,
        server.pid,
        &config.image,
        config.limits.cpus,
        lines,
        Some(runtime),
    )
    .await;
    server.close_like_sdk(client).await;
    let measured = measured?;
    if json {
        println!(
            "{}",
            json!({ "runtime": runtime, "output": measured.to_json() })
        );
    } else {
        print!("{runtime}: ");
        measured.print();
    }
    Ok(())
}
