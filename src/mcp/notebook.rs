//! What the code showed, as a notebook would keep it: nbformat v4 outputs (`stream`,
//! `display_data`, `execute_result`, `error`) as structured content and as content blocks in
//! order, bounded for a model.
//!
//! The bounds follow `SANDBOX_MODEL_OUTPUT` (the budget): each stream's text is cut exactly as
//! the `stdout`/`stderr` fields are (same share, head and tail, one line saying what was cut and
//! where the whole is); the text of all displays and values shares twice the budget, one plain
//! text at most half of it (cut to head and tail), and a rich form (HTML, Markdown, LaTeX, JSON,
//! SVG) that does not fit is left out whole, never cut into something malformed, with a line in
//! its plain text saying so; a traceback keeps at most half the budget. Images are not text: they
//! are bounded by the runner (count and bytes) and come back as images.

use rmcp::model::{ContentBlock, ResourceContents};
use schemars::JsonSchema;
use serde::Serialize;

use crate::engine::displays::is_json_mime;
use crate::engine::outcome::{Output, StreamName};
use crate::text::{self, Excerpt};

/// One output, as in a Jupyter notebook (nbformat v4).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(tag = "output_type", rename_all = "snake_case")]
pub enum OutputJson {
    Stream {
        /// `stdout` or `stderr`.
        name: String,
        text: String,
    },
    DisplayData {
        /// By MIME type: text; base64 for images; the JSON itself for the JSON types.
        data: serde_json::Map<String, serde_json::Value>,
        metadata: serde_json::Map<String, serde_json::Value>,
        /// The display's id, when it has one (`display(..., display_id=True)`): a later
        /// `update_display_data` with this id replaces it, and so does a later display with it
        /// (as in Jupyter). Not kept in a saved notebook.
        #[serde(skip_serializing_if = "Option::is_none")]
        transient: Option<Transient>,
    },
    ExecuteResult {
        /// By MIME type: text; base64 for images; the JSON itself for the JSON types.
        data: serde_json::Map<String, serde_json::Value>,
        metadata: serde_json::Map<String, serde_json::Value>,
        /// Counts the session's executions, like a notebook's `Out[n]`.
        execution_count: u64,
        /// The value's display id, when code sent it as a kernel message with one: a later
        /// `update_display_data` with this id replaces it. Not kept in a saved notebook.
        #[serde(skip_serializing_if = "Option::is_none")]
        transient: Option<Transient>,
    },
    /// New content for a display an earlier call showed (its `transient.display_id`); an update
    /// of a display of this call is already applied to it.
    UpdateDisplayData {
        data: serde_json::Map<String, serde_json::Value>,
        metadata: serde_json::Map<String, serde_json::Value>,
        transient: Transient,
    },
    Error {
        ename: String,
        evalue: String,
        traceback: Vec<String>,
    },
}

/// What identifies a display across calls (Jupyter's `transient`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct Transient {
    pub display_id: String,
}

/// A MIME bundle as nbformat's `data`: JSON types as JSON (when their text parses), the rest as
/// strings.
pub(crate) fn bundle_json(
    bundle: &[(String, String)],
) -> serde_json::Map<String, serde_json::Value> {
    bundle
        .iter()
        .map(|(mime, value)| {
            let value = if is_json_mime(mime) {
                // Checked to parse when it came from the sandbox.
                serde_json::from_str(value).unwrap_or_else(|_| value.clone().into())
            } else {
                value.clone().into()
            };
            (mime.clone(), value)
        })
        .collect()
}

impl OutputJson {
    pub fn of(output: &Output) -> Self {
        match output {
            Output::Stream { name, text } => OutputJson::Stream {
                name: name.as_str().to_string(),
                text: text.clone(),
            },
            Output::DisplayData {
                data,
                metadata,
                display_id,
            } => OutputJson::DisplayData {
                data: bundle_json(data),
                metadata: metadata.clone(),
                transient: display_id.as_ref().map(|id| Transient {
                    display_id: id.clone(),
                }),
            },
            Output::ExecuteResult {
                data,
                metadata,
                execution_count,
                display_id,
            } => OutputJson::ExecuteResult {
                data: bundle_json(data),
                metadata: metadata.clone(),
                execution_count: *execution_count,
                transient: display_id.as_ref().map(|id| Transient {
                    display_id: id.clone(),
                }),
            },
            Output::UpdateDisplayData {
                data,
                metadata,
                display_id,
            } => OutputJson::UpdateDisplayData {
                data: bundle_json(data),
                metadata: metadata.clone(),
                transient: Transient {
                    display_id: display_id.clone(),
                },
            },
            Output::Error {
                ename,
                evalue,
                traceback,
            } => OutputJson::Error {
                ename: ename.clone(),
                evalue: evalue.clone(),
                traceback: traceback.clone(),
            },
        }
    }
}

