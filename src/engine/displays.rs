//! What an execution showed, as the runner reports it and as a notebook keeps it.
//!
//! The runner sends its outputs other than streams (IPython's display publisher and display hook:
//! `display_data`, `execute_result`, `error`, and the two messages that change what was shown,
//! `update_display_data` and `clear_output`), each with the byte positions of stdout and stderr
//! when it came; the stream text itself is cut here from the captured streams at those positions.
//! Then what a notebook shows after the cell is computed: a `clear_output` removes everything
//! before it but the updates of earlier calls' displays (with `wait`, only when the next output
//! arrives), an update replaces the displays of this call with its id, and so does a new display
//! (or value) with an id, as Jupyter's messages say. An update for a display of an earlier call
//! stays an output of its own; the caller that keeps the earlier calls' outputs applies it there,
//! and a display with an id too ([`Output::replacement`]).
//!
//! Everything here came from the sandbox: bounded on parsing (counts) and checked (MIME names,
//! images that decode, JSON that parses); what fails is left out, never trusted.

use base64::Engine as _;
use serde::Deserialize;

use super::bounded::at_most;
use crate::text::truncate_chars;

/// Outputs other than streams one execution may return (the runner drops and counts the rest).
pub const MAX_OUTPUTS: usize = 200;
/// Places where the code went from stderr back to stdout that the runner records (past them,
/// the text between two outputs is placed stdout's first). ipykernel, which sends each stream's
/// text at most every 0.2 s, gives a few outputs where a loop takes turns thousands of times;
/// here each turn is an output, a heading in what the model reads: a few hundred at most.
pub const MAX_STREAM_SWITCHES: usize = 200;
/// MIME types in one display's bundle, and lines of one traceback.
pub const MAX_MIME_TYPES: usize = 32;
pub const MAX_TRACEBACK_LINES: usize = 512;
/// Entries of one output's metadata, and bytes of its JSON.
const MAX_METADATA_ENTRIES: usize = 32;
const MAX_METADATA_BYTES: usize = 16 << 10;
/// Characters of a display id.
const MAX_DISPLAY_ID_CHARS: usize = 200;

/// One output as the runner sent it: not a stream (those are cut from the captured streams at
/// the positions `at` and `through` give).
#[derive(Debug, Clone, Deserialize)]
pub struct RawOutput {
    pub output_type: String,
    /// `[mime, value]` pairs: text, base64 for images, JSON text for the JSON types.
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_MIME_TYPES>")]
    pub data: Vec<(String, String)>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    /// The display's id (IPython's `transient.display_id`).
    #[serde(default)]
    pub display_id: Option<String>,
    /// `clear_output(wait=True)`: clear when the next output arrives.
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub execution_count: Option<u64>,
    #[serde(default)]
    pub ename: String,
    #[serde(default)]
    pub evalue: String,
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_TRACEBACK_LINES>")]
    pub traceback: Vec<String>,
    /// Bytes of stdout and stderr written before this output.
    pub at: [u64; 2],
    /// An error's traceback is also on stderr, up to here: that text is the error output, not a
    /// stream.
    #[serde(default)]
    pub through: Option<[u64; 2]>,
}

/// An output's metadata (nbformat's `metadata`, e.g. an image's width), bounded.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// One output of an execution, in the order the code produced it: Jupyter's nbformat v4 outputs,
/// and an update of an earlier call's display.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Stream {
        name: StreamName,
        text: String,
    },
    DisplayData {
        data: MimeBundle,
        metadata: Metadata,
        /// The id `update_display` finds it by (not part of a saved notebook).
        display_id: Option<String>,
    },
    ExecuteResult {
        data: MimeBundle,
        metadata: Metadata,
        execution_count: u64,
        /// The id of a value sent as a display (a kernel message's `transient.display_id`).
        display_id: Option<String>,
    },
    Error {
        ename: String,
        evalue: String,
        traceback: Vec<String>,
    },
    /// New content for the display with this id, shown by an earlier call.
    UpdateDisplayData {
        data: MimeBundle,
        metadata: Metadata,
        display_id: String,
    },
}

impl Output {
    /// A display without metadata or id.
    pub fn display(data: MimeBundle) -> Output {
        Output::DisplayData {
            data,
            metadata: Metadata::new(),
            display_id: None,
        }
    }

