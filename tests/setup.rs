//! `setup`, `completions` and `man`, as a new user runs them: on a machine with no engine, with an
//! engine but no image, and writing into a client's configuration that lists other servers.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::skip_without_engine;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_python-code-sandbox");
const DEFAULT_IMAGE: &str = python_code_sandbox::config::DEFAULT_IMAGE;

fn setup(args: &[&str], home: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("setup")
        .args(args)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .envs(env.iter().copied())
        .output()
        .expect("run setup")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An empty home directory of the test's own.
fn home(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pcs-setup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the home");
    dir
}

fn claude_desktop_file(home: &Path) -> PathBuf {
    home.join(".config/Claude/claude_desktop_config.json")
}

/// A Claude Desktop configuration a user already has: two servers and a setting of its own.
const EXISTING: &str = r#"{
  "globalShortcut": "Alt+Space",
  "mcpServers": {
    "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/ada"]},
    "github": {"command": "docker", "args": ["run", "-i", "--rm", "ghcr.io/github/github-mcp-server"], "env": {"GITHUB_TOKEN": "t"}}
  }
}"#;

fn backups(file: &Path) -> Vec<PathBuf> {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let mut found: Vec<PathBuf> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}.backup-")))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn with_no_engine_setup_says_how_to_get_one_and_exits_125() {
    let home = home("no-engine");
    let out = setup(
        &["--client", "claude-desktop", "--write"],
        &home,
        &[("DOCKER_HOST", "unix:///nonexistent/pcs-no-engine.sock")],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("no container engine answers"), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/pcs-no-engine.sock"),
        "{stderr}"
    );
    assert!(stderr.contains("Get a container engine"), "{stderr}");
    assert!(stderr.contains("Podman"), "{stderr}");
    // Nothing was configured for a server that cannot run.
    assert!(!claude_desktop_file(&home).exists());
    let _ = std::fs::remove_dir_all(&home);
}

