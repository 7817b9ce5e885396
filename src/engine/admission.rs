//! Admission: how many sandboxes this server runs at once and starts at once, and what a call
//! does beyond that (it waits its turn, within its time), instead of asking the engine for more
//! than the host holds and passing the engine's failures on.
//!
//! The bounds come from the host and from what a sandbox costs there ([`Capacity::of`]):
//!
//! - **memory**: the engine's host memory, less a reserve, over the memory limit every sandbox
//!   may use (a bound the kernel enforces, not an estimate), so that sandboxes filling their
//!   limits never run the host out of memory;
//! - **tasks** (local engines): the kernel's task limit (`pid_max`, `threads-max`) less the
//!   tasks running now and a reserve, over what one sandbox may hold: its pids limit plus its
//!   runtime's own tasks on the host, measured on an idle sandbox here (runc: the shim, 12;
//!   gVisor: shim, sentry and gofer, 48);
//! - **starts**: one start at a time per CPU the engine has (at most 4): a start is CPU-bound
//!   in the engine and the runtime, and more at once only make each slower and, under gVisor,
//!   fail;
//! - `SANDBOX_MAX_SANDBOXES` replaces the computed bound on live sandboxes when it is set.
//!
//! Every sandbox for the agent's code holds an [`Admitted`] from before its container is created
//! until it is removed; a start holds a start slot until its runner is ready or it failed. Calls
//! queue in arrival order (tokio's semaphores are fair), at most [`QUEUE_MAX`] at once; a call
//! that does not get its sandbox within its time gets [`Refusal`], which names the bound. The
//! pool and prepared sandboxes never wait: they start only when a slot is free and no call is
//! waiting.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Calls waiting for a sandbox at most; one more is refused at once.
pub const QUEUE_MAX: usize = 256;
/// Host memory kept out of the bound (the server, the engine, the page cache).
const MEMORY_RESERVE: u64 = 1 << 30;
/// Host tasks kept out of the bound (the engine's own, the host's).
const TASK_RESERVE: u64 = 2048;
/// The most starts at once, whatever the CPUs.
const STARTS_MAX: usize = 4;
/// A runtime's own tasks on the host for one idle sandbox, measured on this project's test
/// machine (`/proc/loadavg`'s task count before and after starting four sandboxes).
const RUNC_TASKS: u64 = 12;
const GVISOR_TASKS: u64 = 48;

/// What the host has, as far as it is known (a remote engine's task limits are not).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub memory_bytes: Option<u64>,
    pub cpus: Option<usize>,
    /// The kernel's task limit, and the tasks running now.
    pub tasks: Option<(u64, u64)>,
}

impl Host {
    /// This machine's task limit and use, from /proc (None where it cannot be read).
    pub fn local_tasks() -> Option<(u64, u64)> {
        let read =
            |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
        let limit = read("/proc/sys/kernel/pid_max")?.min(read("/proc/sys/kernel/threads-max")?);
        // The fourth field of /proc/loadavg: running/total scheduling entities.
        let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
        let total = loadavg
            .split_whitespace()
            .nth(3)?
            .split('/')
            .nth(1)?
            .parse()
            .ok()?;
        Some((limit, total))
    }
}

/// What one sandbox may cost the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    pub memory_bytes: u64,
    pub tasks: u64,
}

impl Cost {
    /// A sandbox with these limits under the runtime named (`runsc...` is gVisor).
    pub fn of(memory_bytes: u64, pids: u64, runtime: Option<&str>) -> Cost {
        let own = if runtime.is_some_and(super::platform::is_gvisor_name) {
            GVISOR_TASKS
        } else {
            RUNC_TASKS
        };
        Cost {
            memory_bytes: memory_bytes.max(1),
            tasks: pids + own,
        }
    }
}

/// The bounds, and what set the one on live sandboxes (in words for the log, `doctor` and
/// errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub sandboxes: usize,
    pub starts: usize,
    pub why: String,
}

