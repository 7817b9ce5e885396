//! The server as a child of this executable, and rmcp's client speaking MCP to it over stdio.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use crate::SERVER_ROLE;

pub(crate) type Client = RunningService<RoleClient, ()>;

pub(crate) async fn call(
    client: &Client,
    tool: &'static str,
    arguments: Value,
) -> Result<CallToolResult, String> {
    let arguments = match arguments {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .map_err(|e| format!("{tool}: {e}"))?;
    if result.is_error == Some(true) {
        return Err(format!(
            "{tool} failed: {:?}",
            result
                .content
                .first()
                .and_then(|c| c.as_text())
                .map(|t| &t.text)
        ));
    }
    Ok(result)
}

pub(crate) fn stdout_of(result: &CallToolResult) -> String {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s["stdout"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Starts the server as a child with these settings and connects rmcp's client to it.
pub(crate) async fn plot_server(env: &[(&str, &str)]) -> Result<Client, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (transport, _stderr) =
        TokioChildProcess::builder(tokio::process::Command::new(&exe).configure(|cmd| {
            cmd.env(SERVER_ROLE, "1").env("LOG_LEVEL", "warn");
            for (k, v) in &env {
                cmd.env(k, v);
            }
        }))
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    ().serve(transport)
        .await
        .map_err(|e| format!("initialize failed: {e}"))
}

pub(crate) fn field_str(result: &CallToolResult, name: &str) -> Result<String, String> {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s[name].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("no {name} in the result"))
}

/// A server child whose end this executable controls, as an MCP client library does: its pipes
/// are the client's transport, and [`ServerProcess::close_like_sdk`] ends it as the official
/// Python SDK's stdio client does. What it logs (`LOG_LEVEL=warn`) is kept, bounded.
pub(crate) struct ServerProcess {
    pub(crate) pid: u32,
    child: tokio::process::Child,
    log: Arc<Mutex<ServerLog>>,
}

/// The first lines the server logged, escaped and cut, and how many it logged in all.
#[derive(Default, Clone)]
pub(crate) struct ServerLog {
    pub(crate) first: Vec<String>,
    pub(crate) lines: u64,
}

/// Lines of the server's log kept.
const LOG_LINES: usize = 10;

/// How the server ended when its client closed the session.
pub(crate) enum Ended {
    /// It exited on its own once stdin was closed.
    StdinClosed(Duration),
    /// It exited on SIGTERM.
    Terminated(Duration),
    /// It was still running 2 s after SIGTERM and was killed.
    Killed(Duration),
}

impl Ended {
    pub(crate) fn how(&self) -> &'static str {
        match self {
            Ended::StdinClosed(_) => "stdin closed",
            Ended::Terminated(_) => "SIGTERM",
            Ended::Killed(_) => "SIGKILL",
        }
    }

    /// From the close of stdin to the end of the process.
    pub(crate) fn after(&self) -> Duration {
        match self {
            Ended::StdinClosed(d) | Ended::Terminated(d) | Ended::Killed(d) => *d,
        }
    }
}

/// The SDK's patience at each step of closing a stdio server.
const CLOSE_PATIENCE: Duration = Duration::from_secs(2);

/// Starts the server as a child with these settings, its stdin and stdout the client's transport.
/// When `initialize` fails the child is killed and its sandboxes removed.
pub(crate) async fn owned_server(env: &[(&str, &str)]) -> Result<(Client, ServerProcess), String> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut command = tokio::process::Command::new(&exe);
    command
        .env(SERVER_ROLE, "1")
        .env("LOG_LEVEL", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Only when the bench itself fails half-way; otherwise it is closed like the SDK does.
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let pid = child.id().ok_or("the server has no pid")?;
    let (stdin, stdout, stderr) = (
        child.stdin.take().ok_or("no stdin")?,
        child.stdout.take().ok_or("no stdout")?,
        child.stderr.take().ok_or("no stderr")?,
    );
    let log = Arc::new(Mutex::new(ServerLog::default()));
    let kept = log.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut log) = kept.lock() {
                log.lines += 1;
                if log.first.len() < LOG_LINES {
                    log.first.push(crate::mix::excerpt(&line));
                }
            }
        }
    });
    let process = ServerProcess { pid, child, log };
    match ().serve((stdout, stdin)).await {
        Ok(client) => Ok((client, process)),
        Err(e) => {
            let mut child = process.child;
            let _ = child.kill().await;
            if let Ok(left) = crate::leftovers::of_server(pid).await {
                let _ = crate::leftovers::remove(&left).await;
            }
            Err(format!("initialize failed: {e}"))
        }
    }
}

impl ServerProcess {
    /// Ends the session as the official Python SDK's stdio client does: closes the server's
    /// stdin (by ending `client`), waits up to 2 s for it to exit, then sends SIGTERM, waits 2 s
    /// more, then SIGKILL.
    pub(crate) async fn close_like_sdk(&mut self, client: Client) -> Ended {
        let started = Instant::now();
        // Ends the client's loop, which drops the transport: the server's stdin is closed.
        let _ = client.cancel().await;
        if let Ok(Ok(_)) = tokio::time::timeout(CLOSE_PATIENCE, self.child.wait()).await {
            return Ended::StdinClosed(started.elapsed());
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: kill(2) with a valid signal; the pid is our child, not yet reaped (its
            // wait has not returned), so it names no other process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if let Ok(Ok(_)) = tokio::time::timeout(CLOSE_PATIENCE, self.child.wait()).await {
            return Ended::Terminated(started.elapsed());
        }
        let _ = self.child.kill().await;
        Ended::Killed(started.elapsed())
    }

    /// What the server logged so far.
    pub(crate) fn log(&self) -> ServerLog {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }
}
