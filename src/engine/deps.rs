//! Per-run Python dependencies: validation, cache keys, installer command lines, eviction.
//!
//! Agents ask for packages as a list of strings. The original project joined them into a shell
//! `pip install ...`, which let an agent inject pip options (`--index-url=...`) or shell commands.
//! Here every entry is parsed as a strict subset of PEP 508 (a name, extras, version specifiers
//! and a restricted environment marker; no options, paths or URLs unless the operator allows
//! `name @ url`), and only the re-serialized canonical form is ever passed on, each requirement as
//! its own argv element after `--`, never through a shell. Validation is the safety boundary.
//!
//! Installs run in a separate short-lived installer container into `--target <dir>` (wheels
//! only unless the operator allows source builds), and are published under [`cache_key`] (a hash
//! of the image, the requirements, the index settings and the installer) into the cache that
//! sandboxes mount read-only (see `installer`).
//! [`select_evictions`] picks least-recently-used cache entries to remove when the cache is full.
//!
//! This module is pure logic: no I/O, no Docker.

use std::collections::BTreeMap;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// The longest dependency entry accepted, in bytes (entries are ASCII, so also in characters).
pub const MAX_ENTRY_LEN: usize = 200;

/// The most dependency entries accepted in one request.
pub const MAX_DEPENDENCIES: usize = 50;

/// How deeply parentheses may nest in an environment marker.
const MAX_MARKER_DEPTH: usize = 8;

/// The environment marker variables of PEP 508 that a marker may use.
pub const MARKER_VARIABLES: &[&str] = &[
    "python_version",
    "python_full_version",
    "os_name",
    "sys_platform",
    "platform_release",
    "platform_system",
    "platform_version",
    "platform_machine",
    "platform_python_implementation",
    "implementation_name",
    "implementation_version",
    "extra",
];

/// Version comparison operators, longest first so that `===` wins over `==`.
const VERSION_OPERATORS: &[&str] = &["===", "~=", "==", "!=", "<=", ">=", "<", ">"];

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

#[derive(Debug, Clone, PartialEq, Eq)]
enum MarkerToken {
    Open,
    Close,
    Str(String),
    Variable(&'static str),
    Operator(&'static str),
    And,
    Or,
    In,
    Not,
}

impl MarkerToken {
    fn render(&self) -> String {
        match self {
            MarkerToken::Open => "(".into(),
            MarkerToken::Close => ")".into(),
            MarkerToken::Str(s) => format!("\"{s}\""),
            MarkerToken::Variable(v) => (*v).into(),
            MarkerToken::Operator(op) => (*op).into(),
            MarkerToken::And => "and".into(),
            MarkerToken::Or => "or".into(),
            MarkerToken::In => "in".into(),
            MarkerToken::Not => "not".into(),
        }
    }
}

/// Validates an environment marker against a safe subset of PEP 508 and returns it
/// re-serialized (single spaces, double quotes).
fn parse_marker(marker: &str) -> Result<String, String> {
    let tokens = tokenize_marker(marker)?;
    if tokens.is_empty() {
        return Err("empty marker".into());
    }
    let mut parser = MarkerParser {
        tokens: &tokens,
        position: 0,
    };
    parser.parse_or(0)?;
    if let Some(token) = tokens.get(parser.position) {
        return Err(format!("unexpected {:?}", token.render()));
    }
    let mut out = String::new();
    for (index, token) in tokens.iter().enumerate() {
        let after_open = index > 0 && tokens[index - 1] == MarkerToken::Open;
        if index > 0 && !after_open && *token != MarkerToken::Close {
            out.push(' ');
        }
        out.push_str(&token.render());
    }
    Ok(out)
}

fn tokenize_marker(marker: &str) -> Result<Vec<MarkerToken>, String> {
    let bytes = marker.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = char::from(bytes[i]);
        match c {
            ' ' => i += 1,
            '(' => {
                tokens.push(MarkerToken::Open);
                i += 1;
            }
            ')' => {
                tokens.push(MarkerToken::Close);
                i += 1;
            }
            '\'' | '"' => {
                let start = i + 1;
                let Some(length) = marker[start..].find(c) else {
                    return Err("unterminated quoted string".into());
                };
                let content = &marker[start..start + length];
                if let Some(bad) = content
                    .chars()
                    .find(|&ch| matches!(ch, '\'' | '"' | '\\') || !(' '..='~').contains(&ch))
                {
                    return Err(format!(
                        "character {bad:?} is not allowed in a quoted string"
                    ));
                }
                tokens.push(MarkerToken::Str(content.to_string()));
                i = start + length + 1;
            }
            '<' | '>' | '=' | '!' | '~' => {
                let length = marker[i..]
                    .find(|ch: char| !matches!(ch, '<' | '>' | '=' | '!' | '~'))
                    .unwrap_or(marker.len() - i);
                let text = &marker[i..i + length];
                let Some(operator) = VERSION_OPERATORS.iter().find(|op| **op == text) else {
                    return Err(format!("unknown operator {text:?}"));
                };
                tokens.push(MarkerToken::Operator(operator));
                i += length;
            }
            _ if c.is_ascii_alphanumeric() || c == '_' => {
                let length = marker[i..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(marker.len() - i);
                let word = &marker[i..i + length];
                let token = match word {
                    "and" => MarkerToken::And,
                    "or" => MarkerToken::Or,
                    "in" => MarkerToken::In,
                    "not" => MarkerToken::Not,
                    _ => match MARKER_VARIABLES.iter().find(|v| **v == word) {
                        Some(variable) => MarkerToken::Variable(variable),
                        None => return Err(format!("unknown marker variable or keyword {word:?}")),
                    },
                };
                tokens.push(token);
                i += length;
            }
            _ => {
                return Err(format!(
                    "character {c:?} is not allowed outside quoted strings"
                ))
            }
        }
    }
    Ok(tokens)
}

/// Recursive descent over `or` of `and` of (parenthesized marker | value op value).
struct MarkerParser<'a> {
    tokens: &'a [MarkerToken],
    position: usize,
}

impl MarkerParser<'_> {
    fn peek(&self) -> Option<&MarkerToken> {
        self.tokens.get(self.position)
    }

