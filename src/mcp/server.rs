//! The MCP server: one [`SandboxServer`] per client, its tools (from the groups in
//! [`super::tools`]) and what it answers besides tools: capabilities, logging level, resources,
//! completions and prompts.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
#[allow(deprecated)] // see `logging`
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CancelTaskParams, CompleteRequestParams, CompleteResult, GetPromptRequestParams,
    GetPromptResponse, GetTaskParams, GetTaskResult, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, Reference, ServerCapabilities, ServerConfig,
    UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use super::principals::{self, Principal};
use super::quotas::{ExecutionPermit, OverQuota, Quotas};
use super::tasks::Tasks;
use super::{descriptions, logging, prompts, resources};
use crate::engine::sessions::{ClientId, Scope};
use crate::engine::snapshots::shared_owner;
use crate::engine::Engine;
use crate::pypi::PypiSearch;

#[derive(Clone)]
pub struct SandboxServer {
    pub(super) engine: Arc<Engine>,
    pub(super) pypi: Arc<PypiSearch>,
    pub(super) tool_router: ToolRouter<Self>,
    /// The client this server speaks for, when the engine has several (HTTP); `None`: the only
    /// client (stdio), which reaches every session.
    pub(super) client: Option<Arc<Client>>,
    /// The log level the client set.
    pub(super) log: Arc<logging::ClientLog>,
    /// What each principal may use (applies only to a client that is a principal).
    pub(super) quotas: Arc<Quotas>,
    /// The task stores (HTTP): a principal's long calls run as tasks (see `tasks`).
    pub(super) tasks: Option<Arc<Tasks>>,
    /// The client's MCP roots, as it last listed them (`SANDBOX_ROOTS`).
    pub(super) roots: Arc<super::roots::ClientRoots>,
}

/// A principal's call that counts as an execution: its permit (counted while it runs, charged
/// when it ends), and, as it ends, the CPU the principal's sessions used between calls, which the
/// engine measured meanwhile, charged too.
pub(super) struct Running {
    engine: Arc<Engine>,
    quotas: Arc<Quotas>,
    client: Arc<Client>,
    _permit: ExecutionPermit,
}

/// Charges `principal` what its sessions used between calls, as the engine measured it.
fn charge_between_calls(engine: &Engine, quotas: &Quotas, client: &Client, principal: &Principal) {
    quotas.charge(principal, engine.take_cpu_between_calls(&client.id));
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(principal) = &self.client.principal {
            charge_between_calls(&self.engine, &self.quotas, &self.client, principal);
        }
    }
}

/// One client of a server with several: an MCP session over HTTP, or a principal. A client that
/// is an MCP session is dropped when the session has ended and its last call has returned; its
/// sandbox sessions are stopped then. A principal's sessions outlive any MCP session (and the
/// sessionless requests of revision 2026-07-28): they end when stopped or idle.
pub(super) struct Client {
    engine: Arc<Engine>,
    pub(super) id: ClientId,
    pub(super) principal: Option<Arc<Principal>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Without a runtime the process is ending: the engine's shutdown removes everything.
        if self.principal.is_none() && tokio::runtime::Handle::try_current().is_ok() {
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
        let quotas = Arc::new(Quotas::new(engine.config()));
        let tools = Self::described_tools(engine.config());
        Self::with_quotas(engine, pypi, quotas, tools)
    }

    /// Every tool, described for `config`: an HTTP listener builds it once and gives each client's
    /// server a copy (schemas and descriptions are the same for all of them).
    pub fn described_tools(config: &crate::config::Config) -> ToolRouter<Self> {
        let mut tool_router = Self::tools();
        descriptions::describe(&mut tool_router, config);
        tool_router
    }

    /// Every tool, described for `config` and a principal's own `secrets`.
    fn described_tools_for(
        config: &crate::config::Config,
        secrets: &crate::config::secrets::Secrets,
    ) -> ToolRouter<Self> {
        let mut tool_router = Self::tools();
        descriptions::describe_for(&mut tool_router, config, secrets);
        tool_router
    }

    /// A server whose principals' quotas are `quotas` (shared by every server of an HTTP listener).
    fn with_quotas(
        engine: Arc<Engine>,
        pypi: Arc<PypiSearch>,
        quotas: Arc<Quotas>,
        tool_router: ToolRouter<Self>,
    ) -> Self {
        SandboxServer {
            engine,
            pypi,
            tool_router,
            client: None,
            log: Arc::default(),
            quotas,
            tasks: None,
            roots: Arc::new(super::roots::ClientRoots::new()),
        }
    }

