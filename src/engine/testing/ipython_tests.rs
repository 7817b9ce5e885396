//! Cells as IPython runs them (the runner's `run_cell`), on the fake backend: magics and shell
//! escapes, the output cache, display handles, clear_output, input(), IPython's tracebacks, exit
//! codes, and a snapshot that leaves IPython's own names out.
//!
//! They need the runner's IPython set on the host: `PCS_TEST_IPYTHON` names it (scripts/test.sh
//! makes it at `.cache/ipython-set`).

use std::time::Duration;

use super::{engine_with, within};
use crate::engine::outcome::{Output, StreamName};
use crate::engine::sessions::Scope;
use crate::engine::{Engine, Execution, LiveOutput, LiveOutputSink, RunOptions, Task};

const LIMIT: Duration = Duration::from_secs(60);

/// A session on the fake backend and a way to run cells in it.
struct Cells {
    engine: std::sync::Arc<Engine>,
    id: String,
    options: RunOptions,
}

impl Cells {
    async fn new() -> Cells {
        Cells::with(|_| {}).await
    }

    async fn with(adjust: impl FnOnce(&mut crate::config::Config)) -> Cells {
        let (engine, _fake) = engine_with(adjust);
        let options = RunOptions::default();
        let id = within(LIMIT, engine.create_session(Scope::Server, &options))
            .await
            .expect("create");
        Cells {
            engine,
            id,
            options,
        }
    }

    async fn run(&self, code: &str) -> Execution {
        within(
            LIMIT,
            self.engine.execute_in_session(
                Scope::Server,
                &self.id,
                Task::Python(code),
                &self.options,
            ),
        )
        .await
        .expect("execute")
    }

    async fn stop(self) {
        self.engine
            .stop_session(Scope::Server, &self.id)
            .await
            .expect("stop");
    }
}

fn stdout(execution: &Execution) -> String {
    String::from_utf8_lossy(&execution.stdout).into_owned()
}

fn stderr(execution: &Execution) -> String {
    String::from_utf8_lossy(&execution.stderr).into_owned()
}

/// The text/plain of a display, a value or an update.
fn plain(output: &Output) -> Option<String> {
    output
        .bundle()?
        .iter()
        .find(|(mime, _)| mime == "text/plain")
        .map(|(_, value)| value.clone())
}

/// The text/plain of the execution's value (its execute_result), and its execution count.
fn value(execution: &Execution) -> Option<(String, u64)> {
    execution.outputs.iter().find_map(|output| match output {
        Output::ExecuteResult {
            execution_count, ..
        } => Some((plain(output)?, *execution_count)),
        _ => None,
    })
}

fn ok(execution: &Execution) {
    assert_eq!(
        execution.exit_code,
        0,
        "stdout: {}\nstderr: {}\nerror: {:?}",
        stdout(execution),
        stderr(execution),
        execution.error
    );
}

#[tokio::test]
async fn the_last_value_is_an_execute_result_kept_in_out_and_the_underscores() {
    let cells = Cells::new().await;
    let first = cells.run("x = 6\nx * 7").await;
    ok(&first);
    assert_eq!(value(&first), Some(("42".into(), 1)));
    assert_eq!(value(&cells.run("_ + 1").await), Some(("43".into(), 2)));
    assert_eq!(value(&cells.run("__").await), Some(("42".into(), 3)));
    assert_eq!(value(&cells.run("_1 + _2").await), Some(("85".into(), 4)));
    let out = cells.run("sorted(Out.items())[:2], In[1]").await;
    assert_eq!(
        value(&out).map(|v| v.0).as_deref(),
        Some("([(1, 42), (2, 43)], 'x = 6\\nx * 7')")
    );
    // A trailing semicolon shows nothing, as in IPython.
    assert!(cells.run("1 + 1;").await.outputs.is_empty());
    let shell = cells.run("type(get_ipython()).__mro__[1].__name__").await;
    assert_eq!(
        value(&shell).map(|v| v.0).as_deref(),
        Some("'InteractiveShell'")
    );
    cells.stop().await;
}

