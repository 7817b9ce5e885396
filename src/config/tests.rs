//! `from_lookup` as operators meet it: defaults, accepted forms, and refusals that name the
//! variable, the value and the accepted form.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

#[test]
fn gvisor_needs_room_for_its_own_threads() {
    let e = config(&[("SANDBOX_RUNTIME", "runsc"), ("SANDBOX_PIDS_LIMIT", "64")]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_PIDS_LIMIT");
    assert!(config(&[("SANDBOX_RUNTIME", "runsc"), ("SANDBOX_PIDS_LIMIT", "256")]).is_ok());
    assert!(config(&[("SANDBOX_PIDS_LIMIT", "64")]).is_ok());
}

#[test]
fn the_workspace_fits_in_memory() {
    let c = config(&[("SANDBOX_MEMORY_LIMIT", "256m")]).unwrap();
    assert_eq!(
        c.limits.workspace_bytes,
        128 << 20,
        "half the memory when unset"
    );
    let c = config(&[("SANDBOX_WORKSPACE_SIZE", "100m")]).unwrap();
    assert_eq!(c.limits.workspace_bytes, 100 << 20);
    let e = config(&[
        ("SANDBOX_MEMORY_LIMIT", "256m"),
        ("SANDBOX_WORKSPACE_SIZE", "1g"),
    ])
    .unwrap_err();
    assert_eq!(e.var, "SANDBOX_WORKSPACE_SIZE");
}

fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|name| map.get(name).cloned())
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = config(&[]).unwrap();
    assert_eq!(c.image, DEFAULT_IMAGE);
    assert_eq!(c.limits.memory_bytes, 2 * 1024 * 1024 * 1024);
    assert_eq!(c.limits.cpus, 0.5);
    assert_eq!(c.network, NetworkPolicy::None);
    // The host's own bundle, where it has one.
    match c.ca_bundle_source {
        CaBundleSource::Host { .. } => assert!(c.ca_bundle.as_deref().is_some_and(|p| p.is_file())),
        CaBundleSource::NotFound => assert_eq!(c.ca_bundle, None),
        other => panic!("unset, the bundle is the host's or none: {other:?}"),
    }
}

#[test]
fn the_ca_bundle_is_the_setting_or_none_when_set() {
    let c = config(&[("SANDBOX_CA_BUNDLE", "none")]).unwrap();
    assert_eq!(
        (c.ca_bundle, c.ca_bundle_source),
        (None, CaBundleSource::Off)
    );
    assert!(c_summary_names("none", "SANDBOX_CA_BUNDLE=none"));
    let remote = config(&[("DOCKER_HOST", "tcp://engine.example:2376")]).unwrap();
    assert_eq!(remote.ca_bundle_source, CaBundleSource::NotFound);
    assert!(remote.ca_bundle_summary().contains("another machine"));
}

fn c_summary_names(value: &str, words: &str) -> bool {
    config(&[("SANDBOX_CA_BUNDLE", value)])
        .unwrap()
        .ca_bundle_summary()
        .contains(words)
}

#[test]
fn sizes_use_binary_units_like_docker() {
    let c = config(&[
        ("SANDBOX_MEMORY_LIMIT", "512m"),
        ("SANDBOX_MAX_OUTPUT", "64k"),
    ])
    .unwrap();
    assert_eq!(c.limits.memory_bytes, 512 * 1024 * 1024);
    assert_eq!(c.limits.max_output_bytes, 64 * 1024);
    let c = config(&[("SANDBOX_MEMORY_LIMIT", "1G")]).unwrap();
    assert_eq!(c.limits.memory_bytes, 1 << 30);
}

#[test]
fn the_model_output_budget_is_a_bounded_count_of_characters() {
    assert_eq!(config(&[]).unwrap().limits.model_output_chars, 20_000);
    let c = config(&[("SANDBOX_MODEL_OUTPUT", "5000")]).unwrap();
    assert_eq!(c.limits.model_output_chars, 5000);
    for bad in ["999", "1000001", "20k", "-1", "lots"] {
        let e = config(&[("SANDBOX_MODEL_OUTPUT", bad)]).unwrap_err();
        assert_eq!(e.var, "SANDBOX_MODEL_OUTPUT", "{bad}");
        assert!(e.to_string().contains("from 1000 to 1000000"), "{e}");
    }
}

