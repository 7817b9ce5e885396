//! The warm pool: sandboxes of the default configuration, created and started ahead of time, with
//! the runner up and Python initialised, waiting for their first request.
//!
//! A pooled sandbox is handed out once and destroyed after use like any other: the pool saves the
//! start-up, never reuses a sandbox, so isolation is unchanged. Each one is checked with a runner
//! round trip when it is taken; a dead one is removed, not handed out. Refilling happens in the
//! background and never delays a request or the server's start.
//!
//! The pool's size follows demand. It keeps `SANDBOX_POOL_SIZE` sandboxes (its base); a call that
//! finds it empty doubles its target, up to a cap the server derives from `SANDBOX_POOL_MAX_MEMORY`;
//! after a minute without such a miss the target steps back towards the base, one sandbox every
//! ten seconds, and the sandboxes over it are removed. Starting a sandbox costs the engine far more
//! than running a small call (on two cores, ~130 ms against ~3 ms), so a burst of calls can only be
//! served warm from sandboxes that already wait: the pool learns the burst's size from the first.
//!
//! Refilling waits for a pause in the calls: a started refill takes the engine's CPU from the call
//! it follows and from the next one. It starts at once only when at most one sandbox is left.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::sandbox::Sandbox;

/// Sandboxes started at once while refilling.
pub(super) const REFILL_CONCURRENCY: usize = 2;
/// The largest target demand can grow the pool to (the memory bound may set a lower one).
pub const GROWTH_CAP: usize = 32;
/// How long the grown target holds after the last miss, and then each step back.
const GROWTH_HOLD: Duration = Duration::from_secs(60);
const SHRINK_STEP: Duration = Duration::from_secs(10);
/// How long after a take the refill waits for the next (while more than one sandbox is left).
pub(crate) const QUIET: Duration = Duration::from_millis(50);

pub struct Pool {
    base: usize,
    cap: usize,
    target: AtomicUsize,
    ready: Mutex<VecDeque<Sandbox>>,
    starting: AtomicUsize,
    /// When a sandbox was last taken, and when a take last found none.
    times: Mutex<Times>,
    wake: Arc<Notify>,
    closed: AtomicBool,
}

struct Times {
    last_take: Option<Instant>,
    last_miss: Option<Instant>,
}

/// What the refill should do now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refill {
    /// Start this many sandboxes.
    Start(usize),
    /// Calls are coming: look again after this long.
    After(Duration),
    /// The pool is at its target.
    Idle,
}

