//! PyPI package search that does not need PyPI's search page.
//!
//! `https://pypi.org/search` is not reachable from every machine (it answers 404 behind some
//! egress proxies), while the two machine-facing APIs are: the simple index (`/simple/`, PEP 503
//! and PEP 691), which lists every project name, and the JSON API (`/pypi/NAME/json`), which
//! describes one project. So a search here is:
//!
//! 1. an exact lookup of the normalized query through the JSON API (which also finds projects
//!    newer than the cached index),
//! 2. a scan of the full list of names for prefix, substring and close (edit distance ≤ 2)
//!    matches, ranked and capped at [`MAX_RESULTS`],
//! 3. enrichment of each result with its summary and latest version, fetched concurrently.
//!
//! The simple index is large (about 700k names, 30–40 MB), so it is downloaded once, converted
//! into a newline-separated file of normalized names in the cache directory (written to a temporary
//! file and renamed into place), and reused until its TTL expires; its modification time is its
//! fetch time. A failed refresh falls back on a stale copy. Nothing of the index stays in memory
//! between searches: every search streams the file line by line, keeping only the best few
//! candidates. Every response body is read incrementally and abandoned past a size cap, and every
//! request has a time limit, so a hostile or broken server can cost neither memory nor a panic.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant, SystemTime};

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

/// Most results one search returns.
pub const MAX_RESULTS: usize = 5;
/// Longest accepted query, in characters.
pub const MAX_QUERY_LEN: usize = 100;

const INDEX_FILE: &str = "pypi-simple-index.txt";
const INDEX_HEADER_PREFIX: &str = "# pypi-simple-index v1 ";
/// `Accept` for the simple index: PEP 691 JSON first, HTML as a fallback.
const SIMPLE_ACCEPT: &str =
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_INDEX_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_JSON_TIMEOUT: Duration = Duration::from_secs(15);
const DEFAULT_INDEX_MAX_BYTES: u64 = 200 * 1024 * 1024;
/// The JSON API answer includes every release's files: `botocore`'s is close to 4 MB.
const DEFAULT_JSON_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// After a failed refresh, how long to wait before trying again while a stale copy exists.
const RETRY_WITH_STALE: Duration = Duration::from_secs(5 * 60);
/// After a failed refresh, how long to wait before trying again while no copy exists.
const RETRY_WITHOUT_CACHE: Duration = Duration::from_secs(30);
/// Longest project name kept from the index (PyPI's own limit is far lower).
const MAX_NAME_LEN: usize = 200;
/// Largest edit distance of a close match.
const MAX_CLOSE_DISTANCE: usize = 2;
/// Shortest query that gets close matches.
const MIN_CLOSE_QUERY_LEN: usize = 4;

/// One search result.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct PackageInfo {
    /// Project name as PyPI displays it (the normalized name when PyPI did not say).
    pub name: String,
    /// Latest version, empty when unknown.
    pub version: String,
    /// One-line summary, empty when unknown.
    pub summary: String,
    /// Project page, e.g. `https://pypi.org/project/requests/`.
    pub url: String,
    /// How the name matched the query.
    pub match_kind: MatchKind,
}

/// How a result's name matched the query, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatchKind {
    /// The normalized name equals the normalized query.
    Exact,
    /// The name starts with the query.
    Prefix,
    /// The name contains the query (or, for a multi-word query, every word).
    Substring,
    /// The name is within edit distance 2 of the query.
    Close,
}

impl MatchKind {
    fn rank(self) -> u8 {
        match self {
            MatchKind::Exact => 0,
            MatchKind::Prefix => 1,
            MatchKind::Substring => 2,
            MatchKind::Close => 3,
        }
    }
}

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The query cannot be searched for.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// The PyPI base URL given at construction is unusable.
    #[error(
        "invalid PyPI base URL {url:?}: {reason}; expected something like \"https://pypi.org\""
    )]
    InvalidBaseUrl { url: String, reason: String },
    /// The HTTP client could not be set up (TLS roots, ...).
    #[error("cannot set up the HTTP client for PyPI: {0}")]
    HttpClient(String),
    /// The package index could not be downloaded and there is no cached copy to fall back on.
    #[error(
        "the PyPI package index could not be fetched from {url} ({reason}) and no cached copy \
         exists in {cache_dir}; check that this machine can reach PyPI (or point the base URL at a \
         reachable mirror) and that the cache directory is writable, then retry"
    )]
    IndexUnavailable {
        url: String,
        reason: String,
        cache_dir: PathBuf,
    },
    /// The cached index exists but could not be read.
    #[error(
        "cannot read the cached PyPI index {path}: {source}; delete it to force a new download"
    )]
    Cache {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An internal task failed (a bug, not a network problem).
    #[error("internal error while searching PyPI: {0}")]
    Internal(String),
}

/// Size and time limits; tests shrink them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    index_max_bytes: u64,
    json_max_bytes: u64,
    index_timeout: Duration,
    json_timeout: Duration,
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

/// PyPI search backed by the JSON API and a cached copy of the simple index.
///
/// Cheap to share: wrap it in an `Arc` and call [`PypiSearch::search`] from any task.
pub struct PypiSearch {
    base: String,
    cache_dir: PathBuf,
    ttl: Duration,
    client: reqwest::Client,
    limits: Limits,
    /// Held while the index is being refreshed, so concurrent searches download it once.
    refresh_lock: tokio::sync::Mutex<()>,
    /// When the last refresh failed, and why.
    last_failure: StdMutex<Option<(Instant, String)>>,
}

impl std::fmt::Debug for PypiSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PypiSearch")
            .field("base", &self.base)
            .field("cache_dir", &self.cache_dir)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// PEP 503 normalization: lowercase, and every run of `-`, `_` and `.` becomes one `-`.
pub fn normalize(name: &str) -> String {
    crate::engine::deps::normalize_name(name)
}

/// What the JSON API said about one project.
#[derive(Debug, Clone)]
struct ProjectMeta {
    name: String,
    version: String,
    summary: String,
}

#[derive(Debug, Clone)]
enum Lookup {
    Found(ProjectMeta),
    NotFound,
    Failed(String),
}

/// Is the cached index usable, and is it fresh?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheState {
    Missing,
    Stale,
    Fresh,
}

