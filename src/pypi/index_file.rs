//! Converting a downloaded simple index (PEP 691 JSON or PEP 503 HTML) into the name file: one
//! normalized name a line.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use serde::de::DeserializeSeed;

use super::index_html::AnchorParser;
use super::index_json::IndexDocument;
use super::{normalize, IndexError};

/// Longest project name kept from the index (PyPI's own limit is far lower).
const MAX_NAME_LEN: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IndexFormat {
    Json,
    Html,
    /// No telling content type: look at the first byte.
    Sniff,
}

/// Normalizes a name from the index; `None` for anything that cannot be a PyPI project name.
fn clean_name(raw: &str) -> Option<String> {
    let name = normalize(raw.trim());
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    valid.then_some(name)
}

/// Writes normalized names, one a line.
pub(super) struct NameSink<'a> {
    pub(super) out: &'a mut dyn Write,
    pub(super) count: usize,
}

impl NameSink<'_> {
    pub(super) fn push(&mut self, raw: &str) -> io::Result<()> {
        if let Some(name) = clean_name(raw) {
            self.out.write_all(name.as_bytes())?;
            self.out.write_all(b"\n")?;
            self.count += 1;
        }
        Ok(())
    }
}

/// Converts the downloaded index at `src` into the name file at `dst`; returns the name count.
pub(super) fn convert_index(
    src: &Path,
    dst: &Path,
    format: IndexFormat,
    header: &str,
) -> Result<usize, IndexError> {
    let input = std::fs::File::open(src).map_err(|source| IndexError::Read {
        path: src.to_path_buf(),
        source,
    })?;
    let mut input = BufReader::with_capacity(256 * 1024, input);
    let format = match format {
        IndexFormat::Sniff => {
            let start = input.fill_buf().map_err(IndexError::ReadIndex)?;
            match start.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{') => IndexFormat::Json,
                _ => IndexFormat::Html,
            }
        }
        known => known,
    };
    let output = std::fs::File::create(dst).map_err(|source| IndexError::Create {
        path: dst.to_path_buf(),
        source,
    })?;
    let mut output = BufWriter::with_capacity(256 * 1024, output);
    let write_error = |source: io::Error| IndexError::Write {
        path: dst.to_path_buf(),
        source,
    };
    writeln!(output, "{header}").map_err(write_error)?;
    let mut sink = NameSink {
        out: &mut output,
        count: 0,
    };
    match format {
        IndexFormat::Json => {
            let mut de = serde_json::Deserializer::from_reader(input);
            let saw_projects = IndexDocument(&mut sink)
                .deserialize(&mut de)
                .map_err(IndexError::MalformedJson)?;
            de.end().map_err(IndexError::MalformedJson)?;
            if !saw_projects {
                return Err(IndexError::NoProjectsList);
            }
        }
        IndexFormat::Html | IndexFormat::Sniff => {
            let mut parser = AnchorParser::default();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let read = match input.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(IndexError::ReadIndex(e)),
                };
                parser
                    .feed(&chunk[..read], &mut sink)
                    .map_err(write_error)?;
            }
        }
    }
    let count = sink.count;
    output.flush().map_err(write_error)?;
    output
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?
        .sync_all()
        .map_err(write_error)?;
    Ok(count)
}
