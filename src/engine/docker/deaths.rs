//! How sandboxes the engine removed by itself ended. A sandbox is created with `AutoRemove`: once
//! it ends (its supervisor exits, the kernel stops it for memory, someone kills it) the engine
//! removes it, and with it the state an inspection would have shown. The engine's own `oom` and
//! `die` events for the server's sandboxes are kept here, the latest [`KEPT`], so that a lost
//! sandbox is still explained by the engine's record (out of memory, exit status), never guessed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;

use crate::engine::backend::ExitInfo;
use crate::engine::owner::LABEL_MANAGED;

/// Deaths remembered at most.
const KEPT: usize = 512;

#[derive(Default)]
pub struct Deaths {
    seen: Mutex<VecDeque<(String, ExitInfo)>>,
    watching: tokio::sync::OnceCell<()>,
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
                vec!["oom".to_string(), "die".to_string()],
            ),
            ("label".to_string(), vec![format!("{LABEL_MANAGED}=true")]),
        ]);
        let options = bollard::query_parameters::EventsOptions {
            since: None,
            until: None,
            filters: Some(filters),
        };
        let mut events = std::pin::pin!(docker.events(Some(options)));
        while let Some(Ok(event)) = events.next().await {
            let Some(actor) = event.actor else { continue };
            let Some(id) = actor.id else { continue };
            let exit_code = actor
                .attributes
                .as_ref()
                .and_then(|a| a.get("exitCode"))
                .and_then(|c| c.parse().ok());
            self.record(&id, event.action.as_deref() == Some("oom"), exit_code);
        }
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

    /// How the sandbox `id` ended, when the engine said (its `die` event may trail its removal
    /// by a moment: looked for up to half a second).
    pub async fn of(&self, id: &str) -> Option<ExitInfo> {
        for _ in 0..10 {
            let found = self
                .lock()
                .iter()
                .find(|(seen, info)| seen == id && info.exit_code.is_some())
                .map(|(_, info)| info.clone());
            if found.is_some() {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
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
}
