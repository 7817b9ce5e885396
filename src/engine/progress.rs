//! Progress of long steps (an image build, a dependency install, starting a sandbox), told to
//! whoever watches: an MCP client's progress notifications, a person's terminal, or the log.
//! A plain type at the bottom of the engine, so every part can report without knowing who listens.

use std::sync::Arc;

/// Receives short messages naming the step that begins ("starting the sandbox", "Step 3/9 : …").
pub type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// A sink that writes each step to the log at info level (a server has no one watching).
pub fn logged(what: &'static str) -> ProgressSink {
    Arc::new(move |step: &str| tracing::info!("{what}: {step}"))
}
