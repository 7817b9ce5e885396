//! The MCP sessions of `serve --http`: how many may live, and when one that owns nothing ends.
//!
//! Over HTTP every MCP session is a client of its own (a random id, its own sandbox sessions),
//! and every holder of the one token can open as many as it likes. So the limits are on the
//! server, not on a "client" it cannot tell apart:
//!
//! - at most `SANDBOX_HTTP_MAX_MCP_SESSIONS` live at once: beyond it a new `initialize` gets
//!   HTTP 429 with a JSON-RPC error naming the limit, and the sessions already open go on. The
//!   count and the creation are one step (handshakes are taken one at a time), so concurrent
//!   `initialize`s cannot overshoot it;
//! - a session that owns no sandbox session and has no request in progress ends after
//!   `SANDBOX_HTTP_MCP_IDLE_TIMEOUT` without a request, so sessions opened and forgotten free
//!   their place soon. The others keep rmcp's longer expiry (the sandbox sessions' idle limit),
//!   which protects the state they hold.
//!
//! A request "in progress" is a POST whose response is still being sent (a tool call's stream);
//! a GET stream that only listens for notifications does not count.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::sessions::{ClientId, Scope};
use crate::engine::Engine;

/// The header that names a request's MCP session.
pub const SESSION_HEADER: &str = "mcp-session-id";

tokio::task_local! {
    /// The client of the server made while an `initialize` is handled, on that request's task.
    static OPENING: RefCell<Option<ClientId>>;
}

/// Notes the client of a server just made for an MCP session (called by the service factory);
/// outside an `initialize` the gate let through, nothing happens.
pub fn note_client(client: &ClientId) {
    let _ = OPENING.try_with(|slot| *slot.borrow_mut() = Some(client.clone()));
}

pub struct McpSessions {
    manager: Arc<LocalSessionManager>,
    engine: Arc<Engine>,
    max: usize,
    idle_unowned: Duration,
    /// Held while a session may be created, so counting and creating are one step.
    opening: tokio::sync::Mutex<()>,
    live: Mutex<HashMap<String, Tracked>>,
}

struct Tracked {
    /// The client of the session's server; `None` (not learnt): it never expires early.
    client: Option<ClientId>,
    /// The principal that opened it, when the server tells callers apart: only it may use it.
    principal: Option<String>,
    last_request: Instant,
    in_progress: usize,
}

impl McpSessions {
    pub fn new(
        manager: Arc<LocalSessionManager>,
        engine: Arc<Engine>,
        max: usize,
        idle_unowned: Duration,
    ) -> Arc<McpSessions> {
        Arc::new(McpSessions {
            manager,
            engine,
            max,
            idle_unowned,
            opening: tokio::sync::Mutex::new(()),
            live: Mutex::default(),
        })
    }

