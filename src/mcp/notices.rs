//! One tool call's notifications to its client: the steps of preparing a sandbox, and the code's
//! output while it runs (live output), as `notifications/progress` when the call carries a
//! progress token and as `notifications/message` (`info`) when the client's log level admits them.
//!
//! Every notice goes through one queue and one task that sends them in order and waits for each to
//! be written; the call waits for that queue to empty ([`CallNotices::finish`]) before it returns
//! its result, so a client sees every notice of a call before the call's result. Neither sink
//! ever waits: a notice that finds the queue full (a client that does not read) is dropped. The
//! engine already holds live output to a few messages a second, each bounded.
//!
//! Live output as the client sees it: a progress message with the latest lines the code wrote
//! (at most [`PROGRESS_LINES`] lines and [`PROGRESS_CHARS`] characters), and log messages,
//! logger `python-code-sandbox`, data `stdout: <text>` or `stderr: <text>`, one for each piece of
//! text a stream got since the previous message, in the order the code wrote them (one per stream
//! past [`LOG_PIECES`] pieces; at most 4 KiB of each stream; what was skipped is said first).
//!
//! A `clear_output()` in the code clears the live view as it clears a notebook's (the runner
//! marks the next live message `cleared`, its text only what came after; `wait=True` clears when
//! the next text or display comes): the progress message shows only the lines after the clear, or
//! [`CLEARED`] when none came yet, and each log message of a cleared message says so,
//! `stdout (output cleared): <text>` (the clear is of both streams), or is [`CLEARED`] alone when
//! no text came after it. Displays are not live output (only the streams are); they come with the
//! result.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc;

use crate::engine::outcome::StreamName;
use crate::engine::{LiveOutput, LiveOutputSink, ProgressSink};
use crate::mcp::logging::RequestLog;

/// Notices waiting to be sent, at most: the rest are dropped.
const QUEUE: usize = 64;
/// How long a call waits for its notices to be sent before returning its result anyway.
const FINISH_WAIT: Duration = Duration::from_secs(5);
/// What a progress message shows of live output.
pub const PROGRESS_LINES: usize = 3;
pub const PROGRESS_CHARS: usize = 300;
/// What the client is shown of a clear with no text after it yet.
pub const CLEARED: &str = "(output cleared)";
/// The most log messages one live output gives, one a piece of text in the code's order.
const LOG_PIECES: usize = 8;

enum Notice {
    /// A step of the call ("starting the sandbox").
    Step(String),
    Live(LiveOutput),
    /// The call is done: everything queued before this has been sent.
    Done(tokio::sync::oneshot::Sender<()>),
}

/// The notices of one call; `None` from [`CallNotices::start`] when the client wants none.
pub struct CallNotices {
    queue: mpsc::Sender<Notice>,
}

impl CallNotices {
    pub fn start(
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        log: RequestLog,
    ) -> Option<CallNotices> {
        if token.is_none() && !log.wants_info() {
            return None;
        }
        let (queue, mut notices) = mpsc::channel(QUEUE);
        tokio::spawn(async move {
            let mut step = 0u32;
            while let Some(notice) = notices.recv().await {
                let (progress, logs) = match notice {
                    Notice::Step(message) => (Some(message.clone()), vec![message]),
                    Notice::Live(output) => (latest_lines(&output), log_messages(&output)),
                    Notice::Done(done) => {
                        let _ = done.send(());
                        return;
                    }
                };
                for message in logs {
                    log.info_now(&message).await;
                }
                if let (Some(token), Some(message)) = (&token, progress) {
                    step += 1;
                    let param = ProgressNotificationParam::new(token.clone(), f64::from(step))
                        .with_message(message);
                    let _ = peer.notify_progress(param).await;
                }
            }
        });
        Some(CallNotices { queue })
    }

    /// The sink for the steps of preparing a sandbox.
    pub fn steps(&self) -> ProgressSink {
        let queue = self.queue.clone();
        Arc::new(move |message: &str| {
            let _ = queue.try_send(Notice::Step(message.to_string()));
        })
    }

    /// The sink for the code's output while it runs.
    pub fn live_output(&self) -> LiveOutputSink {
        let queue = self.queue.clone();
        Arc::new(move |output: LiveOutput| {
            let _ = queue.try_send(Notice::Live(output));
        })
    }

    /// Waits (a bounded time) until every notice queued so far has been sent.
    pub async fn finish(self) {
        let (done, sent) = tokio::sync::oneshot::channel();
        let wait = async {
            if self.queue.send(Notice::Done(done)).await.is_ok() {
                let _ = sent.await;
            }
        };
        let _ = tokio::time::timeout(FINISH_WAIT, wait).await;
    }
}

/// The progress message for live output: its latest non-blank lines, in the order the code
/// wrote them (a piece of the other stream starts a line).
fn latest_lines(output: &LiveOutput) -> Option<String> {
    let mut text = String::new();
    for (_, piece) in output.in_order() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(piece);
    }
    let mut lines: Vec<&str> = text
        .lines()
        .rev()
        .filter(|line| !line.trim().is_empty())
        .take(PROGRESS_LINES)
        .collect();
    if lines.is_empty() {
        return output.cleared.then(|| CLEARED.to_string());
    }
    lines.reverse();
    let message = lines.join("\n");
    let chars = message.chars().count();
    Some(if chars > PROGRESS_CHARS {
        let tail: String = message.chars().skip(chars - PROGRESS_CHARS + 1).collect();
        format!("…{tail}")
    } else {
        message
    })
}

