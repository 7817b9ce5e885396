//! The sandbox state machine on the fake backend.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::fake_backend::{Event, FakeBackend};
use super::spec;
use crate::engine::backend::Backend;
use crate::engine::sandbox::{Sandbox, Task, WorkspacePath};
use crate::engine::EngineError;

const OUTPUT: u64 = 1 << 20;

async fn launch() -> (Sandbox, Arc<FakeBackend>) {
    let fake = Arc::new(FakeBackend::new());
    let backend: Arc<dyn Backend> = fake.clone();
    let sandbox = Sandbox::launch(backend, &spec()).await.expect("launch");
    (sandbox, fake)
}

#[tokio::test]
async fn launches_and_keeps_variables_between_executions() {
    let (mut sandbox, fake) = launch().await;
    assert!(!sandbox.python_version().is_empty());
    let first = sandbox
        .execute(
            Task::Python("x = 41"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(first.exit_code, 0, "{first:?}");
    let second = sandbox
        .execute(
            Task::Python("print(x + 1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(String::from_utf8_lossy(&second.stdout), "42\n");
    assert!(!second.state_lost && !second.workspace_lost);
    sandbox.destroy().await;
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn an_exception_and_a_shell_status_come_back() {
    let (mut sandbox, _fake) = launch().await;
    let raised = sandbox
        .execute(Task::Python("1 / 0"), Duration::from_secs(10), OUTPUT, None)
        .await
        .expect("execute");
    assert_eq!(raised.exit_code, 1);
    assert_eq!(
        raised.error.as_ref().map(|e| e.kind.as_str()),
        Some("ZeroDivisionError")
    );
    assert!(String::from_utf8_lossy(&raised.stderr).contains("ZeroDivisionError"));
    let shell = sandbox
        .execute(
            Task::Shell("echo hi; exit 3"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(
        (shell.exit_code, shell.stdout.as_slice()),
        (3, &b"hi\n"[..])
    );
    sandbox.destroy().await;
}

#[tokio::test]
async fn written_files_are_reported_and_readable_through_the_runner() {
    let (mut sandbox, fake) = launch().await;
    let execution = sandbox
        .execute(
            Task::Python("open('out.txt', 'w').write('data')"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    let changed: Vec<&str> = execution
        .changes
        .entries
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(changed, ["out.txt"]);
    let workspace = fake.workspace(sandbox.id()).expect("workspace");
    assert_eq!(
        std::fs::read_to_string(workspace.join("out.txt")).ok(),
        Some("data".into())
    );
    let listing = sandbox.list("").await.expect("list");
    assert_eq!(listing.entries.len(), 1);
    let chunk = sandbox
        .read_chunk(&WorkspacePath::text("out.txt"), 0, 100)
        .await
        .expect("read")
        .expect("readable");
    assert_eq!(chunk.data, b"data");
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_timeout_interrupts_the_code_and_keeps_its_state() {
    let (mut sandbox, fake) = launch().await;
    sandbox
        .execute(
            Task::Python("kept = 7"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    let looped = sandbox
        .execute(
            Task::Python("while True: pass"),
            Duration::from_millis(300),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(looped.timed_out && !looped.cancelled, "{looped:?}");
    assert_eq!(looped.exit_code, 130);
    assert!(!looped.state_lost);
    assert_eq!(fake.count(|e| matches!(e, Event::Interrupted(_))), 1);
    assert_eq!(fake.count(|e| matches!(e, Event::KilledProcesses(_))), 0);
    let after = sandbox
        .execute(
            Task::Python("print(kept)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "7\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn cancelling_interrupts_the_code() {
    let (mut sandbox, _fake) = launch().await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let execution = sandbox
        .execute(
            Task::Python("import time\ntime.sleep(30)"),
            Duration::from_secs(20),
            OUTPUT,
            Some(&cancel),
        )
        .await
        .expect("execute");
    assert!(execution.cancelled && !execution.timed_out, "{execution:?}");
    assert_eq!(execution.exit_code, 130);
    sandbox.destroy().await;
}

#[tokio::test]
async fn code_that_ignores_the_interrupt_is_killed_and_the_runner_restarts_with_the_files() {
    let (mut sandbox, fake) = launch().await;
    sandbox
        .execute(
            Task::Python("lost = 1\nopen('kept.txt', 'w').write('kept')"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    let stubborn = "import signal, time\n\
                    signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
                    while True: time.sleep(0.01)";
    let killed = sandbox
        .execute(
            Task::Python(stubborn),
            Duration::from_millis(200),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(killed.timed_out, "{killed:?}");
    assert_eq!(killed.exit_code, 137);
    assert!(killed.state_lost && !killed.workspace_lost, "{killed:?}");
    assert_eq!(fake.count(|e| matches!(e, Event::KilledProcesses(_))), 1);
    assert_eq!(fake.count(|e| matches!(e, Event::Killed(_))), 0);
    let after = sandbox
        .execute(
            Task::Python("print(open('kept.txt').read(), 'lost' in globals())"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "kept False\n");
    assert!(
        !after.state_lost,
        "the loss was reported once, with the kill"
    );
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_runner_that_exits_is_replaced_and_the_workspace_stays() {
    let (mut sandbox, fake) = launch().await;
    let died = sandbox
        .execute(
            Task::Python("open('f', 'w').write('x')\nimport os\nos._exit(3)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(died.exit_code, 3);
    assert!(died.state_lost && !died.workspace_lost && !died.out_of_memory);
    assert!(String::from_utf8_lossy(&died.stderr).contains("exited with status 3"));
    let after = sandbox
        .execute(
            Task::Python("print(open('f').read())"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "x\n");
    assert_eq!(
        fake.count(|e| matches!(e, Event::Started(_))),
        1,
        "no restart of the sandbox"
    );
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_runner_killed_for_memory_is_reported_as_out_of_memory() {
    let (mut sandbox, fake) = launch().await;
    let id = sandbox.id().clone();
    let killer = fake.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        killer.kill_runner(&id, true);
    });
    let execution = sandbox
        .execute(
            Task::Python("import time\ntime.sleep(30)"),
            Duration::from_secs(20),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(
        execution.out_of_memory && execution.state_lost,
        "{execution:?}"
    );
    assert_eq!(execution.exit_code, 137);
    assert_eq!(
        execution.error.as_ref().map(|e| e.kind.as_str()),
        Some("MemoryError")
    );
    let after = sandbox
        .execute(
            Task::Python("print(1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(after.stdout, b"1\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_runner_death_between_requests_is_noticed_on_the_next_one() {
    let (mut sandbox, fake) = launch().await;
    fake.kill_runner(sandbox.id(), false);
    // The supervisor's report waits in the stream: the next request meets it.
    let died = sandbox
        .execute(
            Task::Python("print(1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(died.state_lost, "{died:?}");
    assert_eq!(died.exit_code, 137);
    let after = sandbox
        .execute(
            Task::Python("print(2)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(after.stdout, b"2\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_sandbox_killed_from_outside_is_lost_then_restarts_empty() {
    let (mut sandbox, fake) = launch().await;
    sandbox
        .execute(
            Task::Python("open('f', 'w').write('x')"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    fake.stop_from_outside(sandbox.id(), 137, false).await;
    let lost = sandbox
        .execute(
            Task::Python("print(1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await;
    match lost {
        Err(EngineError::SandboxLost(reason)) => {
            assert!(reason.contains("killed from outside"), "{reason}")
        }
        other => panic!("expected a lost sandbox, got {other:?}"),
    }
    let restarted = sandbox
        .execute(
            Task::Python("import os\nprint(os.path.exists('f'))"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(restarted.workspace_lost && restarted.state_lost);
    assert_eq!(restarted.stdout, b"False\n");
    assert_eq!(fake.count(|e| matches!(e, Event::Started(_))), 2);
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_sandbox_stopped_for_memory_says_so() {
    let (mut sandbox, fake) = launch().await;
    fake.stop_from_outside(sandbox.id(), 137, true).await;
    match sandbox.list("").await {
        Err(EngineError::SandboxLost(reason)) => {
            assert!(reason.contains("ran out of memory"), "{reason}")
        }
        other => panic!("expected a lost sandbox, got {other:?}"),
    }
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_sandbox_removed_from_outside_is_lost() {
    let (mut sandbox, fake) = launch().await;
    fake.remove_from_outside(sandbox.id()).await;
    match sandbox
        .execute(
            Task::Python("print(1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
    {
        Err(EngineError::SandboxLost(reason)) => {
            assert!(reason.contains("removed from outside"), "{reason}")
        }
        other => panic!("expected a lost sandbox, got {other:?}"),
    }
    sandbox.destroy().await;
}

#[tokio::test]
async fn protocol_garbage_stops_the_sandbox_and_the_next_call_restarts_it() {
    let (mut sandbox, fake) = launch().await;
    let mut garbage = 5u32.to_be_bytes().to_vec();
    garbage.extend_from_slice(b"nope!");
    fake.inject_output(sandbox.id(), &garbage);
    let broken = sandbox
        .execute(
            Task::Python("print(1)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await;
    assert!(
        matches!(broken, Err(EngineError::Protocol(_))),
        "{broken:?}"
    );
    assert_eq!(fake.count(|e| matches!(e, Event::Killed(_))), 1);
    let restarted = sandbox
        .execute(
            Task::Python("print(2)"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(restarted.workspace_lost);
    assert_eq!(restarted.stdout, b"2\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn a_failed_start_leaves_nothing_behind() {
    let fake = Arc::new(FakeBackend::new());
    fake.fail_next_starts(1);
    let backend: Arc<dyn Backend> = fake.clone();
    let launched = Sandbox::launch(backend, &spec()).await;
    assert!(launched.is_err());
    assert!(fake.sandboxes().is_empty());
    assert_eq!(fake.count(|e| matches!(e, Event::Destroyed(_))), 1);
}

#[tokio::test]
async fn a_runner_that_dies_as_it_starts_is_reported_with_what_it_printed() {
    let fake = Arc::new(FakeBackend::new());
    let backend: Arc<dyn Backend> = fake.clone();
    let mut broken = spec();
    broken.command = vec![
        "python3".into(),
        "-c".into(),
        "import sys; sys.stderr.write('no runner here'); sys.exit(2)".into(),
    ];
    match Sandbox::launch(backend, &broken).await {
        Err(EngineError::SandboxStart(reason)) => {
            assert!(
                reason.contains("status 2") && reason.contains("no runner here"),
                "{reason}"
            )
        }
        Ok(_) => panic!("the sandbox started"),
        Err(other) => panic!("unexpected error: {other}"),
    }
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn stray_live_output_is_ignored_and_never_taken_for_a_reply() {
    let (mut sandbox, fake) = launch().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink: crate::engine::LiveOutputSink = {
        let seen = seen.clone();
        Arc::new(move |output: crate::engine::LiveOutput| {
            if let Ok(mut seen) = seen.lock() {
                seen.push(output.stdout);
            }
        })
    };
    // "b2xk" is "old": frames for another request, and with no live execution at all.
    let frame = |id: u64| {
        let body = format!(r#"{{"type":"output","id":{id},"stdout":"b2xk"}}"#);
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body.as_bytes());
        bytes
    };
    fake.inject_output(sandbox.id(), &frame(99));
    let execution = sandbox
        .execute_live(
            Task::Python("print('new')"),
            Duration::from_secs(10),
            OUTPUT,
            None,
            Some(&sink),
            None,
        )
        .await
        .expect("execute");
    assert_eq!(execution.stdout, b"new\n");
    assert_eq!(*seen.lock().expect("seen"), ["new\n"]);
    fake.inject_output(sandbox.id(), &frame(1));
    let listing = sandbox.list("").await.expect("list");
    assert!(listing.error.is_none(), "{listing:?}");
    assert_eq!(seen.lock().expect("seen").len(), 1);
    sandbox.destroy().await;
}

#[tokio::test]
async fn buffered_prints_keep_their_order_around_subprocesses_and_forks() {
    let (mut sandbox, _fake) = launch().await;
    // 'c' is still in the parent's buffer at the fork: flushed before it, it is written once.
    let code = "import os, subprocess, sys\n\
                print('a')\n\
                subprocess.run(['echo', 'b'])\n\
                print('c', end='')\n\
                pid = os.fork()\n\
                if pid == 0:\n    print(' child'); sys.stdout.flush(); os._exit(0)\n\
                os.waitpid(pid, 0)\n\
                print('!')\n\
                print('e', file=sys.stderr)\n";
    let execution = sandbox
        .execute(Task::Python(code), Duration::from_secs(10), OUTPUT, None)
        .await
        .expect("execute");
    assert_eq!(
        String::from_utf8_lossy(&execution.stdout),
        "a\nb\nc child\n!\n"
    );
    assert_eq!(execution.stderr, b"e\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn streams_the_code_closed_or_replaced_are_back_in_the_next_execution() {
    let (mut sandbox, _fake) = launch().await;
    let code = "import io, sys\nprint('kept')\nsys.stdout.close()\nsys.stderr = io.StringIO()";
    let closed = sandbox
        .execute(Task::Python(code), Duration::from_secs(10), OUTPUT, None)
        .await
        .expect("execute");
    assert_eq!(closed.stdout, b"kept\n");
    let code = "import sys\nprint('back')\nprint('err', file=sys.stderr)";
    let next = sandbox
        .execute(Task::Python(code), Duration::from_secs(10), OUTPUT, None)
        .await
        .expect("execute");
    assert_eq!(next.stdout, b"back\n");
    assert_eq!(next.stderr, b"err\n");
    sandbox.destroy().await;
}

#[tokio::test]
async fn an_interrupt_in_the_middle_of_printing_leaves_nothing_for_the_next_execution() {
    let (mut sandbox, _fake) = launch().await;
    let flood = sandbox
        .execute(
            Task::Python("while True:\n    print('x' * 100)"),
            Duration::from_millis(500),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert!(flood.timed_out && !flood.state_lost, "{flood:?}");
    assert!(flood.stdout.starts_with(b"xxx"), "{:?}", flood.stdout.len());
    let next = sandbox
        .execute(
            Task::Python("print('next')"),
            Duration::from_secs(10),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(next.stdout, b"next\n");
    sandbox.destroy().await;
}

/// Answers every pip request with the line it got, and a set to put on `sys.path`.
struct EchoPip {
    dir: String,
}

impl crate::engine::pip::PipHandler for EchoPip {
    fn handle<'a>(
        &'a self,
        line: &'a str,
        _deadline: std::time::Instant,
    ) -> crate::engine::pip::PipFuture<'a> {
        Box::pin(async move {
            crate::engine::pip::PipAnswer {
                ok: true,
                text: format!("asked: {line}"),
                add: vec![self.dir.clone()],
                remove: Vec::new(),
            }
        })
    }
}

#[tokio::test]
async fn the_codes_pip_requests_reach_the_handler_within_their_bound_and_its_set_is_importable() {
    let (mut sandbox, _fake) = launch().await;
    let set = std::env::temp_dir().join(format!("pcs-pip-set-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&set).expect("set dir");
    std::fs::write(set.join("from_pip_set.py"), "VALUE = 42\n").expect("module");
    let handler = EchoPip {
        dir: set.display().to_string(),
    };
    // The runner's entry point (what %pip calls) six times, then the shim on PATH: the sixth
    // and the shim's are over the bound of five per execution.
    let code = "import subprocess, sandbox_runner.pip as p\n\
                for i in range(6):\n    p.run('install x%d' % i)\n\
                import from_pip_set\n\
                print('value', from_pip_set.VALUE)\n\
                r = subprocess.run(['pip', 'list'], capture_output=True, text=True)\n\
                print('shim', r.returncode, r.stderr.strip())\n";
    let execution = sandbox
        .execute_live(
            Task::Python(code),
            Duration::from_secs(30),
            OUTPUT,
            None,
            None,
            Some(&handler),
        )
        .await
        .expect("execute");
    let stdout = String::from_utf8_lossy(&execution.stdout);
    let stderr = String::from_utf8_lossy(&execution.stderr);
    assert_eq!(execution.exit_code, 0, "{stdout}\n{stderr}");
    for i in 0..5 {
        assert!(
            stdout.contains(&format!("asked: install x{i}\n")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("install x5"), "{stdout}");
    assert!(
        stderr.contains("at most 5 pip commands per call"),
        "{stderr}"
    );
    assert!(stdout.contains("value 42\n"), "{stdout}");
    assert!(stdout.contains("shim 1 ERROR: pip: at most 5"), "{stdout}");
    // Without a handler the request is refused and the code goes on.
    let execution = sandbox
        .execute(
            Task::Python("import sandbox_runner.pip as p\np.run('list')\nprint('after')"),
            Duration::from_secs(30),
            OUTPUT,
            None,
        )
        .await
        .expect("execute");
    assert_eq!(execution.stdout, b"after\n");
    assert!(
        String::from_utf8_lossy(&execution.stderr).contains("cannot be installed here"),
        "{:?}",
        execution.stderr
    );
    let _ = std::fs::remove_dir_all(&set);
}

/// The runner's seccomp filter (python/runner/seccomp.py) is in force in the host runner too:
/// set-ID bits are refused however a file gets its mode (ordinary modes are given), and
/// pidfd_send_signal and openat2 are unavailable (here at the runner's own /proc directory and
/// signal 0: the host's pid 1 is no target for a test).
#[tokio::test]
async fn the_filter_refuses_set_id_modes_and_queued_signals_through_a_pidfd() {
    let (mut sandbox, _fake) = launch().await;
    let code = r"
import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)
def outcome(call, *args):
    try:
        call(*args)
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
def syscall(*args):
    if libc.syscall(*args) < 0:
        raise OSError(ctypes.get_errno(), 'syscall')
def create(path, mode, flags=os.O_CREAT | os.O_WRONLY):
    os.close(os.open(path, flags, mode))
open('plain', 'w').close()
print('chmod', *(outcome(os.chmod, 'plain', m) for m in (0o755, 0o777, 0o1777, 0o4755, 0o2755, 0o6711)))
fd = os.open('plain', os.O_RDONLY)
print('fchmod', outcome(os.fchmod, fd, 0o4755), outcome(os.fchmod, fd, 0o700), outcome(syscall, 452, -100, b'plain', 0o2755, 0))
print('create', outcome(create, 'made', 0o4755), outcome(create, '.', 0o2700, os.O_TMPFILE | os.O_WRONLY),
      outcome(os.mknod, 'node', stat.S_IFREG | 0o4755), outcome(create, 'made', 0o755), outcome(syscall, 437, -100, b'plain', None, 24))
own = os.open('/proc/self', os.O_RDONLY | os.O_DIRECTORY)
print('pidfd_send_signal', outcome(syscall, 424, own, 0, None, 0), 'kill', outcome(os.kill, os.getpid(), 0),
      'io_uring_setup', outcome(syscall, 425, 1, None))
print(oct(os.stat('plain').st_mode & 0o7777), sorted(os.listdir('.')))
";
    let execution = sandbox
        .execute(Task::Python(code), Duration::from_secs(20), OUTPUT, None)
        .await
        .expect("execute");
    assert_eq!(
        String::from_utf8_lossy(&execution.stdout),
        "chmod ok ok ok EPERM EPERM EPERM\nfchmod EPERM ok EPERM\n\
         create EPERM EPERM EPERM ok ENOSYS\npidfd_send_signal ENOSYS kill ok io_uring_setup ENOSYS\n\
         0o700 ['made', 'plain']\n",
        "{execution:?}"
    );
    sandbox.destroy().await;
}
