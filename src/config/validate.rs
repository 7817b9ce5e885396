//! Rules between settings, which no single setting's parser can check: what may not be set
//! together, and what one value requires of another. Defaults derived from other settings are
//! filled in here too.

use super::address::{redact_url, url_has_credentials};
use super::error::ConfigError;
use super::secrets::Secrets;
use super::settings::{
    Env, DOCKER_CERT_PATH, DOCKER_HOST, DOCKER_TLS_VERIFY, SANDBOX_ALLOW_SOURCE_BUILDS,
    SANDBOX_EGRESS_ALLOW, SANDBOX_EGRESS_ALLOW_ALL, SANDBOX_EGRESS_ASK, SANDBOX_EGRESS_RESOLVE,
    SANDBOX_FILES_MAX_BYTES, SANDBOX_HTTP_RESOURCE_URL, SANDBOX_HTTP_TOKEN,
    SANDBOX_HTTP_TOKENS_FILE, SANDBOX_HTTP_TOKEN_FILE, SANDBOX_NETWORK, SANDBOX_OAUTH_ISSUER,
    SANDBOX_OAUTH_JWKS, SANDBOX_PIDS_LIMIT, SANDBOX_POOL_MAX_MEMORY, SANDBOX_ROOTS,
    SANDBOX_ROOTS_ALLOW, SANDBOX_ROOTS_MAP, SANDBOX_SECRETS_FILE, SANDBOX_SNAPSHOT_MAX_TOTAL,
    SANDBOX_WORKSPACE_SIZE,
};
use super::{Config, NetworkPolicy, RootsMode, DEFAULT_WORKSPACE_BYTES, GVISOR_MIN_PIDS};

/// Settings that may not be given together, checked before any value is read (so the token file
/// is not read when it would be refused anyway).
pub(super) fn conflicts(env: &Env) -> Result<(), ConfigError> {
    if let (Some(_), Some(file)) = (
        env.get(&SANDBOX_HTTP_TOKEN),
        env.get(&SANDBOX_HTTP_TOKEN_FILE),
    ) {
        return Err(ConfigError::new(
            SANDBOX_HTTP_TOKEN_FILE.name,
            file,
            "either SANDBOX_HTTP_TOKEN or SANDBOX_HTTP_TOKEN_FILE, not both",
        ));
    }
    let shared = env
        .get(&SANDBOX_HTTP_TOKEN)
        .or_else(|| env.get(&SANDBOX_HTTP_TOKEN_FILE));
    if let (Some(_), Some(file)) = (shared, env.get(&SANDBOX_HTTP_TOKENS_FILE)) {
        return Err(ConfigError::new(
            SANDBOX_HTTP_TOKENS_FILE.name,
            file,
            "either one shared token (SANDBOX_HTTP_TOKEN or SANDBOX_HTTP_TOKEN_FILE) or a tokens \
             file of principals, not both: give the shared token's holder a line of its own",
        ));
    }
    Ok(())
}

