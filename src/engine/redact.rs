//! Secrets' values kept out of what leaves a sandbox: an upstream that echoes the headers it got
//! (a debugging endpoint, an error page quoting the key) hands the value to the code, which prints
//! it, shows it or saves it. Every value a sandbox's secrets hold is masked wherever the engine
//! passes on what came from that sandbox: an execution's streams, outputs and error, its live
//! output, the files read or copied out of its workspace and their names (a changed file's
//! name, a listing's), the names a snapshot, a fork or a restore reports, and a snapshot's
//! archive itself (so the snapshot store never holds a value).
//!
//! A value is replaced by a mask of **the same length in bytes** (`<redacted:NAME>` padded with
//! `*`, or only `*` where the value is shorter than that), so everything that points into the
//! text still points at the same place: the line that says where output was dropped, the cuts
//! between outputs, a file's size and the offsets of its pieces.
//!
//! What it does not do: find a value the code transformed (encoded, reversed, split across
//! prints that reach the client apart). It keeps an echoed key out of a model's context by
//! accident; code that means to leak a value it was given can transform it. The boundary is that
//! the sandbox is never given the value, and that the proxy adds it only for its hosts.

use crate::config::secrets::Secrets;

use super::displays::{Output, StreamName};
use super::outcome::Execution;
use super::protocol::{ChangedEntry, NotSaved};

/// The values of one sandbox's secrets and their masks.
#[derive(Clone, PartialEq, Eq)]
pub struct Redactor {
    /// `(value, mask)`, longest value first (a value inside another is masked with it).
    needles: Vec<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.needles.len())
    }
}

/// The mask of a value `len` bytes long for the secret `name`.
fn mask(name: &str, len: usize) -> Vec<u8> {
    let label = format!("<redacted:{name}>");
    if label.len() <= len {
        let mut mask = label.into_bytes();
        mask.resize(len, b'*');
        mask
    } else {
        vec![b'*'; len]
    }
}

impl Redactor {
    /// The redactor of `secrets` (`None`: nothing to mask).
    pub fn of(secrets: &Secrets) -> Option<Redactor> {
        let mut needles: Vec<(Vec<u8>, Vec<u8>)> = secrets
            .entries
            .iter()
            .map(|s| s.value.expose().as_bytes().to_vec())
            .zip(secrets.entries.iter().map(|s| s.name.as_str()))
            .filter(|(value, _)| !value.is_empty())
            .map(|(value, name)| {
                let mask = mask(name, value.len());
                (value, mask)
            })
            .collect();
        needles.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        needles.dedup_by(|a, b| a.0 == b.0);
        (!needles.is_empty()).then_some(Redactor { needles })
    }

    /// The longest value, in bytes.
    pub fn longest(&self) -> usize {
        self.needles.first().map_or(0, |(value, _)| value.len())
    }

    /// Masks every value in `data`, in place; whether one was there.
    pub fn bytes(&self, data: &mut [u8]) -> bool {
        let mut found = false;
        for (value, mask) in &self.needles {
            let mut at = 0;
            while let Some(offset) = find(&data[at..], value) {
                let start = at + offset;
                data[start..start + value.len()].copy_from_slice(mask);
                at = start + value.len();
                found = true;
            }
        }
        found
    }

    /// Masks every value in `text`, in place; whether one was there. The text stays UTF-8: a
    /// value is whole characters, and its mask is ASCII of the same length.
    pub fn text(&self, text: &mut String) -> bool {
        if !self
            .needles
            .iter()
            .any(|(value, _)| std::str::from_utf8(value).is_ok_and(|value| text.contains(value)))
        {
            return false;
        }
        let mut bytes = std::mem::take(text).into_bytes();
        let found = self.bytes(&mut bytes);
        *text = String::from_utf8(bytes).unwrap_or_else(|e| {
            // Not reachable (see above); lossy rather than a panic on the way out.
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        });
        found
    }

