//! The command line: thin translations from arguments to engine calls and back.

mod client_config;
mod doctor;
mod gvisor;
pub mod progress;
mod replace;
mod setup;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::config::{self, Config};
use crate::engine::docker::{image, DockerBackend};
use crate::engine::{Engine, Execution, RunOptions, Task};
use crate::mcp::ServeError;

/// Exit status for a configuration error.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status when the sandbox could not run the code (engine down, image missing, ...).
pub const EXIT_INFRA: u8 = 125;
/// Exit status of `run` when the code timed out (as `timeout(1)`).
pub const EXIT_TIMEOUT: u8 = 124;

#[derive(Parser, Debug)]
#[command(
    name = "python-code-sandbox",
    version,
    about = "Run untrusted Python in hardened, disposable Docker sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve MCP over stdin/stdout (the default when no command is given).
    Stdio,
    /// Serve MCP: over stdin/stdout, or with --http over streamable HTTP at http://ADDR/mcp.
    Serve {
        /// Listen on ADDR (IP:PORT; default 127.0.0.1:8080) instead of stdin/stdout. Any address
        /// but loopback needs SANDBOX_HTTP_TOKEN.
        #[arg(
            long,
            value_name = "ADDR",
            num_args = 0..=1,
            default_missing_value = crate::mcp::http::DEFAULT_ADDR
        )]
        http: Option<String>,
    },
    /// Run a Python file (or `-` for stdin) in a fresh sandbox; exits with its exit status.
    Run {
        /// The file to run, or `-` to read the code from stdin.
        file: PathBuf,
        /// A PyPI requirement to install first (repeatable).
        #[arg(long = "dep", value_name = "PKG")]
        deps: Vec<String>,
        /// Wall-clock limit, e.g. `30s`, `2m` (default: SANDBOX_TIMEOUT).
        #[arg(long, value_name = "DUR")]
        timeout: Option<String>,
    },
    /// Check the engine, the image and what a sandbox really enforces.
    Doctor,
    /// Manage the sandbox image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Remove sandboxes left behind by servers that are no longer running.
    Cleanup,
    /// Make a new principal's token for SANDBOX_HTTP_TOKENS_FILE: prints the token (give it to
    /// the principal; it is stored nowhere) and the file's line for it (only its hash).
    Token {
        /// The principal's name: letters, digits, `.`, `_`, `-` (up to 64).
        name: String,
        /// May see every principal's sessions and snapshots.
        #[arg(long)]
        admin: bool,
        /// Live sandbox sessions at once (default: SANDBOX_MAX_SESSIONS).
        #[arg(long)]
        sessions: Option<u64>,
        /// Executions at once (default: SANDBOX_MAX_CONCURRENT).
        #[arg(long)]
        executions: Option<u64>,
        /// CPU-seconds per UTC day (default: SANDBOX_QUOTA_CPU_SECONDS).
        #[arg(long)]
        cpu_seconds_per_day: Option<u64>,
    },
    /// Manage the cache of installed dependencies.
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
    /// Set up for a first result: check the engine (how to get one if there is none), build the
    /// image, run the doctor and a hello world, install a small dependency through the server's
    /// installer (when that fails: the cause, the setting that fixes it, and exit 125 at the end),
    /// then print or write a client's configuration (with that setting in its env).
    Setup {
        /// The MCP client to configure.
        #[arg(long, value_enum)]
        client: Option<client_config::Client>,
        /// Merge the entry into the client's configuration file (other servers are kept, the old
        /// file is backed up) instead of printing it.
        #[arg(long, requires = "client")]
        write: bool,
        /// The name the client lists the server under.
        #[arg(long, default_value = setup::DEFAULT_SERVER_NAME)]
        name: String,
        /// Only the client's configuration: skip the engine, image, doctor, hello world and
        /// dependency install.
        #[arg(long)]
        config_only: bool,
        /// How the client starts the server (default: this program's path; uvx when this program
        /// runs from uv's cache).
        #[arg(long, value_enum)]
        via: Option<setup::Via>,
        /// Register gVisor (runsc) with the local Docker engine when it is not: installs Debian's
        /// runsc if missing, adds it to dockerd's daemon.json (backed up) and reloads dockerd.
        /// Needs root, Linux and a local rootful Docker engine.
        #[arg(long, conflicts_with = "config_only")]
        gvisor: bool,
    },
    /// Print a shell completion script (e.g. `python-code-sandbox completions bash >
    /// /etc/bash_completion.d/python-code-sandbox`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `python-code-sandbox man | man -l -`.
    Man,
    /// Started by a server beside itself: removes the server's sandboxes once it is gone
    /// (see `engine::warden`).
    #[command(name = crate::engine::warden::COMMAND, hide = true)]
    Warden { instance: String },
}

