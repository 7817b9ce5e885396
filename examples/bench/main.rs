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
//!
//! `--only-soak` (or `--soak`, after the rest) is the soak: concurrent callers for a fixed time with
//! a mix of short programs, every result checked, beside the same mix through `docker run --rm`
//! with the same runtime, CPU and time limit, under each runtime (see `soak.rs`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use python_code_sandbox::cli::{EXIT_CONFIG, EXIT_INFRA};
use python_code_sandbox::config::{self, Config};

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
    /// Measure only output throughput (`--output-lines`) under the runtime `SANDBOX_RUNTIME` names
    /// (required here), against the same code under `docker run --runtime` of that runtime.
    #[arg(long)]
    only_output: bool,
    /// Measure only the soak: concurrent callers for a fixed time with a mix of short programs
    /// (some fail on purpose, one runs past the limit), every result checked, beside the same mix
    /// through `docker run --rm` with the same runtime, CPU and limit; the server's memory and
    /// the sandboxes it leaves once its client closes the session.
    #[arg(long)]
    only_soak: bool,
    /// Add the soak to the run (left out by default: with the default knobs it is 4 runs, each
    /// twice --soak-time, over 9 minutes).
    #[arg(long)]
    soak: bool,
    /// Concurrent callers of the soak, one run per count, e.g. 1,4.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4])]
    soak_callers: Vec<usize>,
    /// Length of each side (server, floor) of each soak run, e.g. 60s.
    #[arg(long, default_value = "60s")]
    soak_time: String,
    /// Runtimes of the soak, one server each (runtimes not registered with the engine are
    /// skipped).
    #[arg(long, value_delimiter = ',', default_values = ["runsc", "runc"])]
    soak_runtime: Vec<String>,
    /// The soak's limit per call: SANDBOX_TIMEOUT of its servers, `timeout` in the floor.
    #[arg(long, default_value = "1s")]
    soak_timeout: String,
}

/// The step under way, shown as a spinner on a terminal and as plain lines otherwise.
static PROGRESS: std::sync::OnceLock<python_code_sandbox::engine::ProgressSink> =
    std::sync::OnceLock::new();

macro_rules! step {
    ($($arg:tt)*) => {
        match $crate::PROGRESS.get() {
            Some(progress) => progress(&format!($($arg)*)),
            None => eprintln!("bench: {}", format!($($arg)*)),
        }
    };
}

mod client;
mod egress;
mod floor;
mod leftovers;
mod measure;
mod mix;
mod output;
mod overview;
mod plot;
mod runtimes;
mod snapshot;
mod soak;

use egress::egress;
use overview::run;
use plot::{plot_prompt, PlotOptions};
use runtimes::runtimes;
use snapshot::snapshots;
use soak::{soak, SoakOptions};

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
    let soak_durations = (
        config::parse_duration("--soak-time", &cli.soak_time),
        config::parse_duration("--soak-timeout", &cli.soak_timeout),
    );
    let (soak_time, soak_limit) = match soak_durations {
        (Ok(t), Ok(l)) => (t, l),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("python-code-sandbox: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if cli.soak_callers.contains(&0) {
        eprintln!("python-code-sandbox: --soak-callers: each count must be at least 1");
        return ExitCode::from(EXIT_CONFIG);
    }
    let soak_options = SoakOptions {
        callers: cli.soak_callers.clone(),
        period: soak_time,
        runtimes: cli.soak_runtime.clone(),
        limit: soak_limit,
        limit_text: cli.soak_timeout.clone(),
        json: cli.json,
    };
    let (only_soak, with_soak) = (cli.only_soak, cli.soak);
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
    let (only_output, output_lines) = (cli.only_output, cli.output_lines);
    let progress = python_code_sandbox::cli::progress::Progress::start("bench");
    let _ = PROGRESS.set(progress.sink());
    let measured = runtime.block_on(async move {
        if only_soak {
            return soak(config, soak_options).await;
        }
        if only_runtimes {
            return runtimes(&options).await;
        }
        if only_output {
            let runtime = config.runtime.clone().ok_or_else(|| {
                "--only-output measures one runtime: set SANDBOX_RUNTIME (runc, runsc)".to_string()
            })?;
            return output::only_output(&config, &runtime, output_lines.max(1), json_out).await;
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
        plot_prompt(config.clone(), plot).await?;
        snapshots(snapshot_runs, json_out).await?;
        if with_soak {
            soak(config, soak_options).await?;
        }
        Ok(())
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
