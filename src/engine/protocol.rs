//! The runner protocol: how the host talks to the runner process inside a sandbox.
//!
//! Both directions carry frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
//! The container's command is a fixed bootstrap that reads one frame holding the runner's loader
//! and executes it; the loader reads the next frame, the runner's modules (`python/runner/`, all
//! embedded in this binary), and imports them from memory. The agent's code only ever travels
//! inside request frames, never in argv.
//!
//! Everything the runner sends is untrusted (the code it runs can rewrite it), so the decoder
//! bounds every frame before buffering it and turns anything malformed into an error, never a panic.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::bounded::at_most;
use super::displays::mark_discarded;
pub use super::displays::{
    Discarded, MimeBundle, Output, RawOutput, StreamName, MAX_OUTPUTS, MAX_STREAM_SWITCHES,
};
use super::runner_set::RunnerIpython;
use crate::text::truncate_chars;

/// The runner's loader: the first frame, which the bootstrap executes.
const RUNNER_LOADER: &str = include_str!("python/load_runner.py");

/// One module of the runner's package, named after its file in `python/runner/`.
macro_rules! runner_module {
    ($name:literal) => {
        (
            concat!("sandbox_runner.", $name),
            include_str!(concat!("python/runner/", $name, ".py")),
        )
    };
}

/// The runner's modules by name (the in-memory package `sandbox_runner`): every file of
/// `python/runner/`, which a test checks. A new module of the runner is one more line here.
const RUNNER_MODULES: &[(&str, &str)] = &[
    ("sandbox_runner", include_str!("python/runner/__init__.py")),
    runner_module!("after_import"),
    runner_module!("ahead"),
    runner_module!("capture"),
    runner_module!("changes"),
    runner_module!("compiler"),
    runner_module!("display"),
    runner_module!("execute"),
    runner_module!("figures"),
    runner_module!("host_test"),
    runner_module!("importer"),
    runner_module!("kernel"),
    runner_module!("pip"),
    runner_module!("prepared"),
    runner_module!("processes"),
    runner_module!("protocol"),
    runner_module!("recycle"),
    runner_module!("runner"),
    runner_module!("seccomp"),
    runner_module!("shell"),
    runner_module!("snapshot"),
    runner_module!("streams"),
    runner_module!("supervisor"),
    runner_module!("workspace"),
];

/// What the host writes to a new sandbox's bootstrap to start its runner: the loader's frame, then
/// one frame holding the modules as a JSON object {module name: source}.
pub fn runner_start_frames() -> Vec<u8> {
    let modules: serde_json::Map<String, serde_json::Value> = RUNNER_MODULES
        .iter()
        .map(|(name, source)| ((*name).to_owned(), (*source).into()))
        .collect();
    let modules = serde_json::Value::Object(modules).to_string();
    let mut frames = encode_frame(RUNNER_LOADER.as_bytes());
    frames.extend_from_slice(&encode_frame(modules.as_bytes()));
    frames
}

/// The container command: read one frame from stdin and execute it (the runner's loader).
pub const BOOTSTRAP: &str = "import os,sys\n\
def r(n):\n \
 b=b''\n \
 while len(b)<n:\n  \
  c=os.read(0,n-len(b))\n  \
  if not c: sys.exit(0)\n  \
  b+=c\n \
 return b\n\
n=int.from_bytes(r(4),'big')\n\
exec(compile(r(n),'<sandbox-runner>','exec'),{'__name__':'__sandbox_runner__'})\n";

/// The argv of a sandbox's main process. `-u` keeps the supervisor's and runner's own streams
/// unbuffered; the code gets buffered ones (`python/runner/streams.py`).
pub fn bootstrap_command() -> Vec<String> {
    vec!["python3".into(), "-u".into(), "-c".into(), BOOTSTRAP.into()]
}

/// Encodes one frame.
pub fn encode_frame(body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

/// A request to the runner.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request<'a> {
    /// Execute Python code in the runner's persistent namespace.
    Exec {
        id: u64,
        code: &'a str,
        max_output: u64,
        /// Send the output as it comes too ([`Reply::Output`]); only when the host shows it.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        live: bool,
        /// Run as a program (`Task::Script`): a `SystemExit` is the exit status only.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        script: bool,
    },
    /// Run a shell command (`/bin/sh -c`) with the same capture and limits.
    Shell {
        id: u64,
        command: &'a str,
        max_output: u64,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        live: bool,
    },
    /// List one directory of the workspace.
    List { id: u64, path: &'a str },
    /// Put directories of installed dependencies on `sys.path` (and take others off).
    Paths {
        id: u64,
        add: &'a [String],
        remove: &'a [String],
    },
    /// Import the top-level modules of these distributions (found in the sets on `sys.path`)
    /// into the runner, outside the code's namespace: a prepared sandbox's work before its first
    /// request (`runner/prepared.py`).
    Preload {
        id: u64,
        distributions: &'a [String],
    },
    /// A piece of a workspace file, read as the sandbox's user without following links.
    Read {
        id: u64,
        path: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        path_bytes: Option<String>,
        offset: u64,
        length: u64,
    },
    /// A piece of a file to write into the workspace as the sandbox's user (offset 0 creates it).
    Write {
        id: u64,
        path: &'a str,
        data: String,
        offset: u64,
    },
    /// Save the workspace and the namespace's variables into the runner's private snapshot
    /// file, stopping beyond `max_bytes` (`runner/snapshot.py`).
    Snapshot { id: u64, max_bytes: u64 },
    /// A piece of that snapshot file.
    #[serde(rename = "snapshot_read")]
    SnapshotRead { id: u64, offset: u64, length: u64 },
    /// A piece of a snapshot to restore, written into the runner's private upload file (offset 0
    /// starts it anew). The piece itself follows as one frame of raw bytes
    /// ([`Request::to_frame_with`]).
    #[serde(rename = "restore_write")]
    RestoreWrite { id: u64, offset: u64 },
    /// Unpack the uploaded snapshot: its files into the workspace, its variables into the
    /// namespace.
    Restore { id: u64 },
    /// Remove the runner's private snapshot and upload files.
    #[serde(rename = "snapshot_discard")]
    SnapshotDiscard { id: u64 },
}

impl Request<'_> {
    pub fn id(&self) -> u64 {
        match self {
            Request::Exec { id, .. }
            | Request::Shell { id, .. }
            | Request::List { id, .. }
            | Request::Paths { id, .. }
            | Request::Preload { id, .. }
            | Request::Read { id, .. }
            | Request::Write { id, .. }
            | Request::Snapshot { id, .. }
            | Request::SnapshotRead { id, .. }
            | Request::RestoreWrite { id, .. }
            | Request::Restore { id }
            | Request::SnapshotDiscard { id } => *id,
        }
    }

    pub fn to_frame(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        encode_frame(&serde_json::to_vec(self).unwrap_or_default())
    }

    /// The request's frame followed by one frame of raw bytes (a restore_write's piece).
    pub fn to_frame_with(&self, payload: &[u8]) -> Vec<u8> {
        let mut frames = self.to_frame();
        frames.extend_from_slice(&encode_frame(payload));
        frames
    }
}

