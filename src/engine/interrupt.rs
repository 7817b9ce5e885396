//! Interrupting a sandbox's code: SIGINT to its supervisor, which passes it on to the runner
//! (KeyboardInterrupt in the code), then a grace for the answer before the caller kills the
//! code's processes.
//!
//! One SIGINT can be lost: Python drops a KeyboardInterrupt raised where it cannot propagate (a
//! fork hook, a `__del__`, a weakref callback; under gVisor a signal that comes while code forks
//! is often handled in a fork hook), and code may swallow one (`except:`). So, as a user at a
//! terminal presses Ctrl-C again, the interrupt is repeated every [`REPEAT`] while the grace runs;
//! the runner ignores a repeat that comes once the code is done (`on_sigint` in
//! python/runner/execute.py), and a runner that is still starting ignores SIGINT altogether
//! (python/runner/supervisor.py).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior, Sleep};

use super::backend::{Backend, SandboxId};

/// How long the runner gets to answer after SIGINT before its processes are killed. Longer than
/// the runner's own clean-up budget after an interrupt (2 s, `kill_strays` in
/// python/runner/execute.py), so a runner that cleaned up for all of it, under load, still
/// answers in time and keeps its state.
pub const GRACE: Duration = Duration::from_secs(3);
/// The grace under gVisor, where every system call of the signal's way in, the clean-up and the
/// answer costs several times runc's (on the ptrace platform, under load, past 3 s).
pub const GRACE_GVISOR: Duration = Duration::from_secs(10);
/// How often the interrupt is sent again while the grace runs.
const REPEAT: Duration = Duration::from_secs(1);

/// The grace after SIGINT for a sandbox under `runtime` (see [`GRACE`]).
pub fn grace(runtime: Option<&str>) -> Duration {
    if runtime.is_some_and(super::platform::is_gvisor_name) {
        GRACE_GVISOR
    } else {
        GRACE
    }
}

/// One interruption of a sandbox's code: its grace, and the repeats of the interrupt within it.
pub struct Interruption {
    backend: Arc<dyn Backend>,
    id: SandboxId,
    grace: Pin<Box<Sleep>>,
    repeat: Interval,
}

impl Interruption {
    /// Sends the interrupt; the grace starts once it is sent.
    pub async fn start(backend: Arc<dyn Backend>, id: SandboxId, grace: Duration) -> Self {
        send(backend.as_ref(), &id).await;
        let mut repeat = tokio::time::interval_at(Instant::now() + REPEAT, REPEAT);
        repeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Interruption {
            backend,
            id,
            grace: Box::pin(tokio::time::sleep(grace)),
            repeat,
        }
    }

    /// What `answer` gives, or `None` once the grace is over; the interrupt is repeated meanwhile.
    pub async fn within<T>(&mut self, answer: impl Future<Output = T>) -> Option<T> {
        tokio::pin!(answer);
        loop {
            tokio::select! {
                r = &mut answer => return Some(r),
                () = &mut self.grace => return None,
                _ = self.repeat.tick() => {
                    tracing::debug!(sandbox = %self.id, "no answer yet: interrupting again");
                    send(self.backend.as_ref(), &self.id).await;
                }
            }
        }
    }
}

/// SIGINT to the sandbox's supervisor (a failure is logged: the grace then runs out).
async fn send(backend: &dyn Backend, id: &SandboxId) {
    if let Err(e) = backend.interrupt(id).await {
        tracing::warn!(sandbox = %id, "interrupt failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_is_longer_under_gvisor_and_outlasts_the_runners_clean_up() {
        assert_eq!(grace(None), GRACE);
        assert_eq!(grace(Some("runc")), GRACE);
        assert_eq!(grace(Some("runsc")), GRACE_GVISOR);
        assert_eq!(grace(Some("runsc-ptrace")), GRACE_GVISOR);
        // kill_strays in python/runner/execute.py spends up to 2 s after the interrupt.
        assert!(GRACE > Duration::from_secs(2));
        assert!(GRACE_GVISOR > GRACE);
    }
}