impl PypiSearch {
    /// `base_url` e.g. `"https://pypi.org"` (a trailing slash is fine), `cache_dir` where the index
    /// file lives (created on first use), `ttl` how long a downloaded index is reused.
    pub fn new(base_url: &str, cache_dir: PathBuf, ttl: Duration) -> Result<Self, SearchError> {
        Self::build(base_url, cache_dir, ttl, Limits::default(), true)
    }

    fn build(
        base_url: &str,
        cache_dir: PathBuf,
        ttl: Duration,
        limits: Limits,
        system_proxy: bool,
    ) -> Result<Self, SearchError> {
        let base = base_url.trim().trim_end_matches('/').to_string();
        let invalid = |reason: &str| SearchError::InvalidBaseUrl {
            url: base_url.to_string(),
            reason: reason.to_string(),
        };
        let parsed = reqwest::Url::parse(&base).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if parsed.host_str().is_none() {
            return Err(invalid("it has no host"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid("it must not have a query or a fragment"));
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("python-code-sandbox/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5));
        if !system_proxy {
            builder = builder.no_proxy();
        }
        let client = builder
            .build()
            .map_err(|e| SearchError::HttpClient(error_chain(&e)))?;
        Ok(PypiSearch {
            base,
            cache_dir,
            ttl,
            client,
            limits,
            refresh_lock: tokio::sync::Mutex::new(()),
            last_failure: StdMutex::new(None),
        })
    }

    /// Searches PyPI for `query`: at most [`MAX_RESULTS`] projects, best match first.
    ///
    /// A query may hold several words separated by spaces: they are joined with `-` for the exact,
    /// prefix, substring and close matches (`flask login` finds `flask-login`), and a name that
    /// contains every word, in any order, is a substring match too. No match is an empty list, not
    /// an error. When the index can be neither downloaded nor read from the cache, an exact match
    /// found through the JSON API is still returned (alone); with no exact match either, the search
    /// fails with [`SearchError::IndexUnavailable`].
    pub async fn search(&self, query: &str) -> Result<Vec<PackageInfo>, SearchError> {
        let query = Query::parse(query)?;
        let (exact, index) = tokio::join!(self.lookup(&query.joined), self.ensure_index());

        let mut ranked: Vec<(String, MatchKind)> = match index {
            Ok(path) => {
                let scan_query = query.clone();
                let scan_path = path.clone();
                tokio::task::spawn_blocking(move || scan_index(&scan_path, &scan_query))
                    .await
                    .map_err(|e| SearchError::Internal(format!("index scan task failed: {e}")))?
                    .map_err(|source| SearchError::Cache { path, source })?
            }
            Err(err) => {
                if matches!(exact, Lookup::Found(_)) {
                    tracing::warn!("{err}; returning the exact match only");
                    Vec::new()
                } else {
                    return Err(err);
                }
            }
        };
        if matches!(exact, Lookup::Found(_)) && !ranked.iter().any(|(n, _)| *n == query.joined) {
            // Newer than the cached index, or the index is unavailable.
            ranked.retain(|(_, kind)| *kind != MatchKind::Exact);
            ranked.insert(0, (query.joined.clone(), MatchKind::Exact));
            ranked.truncate(MAX_RESULTS);
        }

        let enriched = ranked.into_iter().map(|(name, match_kind)| {
            let known = (name == query.joined).then(|| exact.clone());
            async move {
                let lookup = match known {
                    Some(lookup) => lookup,
                    None => self.lookup(&name).await,
                };
                let url = format!("{}/project/{}/", self.base, name);
                match lookup {
                    Lookup::Found(meta) => PackageInfo {
                        name: if meta.name.is_empty() { name } else { meta.name },
                        version: meta.version,
                        summary: meta.summary,
                        url,
                        match_kind,
                    },
                    Lookup::NotFound | Lookup::Failed(_) => {
                        if let Lookup::Failed(reason) = &lookup {
                            tracing::debug!(project = %name, "cannot describe PyPI project: {reason}");
                        }
                        PackageInfo {
                            name,
                            version: String::new(),
                            summary: String::new(),
                            url,
                            match_kind,
                        }
                    }
                }
            }
        });
        Ok(futures_util::future::join_all(enriched).await)
    }

    /// Asks the JSON API about one project (`name` is normalized, so URL-safe).
    async fn lookup(&self, name: &str) -> Lookup {
        let url = format!("{}/pypi/{}/json", self.base, name);
        let request = self
            .client
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(self.limits.json_timeout)
            .send();
        let response = match tokio::time::timeout(self.limits.json_timeout, request).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Lookup::Failed(error_chain(&e)),
            Err(_) => return Lookup::Failed("timed out".into()),
        };
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Lookup::NotFound;
        }
        if !status.is_success() {
            return Lookup::Failed(format!("HTTP {status}"));
        }
        let limit = self.limits.json_max_bytes;
        let body = match tokio::time::timeout(
            self.limits.json_timeout,
            read_capped(response, limit),
        )
        .await
        {
            Ok(Ok(body)) => body,
            Ok(Err(reason)) => return Lookup::Failed(reason),
            Err(_) => return Lookup::Failed("timed out reading the answer".into()),
        };
        match serde_json::from_slice::<JsonApiAnswer>(&body) {
            Ok(answer) => Lookup::Found(ProjectMeta {
                name: one_line(answer.info.name.unwrap_or_default(), 200),
                version: one_line(answer.info.version.unwrap_or_default(), 100),
                summary: one_line(answer.info.summary.unwrap_or_default(), 512),
            }),
            Err(e) => Lookup::Failed(format!("malformed JSON API answer: {e}")),
        }
    }

    fn index_path(&self) -> PathBuf {
        self.cache_dir.join(INDEX_FILE)
    }

    fn index_header(&self) -> String {
        format!("{INDEX_HEADER_PREFIX}{}", self.base)
    }

    /// Whether the cached index exists for this base URL, and its age against the TTL.
    async fn cache_state(&self) -> CacheState {
        let path = self.index_path();
        let header = self.index_header();
        let ttl = self.ttl;
        tokio::task::spawn_blocking(move || cache_state_of(&path, &header, ttl))
            .await
            .unwrap_or(CacheState::Missing)
    }

    /// Makes sure a usable index file exists, downloading it when missing or stale; returns its path.
    async fn ensure_index(&self) -> Result<PathBuf, SearchError> {
        let path = self.index_path();
        if self.cache_state().await == CacheState::Fresh {
            return Ok(path);
        }
        let _refreshing = self.refresh_lock.lock().await;
        // Another search may have refreshed it while this one waited.
        let state = self.cache_state().await;
        if state == CacheState::Fresh {
            return Ok(path);
        }
        let recent_failure = self
            .last_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some((when, reason)) = recent_failure {
            let pause = if state == CacheState::Stale {
                RETRY_WITH_STALE
            } else {
                RETRY_WITHOUT_CACHE
            }
            .min(self.ttl);
            if when.elapsed() < pause {
                return match state {
                    CacheState::Stale => Ok(path),
                    _ => Err(self.unavailable(format!(
                        "{reason}; next attempt in {}s",
                        pause.saturating_sub(when.elapsed()).as_secs().max(1)
                    ))),
                };
            }
        }
        match self.refresh().await {
            Ok(count) => {
                tracing::info!(projects = count, path = %path.display(), "PyPI index downloaded");
                *self
                    .last_failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
                Ok(path)
            }
            Err(reason) => {
                *self
                    .last_failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((Instant::now(), reason.clone()));
                if state == CacheState::Stale {
                    tracing::warn!(
                        "cannot refresh the PyPI index from {}/simple/ ({reason}); using the stale copy in {}",
                        self.base,
                        path.display()
                    );
                    Ok(path)
                } else {
                    Err(self.unavailable(reason))
                }
            }
        }
    }

    fn unavailable(&self, reason: String) -> SearchError {
        SearchError::IndexUnavailable {
            url: format!("{}/simple/", self.base),
            reason,
            cache_dir: self.cache_dir.clone(),
        }
    }

    /// Downloads the simple index and atomically replaces the cached name file. Returns the number
    /// of names, or why it failed.
    async fn refresh(&self) -> Result<usize, String> {
        tokio::fs::create_dir_all(&self.cache_dir)
            .await
            .map_err(|e| {
                format!(
                    "cannot create cache directory {}: {e}",
                    self.cache_dir.display()
                )
            })?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let download = RemoveOnDrop(self.cache_dir.join(format!(".pypi-index-{id}.download")));
        let converted = RemoveOnDrop(self.cache_dir.join(format!(".pypi-index-{id}.tmp")));

        // The whole download, headers and body, within the index time limit (plus a margin over
        // reqwest's own timeout, which covers the same span).
        let format = tokio::time::timeout(
            self.limits.index_timeout + Duration::from_secs(1),
            self.download_index(&download.0),
        )
        .await
        .map_err(|_| format!("timed out after {}s", self.limits.index_timeout.as_secs()))??;

        let header = self.index_header();
        let (src, dst) = (download.0.clone(), converted.0.clone());
        let count = tokio::task::spawn_blocking(move || convert_index(&src, &dst, format, &header))
            .await
            .map_err(|e| format!("index conversion task failed: {e}"))??;
        drop(download);
        if count == 0 {
            return Err("the index lists no projects".into());
        }
        tokio::fs::rename(&converted.0, self.index_path())
            .await
            .map_err(|e| {
                format!(
                    "cannot write the cache file {}: {e}",
                    self.index_path().display()
                )
            })?;
        converted.disarm();
        Ok(count)
    }

    /// Streams `/simple/` into `dest`, within the size cap; returns the format the server chose.
    async fn download_index(&self, dest: &Path) -> Result<IndexFormat, String> {
        let url = format!("{}/simple/", self.base);
        let response = self
            .client
            .get(&url)
            .header(reqwest::header::ACCEPT, SIMPLE_ACCEPT)
            .timeout(self.limits.index_timeout)
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
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
            return Err(too_large(limit));
        }
        let file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
        let mut file = tokio::io::BufWriter::with_capacity(256 * 1024, file);
        let mut response = response;
        let mut total: u64 = 0;
        while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
            total = total.saturating_add(chunk.len() as u64);
            if total > limit {
                return Err(too_large(limit));
            }
            file.write_all(&chunk)
                .await
                .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
        }
        file.flush()
            .await
            .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
        Ok(format)
    }
}

