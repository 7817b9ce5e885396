//! Measuring: percentiles of samples, the server's memory, and a sustained rate from concurrent
//! workers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) samples: Vec<Duration>,
    pub(crate) floor: Option<Duration>,
}

impl Series {
    pub(crate) fn new(
        name: impl Into<String>,
        samples: Vec<Duration>,
        floor: Option<Duration>,
    ) -> Self {
        Series {
            name: name.into(),
            samples,
            floor,
        }
    }

    pub(crate) fn percentile(&self, p: f64) -> Duration {
        percentile(&self.samples, p)
    }
}

pub(crate) fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

/// Resident memory of a process, from /proc.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `work` from `workers` tasks until `period` is over; returns completed and failed counts.
pub(crate) async fn sustained<F, Fut>(workers: usize, period: Duration, work: F) -> (u64, u64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + period;
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (done, failed, work) = (done.clone(), failed.clone(), work.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if work().await {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}
