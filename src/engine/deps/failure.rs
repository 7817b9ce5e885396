//! Why an install failed, as data: first what the egress proxy recorded of the installer's
//! connections (a refusal, a host that did not answer), then what pip and uv said (a TLS
//! certificate, a status the index answered, the versions that exist, links skipped for want of a
//! wheel). [`classify`] is pure; the words are only in [`InstallFailure`]'s `Display`.
//!
//! Everything here comes from the installer's sandbox or through it (pip's text, the hosts it
//! asked the proxy for): every piece shown is bounded and stripped of control characters.

use std::fmt;
use std::time::Duration;

use super::summary::installer_error_summary;
use super::{IndexConfig, DEFAULT_INDEX_HOSTS};
use crate::config::redact_url;
use crate::config::settings::{
    PIP_EXTRA_INDEX_URL, PIP_INDEX_URL, SANDBOX_ALLOW_SOURCE_BUILDS, SANDBOX_CA_BUNDLE,
    SANDBOX_DEPS_EGRESS_ALLOW, SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE, SANDBOX_DEPS_INSTALL_MAX,
    SANDBOX_DEPS_TIMEOUT, SANDBOX_EGRESS_UPLINK,
};
use crate::engine::outcome::{NetworkEntry, NetworkOutcome, NoAnswer, Stopped};

/// The line `python/installer.py` prints before what it adds after a failure.
pub const DIAGNOSIS_MARK: &str = "pcs-installer-diagnosis";

/// The index pip and uv use without `PIP_INDEX_URL`.
const DEFAULT_INDEX: &str = "https://pypi.org/simple";
/// The most characters of a host, a requirement or a version shown.
const PIECE_MAX: usize = 200;
/// The most versions named.
const VERSIONS_MAX: usize = 30;

/// What an install failed of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// The egress proxy refused a host the installer tried: not an index host, or one that
    /// resolved to an address that is not public. Nothing was sent to it.
    Refused {
        host: String,
        port: u16,
        stopped: Stopped,
    },
    /// An index host does not resolve.
    Unresolved { host: String, port: u16 },
    /// An index host did not answer the proxy.
    NoAnswer {
        host: String,
        port: u16,
        how: NoAnswer,
    },
    /// The index URL names loopback (`127.0.0.1`, `localhost`, `::1`): inside the installer's
    /// sandbox that is the installer itself, which the proxy never carries.
    OwnLoopback { host: String, port: u16 },
    /// The index's TLS certificate is not trusted (TLS interception, a private CA).
    UntrustedCertificate,
    /// The index answered 401 or 407 (credentials wanted) or 403 (refused).
    Credentials { status: u16 },
    /// The index has no such project (404, uv's "not found in the package registry").
    UnknownProject { name: Option<String> },
    /// The project has no version matching the request; these exist.
    NoSuchVersion {
        requirement: String,
        versions: Vec<String>,
    },
    /// Only source distributions (or wheels for other platforms), and source builds are off.
    NoWheel,
    /// The install ran out of time.
    TimedOut { limit: Duration },
    /// The staging tmpfs filled up.
    TooLarge { limit: u64 },
    /// None of the above: the installer's own lines say it.
    Other,
}

/// Who asked the index: an installer through the egress proxy, or the first stage of an image
/// build directly, on the engine's default network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    #[default]
    EgressProxy,
    ImageBuild,
}

impl Route {
    /// Who it is, in words.
    fn who(self) -> &'static str {
        match self {
            Route::EgressProxy => "the installer",
            Route::ImageBuild => "the image build",
        }
    }
}

/// What the classifier reads of one failed install.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    /// Who asked the index (what the connections below, and the words, are about).
    pub route: Route,
    /// What pip or uv printed (the installer's stdout before [`DIAGNOSIS_MARK`], and its stderr).
    pub output: &'a str,
    /// What the installer script added after the mark: pip's dry run, pip's log lines.
    pub diagnosis: &'a str,
    /// What the egress proxy recorded of the installer's connections.
    pub connections: &'a [NetworkEntry],
    pub timed_out: bool,
}

/// The settings a failure's words depend on.
#[derive(Debug, Clone)]
pub struct Setting<'a> {
    pub index: &'a IndexConfig,
    /// The normalized names of the requested projects.
    pub projects: &'a [String],
    pub timeout: Duration,
    pub install_max_bytes: u64,
}

