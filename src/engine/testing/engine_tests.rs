//! Sessions, the warm pool, expiry, the reaper and shutdown, on the fake backend.

use std::collections::BTreeMap;
use std::time::Duration;

use super::fake_backend::Event;
use super::{engine_with, eventually, within};
use crate::engine::owner::{LABEL_BOOT, LABEL_HOST, LABEL_INSTANCE, LABEL_PID_START};
use crate::engine::sessions::{ClientId, Scope};
use crate::engine::{EngineError, RunOptions, Task};

const LIMIT: Duration = Duration::from_secs(30);

fn stdout(execution: &crate::engine::Execution) -> String {
    String::from_utf8_lossy(&execution.stdout).into_owned()
}

#[tokio::test]
async fn an_ephemeral_run_leaves_no_sandbox() {
    let (engine, fake) = engine_with(|_| {});
    let execution = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print(6 * 7)"), &RunOptions::default()),
    )
    .await
    .expect("run");
    assert_eq!(stdout(&execution), "42\n");
    engine.settle().await;
    assert!(fake.sandboxes().is_empty());
    assert_eq!(fake.count(|e| matches!(e, Event::Destroyed(_))), 1);
}

#[tokio::test]
async fn a_session_keeps_state_until_it_is_stopped() {
    let (engine, fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let id = within(LIMIT, engine.create_session(Scope::Server, &options))
        .await
        .expect("create");
    engine
        .execute_in_session(Scope::Server, &id, Task::Python("total = 40"), &options)
        .await
        .expect("execute");
    // A unique prefix of at least 12 characters names the session too.
    let prefix: String = id.chars().take(12).collect();
    let execution = engine
        .execute_in_session(
            Scope::Server,
            &prefix,
            Task::Python("print(total + 2)"),
            &options,
        )
        .await
        .expect("execute");
    assert_eq!(stdout(&execution), "42\n");
    assert_eq!(engine.sessions(Scope::Server).len(), 1);
    assert_eq!(
        engine.stop_session(Scope::Server, &id).await.expect("stop"),
        id
    );
    assert!(engine.sessions(Scope::Server).is_empty());
    assert!(fake.sandboxes().is_empty());
    let after = engine
        .execute_in_session(Scope::Server, &id, Task::Python("print(1)"), &options)
        .await;
    assert!(
        matches!(after, Err(EngineError::UnknownSession(_))),
        "{after:?}"
    );
}

#[tokio::test]
async fn unknown_and_malformed_session_ids_are_refused() {
    let (engine, _fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let short = engine
        .execute_in_session(Scope::Server, "abc", Task::Python("1"), &options)
        .await;
    assert!(
        matches!(short, Err(EngineError::MalformedSessionId(_))),
        "{short:?}"
    );
    let odd = engine
        .execute_in_session(
            Scope::Server,
            "not/an/id/at/all",
            Task::Python("1"),
            &options,
        )
        .await;
    assert!(
        matches!(odd, Err(EngineError::MalformedSessionId(_))),
        "{odd:?}"
    );
    let unknown = engine.stop_session(Scope::Server, "0123456789abcdef").await;
    assert!(
        matches!(unknown, Err(EngineError::UnknownSession(_))),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn the_number_of_live_sessions_is_limited() {
    let (engine, _fake) = engine_with(|config| config.sessions.max_sessions = 2);
    let options = RunOptions::default();
    let first = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("first");
    engine
        .create_session(Scope::Server, &options)
        .await
        .expect("second");
    let third = engine.create_session(Scope::Server, &options).await;
    assert!(
        matches!(third, Err(EngineError::TooManySessions(2))),
        "{third:?}"
    );
    engine
        .stop_session(Scope::Server, &first)
        .await
        .expect("stop");
    engine
        .create_session(Scope::Server, &options)
        .await
        .expect("room again");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_client_reaches_only_its_own_sessions() {
    let (engine, fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let (alice, bob) = (ClientId::new(), ClientId::new());
    let id = engine
        .create_session(Scope::Client(&alice), &options)
        .await
        .expect("create");
    assert_eq!(engine.sessions(Scope::Client(&alice)).len(), 1);
    assert!(engine.sessions(Scope::Client(&bob)).is_empty());
    assert_eq!(engine.sessions(Scope::Server).len(), 1);
    let foreign = engine
        .execute_in_session(Scope::Client(&bob), &id, Task::Python("1"), &options)
        .await;
    assert!(
        matches!(foreign, Err(EngineError::UnknownSession(_))),
        "{foreign:?}"
    );
    let stop = engine.stop_session(Scope::Client(&bob), &id).await;
    assert!(
        matches!(stop, Err(EngineError::UnknownSession(_))),
        "{stop:?}"
    );
    engine
        .execute_in_session(Scope::Client(&alice), &id, Task::Python("1"), &options)
        .await
        .expect("the owner's call");
    // The client goes away: its sessions end, and later calls say why.
    assert_eq!(engine.end_client(&alice), 1);
    let ended = engine
        .execute_in_session(Scope::Client(&alice), &id, Task::Python("1"), &options)
        .await;
    match ended {
        Err(EngineError::SessionEnded { reason, .. }) => {
            assert!(reason.contains("disconnected"), "{reason}")
        }
        other => panic!("expected an ended session, got {other:?}"),
    }
    engine.settle().await;
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn a_session_lost_from_outside_ends_and_says_why() {
    let (engine, fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let id = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("create");
    let sandbox = fake.sandboxes().pop().expect("its sandbox");
    fake.stop_from_outside(&sandbox, 137, false).await;
    let lost = engine
        .execute_in_session(Scope::Server, &id, Task::Python("1"), &options)
        .await;
    assert!(matches!(lost, Err(EngineError::SandboxLost(_))), "{lost:?}");
    let later = engine
        .execute_in_session(Scope::Server, &id, Task::Python("1"), &options)
        .await;
    match later {
        Err(EngineError::SessionEnded { reason, .. }) => {
            assert!(reason.contains("killed from outside"), "{reason}")
        }
        other => panic!("expected an ended session, got {other:?}"),
    }
    engine.settle().await;
    assert!(fake.sandboxes().is_empty(), "the lost sandbox is removed");
}

#[tokio::test]
async fn idle_sessions_expire() {
    let (engine, fake) = engine_with(|config| {
        config.sessions.idle_timeout = Duration::from_millis(300);
    });
    let options = RunOptions::default();
    let id = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("create");
    assert_eq!(engine.reap_expired_sessions().await, 0, "not idle yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(engine.reap_expired_sessions().await, 1);
    assert!(fake.sandboxes().is_empty());
    match engine
        .execute_in_session(Scope::Server, &id, Task::Python("1"), &options)
        .await
    {
        Err(EngineError::SessionEnded { reason, .. }) => {
            assert!(reason.contains("idle"), "{reason}")
        }
        other => panic!("expected an ended session, got {other:?}"),
    }
}

#[tokio::test]
async fn a_session_running_code_is_not_idle() {
    let (engine, _fake) = engine_with(|config| {
        config.sessions.idle_timeout = Duration::from_millis(200);
    });
    let options = RunOptions::default();
    let id = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("create");
    let running = engine.execute_in_session(
        Scope::Server,
        &id,
        Task::Python("import time\ntime.sleep(1)\nprint('done')"),
        &options,
    );
    let reaping = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        engine.reap_expired_sessions().await
    };
    let (execution, reaped) = tokio::join!(running, reaping);
    assert_eq!(reaped, 0);
    assert_eq!(stdout(&execution.expect("execute")), "done\n");
    engine.shutdown().await;
}

#[tokio::test]
async fn sessions_expire_at_their_maximum_lifetime_even_when_used() {
    let (engine, fake) = engine_with(|config| {
        config.sessions.max_lifetime = Duration::from_millis(600);
    });
    let options = RunOptions::default();
    let id = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("create");
    tokio::time::sleep(Duration::from_millis(300)).await;
    engine
        .execute_in_session(Scope::Server, &id, Task::Python("1"), &options)
        .await
        .expect("execute");
    assert_eq!(engine.reap_expired_sessions().await, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(engine.reap_expired_sessions().await, 1);
    assert!(fake.sandboxes().is_empty());
    match engine
        .execute_in_session(Scope::Server, &id, Task::Python("1"), &options)
        .await
    {
        Err(EngineError::SessionEnded { reason, .. }) => {
            assert!(reason.contains("maximum lifetime"), "{reason}")
        }
        other => panic!("expected an ended session, got {other:?}"),
    }
}

#[tokio::test]
async fn the_pool_hands_out_a_live_sandbox_and_refills() {
    let (engine, fake) = engine_with(|config| config.pool_size = 1);
    engine.start_pool();
    eventually("a pooled sandbox", LIMIT, || engine.pool_ready() == 1).await;
    let pooled = fake.sandboxes().pop().expect("the pooled sandbox");
    let execution = engine
        .run_ephemeral(Task::Python("print(1)"), &RunOptions::default())
        .await
        .expect("run");
    assert_eq!(stdout(&execution), "1\n");
    engine.settle().await;
    assert!(
        fake.events().contains(&Event::Destroyed(pooled.clone())),
        "the run used (and removed) the pooled sandbox"
    );
    eventually("a refill", LIMIT, || engine.pool_ready() == 1).await;
    assert_eq!(fake.count(|e| matches!(e, Event::Created(_))), 2);
    engine.shutdown().await;
    assert_eq!(engine.pool_ready(), 0);
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn a_call_that_finds_the_pool_empty_grows_it_within_the_memory_bound() {
    // SANDBOX_POOL_SIZE=1 under a bound that lets demand grow it to 2: a quarter of 128 MiB, at
    // 16 MiB a plain sandbox.
    let (engine, fake) = engine_with(|config| {
        config.pool_size = 1;
        config.pool_max_memory = 128 << 20;
    });
    // The pool is not started yet: both calls find it empty.
    for _ in 0..2 {
        engine
            .run_ephemeral(Task::Python("print(1)"), &RunOptions::default())
            .await
            .expect("a cold run");
    }
    engine.start_pool();
    eventually("the grown pool", LIMIT, || engine.pool_ready() == 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.pool_ready(), 2, "never over its cap");
    engine.shutdown().await;
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn a_dead_pooled_sandbox_is_not_handed_out() {
    let (engine, fake) = engine_with(|config| config.pool_size = 1);
    engine.start_pool();
    eventually("a pooled sandbox", LIMIT, || engine.pool_ready() == 1).await;
    let pooled = fake.sandboxes().pop().expect("the pooled sandbox");
    fake.stop_from_outside(&pooled, 137, false).await;
    let execution = engine
        .run_ephemeral(Task::Python("print(2)"), &RunOptions::default())
        .await
        .expect("run in another sandbox");
    assert_eq!(stdout(&execution), "2\n");
    assert!(!execution.workspace_lost && !execution.state_lost);
    engine.settle().await;
    assert!(
        !fake.sandboxes().contains(&pooled),
        "the dead one is removed"
    );
    engine.shutdown().await;
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn shutdown_waits_for_a_slow_refill_and_leaves_nothing() {
    let (engine, fake) = engine_with(|config| config.pool_size = 2);
    fake.set_start_delay(Duration::from_millis(500));
    engine.start_pool();
    eventually("a start under way", LIMIT, || {
        fake.count(|e| matches!(e, Event::Created(_))) > 0
    })
    .await;
    within(LIMIT, engine.shutdown()).await;
    assert!(fake.sandboxes().is_empty(), "{:?}", fake.events());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        fake.sandboxes().is_empty(),
        "nothing started after shutdown"
    );
    assert_eq!(engine.pool_ready(), 0);
}

#[tokio::test]
async fn shutdown_removes_sessions_the_pool_and_stray_creates() {
    let (engine, fake) = engine_with(|config| config.pool_size = 1);
    engine.start_pool();
    let options = RunOptions::default();
    engine
        .create_session(Scope::Server, &options)
        .await
        .expect("one");
    engine
        .create_session(Scope::Server, &options)
        .await
        .expect("two");
    eventually("a pooled sandbox", LIMIT, || engine.pool_ready() >= 1).await;
    // A create that completed after its request was dropped: only its labels say whose it is.
    let stray = fake.add_foreign(engine.owner().labels("ephemeral"));
    fake.add_storage("ours", engine.owner().labels("session"));
    // Removing what is already gone answers NotFound: shutdown carries on.
    fake.destroy_reports_not_found(true);
    within(LIMIT, engine.shutdown()).await;
    assert!(fake.sandboxes().is_empty(), "{:?}", fake.sandboxes());
    assert!(fake.events().contains(&Event::Destroyed(stray)));
    assert!(fake.storage().is_empty());
    assert!(engine.sessions(Scope::Server).is_empty());
    assert_eq!(fake.running(), 0);
}

/// Labels of a sandbox made by another server instance on this machine, adjusted by `change`.
fn other_server(
    engine: &crate::engine::Engine,
    change: impl FnOnce(&mut BTreeMap<String, String>),
) -> BTreeMap<String, String> {
    let mut labels = engine.owner().labels("session");
    labels.insert(LABEL_INSTANCE.into(), "another-instance".into());
    change(&mut labels);
    labels
}

#[tokio::test]
async fn leftovers_of_dead_servers_are_removed_and_nothing_else() {
    let (engine, fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let ours = engine
        .create_session(Scope::Server, &options)
        .await
        .expect("create");
    let before_boot = fake.add_foreign(other_server(&engine, |l| {
        l.insert(LABEL_BOOT.into(), "an-earlier-boot".into());
    }));
    // This process's pid with another start time: a server whose pid was reused.
    let dead_pid = fake.add_foreign(other_server(&engine, |l| {
        l.insert(LABEL_PID_START.into(), "1".into());
    }));
    // This very process: a live server (another instance of it).
    let live = fake.add_foreign(other_server(&engine, |_| {}));
    let other_host = fake.add_foreign(other_server(&engine, |l| {
        l.insert(LABEL_HOST.into(), "another-host".into());
        l.insert(LABEL_BOOT.into(), "an-earlier-boot".into());
    }));
    let unmanaged = fake.add_foreign(BTreeMap::new());
    fake.add_storage(
        "dead-volume",
        other_server(&engine, |l| {
            l.insert(LABEL_BOOT.into(), "an-earlier-boot".into());
        }),
    );
    fake.add_storage(
        "other-host-volume",
        other_server(&engine, |l| {
            l.insert(LABEL_HOST.into(), "another-host".into());
        }),
    );
    let removed = engine.remove_leftovers().await.expect("remove");
    assert_eq!(removed, 3);
    let left = fake.sandboxes();
    assert!(
        !left.contains(&before_boot) && !left.contains(&dead_pid),
        "{left:?}"
    );
    assert!(left.contains(&live) && left.contains(&other_host) && left.contains(&unmanaged));
    assert_eq!(fake.storage(), ["other-host-volume"]);
    assert_eq!(
        engine.sessions(Scope::Server).len(),
        1,
        "this server's session stays"
    );
    engine
        .execute_in_session(Scope::Server, &ours, Task::Python("1"), &options)
        .await
        .expect("still usable");
    engine.shutdown().await;
}

#[tokio::test]
async fn output_longer_than_a_model_reads_is_kept_whole_on_the_host_and_in_the_workspace() {
    let files = std::env::temp_dir().join(format!("pcs-whole-{}", uuid::Uuid::new_v4().simple()));
    let dir = files.clone();
    let (engine, _fake) = engine_with(move |config| {
        config.limits.model_output_chars = 1000;
        config.files.persist_dir = Some(dir);
    });
    let options = RunOptions {
        keep_whole_output: true,
        ..Default::default()
    };
    let id = within(LIMIT, engine.create_session(Scope::Server, &options))
        .await
        .expect("create");
    let code = "print('x' * 600); import sys; print('e' * 600, file=sys.stderr)";
    let execution = within(
        LIMIT,
        engine.execute_in_session(Scope::Server, &id, Task::Python(code), &options),
    )
    .await
    .expect("execute");
    let kept = execution.whole_output.clone().expect("kept");
    // Both streams, though each alone would fit: the pair in the workspace is of one execution.
    for (stream, bytes) in [
        (&kept.stdout, &execution.stdout),
        (&kept.stderr, &execution.stderr),
    ] {
        let saved = stream.saved_to.as_ref().expect("saved");
        assert!(saved.starts_with(&files), "{saved:?}");
        assert_eq!(&std::fs::read(saved).expect("saved file"), bytes);
        assert!(stream.notes.is_empty(), "{:?}", stream.notes);
    }
    assert_eq!(
        kept.stdout.workspace_path.as_deref(),
        Some(".outputs/stdout.txt")
    );
    let read = engine
        .read_file(Scope::Server, &id, "/workspace/.outputs/stdout.txt")
        .await
        .expect("read");
    assert_eq!(read.content.as_ref(), Some(&execution.stdout));
    // Written between executions, it is not a change the next one made.
    let next = engine
        .execute_in_session(Scope::Server, &id, Task::Python("print(1)"), &options)
        .await
        .expect("execute");
    assert!(
        next.files.is_empty() && next.whole_output.is_none(),
        "{next:?}"
    );
    engine.stop_session(Scope::Server, &id).await.expect("stop");
    let _ = std::fs::remove_dir_all(&files);
}

#[tokio::test]
async fn without_a_files_directory_an_ephemeral_run_says_the_whole_output_is_not_kept() {
    let (engine, _fake) = engine_with(|config| config.limits.model_output_chars = 1000);
    let options = RunOptions {
        keep_whole_output: true,
        ..Default::default()
    };
    let long = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print('x' * 2000)"), &options),
    )
    .await
    .expect("run");
    let kept = long.whole_output.expect("kept");
    assert_eq!(kept.stdout.saved_to, None);
    assert_eq!(kept.stdout.workspace_path, None);
    assert_eq!(
        kept.stdout.notes,
        ["not saved on the host (SANDBOX_FILES_DIR is empty)"]
    );
    // Output within the budget, or a caller that reads it all, keeps nothing.
    let short = engine
        .run_ephemeral(Task::Python("print('x' * 900)"), &options)
        .await
        .expect("run");
    assert!(short.whole_output.is_none());
    let all = engine
        .run_ephemeral(Task::Python("print('x' * 2000)"), &RunOptions::default())
        .await
        .expect("run");
    assert!(all.whole_output.is_none());
    engine.settle().await;
}

#[tokio::test]
async fn a_session_shows_its_last_value_and_keeps_it_in_underscore() {
    use crate::engine::outcome::{Output, StreamName};
    let (engine, _fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let id = within(LIMIT, engine.create_session(Scope::Server, &options))
        .await
        .expect("create");
    let run = |code: &'static str| {
        let engine = &engine;
        let id = &id;
        let options = &options;
        async move {
            engine
                .execute_in_session(Scope::Server, id, Task::Python(code), options)
                .await
                .expect("execute")
        }
    };
    let first = run("print('a')\ndisplay('b')\nprint('c')\n6 * 7").await;
    let plain = |output: &Output| match output {
        Output::DisplayData { data, .. } | Output::ExecuteResult { data, .. } => data
            .iter()
            .find(|(mime, _)| mime == "text/plain")
            .map(|(_, value)| value.clone()),
        _ => None,
    };
    assert_eq!(first.outputs.len(), 4, "{:?}", first.outputs);
    assert_eq!(
        first.outputs[0],
        Output::Stream {
            name: StreamName::Stdout,
            text: "a\n".into()
        }
    );
    assert_eq!(plain(&first.outputs[1]).as_deref(), Some("'b'"));
    assert!(matches!(&first.outputs[3], Output::ExecuteResult { .. }));
    assert_eq!(plain(&first.outputs[3]).as_deref(), Some("42"));
    let second = run("_ + 1").await;
    assert_eq!(plain(&second.outputs[0]).as_deref(), Some("43"));
    let quiet = run("_ + 1;").await;
    assert!(quiet.outputs.is_empty(), "{:?}", quiet.outputs);
    let asked = run("input()").await;
    assert_eq!(
        asked.error.map(|e| e.kind).as_deref(),
        Some("StdinNotImplementedError")
    );
    engine.stop_session(Scope::Server, &id).await.expect("stop");
}

#[tokio::test]
async fn live_output_reaches_the_sink_while_the_code_runs() {
    let (engine, _fake) = engine_with(|_| {});
    let dir = std::env::temp_dir().join(format!("pcs-live-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let go = dir.join("go");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(
        Vec::<crate::engine::LiveOutput>::new(),
    ));
    let sink: crate::engine::LiveOutputSink = {
        let (seen, go) = (seen.clone(), go.clone());
        std::sync::Arc::new(move |output: crate::engine::LiveOutput| {
            // The code waits for this file: it goes on only once its first line came live.
            if output.stdout.contains("first") {
                let _ = std::fs::write(&go, b"");
            }
            if let Ok(mut seen) = seen.lock() {
                seen.push(output);
            }
        })
    };
    let options = RunOptions {
        live_output: Some(sink),
        ..Default::default()
    };
    let code = format!(
        "import os, sys, time\n\
         print('first')\n\
         print('warn', file=sys.stderr)\n\
         deadline = time.monotonic() + 15\n\
         while not os.path.exists({go:?}) and time.monotonic() < deadline:\n    time.sleep(0.02)\n\
         print('go seen' if os.path.exists({go:?}) else 'no go')\n"
    );
    let id = within(LIMIT, engine.create_session(Scope::Server, &options))
        .await
        .expect("create");
    let execution = within(
        LIMIT,
        engine.execute_in_session(Scope::Server, &id, Task::Python(&code), &options),
    )
    .await
    .expect("execute");
    // The result still carries everything.
    assert_eq!(stdout(&execution), "first\ngo seen\n");
    assert_eq!(String::from_utf8_lossy(&execution.stderr), "warn\n");
    let first = seen.lock().expect("seen").clone();
    let live_stdout: String = first.iter().map(|o| o.stdout.as_str()).collect();
    let live_stderr: String = first.iter().map(|o| o.stderr.as_str()).collect();
    assert_eq!(live_stdout, "first\ngo seen\n", "{first:?}");
    assert_eq!(live_stderr, "warn\n", "{first:?}");
    // A shell command in the session shares the path.
    let shell = within(
        LIMIT,
        engine.execute_in_session(Scope::Server, &id, Task::Shell("echo from-shell"), &options),
    )
    .await
    .expect("shell");
    assert_eq!(stdout(&shell), "from-shell\n");
    let live = seen.lock().expect("seen").clone();
    assert!(live.iter().any(|o| o.stdout == "from-shell\n"), "{live:?}");
    engine.stop_session(Scope::Server, &id).await.expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_start_that_fails_is_tried_once_more_on_a_new_sandbox() {
    let (engine, fake) = engine_with(|_| {});
    fake.fail_next_starts(1);
    let execution = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print(3)"), &RunOptions::default()),
    )
    .await
    .expect("the second sandbox ran it");
    assert_eq!(stdout(&execution), "3\n");
    assert_eq!(fake.count(|e| matches!(e, Event::Created(_))), 2);
    assert_eq!(
        engine.admission_state().map(|s| s.retried),
        Some(1),
        "one retry"
    );
    // Twice: the caller is told so, with the cause, and nothing is left.
    fake.fail_next_starts(2);
    let failed = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print(3)"), &RunOptions::default()),
    )
    .await
    .expect_err("both starts failed");
    assert!(
        matches!(failed, EngineError::StartFailedTwice(_)),
        "{failed:?}"
    );
    assert!(failed.to_string().contains("injected fault"), "{failed}");
    engine.settle().await;
    assert!(fake.sandboxes().is_empty());
    assert_eq!(
        engine.admission_state().map(|s| s.live),
        Some(0),
        "every share given back"
    );
}

#[tokio::test]
async fn calls_beyond_the_bound_wait_their_turn_or_are_refused_in_time() {
    let (engine, fake) = engine_with(|config| {
        config.max_sandboxes = Some(1);
        config.admission_wait = Duration::from_millis(200);
    });
    let session = engine
        .create_session(Scope::Server, &RunOptions::default())
        .await
        .expect("the one sandbox");
    let short = RunOptions {
        timeout: Some(Duration::from_millis(200)),
        ..RunOptions::default()
    };
    let refused = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print(1)"), &short),
    )
    .await
    .expect_err("no share within its time");
    assert!(matches!(refused, EngineError::AtCapacity(_)), "{refused:?}");
    assert!(
        refused.to_string().contains("SANDBOX_MAX_SANDBOXES=1"),
        "{refused}"
    );
    // A call that waits runs once the session's sandbox is gone.
    let waiting = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run_ephemeral(Task::Python("print(2)"), &RunOptions::default())
                .await
        })
    };
    eventually("a call in the queue", LIMIT, || {
        engine.admission_state().is_some_and(|s| s.waiting == 1)
    })
    .await;
    assert_eq!(
        fake.count(|e| matches!(e, Event::Created(_))),
        1,
        "it waits, it does not start"
    );
    engine
        .stop_session(Scope::Server, &session)
        .await
        .expect("stopped");
    let ran = within(LIMIT, waiting).await.expect("joined").expect("ran");
    assert_eq!(stdout(&ran), "2\n");
    engine.shutdown().await;
    assert!(fake.sandboxes().is_empty());
}

/// The code's time limit is not the call's wait for a sandbox: a call with a short one waits
/// past it (a start alone can take longer) and runs once a share is free.
#[tokio::test]
async fn a_short_time_limit_does_not_cut_the_wait_for_a_sandbox() {
    let (engine, _fake) = engine_with(|config| config.max_sandboxes = Some(1));
    let session = engine
        .create_session(Scope::Server, &RunOptions::default())
        .await
        .expect("the one sandbox");
    let waiting = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let short = RunOptions {
                timeout: Some(Duration::from_secs(1)),
                ..RunOptions::default()
            };
            engine.run_ephemeral(Task::Python("print(3)"), &short).await
        })
    };
    eventually("a call in the queue", LIMIT, || {
        engine.admission_state().is_some_and(|s| s.waiting == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        engine.admission_state().map(|s| (s.waiting, s.refused)),
        Some((1, 0)),
        "still waiting past the code's limit"
    );
    engine
        .stop_session(Scope::Server, &session)
        .await
        .expect("stopped");
    let ran = within(LIMIT, waiting).await.expect("joined").expect("ran");
    assert_eq!(stdout(&ran), "3\n");
    engine.shutdown().await;
}

#[tokio::test]
async fn the_pool_grows_only_within_the_bound() {
    let (engine, fake) = engine_with(|config| {
        config.pool_size = 4;
        config.max_sandboxes = Some(2);
    });
    engine.start_pool();
    eventually("the pool within the bound", LIMIT, || {
        engine.pool_ready() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.pool_ready(), 2);
    assert_eq!(fake.sandboxes().len(), 2, "never over the bound");
    // A call takes a pooled one; a call for another image gets the share of an idle pooled one.
    let ran = within(
        LIMIT,
        engine.run_ephemeral(Task::Python("print(5)"), &RunOptions::default()),
    )
    .await
    .expect("ran");
    assert_eq!(stdout(&ran), "5\n");
    engine.shutdown().await;
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn shutdown_removes_sandboxes_in_every_state() {
    let (engine, fake) = engine_with(|config| config.pool_size = 1);
    engine.start_pool();
    eventually("a pooled sandbox", LIMIT, || engine.pool_ready() == 1).await;
    let _idle = engine
        .create_session(Scope::Server, &RunOptions::default())
        .await
        .expect("an idle session");
    // A run in progress, and a start in progress.
    let busy = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run_ephemeral(
                    Task::Python("import time\nwhile True: time.sleep(0.05)"),
                    &RunOptions::default(),
                )
                .await
        })
    };
    eventually("the busy run's sandbox", LIMIT, || fake.running() >= 3).await;
    fake.set_start_delay(Duration::from_millis(500));
    let starting = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .create_session(Scope::Server, &RunOptions::default())
                .await
        })
    };
    eventually("a start under way", LIMIT, || {
        fake.count(|e| matches!(e, Event::Created(_))) >= 4
    })
    .await;
    within(LIMIT, engine.shutdown()).await;
    busy.abort();
    starting.abort();
    eventually("nothing left", LIMIT, || fake.sandboxes().is_empty()).await;
    assert_eq!(fake.running(), 0);
}

/// An execution starts from the walk the last one ended with (one walk each, not two): what the
/// code changed is reported once, what the host wrote in between never, and what the code's own
/// processes changed between two executions by the next one.
#[tokio::test]
async fn each_change_in_the_workspace_is_reported_once_by_the_execution_after_it() {
    let (engine, fake) = engine_with(|_| {});
    let options = RunOptions::default();
    let id = within(LIMIT, engine.create_session(Scope::Server, &options))
        .await
        .expect("create");
    let run = |code: &'static str| {
        let engine = engine.clone();
        let id = id.clone();
        async move {
            let options = RunOptions::default();
            let execution = within(
                LIMIT,
                engine.execute_in_session(Scope::Server, &id, Task::Python(code), &options),
            )
            .await
            .expect("execute");
            assert_eq!(execution.exit_code, 0, "{execution:?}");
            let mut paths: Vec<String> = execution.files.into_iter().map(|f| f.path).collect();
            paths.sort();
            paths
        }
    };
    assert_eq!(run("open('a.txt', 'w').write('a')").await, ["a.txt"]);
    assert!(run("pass").await.is_empty());
    within(
        LIMIT,
        engine.write_file(Scope::Server, &id, "b.txt", b"from the host"),
    )
    .await
    .expect("write");
    assert!(
        run("pass").await.is_empty(),
        "the host's file is not the code's"
    );
    // A thread of the code writes c.txt once the test says so, between two executions.
    let trigger = std::env::temp_dir().join(format!("pcs-walk-{}", uuid::Uuid::new_v4().simple()));
    let code = format!(
        "import os, threading, time\n\
         def later():\n    while not os.path.exists({trigger:?}):\n        time.sleep(0.01)\n    \
         open('c.txt', 'w').write('c')\n\
         threading.Thread(target=later, daemon=True).start()",
        trigger = trigger.to_string_lossy()
    );
    let code: &'static str = Box::leak(code.into_boxed_str());
    assert!(run(code).await.is_empty());
    std::fs::write(&trigger, b"go").expect("trigger");
    let workspace = fake
        .workspace(&crate::engine::backend::SandboxId(id.clone()))
        .expect("the session's workspace");
    eventually("the code's thread to write c.txt", LIMIT, || {
        workspace.join("c.txt").exists()
    })
    .await;
    assert_eq!(run("pass").await, ["c.txt"]);
    assert!(run("pass").await.is_empty());
    engine.stop_session(Scope::Server, &id).await.expect("stop");
    let _ = std::fs::remove_file(&trigger);
}
