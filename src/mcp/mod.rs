//! The MCP server: the seed's tool set, each tool a thin translation to an engine call and back.
//!
//! Tool descriptions are written for the model that reads them and carry the limits in force,
//! read from the live configuration. The code's own failures (exception, non-zero exit, timeout)
//! and infrastructure failures are both `isError` results with text the model can act on; protocol
//! errors are kept for malformed requests.
//!
//! Over stdio the server has one client, which reaches every session. Over HTTP ([`http`]) every
//! MCP session is a client of its own: its tools reach only the sandbox sessions it created.

mod connections;
pub mod http;
mod logging;
mod mcp_sessions;
mod oversize;
mod priming;
mod prompts;
mod render;
pub mod resources;
mod schema;

use std::borrow::Cow;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
#[allow(deprecated)] // see `logging`
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolResult, CompleteRequestParams, CompleteResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, Reference, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{Config, NetworkPolicy};
use crate::engine::artifacts::display_path;
use crate::engine::docker::DockerBackend;
use crate::engine::sessions::{ClientId, Scope};
use crate::engine::{Engine, ProgressSink, RunOptions, Task};
use crate::pypi::{PackageInfo, PypiSearch};
use render::bytes;

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

#[derive(Debug, Serialize, JsonSchema)]
pub struct WriteFileOutput {
    /// The absolute path inside the sandbox.
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListFilesOutput {
    pub path: String,
    pub entries: Vec<crate::engine::protocol::DirEntry>,
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

#[derive(Clone)]
pub struct SandboxServer {
    engine: Arc<Engine>,
    pypi: Arc<PypiSearch>,
    tool_router: ToolRouter<Self>,
    /// The client this server speaks for, when the engine has several (HTTP); `None`: the only
    /// client (stdio), which reaches every session.
    client: Option<Arc<Client>>,
    /// The log level the client set.
    log: Arc<logging::ClientLog>,
}

/// One client of a server with several: an MCP session over HTTP. Dropped when the MCP session
/// has ended and its last call has returned; its sandbox sessions are stopped then.
struct Client {
    engine: Arc<Engine>,
    id: ClientId,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Without a runtime the process is ending: the engine's shutdown removes everything.
        if tokio::runtime::Handle::try_current().is_ok() {
            let stopped = self.engine.end_client(&self.id);
            if stopped > 0 {
                tracing::info!("an MCP session ended: stopping its {stopped} sandbox session(s)");
            }
        }
    }
}

#[tool_router(router = tool_router)]
impl SandboxServer {
    /// The server of a single client (stdio): every session is its own.
    pub fn new(engine: Arc<Engine>, pypi: Arc<PypiSearch>) -> Self {
        let mut tool_router = Self::tool_router();
        describe(&mut tool_router, engine.config());
        SandboxServer {
            engine,
            pypi,
            tool_router,
            client: None,
            log: Arc::default(),
        }
    }

    /// The server of one client among several (an MCP session over HTTP): it reaches only the
    /// sessions it creates, and they are stopped when it is dropped.
    pub fn for_client(engine: Arc<Engine>, pypi: Arc<PypiSearch>) -> Self {
        let client = Arc::new(Client {
            engine: engine.clone(),
            id: ClientId::new(),
        });
        SandboxServer {
            client: Some(client),
            ..Self::new(engine, pypi)
        }
    }

    fn scope(&self) -> Scope<'_> {
        match &self.client {
            Some(client) => Scope::Client(&client.id),
            None => Scope::Server,
        }
    }

