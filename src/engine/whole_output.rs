//! Output longer than its reader reads. A model gets the head and tail of each stream (the MCP
//! layer cuts them, within `SANDBOX_MODEL_OUTPUT`), so the whole, as captured (up to
//! `SANDBOX_MAX_OUTPUT`), is kept where it can be read: saved on the host beside the run's files,
//! and in a session also written into its workspace, where the model can search or page it from
//! code.
//!
//! In the workspace the two streams go to fixed names, overwritten by the next execution whose
//! output is cut: the workspace is a tmpfs the code's own files share, and one name per execution
//! would fill it over a long session. Both streams are written together, so the pair there always
//! belongs to one execution. The write happens after the execution's changes were collected and
//! before the next one takes its snapshot, so it never shows as a change the code made.

use super::artifacts::{self, Destination};
use super::outcome::{KeptStream, WholeOutput};
use super::sandbox::Sandbox;
use crate::config::FilePolicy;
use crate::text;

/// The workspace directory (relative to `/workspace`) a session's whole output is written to.
pub const WORKSPACE_DIR: &str = ".outputs";

/// Whether a reader of `budget` characters sees only part of this output (stdout and stderr
/// share the budget, as [`text::share_budget`] does).
pub fn is_cut(stdout: &[u8], stderr: &[u8], budget: usize) -> bool {
    text::output_chars(stdout).saturating_add(text::output_chars(stderr)) > budget
}

/// Keeps both streams whole: saved on the host when saving is on, and written into the session's
/// workspace when there is one (`sandbox`). Never fails: what could not be kept says why.
pub async fn keep(
    sandbox: Option<&mut Sandbox>,
    stdout: &[u8],
    stderr: &[u8],
    policy: &FilePolicy,
    destination: Destination<'_>,
) -> WholeOutput {
    let streams = [("stdout", stdout), ("stderr", stderr)];
    let mut kept = [KeptStream::default(), KeptStream::default()];
    match &policy.persist_dir {
        None => {
            for k in &mut kept {
                k.notes
                    .push("not saved on the host (SANDBOX_FILES_DIR is empty)".to_string());
            }
        }
        Some(root) => {
            // No sweep removes the run's directory while it is written into.
            let saving = destination.retention.map(|r| r.saving(destination.run_dir));
            let stamp = artifacts::unique_stamp();
            for ((name, bytes), k) in streams.iter().zip(&mut kept) {
                let relative = format!("outputs/{stamp}-{name}.txt");
                match artifacts::save(root, destination.run_dir, &relative, bytes) {
                    Ok(path) => k.saved_to = Some(path),
                    Err(e) => {
                        tracing::warn!(stream = name, "could not save the whole output: {e}");
                        k.notes.push(format!("not saved on the host: {e}"));
                    }
                }
            }
            drop(saving);
            if let Some(retention) = destination.retention {
                retention.saved();
            }
        }
    }
    if let Some(sandbox) = sandbox {
        for ((name, bytes), k) in streams.iter().zip(&mut kept) {
            let path = format!("{WORKSPACE_DIR}/{name}.txt");
            match artifacts::write_whole(sandbox, &path, bytes).await {
                Ok(Ok(_)) => k.workspace_path = Some(path),
                Ok(Err(reason)) => k
                    .notes
                    .push(format!("not written in the workspace: {reason}")),
                Err(e) => k.notes.push(format!("not written in the workspace: {e}")),
            }
        }
    }
    let [stdout, stderr] = kept;
    WholeOutput { stdout, stderr }
}
