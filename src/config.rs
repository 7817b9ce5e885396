//! Operator configuration, read once at start-up from the environment (and a `.env` file).
//!
//! Every value is validated here, so the rest of the program only sees well-formed limits. A bad
//! value is reported with the variable's name, the value given and the form that is accepted; the
//! CLI turns that into exit code 2.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default sandbox image, built by `python-code-sandbox image build`.
pub const DEFAULT_IMAGE: &str = "python-code-sandbox:py3.11";

/// A configuration value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: expected {expected}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Whether sandboxes get a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// No interface but loopback (the default).
    None,
    /// Docker's default bridge: outbound access as the host has it.
    Bridge,
}

impl NetworkPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkPolicy::None => "none",
            NetworkPolicy::Bridge => "bridge",
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

/// A secret value: never shown by `Debug`, in logs or in error messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that needs it (the comparison).
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Image of the sandboxes.
    pub image: String,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// Host CA bundle made available inside sandboxes that have a network.
    pub ca_bundle: Option<PathBuf>,
    /// The OCI runtime of sandboxes that run the agent's code (e.g. `runsc` for gVisor); the
    /// engine's default when unset.
    pub runtime: Option<String>,
    pub files: FilePolicy,
    pub deps: DependencyPolicy,
    /// Host directories mounted into every sandbox (`SANDBOX_MOUNTS`).
    pub mounts: Vec<OperatorMount>,
    /// Images an agent may ask for besides `image` (glob patterns: `*` and `?`).
    pub allowed_images: Vec<String>,
    pub sessions: SessionPolicy,
    /// Executions (and sandbox start-ups) running at once; further calls wait.
    pub max_concurrent: usize,
    /// Sandboxes of the default configuration kept started ahead of time (the server only).
    pub pool_size: usize,
    /// Base URL of the package index searched by `search_pypi_packages`.
    pub pypi_url: String,
    /// How long the downloaded PyPI name index is reused.
    pub pypi_index_ttl: Duration,
    /// Where the server keeps caches (the PyPI name index).
    pub cache_dir: PathBuf,
    /// `tracing` filter directive (e.g. `info`, `debug`, `python_code_sandbox=trace`); unset, each
    /// command picks its own default (the server `info`, `run` only warnings).
    pub log_level: Option<String>,
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
            },
            network: NetworkPolicy::None,
            ca_bundle: None,
            runtime: None,
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
            allowed_images: Vec::new(),
            sessions: SessionPolicy {
                max_sessions: 10,
                idle_timeout: Duration::from_secs(30 * 60),
                max_lifetime: Duration::from_secs(8 * 60 * 60),
            },
            max_concurrent: 8,
            pool_size: 2,
            pypi_url: "https://pypi.org".to_string(),
            pypi_index_ttl: Duration::from_secs(24 * 60 * 60),
            cache_dir: default_cache_dir(),
            log_level: None,
            http: HttpPolicy {
                token: None,
                allowed_origins: Vec::new(),
                allowed_hosts: None,
                max_body_bytes: DEFAULT_HTTP_MAX_BODY,
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(120),
                max_connections: 256,
                max_mcp_sessions: 64,
                mcp_idle_timeout: Duration::from_secs(5 * 60),
            },
        }
    }
}

/// One documented variable: the README table is checked against this list by a test.
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "SANDBOX_IMAGE",
        default: DEFAULT_IMAGE,
        meaning: "image of every sandbox",
    },
    Variable {
        name: "SANDBOX_MEMORY_LIMIT",
        default: "2g",
        meaning: "memory per sandbox, no swap",
    },
    Variable {
        name: "SANDBOX_CPU_LIMIT",
        default: "0.5",
        meaning: "CPUs per sandbox",
    },
    Variable {
        name: "SANDBOX_PIDS_LIMIT",
        default: "256",
        meaning: "processes+threads per sandbox",
    },
    Variable {
        name: "SANDBOX_TMP_SIZE",
        default: "64m",
        meaning: "size of the /tmp tmpfs",
    },
    Variable {
        name: "SANDBOX_WORKSPACE_SIZE",
        default: "512m (at most half the memory limit)",
        meaning: "size of the /workspace tmpfs",
    },
    Variable {
        name: "SANDBOX_TIMEOUT",
        default: "60s",
        meaning: "wall clock per execution",
    },
    Variable {
        name: "SANDBOX_MAX_OUTPUT",
        default: "1m",
        meaning: "stdout+stderr kept per execution",
    },
    Variable {
        name: "SANDBOX_NETWORK",
        default: "none",
        meaning: "none or bridge",
    },
    Variable {
        name: "SANDBOX_CA_BUNDLE",
        default: "(unset)",
        meaning: "host CA file for networked sandboxes",
    },
    Variable {
        name: "SANDBOX_FILES_DIR",
        default: "~/.local/state/python-code-sandbox/files",
        meaning: "where files executions make are saved",
    },
    Variable {
        name: "SANDBOX_FILES_MAX_AGE",
        default: "7d",
        meaning: "saved run/session directories older than this are removed",
    },
    Variable {
        name: "SANDBOX_FILES_MAX_BYTES",
        default: "1g",
        meaning: "total of saved files; oldest removed first beyond it",
    },
    Variable {
        name: "SANDBOX_HTTP_TOKEN",
        default: "(unset)",
        meaning: "bearer token required by serve --http",
    },
    Variable {
        name: "SANDBOX_HTTP_TOKEN_FILE",
        default: "(unset)",
        meaning: "file holding that token",
    },
    Variable {
        name: "SANDBOX_HTTP_ALLOWED_ORIGINS",
        default: "(none)",
        meaning: "browser origins allowed over HTTP",
    },
    Variable {
        name: "SANDBOX_HTTP_ALLOWED_HOSTS",
        default: "loopback names + bind address",
        meaning: "Host headers accepted over HTTP",
    },
    Variable {
        name: "SANDBOX_HTTP_MAX_BODY",
        default: "12m",
        meaning: "largest HTTP request body",
    },
    Variable {
        name: "SANDBOX_HTTP_HEADER_TIMEOUT",
        default: "10s",
        meaning: "time to send a request head over HTTP",
    },
    Variable {
        name: "SANDBOX_HTTP_IDLE_TIMEOUT",
        default: "2m",
        meaning: "an HTTP connection silent this long is closed",
    },
    Variable {
        name: "SANDBOX_HTTP_MAX_CONNECTIONS",
        default: "256",
        meaning: "HTTP connections served at once",
    },
    Variable {
        name: "SANDBOX_HTTP_MAX_MCP_SESSIONS",
        default: "64",
        meaning: "MCP sessions alive at once over HTTP",
    },
    Variable {
        name: "SANDBOX_HTTP_MCP_IDLE_TIMEOUT",
        default: "5m",
        meaning: "expiry of an idle MCP session owning no sandbox",
    },
    Variable {
        name: "SANDBOX_ALLOW_SOURCE_BUILDS",
        default: "false",
        meaning: "build source distributions during installs (runs package code)",
    },
    Variable {
        name: "SANDBOX_DEPS_EGRESS_ALLOW",
        default: "none",
        meaning: "extra hosts the installer's proxy lets through",
    },
    Variable {
        name: "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE",
        default: "none",
        meaning: "allowed hosts that may resolve to private addresses",
    },
    Variable {
        name: "SANDBOX_DEPS_INSTALL_MAX",
        default: "2g",
        meaning: "size of an installer's staging tmpfs",
    },
    Variable {
        name: "LOG_LEVEL",
        default: "info (run: warn)",
        meaning: "log filter, written to stderr",
    },
];