#[tokio::test]
async fn line_and_cell_magics_run_as_ipython_defines_them() {
    let cells = Cells::new().await;
    let time = cells.run("%time y = sum(range(10))\nprint(y)").await;
    ok(&time);
    assert!(stdout(&time).contains("Wall time:"), "{}", stdout(&time));
    assert!(stdout(&time).ends_with("45\n"), "{}", stdout(&time));
    let timeit = cells.run("%timeit -n 5 -r 2 sum(range(10))").await;
    ok(&timeit);
    assert!(
        stdout(&timeit).contains("(mean ± std. dev. of 2 runs, 5 loops each)"),
        "{}",
        stdout(&timeit)
    );
    let cell_time = cells.run("%%time\nz = 2\nprint(z)").await;
    ok(&cell_time);
    assert!(
        stdout(&cell_time).starts_with("2\n"),
        "{}",
        stdout(&cell_time)
    );
    assert!(stdout(&cell_time).contains("Wall time:"));
    let captured = cells
        .run("%%capture kept\nprint('hidden')\ndisplay('shown later')")
        .await;
    ok(&captured);
    assert_eq!(stdout(&captured), "");
    assert!(captured.outputs.is_empty(), "{:?}", captured.outputs);
    let shown = cells.run("print(kept.stdout, end='')\nkept.show()").await;
    assert_eq!(stdout(&shown), "hidden\nhidden\n");
    assert!(
        shown
            .outputs
            .iter()
            .any(|o| plain(o).as_deref() == Some("'shown later'")),
        "{:?}",
        shown.outputs
    );
    let written = cells.run("%%writefile notes.txt\nline one\n").await;
    ok(&written);
    assert_eq!(stdout(&written), "Writing notes.txt\n");
    let read = cells.run("open('notes.txt').read()").await;
    assert_eq!(value(&read).map(|v| v.0).as_deref(), Some("'line one\\n'"));
    let cd = cells
        .run("import os\nos.makedirs('sub', exist_ok=True)\n%cd sub\nprint(os.path.basename(os.getcwd()))")
        .await;
    ok(&cd);
    assert!(stdout(&cd).ends_with("sub\n"), "{}", stdout(&cd));
    cells.run("%cd ..").await;
    let env = cells
        .run("%env CELL_SETTING=on\nread = %env CELL_SETTING\nread")
        .await;
    assert_eq!(stdout(&env), "env: CELL_SETTING=on\n");
    assert_eq!(value(&env).map(|v| v.0).as_deref(), Some("'on'"));
    let who = cells.run("%who").await;
    ok(&who);
    for name in ["kept", "os", "y", "z"] {
        assert!(stdout(&who).contains(name), "{}", stdout(&who));
    }
    assert!(!stdout(&who).contains("In"), "{}", stdout(&who));
    cells.stop().await;
}

#[tokio::test]
async fn help_and_matplotlib_magics_are_accepted() {
    let cells = Cells::new().await;
    let help = cells.run("len?").await;
    ok(&help);
    assert!(
        stdout(&help).contains("Return the number of items in a container."),
        "{}",
        stdout(&help)
    );
    let source = cells
        .run("def twice(n):\n    'Doubles.'\n    return 2 * n\ntwice??")
        .await;
    ok(&source);
    assert!(
        stdout(&source).contains("return 2 * n"),
        "{}",
        stdout(&source)
    );
    assert!(!stdout(&source).contains('\u{1b}'), "no colours");
    // `%matplotlib` is IPython's own: without matplotlib it fails as in Jupyter (the MCP suite
    // runs it with matplotlib: tests/mcp/test_ipython.py).
    let inline = cells.run("%matplotlib inline").await;
    assert_eq!(
        inline.error.as_ref().map(|e| e.kind.as_str()),
        Some("ModuleNotFoundError"),
        "{inline:?}"
    );
    cells.stop().await;
}

#[tokio::test]
async fn shell_escapes_run_sh_on_the_captured_streams() {
    let cells = Cells::new().await;
    let escape = cells
        .run("print('before')\n!echo out; echo err >&2; exit 3\nprint(_exit_code)")
        .await;
    ok(&escape);
    assert_eq!(stdout(&escape), "before\nout\n3\n");
    assert_eq!(stderr(&escape), "err\n");
    let assigned = cells
        .run("name = 'x'\nlines = !echo a-$name; echo b\nlines")
        .await;
    ok(&assigned);
    assert_eq!(
        value(&assigned).map(|v| v.0).as_deref(),
        Some("['a-x', 'b']")
    );
    cells.stop().await;
}

