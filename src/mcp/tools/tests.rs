//! What clients see of the tools: each has its description, filled from the configuration, and
//! its output schema.

use std::collections::HashMap;

use crate::config::Config;
use crate::mcp::descriptions::describe;
use crate::mcp::SandboxServer;

/// Every tool the server offers; each has a structured result, so each has an output schema.
const TOOLS: [&str; 16] = [
    "run_python",
    "run_python_ephemeral",
    "sandbox_exec",
    "sandbox_export_notebook",
    "sandbox_fork",
    "sandbox_initialize",
    "sandbox_list",
    "sandbox_list_files",
    "sandbox_read_file",
    "sandbox_run_notebook",
    "sandbox_snapshot",
    "sandbox_snapshot_delete",
    "sandbox_snapshots",
    "sandbox_stop",
    "sandbox_write_file",
    "search_pypi_packages",
];

fn config(pairs: &[(&str, &str)]) -> Config {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|name| map.get(name).cloned()).expect("a valid configuration")
}

fn described(config: &Config) -> Vec<rmcp::model::Tool> {
    let mut router = SandboxServer::tools();
    describe(&mut router, config);
    router.list_all()
}

#[test]
fn every_tool_has_a_filled_description_and_an_output_schema() {
    let with_saved_files = config(&[
        ("SANDBOX_FILES_DIR", "/srv/sandbox-files"),
        ("SANDBOX_ALLOWED_IMAGES", "python:3.12-slim"),
    ]);
    let without = config(&[("SANDBOX_FILES_DIR", "")]);
    for config in [with_saved_files, without] {
        let tools = described(&config);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, TOOLS);
        for tool in &tools {
            let description = tool.description.as_deref().unwrap_or_default();
            assert!(
                !description.trim().is_empty(),
                "{} has no description",
                tool.name
            );
            assert!(
                !description.contains('{') && !description.contains('}'),
                "{} has an unfilled placeholder: {description}",
                tool.name
            );
            let schema = tool.output_schema.as_ref();
            assert!(
                schema.is_some_and(|s| s.get("type").and_then(|t| t.as_str()) == Some("object")),
                "{} has no output schema",
                tool.name
            );
        }
    }
}

#[test]
fn descriptions_carry_the_live_configuration() {
    let tools = described(&config(&[
        ("SANDBOX_FILES_DIR", "/srv/sandbox-files"),
        ("SANDBOX_ALLOWED_IMAGES", "python:3.12-slim"),
    ]));
    let description = |name: &str| -> String {
        let tool = tools.iter().find(|t| t.name == name);
        tool.and_then(|t| t.description.as_deref())
            .unwrap_or_default()
            .to_string()
    };
    let ephemeral = description("run_python_ephemeral");
    assert!(ephemeral.contains("Limits per execution: "), "{ephemeral}");
    assert!(
        ephemeral.contains("under /srv/sandbox-files"),
        "{ephemeral}"
    );
    assert!(ephemeral.contains("python:3.12-slim"), "{ephemeral}");
    assert!(description("sandbox_stop").contains("under /srv/sandbox-files stay there"));
    assert!(description("sandbox_initialize").contains("sessions at once"));
}

#[test]
fn the_tools_that_run_code_name_the_secrets_it_may_use_and_no_value() {
    let dir = std::env::temp_dir().join(format!("pcs-described-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let file = dir.join("secrets.toml");
    std::fs::write(
        &file,
        "[[secret]]\nname = \"openai\"\nvalue_env = \"PCS_TEST_OPENAI\"\n\
         hosts = [\"api.openai.com\"]\nenv = \"OPENAI_API_KEY\"\n\n\
         [[secret]]\nname = \"anthropic\"\nvalue_env = \"PCS_TEST_ANTHROPIC\"\n\
         hosts = [\"api.anthropic.com\", \"*.anthropic.example:8443\"]\nheader = \"x-api-key\"\n\
         env = \"ANTHROPIC_API_KEY\"\n",
    )
    .expect("written");
    let path = file.display().to_string();
    let with_secrets = config(&[
        ("SANDBOX_NETWORK", "allowlist"),
        ("SANDBOX_SECRETS_FILE", &path),
        ("PCS_TEST_OPENAI", "sk-live-openai-value"),
        ("PCS_TEST_ANTHROPIC", "sk-ant-value"),
    ]);
    std::fs::remove_dir_all(&dir).expect("removed");
    let expected = "Secrets (the proxy adds each to requests to its hosts, over HTTPS; your code \
                    reads the variable, which holds a placeholder, and sends it as usual, e.g. as \
                    the SDK's API key; the real value never enters the sandbox): openai in \
                    $OPENAI_API_KEY for api.openai.com; anthropic in $ANTHROPIC_API_KEY for \
                    api.anthropic.com, *.anthropic.example:8443.";
    let runs_code = [
        "run_python_ephemeral",
        "run_python",
        "sandbox_exec",
        "sandbox_initialize",
        "sandbox_run_notebook",
    ];
    for tool in described(&with_secrets) {
        let description = tool.description.as_deref().unwrap_or_default();
        assert!(
            !description.contains("sk-live") && !description.contains("sk-ant"),
            "{}: {description}",
            tool.name
        );
        assert_eq!(
            description.contains(expected),
            runs_code.contains(&tool.name.as_ref()),
            "{}: {description}",
            tool.name
        );
    }
    for tool in described(&config(&[])) {
        let description = tool.description.as_deref().unwrap_or_default();
        assert!(!description.contains("Secrets"), "{}", tool.name);
    }

    // A principal's own set replaces the server's.
    let mut router = SandboxServer::tools();
    let own = crate::config::secrets::Secrets {
        entries: with_secrets.secrets.entries[1..].to_vec(),
        file: None,
    };
    crate::mcp::descriptions::describe_for(&mut router, &config(&[]), &own);
    let tools = router.list_all();
    let ephemeral = tools
        .iter()
        .find(|t| t.name == "run_python_ephemeral")
        .and_then(|t| t.description.as_deref())
        .unwrap_or_default();
    assert!(
        ephemeral.contains("as the SDK's API key; the real value never enters the sandbox): anthropic in $ANTHROPIC_API_KEY for api.anthropic.com, *.anthropic.example:8443."),
        "{ephemeral}"
    );
    assert!(!ephemeral.contains("openai"), "{ephemeral}");
}
