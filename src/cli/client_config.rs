//! MCP clients' configuration files: where each client keeps its servers, the entry that starts
//! this server, and merging it into a file that already lists others (never losing them).
//!
//! Pure logic over paths and JSON values; `setup` does the reading, backing up and writing.

use std::path::PathBuf;

use serde_json::{json, Map, Value};

/// The MCP clients `setup --client` knows.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Desktop (`claude_desktop_config.json`).
    ClaudeDesktop,
    /// Claude Code, user scope (`~/.claude.json`, as `claude mcp add --scope user`).
    ClaudeCode,
    /// VS Code, user profile (`mcp.json`, as "MCP: Open User Configuration").
    Vscode,
    /// Cursor, global (`~/.cursor/mcp.json`).
    Cursor,
}

/// How the client should start the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub command: String,
    pub args: Vec<String>,
    /// Variables the client must pass (e.g. `DOCKER_HOST`: a client starts servers with its own
    /// environment, not the shell's).
    pub env: Vec<(String, String)>,
}

/// The parts of the environment that locate a client's files.
#[derive(Debug, Clone, Default)]
pub struct Home {
    pub home: Option<PathBuf>,
    pub xdg_config_home: Option<PathBuf>,
    pub appdata: Option<PathBuf>,
}

impl Home {
    pub fn from_env() -> Home {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Home {
            home: var("HOME"),
            xdg_config_home: var("XDG_CONFIG_HOME"),
            appdata: var("APPDATA"),
        }
    }

    /// The per-user configuration directory of desktop applications on this system.
    fn app_config_dir(&self) -> Option<PathBuf> {
        if cfg!(target_os = "macos") {
            Some(self.home.as_ref()?.join("Library/Application Support"))
        } else if cfg!(windows) {
            self.appdata.clone()
        } else {
            self.xdg_config_home
                .clone()
                .or_else(|| Some(self.home.as_ref()?.join(".config")))
        }
    }
}

impl Client {
    /// The client's own name for people.
    pub fn title(self) -> &'static str {
        match self {
            Client::ClaudeDesktop => "Claude Desktop",
            Client::ClaudeCode => "Claude Code",
            Client::Vscode => "VS Code",
            Client::Cursor => "Cursor",
        }
    }

    /// The file the client reads its MCP servers from (for the current user).
    pub fn config_file(self, home: &Home) -> Option<PathBuf> {
        match self {
            Client::ClaudeDesktop => Some(
                home.app_config_dir()?
                    .join("Claude")
                    .join("claude_desktop_config.json"),
            ),
            Client::ClaudeCode => Some(home.home.as_ref()?.join(".claude.json")),
            Client::Vscode => Some(home.app_config_dir()?.join("Code/User/mcp.json")),
            Client::Cursor => Some(home.home.as_ref()?.join(".cursor/mcp.json")),
        }
    }

    /// The key under which the file lists servers.
    fn servers_key(self) -> &'static str {
        match self {
            Client::Vscode => "servers",
            _ => "mcpServers",
        }
    }

    /// This server's entry, as the client expects it.
    pub fn entry(self, launch: &Launch) -> Value {
        let mut entry = Map::new();
        if self == Client::Vscode || self == Client::ClaudeCode {
            entry.insert("type".into(), json!("stdio"));
        }
        entry.insert("command".into(), json!(launch.command));
        entry.insert("args".into(), json!(launch.args));
        if !launch.env.is_empty() {
            let env: Map<String, Value> = launch
                .env
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            entry.insert("env".into(), Value::Object(env));
        }
        Value::Object(entry)
    }

    /// A whole file listing only this server: what to paste into an empty configuration.
    pub fn snippet(self, name: &str, launch: &Launch) -> Value {
        json!({ self.servers_key(): { name: self.entry(launch) } })
    }
}

/// What merging did to the file.
#[derive(Debug, PartialEq, Eq)]
pub enum Merged {
    /// The server was not listed; it is now.
    Added,
    /// An entry of that name was there with other settings; it is replaced (nothing else is).
    Replaced,
    /// The same entry was there already: nothing to write.
    Unchanged,
}

/// Why a file cannot be merged into without losing something.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MergeError {
    #[error(
        "it is not plain JSON ({0}); it may hold comments or trailing commas: add the entry by \
         hand (it is printed above)"
    )]
    NotJson(String),
    #[error("its top level is not a JSON object: add the entry by hand (it is printed above)")]
    NotAnObject,
    #[error("its `{0}` is not a JSON object: add the entry by hand (it is printed above)")]
    ServersNotAnObject(&'static str),
}

/// Adds (or updates) `name` in `existing` (the file's text; empty or absent = a new file),
/// keeping every other key and server as it was, and the variables of the entry's `env` that
/// `launch` does not set (the user's own; setup's replace theirs). Returns the new text and what
/// changed.
pub fn merge(
    client: Client,
    existing: Option<&str>,
    name: &str,
    launch: &Launch,
) -> Result<(String, Merged), MergeError> {
    let mut document = match existing.map(str::trim) {
        None | Some("") => Value::Object(Map::new()),
        Some(text) => {
            serde_json::from_str::<Value>(text).map_err(|e| MergeError::NotJson(e.to_string()))?
        }
    };
    let top = document.as_object_mut().ok_or(MergeError::NotAnObject)?;
    let key = client.servers_key();
    let servers = top
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(MergeError::ServersNotAnObject(key))?;
    let mut entry = client.entry(launch);
    if let Some(Value::Object(kept)) = servers.get(name).and_then(|old| old.get("env")) {
        let mut env = kept.clone();
        if let Some(Value::Object(ours)) = entry.get("env") {
            env.extend(ours.clone());
        }
        if let Some(entry) = entry.as_object_mut() {
            entry.insert("env".into(), Value::Object(env));
        }
    }
    let merged = match servers.get(name) {
        None => Merged::Added,
        Some(old) if *old == entry => Merged::Unchanged,
        Some(_) => Merged::Replaced,
    };
    servers.insert(name.to_string(), entry);
    let mut text =
        serde_json::to_string_pretty(&document).map_err(|e| MergeError::NotJson(e.to_string()))?;
    text.push('\n');
    Ok((text, merged))
}

