//! A `pip` command line the code asked for from inside the sandbox (`%pip install seaborn`,
//! `!pip list`, `pip show x` from its shell), parsed and validated before anything is done with
//! it. The line is untrusted: what it may ask is a small subset of pip's commands, and every
//! requirement is validated exactly like a request's `dependencies` ([`parse_requirement`]), so
//! options, URLs, paths and shell syntax are refused with the entry named.
//!
//! A word wholly inside single or double quotes is read as the shell would (`"numpy<2"` is the
//! requirement `numpy<2`); `<` and `>` outside quotes would be redirections in a shell and are
//! refused, as are `;|&$`, backquotes, backslashes, parentheses, control characters and quotes
//! anywhere else.

use super::requirement::{parse_requirement, DependencyError, Requirement};

/// The longest line accepted, in bytes.
pub const MAX_LINE_BYTES: usize = 4096;

/// What the line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipCommand {
    /// `install REQ...`: validated requirements, in the order given.
    Install(Vec<Requirement>),
    /// `uninstall NAME...` (`-y` accepted): normalized project names.
    Uninstall(Vec<String>),
    /// `list` (`freeze` too).
    List,
    /// `show NAME...`: normalized project names.
    Show(Vec<String>),
}

/// Why a line was refused; the text is shown to the code's reader as pip's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipRefusal {
    #[error("no pip command given; supported: {SUPPORTED}")]
    Empty,
    #[error("the pip command line is {size} bytes, over the limit of {MAX_LINE_BYTES}")]
    TooLong { size: usize },
    #[error(
        "{entry:?} has shell syntax ({what}): pip here takes plain requirements, each as one \
         word (quote one with `<` or `>` whole: \"numpy<2\")"
    )]
    ShellSyntax { entry: String, what: &'static str },
    #[error(
        "the option {entry:?} is not supported: packages come from the server's configured \
         index, and `pip install` takes only requirements (name, extras, version specifiers)"
    )]
    Option { entry: String },
    #[error("{0}")]
    Requirement(String),
    #[error("`pip {command}` takes {what}")]
    Arguments {
        command: &'static str,
        what: &'static str,
    },
    #[error("`pip {command}` is not supported here; supported: {SUPPORTED}")]
    Unsupported { command: String },
}

const SUPPORTED: &str = "install REQ..., uninstall NAME..., list, show NAME...";

/// Parses `line`, the text after `pip` (`install seaborn==0.13`). `allow_urls` is the operator's
/// setting for `dependencies` (`name @ url`; such a reference needs quotes here, being several
/// words).
pub fn parse_pip_line(line: &str, allow_urls: bool) -> Result<PipCommand, PipRefusal> {
    if line.len() > MAX_LINE_BYTES {
        return Err(PipRefusal::TooLong { size: line.len() });
    }
    let words = words(line)?;
    let Some((command, rest)) = words.split_first() else {
        return Err(PipRefusal::Empty);
    };
    if command.text.starts_with('-') {
        return Err(PipRefusal::Option {
            entry: shown(&command.text),
        });
    }
    match command.text.as_str() {
        "install" => {
            let mut requirements = Vec::new();
            for word in rest {
                if word.text.starts_with('-') {
                    if QUIET.contains(&word.text.as_str()) {
                        continue; // pip's output is short here anyway
                    }
                    return Err(PipRefusal::Option {
                        entry: shown(&word.text),
                    });
                }
                requirements.push(requirement(&word.text, allow_urls)?);
            }
            if requirements.is_empty() {
                return Err(PipRefusal::Arguments {
                    command: "install",
                    what: "one or more requirements (`pip install seaborn==0.13`)",
                });
            }
            Ok(PipCommand::Install(requirements))
        }
        "uninstall" => {
            let names = names(rest, "uninstall", &["-y", "--yes"])?;
            Ok(PipCommand::Uninstall(names))
        }
        "show" => Ok(PipCommand::Show(names(rest, "show", &[])?)),
        "list" | "freeze" => match rest.first() {
            None => Ok(PipCommand::List),
            Some(word) if word.text.starts_with('-') => Err(PipRefusal::Option {
                entry: shown(&word.text),
            }),
            Some(_) => Err(PipRefusal::Arguments {
                command: "list",
                what: "no arguments",
            }),
        },
        other => Err(PipRefusal::Unsupported {
            command: shown(other),
        }),
    }
}

