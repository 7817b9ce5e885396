//! Secrets brokered at the egress (`SANDBOX_SECRETS_FILE`): API keys the operator declares, that
//! the egress proxy adds to the code's HTTPS requests to the hosts each is bound to, so that the
//! value never enters a sandbox (the code's variable holds a placeholder).
//!
//! This module is the declaration: the types the egress and the MCP layer read. A secret's value
//! is a [`SecretValue`], which never prints itself.

use std::fmt;
use std::path::{Path, PathBuf};

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

/// The longest `format` (the header's value around `{value}`).
const MAX_FORMAT_BYTES: usize = 256;

/// The keys a `[[secret]]` table may have.
const FIELDS: &[&str] = &[
    "name",
    "value_env",
    "value_file",
    "hosts",
    "header",
    "format",
    "env",
];

/// Headers a secret may not be sent in, lower case: those that frame or route the request
/// (`Host`, `Content-Length`, `Transfer-Encoding`, `Expect`), hop-by-hop ones the proxy itself
/// handles (`Connection`, `Keep-Alive`, `Upgrade`, `TE`, `Trailer`, any `Proxy-*`), the ones the
/// proxy writes (`Via`, `Forwarded`, `X-Forwarded-*`) and `Cookie`, which the code's own cookies
/// share: replacing it would drop them.
const REFUSED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "expect",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "via",
    "forwarded",
    "cookie",
    "set-cookie",
];

/// Header prefixes refused, lower case (see [`REFUSED_HEADERS`]).
const REFUSED_HEADER_PREFIXES: &[&str] = &["proxy-", "x-forwarded-"];

/// Variables a secret's `env` may not be: those the server sets in a sandbox, and those that
/// change how programs there behave (where they find code, libraries, certificates, proxies).
const REFUSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "SHELL",
    "PWD",
    "TMPDIR",
    "TERM",
    "LANG",
    "LANGUAGE",
    "ENV",
    "BASH_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_OPTIONS",
    "GIT_SSL_CAINFO",
    "AWS_CA_BUNDLE",
    "OPENSSL_CONF",
];

/// Prefixes of refused variables (case-sensitive, as programs read them).
const REFUSED_ENV_PREFIXES: &[&str] =
    &["LC_", "LD_", "PYTHON", "PIP_", "UV_", "MPL", "XDG_", "PCS_"];

/// Proxy variables, refused in any case (libraries read both).
const REFUSED_PROXY_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "ftp_proxy",
];

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

/// Where errors of one file point.
struct At<'a> {
    file: &'a Path,
    entry: Option<(usize, Option<String>)>,
}

impl At<'_> {
    fn error(&self, field: Option<&'static str>, problem: impl Into<String>) -> SecretsError {
        SecretsError {
            file: self.file.to_path_buf(),
            entry: self.entry.clone(),
            field,
            problem: problem.into(),
            source: None,
        }
    }
}