#[derive(Subcommand, Debug)]
enum CacheCommand {
    /// List the installed dependency sets.
    List,
    /// Remove the least recently used sets beyond SANDBOX_DEPS_CACHE_MAX (all of them with --all).
    Prune {
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Build the sandbox image (FROM python:3.11-slim; offline from a debootstrap rootfs).
    Build {
        /// Build without any registry: debootstrap a Debian bookworm rootfs (needs root).
        #[arg(long)]
        offline: bool,
        /// Tag to build (default: SANDBOX_IMAGE; with --flavour, python-code-sandbox:py3.11-NAME).
        #[arg(long)]
        tag: Option<String>,
        /// Build a flavour: the sandbox image with a pinned set of packages baked in, installed
        /// through PIP_INDEX_URL / PIP_EXTRA_INDEX_URL with SANDBOX_CA_BUNDLE.
        #[arg(long, value_name = "NAME")]
        flavour: Option<FlavourArg>,
    },
}

/// A flavour's name on the command line: any entry of `image::flavour::FLAVOURS`.
#[derive(Debug, Clone, Copy)]
struct FlavourArg(&'static image::flavour::Flavour);

impl clap::ValueEnum for FlavourArg {
    fn value_variants<'a>() -> &'a [Self] {
        static VARIANTS: std::sync::LazyLock<Vec<FlavourArg>> =
            std::sync::LazyLock::new(|| image::flavour::FLAVOURS.iter().map(FlavourArg).collect());
        &VARIANTS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.0.name).help(self.0.summary))
    }
}

