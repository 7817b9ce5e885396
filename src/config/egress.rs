//! Which hosts the code's sandbox may reach with `SANDBOX_NETWORK=allowlist`: the grammar of
//! `SANDBOX_EGRESS_ALLOW` and `SANDBOX_EGRESS_ASK`, and the decisions the egress proxy takes on
//! each connection attempt. Pure logic: nothing here resolves a name or opens a connection.
//!
//! # The grammar
//!
//! A list of comma-separated entries; whitespace around an entry is trimmed and empty entries are
//! ignored. An entry is a target and an optional `:port` (1 to 65535); without a port it allows
//! ports 80 and 443, the web's two.
//!
//! - A name: `host` exactly, `*.suffix` (any name ending in `.suffix` with at least one more
//!   label: `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com` nor
//!   `badexample.com`), or `*` (any name). Names are case-insensitive and a trailing dot is
//!   ignored; labels are 1 to 63 characters of `a-z`, `0-9`, `-` and `_`, 253 characters at most
//!   in all; `*` only as the whole first label. A name whose last label is a number (`1.2.3`,
//!   `0x7f`) is refused: resolvers read it as an address.
//! - An address: IPv4 `a.b.c.d` or a range `a.b.c.d/n`; IPv6 in brackets, `[::1]` or
//!   `[fd00::/8]` (the brackets keep the port apart). An address entry allows connecting to an
//!   address inside it, given as an address, and lets an allowed *name* resolve to a non-public
//!   address inside it (a service on the operator's own network).
//!
//! # The decisions
//!
//! For a connection attempt to (host, port) ([`EgressPolicy::decide`], then
//! [`EgressPolicy::check_resolved`] once the proxy resolved the name):
//!
//! 1. An address is allowed only when an address entry of `SANDBOX_EGRESS_ALLOW` holds it: a
//!    name entry never allows an address, so `*` cannot be used to reach `169.254.169.254`.
//! 2. A name `SANDBOX_EGRESS_ALLOW` matches is allowed; one `SANDBOX_EGRESS_ASK` matches needs the
//!    user's consent (the session's record of answers is the caller's); anything else is refused.
//! 3. An allowed name is connected to only when *every* address it resolves to is public, or
//!    inside an address entry: all or nothing, so a name that resolves to a public and a private
//!    address cannot be used to reach the private one (DNS rebinding, a hostile resolver). The
//!    proxy connects to the addresses it checked, never resolving again.
//!
//! "Public" ([`is_public`]) excludes loopback, private (RFC 1918), link-local (the cloud
//! metadata address `169.254.169.254` among them), shared (CGNAT `100.64.0.0/10`), multicast,
//! unspecified, broadcast and reserved, documentation and benchmarking ranges; for IPv6 also
//! unique-local `fc00::/7`, site-local `fec0::/10`, everything outside global unicast `2000::/3`,
//! and the IETF protocol range `2001::/23` (Teredo among them). Addresses that carry an IPv4
//! address (v4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged by
//! that IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// The name part of a name entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name exactly (lower case, no trailing dot).
    Exact(String),
    /// Any name ending in `.` and this suffix, with at least one more label (stored without
    /// the `*.`).
    Suffix(String),
    /// Any name (`*`).
    Any,
}

impl HostPattern {
    /// Whether the pattern matches `host` (normalized: lower case, no trailing dot).
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => host == name,
            HostPattern::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty()),
            HostPattern::Any => true,
        }
    }
}

/// One entry of `SANDBOX_EGRESS_ALLOW` or `SANDBOX_EGRESS_ASK`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub target: EntryTarget,
    pub ports: Ports,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryTarget {
    Name(HostPattern),
    /// An address or range (an address alone is a range of one), its host bits cleared.
    Range(IpNet),
}

/// The ports an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// 80 and 443: the entry gave no port.
    Web,
    One(u16),
}

impl Ports {
    pub fn contains(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(p) => p == port,
        }
    }
}

/// A parsed `SANDBOX_EGRESS_ALLOW` or `SANDBOX_EGRESS_ASK`.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct EgressRules {
    pub entries: Vec<Entry>,
}