/// The scheme of the embedded resources that carry rich outputs (HTML, Markdown, LaTeX, JSON,
/// SVG). They are not files: `resources/read` does not serve them, the URI only names the output
/// (`sandbox-output://out-N/I.ext`: execution N's output I).
pub const OUTPUT_SCHEME: &str = "sandbox-output://";

/// MIME types shown as an embedded resource beside a text rendering, and their URIs' extension.
const RESOURCE_MIMES: &[(&str, &str)] = &[
    ("text/html", "html"),
    ("text/markdown", "md"),
    ("text/latex", "tex"),
    ("application/json", "json"),
    ("image/svg+xml", "svg"),
];

/// `repr`'s default for objects without one, as Python writes it (`<module.Class object at
/// 0x...>`) or IPython's pretty printer (`<module.Class at 0x...>`): says nothing.
fn is_default_repr(text: &str) -> bool {
    text.starts_with('<') && text.ends_with('>') && text.contains(" at 0x") && !text.contains('\n')
}

/// Content blocks for the outputs, in order: text for streams, the text rendering of every
/// display and value, images as images, HTML/Markdown/LaTeX/JSON/SVG as embedded resources.
pub fn output_blocks(outputs: &[Output], execution_count: Option<u64>) -> Vec<ContentBlock> {
    let mut blocks = Vec::new();
    for (index, output) in outputs.iter().enumerate() {
        let (data, label) = match output {
            Output::Stream { name, text } => {
                blocks.push(ContentBlock::text(format!(
                    "--- {} ---\n{text}",
                    name.as_str()
                )));
                continue;
            }
            Output::Error { traceback, .. } => {
                blocks.push(ContentBlock::text(traceback.join("\n")));
                continue;
            }
            Output::DisplayData { data, .. } => (data, String::new()),
            Output::UpdateDisplayData { data, .. } => {
                (data, "(an earlier display, updated) ".into())
            }
            Output::ExecuteResult {
                data,
                execution_count,
                ..
            } => (data, format!("Out[{execution_count}]: ")),
        };
        let get = |mime: &str| {
            data.iter()
                .find(|(m, _)| m == mime)
                .map(|(_, v)| v.as_str())
        };
        let plain = get("text/plain").unwrap_or_default();
        let image = ["image/png", "image/jpeg"]
            .into_iter()
            .find_map(|mime| Some((mime, get(mime)?)));
        let rich = RESOURCE_MIMES
            .iter()
            .filter_map(|(mime, ext)| Some((*mime, *ext, get(mime)?)))
            .collect::<Vec<_>>();
        // The text a model reads: the plain repr, unless it is repr's empty default and a
        // readable form exists (Markdown, LaTeX and JSON read well as they are; HTML comes last).
        let text = if !is_default_repr(plain) || (image.is_none() && rich.is_empty()) {
            Some(plain)
        } else {
            rich.iter()
                .find(|(mime, _, _)| *mime != "image/svg+xml")
                .map(|(_, _, value)| *value)
        };
        if let Some(text) = text.filter(|t| !t.is_empty() && (image.is_none() || !label.is_empty()))
        {
            blocks.push(ContentBlock::text(format!("{label}{text}")));
        }
        if let Some((mime, base64)) = image {
            blocks.push(ContentBlock::image(base64.to_string(), mime.to_string()));
        }
        for (mime, ext, value) in rich {
            let uri = format!(
                "{OUTPUT_SCHEME}out-{}/{index}.{ext}",
                execution_count.unwrap_or(0)
            );
            blocks.push(ContentBlock::resource(
                ResourceContents::text(value, uri).with_mime_type(mime),
            ));
        }
    }
    blocks
}

/// Outputs beyond what the stdout/stderr summary says: displays or a last value.
pub fn has_rich_outputs(outputs: &[Output]) -> bool {
    outputs.iter().any(|o| o.bundle().is_some())
}

/// MIME types that are images, not text: outside the text budget.
const IMAGE_MIMES: &[&str] = &["image/png", "image/jpeg"];

/// A value's plain text is never cut below this many characters; with less room left it is left
/// out with a line that says so.
const MIN_SHOWN_CHARS: usize = 200;

