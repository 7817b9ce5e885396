//! A session's workspace files as MCP resources, and completion of their URIs.
//!
//! Every file in the `/workspace` of a live session the caller owns is a resource
//! `sandbox://{session}/{path}`: `resources/list` walks the caller's sessions (bounded, paged),
//! the resource template lets a client name any file, and `resources/read` returns it as text or a
//! blob within the same limit as a file a tool returns. `completion/complete` on the template
//! offers the caller's sessions for `session` and workspace entries for `path`.
//!
//! Files are read through the engine like `sandbox_read_file`: the same session scoping (a client
//! over HTTP sees only its own sessions), the same copy-out checks, the same size limit.

use base64::Engine as _;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, ListResourceTemplatesResult,
    ListResourcesResult, ReadResourceResult, Reference, Resource, ResourceContents,
    ResourceTemplate,
};
use rmcp::ErrorData;

use crate::engine::artifacts::{is_displayable_image, mime_from_name};
use crate::engine::sessions::Scope;
use crate::engine::{Engine, EngineError};

/// The scheme of workspace resources.
pub const SCHEME: &str = "sandbox://";
/// The resource template every workspace file matches (RFC 6570).
pub const TEMPLATE: &str = "sandbox://{session}/{path}";
/// Resources in one page of `resources/list`.
const PAGE: usize = 100;
/// Files `resources/list` walks to at most, over all the caller's sessions; the template reaches
/// the rest.
const MAX_LISTED: usize = 1000;
/// Directories one session's walk opens at most.
const MAX_DIRECTORIES: usize = 200;

/// The URI of a workspace file: the session id, then the path with each segment percent-encoded.
pub fn uri(session: &str, path: &str) -> String {
    format!(
        "{SCHEME}{session}/{}",
        super::render::percent_encoded_path(path)
    )
}

/// The session and the workspace-relative path a `sandbox://` URI names.
pub fn parse(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(SCHEME)?;
    let (session, path) = rest.split_once('/')?;
    let path = percent_decode(path)?;
    (!session.is_empty() && !path.is_empty()).then(|| (session.to_string(), path))
}

/// `%XX` escapes decoded; `None` for an invalid escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![ResourceTemplate::new(
        TEMPLATE,
        "workspace-file",
    )
    .with_title("A file in a sandbox session's /workspace")
    .with_description(
        "Any file in the /workspace of one of your live sandbox sessions: session is the \
         container_id sandbox_initialize returned, path is relative to /workspace.",
    )])
}

/// One page of the files in the caller's sessions. The cursor is the number of files already
/// listed.
pub async fn list(
    engine: &Engine,
    scope: Scope<'_>,
    cursor: Option<&str>,
) -> Result<ListResourcesResult, ErrorData> {
    let skip = match cursor {
        None => 0,
        Some(c) => c
            .parse::<usize>()
            .map_err(|_| ErrorData::invalid_params(format!("invalid cursor {c:?}"), None))?,
    };
    let mut all = Vec::new();
    for session in engine.sessions(scope) {
        if all.len() >= MAX_LISTED {
            break;
        }
        walk(engine, scope, &session.id, &mut all).await;
    }
    all.truncate(MAX_LISTED);
    let next = (skip + PAGE < all.len()).then(|| (skip + PAGE).to_string());
    let page: Vec<Resource> = all.into_iter().skip(skip).take(PAGE).collect();
    let mut result = ListResourcesResult::with_all_items(page);
    result.next_cursor = next;
    Ok(result)
}

/// The regular files of one session's workspace, breadth first, without following links. A
/// session that ends meanwhile simply contributes what was found.
async fn walk(engine: &Engine, scope: Scope<'_>, session: &str, into: &mut Vec<Resource>) {
    let mut directories = vec![String::new()];
    let mut opened = 0;
    while let Some(directory) = directories.pop() {
        if opened >= MAX_DIRECTORIES || into.len() >= MAX_LISTED {
            return;
        }
        opened += 1;
        let Ok(listing) = engine.list_files(scope, session, &directory).await else {
            return;
        };
        let mut subdirectories = Vec::new();
        // A name that is not UTF-8 (shown with U+FFFD) cannot be named back in a URI: skipped.
        for entry in listing
            .entries
            .into_iter()
            .filter(|e| !e.name.contains('\u{FFFD}'))
        {
            let path = if directory.is_empty() {
                entry.name.clone()
            } else {
                format!("{directory}/{}", entry.name)
            };
            match entry.kind.as_str() {
                "file" => into.push(
                    Resource::new(uri(session, &path), path.clone())
                        .with_mime_type(mime_from_name(&path))
                        .with_size(entry.size),
                ),
                "directory" => subdirectories.push(path),
                _ => {}
            }
        }
        // Popped from the end: reversed so directories are visited in name order.
        directories.extend(subdirectories.into_iter().rev());
    }
}

