//! End-to-end tests of the search against a stub PyPI server on localhost.

use super::cache::{INDEX_FILE, INDEX_HEADER_PREFIX};
use super::client::Limits;
use super::*;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        let search =
            PypiSearch::build(&stub.base, dir.0.clone(), HOUR, limits, false).expect("searcher");
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

#[tokio::test]
async fn errors_keep_their_cause() {
    let dir = TempDir::new();
    let err = PypiSearch::new("ftp://pypi.org", dir.0.clone(), HOUR).expect_err("bad scheme");
    let cause = std::error::Error::source(&err).expect("a cause");
    assert!(cause.is::<BaseUrlError>(), "{cause:?}");

    let stub = Stub::start(config(&["requests"], &[])).await;
    let base = stub.base.clone();
    stub.stop().await;
    let search = searcher(&base, &dir, HOUR);
    for attempt in ["downloads", "waits to retry"] {
        let err = search.search("requests").await.expect_err(attempt);
        let cause = std::error::Error::source(&err).expect("a cause");
        assert!(
            matches!(
                cause.downcast_ref::<Arc<IndexError>>().map(|e| &**e),
                Some(IndexError::Fetch(FetchError::Http(_)))
            ),
            "{attempt}: {cause:?}"
        );
        assert!(
            std::error::Error::source(cause).is_some(),
            "{attempt}: reqwest's own cause"
        );
    }
    assert!(search
        .search("requests")
        .await
        .expect_err("still down")
        .to_string()
        .contains("; next attempt in "));
}
