//! The installer's command line and the index configuration it is built from.

use super::requirement::Requirement;

/// Where packages come from, as configured by the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexConfig {
    /// Replaces the default index (PyPI).
    pub index_url: Option<String>,
    /// Additional indexes, in order.
    pub extra_index_urls: Vec<String>,
    /// Digest of a custom CA bundle used for the indexes, if any.
    pub ca_bundle_digest: Option<String>,
    /// Source distributions may be built (`SANDBOX_ALLOW_SOURCE_BUILDS`): their build code runs
    /// during the install. Off, only pre-built wheels are installed and no package code runs.
    pub allow_source_builds: bool,
}

/// The hosts of the default index (PyPI): its pages, then its files.
pub const DEFAULT_INDEX_HOSTS: [&str; 2] = ["pypi.org", "files.pythonhosted.org"];

/// The tool that installs the packages inside the installer container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installer {
    /// `python3 -m pip`.
    Pip,
    /// `uv pip`, when the image has uv.
    Uv,
}

/// The installer's argv (to exec directly, never through a shell). Options come first, then `--`
/// (both pip's optparse and uv's clap treat everything after it as a requirement, never as an
/// option), then each requirement's canonical form as its own element. Unless the index
/// configuration allows source builds, only wheels are accepted (`--only-binary :all:`,
/// `--no-build`). `cache_dir` enables the
/// installer's download cache there; without it caching is disabled.
pub fn installer_argv(
    requirements: &[Requirement],
    target_dir: &str,
    installer: Installer,
    index: &IndexConfig,
    cache_dir: Option<&str>,
) -> Vec<String> {
    let mut argv = options_argv(target_dir, installer, index, cache_dir);
    argv.push("--".into());
    argv.extend(requirements.iter().map(Requirement::canonical));
    argv
}

/// The installer's argv for a lock file (a pip requirements file at `lock_path` in the
/// installer, every entry pinned with the hashes of its files, like the runner's own set): the
/// options of [`installer_argv`], then `--require-hashes --no-deps -r lock_path`. Exactly what the
/// file names is installed, each file checked against its hashes, nothing resolved beyond it.
pub fn locked_installer_argv(
    lock_path: &str,
    target_dir: &str,
    installer: Installer,
    index: &IndexConfig,
    cache_dir: Option<&str>,
) -> Vec<String> {
    let mut argv = options_argv(target_dir, installer, index, cache_dir);
    argv.extend(["--require-hashes", "--no-deps", "-r", lock_path].map(String::from));
    argv
}

/// Everything of an installer's argv before what it installs.
fn options_argv(
    target_dir: &str,
    installer: Installer,
    index: &IndexConfig,
    cache_dir: Option<&str>,
) -> Vec<String> {
    let mut argv: Vec<String> = match installer {
        Installer::Pip => [
            "python3",
            "-m",
            "pip",
            "install",
            "--no-input",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--progress-bar",
            "off",
            "--target",
            target_dir,
        ]
        .map(String::from)
        .to_vec(),
        Installer::Uv => [
            "uv", "pip", "install", "--target", target_dir, "--python", "python3",
        ]
        .map(String::from)
        .to_vec(),
    };
    if !index.allow_source_builds {
        // Wheels only: building a source distribution runs the package's own code.
        match installer {
            Installer::Pip => argv.extend(["--only-binary".into(), ":all:".into()]),
            Installer::Uv => argv.push("--no-build".into()),
        }
    }
    if let Some(url) = &index.index_url {
        argv.push("--index-url".into());
        argv.push(url.clone());
    }
    for url in &index.extra_index_urls {
        argv.push("--extra-index-url".into());
        argv.push(url.clone());
    }
    if installer == Installer::Pip {
        // pip ignores a plain-http index unless its host is trusted; the operator chose it (its
        // traffic goes through the egress proxy like any other).
        for host in plain_http_hosts(index) {
            argv.push("--trusted-host".into());
            argv.push(host);
        }
    }
    match (cache_dir, installer) {
        (Some(dir), _) => {
            argv.push("--cache-dir".into());
            argv.push(dir.to_string());
        }
        (None, Installer::Pip) => argv.push("--no-cache-dir".into()),
        (None, Installer::Uv) => argv.push("--no-cache".into()),
    }
    argv
}

/// The hosts (`host[:port]`, as pip's `--trusted-host` takes them) of the plain-http indexes.
pub fn plain_http_hosts(index: &IndexConfig) -> Vec<String> {
    let mut hosts: Vec<String> = index
        .index_url
        .iter()
        .chain(&index.extra_index_urls)
        .filter_map(|url| {
            let (scheme, rest) = url.split_once("://")?;
            if !scheme.eq_ignore_ascii_case("http") {
                return None;
            }
            let authority = rest.split(['/', '?', '#']).next()?;
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            (!host.is_empty()).then(|| host.to_string())
        })
        .collect();
    hosts.dedup();
    hosts
}