impl Secrets {
    /// Reads and checks a secrets file (`SANDBOX_SECRETS_FILE`, or a principal's `secrets=`):
    /// at most [`MAX_FILE_BYTES`], a regular file (links are followed). `lookup` is the server's
    /// environment, where `value_env` names a variable; `value_file`s are read here, once.
    pub fn load(
        file: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Secrets, SecretsError> {
        let at = At { file, entry: None };
        let text =
            read_small_file(file, MAX_FILE_BYTES).map_err(|(problem, source)| SecretsError {
                source,
                ..at.error(None, problem)
            })?;
        let text = String::from_utf8(text)
            .map_err(|_| at.error(None, "not UTF-8 text (a TOML file is UTF-8)"))?;
        Secrets::parse(&text, file, lookup)
    }

    /// Checks the text of a secrets file read from `file` (named in errors).
    pub fn parse(
        text: &str,
        file: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Secrets, SecretsError> {
        let at = At { file, entry: None };
        // The parser's own message, never its rendering: that quotes the line, which may be a
        // value pasted by mistake.
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
            let message = e.message().trim().replace('\n', "; ");
            match line {
                Some(line) => at.error(None, format!("not valid TOML, line {line}: {message}")),
                None => at.error(None, format!("not valid TOML: {message}")),
            }
        })?;
        if let Some(key) = table.keys().find(|k| k.as_str() != "secret") {
            return Err(at.error(
                None,
                format!("unknown key `{key}` at the top level: each secret is a [[secret]] table"),
            ));
        }
        let tables = match table.get("secret") {
            None => {
                return Err(at.error(
                    None,
                    "no [[secret]] table: declare at least one, or unset the setting",
                ))
            }
            Some(toml::Value::Array(tables)) => tables,
            Some(other) => {
                return Err(at.error(
                    None,
                    format!(
                        "`secret` is a {}: write each secret as a [[secret]] table",
                        other.type_str()
                    ),
                ))
            }
        };
        let mut entries: Vec<Secret> = Vec::new();
        for (index, value) in tables.iter().enumerate() {
            let mut at = At {
                file,
                entry: Some((index + 1, None)),
            };
            let toml::Value::Table(table) = value else {
                return Err(at.error(None, "not a table: write each secret as a [[secret]] table"));
            };
            let secret = parse_entry(table, &mut at, lookup)?;
            if let Some((other, _)) = entries
                .iter()
                .enumerate()
                .find(|(_, s)| s.name == secret.name)
            {
                return Err(at.error(
                    Some("name"),
                    format!("secret #{} has the same name: names are unique", other + 1),
                ));
            }
            if let Some((other, _)) = entries
                .iter()
                .enumerate()
                .find(|(_, s)| s.env == secret.env)
            {
                return Err(at.error(
                    Some("env"),
                    format!(
                        "secret #{} (\"{}\") sets ${} too: each secret has a variable of its own",
                        other + 1,
                        entries[other].name,
                        secret.env
                    ),
                ));
            }
            for host in &secret.hosts {
                for (other, earlier) in entries.iter().enumerate() {
                    if let Some(theirs) = earlier.hosts.iter().find(|h| h.overlaps(host)) {
                        return Err(at.error(
                            Some("hosts"),
                            format!(
                                "{host} overlaps {theirs}, bound to secret #{} (\"{}\"): a host \
                                 carries one secret; bind each host to one of them",
                                other + 1,
                                earlier.name
                            ),
                        ));
                    }
                }
            }
            entries.push(secret);
        }
        Ok(Secrets {
            entries,
            file: Some(file.to_path_buf()),
        })
    }

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

/// A file's bytes, refusing what is not a regular file (a FIFO would hang start-up) or is larger
/// than `max`; on failure, the problem and the I/O error.
fn read_small_file(file: &Path, max: u64) -> Result<Vec<u8>, (String, Option<std::io::Error>)> {
    use std::io::Read;
    let unreadable = |e: std::io::Error| {
        (
            "cannot be read: check the path and that the server's user may read it".to_string(),
            Some(e),
        )
    };
    let meta = std::fs::metadata(file).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(("not a regular file".to_string(), None));
    }
    let too_big = || (format!("larger than {max} bytes"), None);
    if meta.len() > max {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(unreadable)?;
    if bytes.len() as u64 > max {
        return Err(too_big());
    }
    Ok(bytes)
}

fn parse_entry(
    table: &toml::Table,
    at: &mut At<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Secret, SecretsError> {
    if let Some(key) = table.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let hint = if key == "value" {
            ": a value is never written in this file; name where it is with value_env (a \
             variable of the server's environment) or value_file"
                .to_string()
        } else {
            format!(" (known: {})", FIELDS.join(", "))
        };
        return Err(at.error(None, format!("unknown field `{key}`{hint}")));
    }
    let string = |at: &At<'_>, field: &'static str| -> Result<Option<String>, SecretsError> {
        match table.get(field) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(at.error(
                Some(field),
                format!("a string is expected, not a {}", other.type_str()),
            )),
        }
    };
    let required = |at: &At<'_>, field: &'static str| -> Result<String, SecretsError> {
        string(at, field)?.ok_or_else(|| at.error(Some(field), "missing"))
    };

    let name = required(at, "name")?;
    if !is_secret_name(&name) {
        return Err(at.error(
            Some("name"),
            "1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit, such as \"openai\"",
        ));
    }
    at.entry = at
        .entry
        .take()
        .map(|(index, _)| (index, Some(name.clone())));

