//! The proxy container's life, and the conversation with it: one JSON document a line on its
//! attached stdin (the server's answers, requests for byte counts) and stdout (its questions and
//! reports; see `python/egress_proxy.py`).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::sources::{Decision, Role, SessionNetwork, Sources};
use crate::config::Config;
use crate::engine::backend::{Backend, OutputChunk, OutputStream, SandboxId, SandboxSpec};
use crate::engine::outcome::NetworkEntry;
use crate::engine::EngineError;

/// A line from the proxy longer than this is dropped (its lines are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

type Flushes = Mutex<HashMap<u64, oneshot::Sender<Vec<(u64, u64, u64)>>>>;

/// The server's egress proxy and its network.
pub struct Gateway {
    /// The internal network sandboxes join.
    pub network: String,
    /// The proxy's address on it.
    pub address: String,
    proxy: SandboxId,
    backend: Arc<dyn Backend>,
    sources: Arc<Sources>,
    to_proxy: mpsc::UnboundedSender<String>,
    flushes: Arc<Flushes>,
    next_flush: AtomicU64,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// A sandbox spec's place on the egress network: the gateway, and what the sandbox runs.
#[derive(Clone)]
pub struct Attachment {
    pub gateway: Arc<Gateway>,
    pub role: Role,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("network", &self.gateway.network)
            .finish_non_exhaustive()
    }
}

/// A sandbox's adoption under its address; dropping it (the sandbox is gone) forgets it.
pub struct Lease {
    gateway: Arc<Gateway>,
    address: String,
    generation: u64,
}

impl Lease {
    pub fn address(&self) -> &str {
        &self.address
    }

    /// What the sandbox runs, as adopted (and bound since).
    pub fn role(&self) -> Option<Role> {
        self.gateway.sources.role_of(&self.address, self.generation)
    }

    /// Binds a session's consents to this sandbox.
    pub fn bind(&self, session: &Arc<SessionNetwork>) {
        self.gateway
            .sources
            .bind_session(&self.address, self.generation, session);
    }

    /// What the sandbox tried since the last record (open connections counted up to now).
    pub async fn record(&self) -> Vec<NetworkEntry> {
        let flush = self.gateway.next_flush.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.gateway.flushes).insert(flush, tx);
        let asked = self
            .gateway
            .to_proxy
            .send(json!({"flush": flush, "src": self.address}).to_string())
            .is_ok();
        if asked {
            if let Ok(Ok(open)) = tokio::time::timeout(Duration::from_secs(2), rx).await {
                self.gateway.sources.update_open(&self.address, &open);
            }
        }
        lock(&self.gateway.flushes).remove(&flush);
        self.gateway.sources.take_record(&self.address)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.gateway.sources.forget(&self.address, self.generation);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the proxy says.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum FromProxy {
    Listening,
    Ask {
        q: u64,
        conn: u64,
        src: String,
        host: String,
        port: u16,
    },
    Resolved {
        q: u64,
        conn: u64,
        host: String,
        port: u16,
        addresses: Vec<String>,
    },
    Closed {
        conn: u64,
        sent: u64,
        received: u64,
        error: Option<String>,
    },
    Flushed {
        flush: u64,
        open: Vec<(u64, u64, u64)>,
    },
}

impl Gateway {
    /// Creates the network, starts the proxy on it and on the uplink, and waits until it listens.
    /// On failure nothing is left behind.
    pub async fn start(
        backend: Arc<dyn Backend>,
        base: &SandboxSpec,
        config: &Config,
    ) -> Result<Arc<Gateway>, EngineError> {
        let network = format!("pcs-egress-{}", uuid::Uuid::new_v4().simple());
        backend.create_network(&network, true, &base.labels).await?;
        let mut spec = base.clone();
        spec.network = crate::config::NetworkPolicy::Bridge;
        spec.network_name = Some(config.egress.uplink.clone());
        spec.volumes = Vec::new();
        spec.mounts = Vec::new();
        spec.maintenance = false;
        spec.env = Vec::new();
        spec.ca_bundle = None;
        // gVisor may be registered without networking: the proxy needs it, and runs only our code.
        spec.runtime = None;
        spec.command = super::proxy_command(config);
        let mut proxy = None;
        let started = async {
            let id = backend.create(&spec).await?;
            proxy = Some(id.clone());
            backend.connect_network(&id, &network).await?;
            let streams = backend.start(&id).await?;
            let address = backend.address_on(&id, &network).await?;
            Ok::<_, EngineError>((id, streams, address))
        }
        .await;
        let (id, streams, address) = match started {
            Ok(started) => started,
            Err(e) => {
                if let Some(id) = &proxy {
                    let _ = backend.destroy(id).await;
                }
                let _ = backend.remove_network(&network).await;
                return Err(e);
            }
        };
        let sources = Arc::new(Sources::new(
            config.egress.clone(),
            super::index_policy(config),
        ));
        let (to_proxy, mut outgoing) = mpsc::unbounded_channel::<String>();
        let flushes: Arc<Flushes> = Arc::default();
        let (ready_tx, ready_rx) = oneshot::channel();
        let mut input = streams.input;
        let writer = tokio::spawn(async move {
            while let Some(mut line) = outgoing.recv().await {
                line.push('\n');
                if input.write_all(line.as_bytes()).await.is_err() || input.flush().await.is_err() {
                    break;
                }
            }
        });
        let reader = tokio::spawn(converse(
            streams.output,
            sources.clone(),
            to_proxy.clone(),
            flushes.clone(),
            ready_tx,
        ));
        let gateway = Arc::new(Gateway {
            network,
            address,
            proxy: id,
            backend,
            sources,
            to_proxy,
            flushes,
            next_flush: AtomicU64::new(1),
            tasks: Mutex::new(vec![writer, reader]),
        });
        match tokio::time::timeout(Duration::from_secs(30), ready_rx).await {
            Ok(Ok(())) => Ok(gateway),
            _ => {
                gateway.stop().await;
                Err(EngineError::Egress(
                    "the egress proxy did not start (it did not say it listens within 30 s)".into(),
                ))
            }
        }
    }

