//! Who is calling: the principals of `serve --http`.
//!
//! A principal is a caller the server can tell apart from others: a line of the tokens file
//! (`SANDBOX_HTTP_TOKENS_FILE`) or the subject of an OAuth access token ([`super::oauth`]). What
//! a principal creates is its own, whichever MCP session (or none, in revision 2026-07-28) it
//! came through: sandbox sessions, snapshots, saved files (a directory per principal),
//! `sandbox_list`; quotas count per principal.
//!
//! Without principals (no authentication on loopback, or the one shared `SANDBOX_HTTP_TOKEN`)
//! every MCP session is a client of its own, as before; the sessionless revision 2026-07-28,
//! which has no MCP session to own sandboxes, is then not offered over HTTP.
//!
//! The gate identifies the caller of each request and runs the rest of the request inside
//! [`with_current`]; the service factory and the tool handlers read it with [`current`].

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::config::secrets::{server_env, Secrets};
use crate::config::Config;

/// The limits one principal may use; `None`: the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaOverrides {
    /// Live sandbox sessions at once.
    pub sessions: Option<usize>,
    /// Executions (code, commands, installs) running at once.
    pub executions: Option<usize>,
    /// CPU-seconds the principal's code may use per UTC day.
    pub cpu_seconds_per_day: Option<u64>,
}

/// An identified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Its name: the tokens file's first column, or `oauth:` and the token's subject.
    pub name: String,
    /// Sees and reaches every principal's sessions (`admin` in the tokens file, scope
    /// `sandbox:admin` in an access token).
    pub admin: bool,
    pub quotas: QuotaOverrides,
    /// Over HTTP, where its MCP roots' paths are on this machine (`roots_map=CLIENT=HOST` on
    /// its tokens-file line; see `config::roots`).
    pub roots_map: Vec<crate::config::RootMapping>,
    /// The secrets brokered at the egress for its code: its own (`secrets=PATH` on its
    /// tokens-file line, read when the file is), else the server's (`SANDBOX_SECRETS_FILE`,
    /// refused with more than one principal); empty: none (always, for an OAuth caller).
    pub secrets: Arc<Secrets>,
}

impl Principal {
    pub fn new(name: impl Into<String>) -> Principal {
        Principal {
            name: name.into(),
            admin: false,
            quotas: QuotaOverrides::default(),
            roots_map: Vec::new(),
            secrets: Arc::default(),
        }
    }

    /// What `{principal}` stands for in `SANDBOX_ROOTS_MAP`: its name when that is a plain file
    /// name (a tokens-file name always is), else its saved-files directory's name (an OAuth
    /// subject can be anything).
    pub fn roots_dir_name(&self) -> String {
        if is_plain_name(&self.name) && self.name.len() <= 64 {
            self.name.clone()
        } else {
            self.files_dir_name()
        }
    }

    /// The directory, under the files directory, of this principal's saved files.
    pub fn files_dir_name(&self) -> String {
        crate::engine::files_dir::owner_dir_name(&self.name)
    }
}

/// A name made only of ASCII letters, digits, `.`, `_` and `-`, not starting with `.`.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

tokio::task_local! {
    static CURRENT: Option<Arc<Principal>>;
}

/// Runs `future` (the rest of a request) with `principal` as its caller.
pub async fn with_current<F: Future>(principal: Option<Arc<Principal>>, future: F) -> F::Output {
    CURRENT.scope(principal, future).await
}

/// The caller of the request being handled on this task, when it was identified.
pub fn current() -> Option<Arc<Principal>> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// The SHA-256 of a token, as the tokens file holds it: `sha256:` and 64 hex digits.
pub fn token_hash(token: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(token.as_bytes())))
}

/// A new random token: 64 hex digits (256 bits, from the system's random source).
pub fn new_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// How a tokens file's `secrets=` options are read: the server's own set, and why secrets cannot
/// be used at all (the network, the engine), if they cannot.
#[derive(Debug, Clone, Default)]
pub struct SecretsRules {
    /// `SANDBOX_SECRETS_FILE`'s secrets, which a lone principal gets.
    pub global: Arc<Secrets>,
    /// [`Config::secrets_refusal`].
    pub refusal: Option<String>,
}

impl SecretsRules {
    pub fn of(config: &Config) -> SecretsRules {
        SecretsRules {
            global: config.secrets.clone(),
            refusal: config.secrets_refusal(),
        }
    }
}

/// The options a tokens-file line may have, for messages.
const KNOWN_OPTIONS: &str = "admin, sessions=N, executions=N, cpu_seconds_per_day=N, \
                             roots_map=CLIENT_PATH=HOST_PATH, secrets=PATH";

/// The principals of a tokens file, by the hash of their token.
#[derive(Debug, Default)]
pub struct TokenTable {
    by_hash: HashMap<String, Arc<Principal>>,
}

