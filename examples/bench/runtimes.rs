//! runc and gVisor side by side: pooled ephemeral, session and cold ephemeral calls.

use std::time::{Duration, Instant};

use python_code_sandbox::config::Config;
use python_code_sandbox::engine::Engine;
use serde_json::{json, Value};

use crate::client::{call, field_str, plot_server, stdout_of, Client};
use crate::measure::{ms, percentile};
use crate::BenchOptions;

/// The figures of one runtime: pooled ephemeral, session and cold ephemeral calls (p50, p95).
pub(crate) struct RuntimeFigures {
    runtime: &'static str,
    pooled: Vec<Duration>,
    session: Vec<Duration>,
    cold: Vec<Duration>,
}

/// `runs` calls of `arguments` to `tool`, `think` before each; checks the output is `hello`.
pub(crate) async fn hello_series(
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
pub(crate) async fn runtime_figures(
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
    // Cold: no pool, and no recycling either (a recycled sandbox is a warm one).
    let client = plot_server(&[
        ("SANDBOX_RUNTIME", runtime),
        ("SANDBOX_POOL_SIZE", "0"),
        ("SANDBOX_RECYCLE", "false"),
    ])
    .await?;
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

/// The runtimes registered with the engine, by name.
pub(crate) async fn registered_runtimes(
) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    let engine = Engine::with_docker(Config::default());
    Ok(engine
        .backend()
        .info()
        .await
        .map_err(|e| e.to_string())?
        .runtimes)
}

/// runc and gVisor side by side (gVisor only when the engine has it).
pub(crate) async fn runtimes(options: &BenchOptions) -> Result<(), String> {
    let registered = registered_runtimes().await?;
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
