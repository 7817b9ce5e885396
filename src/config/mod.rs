//! Operator configuration, read once at start-up from the environment (and a `.env` file).
//!
//! Every value is validated here, so the rest of the program only sees well-formed limits. A bad
//! value is reported with the variable's name, the value given and the form that is accepted; the
//! CLI turns that into exit code 2.
//!
//! Each setting is defined once, in [`settings`]: its name, its default as users read it, one
//! line of documentation and how its value is parsed (the way ripgrep defines each flag once).
//! Reading the environment is a walk over that table; nothing else names a variable. The files:
//!
//! - `mod.rs`: the [`Config`] type the rest of the program uses, its defaults, and the entry
//!   points [`Config::from_env`] and [`Config::from_lookup`];
//! - [`settings`]: the table, [`SETTINGS`]; docs/configuration.md's Settings table is checked against
//!   it row by row (a test fails on a missing, extra or different row);
//! - `parse`: the value forms settings share (sizes, durations, counts, lists, mounts, globs);
//! - `address`: hosts, origins and URLs, shared with the HTTP transport and the egress proxy;
//! - [`egress`]: the grammar of `SANDBOX_EGRESS_ALLOW`/`SANDBOX_EGRESS_ASK` and the decisions
//!   the code's egress proxy takes (`SANDBOX_NETWORK=allowlist`);
//! - `validate`: the rules between settings (a workspace that fits in memory, ...);
//! - `roots`: MCP roots' mode, allowed prefixes and HTTP mappings (`SANDBOX_ROOTS*`);
//! - [`secrets`]: the secrets the egress proxy adds to the code's requests (`SANDBOX_SECRETS_FILE`);
//! - `paths`: the per-user default directories;
//! - `error`: [`ConfigError`], which keeps the parser's own error as its source.

use std::path::PathBuf;
use std::time::Duration;

mod address;
pub mod egress;
mod error;
mod parse;
mod paths;
mod roots;
pub mod secrets;
pub mod settings;
mod validate;

pub use address::{
    normalize_origin, parse_host, parse_host_port, redact_url, url_has_credentials, url_host_port,
};
pub use egress::{EgressPolicy, EgressRules};
pub use error::{ConfigError, ValueError};
pub use parse::{glob_matches, parse_bytes, parse_duration};
pub use roots::{
    parse_mapping as parse_root_mapping, RootMapping, RootsMode, RootsPolicy, PRINCIPAL_PLACEHOLDER,
};
pub use settings::{Setting, SETTINGS};

use paths::{default_cache_dir, default_files_dir};
use settings::Env;

/// The default sandbox image, built by `python-code-sandbox image build`.
pub const DEFAULT_IMAGE: &str = "python-code-sandbox:py3.11";

/// Whether sandboxes get a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// No interface but loopback (the default).
    None,
    /// Docker's default bridge: outbound access as the host has it.
    Bridge,
    /// The server's internal egress network: the only way out is the egress proxy, which lets
    /// through the hosts `SANDBOX_EGRESS_ALLOW` names and those the user approves.
    Allowlist,
}

impl NetworkPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkPolicy::None => "none",
            NetworkPolicy::Bridge => "bridge",
            NetworkPolicy::Allowlist => "allowlist",
        }
    }
}

/// What happens to the files an execution creates or changes in `/workspace`.
#[derive(Debug, Clone, PartialEq)]
pub struct FilePolicy {
    /// Host directory where they are saved (`<dir>/<run or session>/<path>`); `None`: not saved.
    /// Checked at start-up (`engine::files_dir::prepare`): private to the server's user.
    pub persist_dir: Option<PathBuf>,
    /// Retention of what is saved there: run and session directories whose newest file is older
    /// than this are removed, ...
    pub max_age: Duration,
    /// ... and beyond this many bytes in total the oldest are removed first.
    pub max_saved_bytes: u64,
    /// Limits on what is copied out of a sandbox per execution (and saved).
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    pub max_count: usize,
    /// Limits on what is returned to the client inline, per execution.
    pub return_max_file_bytes: u64,
    pub return_max_total_bytes: u64,
    pub return_max_count: usize,
}

