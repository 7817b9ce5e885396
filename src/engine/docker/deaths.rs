//! How sandboxes the engine removed by itself ended. A sandbox is created with `AutoRemove`: once
//! it ends (its supervisor exits, the kernel stops it for memory, someone kills it) the engine
//! removes it, and with it the state an inspection would have shown. The engine's own `oom`,
//! `kill` and `die` events for the server's sandboxes are kept here, the latest [`KEPT`], so that
//! a lost sandbox is still explained by the engine's record (out of memory, exit status).
//!
//! One gap in that record is filled by elimination: Docker 20.10 drops a sandbox's `oom` event
//! when it processes it after the container's removal ("No such container" in its log), which
//! happens under gVisor, whose whole sandbox the kernel stops. A sandbox that ended by SIGKILL
//! with no `kill` asked of the engine (`docker kill`, `docker rm -f`, `docker stop`, an engine
//! shutdown all say `kill` first) was stopped by the kernel: counted as out of memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;

use crate::engine::backend::ExitInfo;
use crate::engine::owner::LABEL_MANAGED;

/// Deaths remembered at most.
const KEPT: usize = 512;

/// How long a sandbox killed by SIGKILL is looked at for a trailing `oom` event: the engine
/// reports the kernel's memory kill and the exit apart, in either order.
const OOM_TRAILS_BY: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Deaths {
    seen: Mutex<VecDeque<(String, ExitInfo)>>,
    /// Sandboxes someone asked the engine to kill (its `kill` events), the latest [`KEPT`].
    killed: Mutex<VecDeque<String>>,
    /// How many `oom` events each sandbox had, the latest [`KEPT`] sandboxes: under gVisor since
    /// its 2023 releases the kernel stops one of gVisor's helper processes (systrap's stubs, which
    /// gVisor marks as the first to go), and the sandbox lives on with its code stuck.
    ooms: Mutex<VecDeque<(String, u64)>>,
    watching: tokio::sync::OnceCell<()>,
    /// The time of the latest event seen (seconds): a stream that ended resumes from there, so
    /// nothing the engine said in between is missed.
    latest: std::sync::atomic::AtomicI64,
}