/// Reads a whole body, giving up as soon as it passes `limit` bytes.
async fn read_capped(mut response: reqwest::Response, limit: u64) -> Result<Vec<u8>, String> {
    if response.content_length().is_some_and(|len| len > limit) {
        return Err(too_large(limit));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn too_large(limit: u64) -> String {
    format!("the response is larger than the {limit}-byte limit")
}

/// A reqwest error with its causes, e.g. "error sending request: ...: connection refused".
fn error_chain(err: &reqwest::Error) -> String {
    let mut text = if err.is_timeout() {
        format!("timed out: {err}")
    } else {
        err.to_string()
    };
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
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

/// Deletes a temporary file when dropped, unless disarmed.
struct RemoveOnDrop(PathBuf);

impl RemoveOnDrop {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cache_state_of(path: &Path, header: &str, ttl: Duration) -> CacheState {
    let Ok(file) = std::fs::File::open(path) else {
        return CacheState::Missing;
    };
    let Ok(modified) = file.metadata().and_then(|m| m.modified()) else {
        return CacheState::Missing;
    };
    let mut first = String::new();
    if BufReader::new(file.take(1024))
        .read_line(&mut first)
        .is_err()
        || first.trim_end() != header
    {
        // Another base URL's index, or another format: not ours to use.
        return CacheState::Missing;
    }
    match SystemTime::now().duration_since(modified) {
        Ok(age) if age < ttl => CacheState::Fresh,
        // Too old, or dated in the future (a clock jump): refresh.
        _ => CacheState::Stale,
    }
}

// ---------------------------------------------------------------------------------------------
// Query and ranking
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Query {
    /// Each normalized word, without leading or trailing `-`.
    words: Vec<String>,
    /// The words joined with `-`: what names are compared with.
    joined: String,
}

impl Query {
    fn parse(raw: &str) -> Result<Query, SearchError> {
        let trimmed = raw.trim_matches(' ');
        if trimmed.is_empty() {
            return Err(SearchError::InvalidQuery(
                "the query is empty; give a package name or part of one, e.g. \"requests\"".into(),
            ));
        }
        let length = trimmed.chars().count();
        if length > MAX_QUERY_LEN {
            return Err(SearchError::InvalidQuery(format!(
                "the query is {length} characters long; the limit is {MAX_QUERY_LEN}"
            )));
        }
        if let Some(bad) = trimmed
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ')))
        {
            return Err(SearchError::InvalidQuery(format!(
                "the query contains {bad:?}; only ASCII letters, digits, '-', '_', '.' and spaces \
                 can appear in a PyPI project name"
            )));
        }
        let words: Vec<String> = trimmed
            .split(' ')
            .map(|word| normalize(word).trim_matches('-').to_string())
            .filter(|word| !word.is_empty())
            .collect();
        if words.is_empty() {
            return Err(SearchError::InvalidQuery(
                "the query has no letters or digits; give a package name or part of one".into(),
            ));
        }
        let joined = words.join("-");
        Ok(Query { words, joined })
    }

    /// How `name` (normalized) matches, with the edit distance for a close match.
    fn classify(&self, name: &str, want_close: bool) -> Option<(MatchKind, usize)> {
        let q = self.joined.as_str();
        if name == q {
            return Some((MatchKind::Exact, 0));
        }
        if name.starts_with(q) {
            return Some((MatchKind::Prefix, 0));
        }
        if name.contains(q)
            || (self.words.len() > 1 && self.words.iter().all(|w| name.contains(w.as_str())))
        {
            return Some((MatchKind::Substring, 0));
        }
        if want_close && q.len() >= MIN_CLOSE_QUERY_LEN {
            if let Some(d) = osa_distance_within(name.as_bytes(), q.as_bytes(), MAX_CLOSE_DISTANCE)
            {
                return Some((MatchKind::Close, d));
            }
        }
        None
    }
}

/// Ordering of candidates: kind, then edit distance, then length, then name.
type RankKey = (u8, usize, usize, String);

/// The best [`MAX_RESULTS`] candidates seen so far, sorted.
#[derive(Default)]
struct TopK {
    best: Vec<RankKey>,
}

impl TopK {
    fn full(&self) -> bool {
        self.best.len() >= MAX_RESULTS
    }

    /// Whether a candidate of this kind could still get in.
    fn wants(&self, kind: MatchKind) -> bool {
        !self.full() || self.best.last().is_some_and(|worst| worst.0 >= kind.rank())
    }

    fn offer(&mut self, kind: MatchKind, distance: usize, name: &str) {
        let probe = (kind.rank(), distance, name.len());
        if self.full() {
            if let Some(worst) = self.best.last() {
                let worst_probe = (worst.0, worst.1, worst.2);
                if probe > worst_probe || (probe == worst_probe && name >= worst.3.as_str()) {
                    return;
                }
            }
        }
        if self.best.iter().any(|k| k.3 == name) {
            return; // a duplicate line
        }
        let key = (probe.0, probe.1, probe.2, name.to_string());
        let at = self.best.partition_point(|k| *k < key);
        self.best.insert(at, key);
        self.best.truncate(MAX_RESULTS);
    }

    fn into_ranked(self) -> Vec<(String, MatchKind)> {
        self.best
            .into_iter()
            .map(|(rank, _, _, name)| {
                let kind = match rank {
                    0 => MatchKind::Exact,
                    1 => MatchKind::Prefix,
                    2 => MatchKind::Substring,
                    _ => MatchKind::Close,
                };
                (name, kind)
            })
            .collect()
    }
}

/// Streams the name file and keeps the best matches.
fn scan_index(path: &Path, query: &Query) -> io::Result<Vec<(String, MatchKind)>> {
    let file = std::fs::File::open(path)?;
    let mut reader = BufReader::with_capacity(128 * 1024, file);
    let mut top = TopK::default();
    let mut line = Vec::with_capacity(64);
    let query_len = query.joined.len();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let bytes = line.strip_suffix(b"\n").unwrap_or(&line);
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if bytes.is_empty() || bytes[0] == b'#' {
            continue;
        }
        let Ok(name) = std::str::from_utf8(bytes) else {
            continue;
        };
        // Close matches cost an edit distance: only for names of a near length, and only while
        // a close match could still make the cut.
        let want_close =
            name.len().abs_diff(query_len) <= MAX_CLOSE_DISTANCE && top.wants(MatchKind::Close);
        if let Some((kind, distance)) = query.classify(name, want_close) {
            top.offer(kind, distance, name);
        }
    }
    Ok(top.into_ranked())
}

/// Optimal string alignment distance (Damerau–Levenshtein with adjacent transpositions) between
/// `a` and `b` when it is at most `max`.
fn osa_distance_within(a: &[u8], b: &[u8], max: usize) -> Option<usize> {
    const WIDTH: usize = 128;
    if a.len().abs_diff(b.len()) > max || b.len() >= WIDTH {
        return None;
    }
    let n = b.len();
    // Rows i-2, i-1 and i of the DP table, rotated.
    let mut rows = [[0usize; WIDTH]; 3];
    for (j, cell) in rows[1].iter_mut().enumerate().take(n + 1) {
        *cell = j;
    }
    let (mut two_back, mut prev, mut cur) = (0usize, 1usize, 2usize);
    for i in 1..=a.len() {
        rows[cur][0] = i;
        let mut row_min = i;
        for j in 1..=n {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut value = (rows[prev][j] + 1)
                .min(rows[cur][j - 1] + 1)
                .min(rows[prev][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                value = value.min(rows[two_back][j - 2] + 1);
            }
            rows[cur][j] = value;
            row_min = row_min.min(value);
        }
        if row_min > max {
            return None;
        }
        (two_back, prev, cur) = (prev, cur, two_back);
    }
    let distance = rows[prev][n];
    (distance <= max).then_some(distance)
}

// ---------------------------------------------------------------------------------------------
// Index conversion: simple index (JSON or HTML) -> one normalized name per line
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexFormat {
    Json,
    Html,
    /// No telling content type: look at the first byte.
    Sniff,
}

/// Normalizes a name from the index; `None` for anything that cannot be a PyPI project name.
fn clean_name(raw: &str) -> Option<String> {
    let name = normalize(raw.trim());
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    valid.then_some(name)
}

/// Writes normalized names, one a line.
struct NameSink<'a> {
    out: &'a mut dyn Write,
    count: usize,
}

impl NameSink<'_> {
    fn push(&mut self, raw: &str) -> io::Result<()> {
        if let Some(name) = clean_name(raw) {
            self.out.write_all(name.as_bytes())?;
            self.out.write_all(b"\n")?;
            self.count += 1;
        }
        Ok(())
    }
}

/// Converts the downloaded index at `src` into the name file at `dst`; returns the name count.
fn convert_index(
    src: &Path,
    dst: &Path,
    format: IndexFormat,
    header: &str,
) -> Result<usize, String> {
    let input =
        std::fs::File::open(src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
    let mut input = BufReader::with_capacity(256 * 1024, input);
    let format = match format {
        IndexFormat::Sniff => {
            let start = input
                .fill_buf()
                .map_err(|e| format!("cannot read the index: {e}"))?;
            match start.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => IndexFormat::Json,
                _ => IndexFormat::Html,
            }
        }
        known => known,
    };
    let output =
        std::fs::File::create(dst).map_err(|e| format!("cannot create {}: {e}", dst.display()))?;
    let mut output = BufWriter::with_capacity(256 * 1024, output);
    let write_error = |e: io::Error| format!("cannot write {}: {e}", dst.display());
    writeln!(output, "{header}").map_err(write_error)?;
    let mut sink = NameSink {
        out: &mut output,
        count: 0,
    };
    match format {
        IndexFormat::Json => {
            let mut de = serde_json::Deserializer::from_reader(input);
            let saw_projects = IndexDocument(&mut sink)
                .deserialize(&mut de)
                .map_err(|e| format!("malformed PEP 691 JSON index: {e}"))?;
            de.end()
                .map_err(|e| format!("malformed PEP 691 JSON index: {e}"))?;
            if !saw_projects {
                return Err("the JSON index has no \"projects\" list".into());
            }
        }
        IndexFormat::Html | IndexFormat::Sniff => {
            let mut parser = AnchorParser::default();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let read = match input.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(format!("cannot read the index: {e}")),
                };
                parser
                    .feed(&chunk[..read], &mut sink)
                    .map_err(write_error)?;
            }
        }
    }
    let count = sink.count;
    output.flush().map_err(write_error)?;
    output
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?
        .sync_all()
        .map_err(write_error)?;
    Ok(count)
}