/// An install that failed: why, and the installer's own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InstallFailure {
    pub kind: FailureKind,
    /// The index the installer asked (or the one of the host that failed), credentials
    /// redacted.
    pub index: String,
    /// The installer's error lines (bounded, cleaned); empty when it said nothing.
    pub summary: String,
    /// Where the installer's whole output was saved on the host (`SANDBOX_FILES_DIR`), when it
    /// was.
    pub saved_to: Option<std::path::PathBuf>,
    /// Who asked the index.
    pub route: Route,
}

/// Splits the installer's stdout into what pip or uv printed and what the script added.
pub fn split_diagnosis(stdout: &str) -> (&str, &str) {
    let mark = format!("\n{DIAGNOSIS_MARK}\n");
    match stdout.find(&mark) {
        Some(at) => (&stdout[..at], &stdout[at + mark.len()..]),
        None => (stdout, ""),
    }
}

/// Why the install failed, from the evidence.
pub fn classify(evidence: &Evidence<'_>, setting: &Setting<'_>) -> InstallFailure {
    let kind = kind_of(evidence, setting);
    let host = match &kind {
        FailureKind::Refused { host, .. }
        | FailureKind::Unresolved { host, .. }
        | FailureKind::NoAnswer { host, .. } => Some(host.as_str()),
        _ => None,
    };
    InstallFailure {
        index: index_of(setting.index, host),
        summary: clean_lines(&installer_error_summary(evidence.output)),
        saved_to: None,
        route: evidence.route,
        kind,
    }
}

fn kind_of(evidence: &Evidence<'_>, setting: &Setting<'_>) -> FailureKind {
    let stopped = |outcome: NetworkOutcome| {
        evidence
            .connections
            .iter()
            .filter(move |e| e.outcome == outcome)
            .filter_map(|e| Some((clean(&e.host), e.port, e.stopped.clone()?)))
    };
    // What the proxy refused or could not reach is the cause, whatever the installer made of it
    // (pip reads a refusal as "no versions", uv as "not found").
    if let Some((host, port, stopped)) = stopped(NetworkOutcome::Refused).find(|(_, _, s)| {
        matches!(
            s,
            Stopped::NotAllowed | Stopped::OffLimits | Stopped::NonPublic(_)
        )
    }) {
        return FailureKind::Refused {
            host,
            port,
            stopped,
        };
    }
    // An index on loopback is the installer's own loopback: never the proxy's to reach, so it
    // leaves no record, only the installer's words about a refused connection.
    if evidence.route == Route::EgressProxy {
        if let Some(kind) = own_loopback(setting.index) {
            return kind;
        }
    }
    let failed = stopped(NetworkOutcome::Failed).chain(stopped(NetworkOutcome::Refused));
    for (host, port, stopped) in failed {
        match stopped {
            Stopped::NoAnswer(how) => return FailureKind::NoAnswer { host, port, how },
            Stopped::Unresolved => return FailureKind::Unresolved { host, port },
            Stopped::NotAllowed | Stopped::OffLimits | Stopped::NonPublic(_) => {}
        }
    }
    if evidence.timed_out {
        return FailureKind::TimedOut {
            limit: setting.timeout,
        };
    }
    let said = |signs: &[&str]| {
        signs
            .iter()
            .any(|s| evidence.output.contains(s) || evidence.diagnosis.contains(s))
    };
    if said(&[
        "CERTIFICATE_VERIFY_FAILED",
        "certificate verify failed",
        "invalid peer certificate",
        "UnknownIssuer",
    ]) {
        return FailureKind::UntrustedCertificate;
    }
    // A build asks the index itself: pip's words are all there is about its connections (an
    // installer's go through the proxy, whose record above is the truth about them).
    if evidence.route == Route::ImageBuild {
        if let Some(kind) = direct_connection_failure(&said, setting.index) {
            return kind;
        }
    }
    if said(&["No space left on device"]) {
        return FailureKind::TooLarge {
            limit: setting.install_max_bytes,
        };
    }
    for (status, signs) in [
        (
            407,
            &["407 Proxy Authentication Required", "407 Client Error"][..],
        ),
        (401, &["401 Unauthorized", "401 Client Error"][..]),
        (403, &["403 Forbidden", "403 Client Error"][..]),
    ] {
        if said(signs) {
            return FailureKind::Credentials { status };
        }
    }
    let text = [evidence.output, evidence.diagnosis];
    if let Some((requirement, versions)) = text.iter().find_map(|t| existing_versions(t)) {
        return FailureKind::NoSuchVersion {
            requirement,
            versions,
        };
    }
    if said(&[
        "404 Client Error",
        "404 Not Found",
        "not found in the package registry",
    ]) {
        return FailureKind::UnknownProject {
            name: missing_project(&text, setting.projects),
        };
    }
    if !setting.index.allow_source_builds
        && said(&[
            "No sources permitted",
            "none of the wheel's tags",
            "no usable wheels",
            "building from source is disabled",
            "has no wheels with a matching",
        ])
    {
        return FailureKind::NoWheel;
    }
    FailureKind::Other
}