impl Config {
    /// Reads the process environment. A `.env` file in the working directory is loaded first;
    /// variables already set in the environment win over it.
    pub fn from_env() -> Result<Config, ConfigError> {
        let _ = dotenvy::dotenv();
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds a configuration from any variable source (the environment, or a map in tests).
    /// Unset and empty variables take their default.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut config = Config::default();

        if let Some(image) = get("SANDBOX_IMAGE") {
            if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ConfigError {
                    var: "SANDBOX_IMAGE",
                    value: image,
                    expected: "an image reference such as python-code-sandbox:py3.11",
                });
            }
            config.image = image;
        }
        let limits = &mut config.limits;
        if let Some(v) = get("SANDBOX_MEMORY_LIMIT") {
            limits.memory_bytes = parse_bytes("SANDBOX_MEMORY_LIMIT", &v, 16 << 20)?;
        }
        if let Some(v) = get("SANDBOX_CPU_LIMIT") {
            limits.cpus = parse_cpus(&v)?;
        }
        if let Some(v) = get("SANDBOX_PIDS_LIMIT") {
            limits.pids = match v.parse::<u64>() {
                Ok(n) if (8..=1_000_000).contains(&n) => n,
                _ => {
                    return Err(ConfigError {
                        var: "SANDBOX_PIDS_LIMIT",
                        value: v,
                        expected: "a whole number of processes from 8 to 1000000, such as 256",
                    })
                }
            };
        }
        if let Some(v) = get("SANDBOX_TMP_SIZE") {
            limits.tmp_bytes = parse_bytes("SANDBOX_TMP_SIZE", &v, 1 << 20)?;
        }
        match get("SANDBOX_WORKSPACE_SIZE") {
            Some(v) => {
                limits.workspace_bytes = parse_bytes("SANDBOX_WORKSPACE_SIZE", &v, 1 << 20)?;
                if limits.workspace_bytes > limits.memory_bytes {
                    return Err(ConfigError {
                        var: "SANDBOX_WORKSPACE_SIZE",
                        value: v,
                        expected: "a size no larger than SANDBOX_MEMORY_LIMIT (the workspace is \
                                   kept in memory and counts against that limit), such as 512m",
                    });
                }
            }
            None => {
                limits.workspace_bytes = DEFAULT_WORKSPACE_BYTES.min(limits.memory_bytes / 2);
            }
        }
        if let Some(v) = get("SANDBOX_TIMEOUT") {
            limits.timeout = parse_duration("SANDBOX_TIMEOUT", &v)?;
        }
        if let Some(v) = get("SANDBOX_MAX_OUTPUT") {
            limits.max_output_bytes = parse_bytes("SANDBOX_MAX_OUTPUT", &v, 1)?;
            if limits.max_output_bytes > MAX_OUTPUT_CEILING {
                return Err(ConfigError {
                    var: "SANDBOX_MAX_OUTPUT",
                    value: v,
                    expected: "a size from 1 byte to 64m, such as 1m",
                });
            }
        }
        if let Some(v) = get("SANDBOX_NETWORK") {
            config.network = match v.to_ascii_lowercase().as_str() {
                "none" => NetworkPolicy::None,
                "bridge" => NetworkPolicy::Bridge,
                _ => {
                    return Err(ConfigError {
                        var: "SANDBOX_NETWORK",
                        value: v,
                        expected: "none or bridge",
                    })
                }
            };
        }
        if let Some(v) = get("SANDBOX_RUNTIME") {
            if !v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(ConfigError {
                    var: "SANDBOX_RUNTIME",
                    value: v,
                    expected: "the name of a runtime registered with the engine, such as runsc",
                });
            }
            if v.starts_with("runsc") && config.limits.pids < GVISOR_MIN_PIDS {
                return Err(ConfigError {
                    var: "SANDBOX_PIDS_LIMIT",
                    value: config.limits.pids.to_string(),
                    expected: "at least 256 with SANDBOX_RUNTIME=runsc: under gVisor the limit \
                               bounds the gVisor kernel's own host threads, which need that many",
                });
            }
            config.runtime = Some(v);
        }
        if let Some(v) = get("SANDBOX_CA_BUNDLE") {
            let path = PathBuf::from(&v);
            if !path.is_absolute() || !path.is_file() {
                return Err(ConfigError {
                    var: "SANDBOX_CA_BUNDLE",
                    value: v,
                    expected: "the absolute path of an existing CA bundle file on the host",
                });
            }
            config.ca_bundle = Some(path);
        }
        // Set but empty means "do not save files" (the seed's semantics), unlike other variables.
        if let Some(v) = lookup("SANDBOX_FILES_DIR") {
            let v = v.trim().to_string();
            if v.is_empty() {
                config.files.persist_dir = None;
            } else if Path::new(&v).is_absolute() {
                config.files.persist_dir = Some(PathBuf::from(v));
            } else {
                return Err(ConfigError {
                    var: "SANDBOX_FILES_DIR",
                    value: v,
                    expected: "an absolute directory path, or empty to disable saving files",
                });
            }
        }
        let files = &mut config.files;
        if let Some(v) = get("SANDBOX_FILES_MAX_FILE") {
            files.max_file_bytes = parse_bytes("SANDBOX_FILES_MAX_FILE", &v, 1)?;
        }
        if let Some(v) = get("SANDBOX_FILES_MAX_TOTAL") {
            files.max_total_bytes = parse_bytes("SANDBOX_FILES_MAX_TOTAL", &v, 1)?;
        }
        if let Some(v) = get("SANDBOX_FILES_MAX_COUNT") {
            files.max_count = parse_count("SANDBOX_FILES_MAX_COUNT", &v, 0, 10_000)?;
        }
        if let Some(v) = get("SANDBOX_FILES_MAX_AGE") {
            files.max_age = parse_duration("SANDBOX_FILES_MAX_AGE", &v)?;
        }
        if let Some(v) = get("SANDBOX_FILES_MAX_BYTES") {
            files.max_saved_bytes = parse_bytes("SANDBOX_FILES_MAX_BYTES", &v, 1)?;
        }
        if files.max_saved_bytes < files.max_total_bytes {
            return Err(ConfigError {
                var: "SANDBOX_FILES_MAX_BYTES",
                value: lookup("SANDBOX_FILES_MAX_BYTES")
                    .unwrap_or_else(|| files.max_saved_bytes.to_string()),
                expected: "a total at least SANDBOX_FILES_MAX_TOTAL (the files one execution \
                           saves must fit), such as 1g",
            });
        }
        if let Some(v) = get("SANDBOX_RETURN_MAX_FILE") {
            files.return_max_file_bytes = parse_bytes("SANDBOX_RETURN_MAX_FILE", &v, 1)?;
        }
        if let Some(v) = get("SANDBOX_RETURN_MAX_TOTAL") {
            files.return_max_total_bytes = parse_bytes("SANDBOX_RETURN_MAX_TOTAL", &v, 1)?;
        }
        if let Some(v) = get("SANDBOX_RETURN_MAX_COUNT") {
            files.return_max_count = parse_count("SANDBOX_RETURN_MAX_COUNT", &v, 0, 1000)?;
        }
        let deps = &mut config.deps;
        if let Some(v) = get("SANDBOX_DEPS_VOLUME") {
            if !is_volume_name(&v) {
                return Err(ConfigError {
                    var: "SANDBOX_DEPS_VOLUME",
                    value: v,
                    expected: "a Docker volume name: letters, digits, '_', '.', '-'",
                });
            }
            deps.volume = v;
        }
        if let Some(v) = get("SANDBOX_DEPS_CACHE_MAX") {
            deps.cache_max_bytes = parse_bytes("SANDBOX_DEPS_CACHE_MAX", &v, 1 << 20)?;
        }
        if let Some(v) = get("SANDBOX_DEPS_TIMEOUT") {
            deps.install_timeout = parse_duration("SANDBOX_DEPS_TIMEOUT", &v)?;
        }
        if let Some(v) = get("SANDBOX_ALLOW_URL_DEPS") {
            deps.allow_urls = parse_bool("SANDBOX_ALLOW_URL_DEPS", &v)?;
        }
        if let Some(v) = get("PIP_INDEX_URL") {
            deps.index_url = Some(parse_url("PIP_INDEX_URL", &v)?);
        }
        if let Some(v) = get("PIP_EXTRA_INDEX_URL") {
            deps.extra_index_urls = v
                .split_whitespace()
                .map(|u| parse_url("PIP_EXTRA_INDEX_URL", u))
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = get("PIP_CACHE_PATH") {
            let path = PathBuf::from(&v);
            if !path.is_absolute() {
                return Err(ConfigError {
                    var: "PIP_CACHE_PATH",
                    value: v,
                    expected: "an absolute host directory path (writable by uid 1000)",
                });
            }
            deps.download_cache = DownloadCache::HostPath(path);
        }
        if let Some(v) = get("ENABLE_PIP_CACHE") {
            if !parse_bool("ENABLE_PIP_CACHE", &v)? {
                deps.download_cache = DownloadCache::Off;
            }
        }
        if let Some(v) = get("SANDBOX_ALLOW_SOURCE_BUILDS") {
            deps.allow_source_builds = parse_bool("SANDBOX_ALLOW_SOURCE_BUILDS", &v)?;
        }
        if let Some(v) = get("SANDBOX_DEPS_INSTALL_MAX") {
            deps.install_max_bytes = parse_bytes("SANDBOX_DEPS_INSTALL_MAX", &v, 16 << 20)?;
        }
        if let Some(v) = get("SANDBOX_DEPS_EGRESS_ALLOW") {
            deps.egress_allow = parse_hosts("SANDBOX_DEPS_EGRESS_ALLOW", &v)?;
        }
        if let Some(v) = get("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE") {
            deps.egress_allow_private = parse_hosts("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE", &v)?
                .into_iter()
                .map(|(host, _)| host)
                .collect();
        }
        if deps.allow_source_builds {
            // A package's build code runs in the installer, which is given the index URLs.
            let urls = deps.index_url.iter().chain(&deps.extra_index_urls);
            if let Some(url) = urls.clone().find(|u| url_has_credentials(u)) {
                return Err(ConfigError {
                    var: "SANDBOX_ALLOW_SOURCE_BUILDS",
                    value: format!(
                        "true (with the credential-bearing index {})",
                        redact_url(url)
                    ),
                    expected:
                        "false while PIP_INDEX_URL or PIP_EXTRA_INDEX_URL carry credentials: \
                               a source build runs the package's own code in the installer, which \
                               could read them; use wheels only, or an index without credentials",
                });
            }
        }
        if let Some(v) = get("SANDBOX_MOUNTS") {
            config.mounts = parse_mounts(&v)?;
        }
        if let Some(v) = get("SANDBOX_ALLOWED_IMAGES") {
            let patterns: Vec<String> = v
                .split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect();
            if patterns
                .iter()
                .any(|p| p.chars().any(|c| c.is_whitespace() || c.is_control()))
            {
                return Err(ConfigError {
                    var: "SANDBOX_ALLOWED_IMAGES",
                    value: v,
                    expected: "comma-separated image patterns such as python:3.12-slim,myorg/*",
                });
            }
            config.allowed_images = patterns;
        }
        if let Some(v) = get("SANDBOX_MAX_SESSIONS") {
            config.sessions.max_sessions = parse_count("SANDBOX_MAX_SESSIONS", &v, 0, 10_000)?;
        }
        if let Some(v) = get("SANDBOX_SESSION_IDLE_TIMEOUT") {
            config.sessions.idle_timeout = parse_duration("SANDBOX_SESSION_IDLE_TIMEOUT", &v)?;
        }
        if let Some(v) = get("SANDBOX_SESSION_MAX_LIFETIME") {
            config.sessions.max_lifetime = parse_duration("SANDBOX_SESSION_MAX_LIFETIME", &v)?;
        }
        if let Some(v) = get("SANDBOX_POOL_SIZE") {
            config.pool_size = parse_count("SANDBOX_POOL_SIZE", &v, 0, 64)?;
        }
        if let Some(v) = get("SANDBOX_MAX_CONCURRENT") {
            config.max_concurrent = parse_count("SANDBOX_MAX_CONCURRENT", &v, 1, 10_000)?;
        }
        if let Some(v) = get("SANDBOX_PYPI_URL") {
            if !(v.starts_with("https://") || v.starts_with("http://"))
                || v.contains(char::is_whitespace)
            {
                return Err(ConfigError {
                    var: "SANDBOX_PYPI_URL",
                    value: v,
                    expected: "an http(s) URL such as https://pypi.org",
                });
            }
            config.pypi_url = v.trim_end_matches('/').to_string();
        }
        if let Some(v) = get("SANDBOX_PYPI_INDEX_TTL") {
            config.pypi_index_ttl = parse_duration("SANDBOX_PYPI_INDEX_TTL", &v)?;
        }
        if let Some(v) = get("SANDBOX_CACHE_DIR") {
            let path = PathBuf::from(&v);
            if !path.is_absolute() {
                return Err(ConfigError {
                    var: "SANDBOX_CACHE_DIR",
                    value: v,
                    expected: "an absolute directory path",
                });
            }
            config.cache_dir = path;
        }
        config.http = parse_http(&get)?;
        if let Some(v) = get("LOG_LEVEL") {
            if tracing_subscriber::EnvFilter::try_new(&v).is_err() {
                return Err(ConfigError {
                    var: "LOG_LEVEL",
                    value: v,
                    expected: "a log level (error, warn, info, debug, trace) or a tracing filter",
                });
            }
            config.log_level = Some(v);
        }
        Ok(config)
    }
}

