use std::path::Path;

use super::*;

const KEY: &str = "sk-live-0123456789abcdef";

fn env(name: &str) -> Option<String> {
    match name {
        "OPENAI_KEY" => Some(KEY.to_string()),
        "ANTHROPIC_KEY" => Some("sk-ant-xyz".to_string()),
        "SPACED" => Some(format!("{KEY} ")),
        "EMPTY" => Some(String::new()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Secrets, SecretsError> {
    Secrets::parse(text, Path::new("/etc/pcs/secrets.toml"), &env)
}

const TWO: &str = r#"
[[secret]]
name = "openai"
value_env = "OPENAI_KEY"
hosts = ["API.OpenAI.com", "*.openai.example:8443"]
env = "OPENAI_API_KEY"

[[secret]]
name = "anthropic"
value_env = "ANTHROPIC_KEY"
hosts = ["api.anthropic.com"]
header = "x-api-key"
env = "ANTHROPIC_API_KEY"
"#;

#[test]
fn a_file_declares_secrets_with_their_defaults() {
    let secrets = parse(TWO).unwrap();
    let [openai, anthropic] = &secrets.entries[..] else {
        panic!("two secrets: {secrets:?}");
    };
    assert_eq!(openai.name, "openai");
    assert_eq!(openai.value.expose(), KEY);
    assert_eq!(openai.header, "Authorization");
    assert_eq!(openai.format, "Bearer {value}");
    assert_eq!(openai.hosts_text(), "api.openai.com, *.openai.example:8443");
    assert!(openai.binds("api.openai.com", 443));
    assert!(openai.binds("eu.openai.example", 8443));
    assert_eq!(
        anthropic.format, "{value}",
        "not Authorization: the value alone"
    );
    assert_eq!(anthropic.header_value(), "sk-ant-xyz");
    assert_eq!(
        secrets
            .bound("api.anthropic.com", 443)
            .map(|s| s.name.as_str()),
        Some("anthropic")
    );
    let summary = secrets.summary().unwrap();
    assert!(summary.starts_with("2 secrets brokered at the egress from /etc/pcs/secrets.toml: openai ($OPENAI_API_KEY, header Authorization, for api.openai.com, *.openai.example:8443); anthropic"), "{summary}");
    assert!(!summary.contains(KEY) && !summary.contains("sk-ant"));
    assert_eq!(Secrets::default().summary(), None);
}

#[test]
fn a_value_file_is_read_once_without_its_trailing_newline() {
    let dir = std::env::temp_dir().join(format!("pcs-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let value = dir.join("key");
    std::fs::write(&value, format!("{KEY}\r\n")).unwrap();
    let file = dir.join("secrets.toml");
    let text = format!(
        "[[secret]]\nname = \"f\"\nvalue_file = \"{}\"\nhosts = [\"api.example.com\"]\nenv = \"F_KEY\"\n",
        value.display()
    );
    std::fs::write(&file, &text).unwrap();
    let secrets = Secrets::load(&file, &env).unwrap();
    assert_eq!(secrets.entries[0].value.expose(), KEY);
    assert_eq!(secrets.file.as_deref(), Some(file.as_path()));

    std::fs::write(&value, format!("{KEY} with words\n")).unwrap();
    let e = Secrets::load(&file, &env).unwrap_err();
    assert!(
        e.to_string().contains("character 25 of 35 is a space"),
        "{e}"
    );
    assert!(!e.to_string().contains(KEY), "{e}");

    std::fs::write(&value, "x".repeat(MAX_VALUE_BYTES + 10)).unwrap();
    let e = Secrets::load(&file, &env).unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");

    let e = Secrets::load(&dir, &env).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
    let e = Secrets::load(&file, &env).unwrap_err();
    assert!(
        e.to_string().contains("cannot be read") && e.source.is_some(),
        "{e}"
    );
}

/// One `[[secret]]` with `field = value` replacing (or, new, added to) a valid one.
fn with(field: &str, value: &str) -> String {
    let mut fields = vec![
        ("name", "\"llm\"".to_string()),
        ("value_env", "\"OPENAI_KEY\"".to_string()),
        ("hosts", "[\"api.example.com\"]".to_string()),
        ("env", "\"LLM_KEY\"".to_string()),
    ];
    fields.retain(|(f, _)| *f != field);
    if !value.is_empty() {
        fields.push((field, value.to_string()));
    }
    let body: Vec<String> = fields.iter().map(|(f, v)| format!("{f} = {v}")).collect();
    format!("[[secret]]\n{}\n", body.join("\n"))
}

#[test]
fn each_refusal_names_the_entry_and_the_field_and_never_the_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("name", "\"Open AI\"", "field `name`: 1 to 64"),
        ("name", "", "field `name`: missing"),
        ("colour", "\"red\"", "unknown field `colour`"),
        (
            "value",
            "\"sk-live-0123456789abcdef\"",
            "a value is never written in this file",
        ),
        ("value_env", "", "field `value_env`: missing"),
        ("value_env", "\"NOT_SET\"", "$NOT_SET is unset or empty"),
        ("value_env", "\"EMPTY\"", "$EMPTY is unset or empty"),
        ("value_env", "\"SPACED\"", "character 25 of 25 is a space"),
        ("value_env", "\"bad-name\"", "a variable name"),
        ("value_file", "\"relative/key\"", "both given"),
        ("hosts", "", "field `hosts`: missing"),
        ("hosts", "[]", "empty"),
        ("hosts", "\"api.example.com\"", "an array of strings"),
        ("hosts", "[\"93.184.216.34\"]", "is an IP address"),
        ("hosts", "[\"[2001:db8::1]:443\"]", "is an IP address"),
        ("hosts", "[\"api.example.com:0\"]", "the port is 1 to 65535"),
        (
            "hosts",
            "[\"api.example.com:70000\"]",
            "the port is 1 to 65535",
        ),
        ("hosts", "[\"*.com\"]", "at least two labels"),
        ("hosts", "[\"*\"]", "to every host"),
        ("hosts", "[\"a.*.example.com\"]", "as a whole first label"),
        ("hosts", "[\"bad_host!.com\"]", "labels are made of"),
        (
            "hosts",
            "[\"a.example.com\", \"A.example.com.\"]",
            "listed twice",
        ),
        ("header", "\"Host\"", "frames or routes"),
        ("header", "\"proxy-authorization\"", "frames or routes"),
        ("header", "\"Cookie\"", "frames or routes"),
        ("header", "\"X-Api Key\"", "a header name"),
        ("format", "\"Bearer\"", "exactly one {value}"),
        ("format", "\"{value} {value}\"", "exactly one {value}"),
        (
            "format",
            "\"Bearer \\\"{value}\\\"\"",
            "visible ASCII and spaces only",
        ),
        ("format", "\" {value}\"", "no space at the start"),
        ("env", "\"PATH\"", "is set by the server"),
        ("env", "\"LD_PRELOAD\"", "is set by the server"),
        ("env", "\"PYTHONPATH\"", "is set by the server"),
        ("env", "\"Https_Proxy\"", "is set by the server"),
        ("env", "\"SSL_CERT_FILE\"", "is set by the server"),
        ("env", "\"PCS_IPYTHON\"", "is set by the server"),
        ("env", "\"1KEY\"", "a variable name"),
        ("env", "7", "a string is expected, not a integer"),
    ];
    for (field, value, expected) in cases {
        let mut text = with(field, value);
        if *field == "value_file" {
            text = text.replace("name = ", &format!("{field} = {value}\nname = "));
            text = text.replacen(&format!("\n{field} = {value}\n"), "\n", 1);
        }
        let e = parse(&text).unwrap_err();
        let message = e.to_string();
        assert!(
            message.starts_with("/etc/pcs/secrets.toml: [[secret]] #1"),
            "{field}={value}: {message}"
        );
        assert!(message.contains(expected), "{field}={value}: {message}");
        assert!(!message.contains(KEY), "{field}={value}: {message}");
    }
    // The name once it is valid.
    let e = parse(&with("env", "\"HOME\"")).unwrap_err();
    assert!(
        e.to_string()
            .contains("[[secret]] #1 (name \"llm\"), field `env`: HOME is set"),
        "{e}"
    );
}

#[test]
fn the_file_as_a_whole_is_checked() {
    for (text, expected) in [
        ("", "no [[secret]] table"),
        ("secret = 3", "`secret` is a integer"),
        ("[secret]\nname = \"x\"", "`secret` is a table"),
        ("title = \"x\"", "unknown key `title`"),
        (
            "[[secret]]\nname = \"sk-live-0123456789abcdef",
            "not valid TOML, line 2",
        ),
        ("sk-live-0123456789abcdef\n", "not valid TOML, line 1"),
    ] {
        let message = parse(text).unwrap_err().to_string();
        assert!(message.contains(expected), "{text}: {message}");
        assert!(!message.contains(KEY), "{text}: {message}");
    }
}

#[test]
fn secrets_are_unique_in_name_variable_and_host() {
    let second = |field: &str, value: &str| {
        let other = with("name", "\"other\"")
            .replace("LLM_KEY", "OTHER_KEY")
            .replace("api.example.com", "other.example.com");
        let other = if field == "name" {
            other.replace("\"other\"", value)
        } else {
            let mut lines: Vec<String> = other
                .lines()
                .filter(|l| !l.starts_with(&format!("{field} =")))
                .map(String::from)
                .collect();
            lines.push(format!("{field} = {value}"));
            lines.join("\n") + "\n"
        };
        format!(
            "{}\n{other}",
            with("hosts", "[\"api.example.com\", \"*.cdn.example.com\"]")
        )
    };
    assert!(parse(&second("hosts", "[\"api.example.com:8443\"]")).is_ok());
    for (field, value, expected) in [
        (
            "name",
            "\"llm\"",
            "[[secret]] #2 (name \"llm\"), field `name`: secret #1 has the same name",
        ),
        (
            "env",
            "\"LLM_KEY\"",
            "field `env`: secret #1 (\"llm\") sets $LLM_KEY too",
        ),
        (
            "hosts",
            "[\"API.example.com\"]",
            "field `hosts`: api.example.com overlaps api.example.com, bound to secret #1",
        ),
        (
            "hosts",
            "[\"a.cdn.example.com\"]",
            "a.cdn.example.com overlaps *.cdn.example.com",
        ),
        (
            "hosts",
            "[\"*.example.com\"]",
            "*.example.com overlaps api.example.com",
        ),
    ] {
        let message = parse(&second(field, value)).unwrap_err().to_string();
        assert!(message.contains(expected), "{field}={value}: {message}");
    }
}

#[test]
fn a_value_never_prints_itself() {
    let value = SecretValue::new("sk-live-123".into());
    assert_eq!(format!("{value} {value:?}"), "[redacted] [redacted]");
    let secret = Secret {
        name: "llm".into(),
        value,
        hosts: vec![BoundHost {
            pattern: "api.example.test".into(),
            port: 443,
        }],
        header: "Authorization".into(),
        format: "Bearer {value}".into(),
        env: "LLM_API_KEY".into(),
    };
    assert!(!format!("{secret:?}").contains("sk-live"));
    assert_eq!(secret.header_value(), "Bearer sk-live-123");
}

#[test]
fn a_bound_host_is_its_name_and_port_or_a_name_below_a_wildcard() {
    let exact = BoundHost {
        pattern: "api.example.test".into(),
        port: 443,
    };
    assert!(exact.matches("API.example.test.", 443));
    assert!(!exact.matches("api.example.test", 8443));
    assert!(!exact.matches("xapi.example.test", 443));
    let wild = BoundHost {
        pattern: "*.example.test".into(),
        port: 443,
    };
    assert!(wild.matches("a.example.test", 443));
    assert!(wild.matches("a.b.example.test", 443));
    assert!(!wild.matches("example.test", 443));
    assert!(!wild.matches("evilexample.test", 443));
    assert_eq!(wild.to_string(), "*.example.test");
}