/// Reads one workspace file as resource contents: UTF-8 text as text, anything else as a blob.
pub async fn read(
    engine: &Engine,
    scope: Scope<'_>,
    uri: &str,
) -> Result<ReadResourceResult, ErrorData> {
    let not_found = |message: String| {
        ErrorData::resource_not_found(message, Some(serde_json::json!({ "uri": uri })))
    };
    let Some((session, path)) = parse(uri) else {
        return Err(not_found(format!(
            "{uri:?} is not a workspace resource: expected {TEMPLATE}"
        )));
    };
    let file = engine
        .read_file(scope, &session, &path)
        .await
        .map_err(|e| match e {
            EngineError::File { .. }
            | EngineError::UnknownSession(_)
            | EngineError::SessionEnded { .. }
            | EngineError::MalformedSessionId(_) => not_found(format!("{uri}: {e}")),
            e if e.is_request_error() => ErrorData::invalid_params(format!("{uri}: {e}"), None),
            e => ErrorData::internal_error(format!("{uri}: {e}"), None),
        })?;
    let content = file.content.unwrap_or_default();
    let contents = match String::from_utf8(content) {
        Ok(text) if !is_displayable_image(&file.mime_type) => {
            let mime = if file.mime_type == "application/octet-stream" {
                "text/plain".to_string()
            } else {
                file.mime_type
            };
            ResourceContents::text(text, uri).with_mime_type(mime)
        }
        Ok(text) => blob(text.into_bytes(), uri, file.mime_type),
        Err(e) => blob(e.into_bytes(), uri, file.mime_type),
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

fn blob(bytes: Vec<u8>, uri: &str, mime: String) -> ResourceContents {
    ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(bytes), uri)
        .with_mime_type(mime)
}

/// Completes an argument of the workspace template: `session` from the caller's live sessions,
/// `path` from the entries of the session's workspace folder the value is in.
pub async fn complete(
    engine: &Engine,
    scope: Scope<'_>,
    request: &CompleteRequestParams,
) -> Result<CompleteResult, ErrorData> {
    match &request.r#ref {
        Reference::Resource(template) if template.uri == TEMPLATE => {}
        Reference::Resource(template) => {
            return Err(ErrorData::invalid_params(
                format!(
                    "no resource template {:?}; this server has {TEMPLATE}",
                    template.uri
                ),
                None,
            ))
        }
        _ => {
            return Err(ErrorData::invalid_params(
                format!("completion is offered only for the resource template {TEMPLATE}"),
                None,
            ))
        }
    }
    let value = request.argument.value.as_str();
    let values = match request.argument.name.as_str() {
        "session" => engine
            .sessions(scope)
            .into_iter()
            .map(|s| s.id)
            .filter(|id| id.starts_with(value))
            .collect(),
        "path" => {
            let session = request
                .context
                .as_ref()
                .and_then(|c| c.arguments.as_ref())
                .and_then(|a| a.get("session"));
            match session {
                Some(session) => complete_path(engine, scope, session, value).await,
                None => Vec::new(),
            }
        }
        other => {
            return Err(ErrorData::invalid_params(
                format!("{TEMPLATE} has no argument {other:?} (session, path)"),
                None,
            ))
        }
    };
    let total = values.len();
    let mut values = values;
    values.truncate(CompletionInfo::MAX_VALUES);
    let has_more = total > values.len();
    let info = CompletionInfo::with_pagination(values, u32::try_from(total).ok(), has_more)
        .map_err(|e| ErrorData::internal_error(e, None))?;
    Ok(CompleteResult::new(info))
}

/// Workspace entries that complete `value`: those of its folder whose names start with its last
/// segment; folders end in `/`.
async fn complete_path(
    engine: &Engine,
    scope: Scope<'_>,
    session: &str,
    value: &str,
) -> Vec<String> {
    let (folder, prefix) = match value.rsplit_once('/') {
        Some((folder, prefix)) => (folder, prefix),
        None => ("", value),
    };
    let Ok(listing) = engine.list_files(scope, session, folder).await else {
        return Vec::new();
    };
    listing
        .entries
        .into_iter()
        .filter(|e| e.name.starts_with(prefix))
        .map(|e| {
            let path = if folder.is_empty() {
                e.name
            } else {
                format!("{folder}/{}", e.name)
            };
            if e.kind == "directory" {
                format!("{path}/")
            } else {
                path
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_with_any_name() {
        let id = "3f1c0ffee0123456789a";
        for path in [
            "out.txt",
            "data/sub dir/ünïcode.csv",
            "a%b#c?.txt",
            "x/../y",
        ] {
            let uri = uri(id, path);
            assert!(
                !uri.contains(' ') && !uri.contains('#') && !uri.contains('?'),
                "{uri}"
            );
            assert_eq!(
                parse(&uri),
                Some((id.to_string(), path.to_string())),
                "{uri}"
            );
        }
    }

    #[test]
    fn malformed_uris_name_nothing() {
        for bad in [
            "file:///workspace/x",
            "sandbox://",
            "sandbox://abc",
            "sandbox://abc/",
            "sandbox:///x",
            "sandbox://abc/%zz",
            "sandbox://abc/%ff",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