    #[tool(
        name = "run_python_ephemeral",
        annotations(read_only_hint = false, open_world_hint = false)
    )]
    async fn run_python_ephemeral(
        &self,
        Parameters(params): Parameters<RunEphemeralParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let options = self.options_for(&context, params.image, params.dependencies);
        Ok(
            match self
                .engine
                .run_ephemeral(Task::Python(&params.code), &options)
                .await
            {
                Ok(execution) => self.execution_result(&context, &execution, None),
                Err(e) => render::error(&e),
            },
        )
    }

    #[tool(name = "sandbox_initialize")]
    async fn sandbox_initialize(
        &self,
        Parameters(params): Parameters<InitializeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let options = self.options_for(&context, params.image, None);
        let id = match self.engine.create_session(self.scope(), &options).await {
            Ok(id) => id,
            Err(e) => return Ok(render::error(&e)),
        };
        let image = self
            .engine
            .sessions(self.scope())
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.image)
            .unwrap_or_default();
        let text = format!(
            "Sandbox session started.\ncontainer_id: {id}\nimage: {image}\nPass this container_id to run_python \
             (variables persist between calls), sandbox_exec and sandbox_stop."
        );
        Ok(structured(
            text,
            &SessionOutput {
                container_id: id,
                image,
            },
        ))
    }

    #[tool(name = "run_python")]
    async fn run_python(
        &self,
        Parameters(params): Parameters<RunPythonParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let options = self.options_for(&context, None, params.dependencies);
        Ok(self
            .in_session(
                &context,
                &params.container_id,
                Task::Python(&params.code),
                &options,
            )
            .await)
    }

    #[tool(name = "sandbox_exec")]
    async fn sandbox_exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let options = self.options_for(&context, None, None);
        Ok(self
            .in_session(
                &context,
                &params.container_id,
                Task::Shell(&params.command),
                &options,
            )
            .await)
    }

    #[tool(name = "sandbox_stop")]
    async fn sandbox_stop(
        &self,
        Parameters(params): Parameters<StopParams>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .engine
                .stop_session(self.scope(), &params.container_id)
                .await
            {
                Ok(id) => structured(
                    if self.engine.config().files.persist_dir.is_some() {
                        format!("Session {id} stopped and its sandbox removed; the files it saved stay on the host.")
                    } else {
                        format!("Session {id} stopped and its sandbox removed.")
                    },
                    &StopOutput {
                        container_id: id,
                        stopped: true,
                    },
                ),
                Err(e) => render::error(&e),
            },
        )
    }

    #[tool(name = "sandbox_write_file")]
    async fn sandbox_write_file(
        &self,
        Parameters(params): Parameters<WriteFileParams>,
    ) -> Result<CallToolResult, ErrorData> {
        use base64::Engine as _;
        let content = match (params.content, params.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => {
                match base64::engine::general_purpose::STANDARD.decode(encoded.trim()) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        return Ok(render::refusal(format!(
                            "Error: content_base64 is not valid base64: {e}"
                        )))
                    }
                }
            }
            _ => {
                return Ok(render::refusal(
                    "Error: give exactly one of content and content_base64.",
                ))
            }
        };
        let size = content.len() as u64;
        Ok(
            match self
                .engine
                .write_file(self.scope(), &params.container_id, &params.path, &content)
                .await
            {
                Ok(path) => structured(
                    format!("Wrote {path} ({}).", bytes(size)),
                    &WriteFileOutput { path, size },
                ),
                Err(e) => render::error(&e),
            },
        )
    }

    #[tool(name = "sandbox_read_file", annotations(read_only_hint = true))]
    async fn sandbox_read_file(
        &self,
        Parameters(params): Parameters<ReadFileParams>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .engine
                .read_file(self.scope(), &params.container_id, &params.path)
                .await
            {
                Ok(file) => {
                    let text = format!(
                        "{} ({}, {})",
                        display_path(&file.path),
                        bytes(file.size),
                        file.mime_type
                    );
                    let mut blocks = vec![ContentBlock::text(text)];
                    blocks.extend(render::file_block(&file));
                    let mut result = CallToolResult::success(blocks);
                    result.structured_content =
                        serde_json::to_value(render::FileOutput::of(&file)).ok();
                    result
                }
                Err(e) => render::error(&e),
            },
        )
    }

    #[tool(name = "sandbox_list_files", annotations(read_only_hint = true))]
    async fn sandbox_list_files(
        &self,
        Parameters(params): Parameters<ListFilesParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let path = params.path.unwrap_or_default();
        let listing = match self
            .engine
            .list_files(self.scope(), &params.container_id, &path)
            .await
        {
            Ok(listing) => listing,
            Err(e) => return Ok(render::error(&e)),
        };
        if let Some(error) = listing.error {
            return Ok(render::refusal(format!("Error: {error}")));
        }
        let shown = if path.trim().is_empty() {
            "/workspace".to_string()
        } else {
            path.clone()
        };
        let mut text = format!("{shown}: {} entries\n", listing.entries.len());
        for e in &listing.entries {
            let suffix = if e.kind == "directory" { "/" } else { "" };
            text.push_str(&format!(
                "- {}{suffix} ({}, {})\n",
                display_path(&e.name),
                e.kind,
                bytes(e.size)
            ));
        }
        if listing.truncated {
            text.push_str("[more entries not listed]\n");
        }
        Ok(structured(
            text,
            &ListFilesOutput {
                path: shown,
                entries: listing.entries,
                truncated: listing.truncated,
            },
        ))
    }

    #[tool(name = "sandbox_list", annotations(read_only_hint = true))]
    async fn sandbox_list(&self) -> Result<CallToolResult, ErrorData> {
        let config = self.engine.config();
        let sessions: Vec<SessionEntry> = self
            .engine
            .sessions(self.scope())
            .into_iter()
            .map(|s| SessionEntry {
                container_id: s.id,
                image: s.image,
                age_seconds: s.age.as_secs(),
                idle_seconds: s.idle.as_secs(),
            })
            .collect();
        let mut text = if sessions.is_empty() {
            "No live sessions.\n".to_string()
        } else {
            format!("{} live session(s):\n", sessions.len())
        };
        for s in &sessions {
            text.push_str(&format!(
                "- {} ({}), age {} s, idle {} s\n",
                s.container_id, s.image, s.age_seconds, s.idle_seconds
            ));
        }
        text.push_str(&limits_line(config));
        let limits = LimitsOutput {
            memory_bytes: config.limits.memory_bytes,
            cpus: config.limits.cpus,
            pids: config.limits.pids,
            timeout_seconds: config.limits.timeout.as_secs_f64(),
            max_output_bytes: config.limits.max_output_bytes,
            network: config.network.as_str().to_string(),
            max_sessions: config.sessions.max_sessions,
            session_idle_timeout_seconds: config.sessions.idle_timeout.as_secs(),
            session_max_lifetime_seconds: config.sessions.max_lifetime.as_secs(),
        };
        Ok(structured(text, &ListOutput { sessions, limits }))
    }

    #[tool(
        name = "search_pypi_packages",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn search_pypi_packages(
        &self,
        Parameters(params): Parameters<SearchParams>,
    ) -> Result<CallToolResult, ErrorData> {
        match self.pypi.search(&params.query).await {
            Ok(results) => {
                let mut text = if results.is_empty() {
                    format!("No PyPI package matches {:?}.\n", params.query)
                } else {
                    format!("PyPI packages matching {:?}:\n", params.query)
                };
                for p in &results {
                    text.push_str(&format!("- {} {} — {}\n", p.name, p.version, p.summary));
                }
                Ok(structured(
                    text,
                    &SearchOutput {
                        query: params.query,
                        results,
                    },
                ))
            }
            Err(e) => Ok(render::refusal(format!("Error: {e}"))),
        }
    }
}