#[test]
fn durations_accept_units_and_bare_seconds() {
    let c = config(&[("SANDBOX_TIMEOUT", "90")]).unwrap();
    assert_eq!(c.limits.timeout, Duration::from_secs(90));
    let c = config(&[("SANDBOX_TIMEOUT", "2m")]).unwrap();
    assert_eq!(c.limits.timeout, Duration::from_secs(120));
    let c = config(&[("SANDBOX_TIMEOUT", "1.5")]).unwrap();
    assert_eq!(c.limits.timeout, Duration::from_millis(1500));
}

#[test]
fn empty_values_take_the_default() {
    let c = config(&[("SANDBOX_TIMEOUT", ""), ("SANDBOX_NETWORK", " ")]).unwrap();
    assert_eq!(c.limits.timeout, Duration::from_secs(60));
    assert_eq!(c.network, NetworkPolicy::None);
}

#[test]
fn bad_values_name_the_variable_value_and_form() {
    let cases = [
        ("SANDBOX_MEMORY_LIMIT", "lots"),
        ("SANDBOX_MEMORY_LIMIT", "1k"),
        ("SANDBOX_CPU_LIMIT", "-1"),
        ("SANDBOX_CPU_LIMIT", "NaN"),
        ("SANDBOX_PIDS_LIMIT", "0"),
        ("SANDBOX_PIDS_LIMIT", "many"),
        ("SANDBOX_TIMEOUT", "0"),
        ("SANDBOX_TIMEOUT", "soon"),
        ("SANDBOX_TIMEOUT", "-5"),
        ("SANDBOX_MAX_OUTPUT", "1t"),
        ("SANDBOX_NETWORK", "host"),
        ("SANDBOX_CA_BUNDLE", "relative.pem"),
        ("SANDBOX_CA_BUNDLE", "/no/such/file.pem"),
        ("SANDBOX_IMAGE", "two words"),
        ("LOG_LEVEL", "loud=[["),
    ];
    for (var, value) in cases {
        let err = config(&[(var, value)]).expect_err(var);
        assert_eq!(err.var, var);
        assert_eq!(err.value, value);
        let text = err.to_string();
        assert!(
            text.contains(var) && text.contains(value) && text.contains("expected"),
            "{text}"
        );
    }
}

#[test]
fn files_dir_empty_disables_saving() {
    assert!(config(&[]).unwrap().files.persist_dir.is_some());
    assert_eq!(
        config(&[("SANDBOX_FILES_DIR", "")])
            .unwrap()
            .files
            .persist_dir,
        None
    );
    assert_eq!(
        config(&[("SANDBOX_FILES_DIR", "/srv/files")])
            .unwrap()
            .files
            .persist_dir,
        Some(PathBuf::from("/srv/files"))
    );
    assert!(config(&[("SANDBOX_FILES_DIR", "relative")]).is_err());
}

#[test]
fn files_go_to_a_per_user_directory_by_default() {
    let dir = config(&[]).unwrap().files.persist_dir.unwrap();
    assert!(dir.ends_with("python-code-sandbox/files"), "{dir:?}");
    if std::env::var_os("HOME").is_some() || std::env::var_os("XDG_STATE_HOME").is_some() {
        assert!(!dir.starts_with(std::env::temp_dir()), "{dir:?}");
    } else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(dir
            .to_string_lossy()
            .contains(&format!("python-code-sandbox-{uid}")));
    }
}

