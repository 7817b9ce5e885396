//! Sandboxes a run used, emptied by their supervisor (`Sandbox::recycle`), kept for the next run
//! of the same caller: that run starts in the time of a round trip instead of a sandbox's start,
//! and the engine is spared a removal and a start per run.
//!
//! A recycled sandbox serves only the caller its last run came from (the key: a principal, an
//! MCP session over HTTP, the one stdio client), at most [`MAX_USES`] runs, and waits at most
//! [`IDLE`]: then it is removed. At most [`MAX_KEPT`] wait at once (the oldest goes first), and
//! each holds its share of the server's capacity (`engine::admission`) like any sandbox, so one
//! is removed as soon as a call needs that share.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Runs one sandbox serves at most.
pub const MAX_USES: u32 = 50;
/// How long a recycled sandbox waits for its caller's next run.
pub const IDLE: Duration = Duration::from_secs(30);
/// Recycled sandboxes waiting at once.
pub const MAX_KEPT: usize = 8;

struct Kept<T> {
    key: String,
    item: T,
    since: Instant,
}

/// The recycled sandboxes (`T`: a sandbox; plain values in tests), and how many of each caller's
/// are being recycled: a caller's next run that finds none kept waits for one under way
/// ([`Recycled::wait_for`]) rather than start a sandbox, which takes several times as long (under
/// gVisor on this machine kind a recycle is ~0.3 s, a start ~2 s of CPU).
pub struct Recycled<T> {
    kept: Mutex<VecDeque<Kept<T>>>,
    under_way: Mutex<HashMap<String, usize>>,
    changed: Notify,
}

impl<T> Default for Recycled<T> {
    fn default() -> Self {
        Recycled {
            kept: Mutex::new(VecDeque::new()),
            under_way: Mutex::new(HashMap::new()),
            changed: Notify::new(),
        }
    }
}

/// A recycle under way for a caller (from [`Recycled::begin`]): over when dropped, after the
/// sandbox was kept or removed.
pub struct UnderWay<T> {
    recycled: Arc<Recycled<T>>,
    key: String,
}

impl<T> Drop for UnderWay<T> {
    fn drop(&mut self) {
        let mut under_way = self.recycled.under_way_lock();
        if let Some(n) = under_way.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                under_way.remove(&self.key);
            }
        }
        drop(under_way);
        self.recycled.changed.notify_waiters();
    }
}