impl SandboxServer {
    /// Run options for one request: cancellation follows the client's `notifications/cancelled`;
    /// the steps of preparing the sandbox go to the client as progress when it sent a progress
    /// token, and as `info` log messages when it asked for them.
    fn options_for(
        &self,
        context: &RequestContext<RoleServer>,
        image: Option<String>,
        dependencies: Option<Vec<String>>,
    ) -> RunOptions {
        let token = context.meta.get_progress_token();
        let log = self.log.for_request(context);
        let progress: Option<ProgressSink> = (token.is_some() || log.wants_info()).then(|| {
            let peer = context.peer.clone();
            let step = Arc::new(AtomicU32::new(0));
            let sink: ProgressSink = Arc::new(move |message: &str| {
                log.info(message);
                let Some(token) = &token else {
                    return;
                };
                let n = step.fetch_add(1, Ordering::Relaxed) + 1;
                let param = ProgressNotificationParam::new(token.clone(), f64::from(n))
                    .with_message(message.to_string());
                let peer = peer.clone();
                tokio::spawn(async move {
                    let _ = peer.notify_progress(param).await;
                });
            });
            sink
        });
        RunOptions {
            timeout: None,
            image,
            cancel: Some(context.ct.clone()),
            progress,
            dependencies: dependencies.unwrap_or_default(),
        }
    }

