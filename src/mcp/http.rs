//! MCP over streamable HTTP (`serve --http ADDR`): rmcp's streamable HTTP service on axum, behind
//! one gate that every request passes, in this order:
//!
//! 0. no header that must be single (`Authorization`, `Host`, `Origin`, `Mcp-Session-Id`,
//!    `Content-Length`, ... see `SINGLE_HEADERS`) may appear twice: 400;
//! 1. `Host` must be allowed (DNS-rebinding protection): 403;
//! 2. `Origin`, when present, must be allowed (browsers): 403. Allowed are the origins in
//!    `SANDBOX_HTTP_ALLOWED_ORIGINS` and the server's own (an allowed host on the bound port);
//! 3. no credential in the query string: 400;
//! 4. with a token configured, `Authorization: Bearer <token>` (compared in constant time): 401
//!    with `WWW-Authenticate: Bearer`, on every request, whatever its MCP session id;
//! 5. the body within `SANDBOX_HTTP_MAX_BODY`: 413 (announced sizes here, streamed ones in rmcp).
//!
//! Behind the gate, answers rmcp gives in a form some clients cannot read are mended: a body that
//! is not JSON gets a JSON-RPC parse error (-32700) and one that is JSON but no JSON-RPC message an
//! invalid-request error (-32600), both with HTTP 400; SSE priming events go only to clients of
//! revision 2025-11-25 and later ([`super::priming`]).
//!
//! Connections are capped and timed ([`super::connections`]), and so are MCP sessions
//! ([`super::mcp_sessions`]): a new `initialize` beyond `SANDBOX_HTTP_MAX_MCP_SESSIONS` gets 429.
//!
//! Each MCP session gets its own [`SandboxServer`] with a fresh client id, so the sandbox sessions
//! it creates are its own; when the MCP session ends (DELETE, idle expiry, shutdown) they are
//! stopped. The session-based protocol revisions are served (up to 2025-11-25): 2026-07-28 has no
//! MCP sessions to own sandboxes, and clients that probe for it fall back to the handshake.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::connections::{self, ConnectionLimits};
use super::health::{self, Health};
use super::mcp_sessions::{self, McpSessions, SESSION_HEADER};
use super::oauth::{self, OAuth, OAuthRefusal};
use super::principals::{self, Principal, SecretsRules, TokensFile};
use super::quotas::Quotas;
use super::running::Running;
use super::tasks::Tasks;
use super::{priming, SandboxServer, ServeError};
use crate::config::{normalize_origin, parse_host, Config, HostPattern, Secret};
use crate::engine::sessions::ClientId;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";
/// The address `serve --http` binds when none is given.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";
/// How long open connections get to close after SIGINT/SIGTERM before the sandboxes are removed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Query parameters that carry credentials in other APIs; a request with one is refused.
const CREDENTIAL_PARAMS: &[&str] = &[
    "access_token",
    "token",
    "auth",
    "authorization",
    "api_key",
    "apikey",
    "key",
    "bearer",
    "password",
    "secret",
];

/// Headers a request may carry at most once. Two `Authorization`, `Host` or `Origin` headers
/// could be judged by one and acted on by the other; the rest name a session, a revision or the
/// body, where two values leave the meaning open. (hyper refuses differing `Content-Length`s
/// itself; equal ones are refused here.)
const SINGLE_HEADERS: &[&str] = &[
    "authorization",
    "host",
    "origin",
    "mcp-session-id",
    "mcp-protocol-version",
    "content-type",
    "content-length",
    "transfer-encoding",
    "last-event-id",
];

/// The request gate: what a request must satisfy before rmcp sees it.
#[derive(Debug)]
pub struct Gate {
    token: Option<Secret>,
    /// The principals' tokens (`SANDBOX_HTTP_TOKENS_FILE`), when callers are told apart.
    tokens: Option<Arc<TokensFile>>,
    /// OAuth access tokens (`SANDBOX_OAUTH_ISSUER`), tried after the tokens file.
    oauth: Option<Arc<OAuth>>,
    hosts: Vec<HostPattern>,
    origins: Vec<String>,
    /// The port the server listens on: an `Origin` naming an allowed host on it is the server's
    /// own page, not a rebinding attack.
    bound_port: u16,
    max_body: u64,
}

impl Gate {
    /// The gate for a server bound to `bound`, from the configuration.
    pub fn new(config: &Config, bound: SocketAddr) -> Gate {
        let http = &config.http;
        let hosts = http
            .allowed_hosts
            .clone()
            .unwrap_or_else(|| default_hosts(bound.ip()));
        Gate {
            token: http.token.clone(),
            tokens: None,
            oauth: None,
            hosts,
            origins: http.allowed_origins.clone(),
            bound_port: bound.port(),
            max_body: http.max_body_bytes,
        }
    }