    /// What this output makes every earlier display with its id show, in a notebook: an update's
    /// content, and a display's or value's with an id (Jupyter's frontends and nbclient apply a
    /// `display_data` with a `display_id` to the displays already shown with it).
    pub fn replacement(&self) -> Option<(&str, &MimeBundle, &Metadata)> {
        match self {
            Output::DisplayData {
                data,
                metadata,
                display_id: Some(id),
            }
            | Output::ExecuteResult {
                data,
                metadata,
                display_id: Some(id),
                ..
            }
            | Output::UpdateDisplayData {
                data,
                metadata,
                display_id: id,
            } => Some((id, data, metadata)),
            _ => None,
        }
    }

    /// The MIME bundle of a display, a value or an update.
    pub fn bundle(&self) -> Option<&MimeBundle> {
        match self {
            Output::DisplayData { data, .. }
            | Output::ExecuteResult { data, .. }
            | Output::UpdateDisplayData { data, .. } => Some(data),
            Output::Stream { .. } | Output::Error { .. } => None,
        }
    }

    /// Applies an update for `id` when this is that display (or value): true when it was.
    pub fn update(&mut self, id: &str, new: &MimeBundle, new_metadata: &Metadata) -> bool {
        match self {
            Output::DisplayData {
                data,
                metadata,
                display_id: Some(own),
            }
            | Output::ExecuteResult {
                data,
                metadata,
                display_id: Some(own),
                ..
            } if own == id => {
                data.clone_from(new);
                metadata.clone_from(new_metadata);
                true
            }
            _ => false,
        }
    }
}

/// A cell's own outputs, for a notebook that keeps earlier cells: what each output makes the
/// earlier displays with its id show ([`Output::replacement`]) is handed to `update` (display id,
/// new bundle, new metadata); an update itself is not an output of the cell.
pub fn own_outputs(
    outputs: &[Output],
    mut update: impl FnMut(&str, &MimeBundle, &Metadata),
) -> Vec<Output> {
    let mut own = Vec::with_capacity(outputs.len());
    for output in outputs {
        if let Some((id, data, metadata)) = output.replacement() {
            update(id, data, metadata);
        }
        if !matches!(output, Output::UpdateDisplayData { .. }) {
            own.push(output.clone());
        }
    }
    own
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl StreamName {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
        }
    }
}

/// Bytes of one stream the runner did not keep, over the output limit (`SANDBOX_MAX_OUTPUT`): the
/// stream keeps its head and its tail, and between them, in the kept bytes, one line says what was
/// dropped there ([`Discarded::marker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discarded {
    /// Where that line starts in the kept stream: the head's length, in bytes.
    pub at: usize,
    /// The line's length in bytes, its line breaks included.
    pub marker_len: usize,
    /// Bytes of the tail, after the line.
    pub tail: usize,
    /// Bytes dropped between head and tail.
    pub bytes: u64,
    /// Lines those bytes span (a line cut partway counts once).
    pub lines: u64,
    /// The output limit they were over.
    pub limit: u64,
}

impl Discarded {
    /// The line that stands for the dropped bytes in `stream`'s text (without line breaks).
    pub fn marker(&self, stream: StreamName) -> String {
        format!(
            "[… {} ({}) of {} not kept here: over the {} output limit (SANDBOX_MAX_OUTPUT) …]",
            crate::text::count(self.bytes, "byte"),
            crate::text::count(self.lines, "line"),
            stream.as_str(),
            crate::text::bytes(self.limit),
        )
    }

    /// The line's place in the kept stream, in bytes.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.at..self.at + self.marker_len
    }

    /// Where a position in the stream as the code wrote it is in the kept stream: the same in the
    /// head, after the line anywhere among the dropped bytes, shifted back in the tail.
    fn place(&self, position: u64) -> u64 {
        let at = self.at as u64;
        if position <= at {
            position
        } else {
            position
                .saturating_sub(self.bytes)
                .max(at)
                .saturating_add(self.marker_len as u64)
        }
    }
}

/// A stream as the runner kept it (`kept`: its head, the first `cut_at` bytes, then its tail), with
/// the line for the `bytes` dropped between them (spanning `lines` lines) put where they were.
pub fn mark_discarded(
    mut kept: Vec<u8>,
    stream: StreamName,
    cut_at: usize,
    bytes: u64,
    lines: u64,
    limit: u64,
) -> (Vec<u8>, Option<Discarded>) {
    if bytes == 0 {
        return (kept, None);
    }
    let at = cut_at.min(kept.len());
    let mut discarded = Discarded {
        at,
        marker_len: 0,
        tail: kept.len() - at,
        bytes,
        lines: lines.clamp(1, bytes),
        limit,
    };
    let mut line = Vec::new();
    if at > 0 && kept[at - 1] != b'\n' {
        line.push(b'\n');
    }
    line.extend_from_slice(discarded.marker(stream).as_bytes());
    line.push(b'\n');
    discarded.marker_len = line.len();
    kept.splice(at..at, line);
    (kept, Some(discarded))
}