#[tokio::test]
async fn pip_and_conda_say_what_they_cannot_do() {
    let cells = Cells::new().await;
    // The installer's client answers (the fake backend has no installer: it says why nothing was
    // installed), the cell itself does not fail.
    for code in [
        "%pip install nothing-here",
        "!pip install nothing-here",
        "!python3 -m pip install nothing-here",
    ] {
        let execution = cells.run(code).await;
        assert!(
            stderr(&execution).contains("pip") && execution.error.is_none(),
            "{code}: {} {:?}",
            stderr(&execution),
            execution.error
        );
        assert!(
            stderr(&execution).starts_with("ERROR: pip: nothing changed"),
            "{code}: {}",
            stderr(&execution)
        );
    }
    let conda = cells.run("%conda install numpy").await;
    assert_eq!(conda.exit_code, 1);
    assert_eq!(
        conda.error.as_ref().map(|e| e.kind.as_str()),
        Some("UsageError")
    );
    assert!(
        stderr(&conda).contains("%pip install"),
        "{}",
        stderr(&conda)
    );
    cells.stop().await;
}

#[tokio::test]
async fn a_display_handle_updates_its_display_in_this_call_and_in_a_later_one() {
    let cells = Cells::new().await;
    let same = cells
        .run("handle = display('v1', display_id=True)\nprint('between')\nhandle.update('v2')")
        .await;
    ok(&same);
    // The host applied the update: one display, now v2, and the print after it.
    let displays: Vec<_> = same
        .outputs
        .iter()
        .filter(|o| matches!(o, Output::DisplayData { .. }))
        .collect();
    assert_eq!(displays.len(), 1, "{:?}", same.outputs);
    assert_eq!(plain(displays[0]).as_deref(), Some("'v2'"));
    let Output::DisplayData {
        display_id: Some(id),
        ..
    } = displays[0]
    else {
        panic!("a display with an id: {:?}", same.outputs);
    };
    let later = cells.run("handle.update('v3')").await;
    ok(&later);
    assert_eq!(
        later.outputs,
        vec![Output::UpdateDisplayData {
            data: vec![("text/plain".into(), "'v3'".into())],
            metadata: Default::default(),
            display_id: id.clone(),
        }]
    );
    let by_id = cells
        .run("from IPython.display import update_display\nupdate_display('v4', display_id=handle.display_id)")
        .await;
    assert_eq!(
        by_id.outputs.first().and_then(plain).as_deref(),
        Some("'v4'")
    );
    cells.stop().await;
}

#[tokio::test]
async fn kernel_messages_sent_to_iopub_become_the_cells_outputs() {
    // What code written for ipykernel does (nbclient's update-display-id notebook): messages to
    // `get_ipython().kernel.iopub_socket` through `kernel.session.send`.
    let cells = Cells::new().await;
    let define = cells
        .run(concat!(
            "ip = get_ipython()\n",
            "def send(msg_type, **content):\n",
            "    return ip.kernel.session.send(ip.kernel.iopub_socket, msg_type, content, parent=ip.parent_header)\n",
            "def data(obj):\n",
            "    d, md = ip.display_formatter.format(obj)\n",
            "    return dict(data=d, metadata=md)\n",
        ))
        .await;
    ok(&define);
    let sent = cells
        .run(concat!(
            "send('display_data', transient={'display_id': 'd'}, **data(1))\n",
            "send('stream', name='stdout', text='printed\\n')\n",
            "send('update_display_data', transient={'display_id': 'd'}, **data(2))\n",
            "send('execute_result', execution_count=ip.execution_count - 1, transient={'display_id': 'r'}, **data(3))\n",
            "send('comm_open', comm_id='x', target_name='t', data={})\n",
            "send('display_data', data='not a bundle', metadata=[1])\n",
            "msg = ip.kernel.session.send(object(), 'display_data', {'data': {'text/plain': 'elsewhere'}})\n",
            "print(msg['msg_type'], sorted(msg))",
        ))
        .await;
    ok(&sent);
    let id = |s: &str| Some(s.to_string());
    assert_eq!(
        sent.outputs,
        vec![
            Output::DisplayData {
                data: vec![("text/plain".into(), "2".into())],
                metadata: Default::default(),
                display_id: id("d"),
            },
            Output::Stream {
                name: StreamName::Stdout,
                text: "printed\n".into()
            },
            Output::ExecuteResult {
                data: vec![("text/plain".into(), "3".into())],
                metadata: Default::default(),
                execution_count: 2,
                display_id: id("r"),
            },
            // Not a MIME bundle: an empty display, as display() of such a formatter's result.
            Output::display(vec![("text/plain".into(), String::new())]),
            Output::Stream {
                name: StreamName::Stdout,
                text: "display_data ['content', 'header', 'metadata', 'msg_id', 'msg_type', 'parent_header']\n".into()
            },
        ]
    );
    let later = cells
        .run("send('update_display_data', transient={'display_id': 'r'}, **data(4))\nsend('clear_output', wait=False);")
        .await;
    ok(&later);
    // The clear clears this call's outputs, not the update of an earlier call's value.
    assert!(later.outputs_cleared);
    assert_eq!(
        later.outputs,
        vec![Output::UpdateDisplayData {
            data: vec![("text/plain".into(), "4".into())],
            metadata: Default::default(),
            display_id: "r".into(),
        }]
    );
    let error = cells
        .run("send('error', ename='E', evalue='v', traceback=['line 1', 2, 'E: v']);")
        .await;
    ok(&error);
    assert_eq!(
        error.outputs,
        vec![Output::Error {
            ename: "E".into(),
            evalue: "v".into(),
            traceback: vec!["line 1".into(), "E: v".into()],
        }]
    );
    cells.stop().await;
}

