//! `pip` asked for from inside a sandbox during an execution (`runner/pip.py`): the runner's
//! `pip` frame is handed to a [`PipHandler`] the caller of the execution supplies (the service:
//! it validates the line and installs through the server's installer), and the answer goes back
//! to the runner's stdin as a `pip_reply` frame. Requests are bounded here before any handler
//! sees them: their size, and how many one execution may make.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use serde::Serialize;

/// Requests one execution may make; later ones are refused.
pub const MAX_PER_EXECUTION: usize = 5;

/// Changes to a session's set (installs, uninstalls) from inside it, at most, per
/// [`RATE_WINDOW`]: each may start an installer.
pub const MAX_CHANGES_PER_WINDOW: usize = 20;
pub const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// The times of a session's recent changes of its set from inside it.
#[derive(Debug, Default)]
pub struct PipRate {
    recent: std::collections::VecDeque<Instant>,
}

impl PipRate {
    /// Counts a change at `now`, or refuses it when the window is full.
    pub fn admit(&mut self, now: Instant) -> Result<(), PipAnswer> {
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= RATE_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= MAX_CHANGES_PER_WINDOW {
            let free = self
                .recent
                .front()
                .map(|t| RATE_WINDOW.saturating_sub(now.duration_since(*t)))
                .unwrap_or_default();
            return Err(PipAnswer::refused(format!(
                "pip: this session changed its packages {MAX_CHANGES_PER_WINDOW} times in the \
                 last {}; the next change is possible in {}",
                crate::text::duration(RATE_WINDOW),
                crate::text::duration(free)
            )));
        }
        self.recent.push_back(now);
        Ok(())
    }
}

/// The most of an answer's text sent to the runner, in bytes.
const MAX_TEXT_BYTES: usize = 16 << 10;

/// What the runner is told: printed (stdout when `ok`, stderr otherwise), and the sets to put on
/// `sys.path` (`add`, first) and to take off (`remove`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipAnswer {
    pub ok: bool,
    pub text: String,
    pub add: Vec<String>,
    pub remove: Vec<String>,
}

impl PipAnswer {
    /// A refusal: `why` printed on stderr as pip's, nothing changed.
    pub fn refused(why: impl std::fmt::Display) -> PipAnswer {
        PipAnswer {
            ok: false,
            text: format!("ERROR: {why}\n"),
            ..Default::default()
        }
    }

    /// An answer that changes nothing.
    pub fn said(text: String) -> PipAnswer {
        PipAnswer {
            ok: true,
            text,
            ..Default::default()
        }
    }

    /// The `pip_reply` frame answering request `id`.
    pub fn frame(&self, id: u64) -> Vec<u8> {
        #[derive(Serialize)]
        struct Frame<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            id: u64,
            ok: bool,
            text: &'a str,
            add: &'a [String],
            remove: &'a [String],
        }
        let text = crate::text::truncate_chars(&self.text, MAX_TEXT_BYTES / 4);
        let frame = Frame {
            kind: "pip_reply",
            id,
            ok: self.ok,
            text: &text,
            add: &self.add,
            remove: &self.remove,
        };
        // Serializing plain strings and booleans cannot fail.
        super::protocol::encode_frame(&serde_json::to_vec(&frame).unwrap_or_default())
    }
}

/// A boxed future of an answer (a handler's work is async and borrows the handler).
pub type PipFuture<'a> = Pin<Box<dyn Future<Output = PipAnswer> + Send + 'a>>;

/// Answers the pip requests of one execution. `deadline` is when the execution's time is up: an
/// install must end by then (what it takes counts within the call's timeout).
pub trait PipHandler: Send + Sync {
    fn handle<'a>(&'a self, line: &'a str, deadline: Instant) -> PipFuture<'a>;
}

/// Whether a request of execution `execution` gets to a handler: it must be for that execution,
/// within [`MAX_PER_EXECUTION`] (`count` is how many came before) and within the line's size.
/// `Err` is the refusal to send instead.
pub fn admit(execution: u64, id: u64, line: &str, count: usize) -> Result<(), PipAnswer> {
    if id != execution {
        return Err(PipAnswer::refused(
            "pip: only the running code can ask for packages",
        ));
    }
    if count >= MAX_PER_EXECUTION {
        return Err(PipAnswer::refused(format!(
            "pip: at most {MAX_PER_EXECUTION} pip commands per call; run the rest in another call"
        )));
    }
    if line.len() > super::deps::MAX_PIP_LINE_BYTES {
        return Err(PipAnswer::refused(format!(
            "pip: the command line is {} bytes, over the limit of {}",
            line.len(),
            super::deps::MAX_PIP_LINE_BYTES
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_admitted_for_their_execution_within_count_and_size() {
        assert!(admit(7, 7, "install x", 0).is_ok());
        assert!(!admit(7, 6, "install x", 0).unwrap_err().ok);
        let over = admit(7, 7, "list", MAX_PER_EXECUTION).unwrap_err();
        assert!(over.text.contains("at most 5"), "{}", over.text);
        let long = "x".repeat(super::super::deps::MAX_PIP_LINE_BYTES + 1);
        assert!(admit(7, 7, &long, 0)
            .unwrap_err()
            .text
            .contains("over the limit"));
    }

    #[test]
    fn a_session_changes_its_set_within_the_rate() {
        let mut rate = PipRate::default();
        let start = Instant::now();
        for _ in 0..MAX_CHANGES_PER_WINDOW {
            assert!(rate.admit(start).is_ok());
        }
        let refused = rate.admit(start).unwrap_err();
        assert!(
            refused.text.contains("next change is possible"),
            "{}",
            refused.text
        );
        assert!(rate.admit(start + RATE_WINDOW).is_ok());
    }

    #[test]
    fn the_reply_frame_carries_the_answer() {
        let answer = PipAnswer {
            ok: true,
            text: "ok\n".into(),
            add: vec!["/opt/deps/s-new".into()],
            remove: vec!["/opt/deps/s-old".into()],
        };
        let frame = answer.frame(3);
        let body: serde_json::Value = serde_json::from_slice(&frame[4..]).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"type": "pip_reply", "id": 3, "ok": true, "text": "ok\n",
                "add": ["/opt/deps/s-new"], "remove": ["/opt/deps/s-old"]})
        );
        assert_eq!(
            u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
    }
}
