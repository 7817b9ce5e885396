//! The engine against the real Docker engine: behaviour, limits and hardening of sandboxes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use python_code_sandbox::config::NetworkPolicy;
use python_code_sandbox::engine::backend::{Backend, EngineKind, SandboxId, SandboxSpec};
use python_code_sandbox::engine::docker::DockerBackend;
use python_code_sandbox::engine::owner::{LABEL_INSTANCE, LABEL_PID, LABEL_PID_START};
use python_code_sandbox::engine::protocol::bootstrap_command;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{Engine, EngineError, RunOptions, Task};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_world() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let result = run(&engine, "print('hello world')").await;
        assert_eq!(text(&result.stdout), "hello world\n");
        assert_eq!(result.stderr, b"");
        assert_eq!(result.exit_code, 0);
        assert!(result.succeeded() && !result.timed_out && result.truncated_bytes == 0);
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exception_gives_its_traceback_and_status_1() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let result = run(
            &engine,
            "def f():\n    raise ValueError('boom')\nprint('before')\nf()\n",
        )
        .await;
        assert_eq!(result.exit_code, 1);
        assert_eq!(text(&result.stdout), "before\n");
        let stderr = text(&result.stderr);
        // IPython's traceback: the cell and line named, no colours.
        assert!(
            stderr.contains("Traceback (most recent call last)"),
            "{stderr}"
        );
        assert!(stderr.contains("Cell In[1], line 4"), "{stderr}");
        assert!(
            stderr.contains("raise ValueError('boom')") && stderr.ends_with("ValueError: boom\n"),
            "{stderr}"
        );
        assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
        assert!(
            !stderr.contains("sandbox-runner"),
            "runner frames leak into the traceback: {stderr}"
        );
        let error = result.error.expect("the exception is reported");
        assert_eq!(
            (error.kind.as_str(), error.message.as_str()),
            ("ValueError", "boom")
        );
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sys_exit_sets_the_status_and_a_session_survives_it() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let result = run(&engine, "import sys\nprint('bye')\nsys.exit(3)").await;
        assert_eq!(
            (result.exit_code, text(&result.stdout).as_str()),
            (3, "bye\n")
        );
        // As a Jupyter kernel reports it: an error, with the status.
        assert_eq!(
            result
                .error
                .as_ref()
                .map(|e| (e.kind.as_str(), e.message.as_str())),
            Some(("SystemExit", "3"))
        );

        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        assert_eq!(
            in_session(&engine, &session, "kept = 'yes'\nimport sys; sys.exit(3)")
                .await
                .exit_code,
            3
        );
        let after = in_session(&engine, &session, "print(kept)").await;
        assert_eq!(text(&after.stdout), "yes\n", "the runner survives sys.exit");
        assert!(!after.state_lost);
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_persists_across_executions_in_a_session() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(
            &engine,
            &session,
            "import math\nx = 41\nopen('note.txt', 'w').write('kept')",
        )
        .await;
        let result = in_session(
            &engine,
            &session,
            "x += 1\nprint(x, math.pi > 3, open('note.txt').read())",
        )
        .await;
        assert_eq!(text(&result.stdout), "42 True kept\n");
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
        let again = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("print(1)"),
                &RunOptions::default(),
            )
            .await;
        assert!(again.is_err(), "a stopped session must not run code");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_loop_times_out_and_a_session_keeps_its_state_through_a_swallowed_interrupt() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| c.limits.timeout = Duration::from_secs(2));
    no_hang(async {
        let result = run(&engine, "print('started', flush=True)\nwhile True: pass").await;
        assert!(result.timed_out);
        assert_eq!(result.exit_code, 130);
        assert_eq!(
            text(&result.stdout),
            "started\n",
            "output before the timeout is kept"
        );
        assert!(text(&result.stderr).contains("KeyboardInterrupt"));

        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(&engine, &session, "x = 'survives'").await;
        let looped = in_session(&engine, &session, "while True: pass").await;
        assert!(looped.timed_out && !looped.state_lost);
        // The first KeyboardInterrupt swallowed (as Python drops one raised in a fork hook or a
        // `__del__`): the repeated interrupt stops the code before it would be killed.
        let swallowing = "import time\ntry:\n    while True: time.sleep(0.01)\nexcept BaseException:\n    print('swallowed', flush=True)\nwhile True: time.sleep(0.01)";
        let repeated = in_session(&engine, &session, swallowing).await;
        assert!(repeated.timed_out && !repeated.state_lost, "{repeated:?}");
        assert_eq!(text(&repeated.stdout), "swallowed\n");
        let after = in_session(&engine, &session, "print(x)").await;
        assert_eq!(text(&after.stdout), "survives\n");
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_ignores_the_interrupt_is_killed_and_the_session_restarts() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| c.limits.timeout = Duration::from_secs(1));
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(
            &engine,
            &session,
            "x = 1\nopen('file.txt', 'w').write('on disk')",
        )
        .await;
        let stubborn =
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass";
        let result = in_session(&engine, &session, stubborn).await;
        assert!(result.timed_out && result.state_lost, "{result:?}");
        assert!(text(&result.stderr).contains("killed"));
        assert!(!result.workspace_lost, "{result:?}");
        let after = in_session(
            &engine,
            &session,
            "print('x' in globals(), open('file.txt').read())",
        )
        .await;
        assert_eq!(
            text(&after.stdout),
            "False on disk\n",
            "variables are lost, the workspace is not"
        );
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_output_is_cut_at_the_cap() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| {
        c.limits.max_output_bytes = 64 * 1024;
        c.limits.timeout = Duration::from_secs(3);
    });
    no_hang(async {
        let result = run(&engine, "while True: print('x')").await;
        assert!(result.timed_out);
        // The cap, but for the line that says what was dropped and the last partial line cut.
        let cut = result.discarded[0].clone().expect("stdout was cut");
        let kept = result.stdout.len() - cut.marker_len + result.stderr.len();
        assert!(
            (64 * 1024 - 4..=64 * 1024).contains(&kept),
            "the cap is kept: {kept}"
        );
        assert!(
            result.truncated_bytes > 64 * 1024,
            "much more was written: {}",
            result.truncated_bytes
        );
        // The interrupt's traceback is whole, at the end of stderr.
        assert!(result.discarded[1].is_none());
        assert!(text(&result.stderr).contains("KeyboardInterrupt"));
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_output_keeps_its_first_and_last_lines_and_says_what_was_dropped_between() {
    if skip_without_engine() {
        return;
    }
    // The default limit (1 MiB).
    let engine = engine();
    no_hang(async {
        let code = "for i in range(2_000_000):\n    print(i)\nprint('FINAL RESULT 42')\n";
        let result = run(&engine, code).await;
        assert_eq!(result.exit_code, 0, "{}", text(&result.stderr));
        let mut whole: String = (0..2_000_000).map(|i| format!("{i}\n")).collect();
        whole.push_str("FINAL RESULT 42\n");
        let cut = result.discarded[0].clone().expect("stdout was cut");
        let kept = text(&result.stdout);
        let (head, rest) = kept.split_at(cut.at);
        let (line, tail) = rest.split_at(cut.marker_len);
        assert!(whole.starts_with(head) && head.starts_with("0\n1\n2\n"));
        assert!(whole.ends_with(tail));
        assert!(
            tail.ends_with("\n1999999\nFINAL RESULT 42\n"),
            "the last line is kept"
        );
        // Whole lines: the head ends one, the tail starts one.
        let dropped = &whole[head.len()..whole.len() - tail.len()];
        assert!(head.ends_with('\n') && dropped.ends_with('\n'));
        let lines = dropped.matches('\n').count();
        assert_eq!(
            line,
            format!(
                "[… {} bytes ({lines} lines) of stdout not kept here: over the 1 MiB output \
                 limit (SANDBOX_MAX_OUTPUT) …]\n",
                dropped.len()
            )
        );
        assert_eq!((cut.bytes, cut.lines), (dropped.len() as u64, lines as u64));
        assert_eq!(result.truncated_bytes, dropped.len() as u64);
        // Half the limit each, less at most a line.
        assert!(head.len() > (512 << 10) - 8 && head.len() <= 512 << 10);
        assert!(tail.len() > (512 << 10) - 8 && tail.len() <= 512 << 10);
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_runs_unprivileged_without_capabilities() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let code = r#"
import os
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
print(os.getuid(), os.getgid(), status['CapEff'].strip(), status['CapPrm'].strip(), status.get('NoNewPrivs', 'n/a').strip())
"#;
        let result = run(&engine, code).await;
        // gVisor's /proc has no NoNewPrivs line (the engine sets it on the sandbox all the same).
        let no_new_privs = if under_gvisor(&engine).await { "n/a" } else { "1" };
        assert_eq!(
            text(&result.stdout),
            format!("1000 1000 0000000000000000 0000000000000000 {no_new_privs}\n")
        );
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_has_no_network_but_loopback() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let code = r#"
import os, socket
print(sorted(name for _, name in socket.if_nameindex()))
routes = [l for l in open('/proc/net/route').read().splitlines()[1:] if l.strip()]
print(len(routes))
try:
    socket.getaddrinfo('pypi.org', 443)
    print('resolved')
except OSError:
    print('no name resolution')
"#;
        let result = run(&engine, code).await;
        assert_eq!(
            text(&result.stdout),
            "['lo']\n0\nno name resolution\n",
            "{}",
            text(&result.stderr)
        );
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_filesystem_is_read_only_and_tmp_and_workspace_are_bounded() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| {
        c.limits.tmp_bytes = 8 << 20;
        c.limits.workspace_bytes = 8 << 20;
    });
    no_hang(async {
        let code = r#"
import errno
for path in ('/evil', '/usr/lib/evil', '/home/sandbox/evil'):
    try:
        open(path, 'a').write('x')
        print(path, 'WRITABLE')
    except OSError as e:
        print(path, errno.errorcode[e.errno])
open('/tmp/ok', 'w').write('fine')
try:
    with open('/tmp/big', 'wb') as f:
        f.write(b'0' * (16 << 20))
    print('tmp unbounded')
except OSError as e:
    print('tmp', errno.errorcode[e.errno])
try:
    with open('/workspace/big', 'wb') as f:
        f.write(b'0' * (16 << 20))
    print('workspace unbounded')
except OSError as e:
    print('workspace', errno.errorcode[e.errno])
"#;
        let result = run(&engine, code).await;
        // gVisor checks the permission of a root-owned directory before the read-only mount:
        // the write is refused either way; the user's own home shows the read-only root.
        let root_owned = if under_gvisor(&engine).await {
            "EACCES"
        } else {
            "EROFS"
        };
        assert_eq!(
            text(&result.stdout),
            format!("/evil {root_owned}\n/usr/lib/evil {root_owned}\n/home/sandbox/evil EROFS\ntmp ENOSPC\nworkspace ENOSPC\n"),
            "{}",
            text(&result.stderr)
        );
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_reported_as_out_of_memory() {
    if skip_without_engine() {
        return;
    }
    // Under runc the runner sees the kernel's OOM kill and reports it; under gVisor the sandbox's
    // kernel dies with it (checked in `sandboxes_run_under_another_runtime`).
    let engine = engine_with(|c| {
        c.limits.memory_bytes = 128 << 20;
        c.runtime = Some("runc".to_string());
    });
    no_hang(async {
        let result = run(
            &engine,
            "x = []\nwhile True:\n    x.append(bytearray(8 << 20))",
        )
        .await;
        assert!(result.out_of_memory, "{result:?}");
        assert!(!result.succeeded());
        assert!(text(&result.stderr).contains("out of memory"));
        assert_eq!(
            result.error.map(|e| e.kind),
            Some("MemoryError".to_string())
        );

        // A session recovers from it with a fresh runner.
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(&engine, &session, "open('kept.txt', 'w').write('kept')").await;
        let bomb = in_session(
            &engine,
            &session,
            "x = []\nwhile True:\n    x.append(bytearray(8 << 20))",
        )
        .await;
        assert!(
            bomb.out_of_memory && bomb.state_lost && !bomb.workspace_lost,
            "{bomb:?}"
        );
        let after = in_session(&engine, &session, "print('alive', open('kept.txt').read())").await;
        assert_eq!(text(&after.stdout), "alive kept\n");
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_contained() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| {
        c.limits.pids = 64;
        c.limits.timeout = Duration::from_secs(3);
    });
    no_hang(async {
        let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";
        let result = run(&engine, bomb).await;
        assert!(result.timed_out, "{result:?}");

        // In a session the runner cleans up after the interrupt, and the next execution works.
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        in_session(&engine, &session, "x = 7").await;
        let bombed = in_session(&engine, &session, bomb).await;
        assert!(bombed.timed_out, "{bombed:?}");
        let after = in_session(&engine, &session, "import os\nprint(globals().get('x'), len([p for p in os.listdir('/proc') if p.isdigit()]))").await;
        // Left: init (pid 1) and the runner. The variables are kept unless the result said they
        // were lost (a runner that did not stop within the grace is restarted: on a loaded machine).
        let kept = if bombed.state_lost { "None" } else { "7" };
        assert_eq!(text(&after.stdout), format!("{kept} 2\n"), "{}", text(&after.stderr));
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    // The host still responds: a normal run right after.
    assert_eq!(text(&run(&engine, "print('ok')").await.stdout), "ok\n");
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_and_invalid_utf8_output_come_back_byte_for_byte() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let code = "import sys\nprint('héllo ☃ 你好 🐍')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'raw \\xff\\xfe end\\n')\nsys.stderr.buffer.write(b'\\x80err\\n')";
        let result = run(&engine, code).await;
        let mut expected = "héllo ☃ 你好 🐍\nraw ".as_bytes().to_vec();
        expected.extend_from_slice(b"\xff\xfe end\n");
        assert_eq!(result.stdout, expected);
        assert_eq!(result.stderr, b"\x80err\n");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_kilobytes_of_code_run() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let mut code = String::new();
        let mut i = 0;
        while code.len() < 100 * 1024 {
            code.push_str(&format!("v{i} = {i}\n"));
            i += 1;
        }
        code.push_str(&format!(
            "print(sum(globals()[f'v{{n}}'] for n in range({i})))\n"
        ));
        let result = run(&engine, &code).await;
        assert_eq!(
            text(&result.stdout),
            format!("{}\n", (0..i).sum::<u64>()),
            "{}",
            text(&result.stderr)
        );
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_runs_in_parallel_are_all_correct() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let codes: Vec<String> = (0..10).map(|i| format!("print({i} * {i})")).collect();
        let options = RunOptions::default();
        let runs = codes
            .iter()
            .map(|code| engine.run_ephemeral(Task::Python(code), &options));
        let results = futures_util::future::join_all(runs).await;
        for (i, result) in results.into_iter().enumerate() {
            let result = result.expect("run");
            assert_eq!(text(&result.stdout), format!("{}\n", i * i));
        }
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_kills_its_runner_is_reported_and_the_session_recovers() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let result = run(&engine, "import os\nos._exit(5)").await;
        assert_eq!(result.exit_code, 5);
        assert!(result.state_lost);

        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        // A runner that dies is replaced in the same sandbox: variables go, files stay.
        in_session(&engine, &session, "x = 1\nopen('kept.txt', 'w').write('kept')").await;
        for death in ["import os\nos._exit(7)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"] {
            let died = in_session(&engine, &session, death).await;
            assert!(died.state_lost && !died.workspace_lost, "{died:?}");
            assert!(died.exit_code == 7 || died.exit_code == 137, "{died:?}");
            let after = in_session(&engine, &session, "print('x' in globals(), open('kept.txt').read())").await;
            assert_eq!(text(&after.stdout), "False kept\n", "{after:?}");
            assert!(!after.state_lost, "the death was reported once: {after:?}");
            in_session(&engine, &session, "x = 1").await;
        }
        // Garbage on every descriptor the code can find, the protocol stream included.
        let garbage = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\xff\\xff\\xff\\xffjunk')\n    except OSError:\n        pass\nimport time; time.sleep(1)";
        let broken = engine.execute_in_session(Scope::Server, &session, Task::Python(garbage), &RunOptions::default()).await;
        assert!(broken.is_err(), "a broken protocol is an error: {broken:?}");
        let after = in_session(&engine, &session, "print('recovered')").await;
        assert_eq!(text(&after.stdout), "recovered\n");
        assert!(after.state_lost && after.workspace_lost, "a broken protocol restarts the whole sandbox");
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

/// The code's forgery of the host's signal: pid 1's /proc directory as a pidfd, and a siginfo of
/// the caller's making (SI_QUEUE, sender pid 0), as issue 44's review found. `SIGNAME` is replaced.
/// It prints what the call answered; a sent signal is waited for until pid 1 has taken it (its
/// pending set, runc's /proc; gVisor never lets it through).
const FORGED_PIDFD_SIGNAL: &str = r"
import ctypes, errno, os, signal, struct
libc = ctypes.CDLL(None, use_errno=True)
info = ctypes.create_string_buffer(128)
struct.pack_into('iii', info, 0, signal.SIGNAME, 0, -1)
init = os.open('/proc/1', os.O_RDONLY | os.O_DIRECTORY)
if libc.syscall(424, init, signal.SIGNAME, info, 0) == 0:
    print('sent')
    pending = lambda: [l for l in open('/proc/1/status') if l.startswith('ShdPnd:') and int(l.split()[1], 16)]
    while pending():
        pass
else:
    print(errno.errorcode[ctypes.get_errno()])
";

/// The same forgeries with rt_sigqueueinfo, run by `docker exec` (a process of the sandbox's user
/// in its pid namespace, outside the runner's seccomp filter): only the supervisor's own check of
/// the sender stands. It then orphans a process to pid 1 and waits until pid 1 has reaped it: pid
/// 1 takes pending signals lowest first, so SIGUSR2 and SIGTERM were taken before that SIGCHLD.
const FORGED_QUEUED_SIGNALS: &str = r"
import ctypes, os, signal, struct
libc = ctypes.CDLL(None, use_errno=True)
number = {'x86_64': 129, 'aarch64': 138}[os.uname().machine]
for signum in (signal.SIGUSR2, signal.SIGTERM):
    info = ctypes.create_string_buffer(128)
    struct.pack_into('iii', info, 0, signum, 0, -1)
    assert libc.syscall(number, 1, signum, info) == 0, ctypes.get_errno()
r, w = os.pipe()
child = os.fork()
if child == 0:
    orphan = os.fork()
    if orphan == 0:
        os._exit(0)
    os.write(w, str(orphan).encode())
    os._exit(0)
os.waitpid(child, 0)
orphan = int(os.read(r, 16))
while os.path.exists('/proc/%d' % orphan):
    pass
print('queued and reaped')
";

/// Set-ID bits refused (EPERM) however a file gets its mode; ordinary modes still given.
const SET_ID_FILES: &str = r"
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
print(oct(os.stat('plain').st_mode), oct(os.stat('made').st_mode), sorted(os.listdir('.')))
";

/// Issue 44: the code cannot pass for the host (a forged signal to pid 1 ends nothing and wipes
/// nothing), nor make a set-ID file; the host's own signals still work (SIGTERM: `docker stop`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_cannot_pass_for_the_host_or_make_set_id_files() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(
            &engine,
            &session,
            "kept = 42\nopen('kept.txt', 'w').write('kept')",
        )
        .await;
        for signum in ["SIGUSR2", "SIGTERM"] {
            let forged = in_session(
                &engine,
                &session,
                &FORGED_PIDFD_SIGNAL.replace("SIGNAME", signum),
            )
            .await;
            assert_eq!(text(&forged.stdout), "ENOSYS\n", "{signum}: {forged:?}");
            let after = in_session(&engine, &session, "print(kept, open('kept.txt').read())").await;
            assert_eq!(
                text(&after.stdout),
                "42 kept\n",
                "after a forged {signum}: {after:?}"
            );
            assert!(!after.state_lost && !after.workspace_lost, "{after:?}");
        }

        let (containers, _) =
            labelled("io.python-code-sandbox.instance", &engine.owner().instance).await;
        assert_eq!(containers.len(), 1, "{containers:?}");
        // Bounded: under gVisor an exec whose container ends (a supervisor that obeyed) never
        // returns (a guard against a hang, not a timing assertion).
        let exec = tokio::process::Command::new("docker")
            .args([
                "exec",
                &containers[0],
                "python3",
                "-c",
                FORGED_QUEUED_SIGNALS,
            ])
            .kill_on_drop(true)
            .output();
        let exec = tokio::time::timeout(Duration::from_secs(60), exec)
            .await
            .expect("the forgeries end, and the sandbox with them only if the supervisor obeyed")
            .expect("docker exec runs");
        assert_eq!(
            text(&exec.stdout),
            "queued and reaped\n",
            "{}",
            text(&exec.stderr)
        );
        let after = in_session(&engine, &session, "print(kept, open('kept.txt').read())").await;
        assert_eq!(
            text(&after.stdout),
            "42 kept\n",
            "after queued forgeries: {after:?}"
        );
        assert!(!after.state_lost && !after.workspace_lost, "{after:?}");

        let set_id = in_session(&engine, &session, SET_ID_FILES).await;
        assert_eq!(
            text(&set_id.stdout),
            "chmod ok ok ok EPERM EPERM EPERM\nfchmod EPERM ok EPERM\n\
             create EPERM EPERM EPERM ok ENOSYS\n0o100700 0o100755 ['kept.txt', 'made', 'plain']\n",
            "{set_id:?}"
        );

        // The host's SIGTERM still ends the sandbox at once, the supervisor's way (status 143).
        let stopped = std::process::Command::new("docker")
            .args(["stop", "-t", "60", &containers[0]])
            .output()
            .expect("docker stop runs");
        assert!(stopped.status.success(), "{}", text(&stopped.stderr));
        let ended = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Python("print(1)"),
                &RunOptions::default(),
            )
            .await;
        let podman = engine
            .backend()
            .info()
            .await
            .is_ok_and(|info| info.kind == EngineKind::Podman);
        match &ended {
            Err(EngineError::SandboxLost(reason) | EngineError::SessionEnded { reason, .. })
                if reason.contains("exit status 143") => {}
            // Podman removes a container stopped from outside before its status can be read
            // (its 404, or its 500 "no such container" when the removal is under way): that it
            // is gone is what the stop did, and the session ends (its volume goes with it).
            Err(EngineError::SandboxLost(reason))
                if podman && reason.contains("removed from outside") => {}
            other => panic!("the host's SIGTERM did not end the sandbox: {other:?}"),
        }
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_children_cannot_speak_the_protocol() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        let code = "import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n    print('parent')";
        let result = in_session(&engine, &session, code).await;
        assert_eq!(text(&result.stdout), "child\nparent\n");
        let next = in_session(&engine, &session, "print('next')").await;
        assert_eq!(text(&next.stdout), "next\n");
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_commands_run_with_the_same_capture() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        let result = engine
            .execute_in_session(
                Scope::Server,
                &session,
                Task::Shell("echo out; echo err >&2; id -u; exit 4"),
                &RunOptions::default(),
            )
            .await
            .expect("shell");
        assert_eq!(
            (
                text(&result.stdout).as_str(),
                text(&result.stderr).as_str(),
                result.exit_code
            ),
            ("out\n1000\n", "err\n", 4)
        );
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sandbox_carries_every_hardening_field() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        let inspected = docker()
            .await
            .inspect_container(&session, None)
            .await
            .expect("inspect");
        let host = inspected.host_config.expect("host config");
        let config = inspected.config.expect("config");
        let limits = &engine.config().limits;
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert!(host.cap_add.unwrap_or_default().is_empty());
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_string()])
        );
        assert_eq!(host.pids_limit, Some(limits.pids as i64));
        assert_eq!(host.memory, Some(limits.memory_bytes as i64));
        assert_eq!(host.memory_swap, host.memory, "no swap");
        assert_eq!(host.nano_cpus, Some((limits.cpus * 1e9) as i64));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert!(host
            .tmpfs
            .unwrap_or_default()
            .get("/tmp")
            .is_some_and(|o| o.contains("size=")));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        // The runner's supervisor is pid 1, not Docker's init.
        assert_eq!(host.init, Some(false));
        assert_eq!(host.ipc_mode.as_deref(), Some("private"));
        assert_eq!(
            host.log_config.and_then(|l| l.typ).as_deref(),
            Some("none"),
            "nothing the sandbox prints is logged on the host's disk"
        );
        let core = host
            .ulimits
            .unwrap_or_default()
            .into_iter()
            .find(|u| u.name.as_deref() == Some("core"));
        assert_eq!(core.and_then(|u| u.hard), Some(0), "no core dumps");
        assert_eq!(host.privileged, Some(false));
        let mounts = inspected.mounts.unwrap_or_default();
        let workspace = mounts
            .iter()
            .find(|m| m.destination.as_deref() == Some("/workspace"))
            .expect("workspace mount");
        assert_eq!(
            workspace.typ.as_ref().map(|t| t.to_string()).as_deref(),
            Some("volume")
        );
        // Seen from inside: a tmpfs of the configured size, and the runner's parent is pid 1.
        let inside = in_session(
            &engine,
            &session,
            "import os\nfs = os.statvfs('/workspace')\n\
             kind = [l.split()[2] for l in open('/proc/mounts') if l.split()[1] == '/workspace']\n\
             print(fs.f_blocks * fs.f_frsize, kind, os.getppid())",
        )
        .await;
        // gVisor serves the host's tmpfs through its gofer (9p).
        let kind = if under_gvisor(&engine).await {
            "9p"
        } else {
            "tmpfs"
        };
        assert_eq!(
            text(&inside.stdout),
            format!("{} ['{kind}'] 1\n", limits.workspace_bytes)
        );
        let labels = config.labels.unwrap_or_default();
        assert_eq!(
            labels.get("io.python-code-sandbox.instance"),
            Some(&engine.owner().instance)
        );
        // The agent's code is never in argv: only the fixed bootstrap is.
        assert_eq!(config.cmd, Some(bootstrap_command()));
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_copy_in_and_out_of_a_session() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        let mut archive = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o644);
        header.set_uid(1000);
        header.set_gid(1000);
        header.set_cksum();
        archive
            .append_data(&mut header, "input.txt", &b"hello"[..])
            .expect("tar");
        let backend = engine.backend();
        let id = SandboxId(session.clone());
        backend
            .copy_in(&id, "/workspace", archive.into_inner().expect("tar").into())
            .await
            .expect("copy in");
        let result = in_session(
            &engine,
            &session,
            "print(open('input.txt').read())\nopen('out.txt', 'w').write('made inside')",
        )
        .await;
        assert_eq!(text(&result.stdout), "hello\n");
        let out = backend
            .copy_out(&id, "/workspace/out.txt", 1 << 20)
            .await
            .expect("copy out");
        let mut entries = tar::Archive::new(&out[..]);
        let mut entry = entries
            .entries()
            .expect("entries")
            .next()
            .expect("one entry")
            .expect("entry");
        let mut content = String::new();
        std::io::Read::read_to_string(&mut entry, &mut content).expect("read");
        assert_eq!(content, "made inside");
        assert!(
            backend
                .copy_out(&id, "/workspace/out.txt", 10)
                .await
                .is_err(),
            "the size bound holds"
        );
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

/// A spec of the engine's image with nothing else (no mounts, no network of its own): a
/// container the tests create through the backend directly.
fn bare_spec(engine: &Engine, labels: BTreeMap<String, String>) -> SandboxSpec {
    SandboxSpec {
        image: engine.config().image.clone(),
        limits: engine.config().limits.clone(),
        network: engine.config().network,
        ca_bundle: None,
        mounts: Vec::new(),
        volumes: Vec::new(),
        runtime: None,
        command: bootstrap_command(),
        labels,
        network_name: None,
        env: Vec::new(),
        maintenance: false,
        open_files: None,
        user: None,
        roots: None,
        no_forwarding: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cancelled_before_the_engine_answers_leaves_the_last_look_to_the_warden() {
    // A create dropped before the engine's answer (a cancelled call, a refill stopped at shutdown)
    // may still be carried out after the server's last look: its shutdown then does not call
    // itself clean, so its warden looks until the engine is quiet. A loaded Podman made such a
    // container seconds after a server had gone.
    if skip_without_engine() {
        return;
    }
    let backend = std::sync::Arc::new(DockerBackend::new());
    let engine = Engine::new(backend.clone(), common::test_config());
    let instance = engine.owner().instance.clone();
    let spec = bare_spec(&engine, engine.owner().labels("session"));
    no_hang(async {
        // Answered, created or not, a create leaves no doubt.
        backend.create(&spec).await.expect("create");
        assert!(!backend.abandoned_a_create());
        // Polled once (its request under way, or its connection) and dropped.
        let dropped = tokio::time::timeout(std::time::Duration::ZERO, backend.create(&spec)).await;
        assert!(
            dropped.is_err(),
            "a create is never answered at its first poll"
        );
        assert!(backend.abandoned_a_create());
        assert!(
            !engine.shutdown().await,
            "the shutdown is not called clean: what the dropped create makes may come later"
        );
        // The warden's part, here: whatever the engine still makes goes.
        let mut quiet_since = std::time::Instant::now();
        while quiet_since.elapsed() < std::time::Duration::from_secs(3) {
            let (left, _) = labelled(LABEL_INSTANCE, &instance).await;
            for id in &left {
                let _ = backend.destroy(&SandboxId(id.clone())).await;
                quiet_since = std::time::Instant::now();
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_for_a_bind_source_that_vanished_leaves_no_volume() {
    // A client's root can vanish between the engine's first check of a bind's source and its
    // mounting (a rename on the host). Docker 20.10 then refuses the create after it made the
    // sandbox's tmpfs volumes, and keeps them: the CI failure of the adversarial case where a
    // root flips. Such a create leaves nothing, whatever the engine's order of work.
    if skip_without_engine() {
        return;
    }
    let backend = std::sync::Arc::new(DockerBackend::new());
    let engine = Engine::new(backend.clone(), common::test_config());
    let dir = std::env::temp_dir().join(format!("pcs-flip-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).expect("a directory of the test's own");
    let flipping = dir.join("root");
    let mut spec = bare_spec(&engine, engine.owner().labels("session"));
    spec.mounts
        .push(python_code_sandbox::config::OperatorMount {
            host: flipping.clone(),
            container: "/mnt/roots/flipping".to_string(),
            read_only: false,
        });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::create_dir(&flipping);
                std::thread::sleep(Duration::from_micros(500));
                let _ = std::fs::remove_dir(&flipping);
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let (mut created, mut refused) = (0, 0);
    no_hang(async {
        for _ in 0..60 {
            match backend.create(&spec).await {
                Ok(id) => {
                    created += 1;
                    backend.destroy(&id).await.expect("destroy");
                }
                Err(_) => refused += 1,
            }
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().expect("the flipper ends");
    eprintln!("60 creates while the bind's source flipped: {created} created, {refused} refused");
    let _ = std::fs::remove_dir_all(&dir);
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_of_a_dead_server_are_removed_and_live_ones_kept() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    let backend = DockerBackend::new();
    no_hang(async {
        // A sandbox labelled as made by a process of this boot that is not running.
        let dead_owner = python_code_sandbox::engine::owner::Owner::current();
        let mut labels: BTreeMap<String, String> = dead_owner.labels("session");
        labels.insert(LABEL_PID.into(), "4194304".into()); // above any pid_max
        labels.insert(LABEL_PID_START.into(), "1".into());
        let spec = bare_spec(&engine, labels);
        let dead = backend.create(&spec).await.expect("create");
        // And an installer's egress network it left.
        let network = format!("pcs-test-egress-{}", dead_owner.instance);
        backend
            .create_network(&network, true, None, &spec.labels)
            .await
            .expect("network");
        // And one of a live server (this test process, another instance).
        let live_owner = python_code_sandbox::engine::owner::Owner::current();
        let live = backend
            .create(&SandboxSpec {
                labels: live_owner.labels("session"),
                ..spec.clone()
            })
            .await
            .expect("create");

        let removed = engine.remove_leftovers().await.expect("cleanup");
        assert!(removed >= 1);
        let (left, _) = labelled("io.python-code-sandbox.instance", &dead_owner.instance).await;
        assert!(left.is_empty(), "the dead server's sandbox is removed");
        let networks = std::process::Command::new("docker")
            .args([
                "network",
                "ls",
                "-q",
                "--filter",
                &format!("name={network}"),
            ])
            .output()
            .expect("docker network ls");
        assert!(networks.stdout.is_empty(), "its network is removed");
        let (kept, _) = labelled("io.python-code-sandbox.instance", &live_owner.instance).await;
        assert_eq!(
            kept,
            vec![live.0.clone()],
            "a live server's sandbox is kept"
        );
        backend.destroy(&live).await.expect("destroy");
        backend.destroy(&dead).await.expect("destroy is idempotent");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_every_sandbox_of_the_instance() {
    if skip_without_engine() {
        return;
    }
    let engine = engine();
    no_hang(async {
        let a = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        let _b = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        in_session(&engine, &a, "x = 1").await;
        assert_eq!(engine.sessions(Scope::Server).len(), 2);
        engine.shutdown().await;
        assert!(engine.sessions(Scope::Server).is_empty());
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_killed_from_outside_is_not_handed_out() {
    if skip_without_engine() {
        return;
    }
    // runc: the code finds its container id in /proc/self/cgroup (gVisor shows none).
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.pool_size = 1;
        c.runtime = Some("runc".to_string());
    }));
    engine.start_pool();
    no_hang(async {
        while engine.pool_ready() < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let (pooled, _) =
            labelled("io.python-code-sandbox.instance", &engine.owner().instance).await;
        assert_eq!(pooled.len(), 1);
        docker()
            .await
            .kill_container(
                &pooled[0],
                None::<bollard::query_parameters::KillContainerOptions>,
            )
            .await
            .expect("kill");
        let result = run(&engine, "print('served by a live sandbox')").await;
        assert_eq!(text(&result.stdout), "served by a live sandbox\n");
        // The dead one was removed rather than used.
        engine.settle().await;
        let (left, _) = labelled("io.python-code-sandbox.instance", &engine.owner().instance).await;
        assert!(!left.contains(&pooled[0]), "the killed sandbox is removed");
        // And the pool hands out fresh sandboxes: nothing of the previous run is visible.
        let fresh = run(&engine, "import os\nprint(os.listdir('.'))").await;
        assert_eq!(text(&fresh.stdout), "[]\n");
    })
    .await;
    engine.shutdown().await;
    assert_nothing_left(&engine).await;
}

/// Under gVisor (`SANDBOX_RUNTIME=runsc`): the runner works, and the kernel the code sees is
/// gVisor's, not the host's. The test script registers runsc and sets `PCS_TEST_RUNTIME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_run_under_another_runtime() {
    if skip_without_engine() {
        return;
    }
    let Ok(runtime) = std::env::var("PCS_TEST_RUNTIME") else {
        eprintln!("not run: PCS_TEST_RUNTIME is not set (scripts/test.sh sets it after registering runsc)");
        return;
    };
    let engine = engine_with(|c| {
        c.runtime = Some(runtime.clone());
        c.limits.timeout = std::time::Duration::from_secs(3);
        // Small enough that the memory bomb below reaches it well within the timeout.
        c.limits.memory_bytes = 256 << 20;
        c.limits.workspace_bytes = 64 << 20;
    });
    no_hang(async {
        let host_kernel = std::fs::read_to_string("/proc/version").expect("host kernel");
        let seen = run(&engine, "import os\nprint(open('/proc/version').read().strip())\nimport socket\nprint(os.getuid(), sorted(name for _, name in socket.if_nameindex()))").await;
        let stdout = text(&seen.stdout);
        let kernel = stdout.lines().next().unwrap_or_default();
        assert_ne!(kernel, host_kernel.trim(), "the code must not see the host's kernel");
        if runtime == "runsc" {
            assert!(kernel.starts_with("Linux version 4.4.0"), "gVisor's kernel: {kernel}");
        }
        assert_eq!(stdout.lines().nth(1), Some("1000 ['lo']"));
        let root = run(&engine, "open('/home/sandbox/evil', 'w')").await;
        assert!(text(&root.stderr).contains("Read-only file system"), "{}", text(&root.stderr));
        if runtime == "runsc" {
            // Out of memory, gVisor's kernel dies with the code: the sandbox is lost, saying why.
            let bomb = engine
                .run_ephemeral(Task::Python("x = []\nwhile True:\n    x.append(bytearray(8 << 20))"), &RunOptions::default())
                .await;
            match bomb {
                Err(EngineError::SandboxLost(reason)) => assert!(reason.contains("out of memory"), "{reason}"),
                Ok(execution) => assert!(execution.out_of_memory, "{execution:?}"),
                Err(e) => panic!("the memory bomb: {e}"),
            }
        }

        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        in_session(&engine, &session, "kept = 'yes'").await;
        let looped = in_session(&engine, &session, "while True: pass").await;
        assert!(looped.timed_out && !looped.state_lost, "{looped:?}");
        let after = in_session(&engine, &session, "print(kept)").await;
        assert_eq!(text(&after.stdout), "yes\n");
        // A fork bomb is contained either way: under runc the pids limit stops it and the
        // timeout ends it; under gVisor the limit applies to the sandbox kernel's own threads, so
        // that kernel dies, and the session ends saying so.
        let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";
        match engine.execute_in_session(Scope::Server, &session, Task::Python(bomb), &RunOptions::default()).await {
            Ok(bombed) => {
                assert!(bombed.timed_out, "{bombed:?}");
                let next = in_session(&engine, &session, "print('next')").await;
                assert_eq!(text(&next.stdout), "next\n");
            }
            Err(EngineError::SandboxLost(reason)) => {
                let next = engine.execute_in_session(Scope::Server, &session, Task::Python("print(1)"), &RunOptions::default()).await;
                assert!(
                    matches!(&next, Err(EngineError::SessionEnded { reason: r, .. }) if *r == reason),
                    "{next:?}"
                );
                return;
            }
            Err(e) => panic!("the fork bomb: {e}"),
        }
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

/// With no `SANDBOX_RUNTIME`, the strongest runtime the engine has runs the code: gVisor where it
/// can (here `runsc` without a network, and `runsc-net` in host-network mode for a networked
/// policy, as scripts/runsc.sh registers them), runc where it cannot give what a setting needs,
/// and a runtime the operator names is obeyed or refused, never weakened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strongest_runtime_runs_the_code_by_default() {
    if skip_without_engine() {
        return;
    }
    if std::env::var("PCS_TEST_RUNTIME").ok().as_deref() != Some("runsc") {
        eprintln!("not run: gVisor is not registered (scripts/test.sh registers it and sets PCS_TEST_RUNTIME=runsc)");
        return;
    }
    let host_kernel = std::fs::read_to_string("/proc/version").expect("host kernel");
    let kernel = "print(open('/proc/version').read().strip())";
    no_hang(async {
        let default = engine_with(|c| c.pool_size = 0);
        let platform = default.platform().await.expect("the engine is usable");
        assert!(platform.code.gvisor, "{:?}", platform.code);
        assert_eq!(platform.code.name.as_deref(), Some("runsc"));
        let seen = run(&default, kernel).await;
        assert!(
            text(&seen.stdout).starts_with("Linux version 4.4.0"),
            "{}",
            text(&seen.stdout)
        );
        assert_nothing_left(&default).await;

        let networked = engine_with(|c| {
            c.pool_size = 0;
            c.network = NetworkPolicy::Bridge;
        });
        let platform = networked.platform().await.expect("the engine is usable");
        assert!(platform.code.gvisor, "{:?}", platform.code);
        assert_eq!(platform.code.name.as_deref(), Some("runsc-net"));
        assert!(
            platform.code.why.contains("host-network mode"),
            "{}",
            platform.code.why
        );
        let seen = run(&networked, kernel).await;
        assert!(
            text(&seen.stdout).starts_with("Linux version 4.4.0"),
            "{}",
            text(&seen.stdout)
        );
        assert_nothing_left(&networked).await;

        // A pids limit gVisor cannot live with still gets runc, said so.
        let few_pids = engine_with(|c| {
            c.pool_size = 0;
            c.network = NetworkPolicy::Bridge;
            c.limits.pids = 64;
        });
        let platform = few_pids.platform().await.expect("the engine is usable");
        assert!(!platform.code.gvisor, "{:?}", platform.code);
        let seen = run(&few_pids, kernel).await;
        assert_eq!(text(&seen.stdout).trim(), host_kernel.trim());
        assert_nothing_left(&few_pids).await;

        for (runtime, network, expected) in [
            ("no-such-runtime", NetworkPolicy::None, "not registered"),
            ("no-such-runtime", NetworkPolicy::Bridge, "not registered"),
        ] {
            let named = engine_with(|c| {
                c.pool_size = 0;
                c.runtime = Some(runtime.to_string());
                c.network = network;
            });
            match named
                .run_ephemeral(Task::Python("print(1)"), &RunOptions::default())
                .await
            {
                Err(EngineError::Refused(refusal)) => {
                    assert!(refusal.to_string().contains(expected), "{refusal}")
                }
                other => panic!("{runtime} with {network:?} was not refused: {other:?}"),
            }
            assert_nothing_left(&named).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_sandbox_serves_only_the_same_callers_next_run_and_only_once_emptied() {
    if skip_without_engine() {
        return;
    }
    let engine = std::sync::Arc::new(engine_with(|c| {
        c.pool_size = 1;
        c.runtime = Some("runc".to_string());
    }));
    engine.start_pool();
    let caller = |key: &str| RunOptions {
        reuse: Some(key.to_string()),
        ..RunOptions::default()
    };
    // Under runc a sandbox's cgroup names its container.
    let container_of = |out: &str| {
        out.split(|c: char| !c.is_ascii_hexdigit())
            .find(|part| part.len() == 64)
            .unwrap_or_else(|| panic!("no container id in {out:?}"))
            .to_string()
    };
    const WHERE: &str = "print(open('/proc/self/cgroup').read())";
    no_hang(async {
        let first = engine
            .run_ephemeral(
                Task::Python(&format!(
                    "import subprocess\nsubprocess.Popen(['sleep', '300'])\n\
                     open('/workspace/left', 'w').write('x')\n{WHERE}"
                )),
                &caller("a"),
            )
            .await
            .expect("first run");
        let used = container_of(&text(&first.stdout));
        while engine.recycled_waiting() < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Another caller never gets it.
        let other = engine
            .run_ephemeral(Task::Python(WHERE), &caller("b"))
            .await
            .expect("another caller's run");
        assert_ne!(container_of(&text(&other.stdout)), used);
        // The same caller does, with nothing of its last run in it.
        let again = engine
            .run_ephemeral(
                Task::Python(&format!(
                    "import os\nprint(os.listdir('/workspace'), [p for p in os.listdir('/proc') \
                     if p.isdigit() and open(f'/proc/{{p}}/cmdline').read().startswith('sleep')])\n{WHERE}"
                )),
                &caller("a"),
            )
            .await
            .expect("the same caller's run");
        let out = text(&again.stdout);
        assert_eq!(container_of(&out), used, "the recycled sandbox served it: {out}");
        assert!(out.starts_with("[] []\n"), "nothing of the last run is left: {out}");
        // A run stopped at its limit whose runner obeyed the interrupt is recycled like any other.
        let stop_at = |seconds| RunOptions {
            timeout: Some(std::time::Duration::from_secs(seconds)),
            ..caller("a")
        };
        // Two wait: b's and a's (b's stays, well within its idle time).
        while engine.recycled_waiting() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let timed_out = engine
            .run_ephemeral(
                Task::Python(&format!("{WHERE}\nimport time\ntime.sleep(60)")),
                &stop_at(2),
            )
            .await
            .expect("a run out of time");
        assert!(timed_out.timed_out && !timed_out.state_lost, "{timed_out:?}");
        assert_eq!(container_of(&text(&timed_out.stdout)), used);
        // One whose processes had to be killed (it ignored the interrupt) is not: its sandbox goes.
        while engine.recycled_waiting() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let killed = engine
            .run_ephemeral(
                Task::Python(
                    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
                ),
                &stop_at(2),
            )
            .await
            .expect("a run killed at its limit");
        assert!(killed.timed_out && killed.state_lost, "{killed:?}");
        engine.settle().await;
        assert!(
            docker().await.inspect_container(&used, None).await.is_err(),
            "the sandbox of a run whose processes were killed was removed"
        );
    })
    .await;
    engine.shutdown().await;
    assert_nothing_left(&engine).await;
}
