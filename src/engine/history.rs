//! A session's executed cells, as a notebook keeps them: for each Python execution its code, what
//! it showed (the outputs whole, before any reader's budget cuts them) and its execution count.
//!
//! An update of a display an earlier call showed (`Output::UpdateDisplayData`) is applied to the
//! earlier cells' displays with that id, as a Jupyter frontend does, and is not kept as an output
//! of its own; a new display (or value) with an id is applied to them too, and kept. The history is bounded in cells and bytes: the oldest cells go first, and how many
//! went is kept so that a notebook made from it can say so.

use std::collections::VecDeque;

use super::outcome::{Execution, Metadata, MimeBundle, Output};

/// Cells a session keeps, at most.
pub const MAX_CELLS: usize = 500;
/// Bytes of memory a session's cells take, at most: their code and outputs as the heap holds them
/// (every string, display ids and metadata included, and the structure around them; [`size_of`]).
pub const MAX_BYTES: usize = 4 << 20;

/// One executed cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub code: String,
    /// Streams, displays (with their ids, updates applied), the value and the error, in order.
    pub outputs: Vec<Output>,
    /// The interpreter's count for this execution (`In [n]`); `None` for code that was only
    /// whitespace, which IPython does not count.
    pub execution_count: Option<u64>,
    /// The outputs were left out: alone they were over the history's bytes.
    pub outputs_left_out: bool,
}

/// What a history holds at one moment: its cells, oldest first, and how many older ones went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cells {
    pub cells: Vec<Cell>,
    /// Cells dropped over the bounds, before the first one here.
    pub dropped: u64,
}

/// The cells of one session.
#[derive(Debug, Default)]
pub struct History {
    cells: VecDeque<(Cell, usize)>,
    bytes: usize,
    dropped: u64,
    /// The count of the last execution of the interpreter now running (0: none yet).
    counter: u64,
}

/// Bytes of memory a cell takes, as the heap holds it: its slot in the history, the blocks of its
/// code and of its outputs' list, and for each output every string it keeps (stream text, MIME
/// types and values, display ids, metadata keys and values, traceback lines), its lists and its
/// metadata's map nodes, each block counted as the allocator gives it ([`block`]). An estimate
/// from above of what the cell costs, not a measurement: the history's bound holds for what a
/// session really keeps.
fn size_of(cell: &Cell) -> usize {
    std::mem::size_of::<(Cell, usize)>()
        + string(&cell.code)
        + list(&cell.outputs)
        + cell.outputs.iter().map(output_bytes).sum::<usize>()
}

/// The heap an output holds beyond its own slot (which its cell's list counts).
fn output_bytes(output: &Output) -> usize {
    match output {
        Output::Stream { text, .. } => string(text),
        Output::Error {
            ename,
            evalue,
            traceback,
        } => {
            string(ename)
                + string(evalue)
                + list(traceback)
                + traceback.iter().map(string).sum::<usize>()
        }
        Output::DisplayData {
            data,
            metadata,
            display_id,
        }
        | Output::ExecuteResult {
            data,
            metadata,
            display_id,
            ..
        } => bundle_bytes(data) + map_bytes(metadata) + display_id.as_ref().map_or(0, string),
        Output::UpdateDisplayData {
            data,
            metadata,
            display_id,
        } => bundle_bytes(data) + map_bytes(metadata) + string(display_id),
    }
}

fn bundle_bytes(bundle: &MimeBundle) -> usize {
    list(bundle)
        + bundle
            .iter()
            .map(|(m, v)| string(m) + string(v))
            .sum::<usize>()
}

/// Entries of a map node (`std`'s B-tree: 11 at most, 5 at least but in the root) and the size of
/// an inner node (its entries, the links to its children and its own fields): every node is
/// counted as an inner one.
const NODE_ENTRIES: usize = 11;
const NODE_BYTES: usize = NODE_ENTRIES
    * (std::mem::size_of::<String>() + std::mem::size_of::<serde_json::Value>())
    + (NODE_ENTRIES + 1) * std::mem::size_of::<usize>()
    + 16;

/// A JSON object's heap (metadata): its nodes, and its keys' and values' own heap.
fn map_bytes(map: &Metadata) -> usize {
    let nodes = if map.is_empty() {
        0
    } else {
        1 + map.len() / (NODE_ENTRIES / 2)
    };
    nodes * block(NODE_BYTES)
        + map
            .iter()
            .map(|(k, v)| string(k) + value_bytes(v))
            .sum::<usize>()
}

