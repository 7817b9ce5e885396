//! The way out of the egress network: one proxy per server, for the agent's code
//! (`SANDBOX_NETWORK=allowlist`) and for the dependency installers.
//!
//! Every sandbox on the egress gets an `--internal` network of its own (see [`gateway`]: the host
//! has no address on it, its bridge's IPv4 is inhibited) whose only other member is the server's
//! one proxy, which is also on the uplink network (`SANDBOX_EGRESS_UPLINK`, Docker's default bridge
//! unless the operator names another). The proxy is Squid ([`squid`]), in an image of its own
//! ([`PROXY_IMAGE`]), as uid 1000 without capabilities under a small relay ([`RELAY_SCRIPT`]); it
//! is labelled like the sandboxes, removed at shutdown and swept by a later server if this one
//! dies. Sandboxes reach it through `HTTP(S)_PROXY` (its address on their network: they need no
//! resolver, and theirs answers nothing).
//!
//! The proxy decides nothing: Squid asks the server about every request, through the relay over
//! the container's attached stdin and stdout ([`gateway`]), by the request's source address
//! ([`sources`]): an installer may reach the index hosts ([`IndexPolicy`]); the code may reach
//! what `config::egress` allows, and, in a session, what its user approved when asked (MCP
//! elicitation, through a [`ConsentAsker`]). A name is judged before it is resolved (an unknown
//! name is never looked up); Squid then holds every address it resolves to against the rules the
//! server wrote into its configuration (a non-public one is refused unless an allow entry names
//! it, so DNS cannot turn an allowed name into an internal address; the sandboxes' networks and
//! the proxy's uplink neighbours never). Squid's access log gives each request's outcome and
//! bytes: each execution's result lists what its code reached and was refused.

pub mod broker;
mod gateway;
mod sources;
pub mod squid;

use std::net::IpAddr;

pub use crate::config::parse_host_port;
use crate::config::Config;
use crate::engine::outcome::Stopped;
pub use gateway::{Attachment, Gateway, Lease};
pub use sources::{ConsentAnswer, ConsentAsker, Consideration, Role, SessionNetwork};

/// The port the proxy listens on.
pub const PROXY_PORT: u16 = 3128;

/// The proxy container's pid 1, the relay between Squid and the server:
/// `python3 -c RELAY_SCRIPT CONFIG_JSON`.
pub const RELAY_SCRIPT: &str = include_str!("../python/egress_relay.py");

/// The proxy's image: Debian's Squid and Python (see `engine::docker::image::proxy`).
pub const PROXY_IMAGE: &str = "python-code-sandbox-proxy:bookworm";

/// What the installers may reach: the index hosts (and the operator's extra hosts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexPolicy {
    /// Lowercase host names (or addresses) and ports.
    pub allow: Vec<(String, u16)>,
    /// Allowed hosts that may resolve to non-public addresses.
    pub private: Vec<String>,
}

impl IndexPolicy {
    /// Whether an installer may reach `host:port`, judged before any resolution: an index host
    /// given as an address must be public too, unless the operator said it may not be.
    pub fn decide(&self, host: &str, port: u16) -> Result<(), Stopped> {
        if !self.allow.iter().any(|(h, p)| h == host && *p == port) {
            return Err(Stopped::NotAllowed);
        }
        match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(address) => self.check_resolved(host, &[address]),
            Err(_) => Ok(()),
        }
    }

    /// Every address of an index host must be public, unless the operator said it may not be.
    pub fn check_resolved(&self, host: &str, addresses: &[IpAddr]) -> Result<(), Stopped> {
        if addresses.is_empty() {
            return Err(Stopped::Unresolved);
        }
        if self.private.iter().any(|p| p == host) {
            return Ok(());
        }
        match addresses
            .iter()
            .find(|a| !crate::config::egress::is_public(**a))
        {
            Some(a) => Err(Stopped::NonPublic(*a)),
            None => Ok(()),
        }
    }
}

