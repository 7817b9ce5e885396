//! The workspace file tools of a session: write, read and list, as the sandbox's user, through
//! the session's runner (so they wait while it runs code).

use super::Engine;
use crate::engine::backend;
use crate::engine::outcome::Artifact;
use crate::engine::sandbox::Listing;
use crate::engine::sessions::{workspace_relative, Scope};
use crate::engine::{artifacts, EngineError};

impl Engine {
    /// Writes a file into the workspace of a session of the scope (parents created), as the
    /// sandbox user.
    pub async fn write_file(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<String, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = workspace_relative(path)?;
        let limit = self.config.files.max_file_bytes;
        if content.len() as u64 > limit {
            return Err(EngineError::File {
                path,
                reason: format!(
                    "{} bytes is more than the {limit}-byte limit",
                    content.len()
                ),
            });
        }
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let mut written = artifacts::write_whole(&mut sandbox, &path, content).await;
        self.end_if_lost(&full_id, &mut written);
        match written? {
            Ok(_) => Ok(format!("{}/{path}", backend::paths::WORKSPACE)),
            Err(reason) => Err(EngineError::File {
                path,
                reason: runner_reason(&reason),
            }),
        }
    }

    /// Reads one file of the workspace of a session of the scope, within the return limit.
    pub async fn read_file(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
    ) -> Result<Artifact, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = workspace_relative(path)?;
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let limit = self.config.files.return_max_file_bytes;
        let mut read = artifacts::read_whole(&mut sandbox, &path, limit).await;
        self.end_if_lost(&full_id, &mut read);
        let content = read?.map_err(|reason| EngineError::File {
            path: path.clone(),
            reason: runner_reason(&reason),
        })?;
        Ok(Artifact {
            size: content.len() as u64,
            mime_type: artifacts::sniff_mime(&content, &path).to_string(),
            path,
            content: Some(content),
            saved_to: None,
            note: None,
            figure: false,
        })
    }

    /// Lists a directory of the workspace of a session of the scope (`""` for the workspace
    /// itself).
    pub async fn list_files(
        &self,
        scope: Scope<'_>,
        id: &str,
        path: &str,
    ) -> Result<Listing, EngineError> {
        let (full_id, session) = self.session(scope, id)?;
        let path = if path.trim().trim_matches('/').is_empty() || path.trim() == "." {
            String::new()
        } else {
            workspace_relative(path)?
        };
        let mut sandbox = session.sandbox.lock().await;
        session.touch();
        let mut result = sandbox.list(&path).await;
        self.end_if_lost(&full_id, &mut result);
        let mut listing = result?;
        listing.error = listing.error.as_deref().map(runner_reason);
        Ok(listing)
    }
}

/// A reason the runner gave (in the sandbox, the code can make it say anything) as one line of
/// an error a model reads: escaped and bounded, so it cannot write a line of its own.
fn runner_reason(reason: &str) -> String {
    crate::text::log_excerpt(reason, 300)
}