impl FilePolicy {
    /// The effective copy-out limits: without persistence nothing bigger than what can be
    /// returned is worth copying.
    pub fn copy_limits(&self) -> (u64, u64, usize) {
        if self.persist_dir.is_some() {
            (self.max_file_bytes, self.max_total_bytes, self.max_count)
        } else {
            (
                self.max_file_bytes.min(self.return_max_file_bytes),
                self.max_total_bytes.min(self.return_max_total_bytes),
                self.max_count.min(self.return_max_count),
            )
        }
    }
}

/// Where pip/uv keep downloads between installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadCache {
    /// A Docker volume of that name.
    Volume(String),
    /// A host directory (`PIP_CACHE_PATH`), which uid 1000 must be able to write.
    HostPath(PathBuf),
    /// No download cache (`ENABLE_PIP_CACHE=false`).
    Off,
}

/// How dependencies are installed and cached.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyPolicy {
    /// The Docker volume holding installed dependency sets.
    pub volume: String,
    /// Size of the installed sets beyond which the least recently used are removed.
    pub cache_max_bytes: u64,
    /// Wall-clock limit of one install.
    pub install_timeout: Duration,
    /// Accept `name @ https://...` direct references.
    pub allow_urls: bool,
    pub index_url: Option<String>,
    pub extra_index_urls: Vec<String>,
    pub download_cache: DownloadCache,
    /// Build source distributions (`SANDBOX_ALLOW_SOURCE_BUILDS`); off, wheels only.
    pub allow_source_builds: bool,
    /// Extra hosts the installer may reach through its proxy (`SANDBOX_DEPS_EGRESS_ALLOW`).
    pub egress_allow: Vec<(String, u16)>,
    /// Allowed hosts that may resolve to private addresses (`SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE`).
    pub egress_allow_private: Vec<String>,
    /// Size of the installer's staging tmpfs (`SANDBOX_DEPS_INSTALL_MAX`): an install that
    /// writes more fails with ENOSPC.
    pub install_max_bytes: u64,
}

/// A host directory the operator mounts into every sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorMount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// How many sessions may live, and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPolicy {
    pub max_sessions: usize,
    /// A session unused this long is stopped.
    pub idle_timeout: Duration,
    /// A session is stopped this long after it started, used or not.
    pub max_lifetime: Duration,
}

/// Where snapshots of sessions are kept, and for how long (`engine::snapshots`).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPolicy {
    /// Host directory of the snapshots (`<dir>/<owner>/<id>.snap` and `.json`); `None`: no
    /// snapshots. Checked at start-up like the files directory: private to the server's user.
    pub dir: Option<PathBuf>,
    /// The largest snapshot, checked while it is written.
    pub max_size: u64,
    /// A snapshot older than this is removed.
    pub ttl: Duration,
    /// Per owner: at most this many snapshots; its oldest go first.
    pub max_count: usize,
    /// The whole store, every owner's snapshots together: at most this many bytes; a new
    /// snapshot makes room from its owner's oldest only, else it is refused.
    pub max_total: u64,
    /// Snapshot a session before it is stopped for being idle or at its maximum lifetime.
    pub on_expiry: bool,
}

/// A secret value: never shown by `Debug`, in logs or in error messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the places that need it: the comparison, and the digest that
    /// names the token's snapshot owner.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(hidden)")
    }
}

/// An allowed `Host` header: a name or address, and a port when only that port is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// Lower case; IPv6 addresses without brackets.
    pub host: String,
    pub port: Option<u16>,
}

impl HostPattern {
    pub fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host == host && self.port.is_none_or(|p| Some(p) == port)
    }
}

