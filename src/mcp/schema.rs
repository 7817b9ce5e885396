//! Tool schemas as standard JSON Schema 2020-12.
//!
//! schemars describes Rust's number types with formats of its own (`uint64`, `uint`, `int32`,
//! `double`), which 2020-12 does not define: validators warn about them on every call. The range
//! they imply is already stated with `minimum` where it matters, so they are removed; formats
//! the standard defines are kept.

use serde_json::{Map, Value};

/// The `format` values JSON Schema 2020-12 defines (validation vocabulary, section 7.3).
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Removes every non-standard `format` from a schema, in place, at any depth.
pub fn standardize(schema: &mut Map<String, Value>) {
    let non_standard = schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| !STANDARD_FORMATS.contains(&f));
    if non_standard {
        schema.remove("format");
    }
    for value in schema.values_mut() {
        standardize_value(value);
    }
}

fn standardize_value(value: &mut Value) {
    match value {
        Value::Object(map) => standardize(map),
        Value::Array(items) => items.iter_mut().for_each(standardize_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_standard_formats_remain_at_any_depth() {
        let mut schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "properties": {
                "size": {"type": "integer", "format": "uint64", "minimum": 0},
                "cpus": {"type": "number", "format": "double"},
                "when": {"type": "string", "format": "date-time"},
                "items": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                "format": {"type": "string"}
            },
            "$defs": {"X": {"anyOf": [{"type": "integer", "format": "uint"}, {"type": "null"}]}}
        });
        standardize(schema.as_object_mut().unwrap());
        assert_eq!(
            schema,
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "properties": {
                    "size": {"type": "integer", "minimum": 0},
                    "cpus": {"type": "number"},
                    "when": {"type": "string", "format": "date-time"},
                    "items": {"type": "array", "items": {"type": "integer"}},
                    "format": {"type": "string"}
                },
                "$defs": {"X": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}
            })
        );
    }
}
