//! A session's workspace: write a file in, read one out, list a folder.

use base64::Engine as _;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};

use crate::engine::artifacts::display_path;
use crate::mcp::outcome::{structured, ToolError};
use crate::mcp::outputs::{ListFilesOutput, WriteFileOutput};
use crate::mcp::params::{ListFilesParams, ReadFileParams, WriteFileParams};
use crate::mcp::render::{self, FileOutput};
use crate::mcp::SandboxServer;
use crate::text::bytes;

#[tool_router(router = file_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "sandbox_write_file",
        description = "Write a file into a session's /workspace (path relative to it; parent folders \
                       are created), from text (`content`) or bytes (`content_base64`), up to \
                       {max_file_bytes}. Use it to give the code input data.",
        output_schema = schema_for_output::<WriteFileOutput>()
    )]
    async fn sandbox_write_file(
        &self,
        Parameters(params): Parameters<WriteFileParams>,
    ) -> Result<CallToolResult, ToolError> {
        let content = match (params.content, params.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => {
                base64::engine::general_purpose::STANDARD.decode(encoded.trim())?
            }
            _ => {
                return Err(ToolError::refused(
                    "give exactly one of content and content_base64.",
                ))
            }
        };
        let size = content.len() as u64;
        let path = self
            .engine
            .write_file(self.scope(), &params.container_id, &params.path, &content)
            .await?;
        Ok(structured(
            format!("Wrote {path} ({}).", bytes(size)),
            &WriteFileOutput { path, size },
        ))
    }

    #[tool(
        name = "sandbox_read_file",
        description = "Read a file from a session's /workspace: images come back as images, text as a \
                       text resource, other files as a blob resource, up to {return_max_file_bytes}.",
        output_schema = schema_for_output::<FileOutput>(),
        annotations(read_only_hint = true)
    )]
    async fn sandbox_read_file(
        &self,
        Parameters(params): Parameters<ReadFileParams>,
    ) -> Result<CallToolResult, ToolError> {
        let file = self
            .engine
            .read_file(self.scope(), &params.container_id, &params.path)
            .await?;
        let text = format!(
            "{} ({}, {})",
            display_path(&file.path),
            bytes(file.size),
            file.mime_type
        );
        let mut blocks = vec![ContentBlock::text(text)];
        blocks.extend(render::file_block(&file));
        let mut result = CallToolResult::success(blocks);
        result.structured_content = serde_json::to_value(FileOutput::of(&file)).ok();
        Ok(result)
    }

    #[tool(
        name = "sandbox_list_files",
        description = "List a folder of a session's /workspace: names, kinds (file, directory, \
                       symlink) and sizes.",
        output_schema = schema_for_output::<ListFilesOutput>(),
        annotations(read_only_hint = true)
    )]
    async fn sandbox_list_files(
        &self,
        Parameters(params): Parameters<ListFilesParams>,
    ) -> Result<CallToolResult, ToolError> {
        let path = params.path.unwrap_or_default();
        let listing = self
            .engine
            .list_files(self.scope(), &params.container_id, &path)
            .await?;
        if let Some(error) = listing.error {
            return Err(ToolError::Refused(error));
        }
        let shown = if path.trim().is_empty() {
            "/workspace".to_string()
        } else {
            path.clone()
        };
        let mut text = format!("{shown}: {} entries\n", listing.entries.len());
        for e in &listing.entries {
            let suffix = if e.kind == "directory" { "/" } else { "" };
            // The kind comes from the runner: one of its four words, or quoted.
            let kind = match e.kind.as_str() {
                known @ ("file" | "directory" | "symlink" | "special") => known.to_string(),
                other => crate::text::quoted(other, 40),
            };
            text.push_str(&format!(
                "- {}{suffix} ({kind}, {})\n",
                display_path(&e.name),
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
}