/// What values require of each other, once every setting is read.
pub(super) fn relations(config: &mut Config, env: &Env) -> Result<(), ConfigError> {
    let limits = &mut config.limits;
    match env.get(&SANDBOX_WORKSPACE_SIZE) {
        Some(v) if limits.workspace_bytes > limits.memory_bytes => {
            return Err(ConfigError::new(
                SANDBOX_WORKSPACE_SIZE.name,
                v,
                "a size no larger than SANDBOX_MEMORY_LIMIT (the workspace is \
                 kept in memory and counts against that limit), such as 512m",
            ));
        }
        Some(_) => {}
        None => limits.workspace_bytes = DEFAULT_WORKSPACE_BYTES.min(limits.memory_bytes / 2),
    }

    check_tls_files(env)?;

    let under_gvisor = config
        .runtime
        .as_deref()
        .is_some_and(|runtime| runtime.starts_with("runsc"));
    if under_gvisor && config.limits.pids < GVISOR_MIN_PIDS {
        return Err(ConfigError::new(
            SANDBOX_PIDS_LIMIT.name,
            config.limits.pids.to_string(),
            "at least 256 with SANDBOX_RUNTIME=runsc: under gVisor the limit \
             bounds the gVisor kernel's own host threads, which need that many",
        ));
    }

    let files = &config.files;
    if files.max_saved_bytes < files.max_total_bytes {
        return Err(ConfigError::new(
            SANDBOX_FILES_MAX_BYTES.name,
            env.raw(&SANDBOX_FILES_MAX_BYTES)
                .unwrap_or_else(|| files.max_saved_bytes.to_string()),
            "a total at least SANDBOX_FILES_MAX_TOTAL (the files one execution \
             saves must fit), such as 1g",
        ));
    }

    let snapshots = &config.snapshots;
    if snapshots.max_total < snapshots.max_size {
        return Err(ConfigError::new(
            SANDBOX_SNAPSHOT_MAX_TOTAL.name,
            env.raw(&SANDBOX_SNAPSHOT_MAX_TOTAL)
                .unwrap_or_else(|| snapshots.max_total.to_string()),
            "a total at least SANDBOX_SNAPSHOT_MAX_SIZE (one snapshot must fit), such as 5g",
        ));
    }

    if let (Some(v), Some(host)) = (env.get(&SANDBOX_POOL_MAX_MEMORY), host_memory()) {
        if config.pool_max_memory > host {
            return Err(ConfigError::new(
                SANDBOX_POOL_MAX_MEMORY.name,
                v,
                "a size below the host's memory (the pool's sandboxes wait in it), such as 2g",
            ));
        }
    }

    egress(config, env)?;
    oauth(config, env)?;
    secrets(config, env)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    roots(config, env, unsafe { libc::geteuid() })?;

    let deps = &config.deps;
    if deps.allow_source_builds {
        // A package's build code runs in the installer, which is given the index URLs.
        let mut urls = deps.index_url.iter().chain(&deps.extra_index_urls);
        if let Some(url) = urls.find(|u| url_has_credentials(u)) {
            return Err(ConfigError::new(
                SANDBOX_ALLOW_SOURCE_BUILDS.name,
                format!(
                    "true (with the credential-bearing index {})",
                    redact_url(url)
                ),
                "false while PIP_INDEX_URL or PIP_EXTRA_INDEX_URL carry credentials: \
                 a source build runs the package's own code in the installer, which \
                 could read them; use wheels only, or an index without credentials",
            ));
        }
    }
    Ok(())
}

/// The roots settings: the others only when roots are on; not with an engine on another machine
/// (a client's directories are this machine's); `rw` not as root (the code would write the
/// user's files as root); somewhere to allow them.
pub(super) fn roots(config: &Config, env: &Env, euid: u32) -> Result<(), ConfigError> {
    let roots = &config.roots;
    let mode = env.get(&SANDBOX_ROOTS).unwrap_or_default();
    if !roots.mode.is_on() {
        for setting in [&SANDBOX_ROOTS_ALLOW, &SANDBOX_ROOTS_MAP] {
            if let Some(v) = env.get(setting) {
                return Err(ConfigError::new(
                    setting.name,
                    v,
                    "unset unless SANDBOX_ROOTS is ro or rw: it bounds the client's roots, which \
                     are not mounted while SANDBOX_ROOTS is off",
                ));
            }
        }
        return Ok(());
    }
    if config.remote_engine {
        return Err(ConfigError::new(
            SANDBOX_ROOTS.name,
            mode,
            "off with an engine on another machine (DOCKER_HOST): the client's roots are \
             directories of this machine, which that engine cannot mount",
        ));
    }
    if roots.mode == RootsMode::ReadWrite && euid == 0 {
        return Err(ConfigError::new(
            SANDBOX_ROOTS.name,
            mode,
            "ro or off while the server runs as root: with rw the code writes the user's \
             files as the server's user, and root's writes would land as root (run the \
             server as the user whose files these are, or use SANDBOX_ROOTS=ro)",
        ));
    }
    // One directory for every principal's paths would let each mount the others' files.
    let principals = config.http.tokens_file.is_some() || config.http.oauth.issuer.is_some();
    if principals && roots.map.iter().any(|m| !m.per_principal()) {
        return Err(ConfigError::new(
            SANDBOX_ROOTS_MAP.name,
            env.get(&SANDBOX_ROOTS_MAP).unwrap_or_default(),
            "entries whose HOST_PATH names {principal} while there are principals \
             (SANDBOX_HTTP_TOKENS_FILE or OAuth): one mapping for every principal would let \
             each list and mount the others' directories; write /Users=/srv/share/{principal}, \
             or give each principal its own with roots_map=CLIENT_PATH=HOST_PATH on its \
             tokens-file line",
        ));
    }
    if roots.allow.is_empty() {
        return Err(ConfigError::new(
            SANDBOX_ROOTS_ALLOW.name,
            env.get(&SANDBOX_ROOTS_ALLOW).unwrap_or_default(),
            "at least one absolute directory roots may be inside (HOME is unset or not \
             absolute, so there is no default), such as /home/me/projects",
        ));
    }
    Ok(())
}

