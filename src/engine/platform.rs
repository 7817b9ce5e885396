//! What the engine can enforce, and which OCI runtime runs what: decided once per server from
//! the engine's own description ([`BackendInfo`]) and the configuration.
//!
//! Two rules. The strongest isolation available is the default: gVisor (`runsc`) runs the
//! agent's code whenever it is registered with the engine and can provide what the settings ask
//! for, runc otherwise, and the reason is kept so that `doctor` and the start-up log can say it.
//! And code never runs with less isolation than configured: an engine that says it cannot enforce
//! a limit (rootless engines on cgroup v1 ignore them all) gets no sandbox at all, and an explicit
//! `SANDBOX_RUNTIME` that cannot do what the settings need is refused rather than weakened.
//!
//! Pure logic: no engine calls here, so every branch is unit-tested with made-up engines.

use crate::config::{Config, NetworkPolicy, GVISOR_MIN_PIDS};

use super::backend::{BackendInfo, EngineKind, Limit};

/// The OCI runtime chosen for one kind of sandbox, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeChoice {
    /// The runtime's name as registered with the engine (`None`: the engine's default).
    pub name: Option<String>,
    /// The runtime is gVisor.
    pub gvisor: bool,
    /// How that gVisor entry networks its sandboxes (`None` when it is not gVisor).
    pub gvisor_network: Option<GvisorNetwork>,
    pub why: String,
}

impl RuntimeChoice {
    /// The name to show: the registered name, or the engine's default runtime's.
    pub fn label(&self, engine: &BackendInfo) -> String {
        let name = self
            .name
            .clone()
            .or_else(|| engine.default_runtime.clone())
            .unwrap_or_else(|| "the engine's default".to_string());
        match self.gvisor_network {
            Some(GvisorNetwork::Host) if self.gvisor => {
                format!("{name} (gVisor, host-network mode)")
            }
            _ if self.gvisor => format!("{name} (gVisor)"),
            _ => name,
        }
    }

    fn runc(why: String) -> RuntimeChoice {
        RuntimeChoice {
            name: None,
            gvisor: false,
            gvisor_network: None,
            why,
        }
    }

    fn gvisor(entry: &GvisorEntry, why: String) -> RuntimeChoice {
        RuntimeChoice {
            name: Some(entry.name.clone()),
            gvisor: true,
            gvisor_network: Some(entry.network),
            why,
        }
    }
}

/// How a gVisor entry gives its sandboxes a network, read from its registered arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GvisorNetwork {
    /// `--network=none`: none at all, whatever the container asks.
    None,
    /// gVisor's own network stack (runsc's default): the container's interfaces copied into the
    /// sandbox, every packet handled by gVisor.
    Netstack,
    /// `--network=host`: the sandbox's sockets are served by the host kernel, inside the
    /// container's own network namespace (its bridge or egress network, nothing more); the rest
    /// of the kernel stays gVisor's. Registered where runsc refuses its own stack on the host.
    Host,
}

impl GvisorNetwork {
    /// The mode an entry's arguments give (the last `--network=` wins, as in runsc's flags).
    pub fn of(args: &[String]) -> GvisorNetwork {
        args.iter()
            .rev()
            .find_map(|arg| {
                arg.strip_prefix("--network=")
                    .or_else(|| arg.strip_prefix("-network="))
            })
            .map(|mode| match mode {
                "none" => GvisorNetwork::None,
                "host" => GvisorNetwork::Host,
                _ => GvisorNetwork::Netstack,
            })
            .unwrap_or(GvisorNetwork::Netstack)
    }

    /// In words, for the start-up log, `doctor` and `setup`.
    pub fn describe(self) -> &'static str {
        match self {
            GvisorNetwork::None => "no network (--network=none)",
            GvisorNetwork::Netstack => "gVisor's own network stack",
            GvisorNetwork::Host => {
                "host-network mode (--network=host: the host kernel serves the sandbox's sockets \
                 inside the container's own network namespace; the registration chooses it where \
                 runsc refuses gVisor's own network stack)"
            }
        }
    }
}

/// A runtime registered with the engine that is gVisor.
#[derive(Debug, Clone)]
struct GvisorEntry {
    name: String,
    network: GvisorNetwork,
}

