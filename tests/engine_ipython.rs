//! The runner's own IPython against the real engine and PyPI: installed once per image into the
//! dependency cache, found there by the next server process, mounted read-only, named to the
//! runner in `PCS_IPYTHON`, and never on the code's `sys.path`.

mod common;

use common::*;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::RunOptions;

/// What the code sees of the set `dir`, as one JSON line.
const LOOK: &str = r#"
import errno, json, os, sys
d = os.environ.get("PCS_IPYTHON", "")
mounts = [l.split() for l in open("/proc/self/mountinfo")]
deps = [m for m in mounts if m[4] == "/opt/deps"]
try:
    open(os.path.join(d, "pcs-probe"), "x")
    wrote = "wrote"
except OSError as e:
    wrote = errno.errorcode.get(e.errno, type(e).__name__)
import IPython
print(json.dumps({
    "dir": d,
    "read_only": bool(deps) and "ro" in deps[0][5].split(","),
    "wrote": wrote,
    "on_path": [p for p in sys.path if d and p.startswith(d)],
    "ipython": IPython.__version__,
    "from_set": IPython.__file__.startswith(d + "/"),
}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_ipython_is_installed_once_read_only_and_off_the_codes_path() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    // An image that does not carry the set (the sandbox image does: see the test below).
    let image = image_without_ipython();
    let engine = engine_with(|c| {
        c.deps.volume = volume.clone();
        c.image = image.clone();
    });
    let dir = no_hang(async {
        // Two first uses at once: one install, one directory.
        let (a, b) = tokio::join!(engine.runner_set_dir(None), engine.runner_set_dir(None));
        let dir = a.expect("the runner's IPython installs");
        assert_eq!(b.expect("the same set"), dir);
        assert!(dir.starts_with("/opt/deps/s-"), "{dir}");
        assert_eq!(engine.runner_set_installs_started(), 1);
        assert_eq!(engine.installs_started(), 0, "no request's install");

        // A session and an ephemeral run: their runner was given the set.
        let id = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("a session starts");
        let session = in_session(&engine, &id, LOOK).await;
        let ephemeral = run(&engine, LOOK).await;
        for seen in [session, ephemeral] {
            let said: serde_json::Value = serde_json::from_slice(seen.stdout.trim_ascii())
                .unwrap_or_else(|e| panic!("{e}: {} {}", text(&seen.stdout), text(&seen.stderr)));
            assert_eq!(said["dir"], dir.as_str(), "{said}");
            assert_eq!(said["read_only"], true, "{said}");
            assert_ne!(said["wrote"], "wrote", "{said}");
            assert_eq!(said["on_path"], serde_json::json!([]), "{said}");
            assert_eq!(said["ipython"], "9.18.1", "{said}");
            assert_eq!(said["from_set"], true, "{said}");
        }
        assert_eq!(engine.runner_set_installs_started(), 1, "installed once");
        engine.stop_session(Scope::Server, &id).await.expect("stop");

        // `cache list` shows it as the runner's own.
        let sets = engine.cached_dependency_sets().await.expect("list");
        assert_eq!(sets.len(), 1, "{sets:?}");
        assert_eq!(sets[0].requirements, ["(the runner's own) ipython==9.18.1"]);
        assert!(request_sets(&engine).await.is_empty());
        dir
    })
    .await;
    assert_nothing_left(&engine).await;

    // The next server process finds it in the cache (verified, not installed again).
    let next = engine_with(|c| {
        c.deps.volume = volume.clone();
        c.image = image.clone();
    });
    no_hang(async {
        let found = next.runner_set_dir(None).await.expect("found");
        assert_eq!(found, dir, "the same set");
        let ran = run(&next, "print(6 * 7)").await;
        assert_eq!(text(&ran.stdout), "42\n", "{}", text(&ran.stderr));
        assert_eq!(next.runner_set_installs_started(), 0);
    })
    .await;
    assert_nothing_left(&next).await;
    remove_volume(&volume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_image_carries_the_runners_ipython_and_installs_nothing() {
    if skip_without_engine() {
        return;
    }
    let volume = fresh_deps_volume();
    let engine = engine_with(|c| c.deps.volume = volume.clone());
    no_hang(async {
        let dir = engine.runner_set_dir(None).await.expect("the image's own");
        assert_eq!(dir, "/opt/sandbox-ipython");
        let ran = run(&engine, LOOK).await;
        let said: serde_json::Value = serde_json::from_slice(ran.stdout.trim_ascii())
            .unwrap_or_else(|e| panic!("{e}: {} {}", text(&ran.stdout), text(&ran.stderr)));
        assert_eq!(said["dir"], "/opt/sandbox-ipython", "{said}");
        // Root's files, read-only to the code's user; off its path; the set's own IPython.
        // The root is read-only too: runc's kernel says so first (EROFS), gVisor the
        // permission (EACCES); either way nothing is written.
        assert!(
            matches!(said["wrote"].as_str(), Some("EROFS" | "EACCES")),
            "{said}"
        );
        assert_eq!(said["on_path"], serde_json::json!([]), "{said}");
        assert_eq!(said["ipython"], "9.18.1", "{said}");
        assert_eq!(said["from_set"], true, "{said}");
        assert_eq!(engine.runner_set_installs_started(), 0, "nothing installed");
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