#[test]
fn files_retention_has_defaults_and_is_validated() {
    let c = config(&[]).unwrap();
    assert_eq!(c.files.max_age, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(c.files.max_saved_bytes, 1 << 30);
    let c = config(&[
        ("SANDBOX_FILES_MAX_AGE", "2h"),
        ("SANDBOX_FILES_MAX_BYTES", "64k"),
        ("SANDBOX_FILES_MAX_TOTAL", "32k"),
    ])
    .unwrap();
    assert_eq!(c.files.max_age, Duration::from_secs(7200));
    assert_eq!(c.files.max_saved_bytes, 64 << 10);
    for (var, value) in [
        ("SANDBOX_FILES_MAX_AGE", "soon"),
        ("SANDBOX_FILES_MAX_AGE", "0"),
        ("SANDBOX_FILES_MAX_BYTES", "lots"),
        ("SANDBOX_FILES_MAX_BYTES", "0"),
    ] {
        let e = config(&[(var, value)]).unwrap_err();
        assert_eq!(e.var, var);
    }
    // One execution's saved files (SANDBOX_FILES_MAX_TOTAL, 500m by default) must fit.
    let e = config(&[("SANDBOX_FILES_MAX_BYTES", "100m")]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_FILES_MAX_BYTES");
    assert!(e.expected.contains("SANDBOX_FILES_MAX_TOTAL"), "{e}");
}

#[test]
fn operator_mounts_parse_and_refuse_reserved_paths() {
    let tmp = std::env::temp_dir();
    let ok = format!("{}:/data,{}:/scratch:rw", tmp.display(), tmp.display());
    let mounts = config(&[("SANDBOX_MOUNTS", &ok)]).unwrap().mounts;
    assert_eq!(mounts.len(), 2);
    assert!(mounts[0].read_only && !mounts[1].read_only);
    assert_eq!(mounts[1].container, "/scratch");
    for bad in [
        "relative:/data",
        "/no/such/dir:/data",
        "/tmp:/",
        "/tmp:/etc/x",
        "/tmp:/workspace",
        "/tmp:data",
        "/tmp:/data:xx",
        "/tmp:/a/../b",
        "/tmp:/mnt",
        "/tmp:/mnt/roots",
        "/tmp:/mnt/roots/proj",
    ] {
        assert!(config(&[("SANDBOX_MOUNTS", bad)]).is_err(), "{bad}");
    }
    let mnt = format!("{}:/mnt/data", tmp.display());
    assert!(config(&[("SANDBOX_MOUNTS", &mnt)]).is_ok());
}

#[test]
fn dependency_settings_parse() {
    let c = config(&[
        ("PIP_INDEX_URL", "https://mirror.example/simple"),
        (
            "PIP_EXTRA_INDEX_URL",
            "https://a.example/simple https://b.example/simple",
        ),
        ("ENABLE_PIP_CACHE", "false"),
        ("SANDBOX_DEPS_CACHE_MAX", "2g"),
    ])
    .unwrap();
    assert_eq!(
        c.deps.index_url.as_deref(),
        Some("https://mirror.example/simple")
    );
    assert_eq!(c.deps.extra_index_urls.len(), 2);
    assert_eq!(c.deps.download_cache, DownloadCache::Off);
    assert_eq!(c.deps.cache_max_bytes, 2 << 30);
    let c = config(&[("PIP_CACHE_PATH", "/var/cache/pip")]).unwrap();
    assert_eq!(
        c.deps.download_cache,
        DownloadCache::HostPath("/var/cache/pip".into())
    );
    for (var, bad) in [
        ("PIP_INDEX_URL", "file:///x"),
        ("ENABLE_PIP_CACHE", "maybe"),
        ("SANDBOX_DEPS_VOLUME", "a/b"),
        ("PIP_CACHE_PATH", "rel"),
    ] {
        assert!(config(&[(var, bad)]).is_err(), "{var}={bad}");
    }
}

#[test]
fn source_builds_and_credentials() {
    let c = config(&[]).unwrap();
    assert!(!c.deps.allow_source_builds, "wheels only by default");
    assert_eq!(c.deps.install_max_bytes, 2 << 30);
    let c = config(&[
        ("SANDBOX_ALLOW_SOURCE_BUILDS", "true"),
        ("SANDBOX_DEPS_INSTALL_MAX", "500m"),
        ("PIP_INDEX_URL", "https://mirror.example/simple"),
    ])
    .unwrap();
    assert!(c.deps.allow_source_builds);
    assert_eq!(c.deps.install_max_bytes, 500 << 20);
    // Credentials are fine with wheels only (no package code runs during the install)...
    let with_token = "https://user:s3cret@mirror.example/simple";
    assert!(config(&[("PIP_INDEX_URL", with_token)]).is_ok());
    // ...and refused with source builds, without showing them.
    for (var, url) in [
        ("PIP_INDEX_URL", with_token),
        ("PIP_INDEX_URL", "https://tok3n@mirror.example/simple"),
        (
            "PIP_EXTRA_INDEX_URL",
            "https://a.example/simple?token=s3cret",
        ),
    ] {
        let error = config(&[(var, url), ("SANDBOX_ALLOW_SOURCE_BUILDS", "true")])
            .expect_err(url)
            .to_string();
        assert!(error.contains("SANDBOX_ALLOW_SOURCE_BUILDS"), "{error}");
        assert!(
            !error.contains("s3cret") && !error.contains("tok3n"),
            "{error}"
        );
    }
    assert_eq!(
        redact_url("https://u:p@h.example:8080/simple?t=1"),
        "https://***@h.example:8080/simple?***"
    );
    assert!(!url_has_credentials("https://h.example/simple"));
}

#[test]
fn globs_match_images() {
    assert!(glob_matches("python:3.12-slim", "python:3.12-slim"));
    assert!(glob_matches("python:*", "python:3.12-slim"));
    assert!(glob_matches("myorg/*:v?", "myorg/tools:v2"));
    assert!(!glob_matches("myorg/*:v?", "myorg/tools:v22"));
    assert!(!glob_matches("python:*", "evil/python:3"));
    assert!(glob_matches("*", "anything"));
    assert!(!glob_matches("", "x"));
}

#[test]
fn session_and_concurrency_settings_parse() {
    let c = config(&[
        ("SANDBOX_ALLOWED_IMAGES", "python:3.12-slim, myorg/*"),
        ("SANDBOX_MAX_SESSIONS", "3"),
        ("SANDBOX_SESSION_IDLE_TIMEOUT", "5m"),
        ("SANDBOX_MAX_CONCURRENT", "2"),
    ])
    .unwrap();
    assert_eq!(c.allowed_images, vec!["python:3.12-slim", "myorg/*"]);
    assert_eq!(c.sessions.max_sessions, 3);
    assert_eq!(c.sessions.idle_timeout, Duration::from_secs(300));
    assert_eq!(c.max_concurrent, 2);
    assert!(config(&[("SANDBOX_MAX_CONCURRENT", "0")]).is_err());
    assert!(config(&[("SANDBOX_PYPI_URL", "ftp://x")]).is_err());
}

#[test]
fn network_bridge_is_accepted() {
    let c = config(&[("SANDBOX_NETWORK", "Bridge")]).unwrap();
    assert_eq!(c.network, NetworkPolicy::Bridge);
}

#[test]
fn http_settings_parse_and_hide_the_token() {
    let c = config(&[
        ("SANDBOX_HTTP_TOKEN", "0123456789abcdef0123"),
        (
            "SANDBOX_HTTP_ALLOWED_ORIGINS",
            "https://App.example.com, http://localhost:3000/",
        ),
        (
            "SANDBOX_HTTP_ALLOWED_HOSTS",
            "mcp.example.com,[::1]:8080,10.0.0.5:80",
        ),
        ("SANDBOX_HTTP_MAX_BODY", "20m"),
    ])
    .unwrap();
    assert_eq!(
        c.http.token.as_ref().map(Secret::expose),
        Some("0123456789abcdef0123")
    );
    assert!(!format!("{c:?}").contains("0123456789abcdef0123"));
    assert_eq!(
        c.http.allowed_origins,
        vec!["https://app.example.com:443", "http://localhost:3000"]
    );
    let hosts = c.http.allowed_hosts.unwrap();
    assert!(hosts[0].matches("mcp.example.com", Some(1234)));
    assert!(hosts[1].matches("::1", Some(8080)) && !hosts[1].matches("::1", Some(80)));
    assert_eq!(c.http.max_body_bytes, 20 << 20);
    assert_eq!(
        config(&[]).unwrap().http.max_body_bytes,
        DEFAULT_HTTP_MAX_BODY
    );

    let short = config(&[("SANDBOX_HTTP_TOKEN", "tiny")]).unwrap_err();
    assert!(!short.to_string().contains("tiny"), "{short}");
    let spaced = config(&[("SANDBOX_HTTP_TOKEN", "has spaces in it, 1234567")]).unwrap_err();
    assert!(!spaced.to_string().contains("spaces"), "{spaced}");
    for (var, bad) in [
        ("SANDBOX_HTTP_ALLOWED_ORIGINS", "app.example.com"),
        (
            "SANDBOX_HTTP_ALLOWED_ORIGINS",
            "https://app.example.com/path",
        ),
        ("SANDBOX_HTTP_ALLOWED_ORIGINS", "ftp://x"),
        ("SANDBOX_HTTP_ALLOWED_HOSTS", "bad host"),
        ("SANDBOX_HTTP_ALLOWED_HOSTS", "x:99999"),
        ("SANDBOX_HTTP_MAX_BODY", "1k"),
        ("SANDBOX_HTTP_MAX_BODY", "2g"),
    ] {
        assert!(config(&[(var, bad)]).is_err(), "{var}={bad}");
    }
}

#[test]
fn http_limits_parse_within_their_ranges() {
    let c = config(&[]).unwrap();
    assert_eq!(c.http.header_timeout, Duration::from_secs(10));
    assert!(c.http.idle_timeout > SSE_PING_INTERVAL);
    let c = config(&[
        ("SANDBOX_HTTP_HEADER_TIMEOUT", "3s"),
        ("SANDBOX_HTTP_IDLE_TIMEOUT", "1m"),
        ("SANDBOX_HTTP_MAX_CONNECTIONS", "8"),
        ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "2"),
        ("SANDBOX_HTTP_MCP_IDLE_TIMEOUT", "90"),
    ])
    .unwrap();
    assert_eq!(c.http.header_timeout, Duration::from_secs(3));
    assert_eq!(c.http.idle_timeout, Duration::from_secs(60));
    assert_eq!(c.http.max_connections, 8);
    assert_eq!(c.http.max_mcp_sessions, 2);
    assert_eq!(c.http.mcp_idle_timeout, Duration::from_secs(90));
    for (var, bad) in [
        ("SANDBOX_HTTP_HEADER_TIMEOUT", "0"),
        ("SANDBOX_HTTP_HEADER_TIMEOUT", "1h"),
        ("SANDBOX_HTTP_IDLE_TIMEOUT", "10s"),
        ("SANDBOX_HTTP_MAX_CONNECTIONS", "0"),
        ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "0"),
        ("SANDBOX_HTTP_MAX_MCP_SESSIONS", "many"),
        ("SANDBOX_HTTP_MCP_IDLE_TIMEOUT", "-1"),
    ] {
        let e = config(&[(var, bad)]).unwrap_err();
        assert_eq!(e.var, var, "{var}={bad}");
    }
}