/// A message from the runner, as parsed; see [`RawResult::validate`] for the checked form.
#[derive(Debug, Clone)]
pub enum Reply {
    Ready {
        python: String,
        /// What it said of its IPython (see `engine::runner_set`), bounded and on one line.
        ipython: RunnerIpython,
    },
    Result(Box<RawResult>),
    /// Output of a live execution so far, before its result.
    Output(RawLiveOutput),
    /// The code asked for `pip LINE` (`%pip`, `!pip`, the `pip` on its PATH) during execution
    /// `id`; answered with a `pip_reply` frame (`engine::pip`).
    Pip {
        id: u64,
        line: String,
    },
    Listing(RawListing),
    Paths {
        id: u64,
        missing: Vec<String>,
    },
    /// What a preload imported, and what failed to import (module names, at most 1000 each).
    Preloaded {
        id: u64,
        imported: Vec<String>,
        failed: Vec<String>,
    },
    /// From the supervisor: the runner died, and a new one is starting.
    Exited(RunnerExit),
    File(RawFileChunk),
    Written {
        id: u64,
        size: u64,
        error: Option<String>,
    },
    /// What a snapshot saved, or why it failed.
    Snapshot(RawSnapshotReport),
    /// What a restore brought back, or why it failed.
    Restored(RawRestoreReport),
    Discarded {
        id: u64,
    },
    /// A piece of the runner's snapshot file: raw bytes after the JSON (see [`Reply::parse`]).
    Piece {
        id: u64,
        data: Vec<u8>,
        error: Option<String>,
    },
}

/// A name the snapshot could not save (or the restore could not bring back), and why.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct NotSaved {
    pub name: String,
    pub reason: String,
}

/// The runner's account of a snapshot: untrusted, bounded by the parser (names and reasons are
/// cut to size by the engine).
#[derive(Debug, Clone, Deserialize)]
pub struct RawSnapshotReport {
    pub id: u64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub files: u64,
    #[serde(default)]
    pub file_bytes: u64,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub saved: Vec<String>,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub unsaved: Vec<NotSaved>,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub modules: Vec<String>,
}

/// The runner's account of a restore: untrusted, bounded like [`RawSnapshotReport`].
#[derive(Debug, Clone, Deserialize)]
pub struct RawRestoreReport {
    pub id: u64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub files: u64,
    #[serde(default)]
    pub file_bytes: u64,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub variables: Vec<String>,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub failed: Vec<NotSaved>,
    #[serde(default, deserialize_with = "at_most::<_, _, 10000>")]
    pub modules: Vec<String>,
}

#[derive(Deserialize)]
struct DiscardedBody {
    id: u64,
}

#[derive(Deserialize)]
struct PieceBody {
    id: u64,
    #[serde(default)]
    error: Option<String>,
}

/// The `type` of a reply, read first on its own: the body is then parsed straight into the one
/// struct it names. (serde's internally tagged enums buffer the whole message as generic values
/// first, which costs many times the frame's size in memory; the sandbox chooses that size.)
#[derive(Deserialize)]
struct ReplyType<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

#[derive(Deserialize)]
struct PipBody {
    id: u64,
    line: String,
}

#[derive(Deserialize)]
struct ReadyBody {
    python: String,
    /// The version of the IPython it imported.
    #[serde(default)]
    ipython: Option<String>,
    /// Why it could not import it.
    #[serde(default)]
    ipython_error: Option<String>,
}

/// The most characters kept of what a runner says of its IPython (a version, or why not).
const IPYTHON_SAID_MAX: usize = 1000;

impl ReadyBody {
    fn ipython(&self) -> RunnerIpython {
        let said = |text: &str| crate::text::one_line(text, IPYTHON_SAID_MAX);
        match (&self.ipython_error, &self.ipython) {
            (Some(why), _) => RunnerIpython::Failed(said(why)),
            (None, Some(version)) => RunnerIpython::Imported(said(version)),
            (None, None) => RunnerIpython::Unsaid,
        }
    }
}

#[derive(Deserialize)]
struct PathsBody {
    id: u64,
    #[serde(deserialize_with = "at_most::<_, _, 1000>")]
    missing: Vec<String>,
}

#[derive(Deserialize)]
struct PreloadedBody {
    id: u64,
    #[serde(default, deserialize_with = "at_most::<_, _, 1000>")]
    imported: Vec<String>,
    #[serde(default, deserialize_with = "at_most::<_, _, 1000>")]
    failed: Vec<String>,
}

/// Entries of one directory listing, at most.
pub const MAX_LISTED_ENTRIES: usize = 1000;

#[derive(Deserialize)]
struct WrittenBody {
    id: u64,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    error: Option<String>,
}

impl Reply {
    /// Parses one frame's body. The runner's JSON never holds a raw newline, so a body whose
    /// first line is a whole "piece" message carries raw bytes after that line; any other body
    /// is one JSON text.
    pub fn parse(body: &[u8]) -> Result<Reply, ProtocolError> {
        fn body_as<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtocolError> {
            serde_json::from_slice(body).map_err(|e| ProtocolError::Malformed(e.to_string()))
        }
        if let Some(newline) = body.iter().position(|&b| b == b'\n') {
            let (header, data) = (&body[..newline], &body[newline + 1..]);
            let piece =
                serde_json::from_slice::<ReplyType>(header).is_ok_and(|kind| kind.kind == "piece");
            if piece {
                let piece: PieceBody = body_as(header)?;
                return Ok(Reply::Piece {
                    id: piece.id,
                    data: data.to_vec(),
                    error: piece.error,
                });
            }
        }
        let kind: ReplyType = body_as(body)?;
        Ok(match kind.kind.as_ref() {
            "ready" => {
                let ready: ReadyBody = body_as(body)?;
                Reply::Ready {
                    ipython: ready.ipython(),
                    python: ready.python,
                }
            }
            "result" => Reply::Result(Box::new(body_as(body)?)),
            "output" => Reply::Output(body_as(body)?),
            "pip" => {
                let pip: PipBody = body_as(body)?;
                Reply::Pip {
                    id: pip.id,
                    line: pip.line,
                }
            }
            "listing" => Reply::Listing(body_as(body)?),
            "paths" => {
                let paths: PathsBody = body_as(body)?;
                Reply::Paths {
                    id: paths.id,
                    missing: paths.missing,
                }
            }
            "preloaded" => {
                let preloaded: PreloadedBody = body_as(body)?;
                Reply::Preloaded {
                    id: preloaded.id,
                    imported: preloaded.imported,
                    failed: preloaded.failed,
                }
            }
            "exited" => Reply::Exited(body_as(body)?),
            "file" => Reply::File(body_as(body)?),
            "written" => {
                let written: WrittenBody = body_as(body)?;
                Reply::Written {
                    id: written.id,
                    size: written.size,
                    error: written.error,
                }
            }
            "snapshot" => Reply::Snapshot(body_as(body)?),
            "restored" => Reply::Restored(body_as(body)?),
            "discarded" => Reply::Discarded {
                id: body_as::<DiscardedBody>(body)?.id,
            },
            "piece" => {
                let piece: PieceBody = body_as(body)?;
                Reply::Piece {
                    id: piece.id,
                    data: Vec::new(),
                    error: piece.error,
                }
            }
            other => {
                return Err(ProtocolError::Malformed(format!(
                    "unknown message type {:?}",
                    truncate_chars(other, 40)
                )))
            }
        })
    }
}

/// A piece of a workspace file, as the runner sent it.
#[derive(Debug, Clone, Deserialize)]
pub struct RawFileChunk {
    pub id: u64,
    /// Base64.
    #[serde(default)]
    pub data: String,
    /// The file's size when the piece was read (a hint: only the bytes received count).
    #[serde(default)]
    pub size: u64,
    /// `device:inode`: tells hard links to one file apart, and a file replaced between pieces.
    #[serde(default)]
    pub inode: String,
    /// Why the file could not be read (a link, a directory, permission denied, ...).
    #[serde(default)]
    pub error: Option<String>,
}

