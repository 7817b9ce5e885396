//! Running code: a disposable sandbox per call, or a session's interpreter or shell.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};

use crate::engine::{Execution, RunOptions, Task};
use crate::mcp::notices::CallNotices;
use crate::mcp::outcome::ToolError;
use crate::mcp::params::{ExecParams, RunEphemeralParams, RunPythonParams};
use crate::mcp::render::{self, ExecutionOutput};
use crate::mcp::SandboxServer;

#[tool_router(router = run_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "run_python_ephemeral",
        description = "Run Python code in a fresh, isolated sandbox: a new interpreter with an empty \
                       /workspace and /tmp every call (a sandbox this client's previous call used \
                       may serve it, once emptied: none of that call's processes, files or \
                       variables remain). Best for one-off scripts: nothing persists between calls \
                       (use sandbox_initialize and run_python to keep variables). The code runs as `python` \
                       would run a script, as an unprivileged user in /workspace, with Python 3.11 and \
                       its standard library. Returns stdout, stderr (with the traceback of an uncaught \
                       exception) and the exit status; a failure, non-zero exit or timeout is reported \
                       as an error result. {files} {limits} {images} {roots} {secrets}",
        output_schema = schema_for_output::<ExecutionOutput>(),
        annotations(read_only_hint = false, open_world_hint = false)
    )]
    async fn run_python_ephemeral(
        &self,
        Parameters(params): Parameters<RunEphemeralParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _running = self.start_execution()?;
        let (options, notices) = self
            .options_for(&context, params.image, params.dependencies, true)
            .await;
        let execution = self
            .engine
            .run_ephemeral(Task::Script(&params.code), &options)
            .await;
        finish(notices).await;
        Ok(self.execution_result(&context, &execution?, None))
    }

    #[tool(
        name = "run_python",
        description = "Run Python code in a session's persistent interpreter (start one with \
                       sandbox_initialize). State persists between calls: variables, functions, \
                       imports and files in /workspace are still there on the next call. On timeout \
                       the code is interrupted (KeyboardInterrupt) and the session keeps its state; if \
                       the code cannot be interrupted or runs out of memory the interpreter restarts \
                       and the result says state was lost. {files} {limits} {roots} {secrets}",
        output_schema = schema_for_output::<ExecutionOutput>()
    )]
    async fn run_python(
        &self,
        Parameters(params): Parameters<RunPythonParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _running = self.start_execution()?;
        let (options, notices) = self
            .options_for(&context, None, params.dependencies, true)
            .await;
        let task = Task::Python(&params.code);
        let result = self
            .in_session(&context, &params.container_id, task, &options)
            .await;
        finish(notices).await;
        result
    }

    #[tool(
        name = "sandbox_exec",
        description = "Run a shell command (/bin/sh -c) in a session's sandbox, in /workspace, as the \
                       same unprivileged user, e.g. `ls -la` or `python -m pip list`. Returns exit \
                       code, stdout and stderr. {limits} {roots} {secrets}",
        output_schema = schema_for_output::<ExecutionOutput>()
    )]
    async fn sandbox_exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _running = self.start_execution()?;
        let (options, notices) = self.options_for(&context, None, None, true).await;
        let task = Task::Shell(&params.command);
        let result = self
            .in_session(&context, &params.container_id, task, &options)
            .await;
        finish(notices).await;
        result
    }
}

impl SandboxServer {
    /// Run options for one request: cancellation follows the client's `notifications/cancelled`;
    /// the steps of preparing the sandbox, and with `live` the code's output while it runs, go to
    /// the client as progress when it sent a progress token, and as `info` log messages when it
    /// asked for them (see `notices`). The caller finishes the notices before it returns. A
    /// sandbox the call starts mounts the client's roots as they are now (`SANDBOX_ROOTS`).
    pub(super) async fn options_for(
        &self,
        context: &RequestContext<RoleServer>,
        image: Option<String>,
        dependencies: Option<Vec<String>>,
        live: bool,
    ) -> (RunOptions, Option<CallNotices>) {
        let notices = CallNotices::start(
            context.peer.clone(),
            context.meta.get_progress_token(),
            self.log.for_request(context),
        );
        let options = RunOptions {
            timeout: None,
            image,
            cancel: Some(context.ct.clone()),
            progress: notices.as_ref().map(CallNotices::steps),
            live_output: notices
                .as_ref()
                .filter(|_| live)
                .map(CallNotices::live_output),
            dependencies: dependencies.unwrap_or_default(),
            // The result shows a model the head and tail of long output: keep the whole.
            keep_whole_output: true,
            consent: None,
            files_owner: self.principal().map(|p| p.files_dir_name()),
            reuse: Some(self.reuse_key()),
            roots: self
                .roots
                .for_call(&self.engine, context, &self.roots_via())
                .await,
            // A principal's own secrets (its tokens-file line's `secrets=`), else the server's.
            secrets: Some(self.secrets()),
            ..RunOptions::default()
        };
        (options, notices)
    }

    /// A tool result for an execution, with a warning logged to the client when it lost state.
    fn execution_result(
        &self,
        context: &RequestContext<RoleServer>,
        execution: &Execution,
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
        let mut result = render::execution(
            execution,
            &config.limits,
            container_id,
            config.files.return_max_file_bytes,
        );
        crate::mcp::roots::show_refusals(&mut result, &self.roots.take_refusals());
        result
    }

    /// Runs a task in one of this client's sessions.
    async fn in_session(
        &self,
        context: &RequestContext<RoleServer>,
        container_id: &str,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<CallToolResult, ToolError> {
        let execution = self
            .engine
            .execute_in_session(self.scope(), container_id, task, options)
            .await?;
        Ok(self.execution_result(context, &execution, Some(container_id)))
    }
}

/// Waits until the call's notices are sent, so none comes after its result.
pub(super) async fn finish(notices: Option<CallNotices>) {
    if let Some(notices) = notices {
        notices.finish().await;
    }
}
