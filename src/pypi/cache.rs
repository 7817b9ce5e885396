//! The cached copy of the simple index: one normalized name a line under a header naming the base
//! URL, refreshed when older than the TTL, with a stale copy as the fallback when PyPI fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::index_file::convert_index;
use super::{IndexError, PypiSearch, SearchError};

pub(super) const INDEX_FILE: &str = "pypi-simple-index.txt";
pub(super) const INDEX_HEADER_PREFIX: &str = "# pypi-simple-index v1 ";
/// After a failed refresh, how long to wait before trying again while a stale copy exists.
const RETRY_WITH_STALE: Duration = Duration::from_secs(5 * 60);
/// After a failed refresh, how long to wait before trying again while no copy exists.
const RETRY_WITHOUT_CACHE: Duration = Duration::from_secs(30);

/// Is the cached index usable, and is it fresh?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheState {
    Missing,
    Stale,
    Fresh,
}

impl PypiSearch {
    fn index_path(&self) -> PathBuf {
        self.cache_dir.join(INDEX_FILE)
    }

    fn index_header(&self) -> String {
        format!("{INDEX_HEADER_PREFIX}{}", self.base)
    }

    /// Whether the cached index exists for this base URL, and its age against the TTL.
    async fn cache_state(&self) -> CacheState {
        let path = self.index_path();
        let header = self.index_header();
        let ttl = self.ttl;
        tokio::task::spawn_blocking(move || cache_state_of(&path, &header, ttl))
            .await
            .unwrap_or(CacheState::Missing)
    }

    /// Makes sure a usable index file exists, downloading it when missing or stale; returns its path.
    pub(super) async fn ensure_index(&self) -> Result<PathBuf, SearchError> {
        let path = self.index_path();
        if self.cache_state().await == CacheState::Fresh {
            return Ok(path);
        }
        let _refreshing = self.refresh_lock.lock().await;
        // Another search may have refreshed it while this one waited.
        let state = self.cache_state().await;
        if state == CacheState::Fresh {
            return Ok(path);
        }
        let recent_failure = self
            .last_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some((when, reason)) = recent_failure {
            let pause = if state == CacheState::Stale {
                RETRY_WITH_STALE
            } else {
                RETRY_WITHOUT_CACHE
            }
            .min(self.ttl);
            if when.elapsed() < pause {
                return match state {
                    CacheState::Stale => Ok(path),
                    _ => Err(self.unavailable(
                        reason,
                        Some(pause.saturating_sub(when.elapsed()).as_secs().max(1)),
                    )),
                };
            }
        }
        match self.refresh().await {
            Ok(count) => {
                tracing::info!(projects = count, path = %path.display(), "PyPI index downloaded");
                *self
                    .last_failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
                Ok(path)
            }
            Err(reason) => {
                let reason = Arc::new(reason);
                *self
                    .last_failure
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((Instant::now(), reason.clone()));
                if state == CacheState::Stale {
                    tracing::warn!(
                        "cannot refresh the PyPI index from {}/simple/ ({reason}); using the stale copy in {}",
                        self.base,
                        path.display()
                    );
                    Ok(path)
                } else {
                    Err(self.unavailable(reason, None))
                }
            }
        }
    }

    /// `retry_in`: seconds until the next download, when this search did not try one.
    fn unavailable(&self, reason: Arc<IndexError>, retry_in: Option<u64>) -> SearchError {
        SearchError::IndexUnavailable {
            url: format!("{}/simple/", self.base),
            source: reason,
            retry_in,
            cache_dir: self.cache_dir.clone(),
        }
    }

    /// Downloads the simple index and atomically replaces the cached name file. Returns the number
    /// of names, or why it failed.
    async fn refresh(&self) -> Result<usize, IndexError> {
        tokio::fs::create_dir_all(&self.cache_dir)
            .await
            .map_err(|source| IndexError::CreateCacheDir {
                dir: self.cache_dir.clone(),
                source,
            })?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let download = RemoveOnDrop(self.cache_dir.join(format!(".pypi-index-{id}.download")));
        let converted = RemoveOnDrop(self.cache_dir.join(format!(".pypi-index-{id}.tmp")));

        // The whole download, headers and body, within the index time limit (plus a margin over
        // reqwest's own timeout, which covers the same span).
        let format = tokio::time::timeout(
            self.limits.index_timeout + Duration::from_secs(1),
            self.download_index(&download.0),
        )
        .await
        .map_err(|_| IndexError::TimedOut(self.limits.index_timeout))??;

        let header = self.index_header();
        let (src, dst) = (download.0.clone(), converted.0.clone());
        let count = tokio::task::spawn_blocking(move || convert_index(&src, &dst, format, &header))
            .await
            .map_err(IndexError::ConversionTask)??;
        drop(download);
        if count == 0 {
            return Err(IndexError::Empty);
        }
        tokio::fs::rename(&converted.0, self.index_path())
            .await
            .map_err(|source| IndexError::WriteCacheFile {
                path: self.index_path(),
                source,
            })?;
        converted.disarm();
        Ok(count)
    }
}

/// Deletes a temporary file when dropped, unless disarmed.
struct RemoveOnDrop(PathBuf);

impl RemoveOnDrop {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cache_state_of(path: &Path, header: &str, ttl: Duration) -> CacheState {
    let Ok(file) = std::fs::File::open(path) else {
        return CacheState::Missing;
    };
    let Ok(modified) = file.metadata().and_then(|m| m.modified()) else {
        return CacheState::Missing;
    };
    let mut first = String::new();
    if BufReader::new(file.take(1024))
        .read_line(&mut first)
        .is_err()
        || first.trim_end() != header
    {
        // Another base URL's index, or another format: not ours to use.
        return CacheState::Missing;
    }
    match SystemTime::now().duration_since(modified) {
        Ok(age) if age < ttl => CacheState::Fresh,
        // Too old, or dated in the future (a clock jump): refresh.
        _ => CacheState::Stale,
    }
}
