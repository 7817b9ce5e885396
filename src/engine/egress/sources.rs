//! Who is behind each connection the proxy reports, what they may reach, and what they tried.
//!
//! The proxy knows a connection only by its source address on the egress network. Each sandbox on
//! that network is *adopted* under its address when it starts (a generation number tells a later
//! sandbox that got the same address from the earlier one), as the code of a session or of a
//! single run, or as an installer. An address nobody adopted is refused everything. A session's
//! consents ([`SessionNetwork`]) are bound to its sandbox's address; they outlive the sandbox
//! (a restored or restarted session keeps them) but never pass to another sandbox.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use super::broker::{Brokered, Request};
use super::squid::Tag;
use super::{stopped_reason, IndexPolicy};
use crate::config::egress::{target_of, EgressPolicy, EntryTarget, Static, Target};
use crate::config::secrets::Secrets;
use crate::engine::outcome::{NetworkEntry, NetworkOutcome, Stopped};

/// What the user answered to "Allow this sandbox to reach host:port?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsentAnswer {
    Accepted,
    Declined,
    /// Dismissed without an answer: asked again next time.
    Cancelled,
    /// The question could not be asked (the client went away, or cannot ask): why.
    Unavailable(String),
}

/// Asks the user (through the MCP client that owns a session). Implemented by the MCP layer.
pub trait ConsentAsker: Send + Sync {
    /// `None` when this client cannot ask its user at all (no elicitation): the reason.
    fn unable(&self) -> Option<String>;
    fn ask(&self, host: &str, port: u16) -> BoxFuture<'static, ConsentAnswer>;
}

/// A session's consents: hosts its user approved or declined, and questions still open.
#[derive(Default)]
pub struct SessionNetwork {
    consents: Mutex<Consents>,
    asker: Mutex<Option<Arc<dyn ConsentAsker>>>,
}

#[derive(Default)]
struct Consents {
    approved: HashSet<(String, u16)>,
    declined: HashSet<(String, u16)>,
    pending: HashSet<(String, u16)>,
}

/// Where a session stands on one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Approved,
    Declined,
    Pending,
    Unasked,
}

impl SessionNetwork {
    pub fn new(asker: Option<Arc<dyn ConsentAsker>>) -> SessionNetwork {
        SessionNetwork {
            consents: Mutex::default(),
            asker: Mutex::new(asker),
        }
    }