    /// The gate that identifies callers by the principals of a tokens file.
    pub fn with_tokens(mut self, tokens: Arc<TokensFile>) -> Gate {
        self.tokens = Some(tokens);
        self
    }

    /// The gate that identifies callers by OAuth access tokens too.
    pub fn with_oauth(mut self, oauth: Arc<OAuth>) -> Gate {
        self.oauth = Some(oauth);
        self
    }

    /// Whether callers are told apart (principals), rather than all being one.
    pub fn has_principals(&self) -> bool {
        self.tokens.is_some() || self.oauth.is_some()
    }

    /// Who sends a request that passed [`Gate::check`]: `None` when the server has no
    /// principals (or for a CORS preflight, which carries no credentials).
    pub async fn identify(
        &self,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<Option<Arc<Principal>>, Refusal> {
        if !self.has_principals() {
            return Ok(None);
        }
        if method == Method::OPTIONS && headers.contains_key(header::ORIGIN) {
            return Ok(None);
        }
        let presented = bearer(headers);
        if let Some(principal) =
            presented.and_then(|token| self.tokens.as_ref().and_then(|t| t.identify(token)))
        {
            return Ok(Some(principal));
        }
        if let Some(oauth) = &self.oauth {
            let refusal = match presented {
                Some(token) => match oauth.identify(token).await {
                    Ok(principal) => return Ok(Some(Arc::new(principal))),
                    Err(refusal) => Some(refusal),
                },
                None => None,
            };
            let message = match &refusal {
                Some(refusal) => format!(
                    "{}: {}",
                    match refusal.status() {
                        StatusCode::FORBIDDEN => "Forbidden",
                        _ => "Unauthorized",
                    },
                    refusal.description()
                ),
                None => format!(
                    "Unauthorized: send `Authorization: Bearer <access token>` from {} (see {})",
                    oauth.issuer(),
                    oauth.metadata_url()
                ),
            };
            return Err(Refusal {
                challenge: Some(oauth.challenge(refusal.as_ref())),
                ..Refusal::new(
                    refusal
                        .as_ref()
                        .map_or(StatusCode::UNAUTHORIZED, OAuthRefusal::status),
                    &message,
                )
            });
        }
        let challenge = if presented.is_some() {
            "Bearer realm=\"python-code-sandbox\", error=\"invalid_token\""
        } else {
            "Bearer realm=\"python-code-sandbox\""
        };
        Err(Refusal {
            challenge: Some(challenge.to_string()),
            ..Refusal::new(
                StatusCode::UNAUTHORIZED,
                "Unauthorized: send `Authorization: Bearer <token>` with your own token (a line of \
                 the server's SANDBOX_HTTP_TOKENS_FILE; the operator makes one with \
                 `python-code-sandbox token NAME`)",
            )
        })
    }

    /// Checks a request's head; `Err` says why it is refused.
    pub fn check(
        &self,
        method: &Method,
        uri: &axum::http::Uri,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        // A header that must be single is judged only once there is one: with two, the checks
        // below and rmcp or a proxy in front could each read a different one.
        if let Some(name) = SINGLE_HEADERS
            .iter()
            .find(|name| headers.get_all(**name).iter().nth(1).is_some())
        {
            tracing::warn!(header = %name, "refused a request with a repeated header");
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                &format!("Bad Request: the {name} header appears more than once; send it once"),
            ));
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| uri.authority().map(|a| a.to_string()));
        let Some((host, port)) = host.as_deref().and_then(parse_host) else {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Bad Request: missing or malformed Host header",
            ));
        };
        if !self.hosts.iter().any(|p| p.matches(&host, port)) {
            tracing::warn!(
                host = host.as_str(),
                "refused a request for a Host that is not allowed (SANDBOX_HTTP_ALLOWED_HOSTS)"
            );
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "Forbidden: this Host is not allowed (the server's SANDBOX_HTTP_ALLOWED_HOSTS)",
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            if self.allowed_origin(origin).is_none() {
                tracing::warn!(origin = ?origin, "refused a request from an Origin that is not allowed (SANDBOX_HTTP_ALLOWED_ORIGINS)");
                return Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "Forbidden: this Origin is not allowed (the server's SANDBOX_HTTP_ALLOWED_ORIGINS)",
                ));
            }
        }
        if has_credential_param(uri.query()) {
            // Never log the query: it holds the credential.
            tracing::warn!("refused a request with a credential in its URL");
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "Bad Request: credentials are not accepted in the URL; send the token in an \
                 `Authorization: Bearer` header (and replace this one: URLs end up in logs)",
            ));
        }
        // A CORS preflight carries no credentials by design; it only learns what is allowed.
        if method == Method::OPTIONS && headers.contains_key(header::ORIGIN) {
            return Ok(());
        }
        if let Some(token) = &self.token {
            match bearer(headers) {
                Some(presented) if same_secret(presented, token.expose()) => {}
                presented => {
                    let challenge = if presented.is_some() {
                        "Bearer realm=\"python-code-sandbox\", error=\"invalid_token\""
                    } else {
                        "Bearer realm=\"python-code-sandbox\""
                    };
                    return Err(Refusal {
                        challenge: Some(challenge.to_string()),
                        ..Refusal::new(
                            StatusCode::UNAUTHORIZED,
                            "Unauthorized: send `Authorization: Bearer <token>` with the server's SANDBOX_HTTP_TOKEN",
                        )
                    });
                }
            }
        }
        let announced = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > self.max_body) {
            return Err(Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "Payload Too Large: the request body is limited to {} bytes (SANDBOX_HTTP_MAX_BODY)",
                    self.max_body
                ),
            ));
        }
        Ok(())
    }

    /// The request's origin, when it is present and allowed: one of SANDBOX_HTTP_ALLOWED_ORIGINS,
    /// or the server's own origin (an allowed host on the port the server listens on).
    fn allowed_origin<'h>(&self, origin: &'h HeaderValue) -> Option<&'h HeaderValue> {
        let normalized = normalize_origin(origin.to_str().ok()?)?;
        if self.origins.contains(&normalized) {
            return Some(origin);
        }
        let authority = normalized.split_once("://")?.1;
        let (host, port) = parse_host(authority)?;
        (port == Some(self.bound_port) && self.hosts.iter().any(|p| p.matches(&host, port)))
            .then_some(origin)
    }

    /// Adds the CORS headers an allowed browser origin needs.
    fn add_cors(&self, origin: &HeaderValue, preflight: bool, response: &mut Response) {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("mcp-session-id, www-authenticate"),
        );
        if preflight {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, DELETE"),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(
                    "authorization, content-type, accept, mcp-session-id, mcp-protocol-version, last-event-id",
                ),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
    }

    /// The `Host` patterns in force, as rmcp's own (second) check takes them.
    fn host_list(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|p| {
                let host = if p.host.contains(':') {
                    format!("[{}]", p.host)
                } else {
                    p.host.clone()
                };
                match p.port {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                }
            })
            .collect()
    }
}