    /// Masks every value in a JSON value's strings (keys included).
    pub fn json(&self, value: &mut serde_json::Value) -> bool {
        match value {
            serde_json::Value::String(text) => self.text(text),
            serde_json::Value::Array(items) => items
                .iter_mut()
                .fold(false, |found, item| self.json(item) | found),
            serde_json::Value::Object(map) => {
                let mut found = false;
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    let mut masked = key.clone();
                    if self.text(&mut masked) {
                        found = true;
                        if let Some(item) = map.remove(&key) {
                            map.insert(masked.clone(), item);
                        }
                    }
                    if let Some(item) = map.get_mut(&masked) {
                        found |= self.json(item);
                    }
                }
                found
            }
            _ => false,
        }
    }

    /// Masks every value in one output of an execution.
    pub fn output(&self, output: &mut Output) -> bool {
        let bundle = |data: &mut super::displays::MimeBundle,
                      metadata: &mut super::displays::Metadata| {
            let mut found = false;
            for (_, text) in data.iter_mut() {
                found |= self.text(text);
            }
            for item in metadata.values_mut() {
                found |= self.json(item);
            }
            found
        };
        match output {
            Output::Stream { text, .. } => self.text(text),
            Output::DisplayData { data, metadata, .. }
            | Output::ExecuteResult { data, metadata, .. }
            | Output::UpdateDisplayData { data, metadata, .. } => bundle(data, metadata),
            Output::Error {
                ename,
                evalue,
                traceback,
            } => {
                let mut found = self.text(ename) | self.text(evalue);
                for line in traceback {
                    found |= self.text(line);
                }
                found
            }
        }
    }

    /// Masks every value in what an execution showed: its streams, outputs and error. The
    /// positions into the streams (`discarded`) stay right: a mask is as long as its value.
    pub fn execution(&self, execution: &mut Execution) -> bool {
        let mut found = self.bytes(&mut execution.stdout) | self.bytes(&mut execution.stderr);
        found |= self.stream_pieces(&mut execution.outputs);
        for output in &mut execution.outputs {
            if !matches!(output, Output::Stream { .. }) {
                found |= self.output(output);
            }
        }
        if let Some(error) = &mut execution.error {
            found |= self.text(&mut error.kind) | self.text(&mut error.message);
        }
        for entry in &mut execution.changes.entries {
            found |= self.changed(entry);
        }
        for root in &mut execution.changes.roots {
            found |= self.changed(&mut root.entry);
        }
        found
    }

    /// Masks every value in the stream outputs, each stream's pieces taken together: the streams'
    /// order cuts a stream into pieces (text of the other stream between them), and a value cut
    /// in two is found across the cut. A mask is as long as its value and ASCII, so each piece
    /// keeps its length and stays UTF-8.
    fn stream_pieces(&self, outputs: &mut [Output]) -> bool {
        let mut found = false;
        for stream in [StreamName::Stdout, StreamName::Stderr] {
            let mut joined = Vec::new();
            let mut lengths = Vec::new();
            for output in outputs.iter() {
                if let Output::Stream { name, text } = output {
                    if *name == stream {
                        joined.extend_from_slice(text.as_bytes());
                        lengths.push(text.len());
                    }
                }
            }
            if !self.bytes(&mut joined) {
                continue;
            }
            found = true;
            let mut pieces = lengths.into_iter().scan(0usize, |at, len| {
                let piece = joined.get(*at..*at + len).unwrap_or_default();
                *at += len;
                Some(String::from_utf8_lossy(piece).into_owned())
            });
            for output in outputs.iter_mut() {
                if let Output::Stream { name, text } = output {
                    if *name == stream {
                        if let Some(piece) = pieces.next() {
                            *text = piece;
                        }
                    }
                }
            }
        }
        found
    }

    /// Masks every value in the names of entries an execution changed. A masked path is shown
    /// masked; the entry keeps its exact bytes (`path_bytes`), so the file is still read back
    /// under its own name.
    pub fn changed(&self, entry: &mut ChangedEntry) -> bool {
        let original = entry.path.clone();
        if !self.text(&mut entry.path) {
            return false;
        }
        if entry.path_bytes.is_none() {
            use base64::Engine as _;
            entry.path_bytes = Some(base64::engine::general_purpose::STANDARD.encode(original));
        }
        true
    }

    /// Masks every value in names and reasons a sandbox reported (a snapshot's variables, say).
    pub fn names(&self, names: &mut [String]) -> bool {
        names
            .iter_mut()
            .fold(false, |found, name| self.text(name) | found)
    }

    /// Masks every value in what could not be saved, and why.
    pub fn not_saved(&self, items: &mut [NotSaved]) -> bool {
        items.iter_mut().fold(false, |found, item| {
            self.text(&mut item.name) | self.text(&mut item.reason) | found
        })
    }

    /// A redactor for text that arrives in pieces (see [`Stream`]).
    pub fn stream(&self) -> Stream {
        Stream {
            redactor: self.clone(),
            held: Vec::new(),
        }
    }

    /// The span to read so that a piece `[offset, offset + length)` of a file is masked as the
    /// whole file would be: as many bytes before and after as a value can reach into it. Returns
    /// the offset and length to read, and where the piece starts in what is read.
    pub fn widened(&self, offset: u64, length: u64) -> (u64, u64, usize) {
        let reach = self.longest().saturating_sub(1) as u64;
        let before = offset.min(reach);
        (
            offset - before,
            length.saturating_add(before).saturating_add(reach),
            before as usize,
        )
    }
}