    fn consents(&self) -> std::sync::MutexGuard<'_, Consents> {
        self.consents.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn asker(&self) -> Option<Arc<dyn ConsentAsker>> {
        self.asker.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn standing(&self, host: &str, port: u16) -> Standing {
        let key = (host.to_string(), port);
        let consents = self.consents();
        if consents.approved.contains(&key) {
            Standing::Approved
        } else if consents.declined.contains(&key) {
            Standing::Declined
        } else if consents.pending.contains(&key) {
            Standing::Pending
        } else {
            Standing::Unasked
        }
    }

    /// Marks a question open; false when it already was (it is asked once).
    fn open_question(&self, host: &str, port: u16) -> bool {
        self.consents().pending.insert((host.to_string(), port))
    }

    /// Where this session stands on a host that needs consent, and, when the user is to be
    /// asked now, the question opened (asked once: later attempts find it pending). `room` says
    /// whether the execution may still ask (see [`MAX_QUESTIONS_PER_EXECUTION`]).
    pub fn consider(&self, host: &str, port: u16, room: Result<(), String>) -> Consideration {
        match self.standing(host, port) {
            Standing::Approved => return Consideration::Approved,
            Standing::Declined => return Consideration::Declined,
            Standing::Pending => return Consideration::Pending,
            Standing::Unasked => {}
        }
        let Some(asker) = self.asker() else {
            return Consideration::Unable("it has no client".into());
        };
        if let Some(why) = asker.unable() {
            return Consideration::Unable(why);
        }
        if let Err(why) = room {
            return Consideration::Bounded(why);
        }
        let open = self.consents().pending.len();
        if open >= MAX_OPEN_QUESTIONS {
            return Consideration::Bounded(format!(
                "{open} questions to the user are open in this session already (at most \
                 {MAX_OPEN_QUESTIONS} at once): retry once they are answered, or ask for \
                 {host}:{port} up front (sandbox_initialize's network)"
            ));
        }
        if self.open_question(host, port) {
            Consideration::Ask(asker)
        } else {
            Consideration::Pending
        }
    }

    /// Records the user's answer (a cancelled or unavailable question is forgotten).
    pub fn answer(&self, host: &str, port: u16, answer: &ConsentAnswer) {
        let key = (host.to_string(), port);
        let mut consents = self.consents();
        consents.pending.remove(&key);
        match answer {
            ConsentAnswer::Accepted => {
                consents.declined.remove(&key);
                consents.approved.insert(key);
            }
            ConsentAnswer::Declined => {
                consents.declined.insert(key);
            }
            ConsentAnswer::Cancelled | ConsentAnswer::Unavailable(_) => {}
        }
    }
}

/// What [`SessionNetwork::consider`] found.
pub enum Consideration {
    Approved,
    Declined,
    /// Asked already; no answer yet.
    Pending,
    /// The user cannot be asked: why.
    Unable(String),
    /// Not asked now: too many questions are open or were asked; why.
    Bounded(String),
    /// Ask now (the question is open).
    Ask(Arc<dyn ConsentAsker>),
}

/// What a sandbox on the egress network runs.
#[derive(Clone)]
pub enum Role {
    /// An installer: the index hosts only.
    Installer,
    /// The agent's code; `Some` once a session's consents are bound to it.
    Code(Option<Arc<SessionNetwork>>),
}

/// The proxy's question about a connection, answered.
pub enum Decision {
    /// Allowed, with what the proxy may let its addresses be.
    Allow(Tag),
    Refuse(String),
    /// Refused until the user answers the open question.
    Pending(String),
    /// Refused for now; the user is to be asked (the caller asks, then records the answer).
    RefuseAndAsk {
        reason: String,
        session: Arc<SessionNetwork>,
        asker: Arc<dyn ConsentAsker>,
        host: String,
        port: u16,
    },
}

struct Attempt {
    conn: u64,
    host: String,
    port: u16,
    outcome: NetworkOutcome,
    reason: Option<String>,
    stopped: Option<Stopped>,
    sent: u64,
    received: u64,
    /// Bytes already reported by an earlier execution (a connection still open then).
    reported: (u64, u64),
    /// Counted in an earlier execution's record.
    counted: bool,
    open: bool,
    /// The requests this attempt stands for (more than one once alike ones are merged).
    requests: u32,
    /// The secret the proxy added to it.
    secret: Option<String>,
    /// The secrets whose placeholder it carried as written (not replaced by a value).
    placeholder: Option<String>,
}

struct Source {
    generation: u64,
    /// The secrets the proxy adds to its requests (the code's; none for an installer).
    secrets: Arc<Secrets>,
    /// The sandbox's own egress network.
    network: String,
    role: Role,
    attempts: Vec<Attempt>,
    /// Questions to the user opened since the last record (this execution's).
    asked: u32,
    /// Attempts since the last record beyond [`MAX_ATTEMPTS`]: judged alike, not itemized.
    unlisted: u64,
}

/// Every sandbox on the egress network, by address.
pub struct Sources {
    code: EgressPolicy,
    index: IndexPolicy,
    /// The header names the proxy can set, in its configuration's order (see
    /// [`super::squid::secret_headers`]).
    headers: Vec<String>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    by_address: HashMap<String, Source>,
    /// The proxy's connection id -> its source address.
    connections: HashMap<u64, String>,
}

/// At most this many attempts are kept per sandbox between two executions (a loop of refused
/// connections must not grow the server's memory); more are judged the same, and counted.
const MAX_ATTEMPTS: usize = 1000;

/// At most this many questions to the user are open at once in a session; another host that
/// needs consent is refused at once, with the reason, until one is answered.
pub const MAX_OPEN_QUESTIONS: usize = 3;

/// At most this many questions one execution (one record) opens.
pub const MAX_QUESTIONS_PER_EXECUTION: u32 = 10;

impl Sources {
    pub fn new(code: EgressPolicy, index: IndexPolicy, headers: Vec<String>) -> Sources {
        Sources {
            code,
            index,
            headers,
            inner: Mutex::default(),
        }
    }

    /// The secrets of the code at `source` (none for anyone else).
    fn secrets_of(inner: &Inner, source: &str) -> Option<Arc<Secrets>> {
        let entry = inner.by_address.get(source)?;
        match entry.role {
            Role::Code(_) if !entry.secrets.is_empty() => Some(entry.secrets.clone()),
            _ => None,
        }
    }

