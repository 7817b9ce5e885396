//! Notebooks in and out: a session's executed cells as a `.ipynb`, and a notebook run cell by cell
//! in a session (papermill's parameters, nbclient's `raises-exception` and `skip-execution` tags).

use std::time::{Duration, Instant};

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};

use crate::engine::displays::own_outputs;
use crate::engine::outcome::Output;
use crate::engine::{workspace_relative, Execution, RunOptions, Task};
use crate::mcp::ipynb::{self, CellType, Notebook};
use crate::mcp::notebook::OUTPUT_SCHEME;
use crate::mcp::outcome::ToolError;
use crate::mcp::outputs::{ExportNotebookOutput, FailedCellOutput, RunNotebookOutput};
use crate::mcp::params::{ExportNotebookParams, RunNotebookParams};
use crate::mcp::SandboxServer;
use crate::text::{self, bytes, duration};

/// Characters of the failed cell's traceback the summary shows.
const TRACEBACK_CHARS: usize = 3000;

impl From<ipynb::NotebookError> for ToolError {
    fn from(e: ipynb::NotebookError) -> Self {
        ToolError::Refused(format!("{e}."))
    }
}

#[tool_router(router = notebook_tools, vis = "pub(crate)")]
impl SandboxServer {
    #[tool(
        name = "sandbox_export_notebook",
        description = "Return a session's executed cells as a Jupyter notebook (.ipynb, nbformat \
                       4.5): one code cell per run_python call, in order, with its execution count \
                       and outputs as a notebook shows them (clear_output and display updates \
                       applied). The notebook comes back as a resource (application/x-ipynb+json) \
                       and is saved in the session's /workspace (`path`, by default \
                       notebook-<n>.ipynb), where sandbox_read_file and resources/read serve it. \
                       A session keeps its latest 500 cells (4 MiB of code and outputs, as the \
                       server's memory holds them: display ids, metadata and structure count); \
                       older ones are left out with a note.",
        output_schema = schema_for_output::<ExportNotebookOutput>(),
        annotations(read_only_hint = false, open_world_hint = false)
    )]
    async fn sandbox_export_notebook(
        &self,
        Parameters(params): Parameters<ExportNotebookParams>,
    ) -> Result<CallToolResult, ToolError> {
        // Written from the history in place: the text is the one copy of the cells it makes.
        let (id, (json, kept, dropped, latest)) =
            self.engine
                .with_session_cells(self.scope(), &params.container_id, |history| {
                    let latest = history.iter().filter_map(|c| c.execution_count).last();
                    (
                        ipynb::session_json(history.iter(), history.dropped()),
                        history.len(),
                        history.dropped(),
                        latest.unwrap_or(0),
                    )
                })?;
        let path = params
            .path
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| format!("notebook-{latest}.ipynb"));
        let relative = workspace_relative(&path)?;
        let saved = self
            .engine
            .write_file(self.scope(), &id, &relative, json.as_bytes())
            .await?;
        let uri = crate::mcp::resources::uri(&id, &relative);
        let size = json.len() as u64;
        let mut text = format!(
            "Exported {} as a notebook: {saved} ({}), resource {uri}.",
            text::count(kept as u64, "cell"),
            bytes(size)
        );
        if dropped > 0 {
            text.push_str(&format!(
                " {} the session no longer keeps {} left out (a note in the notebook says so).",
                text::count(dropped, "earlier cell"),
                if dropped == 1 { "is" } else { "are" }
            ));
        }
        let output = ExportNotebookOutput {
            path: saved,
            resource_uri: uri.clone(),
            cells: kept,
            dropped_cells: dropped,
            size_bytes: size,
        };
        let blocks = vec![
            ContentBlock::text(text),
            self.notebook_block(json, uri, &relative),
        ];
        let mut result = CallToolResult::success(blocks);
        result.structured_content = serde_json::to_value(&output).ok();
        Ok(result)
    }

    #[tool(
        name = "sandbox_run_notebook",
        description = "Run a Jupyter notebook (.ipynb, nbformat 4) cell by cell, as nbclient and \
                       papermill do: a notebook in the session's /workspace (`path`) or given as \
                       `content`, in a session (`container_id`; without one, a new session is \
                       started for the run and stopped after it). Each code cell runs like a \
                       run_python call (same interpreter, one call per cell, each under the limit \
                       per execution or `timeout_seconds`); markdown and raw cells are kept as they \
                       are, empty cells and cells tagged `skip-execution` are not run. `parameters` \
                       are injected papermill-style after the cell tagged `parameters`. The run \
                       stops at the first cell that fails unless it is tagged `raises-exception` \
                       or `stop_on_error` is false. Returns a summary (cells run, the cell that \
                       failed and its error, duration) and the executed notebook as a resource \
                       (application/x-ipynb+json), saved beside `path` as <name>.executed.ipynb \
                       (or at `output_path`). A notebook may have at most 1000 cells, 16 MiB of \
                       JSON and 1 MiB of source per cell. {limits} {secrets}",
        output_schema = schema_for_output::<RunNotebookOutput>(),
        annotations(read_only_hint = false, open_world_hint = false)
    )]
    async fn sandbox_run_notebook(
        &self,
        Parameters(params): Parameters<RunNotebookParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let _running = self.start_execution()?;
        let started = Instant::now();
        let session = params
            .container_id
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let text = match (&params.path, &params.content, session) {
            (Some(path), None, Some(session)) => {
                let file = self.engine.read_file(self.scope(), session, path).await?;
                String::from_utf8(file.content.unwrap_or_default()).map_err(|_| {
                    ToolError::refused(format!("{path} is not UTF-8 text: not a notebook."))
                })?
            }
            (Some(_), None, None) => {
                return Err(ToolError::refused(
                    "a notebook's `path` names a file in a session's /workspace: give the \
                     session's container_id too, or the notebook itself as `content`.",
                ))
            }
            (None, Some(content), _) => content.clone(),
            _ => return Err(ToolError::refused("give exactly one of path and content.")),
        };
        let mut notebook = Notebook::parse(&text)?;
        drop(text);
        let parameters = match &params.parameters {
            Some(parameters) => notebook.inject_parameters(parameters)?,
            None => Vec::new(),
        };
        let limit = self.engine.config().limits.timeout;
        let timeout = match params.timeout_seconds {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 && s <= limit.as_secs_f64() => {
                Some(Duration::from_secs_f64(s))
            }
            Some(s) => {
                return Err(ToolError::refused(format!(
                    "timeout_seconds is {s}: it must be more than 0 and at most {} (the server's \
                     limit per execution).",
                    limit.as_secs_f64()
                )))
            }
        };
        let output_path =
            match (&params.output_path, &params.path, session) {
                (Some(_), _, None) => return Err(ToolError::refused(
                    "output_path saves in a session's /workspace: give the session's container_id \
                     (a session started for the run is stopped after it).",
                )),
                (Some(out), _, Some(_)) => Some(workspace_relative(out)?),
                (None, Some(path), Some(_)) => Some(executed_name(&workspace_relative(path)?)),
                (None, _, _) => None,
            };

        let (mut options, notices) = self.options_for(&context, None, None, true).await;
        options.timeout = timeout;
        let dependencies = params.dependencies.clone().unwrap_or_default();
        let (id, temporary) = match session {
            Some(id) => (id.to_string(), false),
            None => {
                let slot = match self.session_slot().await {
                    Ok(slot) => slot,
                    Err(over) => {
                        super::run::finish(notices).await;
                        return Err(over.into());
                    }
                };
                let create = RunOptions {
                    dependencies: dependencies.clone(),
                    ..options.clone()
                };
                let created = self.engine.create_session(self.scope(), &create).await;
                drop(slot);
                match created {
                    Ok(id) => (id, true),
                    Err(e) => {
                        super::run::finish(notices).await;
                        return Err(e.into());
                    }
                }
            }
        };
        let steps = notices.as_ref().map(|n| n.steps());
        let first_options = RunOptions {
            dependencies: if temporary { Vec::new() } else { dependencies },
            ..options.clone()
        };
        let stop_on_error = params.stop_on_error.unwrap_or(true);
        let ran = self
            .run_cells(
                &id,
                &mut notebook,
                [&first_options, &options],
                stop_on_error,
                steps.as_ref(),
            )
            .await;
        if temporary {
            if let Err(e) = self.engine.stop_session(self.scope(), &id).await {
                tracing::warn!(session = %id, "could not stop a notebook run's session: {e}");
            }
        }
        super::run::finish(notices).await;

        let json = notebook.to_json();
        let mut note = None;
        let mut saved_path = None;
        let mut resource_uri = None;
        if let Some(out) = &output_path {
            match self
                .engine
                .write_file(self.scope(), &id, out, json.as_bytes())
                .await
            {
                Ok(saved) => {
                    saved_path = Some(saved);
                    resource_uri = Some(crate::mcp::resources::uri(&id, out));
                }
                Err(e) => note = Some(format!("the executed notebook was not saved: {e}")),
            }
        }
        let code_cells = (0..notebook.len())
            .filter(|&i| notebook.cell_type(i) == CellType::Code)
            .count();
        let failed_hard = ran.stopped_at.is_some();
        let output = RunNotebookOutput {
            container_id: (!temporary).then(|| id.clone()),
            cells: notebook.len(),
            code_cells,
            cells_run: ran.cells_run,
            cells_skipped: ran.cells_skipped,
            cells_not_run: ran.cells_not_run,
            stopped_at: ran.stopped_at,
            succeeded: !failed_hard,
            duration_ms: started.elapsed().as_millis() as u64,
            parameters,
            saved_path,
            resource_uri,
            note,
            failed: ran.failed,
        };
        let mut summary = summary(&output, ran.traceback.as_deref(), started.elapsed());
        let name = output_path.clone().unwrap_or_else(|| {
            params
                .path
                .as_deref()
                .map(executed_name)
                .unwrap_or_else(|| "notebook.executed.ipynb".into())
        });
        let block = match &output.resource_uri {
            Some(uri) => Some(self.notebook_block(json, uri.clone(), &name)),
            None if json.len() as u64 <= self.engine.config().files.return_max_file_bytes => {
                Some(ContentBlock::resource(
                    ResourceContents::text(json, format!("{OUTPUT_SCHEME}notebook/{name}"))
                        .with_mime_type(ipynb::MIME_TYPE),
                ))
            }
            None => {
                summary.push_str(&format!(
                    "\nThe executed notebook ({}) is too large to return: run it in a session with \
                     output_path to save it.",
                    bytes(json.len() as u64)
                ));
                None
            }
        };
        let mut blocks = vec![ContentBlock::text(summary)];
        blocks.extend(block);
        let mut result = if failed_hard {
            CallToolResult::error(blocks)
        } else {
            CallToolResult::success(blocks)
        };
        result.structured_content = serde_json::to_value(&output).ok();
        Ok(result)
    }
}

