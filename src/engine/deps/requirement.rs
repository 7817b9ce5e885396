//! Dependency entries parsed as a strict subset of PEP 508: a name, extras, version specifiers,
//! a restricted environment marker (see `marker`), and `name @ url` only when the operator allows
//! it. What is accepted here is the safety boundary: only the re-serialized canonical form is
//! ever passed on to the installer.

use std::collections::BTreeMap;

use super::marker::parse_marker;

/// The longest dependency entry accepted, in bytes (entries are ASCII, so also in characters).
pub const MAX_ENTRY_LEN: usize = 200;

/// The most dependency entries accepted in one request.
pub const MAX_DEPENDENCIES: usize = 50;

/// Version comparison operators, longest first so that `===` wins over `==`.
pub(super) const VERSION_OPERATORS: &[&str] = &["===", "~=", "==", "!=", "<=", ">=", "<", ">"];

/// Endings that make pip (and uv) treat a requirement as a local archive file.
const ARCHIVE_EXTENSIONS: &[&str] = &[
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

/// URL schemes accepted in `name @ url` direct references (only when the operator allows them).
const URL_SCHEMES: &[&str] = &["https://", "http://", "git+https://"];

/// Why a dependency list was refused.
#[derive(Debug, thiserror::Error)]
pub enum DependencyError {
    /// One entry is not an acceptable requirement.
    #[error("invalid dependency {entry:?}: {reason}")]
    Invalid { entry: String, reason: String },
    /// The list has more entries than allowed.
    #[error("too many dependencies: {count} (at most {max})")]
    TooMany { count: usize, max: usize },
    /// Two entries name the same package (under the same marker) differently.
    #[error("conflicting entries for {name}")]
    Conflict { name: String },
}

/// One validated requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The name as written.
    pub name: String,
    /// The name normalized per PEP 503.
    pub normalized: String,
    /// Extras, normalized per PEP 503, sorted and deduplicated.
    pub extras: Vec<String>,
    /// Version specifiers with whitespace removed, clauses in the order written (`">=2,<3"`);
    /// empty when there are none (always empty for a direct reference).
    pub specifier: String,
    /// The URL of a `name @ url` direct reference (only accepted with `allow_urls`).
    pub url: Option<String>,
    /// The environment marker, trimmed and re-serialized with normalized whitespace and double
    /// quotes (`python_version < "3.12"`).
    pub marker: Option<String>,
}

impl Requirement {
    /// The stable canonical text of this requirement, the form passed to the installer:
    /// normalized name, `[extras]` if any, the specifier (or ` @ url`), `; marker` if any.
    pub fn canonical(&self) -> String {
        let mut out = self.normalized.clone();
        if !self.extras.is_empty() {
            out.push('[');
            out.push_str(&self.extras.join(","));
            out.push(']');
        }
        match &self.url {
            Some(url) => {
                out.push_str(" @ ");
                out.push_str(url);
            }
            None => out.push_str(&self.specifier),
        }
        if let Some(marker) = &self.marker {
            if self.url.is_some() {
                // PEP 508 needs whitespace between a URL and the marker separator.
                out.push(' ');
            }
            out.push_str("; ");
            out.push_str(marker);
        }
        out
    }
}

/// Normalizes a project name per PEP 503: lowercase, runs of `-`, `_` and `.` become one `-`.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator {
                out.push('-');
                in_separator = true;
            }
        } else {
            out.extend(c.to_lowercase());
            in_separator = false;
        }
    }
    out
}

/// Parses and validates one dependency entry (see the module documentation for what is accepted).
/// `allow_urls` accepts `name @ url` direct references with http, https or git+https URLs.
pub fn parse_requirement(entry: &str, allow_urls: bool) -> Result<Requirement, DependencyError> {
    parse_entry(entry, allow_urls).map_err(|reason| DependencyError::Invalid {
        entry: entry_for_display(entry),
        reason,
    })
}

