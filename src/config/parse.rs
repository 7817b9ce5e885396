//! Parsers of the value forms settings share: sizes, durations, counts, booleans, URLs, host
//! lists, operator mounts, and the image globs. Each takes the variable's name so its error
//! names it; none knows which setting it serves.

use std::path::PathBuf;
use std::time::Duration;

use super::address::parse_host_port;
use super::error::ConfigError;
use super::{OperatorMount, Secret};

/// Parses a size the way Docker does: `512m`, `2g`, `1048576`; units are binary (`m` = MiB).
pub fn parse_bytes(var: &'static str, value: &str, minimum: u64) -> Result<u64, ConfigError> {
    let parsed = parse_size::Config::new()
        .with_binary()
        .parse_size(value)
        .map_err(|e| {
            ConfigError::new(
                var,
                value,
                "a size such as 512m, 2g or 1048576 (bytes; k/m/g are binary units)",
            )
            .because(e)
        })?;
    if parsed < minimum {
        return Err(ConfigError::new(
            var,
            value,
            "a larger size (this one is below the minimum that can work)",
        ));
    }
    Ok(parsed)
}

/// Parses a duration: `30s`, `2m`, `1h 30m`, or a bare number of seconds (`45`, `2.5`).
pub fn parse_duration(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let error = || {
        ConfigError::new(
            var,
            value,
            "a positive duration such as 30s, 2m or 90 (seconds)",
        )
    };
    let duration = match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e9 => Duration::from_secs_f64(secs),
        Ok(_) => return Err(error()),
        Err(_) => humantime::parse_duration(value).map_err(|e| error().because(e))?,
    };
    if duration.is_zero() {
        return Err(error());
    }
    Ok(duration)
}

/// A whole number from `min` to `max`.
pub(super) fn parse_count(
    var: &'static str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<usize, ConfigError> {
    let error = || {
        ConfigError::new(
            var,
            value,
            "a whole number within the accepted range (see docs/configuration.md)",
        )
    };
    match value.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(error()),
        Err(e) => Err(error().because(e)),
    }
}

pub(super) fn parse_bool(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::new(var, value, "true or false")),
    }
}

/// An http(s) URL that can be passed on to pip and uv unquoted.
pub(super) fn parse_url(var: &'static str, value: &str) -> Result<String, ConfigError> {
    let ok = (value.starts_with("https://") || value.starts_with("http://"))
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'');
    if ok {
        Ok(value.to_string())
    } else {
        Err(ConfigError::new(
            var,
            value,
            "an http(s) URL such as https://pypi.org/simple",
        ))
    }
}

/// Comma-separated `host[:port]` (port 443 when omitted).
pub(super) fn parse_hosts(
    var: &'static str,
    value: &str,
) -> Result<Vec<(String, u16)>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            parse_host_port(h, 443).ok_or_else(|| {
                ConfigError::new(
                    var,
                    value,
                    "comma-separated host names or addresses, each optionally with :PORT",
                )
            })
        })
        .collect()
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
    // The client's roots (`SANDBOX_ROOTS`); nor `/mnt` itself, which holds them.
    "/mnt/roots",
];

