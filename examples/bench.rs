//! The benchmark: the server as an agent's client sees it, beside the floors measured on the
//! same machine in the same run. Run it with
//!
//! ```text
//! cargo run --release --features bench --example bench -- [--json] [--ephemeral-runs N] ...
//! ```
//!
//! (`--help` lists the knobs). It is an example, not part of the shipped binary, so the binary
//! carries neither this code nor rmcp's client.
//!
//! The server is the crate's command line (`cli::main`, exactly what the shipped binary runs),
//! started as a child of this executable and spoken to over stdio with rmcp's client. The floors
//! use the same engine: a full `docker run --rm IMAGE python3 -c pass` lifecycle (one at a time,
//! and as a rate with 4 in parallel), and a round trip to an already running, attached Python
//! interpreter. Nothing here is a test: it prints figures.

use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use python_code_sandbox::cli::{EXIT_CONFIG, EXIT_INFRA};
use python_code_sandbox::config::{self, Config};
use python_code_sandbox::engine::{Engine, RunOptions, Task};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, NumberOrString, ProgressToken, RequestMetaObject,
};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

/// Set in the environment of the child this executable starts: the child is the server.
const SERVER_ROLE: &str = "PYTHON_CODE_SANDBOX_BENCH_SERVER";

/// Measure the server through an MCP client beside the floors on this machine.
#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Cli {
    /// Sequential ephemeral calls (each series).
    #[arg(long, default_value_t = 50)]
    ephemeral_runs: usize,
    /// Session run_python calls.
    #[arg(long, default_value_t = 200)]
    session_runs: usize,
    /// docker run --rm lifecycles and cold runs for the floors.
    #[arg(long, default_value_t = 20)]
    floor_runs: usize,
    /// Length of each sustained-throughput measurement, e.g. 30s.
    #[arg(long, default_value = "30s")]
    throughput: String,
    /// Runs after which the server's memory is read again.
    #[arg(long, default_value_t = 1000)]
    rss_runs: usize,
    /// Pause between the paced ephemeral calls, e.g. 250ms (an agent thinks between calls).
    #[arg(long, default_value = "250ms")]
    think: String,
    /// SANDBOX_POOL_SIZE of the measured server.
    #[arg(long, default_value_t = 4)]
    pool: usize,
    /// Lines the output-throughput case prints (0 skips it).
    #[arg(long, default_value_t = 2_000_000)]
    output_lines: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Calls of the plot prompt (matplotlib + numpy) in each of its series.
    #[arg(long, default_value_t = 15)]
    plot_runs: usize,
    /// Pause before each call of the plot prompt with a prepared pool, e.g. 6s: time for the
    /// pool to prepare the next sandbox (one per set waits).
    #[arg(long, default_value = "6s")]
    plot_pause: String,
    /// Measure only the plot prompt (prepared sandboxes per dependency set).
    #[arg(long)]
    only_plot: bool,
    /// Measure only snapshots: save and restore a session holding a 100 MB numpy array and
    /// 1,000 small files, and fork a session holding 10 MB.
    #[arg(long)]
    only_snapshot: bool,
    /// Runs of each snapshot measurement.
    #[arg(long, default_value_t = 5)]
    snapshot_runs: usize,
    /// Measure only the egress proxy: one HTTPS request to a local endpoint through
    /// `SANDBOX_NETWORK=allowlist` against the same request with `bridge`.
    #[arg(long)]
    only_egress: bool,
    /// Requests of each egress series.
    #[arg(long, default_value_t = 50)]
    egress_runs: usize,
    /// Measure only the runtimes side by side: pooled ephemeral runs, session calls and cold
    /// ephemeral runs (no pool) under runc and under gVisor (when registered).
    #[arg(long)]
    only_runtimes: bool,
}

/// The step under way, shown as a spinner on a terminal and as plain lines otherwise.
static PROGRESS: std::sync::OnceLock<python_code_sandbox::engine::ProgressSink> =
    std::sync::OnceLock::new();

macro_rules! step {
    ($($arg:tt)*) => {
        match PROGRESS.get() {
            Some(progress) => progress(&format!($($arg)*)),
            None => eprintln!("bench: {}", format!($($arg)*)),
        }
    };
}

