//! Snapshots: save and restore of a large session, and a fork.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::client::{call, field_str, plot_server, Client};
use crate::measure::{ms, percentile};

/// A session with `code` run in it (dependencies numpy).
pub(crate) async fn session_with(client: &Client, code: &str) -> Result<String, String> {
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

/// Snapshot and restore of a session holding a 100 MB numpy array and 1,000 small files, and a
/// fork of a session holding 10 MB: time (p50 of `runs`) and size.
pub(crate) async fn snapshots(runs: usize, json_out: bool) -> Result<(), String> {
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
