//! The proxy container's life, the sandboxes' own networks, and the conversation with the proxy:
//! one JSON document a line on its attached stdin (the server's answers, requests for byte
//! counts) and stdout (its questions and reports; see `python/egress_proxy.py`).
//!
//! Every sandbox on the egress gets an `--internal` network of its own (a /29 out of
//! `SANDBOX_EGRESS_SUBNETS`, without an address of the host on it) holding only itself and the
//! proxy: sandboxes cannot reach each other, and each one's source address names it.

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
use crate::config::egress::SANDBOX_SUBNET_PREFIX;
use crate::config::Config;
use crate::engine::backend::{Backend, OutputChunk, OutputStream, SandboxId, SandboxSpec};
use crate::engine::outcome::{NetworkEntry, NoAnswer, Stopped};
use crate::engine::EngineError;

/// A line from the proxy longer than this is dropped (its lines are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

type Flushes = Mutex<HashMap<u64, oneshot::Sender<Vec<(u64, u64, u64)>>>>;

/// The server's egress proxy.
pub struct Gateway {
    proxy: SandboxId,
    labels: std::collections::BTreeMap<String, String>,
    subnets: Mutex<Subnets>,
    backend: Arc<dyn Backend>,
    sources: Arc<Sources>,
    to_proxy: mpsc::UnboundedSender<String>,
    flushes: Arc<Flushes>,
    next_flush: AtomicU64,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// One sandbox's own network, with the proxy on it.
#[derive(Debug, Clone)]
pub struct EgressNetwork {
    pub name: String,
    /// The proxy's address on it.
    pub proxy_address: String,
    subnet: u32,
}

/// The subnets of `SANDBOX_EGRESS_SUBNETS` this server's networks use.
struct Subnets {
    range: ipnet::Ipv4Net,
    next: u32,
    in_use: std::collections::HashSet<u32>,
}

impl Subnets {
    fn count(&self) -> u32 {
        1u32 << SANDBOX_SUBNET_PREFIX.saturating_sub(self.range.prefix_len())
    }

    /// The next free subnet after the last one handed out (another server may hold it: the
    /// engine then refuses it, and the caller asks again).
    fn take(&mut self) -> Option<(u32, String)> {
        let count = self.count();
        for _ in 0..count {
            let index = self.next % count;
            self.next = self.next.wrapping_add(1);
            if self.in_use.insert(index) {
                let base =
                    u32::from(self.range.network()) + (index << (32 - SANDBOX_SUBNET_PREFIX));
                let net = format!("{}/{SANDBOX_SUBNET_PREFIX}", std::net::Ipv4Addr::from(base));
                return Some((index, net));
            }
        }
        None
    }
}

/// A sandbox's place on the egress: the gateway, its own network, and what the sandbox runs.
#[derive(Clone)]
pub struct Attachment {
    pub gateway: Arc<Gateway>,
    pub network: EgressNetwork,
    pub role: Role,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("network", &self.network.name)
            .finish_non_exhaustive()
    }
}

/// A sandbox's adoption under its address; dropping it (the sandbox is gone) forgets it and
/// removes its network.
pub struct Lease {
    gateway: Arc<Gateway>,
    network: EgressNetwork,
    address: String,
    generation: u64,
    released: bool,
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

    /// The sandbox is gone: forgets it and removes its network.
    pub async fn release(mut self) {
        if self.forget() {
            self.gateway.close(&self.network).await;
        }
    }

    /// Forgets the sandbox (once); whether its network is left to remove (a renewed lease, a
    /// restart that changed the address, keeps it).
    fn forget(&mut self) -> bool {
        if std::mem::replace(&mut self.released, true) {
            return false;
        }
        self.gateway.sources.forget(&self.address, self.generation);
        !self.gateway.sources.network_in_use(&self.network.name)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Not released (the sandbox was abandoned): its network goes in the background, and the
        // shutdown removes what is left.
        if !self.forget() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (gateway, network) = (self.gateway.clone(), self.network.clone());
            runtime.spawn(async move { gateway.close(&network).await });
        }
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
        /// What kept the connection from being made, as a word (see [`failure_of`]).
        #[serde(default)]
        failure: Option<String>,
    },
    Flushed {
        flush: u64,
        open: Vec<(u64, u64, u64)>,
    },
}