/// Parses every entry, merges exact duplicates and returns the requirements sorted by canonical
/// form. Two entries for the same package under the same marker must be identical once
/// canonicalized, else the list is refused as conflicting.
pub fn parse_requirements(
    entries: &[String],
    allow_urls: bool,
) -> Result<Vec<Requirement>, DependencyError> {
    if entries.len() > MAX_DEPENDENCIES {
        return Err(DependencyError::TooMany {
            count: entries.len(),
            max: MAX_DEPENDENCIES,
        });
    }
    let mut by_name: BTreeMap<(String, Option<String>), Requirement> = BTreeMap::new();
    for entry in entries {
        let requirement = parse_requirement(entry, allow_urls)?;
        let key = (requirement.normalized.clone(), requirement.marker.clone());
        match by_name.get(&key) {
            Some(existing) if existing.canonical() != requirement.canonical() => {
                return Err(DependencyError::Conflict {
                    name: requirement.normalized,
                });
            }
            Some(_) => {}
            None => {
                by_name.insert(key, requirement);
            }
        }
    }
    let mut requirements: Vec<Requirement> = by_name.into_values().collect();
    requirements.sort_by_cached_key(Requirement::canonical);
    Ok(requirements)
}

/// The entry as shown in an error: whole, unless absurdly long.
fn entry_for_display(entry: &str) -> String {
    const SHOWN: usize = 64;
    if entry.len() <= MAX_ENTRY_LEN {
        return entry.to_string();
    }
    let end = entry
        .char_indices()
        .nth(SHOWN)
        .map_or(entry.len(), |(index, _)| index);
    format!("{}...", &entry[..end])
}

fn parse_entry(entry: &str, allow_urls: bool) -> Result<Requirement, String> {
    if entry.trim().is_empty() {
        return Err("empty requirement".into());
    }
    if entry.len() > MAX_ENTRY_LEN {
        return Err(format!("longer than {MAX_ENTRY_LEN} characters"));
    }
    if let Some(c) = entry.chars().find(|c| !c.is_ascii()) {
        return Err(format!("non-ASCII character {c:?} is not allowed"));
    }
    if let Some(c) = entry.chars().find(char::is_ascii_control) {
        return Err(format!("control character {c:?} is not allowed"));
    }
    let entry = entry.trim_matches(' ');
    if entry.starts_with('-') {
        return Err(
            "looks like a command-line option; only package requirements are allowed".into(),
        );
    }
    let (head, marker) = match entry.split_once(';') {
        Some((head, marker)) => (head.trim_matches(' '), Some(marker)),
        None => (entry, None),
    };
    let mut requirement = parse_head(head, allow_urls)?;
    if let Some(marker) = marker {
        let marker =
            parse_marker(marker).map_err(|e| format!("invalid environment marker: {e}"))?;
        requirement.marker = Some(marker);
    }
    Ok(requirement)
}

/// Parses everything before the marker: `name[extras] specifiers` or `name[extras] @ url`.
fn parse_head(head: &str, allow_urls: bool) -> Result<Requirement, String> {
    if head.is_empty() {
        return Err("missing package name".into());
    }
    if let Some((left, url)) = head.split_once('@') {
        if let Ok((name, extras, "")) = parse_name_and_extras(left.trim_end_matches(' ')) {
            if !allow_urls {
                return Err("direct URL references (`name @ url`) are not allowed".into());
            }
            let url = parse_url(url.trim_matches(' '))?;
            return Ok(Requirement {
                normalized: normalize_name(name),
                name: name.to_string(),
                extras,
                specifier: String::new(),
                url: Some(url),
                marker: None,
            });
        }
    }
    let lower = head.to_ascii_lowercase();
    if lower.contains("://") || lower.starts_with("file:") {
        return Err(
            "URLs are not allowed; give a package name and version specifiers instead".into(),
        );
    }
    if head.contains(['/', '\\']) || head.starts_with(['.', '~']) {
        return Err("local paths are not allowed; give a package name instead".into());
    }
    if let Some(c) = head.chars().find(|&c| !is_requirement_char(c)) {
        return Err(format!(
            "character {c:?} is not allowed in a requirement (outside a marker's quoted strings)"
        ));
    }
    let (name, extras, rest) = parse_name_and_extras(head)?;
    let specifier = parse_specifiers(rest.trim_matches(' '))?;
    let requirement = Requirement {
        normalized: normalize_name(name),
        name: name.to_string(),
        extras,
        specifier,
        url: None,
        marker: None,
    };
    // pip and uv take a requirement ending like an archive for a local file (relative to the
    // working directory). Check both what was written and what will be passed on.
    let canonical = requirement.canonical().to_ascii_lowercase();
    if ARCHIVE_EXTENSIONS
        .iter()
        .any(|ext| lower.ends_with(ext) || canonical.ends_with(ext))
    {
        return Err("looks like a local archive file; give a package name instead".into());
    }
    Ok(requirement)
}

