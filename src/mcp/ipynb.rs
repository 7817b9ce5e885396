//! Notebooks as files (`.ipynb`, nbformat 4): a session's cells written as one, and one read from
//! a client or the workspace to be run cell by cell, with papermill-style parameters.
//!
//! A notebook to run is untrusted input: bounded in bytes, cells and a cell's source, and checked
//! for the shape nbformat 4 gives it; what is wrong is named (the cell, the field). Its markdown
//! and raw cells, its metadata and every field this server does not write are kept as they came;
//! a code cell's outputs and execution count are replaced when it runs. Parameters are JSON
//! values written as Python literals (never evaluated here).

use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::engine::displays::is_json_mime;
use crate::engine::history::{self, Cell};
use crate::engine::outcome::Output;
use crate::mcp::notebook::bundle_json;
use crate::text::{bytes, count};

/// The MIME type of a notebook.
pub const MIME_TYPE: &str = "application/x-ipynb+json";
/// A notebook to run, at most: its JSON text, its cells, one cell's source.
pub const MAX_NOTEBOOK_BYTES: usize = 16 << 20;
pub const MAX_CELLS: usize = 1000;
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Parameters of one run, at most.
const MAX_PARAMETERS: usize = 200;
/// The nbformat minor version written (4.5: cells have ids).
const MINOR: u64 = 5;

/// What is wrong with a notebook or its parameters.
#[derive(Debug, thiserror::Error)]
pub enum NotebookError {
    #[error("the notebook is {} of JSON, more than the {} a run takes", bytes(*.0 as u64), bytes(MAX_NOTEBOOK_BYTES as u64))]
    TooLarge(usize),
    #[error("the notebook is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the notebook is not an nbformat notebook: {0}")]
    Shape(String),
    #[error("the notebook is nbformat {0}; only nbformat 4 notebooks run here (convert it with `jupyter nbconvert --to notebook`)")]
    Version(String),
    #[error("the notebook has {0} cells, more than the {MAX_CELLS} a run takes")]
    TooManyCells(usize),
    #[error("cell {index}: {problem}")]
    Cell { index: usize, problem: String },
    #[error("parameter `{name}`: {problem}")]
    Parameter { name: String, problem: String },
    #[error("{} parameters, more than the {MAX_PARAMETERS} a run takes", .0)]
    TooManyParameters(usize),
}

/// A notebook read from JSON: its top level without the cells, and the cells.
#[derive(Debug, Clone)]
pub struct Notebook {
    root: Map<String, Value>,
    cells: Vec<Map<String, Value>>,
}

/// One cell's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellType {
    Code,
    Markdown,
    Raw,
    /// A kind from a newer minor format than ours (nbformat's "unrecognized cell"): kept as it
    /// is, never run.
    Future,
}

/// A string or a list of strings (nbformat's `multiline_string`) as one string.
fn multiline(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts.iter().map(|p| p.as_str()).collect(),
        _ => None,
    }
}