    /// Runs a principal's long calls as tasks in `tasks` (for a client that takes them).
    pub fn with_tasks(mut self, tasks: Arc<Tasks>) -> Self {
        self.tasks = Some(tasks);
        self
    }

    /// The task stores and the principal whose tasks this server reaches (tasks are on).
    fn task_store(&self) -> Option<(&Arc<Tasks>, &Principal)> {
        Some((self.tasks.as_ref()?, self.principal()?))
    }

    /// The store of this server's tasks, for `tasks/*`.
    fn task_manager(&self) -> Result<rmcp::task_manager::TaskManager, ErrorData> {
        self.task_store()
            .map(|(tasks, principal)| tasks.of(&principal.name))
            .ok_or_else(|| ErrorData::invalid_request("this client has no tasks", None))
    }

    /// The server of one client among several, made for each MCP session and each sessionless
    /// request over HTTP. The caller being served ([`principals::current`]) is the client when
    /// it is a principal: it reaches its own sessions (an admin: every session), whichever MCP
    /// session it comes through. Otherwise the MCP session is the client: it reaches only the
    /// sessions it creates, and they are stopped when it is dropped; its snapshots are the
    /// shared token's ([`shared_owner`]).
    pub fn for_client(
        engine: Arc<Engine>,
        pypi: Arc<PypiSearch>,
        quotas: Arc<Quotas>,
        tools: ToolRouter<Self>,
    ) -> Self {
        let principal = principals::current();
        // `tools` name the server's secrets; a principal with a set of its own is told of it.
        let tools = match &principal {
            Some(p) if *p.secrets != *engine.config().secrets => {
                Self::described_tools_for(engine.config(), &p.secrets)
            }
            _ => tools,
        };
        // Without principals the MCP session is the client, but what outlives it (snapshots)
        // belongs to whoever holds the one shared token, so its next MCP session finds them.
        let id = match &principal {
            Some(principal) => ClientId::of_principal(&principal.name),
            None => {
                let token = engine.config().http.token.as_ref().map(|t| t.expose());
                ClientId::new().with_snapshot_owner(shared_owner(token))
            }
        };
        let client = Arc::new(Client {
            engine: engine.clone(),
            id,
            principal,
        });
        SandboxServer {
            client: Some(client),
            ..Self::with_quotas(engine, pypi, quotas, tools)
        }
    }

    /// Who calls, for the recycling of run sandboxes (`SANDBOX_RECYCLE`): a run's sandbox serves
    /// only the same caller's runs. The principal, or over HTTP without one the MCP session;
    /// over stdio the one client.
    pub(super) fn reuse_key(&self) -> String {
        match &self.client {
            Some(client) => client.id.as_str().to_string(),
            None => "stdio".to_string(),
        }
    }

    /// Where its client's roots are (see [`super::roots::Via`]): over HTTP, mapped through its
    /// principal's own mapping, or without principals the operator's.
    pub(super) fn roots_via(&self) -> super::roots::Via {
        let Some(client) = &self.client else {
            return super::roots::Via::Stdio;
        };
        let policy = &self.engine.config().roots;
        let map = match &client.principal {
            Some(principal) => {
                policy.map_for(Some(&principal.roots_dir_name()), &principal.roots_map)
            }
            None => policy.map_for(None, &[]),
        };
        super::roots::Via::Http(map.into())
    }

    /// The secrets brokered at the egress for this server's client: a principal's own (its
    /// tokens-file line's `secrets=`, else the server's when it is the only principal; none for
    /// an OAuth caller), else the server's (`SANDBOX_SECRETS_FILE`). Never a value shown.
    pub fn secrets(&self) -> Arc<crate::config::secrets::Secrets> {
        match self.principal() {
            Some(principal) => principal.secrets.clone(),
            None => self.engine.config().secrets.clone(),
        }
    }

    /// The principal this server speaks for, when the caller is one.
    pub(super) fn principal(&self) -> Option<&Principal> {
        self.client.as_ref()?.principal.as_deref()
    }