/// How a runner died, as the sandbox's supervisor reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct RunnerExit {
    /// The exit status, or minus the number of the signal that killed it.
    pub status: i32,
    /// The kernel killed a process for memory meanwhile (`None`: the runtime does not say).
    #[serde(default)]
    pub oom: Option<bool>,
    /// The host asked for it (after an unanswered interrupt, or to recycle the sandbox).
    #[serde(default)]
    pub requested: bool,
    /// After a recycle: how many entries are left where the code could write (0: none; -1: the
    /// wipe could not finish). Untrusted like every frame: only 0 lets the sandbox serve again.
    #[serde(default)]
    pub recycled: Option<i64>,
}

impl RunnerExit {
    /// The status a shell would report: 128 + the signal for a killed process.
    pub fn exit_code(&self) -> i32 {
        if self.status < 0 {
            128 - self.status
        } else {
            self.status
        }
    }

    /// The kernel said it killed for memory.
    pub fn out_of_memory(&self) -> bool {
        self.oom == Some(true)
    }
}

impl Reply {
    /// The request a reply answers (`None` for the start-up message).
    pub fn id(&self) -> Option<u64> {
        match self {
            Reply::Ready { .. } | Reply::Exited(_) => None,
            Reply::Result(r) => Some(r.id),
            Reply::Output(o) => Some(o.id),
            Reply::Listing(l) => Some(l.id),
            Reply::Paths { id, .. }
            | Reply::Pip { id, .. }
            | Reply::Written { id, .. }
            | Reply::Preloaded { id, .. }
            | Reply::Discarded { id }
            | Reply::Piece { id, .. } => Some(*id),
            Reply::File(f) => Some(f.id),
            Reply::Snapshot(s) => Some(s.id),
            Reply::Restored(r) => Some(r.id),
        }
    }
}

/// Output a live execution wrote since the last such message, as the runner sent it: base64 of
/// the latest bytes of each stream, and how many earlier ones it skipped; `cleared` when the code
/// cleared its output (`clear_output()`) since, the text then being only what came after.
#[derive(Debug, Clone, Deserialize)]
pub struct RawLiveOutput {
    pub id: u64,
    #[serde(default)]
    pub cleared: bool,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_skipped: u64,
    #[serde(default)]
    pub stderr_skipped: u64,
    /// The text of both streams in the order the code wrote it: `[stream, bytes]` pieces (0
    /// stdout, 1 stderr) covering each stream's text once; none: stdout's, then stderr's.
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_LIVE_PIECES>")]
    pub order: Vec<[u64; 2]>,
}

/// The most of each stream one live output message passes on (the runner sends 2 KiB).
pub const MAX_LIVE_BYTES: usize = 4096;
/// The most pieces a live output message's order has (the runner sends 64 at most).
pub const MAX_LIVE_PIECES: usize = 64;

/// Output of a live execution so far, decoded and bounded: text is lossily UTF-8, at most
/// [`MAX_LIVE_BYTES`] of each stream (the latest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveOutput {
    /// What was shown before is gone (the code cleared its output): the text is what came after.
    pub cleared: bool,
    pub stdout: String,
    pub stderr: String,
    /// Bytes of each stream written meanwhile but not in the text (the runner's and this bound's).
    pub stdout_skipped: u64,
    pub stderr_skipped: u64,
    /// The two texts' pieces in the order the code wrote them, as byte lengths of `stdout` and
    /// `stderr` (see [`LiveOutput::in_order`]); empty: stdout's text, then stderr's.
    pub order: Vec<(StreamName, usize)>,
}

impl LiveOutput {
    /// Both streams' text in the order the code wrote it: `order`'s pieces when they cover each
    /// text exactly, at characters' starts; else stdout's text, then stderr's.
    pub fn in_order(&self) -> Vec<(StreamName, &str)> {
        let mut pieces = Vec::with_capacity(self.order.len());
        let mut at = [0usize; 2];
        for &(stream, size) in &self.order {
            let (text, at) = match stream {
                StreamName::Stdout => (&self.stdout, &mut at[0]),
                StreamName::Stderr => (&self.stderr, &mut at[1]),
            };
            match at
                .checked_add(size)
                .and_then(|end| Some((end, text.get(*at..end)?)))
            {
                Some((end, piece)) => {
                    *at = end;
                    pieces.push((stream, piece));
                }
                None => break,
            }
        }
        if self.order.is_empty()
            || pieces.len() != self.order.len()
            || at != [self.stdout.len(), self.stderr.len()]
        {
            pieces = vec![
                (StreamName::Stdout, self.stdout.as_str()),
                (StreamName::Stderr, self.stderr.as_str()),
            ];
        }
        pieces.retain(|(_, text)| !text.is_empty());
        pieces
    }

    /// The same output with each piece of its text replaced by what `f` makes of it, in order
    /// (what a redaction that holds text back moves stays in its stream).
    pub fn map_text(self, mut f: impl FnMut(StreamName, &str) -> String) -> LiveOutput {
        let mut mapped = LiveOutput {
            cleared: self.cleared,
            stdout_skipped: self.stdout_skipped,
            stderr_skipped: self.stderr_skipped,
            ..LiveOutput::default()
        };
        for (stream, piece) in self.in_order() {
            mapped.push(stream, &f(stream, piece));
        }
        mapped
    }

    /// This output, then `later`'s (live output messages held back by a rate, passed as one): a
    /// later clear leaves only what came after it; the whole keeps the latest [`MAX_LIVE_BYTES`]
    /// of each stream and [`MAX_LIVE_PIECES`] pieces, and what it drops counts as skipped.
    pub fn then(self, later: LiveOutput) -> LiveOutput {
        if later.cleared {
            return later;
        }
        let mut pieces: Vec<(StreamName, &str)> = self.in_order();
        pieces.extend(later.in_order());
        let mut skipped = [
            self.stdout_skipped.saturating_add(later.stdout_skipped),
            self.stderr_skipped.saturating_add(later.stderr_skipped),
        ];
        // The bytes over the bound at each stream's front, up to the start of a character.
        let mut over = [&self.stdout, &self.stderr].map(|earlier| earlier.len());
        over[0] += later.stdout.len();
        over[1] += later.stderr.len();
        let mut over = over.map(|total| total.saturating_sub(MAX_LIVE_BYTES));
        let first_kept = pieces.len().saturating_sub(MAX_LIVE_PIECES);
        let mut merged = LiveOutput {
            cleared: self.cleared,
            ..LiveOutput::default()
        };
        for (index, (stream, piece)) in pieces.into_iter().enumerate() {
            let at = match stream {
                StreamName::Stdout => 0,
                StreamName::Stderr => 1,
            };
            let mut cut = if index < first_kept {
                piece.len()
            } else {
                over[at].min(piece.len())
            };
            while !piece.is_char_boundary(cut) {
                cut += 1;
            }
            over[at] = over[at].saturating_sub(cut);
            skipped[at] = skipped[at].saturating_add(cut as u64);
            merged.push(stream, &piece[cut..]);
        }
        merged.stdout_skipped = skipped[0];
        merged.stderr_skipped = skipped[1];
        merged
    }

    /// `text` written to `stream` after what is there.
    pub(super) fn push(&mut self, stream: StreamName, text: &str) {
        if text.is_empty() {
            return;
        }
        match stream {
            StreamName::Stdout => self.stdout.push_str(text),
            StreamName::Stderr => self.stderr.push_str(text),
        }
        match self.order.last_mut() {
            Some((last, size)) if *last == stream => *size += text.len(),
            _ => self.order.push((stream, text.len())),
        }
    }
}