/// nbformat's cell id: 1 to 64 letters, digits, `-` or `_`.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Notebook {
    /// Reads a notebook from untrusted JSON text (see the module's docs).
    pub fn parse(text: &str) -> Result<Notebook, NotebookError> {
        if text.len() > MAX_NOTEBOOK_BYTES {
            return Err(NotebookError::TooLarge(text.len()));
        }
        let value: Value = serde_json::from_str(text).map_err(NotebookError::NotJson)?;
        let Value::Object(mut root) = value else {
            return Err(NotebookError::Shape(
                "its top level is not a JSON object".into(),
            ));
        };
        match root.get("nbformat") {
            Some(Value::Number(n)) if n.as_u64() == Some(4) => {}
            Some(Value::Number(n)) => return Err(NotebookError::Version(n.to_string())),
            Some(_) => return Err(NotebookError::Shape("`nbformat` is not a number".into())),
            None => return Err(NotebookError::Shape("it has no `nbformat` field".into())),
        }
        let minor = match root.get("nbformat_minor") {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                NotebookError::Shape("`nbformat_minor` is not a whole number".into())
            })?,
            None => 0,
            Some(_) => {
                return Err(NotebookError::Shape(
                    "`nbformat_minor` is not a number".into(),
                ))
            }
        };
        if !matches!(root.get("metadata"), None | Some(Value::Object(_))) {
            return Err(NotebookError::Shape("`metadata` is not an object".into()));
        }
        let cells = match root.remove("cells") {
            Some(Value::Array(cells)) => cells,
            Some(_) => return Err(NotebookError::Shape("`cells` is not a list".into())),
            None => return Err(NotebookError::Shape("it has no `cells` list".into())),
        };
        if cells.len() > MAX_CELLS {
            return Err(NotebookError::TooManyCells(cells.len()));
        }
        let mut checked = Vec::with_capacity(cells.len());
        for (index, cell) in cells.into_iter().enumerate() {
            let problem = |problem: &str| NotebookError::Cell {
                index,
                problem: problem.to_string(),
            };
            let Value::Object(cell) = cell else {
                return Err(problem("it is not a JSON object"));
            };
            match cell.get("cell_type").and_then(Value::as_str) {
                Some("code" | "markdown" | "raw") => {}
                // As nbformat reads a notebook of a newer minor format than it knows: a cell of
                // an unknown kind is kept (with its metadata, whatever else it holds) and not run.
                Some(_) if minor > MINOR => {
                    if !matches!(cell.get("metadata"), Some(Value::Object(_))) {
                        return Err(problem(
                            "a cell of a kind this server does not know (from a newer format) \
                             has no `metadata` object",
                        ));
                    }
                    checked.push(cell);
                    continue;
                }
                Some(other) => {
                    return Err(problem(&format!(
                        "`cell_type` is {:?}; it must be code, markdown or raw (a notebook of \
                         nbformat 4.{minor}; kinds of cells from a newer format are kept only in \
                         a notebook that says it is newer than 4.{MINOR})",
                        crate::text::truncate_chars(other, 40)
                    )))
                }
                None => return Err(problem("it has no `cell_type` string")),
            }
            let source = cell
                .get("source")
                .ok_or_else(|| problem("it has no `source`"))?;
            let source = multiline(source)
                .ok_or_else(|| problem("`source` is not a string or a list of strings"))?;
            if source.len() > MAX_SOURCE_BYTES {
                return Err(problem(&format!(
                    "its source is {}, more than the {} a cell may have",
                    bytes(source.len() as u64),
                    bytes(MAX_SOURCE_BYTES as u64)
                )));
            }
            match cell.get("metadata") {
                None | Some(Value::Object(_)) => {}
                Some(_) => return Err(problem("`metadata` is not an object")),
            }
            match cell.get("metadata").and_then(|m| m.get("tags")) {
                None => {}
                Some(Value::Array(tags)) if tags.iter().all(Value::is_string) => {}
                Some(_) => return Err(problem("`metadata.tags` is not a list of strings")),
            }
            checked.push(cell);
        }
        let mut notebook = Notebook {
            root,
            cells: checked,
        };
        notebook.root.insert("nbformat".into(), 4.into());
        notebook
            .root
            .insert("nbformat_minor".into(), minor.max(MINOR).into());
        notebook.root.entry("metadata").or_insert(Map::new().into());
        notebook.give_ids();
        Ok(notebook)
    }

    /// Every cell gets a valid id unique in the notebook (kept when it has one), as nbformat 4.5
    /// wants.
    fn give_ids(&mut self) {
        let mut seen = std::collections::HashSet::new();
        let mut next = 0usize;
        for cell in self.cells.iter_mut() {
            let own = cell
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| valid_id(id) && !seen.contains(*id))
                .map(str::to_string);
            let id = own.unwrap_or_else(|| loop {
                next += 1;
                let id = format!("cell-{next}");
                if !seen.contains(&id) {
                    break id;
                }
            });
            seen.insert(id.clone());
            cell.insert("id".into(), id.into());
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn cell_type(&self, index: usize) -> CellType {
        match self.cells[index].get("cell_type").and_then(Value::as_str) {
            Some("code") => CellType::Code,
            Some("markdown") => CellType::Markdown,
            Some("raw") => CellType::Raw,
            _ => CellType::Future,
        }
    }

    /// A cell's source (checked to be text when parsed).
    pub fn source(&self, index: usize) -> String {
        self.cells[index]
            .get("source")
            .and_then(multiline)
            .unwrap_or_default()
    }

    pub fn has_tag(&self, index: usize, tag: &str) -> bool {
        self.cells[index]
            .get("metadata")
            .and_then(|m| m.get("tags"))
            .and_then(Value::as_array)
            .is_some_and(|tags| tags.iter().any(|t| t.as_str() == Some(tag)))
    }

    /// A code cell's outputs and count, replaced (a cell not run: none, and no count).
    pub fn set_outputs(&mut self, index: usize, outputs: &[Output], execution_count: Option<u64>) {
        let cell = &mut self.cells[index];
        cell.insert(
            "outputs".into(),
            outputs
                .iter()
                .filter_map(output_json)
                .collect::<Vec<_>>()
                .into(),
        );
        cell.insert(
            "execution_count".into(),
            execution_count.map_or(Value::Null, Value::from),
        );
    }

    /// Papermill's parameters: a code cell tagged `injected-parameters` that assigns each name
    /// its value as a Python literal, right after the cell tagged `parameters` (first when there
    /// is none); an injected cell already there is replaced. Returns the names, in order.
    pub fn inject_parameters(
        &mut self,
        parameters: &Map<String, Value>,
    ) -> Result<Vec<String>, NotebookError> {
        if parameters.len() > MAX_PARAMETERS {
            return Err(NotebookError::TooManyParameters(parameters.len()));
        }
        let mut source = String::from("# Parameters\n");
        for (name, value) in parameters {
            check_identifier(name)?;
            source.push_str(name);
            source.push_str(" = ");
            python_literal(value, &mut source);
            source.push('\n');
        }
        if source.len() > MAX_SOURCE_BYTES {
            return Err(NotebookError::Parameter {
                name: parameters.keys().next_back().cloned().unwrap_or_default(),
                problem: format!(
                    "the parameters' cell would be {}, more than the {} a cell may have",
                    bytes(source.len() as u64),
                    bytes(MAX_SOURCE_BYTES as u64)
                ),
            });
        }
        if let Some(old) = (0..self.len()).find(|&i| self.has_tag(i, "injected-parameters")) {
            self.cells.remove(old);
        }
        let at = (0..self.len())
            .find(|&i| self.has_tag(i, "parameters"))
            .map_or(0, |i| i + 1);
        let mut cell = Map::new();
        cell.insert("cell_type".into(), "code".into());
        cell.insert("execution_count".into(), Value::Null);
        let mut metadata = Map::new();
        metadata.insert("tags".into(), vec!["injected-parameters"].into());
        cell.insert("metadata".into(), metadata.into());
        cell.insert("outputs".into(), Vec::<Value>::new().into());
        cell.insert("source".into(), source.into());
        self.cells.insert(at, cell);
        self.give_ids();
        Ok(parameters.keys().cloned().collect())
    }

    /// The notebook as JSON text (one space of indent, as Jupyter writes it), written from the
    /// notebook in place (no copy of its cells).
    pub fn to_json(&self) -> String {
        pretty(self)
    }
}