/// `install` options that change only how much pip prints: accepted, and ignored.
const QUIET: &[&str] = &["-q", "-qq", "-qqq", "--quiet"];

fn requirement(word: &str, allow_urls: bool) -> Result<Requirement, PipRefusal> {
    parse_requirement(word, allow_urls).map_err(|e| match e {
        DependencyError::Invalid { entry, reason } => {
            PipRefusal::Requirement(format!("invalid requirement {entry:?}: {reason}"))
        }
        other => PipRefusal::Requirement(other.to_string()),
    })
}

/// Project names (`uninstall`, `show`): at least one, each a bare name.
fn names(
    words: &[Word],
    command: &'static str,
    accepted: &[&str],
) -> Result<Vec<String>, PipRefusal> {
    let mut names = Vec::new();
    for word in words {
        if word.text.starts_with('-') {
            if accepted.contains(&word.text.as_str()) {
                continue;
            }
            return Err(PipRefusal::Option {
                entry: shown(&word.text),
            });
        }
        let requirement = requirement(&word.text, false)?;
        if !requirement.specifier.is_empty()
            || !requirement.extras.is_empty()
            || requirement.marker.is_some()
        {
            return Err(PipRefusal::Arguments {
                command,
                what: "project names only (no versions, extras or markers)",
            });
        }
        names.push(requirement.normalized);
    }
    if names.is_empty() {
        return Err(PipRefusal::Arguments {
            command,
            what: "one or more project names",
        });
    }
    Ok(names)
}

/// One word of the line, its quotes removed.
struct Word {
    text: String,
}

/// A word as a refusal names it: bounded.
fn shown(word: &str) -> String {
    crate::text::truncate_chars(word, 100)
}

/// What a character is in a shell, when it is syntax there (outside quotes).
fn shell_meaning(c: char) -> Option<&'static str> {
    Some(match c {
        ';' => "`;` ends a command",
        '|' => "`|` is a pipe",
        '&' => "`&` runs in the background or joins commands",
        '$' => "`$` expands a variable or a command",
        '`' => "a backquote runs a command",
        '\\' => "a backslash escapes",
        '(' | ')' => "parentheses group commands",
        '<' | '>' => "`<` and `>` redirect (quote the requirement whole: \"numpy<2\")",
        '\'' | '"' => "a quote inside a word",
        '\n' | '\r' => "a newline ends a command",
        c if c.is_control() => "a control character",
        _ => return None,
    })
}