/// The top-level PEP 691 object: streams its `projects` into the sink, skips everything else.
struct IndexDocument<'a, 'b>(&'a mut NameSink<'b>);

impl<'de> DeserializeSeed<'de> for IndexDocument<'_, '_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexDocument<'_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a PEP 691 project list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let sink = self.0;
        let mut saw_projects = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "projects" {
                map.next_value_seed(ProjectList(&mut *sink))?;
                saw_projects = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(saw_projects)
    }
}

/// The `projects` array, one `{"name": ...}` at a time.
struct ProjectList<'a, 'b>(&'a mut NameSink<'b>);

#[derive(Deserialize)]
struct ProjectEntry {
    name: String,
}

impl<'de> DeserializeSeed<'de> for ProjectList<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ProjectList<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of projects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(entry) = seq.next_element::<ProjectEntry>()? {
            self.0.push(&entry.name).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// Pulls the text of every `<a ...>text</a>` out of HTML fed in arbitrary chunks.
#[derive(Default)]
struct AnchorParser {
    state: HtmlState,
    tag: Vec<u8>,
    /// Inside `<!...>`: quotes mean nothing there.
    bang: bool,
    quote: Option<u8>,
    in_anchor: bool,
    text: Vec<u8>,
    text_overflow: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum HtmlState {
    #[default]
    Text,
    TagName,
    InTag,
}

impl AnchorParser {
    const MAX_TEXT: usize = 512;
    const MAX_TAG: usize = 16;

