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
//!
//! With secrets (`SANDBOX_SECRETS_FILE`), Squid terminates TLS only where a secret is to be added
//! ([`bump_rules`]): it peeks at each tunnel's TLS hello, and bumps it (with a CA the proxy made
//! at start-up, whose key never leaves its container) only when the server tagged the `CONNECT`
//! `bump=yes` (a name bound to a secret of that sandbox) and a second question, with the hello's
//! SNI, found that it names the same host; everything else is spliced, untouched. Each request
//! inside a bumped tunnel is asked about again, with its `Host` and the SNI, and the server's yes
//! carries the header's value as a note (`pcs_h0`, ...) that Squid puts in that header, in place
//! of whatever the request sent there. Upstreams are verified against the host's bundle.

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

/// Where the relay keeps its files in the proxy container (its tmpfs).
pub const HOME: &str = "/tmp/pcs";
/// The note that asks Squid to bump a tunnel.
pub const NOTE_BUMP: &str = "bump";
/// Where the host's CA bundle is mounted in the proxy container (upstreams are verified against
/// it, besides the proxy's own system store).
pub const UPSTREAM_BUNDLE: &str = "/etc/pcs-upstream-ca.pem";

/// The note that carries the value of the `index`th header of [`secret_headers`].
pub fn header_note(index: usize) -> String {
    format!("pcs_h{index}")
}

/// Headers the proxy can set for principals' own secrets (`secrets=` in the tokens file, read
/// again on SIGHUP), besides those of the server's: the usual places of an API key. A
/// principal's secret in another header is not sent, and the log says why.
pub const COMMON_SECRET_HEADERS: &[&str] = &[
    "Authorization",
    "X-Api-Key",
    "Api-Key",
    "X-Goog-Api-Key",
    "Private-Token",
    "X-Auth-Token",
];

/// Whether the proxy brokers secrets: the server has some, or principals may have their own
/// (a tokens file).
pub fn brokers_secrets(config: &Config) -> bool {
    !config.secrets.is_empty() || config.http.tokens_file.is_some()
}

/// The headers the proxy can set, in its configuration's order (a note's index is a header's
/// place here): the server's secrets', then [`COMMON_SECRET_HEADERS`]. Empty when it brokers
/// none.
pub fn secret_headers(config: &Config) -> Vec<String> {
    if !brokers_secrets(config) {
        return Vec::new();
    }
    let mut headers = config.secrets.headers();
    for common in COMMON_SECRET_HEADERS {
        if !headers.iter().any(|h| h.eq_ignore_ascii_case(common)) {
            headers.push(common.to_string());
        }
    }
    headers
}

/// The refusal pages: the body a refused request gets starts with these words.
pub const REFUSED: &str = "refused by the sandbox's egress proxy: ";

/// Squid's error page names (`deny_info`) for the server's refusals, an address no request may
/// reach, and an address the tag does not allow; the access log names them.
pub const PAGE_REFUSED: &str = "ERR_PCS_REFUSED";
pub const PAGE_FORBIDDEN: &str = "ERR_PCS_FORBIDDEN";
pub const PAGE_ADDRESS: &str = "ERR_PCS_ADDRESS";