impl Serialize for Notebook {
    /// The top level's fields with `cells` among them, in order, as one map of them would be.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.root.len() + 1))?;
        let mut cells = Some(&self.cells);
        for (key, value) in &self.root {
            if key.as_str() > "cells" {
                if let Some(cells) = cells.take() {
                    map.serialize_entry("cells", cells)?;
                }
            }
            if key != "cells" {
                map.serialize_entry(key, value)?;
            }
        }
        if let Some(cells) = cells {
            map.serialize_entry("cells", cells)?;
        }
        map.end()
    }
}

/// The notebook metadata this server writes: a Python 3 kernel.
fn python_metadata() -> Map<String, Value> {
    let value = serde_json::json!({
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {
            "name": "python",
            "file_extension": ".py",
            "mimetype": "text/x-python",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "pygments_lexer": "ipython3",
        },
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// A session's cells as a notebook's JSON text: one code cell per execution, in order, with its
/// count and outputs; a note first when older cells are no longer kept, and before a cell whose
/// outputs were too large to keep. Written as it is read from the cells, with nothing of them
/// copied into a tree of JSON values first: the text is the only thing of their size it makes
/// (what one JSON output's value parses to aside). The same text, to the byte, as a [`Notebook`]
/// built from the cells writes (`to_json`).
pub fn session_json<'a>(cells: impl IntoIterator<Item = &'a Cell>, dropped: u64) -> String {
    let notebook = SessionNotebook {
        cells: cells.into_iter().collect(),
        dropped,
    };
    pretty(&notebook)
}

/// JSON text as Jupyter writes it: one space of indent, a line break at the end.
fn pretty(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    match value.serialize(&mut serializer) {
        // serde_json writes UTF-8.
        Ok(()) => String::from_utf8(out).unwrap_or_default() + "\n",
        Err(_) => String::new(),
    }
}

/// A session's cells, to be written as a notebook ([`session_json`]). Maps are written with
/// their keys in order, as a `serde_json::Map` keeps them.
struct SessionNotebook<'a> {
    cells: Vec<&'a Cell>,
    dropped: u64,
}

impl Serialize for SessionNotebook<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("cells", &SessionCells(self))?;
        map.serialize_entry("metadata", &python_metadata())?;
        map.serialize_entry("nbformat", &4)?;
        map.serialize_entry("nbformat_minor", &MINOR)?;
        map.end()
    }
}

