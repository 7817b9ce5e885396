//! Tool descriptions carry the limits in force. Each handler's `#[tool(description = ...)]` holds
//! its own text, with `{placeholders}` for the parts that come from the live configuration; they
//! are filled here, once per server, from one table of fragments shared by the tools.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;

use super::schema;
use crate::config::secrets::Secrets;
use crate::config::{Config, NetworkPolicy, RootsMode};
use crate::text::{bytes, duration};

/// The limits of one execution, as a sentence (descriptions and `sandbox_list`).
pub fn limits_line(config: &Config) -> String {
    let network = match config.network {
        NetworkPolicy::None => "no network access".to_string(),
        NetworkPolicy::Bridge => "network access".to_string(),
        NetworkPolicy::Allowlist => {
            "network access only to allowed hosts, through a proxy".to_string()
        }
    };
    format!(
        "Limits per execution: {} wall clock, {} memory, {} CPU(s), {} processes, output kept to {} \
         (a longer stream's first and last lines, saying what was dropped between; the result \
         shows at most {} characters of it, head and tail, and says where the whole is), \
         {network}.",
        duration(config.limits.timeout),
        bytes(config.limits.memory_bytes),
        config.limits.cpus,
        config.limits.pids,
        bytes(config.limits.max_output_bytes),
        config.limits.model_output_chars,
    )
}

/// What the model is told of the secrets its code may use: each one's name, variable and hosts,
/// never a value; empty without secrets (run tools' descriptions and `sandbox_initialize`).
pub fn secrets_line(secrets: &Secrets) -> String {
    if secrets.is_empty() {
        return String::new();
    }
    let each: Vec<String> = secrets
        .entries
        .iter()
        .map(|s| format!("{} in ${} for {}", s.name, s.env, s.hosts_text()))
        .collect();
    format!(
        "Secrets (the proxy adds each to requests to its hosts, over HTTPS; your code reads the \
         variable, which holds a placeholder, and sends it as usual, e.g. as the SDK's API key; \
         the real value never enters the sandbox): {}.",
        each.join("; ")
    )
}

/// The fragments a description can name as `{name}`, from the live configuration and the
/// secrets of the client it is for.
fn fragments(config: &Config, secrets: &Secrets) -> Vec<(&'static str, String)> {
    let sessions = &config.sessions;
    let session_policy = format!(
        "At most {} sessions at once; a session unused for {} is stopped, and every session ends {} after it started.",
        sessions.max_sessions,
        duration(sessions.idle_timeout),
        duration(sessions.max_lifetime)
    );
    let images = if config.allowed_images.is_empty() {
        format!("Optional `image`: only {} is available.", config.image)
    } else {
        format!(
            "Optional `image`: {} (default) or one matching {}.",
            config.image,
            config.allowed_images.join(", ")
        )
    };
    let retention = format!(
        "kept {}, and the oldest removed first beyond {} in total",
        duration(config.files.max_age),
        bytes(config.files.max_saved_bytes)
    );
    let returned =
        "Files the code creates or changes in /workspace come back: images (and matplotlib \
                    figures, shown inline as in Jupyter) as images, other files as resources, up to";
    let return_max = bytes(config.files.return_max_file_bytes);
    let (files, stopped) = match &config.files.persist_dir {
        Some(dir) => (
            format!(
                "{returned} {return_max} each; every file is also saved on the server's host under {} \
                 ({retention}).",
                dir.display()
            ),
            format!(
                "its variables and /workspace are gone. Files its executions already saved on the host \
                 under {} stay there (the paths results gave keep working; {retention}).",
                dir.display()
            ),
        ),
        None => (
            format!("{returned} {return_max} each."),
            "its variables and /workspace files are gone (nothing is saved on the host).".to_string(),
        ),
    };
    let snapshots = &config.snapshots;
    let snapshot_policy = match &snapshots.dir {
        Some(_) => format!(
            "Snapshots are kept {} (at most {} per user, each at most {}, the oldest going first; the server keeps {} of everyone's in all, and refuses a new one that does not fit even in place of your older ones){}.",
            duration(snapshots.ttl),
            snapshots.max_count,
            bytes(snapshots.max_size),
            bytes(snapshots.max_total),
            if snapshots.on_expiry {
                "; a session that expires is saved as a snapshot first, and the error on its id names it"
            } else {
                ""
            }
        ),
        None => "Snapshots are turned off on this server.".to_string(),
    };
    let roots = match config.roots.mode {
        RootsMode::Off => String::new(),
        RootsMode::ReadOnly => "The user's own directories (the client's MCP roots) are mounted \
             read-only at /mnt/roots/<name> in each new sandbox (sandbox_initialize's result lists \
             them; a session keeps those it started with)."
            .to_string(),
        RootsMode::ReadWrite => "The user's own directories (the client's MCP roots) are mounted \
             read-write at /mnt/roots/<name> in each new sandbox (sandbox_initialize's result lists \
             them; a session keeps those it started with): what the code writes there changes the \
             user's files, and is listed in `files` with its place on the host."
            .to_string(),
    };
    let fork_roots = if config.roots.mode.is_on() {
        "The copy mounts the roots the original mounts (/mnt/roots/<name>), not the client's \
         current ones."
    } else {
        ""
    };
    vec![
        ("secrets", secrets_line(secrets)),
        ("roots", roots),
        ("fork_roots", fork_roots.to_string()),
        ("snapshot_policy", snapshot_policy),
        ("limits", limits_line(config)),
        ("session_policy", session_policy),
        ("images", images),
        ("files", files),
        ("stopped", stopped),
        ("max_file_bytes", bytes(config.files.max_file_bytes)),
        ("return_max_file_bytes", return_max),
    ]
}