/// Splits the line into words at spaces and tabs. A word may be wholly quoted (`"x<2"`, `'x'`);
/// inside quotes only `<`, `>` and spaces lose their meaning, everything else that is shell
/// syntax is refused there too.
fn words(line: &str) -> Result<Vec<Word>, PipRefusal> {
    let mut words = Vec::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    // The raw text of the word being read, for the refusal to name it.
    let raw_word = |start: usize| -> String {
        let end = chars[start..]
            .iter()
            .position(|c| *c == ' ' || *c == '\t')
            .map_or(chars.len(), |p| start + p);
        chars[start..end].iter().collect()
    };
    while i < chars.len() {
        let c = chars[i];
        if c == ' ' || c == '\t' {
            i += 1;
            continue;
        }
        let start = i;
        if c == '\'' || c == '"' {
            let quote = c;
            let close = chars[i + 1..].iter().position(|d| *d == quote);
            let Some(close) = close.map(|p| i + 1 + p) else {
                return Err(PipRefusal::ShellSyntax {
                    entry: shown(&chars[start..].iter().collect::<String>()),
                    what: "an unclosed quote",
                });
            };
            let inner: String = chars[i + 1..close].iter().collect();
            let after = chars.get(close + 1);
            if after.is_some_and(|d| *d != ' ' && *d != '\t') {
                return Err(PipRefusal::ShellSyntax {
                    entry: shown(&raw_word(start)),
                    what: "a quote inside a word",
                });
            }
            if let Some(what) = inner
                .chars()
                .filter(|d| !matches!(d, '<' | '>' | ' '))
                .find_map(shell_meaning)
            {
                return Err(PipRefusal::ShellSyntax {
                    entry: shown(&format!("{quote}{inner}{quote}")),
                    what,
                });
            }
            words.push(Word {
                text: inner.trim().to_string(),
            });
            i = close + 1;
            continue;
        }
        let mut text = String::new();
        while i < chars.len() && chars[i] != ' ' && chars[i] != '\t' {
            if let Some(what) = shell_meaning(chars[i]) {
                return Err(PipRefusal::ShellSyntax {
                    entry: shown(&raw_word(start)),
                    what,
                });
            }
            text.push(chars[i]);
            i += 1;
        }
        words.push(Word { text });
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<PipCommand, PipRefusal> {
        parse_pip_line(line, false)
    }

    fn installed(line: &str) -> Vec<String> {
        match parse(line) {
            Ok(PipCommand::Install(r)) => r.iter().map(Requirement::canonical).collect(),
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn install_takes_requirements_validated_like_dependencies() {
        assert_eq!(
            installed("install seaborn==0.13  Six"),
            ["seaborn==0.13", "six"]
        );
        assert_eq!(
            installed("install -q \"numpy<2\" 'a[x]>=1'"),
            ["numpy<2", "a[x]>=1"]
        );
        assert_eq!(installed("  install\tcowsay  "), ["cowsay"]);
    }

    #[test]
    fn shell_syntax_is_refused_naming_the_word() {
        for (line, entry) in [
            ("install x; rm -rf /", "x;"),
            ("install x|y", "x|y"),
            ("install x&&y", "x&&y"),
            ("install $(id)", "$(id)"),
            ("install `id`", "`id`"),
            ("install x>1", "x>1"),
            ("install a\\b", "a\\b"),
            ("install x\ny", "x\ny"),
            ("install 'x;y'", "'x;y'"),
            ("install \"x\"y", "\"x\"y"),
            ("install \"x", "\"x"),
        ] {
            match parse(line) {
                Err(e @ PipRefusal::ShellSyntax { .. }) => {
                    let PipRefusal::ShellSyntax { entry: got, .. } = &e else {
                        unreachable!()
                    };
                    assert_eq!(got, entry, "{line:?}");
                    assert!(e.to_string().contains(&format!("{entry:?}")), "{e}");
                }
                other => panic!("{line:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn options_urls_and_paths_are_refused_naming_the_entry() {
        for option in [
            "-U",
            "--upgrade",
            "--index-url=https://evil.example/simple",
            "-r",
            "-e",
            "--target=/tmp",
        ] {
            let e = parse(&format!("install {option} x")).unwrap_err();
            assert!(
                matches!(&e, PipRefusal::Option { entry } if entry == option),
                "{option}: {e:?}"
            );
            assert!(e.to_string().contains(option));
        }
        for entry in [
            "https://example.com/x-1.0-py3-none-any.whl",
            "./local",
            "/tmp/x.whl",
            "x-1.0.tar.gz",
            "git+https://github.com/a/b",
        ] {
            let e = parse(&format!("install {entry}")).unwrap_err();
            assert!(matches!(e, PipRefusal::Requirement(_)), "{entry}: {e:?}");
            assert!(e.to_string().contains(entry), "{entry}: {e}");
        }
    }

    #[test]
    fn the_other_commands_take_names_or_nothing() {
        assert_eq!(parse("list"), Ok(PipCommand::List));
        assert_eq!(parse("freeze"), Ok(PipCommand::List));
        assert!(matches!(
            parse("list --outdated"),
            Err(PipRefusal::Option { .. })
        ));
        assert_eq!(
            parse("uninstall -y Seaborn six"),
            Ok(PipCommand::Uninstall(vec!["seaborn".into(), "six".into()]))
        );
        assert_eq!(parse("show x_y"), Ok(PipCommand::Show(vec!["x-y".into()])));
        assert!(matches!(
            parse("show x==1"),
            Err(PipRefusal::Arguments { .. })
        ));
        assert!(matches!(
            parse("install"),
            Err(PipRefusal::Arguments { .. })
        ));
        assert!(matches!(
            parse("install -q"),
            Err(PipRefusal::Arguments { .. })
        ));
        assert_eq!(parse("   "), Err(PipRefusal::Empty));
        let e = parse("download x").unwrap_err();
        assert!(
            e.to_string().contains("`pip download` is not supported"),
            "{e}"
        );
        assert!(e.to_string().contains("install REQ..."), "{e}");
        assert!(matches!(parse("--version"), Err(PipRefusal::Option { .. })));
    }

    #[test]
    fn a_long_line_is_refused_before_it_is_read() {
        let line = format!("install {}", "a".repeat(MAX_LINE_BYTES));
        assert_eq!(parse(&line), Err(PipRefusal::TooLong { size: line.len() }));
    }
}