/// Held by the tests that need the default image (setup's doctor, hello world) while one of them
/// takes it away and builds it again.
static DEFAULT_IMAGE_USE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn with_an_engine_but_no_image_setup_builds_it_and_writes_the_client_config() {
    if skip_without_engine() {
        return;
    }
    let _image = DEFAULT_IMAGE_USE.lock().await;
    let docker = common::docker().await;
    // The image goes away under another name (its layers stay: the rebuild may use them), and
    // comes back whatever happens.
    let keep = format!("pcs-setup-test-keep:{}", std::process::id());
    let status = Command::new("docker")
        .args(["tag", DEFAULT_IMAGE, &keep])
        .status()
        .expect("docker tag");
    assert!(
        status.success(),
        "the default image must exist before this test"
    );
    let restore = Restore { keep: keep.clone() };
    let status = Command::new("docker")
        .args(["rmi", DEFAULT_IMAGE])
        .status()
        .expect("docker rmi");
    assert!(status.success());
    assert!(docker.inspect_image(DEFAULT_IMAGE).await.is_err());

    let home = home("engine");
    let file = claude_desktop_file(&home);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, EXISTING).unwrap();
    let out = setup(
        &["--client", "claude-desktop", "--write"],
        &home,
        &[("LOG_LEVEL", "warn")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // The image was built (its steps shown: stderr is no terminal here, so plain lines) …
    assert!(
        stderr.contains(&format!("building {DEFAULT_IMAGE}")),
        "{stderr}"
    );
    assert!(stderr.contains("Step 1/"), "{stderr}");
    let built = docker
        .inspect_image(DEFAULT_IMAGE)
        .await
        .expect("image built");
    let labels = built.config.and_then(|c| c.labels).unwrap_or_default();
    assert!(labels.contains_key("io.python-code-sandbox.recipe"));
    // … the doctor passed and the hello world ran …
    assert!(stdout.contains("ok   image"), "{stdout}");
    assert!(stdout.contains("the agent's code runs under"), "{stdout}");
    assert!(stdout.contains("Hello from the sandbox"), "{stdout}");
    // … and the server was added to the client's file, every other server and setting kept.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(config["globalShortcut"], "Alt+Space");
    assert_eq!(config["mcpServers"]["filesystem"]["args"][2], "/home/ada");
    assert_eq!(config["mcpServers"]["github"]["env"]["GITHUB_TOKEN"], "t");
    let entry = &config["mcpServers"]["python-sandbox"];
    let command = entry["command"].as_str().expect("a command");
    assert!(Path::new(command).is_absolute(), "{entry}");
    assert!(command.ends_with("python-code-sandbox"), "{entry}");
    let backup = backups(&file);
    assert_eq!(backup.len(), 1, "one backup of the previous file");
    assert_eq!(std::fs::read_to_string(&backup[0]).unwrap(), EXISTING);
    drop(restore);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn setup_says_which_runtime_runs_the_code_and_registers_gvisor_only_when_asked() {
    if skip_without_engine() {
        return;
    }
    let _image = DEFAULT_IMAGE_USE.blocking_lock();
    let home = home("runtime");
    // `--gvisor` changes the engine: never together with a run that touches no engine.
    let out = setup(&["--gvisor", "--config-only"], &home, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot be used with"));

    let registered = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .is_ok_and(|o| text(&o.stdout).contains("\"runsc\""));
    let out = setup(&[], &home, &[("LOG_LEVEL", "warn")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("2. runtime of the agent's code"),
        "{stdout}"
    );
    if registered {
        assert!(
            stdout.contains("   the agent's code runs under runsc (gVisor): gVisor is registered"),
            "{stdout}"
        );
    } else {
        assert!(
            stdout.contains("the agent's code runs under runc: gVisor (runsc) is not registered")
                && stdout.contains("setup --gvisor"),
            "{stdout}"
        );
    }
    // The operator's choice is said as such.
    let out = setup(
        &[],
        &home,
        &[("LOG_LEVEL", "warn"), ("SANDBOX_RUNTIME", "runc")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("   the agent's code runs under runc: SANDBOX_RUNTIME chooses it"),
        "{stdout}"
    );
    assert!(stdout.contains("Hello from the sandbox"), "{stdout}");
    // Asked for gVisor where it is registered, setup changes nothing and says so (registering it
    // for real is tested on an engine of its own: scripts/test-remote.sh).
    if registered {
        let daemon_json = std::fs::read("/etc/docker/daemon.json").ok();
        let out = setup(&["--gvisor"], &home, &[("LOG_LEVEL", "warn")]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        assert!(
            stdout.contains("gVisor (runsc) is already registered"),
            "{stdout}"
        );
        assert_eq!(std::fs::read("/etc/docker/daemon.json").ok(), daemon_json);
    }
    let _ = std::fs::remove_dir_all(&home);
}

/// The addresses `host` resolves to on this machine (getaddrinfo), none when it does not.
fn addresses(host: &str) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    (host, 443)
        .to_socket_addrs()
        .map(|found| found.map(|a| a.ip()).collect())
        .unwrap_or_default()
}

/// PyPI's names resolve here only to non-public addresses (behind an intercepting proxy), which
/// the installer's egress proxy refuses unless SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE names them.
fn pypi_resolves_to_non_public_addresses() -> Result<(), String> {
    let found = addresses("pypi.org");
    if found.is_empty() {
        return Err("pypi.org does not resolve here".into());
    }
    match found
        .iter()
        .find(|a| python_code_sandbox::config::egress::is_public(**a))
    {
        Some(public) => Err(format!(
            "pypi.org resolves to the public address {public} here"
        )),
        None => Ok(()),
    }
}

#[tokio::test]
async fn setup_installs_a_dependency_through_the_installer_and_names_the_setting_that_fixes_a_refusal(
) {
    if skip_without_engine() {
        return;
    }
    let _image = DEFAULT_IMAGE_USE.lock().await;
    const FIX: &str = "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE=pypi.org,files.pythonhosted.org";
    let private = pypi_resolves_to_non_public_addresses();
    // The runtime of the code does not matter here (installers get their own): the suite's.
    let runtime = common::suite_runtime();
    let mut env: Vec<(&str, &str)> = vec![("LOG_LEVEL", "warn")];
    if let Some(runtime) = runtime.as_deref() {
        env.push(("SANDBOX_RUNTIME", runtime));
    }
    // (a) With this machine's settings (scripts/test.sh's: the CA bundle, and PyPI's names
    // allowed to resolve privately where they do), into a cache of its own: an install for real.
    let allowed = std::env::var("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE").unwrap_or_default();
    let allowed = if allowed.is_empty() && private.is_ok() {
        "pypi.org,files.pythonhosted.org".to_string()
    } else {
        allowed
    };
    let volume = common::fresh_deps_volume();
    let ok_home = home("deps-ok");
    let mut with = env.clone();
    with.extend([
        ("SANDBOX_DEPS_VOLUME", volume.as_str()),
        ("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE", allowed.as_str()),
    ]);
    let out = setup(&[], &ok_home, &with);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "6. a dependency through the server's installer: six==1.16.0 from PyPI\n   ok: \
             installed through the installer's egress proxy, and imported in a sandbox, in "
        ),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("7. ready."), "{stdout}");
    // Again: the cache has it, and setup says the index was not asked.
    let out = setup(&[], &ok_home, &with);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "   ok: found in the dependency cache (installed earlier; the index was not asked"
        ),
        "{stdout}"
    );
    common::remove_volume(&volume).await;
    let _ = std::fs::remove_dir_all(&ok_home);

    // (b) Without SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE, where PyPI resolves privately here: refused,
    // with the exact setting, and that setting written into the client's `env` with --write
    // (beside what the user had there); the other steps still shown, setup exits 0 with a warning
    // (the server runs code; only agents' `dependencies` would fail).
    if let Err(reason) = private {
        eprintln!(
            "SKIPPED the refusal half of {}: {reason}, so the egress proxy lets it through",
            std::thread::current().name().unwrap_or("this test")
        );
        return;
    }
    let volume = common::fresh_deps_volume();
    let home = home("deps-refused");
    let file = home.join(".claude.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"python-sandbox": {"command": "old", "env": {"SANDBOX_MEMORY_LIMIT": "1g"}}}, "theme": "dark"}"#,
    )
    .unwrap();
    let mut without = env.clone();
    without.push(("SANDBOX_DEPS_VOLUME", volume.as_str()));
    let out = Command::new(BIN)
        .args(["setup", "--client", "claude-code", "--write"])
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE")
        .envs(without.iter().copied())
        .output()
        .expect("run setup");
    common::remove_volume(&volume).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hello from the sandbox"), "{stdout}");
    assert!(
        stderr.contains("setup: warning: the dependency install (step 6) failed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the dependency install failed: the egress proxy refused ")
            && stderr.contains("resolved to the non-public address"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("   the setting that fixes it: {FIX}\n")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("`export {FIX}`")), "{stderr}");
    assert!(
        stdout.contains(&format!(
            "   step 6's fix is written into its `env`: {FIX}\n"
        )),
        "{stdout}"
    );
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entry = &config["mcpServers"]["python-sandbox"];
    assert!(entry["command"]
        .as_str()
        .is_some_and(|c| c.ends_with("python-code-sandbox")));
    assert_eq!(
        entry["env"]["SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE"], "pypi.org,files.pythonhosted.org",
        "{config}"
    );
    assert_eq!(entry["env"]["SANDBOX_MEMORY_LIMIT"], "1g", "{config}");
    assert_eq!(config["theme"], "dark");
    assert_eq!(backups(&file).len(), 1);
    let _ = std::fs::remove_dir_all(&home);
}

/// Puts the default image back from the kept tag if the test did not get as far as rebuilding
/// it, and removes the extra tag.
struct Restore {
    keep: String,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let present = Command::new("docker")
            .args(["image", "inspect", DEFAULT_IMAGE])
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            let _ = Command::new("docker")
                .args(["tag", &self.keep, DEFAULT_IMAGE])
                .status();
        }
        let _ = Command::new("docker").args(["rmi", &self.keep]).output();
    }
}