impl TokenTable {
    /// Parses a tokens file, its lines only: a `secrets=` file is not read (see
    /// [`TokenTable::parse_with`]). Each line: `NAME sha256:HEX [admin] [sessions=N]
    /// [executions=N] [cpu_seconds_per_day=N] [roots_map=CLIENT_PATH=HOST_PATH ...]
    /// [secrets=PATH]`; blank lines and lines starting with `#` are skipped. An error names the
    /// line and what is wrong with it.
    pub fn parse(text: &str) -> Result<TokenTable, String> {
        TokenTable::parse_with(text, None)
    }

    /// Parses a tokens file and, given `rules`, reads each `secrets=` file (the principal's
    /// set; a line without one gets the server's) and refuses what the rules do not allow: a
    /// `secrets=` where secrets cannot be used, or beside `SANDBOX_SECRETS_FILE`, and the
    /// server's secrets with more than one principal.
    pub fn parse_with(text: &str, rules: Option<&SecretsRules>) -> Result<TokenTable, String> {
        let mut by_hash = HashMap::new();
        let mut names = std::collections::HashSet::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(name), Some(hash)) = (fields.next(), fields.next()) else {
                return Err(format!(
                    "line {number}: expected `NAME sha256:HEX [OPTIONS]` (make one with `python-code-sandbox token NAME`)"
                ));
            };
            if !is_plain_name(name) || name.len() > 64 {
                return Err(format!(
                    "line {number}: the name `{name}` must be 1 to 64 letters, digits, `.`, `_` or `-`"
                ));
            }
            let valid_hash = hash
                .strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if !valid_hash {
                return Err(format!(
                    "line {number}: `{name}`'s token hash must be `sha256:` and 64 hex digits (never the token itself)"
                ));
            }
            let mut principal = Principal::new(name);
            let mut secrets_file: Option<PathBuf> = None;
            for option in fields {
                if let Some(path) = option.strip_prefix("secrets=") {
                    let path = PathBuf::from(path);
                    if !path.is_absolute() {
                        return Err(format!(
                            "line {number} (`{name}`): `secrets` takes the absolute path of a \
                             secrets file (TOML, as SANDBOX_SECRETS_FILE's), not `{}`",
                            path.display()
                        ));
                    }
                    if secrets_file.replace(path).is_some() {
                        return Err(format!(
                            "line {number} (`{name}`): `secrets` given twice: one file holds \
                             all of a principal's secrets"
                        ));
                    }
                    continue;
                }
                parse_option(&mut principal, option)
                    .map_err(|e| format!("line {number} (`{name}`): {e}"))?;
            }
            if let Some(rules) = rules {
                principal.secrets = principal_secrets(rules, secrets_file.as_deref())
                    .map_err(|e| format!("line {number} (`{name}`): {e}"))?;
            }
            if !names.insert(name.to_string()) {
                return Err(format!("line {number}: `{name}` appears twice"));
            }
            let hash = hash.to_ascii_lowercase();
            if by_hash.insert(hash, Arc::new(principal)).is_some() {
                return Err(format!(
                    "line {number}: `{name}` has the same token as an earlier line"
                ));
            }
        }
        let shared = rules.is_some_and(|r| !r.global.is_empty());
        if shared && by_hash.len() > 1 {
            return Err(format!(
                "{} principals, and SANDBOX_SECRETS_FILE gives one set of secrets to every \
                 principal: unset SANDBOX_SECRETS_FILE and give each principal its own with \
                 secrets=PATH on its line",
                by_hash.len()
            ));
        }
        Ok(TokenTable { by_hash })
    }

    /// Reads and parses a tokens file, and the `secrets=` files it names ([`Self::parse_with`]).
    pub fn load(path: &Path, rules: &SecretsRules) -> Result<TokenTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        TokenTable::parse_with(&text, Some(rules)).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The principal whose token this is.
    pub fn identify(&self, token: &str) -> Option<Arc<Principal>> {
        self.by_hash.get(&token_hash(token)).cloned()
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// A principal's secrets: its own file's, else the server's.
fn principal_secrets(rules: &SecretsRules, file: Option<&Path>) -> Result<Arc<Secrets>, String> {
    let Some(file) = file else {
        return Ok(rules.global.clone());
    };
    let shown = file.display();
    if let Some(why) = &rules.refusal {
        return Err(format!("secrets={shown}: {why}; or remove secrets="));
    }
    if !rules.global.is_empty() {
        return Err(format!(
            "secrets={shown} beside SANDBOX_SECRETS_FILE: a principal's secrets are its own \
             file's or the server's, not both; unset SANDBOX_SECRETS_FILE (or remove secrets=)"
        ));
    }
    Secrets::load(file, &server_env)
        .map(Arc::new)
        .map_err(|e| format!("secrets={shown}: {}", e.where_and_why()))
}

fn parse_option(principal: &mut Principal, option: &str) -> Result<(), String> {
    if option == "admin" {
        principal.admin = true;
        return Ok(());
    }
    let Some((key, value)) = option.split_once('=') else {
        return Err(format!(
            "unknown option `{option}` (known: {KNOWN_OPTIONS})"
        ));
    };
    let number = || {
        value
            .parse::<u64>()
            .map_err(|_| format!("`{key}` takes a whole number, not `{value}`"))
    };
    let quotas = &mut principal.quotas;
    match key {
        "sessions" => quotas.sessions = Some(usize::try_from(number()?).unwrap_or(usize::MAX)),
        "executions" => quotas.executions = Some(usize::try_from(number()?).unwrap_or(usize::MAX)),
        "cpu_seconds_per_day" => quotas.cpu_seconds_per_day = Some(number()?),
        "roots_map" => match crate::config::parse_root_mapping(value) {
            Some(mapping) => principal.roots_map.push(mapping),
            None => {
                return Err(format!(
                    "`roots_map` takes CLIENT_PATH=HOST_PATH, both absolute without . or .., \
                     not `{value}`"
                ))
            }
        },
        _ => return Err(format!("unknown option `{key}` (known: {KNOWN_OPTIONS})")),
    }
    Ok(())
}

/// A tokens file, reloaded on demand (SIGHUP): a reload that fails keeps the table in force.
#[derive(Debug)]
pub struct TokensFile {
    path: PathBuf,
    /// How its `secrets=` files are read, each time it is.
    rules: SecretsRules,
    table: RwLock<Arc<TokenTable>>,
}

impl TokensFile {
    pub fn open(path: &Path, rules: SecretsRules) -> Result<TokensFile, String> {
        let table = TokenTable::load(path, &rules)?;
        Ok(TokensFile {
            path: path.to_path_buf(),
            rules,
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// Reads the file again, and the `secrets=` files it names; on error the principals in
    /// force stay.
    pub fn reload(&self) -> Result<usize, String> {
        let table = TokenTable::load(&self.path, &self.rules)?;
        let count = table.len();
        match self.table.write() {
            Ok(mut slot) => *slot = Arc::new(table),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(table),
        }
        Ok(count)
    }

    pub fn identify(&self, token: &str) -> Option<Arc<Principal>> {
        let table = match self.table.read() {
            Ok(table) => table.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        table.identify(token)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The line of the tokens file for a new principal with `token`.
pub fn tokens_file_line(name: &str, token: &str, options: &[String]) -> String {
    let mut line = format!("{name} {}", token_hash(token));
    for option in options {
        line.push(' ');
        line.push_str(option);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_identifies_its_principal_and_only_its_hash_is_stored() {
        let alice = new_token();
        let bob = new_token();
        assert_eq!(alice.len(), 64);
        assert_ne!(alice, bob);
        let file = format!(
            "# team\n{}\n\n{}\n",
            tokens_file_line("alice", &alice, &["sessions=2".into()]),
            tokens_file_line(
                "bob",
                &bob,
                &["admin".into(), "cpu_seconds_per_day=60".into()]
            ),
        );
        assert!(!file.contains(&alice));
        let table = TokenTable::parse(&file).unwrap();
        let a = table.identify(&alice).unwrap();
        assert_eq!(
            (a.name.as_str(), a.admin, a.quotas.sessions),
            ("alice", false, Some(2))
        );
        let b = table.identify(&bob).unwrap();
        assert!(b.admin);
        assert_eq!(b.quotas.cpu_seconds_per_day, Some(60));
        assert!(table.identify("not-a-token").is_none());
        assert!(table.identify(&alice[1..]).is_none());
    }

    #[test]
    fn a_bad_line_is_named() {
        let hash = token_hash("x");
        for (text, expected) in [
            ("alice".to_string(), "line 1"),
            ("alice secret".to_string(), "64 hex digits"),
            (format!("../x {hash}"), "letters, digits"),
            (format!("a {hash} sessions=two"), "whole number"),
            (format!("a {hash} colour=red"), "unknown option"),
            (format!("a {hash}\nb {hash}"), "same token"),
            (format!("a {hash}\na {}", token_hash("y")), "twice"),
        ] {
            let error = TokenTable::parse(&text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    /// A secrets file with one secret, its value in a file beside it, in a directory of its own.
    fn secrets_file(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pcs-principal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{name}.toml"));
        let key = dir.join("key");
        std::fs::write(&key, "sk-test-key\n").unwrap();
        std::fs::write(
            &file,
            format!(
                "[[secret]]\nname = \"{name}\"\nvalue_file = \"{}\"\n\
                 hosts = [\"api.{name}.example\"]\nenv = \"{}_KEY\"\n",
                key.display(),
                name.to_ascii_uppercase()
            ),
        )
        .unwrap();
        file
    }

    #[test]
    fn a_principal_has_its_own_secrets_or_the_servers() {
        let (alice, bob) = (new_token(), new_token());
        let file = secrets_file("alpha");
        let text = format!(
            "{}\n{}\n",
            tokens_file_line("alice", &alice, &[format!("secrets={}", file.display())]),
            tokens_file_line("bob", &bob, &[]),
        );
        let rules = SecretsRules::default();
        let table = TokenTable::parse_with(&text, Some(&rules)).unwrap();
        let a = table.identify(&alice).unwrap();
        assert_eq!(a.secrets.entries[0].name, "alpha");
        assert_eq!(a.secrets.entries[0].env, "ALPHA_KEY");
        assert_eq!(a.secrets.file.as_deref(), Some(file.as_path()));
        assert!(table.identify(&bob).unwrap().secrets.is_empty());
        // Without rules (the `token` command's check) the line is read, not the file.
        assert!(TokenTable::parse(&text)
            .unwrap()
            .identify(&alice)
            .unwrap()
            .secrets
            .is_empty());

        // Where secrets cannot be used, a `secrets=` is refused with the reason.
        let refused = SecretsRules {
            refusal: Some("secrets need SANDBOX_NETWORK=allowlist".into()),
            ..SecretsRules::default()
        };
        let e = TokenTable::parse_with(&text, Some(&refused)).unwrap_err();
        assert!(
            e.starts_with("line 1 (`alice`): secrets=") && e.contains("need SANDBOX_NETWORK"),
            "{e}"
        );

        // The server's set: a lone principal's, refused beside a principal's own or with two.
        let global = Arc::new(
            Secrets::load(&secrets_file("beta"), &crate::config::secrets::server_env).unwrap(),
        );
        let shared = SecretsRules {
            global: global.clone(),
            refusal: None,
        };
        let lone = tokens_file_line("bob", &bob, &[]);
        let table = TokenTable::parse_with(&lone, Some(&shared)).unwrap();
        assert_eq!(table.identify(&bob).unwrap().secrets, global);
        let e = TokenTable::parse_with(&text, Some(&shared)).unwrap_err();
        assert!(e.contains("beside SANDBOX_SECRETS_FILE"), "{e}");
        let two = format!("{lone}\n{}", tokens_file_line("carol", &alice, &[]));
        let e = TokenTable::parse_with(&two, Some(&shared)).unwrap_err();
        assert!(
            e.contains("2 principals, and SANDBOX_SECRETS_FILE gives one set"),
            "{e}"
        );

        // A bad file names the line, the option and the entry; never the value.
        let bad = file.with_file_name("bad.toml");
        let key = file.with_file_name("key");
        std::fs::write(
            &bad,
            format!(
                "[[secret]]\nname = \"x\"\nvalue_file = \"{}\"\nhosts = [\"10.0.0.1\"]\nenv = \"K\"\n",
                key.display()
            ),
        )
        .unwrap();
        let line = tokens_file_line("alice", &alice, &[format!("secrets={}", bad.display())]);
        let e = TokenTable::parse_with(&line, Some(&rules)).unwrap_err();
        assert!(
            e.contains("line 1 (`alice`): secrets=")
                && e.contains(
                    "[[secret]] #1 (name \"x\"), field `hosts`: 10.0.0.1 is an IP address"
                ),
            "{e}"
        );
        assert!(!e.contains("sk-test-key"), "{e}");
        assert_eq!(a.secrets.entries[0].value.expose(), "sk-test-key");
        for (option, expected) in [
            ("secrets=relative.toml", "absolute path"),
            ("secrets=/a.toml secrets=/b.toml", "given twice"),
        ] {
            let line = format!("{} {option}", tokens_file_line("alice", &alice, &[]));
            let e = TokenTable::parse(&line).unwrap_err();
            assert!(e.contains(expected), "{option}: {e}");
        }
        for dir in [file.parent(), bad.parent()].into_iter().flatten() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn files_dirs_are_plain_names_or_digests() {
        assert_eq!(Principal::new("alice").files_dir_name(), "principal-alice");
        let odd = Principal::new("oauth:https://idp/../user").files_dir_name();
        assert!(
            odd.starts_with("principal-~") && !odd.contains('/'),
            "{odd}"
        );
        assert_ne!(odd, Principal::new("oauth:other").files_dir_name());
    }

    #[tokio::test]
    async fn the_current_principal_is_the_one_of_the_request() {
        assert!(current().is_none());
        let alice = Arc::new(Principal::new("alice"));
        let seen = with_current(Some(alice.clone()), async { current() }).await;
        assert_eq!(seen, Some(alice));
        assert!(current().is_none());
    }
}