struct SessionCells<'a>(&'a SessionNotebook<'a>);

/// A markdown cell of this server's own (a note about what a notebook leaves out).
#[derive(Serialize)]
struct NoteCell {
    cell_type: &'static str,
    id: String,
    metadata: Map<String, Value>,
    source: String,
}

#[derive(Serialize)]
struct CodeCell<'a> {
    cell_type: &'static str,
    execution_count: Option<u64>,
    id: String,
    metadata: Map<String, Value>,
    outputs: Outputs<'a>,
    source: &'a str,
}

impl Serialize for SessionCells<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let SessionNotebook { cells, dropped } = self.0;
        let notes = usize::from(*dropped > 0) + cells.iter().filter(|c| c.outputs_left_out).count();
        let mut seq = serializer.serialize_seq(Some(cells.len() + notes))?;
        // Ids as `Notebook::give_ids` gives them to cells that have none.
        let mut next = 0usize;
        let mut id = || {
            next += 1;
            format!("cell-{next}")
        };
        let note = |id: String, source: String| NoteCell {
            cell_type: "markdown",
            id,
            metadata: Map::new(),
            source,
        };
        if *dropped > 0 {
            seq.serialize_element(&note(id(), dropped_note(*dropped)))?;
        }
        for cell in cells {
            if cell.outputs_left_out {
                seq.serialize_element(&note(id(), left_out_note()))?;
            }
            seq.serialize_element(&CodeCell {
                cell_type: "code",
                execution_count: cell.execution_count,
                id: id(),
                metadata: Map::new(),
                outputs: Outputs(&cell.outputs),
                source: &cell.code,
            })?;
        }
        seq.end()
    }
}

/// A cell's outputs as a saved notebook keeps them ([`output_json`]), written in place.
struct Outputs<'a>(&'a [Output]);

impl Serialize for Outputs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            self.0
                .iter()
                .filter(|o| !matches!(o, Output::UpdateDisplayData { .. }))
                .map(OutputRef),
        )
    }
}

struct OutputRef<'a>(&'a Output);

impl Serialize for OutputRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Output::Stream { name, text } => {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("name", name.as_str())?;
                map.serialize_entry("output_type", "stream")?;
                map.serialize_entry("text", text)?;
                map.end()
            }
            Output::DisplayData { data, metadata, .. } => {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("data", &BundleRef(data))?;
                map.serialize_entry("metadata", metadata)?;
                map.serialize_entry("output_type", "display_data")?;
                map.end()
            }
            Output::ExecuteResult {
                data,
                metadata,
                execution_count,
                ..
            } => {
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry("data", &BundleRef(data))?;
                map.serialize_entry("execution_count", execution_count)?;
                map.serialize_entry("metadata", metadata)?;
                map.serialize_entry("output_type", "execute_result")?;
                map.end()
            }
            Output::Error {
                ename,
                evalue,
                traceback,
            } => {
                let mut map = serializer.serialize_map(Some(4))?;
                map.serialize_entry("ename", ename)?;
                map.serialize_entry("evalue", evalue)?;
                map.serialize_entry("output_type", "error")?;
                map.serialize_entry("traceback", traceback)?;
                map.end()
            }
            // Not an output of its own: filtered out before.
            Output::UpdateDisplayData { .. } => serializer.serialize_unit(),
        }
    }
}

/// A MIME bundle as nbformat's `data` ([`bundle_json`]), written in place: by MIME type in order
/// (the last value of a type given twice), JSON types as JSON.
struct BundleRef<'a>(&'a [(String, String)]);

impl Serialize for BundleRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<&(String, String)> = self.0.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut map = serializer.serialize_map(None)?;
        for (i, (mime, value)) in entries.iter().map(|e| (&e.0, &e.1)).enumerate() {
            if entries.get(i + 1).is_some_and(|next| next.0 == *mime) {
                continue;
            }
            match is_json_mime(mime)
                .then(|| serde_json::from_str::<Value>(value).ok())
                .flatten()
            {
                Some(json) => map.serialize_entry(mime, &json)?,
                None => map.serialize_entry(mime, value)?,
            }
        }
        map.end()
    }
}

