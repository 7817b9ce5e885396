//! Health, readiness and drain of `serve --http`.
//!
//! - `GET /healthz`: `200 ok` while the process serves HTTP (from the moment it listens).
//! - `GET /readyz`: `200 ready` once start-up is done, while the engine answers and has the
//!   sandbox image, and the server is not draining; `503 not ready` otherwise.
//!
//! Both are outside the token gate and say nothing more: no versions, no reasons (the log says
//! why the server is not ready). On SIGTERM the server drains: `/readyz` fails at once, requests
//! that would open a new MCP session get `503`, and the tool calls in progress get
//! `SANDBOX_DRAIN_TIMEOUT` to finish before the shutdown ends every MCP session.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::mcp_sessions::SESSION_HEADER;
use crate::engine::Engine;

pub const HEALTH_PATH: &str = "/healthz";
pub const READY_PATH: &str = "/readyz";

/// How long `/readyz` waits for the engine's answer.
const ENGINE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a drain looks whether the calls in progress have finished.
const DRAIN_POLL: Duration = Duration::from_millis(100);
/// After the last call, a drain waits until the MCP endpoint has been quiet this long: a client
/// that just got its result may still list the tools to check it, then end its session.
const DRAIN_LINGER: Duration = Duration::from_secs(1);

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const DRAINING: u8 = 2;

/// Where the server is in its life, and the engine `/readyz` asks.
pub struct Health {
    phase: tokio::sync::watch::Sender<u8>,
    engine: OnceLock<Arc<Engine>>,
    /// When the MCP endpoint last received a request.
    last_request: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health {
            phase: tokio::sync::watch::Sender::new(STARTING),
            engine: OnceLock::new(),
            last_request: std::sync::Mutex::new(None),
        })
    }

    fn phase(&self) -> u8 {
        *self.phase.borrow()
    }

    /// The engine is made (start-up goes on): `/readyz` asks it from now on.
    pub fn engine_made(&self, engine: Arc<Engine>) {
        let _ = self.engine.set(engine);
    }

    /// Start-up is done: MCP requests are served.
    pub fn serving(&self) {
        self.phase.send_if_modified(|phase| {
            let starting = *phase == STARTING;
            if starting {
                *phase = SERVING;
            }
            starting
        });
    }

    /// Draining from now on: `/readyz` fails and new MCP requests are refused.
    pub fn drain(&self) {
        self.phase.send_replace(DRAINING);
    }

    pub fn is_draining(&self) -> bool {
        self.phase() == DRAINING
    }

    fn note_request(&self) {
        *self
            .last_request
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    /// Whether the MCP endpoint has had no request for `quiet`.
    fn quiet_for(&self, quiet: Duration) -> bool {
        self.last_request
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|last| last.elapsed() >= quiet)
    }

    /// Waits until start-up is over (served or draining).
    async fn started(&self) {
        let mut phase = self.phase.subscribe();
        let _ = phase.wait_for(|phase| *phase != STARTING).await;
    }

    /// Whether the server is ready for traffic now (asks the engine).
    pub async fn is_ready(&self) -> bool {
        if self.phase() != SERVING {
            return false;
        }
        let Some(engine) = self.engine.get() else {
            return false;
        };
        let image = &engine.config().image;
        match tokio::time::timeout(ENGINE_CHECK_TIMEOUT, engine.backend().image_id(image)).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!("not ready: {e}");
                false
            }
            Err(_) => {
                tracing::warn!(
                    "not ready: the engine did not answer within {}s",
                    ENGINE_CHECK_TIMEOUT.as_secs()
                );
                false
            }
        }
    }
}

/// `/healthz` and `/readyz`, to be served outside the gate.
pub fn routes(health: Arc<Health>) -> axum::Router {
    axum::Router::new()
        .route(HEALTH_PATH, axum::routing::get(healthz))
        .route(READY_PATH, axum::routing::get(readyz))
        .with_state(health)
}

async fn healthz() -> Response {
    plain(StatusCode::OK, "ok")
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    if health.is_ready().await {
        plain(StatusCode::OK, "ready")
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// The layer in front of the MCP endpoint: a request that comes during start-up waits for its
/// end (as it would in the listen backlog); while the server drains, a request outside the MCP
/// sessions already open gets `503`. Those sessions are still served: a client finishing its
/// call may list the tools to check the result, then close its session.
pub async fn admit(State(health): State<Arc<Health>>, request: Request, next: Next) -> Response {
    health.started().await;
    health.note_request();
    if health.is_draining() && !request.headers().contains_key(SESSION_HEADER) {
        let mut response = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable: the server is shutting down; retry on another instance",
        );
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    next.run(request).await
}

/// Drains: marks the server draining, then waits until no tool call is in progress and, since
/// the last one ended, the MCP endpoint has been quiet for [`DRAIN_LINGER`], or `limit`. Returns how many calls were still
/// running when it stopped waiting.
pub async fn drain(health: &Health, limit: Duration) -> i64 {
    health.drain();
    let in_flight = || super::metrics::global().in_flight();
    let waited = tokio::time::timeout(limit, async {
        // The linger counts from the end of the last call, and again from each later request.
        let mut calls_ended: Option<std::time::Instant> = None;
        loop {
            if in_flight() > 0 {
                calls_ended = None;
            } else {
                let ended = *calls_ended.get_or_insert_with(std::time::Instant::now);
                if ended.elapsed() >= DRAIN_LINGER && health.quiet_for(DRAIN_LINGER) {
                    return;
                }
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    })
    .await;
    match waited {
        Ok(()) => 0,
        Err(_) => in_flight(),
    }
}

fn plain(status: StatusCode, text: &str) -> Response {
    let mut response = Response::new(Body::from(format!("{text}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn not_ready_while_starting_or_draining() {
        let health = Health::new();
        assert!(!health.is_ready().await, "starting");
        health.serving();
        // Serving without an engine to ask: not ready either.
        assert!(!health.is_ready().await);
        health.drain();
        assert!(health.is_draining());
        // Start-up ending after the signal does not undo the drain.
        health.serving();
        assert!(health.is_draining());
        assert!(!health.is_ready().await);
    }

    #[tokio::test]
    async fn a_drain_with_no_call_in_progress_ends_after_the_linger() {
        let health = Health::new();
        let left = tokio::time::timeout(
            Duration::from_secs(60),
            drain(&health, Duration::from_secs(30)),
        )
        .await;
        assert_eq!(left.ok(), Some(0));
        assert!(health.is_draining());
    }
}