/// Comma-separated `HOST:CONTAINER[:ro|rw]`, read-only by default.
/// `check_exists`: the host path must exist here (a local engine; a remote engine's machine is
/// checked by the engine at start-up).
pub(super) fn parse_mounts(
    var: &'static str,
    value: &str,
    check_exists: bool,
) -> Result<Vec<OperatorMount>, ConfigError> {
    let error = |expected| ConfigError::new(var, value, expected);
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
        if !host.is_absolute() || (check_exists && !host.exists()) {
            return Err(error(
                "existing absolute host paths (HOST:CONTAINER[:ro|rw])",
            ));
        }
        let normal = container.starts_with('/')
            && container.len() > 1
            && container[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        let reserved = container == "/mnt"
            || RESERVED_MOUNT_PATHS
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

/// An image reference or pattern as far as it matters here: one word, nothing invisible.
pub(super) fn is_image_reference(text: &str) -> bool {
    !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Docker's rule for volume names.
pub(super) fn is_volume_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
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

/// A duration within `range`; anything else is refused with the setting's own `expected`.
pub(super) fn parse_duration_within(
    var: &'static str,
    value: &str,
    range: std::ops::RangeInclusive<Duration>,
    expected: &'static str,
) -> Result<Duration, ConfigError> {
    match parse_duration(var, value) {
        Ok(d) if range.contains(&d) => Ok(d),
        Ok(_) => Err(ConfigError::new(var, value, expected)),
        Err(e) => Err(ConfigError {
            expected: expected.into(),
            ..e
        }),
    }
}

/// The smallest token accepted: shorter ones can be guessed.
const MIN_TOKEN_CHARS: usize = 16;

/// A bearer token: long enough not to be guessed, in the characters RFC 6750 allows.
pub(super) fn parse_token(var: &'static str, token: &str) -> Result<Secret, ConfigError> {
    let b64token = token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '='));
    if token.chars().count() < MIN_TOKEN_CHARS || !b64token {
        return Err(ConfigError::new(
            var,
            // The value is a secret: say only what is wrong with it.
            format!("(hidden, {} characters)", token.chars().count()),
            "a token of at least 16 characters from A-Z a-z 0-9 - . _ ~ + / =, such as the output of `openssl rand -hex 32`",
        ));
    }
    Ok(Secret::new(token))
}

/// Dependency sets at most in `SANDBOX_PRELOAD`, and requirements at most in one set.
pub const MAX_PRELOAD_SETS: usize = 16;
pub const MAX_PRELOAD_REQUIREMENTS: usize = 32;

/// Parses requirement sets: sets separated by `;`, requirements within a set by `,`
/// (`numpy,matplotlib;pandas`). A comma followed by a version operator continues a specifier
/// (`pandas>=2,<3,numpy` is `pandas>=2,<3` and `numpy`), so only a comma before a name starts a
/// new requirement. Markers (`; python_version...`) cannot be written here. Only the shape is
/// checked here; each requirement is validated like a request's `dependencies` when the engine
/// starts (the parser is the engine's).
pub fn parse_requirement_sets(
    var: &'static str,
    value: &str,
) -> Result<Vec<Vec<String>>, ConfigError> {
    const EXPECTED: &str = "requirement sets separated by `;`, requirements within a set by `,`, \
                            such as numpy,matplotlib;pandas>=2,<3 (at most 16 sets of 32)";
    let mut sets: Vec<Vec<String>> = Vec::new();
    for set in value.split(';') {
        let set = set.trim();
        if set.is_empty() {
            return Err(ConfigError::new(var, value, EXPECTED));
        }
        let mut requirements: Vec<String> = Vec::new();
        for piece in set.split(',') {
            let piece = piece.trim();
            let starts_name = piece.starts_with(|c: char| c.is_ascii_alphanumeric());
            match requirements.last_mut() {
                Some(last) if !starts_name && !piece.is_empty() => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ if starts_name => requirements.push(piece.to_string()),
                _ => return Err(ConfigError::new(var, value, EXPECTED)),
            }
        }
        requirements.sort();
        requirements.dedup();
        if requirements.len() > MAX_PRELOAD_REQUIREMENTS {
            return Err(ConfigError::new(var, value, EXPECTED));
        }
        if !sets.contains(&requirements) {
            sets.push(requirements);
        }
    }
    if sets.len() > MAX_PRELOAD_SETS {
        return Err(ConfigError::new(var, value, EXPECTED));
    }
    Ok(sets)
}

#[cfg(test)]
mod requirement_set_tests {
    use super::*;

    fn sets(value: &str) -> Vec<Vec<String>> {
        parse_requirement_sets("V", value).expect("valid")
    }

    #[test]
    fn sets_split_on_semicolons_and_requirements_on_commas_before_names() {
        assert_eq!(
            sets("numpy, matplotlib ; pandas>=2,<3,numpy"),
            [
                vec!["matplotlib".to_string(), "numpy".to_string()],
                vec!["numpy".to_string(), "pandas>=2,<3".to_string()],
            ]
        );
        // One set written twice (in another order) is one set.
        assert_eq!(sets("numpy,six;six,numpy").len(), 1);
    }

    #[test]
    fn empty_sets_and_dangling_commas_are_refused() {
        for bad in ["numpy;", ";numpy", "numpy,,six", ",numpy", "numpy,"] {
            assert!(parse_requirement_sets("V", bad).is_err(), "{bad}");
        }
        let many = vec!["six"; 33]
            .iter()
            .enumerate()
            .map(|(i, _)| format!("p{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(parse_requirement_sets("V", &many).is_err());
    }
}