impl Gateway {
    /// Starts the proxy on the uplink and waits until it listens. On failure nothing is left
    /// behind.
    pub async fn start(
        backend: Arc<dyn Backend>,
        base: &SandboxSpec,
        config: &Config,
    ) -> Result<Arc<Gateway>, EngineError> {
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
            let streams = backend.start(&id).await?;
            Ok::<_, EngineError>((id, streams))
        }
        .await;
        let (id, streams) = match started {
            Ok(started) => started,
            Err(e) => {
                if let Some(id) = &proxy {
                    let _ = backend.destroy(id).await;
                }
                return Err(EngineError::Egress(format!(
                    "it cannot start on the uplink network {:?} (SANDBOX_EGRESS_UPLINK: does the \
                     engine have that network, and does it run?): {e}",
                    config.egress.uplink
                )));
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
            proxy: id,
            labels: base.labels.clone(),
            subnets: Mutex::new(Subnets {
                range: config.egress.subnets,
                next: rand_start(),
                in_use: Default::default(),
            }),
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

    /// A new network for one sandbox, with the proxy on it.
    pub async fn open(&self) -> Result<EgressNetwork, EngineError> {
        let mut last_error = None;
        // Another server on the engine may hold a subnet: the engine refuses it, try the next.
        for _ in 0..32 {
            let Some((index, subnet)) = lock(&self.subnets).take() else {
                break;
            };
            let name = format!("pcs-egress-{}", uuid::Uuid::new_v4().simple());
            if let Err(e) = self
                .backend
                .create_network(&name, true, Some(&subnet), &self.labels)
                .await
            {
                tracing::debug!(subnet, "egress subnet refused: {e}");
                last_error = Some(e);
                // Left marked as in use: someone else has it.
                continue;
            }
            let network = EgressNetwork {
                name,
                proxy_address: String::new(),
                subnet: index,
            };
            let connected = async {
                self.backend
                    .connect_network(&self.proxy, &network.name)
                    .await?;
                self.backend.address_on(&self.proxy, &network.name).await
            }
            .await;
            return match connected {
                Ok(proxy_address) => Ok(EgressNetwork {
                    proxy_address,
                    ..network
                }),
                Err(e) => {
                    self.close(&network).await;
                    Err(e.into())
                }
            };
        }
        Err(EngineError::Egress(match last_error {
            Some(e) => format!(
                "no free subnet for a sandbox's egress network in SANDBOX_EGRESS_SUBNETS: {e}"
            ),
            None => "every subnet of SANDBOX_EGRESS_SUBNETS is in use".into(),
        }))
    }

    /// Removes a sandbox's network (once the sandbox is gone).
    pub async fn close(&self, network: &EgressNetwork) {
        let _ = self
            .backend
            .disconnect_network(&self.proxy, &network.name)
            .await;
        match self.backend.remove_network(&network.name).await {
            Ok(()) => {
                lock(&self.subnets).in_use.remove(&network.subnet);
            }
            Err(e) => tracing::debug!(network = %network.name, "not removed yet: {e}"),
        }
    }

    /// Adopts a sandbox started on `network` at `address`.
    pub fn lease(self: &Arc<Self>, network: EgressNetwork, address: String, role: Role) -> Lease {
        let generation = self.sources.adopt(&address, &network.name, role);
        Lease {
            gateway: self.clone(),
            network,
            address,
            generation,
            released: false,
        }
    }

    /// Removes the proxy (the shutdown's sweep has removed the sandboxes; their networks go
    /// with the instance's storage after).
    pub async fn stop(&self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        if let Err(e) = self.backend.destroy(&self.proxy).await {
            tracing::warn!("could not remove the egress proxy: {e}");
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
            Decision::Refuse(why) | Decision::Pending(why) => reply(to_proxy, q, Err(why)),
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
            failure,
        } => sources.closed(
            conn,
            sent,
            received,
            error.as_deref(),
            failure.as_deref().and_then(failure_of),
        ),
        FromProxy::Flushed { flush, open } => {
            if let Some(tx) = lock(flushes).remove(&flush) {
                let _ = tx.send(open);
            }
        }
    }
}

/// The proxy's word for why it could not make an allowed connection.
fn failure_of(word: &str) -> Option<Stopped> {
    Some(match word {
        "refused" => Stopped::NoAnswer(NoAnswer::Refused),
        "timeout" => Stopped::NoAnswer(NoAnswer::TimedOut),
        "unreachable" => Stopped::NoAnswer(NoAnswer::Unreachable),
        "unresolved" => Stopped::Unresolved,
        _ => return None,
    })
}

/// Where a server starts looking for free subnets: servers sharing an engine rarely collide.
fn rand_start() -> u32 {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxys_closing_words_are_read_as_data() {
        let line = br#"{"op":"closed","conn":7,"sent":0,"received":0,"error":"cannot connect to h:1: x","failure":"refused"}"#;
        let Ok(FromProxy::Closed { failure, .. }) = serde_json::from_slice::<FromProxy>(line)
        else {
            panic!("a closed report")
        };
        assert_eq!(
            failure.as_deref().and_then(failure_of),
            Some(Stopped::NoAnswer(NoAnswer::Refused))
        );
        // An older proxy's report, without the word, still reads.
        let line = br#"{"op":"closed","conn":7,"sent":1,"received":2,"error":null}"#;
        assert!(matches!(
            serde_json::from_slice::<FromProxy>(line),
            Ok(FromProxy::Closed { failure: None, .. })
        ));
        assert_eq!(
            failure_of("timeout"),
            Some(Stopped::NoAnswer(NoAnswer::TimedOut))
        );
        assert_eq!(failure_of("unresolved"), Some(Stopped::Unresolved));
        assert_eq!(failure_of("anything else"), None);
    }
}