/// Where the previous version of `file` is kept before it is rewritten.
#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn launch() -> Launch {
        Launch {
            command: "/opt/bin/python-code-sandbox".into(),
            args: vec![],
            env: vec![(
                "DOCKER_HOST".into(),
                "unix:///run/podman/podman.sock".into(),
            )],
        }
    }

    #[test]
    fn other_servers_and_keys_survive_a_merge() {
        let existing = r#"{"globalShortcut": "Ctrl+Space",
            "mcpServers": {"filesystem": {"command": "npx", "args": ["-y", "server-filesystem", "/tmp"]}}}"#;
        let (text, merged) = merge(
            Client::ClaudeDesktop,
            Some(existing),
            "python-sandbox",
            &launch(),
        )
        .unwrap();
        assert_eq!(merged, Merged::Added);
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["globalShortcut"], "Ctrl+Space");
        assert_eq!(value["mcpServers"]["filesystem"]["command"], "npx");
        assert_eq!(
            value["mcpServers"]["python-sandbox"]["command"],
            "/opt/bin/python-code-sandbox"
        );
        assert_eq!(
            value["mcpServers"]["python-sandbox"]["env"]["DOCKER_HOST"],
            "unix:///run/podman/podman.sock"
        );
        // Merging again changes nothing; a changed entry replaces only itself.
        let (again, merged) = merge(
            Client::ClaudeDesktop,
            Some(&text),
            "python-sandbox",
            &launch(),
        )
        .unwrap();
        assert_eq!((again.as_str(), merged), (text.as_str(), Merged::Unchanged));
        let mut other = launch();
        other.command = "uvx".into();
        let (_, merged) =
            merge(Client::ClaudeDesktop, Some(&text), "python-sandbox", &other).unwrap();
        assert_eq!(merged, Merged::Replaced);
    }

    #[test]
    fn the_users_variables_in_the_entrys_env_are_kept_and_setups_replace_theirs() {
        let existing = r#"{"mcpServers": {"python-sandbox": {"command": "old",
            "env": {"SANDBOX_MEMORY_LIMIT": "1g", "DOCKER_HOST": "unix:///old.sock"}}}}"#;
        let mut ours = launch();
        ours.env.push((
            "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE".into(),
            "pypi.org,files.pythonhosted.org".into(),
        ));
        let (text, merged) = merge(
            Client::ClaudeDesktop,
            Some(existing),
            "python-sandbox",
            &ours,
        )
        .unwrap();
        assert_eq!(merged, Merged::Replaced);
        let value: Value = serde_json::from_str(&text).unwrap();
        let env = &value["mcpServers"]["python-sandbox"]["env"];
        assert_eq!(env["SANDBOX_MEMORY_LIMIT"], "1g");
        assert_eq!(env["DOCKER_HOST"], "unix:///run/podman/podman.sock");
        assert_eq!(
            env["SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE"],
            "pypi.org,files.pythonhosted.org"
        );
        assert_eq!(env.as_object().unwrap().len(), 3);
        // An entry with no `env` of ours keeps the user's.
        let mut bare = launch();
        bare.env.clear();
        let (text, _) = merge(Client::ClaudeDesktop, Some(&text), "python-sandbox", &bare).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value["mcpServers"]["python-sandbox"]["env"]["SANDBOX_MEMORY_LIMIT"],
            "1g"
        );
    }

    #[test]
    fn files_that_cannot_be_merged_safely_are_refused() {
        let jsonc = "{\n // my servers\n \"servers\": {}\n}";
        assert!(matches!(
            merge(Client::Vscode, Some(jsonc), "x", &launch()),
            Err(MergeError::NotJson(_))
        ));
        assert_eq!(
            merge(Client::Cursor, Some("[1]"), "x", &launch()),
            Err(MergeError::NotAnObject)
        );
        assert_eq!(
            merge(
                Client::Cursor,
                Some(r#"{"mcpServers": []}"#),
                "x",
                &launch()
            ),
            Err(MergeError::ServersNotAnObject("mcpServers"))
        );
    }

    #[test]
    fn each_client_has_its_file_and_its_shape() {
        let home = Home {
            home: Some("/home/ada".into()),
            xdg_config_home: None,
            appdata: None,
        };
        if cfg!(target_os = "linux") {
            assert_eq!(
                Client::ClaudeDesktop.config_file(&home).unwrap(),
                Path::new("/home/ada/.config/Claude/claude_desktop_config.json")
            );
            assert_eq!(
                Client::Vscode.config_file(&home).unwrap(),
                Path::new("/home/ada/.config/Code/User/mcp.json")
            );
        }
        assert_eq!(
            Client::ClaudeCode.config_file(&home).unwrap(),
            Path::new("/home/ada/.claude.json")
        );
        let vscode = Client::Vscode.snippet("python-sandbox", &launch());
        assert_eq!(vscode["servers"]["python-sandbox"]["type"], "stdio");
        let cursor = Client::Cursor.snippet("python-sandbox", &launch());
        assert!(cursor["mcpServers"]["python-sandbox"].get("type").is_none());
        assert!(Client::Cursor.config_file(&Home::default()).is_none());
    }
}
