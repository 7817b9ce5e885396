//! Long executions as tasks (the tasks extension of revision 2026-07-28, SEP-2663), for
//! principals over HTTP only.
//!
//! A principal's client that declares the extension gets `run_python`, `run_python_ephemeral`
//! and `sandbox_exec` back as a task (`resultType: "task"`) and polls `tasks/get` for the
//! result; `tasks/cancel` cancels the execution (its sandbox is stopped as on a client's
//! `notifications/cancelled`). Every principal has a store of its own ([`Tasks::of`]), so no
//! principal reaches another's task; an id it does not own is unknown (`-32602`).
//!
//! The task runs the call on its own: its own cancellation token (the request's ends with the
//! HTTP response), the audit line and the metrics, and the execution permit of the principal's
//! quota, which the tool takes inside the task and holds until the execution ends. A task is
//! kept for its TTL (the longest a call can take) after it ends; all are aborted when the server
//! stops ([`Tasks::shutdown`]).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CreateTaskResult};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData, RoleServer};
use tokio_util::sync::CancellationToken;

use super::server::SandboxServer;

/// The tools that run as a task when the client takes tasks.
const TASK_TOOLS: &[&str] = &["run_python", "run_python_ephemeral", "sandbox_exec"];

/// How often a client is told to poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 500;

/// The task stores of a server, one per principal.
pub struct Tasks {
    stores: Mutex<HashMap<String, TaskManager>>,
    ttl: Duration,
}

impl Tasks {
    /// Stores whose tasks live `ttl` (the longest a call can take).
    pub fn new(ttl: Duration) -> Self {
        Tasks {
            stores: Mutex::default(),
            ttl,
        }
    }

    /// The store of one principal's tasks.
    pub fn of(&self, principal: &str) -> TaskManager {
        self.stores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(principal.to_string())
            .or_default()
            .clone()
    }

    /// Aborts every running task and forgets every task (the server is stopping).
    pub fn shutdown(&self) {
        let stores =
            std::mem::take(&mut *self.stores.lock().unwrap_or_else(PoisonError::into_inner));
        for store in stores.values() {
            store.shutdown();
        }
    }
}

/// Whether a call runs as a task: a tool that runs code, for a principal whose request
/// declared the tasks extension.
pub(super) fn runs_as_task(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> bool {
    TASK_TOOLS.contains(&request.name.as_ref())
        && context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
}

/// Starts a call as a task of `principal` in `tasks`, answering with the task.
pub(super) fn start(
    tasks: &Tasks,
    server: &SandboxServer,
    principal: &str,
    audit: super::audit::Pending,
    request: CallToolRequestParams,
    mut context: RequestContext<RoleServer>,
) -> CallToolResponse {
    let store = tasks.of(principal);
    let ttl_ms = u64::try_from(tasks.ttl.as_millis()).unwrap_or(u64::MAX);
    let options = TaskOptions::new()
        .with_ttl_ms(ttl_ms)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    let server = server.clone();
    let task = store.spawn(options, move |task| {
        Box::pin(async move {
            // The request's token ends with its response: the task has its own.
            let cancel = CancellationToken::new();
            context.ct = cancel.clone();
            let call = ToolCallContext::new(&server, request, context);
            let run = audit.run(&cancel, server.tool_router.call(call));
            tokio::pin!(run);
            let response = tokio::select! {
                response = &mut run => response,
                () = task.cancelled() => {
                    cancel.cancel();
                    // The execution ends (and its sandbox is stopped) before the task does.
                    let _ = run.await;
                    return Err(TaskExit::Cancelled);
                }
            };
            match response {
                Ok(CallToolResponse::Complete(result)) => Ok(result),
                Ok(_) => Err(TaskExit::Error(ErrorData::internal_error(
                    "the tool answered with something other than a result",
                    None,
                ))),
                Err(error) => Err(TaskExit::Error(error)),
            }
        })
    });
    CallToolResponse::Task(CreateTaskResult::new(task))
}