impl EgressRules {
    /// Parses a comma-separated list of entries (see the module docs). The error says which
    /// entry is wrong and why.
    pub fn parse(text: &str) -> Result<EgressRules, String> {
        let entries = text
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .enumerate()
            .map(|(i, entry)| {
                parse_entry(entry).map_err(|why| format!("entry {} `{entry}`: {why}", i + 1))
            })
            .collect::<Result<_, _>>()?;
        Ok(EgressRules { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether an entry is `*` (with any port).
    pub fn has_any(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.target == EntryTarget::Name(HostPattern::Any))
    }

    /// Whether a name entry allows `host` (normalized: see [`normalize_host`]) on `port`.
    pub fn permits_name(&self, host: &str, port: u16) -> bool {
        self.entries.iter().any(|e| match &e.target {
            EntryTarget::Name(pattern) => e.ports.contains(port) && pattern.matches(host),
            EntryTarget::Range(_) => false,
        })
    }

    /// The ports some address entry allows.
    pub fn address_ports(&self) -> std::collections::BTreeSet<u16> {
        self.entries
            .iter()
            .filter(|e| matches!(e.target, EntryTarget::Range(_)))
            .flat_map(|e| match e.ports {
                Ports::Web => vec![80, 443],
                Ports::One(port) => vec![port],
            })
            .collect()
    }

    /// The ranges address entries allow on `port`.
    pub fn ranges_on(&self, port: u16) -> Vec<IpNet> {
        self.entries
            .iter()
            .filter(|e| e.ports.contains(port))
            .filter_map(|e| match e.target {
                EntryTarget::Range(net) => Some(net),
                EntryTarget::Name(_) => None,
            })
            .collect()
    }

    /// Whether an address entry holds `ip` on `port`. A v4-mapped IPv6 address is also matched
    /// as the IPv4 address it carries.
    pub fn permits_address(&self, ip: IpAddr, port: u16) -> bool {
        let mapped = unmap(ip);
        self.entries.iter().any(|e| match &e.target {
            EntryTarget::Range(net) => {
                e.ports.contains(port) && (net.contains(&ip) || net.contains(&mapped))
            }
            EntryTarget::Name(_) => false,
        })
    }
}

/// The egress settings together (`SANDBOX_EGRESS_*`), used when `SANDBOX_NETWORK=allowlist`.
#[derive(Debug, Clone, PartialEq)]
pub struct EgressPolicy {
    /// `SANDBOX_EGRESS_ALLOW`: allowed without asking.
    pub allow: EgressRules,
    /// `SANDBOX_EGRESS_ASK`: allowed once the user agrees, per session.
    pub ask: EgressRules,
    /// `SANDBOX_EGRESS_ALLOW_ALL`: the operator's confirmation that `*` in `allow` is meant.
    pub allow_all: bool,
    /// `SANDBOX_EGRESS_RESOLVE`: test-only name overrides (names under `.test` only).
    pub resolve: Vec<(String, IpAddr)>,
    /// `SANDBOX_EGRESS_UPLINK`: the Docker network the proxy reaches outside hosts through.
    pub uplink: String,
    /// `SANDBOX_EGRESS_SUBNETS`: where each sandbox's own egress network gets its small subnet.
    pub subnets: ipnet::Ipv4Net,
}

/// The default of `SANDBOX_EGRESS_SUBNETS`: outside Docker's default address pools.
pub const DEFAULT_SUBNETS: &str = "10.213.0.0/16";

/// The prefix of one sandbox's egress network: room for the proxy, the sandbox, and the
/// addresses Docker reserves (network, gateway, broadcast).
pub const SANDBOX_SUBNET_PREFIX: u8 = 29;

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allow: EgressRules::default(),
            ask: EgressRules::default(),
            allow_all: false,
            resolve: Vec::new(),
            uplink: "bridge".to_string(),
            subnets: DEFAULT_SUBNETS
                .parse()
                .unwrap_or_else(|_| ipnet::Ipv4Net::default()),
        }
    }
}

/// Where a connection attempt goes: a name to resolve, or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Address(IpAddr),
}

/// The decision on a target before any resolution (no session state: the caller adds what the
/// user approved or declined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Static {
    Allowed,
    /// A name `SANDBOX_EGRESS_ASK` matches: allowed if the user agrees.
    Ask,
    /// Refused, and why (the message the proxy gives).
    Refused(String),
}

