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

mod cache;
mod client;
mod error;
mod index_file;
mod index_html;
mod index_json;
mod ranking;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use client::{Limits, Lookup, CONNECT_TIMEOUT};
pub use error::{BaseUrlError, FetchError, IndexError, SearchError};
use ranking::{scan_index, Query};

/// Most results one search returns.
pub const MAX_RESULTS: usize = 5;
/// Longest accepted query, in characters.
pub const MAX_QUERY_LEN: usize = 100;

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
    last_failure: StdMutex<Option<(Instant, Arc<IndexError>)>>,
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
        let invalid = |reason: BaseUrlError| SearchError::InvalidBaseUrl {
            url: base_url.to_string(),
            reason,
        };
        let parsed =
            reqwest::Url::parse(&base).map_err(|e| invalid(BaseUrlError::Unparsable(e)))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(BaseUrlError::Scheme));
        }
        if parsed.host_str().is_none() {
            return Err(invalid(BaseUrlError::NoHost));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid(BaseUrlError::QueryOrFragment));
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("python-code-sandbox/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5));
        if !system_proxy {
            builder = builder.no_proxy();
        }
        let client = builder.build().map_err(SearchError::HttpClient)?;
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
                    .map_err(SearchError::Internal)?
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
}
