//! Why a search, a download or a lookup failed. Each error keeps its cause as its `source`; the
//! messages still name the cause, because the tool's answer shows only the top-level message.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What `reqwest::Url::parse` fails with (the `url` crate's `ParseError`).
type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

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
    InvalidBaseUrl {
        url: String,
        #[source]
        reason: BaseUrlError,
    },
    /// The HTTP client could not be set up (TLS roots, ...).
    #[error("cannot set up the HTTP client for PyPI: {}", error_chain(.0))]
    HttpClient(#[source] reqwest::Error),
    /// The package index could not be downloaded and there is no cached copy to fall back on.
    #[error(
        "the PyPI package index could not be fetched from {url} ({source}{}) and no cached copy \
         exists in {cache_dir}; check that this machine can reach PyPI (or point the base URL at a \
         reachable mirror) and that the cache directory is writable, then retry",
        retry_note(.retry_in)
    )]
    IndexUnavailable {
        url: String,
        /// Why the last download failed (shared: later searches report it until the next try).
        #[source]
        source: Arc<IndexError>,
        /// Seconds until the next download is tried, when this search did not try.
        retry_in: Option<u64>,
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
    #[error("internal error while searching PyPI: index scan task failed: {0}")]
    Internal(#[source] tokio::task::JoinError),
}

fn retry_note(retry_in: &Option<u64>) -> String {
    retry_in.map_or_else(String::new, |secs| format!("; next attempt in {secs}s"))
}

/// What is wrong with a PyPI base URL.
#[derive(Debug, thiserror::Error)]
pub enum BaseUrlError {
    #[error("{0}")]
    Unparsable(#[source] UrlParseError),
    #[error("the scheme must be http or https")]
    Scheme,
    #[error("it has no host")]
    NoHost,
    #[error("it must not have a query or a fragment")]
    QueryOrFragment,
}

/// Why the simple index could not be downloaded and converted into the name file.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("timed out after {}s", .0.as_secs())]
    TimedOut(Duration),
    #[error("cannot create cache directory {dir}: {source}")]
    CreateCacheDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the index: {0}")]
    ReadIndex(#[source] io::Error),
    #[error("malformed PEP 691 JSON index: {0}")]
    MalformedJson(#[source] serde_json::Error),
    #[error("the JSON index has no \"projects\" list")]
    NoProjectsList,
    #[error("index conversion task failed: {0}")]
    ConversionTask(#[source] tokio::task::JoinError),
    #[error("the index lists no projects")]
    Empty,
    #[error("cannot write the cache file {path}: {source}")]
    WriteCacheFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Why a request to PyPI got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{}", error_chain(.0))]
    Http(#[source] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("the response is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("timed out")]
    TimedOut,
    #[error("timed out reading the answer")]
    TimedOutReading,
    #[error("malformed JSON API answer: {0}")]
    MalformedAnswer(#[source] serde_json::Error),
}

/// A reqwest error with its causes, e.g. "error sending request: ...: connection refused":
/// reqwest's own message leaves them out, and they are what tells a user what to fix.
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
