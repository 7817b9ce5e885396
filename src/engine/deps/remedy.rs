//! The one setting that fixes a failed install, where a setting alone does and its value is
//! known: what `setup` prints after the failure's words, and offers in a client's `env`.
//!
//! Pure: the failure's kind, the dependency settings in force and the CA bundles in view.

use std::fmt;
use std::path::Path;

use super::command::DEFAULT_INDEX_HOSTS;
use super::FailureKind;
use crate::config::settings::{SANDBOX_CA_BUNDLE, SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE};
use crate::config::DependencyPolicy;
use crate::engine::outcome::Stopped;

/// A setting and the value that fixes a failure (the value keeps what the setting held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remedy {
    pub name: &'static str,
    pub value: String,
}

impl fmt::Display for Remedy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// The CA bundles a certificate failure is judged with.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaBundles<'a> {
    /// The bundle the installers trust now (`Config::ca_bundle`); `None`: their image's own.
    pub in_use: Option<&'a Path>,
    /// The host's own bundle, the one that trusts what the host trusts (an intercepting proxy's
    /// CA installed there), when there is one.
    pub host: Option<&'a Path>,
}

/// The setting that fixes `kind`, or `None` where no setting alone does or its value is not
/// known:
///
/// - an index host refused for resolving to a non-public address:
///   `SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE` with the hosts it held, plus the refused one; for one of
///   PyPI's, both of PyPI's (the index answers on the first, its files come from the second);
/// - an untrusted certificate: `SANDBOX_CA_BUNDLE` naming the host's bundle, when the installers
///   do not use that one already.
///
/// The others need a person's choice (credentials, another index, a host beyond the index's,
/// source builds, more time or room), which the failure's words name.
pub fn remedy(kind: &FailureKind, deps: &DependencyPolicy, ca: CaBundles<'_>) -> Option<Remedy> {
    match kind {
        FailureKind::Refused {
            host,
            stopped: Stopped::NonPublic(_),
            ..
        } => {
            let host = host.to_ascii_lowercase();
            let index_hosts: Vec<String> = if DEFAULT_INDEX_HOSTS.contains(&host.as_str()) {
                DEFAULT_INDEX_HOSTS.iter().map(|h| h.to_string()).collect()
            } else {
                vec![host]
            };
            let mut hosts: Vec<String> = Vec::new();
            for h in deps.egress_allow_private.iter().chain(&index_hosts) {
                if !hosts.iter().any(|k| k.eq_ignore_ascii_case(h)) {
                    hosts.push(h.clone());
                }
            }
            if hosts.len() == deps.egress_allow_private.len() {
                // All of them allowed already: the refusal is not this setting's doing.
                return None;
            }
            let value = hosts
                .iter()
                .map(|h| {
                    if h.contains(':') {
                        format!("[{h}]")
                    } else {
                        h.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            Some(Remedy {
                name: SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE.name,
                value,
            })
        }
        FailureKind::UntrustedCertificate => {
            let host = ca.host?;
            if ca.in_use == Some(host) {
                return None;
            }
            Some(Remedy {
                name: SANDBOX_CA_BUNDLE.name,
                value: host.display().to_string(),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::outcome::NoAnswer;
    use std::time::Duration;

    fn refused(host: &str, address: &str) -> FailureKind {
        FailureKind::Refused {
            host: host.into(),
            port: 443,
            stopped: Stopped::NonPublic(address.parse().unwrap()),
        }
    }

    fn deps(private: &[&str]) -> DependencyPolicy {
        let mut deps = Config::default().deps;
        deps.egress_allow_private = private.iter().map(|h| h.to_string()).collect();
        deps
    }

    #[test]
    fn a_pypi_host_refused_as_non_public_needs_both_of_pypis_hosts() {
        for host in ["pypi.org", "files.pythonhosted.org", "PyPI.org"] {
            let fix = remedy(&refused(host, "10.1.2.3"), &deps(&[]), CaBundles::default());
            assert_eq!(
                fix.map(|f| f.to_string()).as_deref(),
                Some("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE=pypi.org,files.pythonhosted.org"),
                "{host}"
            );
        }
        // What the setting held is kept, first; a host it had is not repeated.
        let fix = remedy(
            &refused("files.pythonhosted.org", "10.1.2.3"),
            &deps(&["mirror.lan", "pypi.org"]),
            CaBundles::default(),
        )
        .unwrap();
        assert_eq!(fix.value, "mirror.lan,pypi.org,files.pythonhosted.org");
        // Allowed already: something else refused it, and no setting here fixes that.
        assert_eq!(
            remedy(
                &refused("pypi.org", "10.1.2.3"),
                &deps(&["files.pythonhosted.org", "pypi.org"]),
                CaBundles::default()
            ),
            None
        );
    }

    #[test]
    fn another_index_host_is_added_alone() {
        let fix = remedy(
            &refused("172.17.0.1", "172.17.0.1"),
            &deps(&[]),
            CaBundles::default(),
        );
        assert_eq!(
            fix,
            Some(Remedy {
                name: "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE",
                value: "172.17.0.1".into()
            })
        );
        let fix = remedy(
            &refused("fd00::1", "fd00::1"),
            &deps(&[]),
            CaBundles::default(),
        );
        assert_eq!(fix.unwrap().value, "[fd00::1]");
    }

    #[test]
    fn an_untrusted_certificate_is_fixed_by_the_hosts_bundle_unless_it_is_in_use() {
        let host = Path::new("/etc/ssl/certs/ca-certificates.crt");
        let other = Path::new("/opt/ca.pem");
        let kind = FailureKind::UntrustedCertificate;
        let with = |in_use, host| CaBundles { in_use, host };
        assert_eq!(
            remedy(&kind, &deps(&[]), with(None, Some(host))).map(|f| f.to_string()),
            Some("SANDBOX_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt".into())
        );
        assert_eq!(
            remedy(&kind, &deps(&[]), with(Some(other), Some(host))).map(|f| f.value),
            Some("/etc/ssl/certs/ca-certificates.crt".into())
        );
        // The host's bundle is in use and still not trusted; or there is none: no value known.
        assert_eq!(
            remedy(&kind, &deps(&[]), with(Some(host), Some(host))),
            None
        );
        assert_eq!(remedy(&kind, &deps(&[]), with(None, None)), None);
    }

    #[test]
    fn failures_that_need_a_persons_choice_have_no_setting() {
        let ca = CaBundles {
            in_use: None,
            host: Some(Path::new("/etc/ssl/certs/ca-certificates.crt")),
        };
        for kind in [
            FailureKind::Refused {
                host: "evil.test".into(),
                port: 443,
                stopped: Stopped::NotAllowed,
            },
            FailureKind::Unresolved {
                host: "pypi.org".into(),
                port: 443,
            },
            FailureKind::NoAnswer {
                host: "pypi.org".into(),
                port: 443,
                how: NoAnswer::Refused,
            },
            FailureKind::Credentials { status: 401 },
            FailureKind::UnknownProject { name: None },
            FailureKind::NoSuchVersion {
                requirement: "six==9".into(),
                versions: vec![],
            },
            FailureKind::NoWheel,
            FailureKind::TimedOut {
                limit: Duration::from_secs(1),
            },
            FailureKind::TooLarge { limit: 1 },
            FailureKind::Other,
        ] {
            assert_eq!(remedy(&kind, &deps(&[]), ca), None, "{kind:?}");
        }
    }
}