impl Capacity {
    /// The bounds for `host` and `cost`; `configured`: `SANDBOX_MAX_SANDBOXES`.
    pub fn of(host: &Host, cost: &Cost, configured: Option<usize>) -> Capacity {
        let starts = host.cpus.unwrap_or(1).clamp(1, STARTS_MAX);
        if let Some(n) = configured {
            return Capacity {
                sandboxes: n.max(1),
                starts,
                why: format!("SANDBOX_MAX_SANDBOXES={n}"),
            };
        }
        let mut bounds: Vec<(usize, String)> = Vec::new();
        if let Some(memory) = host.memory_bytes {
            let n = memory.saturating_sub(MEMORY_RESERVE) / cost.memory_bytes;
            bounds.push((
                n as usize,
                format!(
                    "memory: {} MiB on the engine's host, less {} MiB, over {} MiB per sandbox",
                    memory >> 20,
                    MEMORY_RESERVE >> 20,
                    cost.memory_bytes >> 20
                ),
            ));
        }
        if let Some((limit, used)) = host.tasks {
            let n = limit.saturating_sub(used).saturating_sub(TASK_RESERVE) / cost.tasks.max(1);
            bounds.push((
                n as usize,
                format!(
                    "tasks: the kernel's limit {limit}, {used} running, less {TASK_RESERVE}, over {} \
                     per sandbox",
                    cost.tasks
                ),
            ));
        }
        match bounds.into_iter().min_by_key(|(n, _)| *n) {
            Some((n, why)) => Capacity {
                sandboxes: n.max(1),
                starts,
                why,
            },
            None => Capacity {
                sandboxes: 16,
                starts,
                why: "the engine says nothing of its host: 16".into(),
            },
        }
    }
}

/// What the admission holds now (for `/metrics` and `doctor`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Sandboxes holding a share, and the bound.
    pub live: usize,
    pub limit: usize,
    /// Calls waiting for a share.
    pub waiting: usize,
    /// Calls refused (queue full or out of time), and starts tried again, so far.
    pub refused: u64,
    pub retried: u64,
    /// Recycled sandboxes waiting for their caller.
    pub recycled: usize,
}

/// A call that got no sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "no sandbox could be had within {waited_s}s: this server runs at most {limit} sandboxes \
         at once ({why}), {live} of them live, and starts at most {starts} at once; {waiting} \
         calls were waiting. Try again, or the operator raises SANDBOX_MAX_SANDBOXES or gives \
         the engine's host more capacity"
    )]
    Timeout {
        waited_s: u64,
        limit: usize,
        live: usize,
        starts: usize,
        why: String,
        waiting: usize,
    },
    #[error(
        "{waiting} calls are already waiting for a sandbox (at most {max}): this server runs at \
         most {limit} sandboxes at once ({why}). Try again shortly"
    )]
    QueueFull {
        waiting: usize,
        max: usize,
        limit: usize,
        why: String,
    },
    /// The server's own work found no free share (it tries again later).
    #[error("no share of the server's capacity is free for work ahead of demand")]
    Busy,
}

/// A live sandbox's share of the bound; given back when dropped (with the sandbox).
#[derive(Debug)]
pub struct Admitted {
    _live: OwnedSemaphorePermit,
}

/// A start in progress; given back when dropped.
#[derive(Debug)]
pub struct Starting {
    _start: OwnedSemaphorePermit,
}

/// A call in the queue: counted from `join` until dropped.
struct Queued<'a> {
    count: &'a AtomicUsize,
    /// Calls that were waiting when this one came.
    ahead: usize,
}

