//! MCP roots (`SANDBOX_ROOTS`, `SANDBOX_ROOTS_ALLOW`, `SANDBOX_ROOTS_MAP`): whether the
//! directories a client declares are mounted into its sandboxes, where they may be, and how an
//! HTTP client's paths name this machine's. What a root may be is decided in `engine::roots`.

use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// How the client's roots reach its sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RootsMode {
    /// Not asked for, nothing mounted.
    #[default]
    Off,
    /// Mounted read-only.
    ReadOnly,
    /// Mounted read-write; the code runs as the server's user, so what it writes is theirs.
    ReadWrite,
}

impl RootsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RootsMode::Off => "off",
            RootsMode::ReadOnly => "ro",
            RootsMode::ReadWrite => "rw",
        }
    }

    pub fn is_on(self) -> bool {
        self != RootsMode::Off
    }
}

/// An HTTP client's path prefix and the directory of this machine it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootMapping {
    /// An absolute path on the client's machine, as its `file://` URIs spell it.
    pub client: String,
    pub host: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RootsPolicy {
    pub mode: RootsMode,
    /// A root must be strictly inside one of these (`SANDBOX_ROOTS_ALLOW`; by default the
    /// server's home directory).
    pub allow: Vec<PathBuf>,
    /// Over HTTP, the only roots accepted are under a mapping's client prefix (`SANDBOX_ROOTS_MAP`).
    pub map: Vec<RootMapping>,
}

impl RootsPolicy {
    /// The default: off, allowed under `$HOME` when it is an absolute path.
    pub fn from_home(home: Option<&Path>) -> RootsPolicy {
        RootsPolicy {
            mode: RootsMode::Off,
            allow: home
                .filter(|h| h.is_absolute())
                .map(|h| vec![h.to_path_buf()])
                .unwrap_or_default(),
            map: Vec::new(),
        }
    }
}

/// In a `SANDBOX_ROOTS_MAP` directory, the principal's name (its saved-files directory name):
/// each principal's paths map to a directory of its own.
pub const PRINCIPAL_PLACEHOLDER: &str = "{principal}";

impl RootMapping {
    /// Whether its directory is a principal's own (it names [`PRINCIPAL_PLACEHOLDER`]).
    pub fn per_principal(&self) -> bool {
        self.host.to_string_lossy().contains(PRINCIPAL_PLACEHOLDER)
    }
}

impl RootsPolicy {
    /// The mapping an HTTP client's paths go through: a principal's own entries (`own`, its
    /// tokens-file line's `roots_map=`) first, then `SANDBOX_ROOTS_MAP`'s with
    /// [`PRINCIPAL_PLACEHOLDER`] made its name (`principal`: the name as a directory, `None`
    /// without principals, when the entries without it apply instead). Start-up refuses
    /// entries without it beside principals (`config::validate`), so no two principals share
    /// a directory through it.
    pub fn map_for(&self, principal: Option<&str>, own: &[RootMapping]) -> Vec<RootMapping> {
        let mut map = own.to_vec();
        for mapping in &self.map {
            match (principal, mapping.per_principal()) {
                (Some(name), true) => map.push(RootMapping {
                    client: mapping.client.clone(),
                    host: PathBuf::from(
                        mapping
                            .host
                            .to_string_lossy()
                            .replace(PRINCIPAL_PLACEHOLDER, name),
                    ),
                }),
                (None, false) => map.push(mapping.clone()),
                _ => {}
            }
        }
        map
    }

    /// One line on what is mounted, for `doctor` and the start-up log.
    pub fn summary(&self) -> String {
        match self.mode {
            RootsMode::Off => "off: the client's roots are not asked for, nothing is mounted \
                               (SANDBOX_ROOTS=ro or rw mounts them at /mnt/roots/<name>)"
                .to_string(),
            mode => {
                let allow: Vec<String> =
                    self.allow.iter().map(|a| a.display().to_string()).collect();
                let http = if self.map.is_empty() {
                    "HTTP clients' roots refused (no SANDBOX_ROOTS_MAP)".to_string()
                } else {
                    let map: Vec<String> = self
                        .map
                        .iter()
                        .map(|m| format!("{} -> {}", m.client, m.host.display()))
                        .collect();
                    format!("HTTP clients' roots mapped {}", map.join(", "))
                };
                format!(
                    "{} ({}), each client's roots mounted at /mnt/roots/<name> when inside {}; {http}",
                    mode.as_str(),
                    if mode == RootsMode::ReadWrite {
                        "read-write, the code runs as the server's user"
                    } else {
                        "read-only"
                    },
                    allow.join(", ")
                )
            }
        }
    }
}

pub(super) fn parse_mode(var: &'static str, value: &str) -> Result<RootsMode, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "off" | "false" | "0" | "no" => Ok(RootsMode::Off),
        "ro" => Ok(RootsMode::ReadOnly),
        "rw" => Ok(RootsMode::ReadWrite),
        _ => Err(ConfigError::new(var, value, "off, ro or rw")),
    }
}