/// `(mime type, value)` pairs (`text/plain` among them unless a raw bundle had none): values are text, base64 for
/// `image/png` and `image/jpeg` (checked), JSON text for the JSON types (checked).
pub type MimeBundle = Vec<(String, String)>;

/// A MIME type whose values are JSON, as nbformat keeps them: `application/json` and
/// `application/*+json` (a widget's `application/vnd.jupyter.widget-view+json`, say).
pub fn is_json_mime(mime: &str) -> bool {
    mime.strip_prefix("application/")
        .is_some_and(|rest| rest == "json" || rest.ends_with("+json"))
}

/// A MIME bundle from the runner, checked: well-formed type names, each once; images that decode;
/// JSON that parses. Values that fail are left out; nothing is added (a raw bundle without
/// `text/plain` has none, as a kernel sends it).
fn checked_bundle(raw: Vec<(String, String)>) -> MimeBundle {
    let mut bundle: MimeBundle = Vec::with_capacity(raw.len());
    for (mime, value) in raw {
        let well_formed = mime.len() <= 100
            && mime.split_once('/').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && mime
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"/.+-_".contains(&c))
            });
        if !well_formed || bundle.iter().any(|(m, _)| *m == mime) {
            continue;
        }
        let valid = match mime.as_str() {
            "image/png" | "image/jpeg" => base64::engine::general_purpose::STANDARD
                .decode(&value)
                .is_ok_and(|bytes| {
                    bytes.starts_with(if mime == "image/png" {
                        b"\x89PNG\r\n\x1a\n"
                    } else {
                        b"\xff\xd8\xff"
                    })
                }),
            json if is_json_mime(json) => {
                serde_json::from_str::<serde::de::IgnoredAny>(&value).is_ok()
            }
            _ => true,
        };
        if valid {
            bundle.push((mime, value));
        }
    }
    bundle
}

/// Metadata from the runner: a JSON object within its bounds, or none at all.
fn checked_metadata(raw: Option<serde_json::Value>) -> Metadata {
    match raw {
        Some(serde_json::Value::Object(map))
            if map.len() <= MAX_METADATA_ENTRIES
                && serde_json::to_string(&map).is_ok_and(|s| s.len() <= MAX_METADATA_BYTES) =>
        {
            map
        }
        _ => Metadata::new(),
    }
}

/// A display id from the runner: a bounded, non-empty string of printable characters.
fn checked_display_id(raw: Option<String>) -> Option<String> {
    raw.filter(|id| {
        !id.is_empty()
            && id.chars().count() <= MAX_DISPLAY_ID_CHARS
            && !id.chars().any(char::is_control)
    })
}

/// What an execution showed, after its clears and updates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shown {
    pub outputs: Vec<Output>,
    /// The code cleared its output (`clear_output`): the streams it printed are no longer all
    /// shown, so what a model reads comes from `outputs`, not from the whole streams.
    pub cleared: bool,
}