/// What a run of a notebook's cells came to.
#[derive(Default)]
struct Ran {
    cells_run: usize,
    cells_skipped: usize,
    cells_not_run: usize,
    failed: Vec<FailedCellOutput>,
    stopped_at: Option<usize>,
    /// The traceback (or why) of the cell the run stopped at.
    traceback: Option<String>,
}

impl SandboxServer {
    /// The notebook as a resource: whole when it is small enough to return, else a link to the
    /// saved file.
    fn notebook_block(&self, json: String, uri: String, name: &str) -> ContentBlock {
        let size = json.len() as u64;
        if size <= self.engine.config().files.return_max_file_bytes {
            ContentBlock::resource(
                ResourceContents::text(json, uri).with_mime_type(ipynb::MIME_TYPE),
            )
        } else {
            ContentBlock::resource_link(
                Resource::new(uri, name.to_string())
                    .with_mime_type(ipynb::MIME_TYPE)
                    .with_size(size),
            )
        }
    }

    /// Runs the notebook's code cells in order in the session, each as one execution (the first
    /// with `options[0]`, the rest with `options[1]`), and puts their outputs in the notebook.
    async fn run_cells(
        &self,
        id: &str,
        notebook: &mut Notebook,
        options: [&RunOptions; 2],
        stop_on_error: bool,
        steps: Option<&crate::engine::ProgressSink>,
    ) -> Ran {
        let mut ran = Ran::default();
        let to_run: Vec<usize> = (0..notebook.len())
            .filter(|&i| notebook.cell_type(i) == CellType::Code)
            .collect();
        let total = to_run.len();
        // Outputs of the cells run so far: a later cell's display update changes them.
        let mut shown: Vec<(usize, Vec<Output>, Option<u64>)> = Vec::new();
        for (n, &index) in to_run.iter().enumerate() {
            let source = notebook.source(index);
            if ran.stopped_at.is_some() {
                ran.cells_not_run += 1;
                notebook.set_outputs(index, &[], None);
                continue;
            }
            if source.trim().is_empty() || notebook.has_tag(index, "skip-execution") {
                ran.cells_skipped += 1;
                notebook.set_outputs(index, &[], None);
                continue;
            }
            if let Some(step) = steps {
                step(&format!("cell {index}: code cell {} of {total}", n + 1));
            }
            let cell_options = options[usize::from(ran.cells_run > 0)];
            let result = self
                .engine
                .execute_in_session(self.scope(), id, Task::Python(&source), cell_options)
                .await;
            let execution = match result {
                Ok(execution) => execution,
                Err(e) => {
                    let why = e.to_string();
                    ran.failed.push(FailedCellOutput {
                        index,
                        execution_count: None,
                        ename: "NotRun".into(),
                        evalue: why.clone(),
                        allowed: false,
                    });
                    ran.stopped_at = Some(index);
                    ran.traceback = Some(why);
                    notebook.set_outputs(index, &[], None);
                    continue;
                }
            };
            ran.cells_run += 1;
            // An update, or a display with an id, changes the earlier cells' displays with that
            // id, as nbclient applies them; an update is not an output of its own.
            let own = own_outputs(&execution.outputs, |display_id, data, metadata| {
                for (_, earlier, _) in shown.iter_mut() {
                    for o in earlier.iter_mut() {
                        o.update(display_id, data, metadata);
                    }
                }
            });
            if !execution.succeeded() {
                let (ename, evalue) = failure(&execution);
                let allowed = notebook.has_tag(index, "raises-exception");
                ran.failed.push(FailedCellOutput {
                    index,
                    execution_count: execution.execution_count,
                    ename,
                    evalue,
                    allowed,
                });
                if execution.cancelled || execution.workspace_lost || (stop_on_error && !allowed) {
                    ran.stopped_at = Some(index);
                    ran.traceback = Some(traceback_of(&execution));
                }
            }
            shown.push((index, own, execution.execution_count));
        }
        for (index, outputs, count) in shown {
            notebook.set_outputs(index, &outputs, count);
        }
        ran
    }
}

