//! The egress proxy's Squid: its configuration, written here from the server's settings, and
//! what the relay in its container (`python/egress_relay.py`) needs to start it.
//!
//! Squid does the HTTP: it parses requests (a malformed one is answered `400` at once), judges
//! *every* request, pipelined and persistent ones too, sends the URL's host as `Host` (a request
//! cannot name one host and reach another), caps connections per sandbox
//! (`client_ip_max_connections`; each sandbox has an address of its own) and in all (its
//! descriptors), times out slow and idle clients, resolves names once for both the checks and
//! the connection (its cache keeps an answer at least `negative_dns_ttl`), and logs each request
//! with its bytes and outcome.
//!
//! It decides nothing on its own: every request goes to the server first
//! (`external_acl_type`, never cached), which answers from the sandbox's role, the policy and
//! the user's consent ([`super::sources`]), and tags its yes with what the sandbox is. Squid then
//! refuses, for every address the name resolves to (its `dst` ACLs), what the policy says no
//! address may be: the sandboxes' own networks and the proxy's uplink neighbours always, and a
//! non-public address unless the tag or an address entry of `SANDBOX_EGRESS_ALLOW` for that
//! port says it may be ([`address_rules`]).

use std::fmt::Write as _;

use ipnet::IpNet;

use super::PROXY_PORT;
use crate::config::egress::non_public_ranges;
use crate::config::Config;

/// At most this many connections from one sandbox at once (its browser-like clients open a few;
/// a flood stops here, far below what the proxy holds for everyone).
pub const PER_SANDBOX_CONNECTIONS: u32 = 64;
/// The proxy's descriptors (its container's `nofile`): two per connection, for
/// [`PER_SANDBOX_CONNECTIONS`] from over a hundred sandboxes at once. No higher: an engine
/// cannot grant more than its own hard limit (20000 on some hosts), and the container would not
/// start.
pub const PROXY_DESCRIPTORS: u64 = 16384;

/// The tag of a yes: what Squid may let the request's addresses be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The code: public addresses, and those an address entry names for the port.
    Code,
    /// An installer: public addresses only.
    Index,
    /// An installer's host the operator allowed to be non-public
    /// (`SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE`).
    Private,
}

impl Tag {
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Code => "code",
            Tag::Index => "index",
            Tag::Private => "private",
        }
    }
}

/// The refusal pages: the body a refused request gets starts with these words.
pub const REFUSED: &str = "refused by the sandbox's egress proxy: ";

/// Squid's error page names (`deny_info`) for the server's refusals, an address no request may
/// reach, and an address the tag does not allow; the access log names them.
pub const PAGE_REFUSED: &str = "ERR_PCS_REFUSED";
pub const PAGE_FORBIDDEN: &str = "ERR_PCS_FORBIDDEN";
pub const PAGE_ADDRESS: &str = "ERR_PCS_ADDRESS";

/// The relay's configuration: `python3 -c RELAY CONF`.
pub fn relay_conf(config: &Config) -> serde_json::Value {
    let resolve: serde_json::Map<String, serde_json::Value> = config
        .egress
        .resolve
        .iter()
        .map(|(name, address)| (name.clone(), address.to_string().into()))
        .collect();
    serde_json::json!({
        "port": PROXY_PORT,
        "squid_conf": squid_conf(config),
        "resolve": resolve,
        "forbidden": [config.egress.subnets.to_string()],
        "pages": {
            PAGE_REFUSED: format!("{REFUSED}%o\n"),
            PAGE_FORBIDDEN: format!(
                "{REFUSED}%H is on the sandboxes' own networks or next to the proxy on its uplink, \
                 which no sandbox may reach\n"
            ),
            PAGE_ADDRESS: format!(
                "{REFUSED}%H resolves to a non-public address that no setting allows this sandbox \
                 on port %p\n"
            ),
        },
    })
}

/// One ACL line per range list: Squid reads a long line fine, and each list stays whole.
fn acl(out: &mut String, name: &str, kind: &str, values: impl IntoIterator<Item = String>) {
    let values: Vec<String> = values.into_iter().collect();
    let _ = writeln!(out, "acl {name} {kind} {}", values.join(" "));
}