    /// A tool result for an execution, with a warning logged to the client when it lost state.
    fn execution_result(
        &self,
        context: &RequestContext<RoleServer>,
        execution: &crate::engine::Execution,
        container_id: Option<&str>,
    ) -> CallToolResult {
        let lost = if execution.workspace_lost {
            Some("the sandbox restarted: the session's variables and /workspace files are gone")
        } else if execution.state_lost && container_id.is_some() {
            Some("the interpreter restarted: the session's variables are gone (files are kept)")
        } else {
            None
        };
        if let Some(lost) = lost {
            self.log.for_request(context).warning(lost);
        }
        let config = self.engine.config();
        render::execution(
            execution,
            &config.limits,
            container_id,
            config.files.return_max_file_bytes,
        )
    }

    async fn in_session(
        &self,
        context: &RequestContext<RoleServer>,
        container_id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> CallToolResult {
        match self
            .engine
            .execute_in_session(self.scope(), container_id, task, options)
            .await
        {
            Ok(execution) => self.execution_result(context, &execution, Some(container_id)),
            Err(e) => render::error(&e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        // logging: deprecated from revision 2026-07-28, which HTTP does not offer
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
                    .with_title("Python code sandbox"),
            )
            .with_instructions(
                "Runs Python in disposable, hardened Docker sandboxes. Use run_python_ephemeral for \
                 one-off code; sandbox_initialize + run_python to keep variables across calls \
                 (stop it with sandbox_stop when done).",
            )
    }

    #[allow(deprecated)] // see `logging`
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log.set(request.level);
        Ok(())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        resources::list(&self.engine, self.scope(), cursor).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        resources::read(&self.engine, self.scope(), &request.uri)
            .await
            .map(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        match &request.r#ref {
            Reference::Prompt(prompt) => prompts::complete(&prompt.name),
            _ => resources::complete(&self.engine, self.scope(), &request).await,
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(prompts::list())
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        prompts::get(&request.name, request.arguments.as_ref()).map(GetPromptResponse::Complete)
    }

    /// A client of a server with several keeps its sessions through an MCP session, so it must
    /// speak a revision that has one: up to 2025-11-25 (2026-07-28 is sessionless). Clients that
    /// probe for 2026-07-28 are told so and fall back to the handshake.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.client.is_some() {
            Cow::Borrowed(ProtocolVersion::known_up_to(
                &ProtocolVersion::LATEST_WITH_INITIALIZE,
            ))
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }
}

fn structured<T: Serialize>(text: String, value: &T) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(value).ok();
    result
}

fn limits_line(config: &Config) -> String {
    let network = match config.network {
        NetworkPolicy::None => "no network access".to_string(),
        NetworkPolicy::Bridge => "network access".to_string(),
    };
    format!(
        "Limits per execution: {} wall clock, {} memory, {} CPU(s), {} processes, output cut at {}, {network}.",
        render::human(config.limits.timeout),
        bytes(config.limits.memory_bytes),
        config.limits.cpus,
        config.limits.pids,
        bytes(config.limits.max_output_bytes),
    )
}