    /// Starts an execution against the principal's quotas (none without a principal), once
    /// what its sessions used between calls is charged.
    pub(super) fn start_execution(&self) -> Result<Option<Running>, OverQuota> {
        let Some(client) = &self.client else {
            return Ok(None);
        };
        let Some(principal) = &client.principal else {
            return Ok(None);
        };
        charge_between_calls(&self.engine, &self.quotas, client, principal);
        let permit = self.quotas.start_execution(principal)?;
        Ok(Some(Running {
            engine: self.engine.clone(),
            quotas: self.quotas.clone(),
            client: client.clone(),
            _permit: permit,
        }))
    }

    /// Every tool, as its group declares it (descriptions not yet filled in).
    pub(super) fn tools() -> ToolRouter<Self> {
        Self::run_tools()
            + Self::session_tools()
            + Self::snapshot_tools()
            + Self::file_tools()
            + Self::notebook_tools()
            + Self::search_tools()
    }

    /// The sessions this server's tools reach.
    pub(super) fn scope(&self) -> Scope<'_> {
        match &self.client {
            Some(client) => Scope::Client(&client.id),
            None => Scope::Server,
        }
    }

    /// The sessions and snapshots this server's listings show: an admin principal sees every
    /// principal's (and acts only on its own).
    pub(super) fn visible_scope(&self) -> Scope<'_> {
        if self.principal().is_some_and(|p| p.admin) {
            Scope::Server
        } else {
            self.scope()
        }
    }

    /// Holds the principal's session creation while its live sessions are counted against its
    /// quota and one is created (nothing without a principal).
    pub(super) async fn session_slot(
        &self,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, OverQuota> {
        let Some(client) = &self.client else {
            return Ok(None);
        };
        let Some(principal) = &client.principal else {
            return Ok(None);
        };
        let own = || self.engine.sessions(Scope::Client(&client.id)).len();
        self.quotas.session_slot(principal, own).await.map(Some)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    /// Every tool call, through the router, passes the audit log and the metrics once.
    async fn call_tool(
        &self,
        mut request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        // Under 2026-07-28 a call that needs the client's roots asks for them first.
        if let Some(ask) =
            self.roots
                .ask_within_call(&self.engine, &mut request, &context, &self.roots_via())
        {
            return Ok(rmcp::model::CallToolResponse::InputRequired(ask));
        }
        // A tool this server does not have is refused before anything counts its name.
        let audit = super::audit::begin(
            &self.tool_router,
            &request,
            self.principal().map(|p| p.name.as_str()),
        )?;
        if let Some((tasks, principal)) = self.task_store() {
            if super::tasks::runs_as_task(&request, &context) {
                let principal = principal.name.clone();
                return Ok(super::tasks::start(
                    tasks, self, &principal, audit, request, context,
                ));
            }
        }
        let cancel = context.ct.clone();
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        audit.run(&cancel, self.tool_router.call(call)).await
    }

    /// The client is ready: its roots are asked for (when roots are on and it has them).
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        tracing::debug!("client initialized");
        self.roots
            .refresh(&self.engine, context.peer, self.roots_via());
    }

    /// The client's roots changed: asked for again; new sandboxes mount the new ones.
    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        self.roots
            .refresh(&self.engine, context.peer, self.roots_via());
    }

    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        // logging: deprecated from revision 2026-07-28; its clients opt in per request instead
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_tools();
        // Tasks (revision 2026-07-28): a principal's, over HTTP.
        let capabilities = match self.task_store() {
            Some(_) => capabilities.enable_tasks().build(),
            None => capabilities.build(),
        };
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

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let task = self.task_manager()?.get_task(&request.task_id)?;
        Ok(GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // Tasks here never ask for input: there is nothing to deliver.
        let none: [(String, serde_json::Value); 0] = [];
        self.task_manager()?.update_task(&request.task_id, none)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_manager()?.cancel_task(&request.task_id)
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

    /// A client that is an MCP session keeps its sandbox sessions through it, so it must speak a
    /// revision that has one: up to 2025-11-25 (clients that probe for 2026-07-28 are told so
    /// and fall back to the handshake). A principal, and the one client of stdio, keep them
    /// without: every revision, the sessionless 2026-07-28 too.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match &self.client {
            Some(client) if client.principal.is_none() => Cow::Borrowed(
                ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE),
            ),
            _ => Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }
}