#[test]
fn the_token_comes_from_a_file_or_the_environment_not_both() {
    let path = std::env::temp_dir().join(format!("pcs-token-{}", uuid::Uuid::new_v4()));
    std::fs::write(&path, "fedcba9876543210fedcba\n").unwrap();
    let file = path.display().to_string();
    let c = config(&[("SANDBOX_HTTP_TOKEN_FILE", &file)]).unwrap();
    assert_eq!(
        c.http.token.as_ref().map(Secret::expose),
        Some("fedcba9876543210fedcba")
    );
    let both = config(&[
        ("SANDBOX_HTTP_TOKEN_FILE", &file),
        ("SANDBOX_HTTP_TOKEN", "0123456789abcdef0123"),
    ]);
    assert!(both.is_err());
    let _ = std::fs::remove_file(&path);
    assert!(
        config(&[("SANDBOX_HTTP_TOKEN_FILE", &file)]).is_err(),
        "missing file"
    );
}

#[test]
fn hosts_and_origins_normalize() {
    assert_eq!(
        parse_host("LocalHost:8080"),
        Some(("localhost".into(), Some(8080)))
    );
    assert_eq!(parse_host("[::1]"), Some(("::1".into(), None)));
    assert_eq!(parse_host("::1"), Some(("::1".into(), None)));
    assert_eq!(parse_host("evil.com:8080:1"), None);
    assert_eq!(parse_host("a b"), None);
    assert_eq!(parse_host(""), None);
    assert_eq!(
        normalize_origin("http://[::1]:9000").as_deref(),
        Some("http://[::1]:9000")
    );
    assert_eq!(
        normalize_origin("HTTPS://Example.com").as_deref(),
        Some("https://example.com:443")
    );
    assert_eq!(normalize_origin("null").as_deref(), Some("null"));
    assert_eq!(normalize_origin("https://u@example.com"), None);
}

