//! Secrets brokered at the egress (`SANDBOX_SECRETS_FILE`): API keys the operator declares, that
//! the egress proxy adds to the code's HTTPS requests to the hosts each is bound to, so that the
//! value never enters a sandbox (the code's variable holds a placeholder).
//!
//! This module is the declaration: the types the egress and the MCP layer read. A secret's value
//! is a [`SecretValue`], which never prints itself.
//!
//! Reading and checking a secrets file (`Secrets::load`, `Secrets::parse`: each field's rules,
//! the errors that name the entry and the field) is in `file.rs`.

mod file;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;

/// A secret's value: shown as `[redacted]` by `Debug` and `Display`; [`SecretValue::expose`]
/// is the only way to its text.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> SecretValue {
        SecretValue(value)
    }

    /// The value itself: for the proxy's header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A host a secret is bound to: a name (lower case, no trailing dot) or `*.suffix` (any name
/// below `suffix`, not `suffix` itself), and a port (443 unless one is named).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundHost {
    pub pattern: String,
    pub port: u16,
}

impl BoundHost {
    /// Whether `host:port` (a name as a request names it) is this one.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self.pattern.strip_prefix("*.") {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            None => host == self.pattern,
        }
    }
}

impl fmt::Display for BoundHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port == 443 {
            f.write_str(&self.pattern)
        } else {
            write!(f, "{}:{}", self.pattern, self.port)
        }
    }
}

/// One secret of the operator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// Its name (what the model is told, what records and metrics say).
    pub name: String,
    pub value: SecretValue,
    pub hosts: Vec<BoundHost>,
    /// The request header the proxy sets (`Authorization`, `x-api-key`, ...).
    pub header: String,
    /// The header's value, `{value}` where the secret goes (`Bearer {value}`).
    pub format: String,
    /// The variable the sandbox sees, holding a placeholder.
    pub env: String,
}

impl Secret {
    /// The header's value with the secret in it.
    pub fn header_value(&self) -> String {
        self.format.replacen("{value}", self.value.expose(), 1)
    }

    /// Whether this secret is bound to `host:port`.
    pub fn binds(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|h| h.matches(host, port))
    }
}

/// The operator's secrets (empty: none declared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    pub entries: Vec<Secret>,
    /// The file they were read from.
    pub file: Option<PathBuf>,
}

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The secret bound to `host:port`, if any (the file is refused when two share a host).
    pub fn bound(&self, host: &str, port: u16) -> Option<&Secret> {
        self.entries.iter().find(|s| s.binds(host, port))
    }

    /// The distinct header names the secrets are sent in, in the order first declared.
    pub fn headers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for secret in &self.entries {
            if !out.iter().any(|h| h.eq_ignore_ascii_case(&secret.header)) {
                out.push(secret.header.clone());
            }
        }
        out
    }
}

/// The server's own environment, where a `value_env` is looked up: for a principal's `secrets=`
/// file, read when the server starts and again on SIGHUP (`SANDBOX_SECRETS_FILE` is read through
/// the lookup the settings come from).
pub fn server_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The largest secrets file read (it holds references to values, not values).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The longest value: it travels in a request header and in the proxy's helper protocol.
pub const MAX_VALUE_BYTES: usize = 8 << 10;

/// Why a secrets file was refused: where (the file, the `[[secret]]` table, the field) and why.
/// Never a value: the problem names a value's length or the position of a bad character at most.
#[derive(Debug, thiserror::Error)]
#[error("{}: {}", file.display(), self.where_and_why())]
pub struct SecretsError {
    pub file: PathBuf,
    /// The `[[secret]]` table, counted from 1, and its name once that is valid.
    pub entry: Option<(usize, Option<String>)>,
    /// The field at fault.
    pub field: Option<&'static str>,
    pub problem: String,
    /// Why the file (or a `value_file`) could not be read.
    #[source]
    pub source: Option<std::io::Error>,
}

impl SecretsError {
    /// The message without the file's name (for a message that already names it).
    pub fn where_and_why(&self) -> String {
        let mut out = String::new();
        if let Some((index, name)) = &self.entry {
            out.push_str(&format!("[[secret]] #{index}"));
            if let Some(name) = name {
                out.push_str(&format!(" (name \"{name}\")"));
            }
        }
        if let Some(field) = self.field {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&format!("field `{field}`"));
        }
        if out.is_empty() {
            self.problem.clone()
        } else {
            format!("{out}: {}", self.problem)
        }
    }
}

impl Secrets {
    /// One line for `doctor` and the start-up log: each secret's name, variable, header and hosts
    /// (never a value); `None` without secrets.
    pub fn summary(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let each: Vec<String> = self
            .entries
            .iter()
            .map(|s| {
                format!(
                    "{} (${}, header {}, for {})",
                    s.name,
                    s.env,
                    s.header,
                    s.hosts_text()
                )
            })
            .collect();
        let from = self
            .file
            .as_deref()
            .map(|f| format!(" from {}", f.display()))
            .unwrap_or_default();
        Some(format!(
            "{} brokered at the egress{from}: {}",
            if each.len() == 1 {
                "1 secret".to_string()
            } else {
                format!("{} secrets", each.len())
            },
            each.join("; ")
        ))
    }
}

impl Secret {
    /// Its hosts, comma-separated, as the operator reads them (`:port` unless 443).
    pub fn hosts_text(&self) -> String {
        self.hosts
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl BoundHost {
    /// Whether some `host:port` is bound by both (the file is refused when two secrets' hosts do).
    pub fn overlaps(&self, other: &BoundHost) -> bool {
        self.port == other.port
            && (self.pattern == other.pattern || self.covers(other) || other.covers(self))
    }

    /// Whether this is a wildcard that matches a name `other` matches.
    fn covers(&self, other: &BoundHost) -> bool {
        if !self.pattern.starts_with("*.") {
            return false;
        }
        let sample = match other.pattern.strip_prefix("*.") {
            Some(suffix) => format!("x.{suffix}"),
            None => other.pattern.clone(),
        };
        self.matches(&sample, other.port)
    }
}