impl EgressPolicy {
    /// Rules 1 and 2 (see the module docs), without what the user answered in a session.
    pub fn decide(&self, target: &Target, port: u16) -> Static {
        match target {
            Target::Address(ip) if self.allow.permits_address(*ip, port) => Static::Allowed,
            Target::Address(ip) => Static::Refused(format!(
                "{} is an IP address; only addresses SANDBOX_EGRESS_ALLOW names are allowed",
                SocketAddr::new(*ip, port)
            )),
            Target::Name(host) if self.allow.permits_name(host, port) => Static::Allowed,
            Target::Name(host) if self.ask.permits_name(host, port) => Static::Ask,
            Target::Name(host) => {
                Static::Refused(format!("{host}:{port} is not in SANDBOX_EGRESS_ALLOW"))
            }
        }
    }

    /// Rule 3: every address an allowed name resolved to must be public or inside an address
    /// entry of `SANDBOX_EGRESS_ALLOW` (on `port`).
    pub fn check_resolved(
        &self,
        host: &str,
        port: u16,
        addresses: &[IpAddr],
    ) -> Result<(), String> {
        if addresses.is_empty() {
            return Err(format!("{host} does not resolve"));
        }
        match addresses
            .iter()
            .find(|ip| !is_public(**ip) && !self.allow.permits_address(**ip, port))
        {
            Some(ip) => Err(format!("{host} resolves to the non-public address {ip}")),
            None => Ok(()),
        }
    }

    /// The address `SANDBOX_EGRESS_RESOLVE` maps `host` (normalized) to, if any.
    pub fn resolve_override(&self, host: &str) -> Option<IpAddr> {
        self.resolve
            .iter()
            .find(|(name, _)| name == host)
            .map(|(_, ip)| *ip)
    }
}

/// Whether `ip` is a public address (see the module docs for what is not).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

/// IPv4 ranges that are not public.
const NOT_PUBLIC_V4: &[([u8; 4], u8)] = &[
    ([0, 0, 0, 0], 8),       // "this network", unspecified
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // shared address space (CGNAT)
    ([127, 0, 0, 0], 8),     // loopback
    ([169, 254, 0, 0], 16),  // link-local, the cloud metadata address
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation (TEST-NET-1)
    ([192, 88, 99, 0], 24),  // 6to4 relay anycast (deprecated)
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation (TEST-NET-2)
    ([203, 0, 113, 0], 24),  // documentation (TEST-NET-3)
    ([224, 0, 0, 0], 4),     // multicast
    ([240, 0, 0, 0], 4),     // reserved, and the broadcast address
];

/// IPv6 ranges inside global unicast (`2000::/3`) that are not public.
const NOT_PUBLIC_V6: &[(u128, u8)] = &[
    (0x2001_0000 << 96, 23), // IETF protocol assignments (Teredo, benchmarking, ...)
    (0x2001_0db8 << 96, 32), // documentation
    (0x3fff_0000 << 96, 20), // documentation
    (0x0064_ff9b_0001 << 80, 48), // local-use NAT64
];

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let bits = u32::from(ip);
    !NOT_PUBLIC_V4.iter().any(|(network, prefix)| {
        let mask = u32::MAX << (32 - u32::from(*prefix));
        bits & mask == u32::from(Ipv4Addr::from(*network))
    })
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let bits = u128::from(ip);
    let global_unicast = bits >> 125 == 0b001;
    global_unicast
        && !NOT_PUBLIC_V6.iter().any(|(network, prefix)| {
            let mask = u128::MAX << (128 - u32::from(*prefix));
            bits & mask == *network
        })
}

/// Every range holding a non-public address, as ranges a proxy can match a resolved address
/// against: the IPv4 ranges, everything outside IPv6 global unicast (v4-mapped and NAT64
/// addresses among it, whatever they carry: stricter than [`is_public`] there), the non-public
/// ranges inside it, and 6to4 addresses carrying a non-public IPv4 address.
pub fn non_public_ranges() -> Vec<IpNet> {
    let mut ranges: Vec<IpNet> = NOT_PUBLIC_V4
        .iter()
        .filter_map(|(network, prefix)| {
            ipnet::Ipv4Net::new(Ipv4Addr::from(*network), *prefix)
                .ok()
                .map(IpNet::V4)
        })
        .collect();
    let v6 = |bits: u128, prefix: u8| ipnet::Ipv6Net::new(Ipv6Addr::from(bits), prefix).ok();
    let outside_global_unicast = [(0u128, 3u8), (0x4 << 124, 2), (0x8 << 124, 1)];
    let six_to_four = NOT_PUBLIC_V4.iter().map(|(network, prefix)| {
        let v4 = u128::from(u32::from(Ipv4Addr::from(*network)));
        ((0x2002u128 << 112) | (v4 << 80), 16 + prefix)
    });
    ranges.extend(
        outside_global_unicast
            .into_iter()
            .chain(NOT_PUBLIC_V6.iter().copied())
            .chain(six_to_four)
            .filter_map(|(bits, prefix)| v6(bits, prefix).map(IpNet::V6)),
    );
    ranges
}

