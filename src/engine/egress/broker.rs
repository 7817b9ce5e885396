//! Secrets brokered at the egress: what the proxy adds to one request of the code's, decided
//! from the request alone (pure logic; [`super::sources`] asks it for the code's sandboxes).
//!
//! The rules, each the condition for a secret to leave the proxy:
//! - TLS only: a tunnel (`CONNECT`) to a *name* a secret is bound to (with its port) is bumped;
//!   an IP literal is never bumped (a secret needs a name the certificate and SNI agree on), nor
//!   is any other tunnel, which is spliced untouched;
//! - before the bump, the client's SNI must name the tunnel's host;
//! - inside a bumped tunnel, each request is judged again: its URL's host (the tunnel's), its
//!   `Host` header and the tunnel's SNI must all name the same bound host and port; then the
//!   header is set to the secret's value, whatever the request sent in it (a placeholder, another
//!   value, nothing), never doubled;
//! - a request in clear text (absolute-form HTTP) to a bound host gets nothing: the value would
//!   travel unencrypted.

use crate::config::egress::{target_of, Target};
use crate::config::secrets::Secrets;

use super::squid::{header_note, NOTE_BUMP};

/// One request as the proxy asked about it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The URL's host (a tunnel's target for `CONNECT`).
    pub host: &'a str,
    pub port: u16,
    /// The request's `Host` header, as sent.
    pub host_header: Option<&'a str>,
    /// The TLS SNI of the tunnel the request came through (bumped tunnels only).
    pub sni: Option<&'a str>,
    /// The values of the headers the proxy can set, as sent, in their order (`None`: absent).
    pub sent: &'a [Option<String>],
}

/// What the proxy does about secrets for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Brokered {
    /// No secret is bound to where it goes.
    Nothing,
    /// A tunnel to a bound name: bump it (if its SNI agrees, asked next).
    Bump { secret: String },
    /// Add the secret in its header: the note Squid reads, and the header's value.
    Add {
        secret: String,
        note: String,
        value: String,
    },
    /// A secret is bound to where it goes, and is not sent: why.
    Withheld { secret: String, why: String },
}

impl Brokered {
    /// The notes of the proxy's yes (see [`super::squid`]).
    pub fn notes(&self) -> Vec<(String, String)> {
        match self {
            Brokered::Bump { .. } => vec![(NOTE_BUMP.to_string(), "yes".to_string())],
            Brokered::Add { note, value, .. } => vec![(note.clone(), value.clone())],
            Brokered::Nothing | Brokered::Withheld { .. } => Vec::new(),
        }
    }

    /// The secret the request used, when it was sent.
    pub fn sent(&self) -> Option<&str> {
        match self {
            Brokered::Add { secret, .. } => Some(secret),
            _ => None,
        }
    }
}

/// A name as requests name it: lower case, no trailing dot.
fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The host and port a `Host` header names (`default_port` when it names none).
fn host_header(value: &str, default_port: u16) -> Option<(String, u16)> {
    let value = value.trim();
    if let Some(bracketed) = value.strip_prefix('[') {
        let (host, rest) = bracketed.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if rest.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_ascii_lowercase(), port));
    }
    match value.rsplit_once(':') {
        Some((host, port)) => Some((normal(host), port.parse().ok()?)),
        None => Some((normal(value), default_port)),
    }
}

/// What the proxy adds to `request` from `secrets` (those of the sandbox that sent it).
/// `headers` are the header names the proxy can set, in its configuration's order (a note's
/// index is a header's place there).
pub fn for_request(secrets: &Secrets, headers: &[String], request: &Request<'_>) -> Brokered {
    let Some(secret) = secrets.bound(request.host, request.port) else {
        return Brokered::Nothing;
    };
    let withheld = |why: String| Brokered::Withheld {
        secret: secret.name.clone(),
        why,
    };
    let host = normal(request.host);
    if !matches!(target_of(&host), Some(Target::Name(_))) {
        return withheld(format!("{host} is not a name"));
    }
    if request.method.eq_ignore_ascii_case("CONNECT") {
        return Brokered::Bump {
            secret: secret.name.clone(),
        };
    }
    let Some(sni) = request.sni else {
        return withheld(format!(
            "the request to {host}:{} is not inside TLS (a secret is sent over TLS only)",
            request.port
        ));
    };
    if normal(sni) != host {
        return withheld(format!("the TLS SNI names {sni:?}, not {host}"));
    }
    let named = request
        .host_header
        .and_then(|value| host_header(value, request.port));
    if named != Some((host.clone(), request.port)) {
        return withheld(format!(
            "its Host header ({:?}) does not name {host}:{}",
            request.host_header.unwrap_or(""),
            request.port
        ));
    }
    let Some(index) = headers
        .iter()
        .position(|h| h.eq_ignore_ascii_case(&secret.header))
    else {
        return withheld(format!(
            "its header {} is not one the egress proxy was started with (it sets {}): restart \
             the server after changing the secrets' headers",
            secret.header,
            headers.join(", ")
        ));
    };
    Brokered::Add {
        secret: secret.name.clone(),
        note: header_note(index),
        value: secret.header_value(),
    }
}

