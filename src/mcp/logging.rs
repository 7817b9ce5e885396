//! MCP logging: messages to the client at or above the level it set with `logging/setLevel`.
//!
//! What is logged is what a person watching the client would want to know while a call runs:
//! the steps of preparing a sandbox and installing dependencies (`info`, the same text progress
//! notifications carry), the code's output while it runs (`info`, see `notices`) and an
//! execution that lost the session's variables or files (`warning`).
//! Until the client sets a level, only warnings and worse are sent.
//!
//! rmcp marks logging deprecated: revision 2026-07-28 (SEP-2577) drops it. Every revision this
//! server offers over HTTP, and every stdio client today, still has it.
#![allow(deprecated)]

use std::sync::atomic::{AtomicU8, Ordering};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};

/// The logger name messages carry.
const LOGGER: &str = "python-code-sandbox";

/// The least severe level one client wants.
#[derive(Debug)]
pub struct ClientLog {
    minimum: AtomicU8,
}

impl Default for ClientLog {
    fn default() -> Self {
        ClientLog {
            minimum: AtomicU8::new(rank(LoggingLevel::Warning)),
        }
    }
}

impl ClientLog {
    pub fn set(&self, level: LoggingLevel) {
        self.minimum.store(rank(level), Ordering::Relaxed);
    }

    /// The log of one request. Revision 2026-07-28 has no `logging/setLevel`: a request opts in
    /// with a level in its `_meta`, and a request of that revision without one gets no messages.
    /// Earlier revisions get what `logging/setLevel` asked for.
    pub fn for_request(&self, context: &RequestContext<RoleServer>) -> RequestLog {
        let minimum = match context.meta.log_level() {
            Some(level) => Some(rank(level)),
            None if context.meta.contains_key(PER_REQUEST_REVISION) => None,
            None => Some(self.minimum.load(Ordering::Relaxed)),
        };
        RequestLog {
            peer: context.peer.clone(),
            minimum,
        }
    }
}

/// The `_meta` key that marks a request of revision 2026-07-28 (which carries its revision).
const PER_REQUEST_REVISION: &str = "io.modelcontextprotocol/protocolVersion";

/// Where one request's log messages go, and from which level.
#[derive(Clone)]
pub struct RequestLog {
    peer: Peer<RoleServer>,
    /// `None`: the request did not opt in to messages.
    minimum: Option<u8>,
}

impl RequestLog {
    fn allows(&self, level: LoggingLevel) -> bool {
        self.minimum.is_some_and(|minimum| rank(level) >= minimum)
    }

    /// Whether the client wants `info` messages (the steps of a call).
    pub fn wants_info(&self) -> bool {
        self.allows(LoggingLevel::Info)
    }

    pub fn warning(&self, message: &str) {
        self.send(LoggingLevel::Warning, message);
    }

    /// Sends an `info` message if the client wants it, and waits until it is written (so what is
    /// sent next, the call's result too, comes after it).
    pub async fn info_now(&self, message: &str) {
        if self.allows(LoggingLevel::Info) {
            let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, message.into())
                .with_logger(LOGGER);
            let _ = self.peer.notify_logging_message(param).await;
        }
    }

    /// Sends `message` at `level` if the client wants it; never waits for the client.
    fn send(&self, level: LoggingLevel, message: &str) {
        if !self.allows(level) {
            return;
        }
        let param = LoggingMessageNotificationParam::new(level, message.into()).with_logger(LOGGER);
        let peer = self.peer.clone();
        tokio::spawn(async move {
            let _ = peer.notify_logging_message(param).await;
        });
    }
}

/// Severity order, as RFC 5424 lists the levels (debug least severe).
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_order_by_severity() {
        let levels = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        let ranks: Vec<u8> = levels.into_iter().map(rank).collect();
        assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{ranks:?}");
        assert_eq!(
            ClientLog::default().minimum.load(Ordering::Relaxed),
            rank(LoggingLevel::Warning)
        );
    }
}
