//! The user's consent to a host, asked through the MCP client: an elicitation (form mode, no
//! fields: the user accepts or declines) sent to the client that owns the session.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema, ProtocolVersion};
use rmcp::service::{ElicitationMode, Peer, RequestContext, RoleServer};

use crate::engine::egress::{ConsentAnswer, ConsentAsker};

/// How long a question waits for the user; unanswered, it is asked again on the next attempt.
const QUESTION_TIMEOUT: Duration = Duration::from_secs(600);

/// Asks through one MCP client.
pub struct ElicitingAsker {
    peer: Peer<RoleServer>,
    /// The client speaks a revision without server-to-client requests (2026-07-28).
    sessionless: bool,
}

impl ElicitingAsker {
    /// Asks through the client that made this request.
    pub fn for_client(context: &RequestContext<RoleServer>) -> Arc<dyn ConsentAsker> {
        let sessionless = context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        Arc::new(ElicitingAsker {
            peer: context.peer.clone(),
            sessionless,
        })
    }
}

impl ConsentAsker for ElicitingAsker {
    fn unable(&self) -> Option<String> {
        if self.sessionless {
            return Some(
                "it speaks MCP 2026-07-28, in which a server cannot send requests to its client"
                    .into(),
            );
        }
        if self
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            None
        } else {
            Some("it did not declare the elicitation capability".into())
        }
    }

    fn ask(&self, host: &str, port: u16) -> BoxFuture<'static, ConsentAnswer> {
        let peer = self.peer.clone();
        let message = format!(
            "Allow this sandbox to reach {host}:{port}? The code running in your sandbox session \
             asked to connect to it; the answer holds for this session only."
        );
        Box::pin(async move {
            let params = ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: ElicitationSchema::builder().build_unchecked(),
            };
            match peer
                .create_elicitation_with_timeout(params, Some(QUESTION_TIMEOUT))
                .await
            {
                Ok(result) => match result.action {
                    ElicitationAction::Accept => ConsentAnswer::Accepted,
                    ElicitationAction::Decline => ConsentAnswer::Declined,
                    ElicitationAction::Cancel => ConsentAnswer::Cancelled,
                    _ => ConsentAnswer::Cancelled,
                },
                Err(e) => ConsentAnswer::Unavailable(format!("the question failed: {e}")),
            }
        })
    }
}