/// `x.ipynb` → `x.executed.ipynb`.
fn executed_name(path: &str) -> String {
    match path.strip_suffix(".ipynb") {
        Some(stem) => format!("{stem}.executed.ipynb"),
        None => format!("{path}.executed.ipynb"),
    }
}

/// A failed execution's exception type and message, or what else ended it.
fn failure(execution: &Execution) -> (String, String) {
    if execution.cancelled {
        ("Cancelled".into(), "the client cancelled the call".into())
    } else if execution.out_of_memory {
        ("MemoryError".into(), "the sandbox ran out of memory".into())
    } else if let Some(error) = &execution.error {
        (error.kind.clone(), error.message.clone())
    } else if execution.timed_out {
        (
            "Timeout".into(),
            "the cell ran longer than its timeout".into(),
        )
    } else {
        (
            "SystemExit".into(),
            format!("exit status {}", execution.exit_code),
        )
    }
}

/// The failed cell's traceback as a model reads it: its head and tail.
fn traceback_of(execution: &Execution) -> String {
    let whole = execution
        .outputs
        .iter()
        .rev()
        .find_map(|o| match o {
            Output::Error { traceback, .. } => Some(traceback.join("\n")),
            _ => None,
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&execution.stderr).into_owned());
    let excerpt = text::head_and_tail(&whole, TRACEBACK_CHARS);
    if excerpt.is_cut() {
        format!("{}\n[…]\n{}", excerpt.head.trim_end(), excerpt.tail)
    } else {
        whole
    }
}