/// The outputs in order: stream text cut from the kept stdout and stderr at the positions each
/// output carries and at the `switches` (where stderr text ended before more stdout came: text
/// between two places is placed stdout first), positions beyond what was kept, or going back,
/// clamped; consecutive text of one stream merged; clears and updates applied. A stream the runner cut (`discarded`) has
/// the line for its dropped bytes where they were: an output produced while they were written
/// comes after that line, in its order among the others.
pub fn ordered(
    raw: Vec<RawOutput>,
    switches: &[[u64; 2]],
    stdout: &[u8],
    stderr: &[u8],
    discarded: [Option<&Discarded>; 2],
) -> Shown {
    let mut shown = Showing {
        streams: [(StreamName::Stdout, stdout), (StreamName::Stderr, stderr)],
        discarded,
        done: [0; 2],
        outputs: Vec::with_capacity(raw.len() * 2 + 2),
        clear_pending: false,
        cleared: false,
    };
    // Positions only grow as the code writes: the switches up to an output's position came
    // before it.
    let mut switches = switches.iter().peekable();
    for output in raw {
        while let Some(at) = switches.next_if(|s| s[0] <= output.at[0] && s[1] <= output.at[1]) {
            shown.advance(*at, true);
        }
        shown.advance(output.at, true);
        match output.output_type.as_str() {
            "display_data" => shown.push_display(Output::DisplayData {
                data: checked_bundle(output.data),
                metadata: checked_metadata(output.metadata),
                display_id: checked_display_id(output.display_id),
            }),
            "execute_result" => shown.push_display(Output::ExecuteResult {
                data: checked_bundle(output.data),
                metadata: checked_metadata(output.metadata),
                execution_count: output.execution_count.unwrap_or(0),
                display_id: checked_display_id(output.display_id),
            }),
            "update_display_data" => {
                let Some(id) = checked_display_id(output.display_id) else {
                    continue; // an update of nothing
                };
                let data = checked_bundle(output.data);
                let metadata = checked_metadata(output.metadata);
                let mut found = false;
                for earlier in shown.outputs.iter_mut() {
                    found |= earlier.update(&id, &data, &metadata);
                }
                if !found {
                    // A display of an earlier call, or one cleared away: the latest update stands.
                    shown.outputs.retain(|o| {
                        !matches!(o, Output::UpdateDisplayData { display_id, .. } if *display_id == id)
                    });
                    shown.outputs.push(Output::UpdateDisplayData {
                        data,
                        metadata,
                        display_id: id,
                    });
                }
            }
            "clear_output" => {
                if output.wait {
                    shown.clear_pending = true;
                } else {
                    shown.clear();
                }
            }
            "error" => {
                shown.push(Output::Error {
                    ename: truncate_chars(&output.ename, 200),
                    evalue: truncate_chars(&output.evalue, 1000),
                    traceback: output
                        .traceback
                        .iter()
                        .map(|line| truncate_chars(line, 2000))
                        .collect(),
                });
                if let Some(through) = output.through {
                    shown.advance(through, false);
                }
            }
            _ => {} // a type this host does not know: nothing to show
        }
    }
    for at in switches {
        shown.advance(*at, true);
    }
    shown.advance([u64::MAX; 2], true);
    Shown {
        outputs: shown.outputs,
        cleared: shown.cleared,
    }
}