/// The smallest token accepted: shorter ones can be guessed.
const MIN_TOKEN_CHARS: usize = 16;

fn parse_http(get: &impl Fn(&str) -> Option<String>) -> Result<HttpPolicy, ConfigError> {
    let mut http = Config::default().http;
    let token = match (get("SANDBOX_HTTP_TOKEN"), get("SANDBOX_HTTP_TOKEN_FILE")) {
        (Some(_), Some(file)) => {
            return Err(ConfigError {
                var: "SANDBOX_HTTP_TOKEN_FILE",
                value: file,
                expected: "either SANDBOX_HTTP_TOKEN or SANDBOX_HTTP_TOKEN_FILE, not both",
            })
        }
        (Some(token), None) => Some(("SANDBOX_HTTP_TOKEN", token)),
        (None, Some(file)) => {
            let read = std::fs::read_to_string(&file).map_err(|_| ConfigError {
                var: "SANDBOX_HTTP_TOKEN_FILE",
                value: file.clone(),
                expected: "the path of a readable file holding the token",
            })?;
            Some(("SANDBOX_HTTP_TOKEN_FILE", read.trim().to_string()))
        }
        (None, None) => None,
    };
    if let Some((var, token)) = token {
        let b64token = token.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '=')
        });
        if token.chars().count() < MIN_TOKEN_CHARS || !b64token {
            return Err(ConfigError {
                var,
                // The value is a secret: say only what is wrong with it.
                value: format!("(hidden, {} characters)", token.chars().count()),
                expected: "a token of at least 16 characters from A-Z a-z 0-9 - . _ ~ + / =, such as the output of `openssl rand -hex 32`",
            });
        }
        http.token = Some(Secret(token));
    }
    if let Some(v) = get("SANDBOX_HTTP_ALLOWED_ORIGINS") {
        http.allowed_origins = v
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(|o| {
                normalize_origin(o).ok_or_else(|| ConfigError {
                    var: "SANDBOX_HTTP_ALLOWED_ORIGINS",
                    value: v.clone(),
                    expected: "comma-separated origins such as https://app.example.com or http://localhost:3000 (scheme, host, optional port; no path)",
                })
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(v) = get("SANDBOX_HTTP_ALLOWED_HOSTS") {
        let hosts = v
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                parse_host(h).map(|(host, port)| HostPattern { host, port }).ok_or_else(|| ConfigError {
                    var: "SANDBOX_HTTP_ALLOWED_HOSTS",
                    value: v.clone(),
                    expected: "comma-separated host names or addresses, each with an optional port, such as mcp.example.com,10.0.0.5:8080",
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if hosts.is_empty() {
            return Err(ConfigError {
                var: "SANDBOX_HTTP_ALLOWED_HOSTS",
                value: v,
                expected: "at least one host name or address",
            });
        }
        http.allowed_hosts = Some(hosts);
    }
    if let Some(v) = get("SANDBOX_HTTP_MAX_BODY") {
        http.max_body_bytes = parse_bytes("SANDBOX_HTTP_MAX_BODY", &v, 64 << 10)?;
        if http.max_body_bytes > 1 << 30 {
            return Err(ConfigError {
                var: "SANDBOX_HTTP_MAX_BODY",
                value: v,
                expected: "a size from 64k to 1g, such as 12m",
            });
        }
    }
    let within = |var: &'static str, min: Duration, max: Duration, expected: &'static str| {
        get(var)
            .map(|v| match parse_duration(var, &v) {
                Ok(d) if (min..=max).contains(&d) => Ok(Some(d)),
                _ => Err(ConfigError {
                    var,
                    value: v,
                    expected,
                }),
            })
            .transpose()
            .map(Option::flatten)
    };
    if let Some(d) = within(
        "SANDBOX_HTTP_HEADER_TIMEOUT",
        Duration::from_secs(1),
        Duration::from_secs(600),
        "a duration from 1s to 10m, such as 10s",
    )? {
        http.header_timeout = d;
    }
    if let Some(d) = within(
        "SANDBOX_HTTP_IDLE_TIMEOUT",
        SSE_PING_INTERVAL * 2,
        Duration::from_secs(24 * 3600),
        "a duration from 30s (twice the SSE ping interval) to 24h, such as 2m",
    )? {
        http.idle_timeout = d;
    }
    if let Some(v) = get("SANDBOX_HTTP_MAX_CONNECTIONS") {
        http.max_connections = parse_count("SANDBOX_HTTP_MAX_CONNECTIONS", &v, 1, 100_000)?;
    }
    if let Some(v) = get("SANDBOX_HTTP_MAX_MCP_SESSIONS") {
        http.max_mcp_sessions = parse_count("SANDBOX_HTTP_MAX_MCP_SESSIONS", &v, 1, 100_000)?;
    }
    if let Some(d) = within(
        "SANDBOX_HTTP_MCP_IDLE_TIMEOUT",
        Duration::from_secs(1),
        Duration::from_secs(24 * 3600),
        "a duration from 1s to 24h, such as 5m",
    )? {
        http.mcp_idle_timeout = d;
    }
    Ok(http)
}

/// Splits a `Host` header (or an allowed-host entry) into a lower-case host and an optional
/// port: `example.com`, `example.com:8080`, `127.0.0.1:80`, `[::1]:8080`, `::1`. `None` when it
/// is not of that form.
pub fn parse_host(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        address.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?.parse::<u16>().ok()?),
        };
        (address.to_string(), port)
    } else if value.matches(':').count() > 1 {
        value.parse::<std::net::Ipv6Addr>().ok()?;
        (value.to_string(), None)
    } else {
        match value.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port.parse::<u16>().ok()?)),
            None => (value.to_string(), None),
        }
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    name_ok.then(|| (host.to_ascii_lowercase(), port))
}