/// The loopback names and the bound address (unless it is the unspecified address).
fn default_hosts(bound: IpAddr) -> Vec<HostPattern> {
    let mut hosts: Vec<HostPattern> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(|host| HostPattern {
            host: host.to_string(),
            port: None,
        })
        .collect();
    let own = bound.to_string();
    if !bound.is_unspecified() && !hosts.iter().any(|h| h.host == own) {
        hosts.push(HostPattern {
            host: own,
            port: None,
        });
    }
    hosts
}

fn has_credential_param(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        query.split(['&', ';']).any(|pair| {
            let name = percent_decoded(pair.split('=').next().unwrap_or_default());
            CREDENTIAL_PARAMS.contains(&name.to_ascii_lowercase().as_str())
        })
    })
}

/// A query parameter name with `%XX` escapes and `+` decoded (invalid escapes kept as they are).
fn percent_decoded(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| name.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], escaped) {
            (_, Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (byte, None) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Compares two secrets in time that depends on neither: both are hashed first (equal lengths),
/// and the digests compared without an early exit.
fn same_secret(presented: &str, expected: &str) -> bool {
    let (a, b) = (
        Sha256::digest(presented.as_bytes()),
        Sha256::digest(expected.as_bytes()),
    );
    let difference = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Why the gate refused a request, and the answer it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// The `WWW-Authenticate` challenge of a 401 or 403.
    pub challenge: Option<String>,
}

impl Refusal {
    fn new(status: StatusCode, message: &str) -> Refusal {
        Refusal {
            status,
            message: message.to_string(),
            challenge: None,
        }
    }

    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(format!("{}\n", self.message)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(challenge) = self.challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            headers.insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}

async fn gatekeeper(
    State((gate, sessions)): State<(Arc<Gate>, Arc<McpSessions>)>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refusal) = gate.check(request.method(), request.uri(), request.headers()) {
        return refusal.into_response();
    }
    let principal = match gate.identify(request.method(), request.headers()).await {
        Ok(principal) => principal,
        Err(refusal) => return refusal.into_response(),
    };
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| gate.allowed_origin(o))
        .cloned();
    let preflight = request.method() == Method::OPTIONS && origin.is_some();
    let mut response = if preflight {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        response
    } else {
        match gate.forward(&sessions, principal, request, next).await {
            Ok(response) | Err(response) => response,
        }
    };
    if let Some(origin) = origin {
        gate.add_cors(&origin, preflight, &mut response);
    }
    response
}

impl Gate {
    /// Hands a request that passed the gate to rmcp, and mends what rmcp answers in a way
    /// clients of some revisions cannot read: JSON-RPC errors for unparsable bodies (rmcp says
    /// 415 in text), no SSE priming events before 2025-11-25, 204 for a session's DELETE.
    /// A request that may open an MCP session goes through the session cap ([`McpSessions`]).
    /// The rest runs with its caller, when it is a principal, as the current one; a session
    /// opened by a principal serves only that principal.
    async fn forward(
        &self,
        sessions: &Arc<McpSessions>,
        principal: Option<Arc<Principal>>,
        request: Request,
        next: Next,
    ) -> Result<Response, Response> {
        let (parts, body) = request.into_parts();
        let json_post = parts.method == Method::POST && is_json(&parts.headers);
        let deleting = parts.method == Method::DELETE;
        let mut asked_revision = None;
        // A JSON POST without a session id may open one, unless it is plainly another request.
        let session_id = parts
            .headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut opening = json_post && session_id.is_none();
        let mut request_id = None;
        let body = if json_post {
            let limit = usize::try_from(self.max_body).unwrap_or(usize::MAX);
            let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
                Refusal::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "Payload Too Large: the request body is limited to {} bytes (SANDBOX_HTTP_MAX_BODY)",
                        self.max_body
                    ),
                )
                .into_response()
            })?;
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
                return Err(json_rpc_error(-32700, &format!("Parse error: {e}")));
            }
            let probe = serde_json::from_slice::<InitializeProbe>(&bytes).ok();
            if let Some(probe) = probe {
                if probe.method.as_deref() == Some("initialize") {
                    request_id = probe.id;
                    asked_revision = probe.params.and_then(|params| params.protocol_version);
                } else if probe.method.is_some() {
                    opening = false;
                }
            }
            Body::from(bytes)
        } else {
            body
        };
        let revision = priming::request_revision(
            parts
                .headers
                .get("mcp-protocol-version")
                .and_then(|v| v.to_str().ok()),
            asked_revision.as_deref(),
        );
        let post = parts.method == Method::POST;
        let request = Request::from_parts(parts, body);
        let caller_name = principal.as_ref().map(|p| p.name.clone());
        if let Some(id) = &session_id {
            if !sessions.admits(id, caller_name.as_deref()) {
                // Another principal's session looks like no session at all.
                tracing::warn!("refused a request to an MCP session of another principal");
                return Err(Refusal::new(
                    StatusCode::NOT_FOUND,
                    "Not Found: no such MCP session; start a new one (initialize)",
                )
                .into_response());
            }
        }
        let mut response = principals::with_current(principal, async {
            match &session_id {
                _ if opening => sessions.open(request_id, next.run(request)).await,
                Some(id) => sessions.track(id, post, next.run(request).await),
                None => next.run(request).await,
            }
        })
        .await;
        // rmcp checks the Content-Type first: a 415 for a JSON body means it is no JSON-RPC message.
        if json_post && response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            return Err(json_rpc_error(
                -32600,
                "Invalid Request: the body is JSON but not a JSON-RPC 2.0 request, notification or response",
            ));
        }
        // rmcp accepts a session's DELETE with 202, which clients log as a failed termination;
        // the session is gone by then, so say so.
        if deleting && response.status() == StatusCode::ACCEPTED {
            *response.status_mut() = StatusCode::NO_CONTENT;
        }
        let event_stream = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if event_stream && !priming::expects_priming(&revision) {
            let (parts, body) = response.into_parts();
            let filtered = priming::without_priming(body.into_data_stream());
            response = Response::from_parts(parts, Body::from_stream(filtered));
        }
        Ok(response)
    }
}