impl<'a> Queued<'a> {
    fn join(count: &'a AtomicUsize) -> Self {
        let ahead = count.fetch_add(1, Ordering::SeqCst);
        Queued { count, ahead }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The bounds in force, and who waits for them.
#[derive(Debug)]
pub struct Admission {
    capacity: Capacity,
    live: Arc<Semaphore>,
    starts: Arc<Semaphore>,
    waiting: AtomicUsize,
    refused: AtomicU64,
}

impl Admission {
    pub fn new(capacity: Capacity) -> Admission {
        Admission {
            live: Arc::new(Semaphore::new(capacity.sandboxes)),
            starts: Arc::new(Semaphore::new(capacity.starts)),
            capacity,
            waiting: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// Sandboxes holding a share now.
    pub fn live(&self) -> usize {
        self.capacity.sandboxes - self.live.available_permits()
    }

    /// Calls waiting for a sandbox now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Calls refused so far (queue full or out of time).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// A share and a start slot for a call, waiting in turn until `deadline`.
    pub async fn admit(&self, deadline: Instant) -> Result<(Admitted, Starting), Refusal> {
        let started = Instant::now();
        // Counted while it waits, however the wait ends (a cancelled call's future is dropped).
        let queued = Queued::join(&self.waiting);
        if queued.ahead >= QUEUE_MAX {
            drop(queued);
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Refusal::QueueFull {
                waiting: self.waiting(),
                max: QUEUE_MAX,
                limit: self.capacity.sandboxes,
                why: self.capacity.why.clone(),
            });
        }
        let both = async {
            let live = self.live.clone().acquire_owned().await;
            let start = self.starts.clone().acquire_owned().await;
            (live, start)
        };
        let got = tokio::time::timeout_at(deadline.into(), both).await;
        drop(queued);
        match got {
            // The semaphores are never closed.
            Ok((Ok(live), Ok(start))) => Ok((Admitted { _live: live }, Starting { _start: start })),
            _ => {
                self.refused.fetch_add(1, Ordering::SeqCst);
                Err(Refusal::Timeout {
                    waited_s: started.elapsed().as_secs(),
                    limit: self.capacity.sandboxes,
                    live: self.live(),
                    starts: self.capacity.starts,
                    why: self.capacity.why.clone(),
                    waiting: self.waiting(),
                })
            }
        }
    }

    /// A share and a start slot for the server's own work ahead of demand (the pool, prepared
    /// sandboxes), only when both are free now and no call waits.
    pub fn try_admit(&self) -> Option<(Admitted, Starting)> {
        if self.waiting() > 0 {
            return None;
        }
        let live = self.live.clone().try_acquire_owned().ok()?;
        let start = self.starts.clone().try_acquire_owned().ok()?;
        Some((Admitted { _live: live }, Starting { _start: start }))
    }

    /// Whether a call is waiting for a share (what holds one idly should give it up).
    pub fn wanted(&self) -> bool {
        self.waiting() > 0 && self.live.available_permits() == 0
    }
}

#[cfg(test)]
mod tests {
    //! The admission state machine without an engine: bounds, queueing in order, refusals, and
    //! shares given back when sandboxes go.
    use super::*;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn capacity(sandboxes: usize, starts: usize) -> Capacity {
        Capacity {
            sandboxes,
            starts,
            why: "test".into(),
        }
    }

    #[test]
    fn the_tightest_bound_wins_and_names_itself() {
        let host = Host {
            memory_bytes: Some(24 * GIB),
            cpus: Some(2),
            tasks: Some((32768, 200)),
        };
        let runc = Capacity::of(&host, &Cost::of(2 * GIB, 256, None), None);
        assert_eq!(runc.sandboxes, 11, "{runc:?}");
        assert!(runc.why.starts_with("memory"), "{runc:?}");
        assert_eq!(runc.starts, 2);
        // Small sandboxes: the task limit binds (gVisor's own tasks counted).
        let gvisor = Capacity::of(&host, &Cost::of(64 << 20, 256, Some("runsc")), None);
        assert_eq!(gvisor.sandboxes, (32768 - 200 - 2048) / (256 + 48));
        assert!(gvisor.why.starts_with("tasks"), "{gvisor:?}");
        // The operator's number replaces both; CPUs bound the starts, at most 4.
        let many = Host {
            cpus: Some(64),
            ..host.clone()
        };
        let set = Capacity::of(&many, &Cost::of(GIB, 256, None), Some(3));
        assert_eq!((set.sandboxes, set.starts), (3, 4));
        // Nothing known: a modest default, never zero.
        let unknown = Capacity::of(&Host::default(), &Cost::of(GIB, 256, None), None);
        assert_eq!((unknown.sandboxes, unknown.starts), (16, 1));
        let tiny = Host {
            memory_bytes: Some(GIB / 2),
            ..Host::default()
        };
        assert_eq!(
            Capacity::of(&tiny, &Cost::of(GIB, 256, None), None).sandboxes,
            1
        );
    }

    #[tokio::test]
    async fn calls_wait_in_turn_and_get_a_share_when_a_sandbox_goes() {
        let admission = Arc::new(Admission::new(capacity(2, 2)));
        let far = Instant::now() + Duration::from_secs(60);
        let (a, sa) = admission.admit(far).await.expect("first");
        let (b, sb) = admission.admit(far).await.expect("second");
        drop((sa, sb));
        assert_eq!(admission.live(), 2);
        assert!(
            admission.try_admit().is_none(),
            "the pool never goes over the bound"
        );
        let waiter = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit(far).await.map(|(a, _)| a) })
        };
        while admission.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(admission.wanted());
        drop(a); // a sandbox removed
        let c = waiter
            .await
            .expect("joined")
            .expect("admitted once a share was free");
        assert_eq!(admission.live(), 2);
        assert_eq!(admission.waiting(), 0);
        drop((b, c));
        assert_eq!(admission.live(), 0);
        assert!(admission.try_admit().is_some());
    }

