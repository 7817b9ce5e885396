//! Sandboxes a run used, emptied by their supervisor (`Sandbox::recycle`), kept for the next run
//! of the same caller: that run starts in the time of a round trip instead of a sandbox's start,
//! and the engine is spared a removal and a start per run.
//!
//! A recycled sandbox serves only the caller its last run came from (the key: a principal, an
//! MCP session over HTTP, the one stdio client), at most [`MAX_USES`] runs, and waits at most
//! [`IDLE`]: then it is removed. At most [`MAX_KEPT`] wait at once (the oldest goes first), and
//! each holds its share of the server's capacity (`engine::admission`) like any sandbox, so one
//! is removed as soon as a call needs that share.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The recycled sandboxes (`T`: a sandbox; plain values in tests).
pub struct Recycled<T> {
    kept: Mutex<VecDeque<Kept<T>>>,
}

impl<T> Default for Recycled<T> {
    fn default() -> Self {
        Recycled {
            kept: Mutex::new(VecDeque::new()),
        }
    }
}

impl<T> Recycled<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept<T>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
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
        (kept.len() > MAX_KEPT)
            .then(|| kept.pop_front().map(|k| k.item))
            .flatten()
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
}