/// The first index's host, when it is loopback.
fn own_loopback(index: &IndexConfig) -> Option<FailureKind> {
    let primary = index.index_url.as_deref().unwrap_or(DEFAULT_INDEX);
    let (host, port) = crate::config::url_host_port(primary)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare.to_ascii_lowercase().ends_with(".localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| FailureKind::OwnLoopback {
        host: clean(&host),
        port,
    })
}

/// A connection pip made itself that failed, from its words, named by the first index's host.
fn direct_connection_failure(
    said: &dyn Fn(&[&str]) -> bool,
    index: &IndexConfig,
) -> Option<FailureKind> {
    let primary = index.index_url.as_deref().unwrap_or(DEFAULT_INDEX);
    let (host, port) = crate::config::url_host_port(primary)?;
    let host = clean(&host);
    if said(&[
        "Name or service not known",
        "Temporary failure in name resolution",
        "No address associated with hostname",
        "nodename nor servname",
    ]) {
        return Some(FailureKind::Unresolved { host, port });
    }
    let how = if said(&["Connection refused", "[Errno 111]"]) {
        NoAnswer::Refused
    } else if said(&["ConnectTimeoutError", "timed out", "Read timed out"]) {
        NoAnswer::TimedOut
    } else if said(&[
        "Network is unreachable",
        "No route to host",
        "NewConnectionError",
    ]) {
        NoAnswer::Unreachable
    } else {
        return None;
    };
    Some(FailureKind::NoAnswer { host, port, how })
}

/// pip's "Could not find a version that satisfies the requirement R (from versions: A, B)", when
/// it names versions.
fn existing_versions(text: &str) -> Option<(String, Vec<String>)> {
    const REQUIREMENT: &str = "satisfies the requirement ";
    const VERSIONS: &str = " (from versions: ";
    text.lines().find_map(|line| {
        let rest = &line[line.find(REQUIREMENT)? + REQUIREMENT.len()..];
        let (requirement, rest) = rest.split_once(VERSIONS)?;
        let listed = rest.split(')').next()?.trim();
        if listed.is_empty() || listed == "none" {
            return None;
        }
        let versions = listed
            .split(',')
            .map(|v| clean(v.trim()))
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>();
        Some((clean(requirement.trim()), versions))
    })
}

/// Which requested project the index said it does not have.
fn missing_project(text: &[&str], projects: &[String]) -> Option<String> {
    if let [only] = projects {
        return Some(clean(only));
    }
    let lines = text.iter().flat_map(|t| t.lines());
    let said: Vec<&str> = lines
        .filter(|l| l.contains("404") || l.contains("not found in the package registry"))
        .collect();
    projects
        .iter()
        .find(|p| {
            said.iter().any(|l| {
                l.to_ascii_lowercase().contains(&format!("/{p}/"))
                    || l.contains(&format!("Because {p} was not found"))
            })
        })
        .map(|p| clean(p))
}

/// The index to name: the one whose host failed, else the first.
fn index_of(index: &IndexConfig, host: Option<&str>) -> String {
    let primary = index.index_url.as_deref().unwrap_or(DEFAULT_INDEX);
    let urls = std::iter::once(primary).chain(index.extra_index_urls.iter().map(String::as_str));
    let chosen = host
        .and_then(|host| {
            urls.clone()
                .find(|url| host_of(url).is_some_and(|h| h == host))
        })
        .unwrap_or(primary);
    clean(&redact_url(chosen))
}

/// The lowercase host of an index URL.
fn host_of(url: &str) -> Option<String> {
    crate::config::url_host_port(url).map(|(host, _)| host)
}

/// A piece of untrusted text shown on one line: no control characters, bounded.
fn clean(text: &str) -> String {
    let kept: String = text.chars().filter(|c| !c.is_control()).collect();
    crate::text::truncate_chars(&kept, PIECE_MAX)
}

