//! The default run: ephemeral and session calls, a cached dependency, sustained throughput, output
//! throughput and the server's memory, beside the floors measured in the same run.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use python_code_sandbox::config::Config;
use python_code_sandbox::engine::{Engine, RunOptions, Task};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::{json, Value};

use crate::client::{call, stdout_of, Client};
use crate::floor::docker_run;
use crate::measure::{ms, percentile, rss_kib, sustained, Series};
use crate::output::{output_throughput, OutputThroughput};
use crate::{BenchOptions, SERVER_ROLE};

pub(crate) async fn run(config: Config, options: BenchOptions) -> Result<(), String> {
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

    // Round trips to a running, attached interpreter, and cold ephemeral runs without a pool
    // (nor recycling: a recycled sandbox is a warm one).
    let engine = Engine::with_docker(Config {
        pool_size: 0,
        recycle: false,
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
                config.runtime.as_deref(),
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
