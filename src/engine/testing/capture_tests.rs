//! Output over the cap (`SANDBOX_MAX_OUTPUT`), as the runner's capture keeps it: each stream over
//! its share keeps its head and its tail in whole lines, and the line between them says exactly
//! how much was dropped there; displays keep their order around the cut. Cells run through
//! IPython, so these need `PCS_TEST_IPYTHON` as the IPython tests do.

use std::time::Duration;

use super::{engine_with, within};
use crate::engine::outcome::{Discarded, Output, StreamName};
use crate::engine::{Engine, Execution, RunOptions, Task};

const LIMIT: Duration = Duration::from_secs(60);
const CAP: u64 = 64 << 10;

fn engine() -> std::sync::Arc<Engine> {
    engine_with(|config| config.limits.max_output_bytes = CAP).0
}

async fn run(engine: &Engine, code: &str) -> Execution {
    within(
        LIMIT,
        engine.run_ephemeral(Task::Python(code), &RunOptions::default()),
    )
    .await
    .expect("run")
}

/// Lines `from..to` as `print(f"{prefix} {i:05}")` writes them.
fn lines(prefix: &str, from: usize, to: usize) -> String {
    (from..to).map(|i| format!("{prefix} {i:05}\n")).collect()
}

/// Checks a stream kept as head, line, tail against what the code wrote (`whole`), and returns
/// head and tail.
fn check_cut<'a>(
    name: StreamName,
    kept: &'a [u8],
    d: &Discarded,
    whole: &[u8],
) -> (&'a [u8], &'a [u8]) {
    let head = &kept[..d.at];
    let line = &kept[d.range()];
    let tail = &kept[d.range().end..];
    assert_eq!(tail.len(), d.tail);
    assert!(
        whole.starts_with(head),
        "the head is the first bytes written"
    );
    assert!(whole.ends_with(tail), "the tail is the last bytes written");
    let dropped = &whole[head.len()..whole.len() - tail.len()];
    assert_eq!(d.bytes, dropped.len() as u64, "exactly the bytes dropped");
    let spanned =
        dropped.iter().filter(|b| **b == b'\n').count() + usize::from(!dropped.ends_with(b"\n"));
    assert_eq!(d.lines, spanned as u64);
    assert_eq!(d.limit, CAP);
    let marker = d.marker(name);
    let text = String::from_utf8_lossy(line);
    assert_eq!(text.trim_start_matches('\n'), format!("{marker}\n"));
    assert!(
        marker.starts_with(&format!("[… {} bytes ({} line", dropped.len(), spanned)),
        "{marker}"
    );
    // Whole lines, unless a part has no line break at all; never a character cut in two.
    if head.contains(&b'\n') {
        assert!(head.ends_with(b"\n"), "the head ends a line");
    }
    if tail[..tail.len().saturating_sub(1)].contains(&b'\n') {
        assert_eq!(dropped.last(), Some(&b'\n'), "the tail starts a line");
    }
    assert!(std::str::from_utf8(head).is_ok() && std::str::from_utf8(tail).is_ok());
    (head, tail)
}

#[tokio::test]
async fn a_stream_over_the_cap_keeps_its_first_and_last_lines_and_counts_the_middle() {
    let engine = engine();
    let code = "for i in range(20_000):\n    print(f'line {i:05}')\nprint('FINAL RESULT 42')";
    let execution = run(&engine, code).await;
    assert_eq!(execution.exit_code, 0, "{execution:?}");
    let whole = lines("line", 0, 20_000) + "FINAL RESULT 42\n";
    let d = execution.discarded[0].clone().expect("stdout was cut");
    assert!(execution.discarded[1].is_none() && execution.stderr.is_empty());
    let (head, tail) = check_cut(StreamName::Stdout, &execution.stdout, &d, whole.as_bytes());
    assert!(head.starts_with(b"line 00000\nline 00001\n"));
    assert!(tail.ends_with(b"line 19999\nFINAL RESULT 42\n"));
    // Stdout alone: half the cap each, less at most a line.
    let half = (CAP / 2) as usize;
    assert!(
        head.len() <= half && head.len() > half - 11,
        "{}",
        head.len()
    );
    assert!(
        tail.len() <= half && tail.len() > half - 16,
        "{}",
        tail.len()
    );
    assert_eq!(execution.truncated_bytes, d.bytes);
    assert_eq!(
        (head.len() + tail.len()) as u64 + d.bytes,
        whole.len() as u64
    );
}