impl Deaths {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, ExitInfo)>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts following the engine's events (once; again after the stream ends).
    pub async fn watch(self: &Arc<Self>, docker: &Docker) {
        self.watching
            .get_or_init(|| async {
                let deaths = self.clone();
                let docker = docker.clone();
                tokio::spawn(async move {
                    loop {
                        deaths.follow(&docker).await;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                });
            })
            .await;
    }

    async fn follow(&self, docker: &Docker) {
        let filters = std::collections::HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            (
                "event".to_string(),
                vec!["oom".to_string(), "kill".to_string(), "die".to_string()],
            ),
            ("label".to_string(), vec![format!("{LABEL_MANAGED}=true")]),
        ]);
        let latest = self.latest.load(std::sync::atomic::Ordering::Relaxed);
        let options = bollard::query_parameters::EventsOptions {
            since: (latest > 0).then(|| latest.to_string()),
            until: None,
            filters: Some(filters),
        };
        let mut events = std::pin::pin!(docker.events(Some(options)));
        while let Some(Ok(event)) = events.next().await {
            if let Some(time) = event.time {
                self.latest
                    .fetch_max(time, std::sync::atomic::Ordering::Relaxed);
            }
            let Some(actor) = event.actor else { continue };
            let Some(id) = actor.id else { continue };
            let exit_code = actor
                .attributes
                .as_ref()
                .and_then(|a| a.get("exitCode"))
                .and_then(|c| c.parse().ok());
            if event.action.as_deref() == Some("kill") {
                self.record_kill(&id);
                continue;
            }
            if event.action.as_deref() == Some("oom") {
                self.count_oom(&id);
            }
            self.record(&id, event.action.as_deref() == Some("oom"), exit_code);
        }
    }

    fn count_oom(&self, id: &str) {
        let mut ooms = self.ooms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, count)) = ooms.iter_mut().find(|(seen, _)| seen == id) {
            *count += 1;
            return;
        }
        ooms.push_back((id.to_string(), 1));
        if ooms.len() > KEPT {
            ooms.pop_front();
        }
    }

    /// Whether the engine's events are followed (so that no `oom` event means none happened).
    pub fn following(&self) -> bool {
        self.watching.initialized()
    }

    /// How many `oom` events the engine gave for `id` so far (0 for none).
    pub fn oom_count(&self, id: &str) -> u64 {
        self.ooms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(seen, _)| seen == id)
            .map_or(0, |(_, count)| *count)
    }

    fn record(&self, id: &str, oom: bool, exit_code: Option<i64>) {
        let mut seen = self.lock();
        if let Some((_, info)) = seen.iter_mut().find(|(seen, _)| seen == id) {
            info.oom_killed |= oom;
            info.exit_code = exit_code.or(info.exit_code);
            return;
        }
        seen.push_back((
            id.to_string(),
            ExitInfo {
                running: false,
                exit_code,
                oom_killed: oom,
                started_at: None,
            },
        ));
        if seen.len() > KEPT {
            seen.pop_front();
        }
    }

    fn record_kill(&self, id: &str) {
        let mut killed = self.killed.lock().unwrap_or_else(|p| p.into_inner());
        if !killed.iter().any(|k| k == id) {
            killed.push_back(id.to_string());
            if killed.len() > KEPT {
                killed.pop_front();
            }
        }
    }

    fn was_killed(&self, id: &str) -> bool {
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|k| k == id)
    }

    fn find(&self, id: &str) -> Option<ExitInfo> {
        self.lock()
            .iter()
            .find(|(seen, _)| seen == id)
            .map(|(_, info)| info.clone())
    }

    /// How the sandbox `id` ended, when the engine said (its `die` event may trail its removal
    /// by a moment: looked for up to half a second; a kill by SIGKILL is then looked at for a
    /// trailing `oom`, see [`Deaths::out_of_memory`]).
    pub async fn of(&self, id: &str) -> Option<ExitInfo> {
        for _ in 0..10 {
            if let Some(mut info) = self.find(id).filter(|info| info.exit_code.is_some()) {
                if info.exit_code == Some(137) && !info.oom_killed {
                    info.oom_killed = self.killed_by_kernel(id).await;
                }
                return Some(info);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Whether the kernel stopped `id`, which ended by SIGKILL: the engine said so (an `oom`
    /// event, waited for as [`Deaths::out_of_memory`] does), or nobody asked the engine to kill
    /// it (the `oom` event Docker drops; see the module docs). Whether the sandbox was still
    /// there to inspect or already removed: Docker drops the event when it processes it after
    /// the removal, which can follow the inspection.
    pub async fn killed_by_kernel(&self, id: &str) -> bool {
        self.out_of_memory(id).await || !self.was_killed(id)
    }

    /// Whether the engine said the kernel stopped `id` for memory, waiting up to
    /// [`OOM_TRAILS_BY`] for it: asked only of a sandbox that ended by SIGKILL, whose `oom` event
    /// may come after its exit (then its inspection does not show it either).
    async fn out_of_memory(&self, id: &str) -> bool {
        let deadline = tokio::time::Instant::now() + OOM_TRAILS_BY;
        loop {
            if self.find(id).is_some_and(|info| info.oom_killed) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_oom_and_a_die_event_make_one_record() {
        let deaths = Deaths::default();
        deaths.record("a", true, None);
        deaths.record("a", false, Some(137));
        deaths.record("b", false, Some(0));
        let a = deaths.of("a").await.expect("recorded");
        assert!(a.oom_killed && a.exit_code == Some(137) && !a.running);
        assert_eq!(deaths.of("b").await.map(|b| b.oom_killed), Some(false));
        for n in 0..KEPT {
            deaths.record(&n.to_string(), false, Some(1));
        }
        assert!(deaths.of("a").await.is_none(), "only the latest are kept");
    }

    #[tokio::test]
    async fn an_oom_event_after_the_exit_still_counts() {
        let deaths = Arc::new(Deaths::default());
        deaths.record("a", false, Some(137));
        let later = deaths.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            later.record("a", true, None);
        });
        assert!(deaths.of("a").await.is_some_and(|a| a.oom_killed));
        deaths.record_kill("b");
        deaths.record("b", false, Some(137));
        assert!(
            !deaths.of("b").await.is_some_and(|b| b.oom_killed),
            "no oom: a plain kill"
        );
        // SIGKILL that nobody asked the engine for, and no oom event (Docker dropped it).
        deaths.record("c", false, Some(137));
        assert!(deaths.of("c").await.is_some_and(|c| c.oom_killed));
    }

    #[test]
    fn each_oom_event_of_a_sandbox_is_counted() {
        let deaths = Deaths::default();
        assert_eq!(deaths.oom_count("a"), 0);
        deaths.count_oom("a");
        deaths.count_oom("a");
        deaths.count_oom("b");
        assert_eq!(deaths.oom_count("a"), 2);
        assert_eq!(deaths.oom_count("b"), 1);
        for n in 0..KEPT {
            deaths.count_oom(&n.to_string());
        }
        assert_eq!(deaths.oom_count("a"), 0, "only the latest are kept");
        assert!(!deaths.following());
    }
}