/// Untrusted lines: each without control characters (the summary is bounded already).
fn clean_lines(text: &str) -> String {
    text.lines()
        .map(|l| l.chars().filter(|c| !c.is_control()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The words for a source build the operator may allow.
const WHEELS_ONLY: &str = "Only pre-built wheels are installed: building a package from source \
    runs the package's own code during the install. A package published only as a source \
    distribution (or a version without a wheel for this platform) cannot be installed unless the \
    operator sets SANDBOX_ALLOW_SOURCE_BUILDS=true.";

impl fmt::Display for InstallFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = &self.index;
        match &self.kind {
            FailureKind::Refused {
                host,
                port,
                stopped: Stopped::NonPublic(address),
            } => {
                let resolved = if host.parse::<std::net::IpAddr>().is_ok() {
                    format!("{host} is a non-public address")
                } else {
                    format!("{host} resolved to the non-public address {address}")
                };
                // PyPI answers on one host and serves its files from the other: both, or the
                // next install is refused at the second.
                let allow = if DEFAULT_INDEX_HOSTS.contains(&host.as_str()) {
                    DEFAULT_INDEX_HOSTS.join(",")
                } else {
                    host.clone()
                };
                write!(
                    f,
                    "the egress proxy refused {host}:{port} (for the index {index}): {resolved}, \
                     and the installer may reach non-public addresses only for hosts named in \
                     {private} (as behind an intercepting proxy, or for a local index). Nothing \
                     was sent to it. To allow it, the operator sets {private}={allow}.",
                    private = SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE.name,
                )?;
            }
            FailureKind::Refused {
                host,
                port,
                stopped: Stopped::OffLimits,
            } => write!(
                f,
                "the egress proxy refused {host}:{port} (the index {index}): that address is on \
                 the sandboxes' own networks or next to the proxy on its uplink network \
                 ({uplink}), which no sandbox may reach whatever the settings (a container on \
                 the engine's default bridge is there). Nothing was sent to it. Serve the index \
                 from an address outside those networks: publish its port on the host (`docker \
                 run -p`) and set {url} to the host's address, with {private}=HOST where that \
                 address is not public.",
                uplink = SANDBOX_EGRESS_UPLINK.name,
                url = PIP_INDEX_URL.name,
                private = SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE.name,
            )?,
            FailureKind::Refused { host, port, .. } => write!(
                f,
                "the egress proxy refused {host}:{port}: the installer may reach only the index \
                 hosts ({index} and its files), and {host}:{port} is not one. Nothing was sent \
                 to it. If the install needs it, the operator adds it to {allow} \
                 ({allow}={host}:{port}), or makes it the index with {url} / {extra}.",
                allow = SANDBOX_DEPS_EGRESS_ALLOW.name,
                url = PIP_INDEX_URL.name,
                extra = PIP_EXTRA_INDEX_URL.name,
            )?,
            FailureKind::OwnLoopback { host, port } => write!(
                f,
                "the index {index} is on {host}, loopback: inside the installer's sandbox that \
                 is the installer itself (nothing of the host's is there, and loopback never \
                 goes through the egress proxy), so nothing answered at {host}:{port}. Serve \
                 the index where the engine's containers reach it: publish its port on the host \
                 and set {url} to the host's address on the engine's network (such as the \
                 bridge gateway, 172.17.0.1 on Docker's default), with \
                 {private}=HOST where that address is not public.",
                url = PIP_INDEX_URL.name,
                private = SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE.name,
            )?,
            FailureKind::Unresolved { host, port } if self.route == Route::ImageBuild => write!(
                f,
                "the index {index} did not answer: {host} does not resolve in the image build \
                 (port {port}; the engine's build containers use its DNS). Check the host in \
                 {url} (and {extra}).",
                url = PIP_INDEX_URL.name,
                extra = PIP_EXTRA_INDEX_URL.name,
            )?,
            FailureKind::NoAnswer { host, port, how } if self.route == Route::ImageBuild => write!(
                f,
                "the index {index} did not answer the image build: it could not connect to \
                 {host}:{port} ({how}). Check {url} (and {extra}): that the index runs at that \
                 host and port and is reachable from the engine's build containers (on its \
                 default network; 127.0.0.1 there is the build container itself).",
                how = how.as_str(),
                url = PIP_INDEX_URL.name,
                extra = PIP_EXTRA_INDEX_URL.name,
            )?,
            FailureKind::Unresolved { host, port } => write!(
                f,
                "the index {index} did not answer: {host} does not resolve (the egress proxy \
                 looked up {host}:{port}). Check the host in {url} (and {extra}), and that the \
                 engine's uplink network ({uplink}) can resolve it.",
                url = PIP_INDEX_URL.name,
                extra = PIP_EXTRA_INDEX_URL.name,
                uplink = SANDBOX_EGRESS_UPLINK.name,
            )?,
            FailureKind::NoAnswer { host, port, how } => write!(
                f,
                "the index {index} did not answer: the egress proxy could not connect to \
                 {host}:{port} ({how}). Check {url} (and {extra}): that the index runs at that \
                 host and port and is reachable from the engine's uplink network ({uplink}); \
                 where TLS is intercepted, {ca} names the CA bundle that signs it.",
                how = how.as_str(),
                url = PIP_INDEX_URL.name,
                extra = PIP_EXTRA_INDEX_URL.name,
                uplink = SANDBOX_EGRESS_UPLINK.name,
                ca = SANDBOX_CA_BUNDLE.name,
            )?,
            FailureKind::UntrustedCertificate => write!(
                f,
                "the index {index} presented a TLS certificate {who} does not trust (as \
                 where TLS is intercepted): the operator sets {ca} to the CA bundle (PEM) that \
                 signs it, or {url} to another index.",
                who = self.route.who(),
                ca = SANDBOX_CA_BUNDLE.name,
                url = PIP_INDEX_URL.name,
            )?,
            FailureKind::Credentials { status } => {
                let credentials = format!(
                    "the operator puts them in the index URL, {url}=https://USER:TOKEN@HOST/simple \
                     ({extra} likewise; not together with {builds})",
                    url = PIP_INDEX_URL.name,
                    extra = PIP_EXTRA_INDEX_URL.name,
                    builds = SANDBOX_ALLOW_SOURCE_BUILDS.name,
                );
                match status {
                    401 => write!(
                        f,
                        "the index {index} asks for credentials (HTTP 401 Unauthorized): \
                         {credentials}."
                    )?,
                    407 => write!(
                        f,
                        "a proxy in front of the index {index} asks for credentials (HTTP 407 \
                         Proxy Authentication Required), which the installer's egress proxy \
                         cannot give: set {url} to an index reachable without that proxy (if it \
                         needs credentials, {url}=https://USER:TOKEN@HOST/simple).",
                        url = PIP_INDEX_URL.name,
                    )?,
                    _ => write!(
                        f,
                        "the index {index} refused access (HTTP {status} Forbidden): the \
                         credentials are missing or not allowed this project; {credentials}."
                    )?,
                }
            }
            FailureKind::UnknownProject { name } => {
                let project = name
                    .as_deref()
                    .map_or("one of the requested projects".to_string(), |n| {
                        format!("no project named {n}")
                    });
                let what = if name.is_some() {
                    project
                } else {
                    format!("not {project}")
                };
                write!(
                    f,
                    "the index {index} has {what} (HTTP 404): check the name on the index (or \
                     that {url} names the index that publishes it).",
                    url = PIP_INDEX_URL.name,
                )?;
            }
            FailureKind::NoSuchVersion {
                requirement,
                versions,
            } => {
                let shown: Vec<&str> = versions
                    .iter()
                    .rev()
                    .take(VERSIONS_MAX)
                    .rev()
                    .map(String::as_str)
                    .collect();
                let more = if versions.len() > shown.len() {
                    format!("{} earlier ones and ", versions.len() - shown.len())
                } else {
                    String::new()
                };
                write!(
                    f,
                    "no version of {requirement} exists on the index {index}; it has {more}{}.",
                    shown.join(", ")
                )?;
            }
            FailureKind::NoWheel => write!(
                f,
                "a requested project has no wheel for this platform on the index {index}. \
                 {WHEELS_ONLY}"
            )?,
            FailureKind::TimedOut { limit } => write!(
                f,
                "the install did not finish within {} ({})",
                crate::text::duration(*limit),
                SANDBOX_DEPS_TIMEOUT.name
            )?,
            FailureKind::TooLarge { limit } => write!(
                f,
                "the install is larger than {} ({limit} bytes).",
                SANDBOX_DEPS_INSTALL_MAX.name
            )?,
            FailureKind::Other => return f.write_str(&self.summary),
        }
        if !self.summary.is_empty() {
            let who = match self.route {
                Route::EgressProxy => "The installer said",
                Route::ImageBuild => "pip said",
            };
            write!(f, "\n{who}:\n{}", self.summary)?;
        }
        if let Some(path) = &self.saved_to {
            write!(f, "\nIts whole output: {}", path.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_host_off_limits_is_not_called_a_host_that_is_not_allowed() {
        let index = IndexConfig {
            index_url: Some("http://172.17.0.2:8765/simple/".into()),
            ..IndexConfig::default()
        };
        let connections = [entry(
            "172.17.0.2",
            8765,
            NetworkOutcome::Refused,
            Stopped::OffLimits,
        )];
        let failure = classify(
            &Evidence {
                route: Route::EgressProxy,
                output: "ERROR: No matching distribution found for pcs-fake",
                diagnosis: "",
                connections: &connections,
                timed_out: false,
            },
            &Setting {
                index: &index,
                projects: &["pcs-fake".to_string()],
                timeout: Duration::from_secs(60),
                install_max_bytes: 1 << 30,
            },
        );
        let text = failure.to_string();
        assert!(
            text.starts_with(
                "the egress proxy refused 172.17.0.2:8765 (the index \
                 http://172.17.0.2:8765/simple/): that address is on the sandboxes' own networks"
            ),
            "{text}"
        );
        assert!(!text.contains("is not one"), "{text}");
        assert!(text.contains("publish its port on the host"), "{text}");
    }

    #[test]
    fn an_index_on_loopback_is_the_installers_own_and_said_so() {
        for url in [
            "http://127.0.0.1:8765/simple/",
            "http://localhost:8765/simple/",
            "http://[::1]:8765/simple/",
        ] {
            let index = IndexConfig {
                index_url: Some(url.into()),
                ..IndexConfig::default()
            };
            let evidence = |route| Evidence {
                route,
                output: "error: Request failed after 3 retries\n  Caused by: Connection refused",
                diagnosis: "",
                connections: &[],
                timed_out: false,
            };
            let setting = Setting {
                index: &index,
                projects: &["pcs-fake".to_string()],
                timeout: Duration::from_secs(60),
                install_max_bytes: 1 << 30,
            };
            let text = classify(&evidence(Route::EgressProxy), &setting).to_string();
            assert!(text.contains("is on "), "{text}");
            assert!(text.contains("the installer itself"), "{text}");
            assert!(text.contains("PIP_INDEX_URL"), "{text}");
            assert!(
                text.contains("The installer said:\nerror: Request failed"),
                "{text}"
            );
            // A build's own loopback is said by its own words.
            let build = classify(&evidence(Route::ImageBuild), &setting);
            assert!(
                !matches!(build.kind, FailureKind::OwnLoopback { .. }),
                "{build}"
            );
        }
        let public = IndexConfig {
            index_url: Some("http://127.example.test/simple/".into()),
            ..IndexConfig::default()
        };
        assert!(own_loopback(&public).is_none());
    }

    fn entry(host: &str, port: u16, outcome: NetworkOutcome, stopped: Stopped) -> NetworkEntry {
        NetworkEntry {
            host: host.into(),
            port,
            outcome,
            connections: 1,
            bytes_sent: 0,
            bytes_received: 0,
            reason: None,
            stopped: Some(stopped),
            secret: None,
            placeholder: None,
        }
    }

    fn failure(output: &str, diagnosis: &str, connections: &[NetworkEntry]) -> InstallFailure {
        let index = IndexConfig {
            index_url: Some("http://u:secret@172.17.0.1:8000/simple".into()),
            ..IndexConfig::default()
        };
        classify(
            &Evidence {
                route: Route::EgressProxy,
                output,
                diagnosis,
                connections,
                timed_out: false,
            },
            &Setting {
                index: &index,
                projects: &["pcs-fake".to_string()],
                timeout: Duration::from_secs(300),
                install_max_bytes: 1 << 30,
            },
        )
    }

    const PIP_NONE: &str = "ERROR: Could not find a version that satisfies the requirement \
                            pcs-fake (from versions: none)\nERROR: No matching distribution found \
                            for pcs-fake";

    #[test]
    fn a_refusal_is_the_cause_whatever_pip_made_of_it() {
        let address = "172.17.0.1".parse().unwrap();
        let refused = [entry(
            "172.17.0.1",
            8000,
            NetworkOutcome::Refused,
            Stopped::NonPublic(address),
        )];
        let seen = failure(PIP_NONE, "log: No sources permitted for pcs-fake", &refused);
        assert_eq!(
            seen.kind,
            FailureKind::Refused {
                host: "172.17.0.1".into(),
                port: 8000,
                stopped: Stopped::NonPublic(address)
            }
        );
        let text = seen.to_string();
        assert!(
            text.starts_with(
                "the egress proxy refused 172.17.0.1:8000 (for the index \
                 http://***@172.17.0.1:8000/simple): 172.17.0.1 is a non-public address"
            ),
            "{text}"
        );
        assert!(
            text.contains("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE=172.17.0.1"),
            "{text}"
        );
        assert!(
            !text.contains("secret") && !text.contains("SOURCE_BUILDS=true"),
            "{text}"
        );
        assert!(text.ends_with(&format!(
            "The installer said:\n{}",
            installer_error_summary(PIP_NONE)
        )));

        let name = [entry(
            "pypi.org",
            443,
            NetworkOutcome::Refused,
            Stopped::NonPublic("10.1.2.3".parse().unwrap()),
        )];
        let text = failure("", "", &name).to_string();
        assert!(
            text.contains("pypi.org resolved to the non-public address 10.1.2.3")
                && text.contains(
                    "the operator sets \
                     SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE=pypi.org,files.pythonhosted.org."
                ),
            "{text}"
        );
        let other = [entry(
            "evil.test\u{1b}[2J",
            443,
            NetworkOutcome::Refused,
            Stopped::NotAllowed,
        )];
        let text = failure("", "", &other).to_string();
        assert!(
            text.contains("refused evil.test[2J:443")
                && text.contains("SANDBOX_DEPS_EGRESS_ALLOW="),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }

    #[test]
    fn a_host_that_does_not_answer_is_named_with_what_to_check() {
        let failed = [entry(
            "172.17.0.1",
            8000,
            NetworkOutcome::Failed,
            Stopped::NoAnswer(NoAnswer::Refused),
        )];
        let seen = failure(PIP_NONE, "log: 403 Client Error", &failed);
        assert_eq!(
            seen.kind,
            FailureKind::NoAnswer {
                host: "172.17.0.1".into(),
                port: 8000,
                how: NoAnswer::Refused
            }
        );
        let text = seen.to_string();
        assert!(
            text.starts_with(
                "the index http://***@172.17.0.1:8000/simple did not answer: the egress proxy \
                 could not connect to 172.17.0.1:8000 (the connection was refused)"
            ),
            "{text}"
        );
        assert!(
            text.contains("PIP_INDEX_URL") && text.contains("SANDBOX_CA_BUNDLE"),
            "{text}"
        );
        let unresolved = [entry(
            "pypi.org",
            443,
            NetworkOutcome::Failed,
            Stopped::Unresolved,
        )];
        assert_eq!(
            failure("", "", &unresolved).kind,
            FailureKind::Unresolved {
                host: "pypi.org".into(),
                port: 443
            }
        );
    }

    #[test]
    fn statuses_name_the_credentials() {
        for (said, status) in [
            ("log: Could not fetch URL http://h/simple/pcs-fake/: 401 Client Error: Unauthorized for url", 401),
            ("log: Could not fetch URL http://h/simple/pcs-fake/: 403 Client Error: Forbidden for url", 403),
            ("log: 407 Client Error: Proxy Authentication Required for url", 407),
        ] {
            let seen = failure(PIP_NONE, said, &[]);
            assert_eq!(seen.kind, FailureKind::Credentials { status }, "{said}");
            let text = seen.to_string();
            assert!(text.contains(&format!("HTTP {status}")), "{text}");
            assert!(text.contains("PIP_INDEX_URL"), "{text}");
            assert!(!text.contains("SOURCE_BUILDS=true"), "{text}");
        }
        let uv = "  ╰─▶ Because pcs-fake was not found in the package registry and you require \
                  pcs-fake, we can conclude that your requirements are unsatisfiable.\n\n      \
                  hint: An index URL (http://h/simple) could not be queried due to a lack of \
                  valid authentication credentials (401 Unauthorized).";
        assert_eq!(
            failure(uv, "", &[]).kind,
            FailureKind::Credentials { status: 401 }
        );
    }

    #[test]
    fn existing_versions_are_named() {
        let pip = "ERROR: Could not find a version that satisfies the requirement pcs-fake==9.9 \
                   (from versions: 1.0, 2.0)\nERROR: No matching distribution found for \
                   pcs-fake==9.9";
        let uv = "  ╰─▶ Because there is no version of pcs-fake==9.9 and you require \
                  pcs-fake==9.9, we can conclude that your requirements are unsatisfiable.";
        for (output, diagnosis) in [(pip, ""), (uv, pip)] {
            let seen = failure(output, diagnosis, &[]);
            assert_eq!(
                seen.kind,
                FailureKind::NoSuchVersion {
                    requirement: "pcs-fake==9.9".into(),
                    versions: vec!["1.0".into(), "2.0".into()]
                }
            );
            assert!(seen.to_string().starts_with(
                "no version of pcs-fake==9.9 exists on the index \
                 http://***@172.17.0.1:8000/simple; it has 1.0, 2.0."
            ));
        }
        let many = format!(
            "ERROR: Could not find a version that satisfies the requirement x==0 (from versions: {})",
            (1..=40).map(|i| format!("{i}.0")).collect::<Vec<_>>().join(", ")
        );
        let text = failure(&many, "", &[]).to_string();
        assert!(
            text.contains("it has 10 earlier ones and 11.0, 12.0"),
            "{text}"
        );
        assert!(text.contains(", 40.0."), "{text}");
    }

    #[test]
    fn a_missing_project_is_named() {
        let log = "log: Could not fetch URL http://172.17.0.1:8000/simple/pcs-fake/: 404 Client \
                   Error: Not Found for url: http://172.17.0.1:8000/simple/pcs-fake/ - skipping";
        let seen = failure(PIP_NONE, log, &[]);
        assert_eq!(
            seen.kind,
            FailureKind::UnknownProject {
                name: Some("pcs-fake".into())
            }
        );
        assert!(seen.to_string().starts_with(
            "the index http://***@172.17.0.1:8000/simple has no project named pcs-fake (HTTP 404)"
        ));
        let text = ["", log];
        assert_eq!(
            missing_project(&text, &["six".into(), "pcs-fake".into()]),
            Some("pcs-fake".into())
        );
        assert_eq!(missing_project(&text, &["six".into(), "idna".into()]), None);
    }

    #[test]
    fn only_a_missing_wheel_gets_the_source_build_text() {
        let skipped = "log: Skipping link: No sources permitted for pcs-fake: \
                       http://h/pcs_fake-1.0.tar.gz";
        let seen = failure(PIP_NONE, skipped, &[]);
        assert_eq!(seen.kind, FailureKind::NoWheel);
        assert!(
            seen.to_string()
                .contains("SANDBOX_ALLOW_SOURCE_BUILDS=true"),
            "{seen}"
        );
        let uv = "  ╰─▶ Because only pcs-sdist==1.0 is available and pcs-sdist==1.0 has no usable \
                  wheels, we can conclude that all versions of pcs-sdist cannot be used.";
        assert_eq!(failure(uv, "", &[]).kind, FailureKind::NoWheel);
        // "from versions: none" alone says nothing of why.
        let seen = failure(PIP_NONE, "", &[]);
        assert_eq!(seen.kind, FailureKind::Other);
        assert_eq!(seen.to_string(), installer_error_summary(PIP_NONE));
        assert!(!seen.to_string().contains("SOURCE_BUILDS"));
    }

    #[test]
    fn tls_timeouts_and_full_disks() {
        let tls = "WARNING: Retrying ... SSLError(SSLCertVerificationError(1, '[SSL: \
                   CERTIFICATE_VERIFY_FAILED] certificate verify failed'))";
        let seen = failure(tls, "", &[]);
        assert_eq!(seen.kind, FailureKind::UntrustedCertificate);
        assert!(seen.to_string().contains("SANDBOX_CA_BUNDLE"));
        assert_eq!(
            failure("OSError: [Errno 28] No space left on device", "", &[]).kind,
            FailureKind::TooLarge { limit: 1 << 30 }
        );
        let index = IndexConfig::default();
        let timed_out = classify(
            &Evidence {
                route: Route::EgressProxy,
                output: "Collecting six",
                diagnosis: "",
                connections: &[],
                timed_out: true,
            },
            &Setting {
                index: &index,
                projects: &[],
                timeout: Duration::from_secs(300),
                install_max_bytes: 1,
            },
        );
        assert_eq!(
            timed_out.kind,
            FailureKind::TimedOut {
                limit: Duration::from_secs(300)
            }
        );
        assert_eq!(timed_out.index, "https://pypi.org/simple");
        assert!(timed_out.to_string().contains("SANDBOX_DEPS_TIMEOUT"));
    }

    #[test]
    fn the_diagnosis_is_split_from_the_installers_words() {
        let stdout = "installer: uv\nResolved\npcs-installer-diagnosis\nERROR: x\nlog: y\n";
        assert_eq!(
            split_diagnosis(stdout),
            ("installer: uv\nResolved", "ERROR: x\nlog: y\n")
        );
        assert_eq!(
            split_diagnosis("installer: pip\n"),
            ("installer: pip\n", "")
        );
    }

    #[test]
    fn the_failed_hosts_index_is_named() {
        let index = IndexConfig {
            index_url: Some("https://a.example/simple".into()),
            extra_index_urls: vec!["https://t:k@b.example/simple?x=1".into()],
            ..IndexConfig::default()
        };
        assert_eq!(
            index_of(&index, Some("b.example")),
            "https://***@b.example/simple?***"
        );
        assert_eq!(
            index_of(&index, Some("c.example")),
            "https://a.example/simple"
        );
        assert_eq!(index_of(&index, None), "https://a.example/simple");
    }
}