impl Pool {
    /// A pool of `base` sandboxes that demand may grow to `cap` (at least `base`).
    pub fn new(base: usize, cap: usize) -> Self {
        Pool {
            base,
            cap: cap.max(base),
            target: AtomicUsize::new(base),
            ready: Mutex::new(VecDeque::new()),
            starting: AtomicUsize::new(0),
            times: Mutex::new(Times {
                last_take: None,
                last_miss: None,
            }),
            wake: Arc::new(Notify::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// `SANDBOX_POOL_SIZE`: zero disables the pool.
    pub fn base(&self) -> usize {
        self.base
    }

    /// How many sandboxes the pool wants now.
    pub fn target(&self) -> usize {
        self.target.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sandbox>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Sandboxes ready now.
    pub fn ready(&self) -> usize {
        self.lock().len()
    }

    /// The ids of the sandboxes ready now.
    pub(super) fn ready_ids(&self) -> Vec<super::backend::SandboxId> {
        self.lock().iter().map(|s| s.id().clone()).collect()
    }

    /// The oldest ready sandbox, if any. An empty pool grows its target and starts refilling;
    /// otherwise the refill waits for `used` (the end of the call) or a pause.
    pub fn take(&self, now: Instant) -> Option<Sandbox> {
        let sandbox = self.lock().pop_front();
        let mut times = self.times();
        times.last_take = Some(now);
        if sandbox.is_none() && self.base > 0 {
            times.last_miss = Some(now);
            let grown = (self.target() * 2).max(self.base + 1).min(self.cap);
            self.target.store(grown, Ordering::SeqCst);
            drop(times);
            self.wake.notify_one();
        }
        sandbox
    }

    /// The call that took a sandbox is done with the engine for now: the refill may run.
    pub fn used(&self) {
        self.wake.notify_one();
    }

    /// The newest ready sandbox, to be removed: a call needs its share of the capacity. Not a
    /// take: the pool's sizing does not learn from it.
    pub(super) fn evict(&self) -> Option<Sandbox> {
        self.lock().pop_back()
    }

    /// Stops refilling and hands back what is ready (to be destroyed).
    pub fn close(&self) -> Vec<Sandbox> {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        self.lock().drain(..).collect()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Counts `n` sandboxes being started for the pool (they count against its target).
    pub(super) fn starting(&self, n: usize) {
        self.starting.fetch_add(n, Ordering::SeqCst);
    }

    /// `n` of the sandboxes being started are done (ready or failed).
    pub(super) fn started(&self, n: usize) {
        self.starting.fetch_sub(n, Ordering::SeqCst);
    }

    /// Adds a started sandbox; hands it back when the pool is closed or over its target (to be
    /// removed).
    #[must_use]
    pub(super) fn put(&self, sandbox: Sandbox) -> Option<Sandbox> {
        let mut ready = self.lock();
        if self.is_closed() || ready.len() >= self.target() {
            return Some(sandbox);
        }
        ready.push_back(sandbox);
        None
    }

    /// Steps a grown target back towards the base once demand has been quiet for a while, and
    /// hands back the sandboxes over the new target (the newest first), to be removed.
    pub(super) fn shrink(&self, now: Instant) -> Vec<Sandbox> {
        let mut times = self.times();
        let target = self.target();
        let quiet_since = times
            .last_miss
            .map_or(Duration::MAX, |t| now.duration_since(t));
        if target <= self.base || quiet_since < GROWTH_HOLD {
            return Vec::new();
        }
        self.target.store(target - 1, Ordering::SeqCst);
        // The next step comes SHRINK_STEP later.
        times.last_miss = now.checked_sub(GROWTH_HOLD - SHRINK_STEP).or(Some(now));
        drop(times);
        let mut ready = self.lock();
        let over = ready.len().saturating_sub(target - 1);
        let len = ready.len();
        ready.drain(len - over..).collect()
    }

    /// Whether to start sandboxes now, later, or not at all.
    pub(super) fn refill(&self, now: Instant) -> Refill {
        let ready = self.ready();
        let deficit = self
            .target()
            .saturating_sub(ready + self.starting.load(Ordering::SeqCst));
        if deficit == 0 {
            return Refill::Idle;
        }
        if ready > 1 {
            if let Some(last) = self.times().last_take {
                let since = now.duration_since(last);
                if since < QUIET {
                    return Refill::After(QUIET - since);
                }
            }
        }
        Refill::Start(deficit.min(REFILL_CONCURRENCY))
    }

    /// When the grown target may next step back (the refill looks again then).
    pub(super) fn next_shrink(&self, now: Instant) -> Option<Duration> {
        if self.target() <= self.base {
            return None;
        }
        let last = self.times().last_miss?;
        Some((last + GROWTH_HOLD).saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    //! The pool's sizing as a state machine, without sandboxes (`Pool<Sandbox>` is only filled by
    //! the engine; these check target, refill decisions and shrinking on an empty pool).
    use super::*;

    #[test]
    fn a_miss_doubles_the_target_up_to_the_cap() {
        let pool = Pool::new(2, 9);
        let now = Instant::now();
        assert_eq!(pool.target(), 2);
        assert!(pool.take(now).is_none());
        assert_eq!(pool.target(), 4);
        pool.take(now);
        pool.take(now);
        assert_eq!(pool.target(), 9, "never over the cap");
        // A disabled pool never grows.
        let off = Pool::new(0, 9);
        assert!(off.take(now).is_none());
        assert_eq!(off.target(), 0);
        assert_eq!(off.refill(now), Refill::Idle);
    }

    #[test]
    fn the_cap_is_never_below_the_base() {
        let pool = Pool::new(5, 2);
        pool.take(Instant::now());
        assert_eq!(pool.target(), 5);
    }

    #[test]
    fn an_empty_pool_refills_at_once_at_most_two_at_a_time() {
        let pool = Pool::new(3, 8);
        let now = Instant::now();
        assert_eq!(pool.refill(now), Refill::Start(2));
        pool.starting(2);
        assert_eq!(pool.refill(now), Refill::Start(1));
        pool.starting(1);
        assert_eq!(pool.refill(now), Refill::Idle);
        pool.started(3);
        // Right after a take with nothing left, the refill still starts at once.
        pool.take(now);
        assert_eq!(pool.refill(now), Refill::Start(2));
    }

    #[test]
    fn the_target_steps_back_after_a_quiet_minute() {
        let pool = Pool::new(2, 32);
        let start = Instant::now();
        pool.take(start);
        pool.take(start);
        assert_eq!(pool.target(), 8);
        assert!(pool.shrink(start + Duration::from_secs(59)).is_empty());
        assert_eq!(pool.target(), 8);
        assert_eq!(pool.next_shrink(start), Some(GROWTH_HOLD));
        let later = start + GROWTH_HOLD;
        pool.shrink(later);
        assert_eq!(pool.target(), 7);
        pool.shrink(later + Duration::from_secs(1));
        assert_eq!(pool.target(), 7, "one step per SHRINK_STEP");
        assert_eq!(pool.next_shrink(later), Some(SHRINK_STEP));
        let mut t = later;
        for _ in 0..20 {
            t += SHRINK_STEP;
            pool.shrink(t);
        }
        assert_eq!(pool.target(), 2, "never below the base");
        assert_eq!(pool.next_shrink(t), None);
        // A new miss grows it again.
        pool.take(t);
        assert_eq!(pool.target(), 4);
    }
}