    fn next(&mut self) -> Option<&MarkerToken> {
        let token = self.tokens.get(self.position);
        self.position += 1;
        token
    }

    fn parse_or(&mut self, depth: usize) -> Result<(), String> {
        self.parse_and(depth)?;
        while self.peek() == Some(&MarkerToken::Or) {
            self.position += 1;
            self.parse_and(depth)?;
        }
        Ok(())
    }

    fn parse_and(&mut self, depth: usize) -> Result<(), String> {
        self.parse_atom(depth)?;
        while self.peek() == Some(&MarkerToken::And) {
            self.position += 1;
            self.parse_atom(depth)?;
        }
        Ok(())
    }

    fn parse_atom(&mut self, depth: usize) -> Result<(), String> {
        if self.peek() == Some(&MarkerToken::Open) {
            if depth >= MAX_MARKER_DEPTH {
                return Err("parentheses nested too deeply".into());
            }
            self.position += 1;
            self.parse_or(depth + 1)?;
            return match self.next() {
                Some(MarkerToken::Close) => Ok(()),
                _ => Err("missing ')'".into()),
            };
        }
        self.parse_value()?;
        match self.next() {
            Some(MarkerToken::Operator(_) | MarkerToken::In) => {}
            Some(MarkerToken::Not) => {
                if self.next() != Some(&MarkerToken::In) {
                    return Err("expected 'in' after 'not'".into());
                }
            }
            Some(token) => {
                return Err(format!(
                    "expected a comparison operator, found {:?}",
                    token.render()
                ))
            }
            None => return Err("expected a comparison operator".into()),
        }
        self.parse_value()
    }

    fn parse_value(&mut self) -> Result<(), String> {
        match self.next() {
            Some(MarkerToken::Variable(_) | MarkerToken::Str(_)) => Ok(()),
            Some(token) => Err(format!(
                "expected a marker variable or a quoted string, found {:?}",
                token.render()
            )),
            None => Err("expected a marker variable or a quoted string".into()),
        }
    }
}

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