/// The state of [`ordered`] while it walks the runner's outputs.
struct Showing<'a> {
    streams: [(StreamName, &'a [u8]); 2],
    discarded: [Option<&'a Discarded>; 2],
    /// Bytes of each stream already placed (shown or skipped).
    done: [usize; 2],
    outputs: Vec<Output>,
    /// A `clear_output(wait=True)` waits for the next output.
    clear_pending: bool,
    cleared: bool,
}

impl Showing<'_> {
    fn clear(&mut self) {
        // An update of a display of an earlier call is not this call's output: it stays.
        self.outputs
            .retain(|o| matches!(o, Output::UpdateDisplayData { .. }));
        self.clear_pending = false;
        self.cleared = true;
    }

    fn push(&mut self, output: Output) {
        if self.clear_pending {
            self.clear();
        }
        self.outputs.push(output);
    }

    /// A display or value: with an id, the earlier displays of this call with it show it too.
    fn push_display(&mut self, output: Output) {
        if let Some((id, data, metadata)) = output.replacement() {
            for earlier in self.outputs.iter_mut() {
                earlier.update(id, data, metadata);
            }
        }
        self.push(output);
    }

    /// Places the stream text written before `to` (positions in the streams as written): shown
    /// when `emit`, else skipped, but for the line that stands for dropped bytes, which is always
    /// shown.
    fn advance(&mut self, to: [u64; 2], emit: bool) {
        for i in 0..2 {
            let (name, bytes) = self.streams[i];
            let discarded = self.discarded[i];
            let to = discarded.map_or(to[i], |d| d.place(to[i]));
            let end = usize::try_from(to)
                .unwrap_or(usize::MAX)
                .min(bytes.len())
                .max(self.done[i]);
            let start = self.done[i];
            if emit && end > start {
                self.emit(name, &bytes[start..end]);
            } else if let Some(line) = discarded.map(Discarded::range) {
                if start <= line.start && line.end <= end {
                    self.emit(name, &bytes[line]);
                }
            }
            self.done[i] = end;
        }
    }

    fn emit(&mut self, name: StreamName, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes).into_owned();
        if self.clear_pending {
            self.clear();
        }
        match self.outputs.last_mut() {
            Some(Output::Stream {
                name: last,
                text: so_far,
            }) if *last == name => so_far.push_str(&text),
            _ => self.outputs.push(Output::Stream { name, text }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: serde_json::Value) -> RawOutput {
        serde_json::from_value(json).unwrap()
    }

    fn plain(text: &str) -> MimeBundle {
        vec![("text/plain".into(), text.into())]
    }

    fn stream(name: StreamName, text: &str) -> Output {
        Output::Stream {
            name,
            text: text.into(),
        }
    }

    #[test]
    fn the_streams_are_cut_at_the_positions_and_bad_values_are_left_out() {
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let raws = vec![
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/html","<b>x</b>"],["image/png",b64(b"not a png")],["bad mime","v"],["application/json","{nope"],["application/vnd.x+json","{nope"],["text/plain","x"]],"at":[2,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"execute_result","data":[["application/json","[1]"]],"execution_count":4,"at":[4,1],"metadata":{"isolated":true}}),
            ),
            raw(
                serde_json::json!({"output_type":"error","ename":"E","evalue":"v","traceback":["Traceback","E: v"],"at":[99,999],"through":[4,6]}),
            ),
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","late"]],"at":[1,0],"metadata":[1]}),
            ),
        ];
        let shown = ordered(raws, &[], b"a\nb\nc\n", b"w\nTB!!\n", [None, None]);
        assert!(!shown.cleared);
        assert_eq!(
            shown.outputs,
            vec![
                stream(StreamName::Stdout, "a\n"),
                Output::display(vec![
                    ("text/html".into(), "<b>x</b>".into()),
                    ("text/plain".into(), "x".into())
                ]),
                stream(StreamName::Stdout, "b\n"),
                stream(StreamName::Stderr, "w"),
                Output::ExecuteResult {
                    // No text/plain is added where the runner sent none.
                    data: vec![("application/json".into(), "[1]".into())],
                    metadata: serde_json::json!({"isolated": true})
                        .as_object()
                        .cloned()
                        .unwrap(),
                    execution_count: 4,
                    display_id: None
                },
                // Positions past the kept text are clamped; the traceback's text is the error.
                stream(StreamName::Stdout, "c\n"),
                stream(StreamName::Stderr, "\nTB!!\n"),
                Output::Error {
                    ename: "E".into(),
                    evalue: "v".into(),
                    traceback: vec!["Traceback".into(), "E: v".into()]
                },
                // A position going back counts as no new text; metadata that is not an object
                // is dropped.
                Output::display(plain("late")),
            ]
        );
    }

    #[test]
    fn clear_output_removes_what_came_before_it() {
        let raws = vec![
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","D"]],"at":[2,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","U"]],"display_id":"earlier","at":[2,0]}),
            ),
            raw(serde_json::json!({"output_type":"clear_output","at":[4,1]})),
        ];
        let shown = ordered(raws, &[], b"a\nb\nc\n", b"w", [None, None]);
        assert!(shown.cleared);
        // An update of an earlier call's display is not cleared with this call's outputs.
        assert_eq!(
            shown.outputs,
            vec![
                Output::UpdateDisplayData {
                    data: plain("U"),
                    metadata: Metadata::new(),
                    display_id: "earlier".into()
                },
                stream(StreamName::Stdout, "c\n")
            ]
        );
    }

    #[test]
    fn stream_text_keeps_the_order_it_was_written_in_across_stdout_and_stderr() {
        // print('Bar!', file=sys.stderr); print('Combo breaker!'); print('Foo!', file=sys.stderr);
        // display('D'); print('E', file=sys.stderr); print('F'): the runner's places where stdout
        // came after stderr (one at the display's position too: harmless).
        let raws = vec![raw(
            serde_json::json!({"output_type":"display_data","data":[["text/plain","D"]],"at":[15,10]}),
        )];
        let switches = [[0, 5], [15, 10], [15, 12]];
        let shown = ordered(
            raws,
            &switches,
            b"Combo breaker!\nF\n",
            b"Bar!\nFoo!\nE\n",
            [None, None],
        );
        assert_eq!(
            shown.outputs,
            vec![
                stream(StreamName::Stderr, "Bar!\n"),
                stream(StreamName::Stdout, "Combo breaker!\n"),
                stream(StreamName::Stderr, "Foo!\n"),
                Output::display(plain("D")),
                stream(StreamName::Stderr, "E\n"),
                stream(StreamName::Stdout, "F\n"),
            ]
        );
        // Without switches (over the runner's bound, or text a subprocess wrote): stdout first
        // between two outputs, as before.
        let shown = ordered(Vec::new(), &[], b"o\n", b"e\n", [None, None]);
        assert_eq!(
            shown.outputs,
            vec![
                stream(StreamName::Stdout, "o\n"),
                stream(StreamName::Stderr, "e\n")
            ]
        );
        // Switches from the sandbox that go back, or past the text, are clamped.
        let shown = ordered(
            Vec::new(),
            &[[9, 9], [0, 1], [u64::MAX, 0]],
            b"o\n",
            b"e\n",
            [None, None],
        );
        assert_eq!(
            shown.outputs,
            vec![
                stream(StreamName::Stdout, "o\n"),
                stream(StreamName::Stderr, "e\n")
            ]
        );
    }

    #[test]
    fn clear_output_with_wait_clears_at_the_next_output() {
        // Progress as a notebook shows it: each line replaces the last.
        let raws = (0..3)
            .map(|i| {
                raw(serde_json::json!({"output_type":"clear_output","wait":true,"at":[i * 2, 0]}))
            })
            .collect();
        let shown = ordered(raws, &[], b"0\n1\n2\n", b"", [None, None]);
        assert_eq!(shown.outputs, vec![stream(StreamName::Stdout, "2\n")]);
        // A wait with nothing after it clears nothing.
        let raws = vec![
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","D"]],"at":[0,0]}),
            ),
            raw(serde_json::json!({"output_type":"clear_output","wait":true,"at":[0,0]})),
        ];
        let shown = ordered(raws, &[], b"", b"", [None, None]);
        assert!(!shown.cleared);
        assert_eq!(shown.outputs, vec![Output::display(plain("D"))]);
        // The next display clears too.
        let raws = vec![
            raw(serde_json::json!({"output_type":"clear_output","wait":true,"at":[2,0]})),
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","D"]],"at":[2,0]}),
            ),
        ];
        assert_eq!(
            ordered(raws, &[], b"a\n", b"", [None, None]).outputs,
            vec![Output::display(plain("D"))]
        );
    }

    #[test]
    fn a_display_or_value_with_an_id_replaces_the_earlier_displays_of_this_call_with_it() {
        let raws = vec![
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","1"]],"display_id":"here","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","2"]],"display_id":"there","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"execute_result","data":[["text/plain","3"]],"display_id":"here","execution_count":5,"at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","4"]],"display_id":"here","at":[0,0]}),
            ),
        ];
        let id = |s: &str| Some(s.to_string());
        let shown = ordered(raws, &[], b"", b"", [None, None]);
        assert_eq!(
            shown.outputs,
            vec![
                Output::DisplayData {
                    data: plain("4"),
                    metadata: Metadata::new(),
                    display_id: id("here")
                },
                Output::DisplayData {
                    data: plain("2"),
                    metadata: Metadata::new(),
                    display_id: id("there")
                },
                Output::ExecuteResult {
                    data: plain("4"),
                    metadata: Metadata::new(),
                    execution_count: 5,
                    display_id: id("here")
                },
            ]
        );
        let replaced: Vec<_> = shown
            .outputs
            .iter()
            .map(|o| {
                o.replacement()
                    .map(|(id, data, _)| (id, data[0].1.as_str()))
            })
            .collect();
        assert_eq!(
            replaced,
            [
                Some(("here", "4")),
                Some(("there", "2")),
                Some(("here", "4"))
            ]
        );
        assert_eq!(Output::display(plain("x")).replacement(), None);
    }

    #[test]
    fn an_update_replaces_the_display_of_this_call_or_stays_for_an_earlier_one() {
        let raws = vec![
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","v1"]],"display_id":"d","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"display_data","data":[["text/plain","other"]],"display_id":"e","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","v2"]],"display_id":"d","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","old 1"]],"display_id":"earlier","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","old 2"]],"display_id":"earlier","at":[0,0]}),
            ),
            raw(
                serde_json::json!({"output_type":"update_display_data","data":[["text/plain","x"]],"display_id":"\u{1b}[2J","at":[0,0]}),
            ),
        ];
        let shown = ordered(raws, &[], b"", b"", [None, None]);
        let id = |s: &str| Some(s.to_string());
        assert_eq!(
            shown.outputs,
            vec![
                Output::DisplayData {
                    data: plain("v2"),
                    metadata: Metadata::new(),
                    display_id: id("d")
                },
                Output::DisplayData {
                    data: plain("other"),
                    metadata: Metadata::new(),
                    display_id: id("e")
                },
                Output::UpdateDisplayData {
                    data: plain("old 2"),
                    metadata: Metadata::new(),
                    display_id: "earlier".into()
                },
            ]
        );
    }
}