impl RawLiveOutput {
    /// Decodes the message; whatever it claims, only the last [`MAX_LIVE_BYTES`] of each stream
    /// are decoded (the base64 is cut from its end first, so a long one costs no more), and a
    /// character cut at the start is dropped. Base64 that does not decode counts as skipped.
    pub fn decode(&self) -> LiveOutput {
        // The bytes of the latest of a stream's text, the bytes cut from its front, the skipped.
        fn tail(b64: &str, skipped: u64) -> (Vec<u8>, u64, u64) {
            // Base64's 4-character groups from the end decode on their own.
            let groups = MAX_LIVE_BYTES.div_ceil(3) * 4;
            let start = b64.len().saturating_sub(groups);
            let start = start + (b64.len() - start) % 4;
            let mut cut = (start / 4 * 3) as u64;
            let Some(Ok(mut bytes)) = b64
                .get(start..)
                .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
            else {
                let lost = (b64.len() / 4 * 3) as u64;
                return (Vec::new(), lost, skipped.saturating_add(lost));
            };
            if bytes.len() > MAX_LIVE_BYTES {
                let over = bytes.len() - MAX_LIVE_BYTES;
                bytes.drain(..over);
                cut += over as u64;
            }
            // UTF-8 continuation bytes at the start are the rest of a character cut off.
            let partial = bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0xC0) == 0x80)
                .count();
            bytes.drain(..partial);
            cut += partial as u64;
            (bytes, cut, skipped.saturating_add(cut))
        }
        let (stdout, stdout_cut, stdout_skipped) = tail(&self.stdout, self.stdout_skipped);
        let (stderr, stderr_cut, stderr_skipped) = tail(&self.stderr, self.stderr_skipped);
        let mut live = LiveOutput {
            cleared: self.cleared,
            stdout_skipped,
            stderr_skipped,
            ..LiveOutput::default()
        };
        let texts = [
            (StreamName::Stdout, stdout, stdout_cut),
            (StreamName::Stderr, stderr, stderr_cut),
        ];
        // The runner's pieces, when they cover its texts exactly: each decoded on its own (what
        // was cut from a text's front is taken from its first pieces).
        let sums = self
            .order
            .iter()
            .fold([0u64; 2], |mut sums, &[stream, size]| {
                if let Some(sum) = sums.get_mut(stream as usize) {
                    *sum = sum.saturating_add(size);
                } else {
                    sums = [u64::MAX; 2];
                }
                sums
            });
        let whole = texts
            .each_ref()
            .map(|(_, bytes, cut)| cut + bytes.len() as u64);
        if self.order.is_empty() || sums != whole {
            for (stream, bytes, _) in &texts {
                live.push(*stream, &String::from_utf8_lossy(bytes));
            }
            return live;
        }
        let mut at = [0u64; 2];
        for &[stream, size] in &self.order {
            let (name, bytes, cut) = &texts[stream as usize];
            let end = at[stream as usize] + size;
            let from = at[stream as usize].max(*cut) - cut;
            let to = end.max(*cut) - cut;
            at[stream as usize] = end;
            if let Some(piece) = bytes.get(from as usize..to as usize) {
                live.push(*name, &String::from_utf8_lossy(piece));
            }
        }
        live
    }
}

/// A directory listing, as the runner sent it.
#[derive(Debug, Clone, Deserialize)]
pub struct RawListing {
    pub id: u64,
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_LISTED_ENTRIES>")]
    pub entries: Vec<DirEntry>,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub error: Option<String>,
}

/// One entry of a workspace directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `directory`, `symlink` or `special` (FIFO, socket, device).
    pub kind: String,
    pub size: u64,
}

/// A workspace entry an execution created or changed, as the runner reported it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChangedEntry {
    /// Relative to `/workspace`, `/`-separated; bytes that are not UTF-8 replaced by U+FFFD.
    pub path: String,
    /// The path's exact bytes (base64) when they are not UTF-8: how to name the file back.
    #[serde(default)]
    pub path_bytes: Option<String>,
    /// `file`, `symlink` or `special`.
    pub kind: String,
    pub size: u64,
}

/// An entry an execution created or changed in one of the client's writable roots
/// (`/mnt/roots/<root>/<path>`), as the runner reported it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RootChangedEntry {
    /// The root's mount name.
    pub root: String,
    #[serde(flatten)]
    pub entry: ChangedEntry,
}

/// Most entries a result may name, and the bytes of their paths: the runner counts the rest.
pub const MAX_CHANGED_ENTRIES: usize = 1000;
pub const MAX_CHANGED_PATH_BYTES: usize = 256 << 10;
/// The workspace entries the runner tracks; beyond them changes are not seen at all.
pub const MAX_TRACKED_ENTRIES: usize = 10_000;
/// Figures an execution may return, and their total size.
pub const MAX_FIGURES: usize = 8;
pub const MAX_FIGURES_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, Deserialize)]
pub struct RawResult {
    pub id: u64,
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    /// Bytes dropped between each stream's head and tail (over the output limit), the lines they
    /// span, and where in the kept bytes the cut is (the head's length; the end when not given).
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
    #[serde(default)]
    pub stdout_dropped_lines: u64,
    #[serde(default)]
    pub stderr_dropped_lines: u64,
    #[serde(default)]
    pub stdout_cut_at: Option<u64>,
    #[serde(default)]
    pub stderr_cut_at: Option<u64>,
    pub duration_ms: f64,
    pub interrupted: bool,
    pub error: Option<RaisedException>,
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_CHANGED_ENTRIES>")]
    pub files: Vec<ChangedEntry>,
    /// Changed entries the runner did not name (over its count or path-bytes bound).
    #[serde(default)]
    pub files_left_out: u64,
    #[serde(default)]
    pub files_truncated: bool,
    /// The same, in the client's writable roots (`SANDBOX_ROOTS=rw`).
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_CHANGED_ENTRIES>")]
    pub root_files: Vec<RootChangedEntry>,
    #[serde(default)]
    pub root_files_left_out: u64,
    #[serde(default)]
    pub root_files_truncated: bool,
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_FIGURES>")]
    pub figures: Vec<String>,
    /// Displays, the last expression's value and the error, in order; each with the stream
    /// positions it came at (the stream text is cut from `stdout`/`stderr` here).
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_OUTPUTS>")]
    pub outputs: Vec<RawOutput>,
    /// Outputs the runner dropped (over its count or size bounds).
    #[serde(default)]
    pub outputs_dropped: u64,
    /// Stream positions where the code wrote to stdout after it wrote to stderr: stderr text up to
    /// there came before stdout text past there ([`super::displays::ordered`]).
    #[serde(default, deserialize_with = "at_most::<_, _, MAX_STREAM_SWITCHES>")]
    pub switches: Vec<[u64; 2]>,
    /// The shell's count of this execution (`In [n]`); none for a shell command or an empty cell.
    #[serde(default)]
    pub execution_count: Option<u64>,
}

/// The exception that ended the code, when one did.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct RaisedException {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// An execution's outcome as reported by the runner, decoded and bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerResult {
    /// Each stream as kept: whole, or its head and tail with a line for what was dropped between.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes the code wrote beyond the output cap (counted, not kept), both streams.
    pub dropped_bytes: u64,
    /// What was dropped from stdout and from stderr, and where the line that says so is.
    pub discarded: [Option<Discarded>; 2],
    pub exit_code: i32,
    pub duration_ms: f64,
    pub interrupted: bool,
    pub error: Option<RaisedException>,
    /// Workspace entries the execution created or changed (paths checked, not yet copied).
    pub changed: Vec<ChangedEntry>,
    /// Changed entries not named in `changed` (over the listing's bounds).
    pub changed_left_out: u64,
    /// More entries changed than the runner tracks.
    pub changed_truncated: bool,
    /// The same in the writable roots (root names and paths checked).
    pub root_changed: Vec<RootChangedEntry>,
    pub root_changed_left_out: u64,
    pub root_changed_truncated: bool,
    /// PNG images of the matplotlib figures shown (displayed by matplotlib's inline backend).
    pub figures: Vec<Vec<u8>>,
    /// Everything the code showed, in order (nbformat v4 outputs), its clears and updates applied.
    pub outputs: Vec<Output>,
    /// The code cleared its output: `outputs` is what a notebook shows, the streams are whole.
    pub outputs_cleared: bool,
    /// The shell's count of this execution, as the runner said.
    pub execution_count: Option<u64>,
    /// Outputs dropped over their bounds.
    pub outputs_dropped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("the sandbox announced a {size}-byte message, more than the {limit}-byte limit")]
    FrameTooLarge { size: usize, limit: usize },
    #[error("the sandbox sent a malformed message: {0}")]
    Malformed(String),
    #[error("the sandbox answered request {got} while request {expected} was pending")]
    WrongId { expected: u64, got: u64 },
}

