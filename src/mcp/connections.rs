//! The connections of `serve --http`: accepted up to a cap, each served by hyper's HTTP/1.1
//! connection with a deadline for its request heads and a watch for silence.
//!
//! - **Cap** (`SANDBOX_HTTP_MAX_CONNECTIONS`): with that many connections open the server stops
//!   accepting until one closes. Connections beyond it wait in the kernel's listen backlog, which
//!   costs the server nothing per connection; they are served in turn as slots free up (with the
//!   header timeout, a slot held by a stalled client frees within seconds). Refusing them instead
//!   would make the server accept and answer every one, work an attacker controls, and turn a
//!   short delay for honest clients into a failure.
//! - **Header timeout** (`SANDBOX_HTTP_HEADER_TIMEOUT`): a connection that has not sent a complete
//!   request head this long after it opened, or after its previous response ended, is closed
//!   (hyper's `header_read_timeout`): half-open connections and idle keep-alive ones go. While
//!   they last, each costs about 15 KB (500 half-open: VmRSS 12 MB -> 19 MB, release build).
//! - **Idle timeout** (`SANDBOX_HTTP_IDLE_TIMEOUT`): a connection on which no byte moved in
//!   either direction this long is closed, whatever it was doing: a body that stalls, a client
//!   that stopped reading its responses. Streams in progress are not silent: rmcp sends an SSE
//!   ping every 15 s, so a long tool call keeps its connection.

use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The connection limits, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl ConnectionLimits {
    pub fn from_config(http: &crate::config::HttpPolicy) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: http.header_timeout,
            idle_timeout: http.idle_timeout,
            max_connections: http.max_connections,
        }
    }
}

/// Accepts and serves connections with `app` until `stop` is cancelled; then stops accepting,
/// asks every connection to close after its request in progress, and returns once all have.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut warned_full = false;
    loop {
        if slots.available_permits() == 0 && !warned_full {
            tracing::warn!(
                "{} HTTP connections are open, the most served at once (SANDBOX_HTTP_MAX_CONNECTIONS): \
                 new ones wait until one closes",
                limits.max_connections
            );
            warned_full = true;
        }
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed
            },
            () = stop.cancelled() => break,
        };
        if slots.available_permits() > 0 {
            warned_full = false;
        }
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of descriptors or memory, or a connection reset before it was
                    // accepted: wait a moment instead of spinning, and go on.
                    tracing::warn!("accepting an HTTP connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (app, stop) = (app.clone(), stop.clone());
        connections.spawn(async move {
            serve_connection(stream, app, limits, stop).await;
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

async fn serve_connection(
    stream: TcpStream,
    app: axum::Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let start = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched {
        inner: stream,
        start,
        activity: activity.clone(),
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut connection = pin!(builder.serve_connection(io, TowerToHyperService::new(app)));
    let mut closing = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!("HTTP connection ended: {e}");
                }
                return;
            }
            () = stop.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = silence(start, &activity, limits.idle_timeout) => {
                tracing::debug!(
                    "closing an HTTP connection silent for {}s (SANDBOX_HTTP_IDLE_TIMEOUT)",
                    limits.idle_timeout.as_secs()
                );
                return;
            }
        }
    }
}

/// Resolves once nothing has moved on the connection for `idle`.
async fn silence(start: Instant, activity: &AtomicU64, idle: Duration) {
    loop {
        let last = start + Duration::from_millis(activity.load(Ordering::Relaxed));
        let deadline = last + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A connection's stream that notes when bytes last moved.
struct Watched {
    inner: TcpStream,
    start: Instant,
    /// Milliseconds from `start` to the last read or write that moved bytes.
    activity: Arc<AtomicU64>,
}

impl Watched {
    fn moved(&self) {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.activity.store(elapsed, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.moved();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.moved();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.moved();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
