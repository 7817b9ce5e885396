//! Code in a disposable sandbox: started (or drawn from the pool), run, its files collected, and
//! removed in the background once the result is on its way.

use std::time::{Duration, Instant};

use super::pip::CodePip;
use super::{Engine, RunOptions};
use crate::engine::deps::Requirement;
use crate::engine::outcome::{DependencyReport, Execution};
use crate::engine::sandbox::{Sandbox, Task};
use crate::engine::sessions::SessionDependencies;
use crate::engine::EngineError;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The host directory name of an ephemeral run: sortable by time, unique.
fn ephemeral_run_dir() -> String {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = stamp
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    format!(
        "run-{stamp}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

impl Engine {
    /// One execution of an ephemeral run whose code may change the run's own set with pip
    /// (`service::pip`); `report` becomes the set it ran with last.
    async fn execute_with_pip(
        &self,
        sandbox: &mut Sandbox,
        task: Task<'_>,
        options: &RunOptions,
        requirements: &[Requirement],
        report: &mut Option<DependencyReport>,
    ) -> Result<Execution, EngineError> {
        let set = std::sync::Mutex::new(match report {
            Some(report) => SessionDependencies {
                requirements: requirements.to_vec(),
                key: Some(report.key.clone()),
                path: Some(report.path.clone()),
            },
            None => SessionDependencies::default(),
        });
        let pip = CodePip {
            engine: self,
            image: self.check_image(options.image.as_deref())?,
            kind: "ephemeral",
            options,
            set: &set,
            rate: None,
            report: std::sync::Mutex::new(None),
        };
        let result = self.execute_in(sandbox, task, options, Some(&pip)).await;
        if let Some(changed) = pip.into_report() {
            *report = Some(changed);
        }
        result
    }

    /// Runs code in a fresh sandbox: a new one, or one the caller's last run used, emptied by its
    /// supervisor since (`SANDBOX_RECYCLE`, see `engine::recycled`); nothing of another run is
    /// left in it.
    pub async fn run_ephemeral(
        &self,
        task: Task<'_>,
        options: &RunOptions,
    ) -> Result<Execution, EngineError> {
        Self::check_task(task)?;
        let requirements = self.requirements(&options.dependencies)?;
        let _permit = self.permit().await;
        let started = Instant::now();
        let (mut sandbox, mut report) = self.launch("ephemeral", options, &requirements).await?;
        let mut acquired = started.elapsed();
        options.report("running");
        let mut result = self
            .execute_with_pip(&mut sandbox, task, options, &requirements, &mut report)
            .await;
        // A pooled sandbox that died while it waited: the code never ran; take another (the pool
        // empties, then a sandbox is started for the call).
        while matches!(result, Err(EngineError::DiedBeforeUse)) {
            self.retire(sandbox);
            (sandbox, report) = self.launch("ephemeral", options, &requirements).await?;
            acquired = started.elapsed();
            result = self
                .execute_with_pip(&mut sandbox, task, options, &requirements, &mut report)
                .await;
        }
        let executed = started.elapsed();
        // Neither dependencies nor pip's changes, the default image: as a pooled sandbox is.
        let plain = requirements.is_empty()
            && report.is_none()
            && self.check_image(options.image.as_deref()).ok().as_deref()
                == Some(self.config.image.as_str());
        if let Ok(execution) = &mut result {
            execution.dependencies = report;
            let run_dir = options.run_dir(ephemeral_run_dir());
            self.collect_files(
                &mut sandbox,
                execution,
                &run_dir,
                options.mounted_roots().map(|r| r.as_ref()),
            )
            .await;
            // The sandbox goes away with this call: the host keeps the only copy.
            self.keep_whole_output(None, execution, &run_dir, options)
                .await;
        }
        let collected = started.elapsed();
        // The result goes back now; the sandbox is recycled or removed in the background.
        self.retire_used(sandbox, options, &result, plain);
        self.pool_used();
        tracing::debug!(
            acquire_ms = ms(acquired),
            execute_ms = ms(executed - acquired),
            collect_ms = ms(collected - executed),
            total_ms = ms(collected),
            "ephemeral run"
        );
        result
    }
}