/// One log message per piece of text, in the order the code wrote them (one per stream past
/// [`LOG_PIECES`] pieces); a clear with no text after it is one message.
fn log_messages(output: &LiveOutput) -> Vec<String> {
    let cleared = if output.cleared {
        " (output cleared)"
    } else {
        ""
    };
    let mut pieces = output.in_order();
    if pieces.len() > LOG_PIECES {
        pieces = [
            (StreamName::Stdout, output.stdout.as_str()),
            (StreamName::Stderr, output.stderr.as_str()),
        ]
        .into_iter()
        .filter(|(_, text)| !text.is_empty())
        .collect();
    }
    let mut said_skipped = [false; 2];
    let messages: Vec<String> = pieces
        .into_iter()
        .map(|(stream, text)| {
            let (skipped, said) = match stream {
                StreamName::Stdout => (output.stdout_skipped, &mut said_skipped[0]),
                StreamName::Stderr => (output.stderr_skipped, &mut said_skipped[1]),
            };
            let name = stream.as_str();
            let text = text.strip_suffix('\n').unwrap_or(text);
            if skipped > 0 && !std::mem::replace(said, true) {
                format!(
                    "{name}{cleared}: [{} skipped] …{text}",
                    crate::text::bytes(skipped)
                )
            } else {
                format!("{name}{cleared}: {text}")
            }
        })
        .collect();
    if messages.is_empty() && output.cleared {
        return vec![CLEARED.to_string()];
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_shows_the_latest_lines_within_bounds() {
        let output = LiveOutput {
            stdout: "a\nb\n\nc\nd\n".into(),
            stderr: String::new(),
            ..Default::default()
        };
        assert_eq!(latest_lines(&output).as_deref(), Some("b\nc\nd"));
        let output = LiveOutput {
            stdout: "x".repeat(1000),
            stderr: "warning\n".into(),
            ..Default::default()
        };
        let message = latest_lines(&output).unwrap();
        assert_eq!(message.chars().count(), PROGRESS_CHARS);
        assert!(message.starts_with('…') && message.ends_with("x\nwarning"));
        assert_eq!(latest_lines(&LiveOutput::default()), None);
    }

    #[test]
    fn log_messages_name_their_stream_and_what_was_skipped() {
        let output = LiveOutput {
            stdout: "step 3\n".into(),
            stderr: "oops\n".into(),
            stdout_skipped: 2048,
            stderr_skipped: 0,
            cleared: false,
            order: Vec::new(),
        };
        assert_eq!(
            log_messages(&output),
            vec!["stdout: [2 KiB skipped] …step 3", "stderr: oops"]
        );
        assert!(log_messages(&LiveOutput::default()).is_empty());
    }

    #[test]
    fn the_streams_keep_the_order_the_code_wrote_them_in() {
        let output = LiveOutput {
            stdout: "a\nc\n".into(),
            stderr: "b\nd".into(),
            stdout_skipped: 0,
            stderr_skipped: 1024,
            cleared: false,
            order: vec![
                (StreamName::Stdout, 2),
                (StreamName::Stderr, 2),
                (StreamName::Stdout, 2),
                (StreamName::Stderr, 1),
            ],
        };
        assert_eq!(latest_lines(&output).as_deref(), Some("b\nc\nd"));
        assert_eq!(
            log_messages(&output),
            vec![
                "stdout: a",
                "stderr: [1 KiB skipped] …b",
                "stdout: c",
                "stderr: d"
            ]
        );
        // Turns past LOG_PIECES: one message per stream.
        let output = LiveOutput {
            stdout: "o".repeat(LOG_PIECES),
            stderr: "e".repeat(LOG_PIECES),
            order: (0..2 * LOG_PIECES)
                .map(|i| {
                    (
                        if i % 2 == 0 {
                            StreamName::Stdout
                        } else {
                            StreamName::Stderr
                        },
                        1,
                    )
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(log_messages(&output).len(), 2);
        // An order that does not cover the texts exactly, or cuts a character: stdout, then stderr.
        for order in [
            vec![(StreamName::Stderr, 1), (StreamName::Stdout, 1)],
            vec![
                (StreamName::Stdout, 1),
                (StreamName::Stderr, 1),
                (StreamName::Stdout, 1),
            ],
        ] {
            let output = LiveOutput {
                stdout: "é".into(),
                stderr: "x".into(),
                order,
                ..Default::default()
            };
            assert_eq!(
                output.in_order(),
                vec![(StreamName::Stdout, "é"), (StreamName::Stderr, "x")]
            );
        }
    }

    #[test]
    fn a_clear_shows_only_what_came_after_it() {
        let output = LiveOutput {
            cleared: true,
            stdout: "step 4\n".into(),
            stderr: "late\n".into(),
            stdout_skipped: 0,
            stderr_skipped: 3072,
            order: Vec::new(),
        };
        assert_eq!(latest_lines(&output).as_deref(), Some("step 4\nlate"));
        assert_eq!(
            log_messages(&output),
            vec![
                "stdout (output cleared): step 4",
                "stderr (output cleared): [3 KiB skipped] …late"
            ]
        );
        // Nothing written since the clear: the client is told the output is gone.
        let output = LiveOutput {
            cleared: true,
            ..Default::default()
        };
        assert_eq!(latest_lines(&output).as_deref(), Some(CLEARED));
        assert_eq!(log_messages(&output), vec![CLEARED]);
        // Only blank lines since: the same, for the progress message.
        let output = LiveOutput {
            cleared: true,
            stdout: "\n\n".into(),
            ..Default::default()
        };
        assert_eq!(latest_lines(&output).as_deref(), Some(CLEARED));
        assert_eq!(log_messages(&output), vec!["stdout (output cleared): \n"]);
    }
}
