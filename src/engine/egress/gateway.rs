//! The proxy container's life, the sandboxes' own networks, and the conversation with the proxy's
//! relay: one JSON document a line on its attached stdin (the server's answers, requests for the
//! log so far) and stdout (Squid's questions and access log lines; see `python/egress_relay.py`
//! and [`super::squid`]).
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

use super::broker::Request;
use super::sources::{Decision, Role, SessionNetwork, Sources};
use super::squid::{self, Tag};
use crate::config::egress::SANDBOX_SUBNET_PREFIX;
use crate::config::Config;
use crate::engine::backend::{Backend, OutputChunk, OutputStream, SandboxId, SandboxSpec};
use crate::engine::outcome::{NetworkEntry, NoAnswer, Stopped};
use crate::engine::EngineError;

/// A line from the proxy longer than this is dropped (its lines are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

type Flushes = Mutex<HashMap<u64, oneshot::Sender<()>>>;

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
    /// The proxy's CA certificate (PEM), with secrets: the code's sandboxes trust it.
    ca: Arc<Mutex<Option<String>>>,
    /// The bundle the code's sandboxes trust with secrets: the host's and the proxy's CA, in a
    /// file of this server's (removed with the proxy).
    trust: Mutex<Option<std::path::PathBuf>>,
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
    /// The secrets the proxy adds to this sandbox's requests (none for an installer).
    pub secrets: Arc<crate::config::secrets::Secrets>,
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
            // The relay answers once the sandbox's finished requests are logged (a moment).
            let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
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

/// What the relay says: Squid's questions, its access log, and its answers to the server.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum FromProxy {
    /// Squid accepts connections; the networks it will never reach (the relay's list), and with
    /// secrets the proxy's CA certificate (PEM; its key stays in the proxy).
    Listening {
        #[serde(default)]
        forbidden: Vec<String>,
        #[serde(default)]
        ca: Option<String>,
    },
    /// Squid asks whether the request (its transaction `conn`) may go.
    Ask {
        q: u64,
        conn: Option<u64>,
        src: String,
        host: String,
        port: u16,
        #[serde(default)]
        method: String,
        /// Its `Host` header.
        #[serde(default)]
        host_header: Option<String>,
        /// The SNI of the bumped tunnel it came through.
        #[serde(default)]
        sni: Option<String>,
        /// The values of the headers the proxy can set, as the request sent them (see
        /// [`super::squid::secret_headers`]).
        #[serde(default)]
        sent: Vec<Option<String>>,
    },
    /// Squid asks whether a tunnel whose TLS hello names `sni` may be bumped.
    Sni {
        q: u64,
        src: String,
        host: String,
        port: u16,
        #[serde(default)]
        sni: Option<String>,
    },
    /// A request ended (see the `logformat` in [`super::squid`]).
    Logged(Logged),
    Flushed {
        flush: u64,
    },
}