fn value_bytes(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::String(s) => string(s),
        serde_json::Value::Array(items) => {
            list(items) + items.iter().map(value_bytes).sum::<usize>()
        }
        serde_json::Value::Object(map) => map_bytes(map),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => 0,
    }
}

/// A string's block (its capacity, not its length).
fn string(s: &String) -> usize {
    block(s.capacity())
}

/// A list's block (its capacity in slots).
fn list<T>(items: &Vec<T>) -> usize {
    block(items.capacity() * std::mem::size_of::<T>())
}

/// What the allocator takes for a block of `n` bytes, as glibc's malloc does: a header of 8 bytes,
/// rounded up to 16, at least 32; no block for none.
fn block(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n.saturating_add(8 + 15) / 16 * 16).max(32)
    }
}

impl History {
    /// Records one Python execution of `code`; returns its execution count.
    pub fn record(&mut self, code: &str, execution: &Execution) -> Option<u64> {
        let mut outputs = super::displays::own_outputs(&execution.outputs, |id, data, metadata| {
            self.update_display(id, data, metadata)
        });
        let value_count = outputs.iter().find_map(|o| match o {
            Output::ExecuteResult {
                execution_count, ..
            } => Some(*execution_count),
            _ => None,
        });
        let execution_count = if code.trim().is_empty() {
            None
        } else {
            // The shell's own count when the runner said it; else the value's, else the next.
            execution
                .execution_count
                .or(value_count.filter(|n| *n > 0))
                .or(Some(self.counter + 1))
        };
        if let Some(n) = execution_count {
            self.counter = n;
        }
        if execution.state_lost || execution.workspace_lost {
            // A new interpreter counts from the start.
            self.counter = 0;
        }
        outputs.shrink_to_fit();
        let mut cell = Cell {
            code: code.to_string(),
            outputs,
            execution_count,
            outputs_left_out: false,
        };
        let mut size = size_of(&cell);
        if size > MAX_BYTES {
            // Dropped with their block: a cleared list would keep it.
            cell.outputs = Vec::new();
            cell.outputs_left_out = true;
            if cell.code.len() > MAX_BYTES / 2 {
                cell.code = crate::text::truncate_chars(&cell.code, MAX_BYTES / 8);
            }
            size = size_of(&cell);
        }
        self.cells.push_back((cell, size));
        self.bytes += size;
        while self.cells.len() > MAX_CELLS || self.bytes > MAX_BYTES {
            let Some((_, gone)) = self.cells.pop_front() else {
                break;
            };
            self.bytes -= gone;
            self.dropped += 1;
        }
        execution_count
    }

    /// Applies an update to every earlier display with the id (the byte count follows).
    fn update_display(&mut self, id: &str, data: &MimeBundle, metadata: &Metadata) {
        for (cell, size) in self.cells.iter_mut() {
            let mut changed = false;
            for output in cell.outputs.iter_mut() {
                changed |= output.update(id, data, metadata);
            }
            if changed {
                let new = size_of(cell);
                self.bytes = self.bytes - *size + new;
                *size = new;
            }
        }
        while self.bytes > MAX_BYTES && self.cells.len() > 1 {
            if let Some((_, gone)) = self.cells.pop_front() {
                self.bytes -= gone;
                self.dropped += 1;
            }
        }
    }

    /// The cells now, oldest first, in place (a notebook is written from them without a copy).
    pub fn iter(&self) -> impl Iterator<Item = &Cell> {
        self.cells.iter().map(|(cell, _)| cell)
    }

