//! A client's MCP roots (`SANDBOX_ROOTS`): asked for once the client is initialized and again on
//! `notifications/roots/list_changed`, resolved by the engine (`engine::roots`), and handed to
//! every call that may start a sandbox. What was refused is logged and shown once, in the next
//! tool result that runs code or starts a session.
//!
//! The listing is asked for in a task of its own: a handler that awaited the client's answer
//! would hold up the very connection the answer comes through. A call that comes before the
//! first answer waits for it, briefly ([`FIRST_LISTING_WAIT`]); a client that never answers
//! gets sandboxes without roots and the reason, shown once.
//!
//! A client of revision 2026-07-28 takes no request from the server outside a call: each call
//! that runs code or starts a session ([`ROOT_TOOLS`]) first answers with `input_required`
//! asking for `roots/list` ([`ClientRoots::ask_within_call`]), and goes on when the client
//! retries it with the listing. So each such call mounts the roots as they are then.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::service::Peer;
use rmcp::RoleServer;
use tokio::sync::watch;

use crate::config::RootMapping;
use crate::engine::roots::{shown, Listed, Refused, RootSet, UNMAPPED};
use crate::engine::Engine;

/// How long a call waits for the client's first listing of roots.
const FIRST_LISTING_WAIT: Duration = Duration::from_secs(5);

/// How long the client gets to answer `roots/list`.
const LISTING_TIMEOUT: Duration = Duration::from_secs(30);

/// The tools whose calls may start a sandbox or run code in a session: they need the roots.
const ROOT_TOOLS: &[&str] = &[
    "run_python_ephemeral",
    "run_python",
    "sandbox_exec",
    "sandbox_initialize",
    "sandbox_run_notebook",
];

/// The key of the roots listing among a call's `inputResponses`.
const INPUT_KEY: &str = "roots";

/// Where a client is, for its roots: on this machine (stdio), or over HTTP on another, whose
/// paths name this machine's directories only through a mapping: its principal's own (a
/// tokens-file line's `roots_map=`, or `SANDBOX_ROOTS_MAP`'s entries with `{principal}`), or
/// without principals the operator's `SANDBOX_ROOTS_MAP` (see `config::roots`).
#[derive(Debug, Clone)]
pub(crate) enum Via {
    Stdio,
    Http(Arc<[RootMapping]>),
}

impl Via {
    /// The mapping its paths go through (`None`: they are this machine's).
    fn map(&self) -> Option<&[RootMapping]> {
        match self {
            Via::Stdio => None,
            Via::Http(map) => Some(map),
        }
    }

    /// An HTTP client with no mapping: its roots mean nothing here.
    fn unmapped(&self) -> bool {
        self.map().is_some_and(<[RootMapping]>::is_empty)
    }
}

/// One client's roots as last listed, and what of them is still to be shown.
pub(crate) struct ClientRoots {
    state: Mutex<State>,
    /// Counts the listings answered (or given up on): a call waits for the first.
    answered: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The current set; `None` until the first listing (or when roots are off).
    current: Option<Arc<RootSet>>,
    /// Refusals of the last listing not yet shown in a result.
    unshown: Vec<Refused>,
}

