//! The warden: a small process beside each server that removes the server's sandboxes once the
//! server is gone, however it went.
//!
//! A server removes what it made when it shuts down, and a started sandbox ends itself when its
//! server's end of the attached stdin closes (`python/runner/supervisor.py`). What neither covers
//! is a server killed outright (SIGKILL, the OOM killer) between creating a container and starting
//! it: a container that was created but never started waits for ever. So a serving process
//! starts its warden (this same program, [`COMMAND`]) in a process group of its own, so that a
//! client that signals the server's group does not reach it, with a pipe as its stdin. The warden
//! does nothing while the pipe is open. When the server is done it writes [`DONE`] and the warden
//! exits at once; when the pipe closes without it, the server died, and the warden removes every
//! container, network and volume that carries the server's instance label, looking again until
//! the engine has listed none for a while (a create the server sent may still complete), then
//! exits. It never touches another instance's sandboxes.
//!
//! Where the server is its container's pid 1 (the server image), killing the container ends the
//! warden too: there `cleanup` and the next server remain the backstop, as everywhere.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use super::Engine;

/// The hidden command line verb that runs a warden: `<program> warden <instance>`.
pub const COMMAND: &str = "warden";
/// What the server writes to its warden when it has removed everything itself.
const DONE: &[u8] = b"done\n";

/// How long the warden keeps looking after the last container it found (a create sent by the
/// dead server may still complete), how often it looks, and the most it spends in all.
const QUIET: Duration = Duration::from_secs(5);
const EVERY: Duration = Duration::from_millis(500);
const AT_MOST: Duration = Duration::from_secs(60);

/// The server's handle on its warden.
#[derive(Debug)]
pub struct Warden {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Warden {
    /// Starts this program as the warden of `instance`.
    pub fn spawn(instance: &str) -> std::io::Result<Warden> {
        use std::os::unix::process::CommandExt;
        let program = std::env::current_exe()?;
        let mut child = Command::new(program)
            .arg(COMMAND)
            .arg(instance)
            .stdin(Stdio::piped())
            // Nothing of the client's: it must not wait for a pipe the warden holds.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a client ending the server's group leaves it running.
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Warden { child, pipe })
    }

    /// Tells the warden that nothing is left to remove, and waits (briefly, without holding a
    /// runtime thread) for it to exit.
    pub async fn release(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(DONE);
        }
        for _ in 0..50 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::debug!("the warden did not exit at once: it removes what is left and exits");
    }
}

/// Whether `instance` is an instance id this program makes (32 hexadecimal digits).
pub fn is_instance(instance: &str) -> bool {
    instance.len() == 32 && instance.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The warden's life: waits for its server to say it is done or to die; in the second case
/// removes everything of `instance`. Reads the pipe on a thread of its own.
pub async fn watch(engine: Engine, instance: &str) {
    let (told, hear) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = told.send(server_said_done(std::io::stdin().lock()));
    });
    if matches!(hear.await, Ok(true)) {
        return;
    }
    engine
        .remove_instance(instance, QUIET, EVERY, AT_MOST)
        .await;
}

/// Reads the server's pipe until it closes: true when the server wrote [`DONE`] first.
fn server_said_done(mut pipe: impl Read) -> bool {
    let mut heard = Vec::new();
    let mut buffer = [0u8; 64];
    loop {
        match pipe.read(&mut buffer) {
            Ok(0) => return false,
            Ok(n) => {
                heard.extend_from_slice(&buffer[..n]);
                if heard.windows(DONE.len()).any(|w| w == DONE) {
                    return true;
                }
                // Only the server writes here, and only DONE: keep no more than it.
                let keep = heard.len().saturating_sub(DONE.len());
                heard.drain(..keep);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_releases_the_warden_and_a_closed_pipe_sets_it_to_work() {
        assert!(server_said_done(&b"done\n"[..]));
        assert!(server_said_done(&b"xxdone\n"[..]));
        assert!(!server_said_done(&b""[..]));
        assert!(!server_said_done(&b"don"[..]));
        // DONE split across reads.
        struct Trickle(Vec<u8>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0.remove(0);
                Ok(1)
            }
        }
        assert!(server_said_done(Trickle(b"done\n".to_vec())));
        assert!(!server_said_done(Trickle(b"dine\n".to_vec())));
    }

    #[test]
    fn only_instance_ids_are_accepted() {
        assert!(is_instance("0123456789abcdef0123456789abcdef"));
        assert!(!is_instance("0123456789abcdef"));
        assert!(!is_instance("0123456789abcdef0123456789abcdeg"));
        assert!(!is_instance(""));
    }
}
