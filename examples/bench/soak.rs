//! The soak: N concurrent callers for a fixed time, each running the mix of short programs
//! ([`crate::mix`]) through `run_python_ephemeral`, beside the same mix through `docker run --rm`
//! from as many workers for as long, in the same run, under each runtime. Every result is checked.
//! Around it: the server's memory before and after, and the sandboxes the server leaves on the
//! engine once its client closes the session as the official Python SDK does. Whatever is left is
//! removed after it is counted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use python_code_sandbox::config::Config;
use rmcp::model::CallToolRequestParams;
use serde_json::{json, Value};

use crate::client::{owned_server, Client, Ended, ServerLog};
use crate::floor::FloorRun;
use crate::leftovers;
use crate::measure::{ms, percentile, rss_kib};
use crate::mix::{self, excerpt, Expect, Program, Verdict, CYCLE};

/// What to soak, and for how long.
#[derive(Debug, Clone)]
pub(crate) struct SoakOptions {
    /// Concurrent callers of each run, one run per count.
    pub(crate) callers: Vec<usize>,
    pub(crate) period: Duration,
    /// Runtimes (names registered with the engine), one server each.
    pub(crate) runtimes: Vec<String>,
    /// The per-call limit: `SANDBOX_TIMEOUT` of the server, `timeout` in the floor's containers.
    pub(crate) limit: Duration,
    pub(crate) limit_text: String,
    pub(crate) json: bool,
}

/// Messages of failed calls kept per side of a run.
const MESSAGES: usize = 5;

/// One call: which program, how long it took, and whether its result was the expected one.
struct Sample {
    program: usize,
    latency: Duration,
    verdict: Verdict,
}