/// Who may talk to the server over streamable HTTP (`serve --http`).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpPolicy {
    /// The bearer token every request must carry; `None`: no authentication (loopback only).
    pub token: Option<Secret>,
    /// The principals' tokens file (`mcp::principals`); `None`: no principals.
    pub tokens_file: Option<PathBuf>,
    /// CPU-seconds per UTC day each principal may use; `None`: unlimited.
    pub quota_cpu_seconds_per_day: Option<u64>,
    /// Browser origins allowed to call the server (normalized by [`normalize_origin`]); requests
    /// without an `Origin` header are always allowed, any other origin is refused.
    pub allowed_origins: Vec<String>,
    /// Allowed `Host` headers; `None`: the loopback names and the bind address.
    pub allowed_hosts: Option<Vec<HostPattern>>,
    /// The largest request body accepted.
    pub max_body_bytes: u64,
    /// How long a connection gets to send a complete request head, counted from when it opens
    /// or its previous response ended (so also how long an idle keep-alive connection stays).
    pub header_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed (a stalled body,
    /// a client that stopped reading); SSE streams carry a ping every 15 s.
    pub idle_timeout: Duration,
    /// Connections served at once; beyond it the server stops accepting until one closes.
    pub max_connections: usize,
    /// MCP sessions alive at once; beyond it a new `initialize` gets 429.
    pub max_mcp_sessions: usize,
    /// An MCP session that owns no sandbox session and has no request in progress ends after
    /// this long without a request (a longer expiry applies to the others).
    pub mcp_idle_timeout: Duration,
    /// How long the tool calls in progress get to finish after SIGTERM.
    pub drain_timeout: Duration,
    /// Where `/metrics` is served without authentication; `None`: on the MCP port, behind the gate.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// OAuth access tokens (`mcp::oauth`); all unset: none accepted.
    pub oauth: OAuthPolicy,
}

/// `serve --http` as an OAuth 2.1 resource server: set all three or none (checked in
/// `validate`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthPolicy {
    /// The authorization server's issuer: the `iss` every access token must carry.
    pub issuer: Option<String>,
    /// Where the issuer's signing keys (its JWKS) are.
    pub jwks: Option<JwksSource>,
    /// This server's resource URL: the `aud` a token must name, and the metadata's `resource`.
    pub resource_url: Option<String>,
}

impl OAuthPolicy {
    /// Whether access tokens are accepted.
    pub fn enabled(&self) -> bool {
        self.issuer.is_some()
    }
}

/// Where a JWKS is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// Fetched at start, and again when a token names a key it does not hold.
    Url(String),
    /// Read at start, and again when a token names a key it does not hold.
    File(PathBuf),
}

/// The default request body limit: 4 MiB more than the largest code accepted (8 MiB), for the
/// JSON around it and its escapes.
pub const DEFAULT_HTTP_MAX_BODY: u64 = 12 << 20;

/// The interval of rmcp's SSE keep-alive pings: an idle timeout must be longer.
pub const SSE_PING_INTERVAL: Duration = Duration::from_secs(15);

