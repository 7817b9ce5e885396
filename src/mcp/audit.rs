//! The audit log and the call metrics: every tool call passes here once ([`begin`], then
//! [`Pending::run`], from the server's `call_tool`), and leaves one line on stderr (tracing target `audit`, level `info`):
//!
//! `principal tool session outcome duration_ms bytes_out`
//!
//! - `principal`: the caller's principal, `anonymous` without one;
//! - `session`: the sandbox session the call named or created (`-` for none);
//! - `outcome`: `ok`, `error`, `timeout`, `out_of_memory` or `cancelled` (as the metrics say);
//! - `bytes_out`: bytes of workspace files the call copied out of its sandbox.
//!
//! With `LOG_FORMAT=json` the line is a JSON object with these fields. The code, the command and
//! what they printed are never in it, unless the `audit` target logs at `debug` (`LOG_LEVEL=debug`):
//! then the line also carries the call's arguments.

use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::ErrorData;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::metrics::{self, Outcome, ANONYMOUS};

/// The tracing target of audit lines.
pub const TARGET: &str = "audit";

/// One tool call being observed; recorded when it ends, or as cancelled if it is dropped while
/// it runs (the client went away, the server stopped). `ended` is true until it runs.
struct Call {
    tool: String,
    principal: String,
    session: Option<String>,
    arguments: Option<String>,
    started: Instant,
    ended: bool,
}

impl Call {
    fn record(&mut self, outcome: Outcome, took: Duration, bytes_out: u64) {
        self.ended = true;
        let metrics = metrics::global();
        metrics.call_ended(&self.tool, outcome, &self.principal, took);
        let session = self.session.as_deref().unwrap_or("-");
        let duration_ms = took.as_millis() as u64;
        // `arguments` is recorded only when present (LOG_LEVEL=debug for the audit target).
        tracing::info!(
            target: TARGET,
            principal = %self.principal,
            tool = %self.tool,
            session,
            outcome = outcome.as_str(),
            duration_ms,
            bytes_out,
            arguments = self.arguments.as_deref(),
            "tool call"
        );
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.ended {
            self.record(Outcome::Cancelled, self.started.elapsed(), 0);
        }
    }
}

/// A tool call about to run: what its audit line says of it. `principal` is the caller's name,
/// if it is a principal (else the current principal of the request, else `anonymous`).
pub fn begin(request: &CallToolRequestParams, principal: Option<&str>) -> Pending {
    let principal = principal
        .map(str::to_string)
        .or_else(|| super::principals::current().map(|p| p.name.clone()))
        .unwrap_or_else(|| ANONYMOUS.to_string());
    let arguments = tracing::enabled!(target: TARGET, tracing::Level::DEBUG).then(|| {
        request
            .arguments
            .as_ref()
            .map(|a| Value::Object(a.clone()).to_string())
            .unwrap_or_default()
    });
    Pending(Call {
        tool: request.name.to_string(),
        principal,
        session: named_session(request),
        arguments,
        started: Instant::now(),
        ended: true,
    })
}

/// A call [`begin`] described, to be run with [`Pending::run`].
pub struct Pending(Call);

impl Pending {
    /// Runs the call, then counts it and writes its audit line; `cancel` is the request's
    /// cancellation (a call cancelled by the client is `cancelled`, whatever it answered).
    pub async fn run<F>(self, cancel: &CancellationToken, call: F) -> F::Output
    where
        F: std::future::Future<Output = Result<CallToolResponse, ErrorData>>,
    {
        let mut record = self.0;
        record.started = Instant::now();
        record.ended = false;
        metrics::global().call_started();
        let (response, bytes_out) = crate::engine::stats::counting_copied(call).await;
        let took = record.started.elapsed();
        if let Ok(CallToolResponse::Complete(result)) = &response {
            let content = result.structured_content.as_ref();
            if record.session.is_none() {
                record.session = content
                    .and_then(|c| c.get("container_id"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            if content
                .and_then(|c| c.get("dependencies"))
                .and_then(|d| d.get("installed"))
                .and_then(Value::as_bool)
                == Some(false)
            {
                metrics::global().cache_hit();
            }
        }
        let outcome = if cancel.is_cancelled() {
            Outcome::Cancelled
        } else {
            outcome_of(&response)
        };
        record.record(outcome, took, bytes_out);
        response
    }
}

/// The session a call names in its arguments.
fn named_session(request: &CallToolRequestParams) -> Option<String> {
    request
        .arguments
        .as_ref()?
        .get("container_id")?
        .as_str()
        .map(str::to_string)
}

/// How a call ended, from what it answered: an execution's flags first (a timeout is also an
/// error result), then whether the result is an error.
pub fn outcome_of(response: &Result<CallToolResponse, ErrorData>) -> Outcome {
    let result = match response {
        Ok(CallToolResponse::Complete(result)) => result,
        Ok(_) => return Outcome::Ok,
        Err(_) => return Outcome::Error,
    };
    let flag = |name: &str| {
        result
            .structured_content
            .as_ref()
            .and_then(|c| c.get(name))
            .and_then(Value::as_bool)
            == Some(true)
    };
    if flag("cancelled") {
        Outcome::Cancelled
    } else if flag("timed_out") {
        Outcome::Timeout
    } else if flag("out_of_memory") {
        Outcome::OutOfMemory
    } else if result.is_error == Some(true) {
        Outcome::Error
    } else {
        Outcome::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock};
    use serde_json::json;

    fn complete(is_error: bool, content: Value) -> Result<CallToolResponse, ErrorData> {
        let mut result = if is_error {
            CallToolResult::error(vec![ContentBlock::text("x")])
        } else {
            CallToolResult::success(vec![ContentBlock::text("x")])
        };
        result.structured_content = Some(content);
        Ok(CallToolResponse::Complete(result))
    }

    #[test]
    fn outcomes_follow_the_execution_flags_then_the_error_flag() {
        assert_eq!(outcome_of(&complete(false, json!({}))), Outcome::Ok);
        assert_eq!(
            outcome_of(&complete(true, json!({"exit_code": 1}))),
            Outcome::Error
        );
        assert_eq!(
            outcome_of(&complete(true, json!({"timed_out": true}))),
            Outcome::Timeout
        );
        assert_eq!(
            outcome_of(&complete(
                true,
                json!({"out_of_memory": true, "timed_out": false})
            )),
            Outcome::OutOfMemory
        );
        assert_eq!(
            outcome_of(&complete(
                true,
                json!({"cancelled": true, "timed_out": true})
            )),
            Outcome::Cancelled
        );
        assert_eq!(
            outcome_of(&Err(ErrorData::invalid_params("bad", None))),
            Outcome::Error
        );
    }

    #[test]
    fn the_session_is_read_from_the_arguments() {
        let mut request = CallToolRequestParams::new("run_python");
        assert_eq!(named_session(&request), None);
        request.arguments = json!({"container_id": "abc", "code": "print(1)"})
            .as_object()
            .cloned();
        assert_eq!(named_session(&request).as_deref(), Some("abc"));
    }
}