/// Sets each tool's description from the live configuration, and its output schema.
fn describe(router: &mut ToolRouter<SandboxServer>, config: &Config) {
    use rmcp::handler::server::tool::schema_for_output;
    let limits = limits_line(config);
    let sessions = &config.sessions;
    let session_policy = format!(
        "At most {} sessions at once; a session unused for {} is stopped, and every session ends {} after it started.",
        sessions.max_sessions,
        render::human(sessions.idle_timeout),
        render::human(sessions.max_lifetime)
    );
    let images = if config.allowed_images.is_empty() {
        format!("Optional `image`: only {} is available.", config.image)
    } else {
        format!(
            "Optional `image`: {} (default) or one matching {}.",
            config.image,
            config.allowed_images.join(", ")
        )
    };
    let execution_schema = schema_for_output::<render::ExecutionOutput>();
    let retention = format!(
        "kept {}, and the oldest removed first beyond {} in total",
        render::human(config.files.max_age),
        bytes(config.files.max_saved_bytes)
    );
    let files = match &config.files.persist_dir {
        Some(dir) => format!(
            "Files the code creates or changes in /workspace come back: images (and matplotlib figures, \
             plt.show() or left open) as images, other files as resources, up to {} each; every file is \
             also saved on the server's host under {} ({retention}).",
            bytes(config.files.return_max_file_bytes),
            dir.display()
        ),
        None => format!(
            "Files the code creates or changes in /workspace come back: images (and matplotlib figures, \
             plt.show() or left open) as images, other files as resources, up to {} each.",
            bytes(config.files.return_max_file_bytes)
        ),
    };
    let tools: [(&str, String, Option<_>); 10] = [
        (
            "run_python_ephemeral",
            format!(
                "Run Python code in a brand-new, isolated sandbox that is destroyed right after the \
                 call. Best for one-off scripts: nothing persists between calls (use sandbox_initialize \
                 and run_python to keep variables). The code runs as `python` would run a script, as an \
                 unprivileged user in /workspace, with Python 3.11 and its standard library. Returns \
                 stdout, stderr (with the traceback of an uncaught exception) and the exit status; a \
                 failure, non-zero exit or timeout is reported as an error result. {files} {limits} {images}"
            ),
            Some(execution_schema.clone()),
        ),
        (
            "sandbox_initialize",
            format!(
                "Start a persistent sandbox session and return its container_id. Use it for multi-step \
                 work: run_python keeps variables, imports and files between calls, like a notebook. \
                 Call sandbox_stop when done. {session_policy} {images}"
            ),
            Some(schema_for_output::<SessionOutput>()),
        ),
        (
            "run_python",
            format!(
                "Run Python code in a session's persistent interpreter (start one with \
                 sandbox_initialize). State persists between calls: variables, functions, imports and \
                 files in /workspace are still there on the next call. On timeout the code is \
                 interrupted (KeyboardInterrupt) and the session keeps its state; if the code cannot be \
                 interrupted or runs out of memory the interpreter restarts and the result says state \
                 was lost. {files} {limits}"
            ),
            Some(execution_schema.clone()),
        ),
        (
            "sandbox_exec",
            format!(
                "Run a shell command (/bin/sh -c) in a session's sandbox, in /workspace, as the same \
                 unprivileged user, e.g. `ls -la` or `python -m pip list`. Returns exit code, stdout \
                 and stderr. {limits}"
            ),
            Some(execution_schema),
        ),
        (
            "sandbox_write_file",
            format!(
                "Write a file into a session's /workspace (path relative to it; parent folders are \
                 created), from text (`content`) or bytes (`content_base64`), up to {}. Use it to give \
                 the code input data.",
                bytes(config.files.max_file_bytes)
            ),
            Some(schema_for_output::<WriteFileOutput>()),
        ),
        (
            "sandbox_read_file",
            format!(
                "Read a file from a session's /workspace: images come back as images, text as a text \
                 resource, other files as a blob resource, up to {}.",
                bytes(config.files.return_max_file_bytes)
            ),
            Some(schema_for_output::<render::FileOutput>()),
        ),
        (
            "sandbox_list_files",
            "List a folder of a session's /workspace: names, kinds (file, directory, symlink) and sizes."
                .to_string(),
            Some(schema_for_output::<ListFilesOutput>()),
        ),
        (
            "sandbox_stop",
            match &config.files.persist_dir {
                Some(dir) => format!(
                    "Stop a session started by sandbox_initialize and remove its sandbox: its variables \
                     and /workspace are gone. Files its executions already saved on the host under {} \
                     stay there (the paths results gave keep working; {retention})."
                    ,
                    dir.display()
                ),
                None => "Stop a session started by sandbox_initialize and remove its sandbox: its \
                         variables and /workspace files are gone (nothing is saved on the host)."
                    .to_string(),
            },
            Some(schema_for_output::<StopOutput>()),
        ),
        (
            "sandbox_list",
            "List this server's live sessions (container_id, image, age, idle time) and the limits in force."
                .to_string(),
            Some(schema_for_output::<ListOutput>()),
        ),
        (
            "search_pypi_packages",
            "Find PyPI packages by name: exact and normalized names first, then names that start with \
             or contain the query, then close spellings. Returns up to 5 packages with latest version \
             and summary."
                .to_string(),
            Some(schema_for_output::<SearchOutput>()),
        ),
    ];
    for (name, description, schema) in tools {
        if let Some(route) = router.map.get_mut(name) {
            route.attr.description = Some(description.into());
            route.attr.output_schema = schema;
        }
    }
    for route in router.map.values_mut() {
        schema::standardize(Arc::make_mut(&mut route.attr.input_schema));
        if let Some(output) = route.attr.output_schema.as_mut() {
            schema::standardize(Arc::make_mut(output));
        }
    }
}