impl RawResult {
    /// Decodes the output and holds the runner to the cap it was given: whatever it claims, no
    /// more than `max_output` bytes of output are kept on the host (and one line for each stream
    /// cut, where its dropped bytes were).
    pub fn validate(
        self,
        expected_id: u64,
        max_output: u64,
    ) -> Result<RunnerResult, ProtocolError> {
        if self.id != expected_id {
            return Err(ProtocolError::WrongId {
                expected: expected_id,
                got: self.id,
            });
        }
        let decode = |s: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| ProtocolError::Malformed(format!("output is not base64: {e}")))
        };
        let mut stdout = decode(&self.stdout)?;
        let mut stderr = decode(&self.stderr)?;
        let cap = usize::try_from(max_output).unwrap_or(usize::MAX);
        let mut dropped = [self.stdout_dropped, self.stderr_dropped];
        if stdout.len() > cap {
            dropped[0] = dropped[0].saturating_add((stdout.len() - cap) as u64);
            stdout.truncate(cap);
        }
        let room = cap - stdout.len();
        if stderr.len() > room {
            dropped[1] = dropped[1].saturating_add((stderr.len() - room) as u64);
            stderr.truncate(room);
        }
        let cut_at = |at: Option<u64>, len: usize| {
            at.map_or(len, |at| usize::try_from(at).unwrap_or(usize::MAX).min(len))
        };
        let stdout_cut = cut_at(self.stdout_cut_at, stdout.len());
        let stderr_cut = cut_at(self.stderr_cut_at, stderr.len());
        let (stdout, stdout_discarded) = mark_discarded(
            stdout,
            StreamName::Stdout,
            stdout_cut,
            dropped[0],
            self.stdout_dropped_lines,
            max_output,
        );
        let (stderr, stderr_discarded) = mark_discarded(
            stderr,
            StreamName::Stderr,
            stderr_cut,
            dropped[1],
            self.stderr_dropped_lines,
            max_output,
        );
        let duration_ms = if self.duration_ms.is_finite() && self.duration_ms >= 0.0 {
            self.duration_ms
        } else {
            0.0
        };
        let exit_code = i32::try_from(self.exit_code).unwrap_or(if self.exit_code < 0 {
            i32::MIN
        } else {
            i32::MAX
        });
        let error = self.error.map(|e| RaisedException {
            kind: truncate_chars(&e.kind, 200),
            message: truncate_chars(&e.message, 1000),
        });
        let path_bytes: usize = self.files.iter().map(|f| f.path.len()).sum();
        if self.files.len() > MAX_CHANGED_ENTRIES || path_bytes > MAX_CHANGED_PATH_BYTES * 3 {
            return Err(ProtocolError::Malformed(format!(
                "{} changed files reported ({path_bytes} bytes of paths)",
                self.files.len()
            )));
        }
        let mut changed = Vec::with_capacity(self.files.len());
        for entry in self.files {
            check_changed_path(&entry)?;
            changed.push(entry);
        }
        let root_bytes: usize = self.root_files.iter().map(|f| f.entry.path.len()).sum();
        if root_bytes > MAX_CHANGED_PATH_BYTES * 3 {
            return Err(ProtocolError::Malformed(format!(
                "{root_bytes} bytes of changed paths in roots"
            )));
        }
        for entry in &self.root_files {
            check_changed_path(&entry.entry)?;
            if !is_safe_relative_path(&entry.root) || entry.root.contains('/') {
                return Err(ProtocolError::Malformed(format!(
                    "unsafe root name {:?}",
                    truncate_chars(&entry.root, 100)
                )));
            }
        }
        if self.figures.len() > MAX_FIGURES {
            return Err(ProtocolError::Malformed(format!(
                "{} figures",
                self.figures.len()
            )));
        }
        let mut figures = Vec::with_capacity(self.figures.len());
        let mut figures_size = 0;
        for figure in &self.figures {
            let png = decode(figure)?;
            figures_size += png.len();
            if figures_size > MAX_FIGURES_BYTES || !png.starts_with(b"\x89PNG\r\n\x1a\n") {
                return Err(ProtocolError::Malformed(
                    "a figure is not a PNG image within the limits".into(),
                ));
            }
            figures.push(png);
        }
        let shown = super::displays::ordered(
            self.outputs,
            &self.switches,
            &stdout,
            &stderr,
            [stdout_discarded.as_ref(), stderr_discarded.as_ref()],
        );
        Ok(RunnerResult {
            outputs: shown.outputs,
            outputs_cleared: shown.cleared,
            execution_count: self.execution_count,
            outputs_dropped: self.outputs_dropped,
            stdout,
            stderr,
            dropped_bytes: dropped[0].saturating_add(dropped[1]),
            discarded: [stdout_discarded, stderr_discarded],
            exit_code,
            duration_ms,
            interrupted: self.interrupted,
            error,
            changed,
            changed_left_out: self.files_left_out,
            changed_truncated: self.files_truncated,
            root_changed: self.root_files,
            root_changed_left_out: self.root_files_left_out,
            root_changed_truncated: self.root_files_truncated,
            figures,
        })
    }
}

/// A changed entry's path (and its raw bytes) stays inside the directory it was reported in.
fn check_changed_path(entry: &ChangedEntry) -> Result<(), ProtocolError> {
    let raw_ok = entry.path_bytes.as_deref().is_none_or(|raw| {
        base64::engine::general_purpose::STANDARD
            .decode(raw)
            .is_ok_and(|bytes| is_safe_relative_path_bytes(&bytes))
    });
    if !is_safe_relative_path(&entry.path) || !raw_ok {
        return Err(ProtocolError::Malformed(format!(
            "unsafe path {:?}",
            truncate_chars(&entry.path, 100)
        )));
    }
    Ok(())
}

/// A path relative to the workspace that cannot leave it: `/`-separated normal components only.
pub fn is_safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// [`is_safe_relative_path`] for a path's raw bytes.
pub fn is_safe_relative_path_bytes(path: &[u8]) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && path[0] != b'/'
        && !path.contains(&0)
        && path
            .split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Splits the runner's stdout byte stream into frames, never buffering more than one frame of at
/// most `max_frame` bytes.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    max_frame: usize,
}

impl FrameDecoder {
    pub fn new(max_frame: usize) -> Self {
        FrameDecoder {
            buffer: Vec::new(),
            max_frame,
        }
    }

    /// The frame size needed to carry `max_output` bytes of output (base64 grows it by 4/3) plus the
    /// JSON around it.
    pub fn limit_for_output(max_output: u64) -> usize {
        let output = usize::try_from(max_output).unwrap_or(usize::MAX / 2);
        // Output and figures travel base64-encoded; the list of changed files is bounded too
        // (paths, their raw bytes in base64, and the JSON around each entry).
        let changed_list = MAX_CHANGED_PATH_BYTES * 3 + MAX_CHANGED_ENTRIES * 128;
        // The outputs other than streams are within the output cap too (as JSON), plus their
        // frame around each.
        let outputs = output.saturating_add(MAX_OUTPUTS * 1024 + MAX_STREAM_SWITCHES * 48);
        output.saturating_add(MAX_FIGURES_BYTES).saturating_mul(4) / 3
            + outputs
            + changed_list
            + 64 * 1024
    }