/// An origin in one canonical form, `scheme://host:port` (port always written), or `null`.
/// `None` when the value is not an http(s) origin (a path, a query, credentials...).
pub fn normalize_origin(value: &str) -> Option<String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Some("null".to_string());
    }
    let (scheme, rest) = value.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) {
        return None;
    }
    let (host, port) = parse_host(authority)?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    Some(format!(
        "{scheme}://{host}:{}",
        port.unwrap_or(default_port)
    ))
}

/// The largest output cap an operator may set: the host buffers up to this much per execution.
/// The smallest pids limit gVisor's kernel runs under (it counts its own host threads).
pub const GVISOR_MIN_PIDS: u64 = 256;

/// `/workspace` when `SANDBOX_WORKSPACE_SIZE` is unset (capped at half the memory limit).
pub const DEFAULT_WORKSPACE_BYTES: u64 = 512 << 20;

pub const MAX_OUTPUT_CEILING: u64 = 64 << 20;

/// Parses a size the way Docker does: `512m`, `2g`, `1048576`; units are binary (`m` = MiB).
pub fn parse_bytes(var: &'static str, value: &str, minimum: u64) -> Result<u64, ConfigError> {
    let error = || ConfigError {
        var,
        value: value.to_string(),
        expected: "a size such as 512m, 2g or 1048576 (bytes; k/m/g are binary units)",
    };
    let parsed = parse_size::Config::new()
        .with_binary()
        .parse_size(value)
        .map_err(|_| error())?;
    if parsed < minimum {
        return Err(ConfigError {
            var,
            value: value.to_string(),
            expected: "a larger size (this one is below the minimum that can work)",
        });
    }
    Ok(parsed)
}