fn dropped_note(dropped: u64) -> String {
    format!(
        "*{} of this session {} not in this notebook: a session keeps its latest {} cells and \
         {} of their code and outputs.*",
        count(dropped, "earlier cell"),
        if dropped == 1 { "is" } else { "are" },
        history::MAX_CELLS,
        bytes(history::MAX_BYTES as u64)
    )
}

fn left_out_note() -> String {
    format!(
        "*The outputs of the next cell are not kept: alone they were more than the {} a \
         session keeps.*",
        bytes(history::MAX_BYTES as u64)
    )
}

/// One output as a saved notebook keeps it: without `transient` (a display's id is not saved);
/// an update of an earlier display is no output of its own (`None`).
pub fn output_json(output: &Output) -> Option<Value> {
    let mut map = Map::new();
    match output {
        Output::Stream { name, text } => {
            map.insert("output_type".into(), "stream".into());
            map.insert("name".into(), name.as_str().into());
            map.insert("text".into(), text.clone().into());
        }
        Output::DisplayData { data, metadata, .. } => {
            map.insert("output_type".into(), "display_data".into());
            map.insert("data".into(), bundle_json(data).into());
            map.insert("metadata".into(), metadata.clone().into());
        }
        Output::ExecuteResult {
            data,
            metadata,
            execution_count,
            ..
        } => {
            map.insert("output_type".into(), "execute_result".into());
            map.insert("data".into(), bundle_json(data).into());
            map.insert("metadata".into(), metadata.clone().into());
            map.insert("execution_count".into(), (*execution_count).into());
        }
        Output::Error {
            ename,
            evalue,
            traceback,
        } => {
            map.insert("output_type".into(), "error".into());
            map.insert("ename".into(), ename.clone().into());
            map.insert("evalue".into(), evalue.clone().into());
            map.insert("traceback".into(), traceback.clone().into());
        }
        Output::UpdateDisplayData { .. } => return None,
    }
    Some(map.into())
}

/// Python's hard keywords: not names a parameter may have.
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// A parameter's name: an ASCII Python identifier that is not a keyword.
fn check_identifier(name: &str) -> Result<(), NotebookError> {
    let refuse = |problem: &str| NotebookError::Parameter {
        name: crate::text::truncate_chars(name, 60)
            .escape_debug()
            .to_string(),
        problem: problem.to_string(),
    };
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.len() > 100 {
        return Err(refuse(
            "a name must be a Python identifier (ASCII letters, digits and `_`, not starting with \
             a digit, at most 100 characters)",
        ));
    }
    if KEYWORDS.contains(&name) {
        return Err(refuse("a name cannot be a Python keyword"));
    }
    Ok(())
}

/// A JSON value as the Python literal of the same value: `None`, `True`/`False`, numbers as JSON
/// writes them, strings quoted with every backslash, quote and control character escaped, lists
/// and dicts of those.
pub fn python_literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => python_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_literal(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_string(key, out);
                out.push_str(": ");
                python_literal(item, out);
            }
            out.push('}');
        }
    }
}