    /// Appends bytes received from the runner.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ProtocolError> {
        self.buffer.extend_from_slice(bytes);
        self.check_header()
    }

    fn check_header(&self) -> Result<(), ProtocolError> {
        if let Some(size) = self.announced() {
            if size > self.max_frame {
                return Err(ProtocolError::FrameTooLarge {
                    size,
                    limit: self.max_frame,
                });
            }
        }
        // More bytes than one frame can hold are pending only if the runner pipelines replies we
        // did not ask for; refuse rather than grow.
        if self.buffer.len() > self.max_frame.saturating_add(4) * 2 {
            return Err(ProtocolError::Malformed(
                "more data than any reply can hold".into(),
            ));
        }
        Ok(())
    }

    fn announced(&self) -> Option<usize> {
        let header: [u8; 4] = self.buffer.get(..4)?.try_into().ok()?;
        Some(u32::from_be_bytes(header) as usize)
    }

    /// Takes the next complete frame and parses it, if one is buffered.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, ProtocolError> {
        let Some(size) = self.announced() else {
            return Ok(None);
        };
        if size > self.max_frame {
            return Err(ProtocolError::FrameTooLarge {
                size,
                limit: self.max_frame,
            });
        }
        if self.buffer.len() < 4 + size {
            return Ok(None);
        }
        let reply = Reply::parse(&self.buffer[4..4 + size]);
        self.buffer.drain(..4 + size);
        let reply = reply?;
        self.check_header()?;
        Ok(Some(reply))
    }

    /// Changes the frame limit (requests with a different output cap need a different bound).
    pub fn set_limit(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_carries_raw_bytes_after_its_json_and_nothing_else_does() {
        let mut body = br#"{"type":"piece","id":7,"size":9}"#.to_vec();
        body.push(b'\n');
        body.extend_from_slice(b"raw\n\0bytes");
        match Reply::parse(&body) {
            Ok(Reply::Piece { id, data, error }) => {
                assert_eq!(
                    (id, data.as_slice(), error),
                    (7, &b"raw\n\0bytes"[..], None)
                )
            }
            other => panic!("{other:?}"),
        }
        match Reply::parse(br#"{"type":"piece","id":7,"error":"gone"}"#) {
            Ok(Reply::Piece { data, error, .. }) => {
                assert!(data.is_empty());
                assert_eq!(error.as_deref(), Some("gone"));
            }
            other => panic!("{other:?}"),
        }
        let smuggled = b"{\"type\":\"written\",\"id\":1,\"size\":2}\nextra";
        assert!(matches!(
            Reply::parse(smuggled),
            Err(ProtocolError::Malformed(_))
        ));
    }

    #[test]
    fn every_runner_module_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine/python/runner");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("the runner's directory")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with(".py"))
            .map(|name| match name.trim_end_matches(".py") {
                "__init__" => "sandbox_runner".to_owned(),
                module => format!("sandbox_runner.{module}"),
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = RUNNER_MODULES
            .iter()
            .map(|(name, _)| (*name).to_owned())
            .collect();
        assert_eq!(
            embedded, on_disk,
            "RUNNER_MODULES lists every file of python/runner/, sorted"
        );
    }

    #[test]
    fn runner_start_is_the_loader_then_the_modules() {
        fn split_frame(bytes: &[u8]) -> (&[u8], &[u8]) {
            let (header, rest) = bytes.split_at(4);
            let size = u32::from_be_bytes(header.try_into().expect("a 4-byte header")) as usize;
            rest.split_at(size)
        }
        let frames = runner_start_frames();
        let (loader, rest) = split_frame(&frames);
        assert_eq!(loader, RUNNER_LOADER.as_bytes());
        let (modules, rest) = split_frame(rest);
        assert!(rest.is_empty());
        let modules: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(modules).expect("a JSON object of sources");
        assert_eq!(modules.len(), RUNNER_MODULES.len());
        assert_eq!(
            modules["sandbox_runner.protocol"],
            include_str!("python/runner/protocol.py")
        );
    }

    fn result_json(id: u64, stdout: &[u8]) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(stdout);
        format!(
            r#"{{"type":"result","id":{id},"exit_code":0,"stdout":"{b64}","stderr":"","stdout_dropped":0,"stderr_dropped":0,"duration_ms":1.5,"interrupted":false,"error":null}}"#
        )
        .into_bytes()
    }

    #[test]
    fn frames_split_across_pushes_are_reassembled() {
        let frame = encode_frame(&result_json(7, b"hi\n"));
        let mut decoder = FrameDecoder::new(1 << 16);
        for byte in &frame[..frame.len() - 1] {
            decoder.push(std::slice::from_ref(byte)).unwrap();
            assert!(decoder.next_reply().unwrap().is_none());
        }
        decoder.push(&frame[frame.len() - 1..]).unwrap();
        let Some(Reply::Result(raw)) = decoder.next_reply().unwrap() else {
            panic!("no result")
        };
        let result = raw.validate(7, 1024).unwrap();
        assert_eq!(result.stdout, b"hi\n");
        assert!(decoder.next_reply().unwrap().is_none());
    }

    #[test]
    fn long_lists_stop_parsing_at_their_bound() {
        let entry = r#"{"path":"a","kind":"file","size":0}"#;
        let many = vec![entry; MAX_CHANGED_ENTRIES + 1].join(",");
        let body = format!(
            r#"{{"type":"result","id":1,"exit_code":0,"stdout":"","stderr":"","stdout_dropped":0,"stderr_dropped":0,"duration_ms":1,"interrupted":false,"error":null,"files":[{many}]}}"#
        );
        let error = Reply::parse(body.as_bytes()).unwrap_err();
        assert!(
            error.to_string().contains("more than 1000 items"),
            "{error}"
        );
        let fits = vec![entry; MAX_CHANGED_ENTRIES].join(",");
        let body = body.replace(&many, &fits);
        assert!(
            matches!(Reply::parse(body.as_bytes()), Ok(Reply::Result(r)) if r.files.len() == 1000)
        );
    }

    #[test]
    fn replies_parse_by_their_type_and_unknown_types_are_errors() {
        let ready = Reply::parse(br#"{"type":"ready","python":"3.11.2","pid":7}"#).unwrap();
        assert!(matches!(
            ready,
            Reply::Ready { python, ipython: RunnerIpython::Unsaid } if python == "3.11.2"
        ));
        let ready =
            Reply::parse(br#"{"type":"ready","python":"3.11.2","ipython":"9.18.1"}"#).unwrap();
        assert!(matches!(
            ready,
            Reply::Ready { ipython: RunnerIpython::Imported(v), .. } if v == "9.18.1"
        ));
        // Why not is untrusted: on one line, bounded; it wins over a version said beside it.
        let long = "x".repeat(5000);
        let frame = format!(
            r#"{{"type":"ready","python":"3","ipython":"9","ipython_error":"No module\nnamed {long}"}}"#
        );
        match Reply::parse(frame.as_bytes()).unwrap() {
            Reply::Ready {
                ipython: RunnerIpython::Failed(why),
                ..
            } => {
                assert!(why.starts_with("No module named xx"), "{why}");
                assert_eq!(why.chars().count(), IPYTHON_SAID_MAX);
            }
            other => panic!("{other:?}"),
        }
        let file = Reply::parse(br#"{"type":"file","id":3,"data":"aGk=","size":2,"inode":"1:2"}"#);
        assert!(matches!(file, Ok(Reply::File(f)) if f.id == 3 && f.data == "aGk="));
        let written = Reply::parse(br#"{"type":"written","id":4,"error":"a directory"}"#);
        assert!(matches!(
            written,
            Ok(Reply::Written {
                id: 4,
                error: Some(_),
                ..
            })
        ));
        assert!(Reply::parse(br#"{"type":"surprise","id":1}"#).is_err());
        assert!(Reply::parse(br#"{"id":1}"#).is_err());
        assert!(Reply::parse(b"[1,2]").is_err());
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_buffered() {
        let mut decoder = FrameDecoder::new(1024);
        let err = decoder.push(&u32::MAX.to_be_bytes()).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for junk in [
            &b"\x00\x00\x00\x03abc"[..],
            b"\x00\x00\x00\x02{}",
            b"\x00\x00\x00\x04null",
        ] {
            let mut decoder = FrameDecoder::new(1024);
            decoder.push(junk).unwrap();
            assert!(
                matches!(decoder.next_reply(), Err(ProtocolError::Malformed(_))),
                "{junk:?}"
            );
        }
        let mut decoder = FrameDecoder::new(1024);
        let bad = br#"{"type":"result","id":1,"exit_code":0,"stdout":"!!","stderr":"","stdout_dropped":0,"stderr_dropped":0,"duration_ms":0,"interrupted":false,"error":null}"#;
        decoder.push(&encode_frame(bad)).unwrap();
        let Some(Reply::Result(raw)) = decoder.next_reply().unwrap() else {
            panic!()
        };
        assert!(matches!(
            raw.validate(1, 10),
            Err(ProtocolError::Malformed(_))
        ));
    }

    #[test]
    fn a_reply_to_another_request_is_refused() {
        let mut decoder = FrameDecoder::new(1 << 16);
        decoder.push(&encode_frame(&result_json(2, b""))).unwrap();
        let Some(Reply::Result(raw)) = decoder.next_reply().unwrap() else {
            panic!()
        };
        assert_eq!(
            raw.validate(1, 10),
            Err(ProtocolError::WrongId {
                expected: 1,
                got: 2
            })
        );
    }

    #[test]
    fn output_beyond_the_cap_is_cut_on_the_host_too() {
        let mut decoder = FrameDecoder::new(1 << 16);
        decoder
            .push(&encode_frame(&result_json(1, &[b'x'; 100])))
            .unwrap();
        let Some(Reply::Result(raw)) = decoder.next_reply().unwrap() else {
            panic!()
        };
        let result = raw.validate(1, 10).unwrap();
        assert_eq!(result.dropped_bytes, 90);
        // The 10 bytes kept, then the line for the rest.
        assert_eq!(
            String::from_utf8_lossy(&result.stdout),
            "xxxxxxxxxx\n[… 90 bytes (1 line) of stdout not kept here: over the 10 bytes output \
             limit (SANDBOX_MAX_OUTPUT) …]\n"
        );
        let cut = result.discarded[0].clone().expect("stdout was cut");
        assert_eq!((cut.at, cut.tail, cut.bytes), (10, 0, 90));
        assert_eq!(cut.range().end, result.stdout.len());
        assert!(result.discarded[1].is_none());
    }

    #[test]
    fn a_stream_cut_in_its_middle_has_the_line_there_and_outputs_around_it_in_order() {
        use super::super::displays::{Output, StreamName};
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        // As written: "a\nb\n" + 1000 lines of "m\n" + "y\nz\n"; displays before the cut, in the
        // dropped middle (two), at the tail's start and in the tail. Stderr is whole.
        let display = |name: &str, at: u64| {
            format!(
                r#"{{"output_type":"display_data","data":[["text/plain","{name}"]],"at":[{at},0]}}"#
            )
        };
        let frame = format!(
            r#"{{"type":"result","id":1,"exit_code":0,"stdout":"{}","stderr":"{}","stdout_dropped":2000,"stderr_dropped":0,"stdout_dropped_lines":1000,"stdout_cut_at":4,"duration_ms":1,"interrupted":false,"error":null,"outputs":[{},{},{},{},{}]}}"#,
            b64(b"a\nb\ny\nz\n"),
            b64(b"e\n"),
            display("before", 2),
            display("middle 1", 5),
            display("middle 2", 1000),
            display("tail start", 2004),
            display("in tail", 2006),
        );
        let Ok(Reply::Result(raw)) = Reply::parse(frame.as_bytes()) else {
            panic!("not a result")
        };
        let result = raw.validate(1, 100).unwrap();
        let line = "[… 2000 bytes (1000 lines) of stdout not kept here: over the 100 bytes output \
                    limit (SANDBOX_MAX_OUTPUT) …]\n";
        assert_eq!(
            String::from_utf8_lossy(&result.stdout),
            format!("a\nb\n{line}y\nz\n")
        );
        assert_eq!(result.dropped_bytes, 2000);
        let cut = result.discarded[0].clone().expect("stdout was cut");
        assert_eq!((cut.at, cut.tail, cut.lines), (4, 4, 1000));
        assert_eq!(&result.stdout[cut.range()], line.as_bytes());
        let stream = |text: &str| Output::Stream {
            name: StreamName::Stdout,
            text: text.into(),
        };
        let shown = |name: &str| Output::display(vec![("text/plain".into(), name.into())]);
        assert_eq!(
            result.outputs,
            vec![
                stream("a\n"),
                shown("before"),
                stream(&format!("b\n{line}")),
                shown("middle 1"),
                shown("middle 2"),
                shown("tail start"),
                stream("y\n"),
                shown("in tail"),
                stream("z\n"),
                Output::Stream {
                    name: StreamName::Stderr,
                    text: "e\n".into()
                },
            ]
        );
        // A head that does not end a line (no line break in it): the line starts a line of its own.
        let frame = format!(
            r#"{{"type":"result","id":1,"exit_code":0,"stdout":"{}","stderr":"","stdout_dropped":5,"stderr_dropped":0,"stdout_dropped_lines":1,"stdout_cut_at":3,"duration_ms":1,"interrupted":false,"error":null}}"#,
            b64(b"abcxyz"),
        );
        let Ok(Reply::Result(raw)) = Reply::parse(frame.as_bytes()) else {
            panic!("not a result")
        };
        let result = raw.validate(1, 100).unwrap();
        assert!(
            String::from_utf8_lossy(&result.stdout)
                .starts_with("abc\n[… 5 bytes (1 line) of stdout")
                && result.stdout.ends_with("…]\nxyz".as_bytes())
        );
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/.",
            "a\0b",
        ] {
            assert!(!is_safe_relative_path(bad), "{bad:?}");
        }
        for good in [
            "a",
            "a/b.txt",
            "dir/sub/file with spaces.csv",
            "ünïcode.txt",
            "..hidden",
        ] {
            assert!(is_safe_relative_path(good), "{good:?}");
        }
        let mut decoder = FrameDecoder::new(1 << 16);
        let bad = br#"{"type":"result","id":1,"exit_code":0,"stdout":"","stderr":"","stdout_dropped":0,"stderr_dropped":0,"duration_ms":0,"interrupted":false,"error":null,"files":[{"path":"../../etc/passwd","kind":"file","size":1}]}"#;
        decoder.push(&encode_frame(bad)).unwrap();
        let Some(Reply::Result(raw)) = decoder.next_reply().unwrap() else {
            panic!()
        };
        assert!(matches!(
            raw.validate(1, 10),
            Err(ProtocolError::Malformed(_))
        ));
    }

    #[test]
    fn live_output_is_decoded_within_its_bound() {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let frame = format!(
            r#"{{"type":"output","id":4,"stdout":"{}","stderr":"{}","stdout_skipped":10}}"#,
            b64(b"step 1\n"),
            b64("é".repeat(MAX_LIVE_BYTES).as_bytes()),
        );
        let Ok(Reply::Output(raw)) = Reply::parse(frame.as_bytes()) else {
            panic!("not output")
        };
        assert_eq!(raw.id, 4);
        let live = raw.decode();
        assert_eq!(live.stdout, "step 1\n");
        assert_eq!(live.stdout_skipped, 10);
        // Only the latest bytes, and no character cut in two.
        assert!(live.stderr.len() <= MAX_LIVE_BYTES && live.stderr.len() >= MAX_LIVE_BYTES - 3);
        assert!(
            live.stderr.chars().all(|c| c == 'é'),
            "{:?}",
            &live.stderr[..10]
        );
        assert_eq!(
            live.stderr_skipped as usize + live.stderr.len(),
            2 * MAX_LIVE_BYTES
        );
        assert!(!live.cleared);
        let frame = format!(
            r#"{{"type":"output","id":5,"cleared":true,"stdout":"{}"}}"#,
            b64(b"after\n")
        );
        let Ok(Reply::Output(raw)) = Reply::parse(frame.as_bytes()) else {
            panic!("not output")
        };
        let live = raw.decode();
        assert!(live.cleared);
        assert_eq!(live.stdout, "after\n");
        assert_eq!(live.stderr, "");
        // A `cleared` that is not a boolean is a malformed frame, not a clear.
        assert!(Reply::parse(br#"{"type":"output","id":5,"cleared":"yes"}"#).is_err());
        let bad = RawLiveOutput {
            id: 1,
            cleared: false,
            stdout: "!!!!".into(),
            stderr: String::new(),
            stdout_skipped: 0,
            stderr_skipped: 0,
            order: Vec::new(),
        };
        assert_eq!(bad.decode().stdout, "");
        assert_eq!(bad.decode().stdout_skipped, 3);
    }

    #[test]
    fn live_outputs_passed_as_one_keep_their_order_within_the_bound() {
        let live = |cleared, pieces: &[(StreamName, &str)]| {
            let mut live = LiveOutput {
                cleared,
                ..LiveOutput::default()
            };
            for (stream, text) in pieces {
                live.push(*stream, text);
            }
            live
        };
        let pieces = |live: &LiveOutput| -> Vec<(StreamName, String)> {
            live.in_order()
                .into_iter()
                .map(|(s, t)| (s, t.to_string()))
                .collect()
        };
        let (out, err) = (StreamName::Stdout, StreamName::Stderr);
        // The text follows on, each stream's pieces in order, a clear before staying.
        let merged = live(true, &[(out, "a\n"), (err, "b\n")])
            .then(live(false, &[(err, "c\n"), (out, "d\n")]));
        assert!(merged.cleared);
        assert_eq!(
            pieces(&merged),
            vec![
                (out, "a\n".to_string()),
                (err, "b\nc\n".to_string()),
                (out, "d\n".to_string())
            ]
        );
        // A later clear leaves only what came after it.
        let cleared = live(false, &[(out, "a\n")]).then(live(true, &[(err, "b\n")]));
        assert_eq!(cleared, live(true, &[(err, "b\n")]));
        // Over the bound, each stream's front goes, counted as skipped, characters whole.
        let long = "é".repeat(MAX_LIVE_BYTES / 2);
        let merged = live(false, &[(out, "x"), (err, "warn\n"), (out, &long)])
            .then(live(false, &[(out, "z")]));
        assert_eq!(
            pieces(&merged),
            vec![
                (err, "warn\n".to_string()),
                (out, "é".repeat(MAX_LIVE_BYTES / 2 - 1) + "z")
            ]
        );
        assert_eq!(merged.stdout_skipped, 3);
        assert_eq!(merged.stderr_skipped, 0);
        // At most so many pieces: the oldest go, counted as skipped.
        let mut many = LiveOutput::default();
        for i in 0..MAX_LIVE_PIECES {
            many = many.then(live(false, &[(if i % 2 == 0 { out } else { err }, "ab")]));
        }
        let merged = many.then(live(false, &[(out, "c"), (err, "d")]));
        assert_eq!(merged.order.len(), MAX_LIVE_PIECES);
        assert_eq!((merged.stdout_skipped, merged.stderr_skipped), (2, 2));
        assert_eq!(pieces(&merged).last(), Some(&(err, "d".to_string())));
    }

    #[test]
    fn a_live_output_keeps_the_order_of_its_pieces_whatever_the_bound_cuts() {
        let b64 = |text: &[u8]| base64::engine::general_purpose::STANDARD.encode(text);
        let frame = |stdout: &[u8], stderr: &[u8], order: Vec<[u64; 2]>| RawLiveOutput {
            id: 1,
            cleared: false,
            stdout: b64(stdout),
            stderr: b64(stderr),
            stdout_skipped: 0,
            stderr_skipped: 0,
            order,
        };
        let pieces = |live: &LiveOutput| -> Vec<(StreamName, String)> {
            live.in_order()
                .into_iter()
                .map(|(s, t)| (s, t.to_string()))
                .collect()
        };
        let live = frame(b"a\nc\n", b"b\n", vec![[0, 2], [1, 2], [0, 2]]).decode();
        assert_eq!(
            pieces(&live),
            vec![
                (StreamName::Stdout, "a\n".to_string()),
                (StreamName::Stderr, "b\n".to_string()),
                (StreamName::Stdout, "c\n".to_string())
            ]
        );
        // Over the bound, the front of stdout goes: its first piece, and part of its second (a
        // character cut there is dropped whole).
        let mut stdout = vec![b'x'; 10];
        stdout.extend(("é".repeat(MAX_LIVE_BYTES / 2 + 1) + "z").as_bytes());
        let second = stdout.len() as u64 - 10;
        let live = frame(&stdout, b"warn\n", vec![[0, 10], [1, 5], [0, second]]).decode();
        let got = pieces(&live);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], (StreamName::Stderr, "warn\n".to_string()));
        assert_eq!(got[1].0, StreamName::Stdout);
        assert_eq!(got[1].1, "é".repeat(MAX_LIVE_BYTES / 2 - 1) + "z");
        assert_eq!(
            live.stdout_skipped as usize + live.stdout.len(),
            stdout.len()
        );
        // Pieces that do not add up to the texts, or name no stream: stdout, then stderr.
        for order in [
            vec![[0, 1], [1, 2]],
            vec![[0, 2], [2, 2]],
            vec![[0, u64::MAX], [1, 2]],
        ] {
            let live = frame(b"ab", b"cd", order).decode();
            assert_eq!(
                pieces(&live),
                vec![
                    (StreamName::Stdout, "ab".to_string()),
                    (StreamName::Stderr, "cd".to_string())
                ]
            );
        }
        // More pieces than a frame may have is a malformed frame.
        let many: Vec<String> = (0..=MAX_LIVE_PIECES)
            .map(|i| format!("[{}, 1]", i % 2))
            .collect();
        let text = format!(
            r#"{{"type":"output","id":5,"stdout":"","stderr":"","order":[{}]}}"#,
            many.join(",")
        );
        assert!(Reply::parse(text.as_bytes()).is_err());
    }

    #[test]
    fn requests_serialize_with_their_op() {
        let frame = Request::Exec {
            id: 3,
            code: "print(1)",
            max_output: 5,
            live: false,
            script: false,
        }
        .to_frame();
        let body: serde_json::Value = serde_json::from_slice(&frame[4..]).unwrap();
        assert_eq!(body["op"], "exec");
        assert_eq!(body["code"], "print(1)");
        assert!(
            body.get("live").is_none(),
            "live only when asked for: {body}"
        );
        assert_eq!(
            u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
    }
}
