//! The installer's only way out: a CONNECT proxy that reaches the configured package indexes and
//! nothing else.
//!
//! Each install gets an `--internal` network of its own (no route out of it) holding the installer
//! and one proxy container: the sandbox image running [`PROXY_SCRIPT`] as uid 1000 without
//! capabilities, attached to that network and to Docker's default bridge. pip and uv reach the
//! index through `HTTPS_PROXY`/`HTTP_PROXY` (the proxy's address, so the installer needs no
//! resolver). The proxy accepts a `CONNECT host:port` (or a plain-HTTP request in absolute form)
//! only for an allowed host and port, checked before any name is resolved; it then resolves the
//! name itself and refuses when any address is not global (loopback, private, link-local
//! including the metadata address, CGNAT, multicast, unspecified, reserved, ULA), unless the
//! operator listed that host in `SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE`; it connects to the address it
//! checked. TLS is end to end through the tunnel, so the CA bundle works as before. Everything is
//! labelled like sandboxes and removed after the install (or by a later server's clean-up).

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::config::parse_host_port;
use crate::config::Config;

/// The port the proxy listens on.
pub const PROXY_PORT: u16 = 3128;

/// Runs in the proxy container: `python3 -c PROXY_SCRIPT CONFIG_JSON`.
pub const PROXY_SCRIPT: &str = include_str!("python/egress_proxy.py");

/// What the proxy lets through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EgressPolicy {
    /// Lowercase host names (or addresses) and ports.
    pub allow: Vec<(String, u16)>,
    /// Allowed hosts that may resolve to non-public addresses.
    pub private: Vec<String>,
    pub port: u16,
}

/// The host and port of an http(s) URL (`None` when it has no host).
pub fn host_port(url: &str) -> Option<(String, u16)> {
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

/// The proxy's policy: the index hosts (PyPI's two without a custom index), plus the operator's
/// extra hosts.
pub fn policy(config: &Config) -> EgressPolicy {
    let mut allow: Vec<(String, u16)> = Vec::new();
    match &config.deps.index_url {
        Some(url) => allow.extend(host_port(url)),
        None => {
            allow.push(("pypi.org".into(), 443));
            allow.push(("files.pythonhosted.org".into(), 443));
        }
    }
    allow.extend(
        config
            .deps
            .extra_index_urls
            .iter()
            .filter_map(|u| host_port(u)),
    );
    allow.extend(config.deps.egress_allow.iter().cloned());
    allow.sort();
    allow.dedup();
    EgressPolicy {
        allow,
        private: config.deps.egress_allow_private.clone(),
        port: PROXY_PORT,
    }
}

/// The proxy container's argv.
pub fn proxy_command(policy: &EgressPolicy) -> Vec<String> {
    vec![
        "python3".into(),
        "-c".into(),
        PROXY_SCRIPT.into(),
        serde_json::to_string(policy).unwrap_or_else(|_| "{}".into()),
    ]
}

/// The installer's proxy environment.
pub fn proxy_env(address: &str) -> Vec<String> {
    let url = format!("http://{address}:{PROXY_PORT}");
    [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "https_proxy",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .iter()
    .map(|var| format!("{var}={url}"))
    .chain(["NO_PROXY=".to_string(), "no_proxy=".to_string()])
    .collect()
}

/// Labels of the egress network.
pub fn network_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ports_of_urls() {
        assert_eq!(
            host_port("https://u:p@Mirror.Example:8443/simple"),
            Some(("mirror.example".into(), 8443))
        );
        assert_eq!(
            host_port("http://172.17.0.1:8000/simple/"),
            Some(("172.17.0.1".into(), 8000))
        );
        assert_eq!(
            host_port("https://pypi.org/simple"),
            Some(("pypi.org".into(), 443))
        );
        assert_eq!(parse_host_port("[::1]:80", 443), Some(("::1".into(), 80)));
        assert_eq!(parse_host_port("a b", 443), None);
        assert_eq!(parse_host_port("h:0", 443), None);
    }

    #[test]
    fn the_default_policy_is_pypi_only() {
        let config = Config::default();
        let policy = policy(&config);
        assert_eq!(
            policy.allow,
            [
                ("files.pythonhosted.org".to_string(), 443),
                ("pypi.org".to_string(), 443)
            ]
        );
        assert!(policy.private.is_empty());
        let argv = proxy_command(&policy);
        assert_eq!(argv[..2], ["python3", "-c"]);
        assert!(argv[3].contains("pypi.org"));
    }
}