/// The part of an `initialize` request that names the revision the client asks for.
#[derive(serde::Deserialize)]
struct InitializeProbe {
    id: Option<serde_json::Value>,
    method: Option<String>,
    params: Option<InitializeProbeParams>,
}

#[derive(serde::Deserialize)]
struct InitializeProbeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// A JSON-RPC error response for a request that could not be read (so it has no id): HTTP 400.
fn json_rpc_error(code: i32, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Parses `serve --http`'s address: `IP:PORT`, `[IPv6]:PORT` or `localhost:PORT`.
pub fn parse_bind(addr: &str) -> Result<SocketAddr, String> {
    let addr = addr.trim();
    if let Ok(parsed) = addr.parse::<SocketAddr>() {
        return Ok(parsed);
    }
    if let Some(port) = addr.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        }
    }
    Err(format!(
        "invalid --http address {addr:?}: expected IP:PORT, such as {DEFAULT_ADDR}, 0.0.0.0:8080 or [::1]:8080"
    ))
}

/// Why a bind address is refused before anything starts, if it is.
pub fn refuse_bind(addr: SocketAddr, config: &Config) -> Option<String> {
    if addr.ip().is_loopback()
        || config.http.token.is_some()
        || config.http.tokens_file.is_some()
        || config.http.oauth.enabled()
    {
        return None;
    }
    Some(format!(
        "refusing to serve on {addr} without a token: whoever reaches it could run code and, \
         through the server, use its Docker engine. Set SANDBOX_HTTP_TOKEN (or \
         SANDBOX_HTTP_TOKEN_FILE), SANDBOX_HTTP_TOKENS_FILE or OAuth (SANDBOX_OAUTH_ISSUER), or bind a loopback address such as {DEFAULT_ADDR}"
    ))
}