pub fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    // Generated from the definition above: no configuration, engine or runtime needed.
    match cli.command {
        Some(Command::Completions { shell }) => return completions(shell),
        Some(Command::Man) => return manual(),
        _ => {}
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("python-code-sandbox: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // The doctor (setup runs it too) ends its own probe session on purpose, with an allocation
    // past the memory limit under gVisor, and reports that itself: the engine's warning about a
    // lost session would only alarm.
    const DOCTOR_SESSION: &str = "python_code_sandbox::engine::service::sessions=error";
    let default_level = match cli.command {
        // Progress and results are printed; the log says only what went wrong.
        Some(Command::Setup { .. }) => format!("warn,{DOCTOR_SESSION}"),
        Some(Command::Run { .. } | Command::Image { .. }) => "warn".to_string(),
        Some(Command::Doctor) => format!("info,{DOCTOR_SESSION}"),
        _ => "info".to_string(),
    };
    init_logging(&config, &default_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("python-code-sandbox: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_INFRA);
        }
    };
    let code = runtime.block_on(dispatch(cli, config));
    // The stdio transport leaves a blocking read of stdin behind; don't wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// glibc gives each thread that allocates its own malloc arena; in a long-running server whose
/// requests hop between runtime threads that shows up as memory that grows and is never returned.
/// Two arenas keep the server's footprint flat at no measurable cost.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Logs to stderr at `LOG_LEVEL`, else `default_level`, as text or (`LOG_FORMAT=json`) JSON lines: stdout belongs to the code's output, the
/// MCP protocol or the benchmark's figures.
pub fn init_logging(config: &Config, default_level: &str) {
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = config.log_level.as_deref().unwrap_or(default_level);
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Logs go to stderr: stdout is the code's output (run) or the MCP protocol (server).
    let _ = log_dispatch(filter, config.log_json, std::io::stderr).try_init();
}

/// The log as `init_logging` sets it up, writing to `writer`: every line escaped by
/// [`EscapedLines`], without colours (their escape sequences would be escaped too).
fn log_dispatch<W>(
    filter: tracing_subscriber::EnvFilter,
    json: bool,
    writer: W,
) -> tracing::Dispatch
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(writer);
    if json {
        // LOG_FORMAT=json: one JSON object per line, the event's fields at the top level.
        let logs = logs.json().flatten_event(true);
        tracing::Dispatch::new(
            logs.map_event_format(|inner| EscapedLines {
                inner,
                form: crate::text::LogForm::Json,
            })
            .finish(),
        )
    } else {
        tracing::Dispatch::new(
            logs.map_event_format(|inner| EscapedLines {
                inner,
                form: crate::text::LogForm::Text,
            })
            .finish(),
        )
    }
}

/// The log's guarantee that one event is one line: an event is formatted by `inner` (text or
/// JSON), then every character that could end the line, forge another or drive a terminal
/// (`text::unsafe_in_log`: newlines, carriage returns, ANSI escapes, C1 controls, ...) is
/// escaped, wherever it came from: a message, a field, a span's fields. No call site can forget
/// it, whatever clients or sandboxes put in the text it logs. In a JSON line the escapes are
/// JSON's, so the line stays valid and its values decode to the original text.
struct EscapedLines<F> {
    inner: F,
    form: crate::text::LogForm,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for EscapedLines<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.inner.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        // The formatter ends the event with one newline: the only one the line keeps.
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line.as_str(), ""),
        };
        writer.write_str(&crate::text::escape_log(body, self.form))?;
        writer.write_str(end)
    }
}

/// Prints a new token and its tokens-file line; the line is checked the way the server reads it.
fn new_principal_token(name: &str, options: &[String]) -> ExitCode {
    use crate::mcp::principals::{new_token, tokens_file_line, TokenTable};
    let token = new_token();
    let line = tokens_file_line(name, &token, options);
    if let Err(e) = TokenTable::parse(&line) {
        eprintln!("error: {}", e.trim_start_matches("line 1: "));
        return ExitCode::from(2);
    }
    println!("token: {token}");
    println!("line: {line}");
    eprintln!(
        "Append the line to the file SANDBOX_HTTP_TOKENS_FILE names (then `kill -HUP` the server \
         to reload it); give the token to {name}: it is stored nowhere."
    );
    ExitCode::SUCCESS
}

