//! Engine results as MCP tool results: a text block written for an LLM reader, and the same facts
//! as `structuredContent` matching the tool's declared `outputSchema`.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};
use schemars::JsonSchema;
use serde::Serialize;

use super::notebook::{self, OutputJson};
use crate::config::Limits;
use crate::engine::artifacts::{display_path, is_displayable_image};
use crate::engine::outcome::{Discarded, NetworkEntry, Output, StreamName};
use crate::engine::{Artifact, Execution, KeptStream};
use crate::text::{self, bytes, duration, Excerpt};

/// What an execution tool returns as structured content.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExecutionOutput {
    /// What the code wrote to stdout (invalid UTF-8 replaced), as the text shows it: whole, or
    /// when stdout and stderr together are longer than the server's model output budget, the
    /// head and tail around one line saying what was cut and where the whole is (`stdout_cut`).
    /// Over the output limit it was captured as its head and tail already, with the line
    /// `[… N bytes (L lines) of stdout not kept here: …]` where the bytes not kept were
    /// (`stdout_dropped_bytes`).
    pub stdout: String,
    /// What the code wrote to stderr, tracebacks included; cut like stdout (`stderr_cut`).
    pub stderr: String,
    /// Set when `stdout` holds only its head and tail: what was cut, and where the whole is.
    pub stdout_cut: Option<CutOutput>,
    /// Set when `stderr` holds only its head and tail: what was cut, and where the whole is.
    pub stderr_cut: Option<CutOutput>,
    /// 0 on success, `sys.exit(n)` gives n, 1 for an uncaught exception, 130 when interrupted,
    /// 137 when the sandbox was killed.
    pub exit_code: i32,
    pub duration_ms: u64,
    /// The wall-clock limit expired and the code was interrupted.
    pub timed_out: bool,
    /// Output beyond the limit (`SANDBOX_MAX_OUTPUT`) was discarded.
    pub truncated: bool,
    /// How many bytes were discarded, both streams.
    pub truncated_bytes: u64,
    /// Bytes of stdout discarded between its head and its tail (over the output limit), and the
    /// lines they span (a line cut partway counts once).
    pub stdout_dropped_bytes: u64,
    pub stdout_dropped_lines: u64,
    /// The same for stderr.
    pub stderr_dropped_bytes: u64,
    pub stderr_dropped_lines: u64,
    /// The client cancelled the call.
    pub cancelled: bool,
    /// The interpreter was restarted: variables from earlier calls are gone.
    pub state_lost: bool,
    /// The whole sandbox was restarted: the files in /workspace are gone too.
    pub workspace_lost: bool,
    pub out_of_memory: bool,
    /// The exception that ended the code, if one did.
    pub error: Option<ErrorOutput>,
    /// The session the code ran in (absent for run_python_ephemeral).
    pub container_id: Option<String>,
    /// In a session, this execution's count (`In [n]`), as a notebook numbers its cells (absent
    /// for shell commands and code that is only whitespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// Files the execution created or changed in /workspace, and matplotlib figures.
    pub files: Vec<FileOutput>,
    /// The dependencies in force, when some were requested.
    pub dependencies: Option<DependenciesOutput>,
    /// Everything the code showed, in the order it did, shaped like Jupyter's nbformat v4
    /// outputs: `stream` (stdout/stderr text), `display_data` (display()), `execute_result` (the
    /// value of the last expression), `error` (the exception that ended the code).
    pub outputs: Vec<OutputJson>,
    /// Displays left out of `outputs` over their count or size limits.
    pub outputs_dropped: u64,
    /// With `SANDBOX_NETWORK=allowlist`: what the code tried to reach through the egress proxy
    /// during this execution, one entry per host, port and outcome (absent in the other modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Vec<NetworkOutput>>,
    /// In a session: the client's roots changed since the session started; it still mounts the
    /// ones it started with (new sandboxes mount the new ones). Absent when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub roots_stale: bool,
    /// Roots the client listed that are not mounted, and why: shown once, in the first result
    /// after the client listed them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roots_refused: Vec<super::outputs::RefusedRootOutput>,
}

/// Connections to one host and port that came to one outcome.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkOutput {
    pub host: String,
    pub port: u16,
    /// `reached`, `refused` (by the policy), `pending` (refused until the user answers: retry
    /// after they do), or `failed` (allowed, but the connection could not be made).
    pub outcome: String,
    pub connections: u32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Why it was refused, is pending, or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The secret the egress proxy added to these requests (its name; the value never leaves
    /// the proxy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The secrets whose placeholder these requests carried as written, to a host that gets no
    /// value for it (the proxy sees clear text and bumped tunnels only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
}