    /// What the proxy adds to an allowed request of `source`'s (see [`super::broker`]): only the
    /// code's requests carry secrets. A secret sent is recorded on the request's attempt, and
    /// said in the log (never its value).
    pub fn broker(&self, source: &str, conn: u64, request: &Request<'_>) -> Brokered {
        let mut inner = self.inner();
        let Some(secrets) = Self::secrets_of(&inner, source) else {
            return Brokered::Nothing;
        };
        let brokered = super::broker::for_request(&secrets, &self.headers, request);
        let placeholders =
            super::broker::placeholders_sent(&secrets, &self.headers, request, &brokered);
        if !placeholders.is_empty() {
            let names = placeholders.join(", ");
            tracing::info!(
                source,
                host = request.host,
                port = request.port,
                method = request.method,
                "the placeholder of {names} went as written: it means nothing there (no value is added)"
            );
            if let Some(attempt) = Self::attempt(&mut inner, conn) {
                attempt.placeholder = Some(names);
            }
        }
        match &brokered {
            Brokered::Add { secret, .. } => {
                if let Some(attempt) = Self::attempt(&mut inner, conn) {
                    attempt.secret = Some(secret.clone());
                }
                tracing::info!(
                    secret,
                    source,
                    host = request.host,
                    port = request.port,
                    method = request.method,
                    "the egress proxy adds a secret to a request"
                );
                crate::engine::stats::secret_used(secret, request.host);
            }
            Brokered::Withheld { secret, why } => tracing::info!(
                secret,
                source,
                host = request.host,
                port = request.port,
                "a secret is not sent: {why}"
            ),
            Brokered::Bump { .. } | Brokered::Nothing => {}
        }
        brokered
    }