/// The gVisor entries the engine lists: the one for sandboxes without a network (`runsc`
/// registered with `--network=none`, as `setup --gvisor` does) and the one for networked
/// sandboxes (`runsc-net`, or any other gVisor entry with a network). A `runsc` registered with
/// a network serves both.
fn gvisor_entries(engine: &BackendInfo) -> (Option<GvisorEntry>, Option<GvisorEntry>) {
    let mut entries: Vec<GvisorEntry> = engine
        .runtimes
        .iter()
        .filter(|(name, _)| is_gvisor_name(name))
        .map(|(name, args)| GvisorEntry {
            name: name.clone(),
            network: GvisorNetwork::of(args),
        })
        .collect();
    // The conventional names first, then the rest by name (the map is sorted).
    let rank = |entry: &GvisorEntry| match entry.name.as_str() {
        "runsc" => 0,
        "runsc-net" => 1,
        _ => 2,
    };
    entries.sort_by_key(rank);
    let offline = entries
        .iter()
        .find(|e| e.network == GvisorNetwork::None)
        .or_else(|| entries.first())
        .cloned();
    let networked = entries
        .iter()
        .find(|e| e.network != GvisorNetwork::None)
        .cloned();
    (offline, networked)
}

/// The engine as the server uses it.
#[derive(Debug, Clone)]
pub struct Platform {
    pub engine: BackendInfo,
    /// The runtime of the sandboxes that run the agent's code (and of preparers, which import
    /// its packages).
    pub code: RuntimeChoice,
    /// The runtime of installers, which need a network whatever the code's policy.
    pub installer: RuntimeChoice,
}

/// Why no sandbox may start on this engine with these settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// A runtime registered under this name is taken to be gVisor (`runsc`, `runsc-net`, ...).
pub fn is_gvisor_name(name: &str) -> bool {
    name.starts_with("runsc")
}

/// Decides the runtimes, or refuses the engine.
pub fn decide(config: &Config, engine: BackendInfo) -> Result<Platform, Refusal> {
    refuse_unenforced_limits(&engine)?;
    refuse_unowned_roots(config, &engine)?;
    if engine.kind == EngineKind::Podman && config.network == NetworkPolicy::Allowlist {
        return Err(Refusal(format!(
            "refusing to start sandboxes: SANDBOX_NETWORK=allowlist is not supported on {} yet \
             (its egress networks and proxy are tested on Docker only); use Docker, or \
             SANDBOX_NETWORK=none",
            engine.name
        )));
    }
    let code_needs_network = config.network != NetworkPolicy::None;
    let code = match &config.runtime {
        Some(name) => explicit(config, &engine, name, code_needs_network)?,
        None => automatic(config, &engine, code_needs_network),
    };
    // Installers reach the index: the code's runtime when it gives them a network, else the
    // networked gVisor entry, else the engine's default.
    let installer = if code_needs_network || !code.gvisor {
        code.clone()
    } else {
        match gvisor_entries(&engine).1 {
            Some(entry) => RuntimeChoice::gvisor(
                &entry,
                format!(
                    "gVisor gives installers their network through {}",
                    entry.network.describe()
                ),
            ),
            None => RuntimeChoice::runc(
                "installers need a network, and no gVisor entry with one is registered \
                 (`sudo python-code-sandbox setup --gvisor` registers runsc-net)"
                    .to_string(),
            ),
        }
    };
    Ok(Platform {
        engine,
        code,
        installer,
    })
}

/// What runsc says when it refuses gVisor's own network stack on a host.
pub const NETSTACK_REFUSAL: &str = "cannot run with network enabled in root network namespace";

/// The runtime networked code would get on this engine (`SANDBOX_NETWORK=allowlist` or
/// `bridge`), for `doctor` and `setup` to say when the policy is `none`; `None` when the engine
/// would refuse it.
pub fn networked_code(config: &Config, engine: &BackendInfo) -> Option<RuntimeChoice> {
    let networked = Config {
        network: NetworkPolicy::Bridge,
        ..config.clone()
    };
    decide(&networked, engine.clone()).ok().map(|p| p.code)
}

/// `SANDBOX_ROOTS=rw` runs the code as the server's uid so that what it writes to the user's
/// directories is the user's: an engine that maps container uids to others (rootless, or
/// `userns-remap`) would leave those files owned by someone else.
fn refuse_unowned_roots(config: &Config, engine: &BackendInfo) -> Result<(), Refusal> {
    if config.roots.mode != crate::config::RootsMode::ReadWrite {
        return Ok(());
    }
    let mapping = if engine.rootless {
        "runs rootless, so a sandbox's uids are mapped into the engine user's subordinate range"
    } else if engine.userns_remap {
        "remaps container uids (userns-remap)"
    } else {
        return Ok(());
    };
    Err(Refusal(format!(
        "refusing to start sandboxes: SANDBOX_ROOTS=rw needs the files the code writes to the \
         user's roots to be owned by the server's user, and {} {mapping}: they would be owned by \
         another uid. Use SANDBOX_ROOTS=ro, or a rootful engine without user-namespace remapping",
        engine.name
    )))
}