impl NetworkOutput {
    fn of(entry: &NetworkEntry) -> NetworkOutput {
        NetworkOutput {
            host: entry.host.clone(),
            port: entry.port,
            outcome: entry.outcome.as_str().to_string(),
            connections: entry.connections,
            bytes_sent: entry.bytes_sent,
            bytes_received: entry.bytes_received,
            reason: entry.reason.clone(),
            secret: entry.secret.clone(),
            placeholder: entry.placeholder.clone(),
        }
    }
}

/// The text line of an execution's network record (`None` when it tried nothing).
fn network_line(entries: &[NetworkEntry]) -> Option<String> {
    if entries.is_empty() {
        return None;
    }
    let parts: Vec<String> = entries
        .iter()
        .map(|e| {
            let mut what = format!("{} {}:{}", e.outcome.as_str(), e.host, e.port);
            if let Some(secret) = &e.secret {
                what.push_str(&format!(" with secret {secret}"));
            }
            if let Some(names) = &e.placeholder {
                what.push_str(&format!(
                    " with the placeholder of {names} as written (no value)"
                ));
            }
            match &e.reason {
                Some(reason) => format!("{what} ({reason})"),
                None => format!(
                    "{what} ({} connection{}, {} sent, {} received)",
                    e.connections,
                    if e.connections == 1 { "" } else { "s" },
                    bytes(e.bytes_sent),
                    bytes(e.bytes_received)
                ),
            }
        })
        .collect();
    Some(format!("network: {}\n", parts.join("; ")))
}

/// A stream of output cut to its head and tail for the model, and where its whole is.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CutOutput {
    /// Characters left out between head and tail.
    pub cut_chars: u64,
    /// Lines the left-out part spans.
    pub cut_lines: u64,
    /// Bytes of the whole stream as captured (itself cut at the output limit, see `truncated`).
    pub whole_bytes: u64,
    /// In a session: the whole stream as a file in the sandbox, overwritten by the next
    /// execution whose output is cut; search or page it from code, or read it with
    /// sandbox_read_file.
    pub workspace_path: Option<String>,
    /// The same file as a resource to read with `resources/read`.
    pub resource_uri: Option<String>,
    /// Where the whole stream was saved on the server's host, if saving is on.
    pub saved_to: Option<String>,
    /// Why the whole was not saved on the host or not written in the workspace.
    pub note: Option<String>,
}

impl CutOutput {
    fn of(
        excerpt: &Excerpt,
        whole_bytes: usize,
        kept: Option<&KeptStream>,
        session: Option<&str>,
    ) -> CutOutput {
        let workspace = kept.and_then(|k| k.workspace_path.as_deref());
        let notes = kept.map(|k| k.notes.join("; "));
        CutOutput {
            cut_chars: excerpt.cut_chars as u64,
            cut_lines: excerpt.cut_lines as u64,
            whole_bytes: whole_bytes as u64,
            workspace_path: workspace.map(|path| format!("/workspace/{path}")),
            resource_uri: workspace
                .zip(session)
                .map(|(path, session)| super::resources::uri(session, path)),
            saved_to: kept
                .and_then(|k| k.saved_to.as_ref())
                .map(|p| p.display().to_string()),
            note: match notes {
                Some(notes) if !notes.is_empty() => Some(notes),
                Some(_) => None,
                None => Some("the whole was not kept".to_string()),
            },
        }
    }

    /// The one line that stands for the cut part: how much, and where the whole is; and, when the
    /// line for bytes the capture did not keep is in the cut part (`within`), how many those were.
    fn line(&self, stream: &str, within: Option<&Discarded>) -> String {
        let mut places = Vec::new();
        if let Some(path) = &self.workspace_path {
            places.push(format!(
                "in {path} (search or page it from code, or sandbox_read_file)"
            ));
        }
        if let Some(saved) = &self.saved_to {
            places.push(format!("saved on the server's host at {saved}"));
        }
        let whole = if places.is_empty() {
            "was not kept".to_string()
        } else {
            format!("is {}", places.join(" and "))
        };
        let note = match &self.note {
            Some(note) if !places.is_empty() || note != "the whole was not kept" => {
                format!("; {note}")
            }
            _ => String::new(),
        };
        let not_kept = within.map_or(String::new(), |d| {
            format!(
                "; within them {} ({}) were not kept at all (over the {} output limit)",
                text::count(d.bytes, "byte"),
                text::count(d.lines, "line"),
                bytes(d.limit)
            )
        });
        format!(
            "[… {} ({}) cut here{not_kept}; the whole {stream} ({}) {whole}{note} …]",
            text::count(self.cut_chars, "character"),
            text::count(self.cut_lines, "line"),
            bytes(self.whole_bytes),
        )
    }
}

