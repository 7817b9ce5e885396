//! The server as a child of this executable, and rmcp's client speaking MCP to it over stdio.

use std::process::Stdio;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use crate::SERVER_ROLE;

pub(crate) type Client = RunningService<RoleClient, ()>;

pub(crate) async fn call(
    client: &Client,
    tool: &'static str,
    arguments: Value,
) -> Result<CallToolResult, String> {
    let arguments = match arguments {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .map_err(|e| format!("{tool}: {e}"))?;
    if result.is_error == Some(true) {
        return Err(format!(
            "{tool} failed: {:?}",
            result
                .content
                .first()
                .and_then(|c| c.as_text())
                .map(|t| &t.text)
        ));
    }
    Ok(result)
}

pub(crate) fn stdout_of(result: &CallToolResult) -> String {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s["stdout"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Starts the server as a child with these settings and connects rmcp's client to it.
pub(crate) async fn plot_server(env: &[(&str, &str)]) -> Result<Client, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (transport, _stderr) =
        TokioChildProcess::builder(tokio::process::Command::new(&exe).configure(|cmd| {
            cmd.env(SERVER_ROLE, "1").env("LOG_LEVEL", "warn");
            for (k, v) in &env {
                cmd.env(k, v);
            }
        }))
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    ().serve(transport)
        .await
        .map_err(|e| format!("initialize failed: {e}"))
}

pub(crate) fn field_str(result: &CallToolResult, name: &str) -> Result<String, String> {
    result
        .structured_content
        .as_ref()
        .and_then(|s| s[name].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("no {name} in the result"))
}