/// `template` with every `{name}` of a known fragment replaced by its text, in one pass (so a
/// fragment's own text, such as a path, is never read as a placeholder); anything else is kept.
fn fill(template: &str, fragments: &[(&'static str, String)]) -> String {
    let mut filled = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        filled.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let known = after.find('}').and_then(|close| {
            let name = &after[..close];
            fragments
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, text)| (text, close))
        });
        match known {
            Some((text, close)) => {
                filled.push_str(text);
                rest = &after[close + 1..];
            }
            None => {
                filled.push('{');
                rest = after;
            }
        }
    }
    filled.push_str(rest);
    filled
}

/// Fills each tool's description from the live configuration, and puts its input and output
/// schemas in the form every client reads ([`schema::standardize`]). The secrets named are the
/// server's (`SANDBOX_SECRETS_FILE`); see [`describe_for`].
pub fn describe<S>(router: &mut ToolRouter<S>, config: &Config) {
    describe_for(router, config, &config.secrets)
}

/// [`describe`], naming `secrets`: a principal's own set over HTTP.
pub fn describe_for<S>(router: &mut ToolRouter<S>, config: &Config, secrets: &Secrets) {
    let fragments = fragments(config, secrets);
    for route in router.map.values_mut() {
        if let Some(template) = route.attr.description.take() {
            // A fragment that is empty in this configuration (roots off) leaves no gap.
            let filled = fill(&template, &fragments).replace("  ", " ");
            route.attr.description = Some(Cow::Owned(filled.trim_end().to_string()));
        }
        schema::standardize(Arc::make_mut(&mut route.attr.input_schema));
        if let Some(output) = route.attr.output_schema.as_mut() {
            schema::standardize(Arc::make_mut(output));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_once_and_unknown_ones_kept() {
        let fragments = vec![("dir", "/srv/{dir}".to_string()), ("n", "3".to_string())];
        assert_eq!(
            fill("under {dir}, {n} times {x} {", &fragments),
            "under /srv/{dir}, 3 times {x} {"
        );
        assert_eq!(fill("no braces", &fragments), "no braces");
    }
}