/// The OAuth settings: all three or none, and not with the one shared token (OAuth callers are
/// principals; a tokens file may sit beside it).
fn oauth(config: &Config, env: &Env) -> Result<(), ConfigError> {
    let oauth = &config.http.oauth;
    let set = [
        (&SANDBOX_OAUTH_ISSUER, oauth.issuer.is_some()),
        (&SANDBOX_OAUTH_JWKS, oauth.jwks.is_some()),
        (&SANDBOX_HTTP_RESOURCE_URL, oauth.resource_url.is_some()),
    ];
    if let Some((given, _)) = set.iter().find(|(_, on)| *on) {
        if let Some((missing, _)) = set.iter().find(|(_, on)| !*on) {
            return Err(ConfigError::new(
                given.name,
                env.get(given).unwrap_or_default(),
                format!(
                    "to be set together with {} (OAuth needs the issuer, its keys and this \
                     server's resource URL: SANDBOX_OAUTH_ISSUER, SANDBOX_OAUTH_JWKS and \
                     SANDBOX_HTTP_RESOURCE_URL)",
                    missing.name
                ),
            ));
        }
        let shared = [&SANDBOX_HTTP_TOKEN, &SANDBOX_HTTP_TOKEN_FILE]
            .into_iter()
            .find(|s| env.get(s).is_some());
        if let Some(shared) = shared {
            return Err(ConfigError::new(
                shared.name,
                env.get(shared)
                    .map(|_| "(set)".to_string())
                    .unwrap_or_default(),
                "unset with SANDBOX_OAUTH_ISSUER: OAuth callers are principals, and the one \
                 shared token names none; use SANDBOX_HTTP_TOKENS_FILE for token holders",
            ));
        }
    }
    Ok(())
}

/// The egress settings: only with the allowlist network, `*` only when confirmed, and something
/// to reach.
fn egress(config: &Config, env: &Env) -> Result<(), ConfigError> {
    if config.network != NetworkPolicy::Allowlist {
        let egress_settings = [
            &SANDBOX_EGRESS_ALLOW,
            &SANDBOX_EGRESS_ASK,
            &SANDBOX_EGRESS_ALLOW_ALL,
            &SANDBOX_EGRESS_RESOLVE,
        ];
        for setting in egress_settings {
            if let Some(v) = env.get(setting) {
                return Err(ConfigError::new(
                    setting.name,
                    v,
                    "unset unless SANDBOX_NETWORK=allowlist: the SANDBOX_EGRESS_* settings \
                     apply only to the allowlist network; set SANDBOX_NETWORK=allowlist, or \
                     remove this setting",
                ));
            }
        }
        return Ok(());
    }
    let egress = &config.egress;
    if egress.allow.has_any() && !egress.allow_all {
        return Err(ConfigError::new(
            SANDBOX_EGRESS_ALLOW.name,
            env.get(&SANDBOX_EGRESS_ALLOW).unwrap_or_default(),
            "no `*` entry unless SANDBOX_EGRESS_ALLOW_ALL=true: `*` lets the code reach \
             any host name without asking; set SANDBOX_EGRESS_ALLOW_ALL=true if that is \
             meant, or name the hosts (or put `*` in SANDBOX_EGRESS_ASK to ask the user)",
        ));
    }
    // A secret's hosts are reachable by the code that can use it.
    if egress.allow.is_empty() && egress.ask.is_empty() && config.secrets.file.is_none() {
        return Err(ConfigError::new(
            SANDBOX_NETWORK.name,
            env.get(&SANDBOX_NETWORK).unwrap_or_default(),
            "with SANDBOX_NETWORK=allowlist, at least one host in SANDBOX_EGRESS_ALLOW or \
             SANDBOX_EGRESS_ASK, or a secret's in SANDBOX_SECRETS_FILE (with none nothing \
             could be reached: use SANDBOX_NETWORK=none for no network)",
        ));
    }
    Ok(())
}