#[tokio::test]
async fn clear_output_clears_what_came_before_and_wait_defers_it() {
    let cells = Cells::new().await;
    let cleared = cells
        .run("from IPython.display import clear_output\nprint('old')\ndisplay('gone')\nclear_output()\nprint('new')")
        .await;
    ok(&cleared);
    assert!(cleared.outputs_cleared);
    assert_eq!(
        cleared.outputs,
        vec![Output::Stream {
            name: StreamName::Stdout,
            text: "new\n".into()
        }]
    );
    assert!(
        !stdout(&cleared).contains("\u{1b}[2K"),
        "{:?}",
        stdout(&cleared)
    );
    // Progress as a notebook shows it: each step replaces the last, thousands of times.
    let progress = cells
        .run("from IPython.display import clear_output\nfor i in range(1000):\n    clear_output(wait=True)\n    display(f'step {i}')")
        .await;
    ok(&progress);
    assert_eq!(progress.outputs_dropped, 0);
    assert_eq!(progress.outputs.len(), 1, "{:?}", progress.outputs);
    assert_eq!(plain(&progress.outputs[0]).as_deref(), Some("'step 999'"));
    // A clear after more displays than a result keeps still clears them all, with or without wait.
    for wait in ["False", "True"] {
        let full = cells
            .run(&format!("from IPython.display import clear_output\nfor i in range(300):\n    display(i)\nclear_output(wait={wait})\nprint('after')"))
            .await;
        ok(&full);
        assert_eq!(
            full.outputs,
            vec![Output::Stream {
                name: StreamName::Stdout,
                text: "after\n".into()
            }],
            "wait={wait}"
        );
    }
    // A wait with nothing after it clears nothing.
    let kept = cells
        .run("from IPython.display import clear_output\nprint('stays')\nclear_output(wait=True)")
        .await;
    assert!(!kept.outputs_cleared);
    assert_eq!(
        kept.outputs,
        vec![Output::Stream {
            name: StreamName::Stdout,
            text: "stays\n".into()
        }]
    );
    cells.stop().await;
}

/// The code's steps wait for files that the live sink writes once it has seen a marker, so each
/// step's text is known to have gone out live before the next step starts.
const LIVE_CLEARS: &str = "import os, time\n\
from IPython.display import clear_output, display\n\
def seen(name):\n    \
    path = os.path.join(DIR, name)\n    \
    deadline = time.monotonic() + 20\n    \
    while not os.path.exists(path) and time.monotonic() < deadline:\n        time.sleep(0.02)\n    \
    assert os.path.exists(path), 'never seen live: ' + name\n\
print('one')\n\
seen('one')\n\
print('gone'); clear_output(); print('kept')\n\
seen('kept')\n\
print('old')\n\
seen('old')\n\
clear_output(wait=True)\n\
time.sleep(0.8)  # frames are sent 4 a second: a clear that did not wait would be sent meanwhile\n\
print('new')\n\
seen('new')\n\
print('stale')\n\
seen('stale')\n\
clear_output(wait=True)\n\
display('shown')\n\
seen('shown')\n\
clear_output(wait=True)  # nothing after it: never in effect\n";