/// The text of a run's result.
fn summary(output: &RunNotebookOutput, traceback: Option<&str>, took: Duration) -> String {
    let mut text = format!(
        "Ran {} of {} in {}",
        output.cells_run,
        text::count(output.code_cells as u64, "code cell"),
        duration(took)
    );
    if output.cells_skipped > 0 {
        text.push_str(&format!(" ({} skipped)", output.cells_skipped));
    }
    text.push('.');
    if !output.parameters.is_empty() {
        text.push_str(&format!(
            " Parameters injected: {}.",
            output.parameters.join(", ")
        ));
    }
    for failed in &output.failed {
        let how = if failed.allowed {
            " (tagged raises-exception: the run went on)"
        } else {
            ""
        };
        text.push_str(&format!(
            "\ncell {} failed: {}: {}{how}",
            failed.index,
            failed.ename,
            text::truncate_chars(&failed.evalue, 500)
        ));
    }
    if let Some(index) = output.stopped_at {
        text.push_str(&format!(
            "\nThe run stopped at cell {index}; {} not run.",
            text::count(output.cells_not_run as u64, "later code cell")
        ));
        if let Some(traceback) = traceback.filter(|t| !t.trim().is_empty()) {
            text.push_str(&format!("\n{traceback}"));
        }
    }
    match (&output.saved_path, &output.resource_uri) {
        (Some(path), Some(uri)) => text.push_str(&format!(
            "\nThe executed notebook: {path} (resource {uri})."
        )),
        _ => text.push_str("\nThe executed notebook is attached (not saved)."),
    }
    if let Some(note) = &output.note {
        text.push_str(&format!("\n{note}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executed_notebook_is_named_after_the_one_run() {
        assert_eq!(executed_name("a/b.ipynb"), "a/b.executed.ipynb");
        assert_eq!(executed_name("notes"), "notes.executed.ipynb");
    }
}
