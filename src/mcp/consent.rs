//! The user's consent to a host, asked through the MCP client: an elicitation (form mode, no
//! fields: the user accepts or declines) sent to the client that owns the session.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{ElicitationMode, Peer, RoleServer};

use crate::engine::egress::{ConsentAnswer, ConsentAsker};

/// How long a question waits for the user; unanswered, it is asked again on the next attempt.
const QUESTION_TIMEOUT: Duration = Duration::from_secs(600);

/// Asks through one MCP client.
pub struct ElicitingAsker {
    peer: Peer<RoleServer>,
}

impl ElicitingAsker {
    pub fn for_client(peer: Peer<RoleServer>) -> Arc<dyn ConsentAsker> {
        Arc::new(ElicitingAsker { peer })
    }
}

impl ConsentAsker for ElicitingAsker {
    fn unable(&self) -> Option<String> {
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