/// Why the installers' policy or the proxy stopped a connection to `host:port`, in words (the
/// proxy's refusal and the network record say this).
pub fn stopped_reason(host: &str, port: u16, stopped: &Stopped) -> String {
    match stopped {
        Stopped::NotAllowed => format!("{host}:{port} is not an allowed index host"),
        Stopped::OffLimits => format!(
            "{host} is on the sandboxes' own networks or next to the proxy on its uplink, which \
             no sandbox may reach"
        ),
        Stopped::NonPublic(address) => {
            format!("{host} resolves to the non-public address {address}")
        }
        Stopped::Unresolved => format!("{host} does not resolve"),
        Stopped::NoAnswer(how) => format!("{host}:{port} did not answer: {}", how.as_str()),
    }
}

pub use crate::config::url_host_port as host_port;

/// The installers' policy: the index hosts (PyPI's two without a custom index), plus the
/// operator's extra hosts.
pub fn index_policy(config: &Config) -> IndexPolicy {
    let mut allow: Vec<(String, u16)> = Vec::new();
    match &config.deps.index_url {
        Some(url) => allow.extend(host_port(url)),
        None => allow.extend(
            crate::engine::deps::DEFAULT_INDEX_HOSTS
                .iter()
                .map(|h| (h.to_string(), 443)),
        ),
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
    IndexPolicy {
        allow,
        private: config.deps.egress_allow_private.clone(),
    }
}

/// The proxy container's argv: the relay, with Squid's configuration and what it needs
/// (`upstream_bundle`: the host's CA bundle is mounted at [`squid::UPSTREAM_BUNDLE`]).
pub fn proxy_command(config: &Config, upstream_bundle: bool) -> Vec<String> {
    vec![
        "python3".into(),
        "-u".into(),
        "-c".into(),
        RELAY_SCRIPT.into(),
        squid::relay_conf(config, upstream_bundle).to_string(),
    ]
}

/// The variables of a code sandbox's secrets, each holding a placeholder of this sandbox's own:
/// a random token the code sends as it would the key (SDKs that require one start unchanged),
/// which the proxy replaces on the way to the secret's hosts and which means nothing elsewhere.
pub fn placeholders(secrets: &crate::config::secrets::Secrets) -> Vec<String> {
    secrets
        .entries
        .iter()
        .map(|secret| {
            format!(
                "{}=pcs-placeholder-{}-{}",
                secret.env,
                secret.name,
                uuid::Uuid::new_v4().simple()
            )
        })
        .collect()
}

/// The proxy environment of a sandbox on the egress network.
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
    .chain([
        "NO_PROXY=localhost,127.0.0.1,::1".to_string(),
        "no_proxy=localhost,127.0.0.1,::1".to_string(),
    ])
    .collect()
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
        let policy = index_policy(&config);
        assert_eq!(
            policy.allow,
            [
                ("files.pythonhosted.org".to_string(), 443),
                ("pypi.org".to_string(), 443)
            ]
        );
        assert!(policy.private.is_empty());
        assert!(policy.decide("pypi.org", 443).is_ok());
        assert_eq!(policy.decide("pypi.org", 80), Err(Stopped::NotAllowed));
        let local = IndexPolicy {
            allow: vec![("172.17.0.1".into(), 8000)],
            private: Vec::new(),
        };
        assert!(local.decide("172.17.0.1", 8000).is_err(), "not public");
        let local = IndexPolicy {
            private: vec!["172.17.0.1".into()],
            ..local
        };
        assert!(
            local.decide("172.17.0.1", 8000).is_ok(),
            "allowed explicitly"
        );
        let argv = proxy_command(&config, false);
        assert_eq!(argv[..3], ["python3", "-u", "-c"]);
        assert!(argv[4].contains("3128"));
        let private: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(
            policy.check_resolved("pypi.org", &[private]),
            Err(Stopped::NonPublic(private))
        );
        assert_eq!(
            policy.check_resolved("pypi.org", &[]),
            Err(Stopped::Unresolved)
        );
        assert_eq!(
            stopped_reason("pypi.org", 443, &Stopped::NonPublic(private)),
            "pypi.org resolves to the non-public address 10.0.0.1"
        );
    }
}