impl ClientRoots {
    pub(crate) fn new() -> ClientRoots {
        ClientRoots {
            state: Mutex::default(),
            answered: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each update is one assignment: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client is initialized (or said its roots changed): ask for its roots in the
    /// background, when roots are on and it declares them. `map`: see [`Via`].
    pub(crate) fn refresh(
        self: &Arc<Self>,
        engine: &Arc<Engine>,
        peer: Peer<RoleServer>,
        via: Via,
    ) {
        match legacy(engine, &peer, &via) {
            Legacy::Asked => {}
            Legacy::Unmapped => {
                self.replace(
                    engine,
                    Arc::new(RootSet {
                        roots: Vec::new(),
                        refused: vec![Refused {
                            uri: "(every root the client lists)".to_string(),
                            reason: UNMAPPED.to_string(),
                        }],
                    }),
                );
                return;
            }
            Legacy::No => {
                let declared = peer
                    .peer_info()
                    .is_some_and(|info| info.capabilities.roots.is_some());
                if engine.config().roots.mode.is_on() && !declared {
                    tracing::info!(
                        "roots: the client does not declare roots: its sandboxes mount none"
                    );
                }
                return;
            }
        }
        let roots = self.clone();
        let engine = engine.clone();
        tokio::spawn(async move {
            let set = match tokio::time::timeout(LISTING_TIMEOUT, list(&peer)).await {
                Ok(Ok(listed)) => engine.resolve_roots(&listed, via.map()),
                Ok(Err(reason)) => Arc::new(unanswered(reason)),
                Err(_) => Arc::new(unanswered(format!(
                    "the client did not answer roots/list within {} s",
                    LISTING_TIMEOUT.as_secs()
                ))),
            };
            roots.replace(&engine, set);
        });
    }

    /// For a client of revision 2026-07-28: a call of [`ROOT_TOOLS`] that does not carry the
    /// client's listing yet is answered with a request for it; one that does has it resolved and
    /// goes on (`None`). Other calls and clients go on at once.
    #[allow(deprecated)] // roots: deprecated by SEP-2577, still what clients send
    pub(crate) fn ask_within_call(
        &self,
        engine: &Engine,
        request: &mut rmcp::model::CallToolRequestParams,
        context: &rmcp::service::RequestContext<RoleServer>,
        via: &Via,
    ) -> Option<rmcp::model::InputRequiredResult> {
        let policy = &engine.config().roots;
        let stateless = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        if !policy.mode.is_on() || !stateless || !ROOT_TOOLS.contains(&request.name.as_ref()) {
            return None;
        }
        if via.unmapped() {
            return None;
        }
        let declared = context
            .client_capabilities()
            .is_some_and(|caps| caps.roots.is_some());
        if !declared {
            return None;
        }
        let answer = request
            .input_responses
            .as_mut()
            .and_then(|responses| responses.remove(INPUT_KEY));
        let Some(answer) = answer else {
            let mut requests = rmcp::model::InputRequests::new();
            requests.insert(
                INPUT_KEY.to_string(),
                rmcp::model::InputRequest::ListRoots(rmcp::model::ListRootsRequest::default()),
            );
            return Some(rmcp::model::InputRequiredResult::from_input_requests(
                requests,
            ));
        };
        let set = match listed_from(answer) {
            Ok(listed) => engine.resolve_roots(&listed, via.map()),
            Err(reason) => Arc::new(unanswered(reason)),
        };
        self.replace(engine, set);
        None
    }

    /// Makes `set` the current listing; the engine prepares sandboxes with a new one.
    fn replace(&self, engine: &Engine, set: Arc<RootSet>) {
        if let Some((old, new)) = self.swap(set) {
            engine.roots_changed(old.as_deref(), &new);
        }
    }

    /// Makes `set` the current listing; returns the last one and the new one when they differ.
    fn swap(&self, set: Arc<RootSet>) -> Option<(Option<Arc<RootSet>>, Arc<RootSet>)> {
        let changed = {
            let mut state = self.lock();
            // The same listing again (a client that lists with every call) is news to nobody.
            let same = state
                .current
                .as_ref()
                .is_some_and(|now| now.key() == set.key() && now.refused == set.refused);
            (!same).then(|| {
                log(&set);
                state.unshown = set.refused.clone();
                (state.current.replace(set.clone()), set)
            })
        };
        self.answered.send_modify(|n| *n += 1);
        changed
    }

    /// The roots a call's new sandbox mounts (`None`: roots are off or the client lists none),
    /// after the first listing when one is on its way (the call may be handled before the
    /// client's `initialized` notification that asks for it).
    pub(crate) async fn for_call(
        &self,
        engine: &Engine,
        context: &rmcp::service::RequestContext<RoleServer>,
        via: &Via,
    ) -> Option<Arc<RootSet>> {
        if !engine.config().roots.mode.is_on() {
            return None;
        }
        if legacy(engine, &context.peer, via) == Legacy::Asked {
            self.first_listing().await;
        }
        self.lock().current.clone()
    }

    /// Waits for the first listing, at most [`FIRST_LISTING_WAIT`].
    async fn first_listing(&self) {
        let mut seen = self.answered.subscribe();
        let _ = tokio::time::timeout(FIRST_LISTING_WAIT, seen.wait_for(|n| *n > 0)).await;
    }

    /// The refusals not yet shown: taken by the result that shows them.
    pub(crate) fn take_refusals(&self) -> Vec<Refused> {
        std::mem::take(&mut self.lock().unshown)
    }
}

/// What becomes of a client's roots over a connection of a legacy revision.
#[derive(Debug, PartialEq, Eq)]
enum Legacy {
    /// Asked for (or to be): roots are on, the client declared them, its paths mean something.
    Asked,
    /// An HTTP client's roots, with no `SANDBOX_ROOTS_MAP` to say what they are here: all
    /// refused, unasked.
    Unmapped,
    /// Not asked: roots off, the client has none, or it speaks 2026-07-28 (asked within each call).
    No,
}

fn legacy(engine: &Engine, peer: &Peer<RoleServer>, via: &Via) -> Legacy {
    let policy = &engine.config().roots;
    let Some(info) = peer.peer_info() else {
        return Legacy::No;
    };
    if !policy.mode.is_on()
        || info.protocol_version >= rmcp::model::ProtocolVersion::V_2026_07_28
        || info.capabilities.roots.is_none()
    {
        return Legacy::No;
    }
    if via.unmapped() {
        return Legacy::Unmapped;
    }
    Legacy::Asked
}

/// Shows `refused` in a tool result: a line each in its text, and `roots_refused` in its
/// structured content (declared by the tools' output schemas).
pub(crate) fn show_refusals(result: &mut rmcp::model::CallToolResult, refused: &[Refused]) {
    if refused.is_empty() {
        return;
    }
    let lines: String = refused
        .iter()
        .map(|r| format!("\nroot refused: {}: {}", r.uri, r.reason))
        .collect();
    match result.content.first_mut() {
        Some(rmcp::model::ContentBlock::Text(text)) => text.text.push_str(&lines),
        _ => result.content.insert(
            0,
            rmcp::model::ContentBlock::text(lines.trim_start().to_string()),
        ),
    }
    if let Some(serde_json::Value::Object(structured)) = &mut result.structured_content {
        let entries: Vec<_> = refused
            .iter()
            .map(|r| super::outputs::RefusedRootOutput {
                uri: r.uri.clone(),
                reason: r.reason.clone(),
            })
            .collect();
        if let Ok(value) = serde_json::to_value(entries) {
            structured.insert("roots_refused".to_string(), value);
        }
    }
}

/// The client's answer to `roots/list`, asked for over the connection (legacy revisions).
#[allow(deprecated)] // roots: deprecated by SEP-2577, still what clients send
async fn list(peer: &Peer<RoleServer>) -> Result<Vec<Listed>, String> {
    let roots = peer
        .list_roots()
        .await
        .map_err(|e| {
            format!(
                "the client's answer to roots/list failed: {}",
                shown(&e.to_string())
            )
        })?
        .roots;
    Ok(bounded(roots))
}

/// The client's listing carried in a retried call (revision 2026-07-28).
#[allow(deprecated)]
fn listed_from(answer: serde_json::Value) -> Result<Vec<Listed>, String> {
    let result: rmcp::model::ListRootsResult = serde_json::from_value(answer).map_err(|e| {
        format!(
            "the client's answer to roots/list is not a listing of roots: {}",
            shown(&e.to_string())
        )
    })?;
    Ok(bounded(result.roots))
}

/// A listing, bounded (the engine mounts at most [`crate::engine::roots::MAX_ROOTS`]; a few
/// more are kept to be refused by name).
#[allow(deprecated)]
fn bounded(roots: Vec<rmcp::model::Root>) -> Vec<Listed> {
    roots
        .into_iter()
        .take(crate::engine::roots::MAX_ROOTS * 2)
        .map(|root| Listed {
            uri: root.uri,
            name: root.name,
        })
        .collect()
}

/// A listing that did not come: no roots, and why.
fn unanswered(reason: String) -> RootSet {
    RootSet {
        roots: Vec::new(),
        refused: vec![Refused {
            uri: "(roots/list)".to_string(),
            reason,
        }],
    }
}

/// What a listing came to, in the server's log.
fn log(set: &RootSet) {
    if set.roots.is_empty() {
        tracing::info!("roots: none mounted");
    }
    for root in &set.roots {
        tracing::info!(
            "roots: {} = {} ({})",
            root.container_path(),
            root.host.display(),
            if root.read_only {
                "read-only"
            } else {
                "read-write"
            }
        );
    }
    for refused in &set.refused {
        tracing::warn!("roots: refused {}: {}", refused.uri, refused.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refusals_are_shown_once_and_a_call_waits_for_the_first_listing() {
        let roots = Arc::new(ClientRoots::new());
        let waiting = {
            let roots = roots.clone();
            tokio::spawn(async move {
                roots.first_listing().await;
                roots.lock().current.clone()
            })
        };
        roots.swap(Arc::new(unanswered("no answer".into())));
        let set = waiting.await.unwrap().expect("the listing");
        assert!(set.roots.is_empty());
        assert_eq!(roots.take_refusals()[0].reason, "no answer");
        assert!(roots.take_refusals().is_empty());
        // The same listing again is not shown again; another one is.
        assert!(roots
            .swap(Arc::new(unanswered("no answer".into())))
            .is_none());
        assert!(roots.take_refusals().is_empty());
        assert!(roots
            .swap(Arc::new(unanswered("still none".into())))
            .is_some());
        assert_eq!(roots.take_refusals().len(), 1);
    }
}
