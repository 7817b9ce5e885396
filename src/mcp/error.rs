//! Why a server did not start or stopped serving. The binary's edge decides what each means for
//! the process (message, exit status).

use std::net::SocketAddr;

use crate::engine::files_dir::FilesDirError;
use crate::pypi::SearchError;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The directory for saved files cannot be trusted.
    #[error(transparent)]
    FilesDir(#[from] FilesDirError),
    /// The package index settings are unusable.
    #[error(transparent)]
    PackageIndex(#[from] SearchError),
    /// A dependency set of `SANDBOX_PRELOAD` is invalid.
    #[error("SANDBOX_PRELOAD: {0}")]
    Preload(#[source] crate::engine::EngineError),
    /// The `--http` address is no address, or one the configuration does not allow.
    #[error("{0}")]
    Address(String),
    /// The address is fine but cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// `SANDBOX_NETWORK=allowlist`, and the egress proxy cannot start.
    #[error("SANDBOX_NETWORK=allowlist: {0}")]
    Egress(#[source] crate::engine::EngineError),
    /// The tokens file (`SANDBOX_HTTP_TOKENS_FILE`) is unusable.
    #[error("SANDBOX_HTTP_TOKENS_FILE: {0}")]
    Principals(String),
    /// OAuth is configured, and the issuer's keys cannot be loaded (`SANDBOX_OAUTH_JWKS`).
    #[error("{0}")]
    OAuth(String),
    /// The stdio client's `initialize` failed.
    #[error("MCP session failed to start: {0}")]
    Handshake(#[source] Box<rmcp::service::ServerInitializeError>),
}

impl ServeError {
    /// Whether the operator's settings or arguments are at fault (rather than the environment or
    /// the client).
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            ServeError::FilesDir(_)
                | ServeError::PackageIndex(_)
                | ServeError::Address(_)
                | ServeError::Preload(_)
                | ServeError::Egress(_)
                | ServeError::Principals(_)
                | ServeError::OAuth(_)
        )
    }
}
