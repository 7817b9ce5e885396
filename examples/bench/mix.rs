//! The soak's programs: short Python programs, each with the one result it must give, and the
//! checks of a tool result and of a `docker run` against it. Some fail on purpose (an exception,
//! a non-zero exit, a run past the time limit): those failures are the programs' own, and a call
//! that gives them is correct.

use rmcp::model::CallToolResult;
use serde_json::Value;

/// What a program must give.
pub(crate) enum Expect {
    /// Exit status 0 and exactly this on stdout, nothing on stderr.
    Stdout(String),
    /// Exit status 0 and `lines` lines `line i` on stdout; a tool result may hold only their
    /// head and tail (cut for the model), and then says so.
    Lines(u32),
    /// The code's own uncaught exception: its type and message.
    Raises {
        kind: &'static str,
        message: &'static str,
    },
    /// `sys.exit(code)` after writing `stderr` to stderr.
    Exits { code: i32, stderr: &'static str },
    /// Runs until the per-call time limit stops it.
    TimesOut,
}

pub(crate) struct Program {
    pub(crate) name: &'static str,
    pub(crate) code: String,
    pub(crate) expect: Expect,
}

impl Program {
    /// Whether the program's correct result is a failure of its own.
    pub(crate) fn fails_on_purpose(&self) -> bool {
        !matches!(self.expect, Expect::Stdout(_) | Expect::Lines(_))
    }
}

/// How one call ended against its program's expected result.
pub(crate) enum Verdict {
    /// The expected result (a failure of the program's own included).
    Correct,
    /// Anything else: a wrong result, a tool error, an MCP error, an engine error.
    Wrong(String),
}

const SUM_TO: u128 = 200_000;
const SORT_LEN: u64 = 20_000;
const SMALL_LINES: u32 = 200;
const BIG_LINES: u32 = 20_000;

/// The programs, each once.
pub(crate) fn programs() -> Vec<Program> {
    vec![
        Program {
            name: "sum",
            code: format!("s = 0\nfor i in range({SUM_TO}):\n    s += i * i\nprint(s)\n"),
            expect: Expect::Stdout(format!("{}\n", sum_of_squares(SUM_TO))),
        },
        Program {
            name: "sort",
            code: format!(
                "xs = [(i * 7919 + 13) % 100003 for i in range({SORT_LEN})]\n\
                 xs.sort()\n\
                 print(xs[0], xs[len(xs) // 2], xs[-1], sum(xs[::97]))\n"
            ),
            expect: Expect::Stdout(sorted_summary(SORT_LEN)),
        },
        Program {
            name: "hello",
            code: "print('hello')\n".into(),
            expect: Expect::Stdout("hello\n".into()),
        },
        Program {
            name: "print-200",
            code: lines_code(SMALL_LINES),
            expect: Expect::Lines(SMALL_LINES),
        },
        Program {
            name: "print-20000",
            code: lines_code(BIG_LINES),
            expect: Expect::Lines(BIG_LINES),
        },
        Program {
            name: "raise",
            code: "def check(n):\n    raise ValueError(f'bench: {n} on purpose')\ncheck(7)\n"
                .into(),
            expect: Expect::Raises {
                kind: "ValueError",
                message: "bench: 7 on purpose",
            },
        },
        Program {
            name: "exit-3",
            code: "import sys\nprint('bench: exiting with 3', file=sys.stderr)\nsys.exit(3)\n"
                .into(),
            expect: Expect::Exits {
                code: 3,
                stderr: "bench: exiting with 3",
            },
        },
        Program {
            name: "timeout",
            code: "n = 0\nwhile True:\n    n += 1\n".into(),
            expect: Expect::TimesOut,
        },
    ]
}

/// The order each caller runs the programs in (indexes into [`programs`]), from its own starting
/// point: one run past the time limit in every 20 calls.
pub(crate) const CYCLE: [usize; 20] = [0, 1, 2, 3, 0, 1, 5, 4, 0, 1, 2, 6, 0, 1, 3, 4, 0, 1, 2, 7];

fn sum_of_squares(n: u128) -> u128 {
    (n - 1) * n * (2 * n - 1) / 6
}

fn sorted_summary(len: u64) -> String {
    let mut xs: Vec<u64> = (0..len).map(|i| (i * 7919 + 13) % 100_003).collect();
    xs.sort_unstable();
    let (first, middle, last) = (xs[0], xs[xs.len() / 2], xs[xs.len() - 1]);
    let every: u64 = xs.iter().step_by(97).sum();
    format!("{first} {middle} {last} {every}\n")
}

fn lines_code(lines: u32) -> String {
    format!("for i in range({lines}):\n    print('line', i)\n")
}

fn lines(n: u32) -> String {
    (0..n).map(|i| format!("line {i}\n")).collect()
}

/// A bounded, escaped excerpt of text from a container or the server, for a message.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX: usize = 240;
    let mut cut: String = text.chars().take(MAX).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// Checks a `run_python_ephemeral` result against the program's expected result.
pub(crate) fn check_tool_result(program: &Program, result: &CallToolResult) -> Verdict {
    let Some(s) = result.structured_content.as_ref() else {
        // An error result without an execution: the engine or the server failed.
        let text = result
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.as_str())
            .unwrap_or("(no text)");
        return Verdict::Wrong(format!("tool error: {}", excerpt(text)));
    };
    let is_error = result.is_error == Some(true);
    let exit = s["exit_code"].as_i64();
    let timed_out = s["timed_out"].as_bool() == Some(true);
    let stdout = s["stdout"].as_str().unwrap_or_default();
    let stderr = s["stderr"].as_str().unwrap_or_default();
    let facts = || {
        format!(
            "error result {is_error}, exit {exit:?}, timed out {timed_out}, stdout {}, stderr {}",
            excerpt(stdout),
            excerpt(stderr)
        )
    };
    let correct = match &program.expect {
        Expect::Stdout(want) => {
            !is_error && exit == Some(0) && !timed_out && stdout == want && stderr.is_empty()
        }
        Expect::Lines(n) => {
            let whole = lines(*n);
            let cut_for_model = !s["stdout_cut"].is_null();
            let shown = if cut_for_model {
                stdout.starts_with("line 0\nline 1\n")
                    && stdout.ends_with(&format!("line {}\n", n - 1))
            } else {
                stdout == whole
            };
            !is_error
                && exit == Some(0)
                && !timed_out
                && shown
                && s["truncated"] == Value::Bool(false)
        }
        Expect::Raises { kind, message } => {
            is_error
                && exit == Some(1)
                && !timed_out
                && s["error"]["type"].as_str() == Some(kind)
                && s["error"]["message"].as_str() == Some(message)
        }
        Expect::Exits { code, stderr: want } => {
            is_error && exit == Some(i64::from(*code)) && !timed_out && stderr.contains(want)
        }
        Expect::TimesOut => is_error && timed_out,
    };
    if correct {
        Verdict::Correct
    } else {
        Verdict::Wrong(format!("wrong result: {}", facts()))
    }
}

/// What a `docker run` of a program gave: the CLI's exit status and the (bounded) streams.
pub(crate) struct RunOutput {
    pub(crate) status: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// The exit status of coreutils' `timeout` when the limit stopped the command.
pub(crate) const TIMEOUT_STATUS: i32 = 124;

/// Checks the output of a program run as `timeout LIMIT python3 -c CODE` under `docker run`.
pub(crate) fn check_run_output(program: &Program, out: &RunOutput) -> Verdict {
    let correct = match &program.expect {
        Expect::Stdout(want) => out.status == Some(0) && out.stdout == *want,
        Expect::Lines(n) => out.status == Some(0) && out.stdout == lines(*n),
        Expect::Raises { kind, message } => {
            out.status == Some(1) && out.stderr.contains(&format!("{kind}: {message}"))
        }
        Expect::Exits { code, stderr } => out.status == Some(*code) && out.stderr.contains(stderr),
        Expect::TimesOut => out.status == Some(TIMEOUT_STATUS),
    };
    if correct {
        Verdict::Correct
    } else {
        Verdict::Wrong(format!(
            "wrong result: exit {:?}, stdout {}, stderr {}",
            out.status,
            excerpt(&out.stdout),
            excerpt(&out.stderr)
        ))
    }
}
