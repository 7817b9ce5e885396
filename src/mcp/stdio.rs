//! MCP over stdin/stdout: one client, which reaches every session.

use std::future::Future;

use rmcp::ServiceExt;

use super::error::ServeError;
use super::oversize;
use super::running::Running;
use super::SandboxServer;
use crate::config::Config;

/// Serves MCP over stdio until the client closes stdin or `shutdown` resolves (with what asked
/// for it, e.g. the signal's name); then removes every sandbox this server made.
pub async fn serve_stdio(
    config: Config,
    shutdown: impl Future<Output = &'static str>,
) -> Result<(), ServeError> {
    let running = Running::start(config)?.ready().await?;
    // `initialize` is answered at once: nothing above waited for Docker.
    let server = SandboxServer::new(running.engine.clone(), running.pypi.clone());
    tokio::pin!(shutdown);
    let outcome = tokio::select! {
        session = server.serve(oversize::guarded_stdio()) => match session {
            Ok(session) => {
                let token = session.cancellation_token();
                tokio::select! {
                    quit = session.waiting() => {
                        tracing::info!("client disconnected ({quit:?})");
                    }
                    reason = &mut shutdown => {
                        tracing::info!("{reason}: shutting down");
                        token.cancel();
                    }
                }
                Ok(())
            }
            Err(e) => Err(ServeError::Handshake(Box::new(e))),
        },
        reason = &mut shutdown => {
            tracing::info!("{reason} before the MCP session started: shutting down");
            Ok(())
        }
    };
    running.stop().await;
    outcome
}