/// Resource limits applied to every sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Memory in bytes; swap is disabled by setting the memory+swap limit to the same value.
    pub memory_bytes: u64,
    /// CPUs, as a fraction (0.5 = half a core).
    pub cpus: f64,
    /// Maximum number of processes and threads.
    pub pids: u64,
    /// Size of the `/tmp` tmpfs in bytes (it counts against the memory limit).
    pub tmp_bytes: u64,
    /// Size of `/workspace`, a tmpfs kept across runner restarts (it counts against the memory
    /// limit): code that fills it gets ENOSPC, and the host's disk is never touched.
    pub workspace_bytes: u64,
    /// Wall-clock limit of one execution.
    pub timeout: Duration,
    /// Bytes kept of stdout+stderr of one execution; the rest is counted and reported as cut.
    pub max_output_bytes: u64,
    /// Characters of stdout+stderr a model reads in a tool result: beyond them, each stream keeps
    /// its head and tail and the whole is kept where it can be read (`SANDBOX_MODEL_OUTPUT`).
    pub model_output_chars: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Image of the sandboxes.
    pub image: String,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// Who the code may reach with `SANDBOX_NETWORK=allowlist` (`SANDBOX_EGRESS_*`).
    pub egress: EgressPolicy,
    /// The secrets the egress proxy adds to the code's requests (`SANDBOX_SECRETS_FILE`).
    pub secrets: std::sync::Arc<secrets::Secrets>,
    /// Host CA bundle trusted by the containers that reach a package index (the image build,
    /// flavours, installers) and made available inside sandboxes that have a network.
    pub ca_bundle: Option<PathBuf>,
    /// Where [`Config::ca_bundle`] comes from.
    pub ca_bundle_source: CaBundleSource,
    /// The engine is on another machine (`DOCKER_HOST` is not a local socket): host paths in
    /// settings are that machine's, checked by the engine rather than here.
    pub remote_engine: bool,
    /// The OCI runtime of sandboxes that run the agent's code, when the operator names one;
    /// `None` lets the engine choose the strongest available (see `engine::platform`).
    pub runtime: Option<String>,
    pub files: FilePolicy,
    pub deps: DependencyPolicy,
    /// Host directories mounted into every sandbox (`SANDBOX_MOUNTS`).
    pub mounts: Vec<OperatorMount>,
    /// The client's MCP roots, mounted into its sandboxes (`SANDBOX_ROOTS*`).
    pub roots: RootsPolicy,
    /// Images an agent may ask for besides `image` (glob patterns: `*` and `?`).
    pub allowed_images: Vec<String>,
    pub sessions: SessionPolicy,
    pub snapshots: SnapshotPolicy,
    /// Executions (and sandbox start-ups) running at once; further calls wait.
    pub max_concurrent: usize,
    /// Sandboxes of the default configuration kept started ahead of time (the server only).
    pub pool_size: usize,
    /// Live sandboxes at most (`SANDBOX_MAX_SANDBOXES`); `None`: computed from the host (see
    /// `engine::admission`).
    pub max_sandboxes: Option<usize>,
    /// How long a call waits for a sandbox at least, whatever its time limit (a longer limit
    /// waits as long): the limit is the code's, and a sandbox's start alone (about 2 s under
    /// gVisor on ptrace, more while others start) can take longer than a short one. 60 s; not a
    /// setting (tests shorten it).
    pub admission_wait: Duration,
    /// A sandbox a run used may serve the same caller's next run once emptied
    /// (`SANDBOX_RECYCLE`).
    pub recycle: bool,
    /// Dependency sets the pool keeps prepared sandboxes for (`SANDBOX_PRELOAD`), as written:
    /// the engine validates each requirement.
    pub preload: Vec<Vec<String>>,
    /// What the pool's waiting sandboxes may use together (`SANDBOX_POOL_MAX_MEMORY`).
    pub pool_max_memory: u64,
    /// Base URL of the package index searched by `search_pypi_packages`.
    pub pypi_url: String,
    /// How long the downloaded PyPI name index is reused.
    pub pypi_index_ttl: Duration,
    /// Where the server keeps caches (the PyPI name index).
    pub cache_dir: PathBuf,
    /// `tracing` filter directive (e.g. `info`, `debug`, `python_code_sandbox=trace`); unset, each
    /// command picks its own default (the server `info`, `run` only warnings).
    pub log_level: Option<String>,
    /// `LOG_FORMAT=json`: log lines are JSON objects.
    pub log_json: bool,
    /// The streamable HTTP transport's access rules.
    pub http: HttpPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            image: DEFAULT_IMAGE.to_string(),
            limits: Limits {
                memory_bytes: 2 << 30,
                cpus: 0.5,
                pids: 256,
                tmp_bytes: 64 << 20,
                workspace_bytes: DEFAULT_WORKSPACE_BYTES,
                timeout: Duration::from_secs(60),
                max_output_bytes: 1 << 20,
                model_output_chars: DEFAULT_MODEL_OUTPUT_CHARS,
            },
            network: NetworkPolicy::None,
            egress: EgressPolicy::default(),
            secrets: Default::default(),
            ca_bundle: None,
            ca_bundle_source: CaBundleSource::NotFound,
            runtime: None,
            remote_engine: false,
            files: FilePolicy {
                persist_dir: Some(default_files_dir()),
                max_age: Duration::from_secs(7 * 24 * 60 * 60),
                max_saved_bytes: 1 << 30,
                max_file_bytes: 100 << 20,
                max_total_bytes: 500 << 20,
                max_count: 100,
                return_max_file_bytes: 5 << 20,
                return_max_total_bytes: 10 << 20,
                return_max_count: 20,
            },
            deps: DependencyPolicy {
                volume: "python-code-sandbox-deps".to_string(),
                cache_max_bytes: 10 << 30,
                install_timeout: Duration::from_secs(600),
                allow_urls: false,
                index_url: None,
                extra_index_urls: Vec::new(),
                download_cache: DownloadCache::Volume("python-code-sandbox-pip-cache".to_string()),
                allow_source_builds: false,
                egress_allow: Vec::new(),
                egress_allow_private: Vec::new(),
                install_max_bytes: 2 << 30,
            },
            mounts: Vec::new(),
            roots: paths::default_roots(),
            allowed_images: Vec::new(),
            sessions: SessionPolicy {
                max_sessions: 10,
                idle_timeout: Duration::from_secs(30 * 60),
                max_lifetime: Duration::from_secs(8 * 60 * 60),
            },
            snapshots: SnapshotPolicy {
                dir: Some(paths::default_state_dir("snapshots")),
                max_size: 1 << 30,
                ttl: Duration::from_secs(7 * 24 * 60 * 60),
                max_count: 50,
                max_total: 5 << 30,
                on_expiry: true,
            },
            max_concurrent: 8,
            pool_size: 2,
            max_sandboxes: None,
            admission_wait: Duration::from_secs(60),
            recycle: true,
            preload: Vec::new(),
            pool_max_memory: 2 << 30,
            pypi_url: "https://pypi.org".to_string(),
            pypi_index_ttl: Duration::from_secs(24 * 60 * 60),
            cache_dir: default_cache_dir(),
            log_level: None,
            log_json: false,
            http: HttpPolicy {
                token: None,
                tokens_file: None,
                quota_cpu_seconds_per_day: None,
                allowed_origins: Vec::new(),
                allowed_hosts: None,
                max_body_bytes: DEFAULT_HTTP_MAX_BODY,
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(120),
                max_connections: 256,
                max_mcp_sessions: 64,
                mcp_idle_timeout: Duration::from_secs(5 * 60),
                drain_timeout: Duration::from_secs(30),
                metrics_addr: None,
                oauth: OAuthPolicy::default(),
            },
        }
    }
}

