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

/// How the soak's floor runs a program: `docker run --rm` of the same image, under the same
/// runtime, CPU quota and time limit as a sandbox, with no network.
pub(crate) struct FloorRun {
    pub(crate) image: String,
    pub(crate) runtime: String,
    pub(crate) cpus: f64,
    pub(crate) limit: std::time::Duration,
    /// A label on each floor container, so that one the bench had to abandon can be removed.
    pub(crate) label: String,
}

/// Bytes of each stream a floor run keeps (the rest is read and dropped).
const FLOOR_OUTPUT_MAX: usize = 1 << 20;

impl FloorRun {
    /// The `docker run` arguments for `code` (shown in the report).
    pub(crate) fn args(&self, code: &str) -> Vec<String> {
        [
            "run",
            "--rm",
            "--runtime",
            &self.runtime,
            "--cpus",
            &self.cpus.to_string(),
            "--network",
            "none",
            "--label",
            &self.label,
            &self.image,
            "timeout",
            &self.limit.as_secs_f64().to_string(),
            "python3",
            "-c",
            code,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Runs `code` once; its exit status and streams. A run still going long after the time
    /// limit is abandoned (its CLI killed; its container is removed with the others at the end).
    pub(crate) async fn run(&self, code: &str) -> Result<crate::mix::RunOutput, String> {
        use tokio::io::AsyncReadExt;
        async fn bounded(mut stream: impl tokio::io::AsyncRead + Unpin) -> std::io::Result<String> {
            let (mut kept, mut buffer) = (Vec::new(), vec![0u8; 1 << 16]);
            loop {
                let n = stream.read(&mut buffer).await?;
                if n == 0 {
                    return Ok(String::from_utf8_lossy(&kept).into_owned());
                }
                let room = FLOOR_OUTPUT_MAX.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
            }
        }
        let mut child = tokio::process::Command::new("docker")
            .args(self.args(code))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run the docker CLI for the floor: {e}"))?;
        let (stdout, stderr) = (
            child.stdout.take().ok_or("no stdout")?,
            child.stderr.take().ok_or("no stderr")?,
        );
        let ran = async {
            let (stdout, stderr) = tokio::try_join!(bounded(stdout), bounded(stderr))?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, stdout, stderr))
        };
        let patience = self.limit + std::time::Duration::from_secs(120);
        match tokio::time::timeout(patience, ran).await {
            Ok(Ok((status, stdout, stderr))) => Ok(crate::mix::RunOutput {
                status: status.code(),
                stdout,
                stderr,
            }),
            Ok(Err(e)) => Err(format!("reading the docker CLI: {e}")),
            Err(_) => Err(format!(
                "docker run still going {} s after its limit; abandoned",
                patience.as_secs()
            )),
        }
    }
}
