//! Choosing which dependency cache entries to remove when the cache is over its size cap.

use std::time::SystemTime;

/// One published install in the dependency cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The cache key (directory name).
    pub key: String,
    /// Size on disk.
    pub size_bytes: u64,
    /// When a sandbox last used it.
    pub last_used: SystemTime,
    /// Whether a live sandbox mounts it now; such entries are never evicted.
    pub in_use: bool,
}

/// The keys to evict, least recently used first, so that the total size is at most `max_bytes`.
/// Entries in use are never evicted, even when the total then stays above the cap.
pub fn select_evictions(entries: &[CacheEntry], max_bytes: u64) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|entry| entry.size_bytes).sum();
    let mut candidates: Vec<&CacheEntry> = entries.iter().filter(|entry| !entry.in_use).collect();
    candidates.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut evicted = Vec::new();
    for entry in candidates {
        if total <= max_bytes {
            break;
        }
        total = total.saturating_sub(entry.size_bytes);
        evicted.push(entry.key.clone());
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(key: &str, size: u64, age_secs: u64, in_use: bool) -> CacheEntry {
        CacheEntry {
            key: key.into(),
            size_bytes: size,
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_secs),
            in_use,
        }
    }

    #[test]
    fn eviction_under_cap_evicts_nothing() {
        let entries = [entry("a", 10, 5, false), entry("b", 10, 1, false)];
        assert!(select_evictions(&entries, 20).is_empty());
        assert!(select_evictions(&[], 0).is_empty());
    }

    #[test]
    fn eviction_is_least_recently_used_first() {
        let entries = [
            entry("newest", 10, 1, false),
            entry("oldest", 10, 100, false),
            entry("middle", 10, 50, false),
        ];
        assert_eq!(select_evictions(&entries, 25), vec!["oldest"]);
        assert_eq!(select_evictions(&entries, 10), vec!["oldest", "middle"]);
        assert_eq!(
            select_evictions(&entries, 0),
            vec!["oldest", "middle", "newest"]
        );
    }

    #[test]
    fn eviction_never_touches_entries_in_use() {
        let entries = [
            entry("busy-old", 100, 1000, true),
            entry("idle", 10, 10, false),
            entry("busy-new", 100, 1, true),
        ];
        // Even evicting every idle entry leaves 200 > 50: in-use entries stay.
        assert_eq!(select_evictions(&entries, 50), vec!["idle"]);
    }

    #[test]
    fn eviction_stops_as_soon_as_under_cap() {
        let entries = [
            entry("big-old", 100, 100, false),
            entry("small-older", 1, 200, false),
            entry("recent", 50, 1, false),
        ];
        assert_eq!(
            select_evictions(&entries, 100),
            vec!["small-older", "big-old"]
        );
        assert_eq!(select_evictions(&entries, 150), vec!["small-older"]);
    }
}
