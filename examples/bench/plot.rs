//! The plot prompt and a pandas analysis with prepared sandboxes and without any pool, bursts of
//! hellos at default settings, and the memory of the pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use python_code_sandbox::config::Config;
use python_code_sandbox::engine::Engine;
use serde_json::{json, Value};

use crate::client::{call, plot_server, Client};
use crate::measure::{ms, percentile};

/// The plot prompt's series: how many calls, the pause before each with a prepared pool.
pub(crate) struct PlotOptions {
    pub(crate) runs: usize,
    pub(crate) pause: Duration,
    pub(crate) json: bool,
}

/// The original project's second test prompt: dependencies matplotlib and numpy, a sine wave saved
/// to a PNG. (Whether a prepared sandbox served it, the result's `dependencies.prepared` says.)
pub(crate) const PLOT_CODE: &str = "import numpy as np\n\
import matplotlib.pyplot as plt\n\
x = np.linspace(0, 2 * np.pi, 200)\n\
plt.plot(x, np.sin(x))\n\
plt.title('Sine wave')\n\
plt.savefig('sine.png')\n";

/// The back-to-back bursts at default settings: calls per burst, and the pause between bursts.
pub(crate) const BURST: usize = 50;
pub(crate) const BURST_PAUSE: Duration = Duration::from_secs(15);

pub(crate) const PLOT_SET: &[&str] = &["matplotlib", "numpy"];

/// The data-analysis call: a 100k-row frame, a group-by, a bar chart saved as PNG.
pub(crate) const ANALYSIS_CODE: &str = "import numpy as np\n\
import pandas as pd\n\
import matplotlib.pyplot as plt\n\
rng = np.random.default_rng(0)\n\
df = pd.DataFrame({'group': rng.integers(0, 10, 100_000), 'value': rng.normal(size=100_000)})\n\
summary = df.groupby('group')['value'].agg(['mean', 'std', 'count'])\n\
summary['mean'].plot(kind='bar')\n\
plt.savefig('groups.png')\n";

pub(crate) const ANALYSIS_SET: &[&str] = &["matplotlib", "pandas"];

/// Runs the plot prompt `runs` times, `pause` before each; returns the durations and how many
/// calls a prepared sandbox served.
pub(crate) async fn plot_series(
    client: &Client,
    runs: usize,
    pause: Duration,
) -> Result<(Vec<Duration>, usize), String> {
    prepared_series(client, PLOT_CODE, PLOT_SET, "sine.png", runs, pause).await
}

/// Runs `code` with dependencies `set` `runs` times, `pause` before each; checks that `file` came
/// back; returns the durations and how many calls a prepared sandbox served.
pub(crate) async fn prepared_series(
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
        let structured = result.structured_content.as_ref();
        if structured.and_then(|s| s["dependencies"]["prepared"].as_bool()) == Some(true) {
            prepared += 1;
        }
        let saved = structured.is_some_and(|s| s.to_string().contains(file));
        if !saved {
            return Err(format!("the code's {file} did not come back"));
        }
    }
    Ok((samples, prepared))
}

/// The plot prompt with the pool prepared for its set and with every pool disabled, beside the
/// plain hello of the same server, and the memory of prepared sandboxes.
pub(crate) async fn plot_prompt(config: Config, options: PlotOptions) -> Result<(), String> {
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
