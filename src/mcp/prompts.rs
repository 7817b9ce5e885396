//! MCP prompts: ready-made requests a person picks in the client (a slash command or a menu
//! entry) to get the model to use the sandbox well.
//!
//! One prompt today, `run-python`: a task in plain words becomes a request to solve it by
//! running code here, with the habits that make the tools work well (a session for multi-step
//! work, dependencies through the tool rather than pip, figures and files that come back).

use rmcp::model::{
    CompleteResult, GetPromptResult, ListPromptsResult, Prompt, PromptArgument, PromptMessage, Role,
};
use rmcp::ErrorData;

pub const RUN_PYTHON: &str = "run-python";

pub fn list() -> ListPromptsResult {
    ListPromptsResult::with_all_items(vec![Prompt::new(
        RUN_PYTHON,
        Some("Solve a task by writing Python and running it in a disposable, isolated sandbox."),
        Some(vec![
            PromptArgument::new("task")
                .with_title("Task")
                .with_description("What the code should do, in plain words")
                .with_required(true),
            PromptArgument::new("packages")
                .with_title("PyPI packages")
                .with_description("Packages the code may need, comma-separated (optional)"),
        ]),
    )
    .with_title("Run Python in a sandbox")])
}

/// The prompt's messages for the given arguments; unknown prompts and a missing task are
/// invalid parameters.
pub fn get(
    name: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<GetPromptResult, ErrorData> {
    if name != RUN_PYTHON {
        return Err(ErrorData::invalid_params(
            format!("no prompt named {name:?}; this server has {RUN_PYTHON}"),
            None,
        ));
    }
    let argument = |key: &str| {
        arguments
            .and_then(|a| a.get(key))
            .and_then(|v| v.as_str())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let Some(task) = argument("task") else {
        return Err(ErrorData::invalid_params(
            format!("{RUN_PYTHON} needs the argument `task`: what the code should do"),
            None,
        ));
    };
    let packages = match argument("packages") {
        Some(list) => format!(
            " Pass the packages it needs in the tool's `dependencies` argument ({list}); they are \
             installed outside the sandbox, which has no network."
        ),
        None => " If it needs PyPI packages, pass them in the tool's `dependencies` argument \
                 (the sandbox has no network, so pip inside it cannot download)."
            .to_string(),
    };
    let text = format!(
        "Do this by writing Python and running it with the python-code-sandbox tools: {task}\n\n\
         Use run_python_ephemeral for a one-off script; for work in several steps, start a session \
         with sandbox_initialize and use run_python, which keeps variables and files between \
         calls, then sandbox_stop it.{packages} Files the code writes in /workspace, and \
         matplotlib figures, come back with the result. Read the output before answering, and fix \
         and re-run the code if it failed."
    );
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description(format!("Run Python in a sandbox: {task}")),
    )
}

/// Completion of a prompt's argument: the prompt must exist; its arguments are free text, so
/// nothing is offered.
pub fn complete(name: &str) -> Result<CompleteResult, ErrorData> {
    if name != RUN_PYTHON {
        return Err(ErrorData::invalid_params(
            format!("no prompt named {name:?}; this server has {RUN_PYTHON}"),
            None,
        ));
    }
    Ok(CompleteResult::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_task_is_required_and_packages_are_optional() {
        let args = json!({"task": "plot a sine wave", "packages": "matplotlib, numpy"});
        let result = get(RUN_PYTHON, args.as_object()).unwrap();
        let text = serde_json::to_string(&result.messages).unwrap();
        assert!(
            text.contains("plot a sine wave") && text.contains("matplotlib, numpy"),
            "{text}"
        );
        assert!(get(RUN_PYTHON, json!({"task": "  "}).as_object()).is_err());
        assert!(get(RUN_PYTHON, None).is_err());
        assert!(get("test_prompt_with_arguments", args.as_object()).is_err());
        assert!(complete(RUN_PYTHON).is_ok());
        assert!(complete("nope").is_err());
    }
}
