//! The MCP server: one [`SandboxServer`] per client, its tools (from the groups in
//! [`super::tools`]) and what it answers besides tools: capabilities, logging level, resources,
//! completions and prompts.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
#[allow(deprecated)] // see `logging`
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse,
    Implementation, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    Reference, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use super::{descriptions, logging, prompts, resources};
use crate::engine::sessions::{ClientId, Scope};
use crate::engine::Engine;
use crate::pypi::PypiSearch;

#[derive(Clone)]
pub struct SandboxServer {
    pub(super) engine: Arc<Engine>,
    pub(super) pypi: Arc<PypiSearch>,
    tool_router: ToolRouter<Self>,
    /// The client this server speaks for, when the engine has several (HTTP); `None`: the only
    /// client (stdio), which reaches every session.
    pub(super) client: Option<Arc<Client>>,
    /// The log level the client set.
    pub(super) log: Arc<logging::ClientLog>,
}

/// One client of a server with several: an MCP session over HTTP. Dropped when the MCP session
/// has ended and its last call has returned; its sandbox sessions are stopped then.
pub(super) struct Client {
    engine: Arc<Engine>,
    pub(super) id: ClientId,
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

impl SandboxServer {
    /// The server of a single client (stdio): every session is its own.
    pub fn new(engine: Arc<Engine>, pypi: Arc<PypiSearch>) -> Self {
        let mut tool_router = Self::tools();
        descriptions::describe(&mut tool_router, engine.config());
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

    /// Every tool, as its group declares it (descriptions not yet filled in).
    pub(super) fn tools() -> ToolRouter<Self> {
        Self::run_tools()
            + Self::session_tools()
            + Self::snapshot_tools()
            + Self::file_tools()
            + Self::search_tools()
    }

    /// The sessions this server's tools reach.
    pub(super) fn scope(&self) -> Scope<'_> {
        match &self.client {
            Some(client) => Scope::Client(&client.id),
            None => Scope::Server,
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
