//! Talking to PyPI over HTTP: the JSON API for one project, the simple index as a download, both
//! within size and time limits.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::index_file::IndexFormat;
use super::{FetchError, IndexError, PypiSearch};

/// `Accept` for the simple index: PEP 691 JSON first, HTML as a fallback.
const SIMPLE_ACCEPT: &str =
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01";
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_INDEX_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_JSON_TIMEOUT: Duration = Duration::from_secs(15);
const DEFAULT_INDEX_MAX_BYTES: u64 = 200 * 1024 * 1024;
/// The JSON API answer includes every release's files: `botocore`'s is close to 4 MB.
const DEFAULT_JSON_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// Size and time limits; tests shrink them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) index_max_bytes: u64,
    pub(super) json_max_bytes: u64,
    pub(super) index_timeout: Duration,
    pub(super) json_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            index_max_bytes: DEFAULT_INDEX_MAX_BYTES,
            json_max_bytes: DEFAULT_JSON_MAX_BYTES,
            index_timeout: DEFAULT_INDEX_TIMEOUT,
            json_timeout: DEFAULT_JSON_TIMEOUT,
        }
    }
}

/// What the JSON API said about one project.
#[derive(Debug, Clone)]
pub(super) struct ProjectMeta {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) summary: String,
}

#[derive(Debug, Clone)]
pub(super) enum Lookup {
    Found(ProjectMeta),
    NotFound,
    /// Shared: the answer for the exact name is reused for its result.
    Failed(Arc<FetchError>),
}

impl PypiSearch {
    /// Asks the JSON API about one project (`name` is normalized, so URL-safe).
    pub(super) async fn lookup(&self, name: &str) -> Lookup {
        match self.fetch_project(name).await {
            Ok(Some(meta)) => Lookup::Found(meta),
            Ok(None) => Lookup::NotFound,
            Err(e) => Lookup::Failed(Arc::new(e)),
        }
    }

    /// The JSON API's description of one project; `None` when PyPI has no such project.
    async fn fetch_project(&self, name: &str) -> Result<Option<ProjectMeta>, FetchError> {
        let url = format!("{}/pypi/{}/json", self.base, name);
        let request = self
            .client
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.limits.json_timeout)
            .send();
        let response = match tokio::time::timeout(self.limits.json_timeout, request).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(FetchError::Http(e)),
            Err(_) => return Err(FetchError::TimedOut),
        };
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(FetchError::Status(status));
        }
        let limit = self.limits.json_max_bytes;
        let body = tokio::time::timeout(self.limits.json_timeout, read_capped(response, limit))
            .await
            .map_err(|_| FetchError::TimedOutReading)??;
        let answer: JsonApiAnswer =
            serde_json::from_slice(&body).map_err(FetchError::MalformedAnswer)?;
        Ok(Some(ProjectMeta {
            name: one_line(answer.info.name.unwrap_or_default(), 200),
            version: one_line(answer.info.version.unwrap_or_default(), 100),
            summary: one_line(answer.info.summary.unwrap_or_default(), 512),
        }))
    }

    /// Streams `/simple/` into `dest`, within the size cap; returns the format the server chose.
    pub(super) async fn download_index(&self, dest: &Path) -> Result<IndexFormat, IndexError> {
        let url = format!("{}/simple/", self.base);
        let response = self
            .client
            .get(&url)
            .header(reqwest::header::ACCEPT, SIMPLE_ACCEPT)
            .timeout(self.limits.index_timeout)
            .send()
            .await
            .map_err(FetchError::Http)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status(status).into());
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let format = if content_type.contains("json") {
            IndexFormat::Json
        } else if content_type.contains("html") {
            IndexFormat::Html
        } else {
            IndexFormat::Sniff
        };
        let limit = self.limits.index_max_bytes;
        if response.content_length().is_some_and(|len| len > limit) {
            return Err(FetchError::TooLarge { limit }.into());
        }
        let write_error = |source| IndexError::Write {
            path: dest.to_path_buf(),
            source,
        };
        let file = tokio::fs::File::create(dest)
            .await
            .map_err(|source| IndexError::Create {
                path: dest.to_path_buf(),
                source,
            })?;
        let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
        let mut response = response;
        let mut total: u64 = 0;
        while let Some(chunk) = response.chunk().await.map_err(FetchError::Http)? {
            total = total.saturating_add(chunk.len() as u64);
            if total > limit {
                return Err(FetchError::TooLarge { limit }.into());
            }
            file.write_all(&chunk).await.map_err(write_error)?;
        }
        file.flush().await.map_err(write_error)?;
        Ok(format)
    }
}

/// Reads a whole body, giving up as soon as it passes `limit` bytes.
async fn read_capped(mut response: reqwest::Response, limit: u64) -> Result<Vec<u8>, FetchError> {
    if response.content_length().is_some_and(|len| len > limit) {
        return Err(FetchError::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(FetchError::Http)? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(FetchError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Collapses whitespace (summaries may hold newlines) and caps the length, in characters.
fn one_line(text: String, max_chars: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= max_chars {
        joined
    } else {
        let mut cut: String = joined.chars().take(max_chars.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[derive(Deserialize)]
struct JsonApiAnswer {
    info: JsonApiInfo,
}

#[derive(Deserialize)]
struct JsonApiInfo {
    name: Option<String>,
    version: Option<String>,
    summary: Option<String>,
}