/// A stream as the model reads it: whole, or its head, the line saying what was cut, its tail.
fn shown(
    stream: &str,
    excerpt: &Excerpt,
    cut: Option<&CutOutput>,
    within: Option<&Discarded>,
) -> String {
    let Some(cut) = cut else {
        return excerpt.head.to_string();
    };
    let line = cut.line(stream, within);
    let mut text = String::with_capacity(excerpt.head.len() + line.len() + excerpt.tail.len() + 2);
    text.push_str(excerpt.head);
    if !excerpt.head.is_empty() && !excerpt.head.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&line);
    text.push('\n');
    text.push_str(excerpt.tail);
    text
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DependenciesOutput {
    /// Normalized requirements importable during the execution.
    pub requirements: Vec<String>,
    /// An install ran for this call (false: they came from the cache).
    pub installed: bool,
    /// The sandbox was prepared for them before the call (their modules imported ahead, out of
    /// the code's sight until it imports them).
    pub prepared: bool,
}

/// A file an execution produced.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileOutput {
    /// Relative to /workspace (figures: figures/figure-N.png).
    pub path: String,
    pub size: u64,
    pub mime_type: String,
    /// Included in this result as image or resource content.
    pub returned: bool,
    /// Where it was saved on the server's host, if saving is on.
    pub saved_to: Option<String>,
    /// Why it was not returned or not copied.
    pub note: Option<String>,
    /// A matplotlib figure (shown or left open), not a workspace file.
    pub figure: bool,
    /// A `sandbox://` resource to read the file with `resources/read` while the session lives,
    /// given (as a `resource_link`) instead of the file's content when it is large or over the
    /// result's limits.
    pub resource_uri: Option<String>,
}

impl FileOutput {
    pub fn of(a: &Artifact) -> Self {
        FileOutput {
            path: a.path.clone(),
            size: a.size,
            mime_type: a.mime_type.clone(),
            returned: a.content.is_some(),
            saved_to: a.saved_to.as_ref().map(|p| p.display().to_string()),
            note: a.note.clone(),
            figure: a.figure,
            resource_uri: None,
        }
    }
}

/// Files in a session larger than this come back as a link to read them, not inline, except
/// images, which a client shows (a model reads text and blobs, and a large one fills its context).
pub const LINK_ABOVE_BYTES: u64 = 256 << 10;

/// How one file of an execution comes back.
enum Delivery {
    Inline,
    Link(String),
    Listed,
}

/// Inline when its content is returned and it is not a large non-image of a session; a link when
/// it is a regular workspace file of a live session that `resources/read` can return; otherwise
/// only listed.
fn delivery(a: &Artifact, session: Option<&str>, readable_max: u64) -> Delivery {
    let large = a.size > LINK_ABOVE_BYTES && !is_displayable_image(&a.mime_type);
    let regular_file = !a.figure && !a.mime_type.is_empty();
    match session {
        Some(session)
            if regular_file && a.size <= readable_max && (a.content.is_none() || large) =>
        {
            Delivery::Link(super::resources::uri(session, &a.path))
        }
        _ if a.content.is_some() => Delivery::Inline,
        _ => Delivery::Listed,
    }
}

/// A file as MCP content: images as `image`, UTF-8 text as a text resource, the rest as a blob.
pub fn file_block(a: &Artifact) -> Option<ContentBlock> {
    let content = a.content.as_ref()?;
    let base64 = || base64::engine::general_purpose::STANDARD.encode(content);
    if is_displayable_image(&a.mime_type) {
        return Some(ContentBlock::image(base64(), a.mime_type.clone()));
    }
    let uri = file_uri(&a.path);
    let resource = match std::str::from_utf8(content) {
        Ok(text) => {
            let mime = if a.mime_type == "application/octet-stream" {
                "text/plain"
            } else {
                a.mime_type.as_str()
            };
            ResourceContents::text(text, uri).with_mime_type(mime)
        }
        Err(_) => ResourceContents::blob(base64(), uri).with_mime_type(a.mime_type.clone()),
    };
    Some(ContentBlock::resource(resource))
}

/// `file:///workspace/PATH`, percent-encoded.
pub fn file_uri(path: &str) -> String {
    format!("file:///workspace/{}", percent_encoded_path(path))
}

