//! Hosts a session asks for up front (`sandbox_initialize {network: [...]}`): allowed at once when
//! the allowlist names them, else asked of the user (the call waits for the answers, one
//! question at a time, at most [`ANSWER_WAIT`] each).

use std::time::Duration;

use super::Engine;
use crate::config::egress::{target_of, Static, Target};
use crate::config::{parse_host_port, NetworkPolicy};
use crate::engine::egress::{ConsentAnswer, Consideration, SessionNetwork};
use crate::engine::sessions::Scope;
use crate::engine::EngineError;

/// How long a question asked up front is waited for; unanswered, the host stays pending.
const ANSWER_WAIT: Duration = Duration::from_secs(120);

/// At most this many hosts in one request.
const MAX_HOSTS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatus {
    Allowed,
    Declined,
    Pending,
    Refused,
}

impl HostStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HostStatus::Allowed => "allowed",
            HostStatus::Declined => "declined",
            HostStatus::Pending => "pending",
            HostStatus::Refused => "refused",
        }
    }
}

/// What became of one host a session asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRequest {
    pub host: String,
    pub port: u16,
    pub status: HostStatus,
    pub reason: Option<String>,
}

impl Engine {
    /// Asks for `hosts` (`host[:port]`, 443 by default) for the session `id`.
    pub async fn request_hosts(
        &self,
        scope: Scope<'_>,
        id: &str,
        hosts: &[String],
    ) -> Result<Vec<HostRequest>, EngineError> {
        if self.config.network != NetworkPolicy::Allowlist {
            return Err(EngineError::Egress(format!(
                "hosts can be asked for only with SANDBOX_NETWORK=allowlist (it is {})",
                self.config.network.as_str()
            )));
        }
        if hosts.len() > MAX_HOSTS {
            return Err(EngineError::Egress(format!(
                "at most {MAX_HOSTS} hosts can be asked for at once"
            )));
        }
        let (_, session) = self.session(scope, id)?;
        let mut answers = Vec::with_capacity(hosts.len());
        for entry in hosts {
            let parsed = parse_host_port(entry.trim(), 443)
                .and_then(|(host, port)| target_of(&host).map(|t| (t, port)));
            let Some((target, port)) = parsed else {
                answers.push(HostRequest {
                    host: entry.clone(),
                    port: 0,
                    status: HostStatus::Refused,
                    reason: Some(format!(
                        "{entry:?} is not host[:port] (a name or an IP address, and a port)"
                    )),
                });
                continue;
            };
            let host = match &target {
                Target::Name(name) => name.clone(),
                Target::Address(address) => address.to_string(),
            };
            let (status, reason) = match self.config.egress.decide(&target, port) {
                Static::Allowed => (HostStatus::Allowed, None),
                Static::Refused(why) => (HostStatus::Refused, Some(why)),
                Static::Ask => self.ask_up_front(&session.network, &host, port).await,
            };
            answers.push(HostRequest {
                host,
                port,
                status,
                reason,
            });
        }
        Ok(answers)
    }

    async fn ask_up_front(
        &self,
        network: &SessionNetwork,
        host: &str,
        port: u16,
    ) -> (HostStatus, Option<String>) {
        let declined = || {
            (
                HostStatus::Declined,
                Some("the user declined it for this session".into()),
            )
        };
        let asker = match network.consider(host, port, Ok(())) {
            Consideration::Approved => return (HostStatus::Allowed, None),
            Consideration::Declined => return declined(),
            Consideration::Pending => {
                return (
                    HostStatus::Pending,
                    Some("the user has not answered yet".into()),
                )
            }
            Consideration::Unable(why) => {
                return (
                    HostStatus::Refused,
                    Some(format!(
                        "it needs the user's consent (SANDBOX_EGRESS_ASK), and this MCP client cannot ask its user ({why})"
                    )),
                )
            }
            Consideration::Bounded(why) => return (HostStatus::Refused, Some(why)),
            Consideration::Ask(asker) => asker,
        };
        let answer = tokio::time::timeout(ANSWER_WAIT, asker.ask(host, port))
            .await
            .unwrap_or(ConsentAnswer::Cancelled);
        network.answer(host, port, &answer);
        match answer {
            ConsentAnswer::Accepted => (HostStatus::Allowed, None),
            ConsentAnswer::Declined => declined(),
            ConsentAnswer::Cancelled => (
                HostStatus::Pending,
                Some(
                    "the user dismissed the question or did not answer in time: it is asked again \
                     on the next attempt"
                        .into(),
                ),
            ),
            ConsentAnswer::Unavailable(why) => (HostStatus::Refused, Some(why)),
        }
    }
}
