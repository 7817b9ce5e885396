//! # python-code-sandbox
//!
//! Runs untrusted Python, written by LLM agents, in disposable and hardened containers, and serves
//! that to MCP clients.
//!
//! The design has three layers, each depending only on the one below:
//!
//! - [`config`] reads and validates the operator's settings (environment and `.env`) once.
//! - [`engine`] owns sandboxes. A [`engine::backend::Backend`] trait hides the container platform
//!   (Docker today). Inside every sandbox one long-lived runner process (the Python package
//!   `engine/python/runner/`, embedded in the binary and sent over stdin at start) executes code on
//!   request, over length-prefixed JSON frames on the container's attached stdin/stdout. The runner keeps one namespace, so a session
//!   keeps its variables between executions; a disposable run is a fresh sandbox removed right after.
//!   Timeouts interrupt the code first (SIGINT, so a session keeps its state) and kill the code's
//!   processes only when that fails. A supervisor, the container's pid 1, outlives the runner and
//!   starts a new one after any death, so a session loses variables, never its workspace (a
//!   size-bounded tmpfs).
//!   Files the code writes come back checked and bounded; dependencies are installed outside the
//!   code's sandbox into a shared, read-only cache; a warm pool hides start-up.
//! - [`mcp`] translates MCP tool calls to engine calls and back (rmcp, over stdio or streamable
//!   HTTP behind a request gate: token, Host, Origin, size); [`pypi`] backs the package search.
//! - [`cli`] is the command line: the server (no arguments, `stdio`, or `serve --http ADDR`),
//!   `run`, `doctor`, `image build`, `cleanup`, `cache`; exit codes and signals live there. The
//!   benchmark is an example (`cargo run --release --features bench --example bench`), not part of the binary.
//!
//! Everything that comes out of a sandbox is treated as hostile: frames are size-checked before
//! they are buffered, output is capped inside the sandbox and again on the host, and malformed
//! messages stop the sandbox instead of the server.

pub mod cli;
pub mod config;
pub mod engine;
pub mod mcp;
pub mod pypi;
pub mod text;
