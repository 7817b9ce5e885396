//! The command line, as a person uses it, against the real Docker engine.

mod common;

use common::skip_without_engine;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::labelled;

const BIN: &str = env!("CARGO_BIN_EXE_python-code-sandbox");

fn cli(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (Output, u32) {
    let mut child = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the binary");
    let pid = child.id();
    let mut input = child.stdin.take().expect("stdin");
    // The binary may exit before it reads (a bad setting): a closed pipe is not the test's concern.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    (child.wait_with_output().expect("wait"), pid)
}

/// No sandbox made by the server process `pid` exists any more.
async fn assert_no_sandbox_of(pid: u32) {
    let (containers, volumes) = labelled("io.python-code-sandbox.pid", &pid.to_string()).await;
    assert!(
        containers.is_empty() && volumes.is_empty(),
        "left behind: {containers:?} {volumes:?}"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn run_prints_the_example_output_and_leaves_nothing() {
    if skip_without_engine() {
        return;
    }
    let (out, pid) = cli(&["run", "examples/hello.py"], "", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("Hello from the sandbox!\n"),
        "{}",
        text(&out.stdout)
    );
    assert_no_sandbox_of(pid).await;
}

#[tokio::test]
async fn run_passes_the_exit_status_through() {
    if skip_without_engine() {
        return;
    }
    let (out, pid) = cli(&["run", "-"], "import sys\nsys.exit(3)", &[]);
    assert_eq!(out.status.code(), Some(3));
    let (out, _) = cli(&["run", "-"], "raise RuntimeError('bad')", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("RuntimeError: bad"));
    assert_no_sandbox_of(pid).await;
}

#[tokio::test]
async fn run_exits_124_on_timeout() {
    if skip_without_engine() {
        return;
    }
    let (out, pid) = cli(&["run", "--timeout", "1s", "-"], "while True: pass", &[]);
    assert_eq!(out.status.code(), Some(124));
    assert!(
        text(&out.stderr).contains("timed out after 1s"),
        "{}",
        text(&out.stderr)
    );
    assert_no_sandbox_of(pid).await;
}

#[tokio::test]
async fn endless_output_is_cut_and_the_host_process_stays_small() {
    if skip_without_engine() {
        return;
    }
    let mut child = Command::new(BIN)
        .args(["run", "--timeout", "4s", "-"])
        .env("SANDBOX_MAX_OUTPUT", "1m")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the binary");
    let pid = child.id();
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"while True: print('x' * 1000)");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buffer).map(|_| buffer)
    });
    let err = std::thread::spawn(move || {
        let mut buffer = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut buffer).map(|_| buffer)
    });
    // wait4 gives this process's own peak memory (not that of other tests' children).
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid as i32);
    drop(child); // reaped above; dropping a Child neither waits nor kills
    let stdout = out.join().expect("join").expect("read stdout");
    let stderr = text(&err.join().expect("join").expect("read stderr"));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 124,
        "status {status}: {stderr}"
    );
    // The cap, less the interrupt's traceback on stderr and at most a line at each cut: the
    // code's head and tail as it wrote them, the line between them only on stderr.
    assert!(
        stdout.len() <= 1 << 20 && stdout.len() > (1 << 20) - 8192,
        "{} bytes reach stdout",
        stdout.len()
    );
    // Whole lines from the first; the last may be partial, as the interrupt left it.
    let line = format!("{}\n", "x".repeat(1000));
    assert!(stdout.starts_with(line.as_bytes()));
    let lines: Vec<&[u8]> = stdout.split(|b| *b == b'\n').collect();
    assert!(lines[..lines.len() - 1]
        .iter()
        .all(|l| *l == &line.as_bytes()[..1000]));
    assert!(lines[lines.len() - 1].iter().all(|b| *b == b'x'));
    assert!(
        stderr.contains("[python-code-sandbox: output cut; stdout keeps its first ")
            && stderr.contains(" lines) between them were discarded (SANDBOX_MAX_OUTPUT, 1 MiB)]"),
        "{stderr}"
    );
    let max_rss_kib = usage.ru_maxrss;
    assert!(max_rss_kib < 64 * 1024, "the CLI grew to {max_rss_kib} KiB");
    assert_no_sandbox_of(pid).await;
}

