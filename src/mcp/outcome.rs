//! The one way a tool's outcome becomes an MCP result.
//!
//! Handlers return `Result<CallToolResult, ToolError>` and `?` their engine calls, the way axum
//! handlers `?` into their error type. A failure is always an `isError` result with text the model
//! can act on, never a protocol error: those are kept for malformed requests, which rmcp answers
//! before a handler runs.

use rmcp::model::{CallToolResult, ContentBlock, IntoContents};
use serde::Serialize;

use crate::engine::backend::BackendError;
use crate::engine::EngineError;
use crate::pypi::SearchError;

/// Why a tool call did not give its result.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The engine refused the request or could not carry it out.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The package index could not be searched.
    #[error(transparent)]
    Search(#[from] SearchError),
    /// A file's bytes were not valid base64.
    #[error("content_base64 is not valid base64: {0}")]
    InvalidBase64(#[from] base64::DecodeError),
    /// The tool refused the request before it reached the engine.
    #[error("{0}")]
    Refused(String),
}

impl From<crate::mcp::quotas::OverQuota> for ToolError {
    fn from(over: crate::mcp::quotas::OverQuota) -> Self {
        ToolError::Refused(over.0)
    }
}

impl ToolError {
    /// A refusal of the request, in words the model can act on.
    pub fn refused(message: impl Into<String>) -> Self {
        ToolError::Refused(message.into())
    }

    /// The text of the error result: `Error:` and what went wrong; for engine failures where the
    /// operator (not the model) must act, a hint saying what to do.
    fn text(&self) -> String {
        match self {
            ToolError::Engine(e) => {
                let endpoint = crate::engine::docker::endpoint();
                let hint = match e {
                    EngineError::Backend(BackendError::Unavailable { .. })
                        if crate::config::settings::is_remote_endpoint(&endpoint) =>
                    {
                        format!(
                            " The engine at {endpoint} must be reachable (the network, and the TLS \
                             certificates in DOCKER_CERT_PATH or the ssh login); the server \
                             reconnects on the next call."
                        )
                    }
                    EngineError::Backend(BackendError::Unavailable { .. }) => {
                        " The Docker engine must be running (start it, e.g. `systemctl start docker` or \
                         `bash scripts/dev-env.sh`); the server reconnects on the next call."
                            .to_string()
                    }
                    EngineError::Backend(BackendError::ImageMissing { .. }) => {
                        " Ask the operator to build or pull the image.".to_string()
                    }
                    _ => String::new(),
                };
                format!("Error: {e}.{hint}")
            }
            other => format!("Error: {other}"),
        }
    }
}

/// rmcp turns a handler's `Err` into an `isError` result with these contents.
impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.text())]
    }
}

/// A successful result: the text every client reads, and the same as structured content.
pub fn structured<T: Serialize>(text: String, value: &T) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(value).ok();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::handler::server::tool::IntoCallToolResult;
    use rmcp::model::CallToolResponse;

    /// The result a handler's `Err(error)` becomes, as rmcp builds it.
    fn answered(error: ToolError) -> CallToolResult {
        let outcome: Result<CallToolResult, ToolError> = Err(error);
        match outcome.into_call_tool_result() {
            Ok(CallToolResponse::Complete(result)) => result,
            other => panic!("not a complete tool result: {other:?}"),
        }
    }

    fn text_of(result: &CallToolResult) -> &str {
        match result.content.as_slice() {
            [block] => block.as_text().map(|t| t.text.as_str()).unwrap_or_default(),
            blocks => panic!("expected one text block, got {blocks:?}"),
        }
    }

    #[test]
    fn request_errors_are_error_results_with_the_engine_text() {
        let error = EngineError::UnknownSession("abc".into());
        let expected = format!("Error: {error}.");
        let result = answered(error.into());
        assert_eq!(result.is_error, Some(true));
        assert_eq!(text_of(&result), expected);
        assert!(result.structured_content.is_none());
    }

    #[test]
    fn engine_errors_say_what_the_operator_must_do() {
        let down = EngineError::Backend(BackendError::unavailable(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
        let result = answered(down.into());
        assert_eq!(result.is_error, Some(true));
        let text = text_of(&result);
        assert!(text.starts_with("Error: "), "{text}");
        assert!(text.contains("The Docker engine must be running"), "{text}");

        let missing = EngineError::Backend(BackendError::ImageMissing {
            image: "python-code-sandbox:py3.11".into(),
            hint: "build it".into(),
        });
        let result = answered(missing.into());
        assert!(text_of(&result).ends_with(" Ask the operator to build or pull the image."));
    }

    #[test]
    fn refusals_are_error_results_with_their_reason() {
        let result = answered(ToolError::refused("give exactly one of a and b."));
        assert_eq!(result.is_error, Some(true));
        assert_eq!(text_of(&result), "Error: give exactly one of a and b.");
        let result = answered(base64_error().into());
        assert!(
            text_of(&result).starts_with("Error: content_base64 is not valid base64: "),
            "{}",
            text_of(&result)
        );
    }

    fn base64_error() -> base64::DecodeError {
        use base64::Engine as _;
        match base64::engine::general_purpose::STANDARD.decode("not base64!") {
            Err(e) => e,
            Ok(bytes) => panic!("decoded {bytes:?}"),
        }
    }

    #[test]
    fn successes_carry_their_structured_content() {
        let result = structured("done".into(), &serde_json::json!({"ok": true}));
        assert_ne!(result.is_error, Some(true));
        assert_eq!(text_of(&result), "done");
        assert_eq!(
            result.structured_content,
            Some(serde_json::json!({"ok": true}))
        );
    }
}