    /// Runs a request that may open an MCP session (`initialize` without a session id): refused
    /// with 429 when `max` sessions live, else handled, and the session it opened tracked.
    pub async fn open(
        &self,
        request_id: Option<serde_json::Value>,
        handle: impl Future<Output = Response>,
    ) -> Response {
        let _one_at_a_time = self.opening.lock().await;
        let live = self.manager.sessions.read().await.len();
        if live >= self.max {
            tracing::warn!(
                "refused a new MCP session: {live} are open, the most allowed (SANDBOX_HTTP_MAX_MCP_SESSIONS)"
            );
            return too_many_sessions(self.max, request_id);
        }
        let (response, client) = OPENING
            .scope(RefCell::new(None), async {
                let response = handle.await;
                (response, OPENING.with(|slot| slot.borrow_mut().take()))
            })
            .await;
        if let Some(id) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            self.lock_live().insert(
                id.to_string(),
                Tracked {
                    client,
                    principal: super::principals::current().map(|p| p.name.clone()),
                    last_request: Instant::now(),
                    in_progress: 0,
                },
            );
        }
        response
    }

    /// Whether `principal` may use session `id`: the one that opened it (a session this gate
    /// does not know is rmcp's to answer).
    pub fn admits(&self, id: &str, principal: Option<&str>) -> bool {
        self.lock_live()
            .get(id)
            .is_none_or(|tracked| tracked.principal.as_deref() == principal)
    }

    /// Notes a request to session `id`; a POST's response counts as in progress until its body
    /// is sent or dropped.
    pub fn track(self: &Arc<Self>, id: &str, post: bool, response: Response) -> Response {
        {
            let mut live = self.lock_live();
            let Some(tracked) = live.get_mut(id) else {
                return response;
            };
            tracked.last_request = Instant::now();
            if !post {
                return response;
            }
            tracked.in_progress += 1;
        }
        let guard = InProgress {
            sessions: self.clone(),
            id: id.to_string(),
        };
        let (parts, body) = response.into_parts();
        Response::from_parts(
            parts,
            Body::new(Guarded {
                inner: body,
                _guard: guard,
            }),
        )
    }

    /// Ends, every little while, the sessions that own nothing and were left idle; forgets the
    /// ones rmcp has ended. Stops with `stop`.
    pub fn spawn_reaper(self: &Arc<Self>, stop: CancellationToken) {
        let sessions = Arc::downgrade(self);
        let tick =
            (self.idle_unowned / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(tick) => {}
                    () = stop.cancelled() => return,
                }
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                sessions.reap().await;
            }
        });
    }

    async fn reap(&self) {
        let candidates: Vec<(String, bool)> =
            self.lock_live()
                .iter()
                .map(|(id, t)| {
                    let idle = t.in_progress == 0 && t.last_request.elapsed() >= self.idle_unowned;
                    let owns_nothing = t.client.as_ref().is_some_and(|client| {
                        self.engine.sessions(Scope::Client(client)).is_empty()
                    });
                    (id.clone(), idle && owns_nothing)
                })
                .collect();
        for (id, expired) in candidates {
            let key: Arc<str> = id.as_str().into();
            if !self.manager.has_session(&key).await.unwrap_or(false) {
                self.lock_live().remove(&id);
                continue;
            }
            if !expired {
                continue;
            }
            // Look again under the lock: a request may have arrived meanwhile.
            let still = self.lock_live().get(&id).is_some_and(|t| {
                t.in_progress == 0 && t.last_request.elapsed() >= self.idle_unowned
            });
            if !still {
                continue;
            }
            self.lock_live().remove(&id);
            tracing::info!(
                "an MCP session with no sandbox session was idle for {}s: ending it (SANDBOX_HTTP_MCP_IDLE_TIMEOUT)",
                self.idle_unowned.as_secs()
            );
            if let Err(e) = self.manager.close_session(&key).await {
                tracing::warn!("ending an idle MCP session failed: {e}");
            }
        }
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The answer to an `initialize` beyond the cap: HTTP 429 and a JSON-RPC error.
fn too_many_sessions(max: usize, request_id: Option<serde_json::Value>) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": request_id.unwrap_or(serde_json::Value::Null),
        "error": {
            "code": -32000,
            "message": format!(
                "Too many MCP sessions: this server keeps at most {max} open at once \
                 (SANDBOX_HTTP_MAX_MCP_SESSIONS). End sessions you no longer use (HTTP DELETE \
                 with their Mcp-Session-Id) or wait for idle ones to expire, then retry; the \
                 operator can raise the limit."
            ),
        },
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A POST of a session in progress: counted until dropped.
struct InProgress {
    sessions: Arc<McpSessions>,
    id: String,
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if let Some(tracked) = self.sessions.lock_live().get_mut(&self.id) {
            tracked.in_progress = tracked.in_progress.saturating_sub(1);
            tracked.last_request = Instant::now();
        }
    }
}

/// A response body that holds a guard until it is sent or dropped.
struct Guarded {
    inner: Body,
    _guard: InProgress,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