/// The smallest pids limit gVisor's kernel runs under (it counts its own host threads).
pub const GVISOR_MIN_PIDS: u64 = 256;

/// `/workspace` when `SANDBOX_WORKSPACE_SIZE` is unset (capped at half the memory limit).
pub const DEFAULT_WORKSPACE_BYTES: u64 = 512 << 20;

/// What a model reads of an execution's output by default: about 5k tokens.
pub const DEFAULT_MODEL_OUTPUT_CHARS: usize = 20_000;

/// The bounds of `SANDBOX_MODEL_OUTPUT`: below the smallest, a traceback's head and tail no longer
/// fit; above the largest, one result would fill most models' whole context.
pub const MODEL_OUTPUT_RANGE: std::ops::RangeInclusive<usize> = 1_000..=1_000_000;

/// The largest output cap an operator may set: the host buffers up to this much per execution.
pub const MAX_OUTPUT_CEILING: u64 = 64 << 20;

impl Config {
    /// Reads the process environment. A `.env` file in the working directory is loaded first;
    /// variables already set in the environment win over it.
    pub fn from_env() -> Result<Config, ConfigError> {
        let _ = dotenvy::dotenv();
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds a configuration from any variable source (the environment, or a map in tests).
    /// Unset and blank variables take their default.
    ///
    /// Conflicting settings are refused first, then each setting is read in [`SETTINGS`] order
    /// (the first invalid value is reported), then the rules between values are checked.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env = Env(&lookup);
        validate::conflicts(&env)?;
        let mut config = Config {
            // Decides where host paths in other settings are checked, so it comes first.
            remote_engine: env
                .get(&settings::DOCKER_HOST)
                .is_some_and(|host| settings::is_remote_endpoint(&host)),
            ..Config::default()
        };
        for setting in SETTINGS {
            setting.apply(&mut config, &env)?;
        }
        if config.ca_bundle_source == CaBundleSource::NotFound && !config.remote_engine {
            if let Some((path, via)) =
                paths::host_ca_bundle(lookup("SSL_CERT_FILE"), paths::usable_bundle)
            {
                config.ca_bundle = Some(path);
                config.ca_bundle_source = CaBundleSource::Host { via };
            }
        }
        validate::relations(&mut config, &env)?;
        Ok(config)
    }