/// The secrets whose placeholder `request` carries, as sent, in a header the proxy can set
/// (`headers`, in its order), other than the one the proxy sets in it (`brokered`): a placeholder
/// that reaches a host as it was written, which means nothing there. The proxy sees the headers of
/// clear-text requests and of those inside a bumped tunnel (a spliced tunnel is never opened).
pub fn placeholders_sent(
    secrets: &Secrets,
    headers: &[String],
    request: &Request<'_>,
    brokered: &Brokered,
) -> Vec<String> {
    let set = match brokered {
        Brokered::Add { secret, .. } => secrets
            .entries
            .iter()
            .find(|s| &s.name == secret)
            .and_then(|s| {
                headers
                    .iter()
                    .position(|h| h.eq_ignore_ascii_case(&s.header))
            }),
        _ => None,
    };
    let mut names: Vec<String> = Vec::new();
    for (index, value) in request.sent.iter().enumerate() {
        let Some(value) = value else { continue };
        if Some(index) == set {
            continue;
        }
        for secret in &secrets.entries {
            let marker = format!("pcs-placeholder-{}-", secret.name);
            if value.contains(&marker) && !names.contains(&secret.name) {
                names.push(secret.name.clone());
            }
        }
    }
    names
}

/// Whether a tunnel to `host:port` whose TLS hello names `sni` may be bumped.
pub fn for_sni(secrets: &Secrets, host: &str, port: u16, sni: Option<&str>) -> Result<(), String> {
    let Some(secret) = secrets.bound(host, port) else {
        return Err(format!("no secret is bound to {host}:{port}"));
    };
    match sni {
        Some(sni) if normal(sni) == normal(host) => Ok(()),
        Some(sni) => Err(format!(
            "the TLS SNI names {sni:?}, not {host}: {} is not sent",
            secret.name
        )),
        None => Err(format!(
            "the TLS hello names no host (no SNI): {} is not sent",
            secret.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::{BoundHost, Secret, SecretValue};

    fn secrets() -> Secrets {
        let secret = |name: &str, host: &str, port: u16, header: &str, format: &str| Secret {
            name: name.into(),
            value: SecretValue::new(format!("{name}-VALUE")),
            hosts: vec![BoundHost {
                pattern: host.into(),
                port,
            }],
            header: header.into(),
            format: format.into(),
            env: format!("{}_KEY", name.to_ascii_uppercase()),
        };
        Secrets {
            entries: vec![
                secret(
                    "llm",
                    "api.llm.test",
                    443,
                    "Authorization",
                    "Bearer {value}",
                ),
                secret("other", "*.other.test", 8443, "x-api-key", "{value}"),
            ],
            file: None,
        }
    }

    fn request<'a>(
        method: &'a str,
        host: &'a str,
        port: u16,
        host_header: Option<&'a str>,
        sni: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            method,
            host,
            port,
            host_header,
            sni,
            sent: &[],
        }
    }

    #[test]
    fn a_tunnel_to_a_bound_name_is_bumped_and_its_requests_get_the_header() {
        let s = secrets();
        assert_eq!(
            for_request(
                &s,
                &s.headers(),
                &request("CONNECT", "api.llm.test", 443, None, None)
            ),
            Brokered::Bump {
                secret: "llm".into()
            }
        );
        assert!(for_sni(&s, "api.llm.test", 443, Some("API.llm.test.")).is_ok());
        let added = for_request(
            &s,
            &s.headers(),
            &request(
                "POST",
                "api.llm.test",
                443,
                Some("api.llm.test"),
                Some("api.llm.test"),
            ),
        );
        assert_eq!(
            added,
            Brokered::Add {
                secret: "llm".into(),
                note: "pcs_h0".into(),
                value: "Bearer llm-VALUE".into()
            }
        );
        assert_eq!(added.sent(), Some("llm"));
        assert_eq!(
            added.notes(),
            [("pcs_h0".into(), "Bearer llm-VALUE".into())]
        );
        // A wildcard binding, its own header, a port named in Host.
        let other = for_request(
            &s,
            &s.headers(),
            &request(
                "GET",
                "a.other.test",
                8443,
                Some("a.other.test:8443"),
                Some("a.other.test"),
            ),
        );
        assert_eq!(other.notes(), [("pcs_h1".into(), "other-VALUE".into())]);
    }

    #[test]
    fn nothing_is_sent_where_host_sni_and_tunnel_disagree_or_without_tls() {
        let s = secrets();
        let withheld =
            |r: Request<'_>| matches!(for_request(&s, &s.headers(), &r), Brokered::Withheld { .. });
        // Not bound at all: nothing, and the tunnel is spliced.
        assert_eq!(
            for_request(
                &s,
                &s.headers(),
                &request("CONNECT", "elsewhere.test", 443, None, None)
            ),
            Brokered::Nothing
        );
        assert_eq!(
            for_request(
                &s,
                &s.headers(),
                &request("CONNECT", "api.llm.test", 8443, None, None)
            ),
            Brokered::Nothing,
            "another port"
        );
        // An IP literal, a clear-text request, another SNI, another Host.
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            Some("api.llm.test"),
            None
        )));
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            Some("api.llm.test"),
            Some("evil.test")
        )));
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            Some("evil.test"),
            Some("api.llm.test")
        )));
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            Some("api.llm.test:8443"),
            Some("api.llm.test")
        )));
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            None,
            Some("api.llm.test")
        )));
        assert!(for_sni(&s, "api.llm.test", 443, Some("evil.test")).is_err());
        assert!(for_sni(&s, "api.llm.test", 443, None).is_err());
        assert!(for_sni(&s, "elsewhere.test", 443, Some("elsewhere.test")).is_err());
        // A CR or LF cannot ride in on Host: the header does not parse to the host.
        assert!(withheld(request(
            "GET",
            "api.llm.test",
            443,
            Some("api.llm.test\r\nX: y"),
            Some("api.llm.test")
        )));
    }

    #[test]
    fn host_headers_are_read_with_their_ports() {
        assert_eq!(host_header("A.test.", 443), Some(("a.test".into(), 443)));
        assert_eq!(
            host_header("a.test:8443", 443),
            Some(("a.test".into(), 8443))
        );
        assert_eq!(host_header("[::1]:80", 443), Some(("::1".into(), 80)));
        assert_eq!(host_header("a.test:x", 443), None);
    }

    #[test]
    fn a_placeholder_that_gets_no_value_is_named() {
        let s = secrets();
        let headers = vec!["Authorization".to_string(), "x-api-key".to_string()];
        let llm = Some("Bearer pcs-placeholder-llm-0123456789abcdef0123456789abcdef".to_string());
        let other = Some("pcs-placeholder-other-0123456789abcdef0123456789abcdef".to_string());
        let judged = |sent: &[Option<String>], host: &str, port: u16| {
            let request = Request {
                sent,
                ..request("GET", host, port, Some(host), Some(host))
            };
            let brokered = for_request(&s, &headers, &request);
            placeholders_sent(&s, &headers, &request, &brokered)
        };
        // Replaced by the value in its own header: nothing to say.
        assert!(judged(&[llm.clone(), None], "api.llm.test", 443).is_empty());
        // Another host, clear text or not: sent as written.
        assert_eq!(judged(&[llm.clone(), None], "elsewhere.test", 443), ["llm"]);
        // In a header the proxy does not set for it, or another secret's: named too.
        assert_eq!(judged(&[None, llm.clone()], "api.llm.test", 443), ["llm"]);
        assert_eq!(
            judged(&[llm.clone(), other.clone()], "api.llm.test", 443),
            ["other"]
        );
        // Each once, whatever it was sent in; nothing without a placeholder.
        assert_eq!(judged(&[llm.clone(), llm], "a.test", 80), ["llm"]);
        let plain = Some("Bearer pcs-placeholder-".to_string());
        assert!(judged(&[plain, None], "a.test", 80).is_empty());
    }
}