    /// Adopts a sandbox started on the network at `address`.
    pub fn lease(self: &Arc<Self>, address: String, role: Role) -> Lease {
        let generation = self.sources.adopt(&address, role);
        Lease {
            gateway: self.clone(),
            address,
            generation,
        }
    }

    /// The environment that sends a sandbox's traffic to the proxy.
    pub fn proxy_env(&self) -> Vec<String> {
        super::proxy_env(&self.address)
    }

    /// Removes the proxy and the network (sandboxes still on it keep the removal from
    /// succeeding: the shutdown's sweep removes them first, and the network after).
    pub async fn stop(&self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        if let Err(e) = self.backend.destroy(&self.proxy).await {
            tracing::warn!("could not remove the egress proxy: {e}");
        }
        if let Err(e) = self.backend.remove_network(&self.network).await {
            tracing::debug!("the egress network is not removed yet: {e}");
        }
    }
}

/// Reads the proxy's lines and answers them, until its output ends.
async fn converse(
    mut output: OutputStream,
    sources: Arc<Sources>,
    to_proxy: mpsc::UnboundedSender<String>,
    flushes: Arc<Flushes>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(chunk) = output.next().await {
        let bytes = match chunk {
            Ok(OutputChunk::Stdout(bytes)) => bytes,
            Ok(OutputChunk::Stderr(bytes)) => {
                tracing::debug!(
                    "egress proxy: {}",
                    String::from_utf8_lossy(&bytes).trim_end()
                );
                continue;
            }
            Err(e) => {
                tracing::warn!("the egress proxy's output ended: {e}");
                break;
            }
        };
        buffer.extend_from_slice(&bytes);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match serde_json::from_slice::<FromProxy>(&line) {
                Ok(FromProxy::Listening) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(message) => answer(message, &sources, &to_proxy, &flushes),
                Err(e) => tracing::debug!("unreadable line from the egress proxy: {e}"),
            }
        }
        if buffer.len() > MAX_LINE {
            tracing::warn!("the egress proxy wrote an overlong line: dropped");
            buffer.clear();
        }
    }
    tracing::debug!("the egress proxy's conversation ended");
}

fn reply(to_proxy: &mpsc::UnboundedSender<String>, q: u64, verdict: Result<(), String>) {
    let line = match verdict {
        Ok(()) => json!({"a": q, "ok": true}),
        Err(why) => json!({"a": q, "ok": false, "why": why}),
    };
    let _ = to_proxy.send(line.to_string());
}

fn answer(
    message: FromProxy,
    sources: &Sources,
    to_proxy: &mpsc::UnboundedSender<String>,
    flushes: &Flushes,
) {
    match message {
        FromProxy::Listening => {}
        FromProxy::Ask {
            q,
            conn,
            src,
            host,
            port,
        } => match sources.decide(&src, conn, &host, port) {
            Decision::Allow => reply(to_proxy, q, Ok(())),
            Decision::Refuse(why) => reply(to_proxy, q, Err(why)),
            Decision::RefuseAndAsk {
                reason,
                session,
                asker,
                host,
                port,
            } => {
                reply(to_proxy, q, Err(reason));
                tokio::spawn(async move {
                    let answer = asker.ask(&host, port).await;
                    tracing::info!(host, port, ?answer, "the user answered a network request");
                    session.answer(&host, port, &answer);
                });
            }
        },
        FromProxy::Resolved {
            q,
            conn,
            host,
            port,
            addresses,
        } => {
            let src = sources.source_of(conn);
            let parsed: Result<Vec<IpAddr>, _> = addresses
                .iter()
                .map(|a| a.split('%').next().unwrap_or(a).parse::<IpAddr>())
                .collect();
            let verdict = match (src, parsed) {
                (Some(src), Ok(addresses)) => {
                    sources.check_resolved(&src, conn, &host, port, &addresses)
                }
                (None, _) => Err("unknown connection".to_string()),
                (_, Err(_)) => Err(format!("{host} resolved to something not an address")),
            };
            reply(to_proxy, q, verdict);
        }
        FromProxy::Closed {
            conn,
            sent,
            received,
            error,
        } => sources.closed(conn, sent, received, error.as_deref()),
        FromProxy::Flushed { flush, open } => {
            if let Some(tx) = lock(flushes).remove(&flush) {
                let _ = tx.send(open);
            }
        }
    }
}
