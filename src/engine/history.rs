//! A session's executed cells, as a notebook keeps them: for each Python execution its code, what
//! it showed (the outputs whole, before any reader's budget cuts them) and its execution count.
//!
//! An update of a display an earlier call showed (`Output::UpdateDisplayData`) is applied to the
//! earlier cells' displays with that id, as a Jupyter frontend does, and is not kept as an output
//! of its own; a new display (or value) with an id is applied to them too, and kept. The history is bounded in cells and bytes: the oldest cells go first, and how many
//! went is kept so that a notebook made from it can say so.

use std::collections::VecDeque;

use super::outcome::{Execution, Output};

/// Cells a session keeps, at most.
pub const MAX_CELLS: usize = 500;
/// Bytes of code and outputs a session keeps, at most.
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

/// Bytes a cell takes: its code and its outputs' text.
fn size_of(cell: &Cell) -> usize {
    cell.code.len() + cell.outputs.iter().map(output_bytes).sum::<usize>()
}

fn output_bytes(output: &Output) -> usize {
    // A fixed part per output stands for its keys and structure.
    64 + match output {
        Output::Stream { text, .. } => text.len(),
        Output::Error {
            ename,
            evalue,
            traceback,
        } => ename.len() + evalue.len() + traceback.iter().map(String::len).sum::<usize>(),
        Output::DisplayData { data, metadata, .. }
        | Output::ExecuteResult { data, metadata, .. }
        | Output::UpdateDisplayData { data, metadata, .. } => {
            data.iter().map(|(m, v)| m.len() + v.len()).sum::<usize>()
                + serde_json::to_string(metadata).map_or(0, |s| s.len())
        }
    }
}

impl History {
    /// Records one Python execution of `code`; returns its execution count.
    pub fn record(&mut self, code: &str, execution: &Execution) -> Option<u64> {
        let outputs = super::displays::own_outputs(&execution.outputs, |id, data, metadata| {
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
        let mut cell = Cell {
            code: code.to_string(),
            outputs,
            execution_count,
            outputs_left_out: false,
        };
        let mut size = size_of(&cell);
        if size > MAX_BYTES {
            cell.outputs.clear();
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
    fn update_display(
        &mut self,
        id: &str,
        data: &super::outcome::MimeBundle,
        metadata: &super::outcome::Metadata,
    ) {
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

    /// The cells now, oldest first.
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
}