/// The outputs as a model reads them (see the module's docs). `shares` are the characters each
/// stream (stdout, stderr) may keep, as the stream fields got them; `cut_line` says what was cut
/// from a stream and where its whole is, and whether the line `markers` gives for the stream
/// (the one for bytes the capture dropped) is in the cut part: that line is never split.
pub fn bounded(
    outputs: &[Output],
    shares: [usize; 2],
    budget: usize,
    cut_line: &dyn Fn(StreamName, &Excerpt, bool) -> String,
    markers: [Option<&str>; 2],
) -> Vec<Output> {
    let mut outputs: Vec<Option<Output>> = outputs.iter().cloned().map(Some).collect();
    for ((name, share), marker) in [StreamName::Stdout, StreamName::Stderr]
        .into_iter()
        .zip(shares)
        .zip(markers)
    {
        cut_stream(&mut outputs, name, share, cut_line, marker);
    }
    let mut room = budget.saturating_mul(2);
    for output in outputs.iter_mut().flatten() {
        match output {
            Output::DisplayData { data, .. }
            | Output::ExecuteResult { data, .. }
            | Output::UpdateDisplayData { data, .. } => bound_bundle(data, &mut room, budget / 2),
            Output::Error { traceback, .. } => bound_traceback(traceback, budget / 2),
            Output::Stream { .. } => {}
        }
    }
    outputs.into_iter().flatten().collect()
}