#[tokio::test]
async fn clear_output_clears_the_live_output_too() {
    let dir =
        std::env::temp_dir().join(format!("pcs-live-clear-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let frames = std::sync::Arc::new(std::sync::Mutex::new(Vec::<LiveOutput>::new()));
    let sink: LiveOutputSink = {
        let (frames, dir) = (frames.clone(), dir.clone());
        std::sync::Arc::new(move |output: LiveOutput| {
            let Ok(mut frames) = frames.lock() else {
                return;
            };
            for marker in ["one", "kept", "old", "new", "stale"] {
                if output.stdout.contains(marker) {
                    let _ = std::fs::write(dir.join(marker), b"");
                }
            }
            let after_stale = frames.iter().any(|f| f.stdout.contains("stale"));
            if after_stale && output.cleared && output.stdout.is_empty() {
                let _ = std::fs::write(dir.join("shown"), b"");
            }
            frames.push(output);
        })
    };
    let mut cells = Cells::new().await;
    cells.options.live_output = Some(sink);
    let code = LIVE_CLEARS.replace("DIR", &format!("{:?}", dir.display().to_string()));
    let execution = cells.run(&code).await;
    ok(&execution);
    let frames = frames.lock().expect("frames").clone();
    let index = |marker: &str| {
        frames
            .iter()
            .position(|f| f.stdout.contains(marker))
            .unwrap_or_else(|| panic!("no live {marker}: {frames:?}"))
    };
    // Text before a clear is not shown, even when it was written in the same moment.
    let kept = &frames[index("kept")];
    assert!(kept.cleared && !kept.stdout.contains("gone"), "{frames:?}");
    assert!(!frames[index("one")].cleared, "{frames:?}");
    // wait=True: nothing cleared until new text came, then the old text gone with it.
    let (old, new) = (index("old"), index("new"));
    assert!(
        frames[old + 1..new].iter().all(|f| !f.cleared),
        "{frames:?}"
    );
    assert!(
        frames[new].cleared && !frames[new].stdout.contains("old"),
        "{frames:?}"
    );
    // A display puts a waiting clear in effect too (displays themselves are not live output);
    // the last clear, with nothing after it, is never sent.
    let last = frames.last().expect("frames");
    assert!(frames.len() > index("stale") + 1, "{frames:?}");
    assert!(
        last.cleared && last.stdout.is_empty() && last.stderr.is_empty(),
        "{frames:?}"
    );
    // The result shows the same: the display alone.
    assert_eq!(execution.outputs.len(), 1, "{:?}", execution.outputs);
    assert_eq!(plain(&execution.outputs[0]).as_deref(), Some("'shown'"));
    cells.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn live_output_keeps_the_order_the_code_wrote_the_streams_in() {
    // Each step writes stdout, stderr and stdout at once, then sleeps 100 ms: a live frame (4 a
    // second) holds whole steps, the places where the code switched streams recorded, so a frame's pieces,
    // frame after frame, are the lines in the order they were written (and frames the host read
    // late, held back by its rate, are passed as one, nothing lost).
    let frames = std::sync::Arc::new(std::sync::Mutex::new(Vec::<LiveOutput>::new()));
    let sink: LiveOutputSink = {
        let frames = frames.clone();
        std::sync::Arc::new(move |output: LiveOutput| {
            if let Ok(mut frames) = frames.lock() {
                frames.push(output);
            }
        })
    };
    let mut cells = Cells::new().await;
    cells.options.live_output = Some(sink);
    let code = "import sys, time\n\
                for i in range(8):\n\
                \x20   print(f'line {i}a', flush=True)\n\
                \x20   print(f'line {i}b', file=sys.stderr, flush=True)\n\
                \x20   print(f'line {i}c', flush=True)\n\
                \x20   time.sleep(0.1)\n";
    ok(&cells.run(code).await);
    let frames = frames.lock().expect("frames").clone();
    let mut seen = String::new();
    for frame in &frames {
        for (stream, text) in frame.in_order() {
            for line in text.lines() {
                seen.push_str(&format!("{} {line}\n", stream.as_str()));
            }
        }
    }
    let expected: String = (0..8)
        .map(|i| format!("stdout line {i}a\nstderr line {i}b\nstdout line {i}c\n"))
        .collect();
    assert_eq!(seen, expected, "{frames:?}");
    assert!(
        frames
            .iter()
            .any(|f| !f.stdout.is_empty() && !f.stderr.is_empty() && f.in_order().len() > 2),
        "no frame had the streams take turns: {frames:?}"
    );
    cells.stop().await;
}

#[tokio::test]
async fn what_a_cell_prints_is_not_kept_in_the_session() {
    // IPython 9 copies each write to the streams into its history (for `%notebook`), one list
    // entry a piece, for the session's life: 1,000,000 printed lines held about 90 MB there, and
    // each print cost several Python calls. The runner keeps no copy; the host has the output.
    let cells = Cells::new().await;
    ok(&cells
        .run("import resource\nbefore = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss")
        .await);
    let printed = cells
        .run("for i in range(1_000_000):\n    print('line', i)")
        .await;
    ok(&printed);
    assert!(
        stdout(&printed).ends_with("line 999999\n"),
        "the output's tail: {:?}",
        stdout(&printed).chars().rev().take(40).collect::<String>()
    );
    let grown = cells
        .run(
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, \
             sum(len(o) for o in get_ipython().history_manager.outputs.values()))",
        )
        .await;
    ok(&grown);
    let text = stdout(&grown);
    let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>());
    let (Some(Ok(megabytes)), Some(Ok(kept))) = (numbers.next(), numbers.next()) else {
        panic!("not two numbers: {text:?}");
    };
    assert_eq!(
        kept, 0,
        "the shell's history kept {kept} outputs of the streams"
    );
    assert!(
        megabytes < 30,
        "the runner's peak memory grew by {megabytes} MB printing 1,000,000 lines"
    );
    cells.stop().await;
}

#[tokio::test]
async fn input_raises_stdin_not_implemented_at_once() {
    let cells = Cells::new().await;
    for (code, called) in [
        ("input('name? ')", "raw_input"),
        ("import getpass\ngetpass.getpass()", "getpass"),
    ] {
        let asked = cells.run(code).await;
        assert_eq!(asked.exit_code, 1);
        // ipykernel's type and words (nbclient runs without input).
        let message =
            format!("{called} was called, but this frontend does not support input requests.");
        assert_eq!(
            asked
                .error
                .as_ref()
                .map(|e| (e.kind.as_str(), e.message.as_str())),
            Some(("StdinNotImplementedError", message.as_str())),
            "{code}"
        );
        // The runner's own frame is not in the traceback.
        assert!(
            !stderr(&asked).contains("sandbox-runner"),
            "{}",
            stderr(&asked)
        );
    }
    let caught = cells
        .run("from IPython.core.error import StdinNotImplementedError\ntry:\n    input()\nexcept StdinNotImplementedError:\n    print('caught')")
        .await;
    assert_eq!(stdout(&caught), "caught\n");
    cells.stop().await;
}

#[tokio::test]
async fn a_traceback_is_ipythons_naming_the_cell_and_line_without_colours() {
    let cells = Cells::new().await;
    cells.run("a = 1").await;
    cells.run("b = 2").await;
    let failed = cells.run("def f():\n    return 1 / 0\nf()").await;
    assert_eq!(failed.exit_code, 1);
    let error = failed.error.as_ref().expect("an error");
    assert_eq!(error.kind, "ZeroDivisionError");
    assert_eq!(error.message, "division by zero");
    let Some(Output::Error {
        ename, traceback, ..
    }) = failed.outputs.last()
    else {
        panic!("an error output: {:?}", failed.outputs);
    };
    assert_eq!(ename, "ZeroDivisionError");
    let text = traceback.join("\n");
    assert!(text.contains("Cell In[3], line 3"), "{text}");
    assert!(text.contains("Cell In[3], line 2, in f()"), "{text}");
    assert!(text.contains("----> 2     return 1 / 0"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(!text.contains("sandbox-runner"), "{text}");
    // The traceback is the error output, not stream text shown a second time.
    assert!(
        !failed.outputs.iter().any(|o| matches!(
            o,
            Output::Stream {
                name: StreamName::Stderr,
                ..
            }
        )),
        "{:?}",
        failed.outputs
    );
    let syntax = cells.run("def broken(:\n    pass").await;
    assert_eq!(syntax.exit_code, 1);
    assert_eq!(
        syntax.error.as_ref().map(|e| e.kind.as_str()),
        Some("SyntaxError")
    );
    assert!(
        stderr(&syntax).contains("Cell In[4], line 1"),
        "{}",
        stderr(&syntax)
    );
    cells.stop().await;
}

#[tokio::test]
async fn system_exit_is_an_error_as_ipykernel_shows_it_and_an_ephemeral_run_counts_from_one() {
    let cells = Cells::new().await;
    // As ipykernel: the exception only, as an error output, and IPython's advice on stderr.
    let exited = cells.run("import sys\nprint('bye')\nsys.exit(3)").await;
    assert_eq!(exited.exit_code, 3);
    let error = exited.error.as_ref().expect("an error");
    assert_eq!(
        (error.kind.as_str(), error.message.as_str()),
        ("SystemExit", "3")
    );
    assert!(!exited.succeeded());
    assert_eq!(stdout(&exited), "bye\n");
    let errors: Vec<_> = exited
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Error {
                ename,
                evalue,
                traceback,
            } => Some((ename.as_str(), evalue.as_str(), traceback.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [(
            "SystemExit",
            "3",
            vec![
                "An exception has occurred, use %tb to see the full traceback.\n".to_string(),
                "SystemExit: 3\n".to_string()
            ]
        )],
        "{:?}",
        exited.outputs
    );
    assert!(
        stderr(&exited).contains("UserWarning: To exit: use 'exit', 'quit', or Ctrl-D."),
        "{}",
        stderr(&exited)
    );
    // Status 0 is an error too (a notebook's run stops there), with the value IPython shows.
    let zero = cells.run("raise SystemExit").await;
    assert_eq!(zero.exit_code, 0);
    assert_eq!(
        zero.error.as_ref().map(|e| e.kind.as_str()),
        Some("SystemExit")
    );
    assert!(!zero.succeeded());
    // exit() and quit() end the execution quietly with their status (the session stays).
    let quit = cells.run("print('before')\nexit(4)\nprint('after')").await;
    assert_eq!((quit.exit_code, stdout(&quit).as_str()), (4, "before\n"));
    assert!(
        quit.error.is_none()
            && quit
                .outputs
                .iter()
                .all(|o| !matches!(o, Output::Error { .. }))
    );
    assert_eq!(stderr(&quit), "");
    // A status past 64 bits is Python's own exit's: -1; the session goes on.
    let huge = cells.run("exit(2**64)").await;
    assert_eq!(huge.exit_code, -1, "{huge:?}");
    assert_eq!(
        stdout(&cells.run("print('still here')").await),
        "still here\n"
    );
    // A program (the CLI's `run`) ends with its status only, as `python FILE` does.
    let program = within(
        LIMIT,
        cells.engine.execute_in_session(
            Scope::Server,
            &cells.id,
            Task::Script("import sys\nsys.exit(5)"),
            &cells.options,
        ),
    )
    .await
    .expect("execute");
    assert_eq!(program.exit_code, 5);
    assert!(program.error.is_none(), "{:?}", program.error);
    assert_eq!(stderr(&program), "");
    cells.stop().await;
    let (engine, _fake) = engine_with(|_| {});
    for _ in 0..2 {
        let run = within(
            LIMIT,
            engine.run_ephemeral(Task::Python("7"), &RunOptions::default()),
        )
        .await
        .expect("run");
        assert_eq!(value(&run), Some(("7".into(), 1)));
    }
}

#[tokio::test]
async fn a_snapshot_keeps_the_sessions_variables_and_not_ipythons() {
    let dir = std::env::temp_dir().join(format!("pcs-ipy-snap-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let snapshots = dir.clone();
    let cells = Cells::with(move |config| config.snapshots.dir = Some(snapshots)).await;
    ok(&cells.run("kept = [1, 2]\nkept").await);
    ok(&cells.run("import json\nalso = 3").await);
    let meta = cells
        .engine
        .snapshot_session(Scope::Server, &cells.id, None)
        .await
        .expect("snapshot");
    let mut saved = meta.saved.clone();
    saved.sort();
    assert_eq!(saved, vec!["also".to_string(), "kept".to_string()]);
    assert_eq!(meta.modules, vec!["json".to_string()]);
    let (restored_id, restored) = cells
        .engine
        .restore_session(Scope::Server, &meta.id, &cells.options)
        .await
        .expect("restore");
    let mut variables = restored.variables.clone();
    variables.sort();
    assert_eq!(variables, vec!["also".to_string(), "kept".to_string()]);
    let check = within(
        LIMIT,
        cells.engine.execute_in_session(
            Scope::Server,
            &restored_id,
            Task::Python("kept + [also], json.dumps(1), len(Out)"),
            &cells.options,
        ),
    )
    .await
    .expect("execute");
    assert_eq!(
        value(&check),
        Some(("([1, 2, 3], '1', 0)".into(), 1)),
        "{}",
        stderr(&check)
    );
    cells
        .engine
        .stop_session(Scope::Server, &restored_id)
        .await
        .expect("stop");
    cells.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_raw_bundle_is_shown_as_given_without_a_text_plain_added() {
    let cells = Cells::new().await;
    let shown = cells
        .run(
            "from IPython.display import display\ndisplay({'application/x-custom': 'v'}, raw=True)",
        )
        .await;
    let bundles: Vec<_> = shown.outputs.iter().filter_map(Output::bundle).collect();
    assert_eq!(
        bundles,
        [&vec![("application/x-custom".to_string(), "v".to_string())]],
        "{:?}",
        shown.outputs
    );
    cells.stop().await;
}

#[tokio::test]
async fn stdout_stderr_and_displays_keep_the_order_the_code_wrote_them_in() {
    let cells = Cells::new().await;
    let code = "\
import logging, sys, warnings
print('Bar!', file=sys.stderr); print('Combo breaker!'); print('Foo!', file=sys.stderr)
print('before the warning')
warnings.warn('careful')
print('after the warning')
display('shown')
logging.basicConfig(format='%(message)s')
logging.getLogger('x').warning('logged')
print('end', flush=True)
_ = sys.stderr.write('no newline')
";
    let ran = cells.run(code).await;
    let shown: Vec<(&str, String)> = ran
        .outputs
        .iter()
        .map(|o| match o {
            Output::Stream { name, text } => (name.as_str(), text.clone()),
            other => ("display", plain(other).unwrap_or_default()),
        })
        .collect();
    let warning = shown
        .get(4)
        .map(|(_, text)| text.clone())
        .unwrap_or_default();
    assert!(warning.contains("UserWarning: careful"), "{shown:?}");
    assert_eq!(
        shown,
        [
            ("stderr", "Bar!\n".to_string()),
            ("stdout", "Combo breaker!\n".into()),
            ("stderr", "Foo!\n".into()),
            ("stdout", "before the warning\n".into()),
            ("stderr", warning.clone()),
            ("stdout", "after the warning\n".into()),
            ("display", "'shown'".into()),
            ("stderr", "logged\n".into()),
            ("stdout", "end\n".into()),
            ("stderr", "no newline".into()),
        ]
    );
    cells.stop().await;
}

#[tokio::test]
async fn a_subprocess_between_the_streams_neither_cuts_a_line_nor_moves_the_order() {
    // A subprocess's bytes reach stdout's pipe without the runner's count: the place where the
    // code went from stderr back to stdout is recorded as it starts. A stdout whose flush logs to
    // stderr does not make a stderr write look at the pipes again and again.
    let cells = Cells::new().await;
    let code = "\
import subprocess, sys
print('A', file=sys.stderr); print('key=123456789')
subprocess.run(['echo', '12345678'])
print('B', file=sys.stderr)
subprocess.run(['echo', 'after B'])
print('C', file=sys.stderr)
class Logged:
    def write(self, text): return sys.__stdout__.write(text)
    def flush(self): print('flushed', file=sys.__stderr__)
sys.stdout = Logged()
print('D', file=sys.__stderr__); sys.__stdout__.write('E\\n'); print('F', file=sys.__stderr__)
sys.stdout = sys.__stdout__
";
    let ran = cells.run(code).await;
    ok(&ran);
    let shown: Vec<(&str, &str)> = ran
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Stream { name, text } => Some((name.as_str(), text.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("stderr", "A\n"),
            ("stdout", "key=123456789\n12345678\n"),
            ("stderr", "B\n"),
            ("stdout", "after B\n"),
            // The flush's own line goes with the stderr text before the place it was made for.
            ("stderr", "C\nD\nflushed\n"),
            ("stdout", "E\n"),
            ("stderr", "F\n"),
        ],
    );
    cells.stop().await;
}

#[tokio::test]
async fn cells_are_named_as_ipykernel_names_them_and_the_shell_passes_for_a_kernels() {
    let cells = Cells::new().await;
    // ipykernel's name: /tmp/ipykernel_<pid>/<MurmurHash2 of the source, its seed>.py.
    let failed = cells.run("print \"hi\"").await;
    let message = failed.error.as_ref().map(|e| e.message.clone());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.ends_with("(357452326.py, line 1)")),
        "{message:?}"
    );
    let warned = cells.run("import warnings\nwarnings.warn('x')").await;
    assert!(
        stderr(&warned).starts_with("/tmp/ipykernel_")
            && stderr(&warned).contains(".py:2: UserWarning: x"),
        "{}",
        stderr(&warned)
    );
    // What pandas and others look for to format for a notebook.
    let shell = cells.run("print(type(get_ipython()).__name__)").await;
    assert_eq!(stdout(&shell), "ZMQInteractiveShell\n");
    cells.stop().await;
}