/// The cache key of an install: `d-` and the first 32 hex digits of a SHA-256 over a
/// length-prefixed serialization of the image id, the installer, the index configuration and the
/// sorted, deduplicated canonical requirements. Safe as a directory name; independent of the
/// order of `requirements`.
pub fn cache_key(
    image_id: &str,
    requirements: &[Requirement],
    index: &IndexConfig,
    installer: &str,
) -> String {
    fn field(hasher: &mut Sha256, bytes: &[u8]) {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }
    fn optional(hasher: &mut Sha256, value: Option<&str>) {
        match value {
            Some(value) => {
                hasher.update([1u8]);
                field(hasher, value.as_bytes());
            }
            None => hasher.update([0u8]),
        }
    }
    let mut canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
    canonical.sort();
    canonical.dedup();

    let mut hasher = Sha256::new();
    field(&mut hasher, b"python-code-sandbox/deps/v1");
    field(&mut hasher, image_id.as_bytes());
    field(&mut hasher, installer.as_bytes());
    optional(&mut hasher, index.index_url.as_deref());
    hasher.update((index.extra_index_urls.len() as u64).to_be_bytes());
    for url in &index.extra_index_urls {
        field(&mut hasher, url.as_bytes());
    }
    optional(&mut hasher, index.ca_bundle_digest.as_deref());
    hasher.update([u8::from(index.allow_source_builds)]);
    hasher.update((canonical.len() as u64).to_be_bytes());
    for requirement in &canonical {
        field(&mut hasher, requirement.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = String::with_capacity(34);
    key.push_str("d-");
    for byte in digest.iter().take(16) {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    key
}

const HEX: &[u8; 16] = b"0123456789abcdef";

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
    match (cache_dir, installer) {
        (Some(dir), _) => {
            argv.push("--cache-dir".into());
            argv.push(dir.to_string());
        }
        (None, Installer::Pip) => argv.push("--no-cache-dir".into()),
        (None, Installer::Uv) => argv.push("--no-cache".into()),
    }
    argv.push("--".into());
    argv.extend(requirements.iter().map(Requirement::canonical));
    argv
}

/// The most lines [`installer_error_summary`] keeps.
const SUMMARY_MAX_LINES: usize = 20;
/// The most characters [`installer_error_summary`] returns.
const SUMMARY_MAX_CHARS: usize = 4000;
/// How many trailing lines [`installer_error_summary`] keeps when nothing looks like an error.
const SUMMARY_TAIL_LINES: usize = 15;

/// The part of pip's or uv's output worth showing to an agent: the error lines (at most 20 lines
/// and 4000 characters), or the last 15 non-empty lines when none is recognized.
pub fn installer_error_summary(output: &str) -> String {
    let cleaned = strip_ansi(output);
    let lines: Vec<&str> = cleaned
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.trim().is_empty())
        .collect();
    let relevant: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|line| is_relevant_error_line(line))
        .take(SUMMARY_MAX_LINES)
        .collect();
    let kept = if relevant.is_empty() {
        &lines[lines.len().saturating_sub(SUMMARY_TAIL_LINES)..]
    } else {
        &relevant[..]
    };
    crate::text::truncate_chars(&kept.join("\n"), SUMMARY_MAX_CHARS)
}

/// What to add to a failed wheels-only install's summary when the output suggests a requirement
/// has no wheel (pip says "from versions: none", uv "no usable wheels" / "building from source
/// is disabled").
pub fn wheels_only_hint(output: &str) -> Option<&'static str> {
    const SIGNS: &[&str] = &[
        "no usable wheels",
        "building from source is disabled",
        "--no-build",
        "from versions: none",
        "No matching distribution",
        "only-binary",
    ];
    SIGNS.iter().any(|sign| output.contains(sign)).then_some(
        "Only pre-built wheels are installed: building a package from source runs the \
         package's own code during the install. A package published only as a source \
         distribution (or a version without a wheel for this platform) cannot be installed \
         unless the operator sets SANDBOX_ALLOW_SOURCE_BUILDS=true.",
    )
}

fn is_relevant_error_line(line: &str) -> bool {
    const MARKERS: &[&str] = &[
        "No matching distribution",
        "Could not find a version",
        "ResolutionImpossible",
        "× ",
        "╰─▶",
        "Because ",
        "hint:",
    ];
    let trimmed = line.trim_start();
    trimmed.starts_with("ERROR:")
        || trimmed.starts_with("error:")
        || MARKERS.iter().any(|marker| line.contains(marker))
}

/// Removes ANSI escape sequences (CSI `ESC [ ... final`, and lone `ESC x`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // A CSI sequence runs to its final byte; any other escape is two characters.
        if chars.next() == Some('[') {
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
        }
    }
    out
}

