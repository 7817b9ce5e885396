//! Every setting, defined once: its variable name, the default as users read it, one line of
//! documentation, and how its value is parsed into [`Config`].
//!
//! [`SETTINGS`] is the only list of what the program reads from its environment. `from_lookup`
//! applies it in order, docs/configuration.md's Settings table is checked against it row by row, and
//! the few variables read by other parts of the program ([`Read::Elsewhere`]) are listed here too
//! so that they are documented and checked with the rest. A setting's parser sees only its own
//! value; rules between settings live in `validate`.

use std::path::PathBuf;
use std::time::Duration;

use super::address::normalize_origin;
use super::address::parse_host;
use super::egress::{target_of, EgressRules, EntryTarget, Target};
use super::error::ConfigError;
use super::parse::{
    is_image_reference, is_volume_name, parse_bool, parse_bytes, parse_count, parse_duration,
    parse_duration_within, parse_hosts, parse_mounts, parse_requirement_sets, parse_token,
    parse_url,
};
use super::roots;
use super::{
    Config, DownloadCache, HostPattern, JwksSource, NetworkPolicy, DEFAULT_IMAGE,
    MAX_OUTPUT_CEILING, MODEL_OUTPUT_RANGE, SSE_PING_INTERVAL,
};

/// One environment variable the program reads.
pub struct Setting {
    pub name: &'static str,
    /// The default, as the documentation shows it.
    pub default: Shown,
    /// What it does, in one line of Markdown (docs/configuration.md's "meaning" column).
    pub doc: &'static str,
    pub read: Read,
}