    /// Cells kept now.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Cells dropped over the bounds, before the first one kept.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The cells now, oldest first: a copy of them all.
    pub fn cells(&self) -> Cells {
        Cells {
            cells: self.cells.iter().map(|(cell, _)| cell.clone()).collect(),
            dropped: self.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::outcome::{Metadata, StreamName};

    fn plain(text: &str) -> Vec<(String, String)> {
        vec![("text/plain".into(), text.into())]
    }

    fn shown(outputs: Vec<Output>) -> Execution {
        Execution {
            outputs,
            ..Default::default()
        }
    }

    fn display(text: &str, id: &str) -> Output {
        Output::DisplayData {
            data: plain(text),
            metadata: Metadata::new(),
            display_id: Some(id.into()),
        }
    }

    #[test]
    fn a_later_update_changes_the_earlier_display_and_is_not_kept() {
        let mut history = History::default();
        history.record(
            "h = display('a', display_id='d')",
            &shown(vec![display("a", "d")]),
        );
        history.record(
            "h.update('b')",
            &shown(vec![Output::UpdateDisplayData {
                data: plain("b"),
                metadata: Metadata::new(),
                display_id: "d".into(),
            }]),
        );
        let cells = history.cells();
        assert_eq!(cells.cells[0].outputs, vec![display("b", "d")]);
        assert!(cells.cells[1].outputs.is_empty());
        let counts: Vec<_> = cells.cells.iter().map(|c| c.execution_count).collect();
        assert_eq!(counts, [Some(1), Some(2)]);
    }

    #[test]
    fn a_later_display_with_the_id_changes_the_earlier_ones_and_is_kept() {
        let mut history = History::default();
        history.record("show(1, 'd')", &shown(vec![display("1", "d")]));
        let value = Output::ExecuteResult {
            data: plain("v"),
            metadata: Metadata::new(),
            execution_count: 2,
            display_id: Some("r".into()),
        };
        history.record(
            "show(2, 'd'); result('v', 'r')",
            &shown(vec![display("2", "d"), value]),
        );
        history.record(
            "update('r')",
            &shown(vec![Output::UpdateDisplayData {
                data: plain("w"),
                metadata: Metadata::new(),
                display_id: "r".into(),
            }]),
        );
        let cells = history.cells().cells;
        assert_eq!(cells[0].outputs, vec![display("2", "d")]);
        assert_eq!(cells[1].outputs[0], display("2", "d"));
        assert_eq!(plain_of(&cells[1].outputs[1]), "w");
        assert!(cells[2].outputs.is_empty());
    }

    fn plain_of(output: &Output) -> &str {
        output.bundle().map_or("", |b| b[0].1.as_str())
    }

    #[test]
    fn counts_follow_the_interpreter_whitespace_is_not_counted_and_a_restart_starts_again() {
        let mut history = History::default();
        history.record("x = 1", &shown(vec![]));
        history.record("  \n", &shown(vec![]));
        history.record(
            "x",
            &shown(vec![Output::ExecuteResult {
                data: plain("1"),
                metadata: Metadata::new(),
                execution_count: 7,
                display_id: None,
            }]),
        );
        history.record(
            "while True: pass",
            &Execution {
                state_lost: true,
                ..Default::default()
            },
        );
        history.record("y = 2", &shown(vec![]));
        let counts: Vec<_> = history
            .cells()
            .cells
            .iter()
            .map(|c| c.execution_count)
            .collect();
        assert_eq!(counts, [Some(1), None, Some(7), Some(8), Some(1)]);
    }

    #[test]
    fn the_oldest_cells_go_over_the_bounds_and_are_counted() {
        let mut history = History::default();
        for i in 0..MAX_CELLS + 3 {
            history.record(&format!("print({i})"), &shown(vec![]));
        }
        let cells = history.cells();
        assert_eq!(cells.cells.len(), MAX_CELLS);
        assert_eq!(cells.dropped, 3);
        assert_eq!(cells.cells[0].code, "print(3)");

        let mut history = History::default();
        let big = "x".repeat(MAX_BYTES / 3);
        let stream = |text: &str| Output::Stream {
            name: StreamName::Stdout,
            text: text.into(),
        };
        for _ in 0..4 {
            history.record("print(big)", &shown(vec![stream(&big)]));
        }
        let cells = history.cells();
        assert_eq!((cells.cells.len(), cells.dropped), (2, 2));
        // One cell alone over the bound keeps its code, not its outputs.
        history.record("print(huge)", &shown(vec![stream(&"y".repeat(MAX_BYTES))]));
        let last = history.cells().cells.pop().unwrap();
        assert!(last.outputs_left_out && last.outputs.is_empty());
        assert_eq!(last.code, "print(huge)");
    }

    /// Bytes a cell surely holds on the heap: the capacities of its strings and lists, a metadata
    /// entry's key and value slots; no allocator's overhead, no map nodes beyond their entries.
    fn held_at_least(cell: &Cell) -> usize {
        use std::mem::size_of;
        let strings = |v: &[String]| v.iter().map(String::capacity).sum::<usize>();
        let metadata = |m: &Metadata| {
            m.iter()
                .map(|(k, v)| {
                    size_of::<String>()
                        + size_of::<serde_json::Value>()
                        + k.capacity()
                        + v.as_str().map_or(0, str::len)
                })
                .sum::<usize>()
        };
        let bundle = |b: &MimeBundle| {
            b.capacity() * size_of::<(String, String)>()
                + b.iter()
                    .map(|(m, v)| m.capacity() + v.capacity())
                    .sum::<usize>()
        };
        cell.code.capacity()
            + cell.outputs.capacity() * size_of::<Output>()
            + cell
                .outputs
                .iter()
                .map(|o| match o {
                    Output::Stream { text, .. } => text.capacity(),
                    Output::Error {
                        ename,
                        evalue,
                        traceback,
                    } => {
                        ename.capacity()
                            + evalue.capacity()
                            + traceback.capacity() * size_of::<String>()
                            + strings(traceback)
                    }
                    Output::DisplayData {
                        data,
                        metadata: m,
                        display_id,
                    }
                    | Output::ExecuteResult {
                        data,
                        metadata: m,
                        display_id,
                        ..
                    } => {
                        bundle(data) + metadata(m) + display_id.as_ref().map_or(0, String::capacity)
                    }
                    Output::UpdateDisplayData {
                        data,
                        metadata: m,
                        display_id,
                    } => bundle(data) + metadata(m) + display_id.capacity(),
                })
                .sum::<usize>()
    }

    /// What the history says it holds is what its cells add up to, and no less than they hold.
    fn check_accounting(history: &History) {
        let mut total = 0;
        for (cell, size) in &history.cells {
            assert_eq!(*size, size_of(cell));
            let held = held_at_least(cell);
            assert!(
                *size >= held,
                "{size} bytes counted for a cell holding {held} or more"
            );
            total += size;
        }
        assert_eq!(total, history.bytes);
        assert!(history.bytes <= MAX_BYTES, "{} bytes kept", history.bytes);
    }

    fn long_id(call: usize, i: usize) -> String {
        format!("{call:04}-{i:03}-{}", "d".repeat(180))
    }

    #[test]
    fn small_displays_with_long_ids_are_counted_as_held_and_stay_within_the_bound() {
        let mut history = History::default();
        for call in 0..100 {
            let outputs = (0..200)
                .map(|i| display(&i.to_string(), &long_id(call, i)))
                .collect();
            history.record(
                "for i in range(200): display(i, display_id=...)",
                &shown(outputs),
            );
        }
        check_accounting(&history);
        // The ids and the structure are most of what a display costs: far fewer than the 60,000
        // displays fit, and the oldest cells went.
        let kept: usize = history.cells.iter().map(|(c, _)| c.outputs.len()).sum();
        let held: usize = history.cells.iter().map(|(c, _)| held_at_least(c)).sum();
        assert!(kept < 20_000, "{kept} displays kept");
        assert!(held > MAX_BYTES / 2, "{held} bytes held by the kept cells");
        let cells = history.cells();
        assert_eq!(cells.dropped as usize + cells.cells.len(), 100);
        assert!(cells.dropped > 0);
    }

    #[test]
    fn metadata_errors_streams_and_updated_displays_are_counted_as_held() {
        let mut history = History::default();
        let mut metadata = Metadata::new();
        for i in 0..30 {
            metadata.insert(
                format!("key-{i}-{}", "k".repeat(40)),
                "v".repeat(100).into(),
            );
        }
        metadata.insert(
            "nested".into(),
            serde_json::json!({"list": ["a".repeat(300), {"deep": "b".repeat(300)}]}),
        );
        let rich = Output::DisplayData {
            data: vec![
                ("text/plain".into(), "p".repeat(10)),
                ("text/html".into(), "<b>".repeat(100)),
            ],
            metadata: metadata.clone(),
            display_id: Some(long_id(0, 0)),
        };
        let error = Output::Error {
            ename: "ValueError".into(),
            evalue: "e".repeat(500),
            traceback: (0..100).map(|i| format!("line {i}")).collect(),
        };
        let stream = Output::Stream {
            name: StreamName::Stderr,
            text: "s".repeat(1000),
        };
        history.record("show()", &shown(vec![stream, rich, error]));
        // An update with a larger bundle and metadata, applied in place.
        history.record(
            "update()",
            &shown(vec![Output::UpdateDisplayData {
                data: vec![("text/plain".into(), "q".repeat(5000))],
                metadata,
                display_id: long_id(0, 0),
            }]),
        );
        check_accounting(&history);
        assert_eq!(plain_of(&history.cells().cells[0].outputs[1]).len(), 5000);
        let held = held_at_least(&history.cells[0].0);
        assert!(held > 10_000, "{held}");
    }
}