/// Parses a duration: `30s`, `2m`, `1h 30m`, or a bare number of seconds (`45`, `2.5`).
pub fn parse_duration(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let error = || ConfigError {
        var,
        value: value.to_string(),
        expected: "a positive duration such as 30s, 2m or 90 (seconds)",
    };
    let duration = match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e9 => Duration::from_secs_f64(secs),
        Ok(_) => return Err(error()),
        Err(_) => humantime::parse_duration(value).map_err(|_| error())?,
    };
    if duration.is_zero() {
        return Err(error());
    }
    Ok(duration)
}

/// Container paths an operator mount may not cover: the sandbox's own machinery.
const RESERVED_MOUNT_PATHS: &[&str] = &[
    "/",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/workspace",
    "/tmp",
    "/opt/deps",
    "/home/sandbox",
];

/// Parses `SANDBOX_MOUNTS`: comma-separated `HOST:CONTAINER[:ro|rw]`, read-only by default.
fn parse_mounts(value: &str) -> Result<Vec<OperatorMount>, ConfigError> {
    let error = |expected| ConfigError {
        var: "SANDBOX_MOUNTS",
        value: value.to_string(),
        expected,
    };
    let mut mounts = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        let (host, container, read_only) = match parts.as_slice() {
            [host, container] => (*host, *container, true),
            [host, container, "ro"] => (*host, *container, true),
            [host, container, "rw"] => (*host, *container, false),
            _ => {
                return Err(error(
                    "comma-separated HOST:CONTAINER[:ro|rw], such as /srv/data:/data:ro",
                ))
            }
        };
        let host = PathBuf::from(host);
        if !host.is_absolute() || !host.exists() {
            return Err(error(
                "existing absolute host paths (HOST:CONTAINER[:ro|rw])",
            ));
        }
        let normal = container.starts_with('/')
            && container.len() > 1
            && container[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        let reserved = RESERVED_MOUNT_PATHS
            .iter()
            .any(|r| container == *r || (*r != "/" && container.starts_with(&format!("{r}/"))));
        if !normal || reserved {
            return Err(error(
                "absolute container paths outside the sandbox's own directories (/, /proc, /sys, /dev, /etc, /usr, /workspace, /tmp, ...), such as /data",
            ));
        }
        mounts.push(OperatorMount {
            host,
            container: container.to_string(),
            read_only,
        });
    }
    Ok(mounts)
}

fn parse_bool(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError {
            var,
            value: value.to_string(),
            expected: "true or false",
        }),
    }
}

fn parse_url(var: &'static str, value: &str) -> Result<String, ConfigError> {
    let ok = (value.starts_with("https://") || value.starts_with("http://"))
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'');
    if ok {
        Ok(value.to_string())
    } else {
        Err(ConfigError {
            var,
            value: value.to_string(),
            expected: "an http(s) URL such as https://pypi.org/simple",
        })
    }
}

/// Comma-separated `host[:port]` (port 443 when omitted).
fn parse_hosts(var: &'static str, value: &str) -> Result<Vec<(String, u16)>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            crate::engine::egress::parse_host_port(h, 443).ok_or(ConfigError {
                var,
                value: value.to_string(),
                expected: "comma-separated host names or addresses, each optionally with :PORT",
            })
        })
        .collect()
}

/// Whether an index URL carries credentials: `user[:password]@` before the host, or a query.
pub fn url_has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.contains('@') || url.contains('?')
}

/// The URL with its user information and query replaced by `***` (for messages).
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let userinfo = if authority.contains('@') { "***@" } else { "" };
    let path = path
        .split_once('?')
        .map_or(path.to_string(), |(p, _)| format!("{p}?***"));
    format!("{scheme}://{userinfo}{host}{path}")
}

fn is_volume_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn parse_count(
    var: &'static str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<usize, ConfigError> {
    match value.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError {
            var,
            value: value.to_string(),
            expected: "a whole number within the accepted range (see the README)",
        }),
    }
}

/// `$XDG_CACHE_HOME/python-code-sandbox`, else `~/.cache/python-code-sandbox`, else the temp dir.
fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("python-code-sandbox")
}

/// Where files are saved by default: private to the user, never under a fixed name in the shared
/// temp dir. `$XDG_STATE_HOME/python-code-sandbox/files`, else
/// `~/.local/state/python-code-sandbox/files`, else (no home) a temp-dir directory named with the
/// uid, which start-up refuses if someone else made it.
fn default_files_dir() -> PathBuf {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local").join("state"))
        });
    match state {
        Some(state) => state.join("python-code-sandbox").join("files"),
        None => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            std::env::temp_dir()
                .join(format!("python-code-sandbox-{uid}"))
                .join("files")
        }
    }
}