    fn feed(&mut self, bytes: &[u8], sink: &mut NameSink<'_>) -> io::Result<()> {
        for &b in bytes {
            match self.state {
                HtmlState::Text => {
                    if b == b'<' {
                        if self.in_anchor {
                            self.in_anchor = false;
                            if !self.text_overflow {
                                if let Ok(text) = std::str::from_utf8(&self.text) {
                                    sink.push(text)?;
                                }
                            }
                        }
                        self.state = HtmlState::TagName;
                        self.tag.clear();
                        self.bang = false;
                    } else if self.in_anchor {
                        if self.text.len() < Self::MAX_TEXT {
                            self.text.push(b);
                        } else {
                            self.text_overflow = true;
                        }
                    }
                }
                HtmlState::TagName => {
                    if self.tag.is_empty() && b == b'!' {
                        self.bang = true;
                    }
                    if b == b'>' {
                        self.end_tag();
                    } else if b.is_ascii_whitespace() {
                        self.state = HtmlState::InTag;
                    } else if self.tag.len() < Self::MAX_TAG {
                        self.tag.push(b);
                    }
                }
                HtmlState::InTag => match self.quote {
                    Some(q) if b == q => self.quote = None,
                    Some(_) => {}
                    None if b == b'>' => self.end_tag(),
                    None if !self.bang && (b == b'"' || b == b'\'') => self.quote = Some(b),
                    None => {}
                },
            }
        }
        Ok(())
    }

