//! `bench`: cold ephemeral latency (create → result → removed) beside the floor measured on the
//! same machine in the same run, `docker run --rm IMAGE python3 -c pass`.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{infra_error, millis};
use crate::config::Config;
use crate::engine::docker::DockerBackend;
use crate::engine::{Engine, RunOptions, Task};

struct Series {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Series {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        sorted[rank.min(sorted.len() - 1)]
    }
}

pub async fn bench(config: Config, runs: usize, json: bool) -> ExitCode {
    let runs = runs.max(1);
    let image = config.image.clone();
    let engine = Engine::new(Arc::new(DockerBackend::for_config(&config)), config);
    let options = RunOptions::default();
    let hello = Task::Python("print('hello')");

    // One untimed run each, so image checks and page cache do not count.
    if let Err(e) = engine.run_ephemeral(hello, &options).await {
        return infra_error(&e);
    }
    if let Err(e) = docker_run(&image).await {
        return infra_error(&e);
    }

    let mut ours = Series {
        name: "ephemeral hello (create → result → removed)",
        samples: Vec::new(),
    };
    for _ in 0..runs {
        let started = Instant::now();
        match engine.run_ephemeral(hello, &options).await {
            Ok(execution) if execution.stdout == b"hello\n" => ours.samples.push(started.elapsed()),
            Ok(execution) => {
                return infra_error(&format!("unexpected output {:?}", execution.stdout))
            }
            Err(e) => return infra_error(&e),
        }
    }
    let mut floor = Series {
        name: "floor: docker run --rm IMAGE python3 -c pass",
        samples: Vec::new(),
    };
    for _ in 0..runs {
        let started = Instant::now();
        if let Err(e) = docker_run(&image).await {
            return infra_error(&e);
        }
        floor.samples.push(started.elapsed());
    }

    let ratio = millis(ours.percentile(50.0)) / millis(floor.percentile(50.0)).max(0.001);
    if json {
        let series: Vec<serde_json::Value> = [&ours, &floor]
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "runs": s.samples.len(),
                    "p50_ms": millis(s.percentile(50.0)),
                    "p95_ms": millis(s.percentile(95.0)),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "image": image, "series": series, "p50_ratio_to_floor": ratio })
        );
    } else {
        println!(
            "{:<48} {:>6} {:>10} {:>10}",
            "measurement", "runs", "p50 ms", "p95 ms"
        );
        for s in [&ours, &floor] {
            println!(
                "{:<48} {:>6} {:>10.1} {:>10.1}",
                s.name,
                s.samples.len(),
                millis(s.percentile(50.0)),
                millis(s.percentile(95.0))
            );
        }
        println!("p50 ratio to floor: {ratio:.2}");
    }
    ExitCode::SUCCESS
}

async fn docker_run(image: &str) -> Result<(), String> {
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