/// The IPv4 address an IPv6 address stands for, when it carries one that decides where it
/// goes: v4-mapped (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let bits = u128::from(ip);
    if bits >> 32 == 0x0064_ff9b << 64 {
        return Some(Ipv4Addr::from(bits as u32));
    }
    if bits >> 112 == 0x2002 {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    None
}

/// A v4-mapped IPv6 address as the IPv4 address it carries; any other address as it is.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// A host as the proxy compares it: a name in lower case without its trailing dot, or an
/// address in its canonical form (IPv6 without brackets). `None` when it is neither a valid name
/// nor an address.
pub fn normalize_host(host: &str) -> Option<String> {
    match target_of(host)? {
        Target::Name(name) => Some(name),
        Target::Address(ip) => Some(ip.to_string()),
    }
}

/// What a host names: `[::1]`, `::1` and `1.2.3.4` are addresses, anything else a name
/// (normalized); `None` when it is neither.
pub fn target_of(host: &str) -> Option<Target> {
    let bare = host
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'));
    if let Some(inner) = bare {
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| Target::Address(ip.into()));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(Target::Address(ip));
    }
    name(host).ok().map(Target::Name)
}

/// Validates and normalizes a name (not a pattern): lower case, one trailing dot removed.
pub(super) fn name(text: &str) -> Result<String, &'static str> {
    let lower = text.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > 253 {
        return Err("a name is at most 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)");
        }
        if label.len() > 63 {
            return Err("a label is at most 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err("a name's labels are made of a-z, 0-9, '-' and '_'");
        }
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err("not a valid IPv4 address, and a name cannot end in a number");
    }
    Ok(name.to_string())
}

fn parse_entry(entry: &str) -> Result<Entry, String> {
    if entry.contains(char::is_whitespace) {
        return Err("spaces inside an entry (entries are separated by commas)".to_string());
    }
    let (target, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address opened with '[' has no closing ']'")?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or("only `:port` may follow an IPv6 address in brackets")?,
            ),
        };
        let net = parse_range(inside)?;
        if !matches!(net, IpNet::V6(_)) {
            return Err("brackets are for IPv6 addresses; write IPv4 without them".to_string());
        }
        (EntryTarget::Range(net), port)
    } else {
        let (host, port) = match entry.split_once(':') {
            Some((_, rest)) if rest.contains(':') => {
                return Err(
                    if entry.parse::<IpNet>().is_ok() || entry.parse::<IpAddr>().is_ok() {
                        "an IPv6 address goes in brackets: [::1], [fd00::/8]:8080".to_string()
                    } else {
                        "more than one ':' (the form is host:port)".to_string()
                    },
                )
            }
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        };
        (parse_target(host)?, port)
    };
    let ports = match port {
        None => Ports::Web,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 => Ports::One(p),
            _ => return Err(format!("port `{port}` is not a number from 1 to 65535")),
        },
    };
    Ok(Entry { target, ports })
}

/// A name, a name pattern or an IPv4 address or range.
fn parse_target(host: &str) -> Result<EntryTarget, String> {
    if host.is_empty() {
        return Err("no host before the port".to_string());
    }
    if host == "*" {
        return Ok(EntryTarget::Name(HostPattern::Any));
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err("'*' only as the whole first label (`*.example.com`)".to_string());
        }
        return name(suffix)
            .map(|s| EntryTarget::Name(HostPattern::Suffix(s)))
            .map_err(|why| format!("after `*.`: {why}"));
    }
    if host.contains('*') {
        return Err("'*' only as the whole first label (`*.example.com`) or alone".to_string());
    }
    if host.contains('/') || host.parse::<Ipv4Addr>().is_ok() {
        return parse_range(host).map(EntryTarget::Range);
    }
    name(host)
        .map(|n| EntryTarget::Name(HostPattern::Exact(n)))
        .map_err(str::to_string)
}