#[test]
fn network_allowlist_reads_the_egress_settings() {
    let c = config(&[
        ("SANDBOX_NETWORK", "AllowList"),
        (
            "SANDBOX_EGRESS_ALLOW",
            "pypi.org, *.data.test:8443, 10.0.0.0/8:5432",
        ),
        ("SANDBOX_EGRESS_ASK", "*"),
        (
            "SANDBOX_EGRESS_RESOLVE",
            "data.test=172.18.0.5, api.data.test=[fd00::5], test=::1",
        ),
        ("SANDBOX_EGRESS_UPLINK", "my-uplink"),
    ])
    .unwrap();
    assert_eq!(c.network, NetworkPolicy::Allowlist);
    assert_eq!(c.network.as_str(), "allowlist");
    assert_eq!(c.egress.allow.entries.len(), 3);
    assert!(c.egress.allow.permits_name("a.data.test", 8443));
    assert!(c.egress.ask.has_any());
    assert!(!c.egress.allow_all);
    assert_eq!(
        c.egress.resolve,
        vec![
            ("data.test".to_string(), "172.18.0.5".parse().unwrap()),
            ("api.data.test".to_string(), "fd00::5".parse().unwrap()),
            ("test".to_string(), "::1".parse().unwrap()),
        ]
    );
    assert_eq!(
        c.egress.resolve_override("api.data.test"),
        Some("fd00::5".parse().unwrap())
    );
    assert_eq!(c.egress.uplink, "my-uplink");

    let defaults = config(&[]).unwrap().egress;
    assert_eq!(defaults, EgressPolicy::default());
    assert_eq!(defaults.uplink, "bridge");
    assert!(defaults.allow.is_empty() && defaults.ask.is_empty() && !defaults.allow_all);

    let everything = config(&[
        ("SANDBOX_NETWORK", "allowlist"),
        ("SANDBOX_EGRESS_ALLOW", "*"),
        ("SANDBOX_EGRESS_ALLOW_ALL", "true"),
    ])
    .unwrap();
    assert!(everything.egress.allow.has_any() && everything.egress.allow_all);
    let ask_only = config(&[
        ("SANDBOX_NETWORK", "allowlist"),
        ("SANDBOX_EGRESS_ASK", "*.example.com"),
    ]);
    assert!(ask_only.is_ok());
}

