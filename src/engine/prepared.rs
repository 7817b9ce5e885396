//! Prepared sandboxes per dependency set: which sets the warm pool prepares for, the sandboxes
//! waiting for each, and the memory they use together. Bookkeeping only (generic over what it
//! keeps, so its rules are tested without containers); the engine starts and stops sandboxes
//! (`service::prepared`).
//!
//! A set is wanted when the operator named it (`SANDBOX_PRELOAD`: kept while the server runs) or
//! when a call asked for it recently (learned from traffic: at most [`MAX_LEARNED`], the least
//! recently asked for goes first, and one not asked for within [`LEARNED_IDLE`] is retired with
//! its sandboxes). Each wanted set gets [`PER_SET`] sandboxes while the memory bound allows:
//! a sandbox being prepared counts with its set's last measured size (or [`FIRST_ESTIMATE`]), a
//! waiting one with what the engine measured of it. A sandbox is handed out once, for its set's
//! key only; when a set leaves the cache its waiting sandboxes go, and one being prepared at that
//! moment is refused when it arrives (the set's generation changed).
//!
//! A client's listing of roots is a set here too: learned when listed, with no requirements
//! (the engine keeps what it mounts beside, under the same key).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sets learned from traffic, at most.
pub const MAX_LEARNED: usize = 4;
/// A learned set not asked for within this is retired.
pub const LEARNED_IDLE: Duration = Duration::from_secs(15 * 60);
/// Sandboxes kept waiting per set.
pub const PER_SET: usize = 1;
/// What a prepared sandbox is assumed to use before one of its set was measured.
pub const FIRST_ESTIMATE: u64 = 256 << 20;

/// One dependency set the pool prepares for.
struct Entry<T> {
    /// The requirements as given (the engine parses them again when it prepares).
    requirements: Vec<String>,
    configured: bool,
    last_wanted: Instant,
    ready: VecDeque<(T, u64)>,
    starting: usize,
    /// Changes when the set leaves the cache: a sandbox prepared before is never kept.
    generation: u64,
    /// What the last sandbox of this set measured.
    measured: Option<u64>,
}

/// A preparation to start: for the set under `key`, at `generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub key: String,
    pub requirements: Vec<String>,
    pub generation: u64,
}

pub struct Prepared<T> {
    inner: Mutex<Inner<T>>,
    /// The memory the waiting and starting sandboxes may use together.
    budget: u64,
}

struct Inner<T> {
    sets: BTreeMap<String, Entry<T>>,
    closed: bool,
    next_generation: u64,
}

