//! Reading a secrets file: the TOML's shape, each `[[secret]]` field's rules, and errors that
//! name the file, the entry and the field (never a value).

use std::path::{Path, PathBuf};

use crate::config::egress;

use super::{
    BoundHost, Secret, SecretValue, Secrets, SecretsError, MAX_FILE_BYTES, MAX_VALUE_BYTES,
};

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
            let suffix = egress::name(suffix).map_err(|why| format!("{text}: {why} ({form})"))?;
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
        None => egress::name(host).map_err(|why| format!("{text}: {why} ({form})"))?,
    };
    Ok(BoundHost { pattern, port })
}
