//! The audit log and the call metrics: every tool call passes here once ([`begin`], then
//! [`Pending::run`], from the server's `call_tool`), and leaves one line on stderr (tracing target `audit`, level `info`):
//!
//! `principal tool session outcome duration_ms bytes_out`
//!
//! - `principal`: the caller's principal, `anonymous` without one;
//! - `tool`: one of the server's tools, or `<unknown>` for a call of a name it does not have (the
//!   call is refused before it runs; `requested` then carries at most [`NAME_EXCERPT`] characters
//!   of the name, escaped, and its size when it is longer);
//! - `session`: the sandbox session the call named or created (`-` for none; a name longer than
//!   [`SESSION_EXCERPT`] characters is cut);
//! - `outcome`: `ok`, `error`, `timeout`, `out_of_memory` or `cancelled` (as the metrics say);
//! - `bytes_out`: bytes of workspace files the call copied out of its sandbox;
//! - `secrets` (only when there are): what the egress proxy did with the call's secrets, from its
//!   network record: each secret added (`llm -> api.example.com:443 reached, 2 requests, 1 KiB
//!   sent, 3.1 KiB received`) and each placeholder that went as written (`placeholder of llm ->
//!   ...`); names, hosts, outcomes and sizes, never a value.
//!
//! With `LOG_FORMAT=json` the line is a JSON object with these fields. The code, the command and
//! what they printed are never in it, unless the `audit` target logs at `debug` (`LOG_LEVEL=debug`):
//! then the line also carries the call's arguments. Whatever a client put in them, the log's
//! formatter writes every line as one line, with control characters escaped (see `cli`).

use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::ErrorData;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::metrics::{self, Outcome, ToolLabel, ANONYMOUS};

/// The tracing target of audit lines.
pub const TARGET: &str = "audit";

/// How many characters of an unknown tool's name its audit line and its error carry.
pub const NAME_EXCERPT: usize = 64;

/// How many characters of a session a call names its audit line carries (ids are far shorter).
pub const SESSION_EXCERPT: usize = 80;

/// How many entries of a call's network record its `secrets` field names (the rest counted).
pub const SECRET_ENTRIES: usize = 8;

/// A call of a tool the server does not have: refused before it runs, with what the client is
/// told. The name is kept only as a bounded, escaped excerpt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UnknownTool {
    /// At most [`NAME_EXCERPT`] characters of the name, escaped ([`crate::text::log_excerpt`]).
    pub excerpt: String,
    /// The name's size in bytes.
    pub bytes: usize,
    /// The server's tools, comma-separated.
    pub tools: String,
}

impl std::fmt::Display for UnknownTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown tool \"{}\"", self.excerpt)?;
        if self.bytes > metrics::MAX_TOOL_NAME {
            write!(
                f,
                " (a name of {}; tool names are at most {} bytes)",
                crate::text::bytes(self.bytes as u64),
                metrics::MAX_TOOL_NAME
            )?;
        }
        write!(f, ": this server's tools are {}", self.tools)
    }
}

impl UnknownTool {
    fn new<S: Send + Sync + 'static>(name: &str, tools: &ToolRouter<S>) -> Self {
        let names: Vec<String> = tools
            .list_all()
            .into_iter()
            .map(|tool| tool.name.into_owned())
            .collect();
        UnknownTool {
            excerpt: crate::text::log_excerpt(name, NAME_EXCERPT),
            bytes: name.len(),
            tools: names.join(", "),
        }
    }
}

impl From<UnknownTool> for ErrorData {
    /// JSON-RPC's invalid params, as MCP answers a call of an unknown tool.
    fn from(unknown: UnknownTool) -> Self {
        ErrorData::invalid_params(unknown.to_string(), None)
    }
}

