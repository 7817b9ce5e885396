//! Package search on PyPI (or the configured index), for the dependencies a run asks for.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};

use crate::mcp::outcome::{structured, ToolError};
use crate::mcp::outputs::SearchOutput;
use crate::mcp::params::SearchParams;
use crate::mcp::SandboxServer;

#[tool_router(router = search_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "search_pypi_packages",
        description = "Find PyPI packages by name: exact and normalized names first, then names that \
                       start with or contain the query, then close spellings. Returns up to 5 packages \
                       with latest version and summary.",
        output_schema = schema_for_output::<SearchOutput>(),
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn search_pypi_packages(
        &self,
        Parameters(params): Parameters<SearchParams>,
    ) -> Result<CallToolResult, ToolError> {
        let results = self.pypi.search(&params.query).await?;
        let mut text = if results.is_empty() {
            format!("No PyPI package matches {:?}.\n", params.query)
        } else {
            format!("PyPI packages matching {:?}:\n", params.query)
        };
        for p in &results {
            text.push_str(&format!("- {} {} — {}\n", p.name, p.version, p.summary));
        }
        Ok(structured(
            text,
            &SearchOutput {
                query: params.query,
                results,
            },
        ))
    }
}