/// Whether `name` matches a glob `pattern` (`*` any run of characters, `?` one character).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            backtrack = Some((pi, ni));
            pi += 1;
        } else if let Some((star, matched)) = backtrack {
            pi = star + 1;
            ni = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn parse_cpus(value: &str) -> Result<f64, ConfigError> {
    match value.parse::<f64>() {
        Ok(cpus) if cpus.is_finite() && (0.01..=1024.0).contains(&cpus) => Ok(cpus),
        _ => Err(ConfigError {
            var: "SANDBOX_CPU_LIMIT",
            value: value.to_string(),
            expected: "a number of CPUs from 0.01 to 1024, such as 0.5 or 2",
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gvisor_needs_room_for_its_own_threads() {
        let e = config(&[("SANDBOX_RUNTIME", "runsc"), ("SANDBOX_PIDS_LIMIT", "64")]).unwrap_err();
        assert_eq!(e.var, "SANDBOX_PIDS_LIMIT");
        assert!(config(&[("SANDBOX_RUNTIME", "runsc"), ("SANDBOX_PIDS_LIMIT", "256")]).is_ok());
        assert!(config(&[("SANDBOX_PIDS_LIMIT", "64")]).is_ok());
    }

    #[test]
    fn the_workspace_fits_in_memory() {
        let c = config(&[("SANDBOX_MEMORY_LIMIT", "256m")]).unwrap();
        assert_eq!(
            c.limits.workspace_bytes,
            128 << 20,
            "half the memory when unset"
        );
        let c = config(&[("SANDBOX_WORKSPACE_SIZE", "100m")]).unwrap();
        assert_eq!(c.limits.workspace_bytes, 100 << 20);
        let e = config(&[
            ("SANDBOX_MEMORY_LIMIT", "256m"),
            ("SANDBOX_WORKSPACE_SIZE", "1g"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "SANDBOX_WORKSPACE_SIZE");
    }

    use super::*;
    use std::collections::HashMap;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_match_the_seed() {
        let c = config(&[]).unwrap();
        assert_eq!(c.image, DEFAULT_IMAGE);
        assert_eq!(c.limits.memory_bytes, 2 * 1024 * 1024 * 1024);
        assert_eq!(c.limits.cpus, 0.5);
        assert_eq!(c.network, NetworkPolicy::None);
        assert_eq!(c.ca_bundle, None);
    }

    #[test]
    fn sizes_use_binary_units_like_docker() {
        let c = config(&[
            ("SANDBOX_MEMORY_LIMIT", "512m"),
            ("SANDBOX_MAX_OUTPUT", "64k"),
        ])
        .unwrap();
        assert_eq!(c.limits.memory_bytes, 512 * 1024 * 1024);
        assert_eq!(c.limits.max_output_bytes, 64 * 1024);
        let c = config(&[("SANDBOX_MEMORY_LIMIT", "1G")]).unwrap();
        assert_eq!(c.limits.memory_bytes, 1 << 30);
    }

    #[test]
    fn durations_accept_units_and_bare_seconds() {
        let c = config(&[("SANDBOX_TIMEOUT", "90")]).unwrap();
        assert_eq!(c.limits.timeout, Duration::from_secs(90));
        let c = config(&[("SANDBOX_TIMEOUT", "2m")]).unwrap();
        assert_eq!(c.limits.timeout, Duration::from_secs(120));
        let c = config(&[("SANDBOX_TIMEOUT", "1.5")]).unwrap();
        assert_eq!(c.limits.timeout, Duration::from_millis(1500));
    }

    #[test]
    fn empty_values_take_the_default() {
        let c = config(&[("SANDBOX_TIMEOUT", ""), ("SANDBOX_NETWORK", " ")]).unwrap();
        assert_eq!(c.limits.timeout, Duration::from_secs(60));
        assert_eq!(c.network, NetworkPolicy::None);
    }

    #[test]
    fn bad_values_name_the_variable_value_and_form() {
        let cases = [
            ("SANDBOX_MEMORY_LIMIT", "lots"),
            ("SANDBOX_MEMORY_LIMIT", "1k"),
            ("SANDBOX_CPU_LIMIT", "-1"),
            ("SANDBOX_CPU_LIMIT", "NaN"),
            ("SANDBOX_PIDS_LIMIT", "0"),
            ("SANDBOX_PIDS_LIMIT", "many"),
            ("SANDBOX_TIMEOUT", "0"),
            ("SANDBOX_TIMEOUT", "soon"),
            ("SANDBOX_TIMEOUT", "-5"),
            ("SANDBOX_MAX_OUTPUT", "1t"),
            ("SANDBOX_NETWORK", "host"),
            ("SANDBOX_CA_BUNDLE", "relative.pem"),
            ("SANDBOX_CA_BUNDLE", "/no/such/file.pem"),
            ("SANDBOX_IMAGE", "two words"),
            ("LOG_LEVEL", "loud=[["),
        ];
        for (var, value) in cases {
            let err = config(&[(var, value)]).expect_err(var);
            assert_eq!(err.var, var);
            assert_eq!(err.value, value);
            let text = err.to_string();
            assert!(
                text.contains(var) && text.contains(value) && text.contains("expected"),
                "{text}"
            );
        }
    }

    #[test]
    fn files_dir_empty_disables_saving() {
        assert!(config(&[]).unwrap().files.persist_dir.is_some());
        assert_eq!(
            config(&[("SANDBOX_FILES_DIR", "")])
                .unwrap()
                .files
                .persist_dir,
            None
        );
        assert_eq!(
            config(&[("SANDBOX_FILES_DIR", "/srv/files")])
                .unwrap()
                .files
                .persist_dir,
            Some(PathBuf::from("/srv/files"))
        );
        assert!(config(&[("SANDBOX_FILES_DIR", "relative")]).is_err());
    }

    #[test]
    fn files_go_to_a_per_user_directory_by_default() {
        let dir = config(&[]).unwrap().files.persist_dir.unwrap();
        assert!(dir.ends_with("python-code-sandbox/files"), "{dir:?}");
        if std::env::var_os("HOME").is_some() || std::env::var_os("XDG_STATE_HOME").is_some() {
            assert!(!dir.starts_with(std::env::temp_dir()), "{dir:?}");
        } else {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            assert!(dir
                .to_string_lossy()
                .contains(&format!("python-code-sandbox-{uid}")));
        }
    }

    #[test]
    fn files_retention_has_defaults_and_is_validated() {
        let c = config(&[]).unwrap();
        assert_eq!(c.files.max_age, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(c.files.max_saved_bytes, 1 << 30);
        let c = config(&[
            ("SANDBOX_FILES_MAX_AGE", "2h"),
            ("SANDBOX_FILES_MAX_BYTES", "64k"),
            ("SANDBOX_FILES_MAX_TOTAL", "32k"),
        ])
        .unwrap();
        assert_eq!(c.files.max_age, Duration::from_secs(7200));
        assert_eq!(c.files.max_saved_bytes, 64 << 10);
        for (var, value) in [
            ("SANDBOX_FILES_MAX_AGE", "soon"),
            ("SANDBOX_FILES_MAX_AGE", "0"),
            ("SANDBOX_FILES_MAX_BYTES", "lots"),
            ("SANDBOX_FILES_MAX_BYTES", "0"),
        ] {
            let e = config(&[(var, value)]).unwrap_err();
            assert_eq!(e.var, var);
        }
        // One execution's saved files (SANDBOX_FILES_MAX_TOTAL, 500m by default) must fit.
        let e = config(&[("SANDBOX_FILES_MAX_BYTES", "100m")]).unwrap_err();
        assert_eq!(e.var, "SANDBOX_FILES_MAX_BYTES");
        assert!(e.expected.contains("SANDBOX_FILES_MAX_TOTAL"), "{e}");
    }

    #[test]
    fn operator_mounts_parse_and_refuse_reserved_paths() {
        let tmp = std::env::temp_dir();
        let ok = format!("{}:/data,{}:/scratch:rw", tmp.display(), tmp.display());
        let mounts = config(&[("SANDBOX_MOUNTS", &ok)]).unwrap().mounts;
        assert_eq!(mounts.len(), 2);
        assert!(mounts[0].read_only && !mounts[1].read_only);
        assert_eq!(mounts[1].container, "/scratch");
        for bad in [
            "relative:/data",
            "/no/such/dir:/data",
            "/tmp:/",
            "/tmp:/etc/x",
            "/tmp:/workspace",
            "/tmp:data",
            "/tmp:/data:xx",
            "/tmp:/a/../b",
        ] {
            assert!(config(&[("SANDBOX_MOUNTS", bad)]).is_err(), "{bad}");
        }
    }

    #[test]
    fn dependency_settings_parse() {
        let c = config(&[
            ("PIP_INDEX_URL", "https://mirror.example/simple"),
            (
                "PIP_EXTRA_INDEX_URL",
                "https://a.example/simple https://b.example/simple",
            ),
            ("ENABLE_PIP_CACHE", "false"),
            ("SANDBOX_DEPS_CACHE_MAX", "2g"),
        ])
        .unwrap();
        assert_eq!(
            c.deps.index_url.as_deref(),
            Some("https://mirror.example/simple")
        );
        assert_eq!(c.deps.extra_index_urls.len(), 2);
        assert_eq!(c.deps.download_cache, DownloadCache::Off);
        assert_eq!(c.deps.cache_max_bytes, 2 << 30);
        let c = config(&[("PIP_CACHE_PATH", "/var/cache/pip")]).unwrap();
        assert_eq!(
            c.deps.download_cache,
            DownloadCache::HostPath("/var/cache/pip".into())
        );
        for (var, bad) in [
            ("PIP_INDEX_URL", "file:///x"),
            ("ENABLE_PIP_CACHE", "maybe"),
            ("SANDBOX_DEPS_VOLUME", "a/b"),
            ("PIP_CACHE_PATH", "rel"),
        ] {
            assert!(config(&[(var, bad)]).is_err(), "{var}={bad}");
        }
    }

    #[test]
    fn source_builds_and_credentials() {
        let c = config(&[]).unwrap();
        assert!(!c.deps.allow_source_builds, "wheels only by default");
        assert_eq!(c.deps.install_max_bytes, 2 << 30);
        let c = config(&[
            ("SANDBOX_ALLOW_SOURCE_BUILDS", "true"),
            ("SANDBOX_DEPS_INSTALL_MAX", "500m"),
            ("PIP_INDEX_URL", "https://mirror.example/simple"),
        ])
        .unwrap();
        assert!(c.deps.allow_source_builds);
        assert_eq!(c.deps.install_max_bytes, 500 << 20);
        // Credentials are fine with wheels only (no package code runs during the install)...
        let with_token = "https://user:s3cret@mirror.example/simple";
        assert!(config(&[("PIP_INDEX_URL", with_token)]).is_ok());
        // ...and refused with source builds, without showing them.
        for (var, url) in [
            ("PIP_INDEX_URL", with_token),
            ("PIP_INDEX_URL", "https://tok3n@mirror.example/simple"),
            (
                "PIP_EXTRA_INDEX_URL",
                "https://a.example/simple?token=s3cret",
            ),
        ] {
            let error = config(&[(var, url), ("SANDBOX_ALLOW_SOURCE_BUILDS", "true")])
                .expect_err(url)
                .to_string();
            assert!(error.contains("SANDBOX_ALLOW_SOURCE_BUILDS"), "{error}");
            assert!(
                !error.contains("s3cret") && !error.contains("tok3n"),
                "{error}"
            );
        }
        assert_eq!(
            redact_url("https://u:p@h.example:8080/simple?t=1"),
            "https://***@h.example:8080/simple?***"
        );
        assert!(!url_has_credentials("https://h.example/simple"));
    }

    #[test]
    fn globs_match_images() {
        assert!(glob_matches("python:3.12-slim", "python:3.12-slim"));
        assert!(glob_matches("python:*", "python:3.12-slim"));
        assert!(glob_matches("myorg/*:v?", "myorg/tools:v2"));
        assert!(!glob_matches("myorg/*:v?", "myorg/tools:v22"));
        assert!(!glob_matches("python:*", "evil/python:3"));
        assert!(glob_matches("*", "anything"));
        assert!(!glob_matches("", "x"));
    }

    #[test]
    fn session_and_concurrency_settings_parse() {
        let c = config(&[
            ("SANDBOX_ALLOWED_IMAGES", "python:3.12-slim, myorg/*"),
            ("SANDBOX_MAX_SESSIONS", "3"),
            ("SANDBOX_SESSION_IDLE_TIMEOUT", "5m"),
            ("SANDBOX_MAX_CONCURRENT", "2"),
        ])
        .unwrap();
        assert_eq!(c.allowed_images, vec!["python:3.12-slim", "myorg/*"]);
        assert_eq!(c.sessions.max_sessions, 3);
        assert_eq!(c.sessions.idle_timeout, Duration::from_secs(300));
        assert_eq!(c.max_concurrent, 2);
        assert!(config(&[("SANDBOX_MAX_CONCURRENT", "0")]).is_err());
        assert!(config(&[("SANDBOX_PYPI_URL", "ftp://x")]).is_err());
    }

    #[test]
    fn network_bridge_is_accepted() {
        let c = config(&[("SANDBOX_NETWORK", "Bridge")]).unwrap();
        assert_eq!(c.network, NetworkPolicy::Bridge);
    }

    #[test]
    fn http_settings_parse_and_hide_the_token() {
        let c = config(&[
            ("SANDBOX_HTTP_TOKEN", "0123456789abcdef0123"),
            (
                "SANDBOX_HTTP_ALLOWED_ORIGINS",
                "https://App.example.com, http://localhost:3000/",
            ),
            (
                "SANDBOX_HTTP_ALLOWED_HOSTS",
                "mcp.example.com,[::1]:8080,10.0.0.5:80",
            ),
            ("SANDBOX_HTTP_MAX_BODY", "20m"),
        ])
        .unwrap();
        assert_eq!(
            c.http.token.as_ref().map(Secret::expose),
            Some("0123456789abcdef0123")
        );
        assert!(!format!("{c:?}").contains("0123456789abcdef0123"));
        assert_eq!(
            c.http.allowed_origins,
            vec!["https://app.example.com:443", "http://localhost:3000"]
        );
        let hosts = c.http.allowed_hosts.unwrap();
        assert!(hosts[0].matches("mcp.example.com", Some(1234)));
        assert!(hosts[1].matches("::1", Some(8080)) && !hosts[1].matches("::1", Some(80)));
        assert_eq!(c.http.max_body_bytes, 20 << 20);
        assert_eq!(
            config(&[]).unwrap().http.max_body_bytes,
            DEFAULT_HTTP_MAX_BODY
        );

        let short = config(&[("SANDBOX_HTTP_TOKEN", "tiny")]).unwrap_err();
        assert!(!short.to_string().contains("tiny"), "{short}");
        let spaced = config(&[("SANDBOX_HTTP_TOKEN", "has spaces in it, 1234567")]).unwrap_err();
        assert!(!spaced.to_string().contains("spaces"), "{spaced}");
        for (var, bad) in [
            ("SANDBOX_HTTP_ALLOWED_ORIGINS", "app.example.com"),
            (
                "SANDBOX_HTTP_ALLOWED_ORIGINS",
                "https://app.example.com/path",
            ),
            ("SANDBOX_HTTP_ALLOWED_ORIGINS", "ftp://x"),
            ("SANDBOX_HTTP_ALLOWED_HOSTS", "bad host"),
            ("SANDBOX_HTTP_ALLOWED_HOSTS", "x:99999"),
            ("SANDBOX_HTTP_MAX_BODY", "1k"),
            ("SANDBOX_HTTP_MAX_BODY", "2g"),
        ] {
            assert!(config(&[(var, bad)]).is_err(), "{var}={bad}");
        }
    }

    #[test]
    fn http_limits_parse_within_their_ranges() {
        let c = config(&[]).unwrap();
        assert_eq!(c.http.header_timeout, Duration::from_secs(10));
        assert!(c.http.idle_timeout > SSE_PING_INTERVAL);
        let c = config(&[
            ("SANDBOX_HTTP_HEADER_TIMEOUT", "3s"),
            ("SANDBOX_HTTP_IDLE_TIMEOUT", "1m"),
            ("SANDBOX_HTTP_MAX_CONNECTIONS", "8"),
            ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "2"),
            ("SANDBOX_HTTP_MCP_IDLE_TIMEOUT", "90"),
        ])
        .unwrap();
        assert_eq!(c.http.header_timeout, Duration::from_secs(3));
        assert_eq!(c.http.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.http.max_connections, 8);
        assert_eq!(c.http.max_mcp_sessions, 2);
        assert_eq!(c.http.mcp_idle_timeout, Duration::from_secs(90));
        for (var, bad) in [
            ("SANDBOX_HTTP_HEADER_TIMEOUT", "0"),
            ("SANDBOX_HTTP_HEADER_TIMEOUT", "1h"),
            ("SANDBOX_HTTP_IDLE_TIMEOUT", "10s"),
            ("SANDBOX_HTTP_MAX_CONNECTIONS", "0"),
            ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "0"),
            ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "many"),
            ("SANDBOX_HTTP_MCP_IDLE_TIMEOUT", "-1"),
        ] {
            let e = config(&[(var, bad)]).unwrap_err();
            assert_eq!(e.var, var, "{var}={bad}");
        }
    }

    #[test]
    fn the_token_comes_from_a_file_or_the_environment_not_both() {
        let path = std::env::temp_dir().join(format!("pcs-token-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "fedcba9876543210fedcba\n").unwrap();
        let file = path.display().to_string();
        let c = config(&[("SANDBOX_HTTP_TOKEN_FILE", &file)]).unwrap();
        assert_eq!(
            c.http.token.as_ref().map(Secret::expose),
            Some("fedcba9876543210fedcba")
        );
        let both = config(&[
            ("SANDBOX_HTTP_TOKEN_FILE", &file),
            ("SANDBOX_HTTP_TOKEN", "0123456789abcdef0123"),
        ]);
        assert!(both.is_err());
        let _ = std::fs::remove_file(&path);
        assert!(
            config(&[("SANDBOX_HTTP_TOKEN_FILE", &file)]).is_err(),
            "missing file"
        );
    }

    #[test]
    fn hosts_and_origins_normalize() {
        assert_eq!(
            parse_host("LocalHost:8080"),
            Some(("localhost".into(), Some(8080)))
        );
        assert_eq!(parse_host("[::1]"), Some(("::1".into(), None)));
        assert_eq!(parse_host("::1"), Some(("::1".into(), None)));
        assert_eq!(parse_host("evil.com:8080:1"), None);
        assert_eq!(parse_host("a b"), None);
        assert_eq!(parse_host(""), None);
        assert_eq!(
            normalize_origin("http://[::1]:9000").as_deref(),
            Some("http://[::1]:9000")
        );
        assert_eq!(
            normalize_origin("HTTPS://Example.com").as_deref(),
            Some("https://example.com:443")
        );
        assert_eq!(normalize_origin("null").as_deref(), Some("null"));
        assert_eq!(normalize_origin("https://u@example.com"), None);
    }

    #[test]
    fn readme_documents_every_variable() {
        let readme = include_str!("../README.md");
        for v in VARIABLES {
            assert!(
                readme.contains(&format!("`{}`", v.name)),
                "README lacks {}",
                v.name
            );
        }
    }
}