/// Serves MCP over streamable HTTP at `http://ADDR/mcp` until `shutdown` resolves (with what
/// asked for it, e.g. the signal's name); then stops accepting, ends every MCP session (in-flight
/// calls are cancelled), and removes every sandbox.
pub async fn serve_http(
    config: Config,
    addr: &str,
    shutdown: impl Future<Output = &'static str> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = parse_bind(addr).map_err(ServeError::Address)?;
    if let Some(reason) = refuse_bind(addr, &config) {
        return Err(ServeError::Address(reason));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Listen { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let mut gate = Gate::new(&config, bound);
    if let Some(path) = &config.http.tokens_file {
        let tokens = Arc::new(
            TokensFile::open(path, SecretsRules::of(&config)).map_err(ServeError::Principals)?,
        );
        reload_on_sighup(tokens.clone())?;
        gate = gate.with_tokens(tokens);
    }
    let oauth = match OAuth::from_config(&config)
        .await
        .map_err(ServeError::OAuth)?
    {
        Some(oauth) => {
            let oauth = Arc::new(oauth);
            gate = gate.with_oauth(oauth.clone());
            Some(oauth)
        }
        None => None,
    };
    let gate = Arc::new(gate);
    let quotas = Arc::new(Quotas::new(&config));
    // A principal's task lives as long as its call can take (an install, then an execution).
    let tasks = Arc::new(Tasks::new(
        config.limits.timeout + config.deps.install_timeout + Duration::from_secs(60),
    ));
    // An MCP session with no request for this long ends (and with it its sandbox sessions): the
    // idle limit of a sandbox session, but never shorter than the longest call (an install, then
    // an execution), during which the MCP session sees no traffic.
    let idle = config
        .sessions
        .idle_timeout
        .max(config.limits.timeout + config.deps.install_timeout + Duration::from_secs(60));
    let max_body = usize::try_from(config.http.max_body_bytes).unwrap_or(usize::MAX);
    let limits = ConnectionLimits::from_config(&config.http);
    let (max_sessions, unowned_idle) = (config.http.max_mcp_sessions, config.http.mcp_idle_timeout);
    let (drain_timeout, metrics_addr) = (config.http.drain_timeout, config.http.metrics_addr);
    // From here on the engine's start-ups and copies are counted.
    let _ = super::metrics::global();
    let running = Running::start(config)?;
    let health = Health::new();
    health.engine_made(running.engine.clone());

    let stop = CancellationToken::new();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(idle);
    let rmcp_config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(gate.host_list())
        .with_max_request_body_bytes(max_body)
        .with_cancellation_token(stop.child_token());
    let sessions = Arc::new(sessions);
    let mcp_sessions = McpSessions::new(
        sessions.clone(),
        running.engine.clone(),
        max_sessions,
        unowned_idle,
    );
    mcp_sessions.spawn_reaper(stop.child_token());
    let (engine, pypi) = (running.engine.clone(), running.pypi.clone());
    let server_tasks = tasks.clone();
    // Built once: each MCP session and each sessionless request gets a copy.
    let tools = SandboxServer::described_tools(running.engine.config());
    let service = StreamableHttpService::new(
        move || {
            let server = SandboxServer::for_client(
                engine.clone(),
                pypi.clone(),
                quotas.clone(),
                tools.clone(),
            )
            .with_tasks(server_tasks.clone());
            if let Some(client) = &server.client {
                // A principal's sandbox sessions do not hang on the MCP session: it owns
                // nothing, so an idle one ends early.
                let owner = match client.principal {
                    Some(_) => ClientId::new(),
                    None => client.id.clone(),
                };
                mcp_sessions::note_client(&owner);
            }
            Ok(server)
        },
        sessions,
        rmcp_config,
    );
    let mut app = axum::Router::new().route_service(MCP_PATH, service);
    if metrics_addr.is_none() {
        app = app.merge(super::metrics::routes(running.engine.clone()));
    }
    // Health answers from now on, outside the gate; MCP requests wait for the end of start-up.
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            (gate.clone(), mcp_sessions),
            gatekeeper,
        ))
        .layer(axum::middleware::from_fn_with_state(
            health.clone(),
            health::admit,
        ))
        .merge(health::routes(health.clone()));
    // The OAuth metadata is public too (clients read it to find where to log in).
    let app = match oauth {
        Some(oauth) => app.merge(oauth::routes(oauth)),
        None => app,
    };
    let serving = tokio::spawn(connections::serve(listener, app, limits, stop.clone()));
    tracing::info!(
        "listening on http://{bound}: {} and {} answer now, MCP once start-up is done",
        health::HEALTH_PATH,
        health::READY_PATH
    );
    if let Some(addr) = metrics_addr {
        let metrics = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { addr, source })?;
        tracing::info!(
            "serving metrics at http://{}/metrics (no authentication: SANDBOX_METRICS_ADDR)",
            metrics.local_addr().unwrap_or(addr)
        );
        let routes = super::metrics::routes(running.engine.clone());
        tokio::spawn(connections::serve(metrics, routes, limits, stop.clone()));
    }
    let running = match running.ready().await {
        Ok(running) => running,
        Err(e) => {
            stop.cancel();
            return Err(e);
        }
    };
    health.serving();

    let authentication = if gate.has_principals() {
        "a principal's bearer token required"
    } else if running.engine.config().http.token.is_some() {
        "bearer token required"
    } else {
        "no authentication (loopback only)"
    };
    tracing::info!(
        "serving MCP over streamable HTTP at http://{bound}{MCP_PATH} ({authentication})"
    );
    let shutdown = {
        let stop = stop.clone();
        async move {
            let reason = shutdown.await;
            if reason == "SIGTERM" {
                tracing::info!(
                    "{reason}: draining: not ready, new MCP sessions refused, up to {}s for the calls in progress (SANDBOX_DRAIN_TIMEOUT)",
                    drain_timeout.as_secs()
                );
                let left = health::drain(&health, drain_timeout).await;
                if left > 0 {
                    tracing::warn!("{left} tool call(s) still running after SANDBOX_DRAIN_TIMEOUT: ending them");
                }
            }
            tracing::info!("{reason}: shutting down");
            stop.cancel();
        }
    };
    tokio::spawn(shutdown);
    tokio::select! {
        _ = serving => {}
        () = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("connections still open {}s after the signal: closing them", SHUTDOWN_GRACE.as_secs());
        }
    };
    tasks.shutdown();
    running.stop().await;
    Ok(())
}

