//! Containers left on the engine: a server's sandboxes, found by the labels every sandbox carries
//! (managed, the server's host and pid), and the soak floor's containers, found by their own label;
//! counted, and removed once reported.

use std::process::Stdio;

use python_code_sandbox::engine::owner::{LABEL_HOST, LABEL_MANAGED, LABEL_PID};

/// The ids of the containers (running or not) carrying all these `key=value` labels.
async fn containers_with(labels: &[String]) -> Result<Vec<String>, String> {
    let mut command = tokio::process::Command::new("docker");
    command.args(["ps", "--all", "--quiet", "--no-trunc"]);
    for label in labels {
        command.arg("--filter").arg(format!("label={label}"));
    }
    let out = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run the docker CLI: {e}"))?;
    if !out.status.success() {
        return Err(format!("docker ps failed ({})", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
        .collect())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Every server's sandboxes on the engine.
pub(crate) async fn managed() -> Result<Vec<String>, String> {
    containers_with(&[format!("{LABEL_MANAGED}=true")]).await
}

/// The sandboxes of the server that ran as `pid` on this host.
pub(crate) async fn of_server(pid: u32) -> Result<Vec<String>, String> {
    containers_with(&[
        format!("{LABEL_MANAGED}=true"),
        format!("{LABEL_HOST}={}", hostname()),
        format!("{LABEL_PID}={pid}"),
    ])
    .await
}

/// The containers carrying this one `key=value` label.
pub(crate) async fn labelled(label: &str) -> Result<Vec<String>, String> {
    containers_with(&[label.to_string()]).await
}

/// Removes these containers (and their anonymous volumes), whichever still exist.
pub(crate) async fn remove(ids: &[String]) -> Result<(), String> {
    if ids.is_empty() {
        return Ok(());
    }
    // Fails for an id already gone; what is left is counted again by the caller.
    tokio::process::Command::new("docker")
        .args(["rm", "--force", "--volumes"])
        .args(ids)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cannot run the docker CLI: {e}"))?;
    Ok(())
}
