//! Turning an installer's output into a short error an agent can act on.

use crate::text::truncate_chars;

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
    truncate_chars(&kept.join("\n"), SUMMARY_MAX_CHARS)
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
        // pip's words about the connection itself (a certificate, a refused connection).
        "Could not fetch URL",
        "after connection broken by",
    ];
    let trimmed = line.trim_start();
    trimmed.starts_with("ERROR:")
        || trimmed.starts_with("error:")
        || MARKERS.iter().any(|marker| line.contains(marker))
}

/// Removes ANSI escape sequences (CSI `ESC [ ... final`, and lone `ESC x`).
pub fn strip_ansi(text: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