    let env = required(at, "env")?;
    if let Some(why) = env_refusal(&env) {
        return Err(at.error(Some("env"), why));
    }

    let hosts = match table.get("hosts") {
        None => return Err(at.error(Some("hosts"), "missing: the hosts this secret is sent to")),
        Some(toml::Value::Array(items)) => items,
        Some(other) => {
            return Err(at.error(
                Some("hosts"),
                format!(
                    "an array of strings is expected, such as [\"api.openai.com\"], not a {}",
                    other.type_str()
                ),
            ))
        }
    };
    if hosts.is_empty() {
        return Err(at.error(Some("hosts"), "empty: name at least one host"));
    }
    let mut bound: Vec<BoundHost> = Vec::new();
    for item in hosts {
        let toml::Value::String(text) = item else {
            return Err(at.error(
                Some("hosts"),
                format!("each host is a string, not a {}", item.type_str()),
            ));
        };
        let host = parse_bound_host(text).map_err(|why| at.error(Some("hosts"), why))?;
        if bound.contains(&host) {
            return Err(at.error(Some("hosts"), format!("{host} is listed twice")));
        }
        bound.push(host);
    }

    let header = string(at, "header")?.unwrap_or_else(|| "Authorization".to_string());
    if let Some(why) = header_refusal(&header) {
        return Err(at.error(Some("header"), why));
    }
    let format = string(at, "format")?.unwrap_or_else(|| {
        if header.eq_ignore_ascii_case("authorization") {
            "Bearer {value}".to_string()
        } else {
            "{value}".to_string()
        }
    });
    if let Some(why) = format_refusal(&format) {
        return Err(at.error(Some("format"), why));
    }

    let value = match (string(at, "value_env")?, string(at, "value_file")?) {
        (Some(_), Some(_)) => {
            return Err(at.error(
                Some("value_file"),
                "value_env and value_file both given: the value comes from one of them",
            ))
        }
        (None, None) => {
            return Err(at.error(
                Some("value_env"),
                "missing: name where the value is, with value_env (a variable of the server's \
                 environment) or value_file (a file, read at start-up)",
            ))
        }
        (Some(var), None) => {
            if !is_variable_name(&var) {
                return Err(at.error(
                    Some("value_env"),
                    "a variable name ([A-Za-z_][A-Za-z0-9_]*), such as \"OPENAI_API_KEY\"",
                ));
            }
            let value = lookup(&var).unwrap_or_default();
            if value.is_empty() {
                return Err(at.error(
                    Some("value_env"),
                    format!(
                        "${var} is unset or empty in the server's environment: set it where the \
                         server starts, or use value_file"
                    ),
                ));
            }
            check_value(value.as_bytes())
                .map_err(|why| at.error(Some("value_env"), format!("${var}: {why}")))?;
            value
        }
        (None, Some(path)) => {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(at.error(
                    Some("value_file"),
                    "an absolute path, such as \"/run/secrets/openai\"",
                ));
            }
            let bytes = read_small_file(&path, MAX_VALUE_BYTES as u64 + 2).map_err(
                |(problem, source)| SecretsError {
                    source,
                    ..at.error(Some("value_file"), format!("{}: {problem}", path.display()))
                },
            )?;
            let mut end = bytes.len();
            while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
                end -= 1;
            }
            check_value(&bytes[..end]).map_err(|why| {
                at.error(Some("value_file"), format!("{}: {why}", path.display()))
            })?;
            // Checked: visible ASCII only.
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        }
    };

    Ok(Secret {
        name,
        value: SecretValue::new(value),
        hosts: bound,
        header,
        format,
        env,
    })
}

/// `[a-z0-9][a-z0-9_-]{0,63}`.
fn is_secret_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=64).contains(&bytes.len())
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters.
fn is_variable_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=128).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// Why `env` cannot be a secret's variable, if it cannot.
fn env_refusal(env: &str) -> Option<String> {
    if !is_variable_name(env) {
        return Some(
            "a variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128), such as \"OPENAI_API_KEY\""
                .to_string(),
        );
    }
    let refused = REFUSED_ENV.contains(&env)
        || REFUSED_ENV_PREFIXES.iter().any(|p| env.starts_with(p))
        || REFUSED_PROXY_ENV
            .iter()
            .any(|p| env.eq_ignore_ascii_case(p));
    refused.then(|| {
        format!(
            "{env} is set by the server or changes how programs in the sandbox behave (paths, \
             locale, libraries, certificates, proxies): name the variable your SDK reads for its \
             key, such as OPENAI_API_KEY"
        )
    })
}

