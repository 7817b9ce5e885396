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