    /// Why secrets brokered at the egress cannot be used with these settings, if they cannot
    /// (for `SANDBOX_SECRETS_FILE` and a principal's `secrets=`): they are added by the allowlist
    /// network's egress proxy, and the sandboxes' trust in its CA is mounted from this machine.
    pub fn secrets_refusal(&self) -> Option<String> {
        if self.network != NetworkPolicy::Allowlist {
            return Some(format!(
                "secrets need SANDBOX_NETWORK=allowlist (this server's is {}): the allowlist \
                 network's egress proxy adds them; set SANDBOX_NETWORK=allowlist",
                self.network.as_str()
            ));
        }
        if self.remote_engine {
            return Some(
                "secrets need the engine on this machine (DOCKER_HOST names another): the \
                 sandboxes trust the egress proxy's CA through a file of this machine, which \
                 that engine cannot mount"
                    .to_string(),
            );
        }
        None
    }

    /// The secrets brokered at the egress, in one line (names, variables, headers and hosts,
    /// never a value), for `doctor` and the start-up log; `None` without secrets.
    pub fn secrets_summary(&self) -> Option<String> {
        self.secrets.summary()
    }

    /// The host's own CA bundle (`SSL_CERT_FILE`, else the system's), whatever the setting says;
    /// none with a remote engine, whose paths are that machine's.
    pub fn host_ca_bundle(&self) -> Option<PathBuf> {
        if self.remote_engine {
            return None;
        }
        paths::host_ca_bundle(std::env::var("SSL_CERT_FILE").ok(), paths::usable_bundle)
            .map(|(path, _)| path)
    }

    /// The CA bundle in use and where it comes from, in words (for `setup`, `doctor` and the
    /// start-up log).
    pub fn ca_bundle_summary(&self) -> String {
        let path = self
            .ca_bundle
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match &self.ca_bundle_source {
            CaBundleSource::Setting => format!("{path} ({})", settings::SANDBOX_CA_BUNDLE.name),
            CaBundleSource::Host { via } => format!(
                "{path}, the host's own ({via}), trusted by the image build and the installers; \
                 {}=none turns it off",
                settings::SANDBOX_CA_BUNDLE.name
            ),
            CaBundleSource::Off => format!(
                "none ({}=none): containers trust only their own CA bundle",
                settings::SANDBOX_CA_BUNDLE.name
            ),
            CaBundleSource::NotFound if self.remote_engine => format!(
                "none: the engine is on another machine, so the host's bundle is not assumed \
                 there; {} names a bundle on that machine",
                settings::SANDBOX_CA_BUNDLE.name
            ),
            CaBundleSource::NotFound => format!(
                "none: no CA bundle found on the host (SSL_CERT_FILE, {}); {} names one",
                paths::SYSTEM_CA_BUNDLES.join(", "),
                settings::SANDBOX_CA_BUNDLE.name
            ),
        }
    }
}

/// Where the CA bundle of the containers that reach a package index comes from. By default they
/// trust what the host trusts, the way pip's truststore and uv's native TLS use the system store:
/// where TLS is intercepted by a CA the host trusts, the build and the installers work unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaBundleSource {
    /// `SANDBOX_CA_BUNDLE` names it.
    Setting,
    /// The host's own trust store: `SSL_CERT_FILE`, else the first of the distributions' usual
    /// bundle paths that is a non-empty file (`via` says which).
    Host { via: &'static str },
    /// `SANDBOX_CA_BUNDLE=none`: the containers trust only their own bundle.
    Off,
    /// Unset, and none found on the host (or the engine is remote: host paths are its machine's).
    NotFound,
}

#[cfg(test)]
mod tests;