/// Why `header` cannot carry a secret, if it cannot.
fn header_refusal(header: &str) -> Option<String> {
    let token = !header.is_empty()
        && header.len() <= 64
        && header.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        });
    if !token {
        return Some(
            "a header name (1 to 64 letters, digits and !#$%&'*+-.^_`|~), such as \
             \"Authorization\" or \"x-api-key\""
                .to_string(),
        );
    }
    let lower = header.to_ascii_lowercase();
    let refused = REFUSED_HEADERS.contains(&lower.as_str())
        || REFUSED_HEADER_PREFIXES.iter().any(|p| lower.starts_with(p));
    refused.then(|| {
        format!(
            "{header} frames or routes the request, is the proxy's own, or (Cookie) is shared \
             with the code's own values: use the header the API reads its key from, such as \
             Authorization or x-api-key"
        )
    })
}

/// Why `format` cannot be a header's value template, if it cannot.
fn format_refusal(format: &str) -> Option<String> {
    if format.len() > MAX_FORMAT_BYTES {
        return Some(format!("at most {MAX_FORMAT_BYTES} characters"));
    }
    if !format
        .bytes()
        .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
    {
        return Some(
            "visible ASCII and spaces only, without '\"' or '\\', such as \"Bearer {value}\""
                .to_string(),
        );
    }
    if format.matches("{value}").count() != 1 {
        return Some(
            "exactly one {value}, where the secret goes, such as \"Bearer {value}\"".to_string(),
        );
    }
    if format.starts_with(' ') || format.ends_with(' ') {
        return Some("no space at the start or the end (a header's value is trimmed)".to_string());
    }
    None
}

/// Why a value cannot be sent, if it cannot; names a length or a position, never the value.
fn check_value(value: &[u8]) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty".to_string());
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_VALUE_BYTES} a value may have",
            value.len()
        ));
    }
    for (position, &b) in value.iter().enumerate() {
        let what = match b {
            b' ' => "a space",
            b'"' => "a '\"'",
            b'\\' => "a '\\'",
            0x21..=0x7e => continue,
            0..=0x1f | 0x7f => "a control character",
            _ => "a non-ASCII byte",
        };
        return Err(format!(
            "character {} of {} is {what}: a value is visible ASCII without '\"' or '\\' (it \
             travels in a header)",
            position + 1,
            value.len()
        ));
    }
    Ok(())
}