fn allowlist_with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut all = vec![("SANDBOX_NETWORK", "allowlist")];
    all.extend_from_slice(pairs);
    config(&all)
}

#[test]
fn malformed_egress_entries_name_the_setting_and_the_entry() {
    for (var, value, why) in [
        ("SANDBOX_EGRESS_ALLOW", "pypi.org,a..b", "entry 2 `a..b`"),
        ("SANDBOX_EGRESS_ALLOW", "x:65536", "port `65536`"),
        ("SANDBOX_EGRESS_ALLOW", "1.2.3.4/33", "not an address range"),
        ("SANDBOX_EGRESS_ASK", "*.*.x", "'*' only"),
        ("SANDBOX_EGRESS_ASK", "[::1", "no closing ']'"),
        ("SANDBOX_EGRESS_ASK", "10.0.0.0/8", "names only"),
        ("SANDBOX_EGRESS_ALLOW_ALL", "perhaps", "true or false"),
        ("SANDBOX_EGRESS_UPLINK", "two words", "Docker network name"),
        ("SANDBOX_EGRESS_RESOLVE", "data.test", "name=address"),
        (
            "SANDBOX_EGRESS_RESOLVE",
            "data.test=nowhere",
            "name=address",
        ),
        ("SANDBOX_EGRESS_RESOLVE", "1.2.3.4=1.2.3.4", "name=address"),
    ] {
        let other = if var == "SANDBOX_EGRESS_ALLOW" {
            ("SANDBOX_EGRESS_ASK", "*")
        } else {
            ("SANDBOX_EGRESS_ALLOW", "x.org")
        };
        let e = allowlist_with(&[(var, value), other])
            .err()
            .unwrap_or_else(|| panic!("{var}={value} accepted"));
        assert_eq!(e.var, var, "{value}");
        assert_eq!(e.value, value);
        let text = e.to_string();
        assert!(text.contains(var) && text.contains(why), "{text}");
    }
}

#[test]
fn the_resolver_override_cannot_map_public_names() {
    for public in [
        "pypi.org=127.0.0.1",
        "data.test=10.0.0.1,example.com=10.0.0.2",
        "testing=::1",
        "a.test.org=::1",
    ] {
        let e = allowlist_with(&[
            ("SANDBOX_EGRESS_ALLOW", "x.test"),
            ("SANDBOX_EGRESS_RESOLVE", public),
        ])
        .unwrap_err();
        assert_eq!(e.var, "SANDBOX_EGRESS_RESOLVE");
        let text = e.to_string();
        assert!(
            text.contains("test-only") && text.contains("cannot map public names"),
            "{text}"
        );
    }
    let c = allowlist_with(&[
        ("SANDBOX_EGRESS_ALLOW", "x.test"),
        ("SANDBOX_EGRESS_RESOLVE", "Data.Test.=127.0.0.1"),
    ])
    .unwrap();
    assert_eq!(
        c.egress.resolve_override("data.test"),
        Some("127.0.0.1".parse().unwrap())
    );
}