async fn dispatch(cli: Cli, config: Config) -> ExitCode {
    match cli.command {
        None | Some(Command::Stdio) | Some(Command::Serve { http: None }) => {
            served(crate::mcp::serve_stdio(config, termination()).await)
        }
        Some(Command::Serve { http: Some(addr) }) => {
            served(crate::mcp::http::serve_http(config, &addr, termination()).await)
        }
        Some(Command::Run {
            file,
            deps,
            timeout,
        }) => run(config, file, deps, timeout).await,
        Some(Command::Doctor) => doctor::doctor(config).await,
        Some(Command::Image {
            command:
                ImageCommand::Build {
                    offline,
                    tag,
                    flavour,
                },
        }) => build_image(config, offline, tag, flavour).await,
        Some(Command::Cache { command }) => cache(config, command).await,
        Some(Command::Setup {
            client,
            write,
            name,
            config_only,
            via,
            gvisor,
        }) => {
            let request = setup::SetupRequest {
                client,
                write,
                name,
                config_only,
                via,
                gvisor,
            };
            setup::setup(config, request).await
        }
        Some(Command::Completions { shell }) => completions(shell),
        Some(Command::Man) => manual(),
        Some(Command::Token {
            name,
            admin,
            sessions,
            executions,
            cpu_seconds_per_day,
        }) => {
            let options: Vec<String> = [
                admin.then(|| "admin".to_string()),
                sessions.map(|n| format!("sessions={n}")),
                executions.map(|n| format!("executions={n}")),
                cpu_seconds_per_day.map(|n| format!("cpu_seconds_per_day={n}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            new_principal_token(&name, &options)
        }
        Some(Command::Warden { instance }) => {
            if !crate::engine::warden::is_instance(&instance) {
                eprintln!("python-code-sandbox: not a server instance id: {instance:?}");
                return ExitCode::from(2);
            }
            crate::engine::warden::watch(Engine::with_docker(config), &instance).await;
            ExitCode::SUCCESS
        }
        Some(Command::Cleanup) => {
            let engine = Engine::with_docker(config);
            match engine.remove_leftovers().await {
                Ok(n) => {
                    println!("removed {n} leftover sandbox(es) and volume(s)");
                    ExitCode::SUCCESS
                }
                Err(e) => infra_error(&e),
            }
        }
    }
}

async fn cache(config: Config, command: CacheCommand) -> ExitCode {
    let engine = Engine::with_docker(config);
    let (sets, verb) = match command {
        CacheCommand::List => (engine.cached_dependency_sets().await, "cached"),
        CacheCommand::Prune { all } => (engine.prune_dependency_sets(all).await, "removed"),
    };
    match sets {
        Ok(sets) => {
            let total: u64 = sets.iter().map(|s| s.size).sum();
            for set in &sets {
                let when = humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + Duration::from_secs(set.last_used),
                );
                println!(
                    "{}  {:>10}  last used {when}  {}",
                    set.key,
                    set.size,
                    set.requirements.join(" ")
                );
            }
            println!("{verb}: {} set(s), {total} bytes", sets.len());
            ExitCode::SUCCESS
        }
        Err(e) => infra_error(&e),
    }
}

/// Writes the completion script for `shell` to stdout.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut command = Cli::command();
    let name = command.get_name().to_string();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Writes the manual page (roff) to stdout.
fn manual() -> ExitCode {
    let page = clap_mangen::Man::new(Cli::command());
    let mut out = std::io::stdout().lock();
    match page.render(&mut out).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // `… man | head`: the reader had enough.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("python-code-sandbox: cannot write the manual page: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a server that has stopped: success once it served, `EXIT_CONFIG` when the
/// settings or arguments kept it from starting, failure otherwise.
fn served(outcome: Result<(), ServeError>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ ServeError::Handshake(_)) => {
            // The client went wrong, not the operator: a log line, as for the rest of the session.
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("python-code-sandbox: {e}");
            if e.is_configuration() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn infra_error(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("python-code-sandbox: error: {e}");
    ExitCode::from(EXIT_INFRA)
}

/// Builds the sandbox image, or a flavour of it (also when the tag is a flavour's default tag).
async fn build_image(
    config: Config,
    offline: bool,
    tag: Option<String>,
    flavour: Option<FlavourArg>,
) -> ExitCode {
    let backend = DockerBackend::new();
    let docker = match backend.client().await {
        Ok(docker) => docker,
        Err(e) => return infra_error(&e),
    };
    let tag = match (tag, flavour) {
        (Some(tag), _) => tag,
        (None, Some(FlavourArg(flavour))) => flavour.default_tag(),
        (None, None) => config.image.clone(),
    };
    let flavour = flavour
        .map(|f| f.0)
        .or_else(|| image::flavour::for_tag(&tag));
    let mode = if offline {
        image::BuildMode::Offline
    } else {
        image::BuildMode::Auto
    };
    let progress = progress::Progress::start(&match flavour {
        Some(flavour) => format!("building {tag} (flavour {})", flavour.name),
        None => format!("building {tag}"),
    });
    let built = build_tagged(&docker, &config, &tag, flavour, mode, &progress.sink()).await;
    progress.finish(if built.is_ok() { "done" } else { "failed" });
    match built {
        Ok(()) => {
            println!("built {tag}");
            ExitCode::SUCCESS
        }
        Err(e) => infra_error(&e),
    }
}

/// Builds `tag`: the flavour's recipe when it is a flavour, the sandbox image's otherwise.
async fn build_tagged(
    docker: &bollard::Docker,
    config: &Config,
    tag: &str,
    flavour: Option<&image::flavour::Flavour>,
    mode: image::BuildMode,
    progress: &crate::engine::ProgressSink,
) -> Result<(), image::ImageError> {
    let index = image::Index::from_config(config);
    match flavour {
        Some(flavour) => image::flavour::build(docker, flavour, tag, mode, &index, progress).await,
        None => {
            image::build(docker, tag, mode, &index, progress).await?;
            // The egress proxy's image goes with the sandbox image (made once, offline).
            image::ensure_proxy(docker, progress).await
        }
    }
}

fn read_code(file: &PathBuf) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes)?;
    } else {
        bytes = std::fs::read(file)?;
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "the code is not UTF-8"))
}