/// `host[:port]` or `*.suffix[:port]`: a name (an address is refused: the proxy injects by the
/// TLS server name), lower-cased, port 443 unless one is named.
fn parse_bound_host(text: &str) -> Result<BoundHost, String> {
    let form = "host[:port] or *.suffix[:port], such as \"api.openai.com\"";
    if text.starts_with('[') || text.matches(':').count() > 1 {
        return Err(format!(
            "{text} is an IP address: a secret is injected only where the TLS server name \
             (SNI) names the host, which an address has not; name the host ({form})"
        ));
    }
    let (host, port) = match text.split_once(':') {
        Some((host, port)) => match port.parse::<u16>() {
            Ok(port) if port > 0 => (host, port),
            _ => return Err(format!("{text}: the port is 1 to 65535 ({form})")),
        },
        None => (text, 443),
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "{text} is an IP address: a secret is injected only where the TLS server name \
             (SNI) names the host, which an address has not; name the host ({form})"
        ));
    }
    let pattern = match host.strip_prefix("*.") {
        Some(suffix) => {
            let suffix =
                super::egress::name(suffix).map_err(|why| format!("{text}: {why} ({form})"))?;
            if !suffix.contains('.') {
                return Err(format!(
                    "{text}: a wildcard binds every name below its suffix, which needs at least \
                     two labels (*.example.com, not *.com)"
                ));
            }
            format!("*.{suffix}")
        }
        None if host == "*" => {
            return Err(
                "`*` would send the secret to every host the code names: name its API's hosts"
                    .to_string(),
            )
        }
        None if host.contains('*') => {
            return Err(format!(
                "{text}: `*` only as a whole first label, `*.suffix` ({form})"
            ))
        }
        None => super::egress::name(host).map_err(|why| format!("{text}: {why} ({form})"))?,
    };
    Ok(BoundHost { pattern, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-live-0123456789abcdef";

    fn env(name: &str) -> Option<String> {
        match name {
            "OPENAI_KEY" => Some(KEY.to_string()),
            "ANTHROPIC_KEY" => Some("sk-ant-xyz".to_string()),
            "SPACED" => Some(format!("{KEY} ")),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<Secrets, SecretsError> {
        Secrets::parse(text, Path::new("/etc/pcs/secrets.toml"), &env)
    }

    const TWO: &str = r#"
[[secret]]
name = "openai"
value_env = "OPENAI_KEY"
hosts = ["API.OpenAI.com", "*.openai.example:8443"]
env = "OPENAI_API_KEY"

[[secret]]
name = "anthropic"
value_env = "ANTHROPIC_KEY"
hosts = ["api.anthropic.com"]
header = "x-api-key"
env = "ANTHROPIC_API_KEY"
"#;

    #[test]
    fn a_file_declares_secrets_with_their_defaults() {
        let secrets = parse(TWO).unwrap();
        let [openai, anthropic] = &secrets.entries[..] else {
            panic!("two secrets: {secrets:?}");
        };
        assert_eq!(openai.name, "openai");
        assert_eq!(openai.value.expose(), KEY);
        assert_eq!(openai.header, "Authorization");
        assert_eq!(openai.format, "Bearer {value}");
        assert_eq!(openai.hosts_text(), "api.openai.com, *.openai.example:8443");
        assert!(openai.binds("api.openai.com", 443));
        assert!(openai.binds("eu.openai.example", 8443));
        assert_eq!(
            anthropic.format, "{value}",
            "not Authorization: the value alone"
        );
        assert_eq!(anthropic.header_value(), "sk-ant-xyz");
        assert_eq!(
            secrets
                .bound("api.anthropic.com", 443)
                .map(|s| s.name.as_str()),
            Some("anthropic")
        );
        let summary = secrets.summary().unwrap();
        assert!(summary.starts_with("2 secrets brokered at the egress from /etc/pcs/secrets.toml: openai ($OPENAI_API_KEY, header Authorization, for api.openai.com, *.openai.example:8443); anthropic"), "{summary}");
        assert!(!summary.contains(KEY) && !summary.contains("sk-ant"));
        assert_eq!(Secrets::default().summary(), None);
    }

    #[test]
    fn a_value_file_is_read_once_without_its_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("pcs-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let value = dir.join("key");
        std::fs::write(&value, format!("{KEY}\r\n")).unwrap();
        let file = dir.join("secrets.toml");
        let text = format!(
            "[[secret]]\nname = \"f\"\nvalue_file = \"{}\"\nhosts = [\"api.example.com\"]\nenv = \"F_KEY\"\n",
            value.display()
        );
        std::fs::write(&file, &text).unwrap();
        let secrets = Secrets::load(&file, &env).unwrap();
        assert_eq!(secrets.entries[0].value.expose(), KEY);
        assert_eq!(secrets.file.as_deref(), Some(file.as_path()));

        std::fs::write(&value, format!("{KEY} with words\n")).unwrap();
        let e = Secrets::load(&file, &env).unwrap_err();
        assert!(
            e.to_string().contains("character 25 of 35 is a space"),
            "{e}"
        );
        assert!(!e.to_string().contains(KEY), "{e}");

        std::fs::write(&value, "x".repeat(MAX_VALUE_BYTES + 10)).unwrap();
        let e = Secrets::load(&file, &env).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");

        let e = Secrets::load(&dir, &env).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = Secrets::load(&file, &env).unwrap_err();
        assert!(
            e.to_string().contains("cannot be read") && e.source.is_some(),
            "{e}"
        );
    }

    /// One `[[secret]]` with `field = value` replacing (or, new, added to) a valid one.
    fn with(field: &str, value: &str) -> String {
        let mut fields = vec![
            ("name", "\"llm\"".to_string()),
            ("value_env", "\"OPENAI_KEY\"".to_string()),
            ("hosts", "[\"api.example.com\"]".to_string()),
            ("env", "\"LLM_KEY\"".to_string()),
        ];
        fields.retain(|(f, _)| *f != field);
        if !value.is_empty() {
            fields.push((field, value.to_string()));
        }
        let body: Vec<String> = fields.iter().map(|(f, v)| format!("{f} = {v}")).collect();
        format!("[[secret]]\n{}\n", body.join("\n"))
    }

    #[test]
    fn each_refusal_names_the_entry_and_the_field_and_never_the_value() {
        let cases: &[(&str, &str, &str)] = &[
            ("name", "\"Open AI\"", "field `name`: 1 to 64"),
            ("name", "", "field `name`: missing"),
            ("colour", "\"red\"", "unknown field `colour`"),
            (
                "value",
                "\"sk-live-0123456789abcdef\"",
                "a value is never written in this file",
            ),
            ("value_env", "", "field `value_env`: missing"),
            ("value_env", "\"NOT_SET\"", "$NOT_SET is unset or empty"),
            ("value_env", "\"EMPTY\"", "$EMPTY is unset or empty"),
            ("value_env", "\"SPACED\"", "character 25 of 25 is a space"),
            ("value_env", "\"bad-name\"", "a variable name"),
            ("value_file", "\"relative/key\"", "both given"),
            ("hosts", "", "field `hosts`: missing"),
            ("hosts", "[]", "empty"),
            ("hosts", "\"api.example.com\"", "an array of strings"),
            ("hosts", "[\"93.184.216.34\"]", "is an IP address"),
            ("hosts", "[\"[2001:db8::1]:443\"]", "is an IP address"),
            ("hosts", "[\"api.example.com:0\"]", "the port is 1 to 65535"),
            (
                "hosts",
                "[\"api.example.com:70000\"]",
                "the port is 1 to 65535",
            ),
            ("hosts", "[\"*.com\"]", "at least two labels"),
            ("hosts", "[\"*\"]", "to every host"),
            ("hosts", "[\"a.*.example.com\"]", "as a whole first label"),
            ("hosts", "[\"bad_host!.com\"]", "labels are made of"),
            (
                "hosts",
                "[\"a.example.com\", \"A.example.com.\"]",
                "listed twice",
            ),
            ("header", "\"Host\"", "frames or routes"),
            ("header", "\"proxy-authorization\"", "frames or routes"),
            ("header", "\"Cookie\"", "frames or routes"),
            ("header", "\"X-Api Key\"", "a header name"),
            ("format", "\"Bearer\"", "exactly one {value}"),
            ("format", "\"{value} {value}\"", "exactly one {value}"),
            (
                "format",
                "\"Bearer \\\"{value}\\\"\"",
                "visible ASCII and spaces only",
            ),
            ("format", "\" {value}\"", "no space at the start"),
            ("env", "\"PATH\"", "is set by the server"),
            ("env", "\"LD_PRELOAD\"", "is set by the server"),
            ("env", "\"PYTHONPATH\"", "is set by the server"),
            ("env", "\"Https_Proxy\"", "is set by the server"),
            ("env", "\"SSL_CERT_FILE\"", "is set by the server"),
            ("env", "\"PCS_IPYTHON\"", "is set by the server"),
            ("env", "\"1KEY\"", "a variable name"),
            ("env", "7", "a string is expected, not a integer"),
        ];
        for (field, value, expected) in cases {
            let mut text = with(field, value);
            if *field == "value_file" {
                text = text.replace("name = ", &format!("{field} = {value}\nname = "));
                text = text.replacen(&format!("\n{field} = {value}\n"), "\n", 1);
            }
            let e = parse(&text).unwrap_err();
            let message = e.to_string();
            assert!(
                message.starts_with("/etc/pcs/secrets.toml: [[secret]] #1"),
                "{field}={value}: {message}"
            );
            assert!(message.contains(expected), "{field}={value}: {message}");
            assert!(!message.contains(KEY), "{field}={value}: {message}");
        }
        // The name once it is valid.
        let e = parse(&with("env", "\"HOME\"")).unwrap_err();
        assert!(
            e.to_string()
                .contains("[[secret]] #1 (name \"llm\"), field `env`: HOME is set"),
            "{e}"
        );
    }

    #[test]
    fn the_file_as_a_whole_is_checked() {
        for (text, expected) in [
            ("", "no [[secret]] table"),
            ("secret = 3", "`secret` is a integer"),
            ("[secret]\nname = \"x\"", "`secret` is a table"),
            ("title = \"x\"", "unknown key `title`"),
            (
                "[[secret]]\nname = \"sk-live-0123456789abcdef",
                "not valid TOML, line 2",
            ),
            ("sk-live-0123456789abcdef\n", "not valid TOML, line 1"),
        ] {
            let message = parse(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text}: {message}");
            assert!(!message.contains(KEY), "{text}: {message}");
        }
    }

    #[test]
    fn secrets_are_unique_in_name_variable_and_host() {
        let second = |field: &str, value: &str| {
            let other = with("name", "\"other\"")
                .replace("LLM_KEY", "OTHER_KEY")
                .replace("api.example.com", "other.example.com");
            let other = if field == "name" {
                other.replace("\"other\"", value)
            } else {
                let mut lines: Vec<String> = other
                    .lines()
                    .filter(|l| !l.starts_with(&format!("{field} =")))
                    .map(String::from)
                    .collect();
                lines.push(format!("{field} = {value}"));
                lines.join("\n") + "\n"
            };
            format!(
                "{}\n{other}",
                with("hosts", "[\"api.example.com\", \"*.cdn.example.com\"]")
            )
        };
        assert!(parse(&second("hosts", "[\"api.example.com:8443\"]")).is_ok());
        for (field, value, expected) in [
            (
                "name",
                "\"llm\"",
                "[[secret]] #2 (name \"llm\"), field `name`: secret #1 has the same name",
            ),
            (
                "env",
                "\"LLM_KEY\"",
                "field `env`: secret #1 (\"llm\") sets $LLM_KEY too",
            ),
            (
                "hosts",
                "[\"API.example.com\"]",
                "field `hosts`: api.example.com overlaps api.example.com, bound to secret #1",
            ),
            (
                "hosts",
                "[\"a.cdn.example.com\"]",
                "a.cdn.example.com overlaps *.cdn.example.com",
            ),
            (
                "hosts",
                "[\"*.example.com\"]",
                "*.example.com overlaps api.example.com",
            ),
        ] {
            let message = parse(&second(field, value)).unwrap_err().to_string();
            assert!(message.contains(expected), "{field}={value}: {message}");
        }
    }

    #[test]
    fn a_value_never_prints_itself() {
        let value = SecretValue::new("sk-live-123".into());
        assert_eq!(format!("{value} {value:?}"), "[redacted] [redacted]");
        let secret = Secret {
            name: "llm".into(),
            value,
            hosts: vec![BoundHost {
                pattern: "api.example.test".into(),
                port: 443,
            }],
            header: "Authorization".into(),
            format: "Bearer {value}".into(),
            env: "LLM_API_KEY".into(),
        };
        assert!(!format!("{secret:?}").contains("sk-live"));
        assert_eq!(secret.header_value(), "Bearer sk-live-123");
    }

    #[test]
    fn a_bound_host_is_its_name_and_port_or_a_name_below_a_wildcard() {
        let exact = BoundHost {
            pattern: "api.example.test".into(),
            port: 443,
        };
        assert!(exact.matches("API.example.test.", 443));
        assert!(!exact.matches("api.example.test", 8443));
        assert!(!exact.matches("xapi.example.test", 443));
        let wild = BoundHost {
            pattern: "*.example.test".into(),
            port: 443,
        };
        assert!(wild.matches("a.example.test", 443));
        assert!(wild.matches("a.b.example.test", 443));
        assert!(!wild.matches("example.test", 443));
        assert!(!wild.matches("evilexample.test", 443));
        assert_eq!(wild.to_string(), "*.example.test");
    }
}