/// The ranges of `from` that hold no address of `take` (ranges split where needed).
pub fn subtract(from: &[IpNet], take: &[IpNet]) -> Vec<IpNet> {
    let mut out = Vec::new();
    let mut work: Vec<IpNet> = from.to_vec();
    while let Some(net) = work.pop() {
        if take.iter().any(|t| t.contains(&net)) {
            continue;
        }
        if take.iter().any(|t| net.contains(t)) {
            let halves = net
                .subnets(net.prefix_len() + 1)
                .map(|s| s.collect::<Vec<_>>())
                .unwrap_or_default();
            work.extend(halves);
            continue;
        }
        out.push(net);
    }
    out.sort();
    out
}

/// The `dst` rules (after the server's yes): which non-public addresses a request may not
/// resolve to, by tag and port.
pub fn address_rules(config: &Config) -> String {
    let mut out = String::new();
    let non_public = non_public_ranges();
    acl(
        &mut out,
        "pcs_non_public",
        "dst",
        non_public.iter().map(|n| n.to_string()),
    );
    out.push_str("http_access allow pcs_tag_private\n");
    out.push_str("http_access deny !pcs_tag_code pcs_non_public\n");
    let ports = config.egress.allow.address_ports();
    for port in &ports {
        let rest = subtract(&non_public, &config.egress.allow.ranges_on(*port));
        acl(
            &mut out,
            &format!("pcs_port_{port}"),
            "port",
            [port.to_string()],
        );
        if rest.is_empty() {
            continue;
        }
        acl(
            &mut out,
            &format!("pcs_non_public_{port}"),
            "dst",
            rest.iter().map(|n| n.to_string()),
        );
        let _ = writeln!(
            out,
            "http_access deny pcs_port_{port} pcs_non_public_{port}"
        );
        let _ = writeln!(out, "deny_info {PAGE_ADDRESS} pcs_non_public_{port}");
    }
    if ports.is_empty() {
        out.push_str("http_access deny pcs_non_public\n");
    } else {
        acl(
            &mut out,
            "pcs_address_ports",
            "port",
            ports.iter().map(|p| p.to_string()),
        );
        out.push_str("http_access deny !pcs_address_ports pcs_non_public\n");
    }
    let _ = writeln!(out, "deny_info {PAGE_ADDRESS} pcs_non_public");
    out
}