#[tokio::test]
async fn two_streams_over_the_cap_share_it_and_a_short_one_stays_whole() {
    let engine = engine();
    let code = "import sys\nfor i in range(20_000):\n    print(f'out {i:05}')\n    print(f'err {i:05}', file=sys.stderr)\n";
    let both = run(&engine, code).await;
    let quarter = (CAP / 4) as usize;
    for (name, kept, d, prefix) in [
        (StreamName::Stdout, &both.stdout, &both.discarded[0], "out"),
        (StreamName::Stderr, &both.stderr, &both.discarded[1], "err"),
    ] {
        let d = d.clone().expect("both cut");
        let whole = lines(prefix, 0, 20_000);
        let (head, tail) = check_cut(name, kept, &d, whole.as_bytes());
        assert!(head.len() <= quarter && head.len() > quarter - 10);
        assert!(tail.len() <= quarter && tail.len() > quarter - 10);
    }
    assert_eq!(
        both.truncated_bytes,
        both.discarded
            .iter()
            .flatten()
            .map(|d| d.bytes)
            .sum::<u64>()
    );
    // A short stderr keeps all it has; stdout gets the rest of the cap.
    let code = "import sys\nprint('short ' * 100, file=sys.stderr)\nfor i in range(20_000):\n    print(f'out {i:05}')\n";
    let one = run(&engine, code).await;
    assert!(one.discarded[1].is_none());
    let stderr = "short ".repeat(100) + "\n";
    assert_eq!(String::from_utf8_lossy(&one.stderr), stderr);
    let d = one.discarded[0].clone().expect("stdout cut");
    let (head, tail) = check_cut(
        StreamName::Stdout,
        &one.stdout,
        &d,
        lines("out", 0, 20_000).as_bytes(),
    );
    let share = CAP as usize - stderr.len();
    assert!(head.len() <= share / 2 && head.len() > share / 2 - 10);
    assert!(tail.len() <= share - share / 2 && tail.len() > share - share / 2 - 10);
    // Within the cap together, both are whole.
    let code = "import sys\nprint('o' * 30_000)\nprint('e' * 30_000, file=sys.stderr)\n";
    let fits = run(&engine, code).await;
    assert_eq!(fits.discarded, [None, None]);
    assert_eq!((fits.stdout.len(), fits.stderr.len()), (30_001, 30_001));
    assert_eq!(fits.truncated_bytes, 0);
}

#[tokio::test]
async fn a_part_without_line_breaks_is_cut_between_characters() {
    let engine = engine();
    // One line of 210 000 bytes of three-byte characters, no line break at all: half the cap
    // falls within a character, at both ends.
    let execution = run(&engine, "print('€' * 70_000, end='')").await;
    let d = execution.discarded[0].clone().expect("cut");
    let whole = "€".repeat(70_000);
    let (head, tail) = check_cut(StreamName::Stdout, &execution.stdout, &d, whole.as_bytes());
    assert_eq!(d.lines, 1);
    assert_eq!((head.len(), tail.len()), (32_766, 32_766));
    // The line between them starts a line of its own.
    assert_eq!(execution.stdout[d.at], b'\n');
    // A short first line and a long last one: the head is the short line, the tail the end of
    // the last line (the only one it has).
    let execution = run(&engine, "print('short')\nprint('x' * 200_000)").await;
    let d = execution.discarded[0].clone().expect("cut");
    let whole = format!("short\n{}\n", "x".repeat(200_000));
    let (head, tail) = check_cut(StreamName::Stdout, &execution.stdout, &d, whole.as_bytes());
    assert_eq!(head, b"short\n");
    assert!(tail.len() > 32_000 && tail.ends_with(b"xxx\n"));
    assert_eq!(d.lines, 1);
}

#[tokio::test]
async fn displays_before_within_and_after_the_cut_keep_their_order() {
    let engine = engine();
    let code = "\
for i in range(100):
    print(f'line {i:05}')
display('before')
for i in range(100, 10_000):
    print(f'line {i:05}')
display('middle')
for i in range(10_000, 19_990):
    print(f'line {i:05}')
display('end')
for i in range(19_990, 20_000):
    print(f'line {i:05}')
";
    let execution = run(&engine, code).await;
    assert_eq!(execution.exit_code, 0, "{execution:?}");
    let d = execution.discarded[0].clone().expect("cut");
    let whole = lines("line", 0, 20_000);
    check_cut(StreamName::Stdout, &execution.stdout, &d, whole.as_bytes());
    let marker = d.marker(StreamName::Stdout);
    let kinds: Vec<String> = execution
        .outputs
        .iter()
        .map(|o| match o {
            Output::Stream { text, .. } if text.contains(&marker) => "stream with the line".into(),
            Output::Stream { .. } => "stream".into(),
            other => other
                .bundle()
                .and_then(|b| b.iter().find(|(m, _)| m == "text/plain"))
                .map_or("?".into(), |(_, v)| v.clone()),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "stream",
            "'before'",
            "stream with the line",
            "'middle'",
            "stream",
            "'end'",
            "stream"
        ]
    );
    // The streams among the outputs are the kept stdout, the line once.
    let text: String = execution
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Stream { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text.as_bytes(), execution.stdout.as_slice());
    assert_eq!(text.matches(&marker).count(), 1);
    assert!(text.ends_with("line 19999\n"));
}