impl<T> Prepared<T> {
    pub fn new(budget: u64) -> Self {
        Prepared {
            inner: Mutex::new(Inner {
                sets: BTreeMap::new(),
                closed: false,
                next_generation: 1,
            }),
            budget,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // Every update under the lock is one map operation: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Names a set the operator configured: kept for as long as the server runs.
    pub fn configure(&self, key: &str, requirements: Vec<String>, now: Instant) {
        let mut inner = self.lock();
        let generation = inner.next_generation;
        let entry = inner
            .sets
            .entry(key.to_string())
            .or_insert_with(|| Entry::new(requirements, now, generation));
        entry.configured = true;
        inner.next_generation += 1;
    }

    /// A call asked for the set under `key`: it is wanted from now on (learned, if it was not
    /// known). Returns the sandboxes of a learned set this one displaced (to be removed).
    #[must_use]
    pub fn learn(&self, key: &str, requirements: Vec<String>, now: Instant) -> Vec<T> {
        let mut inner = self.lock();
        if inner.closed {
            return Vec::new();
        }
        if let Some(entry) = inner.sets.get_mut(key) {
            entry.last_wanted = now;
            return Vec::new();
        }
        let generation = inner.next_generation;
        inner.next_generation += 1;
        inner
            .sets
            .insert(key.to_string(), Entry::new(requirements, now, generation));
        let mut displaced = Vec::new();
        while inner.sets.values().filter(|e| !e.configured).count() > MAX_LEARNED {
            let oldest = inner
                .sets
                .iter()
                .filter(|(k, e)| !e.configured && k.as_str() != key)
                .min_by_key(|(_, e)| e.last_wanted)
                .map(|(k, _)| k.clone());
            match oldest.and_then(|k| inner.sets.remove(&k)) {
                Some(entry) => displaced.extend(entry.ready.into_iter().map(|(t, _)| t)),
                None => break,
            }
        }
        displaced
    }

    /// A waiting sandbox prepared for exactly the set under `key`, if one waits.
    pub fn take(&self, key: &str, now: Instant) -> Option<T> {
        let mut inner = self.lock();
        let entry = inner.sets.get_mut(key)?;
        entry.last_wanted = now;
        entry.ready.pop_front().map(|(t, _)| t)
    }

    /// The memory counted now: waiting sandboxes as measured, starting ones as estimated.
    pub fn used(&self) -> u64 {
        Self::used_in(&self.lock())
    }

    fn used_in(inner: &Inner<T>) -> u64 {
        inner
            .sets
            .values()
            .map(|e| {
                let waiting: u64 = e.ready.iter().map(|(_, bytes)| *bytes).sum();
                waiting + e.starting as u64 * e.estimate()
            })
            .sum()
    }

    /// Sandboxes waiting now, over all sets.
    pub fn ready(&self) -> usize {
        self.lock().sets.values().map(|e| e.ready.len()).sum()
    }

    /// The requirements of each waiting sandbox's set, with what it measured.
    pub fn waiting(&self) -> Vec<(Vec<String>, u64)> {
        let inner = self.lock();
        inner
            .sets
            .values()
            .flat_map(|e| {
                e.ready
                    .iter()
                    .map(|(_, bytes)| (e.requirements.clone(), *bytes))
            })
            .collect()
    }

    /// Whether the set under `key` is wanted now (configured, or learned and not yet forgotten).
    pub fn knows(&self, key: &str) -> bool {
        self.lock().sets.contains_key(key)
    }

    /// Sandboxes being prepared now for the set under `key`.
    pub fn starting_for(&self, key: &str) -> usize {
        self.lock().sets.get(key).map_or(0, |e| e.starting)
    }

    /// Sandboxes waiting now for the set under `key`.
    pub fn ready_for(&self, key: &str) -> usize {
        self.lock().sets.get(key).map_or(0, |e| e.ready.len())
    }

    /// The next preparation to start, if a set lacks sandboxes and the bound allows one more:
    /// configured sets first, then learned ones, most recently asked for first. Counts it as
    /// starting until [`Prepared::arrived`] or [`Prepared::failed`].
    pub fn next_wanted(&self) -> Option<Wanted> {
        let mut inner = self.lock();
        if inner.closed {
            return None;
        }
        let used = Self::used_in(&inner);
        let mut candidates: Vec<(&String, &Entry<T>)> = inner
            .sets
            .iter()
            .filter(|(_, e)| e.ready.len() + e.starting < PER_SET)
            .filter(|(_, e)| used + e.estimate() <= self.budget)
            .collect();
        candidates.sort_by_key(|(_, e)| (!e.configured, std::cmp::Reverse(e.last_wanted)));
        let key = candidates.first().map(|(k, _)| (*k).clone())?;
        let entry = inner.sets.get_mut(&key)?;
        entry.starting += 1;
        Some(Wanted {
            key,
            requirements: entry.requirements.clone(),
            generation: entry.generation,
        })
    }

    /// A preparation failed: it no longer counts as starting.
    pub fn failed(&self, wanted: &Wanted) {
        let mut inner = self.lock();
        if let Some(entry) = inner.sets.get_mut(&wanted.key) {
            entry.starting = entry.starting.saturating_sub(1);
        }
    }

    /// A prepared sandbox arrived, measured at `bytes`: kept, or handed back (to be removed)
    /// when the pool is closed, its set is gone or left the cache meanwhile, or it does not fit.
    #[must_use]
    pub fn arrived(&self, wanted: &Wanted, sandbox: T, bytes: u64) -> Option<T> {
        let mut inner = self.lock();
        let closed = inner.closed;
        let used = Self::used_in(&inner);
        let Some(entry) = inner.sets.get_mut(&wanted.key) else {
            return Some(sandbox);
        };
        // `used` counted this one at its estimate while it was starting.
        let others = used.saturating_sub(entry.estimate());
        entry.starting = entry.starting.saturating_sub(1);
        entry.measured = Some(bytes);
        if entry.generation != wanted.generation {
            // Its set left the cache while it was prepared: a learned set is forgotten now.
            if !entry.configured && entry.starting == 0 && entry.ready.is_empty() {
                inner.sets.remove(&wanted.key);
            }
            return Some(sandbox);
        }
        if closed || others + bytes > self.budget {
            return Some(sandbox);
        }
        entry.ready.push_back((sandbox, bytes));
        None
    }

    /// The sets under `keys` left the dependency cache: their waiting sandboxes are handed back
    /// (to be removed), sandboxes being prepared for them will be refused, and learned ones are
    /// forgotten (a configured set is prepared again, which installs it again).
    #[must_use]
    pub fn discard(&self, keys: &[String]) -> Vec<T> {
        let mut inner = self.lock();
        let mut gone = Vec::new();
        for key in keys {
            let generation = inner.next_generation;
            inner.next_generation += 1;
            let Some(entry) = inner.sets.get_mut(key) else {
                continue;
            };
            gone.extend(entry.ready.drain(..).map(|(t, _)| t));
            entry.generation = generation;
            if !entry.configured && entry.starting == 0 {
                inner.sets.remove(key);
            }
        }
        gone
    }

    /// Learned sets not asked for within [`LEARNED_IDLE`]: forgotten, their sandboxes handed
    /// back (to be removed).
    #[must_use]
    pub fn retire_idle(&self, now: Instant) -> Vec<T> {
        let mut inner = self.lock();
        let idle: Vec<String> = inner
            .sets
            .iter()
            .filter(|(_, e)| !e.configured && now.duration_since(e.last_wanted) >= LEARNED_IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        idle.iter()
            .filter_map(|k| inner.sets.remove(k))
            .flat_map(|e| e.ready.into_iter().map(|(t, _)| t))
            .collect()
    }

    /// Stops preparing and hands back every waiting sandbox (to be removed).
    #[must_use]
    pub fn close(&self) -> Vec<T> {
        let mut inner = self.lock();
        inner.closed = true;
        inner
            .sets
            .values_mut()
            .flat_map(|e| e.ready.drain(..).map(|(t, _)| t))
            .collect()
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

impl<T> Entry<T> {
    fn new(requirements: Vec<String>, now: Instant, generation: u64) -> Self {
        Entry {
            requirements,
            configured: false,
            last_wanted: now,
            ready: VecDeque::new(),
            starting: 0,
            generation,
            measured: None,
        }
    }

    fn estimate(&self) -> u64 {
        self.measured.unwrap_or(FIRST_ESTIMATE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn reqs(r: &[&str]) -> Vec<String> {
        r.iter().map(|s| s.to_string()).collect()
    }

    /// Prepares one sandbox for the next wanted set, named after the set.
    fn prepare_next(pool: &Prepared<String>, bytes: u64) -> Option<String> {
        let wanted = pool.next_wanted()?;
        let sandbox = format!("for {}", wanted.key);
        assert_eq!(pool.arrived(&wanted, sandbox, bytes), None);
        Some(wanted.key)
    }

    #[test]
    fn a_sandbox_is_handed_out_once_and_only_for_its_own_set() {
        let pool = Prepared::new(2 << 30);
        let now = Instant::now();
        pool.configure("A", reqs(&["numpy"]), now);
        assert!(pool.learn("B", reqs(&["pandas"]), now).is_empty());
        assert_eq!(prepare_next(&pool, 100 * MIB).as_deref(), Some("A"));
        assert_eq!(prepare_next(&pool, 100 * MIB).as_deref(), Some("B"));
        assert_eq!(prepare_next(&pool, 100 * MIB), None, "one per set");
        assert_eq!(pool.take("A", now).as_deref(), Some("for A"));
        assert_eq!(pool.take("A", now), None, "never twice");
        assert_eq!(pool.take("C", now), None);
        assert_eq!(pool.take("B", now).as_deref(), Some("for B"));
    }

    #[test]
    fn an_evicted_set_is_never_served_not_even_by_a_sandbox_prepared_meanwhile() {
        let pool = Prepared::new(2 << 30);
        let now = Instant::now();
        pool.configure("A", reqs(&["numpy"]), now);
        assert!(pool.learn("B", reqs(&["six"]), now).is_empty());
        prepare_next(&pool, MIB);
        let in_flight = pool.next_wanted().expect("B is wanted");
        assert_eq!(in_flight.key, "B");
        assert_eq!(pool.discard(&reqs(&["A", "B"])), vec!["for A".to_string()]);
        // Prepared before the eviction, it arrives after: refused.
        assert_eq!(
            pool.arrived(&in_flight, "stale B".to_string(), MIB),
            Some("stale B".to_string())
        );
        assert_eq!(pool.take("A", now), None);
        assert_eq!(pool.take("B", now), None);
        // The configured set is prepared again (with its new generation); the learned one is
        // forgotten until a call asks for it.
        assert_eq!(prepare_next(&pool, MIB).as_deref(), Some("A"));
        assert_eq!(pool.next_wanted(), None);
    }

    #[test]
    fn the_pool_stays_within_its_memory_bound() {
        let pool = Prepared::new(1000 * MIB);
        let now = Instant::now();
        for (i, key) in ["A", "B", "C", "D", "E"].iter().enumerate() {
            let _ = pool.learn(key, reqs(&["x"]), now + Duration::from_secs(i as u64));
        }
        // The first estimate (256 MiB) lets three start; measured at 300 MiB, the third does not fit.
        let mut kept = 0;
        while let Some(wanted) = pool.next_wanted() {
            assert!(pool.used() <= pool.budget());
            if pool
                .arrived(&wanted, wanted.key.clone(), 300 * MIB)
                .is_none()
            {
                kept += 1;
            }
            assert!(pool.used() <= pool.budget(), "{} > budget", pool.used());
        }
        assert_eq!(kept, 3);
        assert!(pool.used() <= 1000 * MIB);
    }

    #[test]
    fn learned_sets_are_bounded_and_retire_when_idle() {
        let pool = Prepared::new(u64::MAX);
        let start = Instant::now();
        pool.configure("conf", reqs(&["numpy"]), start);
        for i in 0..MAX_LEARNED {
            let key = format!("L{i}");
            assert!(pool
                .learn(&key, reqs(&["x"]), start + Duration::from_secs(i as u64))
                .is_empty());
        }
        while prepare_next(&pool, MIB).is_some() {}
        assert_eq!(pool.ready(), MAX_LEARNED + 1);
        // One more learned set displaces the least recently asked for, with its sandbox.
        let displaced = pool.learn("new", reqs(&["y"]), start + Duration::from_secs(100));
        assert_eq!(displaced, vec!["for L0".to_string()]);
        // Long after, every learned set is retired; the configured one stays.
        let later = start + Duration::from_secs(100) + LEARNED_IDLE;
        assert_eq!(pool.retire_idle(later).len(), MAX_LEARNED - 1);
        assert_eq!(pool.ready(), 1);
        assert_eq!(pool.ready_for("conf"), 1);
    }

    #[test]
    fn a_closed_pool_prepares_nothing_and_keeps_nothing() {
        let pool = Prepared::new(u64::MAX);
        let now = Instant::now();
        pool.configure("A", reqs(&["numpy"]), now);
        let wanted = pool.next_wanted().expect("wanted");
        assert!(pool.close().is_empty());
        assert_eq!(
            pool.arrived(&wanted, "late".to_string(), MIB),
            Some("late".to_string())
        );
        assert_eq!(pool.next_wanted(), None);
        assert!(pool.learn("B", reqs(&["x"]), now).is_empty());
        assert_eq!(pool.ready(), 0);
    }
}