/// An absolute path without `.` or `..` components (a prefix compared component by component).
fn is_plain_absolute(path: &str) -> bool {
    path.starts_with('/')
        && path[1..]
            .split('/')
            .filter(|c| !c.is_empty())
            .all(|c| c != "." && c != "..")
}

pub(super) fn parse_allow(var: &'static str, value: &str) -> Result<Vec<PathBuf>, ConfigError> {
    let mut allow = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if !is_plain_absolute(item) {
            return Err(ConfigError::new(
                var,
                value,
                "comma-separated absolute directories, such as /home/me/projects",
            ));
        }
        allow.push(PathBuf::from(item));
    }
    Ok(allow)
}

/// One `CLIENT_PATH=HOST_PATH` mapping, both absolute without `.` or `..` (`None` otherwise).
pub fn parse_mapping(item: &str) -> Option<RootMapping> {
    match item.split_once('=') {
        Some((client, host)) if is_plain_absolute(client) && is_plain_absolute(host) => {
            Some(RootMapping {
                client: client.trim_end_matches('/').to_string(),
                host: PathBuf::from(host),
            })
        }
        _ => None,
    }
}

pub(super) fn parse_map(var: &'static str, value: &str) -> Result<Vec<RootMapping>, ConfigError> {
    let mut map = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some(mapping) = parse_mapping(item) else {
            return Err(ConfigError::new(
                var,
                value,
                "comma-separated CLIENT_PATH=HOST_PATH, both absolute, such as \
                 /Users/me/src=/srv/share/me/src (with principals, HOST_PATH names \
                 {principal}: /Users/me/src=/srv/share/{principal})",
            ));
        };
        map.push(mapping);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_lists_parse() {
        assert_eq!(parse_mode("V", "RO").unwrap(), RootsMode::ReadOnly);
        assert_eq!(parse_mode("V", "rw").unwrap(), RootsMode::ReadWrite);
        assert_eq!(parse_mode("V", "off").unwrap(), RootsMode::Off);
        assert!(parse_mode("V", "yes please").is_err());
        assert_eq!(
            parse_allow("V", "/a, /b/c").unwrap(),
            vec![PathBuf::from("/a"), PathBuf::from("/b/c")]
        );
        for bad in ["relative", "/a/../b", "/a,./b"] {
            assert!(parse_allow("V", bad).is_err(), "{bad}");
        }
        let map = parse_map("V", "/Users/me/src/=/srv/me").unwrap();
        assert_eq!(map[0].client, "/Users/me/src");
        assert_eq!(map[0].host, PathBuf::from("/srv/me"));
        for bad in ["/a", "/a=b", "a=/b", "/a/..=/b"] {
            assert!(parse_map("V", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_principal_gets_its_own_mapping() {
        let policy = RootsPolicy {
            map: parse_map("V", "/Users=/srv/{principal}/home,/shared=/srv/all").unwrap(),
            ..RootsPolicy::default()
        };
        let own = [parse_mapping("/work=/srv/alice-work").unwrap()];
        let alice = policy.map_for(Some("alice"), &own);
        let hosts: Vec<_> = alice.iter().map(|m| m.host.display().to_string()).collect();
        // Its own first, then the per-principal entries; never the shared one.
        assert_eq!(hosts, ["/srv/alice-work", "/srv/alice/home"]);
        let bob = policy.map_for(Some("bob"), &[]);
        assert_eq!(bob[0].host, PathBuf::from("/srv/bob/home"));
        assert_eq!(bob.len(), 1);
        // Without principals only the entries without the placeholder apply.
        let anyone = policy.map_for(None, &[]);
        assert_eq!(anyone.len(), 1);
        assert_eq!(anyone[0].host, PathBuf::from("/srv/all"));
    }

    #[test]
    fn the_summary_says_what_is_mounted_and_where() {
        let mut policy = RootsPolicy::from_home(Some(Path::new("/home/me")));
        assert!(policy.summary().starts_with("off"));
        policy.mode = RootsMode::ReadOnly;
        let summary = policy.summary();
        assert!(summary.starts_with("ro (read-only)"), "{summary}");
        assert!(summary.contains("/home/me") && summary.contains("no SANDBOX_ROOTS_MAP"));
        policy.map = parse_map("V", "/Users/me=/srv/me").unwrap();
        assert!(policy.summary().contains("/Users/me -> /srv/me"));
    }

    #[test]
    fn the_default_allows_the_home_only_when_absolute() {
        let home = RootsPolicy::from_home(Some(Path::new("/home/me")));
        assert_eq!(home.allow, vec![PathBuf::from("/home/me")]);
        assert!(RootsPolicy::from_home(Some(Path::new("rel")))
            .allow
            .is_empty());
        assert!(RootsPolicy::from_home(None).allow.is_empty());
    }
}
