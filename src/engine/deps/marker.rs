//! Environment markers (`python_version < "3.12"`): a safe subset of PEP 508, validated by a
//! small recursive-descent parser and re-serialized with normalized whitespace and quotes.
//! Tested through `requirement::parse_requirement`.

use super::requirement::VERSION_OPERATORS;

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
pub(super) fn parse_marker(marker: &str) -> Result<String, String> {
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
