//! `doctor`: what is really enforced, verified rather than assumed. A probe sandbox (a session
//! of the doctor's own) reports what it sees; while it exists, the engine's record of it and, on
//! this machine, the host cgroup that holds it are read; last, an allocation past the memory
//! limit must be stopped. Each limit is then compared with the configuration in every source
//! ([`checks`]), and each line says which sources verified it.

mod checks;
mod host;
mod probe;
mod runsc;

use std::process::ExitCode;

use crate::config::{Config, NetworkPolicy};
use crate::engine::backend::BackendInfo;
use crate::engine::docker::image;
use crate::engine::{Engine, EngineError};

struct Report {
    failures: usize,
}

impl Report {
    fn line(&mut self, ok: bool, what: &str, detail: impl std::fmt::Display) {
        if !ok {
            self.failures += 1;
        }
        println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    }

    /// A warning: worth acting on, but nothing is wrong with what is enforced.
    fn warn(&mut self, what: &str, detail: impl std::fmt::Display) {
        println!("warn {what}: {detail}");
    }

    fn check(&mut self, check: &checks::Check) {
        self.line(check.ok, check.what, &check.detail);
    }
}

pub async fn doctor(mut config: Config) -> ExitCode {
    let mut report = Report { failures: 0 };
    // The probe is a session of the doctor's own, whatever the server's cap on them.
    config.sessions.max_sessions = config.sessions.max_sessions.max(1);
    let engine = Engine::with_docker(config.clone());
    let backend = engine.backend();
    let platform = match engine.platform().await {
        Ok(platform) => platform,
        Err(EngineError::Refused(refusal)) => {
            if let Ok(info) = backend.info().await {
                describe_engine(&mut report, &info);
            }
            report.line(false, "sandboxes", refusal);
            return ExitCode::FAILURE;
        }
        Err(e) => {
            report.line(false, "engine", e);
            if config.remote_engine {
                println!(
                    "     check that {} answers: the network, and the TLS certificates \
                     (DOCKER_CERT_PATH) or the ssh login",
                    crate::engine::docker::endpoint()
                );
            } else {
                for line in super::setup::how_to_get_an_engine().lines() {
                    println!("     {line}");
                }
            }
            return ExitCode::FAILURE;
        }
    };
    describe_engine(&mut report, &platform.engine);
    report.line(
        true,
        "runtime",
        format!(
            "the agent's code runs under {}: {}",
            platform.code.label(&platform.engine),
            platform.code.why
        ),
    );
    if config.network == NetworkPolicy::None {
        if let Some(networked) = crate::engine::platform::networked_code(&config, &platform.engine)
        {
            report.line(
                true,
                "networked runtime",
                format!(
                    "with SANDBOX_NETWORK=allowlist or bridge the code would run under {}: {}",
                    networked.label(&platform.engine),
                    networked.why
                ),
            );
        }
    }
    describe_gvisor(&mut report, &platform.engine).await;
    report.line(true, "roots", config.roots.summary());
    report.line(true, "CA bundle", config.ca_bundle_summary());
    if let Some(secrets) = config.secrets_summary() {
        report.line(true, "secrets", secrets);
    }
    if platform.installer != platform.code {
        report.line(
            true,
            "installer runtime",
            format!(
                "{}: {}",
                platform.installer.label(&platform.engine),
                platform.installer.why
            ),
        );
    }
    if let Ok(admission) = engine.admission().await {
        let capacity = admission.capacity();
        report.line(
            true,
            "capacity",
            format!(
                "at most {} sandboxes at once ({}), {} starting at once (the engine's CPUs); calls \
                 beyond wait in turn, for their time limit and at least {} s",
                capacity.sandboxes,
                capacity.why,
                capacity.starts,
                config.admission_wait.as_secs()
            ),
        );
    }
    if backend.image_id(&config.image).await.is_err() {
        report.line(
            false,
            "image",
            format!(
                "{} is missing: {}",
                config.image,
                image::missing_hint(&config.image)
            ),
        );
        return ExitCode::FAILURE;
    }
    report.line(true, "image", &config.image);

    let findings = probe::run(&engine, !platform.engine.remote).await;
    engine.settle().await;
    engine.stop_egress().await;
    let findings = match findings {
        Ok(findings) => findings,
        Err(e) => {
            report.line(false, "probe sandbox", e);
            return ExitCode::FAILURE;
        }
    };
    let expected = checks::Expected {
        limits: &config.limits,
        gvisor: platform.code.gvisor,
        runtime: platform
            .code
            .name
            .clone()
            .or_else(|| platform.engine.default_runtime.clone()),
        runtime_named: platform.code.name.is_some(),
        registered: platform.engine.runtimes.keys().cloned().collect(),
    };
    report.check(&checks::runtime_check(&expected, &findings));
    if let Some(missing) = &findings.host_missing {
        println!("     {missing}; the limits are verified without it");
    }
    for check in checks::identity_checks(&findings.seen)
        .into_iter()
        .chain(checks::limit_checks(&expected, &findings))
        .chain(checks::environment_checks(&findings.seen, config.network))
    {
        report.check(&check);
    }
    if config.network == NetworkPolicy::Allowlist {
        // The probe ran on an egress network of its own: the proxy started, and was asked.
        report.line(
            true,
            "egress",
            format!(
                "each sandbox on an internal network of its own (from {}) with the server's proxy \
                 (uplink {}); {} allow and {} ask entries",
                config.egress.subnets,
                config.egress.uplink,
                config.egress.allow.entries.len(),
                config.egress.ask.entries.len()
            ),
        );
    }
    for check in checks::storage_checks(&findings.seen) {
        report.check(&check);
    }
    if report.failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The engine line: which engine, where, with or without root; and, for an engine on another
/// machine, which settings name paths there.
fn describe_engine(report: &mut Report, info: &BackendInfo) {
    report.line(
        true,
        "engine",
        format!(
            "{} (API {}), {}, {} at {}{}",
            info.name,
            info.api_version,
            if info.rootless { "rootless" } else { "rootful" },
            if info.remote { "remote" } else { "local" },
            info.endpoint,
            info.cgroup_version
                .as_deref()
                .map(|v| format!(", cgroup v{v}"))
                .unwrap_or_default()
        ),
    );
    if info.remote {
        println!(
            "     host paths in SANDBOX_MOUNTS, PIP_CACHE_PATH and SANDBOX_CA_BUNDLE are paths on \
             the engine's machine; SANDBOX_FILES_DIR and SANDBOX_SNAPSHOT_DIR are on this one"
        );
    }
}

/// The gVisor line, where runsc is registered: the version of the binary the engine runs, the
/// platform it runs sandboxes on, and its age, with a warning and the way to update past
/// [`runsc::STALE_MONTHS`] months.
async fn describe_gvisor(report: &mut Report, info: &BackendInfo) {
    let name = crate::cli::gvisor::RUNTIME_NAME;
    let Some(args) = info.runtimes.get(name) else {
        return;
    };
    let binary = info
        .runtime_paths
        .get(name)
        .cloned()
        .unwrap_or_else(|| name.to_string());
    if info.remote {
        let platform = runsc::platform(None, args);
        report.line(
            true,
            "gVisor",
            format!(
                "{binary} on the engine's machine ({}) cannot be run from here: its version and \
                 age are unknown (run `{binary} --version` there){}",
                info.endpoint,
                platform
                    .name
                    .map(|p| format!("; platform {p} ({})", platform.why))
                    .unwrap_or_default()
            ),
        );
        return;
    }
    let output = match runsc::run_version(&binary).await {
        Ok(output) => output,
        Err(why) => {
            let podman = if info.kind == crate::engine::backend::EngineKind::Podman {
                " (Podman finds its runtimes itself: run `runsc --version` where it runs)"
            } else {
                ""
            };
            report.warn(
                "gVisor",
                format!("the engine runs {binary}, whose version is unknown: {why}{podman}"),
            );
            return;
        }
    };
    let version = runsc::parse_version(&output);
    let platform = runsc::platform(version.as_ref().map(|v| v.released), args);
    let platform = format!(
        "platform {} ({})",
        platform.name.as_deref().unwrap_or("unknown"),
        platform.why
    );
    let Some(version) = version else {
        let said = output.lines().next().unwrap_or("").trim();
        report.warn(
            "gVisor",
            format!(
                "{binary} says {said:?}: a version without a release date, so its age is \
                 unknown; {platform}"
            ),
        );
        return;
    };
    let age = runsc::age(version.released, runsc::Date::today());
    let detail = format!(
        "runsc {} ({binary}), {platform}, released {}, {} months ago",
        version.text, version.released, age.months
    );
    if !age.stale {
        report.line(true, "gVisor", detail);
        return;
    }
    report.warn(
        "gVisor",
        format!(
            "{detail}: older than {} months, without the fixes since",
            runsc::STALE_MONTHS
        ),
    );
    let release = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| runsc::os_release(&text));
    let advice = runsc::how_to_update(
        release
            .as_ref()
            .map(|(id, codename)| (id.as_str(), codename.as_str())),
        version.released,
    );
    println!("     {advice}");
}
