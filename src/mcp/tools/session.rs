//! Sessions: start one, stop one, list them with the limits in force.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};

use crate::config::NetworkPolicy;
use crate::mcp::descriptions::limits_line;
use crate::mcp::outcome::{structured, ToolError};
use crate::mcp::outputs::{
    HostOutput, LimitsOutput, ListOutput, RootOutput, SecretOutput, SessionEntry, SessionOutput,
    StopOutput,
};
use crate::mcp::params::{InitializeParams, StopParams};
use crate::mcp::SandboxServer;

#[tool_router(router = session_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "sandbox_initialize",
        description = "Start a persistent sandbox session and return its container_id. Use it for \
                       multi-step work: run_python keeps variables, imports and files between calls, \
                       like a notebook. `dependencies` (as run_python's) are importable from the \
                       first call. `snapshot_id` (from sandbox_snapshot) starts it from a snapshot: \
                       its files, saved variables and dependencies come back. Call sandbox_stop when \
                       done. {session_policy} {images} {roots} {secrets}",
        output_schema = schema_for_output::<SessionOutput>()
    )]
    async fn sandbox_initialize(
        &self,
        Parameters(params): Parameters<InitializeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let requested = params.dependencies.clone().unwrap_or_default();
        let snapshot_id = params.snapshot_id.filter(|s| !s.trim().is_empty());
        let hosts = params.network.unwrap_or_default();
        if !hosts.is_empty() && self.engine.config().network != NetworkPolicy::Allowlist {
            return Err(ToolError::refused(format!(
                "`network` asks for hosts, which needs SANDBOX_NETWORK=allowlist (this server's is {})",
                self.engine.config().network.as_str()
            )));
        }
        // A restore runs the snapshot's code (unpickling, imports): an execution.
        let _running = match snapshot_id.as_ref().map(|_| self.start_execution()) {
            Some(Err(over)) => return Err(over.into()),
            Some(Ok(permit)) => permit,
            None => None,
        };
        let (mut options, notices) = self
            .options_for(&context, params.image, params.dependencies, false)
            .await;
        options.consent = Some(crate::mcp::consent::ElicitingAsker::for_client(&context));
        let slot = match self.session_slot().await {
            Ok(slot) => slot,
            Err(over) => {
                super::run::finish(notices).await;
                return Err(over.into());
            }
        };
        let started = match &snapshot_id {
            Some(snapshot_id) => self
                .engine
                .restore_session(self.scope(), snapshot_id, &options)
                .await
                .map(|(id, restored)| (id, Some(restored))),
            None => self
                .engine
                .create_session(self.scope(), &options)
                .await
                .map(|id| (id, None)),
        };
        drop(slot);
        super::run::finish(notices).await;
        let (id, restored) = started?;
        let network = if hosts.is_empty() {
            None
        } else {
            Some(self.engine.request_hosts(self.scope(), &id, &hosts).await?)
        };
        let image = self
            .engine
            .sessions(self.scope())
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.image)
            .unwrap_or_default();
        let mut text = match &restored {
            Some(restored) => format!(
                "Sandbox session started from snapshot {}.\ncontainer_id: {id}\nimage: {image}",
                restored.snapshot_id
            ),
            None => format!("Sandbox session started.\ncontainer_id: {id}\nimage: {image}"),
        };
        text.push_str(
            "\nPass this container_id to run_python (variables persist between calls), sandbox_exec \
             and sandbox_stop.",
        );
        match &restored {
            Some(restored) => text.push_str(&super::snapshot::restored_text(restored)),
            None if !requested.is_empty() => {
                text.push_str(&format!("\ndependencies: {}", requested.join(" ")))
            }
            None => {}
        }
        let roots = RootOutput::listed(options.mounted_roots().map(|set| set.as_ref()));
        text.push_str(&RootOutput::lines(&roots));
        let secrets = self.secrets();
        if !secrets.is_empty() {
            text.push('\n');
            text.push_str(&crate::mcp::descriptions::secrets_line(&secrets));
        }
        for host in network.iter().flatten() {
            text.push_str(&format!(
                "\nnetwork: {}:{} {}",
                host.host,
                host.port,
                host.status.as_str()
            ));
            if let Some(reason) = &host.reason {
                text.push_str(&format!(" ({reason})"));
            }
        }
        let mut result = structured(
            text,
            &SessionOutput {
                container_id: id,
                image,
                roots,
                roots_refused: Vec::new(),
                secrets: SecretOutput::listed(&secrets),
                restored: restored.map(super::snapshot::restored_output),
                network: network.map(|hosts| {
                    hosts
                        .into_iter()
                        .map(|h| HostOutput {
                            host: h.host,
                            port: h.port,
                            status: h.status.as_str().to_string(),
                            reason: h.reason,
                        })
                        .collect()
                }),
            },
        );
        crate::mcp::roots::show_refusals(&mut result, &self.roots.take_refusals());
        Ok(result)
    }

    #[tool(
        name = "sandbox_stop",
        description = "Stop a session started by sandbox_initialize and remove its sandbox: {stopped}",
        output_schema = schema_for_output::<StopOutput>()
    )]
    async fn sandbox_stop(
        &self,
        Parameters(params): Parameters<StopParams>,
    ) -> Result<CallToolResult, ToolError> {
        let id = self
            .engine
            .stop_session(self.scope(), &params.container_id)
            .await?;
        let text = if self.engine.config().files.persist_dir.is_some() {
            format!(
                "Session {id} stopped and its sandbox removed; the files it saved stay on the host."
            )
        } else {
            format!("Session {id} stopped and its sandbox removed.")
        };
        Ok(structured(
            text,
            &StopOutput {
                container_id: id,
                stopped: true,
            },
        ))
    }

    #[tool(
        name = "sandbox_list",
        description = "List this server's live sessions (container_id, image, age, idle time) and the \
                       limits in force.",
        output_schema = schema_for_output::<ListOutput>(),
        annotations(read_only_hint = true)
    )]
    async fn sandbox_list(&self) -> Result<CallToolResult, ToolError> {
        let config = self.engine.config();
        let sessions: Vec<SessionEntry> = self
            .engine
            .sessions(self.visible_scope())
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
}