fn python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::history::Cells;
    use crate::engine::outcome::{Metadata, StreamName};

    /// JSON text of a tree of values, as the notebooks were written before they were streamed.
    fn pretty_value(value: &Value) -> String {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        value.serialize(&mut serializer).unwrap();
        String::from_utf8(out).unwrap() + "\n"
    }

    fn note_cell(text: String) -> Map<String, Value> {
        let mut cell = Map::new();
        cell.insert("cell_type".into(), "markdown".into());
        cell.insert("metadata".into(), Map::new().into());
        cell.insert("source".into(), text.into());
        cell
    }

    /// A session's notebook as a tree of JSON values: a `Notebook` built from the cells, as the
    /// export made it before it was written in place. The reference for [`session_json`].
    fn from_cells(cells: &Cells) -> Notebook {
        let mut out = Vec::new();
        if cells.dropped > 0 {
            out.push(note_cell(dropped_note(cells.dropped)));
        }
        for cell in &cells.cells {
            if cell.outputs_left_out {
                out.push(note_cell(left_out_note()));
            }
            let mut code = Map::new();
            code.insert("cell_type".into(), "code".into());
            code.insert("metadata".into(), Map::new().into());
            code.insert("source".into(), cell.code.clone().into());
            out.push(code);
        }
        let mut root = Map::new();
        root.insert("metadata".into(), python_metadata().into());
        root.insert("nbformat".into(), 4.into());
        root.insert("nbformat_minor".into(), MINOR.into());
        let mut notebook = Notebook { root, cells: out };
        notebook.give_ids();
        let code_cells: Vec<usize> = (0..notebook.len())
            .filter(|&i| notebook.cell_type(i) == CellType::Code)
            .collect();
        for (index, cell) in code_cells.into_iter().zip(&cells.cells) {
            notebook.set_outputs(index, &cell.outputs, cell.execution_count);
        }
        notebook
    }

    /// The tree of a notebook, as `to_json` wrote it before it wrote the notebook in place.
    fn tree_json(notebook: &Notebook) -> String {
        let mut root = notebook.root.clone();
        root.insert(
            "cells".into(),
            notebook.cells.iter().cloned().map(Value::Object).collect(),
        );
        pretty_value(&Value::Object(root))
    }

    fn bundle(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(m, v)| (m.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_session_is_written_in_place_to_the_byte_as_its_tree_of_values_was() {
        let metadata =
            serde_json::json!({"zeta": [1, 2.5, {"b": null, "a": "é\u{1}"}], "alpha": {"w": 3}});
        let outputs = vec![
            Output::Stream {
                name: StreamName::Stdout,
                text: "line \"quoted\"\n\ttab\n".into(),
            },
            Output::DisplayData {
                data: bundle(&[
                    ("text/plain", "<obj>"),
                    ("text/html", "<b>x</b>"),
                    (
                        "application/vnd.x+json",
                        "{\"k\": [1, {\"z\": 1, \"a\": 2}], \"f\": 1.0}",
                    ),
                    ("application/json", "not json after all"),
                    ("image/png", "iVBORw0KGgo="),
                ]),
                metadata: metadata.as_object().unwrap().clone(),
                display_id: Some("shown".into()),
            },
            Output::UpdateDisplayData {
                data: bundle(&[("text/plain", "gone")]),
                metadata: Metadata::new(),
                display_id: "earlier".into(),
            },
            Output::ExecuteResult {
                data: bundle(&[("text/plain", "42"), ("text/markdown", "**42**")]),
                metadata: Metadata::new(),
                execution_count: 7,
                display_id: None,
            },
            Output::Stream {
                name: StreamName::Stderr,
                text: String::new(),
            },
            Output::Error {
                ename: "ValueError".into(),
                evalue: "bad".into(),
                traceback: vec![
                    "Traceback".into(),
                    "\u{1b}[31mValueError\u{1b}[0m: bad".into(),
                ],
            },
        ];
        let cell = |code: &str, outputs: Vec<Output>, count, left_out| Cell {
            code: code.into(),
            outputs,
            execution_count: count,
            outputs_left_out: left_out,
        };
        for dropped in [0, 1, 12] {
            let cells = Cells {
                cells: vec![
                    cell("x = 1\nx", outputs.clone(), Some(7), false),
                    cell("   ", vec![], None, false),
                    cell("big()", vec![], Some(8), true),
                    cell("", outputs[3..4].to_vec(), Some(9), false),
                ],
                dropped,
            };
            let streamed = session_json(&cells.cells, cells.dropped);
            assert_eq!(
                streamed,
                tree_json(&from_cells(&cells)),
                "dropped: {dropped}"
            );
            assert_eq!(streamed, from_cells(&cells).to_json());
        }
        let empty = Cells::default();
        assert_eq!(
            session_json(&empty.cells, 0),
            tree_json(&from_cells(&empty))
        );
        assert!(session_json(&empty.cells, 0).contains("\"cells\": [],"));
    }

    #[test]
    fn a_notebook_read_is_written_in_place_with_its_own_fields_in_order() {
        let text = r#"{"nbformat": 4, "nbformat_minor": 4, "a_first": [1], "metadata": {"m": 1},
            "zz_last": {"y": true}, "cells": [{"cell_type": "code", "source": "1", "metadata": {}},
            {"cell_type": "markdown", "source": ["a", "b"], "id": "mine", "attachments": {}}]}"#;
        let mut notebook = Notebook::parse(text).unwrap();
        notebook.set_outputs(
            0,
            &[Output::Stream {
                name: StreamName::Stdout,
                text: "1\n".into(),
            }],
            Some(1),
        );
        assert_eq!(notebook.to_json(), tree_json(&notebook));
        let json: Value = serde_json::from_str(&notebook.to_json()).unwrap();
        assert_eq!(json["zz_last"]["y"], true);
        assert_eq!(json["cells"][1]["id"], "mine");
    }

    fn problem(text: &str) -> String {
        Notebook::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_malformed_notebook_is_refused_naming_what_is_wrong() {
        assert!(problem("{").starts_with("the notebook is not valid JSON: "));
        assert_eq!(
            problem("[]"),
            "the notebook is not an nbformat notebook: its top level is not a JSON object"
        );
        assert!(
            problem(r#"{"nbformat": 3, "cells": []}"#).starts_with("the notebook is nbformat 3;")
        );
        assert_eq!(
            problem(r#"{"nbformat": 4, "nbformat_minor": 2, "cells": {}}"#),
            "the notebook is not an nbformat notebook: `cells` is not a list"
        );
        assert_eq!(
            problem(
                r#"{"nbformat": 4, "cells": [{"cell_type": "code", "source": "x"}, {"cell_type": "code", "source": 1}]}"#
            ),
            "cell 1: `source` is not a string or a list of strings"
        );
        assert_eq!(
            problem(r#"{"nbformat": 4, "cells": [{"cell_type": "heading", "source": ""}]}"#),
            "cell 0: `cell_type` is \"heading\"; it must be code, markdown or raw (a notebook \
             of nbformat 4.0; kinds of cells from a newer format are kept only in a notebook \
             that says it is newer than 4.5)"
        );
        assert_eq!(
            problem(
                r#"{"nbformat": 4, "nbformat_minor": 99, "cells": [{"cell_type": "future cell"}]}"#
            ),
            "cell 0: a cell of a kind this server does not know (from a newer format) has no \
             `metadata` object"
        );
        assert_eq!(
            problem(
                r#"{"nbformat": 4, "cells": [{"cell_type": "code", "source": "", "metadata": {"tags": "parameters"}}]}"#
            ),
            "cell 0: `metadata.tags` is not a list of strings"
        );
        let many = format!(
            r#"{{"nbformat": 4, "cells": [{}]}}"#,
            vec![r#"{"cell_type": "raw", "source": ""}"#; MAX_CELLS + 1].join(",")
        );
        assert!(problem(&many).starts_with("the notebook has 1001 cells"));
        let big = format!(
            r#"{{"nbformat": 4, "cells": [{{"cell_type": "code", "source": "{}"}}]}}"#,
            "x".repeat(MAX_SOURCE_BYTES + 1)
        );
        assert!(problem(&big).starts_with("cell 0: its source is "));
    }

    #[test]
    fn cells_keep_what_they_had_and_get_unique_ids() {
        let text = r##"{"nbformat": 4, "nbformat_minor": 2, "metadata": {"x": 1}, "cells": [
            {"cell_type": "markdown", "source": ["# T", "itle"], "metadata": {}, "attachments": {}},
            {"cell_type": "code", "id": "a", "source": "1", "metadata": {}, "outputs": [], "execution_count": null},
            {"cell_type": "code", "id": "a", "source": "2", "metadata": {}, "outputs": [], "execution_count": null}]}"##;
        let mut notebook = Notebook::parse(text).unwrap();
        assert_eq!(notebook.source(0), "# Title");
        notebook.set_outputs(
            1,
            &[Output::Stream {
                name: StreamName::Stdout,
                text: "1\n".into(),
            }],
            Some(1),
        );
        let json: Value = serde_json::from_str(&notebook.to_json()).unwrap();
        assert_eq!(json["nbformat_minor"], 5);
        assert_eq!(json["metadata"]["x"], 1);
        assert_eq!(json["cells"][0]["attachments"], serde_json::json!({}));
        let ids: Vec<&str> = (0..3)
            .map(|i| json["cells"][i]["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["cell-1", "a", "cell-2"]);
        assert_eq!(
            json["cells"][1]["outputs"],
            serde_json::json!([{"output_type": "stream", "name": "stdout", "text": "1\n"}])
        );
        assert_eq!(json["cells"][1]["execution_count"], 1);
    }

    #[test]
    fn a_newer_formats_cells_of_unknown_kinds_are_kept_and_not_run() {
        // nbformat's own test notebook of a future minor format has such a cell and output.
        let text = r##"{"nbformat": 4, "nbformat_minor": 99, "metadata": {}, "cells": [
            {"cell_type": "future cell", "metadata": {}, "future_field": [1, "x"]},
            {"cell_type": "code", "source": "1", "metadata": {}, "outputs": [{"output_type": "future output", "x": 1}], "execution_count": null}]}"##;
        let notebook = Notebook::parse(text).unwrap();
        assert_eq!(notebook.cell_type(0), CellType::Future);
        assert_eq!(notebook.cell_type(1), CellType::Code);
        assert_eq!(notebook.source(0), "");
        let json: Value = serde_json::from_str(&notebook.to_json()).unwrap();
        assert_eq!(json["nbformat_minor"], 99);
        assert_eq!(json["cells"][0]["cell_type"], "future cell");
        assert_eq!(
            json["cells"][0]["future_field"],
            serde_json::json!([1, "x"])
        );
        assert!(json["cells"][0]["id"].is_string());
    }

    #[test]
    fn parameters_are_python_literals_after_the_parameters_cell() {
        let text = r#"{"nbformat": 4, "nbformat_minor": 5, "cells": [
            {"cell_type": "code", "id": "one", "source": "import os", "metadata": {}},
            {"cell_type": "code", "id": "p", "source": "alpha = 0", "metadata": {"tags": ["parameters"]}},
            {"cell_type": "code", "id": "old", "source": "alpha = 9", "metadata": {"tags": ["injected-parameters"]}}]}"#;
        let mut notebook = Notebook::parse(text).unwrap();
        let parameters = serde_json::json!({
            "alpha": 0.5, "name": "a\"b\\c\n\u{0}'", "flags": [true, false, null],
            "nested": {"k": [1, {"x": "y"}]}, "big": 12345678901234567890u64
        });
        let names = notebook
            .inject_parameters(parameters.as_object().unwrap())
            .unwrap();
        assert_eq!(names.len(), 5);
        assert_eq!(notebook.len(), 3, "the old injected cell is replaced");
        assert!(notebook.has_tag(2, "injected-parameters"));
        let source = notebook.source(2);
        assert!(source.starts_with("# Parameters\n"));
        assert!(source.contains("alpha = 0.5\n"));
        assert!(source.contains(r#"name = "a\"b\\c\n\u0000'""#), "{source}");
        assert!(source.contains("flags = [True, False, None]\n"));
        assert!(source.contains(r#"nested = {"k": [1, {"x": "y"}]}"#));
        assert!(source.contains("big = 12345678901234567890\n"));
        for bad in ["1x", "class", "a-b", "", "é"] {
            let mut map = Map::new();
            map.insert(bad.into(), 1.into());
            let error = notebook.inject_parameters(&map).unwrap_err().to_string();
            assert!(error.starts_with("parameter `"), "{error}");
        }
        // No `parameters` cell: first.
        let mut plain =
            Notebook::parse(r#"{"nbformat": 4, "cells": [{"cell_type": "code", "source": "x"}]}"#)
                .unwrap();
        let mut map = Map::new();
        map.insert("x".into(), 1.into());
        plain.inject_parameters(&map).unwrap();
        assert!(plain.has_tag(0, "injected-parameters"));
    }

    #[test]
    fn a_session_becomes_a_notebook_without_transient_ids_and_with_its_notes() {
        let cells = Cells {
            cells: vec![
                Cell {
                    code: "display(1, display_id='d')".into(),
                    outputs: vec![Output::DisplayData {
                        data: vec![
                            ("text/plain".into(), "1".into()),
                            ("application/vnd.x+json".into(), "{\"a\": 1}".into()),
                        ],
                        metadata: Metadata::new(),
                        display_id: Some("d".into()),
                    }],
                    execution_count: Some(1),
                    outputs_left_out: false,
                },
                Cell {
                    code: "big".into(),
                    outputs: vec![],
                    execution_count: Some(2),
                    outputs_left_out: true,
                },
            ],
            dropped: 3,
        };
        let json: Value = serde_json::from_str(&session_json(&cells.cells, cells.dropped)).unwrap();
        let kinds: Vec<&str> = json["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["cell_type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["markdown", "code", "markdown", "code"]);
        assert!(json["cells"][0]["source"]
            .as_str()
            .unwrap()
            .starts_with("*3 earlier cells of this session are not in this notebook"));
        let display = &json["cells"][1]["outputs"][0];
        assert_eq!(display["output_type"], "display_data");
        assert!(display.get("transient").is_none());
        assert_eq!(display["data"]["application/vnd.x+json"]["a"], 1);
        assert_eq!(json["cells"][3]["execution_count"], 2);
        assert_eq!(json["metadata"]["kernelspec"]["name"], "python3");
        assert_eq!(
            (json["nbformat"].as_u64(), json["nbformat_minor"].as_u64()),
            (Some(4), Some(5))
        );
    }
}