/// A started engine and what runs beside it, shared by the stdio and HTTP servers.
pub(crate) struct Running {
    pub engine: Arc<Engine>,
    pub pypi: Arc<PypiSearch>,
    reaper: tokio::task::JoinHandle<()>,
    cleanup: tokio::task::JoinHandle<()>,
    retention: Option<tokio::task::JoinHandle<()>>,
}

/// Starts the engine: the session reaper, the warm pool, and (in the background) the removal of
/// what dead servers left and the retention of saved files. Nothing here waits for Docker. A files
/// directory that cannot be trusted stops start-up (exit 2).
pub(crate) fn start(config: Config) -> Result<Running, ExitCode> {
    if let Err(e) = crate::engine::files_dir::prepare_configured(&config.files) {
        eprintln!("python-code-sandbox: {e}");
        return Err(ExitCode::from(crate::cli::EXIT_CONFIG));
    }
    let pypi = match PypiSearch::new(
        &config.pypi_url,
        config.cache_dir.join("pypi"),
        config.pypi_index_ttl,
    ) {
        Ok(pypi) => Arc::new(pypi),
        Err(e) => {
            eprintln!("python-code-sandbox: {e}");
            return Err(ExitCode::from(crate::cli::EXIT_CONFIG));
        }
    };
    let engine = Arc::new(Engine::new(
        Arc::new(DockerBackend::for_config(&config)),
        config,
    ));
    let cleanup = {
        let engine = engine.clone();
        tokio::spawn(async move {
            match engine.remove_leftovers().await {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} sandbox(es) left by servers that are gone"),
                Err(e) => tracing::warn!("could not look for leftover sandboxes: {e}"),
            }
        })
    };
    let reaper = engine.spawn_reaper();
    let retention = engine.spawn_file_retention();
    engine.start_pool();
    Ok(Running {
        engine,
        pypi,
        reaper,
        cleanup,
        retention,
    })
}

impl Running {
    /// Stops the background tasks and removes every sandbox this server made.
    pub(crate) async fn stop(self) {
        self.reaper.abort();
        self.cleanup.abort();
        if let Some(retention) = &self.retention {
            retention.abort();
        }
        self.engine.shutdown().await;
    }
}

/// Serves MCP over stdio until the client closes stdin or the process gets SIGINT/SIGTERM; then
/// removes every sandbox this server made.
pub async fn serve_stdio(config: Config) -> ExitCode {
    let running = match start(config) {
        Ok(running) => running,
        Err(code) => return code,
    };
    // `initialize` is answered at once: nothing above waited for Docker.
    let server = SandboxServer::new(running.engine.clone(), running.pypi.clone());
    let outcome = tokio::select! {
        running = server.serve(oversize::guarded_stdio()) => match running {
            Ok(running) => {
                let token = running.cancellation_token();
                tokio::select! {
                    quit = running.waiting() => {
                        tracing::info!("client disconnected ({quit:?})");
                        ExitCode::SUCCESS
                    }
                    signal = crate::cli::termination() => {
                        tracing::info!("{signal}: shutting down");
                        token.cancel();
                        ExitCode::SUCCESS
                    }
                }
            }
            Err(e) => {
                tracing::error!("MCP session failed to start: {e}");
                ExitCode::FAILURE
            }
        },
        signal = crate::cli::termination() => {
            tracing::info!("{signal} before the MCP session started: shutting down");
            ExitCode::SUCCESS
        }
    };
    running.stop().await;
    outcome
}