    fn end_tag(&mut self) {
        self.state = HtmlState::Text;
        self.quote = None;
        if self.tag.eq_ignore_ascii_case(b"a") {
            self.in_anchor = true;
            self.text.clear();
            self.text_overflow = false;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// What the stub server answers.
    #[derive(Clone, Default)]
    struct StubConfig {
        simple_body: Vec<u8>,
        simple_content_type: String,
        /// Send the body with no Content-Length (ended by closing the connection).
        omit_content_length: bool,
        /// `/pypi/NAME/json` bodies by NAME.
        json: HashMap<String, Vec<u8>>,
    }

    struct Stub {
        base: String,
        simple_hits: Arc<AtomicUsize>,
        json_hits: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Stub {
        async fn start(config: StubConfig) -> Stub {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind stub");
            let addr = listener.local_addr().expect("stub address");
            let simple_hits = Arc::new(AtomicUsize::new(0));
            let json_hits = Arc::new(AtomicUsize::new(0));
            let config = Arc::new(config);
            let (s, j) = (simple_hits.clone(), json_hits.clone());
            let task = tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let (config, s, j) = (config.clone(), s.clone(), j.clone());
                    tokio::spawn(async move {
                        let _ = serve(socket, &config, &s, &j).await;
                    });
                }
            });
            Stub {
                base: format!("http://{addr}"),
                simple_hits,
                json_hits,
                task,
            }
        }

        fn simple_hits(&self) -> usize {
            self.simple_hits.load(Ordering::SeqCst)
        }

        /// Stops accepting: later requests are refused.
        async fn stop(self) {
            self.task.abort();
            let _ = self.task.await;
        }
    }