/// What one side of a run (the server, or the floor) did.
struct Tally {
    calls: usize,
    correct: usize,
    own_failures: usize,
    failed: usize,
    failed_by_program: Vec<(&'static str, usize)>,
    messages: Vec<String>,
    elapsed: Duration,
    /// Latencies of the calls of the programs that do not run to the limit.
    p50: Duration,
    p95: Duration,
}

impl Tally {
    fn of(samples: &[Sample], elapsed: Duration, programs: &[Program]) -> Tally {
        let mut failed_by_program: Vec<(&'static str, usize)> =
            programs.iter().map(|p| (p.name, 0)).collect();
        let (mut correct, mut own_failures, mut messages) = (0, 0, Vec::new());
        for sample in samples {
            let program = &programs[sample.program];
            match &sample.verdict {
                Verdict::Correct => {
                    correct += 1;
                    if program.fails_on_purpose() {
                        own_failures += 1;
                    }
                }
                Verdict::Wrong(message) => {
                    failed_by_program[sample.program].1 += 1;
                    if messages.len() < MESSAGES {
                        messages.push(format!("{}: {message}", program.name));
                    }
                }
            }
        }
        let latencies: Vec<Duration> = samples
            .iter()
            .filter(|s| !matches!(programs[s.program].expect, Expect::TimesOut))
            .map(|s| s.latency)
            .collect();
        failed_by_program.retain(|(_, n)| *n > 0);
        Tally {
            calls: samples.len(),
            correct,
            own_failures,
            failed: samples.len() - correct,
            failed_by_program,
            messages,
            elapsed,
            p50: percentile(&latencies, 50.0),
            p95: percentile(&latencies, 95.0),
        }
    }

    /// Calls with the expected result, per second of the run.
    fn per_s(&self) -> f64 {
        self.correct as f64 / self.elapsed.as_secs_f64().max(0.001)
    }

    fn to_json(&self) -> Value {
        let by_program: serde_json::Map<String, Value> = self
            .failed_by_program
            .iter()
            .map(|(name, n)| (name.to_string(), json!(n)))
            .collect();
        json!({
            "calls": self.calls, "correct": self.correct, "calls_per_s": self.per_s(),
            "seconds": self.elapsed.as_secs_f64(), "p50_ms": ms(self.p50), "p95_ms": ms(self.p95),
            "failed": self.failed, "own_failures": self.own_failures,
            "failed_by_program": by_program, "failures": self.messages,
        })
    }
}

/// One runtime at one number of callers.
struct SoakRun {
    runtime: String,
    callers: usize,
    /// Sandboxes of any server on the engine before the run.
    managed_before: usize,
    floor: Tally,
    server: Tally,
    rss_before_kib: u64,
    rss_after_kib: u64,
    ended: Ended,
    /// The first lines the server logged (at `warn`), and how many.
    log: ServerLog,
    left_2s: usize,
    left_10s: usize,
    /// Of those left at 10 s, how many the bench removed.
    removed: usize,
}

/// Runs `work` (given a program's index) from `callers` tasks until `period` is over or `stop` is
/// set; each caller goes through [`CYCLE`] from its own starting point. The samples, and the time
/// until the last caller's last call returned.
async fn drive<F, Fut>(
    callers: usize,
    period: Duration,
    stop: Arc<AtomicBool>,
    work: F,
) -> (Vec<Sample>, Duration)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Verdict> + Send,
{
    let samples = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let deadline = started + period;
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (samples, stop, work) = (samples.clone(), stop.clone(), work.clone());
            tokio::spawn(async move {
                let mut position = caller * CYCLE.len() / callers;
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    let program = CYCLE[position % CYCLE.len()];
                    position += 1;
                    let called = Instant::now();
                    let verdict = work(program).await;
                    let sample = Sample {
                        program,
                        latency: called.elapsed(),
                        verdict,
                    };
                    if let Ok(mut samples) = samples.lock() {
                        samples.push(sample);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed();
    let samples = match Arc::try_unwrap(samples) {
        Ok(samples) => samples.into_inner().unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    (samples, elapsed)
}

/// The mix through `docker run --rm`, `callers` workers for the period.
async fn floor_soak(
    floor: Arc<FloorRun>,
    programs: Arc<Vec<Program>>,
    callers: usize,
    period: Duration,
) -> Result<Tally, String> {
    // The image's first start after a while costs more; not counted.
    let hello = &programs[CYCLE[2]];
    floor.run(&hello.code).await?;
    let work = {
        let (floor, programs) = (floor.clone(), programs.clone());
        move |p: usize| {
            let (floor, programs) = (floor.clone(), programs.clone());
            async move {
                let program = &programs[p];
                match floor.run(&program.code).await {
                    Ok(out) => mix::check_run_output(program, &out),
                    Err(e) => Verdict::Wrong(e),
                }
            }
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (samples, elapsed) = drive(callers, period, stop, work).await;
    Ok(Tally::of(&samples, elapsed, &programs))
}

/// What the server part of a run measured.
struct ServerSoak {
    tally: Tally,
    rss_before_kib: u64,
    rss_after_kib: u64,
    ended: Ended,
    log: ServerLog,
}

/// The mix through a server started for this runtime, `callers` concurrent calls for the period;
/// then the session closed as the SDK closes it. The server's pid comes back even when the rest
/// failed, so that its sandboxes can be counted and removed.
async fn server_soak(
    runtime: &str,
    options: &SoakOptions,
    programs: Arc<Vec<Program>>,
    callers: usize,
) -> (Option<u32>, Result<ServerSoak, String>) {
    let env = [
        ("SANDBOX_RUNTIME", runtime),
        ("SANDBOX_TIMEOUT", options.limit_text.as_str()),
    ];
    let (client, mut process) = match owned_server(&env).await {
        Ok(server) => server,
        Err(e) => return (None, Err(e)),
    };
    let pid = process.pid;
    // The pool fills; one call warms the server's connections (not counted).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = Arc::new(client);
    let warm = call_program(&client, &programs[CYCLE[2]]).await;
    if let Verdict::Wrong(e) = warm {
        step!("{runtime}: the warm-up call failed: {e}");
    }
    let rss_before_kib = rss_kib(pid).unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let work = {
        let (client, programs, stop) = (client.clone(), programs.clone(), stop.clone());
        move |p: usize| {
            let (client, programs, stop) = (client.clone(), programs.clone(), stop.clone());
            async move {
                let verdict = call_program(&client, &programs[p]).await;
                if client.is_closed() {
                    // The session is gone (the server died): every further call would fail at once.
                    stop.store(true, Ordering::Relaxed);
                }
                verdict
            }
        }
    };
    let (samples, elapsed) = drive(callers, options.period, stop, work).await;
    let rss_after_kib = rss_kib(pid).unwrap_or(0);
    let Ok(client) = Arc::try_unwrap(client) else {
        return (Some(pid), Err("the client is still shared".into()));
    };
    let ended = process.close_like_sdk(client).await;
    (
        Some(pid),
        Ok(ServerSoak {
            tally: Tally::of(&samples, elapsed, &programs),
            rss_before_kib,
            rss_after_kib,
            ended,
            log: process.log(),
        }),
    )
}

/// One `run_python_ephemeral` call of `program`, checked.
async fn call_program(client: &Client, program: &Program) -> Verdict {
    let mut arguments = serde_json::Map::new();
    arguments.insert("code".into(), Value::String(program.code.clone()));
    let request = CallToolRequestParams::new("run_python_ephemeral").with_arguments(arguments);
    match client.call_tool(request).await {
        Ok(result) => mix::check_tool_result(program, &result),
        Err(e) => Verdict::Wrong(format!("MCP error: {}", excerpt(&e.to_string()))),
    }
}

/// One runtime at one number of callers: the floor, then the server, then what it left.
async fn soak_run(
    config: &Config,
    runtime: &str,
    callers: usize,
    options: &SoakOptions,
    floor_label: &str,
) -> Result<SoakRun, String> {
    let programs = Arc::new(mix::programs());
    let managed_before = leftovers::managed().await?.len();
    step!(
        "soak {runtime}, {callers} caller(s): the floor (docker run --rm) for {} s",
        options.period.as_secs()
    );
    let floor = Arc::new(FloorRun {
        image: config.image.clone(),
        runtime: runtime.to_string(),
        cpus: config.limits.cpus,
        limit: options.limit,
        label: floor_label.to_string(),
    });
    let floor = floor_soak(floor, programs.clone(), callers, options.period).await?;
    step!(
        "soak {runtime}, {callers} caller(s): the server for {} s",
        options.period.as_secs()
    );
    let (pid, soaked) = server_soak(runtime, options, programs, callers).await;
    let Some(pid) = pid else {
        return Err(soaked.err().unwrap_or_default());
    };
    // Counted from the moment the server's process is gone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let left_2s = leftovers::of_server(pid).await?.len();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let left = leftovers::of_server(pid).await?;
    leftovers::remove(&left).await?;
    let remaining = leftovers::of_server(pid).await?.len();
    let soaked = soaked?;
    Ok(SoakRun {
        runtime: runtime.to_string(),
        callers,
        managed_before,
        floor,
        server: soaked.tally,
        rss_before_kib: soaked.rss_before_kib,
        rss_after_kib: soaked.rss_after_kib,
        ended: soaked.ended,
        log: soaked.log,
        left_2s,
        left_10s: left.len(),
        removed: left.len().saturating_sub(remaining),
    })
}

/// The soak under each runtime registered with the engine, at each number of callers.
pub(crate) async fn soak(config: Config, options: SoakOptions) -> Result<(), String> {
    let registered = crate::runtimes::registered_runtimes().await?;
    let floor_label = format!("io.python-code-sandbox.bench-floor={}", std::process::id());
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    let mut failed = None;
    'runtimes: for runtime in &options.runtimes {
        if !registered.contains_key(runtime) {
            step!("{runtime} is not registered with the engine; skipped");
            skipped.push(runtime.clone());
            continue;
        }
        for &callers in &options.callers {
            match soak_run(&config, runtime, callers, &options, &floor_label).await {
                Ok(run) => runs.push(run),
                Err(e) => {
                    failed = Some(format!("soak {runtime}, {callers} caller(s): {e}"));
                    break 'runtimes;
                }
            }
        }
    }
    // Floor containers the bench had to abandon.
    let abandoned = leftovers::labelled(&floor_label).await?;
    leftovers::remove(&abandoned).await?;
    report(&config, &options, &runs, &skipped, abandoned.len());
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn report(
    config: &Config,
    options: &SoakOptions,
    runs: &[SoakRun],
    skipped: &[String],
    abandoned: usize,
) {
    let programs = mix::programs();
    let cycle: Vec<&str> = CYCLE.iter().map(|&p| programs[p].name).collect();
    if options.json {
        let rows: Vec<Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "runtime": r.runtime, "callers": r.callers,
                    "server": r.server.to_json(), "floor": r.floor.to_json(),
                    "ratio": r.server.per_s() / r.floor.per_s().max(0.001),
                    "rss_before_kib": r.rss_before_kib, "rss_after_kib": r.rss_after_kib,
                    "close": {"ended_on": r.ended.how(), "ms": ms(r.ended.after())},
                    "sandboxes_left_after_2s": r.left_2s, "sandboxes_left_after_10s": r.left_10s,
                    "sandboxes_removed_by_bench": r.removed,
                    "managed_sandboxes_before": r.managed_before,
                    "server_log": {"lines": r.log.lines, "first": r.log.first},
                })
            })
            .collect();
        println!(
            "{}",
            json!({"soak": {
                "seconds": options.period.as_secs_f64(), "limit_s": options.limit.as_secs_f64(),
                "image": config.image, "cpus": config.limits.cpus, "cycle": cycle,
                "runs": rows, "skipped_runtimes": skipped,
                "abandoned_floor_containers": abandoned,
            }})
        );
        return;
    }
    let floor = FloorRun {
        image: config.image.clone(),
        runtime: "RUNTIME".into(),
        cpus: config.limits.cpus,
        limit: options.limit,
        label: "…".into(),
    };
    println!(
        "soak: {} s per side of each run; each caller runs the cycle [{}] from its own start; \
         limit {} per call (SANDBOX_TIMEOUT); calls/s count correct results only; p50/p95 leave \
         out the program that runs to the limit",
        options.period.as_secs(),
        cycle.join(", "),
        options.limit_text
    );
    println!("floor: docker {}", floor.args("CODE").join(" "));
    println!(
        "{:<8} {:>7} {:>8} {:>8} {:>6} {:>17} {:>17} {:>6} {:>12} {:>4} {:>14} {:>18} {:>11}",
        "runtime",
        "callers",
        "calls/s",
        "floor/s",
        "ratio",
        "p50 / p95 ms",
        "floor p50 / p95",
        "failed",
        "floor failed",
        "own",
        "RSS MiB",
        "ended on",
        "left 2/10 s"
    );
    for r in runs {
        println!(
            "{:<8} {:>7} {:>8.2} {:>8.2} {:>6.2} {:>17} {:>17} {:>6} {:>12} {:>4} {:>14} {:>18} {:>11}",
            r.runtime,
            r.callers,
            r.server.per_s(),
            r.floor.per_s(),
            r.server.per_s() / r.floor.per_s().max(0.001),
            format!("{:.1} / {:.1}", ms(r.server.p50), ms(r.server.p95)),
            format!("{:.1} / {:.1}", ms(r.floor.p50), ms(r.floor.p95)),
            r.server.failed,
            r.floor.failed,
            r.server.own_failures,
            format!(
                "{:.1} → {:.1}",
                r.rss_before_kib as f64 / 1024.0,
                r.rss_after_kib as f64 / 1024.0
            ),
            format!("{} {:.1}s", r.ended.how(), r.ended.after().as_secs_f64()),
            format!("{} / {}", r.left_2s, r.left_10s),
        );
    }
    for r in runs {
        let name = format!("{}, {} caller(s)", r.runtime, r.callers);
        println!(
            "{name}: server {} calls in {:.1} s ({} correct, {} of them the programs' own failures); floor {} calls in {:.1} s",
            r.server.calls,
            r.server.elapsed.as_secs_f64(),
            r.server.correct,
            r.server.own_failures,
            r.floor.calls,
            r.floor.elapsed.as_secs_f64()
        );
        for (side, tally) in [("server", &r.server), ("floor", &r.floor)] {
            if tally.failed == 0 {
                continue;
            }
            let by: Vec<String> = tally
                .failed_by_program
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            println!(
                "  {side}: {} failed calls ({}); the first:",
                tally.failed,
                by.join(", ")
            );
            for message in &tally.messages {
                println!("    {message}");
            }
        }
        if r.log.lines > 0 {
            println!(
                "  the server logged {} lines at warn or above; the first:",
                r.log.lines
            );
            for line in &r.log.first {
                println!("    {line}");
            }
        }
        if r.left_10s > 0 {
            println!(
                "  {} of the server's sandboxes were still on the engine 10 s after it ended; the bench removed {}",
                r.left_10s, r.removed
            );
        }
        if r.managed_before > 0 {
            println!(
                "  {} sandboxes of other servers were on the engine before this run",
                r.managed_before
            );
        }
    }
    for runtime in skipped {
        println!("{runtime}: not registered with the engine; not measured");
    }
    if abandoned > 0 {
        println!("{abandoned} floor containers had to be abandoned and were removed");
    }
}