/// How a default is shown to users.
pub enum Shown {
    /// A value the setting itself accepts; shown as code, and a test checks that setting it
    /// changes nothing.
    Value(&'static str),
    /// A description, for defaults that are derived or absent (shown as written, in Markdown).
    Prose(&'static str),
}

/// Puts a setting's value into the configuration: `(config, variable name, trimmed value)`.
pub type Apply = fn(&mut Config, &'static str, &str) -> Result<(), ConfigError>;

/// Who reads a setting, and when it counts as set.
pub enum Read {
    /// `Config::from_lookup`, when the variable is set and not blank (blank means the default).
    Value(Apply),
    /// `Config::from_lookup`, also when it is set to blank, which means something of its own.
    EvenEmpty(Apply),
    /// Another part of the program, named here; it reads the value with
    /// [`Setting::read_process_env`] or leaves it to a library.
    Elsewhere(&'static str),
}

impl Setting {
    /// The value in the process environment, trimmed, when set and not blank: for the settings
    /// read where they are used rather than into [`Config`].
    pub fn read_process_env(&self) -> Option<String> {
        non_blank(std::env::var(self.name).ok())
    }

    /// The row of docs/configuration.md's Settings table that documents this setting.
    pub fn markdown_row(&self) -> String {
        let default = match self.default {
            Shown::Value(value) => format!("`{value}`"),
            Shown::Prose(text) => text.to_string(),
        };
        let cell = |text: &str| text.replace('|', "\\|");
        format!(
            "| `{}` | {} | {} |",
            self.name,
            cell(&default),
            cell(self.doc)
        )
    }

    /// Reads this setting from `env` into `config`, when `from_lookup` is its reader.
    pub(super) fn apply(&self, config: &mut Config, env: &Env) -> Result<(), ConfigError> {
        match self.read {
            Read::Value(apply) => match env.get(self) {
                Some(value) => apply(config, self.name, &value),
                None => Ok(()),
            },
            Read::EvenEmpty(apply) => match env.raw(self) {
                Some(value) => apply(config, self.name, value.trim()),
                None => Ok(()),
            },
            Read::Elsewhere(_) => Ok(()),
        }
    }
}

/// The variables `from_lookup` is given, seen through the settings that name them.
pub(super) struct Env<'a>(pub(super) &'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// The value exactly as set (for a message that shows what the operator wrote).
    pub(super) fn raw(&self, setting: &Setting) -> Option<String> {
        (self.0)(setting.name)
    }

    /// The value trimmed; `None` when unset or blank.
    pub(super) fn get(&self, setting: &Setting) -> Option<String> {
        non_blank(self.raw(setting))
    }
}

fn non_blank(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

// The sandbox: image and resource limits.

pub const SANDBOX_IMAGE: Setting = Setting {
    name: "SANDBOX_IMAGE",
    default: Shown::Value(DEFAULT_IMAGE),
    doc: "image of every sandbox; the default one is built by `image build`, another is pulled on first use",
    read: Read::Value(|config, var, v| {
        if !is_image_reference(v) {
            return Err(ConfigError::new(
                var,
                v,
                "an image reference such as python-code-sandbox:py3.11",
            ));
        }
        config.image = v.to_string();
        Ok(())
    }),
};

pub const SANDBOX_MEMORY_LIMIT: Setting = Setting {
    name: "SANDBOX_MEMORY_LIMIT",
    default: Shown::Value("2g"),
    doc: "memory per sandbox; swap is disabled (memory+swap = memory)",
    read: Read::Value(|config, var, v| {
        config.limits.memory_bytes = parse_bytes(var, v, 16 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_CPU_LIMIT: Setting = Setting {
    name: "SANDBOX_CPU_LIMIT",
    default: Shown::Value("0.5"),
    doc: "CPUs per sandbox",
    read: Read::Value(|config, var, v| {
        let error = || {
            ConfigError::new(
                var,
                v,
                "a number of CPUs from 0.01 to 1024, such as 0.5 or 2",
            )
        };
        config.limits.cpus = match v.parse::<f64>() {
            Ok(cpus) if cpus.is_finite() && (0.01..=1024.0).contains(&cpus) => cpus,
            Ok(_) => return Err(error()),
            Err(e) => return Err(error().because(e)),
        };
        Ok(())
    }),
};

pub const SANDBOX_PIDS_LIMIT: Setting = Setting {
    name: "SANDBOX_PIDS_LIMIT",
    default: Shown::Value("256"),
    doc: "processes and threads per sandbox",
    read: Read::Value(|config, var, v| {
        let error = || {
            ConfigError::new(
                var,
                v,
                "a whole number of processes from 8 to 1000000, such as 256",
            )
        };
        config.limits.pids = match v.parse::<u64>() {
            Ok(n) if (8..=1_000_000).contains(&n) => n,
            Ok(_) => return Err(error()),
            Err(e) => return Err(error().because(e)),
        };
        Ok(())
    }),
};

pub const SANDBOX_TMP_SIZE: Setting = Setting {
    name: "SANDBOX_TMP_SIZE",
    default: Shown::Value("64m"),
    doc: "size of the `/tmp` tmpfs (counts against memory)",
    read: Read::Value(|config, var, v| {
        config.limits.tmp_bytes = parse_bytes(var, v, 1 << 20)?;
        Ok(())
    }),
};

/// Unset, its default is derived from the memory limit (in `validate`).
pub const SANDBOX_WORKSPACE_SIZE: Setting = Setting {
    name: "SANDBOX_WORKSPACE_SIZE",
    default: Shown::Prose("`512m`, at most half the memory limit"),
    doc: "size of `/workspace`, a tmpfs that counts against memory and survives runner restarts; full, writes fail with \"No space left on device\" (ENOSPC) and the host's disk is untouched; larger than the memory limit is refused",
    read: Read::Value(|config, var, v| {
        config.limits.workspace_bytes = parse_bytes(var, v, 1 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_TIMEOUT: Setting = Setting {
    name: "SANDBOX_TIMEOUT",
    default: Shown::Value("60s"),
    doc: "wall-clock limit of one execution",
    read: Read::Value(|config, var, v| {
        config.limits.timeout = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_MAX_OUTPUT: Setting = Setting {
    name: "SANDBOX_MAX_OUTPUT",
    default: Shown::Value("1m"),
    doc: "bytes of stdout+stderr kept per execution (at most `64m`), shared by the two streams; a stream over its share keeps its first and last lines, and a line between them says how many bytes and lines were not kept",
    read: Read::Value(|config, var, v| {
        let bytes = parse_bytes(var, v, 1)?;
        if bytes > MAX_OUTPUT_CEILING {
            return Err(ConfigError::new(
                var,
                v,
                "a size from 1 byte to 64m, such as 1m",
            ));
        }
        config.limits.max_output_bytes = bytes;
        Ok(())
    }),
};

pub const SANDBOX_MODEL_OUTPUT: Setting = Setting {
    name: "SANDBOX_MODEL_OUTPUT",
    default: Shown::Value("20000"),
    doc: "characters of stdout+stderr a model reads in a tool result (`1000` to `1000000`; about 4 characters a token); longer output keeps its head and tail around a line saying what was cut and where the whole is: saved with the run's files and, in a session, in `/workspace/.outputs/`",
    read: Read::Value(|config, var, v| {
        let accepted = "a number of characters from 1000 to 1000000, such as 20000";
        config.limits.model_output_chars = match v.parse::<usize>() {
            Ok(n) if MODEL_OUTPUT_RANGE.contains(&n) => n,
            Ok(_) => return Err(ConfigError::new(var, v, accepted)),
            Err(e) => return Err(ConfigError::new(var, v, accepted).because(e)),
        };
        Ok(())
    }),
};

pub const SANDBOX_NETWORK: Setting = Setting {
    name: "SANDBOX_NETWORK",
    default: Shown::Value("none"),
    doc: "`none`: loopback only; `bridge`: Docker's default bridge; `allowlist`: only through the server's egress proxy, to the hosts `SANDBOX_EGRESS_ALLOW` names and those the user approves (`SANDBOX_EGRESS_ASK`)",
    read: Read::Value(|config, var, v| {
        config.network = match v.to_ascii_lowercase().as_str() {
            "none" => NetworkPolicy::None,
            "bridge" => NetworkPolicy::Bridge,
            "allowlist" => NetworkPolicy::Allowlist,
            _ => return Err(ConfigError::new(var, v, "none, bridge or allowlist")),
        };
        Ok(())
    }),
};

// The allowlist network's egress proxy (`SANDBOX_NETWORK=allowlist`); set with another network,
// each is refused in `validate`.

/// `*` in it needs `SANDBOX_EGRESS_ALLOW_ALL`, checked in `validate`.
pub const SANDBOX_EGRESS_ALLOW: Setting = Setting {
    name: "SANDBOX_EGRESS_ALLOW",
    default: Shown::Prose("none"),
    doc: "`allowlist`: comma-separated hosts the code may reach: `host`, `*.suffix` (any name below it, not the suffix itself), `*` (any name, with `SANDBOX_EGRESS_ALLOW_ALL`), an IPv4 address or range `10.0.0.0/8`, an IPv6 one in brackets `[fd00::/8]`; each with `:port`, else ports 80 and 443. Addresses are reached only through address entries, and a name must resolve to public addresses only, or to addresses inside an address entry",
    read: Read::Value(|config, var, v| {
        config.egress.allow = parse_egress_rules(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_EGRESS_ASK: Setting = Setting {
    name: "SANDBOX_EGRESS_ASK",
    default: Shown::Prose("none"),
    doc: "`allowlist`: host names (same form, no addresses; `*` allowed) the code may reach once the user agrees: in a session the client is asked (MCP elicitation) at the first attempt, which is refused meanwhile, and the answer holds for the session; outside a session they are refused",
    read: Read::Value(|config, var, v| {
        let rules = parse_egress_rules(var, v)?;
        if rules
            .entries
            .iter()
            .any(|e| matches!(e.target, EntryTarget::Range(_)))
        {
            return Err(ConfigError::new(
                var,
                v,
                "host names only: addresses and ranges are reached only when SANDBOX_EGRESS_ALLOW names them",
            ));
        }
        config.egress.ask = rules;
        Ok(())
    }),
};

pub const SANDBOX_EGRESS_ALLOW_ALL: Setting = Setting {
    name: "SANDBOX_EGRESS_ALLOW_ALL",
    default: Shown::Prose("`false`"),
    doc: "`true`: accept `*` in `SANDBOX_EGRESS_ALLOW` (any host name, still only to public addresses)",
    read: Read::Value(|config, var, v| {
        config.egress.allow_all = parse_bool(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_EGRESS_RESOLVE: Setting = Setting {
    name: "SANDBOX_EGRESS_RESOLVE",
    default: Shown::Prose("none"),
    doc: "test only: comma-separated `name=address` the egress proxy uses instead of resolving the name; names must be `test` or end in `.test` (reserved, RFC 6761)",
    read: Read::Value(|config, var, v| {
        config.egress.resolve = v
            .split(',')
            .map(str::trim)
            .filter(|pair| !pair.is_empty())
            .map(|pair| parse_resolve_pair(var, v, pair))
            .collect::<Result<_, _>>()?;
        Ok(())
    }),
};

pub const SANDBOX_EGRESS_UPLINK: Setting = Setting {
    name: "SANDBOX_EGRESS_UPLINK",
    default: Shown::Prose("`bridge`"),
    doc: "the Docker network the egress proxy (the code's with `allowlist`, and the installers') reaches outside hosts through",
    read: Read::Value(|config, var, v| {
        if !is_volume_name(v) {
            return Err(ConfigError::new(
                var,
                v,
                "a Docker network name: letters, digits, '_', '.', '-'",
            ));
        }
        config.egress.uplink = v.to_string();
        Ok(())
    }),
};

pub const SANDBOX_EGRESS_SUBNETS: Setting = Setting {
    name: "SANDBOX_EGRESS_SUBNETS",
    default: Shown::Prose("`10.213.0.0/16`"),
    doc: "an IPv4 range (at most /24) each sandbox on the egress network (the code's with `allowlist`, the installers') gets its own /29 network from; pick one the host does not use",
    read: Read::Value(|config, var, v| {
        let accepted = "an IPv4 range of at most /24, such as 10.213.0.0/16";
        match v.trim().parse::<ipnet::Ipv4Net>() {
            Ok(net) if net.prefix_len() <= 24 => {
                config.egress.subnets = net.trunc();
                Ok(())
            }
            _ => Err(ConfigError::new(var, v, accepted)),
        }
    }),
};

/// Read here is only the path; the file is read and checked in `validate`, which knows the
/// network, the engine and the principals it needs (and the environment its `value_env` names).
pub const SANDBOX_SECRETS_FILE: Setting = Setting {
    name: "SANDBOX_SECRETS_FILE",
    default: Shown::Prose("none"),
    doc: "`allowlist`: a TOML file of API keys the egress proxy adds to the code's HTTPS requests to the hosts each is bound to, so that no key enters a sandbox (the code's variable holds a placeholder): a `[[secret]]` table each, with `name`, `value_env` or `value_file`, `hosts`, `header`, `format` and `env` (see [Secrets brokered at the egress](#secrets-brokered-at-the-egress)); read once at start-up; not with an engine on another machine, nor with several principals (each gets its own with `secrets=` on its tokens-file line)",
    read: Read::Value(|config, var, v| {
        let path = PathBuf::from(v);
        if !path.is_absolute() {
            return Err(ConfigError::new(
                var,
                v,
                "the absolute path of a secrets file (TOML), such as /etc/python-code-sandbox/secrets.toml",
            ));
        }
        config.secrets = std::sync::Arc::new(super::secrets::Secrets {
            entries: Vec::new(),
            file: Some(path),
        });
        Ok(())
    }),
};

/// `SANDBOX_EGRESS_ALLOW` or `SANDBOX_EGRESS_ASK`; the error names the entry and why.
fn parse_egress_rules(var: &'static str, v: &str) -> Result<EgressRules, ConfigError> {
    EgressRules::parse(v).map_err(|why| {
        ConfigError::new(
            var,
            v,
            format!(
                "comma-separated host[:port], *.suffix[:port], *, a.b.c.d[/n][:port] or [v6[/n]][:port] ({why})"
            ),
        )
    })
}

/// One `name=address` of `SANDBOX_EGRESS_RESOLVE`.
fn parse_resolve_pair(
    var: &'static str,
    v: &str,
    pair: &str,
) -> Result<(String, std::net::IpAddr), ConfigError> {
    let form = "comma-separated name=address pairs such as data.test=172.18.0.5";
    let (name, address) = pair
        .split_once('=')
        .ok_or_else(|| ConfigError::new(var, v, form))?;
    let name = match target_of(name.trim()) {
        Some(Target::Name(name)) => name,
        _ => return Err(ConfigError::new(var, v, form)),
    };
    if name != "test" && !name.ends_with(".test") {
        return Err(ConfigError::new(
            var,
            v,
            "names under .test only: this is a test-only override of the egress proxy's resolver and cannot map public names",
        ));
    }
    let address = address.trim();
    let bare = address
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(address);
    let address = bare
        .parse::<std::net::IpAddr>()
        .map_err(|_| ConfigError::new(var, v, form))?;
    Ok((name, address))
}

pub const SANDBOX_RUNTIME: Setting = Setting {
    name: "SANDBOX_RUNTIME",
    default: Shown::Prose("`auto`: gVisor (`runsc`) when the engine has it and it can do what the settings need, else the engine's default (runc)"),
    doc: "OCI runtime of the sandboxes that run the agent's code. `auto` chooses gVisor whenever it is registered with the engine (`python-code-sandbox setup --gvisor` registers it with a local Docker engine; `scripts/dev-env.sh` does too), except where it cannot provide what a setting needs: `SANDBOX_NETWORK=bridge|allowlist` runs under gVisor's networked entry (`runsc-net`: gVisor's own network stack, or host-network mode where runsc refuses it; `setup --gvisor` and `scripts/runsc.sh` register both entries and probe which mode works), and falls back to runc only where no gVisor entry has a network, as does a pids limit under `256`; `doctor` and the start-up log say which runtime runs the code and why. A name (`runc`, `runsc`) forces that runtime (`runsc` means gVisor: a networked policy takes its networked entry), and the server refuses to start sandboxes when it is not registered or cannot give the network asked for. Installers run under the code's runtime when it gives them a network, else gVisor's networked entry, else the engine's default. Under gVisor the pids limit bounds gVisor's own host threads, not the processes inside, so it must be at least `256`; a fork bomb then ends the sandbox (reported as lost) instead of stopping at the limit",
    read: Read::Value(|config, var, v| {
        if v == "auto" {
            config.runtime = None;
            return Ok(());
        }
        if !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ConfigError::new(
                var,
                v,
                "auto, or the name of a runtime registered with the engine, such as runc or runsc",
            ));
        }
        config.runtime = Some(v.to_string());
        Ok(())
    }),
};

pub const SANDBOX_CA_BUNDLE: Setting = Setting {
    name: "SANDBOX_CA_BUNDLE",
    default: Shown::Prose("the host's own: `SSL_CERT_FILE`, else the system bundle (`/etc/ssl/certs/ca-certificates.crt`, `/etc/pki/tls/certs/ca-bundle.crt`, …); none with a remote engine"),
    doc: "absolute path of a host CA bundle (PEM) trusted by every container that reaches a package index (the image build, flavours, installers) and mounted read-only into sandboxes that have a network, with `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `PIP_CERT` and `CURL_CA_BUNDLE` pointing at it; `none`: they trust only their own bundle",
    read: Read::Value(|config, var, v| {
        if v.eq_ignore_ascii_case("none") {
            config.ca_bundle = None;
            config.ca_bundle_source = super::CaBundleSource::Off;
            return Ok(());
        }
        let path = PathBuf::from(v);
        // On a remote engine the file is that machine's: the engine checks it at start-up.
        if !path.is_absolute() || !(config.remote_engine || path.is_file()) {
            return Err(ConfigError::new(
                var,
                v,
                "the absolute path of an existing CA bundle file on the host, or none",
            ));
        }
        config.ca_bundle = Some(path);
        config.ca_bundle_source = super::CaBundleSource::Setting;
        Ok(())
    }),
};

// Images, sessions and concurrency.

pub const SANDBOX_ALLOWED_IMAGES: Setting = Setting {
    name: "SANDBOX_ALLOWED_IMAGES",
    default: Shown::Prose("none"),
    doc: "comma-separated glob patterns (`*`, `?`) of other images an agent may ask for with `image`; anything else is refused with the list of what is allowed",
    read: Read::Value(|config, var, v| {
        let patterns: Vec<String> = v
            .split(',')
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        if !patterns.iter().all(|p| is_image_reference(p)) {
            return Err(ConfigError::new(
                var,
                v,
                "comma-separated image patterns such as python:3.12-slim,myorg/*",
            ));
        }
        config.allowed_images = patterns;
        Ok(())
    }),
};

pub const SANDBOX_MAX_SESSIONS: Setting = Setting {
    name: "SANDBOX_MAX_SESSIONS",
    default: Shown::Value("10"),
    doc: "live sessions at once; `sandbox_initialize` beyond it is refused",
    read: Read::Value(|config, var, v| {
        config.sessions.max_sessions = parse_count(var, v, 0, 10_000)?;
        Ok(())
    }),
};

pub const SANDBOX_SESSION_IDLE_TIMEOUT: Setting = Setting {
    name: "SANDBOX_SESSION_IDLE_TIMEOUT",
    default: Shown::Value("30m"),
    doc: "a session unused this long is stopped; later calls on it say it expired",
    read: Read::Value(|config, var, v| {
        config.sessions.idle_timeout = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_SESSION_MAX_LIFETIME: Setting = Setting {
    name: "SANDBOX_SESSION_MAX_LIFETIME",
    default: Shown::Value("8h"),
    doc: "a session is stopped this long after it started",
    read: Read::Value(|config, var, v| {
        config.sessions.max_lifetime = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_POOL_SIZE: Setting = Setting {
    name: "SANDBOX_POOL_SIZE",
    default: Shown::Value("2"),
    doc: "sandboxes of the default image kept started (runner up, Python initialised) by the server; a call that finds none waiting doubles the number kept, up to 32 and a quarter of `SANDBOX_POOL_MAX_MEMORY` (16 MiB each), back to this one a sandbox every 10 s after a minute without such a call; `0` disables the pool",
    read: Read::Value(|config, var, v| {
        config.pool_size = parse_count(var, v, 0, 64)?;
        Ok(())
    }),
};

pub const SANDBOX_MAX_SANDBOXES: Setting = Setting {
    name: "SANDBOX_MAX_SANDBOXES",
    default: Shown::Prose("computed from the engine's host"),
    doc: "sandboxes for the agent's code live at once (sessions, the pool, runs in progress, recycled ones); calls beyond it wait in turn, for their `SANDBOX_TIMEOUT` and at least 60 s (the limit is the code's; a start alone can take longer than a short one), then get an error naming the bound. By default the host's memory over the memory limit, or for a local engine its task headroom over a sandbox's pids limit and runtime, whichever is lower; CPUs bound the starts at once (`doctor` shows both)",
    read: Read::Value(|config, var, v| {
        config.max_sandboxes = match v.trim() {
            "" | "auto" => None,
            n => Some(parse_count(var, n, 1, 10_000)?),
        };
        Ok(())
    }),
};

pub const SANDBOX_RECYCLE: Setting = Setting {
    name: "SANDBOX_RECYCLE",
    default: Shown::Value("true"),
    doc: "a sandbox `run_python_ephemeral` used (default image, no dependencies, no network, its runner answered: a run stopped at its limit counts, one whose processes had to be killed or that ran out of memory does not) serves the same client's next run once its supervisor has killed every other process, emptied /workspace, /tmp and /dev/shm and started a new interpreter; `false`: a new sandbox for every run",
    read: Read::Value(|config, var, v| {
        config.recycle = parse_bool(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_PRELOAD: Setting = Setting {
    name: "SANDBOX_PRELOAD",
    default: Shown::Prose("none"),
    doc: "dependency sets the warm pool keeps sandboxes prepared for (the set mounted, its modules imported), besides the sets recent calls used: sets separated by `;`, requirements within a set by `,` (`matplotlib,numpy;pandas`); each is validated like `dependencies` and installed at start-up; an invalid one stops start-up",
    read: Read::Value(|config, var, v| {
        config.preload = parse_requirement_sets(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_POOL_MAX_MEMORY: Setting = Setting {
    name: "SANDBOX_POOL_MAX_MEMORY",
    default: Shown::Value("2g"),
    doc: "memory the warm pool's waiting sandboxes may use together, as the engine measures it; prepared sandboxes beyond it are not kept; at most the host's memory",
    read: Read::Value(|config, var, v| {
        config.pool_max_memory = parse_bytes(var, v, 64 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_MAX_CONCURRENT: Setting = Setting {
    name: "SANDBOX_MAX_CONCURRENT",
    default: Shown::Value("8"),
    doc: "executions (and sandbox start-ups) running at once; further calls wait",
    read: Read::Value(|config, var, v| {
        config.max_concurrent = parse_count(var, v, 1, 10_000)?;
        Ok(())
    }),
};

// Package search.

pub const SANDBOX_PYPI_URL: Setting = Setting {
    name: "SANDBOX_PYPI_URL",
    default: Shown::Value("https://pypi.org"),
    doc: "index used by `search_pypi_packages` (its JSON API and simple index)",
    read: Read::Value(|config, var, v| {
        if !(v.starts_with("https://") || v.starts_with("http://"))
            || v.contains(char::is_whitespace)
        {
            return Err(ConfigError::new(
                var,
                v,
                "an http(s) URL such as https://pypi.org",
            ));
        }
        config.pypi_url = v.trim_end_matches('/').to_string();
        Ok(())
    }),
};

pub const SANDBOX_PYPI_INDEX_TTL: Setting = Setting {
    name: "SANDBOX_PYPI_INDEX_TTL",
    default: Shown::Value("24h"),
    doc: "how long the downloaded list of PyPI project names is reused",
    read: Read::Value(|config, var, v| {
        config.pypi_index_ttl = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_CACHE_DIR: Setting = Setting {
    name: "SANDBOX_CACHE_DIR",
    default: Shown::Prose("`~/.cache/python-code-sandbox`"),
    doc: "where the server keeps that list",
    read: Read::Value(|config, var, v| {
        let path = PathBuf::from(v);
        if !path.is_absolute() {
            return Err(ConfigError::new(var, v, "an absolute directory path"));
        }
        config.cache_dir = path;
        Ok(())
    }),
};

// Files executions create.

pub const SANDBOX_FILES_DIR: Setting = Setting {
    name: "SANDBOX_FILES_DIR",
    default: Shown::Prose("`$XDG_STATE_HOME/python-code-sandbox/files`, else `~/.local/state/python-code-sandbox/files`, else (no `HOME`) `$TMPDIR/python-code-sandbox-<uid>/files`"),
    doc: "where files an execution creates or changes are saved, as `<dir>/<run-… or session-…>/<path>`; created 0700; start-up is refused (exit 2) when it is a link, not a directory, another uid's, writable by group or others, or below a directory another user could replace (see [Files](tools.md#files)); set to an empty string to save nothing",
    // Set but empty means "do not save files", unlike other variables.
    read: Read::EvenEmpty(|config, var, v| {
        config.files.persist_dir = if v.is_empty() {
            None
        } else if PathBuf::from(v).is_absolute() {
            Some(PathBuf::from(v))
        } else {
            return Err(ConfigError::new(
                var,
                v,
                "an absolute directory path, or empty to disable saving files",
            ));
        };
        Ok(())
    }),
};

pub const SANDBOX_FILES_MAX_AGE: Setting = Setting {
    name: "SANDBOX_FILES_MAX_AGE",
    default: Shown::Value("7d"),
    doc: "a saved run or session directory whose newest file is older than this is removed (in the background)",
    read: Read::Value(|config, var, v| {
        config.files.max_age = parse_duration(var, v)?;
        Ok(())
    }),
};

/// Must hold what one execution saves (`SANDBOX_FILES_MAX_TOTAL`), checked in `validate`.
pub const SANDBOX_FILES_MAX_BYTES: Setting = Setting {
    name: "SANDBOX_FILES_MAX_BYTES",
    default: Shown::Value("1g"),
    doc: "total size of the saved files; beyond it the oldest run and session directories are removed first; at least `SANDBOX_FILES_MAX_TOTAL`",
    read: Read::Value(|config, var, v| {
        config.files.max_saved_bytes = parse_bytes(var, v, 1)?;
        Ok(())
    }),
};

pub const SANDBOX_FILES_MAX_FILE: Setting = Setting {
    name: "SANDBOX_FILES_MAX_FILE",
    default: Shown::Value("100m"),
    doc: "largest file copied out of a sandbox (larger ones are listed, not copied)",
    read: Read::Value(|config, var, v| {
        config.files.max_file_bytes = parse_bytes(var, v, 1)?;
        Ok(())
    }),
};

pub const SANDBOX_FILES_MAX_TOTAL: Setting = Setting {
    name: "SANDBOX_FILES_MAX_TOTAL",
    default: Shown::Value("500m"),
    doc: "bytes copied out per execution",
    read: Read::Value(|config, var, v| {
        config.files.max_total_bytes = parse_bytes(var, v, 1)?;
        Ok(())
    }),
};

pub const SANDBOX_FILES_MAX_COUNT: Setting = Setting {
    name: "SANDBOX_FILES_MAX_COUNT",
    default: Shown::Value("100"),
    doc: "files copied out per execution",
    read: Read::Value(|config, var, v| {
        config.files.max_count = parse_count(var, v, 0, 10_000)?;
        Ok(())
    }),
};

// Snapshots of sessions.

pub const SANDBOX_SNAPSHOT_DIR: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_DIR",
    default: Shown::Prose("`$XDG_STATE_HOME/python-code-sandbox/snapshots`, else `~/.local/state/python-code-sandbox/snapshots`, else (no `HOME`) `$TMPDIR/python-code-sandbox-<uid>/snapshots`"),
    doc: "where session snapshots are kept (`<dir>/<owner>/<snapshot_id>.snap` and `.json`; the owner is the principal, the one shared token or the stdio client, not the MCP session); checked at start-up like `SANDBOX_FILES_DIR`; set to an empty string to turn snapshots off (and `sandbox_fork`, which goes through the store)",
    read: Read::EvenEmpty(|config, var, v| {
        config.snapshots.dir = if v.is_empty() {
            None
        } else if PathBuf::from(v).is_absolute() {
            Some(PathBuf::from(v))
        } else {
            return Err(ConfigError::new(
                var,
                v,
                "an absolute directory path, or empty to turn snapshots off",
            ));
        };
        Ok(())
    }),
};

pub const SANDBOX_SNAPSHOT_MAX_SIZE: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_MAX_SIZE",
    default: Shown::Value("1g"),
    doc: "largest snapshot (workspace and variables), checked while it is written",
    read: Read::Value(|config, var, v| {
        config.snapshots.max_size = parse_bytes(var, v, 1 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_SNAPSHOT_TTL: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_TTL",
    default: Shown::Value("7d"),
    doc:
        "a snapshot older than this is removed (checked by the running server, at least every 30 s)",
    read: Read::Value(|config, var, v| {
        config.snapshots.ttl = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_SNAPSHOT_MAX_COUNT: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_MAX_COUNT",
    default: Shown::Value("50"),
    doc: "snapshots kept per owner (a principal, the one shared token, or the stdio client); beyond it the owner's oldest is removed first",
    read: Read::Value(|config, var, v| {
        config.snapshots.max_count = parse_count(var, v, 1, 10_000)?;
        Ok(())
    }),
};

pub const SANDBOX_SNAPSHOT_MAX_TOTAL: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_MAX_TOTAL",
    default: Shown::Value("5g"),
    doc: "bytes of snapshots kept in the whole store, every owner's together; a new snapshot makes room by removing its owner's oldest, never another owner's, and is refused with an error naming this setting when even that would not make room; at least `SANDBOX_SNAPSHOT_MAX_SIZE`",
    read: Read::Value(|config, var, v| {
        config.snapshots.max_total = parse_bytes(var, v, 1 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_SNAPSHOT_ON_EXPIRY: Setting = Setting {
    name: "SANDBOX_SNAPSHOT_ON_EXPIRY",
    default: Shown::Value("true"),
    doc: "snapshot a session before it is stopped for being idle or at its maximum lifetime; the \"expired\" error names the snapshot",
    read: Read::Value(|config, var, v| {
        config.snapshots.on_expiry = parse_bool(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_RETURN_MAX_FILE: Setting = Setting {
    name: "SANDBOX_RETURN_MAX_FILE",
    default: Shown::Value("5m"),
    doc: "largest file returned to the client inline (larger ones are saved and listed)",
    read: Read::Value(|config, var, v| {
        config.files.return_max_file_bytes = parse_bytes(var, v, 1)?;
        Ok(())
    }),
};

pub const SANDBOX_RETURN_MAX_TOTAL: Setting = Setting {
    name: "SANDBOX_RETURN_MAX_TOTAL",
    default: Shown::Value("10m"),
    doc: "bytes returned inline per execution",
    read: Read::Value(|config, var, v| {
        config.files.return_max_total_bytes = parse_bytes(var, v, 1)?;
        Ok(())
    }),
};

pub const SANDBOX_RETURN_MAX_COUNT: Setting = Setting {
    name: "SANDBOX_RETURN_MAX_COUNT",
    default: Shown::Value("20"),
    doc: "files returned inline per execution",
    read: Read::Value(|config, var, v| {
        config.files.return_max_count = parse_count(var, v, 0, 1000)?;
        Ok(())
    }),
};

pub const SANDBOX_MOUNTS: Setting = Setting {
    name: "SANDBOX_MOUNTS",
    default: Shown::Prose("none"),
    doc: "host directories the operator mounts into every sandbox: comma-separated `HOST:CONTAINER[:ro|rw]`, read-only by default; the agent can never choose a host path",
    read: Read::Value(|config, var, v| {
        config.mounts = parse_mounts(var, v, !config.remote_engine)?;
        Ok(())
    }),
};

pub const SANDBOX_ROOTS: Setting = Setting {
    name: "SANDBOX_ROOTS",
    default: Shown::Value("off"),
    doc: "the client's MCP roots (the directories it opened or allowed) mounted into each new sandbox at `/mnt/roots/<name>`: `off`, `ro` (read-only) or `rw` (the code runs as the server's user, so what it writes there is that user's; refused when the server runs as root, under a rootless or user-namespaced engine, or with an engine on another machine). Over stdio the server asks the client for its roots; see docs/tools.md for what is refused",
    read: Read::Value(|config, var, v| {
        config.roots.mode = roots::parse_mode(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_ROOTS_ALLOW: Setting = Setting {
    name: "SANDBOX_ROOTS_ALLOW",
    default: Shown::Prose("the server's home directory (`HOME`)"),
    doc: "comma-separated absolute directories a root must be inside (never one of them itself); a root elsewhere is refused",
    read: Read::Value(|config, var, v| {
        config.roots.allow = roots::parse_allow(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_ROOTS_MAP: Setting = Setting {
    name: "SANDBOX_ROOTS_MAP",
    default: Shown::Prose("none"),
    doc: "over HTTP, roots are the client machine's paths: comma-separated `CLIENT_PATH=HOST_PATH` names the directory of this machine a client prefix stands for; without it HTTP clients' roots are refused. With principals (a tokens file or OAuth) every `HOST_PATH` must name `{principal}` (the principal's name; an OAuth principal's, which can hold anything, as its saved-files directory's name), so that each principal's paths map to its own directory, or a principal's tokens-file line gives its own (`roots_map=CLIENT_PATH=HOST_PATH`); a mapping shared by several principals is refused at start-up",
    read: Read::Value(|config, var, v| {
        config.roots.map = roots::parse_map(var, v)?;
        Ok(())
    }),
};

// Dependencies.

pub const SANDBOX_DEPS_VOLUME: Setting = Setting {
    name: "SANDBOX_DEPS_VOLUME",
    default: Shown::Value("python-code-sandbox-deps"),
    doc: "Docker volume holding installed dependency sets",
    read: Read::Value(|config, var, v| {
        if !is_volume_name(v) {
            return Err(ConfigError::new(
                var,
                v,
                "a Docker volume name: letters, digits, '_', '.', '-'",
            ));
        }
        config.deps.volume = v.to_string();
        Ok(())
    }),
};

pub const SANDBOX_DEPS_CACHE_MAX: Setting = Setting {
    name: "SANDBOX_DEPS_CACHE_MAX",
    default: Shown::Value("10g"),
    doc: "beyond this, least recently used sets are removed",
    read: Read::Value(|config, var, v| {
        config.deps.cache_max_bytes = parse_bytes(var, v, 1 << 20)?;
        Ok(())
    }),
};

pub const SANDBOX_DEPS_TIMEOUT: Setting = Setting {
    name: "SANDBOX_DEPS_TIMEOUT",
    default: Shown::Value("10m"),
    doc: "time limit of one install",
    read: Read::Value(|config, var, v| {
        config.deps.install_timeout = parse_duration(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_ALLOW_URL_DEPS: Setting = Setting {
    name: "SANDBOX_ALLOW_URL_DEPS",
    default: Shown::Value("false"),
    doc: "accept `name @ https://…` direct references",
    read: Read::Value(|config, var, v| {
        config.deps.allow_urls = parse_bool(var, v)?;
        Ok(())
    }),
};

pub const PIP_INDEX_URL: Setting = Setting {
    name: "PIP_INDEX_URL",
    default: Shown::Prose("PyPI"),
    doc: "the package index, given to the installer only; credentials in it (`user:pass@`, a query) are refused together with `SANDBOX_ALLOW_SOURCE_BUILDS`",
    read: Read::Value(|config, var, v| {
        config.deps.index_url = Some(parse_url(var, v)?);
        Ok(())
    }),
};

pub const PIP_EXTRA_INDEX_URL: Setting = Setting {
    name: "PIP_EXTRA_INDEX_URL",
    default: Shown::Prose("none"),
    doc: "more indexes, separated by spaces, given to the installer only; credentials in them are refused together with `SANDBOX_ALLOW_SOURCE_BUILDS`",
    read: Read::Value(|config, var, v| {
        config.deps.extra_index_urls = v
            .split_whitespace()
            .map(|url| parse_url(var, url))
            .collect::<Result<_, _>>()?;
        Ok(())
    }),
};

/// Refused with credential-bearing indexes, checked in `validate`.
pub const SANDBOX_ALLOW_SOURCE_BUILDS: Setting = Setting {
    name: "SANDBOX_ALLOW_SOURCE_BUILDS",
    default: Shown::Value("false"),
    doc: "`true`: build packages published only as source (their build code runs in the installer, which then gets no download cache); otherwise wheels only",
    read: Read::Value(|config, var, v| {
        config.deps.allow_source_builds = parse_bool(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_DEPS_EGRESS_ALLOW: Setting = Setting {
    name: "SANDBOX_DEPS_EGRESS_ALLOW",
    default: Shown::Prose("none"),
    doc: "comma-separated `host[:port]` (443 by default) the installer's proxy lets through besides the index hosts",
    read: Read::Value(|config, var, v| {
        config.deps.egress_allow = parse_hosts(var, v)?;
        Ok(())
    }),
};

pub const SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE: Setting = Setting {
    name: "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE",
    default: Shown::Prose("none"),
    doc: "comma-separated allowed hosts that may resolve to non-public addresses (a local index); others are refused after resolution",
    read: Read::Value(|config, var, v| {
        config.deps.egress_allow_private = parse_hosts(var, v)?
            .into_iter()
            .map(|(host, _)| host)
            .collect();
        Ok(())
    }),
};

pub const SANDBOX_DEPS_INSTALL_MAX: Setting = Setting {
    name: "SANDBOX_DEPS_INSTALL_MAX",
    default: Shown::Value("2g"),
    doc: "size of an installer's staging tmpfs (counts against its memory limit): a larger install fails",
    read: Read::Value(|config, var, v| {
        config.deps.install_max_bytes = parse_bytes(var, v, 16 << 20)?;
        Ok(())
    }),
};

pub const PIP_CACHE_PATH: Setting = Setting {
    name: "PIP_CACHE_PATH",
    default: Shown::Prose("a volume"),
    doc: "host directory for the installers' download cache (writable by uid 1000)",
    read: Read::Value(|config, var, v| {
        let path = PathBuf::from(v);
        if !path.is_absolute() {
            return Err(ConfigError::new(
                var,
                v,
                "an absolute host directory path (writable by uid 1000)",
            ));
        }
        // `ENABLE_PIP_CACHE=false` wins, whichever is read first.
        if config.deps.download_cache != DownloadCache::Off {
            config.deps.download_cache = DownloadCache::HostPath(path);
        }
        Ok(())
    }),
};

pub const ENABLE_PIP_CACHE: Setting = Setting {
    name: "ENABLE_PIP_CACHE",
    default: Shown::Value("true"),
    doc: "`false`: no download cache",
    read: Read::Value(|config, var, v| {
        if !parse_bool(var, v)? {
            config.deps.download_cache = DownloadCache::Off;
        }
        Ok(())
    }),
};

// Streamable HTTP (`serve --http`).

/// Not together with `SANDBOX_HTTP_TOKEN_FILE`, checked in `validate`.
pub const SANDBOX_HTTP_TOKEN: Setting = Setting {
    name: "SANDBOX_HTTP_TOKEN",
    default: Shown::Prose("unset"),
    doc: "`serve --http`: the bearer token every request must carry (`Authorization: Bearer …`, at least 16 characters, e.g. `openssl rand -hex 32`); required to listen on anything but loopback",
    read: Read::Value(|config, var, v| {
        config.http.token = Some(parse_token(var, v)?);
        Ok(())
    }),
};

pub const SANDBOX_HTTP_TOKEN_FILE: Setting = Setting {
    name: "SANDBOX_HTTP_TOKEN_FILE",
    default: Shown::Prose("unset"),
    doc: "a file holding that token instead (surrounding whitespace ignored); not both",
    read: Read::Value(|config, var, v| {
        let token = std::fs::read_to_string(v).map_err(|e| {
            ConfigError::new(var, v, "the path of a readable file holding the token").because(e)
        })?;
        config.http.token = Some(parse_token(var, token.trim())?);
        Ok(())
    }),
};

/// Not together with `SANDBOX_HTTP_TOKEN`/`SANDBOX_HTTP_TOKEN_FILE`, checked in `validate`; the
/// file's lines are checked when the server starts (`mcp::principals`).
pub const SANDBOX_HTTP_TOKENS_FILE: Setting = Setting {
    name: "SANDBOX_HTTP_TOKENS_FILE",
    default: Shown::Prose("unset"),
    doc: "`serve --http`: a file of principals, one per line: `NAME sha256:HASH [admin] [sessions=N] [executions=N] [cpu_seconds_per_day=N]` (`python-code-sandbox token NAME` prints a line and its new token); each caller is identified by its token and owns what it creates; reloaded on SIGHUP",
    read: Read::Value(|config, var, v| {
        let path = std::path::PathBuf::from(v);
        if !path.is_file() {
            return Err(ConfigError::new(
                var,
                v,
                "the path of a readable tokens file (make lines with `python-code-sandbox token NAME`)",
            ));
        }
        config.http.tokens_file = Some(path);
        Ok(())
    }),
};

pub const SANDBOX_QUOTA_CPU_SECONDS: Setting = Setting {
    name: "SANDBOX_QUOTA_CPU_SECONDS",
    default: Shown::Prose("unlimited"),
    doc: "`serve --http` with principals: CPU-seconds each principal's code may use per UTC day (charged as execution time × `SANDBOX_CPU_LIMIT`, measured on the host); a principal's own `cpu_seconds_per_day` overrides it. Live sessions and concurrent executions per principal default to `SANDBOX_MAX_SESSIONS` and `SANDBOX_MAX_CONCURRENT`",
    read: Read::Value(|config, var, v| {
        let seconds = v.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| {
            ConfigError::new(var, v, "a whole number of seconds, at least 1, such as 3600")
        })?;
        config.http.quota_cpu_seconds_per_day = Some(seconds);
        Ok(())
    }),
};

/// The three OAuth settings go together, checked in `validate`; the JWKS is loaded when the
/// server starts (`mcp::oauth`).
pub const SANDBOX_OAUTH_ISSUER: Setting = Setting {
    name: "SANDBOX_OAUTH_ISSUER",
    default: Shown::Prose("unset"),
    doc: "`serve --http`: the OAuth authorization server whose JWT access tokens are accepted (its issuer URL, exactly as the tokens' `iss`); needs `SANDBOX_OAUTH_JWKS` and `SANDBOX_HTTP_RESOURCE_URL`; a token needs the scope `sandbox:run` (`sandbox:admin`: an admin) and its caller is the principal `oauth:` + `sub`",
    read: Read::Value(|config, var, v| {
        config.http.oauth.issuer = Some(oauth_url(var, v, "https://auth.example.com")?);
        Ok(())
    }),
};

pub const SANDBOX_OAUTH_JWKS: Setting = Setting {
    name: "SANDBOX_OAUTH_JWKS",
    default: Shown::Prose("unset"),
    doc: "the issuer's signing keys: its `jwks_uri` (fetched at start, and again at most once a minute when a token names an unknown key) or the path of a JWKS file",
    read: Read::Value(|config, var, v| {
        let source = if v.starts_with("https://") || v.starts_with("http://") {
            JwksSource::Url(oauth_url(var, v, "https://auth.example.com/.well-known/jwks.json")?)
        } else {
            let path = PathBuf::from(v);
            if !path.is_absolute() || !path.is_file() {
                return Err(ConfigError::new(
                    var,
                    v,
                    "the issuer's jwks_uri (https://...) or the absolute path of a JWKS file",
                ));
            }
            JwksSource::File(path)
        };
        config.http.oauth.jwks = Some(source);
        Ok(())
    }),
};

pub const SANDBOX_HTTP_RESOURCE_URL: Setting = Setting {
    name: "SANDBOX_HTTP_RESOURCE_URL",
    default: Shown::Prose("unset"),
    doc: "with OAuth: this server's MCP endpoint as clients reach it, such as `https://sandbox.example.com/mcp`: the audience (`aud`) a token must name, and the `resource` of the metadata at `/.well-known/oauth-protected-resource`",
    read: Read::Value(|config, var, v| {
        let url = oauth_url(var, v, "https://sandbox.example.com/mcp")?;
        if url.contains('?') {
            return Err(ConfigError::new(
                var,
                v,
                "a URL without a query, such as https://sandbox.example.com/mcp",
            ));
        }
        config.http.oauth.resource_url = Some(url);
        Ok(())
    }),
};

/// A URL of the OAuth settings: https, or http to a loopback host (an issuer on this machine);
/// no credentials, no fragment.
fn oauth_url(var: &'static str, v: &str, example: &str) -> Result<String, ConfigError> {
    let refuse = || {
        ConfigError::new(
            var,
            v,
            format!(
                "an https URL such as {example} (http only to localhost or a loopback address), \
                 without credentials or a fragment"
            ),
        )
    };
    let url = parse_url(var, v).map_err(|_| refuse())?;
    let (scheme, rest) = url.split_once("://").ok_or_else(refuse)?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.contains('@') || url.contains('#') {
        return Err(refuse());
    }
    let (host, _) = parse_host(authority).ok_or_else(refuse)?;
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if scheme == "http" && !loopback {
        return Err(refuse());
    }
    Ok(url)
}

pub const SANDBOX_HTTP_ALLOWED_ORIGINS: Setting = Setting {
    name: "SANDBOX_HTTP_ALLOWED_ORIGINS",
    default: Shown::Prose("none"),
    doc: "comma-separated browser origins (`https://app.example.com`, `http://localhost:3000`) allowed to call `serve --http`; a request with any other `Origin` gets 403, one without `Origin` (a non-browser client) is allowed",
    read: Read::Value(|config, var, v| {
        config.http.allowed_origins = v
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(|o| {
                normalize_origin(o).ok_or_else(|| ConfigError::new(
                    var,
                    v,
                    "comma-separated origins such as https://app.example.com or http://localhost:3000 (scheme, host, optional port; no path)",
                ))
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_ALLOWED_HOSTS: Setting = Setting {
    name: "SANDBOX_HTTP_ALLOWED_HOSTS",
    default: Shown::Prose("`localhost`, `127.0.0.1`, `::1` and the bind address"),
    doc: "comma-separated `Host` headers accepted by `serve --http` (a name or address, optionally `:PORT`); replaces the default; anything else gets 403 (DNS-rebinding protection)",
    read: Read::Value(|config, var, v| {
        let hosts = v
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                parse_host(h).map(|(host, port)| HostPattern { host, port }).ok_or_else(|| ConfigError::new(
                    var,
                    v,
                    "comma-separated host names or addresses, each with an optional port, such as mcp.example.com,10.0.0.5:8080",
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if hosts.is_empty() {
            return Err(ConfigError::new(
                var,
                v,
                "at least one host name or address",
            ));
        }
        config.http.allowed_hosts = Some(hosts);
        Ok(())
    }),
};

pub const SANDBOX_HTTP_MAX_BODY: Setting = Setting {
    name: "SANDBOX_HTTP_MAX_BODY",
    default: Shown::Value("12m"),
    doc: "largest request body `serve --http` accepts (413 beyond); 4 MiB more than the largest code, and the bound on `sandbox_write_file` content over HTTP",
    read: Read::Value(|config, var, v| {
        let bytes = parse_bytes(var, v, 64 << 10)?;
        if bytes > 1 << 30 {
            return Err(ConfigError::new(
                var,
                v,
                "a size from 64k to 1g, such as 12m",
            ));
        }
        config.http.max_body_bytes = bytes;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_HEADER_TIMEOUT: Setting = Setting {
    name: "SANDBOX_HTTP_HEADER_TIMEOUT",
    default: Shown::Value("10s"),
    doc: "time a connection gets to send a complete request head, from opening or from its previous response (1s to 10m); then it is closed",
    read: Read::Value(|config, var, v| {
        config.http.header_timeout = parse_duration_within(
            var,
            v,
            Duration::from_secs(1)..=Duration::from_secs(600),
            "a duration from 1s to 10m, such as 10s",
        )?;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_IDLE_TIMEOUT: Setting = Setting {
    name: "SANDBOX_HTTP_IDLE_TIMEOUT",
    default: Shown::Value("2m"),
    doc: "a connection on which no byte moves for this long is closed (30s to 24h: longer than the 15 s SSE ping)",
    read: Read::Value(|config, var, v| {
        config.http.idle_timeout = parse_duration_within(
            var,
            v,
            SSE_PING_INTERVAL * 2..=Duration::from_secs(24 * 3600),
            "a duration from 30s (twice the SSE ping interval) to 24h, such as 2m",
        )?;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_MAX_CONNECTIONS: Setting = Setting {
    name: "SANDBOX_HTTP_MAX_CONNECTIONS",
    default: Shown::Value("256"),
    doc:
        "connections `serve --http` serves at once (1 to 100000); further ones wait to be accepted",
    read: Read::Value(|config, var, v| {
        config.http.max_connections = parse_count(var, v, 1, 100_000)?;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_MAX_MCP_SESSIONS: Setting = Setting {
    name: "SANDBOX_HTTP_MAX_MCP_SESSIONS",
    default: Shown::Value("64"),
    doc:
        "MCP sessions alive at once over HTTP (1 to 100000); a new `initialize` beyond it gets 429",
    read: Read::Value(|config, var, v| {
        config.http.max_mcp_sessions = parse_count(var, v, 1, 100_000)?;
        Ok(())
    }),
};

pub const SANDBOX_HTTP_MCP_IDLE_TIMEOUT: Setting = Setting {
    name: "SANDBOX_HTTP_MCP_IDLE_TIMEOUT",
    default: Shown::Value("5m"),
    doc: "an MCP session owning no sandbox session, with no call in progress, ends after this long without a request (1s to 24h)",
    read: Read::Value(|config, var, v| {
        config.http.mcp_idle_timeout = parse_duration_within(
            var,
            v,
            Duration::from_secs(1)..=Duration::from_secs(24 * 3600),
            "a duration from 1s to 24h, such as 5m",
        )?;
        Ok(())
    }),
};

pub const SANDBOX_DRAIN_TIMEOUT: Setting = Setting {
    name: "SANDBOX_DRAIN_TIMEOUT",
    default: Shown::Value("30s"),
    doc: "`serve --http`: on SIGTERM, `/readyz` fails at once, requests that would open a new MCP session get 503, and the tool calls in progress get this long to finish before every MCP session ends (0s to 1h)",
    read: Read::Value(|config, var, v| {
        config.http.drain_timeout = parse_duration_within(
            var,
            v,
            Duration::ZERO..=Duration::from_secs(3600),
            "a duration from 0s to 1h, such as 30s",
        )?;
        Ok(())
    }),
};

pub const SANDBOX_METRICS_ADDR: Setting = Setting {
    name: "SANDBOX_METRICS_ADDR",
    default: Shown::Prose("unset: `/metrics` on the MCP port, behind its authentication"),
    doc: "`serve --http`: serve the Prometheus metrics at `http://ADDR/metrics` (IP:PORT) instead, **without authentication**: bind a loopback or otherwise private address",
    read: Read::Value(|config, var, v| {
        let addr = match v.strip_prefix("localhost:") {
            Some(port) => port
                .parse::<u16>()
                .ok()
                .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port))),
            None => v.parse::<std::net::SocketAddr>().ok(),
        };
        config.http.metrics_addr = Some(addr.ok_or_else(|| {
            ConfigError::new(var, v, "IP:PORT, such as 127.0.0.1:9090 or [::1]:9090")
        })?);
        Ok(())
    }),
};

// The process itself.

pub const LOG_LEVEL: Setting = Setting {
    name: "LOG_LEVEL",
    default: Shown::Prose("`info` (`run`: `warn`)"),
    doc: "log filter (`debug`, `python_code_sandbox=trace`, ...); logs go to stderr only",
    read: Read::Value(|config, var, v| {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(v) {
            return Err(ConfigError::new(
                var,
                v,
                "a log level (error, warn, info, debug, trace) or a tracing filter",
            )
            .because(e));
        }
        config.log_level = Some(v.to_string());
        Ok(())
    }),
};

pub const LOG_FORMAT: Setting = Setting {
    name: "LOG_FORMAT",
    default: Shown::Value("text"),
    doc: "`text`, or `json`: one JSON object per log line (the audit lines of tool calls, target `audit`, too)",
    read: Read::Value(|config, var, v| {
        config.log_json = match v {
            "text" => false,
            "json" => true,
            _ => return Err(ConfigError::new(var, v, "text or json")),
        };
        Ok(())
    }),
};

/// An engine address on another machine (`tcp://`, `http(s)://`, `ssh://`): host paths in
/// settings then name that machine's files.
pub fn is_remote_endpoint(endpoint: &str) -> bool {
    !(endpoint.starts_with("unix://") || endpoint.starts_with("npipe://"))
}

pub const DOCKER_HOST: Setting = Setting {
    name: "DOCKER_HOST",
    default: Shown::Prose("the local socket `unix:///var/run/docker.sock`"),
    doc: "the engine, as the Docker CLI reads it: `unix:///PATH` (Docker's socket, or Podman's `unix:///run/podman/podman.sock`), `tcp://HOST:2376` (mutual TLS with `DOCKER_TLS_VERIFY`), or `ssh://USER@HOST` (the `ssh` command on `PATH`, with its own configuration, runs `docker system dial-stdio` on that host). With an engine on another machine, host paths in `SANDBOX_MOUNTS`, `PIP_CACHE_PATH` and `SANDBOX_CA_BUNDLE` name files on that machine (checked at start-up), while `SANDBOX_FILES_DIR` and `SANDBOX_SNAPSHOT_DIR` stay on the server's",
    read: Read::Value(|_config, var, v| {
        let known = ["unix://", "tcp://", "http://", "https://", "ssh://"];
        if !known.iter().any(|scheme| v.starts_with(scheme)) {
            return Err(ConfigError::new(
                var,
                v,
                "unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST",
            ));
        }
        Ok(())
    }),
};

pub const DOCKER_TLS_VERIFY: Setting = Setting {
    name: "DOCKER_TLS_VERIFY",
    default: Shown::Prose("unset"),
    doc: "with a `tcp://` `DOCKER_HOST`: speak TLS, verify the engine's certificate against `ca.pem` and present `cert.pem`/`key.pem` from `DOCKER_CERT_PATH` (mutual TLS, as the Docker CLI does); start-up fails when one of those files is missing",
    read: Read::Elsewhere("the Docker client library (bollard), as the Docker CLI reads it"),
};

pub const DOCKER_CERT_PATH: Setting = Setting {
    name: "DOCKER_CERT_PATH",
    default: Shown::Prose("`~/.docker`"),
    doc: "directory of `ca.pem`, `cert.pem` and `key.pem` for `DOCKER_TLS_VERIFY`",
    read: Read::Elsewhere("the Docker client library (bollard), as the Docker CLI reads it"),
};

pub const DEBOOTSTRAP_MIRROR: Setting = Setting {
    name: "DEBOOTSTRAP_MIRROR",
    default: Shown::Prose("Debian's default"),
    doc: "mirror for the offline image build",
    read: Read::Elsewhere(
        "`image build --offline` (engine::docker::image), when it runs debootstrap",
    ),
};

/// Every setting, in the order `from_lookup` reads them and docs/configuration.md lists them.
pub const SETTINGS: &[Setting] = &[
    SANDBOX_IMAGE,
    SANDBOX_MEMORY_LIMIT,
    SANDBOX_CPU_LIMIT,
    SANDBOX_PIDS_LIMIT,
    SANDBOX_TMP_SIZE,
    SANDBOX_WORKSPACE_SIZE,
    SANDBOX_TIMEOUT,
    SANDBOX_MAX_OUTPUT,
    SANDBOX_MODEL_OUTPUT,
    SANDBOX_NETWORK,
    SANDBOX_EGRESS_ALLOW,
    SANDBOX_EGRESS_ASK,
    SANDBOX_EGRESS_ALLOW_ALL,
    SANDBOX_EGRESS_RESOLVE,
    SANDBOX_EGRESS_UPLINK,
    SANDBOX_EGRESS_SUBNETS,
    SANDBOX_SECRETS_FILE,
    SANDBOX_RUNTIME,
    SANDBOX_CA_BUNDLE,
    SANDBOX_ALLOWED_IMAGES,
    SANDBOX_MAX_SESSIONS,
    SANDBOX_SESSION_IDLE_TIMEOUT,
    SANDBOX_SESSION_MAX_LIFETIME,
    SANDBOX_POOL_SIZE,
    SANDBOX_MAX_SANDBOXES,
    SANDBOX_RECYCLE,
    SANDBOX_PRELOAD,
    SANDBOX_POOL_MAX_MEMORY,
    SANDBOX_MAX_CONCURRENT,
    SANDBOX_PYPI_URL,
    SANDBOX_PYPI_INDEX_TTL,
    SANDBOX_CACHE_DIR,
    SANDBOX_FILES_DIR,
    SANDBOX_FILES_MAX_AGE,
    SANDBOX_FILES_MAX_BYTES,
    SANDBOX_FILES_MAX_FILE,
    SANDBOX_FILES_MAX_TOTAL,
    SANDBOX_FILES_MAX_COUNT,
    SANDBOX_SNAPSHOT_DIR,
    SANDBOX_SNAPSHOT_MAX_SIZE,
    SANDBOX_SNAPSHOT_TTL,
    SANDBOX_SNAPSHOT_MAX_COUNT,
    SANDBOX_SNAPSHOT_MAX_TOTAL,
    SANDBOX_SNAPSHOT_ON_EXPIRY,
    SANDBOX_RETURN_MAX_FILE,
    SANDBOX_RETURN_MAX_TOTAL,
    SANDBOX_RETURN_MAX_COUNT,
    SANDBOX_MOUNTS,
    SANDBOX_ROOTS,
    SANDBOX_ROOTS_ALLOW,
    SANDBOX_ROOTS_MAP,
    SANDBOX_DEPS_VOLUME,
    SANDBOX_DEPS_CACHE_MAX,
    SANDBOX_DEPS_TIMEOUT,
    SANDBOX_ALLOW_URL_DEPS,
    PIP_INDEX_URL,
    PIP_EXTRA_INDEX_URL,
    SANDBOX_ALLOW_SOURCE_BUILDS,
    SANDBOX_DEPS_EGRESS_ALLOW,
    SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE,
    SANDBOX_DEPS_INSTALL_MAX,
    PIP_CACHE_PATH,
    ENABLE_PIP_CACHE,
    SANDBOX_HTTP_TOKEN,
    SANDBOX_HTTP_TOKEN_FILE,
    SANDBOX_HTTP_TOKENS_FILE,
    SANDBOX_QUOTA_CPU_SECONDS,
    SANDBOX_OAUTH_ISSUER,
    SANDBOX_OAUTH_JWKS,
    SANDBOX_HTTP_RESOURCE_URL,
    SANDBOX_HTTP_ALLOWED_ORIGINS,
    SANDBOX_HTTP_ALLOWED_HOSTS,
    SANDBOX_HTTP_MAX_BODY,
    SANDBOX_HTTP_HEADER_TIMEOUT,
    SANDBOX_HTTP_IDLE_TIMEOUT,
    SANDBOX_HTTP_MAX_CONNECTIONS,
    SANDBOX_HTTP_MAX_MCP_SESSIONS,
    SANDBOX_HTTP_MCP_IDLE_TIMEOUT,
    SANDBOX_DRAIN_TIMEOUT,
    SANDBOX_METRICS_ADDR,
    LOG_LEVEL,
    LOG_FORMAT,
    DOCKER_HOST,
    DOCKER_TLS_VERIFY,
    DOCKER_CERT_PATH,
    DEBOOTSTRAP_MIRROR,
];

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

    use super::*;

    /// The configuration reference: its Settings table documents every setting.
    const CONFIGURATION_DOC: &str = include_str!("../../docs/configuration.md");

    /// How the Settings table of docs/configuration.md differs from [`SETTINGS`]: a setting
    /// without its row, a row that differs from the one the table renders, a row naming no
    /// setting, rows out of order. Empty when they agree.
    fn table_differences(doc: &str) -> Vec<String> {
        let Some(section) = doc
            .split("\n## Settings\n")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
        else {
            return vec!["docs/configuration.md has no Settings section".to_string()];
        };
        let mut differences = Vec::new();
        if !section.contains("\n| variable | default | meaning |\n") {
            differences.push(
                "the Settings section has no `| variable | default | meaning |` table".to_string(),
            );
        }
        let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
        let by_name: HashMap<String, &str> = rows.iter().map(|row| (row_name(row), *row)).collect();
        for setting in SETTINGS {
            let expected = setting.markdown_row();
            match by_name.get(setting.name) {
                None => {
                    differences.push(format!("no row for {}; expected\n{expected}", setting.name))
                }
                Some(row) if *row != expected => differences.push(format!(
                    "the row for {} differs\n doc:   {row}\n table: {expected}",
                    setting.name
                )),
                Some(_) => {}
            }
        }
        let known: HashSet<&str> = SETTINGS.iter().map(|s| s.name).collect();
        for row in &rows {
            if !known.contains(row_name(row).as_str()) {
                differences.push(format!("a row names no setting: {row}"));
            }
        }
        let order: Vec<String> = rows.iter().map(|row| row_name(row)).collect();
        let expected_order: Vec<String> = SETTINGS.iter().map(|s| s.name.to_string()).collect();
        if differences.is_empty() && order != expected_order {
            differences.push("the rows are not in the order of SETTINGS".to_string());
        }
        differences
    }

    /// The variable a table row documents: its first cell, `| `NAME` | ...`.
    fn row_name(row: &str) -> String {
        row.strip_prefix("| `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn the_configuration_doc_documents_every_setting_as_defined() {
        let differences = table_differences(CONFIGURATION_DOC);
        let table: Vec<String> = SETTINGS.iter().map(Setting::markdown_row).collect();
        assert!(
            differences.is_empty(),
            "docs/configuration.md's Settings table disagrees with config::SETTINGS:\n{}\n\nThe table as SETTINGS renders it:\n{}",
            differences.join("\n"),
            table.join("\n")
        );
    }

    #[test]
    fn the_table_check_catches_a_missing_extra_or_changed_row() {
        let doc = CONFIGURATION_DOC;
        let row = SANDBOX_TIMEOUT.markdown_row();
        assert!(doc.contains(&row));
        let missing = doc.replace(&format!("{row}\n"), "");
        assert!(table_differences(&missing)
            .iter()
            .any(|d| d.contains("no row for SANDBOX_TIMEOUT")));

        let extra = doc.replace(
            &format!("{row}\n"),
            &format!("{row}\n| `SANDBOX_TIMEOUT_TYPO` | `1s` | nothing |\n"),
        );
        assert!(table_differences(&extra)
            .iter()
            .any(|d| d.contains("SANDBOX_TIMEOUT_TYPO")));

        let changed = doc.replace(&row, &row.replace("`60s`", "`90s`"));
        assert!(table_differences(&changed)
            .iter()
            .any(|d| d.contains("the row for SANDBOX_TIMEOUT differs")));

        let next = SANDBOX_MAX_OUTPUT.markdown_row();
        let swapped = doc.replace(&format!("{row}\n{next}\n"), &format!("{next}\n{row}\n"));
        assert_ne!(swapped, doc);
        assert_eq!(
            table_differences(&swapped),
            vec!["the rows are not in the order of SETTINGS"]
        );

        let elsewhere = doc.replace("\n## Settings\n", "\n## Variables\n");
        assert_eq!(
            table_differences(&elsewhere),
            vec!["docs/configuration.md has no Settings section"]
        );
    }

    #[test]
    fn each_setting_is_defined_once() {
        let mut names = HashSet::new();
        for setting in SETTINGS {
            assert!(
                names.insert(setting.name),
                "{} is defined twice",
                setting.name
            );
            assert!(!setting.doc.is_empty(), "{} has no doc", setting.name);
        }
    }

    /// A default shown as a value is the default used: setting it changes nothing.
    #[test]
    fn the_defaults_shown_are_the_defaults_used() {
        let nothing = Config::from_lookup(|_| None).expect("the defaults are valid");
        for setting in SETTINGS {
            let Shown::Value(shown) = setting.default else {
                continue;
            };
            let given =
                Config::from_lookup(|name| (name == setting.name).then(|| shown.to_string()))
                    .unwrap_or_else(|e| panic!("{}'s default is refused: {e}", setting.name));
            assert_eq!(
                given, nothing,
                "{}={shown} is not the default",
                setting.name
            );
        }
    }

    #[test]
    fn settings_read_elsewhere_are_not_read_into_the_config() {
        let everything_set = Config::from_lookup(|name| {
            [
                DOCKER_TLS_VERIFY.name,
                DOCKER_CERT_PATH.name,
                DEBOOTSTRAP_MIRROR.name,
            ]
            .contains(&name)
            .then(|| "/elsewhere".to_string())
        })
        .expect("values read elsewhere are not checked here");
        assert_eq!(everything_set, Config::from_lookup(|_| None).unwrap());
    }

    #[test]
    fn the_oauth_settings_go_together_with_urls_that_are_safe() {
        let dir = std::env::temp_dir().join(format!("pcs-oauth-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, r#"{"keys": []}"#).expect("written");
        let jwks = jwks.display().to_string();
        let config = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::from_lookup(move |name| vars.get(name).cloned())
        };
        let issuer = (SANDBOX_OAUTH_ISSUER.name, "https://auth.example.com");
        let resource = (
            SANDBOX_HTTP_RESOURCE_URL.name,
            "https://sandbox.example.com/mcp",
        );
        let file = (SANDBOX_OAUTH_JWKS.name, jwks.as_str());
        let all = config(&[issuer, resource, file]).expect("all three");
        assert!(all.http.oauth.enabled());
        assert_eq!(
            all.http.oauth.jwks,
            Some(JwksSource::File(jwks.clone().into()))
        );
        let url = (SANDBOX_OAUTH_JWKS.name, "https://auth.example.com/jwks");
        assert_eq!(
            config(&[issuer, resource, url])
                .expect("a URL")
                .http
                .oauth
                .jwks,
            Some(JwksSource::Url("https://auth.example.com/jwks".into()))
        );
        // A local issuer may speak http; nothing else may.
        let local = config(&[
            (SANDBOX_OAUTH_ISSUER.name, "http://127.0.0.1:9000"),
            (SANDBOX_OAUTH_JWKS.name, "http://localhost:9000/jwks"),
            (SANDBOX_HTTP_RESOURCE_URL.name, "http://127.0.0.1:8080/mcp"),
        ]);
        assert!(local.is_ok(), "{local:?}");

        for (vars, var, expected) in [
            (
                vec![issuer, resource],
                SANDBOX_OAUTH_ISSUER.name,
                "SANDBOX_OAUTH_JWKS",
            ),
            (
                vec![file, resource],
                SANDBOX_OAUTH_JWKS.name,
                "SANDBOX_OAUTH_ISSUER",
            ),
            (
                vec![issuer, file],
                SANDBOX_OAUTH_ISSUER.name,
                "SANDBOX_HTTP_RESOURCE_URL",
            ),
            (
                vec![resource],
                SANDBOX_HTTP_RESOURCE_URL.name,
                "SANDBOX_OAUTH_ISSUER",
            ),
            (
                vec![issuer, resource, (SANDBOX_OAUTH_JWKS.name, "jwks.json")],
                SANDBOX_OAUTH_JWKS.name,
                "absolute path",
            ),
            (
                vec![
                    issuer,
                    resource,
                    (SANDBOX_OAUTH_JWKS.name, "http://auth.example.com/jwks"),
                ],
                SANDBOX_OAUTH_JWKS.name,
                "https URL",
            ),
            (
                vec![
                    (SANDBOX_OAUTH_ISSUER.name, "http://auth.example.com"),
                    resource,
                    file,
                ],
                SANDBOX_OAUTH_ISSUER.name,
                "https URL",
            ),
            (
                vec![
                    issuer,
                    file,
                    (SANDBOX_HTTP_RESOURCE_URL.name, "https://u:p@h.example/mcp"),
                ],
                SANDBOX_HTTP_RESOURCE_URL.name,
                "without credentials",
            ),
            (
                vec![
                    issuer,
                    file,
                    (SANDBOX_HTTP_RESOURCE_URL.name, "https://h.example/mcp#x"),
                ],
                SANDBOX_HTTP_RESOURCE_URL.name,
                "fragment",
            ),
            (
                vec![
                    issuer,
                    resource,
                    file,
                    (SANDBOX_HTTP_TOKEN.name, "0123456789abcdef0123"),
                ],
                SANDBOX_HTTP_TOKEN.name,
                "OAuth callers are principals",
            ),
        ] {
            let error = config(&vars).expect_err("refused");
            assert_eq!(error.var, var, "{vars:?}: {error}");
            assert!(error.to_string().contains(expected), "{vars:?}: {error}");
            assert!(
                !error.to_string().contains("0123456789abcdef0123"),
                "{error}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_remote_engine_checks_its_own_host_paths_and_its_tls_files() {
        let config = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::from_lookup(move |name| vars.get(name).cloned())
        };
        let absent = "/nonexistent/pcs-ca.pem";
        // Local: the CA bundle and mounts must exist here.
        assert!(config(&[(SANDBOX_CA_BUNDLE.name, absent)]).is_err());
        // Remote: they are the engine's machine's, checked by the engine.
        let remote = config(&[
            (DOCKER_HOST.name, "ssh://sandbox@engine.test"),
            (SANDBOX_CA_BUNDLE.name, absent),
            (SANDBOX_MOUNTS.name, "/nonexistent/data:/data"),
        ])
        .expect("remote paths are not checked here");
        assert!(remote.remote_engine);
        assert_eq!(remote.mounts.len(), 1);
        assert!(
            !config(&[(DOCKER_HOST.name, "unix:///run/podman/podman.sock")])
                .expect("a socket")
                .remote_engine
        );

        let wrong = config(&[(DOCKER_HOST.name, "docker.example:2376")]).expect_err("no scheme");
        assert_eq!(wrong.var, DOCKER_HOST.name);

        // Mutual TLS without its files stops start-up, naming where they were looked for.
        let dir = std::env::temp_dir().join(format!("pcs-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let dir_text = dir.display().to_string();
        let tls = [
            (DOCKER_HOST.name, "tcp://engine.test:2376"),
            (DOCKER_TLS_VERIFY.name, "1"),
            (DOCKER_CERT_PATH.name, dir_text.as_str()),
        ];
        let missing = config(&tls).expect_err("no certificates");
        assert_eq!(missing.var, DOCKER_CERT_PATH.name);
        for file in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::write(dir.join(file), "pem").expect("written");
        }
        assert!(config(&tls).expect("the three files").remote_engine);
        // Without DOCKER_CERT_PATH, DOCKER_CONFIG is where they are (as the client library reads).
        let via_config = [
            (DOCKER_HOST.name, "tcp://engine.test:2376"),
            (DOCKER_TLS_VERIFY.name, "1"),
            ("DOCKER_CONFIG", dir_text.as_str()),
            ("HOME", "/nonexistent"),
        ];
        assert!(
            config(&via_config)
                .expect("found in DOCKER_CONFIG")
                .remote_engine
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(config(&via_config).is_err());
    }

    // Every environment variable the program reads is documented in docs/configuration.md: a
    // setting by its row of the Settings table, a variable of the user's environment by a mention
    // in "Other environment variables". The scan reads the crate's source (Rust, and the Python
    // that runs in sandboxes); its patterns are written in pieces (`concat!`) so that this module
    // does not find itself.

    /// Variables the scan finds that users never set, with the reason.
    const NOT_FOR_USERS: &[(&str, &str)] = &[
        (
            "CARGO_MANIFEST_DIR",
            "Cargo's, at compile time: where tests find the crate's files",
        ),
        (
            "CARGO_PKG_NAME",
            "Cargo's, at compile time: the name the MCP server reports",
        ),
        (
            "CARGO_PKG_VERSION",
            "Cargo's, at compile time: the version the server reports",
        ),
        (
            "PCS_INSTALLER_ARGUMENTS",
            "set by the server in its installer sandbox, for the project's script there",
        ),
        (
            "PCS_ROOTS_WRITABLE",
            "set by the server in a code sandbox with writable roots, read by the runner there",
        ),
        (
            "PCS_MAINTENANCE_OPERATION",
            "set by the server in its cache maintenance sandbox, for the project's script there",
        ),
        (
            "MPLCONFIGDIR",
            "set by the server in every sandbox, read by the runner there",
        ),
        (
            "MPLBACKEND",
            "matplotlib's own, set (or not) by the code in its sandbox, read again by the runner \
             there as matplotlib's import reads it",
        ),
        (
            "PCS_IPYTHON",
            "set by the server in every code sandbox: the runner's IPython set, read by the runner",
        ),
        (
            "PCS_TEST_IPYTHON",
            "tests only: the runner's IPython for the fake backend's host runner (scripts/test.sh)",
        ),
        (
            "IPYTHONDIR",
            "set by the runner in the sandbox, for IPython's profile under /tmp",
        ),
    ];

    /// Calls that read the variable their first argument names.
    const NAMED_READS: &[&str] = &[
        concat!("env::", "var("),
        concat!("env::", "var_os("),
        concat!("dotenvy::", "var("),
        // `Env`'s lookup in `validate`: `(env.0)("HOME")`.
        concat!(".0)", "("),
        // Compile time; also matches `option_env!(`.
        concat!("env", "!("),
        // Python, in the sandboxes.
        concat!("environ.get", "("),
        concat!("environ.pop", "("),
        concat!("environ.setdefault", "("),
        concat!("environ", "["),
        concat!("getenv", "("),
    ];

    /// Calls whose library reads variables itself.
    const LIBRARY_READS: &[(&str, &[&str])] = &[
        (
            concat!("Docker::", "connect_with_defaults"),
            &[
                "DOCKER_HOST",
                "DOCKER_TLS_VERIFY",
                "DOCKER_CERT_PATH",
                "DOCKER_CONFIG",
            ],
        ),
        (
            concat!("reqwest::Client::", "builder"),
            &[
                "HTTPS_PROXY",
                "HTTP_PROXY",
                "ALL_PROXY",
                "NO_PROXY",
                "SSL_CERT_FILE",
                "SSL_CERT_DIR",
            ],
        ),
        (concat!("env::", "temp_dir"), &["TMPDIR"]),
    ];

    /// The variables a read names when its argument is no literal.
    enum Names {
        /// The names of [`SETTINGS`], which the scan takes from their definitions.
        OfSettings,
        /// These, each of which the file must write as a literal (`"NAME"`).
        These(&'static [&'static str]),
        /// The variables a secrets file's `value_env` names: the operator's own, documented
        /// with the file ("Secrets brokered at the egress").
        OfSecretsFiles,
    }

    /// Reads whose variable is not a literal: (file under `src/`, argument, what it names).
    const NAMED_ELSEWHERE: &[(&str, &str, Names)] = &[
        // Config::from_env: the lookup `from_lookup` calls with each setting's name.
        ("config/mod.rs", "name", Names::OfSettings),
        // Setting::read_process_env.
        ("config/settings.rs", "self.name", Names::OfSettings),
        // Env::raw, through the lookup `from_lookup` was given.
        ("config/settings.rs", "setting.name", Names::OfSettings),
        // `setup`: where the MCP clients keep their configuration files.
        (
            "cli/client_config.rs",
            "name",
            Names::These(&["HOME", "XDG_CONFIG_HOME", "APPDATA"]),
        ),
        // `setup`: what locates the engine, passed on in the client's configuration.
        (
            "cli/setup.rs",
            "name",
            Names::These(&["DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"]),
        ),
        // A principal's `secrets=` file: its `value_env` variables (`secrets::server_env`).
        ("config/secrets/mod.rs", "name", Names::OfSecretsFiles),
    ];

    /// What a scan found: each variable with the files that read it, and the reads whose
    /// variable is no literal.
    #[derive(Default)]
    struct Reads {
        names: BTreeMap<String, BTreeSet<String>>,
        dynamic: BTreeSet<(String, String)>,
    }

    impl Reads {
        fn add(&mut self, name: &str, file: &str) {
            self.names
                .entry(name.to_string())
                .or_default()
                .insert(file.to_string());
        }
    }

    /// The string literal at the start of `rest` (after blanks), if it is one.
    fn literal(rest: &str) -> Option<&str> {
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
        let body = &rest[1..];
        body.find(quote).map(|end| &body[..end])
    }

    /// The argument at the start of `rest`, up to the bracket that closes it.
    fn argument(rest: &str) -> &str {
        let end = rest.find([')', ']', ',']).unwrap_or(rest.len());
        rest[..end].trim()
    }

    fn is_variable_name(name: &str) -> bool {
        name.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    /// Adds the variables one source file reads to `reads`; `file` is its path under `src/`.
    fn scan(file: &str, text: &str, reads: &mut Reads) {
        let comment = if file.ends_with(".py") { "#" } else { "//" };
        let lines: Vec<&str> = text.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with(comment) {
                continue;
            }
            for pattern in NAMED_READS {
                for (at, _) in line.match_indices(pattern) {
                    let rest = &line[at + pattern.len()..];
                    match literal(rest) {
                        Some(name) if is_variable_name(name) => reads.add(name, file),
                        _ => {
                            reads
                                .dynamic
                                .insert((file.to_string(), argument(rest).to_string()));
                        }
                    }
                }
            }
            for (call, names) in LIBRARY_READS {
                if line.contains(call) {
                    for name in *names {
                        reads.add(name, file);
                    }
                }
            }
            // A program named without a path is looked up in PATH.
            for (at, pattern) in line.match_indices(concat!("Command::", "new(")) {
                if literal(&line[at + pattern.len()..]).is_some_and(|p| !p.contains('/')) {
                    reads.add("PATH", file);
                }
            }
            // A setting's definition: the `name` of a `Setting { ... }`.
            if line.contains(concat!("Setting", " {")) {
                let name = lines[index + 1..]
                    .iter()
                    .take(3)
                    .find_map(|l| l.trim().strip_prefix("name:").and_then(literal));
                if let Some(name) = name.filter(|n| is_variable_name(n)) {
                    reads.add(name, file);
                }
            }
        }
    }

    /// Every variable the crate's source reads (`src/`, Rust and Python).
    fn scan_sources() -> Reads {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
        let mut reads = Reads::default();
        let mut folders = vec![root.to_path_buf()];
        while let Some(folder) = folders.pop() {
            let entries = std::fs::read_dir(&folder).expect("the source folder is readable");
            for entry in entries {
                let path = entry.expect("a source folder entry").path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
                    let text = std::fs::read_to_string(&path).expect("a source file is UTF-8");
                    let file = path
                        .strip_prefix(root)
                        .expect("under src/")
                        .to_string_lossy()
                        .replace('\\', "/");
                    scan(&file, &text, &mut reads);
                    for (read_in, _, names) in NAMED_ELSEWHERE {
                        if let (true, Names::These(names)) = (*read_in == file, names) {
                            for name in *names {
                                assert!(
                                    text.contains(&format!("\"{name}\"")),
                                    "{file} no longer names {name}: update NAMED_ELSEWHERE"
                                );
                                reads.add(name, &file);
                            }
                        }
                    }
                }
            }
        }
        reads
    }

    /// The variables in `names` that `doc` does not document: neither a row of its Settings
    /// table nor a mention (`NAME`) in its "Other environment variables" section, and not in
    /// [`NOT_FOR_USERS`].
    fn undocumented<'a>(names: impl IntoIterator<Item = &'a String>, doc: &str) -> Vec<String> {
        let section = |heading: &str| {
            doc.split(&format!("\n## {heading}\n"))
                .nth(1)
                .and_then(|rest| rest.split("\n## ").next())
                .unwrap_or_default()
                .to_string()
        };
        let settings = section("Settings");
        let rows: BTreeSet<String> = settings
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(row_name)
            .collect();
        let others = section("Other environment variables");
        names
            .into_iter()
            .filter(|name| {
                !rows.contains(name.as_str())
                    && !others.contains(&format!("`{name}`"))
                    && !NOT_FOR_USERS.iter().any(|(exempt, _)| exempt == name)
            })
            .cloned()
            .collect()
    }

    #[test]
    fn every_variable_the_code_reads_is_documented() {
        let reads = scan_sources();
        let found = |name: &str| reads.names.contains_key(name);

        // The scan is not vacuous: it finds every setting by its definition, the variables read
        // directly in Rust, in Python and through libraries, and each exemption is still read.
        for setting in SETTINGS {
            assert!(
                found(setting.name),
                "the scan missed the setting {}",
                setting.name
            );
        }
        for name in [
            "HOME",
            "XDG_STATE_HOME",
            "DOCKER_HOST",
            "PCS_INSTALLER_ARGUMENTS",
        ] {
            assert!(found(name), "the scan missed {name}");
        }
        for name in ["DOCKER_CONFIG", "HTTPS_PROXY", "TMPDIR", "PATH"] {
            assert!(
                found(name),
                "the scan missed {name}, read through a library"
            );
        }
        assert!(
            reads.names.len() >= SETTINGS.len() + 15,
            "only {} variables found",
            reads.names.len()
        );
        for (name, _) in NOT_FOR_USERS {
            assert!(
                found(name),
                "{name} is exempt but no longer read: remove it from NOT_FOR_USERS"
            );
        }

        // A read whose variable is not a literal must be one NAMED_ELSEWHERE says what it reads.
        let known: BTreeSet<(String, String)> = NAMED_ELSEWHERE
            .iter()
            .map(|(file, arg, _)| (file.to_string(), arg.to_string()))
            .collect();
        let unknown: Vec<_> = reads.dynamic.difference(&known).collect();
        assert!(
            unknown.is_empty(),
            "environment reads the scan cannot name (file, argument): {unknown:?}; name the \
             variable with a literal, or say in NAMED_ELSEWHERE which variables the read names"
        );
        let gone: Vec<_> = known.difference(&reads.dynamic).collect();
        assert!(
            gone.is_empty(),
            "NAMED_ELSEWHERE lists reads that are gone: {gone:?}"
        );

        let missing = undocumented(reads.names.keys(), CONFIGURATION_DOC);
        let wheres: Vec<String> = missing
            .iter()
            .map(|name| format!("{name} (read in {:?})", reads.names[name]))
            .collect();
        assert!(
            missing.is_empty(),
            "variables the code reads that docs/configuration.md does not document: {}\n\
             Add a setting to config::SETTINGS (and its row), mention the variable under \
             \"Other environment variables\", or, if users never set it, add it to NOT_FOR_USERS \
             with the reason.",
            wheres.join(", ")
        );
    }

    #[test]
    fn the_variable_scan_finds_each_way_of_reading() {
        // `@` keeps the patterns apart in this file; it is removed before the scan.
        let rust = "
            let a = std::env::v@ar(\"SAMPLE_VAR\").ok();
            let b = env::v@ar_os( \"SAMPLE_VAR_OS\");
            let c = (env.0@)(\"SAMPLE_LOOKUP\");
            let d = e@nv!(\"SAMPLE_COMPILE\");
            let e = option_e@nv!(\"SAMPLE_OPTION\");
            let f = std::env::v@ar(some_name);
            // std::env::v@ar(\"SAMPLE_IN_A_COMMENT\")
            let g = tokio::process::Comm@and::new(\"sample-tool\");
            let h = std::process::Comm@and::new(\"/bin/true\");
            let i = Dock@er::connect_with_defaults();
            let j = dotenvy::v@ar(\"SAMPLE_DOTENVY\");
            let k = std::env::temp_d@ir();
            pub const SAMPLE: Set@ting {
                name: \"SAMPLE_SETTING\",
            };
        "
        .replace('@', "");
        let python = "
            a = os.envi@ron.get('SAMPLE_PY_GET')
            b = os.envi@ron.pop(\"SAMPLE_PY_POP\")
            c = os.envi@ron[\"SAMPLE_PY_INDEX\"]
            d = os.get@env(\"SAMPLE_PY_GETENV\")
            e = os.envi@ron.setdefault(\"SAMPLE_PY_SETDEFAULT\", \"1\")
            # os.get@env(\"SAMPLE_PY_IN_A_COMMENT\")
            f = dict(os.environ, SAMPLE_PY_SET=\"1\")
        "
        .replace('@', "");
        let mut reads = Reads::default();
        scan("sample.rs", &rust, &mut reads);
        scan("sample.py", &python, &mut reads);
        let names: Vec<&str> = reads.names.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "DOCKER_CERT_PATH",
                "DOCKER_CONFIG",
                "DOCKER_HOST",
                "DOCKER_TLS_VERIFY",
                "PATH",
                "SAMPLE_COMPILE",
                "SAMPLE_DOTENVY",
                "SAMPLE_LOOKUP",
                "SAMPLE_OPTION",
                "SAMPLE_PY_GET",
                "SAMPLE_PY_GETENV",
                "SAMPLE_PY_INDEX",
                "SAMPLE_PY_POP",
                "SAMPLE_PY_SETDEFAULT",
                "SAMPLE_SETTING",
                "SAMPLE_VAR",
                "SAMPLE_VAR_OS",
                "TMPDIR",
            ]
        );
        assert_eq!(
            reads.names["SAMPLE_PY_GET"],
            BTreeSet::from(["sample.py".to_string()])
        );
        assert_eq!(
            reads.dynamic,
            BTreeSet::from([("sample.rs".to_string(), "some_name".to_string())])
        );
    }

    #[test]
    fn the_documentation_check_names_what_the_doc_lacks() {
        let doc = CONFIGURATION_DOC;
        let names: Vec<String> = ["SANDBOX_TIMEOUT", "DOCKER_CONFIG", "CARGO_PKG_VERSION"]
            .map(String::from)
            .to_vec();
        assert!(undocumented(&names, doc).is_empty());

        // A setting without its row.
        let row = SANDBOX_TIMEOUT.markdown_row();
        let without_row = doc.replace(&format!("{row}\n"), "");
        assert_eq!(undocumented(&names, &without_row), ["SANDBOX_TIMEOUT"]);

        // A variable of the user's environment no longer mentioned.
        let without_mention = doc.replace("`DOCKER_CONFIG`", "DOCKER_CONFIG");
        assert_eq!(undocumented(&names, &without_mention), ["DOCKER_CONFIG"]);

        // A mention elsewhere than in its section does not count.
        let elsewhere = format!("{without_mention}\n\n`DOCKER_CONFIG`\n");
        assert!(elsewhere.contains("`DOCKER_CONFIG`"));
        assert_eq!(undocumented(&names, &elsewhere), ["DOCKER_CONFIG"]);

        // A variable the code would read that nothing documents.
        let new = vec!["SANDBOX_SOMETHING_NEW".to_string()];
        assert_eq!(undocumented(&new, doc), ["SANDBOX_SOMETHING_NEW"]);
    }
}