/// One published install in the dependency cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The cache key (directory name).
    pub key: String,
    /// Size on disk.
    pub size_bytes: u64,
    /// When a sandbox last used it.
    pub last_used: SystemTime,
    /// Whether a live sandbox mounts it now; such entries are never evicted.
    pub in_use: bool,
}

/// The keys to evict, least recently used first, so that the total size is at most `max_bytes`.
/// Entries in use are never evicted, even when the total then stays above the cap.
pub fn select_evictions(entries: &[CacheEntry], max_bytes: u64) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|entry| entry.size_bytes).sum();
    let mut candidates: Vec<&CacheEntry> = entries.iter().filter(|entry| !entry.in_use).collect();
    candidates.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut evicted = Vec::new();
    for entry in candidates {
        if total <= max_bytes {
            break;
        }
        total = total.saturating_sub(entry.size_bytes);
        evicted.push(entry.key.clone());
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    fn reqs(entries: &[&str]) -> Vec<Requirement> {
        entries.iter().map(|e| parse(e)).collect()
    }

    #[test]
    fn cache_key_shape() {
        let key = cache_key(
            "sha256:abc",
            &reqs(&["numpy"]),
            &IndexConfig::default(),
            "pip",
        );
        assert_eq!(key.len(), 34);
        assert!(key.starts_with("d-"));
        assert!(key[2..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    }

    #[test]
    fn cache_key_is_stable_and_order_independent() {
        let index = IndexConfig::default();
        let a = cache_key("img", &reqs(&["numpy", "pandas>=2"]), &index, "pip");
        let b = cache_key("img", &reqs(&["pandas >= 2", "NumPy"]), &index, "pip");
        let c = cache_key(
            "img",
            &reqs(&["pandas>=2", "numpy", "numpy"]),
            &index,
            "pip",
        );
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            a,
            cache_key("img", &reqs(&["numpy", "pandas>=2"]), &index, "pip")
        );
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let index = IndexConfig::default();
        let base = cache_key("img", &reqs(&["numpy"]), &index, "pip");
        let mut keys = vec![
            base.clone(),
            cache_key("img2", &reqs(&["numpy"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy==1"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy[x]"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy; os_name == 'nt'"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy", "six"]), &index, "pip"),
            cache_key("img", &[], &index, "pip"),
            cache_key("img", &reqs(&["numpy"]), &index, "uv"),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    index_url: Some("https://mirror/simple".into()),
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    extra_index_urls: vec!["https://mirror/simple".into()],
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    ca_bundle_digest: Some("sha256:ca".into()),
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    allow_source_builds: true,
                    ..IndexConfig::default()
                },
                "pip",
            ),
        ];
        let count = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), count, "every input change must change the key");
    }

    #[test]
    fn cache_key_fields_are_unambiguous() {
        let index = IndexConfig::default();
        // Moving bytes between fields must not collide.
        assert_ne!(
            cache_key("ab", &[], &index, "c"),
            cache_key("a", &[], &index, "bc")
        );
        let url_in_index = IndexConfig {
            index_url: Some("u".into()),
            ..IndexConfig::default()
        };
        let url_in_extra = IndexConfig {
            extra_index_urls: vec!["u".into()],
            ..IndexConfig::default()
        };
        assert_ne!(
            cache_key("img", &[], &url_in_index, "pip"),
            cache_key("img", &[], &url_in_extra, "pip")
        );
        let two_extras = IndexConfig {
            extra_index_urls: vec!["a".into(), "b".into()],
            ..IndexConfig::default()
        };
        let swapped = IndexConfig {
            extra_index_urls: vec!["b".into(), "a".into()],
            ..IndexConfig::default()
        };
        assert_ne!(
            cache_key("img", &[], &two_extras, "pip"),
            cache_key("img", &[], &swapped, "pip"),
            "index order matters to uv"
        );
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
    fn error_summary_of_pip() {
        let output = "\
Looking in indexes: https://pypi.org/simple
Collecting numpy==99
ERROR: Could not find a version that satisfies the requirement numpy==99 (from versions: 1.0, 2.0)
ERROR: No matching distribution found for numpy==99
";
        assert_eq!(
            installer_error_summary(output),
            "ERROR: Could not find a version that satisfies the requirement numpy==99 \
             (from versions: 1.0, 2.0)\nERROR: No matching distribution found for numpy==99"
        );
    }

    #[test]
    fn error_summary_of_uv() {
        let output = "\
Using Python 3.12.1 environment at: /usr/local
\u{1b}[31m  × \u{1b}[0mNo solution found when resolving dependencies:
  ╰─▶ Because there is no version of numpy==99 and you require numpy==99, we can conclude that your requirements are unsatisfiable.

      hint: numpy was requested with a pre-release marker
";
        assert_eq!(
            installer_error_summary(output),
            "  × No solution found when resolving dependencies:\n  ╰─▶ Because there is no version \
             of numpy==99 and you require numpy==99, we can conclude that your requirements are \
             unsatisfiable.\n      hint: numpy was requested with a pre-release marker"
        );
    }

    #[test]
    fn a_missing_wheel_gets_the_setting_named() {
        let uv = "  ╰─▶ Because only pcs-sdist==1.0 is available and pcs-sdist==1.0 has no usable \
                  wheels, we can conclude that all versions of pcs-sdist cannot be used.";
        let pip = "ERROR: Could not find a version that satisfies the requirement pcs-sdist \
                   (from versions: none)";
        for output in [uv, pip] {
            let hint = wheels_only_hint(output).expect("a hint");
            assert!(hint.contains("SANDBOX_ALLOW_SOURCE_BUILDS=true"), "{hint}");
        }
        assert_eq!(wheels_only_hint("ERROR: network unreachable"), None);
    }

    #[test]
    fn error_summary_falls_back_to_the_tail() {
        let output: String = (1..=30).map(|i| format!("line {i}\n\n")).collect();
        let summary = installer_error_summary(&output);
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(lines.len(), 15);
        assert_eq!(lines[0], "line 16");
        assert_eq!(lines[14], "line 30");
        assert_eq!(installer_error_summary(""), "");
        assert_eq!(installer_error_summary("  \n\n"), "");
    }

    #[test]
    fn error_summary_is_bounded() {
        let output: String = (0..100).map(|i| format!("ERROR: problem {i}\n")).collect();
        assert_eq!(installer_error_summary(&output).lines().count(), 20);
        let long_line = format!("ERROR: {}\n", "é".repeat(10_000));
        let summary = installer_error_summary(&long_line);
        assert_eq!(summary.chars().count(), 4000);
    }

    fn entry(key: &str, size: u64, age_secs: u64, in_use: bool) -> CacheEntry {
        CacheEntry {
            key: key.into(),
            size_bytes: size,
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_secs),
            in_use,
        }
    }

    #[test]
    fn eviction_under_cap_evicts_nothing() {
        let entries = [entry("a", 10, 5, false), entry("b", 10, 1, false)];
        assert!(select_evictions(&entries, 20).is_empty());
        assert!(select_evictions(&[], 0).is_empty());
    }

    #[test]
    fn eviction_is_least_recently_used_first() {
        let entries = [
            entry("newest", 10, 1, false),
            entry("oldest", 10, 100, false),
            entry("middle", 10, 50, false),
        ];
        assert_eq!(select_evictions(&entries, 25), vec!["oldest"]);
        assert_eq!(select_evictions(&entries, 10), vec!["oldest", "middle"]);
        assert_eq!(
            select_evictions(&entries, 0),
            vec!["oldest", "middle", "newest"]
        );
    }

    #[test]
    fn eviction_never_touches_entries_in_use() {
        let entries = [
            entry("busy-old", 100, 1000, true),
            entry("idle", 10, 10, false),
            entry("busy-new", 100, 1, true),
        ];
        // Even evicting every idle entry leaves 200 > 50: in-use entries stay.
        assert_eq!(select_evictions(&entries, 50), vec!["idle"]);
    }

    #[test]
    fn eviction_stops_as_soon_as_under_cap() {
        let entries = [
            entry("big-old", 100, 100, false),
            entry("small-older", 1, 200, false),
            entry("recent", 50, 1, false),
        ];
        assert_eq!(
            select_evictions(&entries, 100),
            vec!["small-older", "big-old"]
        );
        assert_eq!(select_evictions(&entries, 150), vec!["small-older"]);
    }
}
