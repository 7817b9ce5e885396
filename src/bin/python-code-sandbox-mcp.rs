//! `python-code-sandbox-mcp`: the package's name as a command (what `uvx python-code-sandbox-mcp`
//! runs). It links nothing of the server: it replaces itself with the `python-code-sandbox`
//! binary installed beside it, arguments unchanged, so both names behave the same and the wheel
//! carries the server once.

use std::path::PathBuf;
use std::process::ExitCode;

const SERVER: &str = "python-code-sandbox";

fn main() -> ExitCode {
    let server = match beside_this_program() {
        Some(path) => path,
        None => {
            eprintln!(
                "python-code-sandbox-mcp: cannot find `{SERVER}` beside this program; reinstall \
                 the package (pip/uv/cargo install python-code-sandbox-mcp)"
            );
            return ExitCode::from(125);
        }
    };
    let mut command = std::process::Command::new(&server);
    command.args(std::env::args_os().skip(1));
    run(command, &server)
}

/// The server binary in this program's directory (symlinks to this program resolved first).
fn beside_this_program() -> Option<PathBuf> {
    let this = std::env::current_exe().ok()?;
    let this = this.canonicalize().unwrap_or(this);
    let server = this
        .parent()?
        .join(format!("{SERVER}{}", std::env::consts::EXE_SUFFIX));
    server.is_file().then_some(server)
}

#[cfg(unix)]
fn run(mut command: std::process::Command, server: &std::path::Path) -> ExitCode {
    use std::os::unix::process::CommandExt;
    // exec: same pid, same stdin/stdout (the MCP stdio transport), signals go to the server.
    let error = command.exec();
    eprintln!(
        "python-code-sandbox-mcp: cannot run {}: {error}",
        server.display()
    );
    ExitCode::from(125)
}

#[cfg(not(unix))]
fn run(mut command: std::process::Command, server: &std::path::Path) -> ExitCode {
    match command.status() {
        Ok(status) => ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(error) => {
            eprintln!(
                "python-code-sandbox-mcp: cannot run {}: {error}",
                server.display()
            );
            ExitCode::from(125)
        }
    }
}