impl<T> Recycled<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept<T>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn under_way_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.under_way.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A recycle of `key`'s sandbox starts; it is over when the guard is dropped.
    pub fn begin(self: &Arc<Self>, key: &str) -> UnderWay<T> {
        *self.under_way_lock().entry(key.to_string()).or_insert(0) += 1;
        UnderWay {
            recycled: self.clone(),
            key: key.to_string(),
        }
    }

    /// Keeps `item` for `key`'s next run; hands back the oldest when too many wait (to remove).
    #[must_use]
    pub fn put(&self, key: String, item: T, now: Instant) -> Option<T> {
        let mut kept = self.lock();
        kept.push_back(Kept {
            key,
            item,
            since: now,
        });
        let over = (kept.len() > MAX_KEPT)
            .then(|| kept.pop_front().map(|k| k.item))
            .flatten();
        drop(kept);
        self.changed.notify_waiters();
        over
    }

    /// `key`'s kept sandbox, or, while one of `key`'s is being recycled, the first to be kept
    /// within `limit`; `None` at once when none is kept or under way (start one, then).
    pub async fn wait_for(&self, key: &str, limit: Duration) -> Option<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the look, so a recycle ending between the two is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(item) = self.take(key, Instant::now()) {
                return Some(item);
            }
            if !self.under_way_lock().contains_key(key) {
                return None;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// The most recently kept sandbox of `key` that has not waited too long.
    pub fn take(&self, key: &str, now: Instant) -> Option<T> {
        let mut kept = self.lock();
        let at = kept
            .iter()
            .rposition(|k| k.key == key && now.duration_since(k.since) < IDLE)?;
        kept.remove(at).map(|k| k.item)
    }

    /// Those that waited `IDLE` or longer (to remove).
    pub fn expired(&self, now: Instant) -> Vec<T> {
        let mut kept = self.lock();
        let (old, fresh): (VecDeque<_>, VecDeque<_>) = kept
            .drain(..)
            .partition(|k| now.duration_since(k.since) >= IDLE);
        *kept = fresh;
        old.into_iter().map(|k| k.item).collect()
    }

    /// The one that waited longest, whoever's (its share is wanted).
    pub fn oldest(&self) -> Option<T> {
        self.lock().pop_front().map(|k| k.item)
    }

    /// All of them (at shutdown).
    pub fn drain(&self) -> Vec<T> {
        self.lock().drain(..).map(|k| k.item).collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_serves_only_its_own_caller_and_only_while_fresh() {
        let kept = Recycled::default();
        let t = Instant::now();
        assert!(kept.put("a".into(), 1, t).is_none());
        assert!(kept.put("b".into(), 2, t).is_none());
        assert_eq!(kept.take("c", t), None, "never another caller's");
        assert_eq!(kept.take("a", t), Some(1));
        assert_eq!(kept.take("a", t), None, "each once");
        assert_eq!(kept.take("b", t + IDLE), None, "not after IDLE");
        assert_eq!(kept.expired(t + IDLE), vec![2]);
        assert!(kept.is_empty());
    }

    #[test]
    fn the_newest_is_taken_and_the_oldest_goes_first() {
        let kept = Recycled::default();
        let t = Instant::now();
        for n in 0..MAX_KEPT {
            assert!(kept.put("a".into(), n, t).is_none());
        }
        assert_eq!(
            kept.put("a".into(), 99, t),
            Some(0),
            "over MAX_KEPT: the oldest"
        );
        assert_eq!(kept.take("a", t), Some(99));
        assert_eq!(kept.oldest(), Some(1));
        assert_eq!(kept.drain().len(), MAX_KEPT - 2);
    }

    /// Guards only against a hang: each wait below ends by an event, not by a time.
    async fn no_hang<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(30), f)
            .await
            .expect("the wait ended")
    }

    #[tokio::test]
    async fn a_caller_with_none_kept_waits_only_for_its_own_recycle_under_way() {
        let kept = Arc::new(Recycled::default());
        let long = Duration::from_secs(3600);
        assert_eq!(
            no_hang(kept.wait_for("a", long)).await,
            None,
            "nothing under way"
        );
        let other = kept.begin("b");
        assert_eq!(
            no_hang(kept.wait_for("a", long)).await,
            None,
            "another caller's recycle is no reason to wait"
        );
        drop(other);
        let under_way = kept.begin("a");
        let recycler = {
            let kept = kept.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                assert!(kept.put("a".into(), 7, Instant::now()).is_none());
                drop(under_way);
            })
        };
        assert_eq!(no_hang(kept.wait_for("a", long)).await, Some(7));
        recycler.await.expect("the recycler");
        assert!(kept.is_empty());
    }

    #[tokio::test]
    async fn a_recycle_that_keeps_nothing_ends_the_wait() {
        let kept: Arc<Recycled<u32>> = Arc::new(Recycled::default());
        let under_way = kept.begin("a");
        let failed = tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(under_way); // the recycle failed: the sandbox was removed
        });
        assert_eq!(
            no_hang(kept.wait_for("a", Duration::from_secs(3600))).await,
            None
        );
        failed.await.expect("the recycler");
        assert_eq!(
            kept.wait_for("a", Duration::ZERO).await,
            None,
            "nothing under way any more"
        );
    }

    #[tokio::test]
    async fn the_wait_ends_at_its_limit() {
        let kept: Arc<Recycled<u32>> = Arc::new(Recycled::default());
        let _under_way = kept.begin("a");
        assert_eq!(no_hang(kept.wait_for("a", Duration::ZERO)).await, None);
    }
}