/// Cuts one stream's text, spread over several outputs, to its head and tail as if it were one
/// text: outputs wholly in the cut part go (the displays between them stay), the one where the
/// cut starts gets the line that stands for it.
fn cut_stream(
    outputs: &mut [Option<Output>],
    name: StreamName,
    share: usize,
    cut_line: &dyn Fn(StreamName, &Excerpt, bool) -> String,
    marker: Option<&str>,
) {
    let is_ours = |output: &Option<Output>| matches!(output, Some(Output::Stream { name: n, .. }) if *n == name);
    let whole: String = outputs
        .iter()
        .filter_map(|output| match output {
            Some(Output::Stream { name: n, text }) if *n == name => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let marker = marker.and_then(|marker| whole.find(marker).map(|at| at..at + marker.len()));
    let (excerpt, within) = text::head_and_tail_around(&whole, share, marker);
    if !excerpt.is_cut() {
        return;
    }
    let head_end = excerpt.head.len();
    let tail_start = whole.len() - excerpt.tail.len();
    let line = cut_line(name, &excerpt, within);
    let mut offset = 0;
    for output in outputs.iter_mut().filter(|output| is_ours(output)) {
        let Some(Output::Stream { text, .. }) = output else {
            continue;
        };
        let (start, end) = (offset, offset + text.len());
        offset = end;
        let mut kept = String::new();
        if start < head_end {
            kept.push_str(&whole[start..end.min(head_end)]);
        }
        if (start..end).contains(&head_end) {
            if !kept.is_empty() && !kept.ends_with('\n') {
                kept.push('\n');
            }
            kept.push_str(&line);
            kept.push('\n');
        }
        if end > tail_start {
            kept.push_str(&whole[start.max(tail_start)..end]);
        }
        if kept.is_empty() {
            *output = None;
        } else {
            *text = kept;
        }
    }
}

/// Bounds one display's text forms against the `room` left: the plain text first (cut to head and
/// tail, at most `plain_max`), then each rich form whole or not at all.
fn bound_bundle(data: &mut Vec<(String, String)>, room: &mut usize, plain_max: usize) {
    let mut notes = Vec::new();
    if let Some((_, plain)) = data.iter_mut().find(|(mime, _)| mime == "text/plain") {
        let chars = plain.chars().count();
        let allowed = plain_max.min(*room);
        if chars <= allowed {
            *room -= chars;
        } else if allowed >= MIN_SHOWN_CHARS {
            let excerpt = text::head_and_tail(plain, allowed);
            let cut = format!(
                "{}{}[… {} ({}) of this value cut …]\n{}",
                excerpt.head,
                if excerpt.head.ends_with('\n') {
                    ""
                } else {
                    "\n"
                },
                text::count(excerpt.cut_chars as u64, "character"),
                text::count(excerpt.cut_lines as u64, "line"),
                excerpt.tail
            );
            *room -= allowed;
            *plain = cut;
        } else {
            *plain = format!(
                "[… a value of {chars} characters left out: this result's text is at its budget \
                 (SANDBOX_MODEL_OUTPUT) …]"
            );
        }
    }
    data.retain(|(mime, value)| {
        if mime == "text/plain" || IMAGE_MIMES.contains(&mime.as_str()) {
            return true;
        }
        let chars = value.chars().count();
        if chars <= *room {
            *room -= chars;
            true
        } else {
            notes.push(format!(
                "[{mime} of {chars} characters left out: over this result's budget \
                 (SANDBOX_MODEL_OUTPUT)]"
            ));
            false
        }
    });
    if let Some((_, plain)) = data.iter_mut().find(|(mime, _)| mime == "text/plain") {
        for note in notes {
            if !plain.is_empty() && !plain.ends_with('\n') {
                plain.push('\n');
            }
            plain.push_str(&note);
        }
    }
}

/// A traceback within `budget` characters: its head and tail lines.
fn bound_traceback(traceback: &mut Vec<String>, budget: usize) {
    let whole = traceback.join("\n");
    let excerpt = text::head_and_tail(&whole, budget);
    if !excerpt.is_cut() {
        return;
    }
    let cut = format!(
        "{}\n[… {} characters of the traceback cut …]\n{}",
        excerpt.head.trim_end_matches('\n'),
        excerpt.cut_chars,
        excerpt.tail
    );
    *traceback = cut.split('\n').map(str::to_string).collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: StreamName, text: &str) -> Output {
        Output::Stream {
            name,
            text: text.to_string(),
        }
    }

    fn display(data: &[(&str, &str)]) -> Output {
        Output::display(
            data.iter()
                .map(|(m, v)| (m.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn lines(from: usize, to: usize) -> String {
        (from..to).map(|i| format!("line {i:05}\n")).collect()
    }

    fn line_for(name: StreamName, excerpt: &Excerpt, within: bool) -> String {
        let within = if within { " around the marker" } else { "" };
        format!("[cut {} {}{within}]", name.as_str(), excerpt.cut_chars)
    }

    #[test]
    fn the_line_for_what_the_capture_dropped_is_kept_or_cut_whole() {
        let marker = "[… 9000 bytes (900 lines) of stdout not kept here …]";
        let outputs = vec![
            stream(StreamName::Stdout, &lines(0, 1)),
            display(&[("text/plain", "D1")]),
            stream(
                StreamName::Stdout,
                &format!("{marker}\n{}", lines(910, 1000)),
            ),
        ];
        // The head would end in the marker's line, too far into it to move back to its start: it
        // stops before it, and the line says so.
        let share = 100;
        let head = share * 2 / 5;
        assert!(head - lines(0, 1).len() > head / 2 && head < marker.chars().count());
        let bounded = bounded(
            &outputs,
            [share, 0],
            20_000,
            &line_for,
            [Some(marker), None],
        );
        let Output::Stream { text, .. } = &bounded[2] else {
            panic!("{bounded:?}")
        };
        assert!(text.starts_with("[cut stdout "), "{text}");
        assert!(text.contains(" around the marker]\n"), "{text}");
        assert!(!text.contains("[… 9000"), "{text}");
        assert_eq!(bounded[0], outputs[0]);
        // Without the marker given, the head would have ended in it.
        let plain = super::bounded(&outputs, [share, 0], 20_000, &line_for, [None, None]);
        let Output::Stream { text, .. } = &plain[2] else {
            panic!("{plain:?}")
        };
        assert!(text.starts_with("[… 9000"), "{text}");
    }

    #[test]
    fn a_stream_spread_over_outputs_is_cut_as_one_text_and_displays_stay() {
        let (first, second, third) = (lines(0, 300), lines(300, 600), lines(600, 700));
        let outputs = vec![
            stream(StreamName::Stdout, &first),
            display(&[("text/plain", "D1")]),
            stream(StreamName::Stdout, &second),
            stream(StreamName::Stderr, "warning\n"),
            display(&[("text/plain", "D2")]),
            stream(StreamName::Stdout, &third),
        ];
        let bounded = bounded(&outputs, [1000, 1000], 20_000, &line_for, [None, None]);
        let whole = format!("{first}{second}{third}");
        let excerpt = text::head_and_tail(&whole, 1000);
        let expected = format!(
            "{}[cut stdout {}]\n{}",
            excerpt.head, excerpt.cut_chars, excerpt.tail
        );
        let kept: String = bounded
            .iter()
            .filter_map(|o| match o {
                Output::Stream { name, text } if *name == StreamName::Stdout => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(kept, expected, "the same head, one line, the same tail");
        let kinds: Vec<String> = bounded
            .iter()
            .map(|o| match o {
                Output::Stream { name, .. } => name.as_str().to_string(),
                Output::DisplayData { data, .. } => data[0].1.clone(),
                _ => "other".into(),
            })
            .collect();
        // The middle stdout output fell wholly in the cut part; the displays and stderr stay.
        assert_eq!(kinds, ["stdout", "D1", "stderr", "D2", "stdout"]);
        assert!(matches!(&bounded[0], Output::Stream { text, .. } if text.contains("[cut stdout")));
    }

    #[test]
    fn default_reprs_are_recognised_in_pythons_and_ipythons_forms() {
        assert!(is_default_repr("<__main__.Html object at 0x7f3df26665d0>"));
        assert!(is_default_repr("<__main__.Html at 0x7f3df26665d0>"));
        assert!(!is_default_repr("<b>look at 0x10</b> and more"));
        assert!(!is_default_repr("Point(x=1)"));
    }

    #[test]
    fn streams_within_their_share_are_untouched() {
        let outputs = vec![
            stream(StreamName::Stdout, "hi\n"),
            display(&[("text/plain", "x")]),
        ];
        assert_eq!(
            bounded(&outputs, [3, 0], 20_000, &line_for, [None, None]),
            outputs
        );
    }

    #[test]
    fn displays_share_twice_the_budget_and_rich_forms_go_whole_or_not_at_all() {
        let big_plain = "p".repeat(100_000);
        let big_html = format!("<table>{}</table>", "h".repeat(50_000));
        let outputs = vec![
            display(&[("text/html", &big_html), ("text/plain", &big_plain)]),
            display(&[("text/html", "<b>small</b>"), ("text/plain", "small")]),
            display(&[
                ("image/png", &"A".repeat(90_000)),
                ("text/plain", "<Figure>"),
            ]),
        ];
        let bounded = bounded(&outputs, [0, 0], 20_000, &line_for, [None, None]);
        let data = |i: usize| match &bounded[i] {
            Output::DisplayData { data, .. } => data.clone(),
            other => panic!("{other:?}"),
        };
        let first = data(0);
        assert_eq!(first.len(), 1, "the HTML that does not fit is left out");
        let plain = &first[0].1;
        assert!(plain.chars().count() < 10_000 + 300, "{}", plain.len());
        assert!(plain.contains("characters (1 line) of this value cut …]"));
        assert!(plain.ends_with(
            "[text/html of 50015 characters left out: over this result's budget \
             (SANDBOX_MODEL_OUTPUT)]"
        ));
        assert_eq!(data(1).len(), 2, "a small one still fits");
        assert_eq!(data(2)[0].1.len(), 90_000, "images are not text");
    }

    #[test]
    fn a_spent_budget_leaves_values_out_with_a_line_that_says_so() {
        let plain = "v".repeat(5_000);
        let outputs: Vec<Output> = (0..20)
            .map(|_| display(&[("text/plain", &plain)]))
            .collect();
        let bounded = bounded(&outputs, [0, 0], 4_000, &line_for, [None, None]);
        let texts: Vec<&str> = bounded
            .iter()
            .map(|o| match o {
                Output::DisplayData { data, .. } => data[0].1.as_str(),
                _ => "",
            })
            .collect();
        let total: usize = texts.iter().map(|t| t.chars().count()).sum();
        assert!(total < 8_000 + 20 * 200, "{total}");
        assert!(texts[19].starts_with("[… a value of 5000 characters left out"));
    }

    #[test]
    fn a_long_traceback_keeps_its_head_and_tail_lines() {
        let traceback: Vec<String> = (0..300)
            .map(|i| format!("frame {i:03} {}", "x".repeat(190)))
            .collect();
        let outputs = vec![Output::Error {
            ename: "E".into(),
            evalue: "v".into(),
            traceback,
        }];
        let bounded = bounded(&outputs, [0, 0], 2_000, &line_for, [None, None]);
        let Output::Error { traceback, .. } = &bounded[0] else {
            panic!()
        };
        let joined = traceback.join("\n");
        assert!(joined.chars().count() < 1_000 + 100, "{}", joined.len());
        assert!(joined.starts_with("frame 000"));
        assert!(joined.contains("characters of the traceback cut …]"));
        assert!(traceback.last().is_some_and(|l| l.starts_with("frame 299")));
    }
}