/// pip's argv from [`installer_argv`] with `options` placed right after `install` (before `--`,
/// so they stay options): a verbose log file, a dry run.
pub fn pip_with_options(argv: &[String], options: &[&str]) -> Vec<String> {
    let at = argv
        .iter()
        .position(|a| a == "install")
        .map_or(argv.len(), |i| i + 1);
    let mut out = argv[..at].to_vec();
    out.extend(options.iter().map(|o| o.to_string()));
    out.extend_from_slice(&argv[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::deps::parse_requirements;
    use crate::engine::deps::tests::reqs;

    fn strings(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn pip_argv_shape() {
        let requirements = parse_requirements(
            &strings(&["pandas>=2,<3", "numpy; python_version >= '3.9'"]),
            false,
        )
        .unwrap();
        let argv = installer_argv(
            &requirements,
            "/deps/tmp-1",
            Installer::Pip,
            &IndexConfig::default(),
            None,
        );
        assert_eq!(
            argv,
            strings(&[
                "python3",
                "-m",
                "pip",
                "install",
                "--no-input",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--progress-bar",
                "off",
                "--target",
                "/deps/tmp-1",
                "--only-binary",
                ":all:",
                "--no-cache-dir",
                "--",
                "numpy; python_version >= \"3.9\"",
                "pandas>=2,<3",
            ])
        );
    }

    #[test]
    fn pip_argv_with_indexes_and_cache() {
        let index = IndexConfig {
            index_url: Some("https://mirror/simple".into()),
            extra_index_urls: vec!["https://a/simple".into(), "https://b/simple".into()],
            ca_bundle_digest: Some("sha256:ca".into()),
            allow_source_builds: true,
        };
        let argv = installer_argv(
            &reqs(&["six"]),
            "/t",
            Installer::Pip,
            &index,
            Some("/cache/pip"),
        );
        let tail: Vec<&str> = argv[11..].iter().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                "--index-url",
                "https://mirror/simple",
                "--extra-index-url",
                "https://a/simple",
                "--extra-index-url",
                "https://b/simple",
                "--cache-dir",
                "/cache/pip",
                "--",
                "six",
            ]
        );
    }

    #[test]
    fn uv_argv_shape() {
        let argv = installer_argv(
            &reqs(&["requests[socks]>=2"]),
            "/t",
            Installer::Uv,
            &IndexConfig {
                index_url: Some("https://mirror/simple".into()),
                ..IndexConfig::default()
            },
            None,
        );
        assert_eq!(
            argv,
            strings(&[
                "uv",
                "pip",
                "install",
                "--target",
                "/t",
                "--python",
                "python3",
                "--no-build",
                "--index-url",
                "https://mirror/simple",
                "--no-cache",
                "--",
                "requests[socks]>=2",
            ])
        );
        let cached = installer_argv(
            &[],
            "/t",
            Installer::Uv,
            &IndexConfig::default(),
            Some("/c"),
        );
        assert_eq!(
            &cached[7..],
            strings(&["--no-build", "--cache-dir", "/c", "--"]).as_slice()
        );
        let sources = IndexConfig {
            allow_source_builds: true,
            ..IndexConfig::default()
        };
        let built = installer_argv(&[], "/t", Installer::Uv, &sources, None);
        assert!(!built.contains(&"--no-build".to_string()), "{built:?}");
    }

    #[test]
    fn a_lock_file_is_installed_as_locked() {
        let index = IndexConfig {
            index_url: Some("https://mirror/simple".into()),
            ..IndexConfig::default()
        };
        for installer in [Installer::Pip, Installer::Uv] {
            let argv = locked_installer_argv("/b/lock.txt", "/t", installer, &index, None);
            let plain = installer_argv(&[], "/t", installer, &index, None);
            // The same options (wheels only, the index, no cache), then the file, hashes required.
            assert_eq!(
                argv[..plain.len() - 1],
                plain[..plain.len() - 1],
                "{argv:?}"
            );
            assert_eq!(
                argv[plain.len() - 1..],
                strings(&["--require-hashes", "--no-deps", "-r", "/b/lock.txt"]),
            );
            assert!(!argv.contains(&"--".to_string()), "{argv:?}");
        }
        let pip = locked_installer_argv("/l", "/t", Installer::Pip, &IndexConfig::default(), None);
        assert!(
            pip.windows(2).any(|w| w == ["--only-binary", ":all:"]),
            "{pip:?}"
        );
    }

    #[test]
    fn requirements_come_after_the_option_terminator() {
        let argv = installer_argv(
            &reqs(&["a", "b"]),
            "/t",
            Installer::Pip,
            &IndexConfig::default(),
            None,
        );
        let terminator = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(&argv[terminator + 1..], strings(&["a", "b"]).as_slice());
        assert!(argv[terminator + 1..].iter().all(|a| !a.starts_with('-')));
    }

    #[test]
    fn pip_options_go_before_the_requirements() {
        let argv = installer_argv(
            &reqs(&["six"]),
            "/t",
            Installer::Pip,
            &IndexConfig::default(),
            None,
        );
        let logged = pip_with_options(&argv, &["--dry-run", "--log", "/b/pip.log"]);
        assert_eq!(
            logged[..7],
            strings(&[
                "python3",
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--log",
                "/b/pip.log"
            ])
        );
        assert_eq!(logged[7..], argv[4..]);
        assert_eq!(logged.last().map(String::as_str), Some("six"));
    }

    #[test]
    fn a_plain_http_index_is_trusted_by_pip() {
        let index = IndexConfig {
            index_url: Some("http://u:p@172.17.0.1:8000/simple/".into()),
            extra_index_urls: vec!["https://b/simple".into(), "HTTP://c/simple".into()],
            ..IndexConfig::default()
        };
        let argv = installer_argv(&reqs(&["six"]), "/t", Installer::Pip, &index, None);
        let trusted: Vec<&str> = argv
            .windows(2)
            .filter(|w| w[0] == "--trusted-host")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(trusted, ["172.17.0.1:8000", "c"]);
        let uv = installer_argv(&reqs(&["six"]), "/t", Installer::Uv, &index, None);
        assert!(!uv.contains(&"--trusted-host".to_string()), "{uv:?}");
    }
}