/// The relay's configuration: `python3 -c RELAY CONF`.
pub fn relay_conf(config: &Config, upstream_bundle: bool) -> serde_json::Value {
    let resolve: serde_json::Map<String, serde_json::Value> = config
        .egress
        .resolve
        .iter()
        .map(|(name, address)| (name.clone(), address.to_string().into()))
        .collect();
    serde_json::json!({
        "port": PROXY_PORT,
        "squid_conf": squid_conf(config, upstream_bundle),
        "bump": brokers_secrets(config),
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

/// With secrets: the TLS of a tunnel is bumped only where the server asked for it and the SNI
/// agreed, and each header a secret goes in is replaced by the server's note (see the module's
/// documentation). Empty without secrets.
pub fn bump_rules(config: &Config, upstream_bundle: bool) -> String {
    let headers = secret_headers(config);
    if headers.is_empty() {
        return String::new();
    }
    // What a bumped tunnel carries first that is not HTTP/1 (HTTP/2's preface, TLS again,
    // anything) is answered with an error, never tunnelled on unjudged to the upstream
    // (`on_unsupported_protocol` acts on bumped tunnels only; spliced ones are never parsed).
    let mut out = format!(
        "sslcrtd_program /usr/lib/squid/security_file_certgen -s {HOME}/ssl_db -M 4MB\n\
         sslcrtd_children 4 startup=1 idle=1\n\
         external_acl_type pcs_sni ttl=0 negative_ttl=0 concurrency=100 children-max=2 \
         children-startup=1 %master_xaction %SRC %DST %PORT %ssl::>sni \
         /usr/bin/python3 {HOME}/helper.py {HOME}/sni.sock\n\
         acl pcs_step1 at_step SslBump1\n\
         acl pcs_bump note {NOTE_BUMP} yes\n\
         acl pcs_sni_agrees external pcs_sni\n\
         ssl_bump peek pcs_step1\n\
         ssl_bump bump pcs_bump pcs_sni_agrees\n\
         ssl_bump splice all\n\
         on_unsupported_protocol respond all\n\
         sslproxy_cert_error deny all\n"
    );
    if upstream_bundle {
        let _ = writeln!(out, "tls_outgoing_options cafile={UPSTREAM_BUNDLE}");
    }
    for (index, header) in headers.iter().enumerate() {
        let note = header_note(index);
        let _ = writeln!(out, "acl pcs_inject_{index} note {note}");
        let _ = writeln!(
            out,
            "request_header_access {header} deny pcs_inject_{index}"
        );
        // `%'` puts the note as it is (the value is printable ASCII without quotes).
        let _ = writeln!(
            out,
            "request_header_add {header} \"%'{{{note}}}note\" pcs_inject_{index}"
        );
    }
    out
}

/// Squid's whole configuration (`upstream_bundle`: the host's CA bundle is mounted at
/// [`UPSTREAM_BUNDLE`]).
pub fn squid_conf(config: &Config, upstream_bundle: bool) -> String {
    let home = HOME;
    let port_line = if !brokers_secrets(config) {
        format!("http_port {PROXY_PORT}")
    } else {
        format!(
            "http_port {PROXY_PORT} ssl-bump generate-host-certificates=on \
             dynamic_cert_mem_cache_size=4MB tls-cert={home}/ca.pem tls-key={home}/ca.key"
        )
    };
    // With secrets, each request also carries the values of the headers the proxy can set, as
    // sent: a placeholder there that gets no value is recorded (see [`super::broker`]).
    let sent: String = secret_headers(config)
        .iter()
        .map(|header| format!(" %>{{{header}}}"))
        .collect();
    let mut out = format!(
        "# Written by python-code-sandbox (src/engine/egress/squid.rs).\n\
         {port_line}\n\
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
         request_header_max_size 64 KB\n\
         client_idle_pconn_timeout 30 seconds\n\
         half_closed_clients off\n\
         client_ip_max_connections {PER_SANDBOX_CONNECTIONS}\n\
         max_filedescriptors {PROXY_DESCRIPTORS}\n\
         shutdown_lifetime 1 seconds\n\
         external_acl_type pcs_decide ttl=0 negative_ttl=0 concurrency=100 children-max=2 \
         children-startup=1 %master_xaction %SRC %DST %PORT %METHOD %>{{Host}} %ssl::>sni{sent} \
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
    out.push_str(&bump_rules(config, upstream_bundle));
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
        let conf = squid_conf(&config, false);
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
        let conf = relay_conf(&Config::default(), false);
        assert_eq!(conf["forbidden"][0], "10.213.0.0/16");
        assert!(conf["squid_conf"]
            .as_str()
            .unwrap()
            .contains("client_ip_max_connections 64"));
    }

    #[test]
    fn with_secrets_each_question_carries_the_headers_the_proxy_can_set() {
        use crate::config::secrets::{BoundHost, Secret, SecretValue, Secrets};
        let plain = squid_conf(&Config::default(), false);
        assert!(
            plain.contains("%ssl::>sni /usr/bin/python3") && !plain.contains("ssl_bump"),
            "{plain}"
        );
        let secrets = std::sync::Arc::new(Secrets {
            entries: vec![Secret {
                name: "llm".into(),
                value: SecretValue::new("v".into()),
                hosts: vec![BoundHost {
                    pattern: "api.llm.test".into(),
                    port: 443,
                }],
                header: "X-Llm-Key".into(),
                format: "{value}".into(),
                env: "LLM_KEY".into(),
            }],
            file: None,
        });
        let config = Config {
            secrets,
            ..Config::default()
        };
        let conf = squid_conf(&config, false);
        let asked: String = secret_headers(&config)
            .iter()
            .map(|h| format!(" %>{{{h}}}"))
            .collect();
        assert!(
            asked.starts_with(" %>{X-Llm-Key} %>{Authorization}"),
            "{asked}"
        );
        assert!(
            conf.contains(&format!("%ssl::>sni{asked} /usr/bin/python3")),
            "{conf}"
        );
        assert!(conf.contains("request_header_max_size 64 KB\n"));
    }
}
