//! The MCP server: each tool a thin translation to an engine call and back.
//!
//! Tool descriptions are written for the model that reads them and carry the limits in force,
//! read from the live configuration. The code's own failures (exception, non-zero exit, timeout)
//! and infrastructure failures are both `isError` results with text the model can act on; protocol
//! errors are kept for malformed requests.
//!
//! Over stdio ([`stdio`]) the server has one client, which reaches every session. Over HTTP
//! ([`http`]) every MCP session is a client of its own: its tools reach only the sandbox sessions
//! it created.
//!
//! - [`params`] and [`outputs`]: what tools take and give back (their schemas);
//! - `tools`: the handlers, one file per group, each with its description;
//! - `outcome`: the one conversion of a handler's outcome to a tool result;
//! - `descriptions`: the live configuration's part of the descriptions;
//! - `render`: executions and files as content blocks;
//! - `notebook`: what the code showed, as nbformat outputs bounded for a model;
//! - `ipynb`: notebooks as files (nbformat 4.5): a session's cells written, an untrusted one read;
//! - `notices`: a call's progress and log notifications (its steps, the code's live output);
//! - `server`: the [`SandboxServer`] (capabilities, resources, prompts, completions);
//! - `running`: the engine's background tasks while a server runs;
//! - `tasks`: a principal's long calls as tasks (the tasks extension of revision 2026-07-28);
//! - `audit`: where every tool call passes once: its audit line and its metrics;
//! - `metrics`: the Prometheus metrics; `health`: `/healthz`, `/readyz` and the drain on SIGTERM;
//! - [`stdio`], [`http`]: the transports; [`ServeError`]: why serving stopped or never started.

mod audit;
mod connections;
mod consent;
mod descriptions;
mod error;
mod health;
pub mod http;
mod ipynb;
mod logging;
mod mcp_sessions;
pub mod metrics;
mod notebook;
mod notices;
pub mod oauth;
mod outcome;
pub mod outputs;
mod oversize;
pub mod params;
mod priming;
pub mod principals;
mod prompts;
mod quotas;
mod render;
pub mod resources;
mod roots;
mod running;
mod schema;
mod server;
pub mod stdio;
mod tasks;
mod tools;

pub use error::ServeError;
pub use outputs::*;
pub use params::*;
pub use server::SandboxServer;
pub use stdio::serve_stdio;
