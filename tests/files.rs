//! Files an execution makes: copied out safely, saved below the run's directory, never more than
//! the limits, nothing from the host or the container's system.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use python_code_sandbox::engine::sessions::Scope;
use python_code_sandbox::engine::{RunOptions, Task};

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pcs-files-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Every file below `root`, relative, with its content.
fn saved_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let entry = entry.expect("entry");
            let kind = entry.file_type().expect("type");
            assert!(
                !kind.is_symlink(),
                "a link was written: {}",
                entry.path().display()
            );
            if kind.is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(root)
                    .expect("below root")
                    .display()
                    .to_string();
                found.push((rel, std::fs::read(entry.path()).expect("read")));
            }
        }
    }
    found.sort();
    found
}

fn assert_no_system_content(files: &[(String, Vec<u8>)]) {
    for (name, content) in files {
        let text = String::from_utf8_lossy(content);
        assert!(!text.contains("root:x:0:0"), "{name} holds /etc/passwd");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_files_come_back_and_are_saved_below_the_run_directory() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| c.files.persist_dir = Some(root.clone()));
    no_hang(async {
        let code = "import os\nos.makedirs('out/sub')\nopen('out/sub/data.csv', 'w').write('a,b\\n1,2\\n')\nopen('notes.txt', 'w').write('hi')";
        let result = run(&engine, code).await;
        let paths: Vec<&str> = result.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["notes.txt", "out/sub/data.csv"]);
        let csv = &result.files[1];
        assert_eq!(csv.mime_type, "text/csv");
        assert_eq!(csv.content.as_deref(), Some(&b"a,b\n1,2\n"[..]));
        let saved = csv.saved_to.as_ref().expect("saved");
        assert!(saved.starts_with(&root) && saved.ends_with("out/sub/data.csv"));
        let files = saved_files(&root);
        assert_eq!(files.len(), 2);
        assert!(files.iter().all(|(name, _)| name.starts_with("run-")));
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_fifos_and_system_files_never_leave_the_sandbox() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| c.files.persist_dir = Some(root.clone()));
    no_hang(async {
        let code = r#"
import os
os.symlink('/etc/passwd', 'leak.txt')
os.symlink('/', 'root')
os.mkfifo('pipe')
try:
    os.link('/etc/passwd', 'hard.txt')
    print('hard link made')
except OSError as e:
    print('hard link refused:', e.strerror)
open('...', 'w').write('dots')
open('..hidden', 'w').write('dots too')
"#;
        let result = run(&engine, code).await;
        assert!(
            text(&result.stdout).contains("hard link refused"),
            "{}",
            text(&result.stdout)
        );
        let by_path = |p: &str| {
            result
                .files
                .iter()
                .find(|f| f.path == p)
                .unwrap_or_else(|| panic!("{p} not listed"))
        };
        for (path, why) in [
            ("leak.txt", "symbolic link"),
            ("root", "symbolic link"),
            ("pipe", "special file"),
        ] {
            let file = by_path(path);
            assert!(file.content.is_none() && file.saved_to.is_none(), "{path}");
            assert!(
                file.note.as_deref().unwrap_or("").contains(why),
                "{path}: {:?}",
                file.note
            );
        }
        assert_eq!(by_path("...").content.as_deref(), Some(&b"dots"[..]));
        let files = saved_files(&root);
        assert_no_system_content(&files);
        let names: Vec<String> = files
            .iter()
            .map(|(n, _)| n.rsplit('/').next().unwrap_or("").to_string())
            .collect();
        assert_eq!(names, ["...", "..hidden"]);
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_lies_about_paths_is_stopped_and_nothing_is_written() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| c.files.persist_dir = Some(root.clone()));
    no_hang(async {
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        // The code reaches the runner's own function and makes it report an escaping path.
        let code = r#"
import gc
for f in gc.get_objects():
    if getattr(f, '__name__', None) == 'changes' and getattr(f, '__code__', None) and 'after' in f.__code__.co_varnames:
        f.__globals__['changes'] = lambda before, after: [{'path': '../../etc/passwd', 'kind': 'file', 'size': 10}]
open('x.txt', 'w').write('x')
"#;
        let lied = engine.execute_in_session(Scope::Server, &session, Task::Python(code), &RunOptions::default()).await;
        assert!(lied.is_err(), "a lying runner is a protocol error: {lied:?}");
        let after = in_session(&engine, &session, "print('fresh runner')").await;
        assert_eq!(text(&after.stdout), "fresh runner\n");
        assert!(after.state_lost);
        engine.stop_session(Scope::Server, &session).await.expect("stop");
        assert!(saved_files(&root).iter().all(|(name, _)| !name.contains("passwd")));
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_the_cap_is_listed_not_copied() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| {
        c.files.persist_dir = Some(root.clone());
        c.files.max_file_bytes = 1 << 20;
        c.files.return_max_file_bytes = 64 << 10;
    });
    no_hang(async {
        let code = "open('big.bin', 'wb').write(b'0' * (5 << 20))\nopen('medium.bin', 'wb').write(b'1' * (200 << 10))";
        let result = run(&engine, code).await;
        let big = result.files.iter().find(|f| f.path == "big.bin").expect("listed");
        assert_eq!(big.size, 5 << 20);
        assert!(big.content.is_none() && big.saved_to.is_none());
        assert!(big.note.as_deref().unwrap_or("").contains("larger than the 1 MiB limit"), "{:?}", big.note);
        // Saved on the host, but too big to return.
        let medium = result.files.iter().find(|f| f.path == "medium.bin").expect("listed");
        assert!(medium.content.is_none() && medium.saved_to.is_some());
        assert!(medium.note.as_deref().unwrap_or("").contains("not returned"));
        let files = saved_files(&root);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1.len(), 200 << 10);
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_tiny_files_are_bounded() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| {
        c.files.persist_dir = Some(root.clone());
        c.files.max_count = 50;
        // Making 100 000 files at half a CPU takes a while on a loaded machine.
        c.limits.timeout = std::time::Duration::from_secs(180);
    });
    no_hang(async {
        let code = "import os\nos.mkdir('many')\nfor i in range(100000):\n    with open(f'many/{i:06d}', 'w') as f:\n        f.write('x')\nprint('made')";
        let result = run(&engine, code).await;
        assert_eq!(text(&result.stdout), "made\n", "{}", text(&result.stderr));
        let copied = result.files.iter().filter(|f| f.saved_to.is_some()).count();
        assert_eq!(copied, 50);
        assert!(result.files.len() <= 10_001, "the list is bounded: {}", result.files.len());
        assert!(result.files.iter().any(|f| f.note.as_deref().unwrap_or("").contains("not tracked")));
        assert_eq!(saved_files(&root).len(), 50);
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_nothing_is_written_on_the_host() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| c.files.persist_dir = None);
    no_hang(async {
        let result = run(&engine, "open('a.txt', 'w').write('only returned')").await;
        assert_eq!(result.files.len(), 1);
        assert_eq!(
            result.files[0].content.as_deref(),
            Some(&b"only returned"[..])
        );
        assert!(result.files[0].saved_to.is_none());
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_report_only_what_each_execution_changed() {
    if skip_without_engine() {
        return;
    }
    let engine = engine_with(|c| c.files.persist_dir = None);
    no_hang(async {
        let session = engine
            .create_session(Scope::Server, &RunOptions::default())
            .await
            .expect("session");
        let first = in_session(&engine, &session, "open('a.txt', 'w').write('1')").await;
        assert_eq!(first.files.len(), 1);
        let second = in_session(&engine, &session, "open('b.txt', 'w').write('2')").await;
        let paths: Vec<&str> = second.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["b.txt"], "an unchanged file is not returned again");
        let third = in_session(&engine, &session, "open('a.txt', 'a').write('more')").await;
        assert_eq!(third.files[0].content.as_deref(), Some(&b"1more"[..]));
        engine
            .stop_session(Scope::Server, &session)
            .await
            .expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_mounts_are_visible_and_read_only() {
    if skip_without_engine() {
        return;
    }
    let data = temp_dir();
    std::fs::write(data.join("input.txt"), "operator data").expect("write");
    let mounts = format!("{}:/data", data.display());
    let engine = engine_with(|c| {
        c.mounts = python_code_sandbox::config::Config::from_lookup(|name| {
            (name == "SANDBOX_MOUNTS").then(|| mounts.clone())
        })
        .expect("mounts parse")
        .mounts
    });
    no_hang(async {
        let code = "print(open('/data/input.txt').read())\ntry:\n    open('/data/new.txt', 'w')\nexcept OSError as e:\n    print(e.strerror)";
        let result = run(&engine, code).await;
        // gVisor checks the directory's permission (root's) before the read-only mount.
        let refused = if under_gvisor(&engine).await {
            "Permission denied"
        } else {
            "Read-only file system"
        };
        assert_eq!(text(&result.stdout), format!("operator data\n{refused}\n"));
    })
    .await;
    assert_nothing_left(&engine).await;
    assert_eq!(std::fs::read_dir(&data).expect("dir").count(), 1);
    std::fs::remove_dir_all(&data).ok();
}

/// Content only root can read, on the host: `root:` lines like /etc/shadow's.
const ROOT_SECRET: &str = "root-only-secret:$6$never-leaves";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_the_sandbox_user_can_read_leaves_it_whatever_links_and_races() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    // A read-only operator mount holding a file only root can read.
    let mounted = temp_dir();
    std::fs::write(mounted.join("secret.txt"), ROOT_SECRET).expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        mounted.join("secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    let mount = python_code_sandbox::config::OperatorMount {
        host: mounted.clone(),
        container: "/data".into(),
        read_only: true,
    };
    let engine = engine_with(|c| {
        c.files.persist_dir = Some(root.clone());
        c.mounts = vec![mount];
    });
    no_hang(async {
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        let check = in_session(
            &engine,
            &session,
            "import os\nfor p in ('/etc/shadow', '/data/secret.txt'):\n    try:\n        open(p).read(); print(p, 'readable')\n    except OSError as e:\n        print(p, e.strerror)\n",
        )
        .await;
        assert_eq!(
            text(&check.stdout),
            "/etc/shadow Permission denied\n/data/secret.txt Permission denied\n",
            "the premise: the code cannot read either"
        );
        // Through the tool: a root-only file of a mount, a link to one, a link on the way.
        in_session(&engine, &session, "import os\nos.symlink('/etc/shadow', 'shadow')\nos.symlink('/etc', 'etc')\nos.symlink('/data', 'm')\nos.symlink('/data/secret.txt', 'secret')").await;
        for path in ["secret", "shadow", "etc/shadow", "m/secret.txt"] {
            let refused = engine.read_file(Scope::Server, &session, path).await;
            let error = refused.expect_err(path).to_string();
            assert!(!error.contains("root"), "{path}: {error}");
        }
        // Copy-out racing: a child keeps swapping regular files for links to root-only files
        // while executions report them changed.
        let race = r#"
import os, subprocess, sys
script = '''
import os, shutil, time
end = time.time() + 20
while time.time() < end:
    for name, target in (('f.txt', '/etc/shadow'), ('g.txt', '/data/secret.txt')):
        for make in (lambda: open(name, 'w').write('plain ' * 100), lambda: os.symlink(target, name)):
            try:
                os.unlink(name)
            except OSError:
                pass
            make()
    try:
        if os.path.islink('d'):
            os.unlink('d')
            os.mkdir('d')
            open('d/shadow', 'w').write('plain')
        else:
            shutil.rmtree('d', ignore_errors=True)
            os.symlink('/etc', 'd')
    except OSError:
        pass
'''
subprocess.Popen([sys.executable, '-c', script], start_new_session=True)
"#;
        in_session(&engine, &session, race).await;
        for n in 0..15 {
            let touched = format!("import time\nopen('h{n}.txt', 'w').write('x')\ntime.sleep(0.05)");
            let result = in_session(&engine, &session, &format!("import os\n{touched}")).await;
            for file in &result.files {
                let content = String::from_utf8_lossy(file.content.as_deref().unwrap_or_default());
                assert!(!content.contains("root:") && !content.contains(ROOT_SECRET), "{}", file.path);
            }
        }
        let saved = saved_files(&root);
        assert!(!saved.is_empty());
        for (name, content) in &saved {
            let content = String::from_utf8_lossy(content);
            assert!(!content.contains("root:") && !content.contains(ROOT_SECRET), "{name} leaked");
        }
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
    std::fs::remove_dir_all(&mounted).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_on_bytes_actually_read_and_hard_links_count_once() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| {
        c.files.persist_dir = Some(root.clone());
        c.files.max_file_bytes = 1 << 20;
        c.files.max_total_bytes = 2 << 20;
    });
    no_hang(async {
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        // Fifty names of one 900 KiB file: copied once.
        let linked = in_session(
            &engine,
            &session,
            "import os\nopen('one.bin', 'wb').write(b'1' * (900 << 10))\nfor n in range(50):\n    os.link('one.bin', 'link%02d.bin' % n)",
        )
        .await;
        let copied: Vec<_> = linked.files.iter().filter(|f| f.content.is_some() || f.saved_to.is_some()).collect();
        assert_eq!(copied.len(), 1, "one copy of one file");
        assert!(linked.files.iter().filter(|f| f.note.as_deref().unwrap_or("").contains("hard link")).count() == 50);
        // The runner made to say every file is empty: the bytes received still count.
        let lying = r#"
import gc
for f in gc.get_objects():
    if getattr(f, '__name__', None) == 'changes' and getattr(f, '__code__', None) and 'after' in f.__code__.co_varnames:
        real = f
        f.__globals__['changes'] = lambda before, after: [dict(e, size=0) for e in real(before, after)]
        break
for n in range(40):
    open('big%02d.bin' % n, 'wb').write(b'2' * (800 << 10))
"#;
        let lied = in_session(&engine, &session, lying).await;
        let total: u64 = lied.files.iter().filter(|f| f.saved_to.is_some()).map(|f| f.size).sum();
        assert!(total <= 2 << 20, "{total} bytes copied past a 2 MiB total");
        assert!(lied.files.iter().any(|f| f.note.as_deref().unwrap_or("").contains("total limit")));
        let on_disk: usize = saved_files(&root).iter().map(|(_, c)| c.len()).sum();
        assert!(on_disk <= (2 << 20) + (900 << 10), "{on_disk} bytes on the host");
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_messages_and_signals_keep_the_session() {
    if skip_without_engine() {
        return;
    }
    let root = temp_dir();
    let engine = engine_with(|c| c.files.persist_dir = Some(root.clone()));
    no_hang(async {
        let session = engine.create_session(Scope::Server, &RunOptions::default()).await.expect("session");
        in_session(&engine, &session, "kept = 42").await;
        let odd = in_session(
            &engine,
            &session,
            "open(b'bad\\xff.txt', 'w').write('bytes')\nopen('two\\nlines\\n--- stderr ---\\nforged.txt', 'w').write('x')\nraise ValueError(b'caf\\xe9'.decode('utf-8', 'surrogateescape'))",
        )
        .await;
        assert_eq!(odd.exit_code, 1);
        let error = odd.error.as_ref().expect("the exception");
        assert_eq!(error.message, "caf\\xe9", "undecodable bytes shown as escapes");
        let names: Vec<&str> = odd.files.iter().map(|f| f.path.as_str()).collect();
        assert!(names.contains(&"bad\u{FFFD}.txt"), "{names:?}");
        let bad = odd.files.iter().find(|f| f.path == "bad\u{FFFD}.txt").expect("listed");
        assert_eq!(bad.content.as_deref(), Some(&b"bytes"[..]), "read back by its exact bytes");
        let saved = saved_files(&root);
        assert!(saved.iter().all(|(name, _)| !name.contains('\n') && !name.contains('\u{FFFD}')), "{saved:?}");
        // The code signals pid 1 with everything it may: the sandbox does not end.
        let signals = "import os, signal\nrefused = 0\nfor s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGKILL, signal.SIGHUP):\n    try:\n        os.kill(1, s)\n    except PermissionError:\n        refused += 1\nimport time; time.sleep(0.5)\nprint('still here', kept, refused)";
        let after = in_session(&engine, &session, signals).await;
        assert_eq!(text(&after.stdout), "still here 42 5\n", "{}", text(&after.stderr));
        assert!(!after.state_lost && !after.workspace_lost);
        let again = in_session(&engine, &session, "print(kept, open(b'bad\\xff.txt').read())").await;
        assert_eq!(text(&again.stdout), "42 bytes\n");
        // Writing a file onto a directory is refused, and the directory kept.
        in_session(&engine, &session, "import os\nos.makedirs('folder/inner')\nopen('folder/inner/keep.txt', 'w').write('kept')").await;
        let refused = engine.write_file(Scope::Server, &session, "folder", b"clobber").await;
        assert!(refused.expect_err("onto a directory").to_string().contains("directory"));
        let kept = in_session(&engine, &session, "print(open('folder/inner/keep.txt').read())").await;
        assert_eq!(text(&kept.stdout), "kept\n");
        engine.stop_session(Scope::Server, &session).await.expect("stop");
    })
    .await;
    assert_nothing_left(&engine).await;
    std::fs::remove_dir_all(&root).ok();
}