    #[tokio::test]
    async fn a_call_out_of_time_is_refused_naming_the_bound() {
        let admission = Admission::new(capacity(1, 1));
        let (_held, _) = admission
            .admit(Instant::now() + Duration::from_secs(60))
            .await
            .expect("first");
        let refused = admission
            .admit(Instant::now() + Duration::from_millis(20))
            .await
            .expect_err("no share within its time");
        assert!(
            matches!(refused, Refusal::Timeout { limit: 1, .. }),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("at most 1 sandboxes"),
            "{refused}"
        );
        assert_eq!(admission.refused(), 1);
        assert_eq!(admission.waiting(), 0, "a refused call leaves the queue");
    }

    #[tokio::test]
    async fn starts_are_bounded_apart_from_live_sandboxes() {
        let admission = Admission::new(capacity(4, 1));
        let far = Instant::now() + Duration::from_secs(60);
        let (_a, starting) = admission.admit(far).await.expect("first");
        // A second start waits for the first to finish, though shares are free.
        let second = admission
            .admit(Instant::now() + Duration::from_millis(20))
            .await;
        assert!(second.is_err());
        drop(starting);
        let (_b, _) = admission
            .admit(far)
            .await
            .expect("after the first start ended");
        assert_eq!(admission.live(), 2);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let admission = Arc::new(Admission::new(capacity(1, 1)));
        let far = Instant::now() + Duration::from_secs(60);
        let (_held, _) = admission.admit(far).await.expect("first");
        let mut waiters = Vec::new();
        for _ in 0..QUEUE_MAX {
            let admission = admission.clone();
            waiters.push(tokio::spawn(
                async move { admission.admit(far).await.is_ok() },
            ));
        }
        while admission.waiting() < QUEUE_MAX {
            tokio::task::yield_now().await;
        }
        let refused = admission.admit(far).await.expect_err("the queue is full");
        assert!(matches!(refused, Refusal::QueueFull { .. }), "{refused:?}");
        for waiter in waiters {
            waiter.abort();
        }
    }
}
