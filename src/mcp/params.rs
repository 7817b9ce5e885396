//! The tools' parameters, as clients send them; their doc comments become the input schemas'
//! field descriptions.

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunEphemeralParams {
    /// The Python source code to run.
    pub code: String,
    /// PyPI packages to install first, e.g. ["pandas", "matplotlib>=3.8"] (PEP 508 requirements;
    /// installed outside the sandbox and cached, so repeats cost nothing).
    #[serde(default)]
    pub dependencies: Option<Vec<String>>,
    /// Sandbox image; only the configured image or one the operator allowed.
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InitializeParams {
    /// Sandbox image; only the configured image or one the operator allowed.
    #[serde(default)]
    pub image: Option<String>,
    /// PyPI packages the session starts with (PEP 508 requirements, as run_python's
    /// dependencies): importable from its first call; run_python can add more later.
    #[serde(default)]
    pub dependencies: Option<Vec<String>>,
    /// Start from this snapshot (as sandbox_snapshot or sandbox_snapshots gave it): its files,
    /// its saved variables under their names, its modules imported again, its dependency set.
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// Hosts (`host` or `host:port`, port 443 by default) the session's code will reach, with
    /// `SANDBOX_NETWORK=allowlist`: allowed at once when the allowlist names them, else the user
    /// is asked now (the call waits for the answers).
    #[serde(default)]
    pub network: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SnapshotParams {
    /// The session to save, as returned by sandbox_initialize.
    pub container_id: String,
    /// A name to recognise the snapshot by in sandbox_snapshots.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SnapshotIdParams {
    /// The snapshot's id, as sandbox_snapshot or sandbox_snapshots gave it (`snap-…`).
    pub snapshot_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunPythonParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// The Python source code to run in the session's interpreter.
    pub code: String,
    /// PyPI packages to add to the session first (PEP 508 requirements); they stay importable in
    /// later calls. The session itself never gets network access.
    #[serde(default)]
    pub dependencies: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// A shell command line, run with /bin/sh -c in /workspace.
    pub command: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StopParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SearchParams {
    /// A package name or part of one, e.g. "requests", "yaml", "numpi".
    pub query: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteFileParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// Where to write, relative to /workspace (e.g. "data/input.csv"); parent folders are created.
    pub path: String,
    /// The file's text (UTF-8). Give exactly one of content and content_base64.
    #[serde(default)]
    pub content: Option<String>,
    /// The file's bytes, base64-encoded, for binary files.
    #[serde(default)]
    pub content_base64: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadFileParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// The file to read, relative to /workspace.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListFilesParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// A folder relative to /workspace; the workspace itself when omitted.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExportNotebookParams {
    /// The session's id, as returned by sandbox_initialize.
    pub container_id: String,
    /// Where to save the notebook, relative to /workspace (e.g. "analysis.ipynb"); by default
    /// `notebook-<n>.ipynb`, n the session's latest execution count.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunNotebookParams {
    /// The session to run the notebook in (its variables and files are the notebook's to use and
    /// change); without one, a new session is started for the run and stopped after it.
    #[serde(default)]
    pub container_id: Option<String>,
    /// A .ipynb file in the session's /workspace (relative to it). Give exactly one of path and
    /// content.
    #[serde(default)]
    pub path: Option<String>,
    /// The notebook itself: its JSON text (nbformat 4).
    #[serde(default)]
    pub content: Option<String>,
    /// Values for the notebook's parameters, e.g. {"alpha": 0.5, "name": "run 1"}: written as
    /// Python literals into a new cell tagged `injected-parameters`, right after the cell tagged
    /// `parameters` (first when there is none), as papermill does, in the order of their names.
    /// Names must be Python identifiers.
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
    /// Stop at the first cell that fails (default true), unless that cell is tagged
    /// `raises-exception`; false runs every cell whatever fails (nbclient's allow_errors).
    #[serde(default)]
    pub stop_on_error: Option<bool>,
    /// Seconds each cell may run, at most the server's limit per execution (the default).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Where to save the executed notebook, relative to /workspace; by default, for a `path`,
    /// beside it as `<name>.executed.ipynb` (a notebook given as content is saved only here, and
    /// only in a session that stays).
    #[serde(default)]
    pub output_path: Option<String>,
    /// PyPI packages the notebook needs (PEP 508 requirements, as run_python's), installed
    /// before its first cell.
    #[serde(default)]
    pub dependencies: Option<Vec<String>>,
}