/// A workspace path for a URI: every byte but unreserved characters and `/` percent-encoded.
pub fn percent_encoded_path(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn files_summary(files: &[Artifact], deliveries: &[Delivery]) -> String {
    let mut text = String::new();
    for (a, delivery) in files.iter().zip(deliveries) {
        let what = if a.figure { "figure" } else { "file" };
        let size = bytes(a.size);
        let mut line = format!(
            "- {what} {} ({size}, {})",
            display_path(&a.path),
            a.mime_type
        );
        match delivery {
            Delivery::Inline => line.push_str(", attached"),
            Delivery::Link(uri) => line.push_str(&format!(", read it as resource {uri}")),
            Delivery::Listed => {}
        }
        if let Some(saved) = &a.saved_to {
            line.push_str(&format!(", saved to {}", saved.display()));
        }
        if let Some(note) = &a.note {
            line.push_str(&format!(" [{note}]"));
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorOutput {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// An execution as a tool result. `container_id` names the session it ran in; its files that
/// `resources/read` can return (up to `readable_max`) may come back as links instead of content.
pub fn execution(
    execution: &Execution,
    limits: &Limits,
    container_id: Option<&str>,
    readable_max: u64,
) -> CallToolResult {
    // Stdout and stderr share the model's budget; each beyond its share keeps head and tail. The
    // line for bytes the capture dropped stays whole, in the text or in the cut part.
    let whole_stdout = String::from_utf8_lossy(&execution.stdout);
    let whole_stderr = String::from_utf8_lossy(&execution.stderr);
    let [stdout_discarded, stderr_discarded] = execution.discarded.each_ref().map(Option::as_ref);
    let (stdout_share, stderr_share) = text::share_budget(
        limits.model_output_chars,
        whole_stdout.chars().count(),
        whole_stderr.chars().count(),
    );
    let (stdout_excerpt, stdout_within) = text::head_and_tail_around(
        &whole_stdout,
        stdout_share,
        marker_range(&whole_stdout, &execution.stdout, stdout_discarded),
    );
    let (stderr_excerpt, stderr_within) = text::head_and_tail_around(
        &whole_stderr,
        stderr_share,
        marker_range(&whole_stderr, &execution.stderr, stderr_discarded),
    );
    let kept = execution.whole_output.as_ref();
    let stdout_cut = stdout_excerpt.is_cut().then(|| {
        let kept = kept.map(|k| &k.stdout);
        CutOutput::of(&stdout_excerpt, execution.stdout.len(), kept, container_id)
    });
    let stderr_cut = stderr_excerpt.is_cut().then(|| {
        let kept = kept.map(|k| &k.stderr);
        CutOutput::of(&stderr_excerpt, execution.stderr.len(), kept, container_id)
    });
    let stdout = shown(
        "stdout",
        &stdout_excerpt,
        stdout_cut.as_ref(),
        stdout_discarded.filter(|_| stdout_within),
    );
    let stderr = shown(
        "stderr",
        &stderr_excerpt,
        stderr_cut.as_ref(),
        stderr_discarded.filter(|_| stderr_within),
    );
    // The outputs' stream text is the same text, cut the same way.
    let cut_line = |name: StreamName, excerpt: &Excerpt, within: bool| {
        let (whole, kept, discarded) = match name {
            StreamName::Stdout => (
                execution.stdout.len(),
                kept.map(|k| &k.stdout),
                stdout_discarded,
            ),
            StreamName::Stderr => (
                execution.stderr.len(),
                kept.map(|k| &k.stderr),
                stderr_discarded,
            ),
        };
        CutOutput::of(excerpt, whole, kept, container_id)
            .line(name.as_str(), discarded.filter(|_| within))
    };
    let markers = [
        stdout_discarded.map(|d| d.marker(StreamName::Stdout)),
        stderr_discarded.map(|d| d.marker(StreamName::Stderr)),
    ];
    let outputs = notebook::bounded(
        &execution.outputs,
        [stdout_share, stderr_share],
        limits.model_output_chars,
        &cut_line,
        [markers[0].as_deref(), markers[1].as_deref()],
    );
    let deliveries: Vec<Delivery> = execution
        .files
        .iter()
        .map(|a| delivery(a, container_id, readable_max))
        .collect();
    // With displays or a last value, the streams come in order among them rather than first.
    let rich = execution.outputs_cleared || notebook::has_rich_outputs(&outputs);
    let mut text = summary(execution, limits, &stdout, &stderr, &deliveries, rich);
    if execution.roots_stale {
        text.push_str(
            "\nroots are stale: the client's roots changed since this session started; it still \
             mounts the ones it started with (new sandboxes mount the new ones).",
        );
    }
    let output = ExecutionOutput {
        stdout,
        stderr,
        stdout_cut,
        stderr_cut,
        exit_code: execution.exit_code,
        duration_ms: execution.duration.as_millis() as u64,
        timed_out: execution.timed_out,
        truncated: execution.truncated_bytes > 0,
        truncated_bytes: execution.truncated_bytes,
        stdout_dropped_bytes: stdout_discarded.map_or(0, |d| d.bytes),
        stdout_dropped_lines: stdout_discarded.map_or(0, |d| d.lines),
        stderr_dropped_bytes: stderr_discarded.map_or(0, |d| d.bytes),
        stderr_dropped_lines: stderr_discarded.map_or(0, |d| d.lines),
        cancelled: execution.cancelled,
        state_lost: execution.state_lost,
        workspace_lost: execution.workspace_lost,
        out_of_memory: execution.out_of_memory,
        error: execution.error.as_ref().map(|e| ErrorOutput {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        container_id: container_id.map(str::to_string),
        execution_count: execution.execution_count,
        files: execution
            .files
            .iter()
            .zip(&deliveries)
            .map(|(a, delivery)| {
                let mut file = FileOutput::of(a);
                if let Delivery::Link(uri) = delivery {
                    file.returned = false;
                    file.resource_uri = Some(uri.clone());
                }
                file
            })
            .collect(),
        dependencies: execution.dependencies.as_ref().map(|d| DependenciesOutput {
            requirements: d.requirements.clone(),
            installed: d.installed,
            prepared: d.prepared,
        }),
        outputs: outputs.iter().map(OutputJson::of).collect(),
        outputs_dropped: execution.outputs_dropped,
        network: execution
            .network
            .as_ref()
            .map(|entries| entries.iter().map(NetworkOutput::of).collect()),
        roots_stale: execution.roots_stale,
        roots_refused: Vec::new(),
    };
    let mut content = vec![ContentBlock::text(text)];
    // Figures shown among the outputs are not attached a second time.
    let mut shown_images = std::collections::HashSet::new();
    if rich {
        let count = outputs.iter().find_map(|o| match o {
            Output::ExecuteResult {
                execution_count, ..
            } => Some(*execution_count),
            _ => None,
        });
        content.extend(notebook::output_blocks(&outputs, count));
        for output in &outputs {
            if let Some(data) = output.bundle() {
                shown_images.extend(
                    data.iter()
                        .filter(|(m, _)| m == "image/png")
                        .map(|(_, v)| v.as_str()),
                );
            }
        }
    }
    for (a, delivery) in execution.files.iter().zip(&deliveries) {
        if a.figure
            && a.content.as_ref().is_some_and(|png| {
                shown_images.contains(
                    base64::engine::general_purpose::STANDARD
                        .encode(png)
                        .as_str(),
                )
            })
        {
            continue;
        }
        match delivery {
            Delivery::Inline => content.extend(file_block(a)),
            Delivery::Link(uri) => content.push(ContentBlock::resource_link(
                Resource::new(uri.clone(), a.path.clone())
                    .with_mime_type(a.mime_type.clone())
                    .with_size(a.size),
            )),
            Delivery::Listed => {}
        }
    }
    let mut result = if execution.succeeded() {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    result.structured_content = serde_json::to_value(&output).ok();
    result
}

/// Where the line for the bytes the capture dropped is in a stream's text (`whole`, from `bytes`).
fn marker_range(
    whole: &str,
    bytes: &[u8],
    discarded: Option<&Discarded>,
) -> Option<std::ops::Range<usize>> {
    let d = discarded?;
    let start = String::from_utf8_lossy(bytes.get(..d.at)?).len();
    let range = start..start + d.marker_len;
    whole
        .get(range.clone())
        .is_some_and(|line| line.ends_with("…]\n"))
        .then_some(range)
}

/// The text's line saying what the output limit dropped, stream by stream.
fn discarded_line(execution: &Execution, limits: &Limits) -> Option<String> {
    if execution.truncated_bytes == 0 {
        return None;
    }
    let parts: Vec<String> = [StreamName::Stdout, StreamName::Stderr]
        .into_iter()
        .zip(&execution.discarded)
        .filter_map(|(name, d)| {
            let d = d.as_ref()?;
            Some(format!(
                "{} keeps its first {} and last {}, the {} ({}) between them were discarded",
                name.as_str(),
                bytes(d.at as u64),
                bytes(d.tail as u64),
                text::count(d.bytes, "byte"),
                text::count(d.lines, "line"),
            ))
        })
        .collect();
    let what = if parts.is_empty() {
        format!(
            "{} were discarded",
            text::count(execution.truncated_bytes, "byte")
        )
    } else {
        parts.join("; ")
    };
    Some(format!(
        "[output over the {} limit (SANDBOX_MAX_OUTPUT): {what}]\n",
        bytes(limits.max_output_bytes)
    ))
}

fn summary(
    execution: &Execution,
    limits: &Limits,
    stdout: &str,
    stderr: &str,
    deliveries: &[Delivery],
    rich: bool,
) -> String {
    let mut text = String::new();
    let status = if execution.timed_out {
        format!("timed out after {}", duration(limits.timeout))
    } else if execution.cancelled {
        "cancelled".to_string()
    } else if execution.out_of_memory {
        format!("out of memory (limit {})", bytes(limits.memory_bytes))
    } else {
        format!("exit status {}", execution.exit_code)
    };
    text.push_str(&format!(
        "{status} · {} ms\n",
        execution.duration.as_millis()
    ));
    if let Some(deps) = &execution.dependencies {
        let how = if deps.installed {
            "installed for this call"
        } else if deps.prepared {
            "from the cache, prepared ahead"
        } else {
            "from the cache"
        };
        text.push_str(&format!(
            "dependencies: {} ({how})\n",
            deps.requirements.join(", ")
        ));
    }
    if rich {
        // Said last, below: what follows this block is what the code showed.
    } else if !stdout.is_empty() {
        text.push_str("--- stdout ---\n");
        text.push_str(stdout);
        if !stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if !stderr.is_empty() && !rich {
        text.push_str("--- stderr ---\n");
        text.push_str(stderr);
        if !stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    if stdout.is_empty() && stderr.is_empty() && !rich {
        text.push_str("(no output)\n");
    }
    if let Some(line) = execution.network.as_deref().and_then(network_line) {
        text.push_str(&line);
    }
    if execution.outputs_dropped > 0 {
        text.push_str(&format!(
            "[{} displays were left out: over the limits of count or size]\n",
            execution.outputs_dropped
        ));
    }
    if let Some(line) = discarded_line(execution, limits) {
        text.push_str(&line);
    }
    if execution.timed_out || execution.cancelled {
        text.push_str(if execution.state_lost {
            "[the code did not stop on interrupt: its processes were killed]\n"
        } else {
            "[the code was interrupted; processes it started were stopped]\n"
        });
    }
    if !execution.files.is_empty() {
        text.push_str("--- files ---\n");
        text.push_str(&files_summary(&execution.files, deliveries));
    }
    if execution.workspace_lost {
        text.push_str("[the sandbox was restarted: variables from earlier calls and files in /workspace are gone]\n");
    } else if execution.state_lost {
        text.push_str("[the interpreter was restarted: variables from earlier calls are gone; files in /workspace remain]\n");
    }
    if rich {
        text.push_str("(what the code showed follows, in order)\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample() -> Execution {
        Execution {
            stdout: b"hi\n".to_vec(),
            stderr: Vec::new(),
            exit_code: 0,
            duration: Duration::from_millis(12),
            truncated_bytes: 0,
            timed_out: false,
            cancelled: false,
            state_lost: false,
            out_of_memory: false,
            error: None,
            ..Default::default()
        }
    }

    #[test]
    fn success_has_text_and_structured_content() {
        let limits = crate::config::Config::default().limits;
        let result = execution(&sample(), &limits, None, 5 << 20);
        assert_eq!(result.is_error, Some(false));
        let text = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(
            text.starts_with("exit status 0 · 12 ms\n--- stdout ---\nhi\n"),
            "{text}"
        );
        assert!(!text.contains("stderr"), "empty stderr is not shown");
        let structured = result.structured_content.unwrap();
        assert_eq!(structured["stdout"], "hi\n");
        assert_eq!(structured["truncated"], false);
    }

    #[test]
    fn failures_are_errors_and_say_what_happened() {
        let limits = crate::config::Config::default().limits;
        let mut e = sample();
        e.exit_code = 130;
        e.timed_out = true;
        e.truncated_bytes = 5;
        let result = execution(&e, &limits, Some("abc"), 5 << 20);
        assert_eq!(result.is_error, Some(true));
        let text = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.starts_with("timed out after 1m"), "{text}");
        assert!(
            text.contains(
                "[output over the 1 MiB limit (SANDBOX_MAX_OUTPUT): 5 bytes were discarded]"
            ),
            "{text}"
        );
        assert_eq!(result.structured_content.unwrap()["container_id"], "abc");
    }

    fn file(path: &str, size: u64, mime: &str, returned: bool) -> Artifact {
        Artifact {
            path: path.to_string(),
            size,
            mime_type: mime.to_string(),
            content: returned.then(|| vec![b'x'; size as usize]),
            saved_to: None,
            note: None,
            figure: false,
        }
    }

    #[test]
    fn session_files_that_are_large_or_held_back_come_back_as_links() {
        let limits = crate::config::Config::default().limits;
        let mut e = sample();
        let big = LINK_ABOVE_BYTES + 1;
        e.files = vec![
            file("small.txt", 10, "text/plain", true),
            file("big.csv", big, "text/csv", true),
            file("big.png", big, "image/png", true),
            file("held back.txt", 10, "text/plain", false),
            file("too big.bin", 6 << 20, "application/octet-stream", false),
            file("link", 0, "", false),
            Artifact {
                figure: true,
                ..file("figures/figure-1.png", 10, "image/png", true)
            },
        ];
        let kinds = |result: &CallToolResult| -> Vec<&'static str> {
            result.content[1..]
                .iter()
                .map(|block| match block {
                    ContentBlock::Image(_) => "image",
                    ContentBlock::Resource(_) => "resource",
                    ContentBlock::ResourceLink(_) => "link",
                    _ => "other",
                })
                .collect()
        };
        let in_session = execution(&e, &limits, Some("abc123"), 5 << 20);
        assert_eq!(
            kinds(&in_session),
            ["resource", "link", "image", "link", "image"]
        );
        let files = &in_session.structured_content.unwrap()["files"];
        assert_eq!(files[1]["resource_uri"], "sandbox://abc123/big.csv");
        assert_eq!(files[1]["returned"], false);
        assert_eq!(files[3]["resource_uri"], "sandbox://abc123/held%20back.txt");
        assert!(
            files[4]["resource_uri"].is_null(),
            "over what resources/read returns"
        );
        assert!(
            files[6]["resource_uri"].is_null(),
            "figures are not in the workspace"
        );
        let text = in_session.content[0].as_text().unwrap().text.clone();
        assert!(
            text.contains(
                "big.csv (256.0 KiB, text/csv), read it as resource sandbox://abc123/big.csv"
            ),
            "{text}"
        );
        // Without a session nothing can be read later: content inline, nothing linked.
        let ephemeral = execution(&e, &limits, None, 5 << 20);
        assert_eq!(
            kinds(&ephemeral),
            ["resource", "resource", "image", "image"]
        );
    }

    fn text_of(result: &CallToolResult) -> String {
        result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default()
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_says_where_the_whole_is() {
        let mut limits = crate::config::Config::default().limits;
        limits.model_output_chars = 1000;
        let mut e = sample();
        e.stdout = (0..10_000)
            .map(|i| format!("line {i:05}\n"))
            .collect::<String>()
            .into_bytes();
        e.stderr = b"Traceback: boom\n".to_vec();
        e.whole_output = Some(crate::engine::WholeOutput {
            stdout: KeptStream {
                saved_to: Some("/files/session-abc/outputs/1-stdout.txt".into()),
                workspace_path: Some(".outputs/stdout.txt".into()),
                notes: Vec::new(),
            },
            stderr: KeptStream::default(),
        });
        let result = execution(&e, &limits, Some("abc"), 5 << 20);
        let text = text_of(&result);
        assert!(text.len() < 1000 + 600, "{} bytes: {text}", text.len());
        assert!(text.contains("--- stdout ---\nline 00000\n"), "{text}");
        assert!(text.contains("line 09999\n--- stderr ---\nTraceback: boom\n"));
        let cut_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("[… ")).collect();
        assert_eq!(cut_lines.len(), 1, "{text}");
        assert!(
            cut_lines[0].contains(
                "lines) cut here; the whole stdout (107.4 KiB) is in \
                 /workspace/.outputs/stdout.txt (search or page it from code, or \
                 sandbox_read_file) and saved on the server's host at \
                 /files/session-abc/outputs/1-stdout.txt …]"
            ),
            "{}",
            cut_lines[0]
        );
        let structured = result.structured_content.unwrap();
        let stdout = structured["stdout"].as_str().unwrap();
        assert!(
            text.contains(stdout),
            "the text and the structured stdout agree"
        );
        let cut = &structured["stdout_cut"];
        assert_eq!(cut["whole_bytes"], 110_000);
        assert_eq!(cut["workspace_path"], "/workspace/.outputs/stdout.txt");
        assert_eq!(cut["resource_uri"], "sandbox://abc/.outputs/stdout.txt");
        assert!(cut["note"].is_null());
        let shown_lines = stdout.lines().count() as u64 - 1;
        assert_eq!(cut["cut_lines"].as_u64().unwrap() + shown_lines, 10_000);
        assert_eq!(structured["stderr"], "Traceback: boom\n");
        assert!(structured["stderr_cut"].is_null());
    }

    #[test]
    fn bytes_the_capture_dropped_are_said_in_the_stream_or_in_the_models_cut_line() {
        use crate::engine::displays::mark_discarded;
        let mut limits = crate::config::Config::default().limits;
        let kept: String = (0..100)
            .chain(9900..10_000)
            .map(|i| format!("line {i:05}\n"))
            .collect();
        let (stdout, discarded) = mark_discarded(
            kept.into_bytes(),
            StreamName::Stdout,
            1100,
            108_900,
            9800,
            1 << 20,
        );
        let mut e = sample();
        e.stdout = stdout;
        e.truncated_bytes = 108_900;
        e.discarded = [discarded, None];
        let marker = "[… 108900 bytes (9800 lines) of stdout not kept here: over the 1 MiB output \
                      limit (SANDBOX_MAX_OUTPUT) …]";
        let said = "[output over the 1 MiB limit (SANDBOX_MAX_OUTPUT): stdout keeps its first 1.1 \
                    KiB and last 1.1 KiB, the 108900 bytes (9800 lines) between them were discarded]";
        // Read whole: the line is where the bytes were, and the text says it again at the end.
        let result = execution(&e, &limits, None, 5 << 20);
        let text = text_of(&result);
        assert!(
            text.contains(&format!("line 00099\n{marker}\nline 09900\n")),
            "{text}"
        );
        assert!(text.contains(said), "{text}");
        let structured = result.structured_content.unwrap();
        assert_eq!(structured["stdout_dropped_bytes"], 108_900);
        assert_eq!(structured["stdout_dropped_lines"], 9800);
        assert_eq!(structured["stderr_dropped_bytes"], 0);
        assert_eq!(structured["truncated_bytes"], 108_900);
        assert!(structured["stdout_cut"].is_null());
        // Cut for the model around it: the model's cut line says it too, and it is never split.
        limits.model_output_chars = 1000;
        let result = execution(&e, &limits, None, 5 << 20);
        let text = text_of(&result);
        assert!(!text.contains(marker), "{text}");
        let cut: Vec<&str> = text.lines().filter(|l| l.contains(" cut here")).collect();
        assert_eq!(cut.len(), 1, "{text}");
        assert!(
            cut[0].contains(
                " lines) cut here; within them 108900 bytes (9800 lines) were not kept at all \
                 (over the 1 MiB output limit); the whole stdout ("
            ),
            "{}",
            cut[0]
        );
        assert!(text.contains(said), "{text}");
        assert!(
            text.contains("\nline 09999\n"),
            "the last line is there: {text}"
        );
        // A budget that ends the head within the line: it stops before it.
        limits.model_output_chars = 2700;
        let text = text_of(&execution(&e, &limits, None, 5 << 20));
        assert!(
            !text.contains("[… 108900 bytes") || text.contains(marker),
            "{text}"
        );
    }

    #[test]
    fn a_cut_without_a_place_for_the_whole_says_why() {
        let mut limits = crate::config::Config::default().limits;
        limits.model_output_chars = 1000;
        let mut e = sample();
        e.stdout = vec![b'x'; 5000];
        e.whole_output = Some(crate::engine::WholeOutput {
            stdout: KeptStream {
                notes: vec!["not saved on the host (SANDBOX_FILES_DIR is empty)".into()],
                ..Default::default()
            },
            stderr: KeptStream::default(),
        });
        let text = text_of(&execution(&e, &limits, None, 5 << 20));
        assert!(
            text.contains(
                "\n[… 4000 characters (1 line) cut here; the whole stdout (4.9 KiB) was not \
                 kept; not saved on the host (SANDBOX_FILES_DIR is empty) …]\n"
            ),
            "{text}"
        );
        e.whole_output = None;
        let text = text_of(&execution(&e, &limits, None, 5 << 20));
        assert!(
            text.contains("the whole stdout (4.9 KiB) was not kept …]"),
            "{text}"
        );
    }

    #[test]
    fn rich_outputs_come_in_order_as_text_images_and_resources() {
        use crate::engine::outcome::StreamName;
        let limits = crate::config::Config::default().limits;
        let png = b"\x89PNG\r\n\x1a\nrest".to_vec();
        let png64 = base64::engine::general_purpose::STANDARD.encode(&png);
        let mut e = sample();
        e.outputs = vec![
            Output::Stream {
                name: StreamName::Stdout,
                text: "hi\n".into(),
            },
            Output::display(vec![
                ("image/png".into(), png64.clone()),
                ("text/plain".into(), "<Figure>".into()),
            ]),
            Output::ExecuteResult {
                data: vec![
                    ("text/html".into(), "<table/>".into()),
                    ("application/json".into(), "{\"a\":1}".into()),
                    (
                        "application/vnd.jupyter.widget-view+json".into(),
                        "{\"model_id\":\"m\"}".into(),
                    ),
                    ("text/plain".into(), "   a\n0  1".into()),
                ],
                metadata: Default::default(),
                execution_count: 7,
                display_id: None,
            },
        ];
        e.files = vec![Artifact {
            figure: true,
            content: Some(png),
            ..file("figures/figure-1.png", 10, "image/png", true)
        }];
        let result = execution(&e, &limits, None, 5 << 20);
        let blocks: Vec<String> = result
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text(t) => format!("text:{}", t.text.lines().next().unwrap_or("")),
                ContentBlock::Image(i) => format!("image:{}", i.mime_type),
                ContentBlock::Resource(r) => match &r.resource {
                    ResourceContents::TextResourceContents { uri, .. } => format!("resource:{uri}"),
                    _ => "blob".into(),
                },
                _ => "other".into(),
            })
            .collect();
        assert_eq!(
            blocks,
            [
                "text:exit status 0 · 12 ms",
                "text:--- stdout ---",
                "image:image/png",
                "text:Out[7]:    a",
                "resource:sandbox-output://out-7/2.html",
                "resource:sandbox-output://out-7/2.json",
            ],
            "the figure shown among the outputs is not attached again"
        );
        let structured = result.structured_content.unwrap();
        let outputs = &structured["outputs"];
        assert_eq!(outputs[0]["output_type"], "stream");
        assert_eq!(outputs[0]["name"], "stdout");
        assert_eq!(outputs[2]["output_type"], "execute_result");
        assert_eq!(outputs[2]["execution_count"], 7);
        assert_eq!(outputs[2]["data"]["application/json"]["a"], 1);
        assert_eq!(
            outputs[2]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"],
            "m"
        );
        assert_eq!(outputs[2]["metadata"], serde_json::json!({}));
        assert_eq!(structured["stdout"], "hi\n", "the existing fields stay");
    }

    #[test]
    fn byte_sizes_read_well() {
        assert_eq!(bytes(2 << 30), "2 GiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(10), "10 bytes");
    }
}
