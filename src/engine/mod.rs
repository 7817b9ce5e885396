//! The sandbox engine: runs code in disposable sandboxes and in stateful sessions.
//!
//! Layers, each with one job:
//! - [`backend`]: the trait a container platform implements; [`docker`] is the Docker one.
//! - [`protocol`] and `python/runner/`: how the host talks to the runner process inside a sandbox.
//! - [`sandbox`]: one sandbox's lifecycle as explicit states, with timeouts and recovery.
//! - [`owner`]: labels naming the server instance, to clean up what a dead server left.
//! - [`artifacts`]: files an execution made, copied out safely, saved and selected for return.
//! - [`whole_output`]: output longer than a model reads, kept whole where it can be read.
//! - [`files_dir`]: the host directory they are saved in: checked at start-up, kept within its
//!   retention.
//! - [`deps`] and [`installer`]: validated requirements, installed in a separate sandbox into a
//!   shared read-only cache; [`runner_set`]: the runner's own IPython, installed there once per
//!   image.
//! - [`pip`]: `pip` asked for by the code during an execution, bounded and handed to the caller.
//! - [`pool`]: sandboxes started ahead of time; [`prepared`]: those prepared per dependency set or client's roots;
//!   [`recycled`]: those a run used, emptied, kept for the same caller's next run.
//! - [`roots`]: the client's MCP roots: which are mounted into its sandboxes, and why not the
//!   others.
//! - [`admission`]: how many sandboxes live and start at once, from the host's capacity; calls
//!   beyond it wait in turn.
//! - [`sessions`]: the registry of stateful sandboxes: found by id, owned by a client, ended with
//!   a reason.
//! - [`warden`]: the process beside a server that removes its sandboxes should it be killed.
//! - [`stats`]: start-up times and bytes copied out, told to an observer (the server's metrics).
//! - [`progress`]: the sink long steps report to (a client, a terminal or the log).
//! - [`outcome`] and [`error`]: what an execution comes to, and what can go wrong; plain types
//!   at the bottom, so the parts above never depend on each other for them.
//! - [`service`]: the [`Engine`], at the top: it applies the configuration to every request and
//!   composes the parts above; none of them knows about it.

pub mod admission;
pub mod artifacts;
pub mod backend;
mod bounded;
mod compose;
pub mod deps;
pub mod displays;
pub mod docker;
pub mod egress;
pub mod error;
pub mod files_dir;
pub mod history;
pub mod installer;
pub mod interrupt;
pub mod outcome;
pub mod owner;
pub mod pip;
pub mod platform;
pub mod pool;
pub mod prepared;
pub mod progress;
pub mod protocol;
pub mod recycled;
pub mod redact;
pub mod roots;
pub mod runner_set;
pub mod sandbox;
pub mod service;
pub mod sessions;
pub mod snapshots;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod warden;
pub mod whole_output;

pub use error::EngineError;
pub use outcome::{Artifact, DependencyReport, Execution, KeptStream, WholeOutput};
pub use protocol::LiveOutput;
pub use sandbox::{LiveOutputSink, Task};
pub use service::{Engine, ProgressSink, RunOptions, MAX_CODE_BYTES};
pub use sessions::{workspace_relative, SessionInfo};
