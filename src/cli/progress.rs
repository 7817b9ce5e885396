//! Progress for people: a spinner with the current step when stderr is a terminal, one plain
//! line per step otherwise (logs, CI, a client reading stderr). Feeds on the engine's
//! [`ProgressSink`], so the engine never knows whether a person is watching.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::engine::ProgressSink;

/// One long task's progress on stderr (an image build, an install, a benchmark).
pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    last: Arc<Mutex<String>>,
    what: String,
}

impl Progress {
    /// Starts reporting `what` ("building python-code-sandbox:py3.11").
    pub fn start(what: &str) -> Progress {
        Progress::new(what, std::io::stderr().is_terminal())
    }

    fn new(what: &str, terminal: bool) -> Progress {
        let bar = terminal.then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {wide_msg}")
            {
                bar.set_style(style);
            }
            bar.set_prefix(what.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            eprintln!("{what}");
        }
        Progress {
            bar,
            started: Instant::now(),
            last: Arc::new(Mutex::new(String::new())),
            what: what.to_string(),
        }
    }

    /// The sink to hand to the engine: each message is the step now under way.
    pub fn sink(&self) -> ProgressSink {
        let bar = self.bar.clone();
        let last = self.last.clone();
        let started = self.started;
        Arc::new(move |step: &str| {
            let step = one_line(step);
            if let Ok(mut last) = last.lock() {
                if *last == step {
                    return;
                }
                last.clone_from(&step);
            }
            match &bar {
                Some(bar) => bar.set_message(step),
                None => eprintln!("  [{:>5.1}s] {step}", started.elapsed().as_secs_f64()),
            }
        })
    }

    /// Ends the report with a last line: `outcome` ("done", "failed").
    pub fn finish(self, outcome: &str) {
        let line = format!(
            "{}: {outcome} in {:.1}s",
            self.what,
            self.started.elapsed().as_secs_f64()
        );
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
        eprintln!("{line}");
    }
}

/// Steps are single lines: control characters (from an engine's or a package's output) would
/// move the cursor on a terminal.
fn one_line(step: &str) -> String {
    crate::text::one_line(step, 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_one_printable_line() {
        assert_eq!(
            one_line("  Step 1/3 : RUN x\n\u{1b}[2J"),
            "Step 1/3 : RUN x  [2J"
        );
        assert!(one_line(&"x".repeat(500)).chars().count() <= 201);
    }
}