fn refuse_unenforced_limits(engine: &BackendInfo) -> Result<(), Refusal> {
    let cgroup_v1 = engine.cgroup_version.as_deref() == Some("1");
    if engine.rootless && cgroup_v1 {
        return Err(Refusal(format!(
            "refusing to start sandboxes: {} runs rootless on a cgroup v1 host, where the engine \
             ignores every resource limit (memory, swap, processes, CPU). Run it on a host with \
             cgroup v2 and a delegated subtree (a systemd user session with the memory, pids and \
             cpu controllers delegated), or use the rootful engine",
            engine.name
        )));
    }
    if !engine.unenforced.is_empty() {
        let limits: Vec<&str> = engine.unenforced.iter().map(|l| l.as_str()).collect();
        let hint = if engine.unenforced.contains(&Limit::Swap) && engine.unenforced.len() == 1 {
            " (on cgroup v1, boot the kernel with swapaccount=1)"
        } else {
            ""
        };
        return Err(Refusal(format!(
            "refusing to start sandboxes: {} says it cannot enforce these limits on this host: \
             {}{hint}{}",
            engine.name,
            limits.join(", "),
            if engine.rootless {
                "; a rootless engine needs cgroup v2 with those controllers delegated to the user"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// `SANDBOX_RUNTIME` names a runtime: it must be registered, and able to do what is asked.
fn explicit(
    config: &Config,
    engine: &BackendInfo,
    name: &str,
    needs_network: bool,
) -> Result<RuntimeChoice, Refusal> {
    let registered = engine.runtimes.get(name);
    // Engines that list no runtimes (the fake) are taken at their word.
    if registered.is_none() && !engine.runtimes.is_empty() {
        let known: Vec<&str> = engine.runtimes.keys().map(String::as_str).collect();
        return Err(Refusal(format!(
            "SANDBOX_RUNTIME={name} is not registered with {} (registered: {}); register it \
             (`sudo python-code-sandbox setup --gvisor` does for gVisor with a local Docker engine) or unset SANDBOX_RUNTIME to let the server choose",
            engine.name,
            known.join(", ")
        )));
    }
    if !is_gvisor_name(name) {
        return Ok(RuntimeChoice {
            name: Some(name.to_string()),
            gvisor: false,
            gvisor_network: None,
            why: "SANDBOX_RUNTIME chooses it".to_string(),
        });
    }
    let network = registered
        .map(|args| GvisorNetwork::of(args))
        .unwrap_or(GvisorNetwork::Netstack);
    let named = GvisorEntry {
        name: name.to_string(),
        network,
    };
    if !needs_network || network != GvisorNetwork::None {
        return Ok(RuntimeChoice::gvisor(
            &named,
            "SANDBOX_RUNTIME chooses it".to_string(),
        ));
    }
    // SANDBOX_RUNTIME names gVisor: its entry with a network serves networked sandboxes.
    match gvisor_entries(engine).1 {
        Some(entry) => Ok(RuntimeChoice::gvisor(
            &entry,
            format!(
                "SANDBOX_RUNTIME={name} chooses gVisor, and {name} has no network \
                 (--network=none): SANDBOX_NETWORK={} runs under {}, gVisor with {}",
                config.network.as_str(),
                entry.name,
                entry.network.describe()
            ),
        )),
        None => Err(Refusal(format!(
            "SANDBOX_RUNTIME={name} cannot give sandboxes a network: {} registers it with \
             --network=none and lists no gVisor entry with a network, and SANDBOX_NETWORK={} \
             needs one. Register one (`sudo python-code-sandbox setup --gvisor` adds runsc-net), \
             unset SANDBOX_RUNTIME (runc is then chosen for networked sandboxes) or set \
             SANDBOX_NETWORK=none",
            engine.name,
            config.network.as_str()
        ))),
    }
}

/// gVisor's own installation guide, for engines `setup --gvisor` cannot register it with.
pub const GVISOR_INSTALL_GUIDE: &str = "https://gvisor.dev/docs/user_guide/install/";

/// What to do to get gVisor on this engine: the exact command where `setup --gvisor` can
/// register it, else the instructions for that kind of engine.
pub fn how_to_get_gvisor(engine: &BackendInfo) -> String {
    match gvisor_registrable(engine) {
        Ok(()) => "run `sudo python-code-sandbox setup --gvisor` (installs Debian's runsc when it \
                   is missing, adds it to dockerd's daemon.json and reloads dockerd; running \
                   sandboxes are not touched)"
            .to_string(),
        Err(why) => why,
    }
}

/// Whether `setup --gvisor` can register gVisor with this engine (Linux, a local rootful Docker
/// engine); else what to do instead.
pub fn gvisor_registrable(engine: &BackendInfo) -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err(format!(
            "gVisor needs a Linux engine; {} here runs containers in a VM without it",
            engine.name
        ));
    }
    if engine.remote {
        return Err(format!(
            "the engine is on another machine ({}): install gVisor there \
             ({GVISOR_INSTALL_GUIDE}), add \"runtimes\": {{\"runsc\": {{\"path\": \
             \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\"]}}}} to its \
             /etc/docker/daemon.json and reload dockerd (kill -HUP)",
            engine.endpoint
        ));
    }
    if engine.kind == EngineKind::Podman {
        return Err(
            "Podman cannot choose runsc through its Docker-compatible API (docs/engines.md): \
             use Docker Engine for gVisor"
                .to_string(),
        );
    }
    if engine.rootless {
        return Err(format!(
            "rootless Docker: add runsc to ~/.config/docker/daemon.json \
             ({GVISOR_INSTALL_GUIDE}) and restart the daemon (systemctl --user restart docker)"
        ));
    }
    Ok(())
}

/// No `SANDBOX_RUNTIME`: gVisor when it is registered and can provide what the settings need.
fn automatic(config: &Config, engine: &BackendInfo, needs_network: bool) -> RuntimeChoice {
    let (offline, networked) = gvisor_entries(engine);
    let Some(offline) = offline else {
        return RuntimeChoice::runc(format!(
            "gVisor (runsc) is not registered with {}; for its stronger isolation: {}",
            engine.name,
            how_to_get_gvisor(engine)
        ));
    };
    let entry = if needs_network {
        let Some(networked) = networked else {
            return RuntimeChoice::runc(format!(
                "gVisor is registered with --network=none only, and SANDBOX_NETWORK={} needs a \
                 network: {} registers runsc-net, gVisor's entry for networked sandboxes",
                config.network.as_str(),
                match gvisor_registrable(engine) {
                    Ok(()) => "`sudo python-code-sandbox setup --gvisor`".to_string(),
                    Err(_) => "registering gVisor again as docs/install.md says".to_string(),
                }
            ));
        };
        networked
    } else {
        offline
    };
    if config.limits.pids < GVISOR_MIN_PIDS {
        return RuntimeChoice::runc(format!(
            "SANDBOX_PIDS_LIMIT={} is below the {GVISOR_MIN_PIDS} gVisor needs",
            config.limits.pids
        ));
    }
    let why = if needs_network {
        format!(
            "gVisor is registered with the engine, and {} gives networked sandboxes {} \
             (SANDBOX_RUNTIME=runc chooses runc)",
            entry.name,
            entry.network.describe()
        )
    } else {
        "gVisor is registered with the engine (SANDBOX_RUNTIME=runc chooses runc)".to_string()
    };
    RuntimeChoice::gvisor(&entry, why)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn engine(runtimes: &[(&str, &[&str])]) -> BackendInfo {
        BackendInfo {
            name: "Docker 20.10".into(),
            kind: EngineKind::Docker,
            version: "20.10".into(),
            api_version: "1.41".into(),
            rootless: false,
            userns_remap: false,
            cgroup_version: Some("1".into()),
            runtimes: runtimes
                .iter()
                .map(|(name, args)| {
                    (
                        name.to_string(),
                        args.iter().map(|a| a.to_string()).collect(),
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            runtime_paths: BTreeMap::new(),
            default_runtime: Some("runc".into()),
            unenforced: Vec::new(),
            endpoint: "unix:///var/run/docker.sock".into(),
            remote: false,
            memory_bytes: None,
            cpus: None,
        }
    }

    const HERE: &[(&str, &[&str])] = &[("runc", &[]), ("runsc", &["--network=none"])];

    #[test]
    fn gvisor_by_default_when_registered() {
        let platform = decide(&Config::default(), engine(HERE)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runsc"));
        assert!(platform.code.gvisor);
        assert_eq!(platform.code.label(&platform.engine), "runsc (gVisor)");
        // Installers need a network, which this runsc cannot give.
        assert_eq!(platform.installer.name, None);
        assert!(
            platform.installer.why.contains("runsc-net"),
            "{:?}",
            platform.installer
        );
    }

    /// What `setup --gvisor` and `scripts/runsc.sh` register where runsc refuses its own network
    /// stack (this machine): an entry without a network and one in host-network mode.
    const TWO: &[(&str, &[&str])] = &[
        ("runc", &[]),
        ("runsc", &["--network=none"]),
        ("runsc-net", &["--network=host"]),
    ];

    #[test]
    fn networked_code_and_installers_keep_gvisor_through_its_networked_entry() {
        let networked = Config {
            network: NetworkPolicy::Allowlist,
            ..Config::default()
        };
        let platform = decide(&networked, engine(TWO)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runsc-net"));
        assert_eq!(platform.code.gvisor_network, Some(GvisorNetwork::Host));
        assert!(
            platform.code.why.contains("host-network mode"),
            "{}",
            platform.code.why
        );
        assert_eq!(
            platform.code.label(&platform.engine),
            "runsc-net (gVisor, host-network mode)"
        );
        assert_eq!(platform.installer, platform.code);

        // Without a network the code keeps the entry that has none; installers get the other.
        let platform = decide(&Config::default(), engine(TWO)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runsc"));
        assert_eq!(platform.code.gvisor_network, Some(GvisorNetwork::None));
        assert_eq!(platform.installer.name.as_deref(), Some("runsc-net"));
        assert!(platform.installer.gvisor);

        // gVisor's own stack, where the host accepts it.
        let netstack = engine(&[("runsc", &["--network=none"]), ("runsc-net", &[])]);
        let platform = decide(&networked, netstack).expect("decided");
        assert_eq!(platform.code.gvisor_network, Some(GvisorNetwork::Netstack));
        assert_eq!(platform.code.label(&platform.engine), "runsc-net (gVisor)");

        // SANDBOX_RUNTIME=runsc means gVisor: a networked policy gets its networked entry.
        let named = Config {
            runtime: Some("runsc".into()),
            network: NetworkPolicy::Bridge,
            ..Config::default()
        };
        let platform = decide(&named, engine(TWO)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runsc-net"));
        assert!(
            platform.code.why.contains("SANDBOX_RUNTIME=runsc"),
            "{}",
            platform.code.why
        );
        // An explicit networked entry is taken as named.
        let named = Config {
            runtime: Some("runsc-net".into()),
            ..Config::default()
        };
        let platform = decide(&named, engine(TWO)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runsc-net"));
    }

    #[test]
    fn an_entrys_network_is_read_from_its_arguments() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(GvisorNetwork::of(&args(&[])), GvisorNetwork::Netstack);
        assert_eq!(
            GvisorNetwork::of(&args(&["--network=none"])),
            GvisorNetwork::None
        );
        assert_eq!(
            GvisorNetwork::of(&args(&["-network=host"])),
            GvisorNetwork::Host
        );
        assert_eq!(
            GvisorNetwork::of(&args(&["--network=sandbox", "--platform=systrap"])),
            GvisorNetwork::Netstack
        );
        assert_eq!(
            GvisorNetwork::of(&args(&["--network=none", "--network=host"])),
            GvisorNetwork::Host
        );
    }

    #[test]
    fn runc_when_gvisor_is_absent_or_cannot_do_what_is_asked() {
        let absent = decide(&Config::default(), engine(&[("runc", &[])])).expect("decided");
        assert_eq!(absent.code.name, None);
        assert!(absent.code.why.contains("not registered"));
        assert!(
            absent
                .code
                .why
                .contains("sudo python-code-sandbox setup --gvisor"),
            "{}",
            absent.code.why
        );
        assert_eq!(absent.code.label(&absent.engine), "runc");

        let networked = Config {
            network: NetworkPolicy::Allowlist,
            ..Config::default()
        };
        let platform = decide(&networked, engine(HERE)).expect("decided");
        assert_eq!(platform.code.name, None);
        assert!(platform.code.why.contains("SANDBOX_NETWORK=allowlist"));

        let mut few_pids = Config::default();
        few_pids.limits.pids = 64;
        let platform = decide(&few_pids, engine(HERE)).expect("decided");
        assert!(!platform.code.gvisor);
        assert!(platform.code.why.contains("SANDBOX_PIDS_LIMIT=64"));

        // gVisor registered with a network serves networked code and installers.
        let with_network = engine(&[("runc", &[]), ("runsc", &[])]);
        let platform = decide(&networked, with_network).expect("decided");
        assert!(platform.code.gvisor && platform.installer.gvisor);
    }

    #[test]
    fn an_explicit_runtime_is_obeyed_or_refused_never_weakened() {
        let runc = Config {
            runtime: Some("runc".into()),
            ..Config::default()
        };
        let platform = decide(&runc, engine(HERE)).expect("decided");
        assert_eq!(platform.code.name.as_deref(), Some("runc"));
        assert!(platform.code.why.contains("SANDBOX_RUNTIME"));

        let unknown = Config {
            runtime: Some("kata".into()),
            ..Config::default()
        };
        let refusal = decide(&unknown, engine(HERE)).expect_err("refused");
        assert!(refusal.0.contains("not registered") && refusal.0.contains("runc, runsc"));

        let gvisor_networked = Config {
            runtime: Some("runsc".into()),
            network: NetworkPolicy::Bridge,
            ..Config::default()
        };
        let refusal = decide(&gvisor_networked, engine(HERE)).expect_err("refused");
        assert!(refusal.0.contains("--network=none"), "{refusal}");
    }

    #[test]
    fn writable_roots_need_the_engine_to_keep_uids() {
        let mut rw = Config::default();
        rw.roots.mode = crate::config::RootsMode::ReadWrite;
        assert!(decide(&rw, engine(HERE)).is_ok());
        let mut remapped = engine(HERE);
        remapped.userns_remap = true;
        let refusal = decide(&rw, remapped.clone()).expect_err("refused");
        assert!(refusal.0.contains("SANDBOX_ROOTS=rw") && refusal.0.contains("userns-remap"));
        let mut rootless = engine(HERE);
        rootless.rootless = true;
        rootless.cgroup_version = Some("2".into());
        let refusal = decide(&rw, rootless).expect_err("refused");
        assert!(refusal.0.contains("rootless"), "{refusal}");
        // Read-only roots are read the same under any mapping.
        rw.roots.mode = crate::config::RootsMode::ReadOnly;
        assert!(decide(&rw, remapped).is_ok());
    }

    #[test]
    fn limits_the_engine_cannot_enforce_refuse_every_sandbox() {
        let mut rootless = engine(HERE);
        rootless.kind = EngineKind::Podman;
        rootless.name = "Podman 4.3.1".into();
        rootless.rootless = true;
        let refusal = decide(&Config::default(), rootless.clone()).expect_err("refused");
        assert!(refusal.0.contains("rootless") && refusal.0.contains("cgroup v2"));
        assert!(refusal.0.starts_with("refusing"));

        rootless.cgroup_version = Some("2".into());
        assert!(decide(&Config::default(), rootless.clone()).is_ok());
        let allowlist = Config {
            network: NetworkPolicy::Allowlist,
            ..Config::default()
        };
        let refusal = decide(&allowlist, rootless.clone()).expect_err("refused");
        assert!(refusal.0.contains("allowlist") && refusal.0.contains("Podman"));
        rootless.unenforced = vec![Limit::Memory, Limit::Pids];
        let refusal = decide(&Config::default(), rootless).expect_err("refused");
        assert!(
            refusal.0.contains("SANDBOX_MEMORY_LIMIT") && refusal.0.contains("SANDBOX_PIDS_LIMIT")
        );
        assert!(refusal.0.contains("delegated"));
    }

    #[test]
    fn the_way_to_gvisor_fits_the_engine() {
        let local = engine(&[("runc", &[])]);
        assert!(how_to_get_gvisor(&local).contains("sudo python-code-sandbox setup --gvisor"));
        let mut remote = local.clone();
        remote.remote = true;
        remote.endpoint = "tcp://builder:2376".into();
        let text = how_to_get_gvisor(&remote);
        assert!(
            text.contains("another machine (tcp://builder:2376)") && text.contains("daemon.json")
        );
        let mut podman = local.clone();
        podman.kind = EngineKind::Podman;
        assert!(how_to_get_gvisor(&podman).contains("Podman"));
        let mut rootless = local.clone();
        rootless.rootless = true;
        assert!(how_to_get_gvisor(&rootless).contains("rootless Docker"));
        assert!(gvisor_registrable(&local).is_ok());
        assert!(gvisor_registrable(&remote).is_err());
    }
}