/// One access log line of Squid's: a request that ended, and how.
#[derive(Deserialize, Debug)]
struct Logged {
    conn: Option<u64>,
    src: String,
    host: String,
    port: u16,
    /// The status Squid answered the sandbox with (0: none).
    status: u16,
    sent: u64,
    received: u64,
    /// Squid's error page name (ours for refusals, see [`super::squid`]).
    error: Option<String>,
    /// Squid's detail of the error (`errno=111`).
    detail: Option<String>,
    /// Where the relay found the name resolves (only for an address refusal).
    #[serde(default)]
    addresses: Vec<String>,
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
        // With secrets, upstreams are verified against the host's bundle (bumped tunnels only).
        let upstream = squid::brokers_secrets(config)
            .then_some(config.ca_bundle.as_ref())
            .flatten();
        if let Some(bundle) = upstream {
            spec.mounts.push(crate::config::OperatorMount {
                host: bundle.clone(),
                container: super::squid::UPSTREAM_BUNDLE.to_string(),
                read_only: true,
            });
        }
        spec.command = super::proxy_command(config, upstream.is_some());
        spec.image = super::PROXY_IMAGE.to_string();
        spec.open_files = Some(super::squid::PROXY_DESCRIPTORS);
        spec.no_forwarding = true;
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
            squid::secret_headers(config),
        ));
        let ca: Arc<Mutex<Option<String>>> = Arc::default();
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
            ca.clone(),
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
            ca: ca.clone(),
            trust: Mutex::new(None),
        });
        match tokio::time::timeout(Duration::from_secs(30), ready_rx).await {
            Ok(Ok(())) if squid::brokers_secrets(config) && lock(&ca).is_none() => {
                gateway.stop().await;
                Err(EngineError::Egress(
                    "the egress proxy started without the CA it needs for SANDBOX_SECRETS_FILE \
                     (is its image the current one? python-code-sandbox image build makes it)"
                        .into(),
                ))
            }
            Ok(Ok(())) => {
                if let Some(pem) = gateway.ca_certificate() {
                    match write_trust_bundle(config, &pem) {
                        Ok(path) => *lock(&gateway.trust) = Some(path),
                        Err(e) => {
                            gateway.stop().await;
                            return Err(EngineError::Egress(format!(
                                "cannot write the bundle the code's sandboxes trust \
                                 (SANDBOX_SECRETS_FILE: the host's CA bundle and the proxy's CA) \
                                 under {}: {e}",
                                config.cache_dir.display()
                            )));
                        }
                    }
                }
                Ok(gateway)
            }
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
    pub fn lease(
        self: &Arc<Self>,
        network: EgressNetwork,
        address: String,
        role: Role,
        secrets: Arc<crate::config::secrets::Secrets>,
    ) -> Lease {
        let generation = self.sources.adopt(&address, &network.name, role, secrets);
        Lease {
            gateway: self.clone(),
            network,
            address,
            generation,
            released: false,
        }
    }

    /// The proxy's CA certificate (PEM), when it bumps TLS for secrets.
    pub fn ca_certificate(&self) -> Option<String> {
        lock(&self.ca).clone()
    }

    /// The CA bundle the code's sandboxes trust, when the proxy bumps TLS for secrets: the
    /// host's bundle (`SANDBOX_CA_BUNDLE`) and the proxy's CA.
    pub fn trust_bundle(&self) -> Option<std::path::PathBuf> {
        lock(&self.trust).clone()
    }

    /// Removes the proxy (the shutdown's sweep has removed the sandboxes; their networks go
    /// with the instance's storage after).
    pub async fn stop(&self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        if let Some(path) = lock(&self.trust).take() {
            let _ = std::fs::remove_file(path);
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
    ca: Arc<Mutex<Option<String>>>,
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
                Ok(FromProxy::Listening { forbidden, ca: pem }) => {
                    if let Some(pem) = pem.filter(|p| is_certificate(p)) {
                        *lock(&ca) = Some(pem);
                    }
                    for (entry, network) in sources.entries_covering(&forbidden) {
                        tracing::warn!(
                            "SANDBOX_EGRESS_ALLOW entry {entry} covers {network}, which the egress \
                             never reaches (the sandboxes' own networks, or the proxy's uplink): \
                             requests there are refused whatever the entry says"
                        );
                    }
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

/// Writes the bundle the code's sandboxes trust with secrets (see [`Gateway::trust_bundle`]).
fn write_trust_bundle(config: &Config, ca_pem: &str) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut text = match &config.ca_bundle {
        Some(host) => std::fs::read_to_string(host)?,
        None => String::new(),
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# python-code-sandbox: the egress proxy's CA (it adds secrets to requests)\n");
    text.push_str(ca_pem.trim());
    text.push('\n');
    std::fs::create_dir_all(&config.cache_dir)?;
    let path = config.cache_dir.join(format!(
        "egress-trust-{}.pem",
        uuid::Uuid::new_v4().simple()
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)?;
    file.write_all(text.as_bytes())?;
    Ok(path)
}

/// A PEM certificate and nothing else (what the relay says of its CA is held to that).
fn is_certificate(pem: &str) -> bool {
    let pem = pem.trim();
    pem.len() < 16 << 10
        && pem.starts_with("-----BEGIN CERTIFICATE-----")
        && pem.ends_with("-----END CERTIFICATE-----")
        && pem.matches("-----BEGIN").count() == 1
}

fn reply(to_proxy: &mpsc::UnboundedSender<String>, q: u64, verdict: Result<Tag, String>) {
    reply_with(to_proxy, q, verdict, Vec::new());
}

/// The answer to question `q`, with the notes Squid acts on (see [`super::squid`]).
fn reply_with(
    to_proxy: &mpsc::UnboundedSender<String>,
    q: u64,
    verdict: Result<Tag, String>,
    notes: Vec<(String, String)>,
) {
    let line = match verdict {
        Ok(tag) => {
            let notes: serde_json::Map<String, serde_json::Value> =
                notes.into_iter().map(|(k, v)| (k, v.into())).collect();
            json!({"a": q, "ok": true, "tag": tag.as_str(), "notes": notes})
        }
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
        FromProxy::Listening { .. } => {}
        FromProxy::Ask {
            q, conn: None, src, ..
        } => reply(
            to_proxy,
            q,
            Err(format!("a request from {src} without a transaction")),
        ),
        FromProxy::Ask {
            q,
            conn: Some(conn),
            src,
            host,
            port,
            method,
            host_header,
            sni,
            sent,
        } => match sources.decide(&src, conn, &host, port) {
            Decision::Allow(tag) => {
                let request = Request {
                    method: &method,
                    host: &host,
                    port,
                    host_header: host_header.as_deref(),
                    sni: sni.as_deref(),
                    sent: &sent,
                };
                let notes = sources.broker(&src, conn, &request).notes();
                reply_with(to_proxy, q, Ok(tag), notes)
            }
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
        FromProxy::Sni {
            q,
            src,
            host,
            port,
            sni,
        } => {
            let verdict = sources
                .bump(&src, &host, port, sni.as_deref())
                .map(|()| Tag::Code);
            if let Err(why) = &verdict {
                tracing::info!(source = src, host, port, "a tunnel is not bumped: {why}");
            }
            reply(to_proxy, q, verdict)
        }
        FromProxy::Logged(line) => logged(sources, &line),
        FromProxy::Flushed { flush } => {
            if let Some(tx) = lock(flushes).remove(&flush) {
                let _ = tx.send(());
            }
        }
    }
}

/// What a request's log line means for its attempt.
fn logged(sources: &Sources, line: &Logged) {
    let Some(conn) = line.conn else {
        // Malformed (Squid answered 400 at once): no host to record.
        return;
    };
    let error = line.error.as_deref();
    if error == Some(squid::PAGE_FORBIDDEN) {
        sources.refused_unasked(
            &line.src,
            conn,
            &line.host,
            line.port,
            &format!(
                "{} is on the sandboxes' own networks or next to the proxy on its uplink, which no \
                 sandbox may reach",
                line.host
            ),
        );
        return;
    }
    if error == Some(squid::PAGE_ADDRESS) {
        let addresses: Vec<IpAddr> = line
            .addresses
            .iter()
            .filter_map(|a| a.split('%').next().and_then(|a| a.parse().ok()))
            .collect();
        if sources
            .check_resolved(&line.src, conn, &line.host, line.port, &addresses)
            .is_ok()
        {
            sources.settle_refused(
                conn,
                &format!(
                    "{} resolves to a non-public address that no setting allows on port {}",
                    line.host, line.port
                ),
            );
        }
    }
    let failure = failure_of(error, line.detail.as_deref(), line.status)
        .map(|stopped| (failure_reason(&line.host, line.port, &stopped), stopped));
    let (why, stopped) = failure.unzip();
    sources.closed(conn, line.sent, line.received, why.as_deref(), stopped);
}

/// Why Squid could not make an allowed request, from its error page and detail.
fn failure_of(error: Option<&str>, detail: Option<&str>, status: u16) -> Option<Stopped> {
    let errno = detail
        .and_then(|d| d.strip_prefix("errno="))
        .and_then(|n| n.parse::<i32>().ok());
    Some(match error? {
        "ERR_DNS_FAIL" => Stopped::Unresolved,
        "ERR_CONNECT_FAIL" => match errno {
            Some(111) => Stopped::NoAnswer(NoAnswer::Refused),
            Some(110) => Stopped::NoAnswer(NoAnswer::TimedOut),
            _ => Stopped::NoAnswer(NoAnswer::Unreachable),
        },
        "ERR_READ_TIMEOUT" | "ERR_LIFETIME_EXP" => Stopped::NoAnswer(NoAnswer::TimedOut),
        // The sandbox went away, or its request was refused (judged when asked).
        "ERR_CLIENT_GONE" | "ERR_PCS_REFUSED" | "ERR_PCS_ADDRESS" => return None,
        _ if status >= 500 => Stopped::NoAnswer(NoAnswer::Unreachable),
        _ => return None,
    })
}

fn failure_reason(host: &str, port: u16, stopped: &Stopped) -> String {
    match stopped {
        Stopped::Unresolved => format!("{host} does not resolve"),
        Stopped::NoAnswer(how) => format!("cannot connect to {host}:{port}: {}", how.as_str()),
        other => super::stopped_reason(host, port, other),
    }
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
    fn squids_log_lines_are_read_as_data() {
        let line = br#"{"op":"logged","conn":7,"src":"10.213.0.3","method":"CONNECT","host":"h.test","port":1,"status":503,"squid":"NONE_NONE","sent":0,"received":0,"error":"ERR_CONNECT_FAIL","detail":"errno=111"}"#;
        let Ok(FromProxy::Logged(logged)) = serde_json::from_slice::<FromProxy>(line) else {
            panic!("a log line")
        };
        assert_eq!(
            failure_of(logged.error.as_deref(), logged.detail.as_deref(), 503),
            Some(Stopped::NoAnswer(NoAnswer::Refused))
        );
        assert_eq!(
            failure_of(Some("ERR_DNS_FAIL"), None, 503),
            Some(Stopped::Unresolved)
        );
        assert_eq!(
            failure_of(Some("ERR_CONNECT_FAIL"), Some("errno=110"), 503),
            Some(Stopped::NoAnswer(NoAnswer::TimedOut))
        );
        assert_eq!(failure_of(None, None, 200), None);
        assert_eq!(failure_of(Some("ERR_CLIENT_GONE"), None, 0), None);
        assert_eq!(failure_of(Some("ERR_PCS_REFUSED"), None, 403), None);
        // A line the relay could not make whole is not one.
        assert!(serde_json::from_slice::<FromProxy>(br#"{"op":"logged","conn":7}"#).is_err());
    }
}
