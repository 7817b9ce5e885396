//! The floor every ephemeral call is compared with: a whole `docker run --rm` lifecycle.

use std::process::Stdio;

pub(crate) async fn docker_run(image: &str) -> Result<(), String> {
    let status = tokio::process::Command::new("docker")
        .args(["run", "--rm", image, "python3", "-c", "pass"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cannot run the docker CLI for the floor: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("docker run --rm {image} failed ({status})"))
    }
}