#[tokio::test]
async fn an_invalid_setting_stops_start_up_with_exit_2() {
    let (out, _) = cli(
        &["run", "-"],
        "print(1)",
        &[("SANDBOX_MEMORY_LIMIT", "plenty")],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("SANDBOX_MEMORY_LIMIT")
            && stderr.contains("plenty")
            && stderr.contains("512m"),
        "{stderr}"
    );
}

/// The lines every doctor prints, each of which must be ok.
const DOCTOR_CHECKS: &[&str] = &[
    "engine",
    "runtime",
    "image",
    "probe runtime",
    "user",
    "capabilities",
    "no-new-privileges",
    "pids limit",
    "memory limit",
    "no swap",
    "CPU limit",
    "open files",
    "network",
    "read-only root",
    "workspace",
];

/// The limits, each verified at least from the engine's record of the probe sandbox.
const DOCTOR_LIMITS: &[&str] = &[
    "no-new-privileges",
    "pids limit",
    "memory limit",
    "no swap",
    "CPU limit",
];

/// Runs the doctor with `env`; asserts exit 0, every check ok and verified (no `n/a`, no
/// `FAIL`), and nothing left behind. Returns its output.
async fn doctor_ok(env: &[(&str, &str)]) -> String {
    let (out, pid) = cli(&["doctor"], "", env);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    for check in DOCTOR_CHECKS {
        assert!(
            stdout.contains(&format!("ok   {check}:")),
            "{check} missing in:\n{stdout}"
        );
    }
    for limit in DOCTOR_LIMITS {
        let line = doctor_line(&stdout, limit);
        assert!(line.contains("(engine record"), "{line}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(!stdout.contains("n/a"), "{stdout}");
    assert!(stdout.contains("local at unix://"), "{stdout}");
    assert_no_sandbox_of(pid).await;
    stdout
}

fn doctor_line<'s>(stdout: &'s str, what: &str) -> &'s str {
    stdout
        .lines()
        .find(|line| line.starts_with(&format!("ok   {what}:")))
        .unwrap_or_else(|| panic!("no ok {what} line in:\n{stdout}"))
}

#[tokio::test]
async fn doctor_under_runc_verifies_every_limit() {
    if skip_without_engine() {
        return;
    }
    let stdout = doctor_ok(&[("SANDBOX_RUNTIME", "runc")]).await;
    assert!(
        stdout.contains("runs under runc: SANDBOX_RUNTIME chooses it"),
        "{stdout}"
    );
    assert!(
        doctor_line(&stdout, "probe runtime").contains("runc (engine record)"),
        "{stdout}"
    );
    // Under runc the sandbox sees its own cgroup, and the host kernel stops an allocating process.
    if stdout.contains("ok   engine: Docker") {
        let memory = doctor_line(&stdout, "memory limit");
        assert!(
            memory.contains(
                "host cgroup; the sandbox's cgroup; a process allocating past it was killed"
            ),
            "{memory}"
        );
        for limit in ["pids limit", "no swap", "CPU limit"] {
            let line = doctor_line(&stdout, limit);
            assert!(line.contains("host cgroup; the sandbox's cgroup"), "{line}");
        }
    }
}

#[tokio::test]
async fn doctor_under_the_default_runtime_verifies_every_limit() {
    if skip_without_engine() {
        return;
    }
    // The default: gVisor when the engine has it (scripts/test.sh registers it). gVisor hides
    // the kernel's limits from the sandbox: the engine's record, the host cgroup and gVisor's
    // own word verify them instead.
    let stdout = doctor_ok(&[]).await;
    if std::env::var("PCS_TEST_RUNTIME").ok().as_deref() == Some("runsc") {
        assert!(stdout.contains("runs under runsc (gVisor)"), "{stdout}");
        assert!(
            doctor_line(&stdout, "probe runtime").contains("runsc (engine record)"),
            "{stdout}"
        );
        // Under gVisor's systrap (2023 and later) the host's OOM killer may take one of its
        // stub processes (the engine then stops the code: a process was killed) or the whole
        // sandbox; under ptrace (2022) the sandbox. Either is the limit enforced.
        let memory = doctor_line(&stdout, "memory limit");
        let enforced = [
            "an allocation past it ended the sandbox, killed for memory)",
            "a process allocating past it was killed)",
        ];
        assert!(
            memory.contains("(engine record; host cgroup; gVisor's /proc/meminfo; ")
                && enforced.iter().any(|e| memory.ends_with(e)),
            "{memory}"
        );
        let pids = doctor_line(&stdout, "pids limit");
        assert!(
            pids.contains("(engine record; host cgroup, on gVisor's host threads)"),
            "{pids}"
        );
        let nnp = doctor_line(&stdout, "no-new-privileges");
        assert!(
            nnp.contains("(engine record; gVisor's prctl(PR_GET_NO_NEW_PRIVS))"),
            "{nnp}"
        );
        for limit in ["no swap", "CPU limit"] {
            let line = doctor_line(&stdout, limit);
            assert!(line.contains("(engine record; host cgroup)"), "{line}");
        }
    }
}