/// Characters that may appear before a marker in a requirement without a URL.
fn is_requirement_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            '.' | '_'
                | '-'
                | '['
                | ']'
                | ','
                | ' '
                | '<'
                | '>'
                | '='
                | '!'
                | '~'
                | '*'
                | '+'
                | '('
                | ')'
        )
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether `name` matches `^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`.
fn is_valid_name(name: &str) -> bool {
    let starts_and_ends_alphanumeric = name
        .chars()
        .next()
        .zip(name.chars().last())
        .is_some_and(|(first, last)| first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric());
    starts_and_ends_alphanumeric && name.chars().all(is_name_char)
}

/// Parses a leading name and optional `[extras]`; returns them and the unparsed rest.
fn parse_name_and_extras(s: &str) -> Result<(&str, Vec<String>, &str), String> {
    let name_end = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
    let name = &s[..name_end];
    if name.is_empty() {
        return Err("expected a package name".into());
    }
    if !is_valid_name(name) {
        return Err(format!(
            "invalid package name {name:?}: names must start and end with a letter or digit \
             and contain only letters, digits, '.', '_' and '-'"
        ));
    }
    let rest = s[name_end..].trim_start_matches(' ');
    let Some(after_bracket) = rest.strip_prefix('[') else {
        return Ok((name, Vec::new(), rest));
    };
    let Some((inside, rest)) = after_bracket.split_once(']') else {
        return Err("unterminated extras: missing ']'".into());
    };
    let mut extras = Vec::new();
    if !inside.trim_matches(' ').is_empty() {
        for extra in inside.split(',') {
            let extra = extra.trim_matches(' ');
            if !is_valid_name(extra) {
                return Err(format!("invalid extra {extra:?}"));
            }
            extras.push(normalize_name(extra));
        }
    }
    extras.sort();
    extras.dedup();
    Ok((name, extras, rest))
}

/// Parses version specifiers, optionally in parentheses; returns them without whitespace.
fn parse_specifiers(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Ok(String::new());
    }
    let inner = match s.strip_prefix('(') {
        Some(opened) => opened
            .strip_suffix(')')
            .ok_or("unbalanced parenthesis in version specifiers")?,
        None => s,
    };
    if inner.contains(['(', ')']) {
        return Err("unexpected parenthesis in version specifiers".into());
    }
    let mut clauses = Vec::new();
    for clause in inner.split(',') {
        clauses.push(parse_specifier_clause(clause.trim_matches(' '))?);
    }
    Ok(clauses.join(","))
}

fn parse_specifier_clause(clause: &str) -> Result<String, String> {
    if clause.is_empty() {
        return Err("empty version specifier".into());
    }
    let Some(operator) = VERSION_OPERATORS
        .iter()
        .find(|operator| clause.starts_with(*operator))
    else {
        return Err(format!(
            "unexpected {clause:?}: expected a version specifier starting with one of \
             ~= == != <= >= < > ==="
        ));
    };
    let version = clause[operator.len()..].trim_start_matches(' ');
    if version.is_empty() {
        return Err(format!("missing version after {operator:?}"));
    }
    if let Some(c) = version
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '_' | '-')))
    {
        return Err(format!(
            "character {c:?} is not allowed in version {version:?}"
        ));
    }
    if !version.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "version {version:?} must start with a letter or digit"
        ));
    }
    if version.contains('*') {
        let prefix_ok = version
            .strip_suffix(".*")
            .is_some_and(|prefix| !prefix.is_empty() && !prefix.contains('*'));
        if !matches!(*operator, "==" | "!=") || !prefix_ok {
            return Err(format!(
                "wildcard in {clause:?}: only '==' and '!=' allow a trailing '.*'"
            ));
        }
    }
    Ok(format!("{operator}{version}"))
}