/// Finds `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Text masked as it arrives in pieces: the end of a piece that could be the start of a value is
/// held back until the next piece (or the end) says whether it is one.
#[derive(Debug)]
pub struct Stream {
    redactor: Redactor,
    held: Vec<u8>,
}

impl Stream {
    /// What of the text so far can be passed on, masked.
    pub fn push(&mut self, piece: &str) -> String {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(piece.as_bytes());
        self.redactor.bytes(&mut data);
        let keep = self.held_back(&data);
        self.held = data.split_off(data.len() - keep);
        String::from_utf8_lossy(&data).into_owned()
    }

    /// The rest, at the end of the text.
    pub fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.held)).into_owned()
    }

    /// Whether anything is held back.
    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// How many bytes at the end of `data` are the start of some value (the longest such end).
    fn held_back(&self, data: &[u8]) -> usize {
        let most = data.len().min(self.redactor.longest().saturating_sub(1));
        (1..=most)
            .rev()
            .find(|&n| {
                let end = &data[data.len() - n..];
                self.redactor
                    .needles
                    .iter()
                    .any(|(value, _)| value.len() > n && value.starts_with(end))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::{BoundHost, Secret, SecretValue};

    fn redactor(values: &[(&str, &str)]) -> Redactor {
        let secrets = Secrets {
            entries: values
                .iter()
                .map(|(name, value)| Secret {
                    name: name.to_string(),
                    value: SecretValue::new(value.to_string()),
                    hosts: vec![BoundHost {
                        pattern: "api.test".into(),
                        port: 443,
                    }],
                    header: "Authorization".into(),
                    format: "Bearer {value}".into(),
                    env: "KEY".into(),
                })
                .collect(),
            file: None,
        };
        Redactor::of(&secrets).expect("values")
    }

    const KEY: &str = "sk-live-0123456789abcdefghij";

    #[test]
    fn a_value_is_masked_at_its_own_length_wherever_it_is() {
        let r = redactor(&[("llm", KEY), ("short", "abc")]);
        let mut text = format!("got: {{'authorization': 'Bearer {KEY}'}} and {KEY}; abc.");
        let before = text.len();
        assert!(r.text(&mut text));
        assert_eq!(text.len(), before);
        assert!(!text.contains(KEY), "{text}");
        assert!(text.contains("<redacted:llm>**************"), "{text}");
        // A value shorter than its label is only stars.
        assert!(text.ends_with("; ***."), "{text}");
        let mut clean = String::from("nothing here");
        assert!(!r.text(&mut clean));
        assert_eq!(clean, "nothing here");
        // Bytes that are not UTF-8 around it.
        let mut bytes = b"\xff\xfe".to_vec();
        bytes.extend_from_slice(KEY.as_bytes());
        assert!(r.bytes(&mut bytes));
        assert!(!bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()));
        // No secrets: no redactor.
        assert!(Redactor::of(&Secrets::default()).is_none());
    }

    #[test]
    fn a_value_inside_another_is_masked_with_the_longer_one() {
        let r = redactor(&[("inner", "0123456789abcdef"), ("outer", KEY)]);
        let mut text = format!("{KEY} 0123456789abcdef");
        r.text(&mut text);
        assert!(text.starts_with("<redacted:outer>"), "{text}");
        assert!(text.ends_with(" <redacted:inner>"), "{text}");
    }

    #[test]
    fn json_strings_and_keys_are_masked() {
        let r = redactor(&[("llm", KEY)]);
        let mut value = serde_json::json!({
            "headers": {"Authorization": format!("Bearer {KEY}")},
            KEY: [1, KEY, {"deep": KEY}],
        });
        assert!(r.json(&mut value));
        assert!(!value.to_string().contains(KEY), "{value}");
    }

    #[test]
    fn an_execution_keeps_its_positions() {
        let r = redactor(&[("llm", KEY)]);
        let mut execution = Execution {
            stdout: format!("a {KEY}\n").into_bytes(),
            stderr: KEY.as_bytes().to_vec(),
            outputs: vec![
                Output::Stream {
                    name: super::super::displays::StreamName::Stdout,
                    text: format!("a {KEY}\n"),
                },
                Output::display(vec![("text/html".into(), format!("<b>{KEY}</b>"))]),
                Output::Error {
                    ename: "E".into(),
                    evalue: KEY.into(),
                    traceback: vec![format!("line {KEY}")],
                },
            ],
            error: Some(super::super::protocol::RaisedException {
                kind: "E".into(),
                message: KEY.into(),
            }),
            ..Default::default()
        };
        let before = execution.stdout.len();
        assert!(r.execution(&mut execution));
        assert_eq!(execution.stdout.len(), before);
        assert!(!format!("{execution:?}").contains(KEY));
    }

    #[test]
    fn a_value_the_streams_order_cut_in_two_is_masked_in_both_pieces() {
        use super::super::displays::StreamName;
        let r = redactor(&[("llm", KEY)]);
        let (head, tail) = KEY.split_at(7);
        let stream = |name, text: &str| Output::Stream {
            name,
            text: text.to_string(),
        };
        let mut execution = Execution {
            outputs: vec![
                stream(StreamName::Stdout, &format!("key={head}")),
                stream(StreamName::Stderr, "warning é\n"),
                stream(StreamName::Stdout, &format!("{tail}\nnext\n")),
                Output::display(vec![("text/plain".into(), "x".into())]),
                stream(StreamName::Stderr, "é\n"),
            ],
            ..Default::default()
        };
        let lengths: Vec<usize> = execution
            .outputs
            .iter()
            .map(|o| match o {
                Output::Stream { text, .. } => text.len(),
                _ => 0,
            })
            .collect();
        assert!(r.execution(&mut execution));
        let texts: Vec<String> = execution
            .outputs
            .iter()
            .map(|o| match o {
                Output::Stream { text, .. } => text.clone(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(texts.iter().map(String::len).collect::<Vec<_>>(), lengths);
        assert_eq!(texts[0], "key=<redact");
        assert!(
            texts[2].starts_with("ed:llm>***") && texts[2].ends_with("*\nnext\n"),
            "{texts:?}"
        );
        assert_eq!(
            (texts[1].as_str(), texts[4].as_str()),
            ("warning é\n", "é\n")
        );
    }

    #[test]
    fn a_value_split_across_pieces_is_held_back_and_masked() {
        let r = redactor(&[("llm", KEY)]);
        let mut stream = r.stream();
        let (head, tail) = KEY.split_at(10);
        let first = stream.push(&format!("hello {head}"));
        assert_eq!(first, "hello ");
        assert!(stream.holds());
        let second = stream.push(&format!("{tail} bye"));
        assert!(second.starts_with("<redacted:llm>"), "{second}");
        assert!(second.ends_with(" bye"), "{second}");
        assert!(!stream.holds());
        // A start that turns out not to be a value is passed on with the next piece.
        let third = stream.push("sk-li");
        assert_eq!(third, "");
        assert_eq!(stream.push("ke that!"), "sk-like that!");
        // And at the end, whatever is held.
        assert_eq!(stream.push("x sk-"), "x ");
        assert_eq!(stream.finish(), "sk-");
    }

    #[test]
    fn a_file_piece_is_read_wide_enough_to_find_a_value_across_its_edges() {
        let r = redactor(&[("llm", KEY)]);
        let reach = KEY.len() as u64 - 1;
        assert_eq!(r.widened(0, 100), (0, 100 + reach, 0));
        assert_eq!(r.widened(5, 100), (0, 105 + reach, 5));
        assert_eq!(
            r.widened(1000, 100),
            (1000 - reach, 100 + 2 * reach, reach as usize)
        );
        // A file with the value across the piece's edge: the piece is masked where it overlaps.
        let file = format!("{}{KEY}{}", "a".repeat(90), "b".repeat(90));
        let (start, length, at) = r.widened(100, 50);
        let end = (start + length).min(file.len() as u64) as usize;
        let mut wide = file.as_bytes()[start as usize..end].to_vec();
        r.bytes(&mut wide);
        let piece = &wide[at..at + 50];
        let mut whole = file.clone().into_bytes();
        r.bytes(&mut whole);
        assert_eq!(piece, &whole[100..150]);
    }

    #[test]
    fn a_name_is_shown_masked_and_read_back_by_its_own_bytes() {
        use base64::Engine as _;
        let r = redactor(&[("llm", KEY)]);
        let name = format!("out/{KEY}.txt");
        let mut entry: ChangedEntry = serde_json::from_value(serde_json::json!({
            "path": name, "kind": "file", "size": 3
        }))
        .expect("an entry");
        assert!(r.changed(&mut entry));
        assert!(entry.path.starts_with("out/<redacted:llm>") && !entry.path.contains(KEY));
        assert_eq!(entry.path.len(), name.len());
        let exact = entry
            .path_bytes
            .as_deref()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
        assert_eq!(exact.as_deref(), Some(name.as_bytes()));
        // Without a value, nothing changes (no exact bytes added).
        let mut plain: ChangedEntry = serde_json::from_value(serde_json::json!({
            "path": "plain.txt", "kind": "file", "size": 3
        }))
        .expect("an entry");
        assert!(!r.changed(&mut plain) && plain.path_bytes.is_none());
        let mut names = vec![KEY.to_string(), "x".to_string()];
        let mut failed = vec![NotSaved {
            name: KEY.into(),
            reason: format!("it holds {KEY}"),
        }];
        assert!(r.names(&mut names) && r.not_saved(&mut failed));
        assert!(!format!("{names:?} {failed:?}").contains(KEY));
    }
}