#[tokio::test]
async fn sigterm_during_a_run_removes_the_sandbox() {
    if skip_without_engine() {
        return;
    }
    let mut child = Command::new(BIN)
        .args(["run", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"print('running', flush=True)\nimport time\ntime.sleep(600)")
        .expect("write");
    // Wait until the sandbox exists, then terminate the CLI.
    let mut seen = false;
    for _ in 0..200 {
        let (containers, _) = labelled("io.python-code-sandbox.pid", &pid.to_string()).await;
        if !containers.is_empty() {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(seen, "the sandbox never appeared");
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130));
    assert_no_sandbox_of(pid).await;
}

/// A fresh private directory for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("pcs-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("create a scratch directory");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    dir
}

/// Starts `args` with these files-directory settings and expects the start-up to be refused
/// before anything else happens: exit 2, the directory, the reason and the fix on stderr.
fn refused_at_start_up(args: &[&str], env: &[(&str, &std::path::Path)], reason: &str) {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("SANDBOX_FILES_DIR")
        .env_remove("XDG_STATE_HOME")
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("run the binary");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
    assert!(
        stderr.contains("SANDBOX_FILES_DIR=")
            && stderr.contains(reason)
            && stderr.contains("Fix:")
            && stderr.contains("SANDBOX_FILES_DIR= (empty)"),
        "{args:?} {env:?}: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing was served: {}",
        text(&out.stdout)
    );
}

#[test]
fn an_untrusted_files_directory_stops_start_up_with_exit_2() {
    use std::os::unix::fs::PermissionsExt;
    let base = scratch("files-dir");
    let real = base.join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = base.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let shared = base.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    for args in [
        &["run", "-"][..],
        &["stdio"][..],
        &["serve", "--http", "127.0.0.1:0"][..],
    ] {
        refused_at_start_up(args, &[("SANDBOX_FILES_DIR", &link)], "is a symbolic link");
        refused_at_start_up(
            args,
            &[("SANDBOX_FILES_DIR", &shared)],
            "writable by group or others (mode 0777)",
        );
    }
    // Nothing was written through the link.
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);

    // Owned by another uid: only root can make one.
    let planted = base.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
    if std::os::unix::fs::chown(&planted, Some(4242), Some(4242)).is_ok() {
        refused_at_start_up(
            &["stdio"],
            &[("SANDBOX_FILES_DIR", &planted)],
            "belongs to uid 4242",
        );
    } else {
        eprintln!("part skipped: chown to another uid needs root");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn the_default_files_directory_planted_by_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let home = scratch("planted-home");
    let planted = home.join(".local/state/python-code-sandbox/files");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The default location follows HOME (XDG_STATE_HOME unset) and is checked like any other.
    refused_at_start_up(
        &["stdio"],
        &[("HOME", &home)],
        "writable by group or others",
    );
    let state = scratch("planted-state");
    std::fs::create_dir_all(state.join("python-code-sandbox")).unwrap();
    std::fs::create_dir(state.join("target")).unwrap();
    std::os::unix::fs::symlink(
        state.join("target"),
        state.join("python-code-sandbox/files"),
    )
    .unwrap();
    refused_at_start_up(
        &["run", "-"],
        &[("HOME", &home), ("XDG_STATE_HOME", &state)],
        "is a symbolic link",
    );
    std::fs::remove_dir_all(&home).unwrap();
    std::fs::remove_dir_all(&state).unwrap();
}