/// One tool call being observed; recorded when it ends, or as cancelled if it is dropped while
/// it runs (the client went away, the server stopped). `ended` is true until it runs.
struct Call {
    tool: ToolLabel,
    /// An unknown tool's name as the client gave it: bounded and escaped.
    requested: Option<String>,
    principal: String,
    session: Option<String>,
    arguments: Option<String>,
    /// What the egress proxy did with the call's secrets (see the module's documentation).
    secrets: Option<String>,
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
        // Strings are recorded as strings (quoted in the text format, whatever they hold);
        // `requested` and `arguments` only when present (an unknown tool; LOG_LEVEL=debug for
        // the audit target).
        tracing::info!(
            target: TARGET,
            principal = self.principal.as_str(),
            tool = self.tool.as_str(),
            requested = self.requested.as_deref(),
            session,
            outcome = outcome.as_str(),
            duration_ms,
            bytes_out,
            secrets = self.secrets.as_deref(),
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

/// A tool call about to run: what its audit line says of it. `tools` are the server's (the call
/// must name one of them), `principal` is the caller's name, if it is a principal (else the
/// current principal of the request, else `anonymous`).
///
/// A call of any other name is refused here, before it runs: it is counted and audited as
/// `<unknown>` (with a bounded, escaped excerpt of the name), and the error says so.
pub fn begin<S: Send + Sync + 'static>(
    tools: &ToolRouter<S>,
    request: &CallToolRequestParams,
    principal: Option<&str>,
) -> Result<Pending, UnknownTool> {
    let principal = principal
        .map(str::to_string)
        .or_else(|| super::principals::current().map(|p| p.name.clone()))
        .unwrap_or_else(|| ANONYMOUS.to_string());
    let tool = ToolLabel::of(tools, &request.name);
    if !tool.is_known() {
        let unknown = UnknownTool::new(&request.name, tools);
        metrics::global().call_started();
        Call {
            tool,
            requested: Some(unknown.excerpt.clone()),
            principal,
            session: None,
            arguments: None,
            secrets: None,
            started: Instant::now(),
            ended: false,
        }
        .record(Outcome::Error, Duration::ZERO, 0);
        return Err(unknown);
    }
    let arguments = tracing::enabled!(target: TARGET, tracing::Level::DEBUG).then(|| {
        request
            .arguments
            .as_ref()
            .map(|a| Value::Object(a.clone()).to_string())
            .unwrap_or_default()
    });
    Ok(Pending(Call {
        tool,
        requested: None,
        principal,
        session: named_session(request),
        arguments,
        secrets: None,
        started: Instant::now(),
        ended: true,
    }))
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
                    .map(session_excerpt);
            }
            record.secrets = content.and_then(secret_uses);
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

/// The session a call names in its arguments (bounded: the client wrote it).
fn named_session(request: &CallToolRequestParams) -> Option<String> {
    request
        .arguments
        .as_ref()?
        .get("container_id")?
        .as_str()
        .map(session_excerpt)
}

/// What a call's network record says of its secrets (the `secrets` field; `None` without any):
/// at most [`SECRET_ENTRIES`] entries, hosts bounded (the code chose them; the log's formatter
/// escapes what they hold).
fn secret_uses(content: &Value) -> Option<String> {
    let entries = content.get("network")?.as_array()?;
    let mut uses: Vec<String> = Vec::new();
    let mut more = 0usize;
    for entry in entries {
        let text = |key: &str| entry.get(key).and_then(Value::as_str);
        let number = |key: &str| entry.get(key).and_then(Value::as_u64).unwrap_or(0);
        let mut named = Vec::new();
        if let Some(secret) = text("secret") {
            named.push(crate::text::log_excerpt(secret, 64));
        }
        if let Some(placeholder) = text("placeholder") {
            named.push(format!(
                "placeholder of {}",
                crate::text::log_excerpt(placeholder, 200)
            ));
        }
        for name in named {
            if uses.len() == SECRET_ENTRIES {
                more += 1;
                continue;
            }
            let requests = number("connections");
            uses.push(format!(
                "{name} -> {}:{} {}, {requests} request{}, {} sent, {} received",
                crate::text::log_excerpt(text("host").unwrap_or("?"), 255),
                number("port"),
                text("outcome").unwrap_or("?"),
                if requests == 1 { "" } else { "s" },
                crate::text::bytes(number("bytes_sent")),
                crate::text::bytes(number("bytes_received")),
            ));
        }
    }
    if more > 0 {
        uses.push(format!("and {more} more"));
    }
    (!uses.is_empty()).then(|| uses.join("; "))
}

/// A session's id as its audit line carries it: whole, unless it is longer than any id.
fn session_excerpt(id: &str) -> String {
    crate::text::log_excerpt(id, SESSION_EXCERPT)
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
    fn an_unknown_tool_is_refused_with_a_bounded_escaped_name() {
        let tools = crate::mcp::server::SandboxServer::tools();
        let known = CallToolRequestParams::new("sandbox_list");
        assert!(begin(&tools, &known, None).is_ok());
        let forged = "x\nZ  INFO audit: tool call principal=admin\u{1b}[2K";
        let Err(unknown) = begin(
            &tools,
            &CallToolRequestParams::new(forged.to_string()),
            None,
        ) else {
            panic!("an unknown tool was accepted");
        };
        assert_eq!(
            unknown.excerpt,
            "x\\nZ  INFO audit: tool call principal=admin\\u{1b}[2K"
        );
        let message = ErrorData::from(unknown).message;
        assert!(
            message.starts_with("unknown tool \"x\\nZ  INFO")
                && message.contains("this server's tools are ")
                && message.contains("run_python_ephemeral"),
            "{message}"
        );
        assert!(
            !message.chars().any(crate::text::unsafe_in_log),
            "{message:?}"
        );
        // A huge name: only an excerpt, and its size.
        let huge = "é".repeat(1 << 20);
        let Err(unknown) = begin(&tools, &CallToolRequestParams::new(huge), None) else {
            panic!("an unknown tool was accepted");
        };
        assert_eq!(
            unknown.excerpt,
            format!("{}…(2 MiB)", "é".repeat(NAME_EXCERPT))
        );
        let message = unknown.to_string();
        assert!(
            message.contains("(a name of 2 MiB; tool names are at most 128 bytes)"),
            "{message}"
        );
        assert!(message.len() < 4096, "{message}");
    }

    #[test]
    fn the_session_is_read_from_the_arguments() {
        let mut request = CallToolRequestParams::new("run_python");
        assert_eq!(named_session(&request), None);
        request.arguments = json!({"container_id": "abc", "code": "print(1)"})
            .as_object()
            .cloned();
        assert_eq!(named_session(&request).as_deref(), Some("abc"));
        let long = format!("{}\n", "a".repeat(1000));
        request.arguments = json!({"container_id": long}).as_object().cloned();
        let named = named_session(&request).unwrap_or_default();
        assert!(
            named.starts_with(&"a".repeat(SESSION_EXCERPT)) && named.ends_with("…(1001 bytes)")
        );
    }

    #[test]
    fn a_calls_secrets_are_named_from_its_network_record_never_more() {
        assert_eq!(secret_uses(&json!({})), None);
        assert_eq!(
            secret_uses(&json!({"network": [{"host": "pypi.org", "port": 443}]})),
            None
        );
        let record = json!({"network": [
            {"host": "api.llm.test", "port": 443, "outcome": "reached", "connections": 2,
             "bytes_sent": 1024, "bytes_received": 10, "secret": "llm"},
            {"host": "elsewhere.test", "port": 80, "outcome": "failed", "connections": 1,
             "bytes_sent": 5, "bytes_received": 0, "placeholder": "llm"},
            {"host": "plain.test", "port": 443, "outcome": "reached", "connections": 1}
        ]});
        let said = secret_uses(&record).expect("uses");
        assert!(
            said.starts_with("llm -> api.llm.test:443 reached, 2 requests, 1 KiB sent,"),
            "{said}"
        );
        assert!(
            said.contains("; placeholder of llm -> elsewhere.test:80 failed, 1 request,"),
            "{said}"
        );
        assert!(!said.contains("plain.test"), "{said}");
        // Bounded: a record of many uses names SECRET_ENTRIES and counts the rest.
        let many: Vec<Value> = (0..20)
            .map(|i| json!({"host": format!("h{i}.test"), "port": 443, "secret": "llm"}))
            .collect();
        let said = secret_uses(&json!({ "network": many })).expect("uses");
        assert_eq!(said.matches(" -> ").count(), SECRET_ENTRIES, "{said}");
        assert!(said.ends_with("; and 12 more"), "{said}");
    }
}
