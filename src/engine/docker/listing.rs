//! Containers by label, read in part.
//!
//! bollard reads `GET /containers/json` into its full model, whose `State` is an enum of Docker's
//! states. Podman before 5.x (this machine's 4.3 among them) reports a container in passing as
//! `stopped` there (podman#28359), and one such container made the whole list unreadable: a server
//! could not find its own sandboxes at shutdown. The server needs only each container's id and
//! labels, so it reads those and nothing else, over the client's own transport (`get_text`).

use std::collections::BTreeMap;

use super::super::backend::{BackendError, SandboxId, SandboxRecord};

/// The query of `GET /containers/json` for every container (running or not) labelled
/// `label=value`.
pub(super) fn query(label: &str, value: &str) -> String {
    let filters = serde_json::json!({ "label": [format!("{label}={value}")] }).to_string();
    let filters =
        percent_encoding::utf8_percent_encode(&filters, percent_encoding::NON_ALPHANUMERIC);
    format!("/containers/json?all=true&filters={filters}")
}

/// The ids and labels of the engine's answer to [`query`].
pub(super) fn records(body: &str) -> Result<Vec<SandboxRecord>, BackendError> {
    #[derive(serde::Deserialize)]
    struct Summary {
        #[serde(rename = "Id")]
        id: String,
        #[serde(rename = "Labels", default)]
        labels: Option<BTreeMap<String, String>>,
    }
    let summaries: Vec<Summary> = serde_json::from_str(body).map_err(|e| {
        BackendError::Unexpected(format!(
            "the engine's list of containers could not be read: {e}"
        ))
    })?;
    Ok(summaries
        .into_iter()
        .map(|s| SandboxRecord {
            id: SandboxId(s.id),
            labels: s.labels.unwrap_or_default(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_filters_by_the_label_and_escapes_it() {
        let q = query("io.pcs.instance", "a b&c");
        assert!(q.starts_with("/containers/json?all=true&filters="));
        let encoded = q
            .rsplit_once("filters=")
            .map(|(_, f)| f)
            .unwrap_or_default();
        assert!(!encoded.contains(['&', ' ', '"', '{']), "{encoded}");
        let decoded = percent_encoding::percent_decode_str(encoded)
            .decode_utf8()
            .map(|s| s.to_string())
            .unwrap_or_default();
        assert_eq!(decoded, r#"{"label":["io.pcs.instance=a b&c"]}"#);
    }

    #[test]
    fn a_state_docker_does_not_know_is_not_read() {
        // Podman 4.3's answer for a container in passing: `"State": "stopped"`.
        let body = r#"[{"Id":"abc","State":"stopped","Labels":{"k":"v"},"Names":["/x"]},
                       {"Id":"def","State":"running","Labels":null}]"#;
        let records = records(body).expect("read");
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].id.0, "abc");
        assert_eq!(records[0].labels.get("k").map(String::as_str), Some("v"));
        assert!(records[1].labels.is_empty());
    }

    #[test]
    fn an_answer_that_is_not_a_list_is_an_error() {
        assert!(records(r#"{"message":"no"}"#).is_err());
    }
}
