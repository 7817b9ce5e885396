//! Dependencies against the real engine and PyPI (the only outside traffic tests make): installed
//! outside the code's sandbox, cached, validated.

mod common;

use common::*;
use python_code_sandbox::engine::{EngineError, Execution, RunOptions, Task};

fn with_deps(deps: &[&str]) -> RunOptions {
    RunOptions {
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

async fn run_with(
    engine: &python_code_sandbox::engine::Engine,
    code: &str,
    deps: &[&str],
) -> Execution {
    engine
        .run_ephemeral(Task::Python(code), &with_deps(deps))
        .await
        .expect("the run completes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numpy_is_installed_once_then_comes_from_the_cache() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let code = "import numpy\nprint(numpy.arange(4).sum())";
        let first = run_with(&engine, code, &["numpy"]).await;
        assert_eq!(text(&first.stdout), "6\n", "{}", text(&first.stderr));
        assert!(first.dependencies.as_ref().expect("report").installed);
        assert_eq!(engine.installs_started(), 1);

        let second = run_with(&engine, code, &["NumPy"]).await;
        assert_eq!(text(&second.stdout), "6\n");
        assert!(!second.dependencies.as_ref().expect("report").installed);
        assert_eq!(
            engine.installs_started(),
            1,
            "the repeat starts no installer"
        );

        // The code's own sandbox still has no network.
        let isolated = run_with(
            &engine,
            "import os, numpy\nprint(sorted(os.listdir('/sys/class/net')))",
            &["numpy"],
        )
        .await;
        assert_eq!(text(&isolated.stdout), "['lo']\n");
        assert_eq!(engine.installs_started(), 1);

        let sets = engine.cached_dependency_sets().await.expect("list");
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].requirements, ["numpy"]);
        assert!(sets[0].size > 1 << 20);
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_extras_are_honoured() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let pinned = run_with(
            &engine,
            "import six\nprint(six.__version__)",
            &["six==1.16.0"],
        )
        .await;
        assert_eq!(text(&pinned.stdout), "1.16.0\n", "{}", text(&pinned.stderr));
        let extras = run_with(
            &engine,
            "import urllib3, socks\nprint(urllib3.__version__)",
            &["urllib3[socks]==2.2.3"],
        )
        .await;
        assert_eq!(text(&extras.stdout), "2.2.3\n", "{}", text(&extras.stderr));
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_package_fails_clearly_and_leaves_nothing_in_the_cache() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let failed = engine
            .run_ephemeral(
                Task::Python("print(1)"),
                &with_deps(&["this-package-does-not-exist-pcs-7f3a"]),
            )
            .await;
        let Err(EngineError::Dependencies(why)) = failed else {
            panic!("expected an install failure: {failed:?}")
        };
        assert!(
            why.contains("this-package-does-not-exist-pcs-7f3a"),
            "{why}"
        );
        assert!(
            engine
                .cached_dependency_sets()
                .await
                .expect("list")
                .is_empty(),
            "nothing is published"
        );
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_attempts_are_refused_before_anything_starts() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        for entry in [
            "--index-url=http://x",
            "numpy; rm -rf /",
            "../x",
            "git+https://example.invalid/x/y",
            "numpy && id",
            "-r requirements.txt",
        ] {
            let refused = engine
                .run_ephemeral(Task::Python("print(1)"), &with_deps(&[entry]))
                .await;
            match refused {
                Err(EngineError::InvalidDependency(e)) => {
                    assert!(e.to_string().contains(entry), "{e}")
                }
                other => panic!("{entry}: {other:?}"),
            }
        }
        assert_eq!(engine.installs_started(), 0);
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_a_new_set_install_it_once() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let options = with_deps(&["six==1.16.0"]);
        let code = Task::Python("import six\nprint(six.__version__)");
        let (a, b) = tokio::join!(
            engine.run_ephemeral(code, &options),
            engine.run_ephemeral(code, &options)
        );
        for result in [a, b] {
            assert_eq!(text(&result.expect("run").stdout), "1.16.0\n");
        }
        assert_eq!(engine.installs_started(), 1);
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_gains_dependencies_after_it_started_and_keeps_them() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let session = engine
            .create_session(&RunOptions::default())
            .await
            .expect("session");
        in_session(&engine, &session, "x = 41").await;
        let added = engine
            .execute_in_session(
                &session,
                Task::Python("import six\nx += 1\nprint(x, six.__version__)"),
                &with_deps(&["six==1.16.0"]),
            )
            .await
            .expect("run");
        assert_eq!(
            text(&added.stdout),
            "42 1.16.0\n",
            "{}",
            text(&added.stderr)
        );
        // A second package joins the set; the first stays importable, state is kept.
        let more = engine
            .execute_in_session(
                &session,
                Task::Python("import six, idna\nprint(x, idna.__name__)"),
                &with_deps(&["idna"]),
            )
            .await
            .expect("run");
        assert_eq!(text(&more.stdout), "42 idna\n", "{}", text(&more.stderr));
        let later = in_session(&engine, &session, "import six, idna\nprint('still there')").await;
        assert_eq!(text(&later.stdout), "still there\n");
        // The session's own sandbox has no network.
        let net = in_session(
            &engine,
            &session,
            "import os\nprint(sorted(os.listdir('/sys/class/net')))",
        )
        .await;
        assert_eq!(text(&net.stdout), "['lo']\n");
        engine.stop_session(&session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_cached_sets() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        run_with(&engine, "import six", &["six==1.16.0"]).await;
        assert_eq!(
            engine.cached_dependency_sets().await.expect("list").len(),
            1
        );
        let removed = engine.prune_dependency_sets(true).await.expect("prune");
        assert_eq!(removed.len(), 1);
        assert!(engine
            .cached_dependency_sets()
            .await
            .expect("list")
            .is_empty());
    })
    .await;
    assert_nothing_left(&engine).await;
    remove_volume(&volume).await;
}