async fn run(
    config: Config,
    file: PathBuf,
    deps: Vec<String>,
    timeout: Option<String>,
) -> ExitCode {
    let timeout = match timeout
        .map(|t| config::parse_duration("--timeout", &t))
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("python-code-sandbox: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let code = match read_code(&file) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("python-code-sandbox: cannot read {}: {e}", file.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = crate::engine::files_dir::prepare_configured(&config.files) {
        eprintln!("python-code-sandbox: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let engine = Engine::with_docker(config);
    // A sweep of the saved files now, and after this run's save (cut short at exit, harmlessly).
    let retention = engine.spawn_file_retention();
    // Installing dependencies takes long enough to show its steps (the code's own output is
    // written after, whole).
    let progress = (!deps.is_empty()).then(|| progress::Progress::start("preparing the sandbox"));
    let options = RunOptions {
        timeout,
        dependencies: deps,
        progress: progress.as_ref().map(progress::Progress::sink),
        ..Default::default()
    };
    let outcome = tokio::select! {
        outcome = engine.run_ephemeral(Task::Script(&code), &options) => Some(outcome),
        signal = termination() => {
            tracing::info!("{signal}: removing the sandbox");
            None
        }
    };
    if let Some(progress) = progress {
        let ran = matches!(outcome, Some(Ok(_)));
        progress.finish(if ran { "done" } else { "failed" });
    }
    // The sandbox is removed in the background once the result is in: wait for it, then remove
    // the egress proxy (when `allowlist` or an install started it).
    engine.settle().await;
    engine.stop_egress().await;
    if let Some(retention) = retention {
        retention.abort();
    }
    match outcome {
        Some(Ok(execution)) => report(&execution),
        Some(Err(e)) => infra_error(&e),
        None => {
            engine.shutdown().await;
            ExitCode::from(130)
        }
    }
}

/// Writes an execution's output as the code wrote it (a stream over its share of the output
/// limit: its head and tail, without the line between them), and notes about limits to stderr.
fn report(execution: &Execution) -> ExitCode {
    let [out_cut, err_cut] = execution.discarded.each_ref().map(Option::as_ref);
    let mut stdout = std::io::stdout().lock();
    for part in as_written(&execution.stdout, out_cut) {
        let _ = stdout.write_all(part);
    }
    let _ = stdout.flush();
    let mut stderr = std::io::stderr().lock();
    for part in as_written(&execution.stderr, err_cut) {
        let _ = stderr.write_all(part);
    }
    for (name, cut) in [("stdout", out_cut), ("stderr", err_cut)] {
        if let Some(d) = cut {
            let _ = writeln!(
                stderr,
                "[python-code-sandbox: output cut; {name} keeps its first {} and last {} bytes, \
                 the {} ({}) between them were discarded (SANDBOX_MAX_OUTPUT, {})]",
                d.at,
                d.tail,
                crate::text::count(d.bytes, "byte"),
                crate::text::count(d.lines, "line"),
                crate::text::bytes(d.limit),
            );
        }
    }
    if execution.truncated_bytes > 0 && out_cut.is_none() && err_cut.is_none() {
        let _ = writeln!(
            stderr,
            "[python-code-sandbox: output cut; {} more bytes were discarded]",
            execution.truncated_bytes
        );
    }
    if execution.timed_out {
        let _ = writeln!(
            stderr,
            "[python-code-sandbox: timed out after {}]",
            crate::text::duration(execution.duration)
        );
        return ExitCode::from(EXIT_TIMEOUT);
    }
    ExitCode::from(execution.exit_code.rem_euclid(256) as u8)
}

/// A stream's bytes as the code wrote them: all of them, or head and tail around the line that
/// stands for what was dropped between them.
fn as_written<'a>(
    kept: &'a [u8],
    discarded: Option<&crate::engine::outcome::Discarded>,
) -> [&'a [u8]; 2] {
    match discarded.and_then(|d| Some((kept.get(..d.at)?, kept.get(d.range().end..)?))) {
        Some((head, tail)) => [head, tail],
        None => [kept, &[]],
    }
}

/// Resolves on SIGINT or SIGTERM, naming it: what ends a server or a `run`.
async fn termination() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log writer into memory.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// What the log writes for events that carry `forged` in every place a client's text can be.
    fn logged(json: bool, forged: &str) -> String {
        let captured = Captured::default();
        let dispatch = log_dispatch(
            tracing_subscriber::EnvFilter::new("info"),
            json,
            captured.clone(),
        );
        tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::info_span!("request", host = %forged);
            let _entered = span.enter();
            tracing::info!(target: "audit", tool = %forged, session = forged, "tool call");
            tracing::warn!("refused {forged}");
            tracing::info!(name = ?forged, "debug-formatted");
        });
        let bytes = captured.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    const FORGED: &str = "x\n2026-12-01T21:00:00.000000Z  INFO audit: tool call principal=admin tool=\"run_python\"\r\u{1b}[2K\u{9b}31m\u{2028}end";

    #[test]
    fn text_log_lines_are_one_event_each_with_the_forgery_escaped() {
        let log = logged(false, FORGED);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        for line in &lines {
            assert!(!line.chars().any(crate::text::unsafe_in_log), "{line:?}");
            // Each line starts as the formatter starts one: a timestamp, then a level.
            let mut words = line.split_whitespace();
            assert!(words.next().is_some_and(|t| t.ends_with('Z')), "{line}");
            assert!(matches!(words.next(), Some("INFO" | "WARN")), "{line}");
        }
        assert!(
            lines[0].contains("x\\n2026-12-01T21:00:00.000000Z  INFO audit"),
            "{log}"
        );
        assert!(
            lines[0].contains("\\u{1b}[2K\\u{9b}31m\\u{2028}end"),
            "{log}"
        );
        assert!(lines[1].contains("refused x\\n2026"), "{log}");
    }

    #[test]
    fn json_log_lines_are_one_object_each_that_decodes_to_what_was_logged() {
        let log = logged(true, FORGED);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        let mut records = Vec::new();
        for line in &lines {
            assert!(!line.chars().any(crate::text::unsafe_in_log), "{line:?}");
            let record: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            assert!(record.is_object(), "{line}");
            records.push(record);
        }
        assert_eq!(records[0]["target"], "audit");
        assert_eq!(records[0]["tool"], FORGED);
        assert_eq!(records[0]["session"], FORGED);
        assert_eq!(records[1]["message"], format!("refused {FORGED}"));
        assert_eq!(records[1]["span"]["host"], FORGED);
    }

    #[test]
    fn servers_refused_by_their_settings_exit_2_and_other_failures_1() {
        assert_eq!(served(Ok(())), ExitCode::SUCCESS);
        let refused = ServeError::Address("refusing to serve on 0.0.0.0:8080".into());
        assert_eq!(served(Err(refused)), ExitCode::from(EXIT_CONFIG));
        let busy = ServeError::Listen {
            addr: ([127, 0, 0, 1], 8080).into(),
            source: std::io::ErrorKind::AddrInUse.into(),
        };
        assert_eq!(served(Err(busy)), ExitCode::FAILURE);
    }
}