/// Squid's whole configuration.
pub fn squid_conf(config: &Config) -> String {
    let home = "/tmp/pcs";
    let mut out = format!(
        "# Written by python-code-sandbox (src/engine/egress/squid.rs).\n\
         http_port {PROXY_PORT}\n\
         pid_filename none\n\
         cache deny all\n\
         cache_mem 0\n\
         memory_cache_shared off\n\
         netdb_filename none\n\
         pinger_enable off\n\
         coredump_dir none\n\
         cache_log stdio:/dev/stderr\n\
         debug_options ALL,1\n\
         logformat pcs %master_xaction %>a %rm %>rd %>rP %>Hs %Ss %>st %<st %err_code %err_detail %<a\n\
         access_log stdio:/dev/stdout pcs\n\
         buffered_logs off\n\
         logfile_rotate 0\n\
         via off\n\
         forwarded_for delete\n\
         httpd_suppress_version_string on\n\
         error_directory {home}/errors\n\
         hosts_file {home}/hosts\n\
         dns_timeout 10 seconds\n\
         negative_dns_ttl 1 minutes\n\
         connect_timeout 10 seconds\n\
         request_start_timeout 10 seconds\n\
         request_timeout 10 seconds\n\
         client_idle_pconn_timeout 30 seconds\n\
         half_closed_clients off\n\
         client_ip_max_connections {PER_SANDBOX_CONNECTIONS}\n\
         max_filedescriptors {PROXY_DESCRIPTORS}\n\
         shutdown_lifetime 1 seconds\n\
         external_acl_type pcs_decide ttl=0 negative_ttl=0 concurrency=100 children-max=2 \
         children-startup=1 %master_xaction %SRC %DST %PORT %METHOD \
         /usr/bin/python3 {home}/helper.py {home}/decide.sock\n\
         acl pcs_decided external pcs_decide\n\
         acl pcs_tag_code tag {code}\n\
         acl pcs_tag_private tag {private}\n\
         acl pcs_forbidden dst \"{home}/forbidden\"\n\
         http_access deny manager\n\
         http_access deny pcs_forbidden\n\
         deny_info {PAGE_FORBIDDEN} pcs_forbidden\n\
         http_access deny !pcs_decided\n\
         deny_info {PAGE_REFUSED} pcs_decided\n",
        code = Tag::Code.as_str(),
        private = Tag::Private.as_str(),
    );
    out.push_str(&address_rules(config));
    out.push_str("http_access allow all\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::egress::{is_public, EgressRules};
    use std::net::IpAddr;

    fn net(text: &str) -> IpNet {
        text.parse().expect("a range")
    }

    #[test]
    fn subtracting_ranges_splits_only_where_needed() {
        let rest = subtract(&[net("10.0.0.0/8")], &[net("10.1.0.0/16")]);
        assert_eq!(rest.len(), 8);
        let one: IpAddr = "10.1.2.3".parse().unwrap();
        let other: IpAddr = "10.2.0.1".parse().unwrap();
        assert!(!rest.iter().any(|n| n.contains(&one)));
        assert!(rest.iter().any(|n| n.contains(&other)));
        assert!(subtract(&[net("10.1.0.0/16")], &[net("10.0.0.0/8")]).is_empty());
        assert_eq!(
            subtract(&[net("192.168.0.0/16")], &[net("10.0.0.0/8")]),
            [net("192.168.0.0/16")]
        );
    }

    #[test]
    fn the_ranges_hold_every_address_that_is_not_public() {
        let ranges = non_public_ranges();
        let covered = |ip: IpAddr| ranges.iter().any(|n| n.contains(&ip));
        for text in [
            "10.213.0.2",
            "127.0.0.1",
            "169.254.169.254",
            "172.17.0.1",
            "100.64.1.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a00:1::",
            "2001:db8::1",
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "2002:808:808::",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(covered(ip), !is_public(ip), "{ip}");
        }
    }

    #[test]
    fn an_address_entry_opens_its_range_on_its_port_only() {
        let mut config = Config::default();
        config.egress.allow = EgressRules::parse("10.0.0.0/8:8443,api.test").unwrap();
        let rules = address_rules(&config);
        let line = rules
            .lines()
            .find(|l| l.starts_with("acl pcs_non_public_8443 dst "))
            .expect("a list for port 8443");
        let ranges: Vec<IpNet> = line
            .split_whitespace()
            .skip(3)
            .map(|n| n.parse().unwrap())
            .collect();
        let inside: IpAddr = "10.9.8.7".parse().unwrap();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(!ranges.iter().any(|n| n.contains(&inside)));
        assert!(ranges.iter().any(|n| n.contains(&loopback)));
        assert!(rules.contains("http_access deny !pcs_address_ports pcs_non_public\n"));
        // An installer's request is held to public addresses whatever the code may reach.
        let index = rules.find("deny !pcs_tag_code pcs_non_public").unwrap();
        assert!(index < rules.find("pcs_port_8443 pcs_non_public_8443").unwrap());
        let conf = squid_conf(&config);
        let forbidden = conf.find("http_access deny pcs_forbidden").unwrap();
        let asked = conf.find("http_access deny !pcs_decided").unwrap();
        let private = conf.find("http_access allow pcs_tag_private").unwrap();
        assert!(forbidden < asked && asked < private, "{conf}");
        assert!(conf.trim_end().ends_with("http_access allow all"));
        // A name's answer stays cached at least this long: the checks and the connection see the
        // same addresses (DNS rebinding between the two finds the cache).
        assert!(conf.contains("negative_dns_ttl 1 minutes\n"));
    }

    #[test]
    fn without_address_entries_no_non_public_address_is_reached() {
        let rules = address_rules(&Config::default());
        assert!(rules.contains("http_access deny pcs_non_public\n"));
        let conf = relay_conf(&Config::default());
        assert_eq!(conf["forbidden"][0], "10.213.0.0/16");
        assert!(conf["squid_conf"]
            .as_str()
            .unwrap()
            .contains("client_ip_max_connections 64"));
    }
}
