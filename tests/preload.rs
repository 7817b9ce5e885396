//! Dependency sets prepared ahead: the import-time work done once at install (bytecode,
//! matplotlib's font cache), sessions started with dependencies. Real engine and PyPI.

mod common;

use common::*;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{RunOptions, Task};

fn with_deps(deps: &[&str]) -> RunOptions {
    RunOptions {
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

/// The cache volume: the one the environment names (kept, so that a second run of the tests
/// finds its sets installed), else a fresh one (removed at the end).
fn deps_volume() -> (String, bool) {
    match std::env::var("SANDBOX_DEPS_VOLUME") {
        Ok(volume) if !volume.trim().is_empty() => (volume, false),
        _ => (fresh_deps_volume(), true),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_comes_with_bytecode_and_matplotlibs_font_cache() {
    if skip_without_engine() {
        return;
    }
    let (volume, fresh) = deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        // Before matplotlib is imported, its font cache is already in MPLCONFIGDIR; importing it
        // does not rewrite it (a rebuild would); numpy's modules have unchecked hash-based pycs.
        let code = r#"
import os, glob, importlib.util
config = os.environ["MPLCONFIGDIR"]
before = {p: os.stat(p).st_mtime_ns for p in glob.glob(config + "/fontlist-v*.json")}
import matplotlib.font_manager, numpy
after = {p: os.stat(p).st_mtime_ns for p in glob.glob(config + "/fontlist-v*.json")}
with open(numpy.__cached__, "rb") as f:
    header = f.read(16)
flags = int.from_bytes(header[4:8], "little")
print(len(before), before == after, flags)
"#;
        let run = engine
            .run_ephemeral(Task::Python(code), &with_deps(&["matplotlib"]))
            .await
            .expect("run");
        // flags 1: hash-based, not checked against the source.
        assert_eq!(text(&run.stdout), "1 True 1\n", "{}", text(&run.stderr));
    })
    .await;
    assert_nothing_left(&engine).await;
    if fresh {
        remove_volume(&volume).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_can_start_with_dependencies() {
    if skip_without_engine() {
        return;
    }
    let (volume, fresh) = deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &with_deps(&["six==1.16.0"]))
            .await
            .expect("session");
        let first = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("import six\nprint(six.__version__)"),
                &RunOptions::default(),
            )
            .await
            .expect("run");
        assert_eq!(text(&first.stdout), "1.16.0\n", "{}", text(&first.stderr));
        // Later requests add to the session's set: six stays.
        let more = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("import six, idna\nprint(six.__version__, idna.__name__)"),
                &with_deps(&["idna"]),
            )
            .await
            .expect("run");
        assert_eq!(
            text(&more.stdout),
            "1.16.0 idna\n",
            "{}",
            text(&more.stderr)
        );
        // Invalid dependencies are refused before anything starts.
        let refused = engine
            .create_session(Scope::Server, &with_deps(&["--index-url=http://evil"]))
            .await;
        assert!(refused.is_err());
        assert_eq!(engine.sessions(Scope::Server).len(), 1);
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    if fresh {
        remove_volume(&volume).await;
    }
}

/// Waits (polling; bounded by `no_hang`) until the engine has `n` prepared sandboxes waiting.
async fn prepared_ready(engine: &python_code_sandbox::engine::Engine, n: usize) {
    while engine.prepared_ready() < n {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn run_with(
    engine: &python_code_sandbox::engine::Engine,
    code: &str,
    deps: &[&str],
) -> python_code_sandbox::engine::Execution {
    engine
        .run_ephemeral(Task::Python(code), &with_deps(deps))
        .await
        .expect("the run completes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_sandbox_serves_only_its_set_and_carries_nothing_from_an_earlier_run() {
    if skip_without_engine() {
        return;
    }
    let (volume, fresh) = deps_volume();
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.deps.volume = volume.clone();
        c.pool_size = 1;
        c.preload = vec![vec!["six==1.16.0".to_string()]];
    }));
    engine.start_pool();
    no_hang(async {
        prepared_ready(&engine, 1).await;
        // Prepared: six was imported ahead, out of the code's sight (neither in sys.modules nor
        // in its namespace) until it imports it. The run leaves a file, a variable and a patched
        // module attribute behind.
        let first = run_with(
            &engine,
            "import sys\nprint('six' in sys.modules, 'six' in globals())\n\
             import six\nsix.PATCHED = 1\nleft = 1\nopen('/workspace/left.txt', 'w').write('x')",
            &["six==1.16.0"],
        )
        .await;
        assert_eq!(text(&first.stdout), "False False\n", "{}", text(&first.stderr));
        let report = first.dependencies.as_ref().expect("report");
        assert!(!report.installed && report.prepared, "{report:?}");

        // The next prepared sandbox for the set is a new one: none of that is there.
        prepared_ready(&engine, 1).await;
        let second = run_with(
            &engine,
            "import os, sys, six\nprint(hasattr(six, 'PATCHED'), \
             'left' in globals(), os.path.exists('/workspace/left.txt'))",
            &["six==1.16.0"],
        )
        .await;
        assert_eq!(
            text(&second.stdout),
            "False False False\n",
            "{}",
            text(&second.stderr)
        );
        assert!(second.dependencies.as_ref().is_some_and(|d| d.prepared));

        // Another set never gets the six sandbox: six is neither imported nor importable.
        let other = run_with(
            &engine,
            "import sys, importlib.util\nprint('six' in sys.modules, importlib.util.find_spec('six') is None)\n\
             import idna\nprint(idna.__name__)",
            &["idna"],
        )
        .await;
        assert_eq!(
            text(&other.stdout),
            "False True\nidna\n",
            "{}",
            text(&other.stderr)
        );
    })
    .await;
    engine.shutdown().await;
    assert_nothing_left(&engine).await;
    if fresh {
        remove_volume(&volume).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_zero_disables_every_pool_prepared_ones_included() {
    if skip_without_engine() {
        return;
    }
    let (volume, fresh) = deps_volume();
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.deps.volume = volume.clone();
        c.pool_size = 0;
        c.preload = vec![vec!["six==1.16.0".to_string()]];
    }));
    engine.start_pool();
    no_hang(async {
        // Calls for the set work, cold: it is neither preloaded nor learned from them.
        for _ in 0..2 {
            let run = run_with(
                &engine,
                "import sys\nprint('six' in sys.modules)",
                &["six==1.16.0"],
            )
            .await;
            assert_eq!(text(&run.stdout), "False\n", "{}", text(&run.stderr));
            assert!(run.dependencies.as_ref().is_some_and(|d| !d.prepared));
        }
        let plain = run(&engine, "print(1)").await;
        assert_eq!(text(&plain.stdout), "1\n");
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        assert_eq!(engine.prepared_ready(), 0);
        assert_eq!(engine.pool_ready(), 0);
        // Nothing waits on the engine either: no sandbox of this server exists between calls.
        assert_nothing_left(&engine).await;
    })
    .await;
    engine.shutdown().await;
    if fresh {
        remove_volume(&volume).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_set_is_never_served_from_a_stale_prepared_sandbox() {
    if skip_without_engine() {
        return;
    }
    // A volume of its own: the test removes every set in it.
    let volume = fresh_deps_volume();
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.deps.volume = volume.clone();
        c.pool_size = 1;
        c.preload = vec![vec!["six==1.16.0".to_string()]];
    }));
    engine.start_pool();
    no_hang(async {
        prepared_ready(&engine, 1).await;
        let removed = engine.prune_dependency_sets(true).await.expect("prune");
        assert_eq!(removed.len(), 1);
        // The sandbox prepared before the eviction imported six from the removed directory; the
        // call must get a sandbox whose six is on disk (prepared again, or installed now).
        let run = run_with(
            &engine,
            "import os, six\nprint(os.path.exists(six.__file__))",
            &["six==1.16.0"],
        )
        .await;
        assert_eq!(text(&run.stdout), "True\n", "{}", text(&run.stderr));
    })
    .await;
    engine.shutdown().await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_stays_within_its_memory_bound_under_a_burst_of_sets() {
    if skip_without_engine() {
        return;
    }
    let (volume, fresh) = deps_volume();
    // 400 MiB: the plain pool's share (grown to a quarter of it at most: 6 sandboxes at 16 MiB)
    // and 304 MiB for prepared ones: one at the first estimate (256 MiB), a few once measured;
    // five sets cannot all be kept.
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.deps.volume = volume.clone();
        c.pool_size = 1;
        c.pool_max_memory = 400 << 20;
    }));
    engine.start_pool();
    let sets: [&[&str]; 5] = [
        &["six"],
        &["idna"],
        &["certifi"],
        &["packaging"],
        &["attrs"],
    ];
    no_hang(async {
        let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let watcher = {
            let engine = engine.clone();
            let watching = watching.clone();
            tokio::spawn(async move {
                let mut highest = 0;
                while watching.load(std::sync::atomic::Ordering::Relaxed) {
                    let used = engine.prepared_memory();
                    assert!(
                        used <= engine.prepared_budget(),
                        "{used} > {}",
                        engine.prepared_budget()
                    );
                    highest = highest.max(used);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                highest
            })
        };
        for round in 0..4 {
            let calls = sets.iter().map(|set| {
                let engine = engine.clone();
                async move {
                    let module = set[0];
                    let run =
                        run_with(&engine, &format!("import {module}\nprint('ok')"), set).await;
                    assert_eq!(
                        text(&run.stdout),
                        "ok\n",
                        "round {round} {module}: {}",
                        text(&run.stderr)
                    );
                }
            });
            futures_util::future::join_all(calls).await;
        }
        // Let the pool fill up again after the burst, still within the bound.
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        watching.store(false, std::sync::atomic::Ordering::Relaxed);
        let highest = watcher.await.expect("the bound held");
        eprintln!(
            "highest {highest} of {}, {} waiting",
            engine.prepared_budget(),
            engine.prepared_ready()
        );
        assert!(highest > 0, "sandboxes were prepared");
        assert!(engine.prepared_ready() < sets.len(), "not every set fits");
    })
    .await;
    engine.shutdown().await;
    assert_nothing_left(&engine).await;
    if fresh {
        remove_volume(&volume).await;
    }
}

#[test]
fn an_invalid_preload_set_stops_start_up_with_exit_2() {
    for (value, named) in [("numpy;bad$name", "bad$name"), ("numpy;;six", "numpy;;six")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_python-code-sandbox"))
            .env("SANDBOX_PRELOAD", value)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the binary");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains("SANDBOX_PRELOAD") && stderr.contains(named),
            "{value}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing was served");
    }
}