/// `SANDBOX_SECRETS_FILE`: only where secrets can be used ([`Config::secrets_refusal`]), not
/// with OAuth (its principals are any number, and one set would be every one's); then the file
/// is read, with `value_env` looked up in the same environment as the settings.
fn secrets(config: &mut Config, env: &Env) -> Result<(), ConfigError> {
    let Some(file) = config.secrets.file.clone() else {
        return Ok(());
    };
    let shown = file.display().to_string();
    if let Some(why) = config.secrets_refusal() {
        return Err(ConfigError::new(
            SANDBOX_SECRETS_FILE.name,
            shown,
            format!("unset: {why}; or unset SANDBOX_SECRETS_FILE"),
        ));
    }
    if config.http.oauth.issuer.is_some() {
        return Err(ConfigError::new(
            SANDBOX_SECRETS_FILE.name,
            shown,
            "unset with SANDBOX_OAUTH_ISSUER: OAuth callers are principals, any number of \
             them, and one set of secrets would be every one's; give token holders their own \
             with secrets=PATH on their SANDBOX_HTTP_TOKENS_FILE line",
        ));
    }
    let secrets = Secrets::load(&file, env.0).map_err(|e| {
        ConfigError::new(
            SANDBOX_SECRETS_FILE.name,
            shown,
            format!(
                "a TOML file of [[secret]] tables (docs/configuration.md, \"Secrets brokered at \
                 the egress\"); {}",
                e.where_and_why()
            ),
        )
        .because(e)
    })?;
    config.secrets = std::sync::Arc::new(secrets);
    Ok(())
}

/// The host's memory (`MemTotal` of /proc/meminfo), when it can be read. In a container this is
/// still the machine's memory, which the sandboxes share.
fn host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `DOCKER_TLS_VERIFY` with a TCP engine: the three files the Docker CLI reads must be there, so
/// a missing one stops start-up with its name rather than failing every call later.
fn check_tls_files(env: &Env) -> Result<(), ConfigError> {
    let Some(host) = env.get(&DOCKER_HOST) else {
        return Ok(());
    };
    let tls = host.starts_with("https://")
        || (host.starts_with("tcp://") && env.get(&DOCKER_TLS_VERIFY).is_some());
    if !tls {
        return Ok(());
    }
    // Unset: `DOCKER_CONFIG`, else `~/.docker`, as the client library reads it (the files checked
    // must be the ones it will use).
    let dir = match env.get(&DOCKER_CERT_PATH) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => match (env.0)("DOCKER_CONFIG").filter(|dir| !dir.is_empty()) {
            Some(dir) => std::path::PathBuf::from(dir),
            None => std::path::Path::new(&(env.0)("HOME").unwrap_or_default()).join(".docker"),
        },
    };
    for file in ["ca.pem", "cert.pem", "key.pem"] {
        if !dir.join(file).is_file() {
            return Err(ConfigError::new(
                DOCKER_CERT_PATH.name,
                dir.display().to_string(),
                "a directory with ca.pem, cert.pem and key.pem (mutual TLS with DOCKER_TLS_VERIFY)",
            ));
        }
    }
    Ok(())
}