    async fn serve(
        mut socket: tokio::net::TcpStream,
        config: &StubConfig,
        simple_hits: &AtomicUsize,
        json_hits: &AtomicUsize,
    ) -> io::Result<()> {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (status, content_type, body): (&str, &str, Vec<u8>) = if path == "/simple/" {
            simple_hits.fetch_add(1, Ordering::SeqCst);
            (
                "200 OK",
                &config.simple_content_type,
                config.simple_body.clone(),
            )
        } else if let Some(name) = path
            .strip_prefix("/pypi/")
            .and_then(|rest| rest.strip_suffix("/json"))
        {
            json_hits.fetch_add(1, Ordering::SeqCst);
            match config.json.get(name) {
                Some(body) => ("200 OK", "application/json", body.clone()),
                None => ("404 Not Found", "text/plain", b"not found".to_vec()),
            }
        } else {
            ("404 Not Found", "text/plain", b"not found".to_vec())
        };
        let mut response = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n");
        if !config.omit_content_length {
            response.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        response.push_str("Connection: close\r\n\r\n");
        socket.write_all(response.as_bytes()).await?;
        socket.write_all(&body).await?;
        socket.shutdown().await
    }

    fn json_index(names: &[&str]) -> Vec<u8> {
        let projects: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({ "name": n, "_last-serial": 1 }))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "meta": { "api-version": "1.1", "_last-serial": 1 },
            "projects": projects,
        }))
        .expect("serialize index")
    }

    fn html_index(names: &[&str]) -> Vec<u8> {
        let mut html = String::from(
            "<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.1\">\n    <title>Simple index</title>\n  </head>\n  <body>\n",
        );
        for name in names {
            html.push_str(&format!(
                "    <a href=\"/simple/{}/\">{name}</a>\n",
                normalize(name)
            ));
        }
        html.push_str("  </body>\n</html>\n");
        html.into_bytes()
    }

    fn project_json(name: &str, version: &str, summary: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "info": { "name": name, "version": version, "summary": summary, "home_page": null,
                      "project_urls": { "Homepage": "https://example.invalid" } },
            "last_serial": 1,
            "releases": { version: [] },
            "urls": [],
        }))
        .expect("serialize project")
    }

    fn config(names: &[&str], json: &[(&str, &str, &str, &str)]) -> StubConfig {
        StubConfig {
            simple_body: json_index(names),
            simple_content_type: "application/vnd.pypi.simple.v1+json".into(),
            omit_content_length: false,
            json: json
                .iter()
                .map(|(key, name, version, summary)| {
                    (key.to_string(), project_json(name, version, summary))
                })
                .collect(),
        }
    }

    /// A unique cache directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            TempDir(std::env::temp_dir().join(format!("pypi-search-test-{}", uuid::Uuid::new_v4())))
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn searcher(base: &str, dir: &TempDir, ttl: Duration) -> PypiSearch {
        PypiSearch::build(base, dir.0.clone(), ttl, Limits::default(), false).expect("searcher")
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn names(results: &[PackageInfo]) -> Vec<&str> {
        results.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn normalize_follows_pep_503() {
        assert_eq!(normalize("Requests_OAuthlib"), "requests-oauthlib");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("a-_.-b__c"), "a-b-c");
        assert_eq!(normalize("Django"), "django");
        assert_eq!(normalize("---"), "-");
        assert_eq!(normalize(""), "");
    }

    #[test]
    fn osa_distance_counts_edits_and_transpositions() {
        assert_eq!(osa_distance_within(b"requests", b"requests", 2), Some(0));
        assert_eq!(osa_distance_within(b"reqeusts", b"requests", 2), Some(1));
        assert_eq!(osa_distance_within(b"request", b"requests", 2), Some(1));
        assert_eq!(osa_distance_within(b"rekwests", b"requests", 2), Some(2));
        assert_eq!(osa_distance_within(b"numpy", b"requests", 2), None);
        assert_eq!(osa_distance_within(b"abcdefgh", b"ab", 2), None);
    }

    #[test]
    fn query_validation() {
        for bad in [
            "",
            "   ",
            "-_.",
            "requests!",
            "naïve",
            "a/b",
            &"x".repeat(101),
        ] {
            let err = Query::parse(bad).expect_err(bad);
            assert!(matches!(err, SearchError::InvalidQuery(_)), "{bad}: {err}");
        }
        let q = Query::parse(" Flask  Login ").expect("valid");
        assert_eq!(q.joined, "flask-login");
        assert_eq!(q.words, vec!["flask", "login"]);
        assert_eq!(
            Query::parse(&"x".repeat(100))
                .expect("100 chars")
                .joined
                .len(),
            100
        );
    }

    #[tokio::test]
    async fn invalid_query_is_rejected_without_network() {
        let dir = TempDir::new();
        // Nothing listens here: an invalid query must fail before any request.
        let search = searcher("http://127.0.0.1:9", &dir, HOUR);
        for bad in ["", "rm -rf /", "x\"y"] {
            let err = search.search(bad).await.expect_err(bad);
            assert!(matches!(err, SearchError::InvalidQuery(_)), "{bad}: {err}");
        }
        assert!(!dir.0.exists());
    }

    #[test]
    fn bad_base_url_is_rejected() {
        let dir = TempDir::new();
        for bad in ["", "pypi.org", "ftp://pypi.org", "https://pypi.org/?q=1"] {
            let err = PypiSearch::new(bad, dir.0.clone(), HOUR).expect_err(bad);
            assert!(
                matches!(err, SearchError::InvalidBaseUrl { .. }),
                "{bad}: {err}"
            );
        }
        assert!(PypiSearch::new("https://pypi.org/", dir.0.clone(), HOUR).is_ok());
    }

    #[tokio::test]
    async fn exact_match_first_with_summary_and_version() {
        let stub = Stub::start(config(
            &["requests", "requests-toolbelt", "grequests", "numpy"],
            &[
                ("requests", "requests", "2.32.3", "Python HTTP for Humans."),
                (
                    "requests-toolbelt",
                    "requests-toolbelt",
                    "1.0.0",
                    "A utility belt",
                ),
            ],
        ))
        .await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);
        let results = search.search("requests").await.expect("search");
        assert_eq!(
            results[0],
            PackageInfo {
                name: "requests".into(),
                version: "2.32.3".into(),
                summary: "Python HTTP for Humans.".into(),
                url: format!("{}/project/requests/", stub.base),
                match_kind: MatchKind::Exact,
            }
        );
        assert_eq!(
            names(&results),
            ["requests", "requests-toolbelt", "grequests"]
        );
        assert_eq!(results[1].summary, "A utility belt");
        // grequests has no JSON API entry: kept, undescribed.
        assert_eq!(results[2].match_kind, MatchKind::Substring);
        assert_eq!(results[2].version, "");
        assert_eq!(results[2].summary, "");
        stub.stop().await;
    }

    #[tokio::test]
    async fn query_is_normalized() {
        let stub = Stub::start(config(
            &["Requests-OAuthlib", "requests"],
            &[(
                "requests-oauthlib",
                "requests-oauthlib",
                "2.0.0",
                "OAuthlib for Requests",
            )],
        ))
        .await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);
        let results = search.search("Requests_OAuthlib").await.expect("search");
        assert_eq!(names(&results), ["requests-oauthlib"]);
        assert_eq!(results[0].match_kind, MatchKind::Exact);
        assert_eq!(results[0].version, "2.0.0");
        assert_eq!(
            results[0].url,
            format!("{}/project/requests-oauthlib/", stub.base)
        );
        // Several words: joined with '-', or all contained in any order.
        let results = search.search("requests oauthlib").await.expect("search");
        assert_eq!(names(&results), ["requests-oauthlib"]);
        let results = search.search("oauthlib requests").await.expect("search");
        assert_eq!(names(&results), ["requests-oauthlib"]);
        assert_eq!(results[0].match_kind, MatchKind::Substring);
        stub.stop().await;
    }

    #[tokio::test]
    async fn ranking_groups_and_result_cap() {
        let stub = Stub::start(config(
            &[
                "zeta-pandas-plugin",
                "pandaz",
                "geopandas",
                "pandas-stubs",
                "pndas",
                "pandas",
                "pandas2",
                "numpy",
                "pdx",
                "pandas", // a duplicate line must not appear twice
            ],
            &[("pandas", "pandas", "2.2.3", "Powerful data structures")],
        ))
        .await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);

        // Exact, then prefixes (shorter first), then substrings: the cap cuts the rest.
        let results = search.search("pandas").await.expect("search");
        assert_eq!(
            names(&results),
            [
                "pandas",
                "pandas2",
                "pandas-stubs",
                "geopandas",
                "zeta-pandas-plugin"
            ]
        );
        let kinds: Vec<_> = results.iter().map(|r| r.match_kind).collect();
        use MatchKind::*;
        assert_eq!(kinds, [Exact, Prefix, Prefix, Substring, Substring]);

        // Close matches come last, by distance, then length, then name.
        let results = search.search("pandaz").await.expect("search");
        assert_eq!(names(&results), ["pandaz", "pandas", "pndas", "pandas2"]);
        let kinds: Vec<_> = results.iter().map(|r| r.match_kind).collect();
        assert_eq!(kinds, [Exact, Close, Close, Close]);
        assert_eq!(results[1].summary, "Powerful data structures");

        // A transposition is one edit; equally close names, shorter first.
        let results = search.search("pnadas").await.expect("search");
        assert_eq!(names(&results), ["pndas", "pandas", "pandaz", "pandas2"]);
        assert!(results.iter().all(|r| r.match_kind == Close));

        // Short queries get no close matches ("pdx" is one edit away from "pdy").
        let results = search.search("pdy").await.expect("search");
        assert!(results.is_empty(), "{results:?}");
        stub.stop().await;
    }

    #[tokio::test]
    async fn unknown_package_is_an_empty_list() {
        let stub = Stub::start(config(&["requests", "numpy"], &[])).await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);
        let results = search.search("zzzqqqxxx").await.expect("search");
        assert!(results.is_empty());
        stub.stop().await;
    }

    #[tokio::test]
    async fn index_is_fetched_once_then_again_after_ttl() {
        let stub = Stub::start(config(&["requests", "numpy"], &[])).await;
        let dir = TempDir::new();

        let search = searcher(&stub.base, &dir, HOUR);
        // Concurrent searches share one download.
        let (a, b) = tokio::join!(search.search("requests"), search.search("numpy"));
        assert_eq!(names(&a.expect("a")), ["requests"]);
        assert_eq!(names(&b.expect("b")), ["numpy"]);
        assert_eq!(stub.simple_hits(), 1);
        search.search("num").await.expect("third");
        assert_eq!(stub.simple_hits(), 1);
        // The cache outlives the searcher.
        let again = searcher(&stub.base, &dir, HOUR);
        again.search("requests").await.expect("fourth");
        assert_eq!(stub.simple_hits(), 1);
        let cached = std::fs::read_to_string(dir.0.join(INDEX_FILE)).expect("cache file");
        assert!(cached.starts_with(INDEX_HEADER_PREFIX));
        assert!(cached.lines().any(|l| l == "numpy"));
        // Only the index file is left: no temporary files.
        assert_eq!(std::fs::read_dir(&dir.0).expect("cache dir").count(), 1);

        // A tiny TTL: every search after it expires downloads again.
        let short = searcher(&stub.base, &dir, Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
        short.search("requests").await.expect("after ttl");
        assert_eq!(stub.simple_hits(), 2);
        tokio::time::sleep(Duration::from_millis(50)).await;
        short.search("requests").await.expect("after ttl again");
        assert_eq!(stub.simple_hits(), 3);
        stub.stop().await;
    }

    #[tokio::test]
    async fn stale_cache_is_used_when_pypi_is_gone() {
        let stub = Stub::start(config(
            &["requests", "numpy"],
            &[("requests", "requests", "2.32.3", "Python HTTP for Humans.")],
        ))
        .await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, Duration::from_millis(20));
        search.search("requests").await.expect("first");
        let base = stub.base.clone();
        stub.stop().await;
        tokio::time::sleep(Duration::from_millis(50)).await;

        let results = search.search("request").await.expect("stale cache");
        assert_eq!(names(&results), ["requests"]);
        assert_eq!(results[0].match_kind, MatchKind::Prefix);
        assert_eq!(results[0].version, "", "the JSON API is gone too");
        // A fresh searcher on the same cache too (it has not seen the failure).
        let other = searcher(&base, &dir, Duration::from_millis(20));
        let results = other.search("numpy").await.expect("stale cache");
        assert_eq!(names(&results), ["numpy"]);
    }

    #[tokio::test]
    async fn no_index_and_no_cache_is_an_actionable_error() {
        let stub = Stub::start(config(&["requests"], &[])).await;
        let base = stub.base.clone();
        stub.stop().await;
        let dir = TempDir::new();
        let search = searcher(&base, &dir, HOUR);
        let err = search
            .search("requests")
            .await
            .expect_err("nothing reachable");
        assert!(matches!(err, SearchError::IndexUnavailable { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("/simple/") && message.contains("no cached copy"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn html_index_is_parsed() {
        let mut cfg = config(&[], &[("flask", "Flask", "3.1.0", "A simple framework")]);
        cfg.simple_body = html_index(&["Flask", "Flask-Login", "flask_sqlalchemy", "django"]);
        cfg.simple_content_type = "text/html; charset=utf-8".into();
        let stub = Stub::start(cfg).await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);
        let results = search.search("flask").await.expect("search");
        assert_eq!(
            names(&results),
            ["Flask", "flask-login", "flask-sqlalchemy"]
        );
        assert_eq!(results[0].version, "3.1.0");
        let cached = std::fs::read_to_string(dir.0.join(INDEX_FILE)).expect("cache file");
        assert_eq!(
            cached.lines().skip(1).collect::<Vec<_>>(),
            ["flask", "flask-login", "flask-sqlalchemy", "django"]
        );
        stub.stop().await;
    }

    #[test]
    fn anchor_parser_handles_split_chunks_and_odd_markup() {
        let html = b"<!-- <a>commented</a> don't --><A HREF='x>y'>First_One</A>\n<a\nhref=\"/b/\">second</a><abbr>nope</abbr><a>bad name!</a><a href=x>";
        let mut out = Vec::new();
        let mut sink = NameSink {
            out: &mut out,
            count: 0,
        };
        let mut parser = AnchorParser::default();
        for piece in html.chunks(3) {
            parser.feed(piece, &mut sink).expect("feed");
        }
        let count = sink.count;
        assert_eq!(String::from_utf8(out).expect("utf8"), "first-one\nsecond\n");
        assert_eq!(count, 2);
    }

    #[tokio::test]
    async fn oversized_index_is_rejected() {
        let names: Vec<String> = (0..2000).map(|i| format!("package-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        for omit_content_length in [false, true] {
            let mut cfg = config(&refs, &[]);
            cfg.omit_content_length = omit_content_length;
            let stub = Stub::start(cfg).await;
            let dir = TempDir::new();
            let limits = Limits {
                index_max_bytes: 4096,
                ..Limits::default()
            };
            let search = PypiSearch::build(&stub.base, dir.0.clone(), HOUR, limits, false)
                .expect("searcher");
            let err = search.search("package-1").await.expect_err("too big");
            let message = err.to_string();
            assert!(
                message.contains("larger than the 4096-byte limit"),
                "{message}"
            );
            assert!(!dir.0.join(INDEX_FILE).exists());
            // The partial download was removed.
            let leftovers = std::fs::read_dir(&dir.0).map(|d| d.count()).unwrap_or(0);
            assert_eq!(leftovers, 0);
            stub.stop().await;
        }
    }

    #[tokio::test]
    async fn oversized_or_malformed_project_answer_keeps_the_result() {
        let mut cfg = config(&["requests", "requests-cache"], &[]);
        let padding = "x".repeat(10_000);
        cfg.json.insert(
            "requests".into(),
            project_json("requests", "2.32.3", &padding),
        );
        cfg.json
            .insert("requests-cache".into(), b"{\"info\": [1, 2".to_vec());
        cfg.omit_content_length = true;
        let stub = Stub::start(cfg).await;
        let dir = TempDir::new();
        let limits = Limits {
            json_max_bytes: 1024,
            ..Limits::default()
        };
        let search =
            PypiSearch::build(&stub.base, dir.0.clone(), HOUR, limits, false).expect("searcher");
        let results = search.search("requests").await.expect("search");
        assert_eq!(names(&results), ["requests", "requests-cache"]);
        assert!(results
            .iter()
            .all(|r| r.version.is_empty() && r.summary.is_empty()));
        assert!(stub.json_hits.load(Ordering::SeqCst) >= 2);
        stub.stop().await;
    }

    #[tokio::test]
    async fn project_newer_than_the_index_is_found() {
        let stub = Stub::start(config(
            &["numpy"],
            &[("brand-new", "Brand_New", "0.1.0", "Just published")],
        ))
        .await;
        let dir = TempDir::new();
        let search = searcher(&stub.base, &dir, HOUR);
        let results = search.search("brand.new").await.expect("search");
        assert_eq!(names(&results), ["Brand_New"]);
        assert_eq!(results[0].match_kind, MatchKind::Exact);
        assert_eq!(results[0].url, format!("{}/project/brand-new/", stub.base));
        stub.stop().await;
    }

    #[test]
    fn search_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let dir = TempDir::new();
        let search = PypiSearch::new("https://pypi.org", dir.0.clone(), HOUR).expect("searcher");
        let future = search.search("requests");
        assert_send(&future);
    }
}