#[tokio::test]
async fn a_traceback_after_a_flood_of_stderr_is_in_the_tail() {
    let engine = engine();
    let code = "import sys\nfor i in range(20_000):\n    print(f'warn {i:05}', file=sys.stderr)\nraise ValueError('the end')";
    let execution = run(&engine, code).await;
    assert_eq!(execution.exit_code, 1);
    let d = execution.discarded[1].clone().expect("stderr cut");
    let kept = String::from_utf8_lossy(&execution.stderr);
    assert!(kept.starts_with("warn 00000\n"));
    assert!(kept.contains(&d.marker(StreamName::Stderr)));
    assert!(
        kept.trim_end().ends_with("ValueError: the end"),
        "{}",
        &kept[kept.len() - 300..]
    );
    assert!(matches!(
        execution.outputs.last(),
        Some(Output::Error { ename, .. }) if ename == "ValueError"
    ));
    let streams: Vec<&str> = execution
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Stream { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        streams
            .iter()
            .map(|t| t.matches(&d.marker(StreamName::Stderr)).count())
            .sum::<usize>(),
        1
    );
}

#[tokio::test]
async fn more_than_a_pipe_holds_at_once_is_read_while_the_code_waits_on_it() {
    // A short execution's pipes are read by the executing thread once the code is done; code that
    // writes more than a pipe holds before anything else reads it waits until the capture thread
    // takes the pipes over: never for ever, and nothing is lost, from the code or from a child.
    let engine = engine();
    let code = "import subprocess, sys\n\
                sys.stdout.write('a' * (3 << 20) + '\\n')\n\
                subprocess.run([sys.executable, '-c', 'import os; os.write(1, b\"b\" * (3 << 20) + b\"\\\\n\")'])\n\
                print('FINAL RESULT 42')";
    let execution = run(&engine, code).await;
    assert_eq!(execution.exit_code, 0, "{execution:?}");
    let whole = "a".repeat(3 << 20) + "\n" + &"b".repeat(3 << 20) + "\nFINAL RESULT 42\n";
    let d = execution.discarded[0].clone().expect("stdout was cut");
    let (head, tail) = check_cut(StreamName::Stdout, &execution.stdout, &d, whole.as_bytes());
    assert!(head.starts_with(b"aaaa"), "the head is the first bytes");
    assert_eq!(
        tail, b"FINAL RESULT 42\n",
        "the tail starts at the last line"
    );
}

#[tokio::test]
async fn an_interrupt_while_stdout_writes_neither_repeats_nor_cuts_a_line() {
    // The runner's stdout stack (its text object's buffer and file types) over a pipe read slowly
    // in small pieces, so that writes block and come back partial, interrupted 200 times through
    // the runner's own SIGINT handler while the code prints whole lines and carries on. Python's
    // BufferedWriter takes an exception from its file as "nothing written": one raised in a method
    // of ours after the system call wrote made the buffer write those bytes again.
    let engine = engine();
    let code = r#"
import io, os, signal, sys, threading, time
r, w = os.pipe()
raw = type(sys.stdout.buffer.raw)(w, 'w', closefd=False)
out = io.TextIOWrapper(type(sys.stdout.buffer)(raw, 1 << 16), encoding='utf-8')
got = bytearray()
def read():
    while chunk := os.read(r, 3000):
        got.extend(chunk)
        time.sleep(0.0002)
reader = threading.Thread(target=read)
reader.start()
# The first interrupt waits until the loop below is inside its `try`: on a loaded machine it came
# before, and ended the code.
inside = threading.Event()
def interrupt():
    inside.wait()
    for _ in range(200):
        time.sleep(0.003)
        os.kill(os.getpid(), signal.SIGINT)
interrupter = threading.Thread(target=interrupt)
interrupter.start()
interrupted = 0
while True:
    try:
        inside.set()
        while interrupter.is_alive():
            out.write('x' * 1000 + '\n')
        # The last interrupt is sent before the thread ends: it lands by the end of the sleep.
        interrupter.join()
        time.sleep(0.05)
        break
    except KeyboardInterrupt:
        interrupted += 1
out.flush()
os.close(w)
reader.join()
lines = bytes(got).split(b'\n')
print(interrupted, 'interrupts', len(lines) - 1, 'lines', sum(len(l) != 1000 for l in lines[:-1]), 'cut or repeated')
"#;
    let execution = run(&engine, code).await;
    let text = String::from_utf8_lossy(&execution.stdout);
    assert!(execution.succeeded(), "{execution:?}");
    let words: Vec<&str> = text.split_whitespace().collect();
    let interrupts: usize = words[0].parse().expect("a count");
    assert!(interrupts > 100, "{text}");
    assert!(text.trim_end().ends_with(" 0 cut or repeated"), "{text}");
}