fn main() -> ExitCode {
    if std::env::var_os(SERVER_ROLE).is_some() {
        return python_code_sandbox::cli::main();
    }
    let cli = Cli::parse();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("python-code-sandbox: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // Logs at `warn` unless LOG_LEVEL says otherwise; stdout is the figures.
    python_code_sandbox::cli::init_logging(&config, "warn");
    let durations = (
        config::parse_duration("--throughput", &cli.throughput),
        humantime::parse_duration(&cli.think).map_err(|e| {
            config::ConfigError::new("--think", cli.think.clone(), "a duration such as 250ms")
                .because(e)
        }),
    );
    let (throughput, think) = match durations {
        (Ok(t), Ok(k)) => (t, k),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("python-code-sandbox: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let plot_pause = match humantime::parse_duration(&cli.plot_pause) {
        Ok(pause) => pause,
        Err(e) => {
            eprintln!(
                "python-code-sandbox: {}",
                config::ConfigError::new(
                    "--plot-pause",
                    cli.plot_pause.clone(),
                    "a duration such as 6s"
                )
                .because(e)
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let plot = PlotOptions {
        runs: cli.plot_runs.max(1),
        pause: plot_pause,
        json: cli.json,
    };
    let options = BenchOptions {
        ephemeral_runs: cli.ephemeral_runs.max(1),
        session_runs: cli.session_runs.max(1),
        floor_runs: cli.floor_runs.max(1),
        throughput,
        rss_runs: cli.rss_runs,
        think,
        pool_size: cli.pool,
        output_lines: cli.output_lines,
        json: cli.json,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("python-code-sandbox: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_INFRA);
        }
    };
    let only_plot = cli.only_plot;
    let (only_snapshot, snapshot_runs) = (cli.only_snapshot, cli.snapshot_runs.max(1));
    let json_out = cli.json;
    let (only_egress, egress_runs) = (cli.only_egress, cli.egress_runs.max(1));
    let only_runtimes = cli.only_runtimes;
    let progress = python_code_sandbox::cli::progress::Progress::start("bench");
    let _ = PROGRESS.set(progress.sink());
    let measured = runtime.block_on(async move {
        if only_runtimes {
            return runtimes(&options).await;
        }
        if only_egress {
            return egress(egress_runs, json_out).await;
        }
        if only_snapshot {
            return snapshots(snapshot_runs, json_out).await;
        }
        if !only_plot {
            run(config.clone(), options).await?;
        }
        plot_prompt(config, plot).await?;
        snapshots(snapshot_runs, json_out).await
    });
    progress.finish(if measured.is_ok() { "done" } else { "failed" });
    match measured {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("python-code-sandbox: error: {e}");
            ExitCode::from(EXIT_INFRA)
        }
    }
}

/// What to measure, and how much.
#[derive(Debug, Clone)]
struct BenchOptions {
    ephemeral_runs: usize,
    session_runs: usize,
    floor_runs: usize,
    throughput: Duration,
    rss_runs: usize,
    /// Pause between sequential ephemeral calls (an agent thinks between calls); the back-to-back
    /// series is always measured too.
    think: Duration,
    pool_size: usize,
    output_lines: u64,
    json: bool,
}

struct Series {
    name: String,
    samples: Vec<Duration>,
    floor: Option<Duration>,
}

impl Series {
    fn new(name: impl Into<String>, samples: Vec<Duration>, floor: Option<Duration>) -> Self {
        Series {
            name: name.into(),
            samples,
            floor,
        }
    }

    fn percentile(&self, p: f64) -> Duration {
        percentile(&self.samples, p)
    }
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

type Client = RunningService<RoleClient, ()>;

async fn call(
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

fn stdout_of(result: &CallToolResult) -> String {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s["stdout"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Resident memory of a process, from /proc.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
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

/// Runs `work` from `workers` tasks until `period` is over; returns completed and failed counts.
async fn sustained<F, Fut>(workers: usize, period: Duration, work: F) -> (u64, u64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + period;
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (done, failed, work) = (done.clone(), failed.clone(), work.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if work().await {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

async fn run(config: Config, options: BenchOptions) -> Result<(), String> {
    let image = config.image.clone();
    step!(
        "floors ({} docker run --rm lifecycles, attached round trips)",
        options.floor_runs
    );
    docker_run(&image).await?;
    let mut lifecycle = Vec::new();
    for _ in 0..options.floor_runs {
        let started = Instant::now();
        docker_run(&image).await?;
        lifecycle.push(started.elapsed());
    }
    let floor_lifecycle = percentile(&lifecycle, 50.0);

    // Round trips to a running, attached interpreter, and cold ephemeral runs without a pool.
    let engine = Engine::with_docker(Config {
        pool_size: 0,
        ..config.clone()
    });
    let round_trips = engine
        .runner_round_trips(200)
        .await
        .map_err(|e| e.to_string())?;
    let floor_round_trip = percentile(&round_trips, 50.0);
    let mut cold = Vec::new();
    for _ in 0..options.floor_runs {
        let started = Instant::now();
        let run = engine
            .run_ephemeral(Task::Python("print('hello')"), &RunOptions::default())
            .await;
        run.map_err(|e| e.to_string())?;
        engine.settle().await;
        cold.push(started.elapsed());
    }
    engine.shutdown().await;

    step!(
        "lifecycle rate, 4 in parallel for {}s",
        options.throughput.as_secs()
    );
    let image_for_rate = image.clone();
    let (lifecycles, lifecycle_errors) = sustained(4, options.throughput, move || {
        let image = image_for_rate.clone();
        async move { docker_run(&image).await.is_ok() }
    })
    .await;
    let lifecycle_rate = lifecycles as f64 / options.throughput.as_secs_f64();

    step!("the MCP server over stdio (pool of {})", options.pool_size);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let pool_size = options.pool_size.to_string();
    let spawned = Instant::now();
    let (transport, _stderr) =
        TokioChildProcess::builder(tokio::process::Command::new(&exe).configure(|cmd| {
            cmd.env(SERVER_ROLE, "1")
                .env("SANDBOX_POOL_SIZE", &pool_size)
                .env("LOG_LEVEL", "warn");
        }))
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let server_pid = transport.id().ok_or("the server has no pid")?;
    let client: Client = ().serve(transport).await.map_err(|e| format!("initialize failed: {e}"))?;
    let initialize = spawned.elapsed();
    // Idle: give the pool time to fill, then read the server's memory.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_idle = rss_kib(server_pid).unwrap_or(0);

    let hello = json!({"code": "print('hello')"});
    let mut calls = 0usize;
    for _ in 0..3 {
        call(&client, "run_python_ephemeral", hello.clone()).await?;
        calls += 1;
    }
    step!(
        "ephemeral hello, {} calls, {} ms apart",
        options.ephemeral_runs,
        options.think.as_millis()
    );
    let mut paced = Vec::new();
    for _ in 0..options.ephemeral_runs {
        tokio::time::sleep(options.think).await;
        let started = Instant::now();
        let result = call(&client, "run_python_ephemeral", hello.clone()).await?;
        paced.push(started.elapsed());
        calls += 1;
        if stdout_of(&result) != "hello\n" {
            return Err(format!("unexpected output {:?}", stdout_of(&result)));
        }
    }
    step!(
        "ephemeral hello, {} calls back to back",
        options.ephemeral_runs
    );
    let mut back_to_back = Vec::new();
    for _ in 0..options.ephemeral_runs {
        let started = Instant::now();
        call(&client, "run_python_ephemeral", hello.clone()).await?;
        back_to_back.push(started.elapsed());
        calls += 1;
    }

    // After the first hundred calls: connection pools and buffers exist; growth past this is a leak.
    let (warm_calls, rss_warm) = (calls, rss_kib(server_pid).unwrap_or(0));

    step!("session run_python hello, {} calls", options.session_runs);
    let session = call(&client, "sandbox_initialize", json!({})).await?;
    let container_id = session
        .structured_content
        .as_ref()
        .and_then(|s| s["container_id"].as_str())
        .unwrap_or_default()
        .to_string();
    let session_call = json!({"container_id": container_id, "code": "print('hello')"});
    call(&client, "run_python", session_call.clone()).await?;
    let mut in_session = Vec::new();
    for _ in 0..options.session_runs {
        let started = Instant::now();
        call(&client, "run_python", session_call.clone()).await?;
        in_session.push(started.elapsed());
    }
    step!("session run_python, a 1000-row DataFrame as the last value");
    let make_frame = json!({
        "container_id": container_id,
        "dependencies": ["pandas"],
        "code": "import numpy as np, pandas as pd\n\
                 df = pd.DataFrame({'n': np.arange(1000), 'half': np.arange(1000) / 2, \
                 'label': [f'row {i}' for i in range(1000)]})",
    });
    call(&client, "run_python", make_frame).await?;
    let show_frame = json!({"container_id": container_id, "code": "df"});
    let shown = call(&client, "run_python", show_frame.clone()).await?;
    let is_table = shown.structured_content.as_ref().is_some_and(|s| {
        s["outputs"][0]["data"]["text/html"]
            .as_str()
            .is_some_and(|html| html.contains("<table"))
    });
    if !is_table {
        return Err("the DataFrame did not come back as an HTML table".into());
    }
    let mut frames = Vec::new();
    for _ in 0..options.session_runs {
        let started = Instant::now();
        call(&client, "run_python", show_frame.clone()).await?;
        frames.push(started.elapsed());
    }
    call(
        &client,
        "sandbox_stop",
        json!({"container_id": container_id}),
    )
    .await?;
    let frame_above_hello = ms(percentile(&frames, 50.0)) - ms(percentile(&in_session, 50.0));

    let output = if options.output_lines > 0 {
        step!(
            "output throughput, {} lines, against docker run --cpus {}",
            options.output_lines,
            config.limits.cpus
        );
        Some(
            output_throughput(
                &client,
                server_pid,
                &image,
                config.limits.cpus,
                options.output_lines,
            )
            .await?,
        )
    } else {
        None
    };

    step!("ephemeral with one cached dependency");
    let with_dep = json!({"code": "import six\nprint('hello')", "dependencies": ["six"]});
    call(&client, "run_python_ephemeral", with_dep.clone()).await?;
    let mut cached_dep = Vec::new();
    for _ in 0..options.ephemeral_runs.min(30) {
        tokio::time::sleep(options.think).await;
        let started = Instant::now();
        let result = call(&client, "run_python_ephemeral", with_dep.clone()).await?;
        cached_dep.push(started.elapsed());
        calls += 1;
        let installed = result
            .structured_content
            .as_ref()
            .and_then(|s| s["dependencies"]["installed"].as_bool());
        if installed != Some(false) {
            return Err("the cached dependency was installed again".into());
        }
    }

    step!(
        "sustained ephemeral throughput, 4 concurrent calls for {}s",
        options.throughput.as_secs()
    );
    let client = Arc::new(client);
    let shared = client.clone();
    let (completed, errors) = sustained(4, options.throughput, move || {
        let client = shared.clone();
        async move {
            call(
                &client,
                "run_python_ephemeral",
                json!({"code": "print('hello')"}),
            )
            .await
            .is_ok()
        }
    })
    .await;
    calls += (completed + errors) as usize;
    let throughput = completed as f64 / options.throughput.as_secs_f64();

    if calls < options.rss_runs {
        step!(
            "{} more runs for the memory figure",
            options.rss_runs - calls
        );
        let shared = client.clone();
        let remaining = Arc::new(AtomicU64::new((options.rss_runs - calls) as u64));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (client, remaining) = (shared.clone(), remaining.clone());
                tokio::spawn(async move {
                    while remaining
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        let _ = call(
                            &client,
                            "run_python_ephemeral",
                            json!({"code": "print('hello')"}),
                        )
                        .await;
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        calls = options.rss_runs.max(calls);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib(server_pid).unwrap_or(0);
    if let Ok(client) = Arc::try_unwrap(client) {
        let _ = client.cancel().await;
    }

    let series = [
        Series::new(
            "cold ephemeral, no pool (create → result → removed)",
            cold,
            Some(floor_lifecycle),
        ),
        Series::new(
            format!(
                "MCP ephemeral hello, pool {}, {} ms apart",
                options.pool_size,
                options.think.as_millis()
            ),
            paced,
            Some(floor_lifecycle),
        ),
        Series::new(
            format!(
                "MCP ephemeral hello, pool {}, back to back",
                options.pool_size
            ),
            back_to_back,
            Some(floor_lifecycle),
        ),
        Series::new(
            "MCP session run_python hello",
            in_session,
            Some(floor_round_trip),
        ),
        Series::new(
            "MCP session run_python, 1000-row DataFrame as value",
            frames,
            None,
        ),
        Series::new(
            "MCP ephemeral with a cached dependency",
            cached_dep,
            Some(floor_lifecycle),
        ),
        Series::new(
            "floor: docker run --rm IMAGE python3 -c pass",
            lifecycle,
            None,
        ),
        Series::new("floor: attached interpreter round trip", round_trips, None),
    ];
    if options.json {
        let rows: Vec<Value> = series
            .iter()
            .map(|s| {
                json!({
                    "name": s.name, "runs": s.samples.len(),
                    "p50_ms": ms(s.percentile(50.0)), "p95_ms": ms(s.percentile(95.0)),
                    "ratio_to_floor": s.floor.map(|f| ms(s.percentile(50.0)) / ms(f).max(0.001)),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "image": image, "series": rows,
                "throughput": {"calls_per_s": throughput, "errors": errors, "lifecycle_floor_per_s": lifecycle_rate,
                               "lifecycle_errors": lifecycle_errors, "ratio": throughput / lifecycle_rate.max(0.001)},
                "dataframe_above_session_hello_ms": frame_above_hello,
                "output_throughput": output.as_ref().map(OutputThroughput::to_json),
                "server": {"spawn_to_initialize_ms": ms(initialize), "rss_idle_kib": rss_idle,
                           "rss_warm_kib": rss_warm, "warm_runs": warm_calls,
                           "rss_after_runs_kib": rss_after, "runs": calls},
            })
        );
        return Ok(());
    }
    println!(
        "{:<56} {:>6} {:>10} {:>10} {:>9}",
        "measurement", "runs", "p50 ms", "p95 ms", "/ floor"
    );
    for s in &series {
        let ratio = s
            .floor
            .map(|f| format!("{:.2}", ms(s.percentile(50.0)) / ms(f).max(0.001)))
            .unwrap_or_default();
        println!(
            "{:<56} {:>6} {:>10.2} {:>10.2} {:>9}",
            s.name,
            s.samples.len(),
            ms(s.percentile(50.0)),
            ms(s.percentile(95.0)),
            ratio
        );
    }
    println!("a 1000-row DataFrame as the last value: {frame_above_hello:.2} ms above session hello (p50)");
    println!(
        "sustained ephemeral, 4 concurrent: {throughput:.2} calls/s, {errors} errors; floor (docker run --rm, 4 parallel): {lifecycle_rate:.2}/s ({lifecycle_errors} errors); ratio {:.2}",
        throughput / lifecycle_rate.max(0.001)
    );
    println!(
        "server: spawn → initialize answered {:.1} ms; RSS idle {:.1} MiB, after {warm_calls} runs {:.1} MiB, after {calls} runs {:.1} MiB",
        ms(initialize),
        rss_idle as f64 / 1024.0,
        rss_warm as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    if let Some(output) = &output {
        output.print();
    }
    Ok(())
}

/// The plot prompt's series: how many calls, the pause before each with a prepared pool.
struct PlotOptions {
    runs: usize,
    pause: Duration,
    json: bool,
}

/// The original project's second test prompt: dependencies matplotlib and numpy, a sine wave saved
/// to a PNG. It prints whether pyplot was already imported when it started (a prepared sandbox).
const PLOT_CODE: &str = "import sys\n\
prepared = 'matplotlib.pyplot' in sys.modules\n\
import numpy as np\n\
import matplotlib.pyplot as plt\n\
x = np.linspace(0, 2 * np.pi, 200)\n\
plt.plot(x, np.sin(x))\n\
plt.title('Sine wave')\n\
plt.savefig('sine.png')\n\
print('prepared' if prepared else 'cold')\n";

/// The back-to-back bursts at default settings: calls per burst, and the pause between bursts.
const BURST: usize = 50;
const BURST_PAUSE: Duration = Duration::from_secs(15);

const PLOT_SET: &[&str] = &["matplotlib", "numpy"];

/// The data-analysis call: a 100k-row frame, a group-by, a bar chart saved as PNG.
const ANALYSIS_CODE: &str = "import sys\n\
prepared = 'pandas' in sys.modules\n\
import numpy as np\n\
import pandas as pd\n\
import matplotlib.pyplot as plt\n\
rng = np.random.default_rng(0)\n\
df = pd.DataFrame({'group': rng.integers(0, 10, 100_000), 'value': rng.normal(size=100_000)})\n\
summary = df.groupby('group')['value'].agg(['mean', 'std', 'count'])\n\
summary['mean'].plot(kind='bar')\n\
plt.savefig('groups.png')\n\
print('prepared' if prepared else 'cold')\n";

const ANALYSIS_SET: &[&str] = &["matplotlib", "pandas"];

/// Starts the server as a child with these settings and connects rmcp's client to it.
async fn plot_server(env: &[(&str, &str)]) -> Result<Client, String> {
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

/// Runs the plot prompt `runs` times, `pause` before each; returns the durations and how many
/// calls found pyplot already imported.
async fn plot_series(
    client: &Client,
    runs: usize,
    pause: Duration,
) -> Result<(Vec<Duration>, usize), String> {
    prepared_series(client, PLOT_CODE, PLOT_SET, "sine.png", runs, pause).await
}

/// Runs `code` (which prints `prepared` or `cold`) with dependencies `set` `runs` times, `pause`
/// before each; checks that `file` came back; returns the durations and how many calls found the
/// set's modules already imported.
async fn prepared_series(
    client: &Client,
    code: &str,
    set: &[&str],
    file: &str,
    runs: usize,
    pause: Duration,
) -> Result<(Vec<Duration>, usize), String> {
    let prompt = json!({"code": code, "dependencies": set});
    let mut samples = Vec::with_capacity(runs);
    let mut prepared = 0;
    for _ in 0..runs {
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        let result = call(client, "run_python_ephemeral", prompt.clone()).await?;
        samples.push(started.elapsed());
        match stdout_of(&result).trim() {
            "prepared" => prepared += 1,
            "cold" => {}
            other => return Err(format!("the code printed {other:?}")),
        }
        let saved = result
            .structured_content
            .as_ref()
            .is_some_and(|s| s.to_string().contains(file));
        if !saved {
            return Err(format!("the code's {file} did not come back"));
        }
    }
    Ok((samples, prepared))
}

/// The plot prompt with the pool prepared for its set and with every pool disabled, beside the
/// plain hello of the same server, and the memory of prepared sandboxes.
async fn plot_prompt(config: Config, options: PlotOptions) -> Result<(), String> {
    let runs = options.runs;
    step!(
        "plot prompt, pool prepared for matplotlib+numpy, {runs} calls {} ms apart",
        options.pause.as_millis()
    );
    // The default pool size, so that the same server's hello has its usual pool.
    let prepared_server = plot_server(&[
        ("SANDBOX_POOL_SIZE", "2"),
        ("SANDBOX_PRELOAD", "matplotlib,numpy;matplotlib,pandas"),
    ])
    .await?;
    // The first calls install the sets if the cache does not hold them yet.
    plot_series(&prepared_server, 1, Duration::ZERO).await?;
    let analysis = |runs, pause| {
        prepared_series(
            &prepared_server,
            ANALYSIS_CODE,
            ANALYSIS_SET,
            "groups.png",
            runs,
            pause,
        )
    };
    analysis(1, Duration::ZERO).await?;
    let (with_pool, hits) = plot_series(&prepared_server, runs, options.pause).await?;
    step!("data analysis (pandas, 100k rows, group-by, bar chart), pool prepared");
    let (analysis_samples, analysis_hits) = analysis(runs, options.pause).await?;
    let hello = json!({"code": "print('hello')"});
    let mut hellos = Vec::new();
    for _ in 0..runs {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let started = Instant::now();
        call(&prepared_server, "run_python_ephemeral", hello.clone()).await?;
        hellos.push(started.elapsed());
    }
    let _ = prepared_server.cancel().await;

    step!("plot prompt, every pool disabled, {runs} calls back to back");
    let cold_server = plot_server(&[("SANDBOX_POOL_SIZE", "0")]).await?;
    let (without_pool, _) = plot_series(&cold_server, runs, Duration::ZERO).await?;
    let _ = cold_server.cancel().await;

    step!(
        "ephemeral hello back to back at default settings, 3 bursts of {BURST} calls, {} s apart",
        BURST_PAUSE.as_secs()
    );
    let default_server = plot_server(&[]).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut bursts = Vec::new();
    for n in 0..3 {
        if n > 0 {
            tokio::time::sleep(BURST_PAUSE).await;
        }
        let mut samples = Vec::with_capacity(BURST);
        for _ in 0..BURST {
            let started = Instant::now();
            call(&default_server, "run_python_ephemeral", hello.clone()).await?;
            samples.push(started.elapsed());
        }
        bursts.push(samples);
    }
    let _ = default_server.cancel().await;

    step!("memory of the pool (Docker's measure), default size, two sets prepared");
    let engine = Arc::new(Engine::with_docker(Config {
        pool_size: Config::default().pool_size,
        preload: vec![
            vec!["matplotlib".into(), "numpy".into()],
            vec!["matplotlib".into(), "numpy".into(), "pandas".into()],
        ],
        ..config
    }));
    engine.start_pool();
    let waited = tokio::time::timeout(Duration::from_secs(900), async {
        while engine.prepared_ready() < 2 || engine.pool_ready() < engine.pool_target() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let sets = engine.prepared_sets();
    let pool_memory = engine.prepared_memory();
    let plain_memory = engine.pool_memory().await;
    let plain_ready = engine.pool_ready();
    engine.shutdown().await;
    if waited.is_err() {
        return Err("the prepared sandboxes for the memory figure were not ready in time".into());
    }

    let hello_p50 = ms(percentile(&hellos, 50.0));
    let series = [
        ("plot prompt, pool prepared for the set", &with_pool),
        ("plot prompt, every pool disabled", &without_pool),
        (
            "data analysis (pandas 100k rows), pool prepared",
            &analysis_samples,
        ),
        ("ephemeral hello, same server, 250 ms apart", &hellos),
        (
            "hello back to back, default settings, 1st burst",
            &bursts[0],
        ),
        (
            "hello back to back, default settings, 2nd burst",
            &bursts[1],
        ),
        (
            "hello back to back, default settings, 3rd burst",
            &bursts[2],
        ),
    ];
    if options.json {
        let rows: Vec<Value> = series
            .iter()
            .map(|(name, samples)| {
                json!({"name": name, "runs": samples.len(), "p50_ms": ms(percentile(samples, 50.0)),
                       "p95_ms": ms(percentile(samples, 95.0)),
                       "ratio_to_hello": ms(percentile(samples, 50.0)) / hello_p50.max(0.001)})
            })
            .collect();
        let memory: Vec<Value> = sets
            .iter()
            .map(|(set, bytes)| json!({"set": set, "bytes": bytes}))
            .collect();
        println!(
            "{}",
            json!({"plot": rows, "prepared_hits": hits, "analysis_prepared_hits": analysis_hits,
                   "prepared_memory": memory, "prepared_pool_bytes": pool_memory,
                   "plain_pool_ready": plain_ready, "plain_pool_bytes": plain_memory})
        );
        return Ok(());
    }
    println!(
        "{:<56} {:>6} {:>10} {:>10} {:>9}",
        "measurement", "runs", "p50 ms", "p95 ms", "/ hello"
    );
    for (name, samples) in series {
        println!(
            "{:<56} {:>6} {:>10.2} {:>10.2} {:>9.2}",
            name,
            samples.len(),
            ms(percentile(samples, 50.0)),
            ms(percentile(samples, 95.0)),
            ms(percentile(samples, 50.0)) / hello_p50.max(0.001)
        );
    }
    println!("plot prompt calls served by a prepared sandbox: {hits} of {runs}; data analysis: {analysis_hits} of {runs}");
    for (set, bytes) in &sets {
        println!(
            "prepared sandbox for {}: {:.1} MiB",
            set.join(" "),
            *bytes as f64 / (1024.0 * 1024.0)
        );
    }
    println!(
        "prepared sandboxes together: {:.1} MiB; plain pool ({plain_ready} waiting): {:.1} MiB; whole pool {:.1} MiB",
        pool_memory as f64 / (1024.0 * 1024.0),
        plain_memory as f64 / (1024.0 * 1024.0),
        (pool_memory + plain_memory) as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// The output-throughput case: code printing many short lines, through the server (an ephemeral
/// call, without and with live output) against the same code under `docker run` of the same image
/// with the same CPU quota, its stdout piped to a counter. Also the server's memory around it: the
/// capture path keeps only the cap, whatever the code prints.
struct OutputThroughput {
    lines: u64,
    floor: Duration,
    floor_bytes: u64,
    plain: Duration,
    live: Duration,
    rss_before_kib: u64,
    rss_after_kib: u64,
}

impl OutputThroughput {
    fn to_json(&self) -> Value {
        json!({
            "lines": self.lines, "floor_ms": ms(self.floor), "floor_bytes": self.floor_bytes,
            "sandbox_ms": ms(self.plain), "sandbox_live_ms": ms(self.live),
            "ratio": ms(self.plain) / ms(self.floor).max(0.001),
            "ratio_live": ms(self.live) / ms(self.floor).max(0.001),
            "rss_before_kib": self.rss_before_kib, "rss_after_kib": self.rss_after_kib,
        })
    }

    fn print(&self) {
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

async fn output_throughput(
    client: &Client,
    server_pid: u32,
    image: &str,
    cpus: f64,
    lines: u64,
) -> Result<OutputThroughput, String> {
    use tokio::io::AsyncReadExt;
    let code = format!("for i in range({lines}):\n    print('line', i)\n");

    let started = Instant::now();
    let mut child = tokio::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--cpus",
            &cpus.to_string(),
            image,
            "python3",
            "-c",
            &code,
        ])
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

/// A session with `code` run in it (dependencies numpy).
async fn session_with(client: &Client, code: &str) -> Result<String, String> {
    let started = call(
        client,
        "sandbox_initialize",
        json!({"dependencies": ["numpy"]}),
    )
    .await?;
    let id = started
        .structured_content
        .as_ref()
        .and_then(|s| s["container_id"].as_str())
        .ok_or("sandbox_initialize returned no container_id")?
        .to_string();
    call(
        client,
        "run_python",
        json!({"container_id": id, "code": code}),
    )
    .await?;
    Ok(id)
}

fn field_str(result: &CallToolResult, name: &str) -> Result<String, String> {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s[name].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("no {name} in the result"))
}

/// Snapshot and restore of a session holding a 100 MB numpy array and 1,000 small files, and a
/// fork of a session holding 10 MB: time (p50 of `runs`) and size.
async fn snapshots(runs: usize, json_out: bool) -> Result<(), String> {
    step!("snapshots, {runs} runs each");
    let dir = std::env::temp_dir().join(format!("pcs-bench-snapshots-{}", std::process::id()));
    let dir_text = dir.to_string_lossy().to_string();
    let client = plot_server(&[("SANDBOX_SNAPSHOT_DIR", &dir_text)]).await?;
    let measured = async {
        let big = session_with(
            &client,
            "import numpy as np, os\n\
             arr = np.random.default_rng(0).random(100 * 2**20 // 8)\n\
             os.makedirs('small', exist_ok=True)\n\
             for i in range(1000):\n    open(f'small/{i}.txt', 'w').write('x' * 100)\n",
        )
        .await?;
        let (mut save, mut restore, mut size) = (Vec::new(), Vec::new(), 0u64);
        for _ in 0..runs {
            let started = Instant::now();
            let saved = call(&client, "sandbox_snapshot", json!({"container_id": big})).await?;
            save.push(started.elapsed());
            let snapshot = field_str(&saved, "snapshot_id")?;
            size = saved
                .structured_content
                .as_ref()
                .and_then(|s| s["size_bytes"].as_u64())
                .unwrap_or(0);
            let started = Instant::now();
            let restored = call(
                &client,
                "sandbox_initialize",
                json!({"snapshot_id": snapshot}),
            )
            .await?;
            restore.push(started.elapsed());
            let id = field_str(&restored, "container_id")?;
            call(&client, "sandbox_stop", json!({"container_id": id})).await?;
            call(
                &client,
                "sandbox_snapshot_delete",
                json!({"snapshot_id": snapshot}),
            )
            .await?;
        }
        call(&client, "sandbox_stop", json!({"container_id": big})).await?;
        let small = session_with(
            &client,
            "import numpy as np\nstate = np.ones(10 * 2**20 // 8)\n",
        )
        .await?;
        let mut fork = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            let forked = call(&client, "sandbox_fork", json!({"container_id": small})).await?;
            fork.push(started.elapsed());
            let id = field_str(&forked, "container_id")?;
            call(&client, "sandbox_stop", json!({"container_id": id})).await?;
        }
        call(&client, "sandbox_stop", json!({"container_id": small})).await?;
        Ok::<_, String>((save, restore, size, fork))
    }
    .await;
    let _ = client.cancel().await;
    let _ = std::fs::remove_dir_all(&dir);
    let (save, restore, size, fork) = measured?;
    let p50 = |samples: &[Duration]| ms(percentile(samples, 50.0));
    if json_out {
        println!(
            "{}",
            json!({"snapshot_100mb_1000_files": {"save_ms_p50": p50(&save), "restore_ms_p50": p50(&restore),
                   "size_bytes": size}, "fork_10mb": {"ms_p50": p50(&fork)}})
        );
    } else {
        println!("snapshot of 100 MB array + 1,000 files: save p50 {} ms, restore p50 {} ms (new session included), size {:.1} MiB",
            p50(&save), p50(&restore), size as f64 / (1 << 20) as f64);
        println!("fork of a session holding 10 MB: p50 {} ms", p50(&fork));
    }
    Ok(())
}

/// The host's address on Docker's default bridge, where the egress benchmark's endpoint listens.
fn bridge_address() -> Result<String, String> {
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
fn egress_probe(url: &str, runs: usize) -> String {
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
async fn egress(runs: usize, json_out: bool) -> Result<(), String> {
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

/// The figures of one runtime: pooled ephemeral, session and cold ephemeral calls (p50, p95).
struct RuntimeFigures {
    runtime: &'static str,
    pooled: Vec<Duration>,
    session: Vec<Duration>,
    cold: Vec<Duration>,
}

/// `runs` calls of `arguments` to `tool`, `think` before each; checks the output is `hello`.
async fn hello_series(
    client: &Client,
    tool: &'static str,
    arguments: Value,
    runs: usize,
    think: Duration,
) -> Result<Vec<Duration>, String> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        tokio::time::sleep(think).await;
        let started = Instant::now();
        let result = call(client, tool, arguments.clone()).await?;
        samples.push(started.elapsed());
        if stdout_of(&result) != "hello\n" {
            return Err(format!("unexpected output {:?}", stdout_of(&result)));
        }
    }
    Ok(samples)
}

/// One runtime measured through the server: a pooled server, then one with no pool.
async fn runtime_figures(
    runtime: &'static str,
    options: &BenchOptions,
) -> Result<RuntimeFigures, String> {
    let hello = json!({"code": "print('hello')"});
    let pool = options.pool_size.max(1).to_string();
    let client = plot_server(&[("SANDBOX_RUNTIME", runtime), ("SANDBOX_POOL_SIZE", &pool)]).await?;
    let measured = async {
        // The pool fills, and the first calls warm the server's connections.
        tokio::time::sleep(Duration::from_secs(3)).await;
        hello_series(
            &client,
            "run_python_ephemeral",
            hello.clone(),
            3,
            options.think,
        )
        .await?;
        let pooled = hello_series(
            &client,
            "run_python_ephemeral",
            hello.clone(),
            options.ephemeral_runs,
            options.think,
        )
        .await?;
        let started = call(&client, "sandbox_initialize", json!({})).await?;
        let id = field_str(&started, "container_id")?;
        let in_session = json!({"container_id": id, "code": "print('hello')"});
        hello_series(&client, "run_python", in_session.clone(), 3, Duration::ZERO).await?;
        let session = hello_series(
            &client,
            "run_python",
            in_session,
            options.session_runs,
            Duration::ZERO,
        )
        .await?;
        call(&client, "sandbox_stop", json!({"container_id": id})).await?;
        Ok::<_, String>((pooled, session))
    }
    .await;
    let _ = client.cancel().await;
    let (pooled, session) = measured?;
    let client = plot_server(&[("SANDBOX_RUNTIME", runtime), ("SANDBOX_POOL_SIZE", "0")]).await?;
    let cold = hello_series(
        &client,
        "run_python_ephemeral",
        hello,
        options.floor_runs,
        options.think,
    )
    .await;
    let _ = client.cancel().await;
    Ok(RuntimeFigures {
        runtime,
        pooled,
        session,
        cold: cold?,
    })
}

/// runc and gVisor side by side (gVisor only when the engine has it).
async fn runtimes(options: &BenchOptions) -> Result<(), String> {
    let engine = Engine::with_docker(Config::default());
    let registered = engine
        .backend()
        .info()
        .await
        .map_err(|e| e.to_string())?
        .runtimes;
    let mut figures = Vec::new();
    for runtime in ["runc", "runsc"] {
        if !registered.contains_key(runtime) {
            step!("{runtime} is not registered with the engine; skipped");
            continue;
        }
        step!(
            "{runtime}: {} pooled ephemeral, {} session, {} cold ephemeral calls",
            options.ephemeral_runs,
            options.session_runs,
            options.floor_runs
        );
        figures.push(runtime_figures(runtime, options).await?);
    }
    if options.json {
        let rows: serde_json::Map<String, Value> = figures
            .iter()
            .map(|f| {
                let pair = |samples: &[Duration]| {
                    json!({"p50_ms": ms(percentile(samples, 50.0)), "p95_ms": ms(percentile(samples, 95.0))})
                };
                (
                    f.runtime.to_string(),
                    json!({"pooled_ephemeral": pair(&f.pooled), "session_call": pair(&f.session),
                           "cold_ephemeral": pair(&f.cold)}),
                )
            })
            .collect();
        println!("{}", json!({ "runtimes": rows }));
        return Ok(());
    }
    print!("{:<28}", "p50 / p95 (ms)");
    for f in &figures {
        print!("{:>24}", f.runtime);
    }
    println!();
    type Pick = fn(&RuntimeFigures) -> &Vec<Duration>;
    let rows: [(&str, Pick); 3] = [
        ("pooled ephemeral hello", |f| &f.pooled),
        ("session call hello", |f| &f.session),
        ("cold ephemeral hello", |f| &f.cold),
    ];
    for (name, pick) in rows {
        print!("{name:<28}");
        for f in &figures {
            let samples = pick(f);
            print!(
                "{:>24}",
                format!(
                    "{:.2} / {:.2}",
                    ms(percentile(samples, 50.0)),
                    ms(percentile(samples, 95.0))
                )
            );
        }
        println!();
    }
    Ok(())
}