/// `a.b.c.d`, `a.b.c.d/n`, `v6` or `v6/n`, the host bits cleared.
fn parse_range(text: &str) -> Result<IpNet, String> {
    if text.contains('/') {
        text.parse::<IpNet>()
            .map(|net| net.trunc())
            .map_err(|_| format!("`{text}` is not an address range (`10.0.0.0/8`, `fd00::/8`)"))
    } else {
        text.parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("`{text}` is not an IP address"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> EgressRules {
        EgressRules::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn policy(allow: &str, ask: &str) -> EgressPolicy {
        EgressPolicy {
            allow: rules(allow),
            ask: rules(ask),
            ..EgressPolicy::default()
        }
    }

    fn name_target(host: &str) -> Target {
        Target::Name(host.to_string())
    }

    #[test]
    fn good_entries_parse() {
        let r = rules(
            " Example.COM. , *.Data.Test:8443,,*, 10.0.0.0/8:5432, 1.2.3.4, [::1], [fd00::/8]:80 ,",
        );
        let targets: Vec<(EntryTarget, Ports)> =
            r.entries.into_iter().map(|e| (e.target, e.ports)).collect();
        assert_eq!(
            targets,
            vec![
                (
                    EntryTarget::Name(HostPattern::Exact("example.com".into())),
                    Ports::Web
                ),
                (
                    EntryTarget::Name(HostPattern::Suffix("data.test".into())),
                    Ports::One(8443)
                ),
                (EntryTarget::Name(HostPattern::Any), Ports::Web),
                (
                    EntryTarget::Range("10.0.0.0/8".parse().unwrap()),
                    Ports::One(5432)
                ),
                (
                    EntryTarget::Range("1.2.3.4/32".parse().unwrap()),
                    Ports::Web
                ),
                (EntryTarget::Range("::1/128".parse().unwrap()), Ports::Web),
                (
                    EntryTarget::Range("fd00::/8".parse().unwrap()),
                    Ports::One(80)
                ),
            ]
        );
        assert!(rules("").is_empty() && rules(" , ,").is_empty());
        assert!(rules("a_b.example-1.com:65535,x:1").entries.len() == 2);
        assert_eq!(
            rules("10.1.2.3/8").entries[0].target,
            EntryTarget::Range("10.0.0.0/8".parse().unwrap()),
            "host bits are cleared"
        );
        let longest = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(longest.len(), 253);
        assert!(EgressRules::parse(&longest).is_ok());
    }

    #[test]
    fn bad_entries_are_refused_saying_which_and_why() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62)
        );
        let cases: &[(&str, &str)] = &[
            ("*.", "empty name"),
            ("a..b", "empty label"),
            (".a", "empty label"),
            ("*.*.x", "'*' only as the whole first label"),
            ("a.*.x", "'*' only"),
            ("a*.x", "'*' only"),
            ("**", "'*' only"),
            ("x:0", "port `0`"),
            ("x:65536", "port `65536`"),
            ("x:", "port ``"),
            ("x:http", "port `http`"),
            ("1.2.3.4/33", "not an address range"),
            ("1.2.3.4/", "not an address range"),
            ("[::1", "no closing ']'"),
            ("[::1]x", "only `:port`"),
            ("[1.2.3.4]", "brackets are for IPv6"),
            ("[::1/129]", "not an address range"),
            ("[nothing]", "not an IP address"),
            ("host:80:81", "more than one ':'"),
            ("::1", "goes in brackets"),
            ("fd00::/8", "goes in brackets"),
            ("a b", "spaces inside"),
            ("a.com :80", "spaces inside"),
            (":80", "no host"),
            ("1.2.3.256", "cannot end in a number"),
            ("1.2.3", "cannot end in a number"),
            ("0x7f.0x1", "cannot end in a number"),
            ("exa$mple.com", "a-z, 0-9"),
            ("bücher.de", "a-z, 0-9"),
            (&long_label, "at most 63"),
            (&long_name, "at most 253"),
        ];
        for (entry, why) in cases {
            let error = EgressRules::parse(&format!("ok.example, {entry}")).expect_err(entry);
            assert!(
                error.contains("entry 2") && error.contains(entry) && error.contains(why),
                "{entry}: {error}"
            );
        }
    }

    #[test]
    fn suffixes_need_one_more_label() {
        let r = rules("*.example.com");
        assert!(r.permits_name("a.example.com", 443));
        assert!(r.permits_name("a.b.example.com", 80));
        assert!(!r.permits_name("example.com", 443));
        assert!(!r.permits_name("badexample.com", 443));
        assert!(!r.permits_name(".example.com", 443));
        assert!(!r.permits_name("a.example.com.evil", 443));
        let exact = rules("example.com");
        assert!(exact.permits_name("example.com", 443));
        assert!(!exact.permits_name("a.example.com", 443));
        let any = rules("*");
        assert!(any.has_any() && !exact.has_any() && !r.has_any());
        assert!(rules("*:8080").has_any());
        assert!(any.permits_name("anything.at.all", 80));
    }

    #[test]
    fn ports_default_to_the_web() {
        let r = rules("web.example,one.example:8443");
        assert!(r.permits_name("web.example", 80) && r.permits_name("web.example", 443));
        assert!(!r.permits_name("web.example", 8080) && !r.permits_name("web.example", 22));
        assert!(r.permits_name("one.example", 8443));
        assert!(!r.permits_name("one.example", 443));
    }

    #[test]
    fn name_entries_never_allow_addresses_and_address_entries_never_allow_names() {
        let r = rules("*,10.0.0.0/8:5432");
        assert!(!r.permits_address(ip("169.254.169.254"), 80));
        assert!(!r.permits_address(ip("93.184.216.34"), 443));
        assert!(r.permits_address(ip("10.1.2.3"), 5432));
        assert!(
            !r.permits_address(ip("10.1.2.3"), 443),
            "the range's port only"
        );
        assert!(r.permits_address(ip("::ffff:10.1.2.3"), 5432), "v4-mapped");
        assert!(!r.permits_address(ip("11.0.0.1"), 5432));
        let names = rules("10.0.0.1");
        assert!(!names.permits_name("10.0.0.1", 443));
        let v6 = rules("[fd00::/8]:8080");
        assert!(v6.permits_address(ip("fd12::1"), 8080));
        assert!(!v6.permits_address(ip("fe80::1"), 8080));
    }

    #[test]
    fn public_and_non_public_addresses() {
        for not_public in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "fc00::1",
            "fd00::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "::1",
            "::",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "239.255.255.250",
            "ff02::1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "192.0.0.8",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "::127.0.0.1",
            "100::1",
        ] {
            assert!(!is_public(ip(not_public)), "{not_public} is not public");
        }
        for public in [
            "93.184.216.34",
            "2606:4700::1111",
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "172.15.255.255",
            "100.63.255.255",
            "100.128.0.1",
            "192.169.0.1",
            "::ffff:93.184.216.34",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "2a00:1450:4001:80b::200e",
        ] {
            assert!(is_public(ip(public)), "{public} is public");
        }
    }

    #[test]
    fn hosts_normalize_into_names_or_addresses() {
        assert_eq!(
            normalize_host("Example.COM.").as_deref(),
            Some("example.com")
        );
        assert_eq!(normalize_host("[::1]").as_deref(), Some("::1"));
        assert_eq!(
            normalize_host("::FFFF:1.2.3.4").as_deref(),
            Some("::ffff:1.2.3.4")
        );
        assert_eq!(normalize_host("1.2.3.4").as_deref(), Some("1.2.3.4"));
        for bad in [
            "",
            ".",
            "a..b",
            "a b",
            "*.x",
            "2130706433",
            "0x7f000001",
            "[1.2.3.4]",
            "[::1",
            "x:80",
            "évil.com",
        ] {
            assert_eq!(normalize_host(bad), None, "{bad}");
        }
        assert_eq!(target_of("[::1]"), Some(Target::Address(ip("::1"))));
        assert_eq!(target_of("::1"), Some(Target::Address(ip("::1"))));
        assert_eq!(target_of("1.2.3.4"), Some(Target::Address(ip("1.2.3.4"))));
        assert_eq!(target_of("Data.Test"), Some(name_target("data.test")));
        assert_eq!(target_of("1.2.3"), None);
    }

    #[test]
    fn addresses_are_allowed_only_by_address_entries() {
        let p = policy("*,10.0.0.0/8:5432,[::1]:8080", "");
        assert_eq!(
            p.decide(&Target::Address(ip("10.9.9.9")), 5432),
            Static::Allowed
        );
        assert_eq!(p.decide(&Target::Address(ip("::1")), 8080), Static::Allowed);
        assert_eq!(
            p.decide(&Target::Address(ip("169.254.169.254")), 80),
            Static::Refused(
                "169.254.169.254:80 is an IP address; only addresses SANDBOX_EGRESS_ALLOW names are allowed".into()
            )
        );
        assert_eq!(
            p.decide(&Target::Address(ip("93.184.216.34")), 443),
            Static::Refused(
                "93.184.216.34:443 is an IP address; only addresses SANDBOX_EGRESS_ALLOW names are allowed".into()
            )
        );
        assert!(matches!(
            p.decide(&Target::Address(ip("10.9.9.9")), 443),
            Static::Refused(_)
        ));
        assert!(matches!(
            p.decide(&Target::Address(ip("::ffff:169.254.169.254")), 80),
            Static::Refused(_)
        ));
        let ask_address = policy("", "10.0.0.0/8");
        assert!(matches!(
            ask_address.decide(&Target::Address(ip("10.0.0.1")), 443),
            Static::Refused(_)
        ));
    }

    #[test]
    fn names_are_allowed_asked_or_refused() {
        let p = policy("pypi.org,*.data.test:8443", "*.example.com,*");
        assert_eq!(p.decide(&name_target("pypi.org"), 443), Static::Allowed);
        assert_eq!(p.decide(&name_target("a.data.test"), 8443), Static::Allowed);
        assert_eq!(p.decide(&name_target("a.example.com"), 443), Static::Ask);
        assert_eq!(p.decide(&name_target("other.org"), 80), Static::Ask);
        assert!(
            matches!(p.decide(&name_target("pypi.org"), 22), Static::Refused(_)),
            "neither ALLOW's pypi.org nor ASK's `*` gives port 22"
        );
        let strict = policy("pypi.org", "");
        assert_eq!(
            strict.decide(&name_target("files.pythonhosted.org"), 443),
            Static::Refused("files.pythonhosted.org:443 is not in SANDBOX_EGRESS_ALLOW".into())
        );
        assert_eq!(
            strict.decide(&name_target("pypi.org"), 8443),
            Static::Refused("pypi.org:8443 is not in SANDBOX_EGRESS_ALLOW".into())
        );
    }

    #[test]
    fn every_resolved_address_must_be_public() {
        let p = policy("data.example,10.0.0.0/8:5432", "");
        assert_eq!(
            p.check_resolved(
                "data.example",
                443,
                &[ip("93.184.216.34"), ip("2606:4700::1111")]
            ),
            Ok(())
        );
        assert_eq!(
            p.check_resolved(
                "data.example",
                443,
                &[ip("93.184.216.34"), ip("192.168.0.1")]
            ),
            Err("data.example resolves to the non-public address 192.168.0.1".into()),
            "all or nothing"
        );
        assert_eq!(
            p.check_resolved("data.example", 443, &[ip("::ffff:169.254.169.254")]),
            Err("data.example resolves to the non-public address ::ffff:169.254.169.254".into())
        );
        assert_eq!(
            p.check_resolved("data.example", 443, &[]),
            Err("data.example does not resolve".into())
        );
        // An address entry makes a private resolution acceptable, on its port only.
        assert_eq!(
            p.check_resolved("data.example", 5432, &[ip("10.1.1.1"), ip("93.184.216.34")]),
            Ok(())
        );
        assert!(p
            .check_resolved("data.example", 443, &[ip("10.1.1.1")])
            .is_err());
        assert!(p
            .check_resolved("data.example", 5432, &[ip("127.0.0.1")])
            .is_err());
    }

    #[test]
    fn resolve_overrides_are_looked_up_by_name() {
        let p = EgressPolicy {
            resolve: vec![("data.test".into(), ip("172.18.0.5"))],
            ..EgressPolicy::default()
        };
        assert_eq!(p.resolve_override("data.test"), Some(ip("172.18.0.5")));
        assert_eq!(p.resolve_override("other.test"), None);
        assert_eq!(EgressPolicy::default().uplink, "bridge");
    }
}