/// Reloads the tokens file on SIGHUP, without touching connections or sessions; a file that no
/// longer parses leaves the principals in force (and says why).
fn reload_on_sighup(tokens: Arc<TokensFile>) -> Result<(), ServeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())
        .map_err(|e| ServeError::Principals(format!("cannot listen for SIGHUP: {e}")))?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match tokens.reload() {
                Ok(count) => tracing::info!(
                    "SIGHUP: reloaded {} ({count} principals)",
                    tokens.path().display()
                ),
                Err(e) => tracing::error!(
                    "SIGHUP: the tokens file was not reloaded, the previous principals stay: {e}"
                ),
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Uri;

    fn gate(pairs: &[(&str, &str)], bound: &str) -> Gate {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = Config::from_lookup(|name| map.get(name).cloned()).unwrap();
        Gate::new(&config, bound.parse().unwrap())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn status(gate: &Gate, uri: &str, pairs: &[(&str, &str)]) -> StatusCode {
        let uri: Uri = uri.parse().unwrap();
        match gate.check(&Method::POST, &uri, &headers(pairs)) {
            Ok(()) => StatusCode::OK,
            Err(refusal) => refusal.status,
        }
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn the_token_is_required_on_every_request() {
        let g = gate(&[("SANDBOX_HTTP_TOKEN", TOKEN)], "127.0.0.1:8080");
        let host = ("host", "127.0.0.1:8080");
        assert_eq!(status(&g, "/mcp", &[host]), StatusCode::UNAUTHORIZED);
        let wrong = format!("Bearer {}x", &TOKEN[..TOKEN.len() - 1]);
        assert_eq!(
            status(&g, "/mcp", &[host, ("authorization", &wrong)]),
            StatusCode::UNAUTHORIZED
        );
        let basic = format!("Basic {TOKEN}");
        assert_eq!(
            status(&g, "/mcp", &[host, ("authorization", &basic)]),
            StatusCode::UNAUTHORIZED
        );
        let right = format!("bearer {TOKEN}");
        assert_eq!(
            status(&g, "/mcp", &[host, ("authorization", &right)]),
            StatusCode::OK
        );
        // A session id is no credential.
        assert_eq!(
            status(&g, "/mcp", &[host, ("mcp-session-id", "3f1c")]),
            StatusCode::UNAUTHORIZED
        );
        let uri: Uri = "/mcp".parse().unwrap();
        let refused = g.check(&Method::POST, &uri, &headers(&[host])).unwrap_err();
        assert_eq!(
            refused.challenge.as_deref(),
            Some("Bearer realm=\"python-code-sandbox\"")
        );
        let response = refused.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Bearer"));
    }

    #[test]
    fn credentials_in_the_url_are_refused_even_with_the_header() {
        let g = gate(&[("SANDBOX_HTTP_TOKEN", TOKEN)], "127.0.0.1:8080");
        let auth = format!("Bearer {TOKEN}");
        let ok = [("host", "localhost:8080"), ("authorization", auth.as_str())];
        for uri in [
            format!("/mcp?access_token={TOKEN}"),
            format!("/mcp?x=1&Token={TOKEN}"),
            "/mcp?api_key=1".to_string(),
        ] {
            assert_eq!(status(&g, &uri, &ok), StatusCode::BAD_REQUEST, "{uri}");
        }
        assert_eq!(
            status(&g, "/mcp?access%5Ftoken=1", &ok),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(status(&g, "/mcp?a=1;TOKEN=2", &ok), StatusCode::BAD_REQUEST);
        assert_eq!(status(&g, "/mcp?tokens=1&x=%zz", &ok), StatusCode::OK);
    }

    #[test]
    fn hosts_default_to_loopback_and_the_bound_address() {
        let g = gate(&[], "127.0.0.1:8080");
        for host in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            assert_eq!(
                status(&g, "/mcp", &[("host", host)]),
                StatusCode::OK,
                "{host}"
            );
        }
        for host in [
            "evil.example:8080",
            "127.0.0.1.nip.io:8080",
            "10.0.0.1:8080",
        ] {
            assert_eq!(
                status(&g, "/mcp", &[("host", host)]),
                StatusCode::FORBIDDEN,
                "{host}"
            );
        }
        assert_eq!(status(&g, "/mcp", &[]), StatusCode::BAD_REQUEST);
        let g = gate(&[("SANDBOX_HTTP_TOKEN", TOKEN)], "10.1.2.3:8080");
        let auth = format!("Bearer {TOKEN}");
        assert_eq!(
            status(
                &g,
                "/mcp",
                &[("host", "10.1.2.3:8080"), ("authorization", &auth)]
            ),
            StatusCode::OK
        );
        let g = gate(
            &[("SANDBOX_HTTP_ALLOWED_HOSTS", "mcp.example.com:443")],
            "0.0.0.0:8080",
        );
        assert_eq!(
            status(&g, "/mcp", &[("host", "mcp.example.com:443")]),
            StatusCode::OK
        );
        assert_eq!(
            status(&g, "/mcp", &[("host", "mcp.example.com:80")]),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(&g, "/mcp", &[("host", "localhost")]),
            StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn origins_must_be_allowed_when_present() {
        let g = gate(
            &[("SANDBOX_HTTP_ALLOWED_ORIGINS", "https://app.example.com")],
            "127.0.0.1:8080",
        );
        let host = ("host", "localhost:8080");
        assert_eq!(status(&g, "/mcp", &[host]), StatusCode::OK, "no Origin");
        assert_eq!(
            status(&g, "/mcp", &[host, ("origin", "https://app.example.com")]),
            StatusCode::OK
        );
        for bad in [
            "https://evil.example",
            "http://app.example.com",
            "https://app.example.com:8443",
            "null",
            "garbage",
        ] {
            assert_eq!(
                status(&g, "/mcp", &[host, ("origin", bad)]),
                StatusCode::FORBIDDEN,
                "{bad}"
            );
        }
        let none = gate(&[], "127.0.0.1:8080");
        for own in [
            "http://localhost:8080",
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
        ] {
            assert_eq!(
                status(&none, "/mcp", &[host, ("origin", own)]),
                StatusCode::OK,
                "the server's own origin ({own}) is allowed by default"
            );
        }
        for other in [
            "http://localhost:9090",
            "http://localhost",
            "http://evil.example:8080",
            "http://127.0.0.1.nip.io:8080",
            "null",
        ] {
            assert_eq!(
                status(&none, "/mcp", &[host, ("origin", other)]),
                StatusCode::FORBIDDEN,
                "{other} is no origin of the server's"
            );
        }
    }

    #[test]
    fn repeated_headers_that_must_be_single_are_refused_first() {
        let g = gate(&[("SANDBOX_HTTP_TOKEN", TOKEN)], "127.0.0.1:8080");
        let auth = format!("Bearer {TOKEN}");
        let host = ("host", "127.0.0.1:8080");
        let ok = [host, ("authorization", auth.as_str())];
        assert_eq!(status(&g, "/mcp", &ok), StatusCode::OK);
        let uri: Uri = "/mcp".parse().unwrap();
        let refused = |pairs: &[(&str, &str)]| g.check(&Method::POST, &uri, &headers(pairs));
        // Two tokens, the right one first or last, or the same one twice: refused either way.
        for pairs in [
            vec![
                host,
                ("authorization", auth.as_str()),
                ("authorization", "Bearer x"),
            ],
            vec![
                host,
                ("authorization", "Bearer x"),
                ("authorization", auth.as_str()),
            ],
            vec![
                host,
                ("authorization", auth.as_str()),
                ("authorization", auth.as_str()),
            ],
        ] {
            let refusal = refused(&pairs).unwrap_err();
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
            assert!(
                refusal
                    .message
                    .contains("authorization header appears more than once"),
                "{}",
                refusal.message
            );
        }
        // Two Host headers, an allowed one first: 400, not judged by the first.
        let refusal = refused(&[
            host,
            ("host", "evil.example"),
            ("authorization", auth.as_str()),
        ])
        .unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
        assert!(
            refusal.message.contains("host header"),
            "{}",
            refusal.message
        );
        // Checked before everything else: no 401 or 403 for a request with no valid credential.
        assert_eq!(
            status(
                &g,
                "/mcp",
                &[("host", "evil.example"), ("host", "evil.example")]
            ),
            StatusCode::BAD_REQUEST
        );
        for name in [
            "origin",
            "mcp-session-id",
            "mcp-protocol-version",
            "content-type",
            "content-length",
        ] {
            let value = match name {
                "origin" => "http://127.0.0.1:8080",
                "content-length" => "2",
                "content-type" => "application/json",
                "mcp-protocol-version" => "2025-06-18",
                _ => "abc",
            };
            let mut pairs = ok.to_vec();
            pairs.push((name, value));
            assert_eq!(status(&g, "/mcp", &pairs), StatusCode::OK, "one {name}");
            pairs.push((name, value));
            assert_eq!(
                status(&g, "/mcp", &pairs),
                StatusCode::BAD_REQUEST,
                "two {name}"
            );
        }
    }

    #[test]
    fn an_announced_oversized_body_is_refused() {
        let g = gate(&[("SANDBOX_HTTP_MAX_BODY", "64k")], "127.0.0.1:8080");
        let host = ("host", "localhost:8080");
        assert_eq!(
            status(&g, "/mcp", &[host, ("content-length", "65536")]),
            StatusCode::OK
        );
        assert_eq!(
            status(&g, "/mcp", &[host, ("content-length", "65537")]),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn the_default_body_limit_leaves_room_for_the_largest_code() {
        let limit = Config::default().http.max_body_bytes as usize;
        assert!(limit >= crate::engine::MAX_CODE_BYTES + (2 << 20));
    }

    #[test]
    fn secrets_compare_by_content_only() {
        assert!(same_secret(TOKEN, TOKEN));
        assert!(!same_secret("", TOKEN));
        assert!(!same_secret(&TOKEN[1..], TOKEN));
        assert!(!same_secret(&TOKEN.to_uppercase(), TOKEN));
    }

    #[test]
    fn bind_addresses_parse_and_non_loopback_needs_a_token() {
        assert_eq!(
            parse_bind("localhost:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(parse_bind("[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
        assert!(parse_bind("8080").is_err());
        assert!(parse_bind("example.com:80").is_err());
        let open = Config::default();
        assert!(refuse_bind("127.0.0.1:8080".parse().unwrap(), &open).is_none());
        assert!(refuse_bind("[::1]:8080".parse().unwrap(), &open).is_none());
        let reason = refuse_bind("0.0.0.0:8080".parse().unwrap(), &open).unwrap();
        assert!(reason.contains("SANDBOX_HTTP_TOKEN"), "{reason}");
        let mut closed = Config::default();
        closed.http.token = Some(Secret::new(TOKEN));
        assert!(refuse_bind("0.0.0.0:8080".parse().unwrap(), &closed).is_none());
    }
}
