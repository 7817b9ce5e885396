//! The tools' structured results (`structuredContent`), beside the text every result has; their
//! schemas are the tools' output schemas. Executions and files have theirs in [`super::render`].

use schemars::JsonSchema;
use serde::Serialize;

use crate::engine::protocol::DirEntry;
use crate::pypi::PackageInfo;

#[derive(Debug, Serialize, JsonSchema)]
pub struct WriteFileOutput {
    /// The absolute path inside the sandbox.
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListFilesOutput {
    pub path: String,
    pub entries: Vec<DirEntry>,
    /// More than 1000 entries: the rest are not listed.
    pub truncated: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionOutput {
    /// The session's id: pass it to run_python, sandbox_exec and sandbox_stop.
    pub container_id: String,
    pub image: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StopOutput {
    pub container_id: String,
    pub stopped: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListOutput {
    pub sessions: Vec<SessionEntry>,
    pub limits: LimitsOutput,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionEntry {
    pub container_id: String,
    pub image: String,
    pub age_seconds: u64,
    pub idle_seconds: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LimitsOutput {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
    pub timeout_seconds: f64,
    pub max_output_bytes: u64,
    pub network: String,
    pub max_sessions: usize,
    pub session_idle_timeout_seconds: u64,
    pub session_max_lifetime_seconds: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SearchOutput {
    pub query: String,
    pub results: Vec<PackageInfo>,
}