    /// Whether a tunnel of `source`'s to `host:port` whose TLS hello names `sni` may be bumped.
    pub fn bump(
        &self,
        source: &str,
        host: &str,
        port: u16,
        sni: Option<&str>,
    ) -> Result<(), String> {
        let Some(secrets) = Self::secrets_of(&self.inner(), source) else {
            return Err(format!("{source} holds no secret"));
        };
        super::broker::for_sni(&secrets, host, port, sni)
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sandbox started at `address`: whatever an earlier one there had is gone.
    pub fn adopt(&self, address: &str, network: &str, role: Role, secrets: Arc<Secrets>) -> u64 {
        let mut inner = self.inner();
        inner.generation += 1;
        let generation = inner.generation;
        inner.connections.retain(|_, a| a != address);
        inner.by_address.insert(
            address.to_string(),
            Source {
                generation,
                network: network.to_string(),
                role,
                secrets,
                attempts: Vec::new(),
                asked: 0,
                unlisted: 0,
            },
        );
        generation
    }

    /// Whether a sandbox adopted now is on `network` (a restarted one, at a new address).
    pub fn network_in_use(&self, network: &str) -> bool {
        self.inner()
            .by_address
            .values()
            .any(|s| s.network == network)
    }

    /// The sandbox adopted as `generation` is gone.
    pub fn forget(&self, address: &str, generation: u64) {
        let mut inner = self.inner();
        if inner
            .by_address
            .get(address)
            .is_some_and(|s| s.generation == generation)
        {
            inner.by_address.remove(address);
            inner.connections.retain(|_, a| a != address);
        }
    }

    pub fn role_of(&self, address: &str, generation: u64) -> Option<Role> {
        self.inner()
            .by_address
            .get(address)
            .filter(|s| s.generation == generation)
            .map(|s| s.role.clone())
    }

    /// Binds a session's consents to its sandbox (adopted as `generation`).
    pub fn bind_session(&self, address: &str, generation: u64, session: &Arc<SessionNetwork>) {
        let mut inner = self.inner();
        if let Some(source) = inner.by_address.get_mut(address) {
            if source.generation == generation {
                source.role = Role::Code(Some(session.clone()));
            }
        }
    }

    fn record(&self, inner: &mut Inner, source: &str, conn: u64, host: &str, port: u16) {
        let Some(entry) = inner.by_address.get_mut(source) else {
            return;
        };
        if entry.attempts.len() >= MAX_ATTEMPTS {
            merge_alike(&mut entry.attempts);
        }
        if entry.attempts.len() >= MAX_ATTEMPTS {
            entry.unlisted += 1;
            return;
        }
        entry.attempts.push(Attempt {
            conn,
            host: host.to_string(),
            port,
            outcome: NetworkOutcome::Reached,
            reason: None,
            stopped: None,
            sent: 0,
            received: 0,
            reported: (0, 0),
            counted: false,
            open: true,
            requests: 1,
            secret: None,
            placeholder: None,
        });
        inner.connections.insert(conn, source.to_string());
    }

    /// The attempt a proxy connection is recorded as.
    fn attempt(inner: &mut Inner, conn: u64) -> Option<&mut Attempt> {
        let source = inner.connections.get(&conn)?;
        inner
            .by_address
            .get_mut(source)?
            .attempts
            .iter_mut()
            .find(|a| a.conn == conn)
    }

    fn settle(
        &self,
        inner: &mut Inner,
        conn: u64,
        outcome: NetworkOutcome,
        reason: &str,
        stopped: Option<Stopped>,
    ) {
        if let Some(attempt) = Self::attempt(inner, conn) {
            attempt.outcome = outcome;
            attempt.reason = Some(reason.to_string());
            attempt.stopped = stopped;
        }
    }

    /// The proxy asks whether `source` may reach `host:port` (before any name is resolved).
    pub fn decide(&self, source: &str, conn: u64, host: &str, port: u16) -> Decision {
        let mut inner = self.inner();
        let role = inner.by_address.get(source).map(|s| s.role.clone());
        let mut stopped = None;
        let decision = match role {
            None => Decision::Refuse(format!(
                "{source} is not a sandbox of this server on the egress network"
            )),
            Some(Role::Installer) => match self.index.decide(host, port) {
                Ok(()) if self.index.private.iter().any(|p| p == host) => {
                    Decision::Allow(Tag::Private)
                }
                Ok(()) => Decision::Allow(Tag::Index),
                Err(why) => {
                    let reason = stopped_reason(host, port, &why);
                    stopped = Some(why);
                    Decision::Refuse(reason)
                }
            },
            Some(Role::Code(session)) => {
                let room = match inner.by_address.get(source) {
                    Some(s) if s.asked >= MAX_QUESTIONS_PER_EXECUTION => Err(format!(
                        "this execution asked the user {MAX_QUESTIONS_PER_EXECUTION} questions \
                         already (at most that many in one): ask for {host}:{port} up front \
                         (sandbox_initialize's network), or in a later call"
                    )),
                    _ => Ok(()),
                };
                let secrets = Self::secrets_of(&inner, source);
                self.decide_code(host, port, session, room, secrets.as_deref())
            }
        };
        if let (Decision::RefuseAndAsk { .. }, Some(entry)) =
            (&decision, inner.by_address.get_mut(source))
        {
            entry.asked += 1;
        }
        self.record(&mut inner, source, conn, host, port);
        match &decision {
            Decision::Allow(_) => {}
            Decision::Refuse(reason) => {
                self.settle(&mut inner, conn, NetworkOutcome::Refused, reason, stopped)
            }
            Decision::Pending(reason) | Decision::RefuseAndAsk { reason, .. } => {
                self.settle(&mut inner, conn, NetworkOutcome::Pending, reason, None)
            }
        }
        decision
    }

    fn decide_code(
        &self,
        host: &str,
        port: u16,
        session: Option<Arc<SessionNetwork>>,
        room: Result<(), String>,
        secrets: Option<&Secrets>,
    ) -> Decision {
        let Some(target) = target_of(host) else {
            return Decision::Refuse(format!("{host:?} is not a host name or an IP address"));
        };
        // A secret's hosts are the operator's to allow: the code that can use it reaches them.
        if matches!(target, Target::Name(_))
            && secrets.is_some_and(|s| s.bound(host, port).is_some())
        {
            return Decision::Allow(Tag::Code);
        }
        match self.code.decide(&target, port) {
            Static::Allowed => Decision::Allow(Tag::Code),
            Static::Refused(why) => Decision::Refuse(why),
            Static::Ask => {
                let Target::Name(name) = target else {
                    return Decision::Refuse(format!("{host}:{port} needs the user's consent"));
                };
                let Some(session) = session else {
                    return Decision::Refuse(format!(
                        "{name}:{port} needs the user's consent (SANDBOX_EGRESS_ASK), which is \
                         asked only in a session: start one with sandbox_initialize (it can ask \
                         for hosts up front: network: [\"{name}:{port}\"])"
                    ));
                };
                match session.consider(&name, port, room) {
                    Consideration::Approved => Decision::Allow(Tag::Code),
                    Consideration::Declined => Decision::Refuse(format!(
                        "the user declined {name}:{port} for this session"
                    )),
                    Consideration::Pending => Decision::Pending(pending(&name, port)),
                    Consideration::Unable(why) => Decision::Refuse(unable(&name, port, &why)),
                    Consideration::Bounded(why) => Decision::Refuse(format!(
                        "{name}:{port} needs the user's consent (SANDBOX_EGRESS_ASK), not asked \
                         now: {why}"
                    )),
                    Consideration::Ask(asker) => Decision::RefuseAndAsk {
                        reason: pending(&name, port),
                        session,
                        asker,
                        host: name,
                        port,
                    },
                }
            }
        }
    }

    /// The proxy refused an allowed name for where it resolves: the reason, from the addresses
    /// it found (`Ok` when none of them explains it: the proxy's own lookup differed).
    pub fn check_resolved(
        &self,
        source: &str,
        conn: u64,
        host: &str,
        port: u16,
        addresses: &[IpAddr],
    ) -> Result<(), String> {
        let mut inner = self.inner();
        let role = inner.by_address.get(source).map(|s| s.role.clone());
        let verdict = match role {
            None => Err((format!("{source} is not a sandbox of this server"), None)),
            Some(Role::Installer) => self
                .index
                .check_resolved(host, addresses)
                .map_err(|why| (stopped_reason(host, port, &why), Some(why))),
            Some(Role::Code(_)) => self
                .code
                .check_resolved(host, port, addresses)
                .map_err(|why| (why, None)),
        };
        verdict.map_err(|(why, stopped)| {
            self.settle(&mut inner, conn, NetworkOutcome::Refused, &why, stopped);
            why
        })
    }

    /// A connection ended; `error` when it could not be made (or was refused by the proxy
    /// itself), and `failure`, what the proxy said of it as data.
    pub fn closed(
        &self,
        conn: u64,
        sent: u64,
        received: u64,
        error: Option<&str>,
        failure: Option<Stopped>,
    ) {
        let mut inner = self.inner();
        if let Some(attempt) = Self::attempt(&mut inner, conn) {
            attempt.open = false;
            attempt.sent = sent;
            attempt.received = received;
            if let (Some(error), NetworkOutcome::Reached) = (error, attempt.outcome) {
                attempt.outcome = NetworkOutcome::Failed;
                attempt.reason = Some(error.to_string());
                attempt.stopped = failure;
            }
        }
        inner.connections.remove(&conn);
    }

    /// The code's address entries that overlap one of `networks` (ranges the proxy never
    /// reaches), as (entry, network).
    pub fn entries_covering(&self, networks: &[String]) -> Vec<(String, String)> {
        let networks: Vec<ipnet::IpNet> = networks.iter().filter_map(|n| n.parse().ok()).collect();
        let mut found = Vec::new();
        for entry in &self.code.allow.entries {
            let EntryTarget::Range(range) = entry.target else {
                continue;
            };
            for network in &networks {
                if range.contains(network) || network.contains(&range) {
                    found.push((range.to_string(), network.to_string()));
                }
            }
        }
        found
    }

    /// Refuses an attempt the proxy stopped after it was allowed, for `why`.
    pub fn settle_refused(&self, conn: u64, why: &str) {
        let mut inner = self.inner();
        self.settle(&mut inner, conn, NetworkOutcome::Refused, why, None);
    }

    /// A request the proxy refused before asking (its address is one no sandbox may reach).
    pub fn refused_unasked(&self, source: &str, conn: u64, host: &str, port: u16, why: &str) {
        let mut inner = self.inner();
        self.record(&mut inner, source, conn, host, port);
        self.settle(
            &mut inner,
            conn,
            NetworkOutcome::Refused,
            why,
            Some(Stopped::OffLimits),
        );
    }

    /// What `source` tried since the last call, one entry per host, port and outcome, in the
    /// order of first attempt. Connections still open stay, and count later only what they add.
    pub fn take_record(&self, source: &str) -> Vec<NetworkEntry> {
        let mut inner = self.inner();
        let Some(entry) = inner.by_address.get_mut(source) else {
            return Vec::new();
        };
        entry.asked = 0;
        if std::mem::take(&mut entry.unlisted) > 0 {
            tracing::info!(
                source,
                "more than {MAX_ATTEMPTS} network attempts in one execution: the rest were judged alike and not itemized"
            );
        }
        let mut record: Vec<NetworkEntry> = Vec::new();
        for attempt in &mut entry.attempts {
            let sent = attempt.sent.saturating_sub(attempt.reported.0);
            let received = attempt.received.saturating_sub(attempt.reported.1);
            let fresh = !attempt.counted;
            let requests = if fresh { attempt.requests } else { 0 };
            if !fresh && sent == 0 && received == 0 {
                continue;
            }
            attempt.counted = true;
            attempt.reported = (attempt.sent, attempt.received);
            match record.iter_mut().find(|e| {
                e.host == attempt.host
                    && e.port == attempt.port
                    && e.outcome == attempt.outcome
                    && e.secret == attempt.secret
                    && e.placeholder == attempt.placeholder
            }) {
                Some(e) => {
                    e.connections += requests;
                    e.bytes_sent += sent;
                    e.bytes_received += received;
                }
                None => record.push(NetworkEntry {
                    host: attempt.host.clone(),
                    port: attempt.port,
                    outcome: attempt.outcome,
                    connections: requests,
                    bytes_sent: sent,
                    bytes_received: received,
                    reason: attempt.reason.clone(),
                    stopped: attempt.stopped.clone(),
                    secret: attempt.secret.clone(),
                    placeholder: attempt.placeholder.clone(),
                }),
            }
        }
        entry.attempts.retain(|a| a.open);
        record
    }
}

/// Merges the ended, not yet recorded attempts that went alike (same host, port, outcome and
/// reason) into one, so that a loop of requests keeps a few rows, not one per request.
fn merge_alike(attempts: &mut Vec<Attempt>) {
    let mut kept: Vec<Attempt> = Vec::with_capacity(attempts.len());
    for attempt in attempts.drain(..) {
        let mergeable = !attempt.open && !attempt.counted;
        let alike = kept.iter_mut().find(|k| {
            mergeable
                && !k.open
                && !k.counted
                && k.host == attempt.host
                && k.port == attempt.port
                && k.outcome == attempt.outcome
                && k.reason == attempt.reason
                && k.secret == attempt.secret
                && k.placeholder == attempt.placeholder
        });
        match alike {
            Some(k) => {
                k.requests = k.requests.saturating_add(attempt.requests);
                k.sent += attempt.sent;
                k.received += attempt.received;
            }
            None => kept.push(attempt),
        }
    }
    *attempts = kept;
}

fn pending(host: &str, port: u16) -> String {
    format!(
        "waiting for the user's approval of {host}:{port} (SANDBOX_EGRESS_ASK): the MCP client is asking them now; \
         retry after they answer"
    )
}

fn unable(host: &str, port: u16, why: &str) -> String {
    format!(
        "{host}:{port} needs the user's consent (SANDBOX_EGRESS_ASK), and this MCP client cannot \
         ask its user ({why})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::egress::EgressRules;

    /// Answers every question the same way, and counts them.
    struct FakeAsker {
        able: bool,
        asked: Mutex<Vec<(String, u16)>>,
    }

    impl ConsentAsker for FakeAsker {
        fn unable(&self) -> Option<String> {
            (!self.able).then(|| "no elicitation".to_string())
        }
        fn ask(&self, host: &str, port: u16) -> BoxFuture<'static, ConsentAnswer> {
            self.asked.lock().unwrap().push((host.to_string(), port));
            Box::pin(async { ConsentAnswer::Accepted })
        }
    }

    fn sources() -> Sources {
        let code = EgressPolicy {
            allow: EgressRules::parse("data.test:8080,10.9.0.0/16:8080").unwrap(),
            ask: EgressRules::parse("*").unwrap(),
            ..EgressPolicy::default()
        };
        let index = IndexPolicy {
            allow: vec![("pypi.org".into(), 443)],
            private: Vec::new(),
        };
        Sources::new(code, index, Vec::new())
    }

    fn refused(decision: Decision) -> String {
        match decision {
            Decision::Refuse(why) | Decision::Pending(why) => why,
            Decision::Allow(_) => panic!("allowed"),
            Decision::RefuseAndAsk { reason, .. } => panic!("asks: {reason}"),
        }
    }

    #[test]
    fn an_address_nobody_adopted_reaches_nothing() {
        let s = sources();
        let why = refused(s.decide("10.0.0.9", 1, "data.test", 8080));
        assert!(why.contains("not a sandbox of this server"), "{why}");
    }

    #[test]
    fn installers_reach_the_index_and_code_its_allowlist() {
        let s = sources();
        s.adopt("10.0.0.2", "n2", Role::Installer, Default::default());
        s.adopt("10.0.0.3", "n3", Role::Code(None), Default::default());
        assert!(matches!(
            s.decide("10.0.0.2", 1, "pypi.org", 443),
            Decision::Allow(_)
        ));
        assert!(refused(s.decide("10.0.0.2", 2, "data.test", 8080)).contains("index host"));
        assert!(matches!(
            s.decide("10.0.0.3", 3, "data.test", 8080),
            Decision::Allow(_)
        ));
        assert!(
            refused(s.decide("10.0.0.3", 4, "pypi.org", 443)).contains("asked only in a session")
        );
        // An allowed name's addresses: public, or inside an allowed range.
        let private: IpAddr = "10.8.0.1".parse().unwrap();
        let ranged: IpAddr = "10.9.0.1".parse().unwrap();
        assert!(s
            .check_resolved("10.0.0.3", 3, "data.test", 8080, &[ranged])
            .is_ok());
        let why = s
            .check_resolved("10.0.0.3", 3, "data.test", 8080, &[ranged, private])
            .unwrap_err();
        assert!(why.contains("10.8.0.1"), "{why}");
    }

    #[test]
    fn consent_is_asked_once_and_holds_for_the_session() {
        let s = sources();
        s.adopt("10.0.0.3", "n3", Role::Code(None), Default::default());
        let asker = Arc::new(FakeAsker {
            able: true,
            asked: Mutex::default(),
        });
        let network = Arc::new(SessionNetwork::new(Some(asker.clone())));
        let generation = s.adopt("10.0.0.4", "n4", Role::Code(None), Default::default());
        s.bind_session("10.0.0.4", generation, &network);
        let Decision::RefuseAndAsk {
            reason, host, port, ..
        } = s.decide("10.0.0.4", 1, "api.test", 443)
        else {
            panic!("asks")
        };
        assert!(
            reason.contains("waiting for the user's approval"),
            "{reason}"
        );
        assert_eq!((host.as_str(), port), ("api.test", 443));
        // Asked once: a second attempt while the question is open is refused as pending.
        assert!(refused(s.decide("10.0.0.4", 2, "api.test", 443)).contains("waiting"));
        network.answer("api.test", 443, &ConsentAnswer::Accepted);
        assert!(matches!(
            s.decide("10.0.0.4", 3, "api.test", 443),
            Decision::Allow(_)
        ));
        // Another host, declined.
        assert!(matches!(
            s.decide("10.0.0.4", 4, "other.test", 443),
            Decision::RefuseAndAsk { .. }
        ));
        network.answer("other.test", 443, &ConsentAnswer::Declined);
        assert!(refused(s.decide("10.0.0.4", 5, "other.test", 443)).contains("declined"));
        // The approval is this session's only: another sandbox (a new one at the same address
        // included) is not approved.
        assert!(refused(s.decide("10.0.0.3", 6, "api.test", 443)).contains("session"));
        s.adopt("10.0.0.4", "n4", Role::Code(None), Default::default());
        assert!(refused(s.decide("10.0.0.4", 7, "api.test", 443)).contains("session"));
        let record = s.take_record("10.0.0.4");
        assert_eq!(
            record.len(),
            1,
            "a new sandbox's record is its own: {record:?}"
        );
        assert_eq!(record[0].outcome, NetworkOutcome::Refused);
    }

    #[test]
    fn a_client_that_cannot_ask_gets_a_refusal_naming_the_setting() {
        let s = sources();
        let asker = Arc::new(FakeAsker {
            able: false,
            asked: Mutex::default(),
        });
        let network = Arc::new(SessionNetwork::new(Some(asker.clone())));
        let generation = s.adopt("10.0.0.5", "n5", Role::Code(None), Default::default());
        s.bind_session("10.0.0.5", generation, &network);
        let why = refused(s.decide("10.0.0.5", 1, "api.test", 443));
        assert!(
            why.contains("SANDBOX_EGRESS_ASK") && why.contains("cannot ask"),
            "{why}"
        );
        assert!(asker.asked.lock().unwrap().is_empty());
    }

    #[test]
    fn forgetting_an_earlier_sandbox_spares_a_later_one_at_its_address() {
        let s = sources();
        let first = s.adopt("10.0.0.6", "n6", Role::Code(None), Default::default());
        let _second = s.adopt("10.0.0.6", "n6", Role::Code(None), Default::default());
        s.forget("10.0.0.6", first);
        assert!(matches!(
            s.decide("10.0.0.6", 1, "data.test", 8080),
            Decision::Allow(_)
        ));
    }

    #[test]
    fn questions_are_bounded_per_session_and_per_execution() {
        let s = sources();
        let asker = Arc::new(FakeAsker {
            able: true,
            asked: Mutex::default(),
        });
        let network = Arc::new(SessionNetwork::new(Some(asker.clone())));
        let generation = s.adopt("10.0.0.9", "n9", Role::Code(None), Default::default());
        s.bind_session("10.0.0.9", generation, &network);
        let mut conn = 0;
        let mut ask = |host: &str| {
            conn += 1;
            s.decide("10.0.0.9", conn, host, 443)
        };
        for i in 0..MAX_OPEN_QUESTIONS {
            assert!(matches!(
                ask(&format!("h{i}.test")),
                Decision::RefuseAndAsk { .. }
            ));
        }
        let why = refused(ask("one-more.test"));
        assert!(why.contains("questions to the user are open"), "{why}");
        // Answered ones make room, until the execution has asked its share.
        let mut asked = MAX_OPEN_QUESTIONS as u32;
        for i in 0..MAX_OPEN_QUESTIONS {
            network.answer(&format!("h{i}.test"), 443, &ConsentAnswer::Declined);
        }
        while asked < MAX_QUESTIONS_PER_EXECUTION {
            let host = format!("more{asked}.test");
            assert!(
                matches!(ask(&host), Decision::RefuseAndAsk { .. }),
                "{host}"
            );
            network.answer(&host, 443, &ConsentAnswer::Cancelled);
            asked += 1;
        }
        let why = refused(ask("last.test"));
        assert!(why.contains("this execution asked the user"), "{why}");
        // The next execution may ask again.
        s.take_record("10.0.0.9");
        assert!(matches!(ask("last.test"), Decision::RefuseAndAsk { .. }));
    }

    #[test]
    fn entries_over_the_networks_never_reached_are_named() {
        let s = sources();
        let found = s.entries_covering(&["10.9.8.0/29".into(), "172.17.0.0/16".into()]);
        assert_eq!(
            found,
            [("10.9.0.0/16".to_string(), "10.9.8.0/29".to_string())]
        );
    }

    #[test]
    fn attempts_past_the_record_bound_are_still_judged() {
        let s = sources();
        s.adopt("10.0.0.10", "n10", Role::Code(None), Default::default());
        for conn in 0..(MAX_ATTEMPTS as u64 + 50) {
            assert!(
                matches!(
                    s.decide("10.0.0.10", conn, "data.test", 8080),
                    Decision::Allow(Tag::Code)
                ),
                "attempt {conn}"
            );
        }
        // Ended ones merge into one row: a new host is still listed.
        for conn in 0..(MAX_ATTEMPTS as u64 + 50) {
            s.closed(conn, 1, 2, None, None);
        }
        assert!(refused(s.decide("10.0.0.10", 99_999, "other.test", 8080)).contains("not in"));
        let record = s.take_record("10.0.0.10");
        let rows: Vec<_> = record
            .iter()
            .map(|e| (e.host.as_str(), e.connections, e.bytes_sent))
            .collect();
        assert_eq!(
            rows,
            [
                ("data.test", MAX_ATTEMPTS as u32, MAX_ATTEMPTS as u64),
                ("other.test", 1, 0)
            ]
        );
    }

    #[test]
    fn records_count_each_connection_once_and_open_ones_by_what_they_add() {
        let s = sources();
        s.adopt("10.0.0.7", "n7", Role::Code(None), Default::default());
        assert!(matches!(
            s.decide("10.0.0.7", 1, "data.test", 8080),
            Decision::Allow(_)
        ));
        assert!(matches!(
            s.decide("10.0.0.7", 2, "data.test", 8080),
            Decision::Allow(_)
        ));
        refused(s.decide("10.0.0.7", 3, "1.2.3.4", 80));
        assert!(matches!(
            s.decide("10.0.0.7", 4, "data.test", 8080),
            Decision::Allow(_)
        ));
        s.closed(1, 100, 1000, None, None);
        s.closed(3, 0, 0, None, None);
        s.closed(
            4,
            0,
            0,
            Some("cannot connect"),
            Some(Stopped::NoAnswer(crate::engine::outcome::NoAnswer::Refused)),
        );
        let record = s.take_record("10.0.0.7");
        let summary: Vec<_> = record
            .iter()
            .map(|e| {
                (
                    e.host.as_str(),
                    e.outcome,
                    e.connections,
                    e.bytes_sent,
                    e.bytes_received,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("data.test", NetworkOutcome::Reached, 2, 100, 1000),
                ("1.2.3.4", NetworkOutcome::Refused, 1, 0, 0),
                ("data.test", NetworkOutcome::Failed, 1, 0, 0),
            ]
        );
        // The open connection goes on: the next record has only what it added, not a new one.
        s.closed(2, 15, 50, None, None);
        let record = s.take_record("10.0.0.7");
        assert_eq!(record.len(), 1);
        assert_eq!(
            (
                record[0].connections,
                record[0].bytes_sent,
                record[0].bytes_received
            ),
            (0, 15, 50)
        );
        assert!(s.take_record("10.0.0.7").is_empty());
    }

    #[test]
    fn an_installers_refusals_are_recorded_as_data() {
        let s = sources();
        s.adopt("10.0.0.8", "n8", Role::Installer, Default::default());
        refused(s.decide("10.0.0.8", 1, "evil.test", 443));
        assert!(matches!(
            s.decide("10.0.0.8", 2, "pypi.org", 443),
            Decision::Allow(_)
        ));
        let private: IpAddr = "10.1.2.3".parse().unwrap();
        let why = s
            .check_resolved("10.0.0.8", 2, "pypi.org", 443, &[private])
            .unwrap_err();
        assert_eq!(why, "pypi.org resolves to the non-public address 10.1.2.3");
        assert!(matches!(
            s.decide("10.0.0.8", 3, "pypi.org", 443),
            Decision::Allow(_)
        ));
        s.closed(
            3,
            0,
            0,
            Some("cannot connect to pypi.org:443: timed out"),
            Some(Stopped::NoAnswer(
                crate::engine::outcome::NoAnswer::TimedOut,
            )),
        );
        let record = s.take_record("10.0.0.8");
        let stopped: Vec<_> = record
            .iter()
            .map(|e| (e.host.as_str(), e.outcome, e.stopped.clone()))
            .collect();
        assert_eq!(
            stopped,
            [
                (
                    "evil.test",
                    NetworkOutcome::Refused,
                    Some(Stopped::NotAllowed)
                ),
                (
                    "pypi.org",
                    NetworkOutcome::Refused,
                    Some(Stopped::NonPublic(private))
                ),
                (
                    "pypi.org",
                    NetworkOutcome::Failed,
                    Some(Stopped::NoAnswer(
                        crate::engine::outcome::NoAnswer::TimedOut
                    ))
                ),
            ]
        );
    }
}