#[test]
fn config_only_writes_each_clients_file_and_never_clobbers_one_it_cannot_read() {
    let home = home("clients");
    for (client, file, key) in [
        ("claude-code", home.join(".claude.json"), "mcpServers"),
        ("cursor", home.join(".cursor/mcp.json"), "mcpServers"),
        ("vscode", home.join(".config/Code/User/mcp.json"), "servers"),
    ] {
        let out = setup(
            &["--config-only", "--client", client, "--write"],
            &home,
            &[],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let config: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert!(
            config[key]["python-sandbox"]["command"].is_string(),
            "{client}: {config}"
        );
        assert!(backups(&file).is_empty(), "a new file needs no backup");
        // Again, with uvx: the entry is updated in place.
        let out = setup(
            &[
                "--config-only",
                "--client",
                client,
                "--write",
                "--via",
                "uvx",
            ],
            &home,
            &[],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let config: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(config[key]["python-sandbox"]["command"], "uvx");
        assert_eq!(
            config[key]["python-sandbox"]["args"][0],
            "python-code-sandbox-mcp"
        );
        assert_eq!(backups(&file).len(), 1);
    }
    // A file with comments (VS Code allows them) is not rewritten: the entry is printed instead.
    let vscode = home.join(".config/Code/User/mcp.json");
    let jsonc = "{\n  // mine\n  \"servers\": {\"x\": {\"command\": \"y\"}}\n}\n";
    std::fs::write(&vscode, jsonc).unwrap();
    let out = setup(
        &["--config-only", "--client", "vscode", "--write"],
        &home,
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("not plain JSON"),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("\"python-sandbox\""));
    assert_eq!(std::fs::read_to_string(&vscode).unwrap(), jsonc);
    // Without --write, only printed.
    let out = setup(
        &["--config-only", "--client", "cursor"],
        &home,
        &[("DOCKER_HOST", "unix:///run/podman/podman.sock")],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("\"DOCKER_HOST\": \"unix:///run/podman/podman.sock\""));
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn completions_generate_for_each_shell_and_the_manual_page_names_every_command() {
    let commands = [
        "serve",
        "run",
        "doctor",
        "image",
        "setup",
        "completions",
        "man",
    ];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for command in commands {
            assert!(script.contains(command), "{shell}: no {command}");
        }
    }
    // The bash script is valid bash.
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = std::env::temp_dir().join(format!("pcs-completion-{}.bash", std::process::id()));
    std::fs::write(&script, &out.stdout).unwrap();
    let check = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    let _ = std::fs::remove_file(&script);
    // An unknown shell is refused with the choices.
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bash"));

    let out = Command::new(BIN).arg("man").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let page = text(&out.stdout);
    assert!(page.contains(".TH python-code-sandbox 1"), "{page}");
    for command in commands {
        assert!(page.contains(command), "no {command} in the manual page");
    }
}

#[tokio::test]
async fn on_a_terminal_an_image_build_shows_a_spinner_with_the_step_under_way() {
    if skip_without_engine() {
        return;
    }
    if Command::new("script").arg("--version").output().is_err() {
        panic!("`script` (util-linux) is needed to give the build a terminal");
    }
    let tag = format!("pcs-progress-tty:{}", std::process::id());
    // `script` runs the build with a pseudo-terminal as its stdin, stdout and stderr.
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("{BIN} image build --tag {tag}"),
            "/dev/null",
        ])
        .env("LOG_LEVEL", "error")
        .output()
        .expect("run script");
    let _ = Command::new("docker").args(["rmi", &tag]).output();
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    // The spinner redraws its line in place (erase line, carriage return) with the step …
    assert!(shown.contains("\u{1b}[2K"), "{shown:?}");
    assert!(shown.contains(&format!("building {tag}")), "{shown:?}");
    assert!(shown.contains("Step "), "{shown:?}");
    // … and leaves one summary line; no plain per-step lines.
    assert!(
        shown.contains(&format!("building {tag}: done in")),
        "{shown:?}"
    );
    assert!(!shown.contains("  [  0.0s]"), "{shown:?}");
}