/// Validates a direct reference URL: http, https or git+https, a host, and no whitespace, quotes
/// or shell metacharacters.
fn parse_url(url: &str) -> Result<String, String> {
    if url.is_empty() {
        return Err("missing URL after '@'".into());
    }
    let lower = url.to_ascii_lowercase();
    let Some(scheme) = URL_SCHEMES.iter().find(|scheme| lower.starts_with(*scheme)) else {
        return Err("only http://, https:// and git+https:// URLs are allowed".into());
    };
    if let Some(c) = url.chars().find(|&c| {
        !(c.is_ascii_alphanumeric()
            || matches!(
                c,
                '-' | '.'
                    | '_'
                    | '~'
                    | ':'
                    | '/'
                    | '?'
                    | '#'
                    | '['
                    | ']'
                    | '@'
                    | '!'
                    | '*'
                    | '+'
                    | ','
                    | '='
                    | '%'
            ))
    }) {
        return Err(format!("character {c:?} is not allowed in a URL"));
    }
    let after_scheme = &url[scheme.len()..];
    let host_end = after_scheme
        .find(['/', '?', '#'])
        .unwrap_or(after_scheme.len());
    if host_end == 0 {
        return Err("URL has no host".into());
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entry: &str) -> Requirement {
        parse_requirement(entry, false).unwrap()
    }

    /// Asserts the entry is rejected, that the error names it, and that the reason mentions
    /// `reason_part`.
    fn assert_rejected(entry: &str, allow_urls: bool, reason_part: &str) {
        let error = parse_requirement(entry, allow_urls)
            .expect_err(&format!("{entry:?} should be rejected"));
        let message = error.to_string();
        match &error {
            DependencyError::Invalid {
                entry: named,
                reason,
            } => {
                assert_eq!(named, entry, "error should name the entry");
                assert!(
                    reason.contains(reason_part),
                    "reason for {entry:?} was {reason:?}, expected it to mention {reason_part:?}"
                );
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(
            message.starts_with(&format!("invalid dependency {entry:?}: ")),
            "{message}"
        );
    }

    fn strings(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn plain_name() {
        let r = parse("numpy");
        assert_eq!(r.name, "numpy");
        assert_eq!(r.normalized, "numpy");
        assert!(r.extras.is_empty());
        assert_eq!(r.specifier, "");
        assert_eq!(r.url, None);
        assert_eq!(r.marker, None);
        assert_eq!(r.canonical(), "numpy");
    }

    #[test]
    fn pinned_version() {
        let r = parse("numpy==1.26.4");
        assert_eq!(r.specifier, "==1.26.4");
        assert_eq!(r.canonical(), "numpy==1.26.4");
    }

    #[test]
    fn version_range_with_whitespace_removed() {
        let r = parse("pandas >= 2 , < 3");
        assert_eq!(r.specifier, ">=2,<3");
        assert_eq!(parse("pandas>=2,<3").canonical(), "pandas>=2,<3");
        assert_eq!(r.canonical(), "pandas>=2,<3");
    }

    #[test]
    fn extras_are_normalized_sorted_and_deduplicated() {
        let r = parse("requests[socks,security]>=2");
        assert_eq!(r.extras, vec!["security", "socks"]);
        assert_eq!(r.canonical(), "requests[security,socks]>=2");
        let r = parse("requests [ Socks , socks, SECURITY ]");
        assert_eq!(r.extras, vec!["security", "socks"]);
        assert_eq!(r.canonical(), "requests[security,socks]");
        assert_eq!(parse("requests[]").extras, Vec::<String>::new());
    }

    #[test]
    fn parenthesized_specifiers() {
        let r = parse("Django (>=4.2)");
        assert_eq!(r.name, "Django");
        assert_eq!(r.normalized, "django");
        assert_eq!(r.specifier, ">=4.2");
        assert_eq!(r.canonical(), "django>=4.2");
        assert_eq!(parse("Django(>=4.2, <5)").specifier, ">=4.2,<5");
    }

    #[test]
    fn marker_is_validated_and_normalized() {
        let r = parse("typing-extensions; python_version < \"3.12\"");
        assert_eq!(r.marker.as_deref(), Some("python_version < \"3.12\""));
        assert_eq!(
            r.canonical(),
            "typing-extensions; python_version < \"3.12\""
        );
        let r = parse("typing-extensions ;python_version<'3.12'  ");
        assert_eq!(
            r.canonical(),
            "typing-extensions; python_version < \"3.12\""
        );
    }

    #[test]
    fn complex_markers() {
        let r = parse(
            "pywin32 ; (sys_platform == 'win32' or os_name=='nt') and \
             platform_machine not in 'arm64 aarch64'",
        );
        assert_eq!(
            r.marker.as_deref(),
            Some(
                "(sys_platform == \"win32\" or os_name == \"nt\") and \
                 platform_machine not in \"arm64 aarch64\""
            )
        );
        parse("a; '3.8' <= python_version and extra == \"x\"");
        parse("a; implementation_name === 'cpython'");
        parse("a; 'linux' in sys_platform");
        parse("a; platform_version ~= '5.4'");
        parse("a; ((python_full_version >= '3.9.1'))");
    }

    #[test]
    fn wildcard_and_compatible_release() {
        assert_eq!(parse("name==1.0.*").specifier, "==1.0.*");
        assert_eq!(parse("name!=1.0.*").specifier, "!=1.0.*");
        assert_eq!(parse("Pillow~=10.0").canonical(), "pillow~=10.0");
        assert_eq!(parse("x===1.0-foo").specifier, "===1.0-foo");
        assert_eq!(parse("x>=1!2.0rc1+local_1").specifier, ">=1!2.0rc1+local_1");
    }

    #[test]
    fn misplaced_wildcards_are_rejected() {
        assert_rejected("name>=1.0.*", false, "wildcard");
        assert_rejected("name==1.*.0", false, "wildcard");
        assert_rejected("name==*", false, "must start");
        assert_rejected("name==.*", false, "must start");
    }

    #[test]
    fn normalization() {
        assert_eq!(normalize_name("Requests_OAuthlib"), "requests-oauthlib");
        assert_eq!(normalize_name("zope.interface"), "zope-interface");
        assert_eq!(normalize_name("a-_.-b__c"), "a-b-c");
        assert_eq!(normalize_name("NumPy"), "numpy");
        let r = parse("Requests_OAuthlib>=1");
        assert_eq!(r.name, "Requests_OAuthlib");
        assert_eq!(r.normalized, "requests-oauthlib");
        assert_eq!(r.canonical(), "requests-oauthlib>=1");
    }

    #[test]
    fn invalid_names_are_rejected() {
        assert_rejected("numpy-", false, "invalid package name");
        assert_rejected("_numpy", false, "invalid package name");
        assert_rejected("[extra]", false, "expected a package name");
        assert_rejected("numpy[bad-]", false, "invalid extra");
        assert_rejected("numpy[a", false, "unterminated extras");
        assert_rejected("numpy 1.0", false, "expected a version specifier");
        assert_rejected("numpy curl", false, "expected a version specifier");
        assert_rejected("numpy==", false, "missing version");
        assert_rejected("numpy>=1,", false, "empty version specifier");
        assert_rejected("numpy (>=1", false, "unbalanced parenthesis");
        assert_rejected("numpy ()", false, "empty version specifier");
        assert_rejected("numpy = 1", false, "expected a version specifier");
        assert_rejected("numpy=>1", false, "expected a version specifier");
        assert_rejected(" ; python_version > '3'", false, "missing package name");
    }

    #[test]
    fn options_are_rejected() {
        assert_rejected("--index-url=http://x", false, "command-line option");
        assert_rejected("-r requirements.txt", false, "command-line option");
        assert_rejected("  -e .", false, "command-line option");
        assert_rejected("--", false, "command-line option");
    }

    #[test]
    fn shell_injection_is_rejected() {
        assert_rejected("numpy; rm -rf /", false, "invalid environment marker");
        assert_rejected("numpy && curl x", false, "'&'");
        assert_rejected("numpy|sh", false, "'|'");
        assert_rejected("$(id)", false, "'$'");
        assert_rejected("`id`", false, "'`'");
        assert_rejected("numpy > /tmp/x", false, "local paths");
        assert_rejected("numpy'", false, "'\\''");
        assert_rejected("numpy\"", false, "'\"'");
        assert_rejected("numpy #comment", false, "'#'");
        assert_rejected("numpy{a,b}", false, "'{'");
    }

    #[test]
    fn control_characters_are_rejected() {
        assert_rejected("numpy\n--index-url x", false, "control character");
        assert_rejected("numpy\r", false, "control character");
        assert_rejected("numpy\tpandas", false, "control character");
        assert_rejected("numpy\0", false, "control character");
        assert_rejected("numpy\u{1b}[2J", false, "control character");
    }

    #[test]
    fn bad_markers_are_rejected() {
        assert_rejected("numpy;", false, "empty marker");
        assert_rejected("numpy; python_version", false, "comparison operator");
        assert_rejected("numpy; python_version <", false, "quoted string");
        assert_rejected("numpy; python_version < '3", false, "unterminated");
        assert_rejected("numpy; python_version < \"3'\"", false, "quoted string");
        assert_rejected("numpy; python_version < '3\\'", false, "'\\\\'");
        assert_rejected("numpy; os.name == 'nt'", false, "unknown marker variable");
        assert_rejected("numpy; __import__('os')", false, "unknown marker variable");
        assert_rejected("numpy; python_version = '3'", false, "unknown operator");
        assert_rejected("numpy; python_version < '3' and", false, "quoted string");
        assert_rejected("numpy; (python_version < '3'", false, "missing ')'");
        assert_rejected("numpy; python_version < '3')", false, "unexpected \")\"");
        assert_rejected("numpy; python_version not '3'", false, "'in' after 'not'");
        assert_rejected("numpy; python_version < '3' $x", false, "'$'");
        assert_rejected("numpy; python_version < '3'; rm -rf /", false, "';'");
        let deep = format!("a; {}python_version > '3'{}", "(".repeat(9), ")".repeat(9));
        assert_rejected(&deep, false, "nested too deeply");
        let ok = format!("a; {}python_version > '3'{}", "(".repeat(8), ")".repeat(8));
        parse(&ok);
    }

    #[test]
    fn paths_are_rejected() {
        assert_rejected("../x", false, "local paths");
        assert_rejected("./pkg", false, "local paths");
        assert_rejected("/abs/path", false, "local paths");
        assert_rejected("pkg/sub", false, "local paths");
        assert_rejected("pkg\\sub", false, "local paths");
        assert_rejected(".", false, "local paths");
        assert_rejected("~/pkg", false, "local paths");
        assert_rejected("file:///etc", false, "URLs are not allowed");
        assert_rejected("file:pkg", false, "URLs are not allowed");
        assert_rejected("pkg.whl", false, "archive");
        assert_rejected("pkg-1.0.tar.gz", false, "archive");
        assert_rejected("Pkg.ZIP", false, "archive");
        assert_rejected("pkg==1.0.tgz", false, "archive");
        assert_rejected("pkg[x]==1.whl", false, "archive");
    }

    #[test]
    fn urls_are_rejected_by_default() {
        assert_rejected("git+https://github.com/x/y", false, "URLs are not allowed");
        assert_rejected("https://x/y.whl", false, "URLs are not allowed");
        assert_rejected(
            "git+ssh://git@github.com/x/y",
            false,
            "URLs are not allowed",
        );
        assert_rejected("numpy @ https://x/y.whl", false, "direct URL references");
        assert_rejected("numpy[x]@https://x/y.whl", false, "direct URL references");
        assert_rejected("git+https://github.com/x/y", true, "URLs are not allowed");
        assert_rejected("https://x/y.whl", true, "URLs are not allowed");
        assert_rejected("numpy@1.0", false, "direct URL references");
    }

    #[test]
    fn direct_references_when_allowed() {
        let r = parse_requirement("numpy @ https://x/y.whl", true).unwrap();
        assert_eq!(r.url.as_deref(), Some("https://x/y.whl"));
        assert_eq!(r.specifier, "");
        assert_eq!(r.canonical(), "numpy @ https://x/y.whl");
        let r = parse_requirement(
            "My_Pkg[B,a]@git+https://github.com/x/y@v1.0#egg=y ; python_version>'3.8'",
            true,
        )
        .unwrap();
        assert_eq!(
            r.canonical(),
            "my-pkg[a,b] @ git+https://github.com/x/y@v1.0#egg=y ; python_version > \"3.8\""
        );
        parse_requirement("a @ http://mirror.local:8080/a-1.0.tar.gz", true).unwrap();

        assert_rejected("numpy @ ftp://x/y.whl", true, "only http");
        assert_rejected("numpy @ file:///x/y.whl", true, "only http");
        assert_rejected("numpy @ git+ssh://git@x/y", true, "only http");
        assert_rejected("numpy @ https:///y.whl", true, "no host");
        assert_rejected("numpy @ https://x/y z", true, "' '");
        assert_rejected("numpy @ https://x/$(id)", true, "'$'");
        assert_rejected("numpy @ https://x/'y'", true, "'\\''");
        assert_rejected("numpy @ https://x/y&z", true, "'&'");
        assert_rejected("numpy @", true, "missing URL");
        assert_rejected(
            "numpy @ https://x/y.whl; rm -rf /",
            true,
            "invalid environment marker",
        );
    }

    #[test]
    fn non_ascii_is_rejected() {
        assert_rejected("nümpy", false, "non-ASCII");
        assert_rejected("numpy==1.0\u{ff1b}", false, "non-ASCII");
        assert_rejected("numpy; python_version < '３'", false, "non-ASCII");
        // Cyrillic 'а' that looks like Latin 'a'.
        assert_rejected("p\u{430}ndas", false, "non-ASCII");
    }

    #[test]
    fn length_limits() {
        let ok = format!("a{}", "b".repeat(MAX_ENTRY_LEN - 1));
        assert_eq!(parse(&ok).name.len(), MAX_ENTRY_LEN);
        let long = format!("a{}", "b".repeat(MAX_ENTRY_LEN));
        let error = parse_requirement(&long, false).unwrap_err();
        match &error {
            DependencyError::Invalid { entry, reason } => {
                assert!(reason.contains("longer than 200"), "{reason}");
                assert!(
                    entry.starts_with("abbb") && entry.ends_with("..."),
                    "{entry}"
                );
                assert!(entry.len() < long.len());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(error.to_string().contains("invalid dependency \"abbb"));
    }

    #[test]
    fn empty_entries_are_rejected() {
        assert_rejected("", false, "empty requirement");
        assert_rejected("   ", false, "empty requirement");
    }

    #[test]
    fn list_is_merged_and_sorted() {
        let parsed = parse_requirements(
            &strings(&[
                "pandas>=2",
                "Numpy",
                "numpy",
                "numpy ",
                "attrs; python_version > '3'",
            ]),
            false,
        )
        .unwrap();
        let canonical: Vec<String> = parsed.iter().map(Requirement::canonical).collect();
        assert_eq!(
            canonical,
            vec!["attrs; python_version > \"3\"", "numpy", "pandas>=2"]
        );
    }

    #[test]
    fn same_name_with_different_markers_is_kept() {
        let parsed = parse_requirements(
            &strings(&[
                "numpy==1.24; python_version < '3.9'",
                "numpy==1.26; python_version >= '3.9'",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn conflicting_entries_are_rejected() {
        let error = parse_requirements(&strings(&["numpy==1.26", "NumPy>=2"]), false).unwrap_err();
        assert!(matches!(&error, DependencyError::Conflict { name } if name == "numpy"));
        assert_eq!(error.to_string(), "conflicting entries for numpy");
        assert!(parse_requirements(&strings(&["requests", "requests[socks]"]), false).is_err());
    }

    #[test]
    fn list_errors_name_the_bad_entry() {
        let error =
            parse_requirements(&strings(&["numpy", "--index-url=http://x"]), false).unwrap_err();
        assert!(
            error.to_string().contains("\"--index-url=http://x\""),
            "{error}"
        );
    }

    #[test]
    fn too_many_entries() {
        let entries: Vec<String> = (0..=MAX_DEPENDENCIES).map(|i| format!("pkg{i}")).collect();
        let error = parse_requirements(&entries, false).unwrap_err();
        assert!(matches!(
            error,
            DependencyError::TooMany { count: 51, max: 50 }
        ));
        assert_eq!(
            parse_requirements(&entries[..MAX_DEPENDENCIES], false)
                .unwrap()
                .len(),
            MAX_DEPENDENCIES
        );
        assert!(parse_requirements(&[], false).unwrap().is_empty());
    }
}