#[test]
fn any_host_needs_allow_all() {
    for allow in ["*", "pypi.org, *:8080"] {
        let e = allowlist_with(&[("SANDBOX_EGRESS_ALLOW", allow)]).unwrap_err();
        assert_eq!(e.var, "SANDBOX_EGRESS_ALLOW");
        assert_eq!(e.value, allow);
        assert!(
            e.to_string().contains("SANDBOX_EGRESS_ALLOW_ALL=true"),
            "{e}"
        );
        let e = allowlist_with(&[
            ("SANDBOX_EGRESS_ALLOW", allow),
            ("SANDBOX_EGRESS_ALLOW_ALL", "false"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "SANDBOX_EGRESS_ALLOW");
    }
    // `*` among the names to ask about is the user's to answer, not a blanket allow.
    assert!(allowlist_with(&[("SANDBOX_EGRESS_ASK", "*")]).is_ok());
    // `*.suffix` is not `*`.
    assert!(allowlist_with(&[("SANDBOX_EGRESS_ALLOW", "*.example.com")]).is_ok());
}

#[test]
fn the_allowlist_needs_something_to_reach() {
    for extra in [
        &[][..],
        &[("SANDBOX_EGRESS_ALLOW", " , ")][..],
        &[("SANDBOX_EGRESS_ALLOW_ALL", "true")][..],
    ] {
        let e = allowlist_with(extra).unwrap_err();
        assert_eq!(e.var, "SANDBOX_NETWORK");
        assert_eq!(e.value, "allowlist");
        let text = e.to_string();
        assert!(
            text.contains("SANDBOX_EGRESS_ALLOW") && text.contains("SANDBOX_EGRESS_ASK"),
            "{text}"
        );
    }
}

#[test]
fn egress_settings_need_the_allowlist_network() {
    for network in [None, Some("none"), Some("bridge")] {
        for (var, value) in [
            ("SANDBOX_EGRESS_ALLOW", "pypi.org"),
            ("SANDBOX_EGRESS_ASK", "*"),
            ("SANDBOX_EGRESS_ALLOW_ALL", "false"),
            ("SANDBOX_EGRESS_RESOLVE", "data.test=127.0.0.1"),
        ] {
            let mut pairs = vec![(var, value)];
            pairs.extend(network.map(|n| ("SANDBOX_NETWORK", n)));
            let e = config(&pairs).unwrap_err();
            assert_eq!(e.var, var, "{network:?}");
            let text = e.to_string();
            assert!(text.contains("SANDBOX_NETWORK=allowlist"), "{text}");
        }
    }
    // Blank counts as unset.
    assert!(config(&[("SANDBOX_EGRESS_ALLOW", " ")]).is_ok());
    // The proxy serves the installers in every mode: its uplink and subnets apply there too.
    let c = config(&[
        ("SANDBOX_EGRESS_UPLINK", "my-uplink"),
        ("SANDBOX_EGRESS_SUBNETS", "10.50.0.0/20"),
    ])
    .unwrap();
    assert_eq!(c.egress.uplink, "my-uplink");
    assert_eq!(c.egress.subnets.to_string(), "10.50.0.0/20");
    for bad in ["10.50.0.0/25", "fd00::/8", "nonsense"] {
        let e = config(&[("SANDBOX_EGRESS_SUBNETS", bad)]).unwrap_err();
        assert_eq!(e.var, "SANDBOX_EGRESS_SUBNETS", "{bad}");
    }
}

#[test]
fn roots_settings_parse_and_their_relations_hold() {
    let on = config(&[("SANDBOX_ROOTS", "ro"), ("SANDBOX_ROOTS_ALLOW", "/srv/p")]).unwrap();
    assert_eq!(on.roots.mode, super::RootsMode::ReadOnly);
    assert_eq!(on.roots.allow, vec![std::path::PathBuf::from("/srv/p")]);
    // The bounds of roots only mean something when roots are on.
    let e = config(&[("SANDBOX_ROOTS_ALLOW", "/srv/p")]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_ROOTS_ALLOW");
    let e = config(&[("SANDBOX_ROOTS_MAP", "/a=/b")]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_ROOTS_MAP");
    // A remote engine cannot mount this machine's directories.
    let e = config(&[
        ("SANDBOX_ROOTS", "ro"),
        ("DOCKER_HOST", "ssh://me@elsewhere"),
    ])
    .unwrap_err();
    assert_eq!(e.var, "SANDBOX_ROOTS");
    assert!(e.to_string().contains("another machine"), "{e}");

    // rw as root is refused; as another user it is not.
    let lookup = |name: &str| match name {
        "SANDBOX_ROOTS" => Some("rw".to_string()),
        _ => None,
    };
    let env = super::settings::Env(&lookup);
    let mut rw = Config::default();
    rw.roots.mode = super::RootsMode::ReadWrite;
    rw.roots.allow = vec!["/home/me".into()];
    let e = super::validate::roots(&rw, &env, 0).unwrap_err();
    assert_eq!(e.var, "SANDBOX_ROOTS");
    assert!(e.to_string().contains("root"), "{e}");
    super::validate::roots(&rw, &env, 1000).unwrap();
    // With nowhere allowed, nothing could be mounted: refused rather than silently empty.
    rw.roots.allow.clear();
    let e = super::validate::roots(&rw, &env, 1000).unwrap_err();
    assert_eq!(e.var, "SANDBOX_ROOTS_ALLOW");
}

/// A secrets file in a directory of its own, with one secret whose value is `$PCS_TEST_KEY`.
fn secrets_file() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pcs-secrets-cfg-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let file = dir.join("secrets.toml");
    std::fs::write(
        &file,
        "[[secret]]\nname = \"openai\"\nvalue_env = \"PCS_TEST_KEY\"\nhosts = [\"api.openai.com\"]\nenv = \"OPENAI_API_KEY\"\n",
    )
    .expect("written");
    file
}

#[test]
fn secrets_are_read_with_the_allowlist_network_only() {
    let file = secrets_file();
    let path = file.display().to_string();
    let key = ("PCS_TEST_KEY", "sk-test-123");
    let allowlist = ("SANDBOX_NETWORK", "allowlist");
    let secrets = ("SANDBOX_SECRETS_FILE", path.as_str());

    // Nothing else to reach is needed: the secret's host is reachable.
    let c = config(&[secrets, allowlist, key]).unwrap();
    assert_eq!(c.secrets.entries.len(), 1);
    assert_eq!(c.secrets.entries[0].value.expose(), "sk-test-123");
    assert_eq!(c.secrets.file.as_deref(), Some(file.as_path()));
    let summary = c.secrets_summary().unwrap();
    assert!(summary.contains("openai ($OPENAI_API_KEY"), "{summary}");
    assert!(!format!("{c:?}").contains("sk-test-123"));
    assert!(config(&[allowlist]).is_err(), "nothing to reach");
    assert_eq!(config(&[]).unwrap().secrets_summary(), None);

    for (network, shown) in [(None, "none"), (Some("bridge"), "bridge")] {
        let mut vars = vec![secrets, key];
        vars.extend(network.map(|n| ("SANDBOX_NETWORK", n)));
        let e = config(&vars).unwrap_err();
        assert_eq!(e.var, "SANDBOX_SECRETS_FILE");
        assert!(
            e.to_string().contains(&format!(
                "secrets need SANDBOX_NETWORK=allowlist (this server's is {shown})"
            )),
            "{e}"
        );
    }

    let remote = ("DOCKER_HOST", "ssh://me@engine.example");
    let e = config(&[secrets, allowlist, key, remote]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_SECRETS_FILE");
    assert!(e.to_string().contains("the engine on this machine"), "{e}");

    let e = config(&[
        secrets,
        allowlist,
        key,
        ("SANDBOX_OAUTH_ISSUER", "https://auth.example.com"),
        ("SANDBOX_OAUTH_JWKS", "https://auth.example.com/jwks"),
        (
            "SANDBOX_HTTP_RESOURCE_URL",
            "https://sandbox.example.com/mcp",
        ),
    ])
    .unwrap_err();
    assert_eq!(e.var, "SANDBOX_SECRETS_FILE");
    assert!(e.to_string().contains("SANDBOX_OAUTH_ISSUER"), "{e}");

    // The file's own faults, with the entry and the field; the value never.
    let e = config(&[secrets, allowlist]).unwrap_err();
    assert_eq!(e.var, "SANDBOX_SECRETS_FILE");
    assert!(
        e.to_string().contains(
            "[[secret]] #1 (name \"openai\"), field `value_env`: $PCS_TEST_KEY is unset or empty"
        ),
        "{e}"
    );
    let e = config(&[secrets, allowlist, ("PCS_TEST_KEY", "sk test")]).unwrap_err();
    assert!(e.to_string().contains("character 3 of 7 is a space"), "{e}");
    assert!(!e.to_string().contains("sk test"), "{e}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "the typed error is kept"
    );
    let e = config(&[("SANDBOX_SECRETS_FILE", "secrets.toml"), allowlist]).unwrap_err();
    assert!(e.to_string().contains("the absolute path"), "{e}");
    let missing = file.with_file_name("missing.toml");
    let e = config(&[
        ("SANDBOX_SECRETS_FILE", &missing.display().to_string()),
        allowlist,
    ])
    .unwrap_err();
    assert!(e.to_string().contains("cannot be read"), "{e}");
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}
