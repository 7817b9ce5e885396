//! Host names, origins and URLs as settings give them: splitting `host:port`, putting origins in
//! one canonical form, and keeping index credentials out of messages. The HTTP transport and the
//! installer's egress proxy match requests with the same functions.

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

/// The host and port of an http(s) URL: the port it names, else 80 for `http` and 443 otherwise;
/// credentials before `@` are skipped. `None` when it has no host.
pub fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    parse_host_port(authority, default)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`, lowercased; `default` is the port when none is
/// given.
pub fn parse_host_port(text: &str, default: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let (host, rest) = inner.split_once(']')?;
        (host, rest.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok().filter(|p| *p > 0)?,
        None => default,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    valid.then_some((host, port))
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
