//! SSE priming events only for the protocol revisions that define them.
//!
//! Revision 2025-11-25 (SEP-1699) lets a server open an SSE stream with an event that carries an
//! id and an empty `data:` field, so the client can resume the stream after a disconnect. rmcp
//! sends it on every stream, whatever revision the client negotiated; clients written for earlier
//! revisions read the empty `data:` as a JSON-RPC message and fail to parse it. The official SDKs
//! send it only to 2025-11-25 and later, and so does this server: for older revisions the HTTP
//! layer drops empty-data events from the response stream ([`without_priming`]).

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

/// The first revision whose clients expect priming events.
pub const PRIMING_SINCE: &str = "2025-11-25";

/// The revision a request speaks: its `MCP-Protocol-Version` header; for `initialize`, the
/// revision it asks for; otherwise 2025-03-26, which the specification tells servers to assume
/// when the header is absent.
pub fn request_revision(header: Option<&str>, initialize_asks: Option<&str>) -> String {
    header
        .or(initialize_asks)
        .unwrap_or("2025-03-26")
        .trim()
        .to_string()
}

/// Whether a client speaking `revision` expects priming events. Revisions are dates, so they
/// compare as strings; an unknown revision newer than all is answered with the newest, which does.
pub fn expects_priming(revision: &str) -> bool {
    revision >= PRIMING_SINCE
}

/// The events of an SSE byte stream, with every event whose data is empty left out. Comments
/// (keep-alives) and events with data pass unchanged; bytes are passed on as soon as the event
/// they end is complete.
pub fn without_priming<S, E>(body: S) -> impl Stream<Item = Result<Bytes, E>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    body.map(Some)
        .chain(futures_util::stream::once(async { None }))
        .scan(BytesMut::new(), |pending, chunk| {
            let out = match chunk {
                Some(Ok(bytes)) => {
                    pending.extend_from_slice(&bytes);
                    let mut kept = BytesMut::new();
                    while let Some(end) = event_end(pending) {
                        let event = pending.split_to(end);
                        if !is_priming(&event) {
                            kept.extend_from_slice(&event);
                        }
                    }
                    (!kept.is_empty()).then(|| Ok(kept.freeze()))
                }
                Some(Err(e)) => Some(Err(e)),
                // The stream ended inside an event: pass on what there is.
                None => (!pending.is_empty()).then(|| Ok(std::mem::take(pending).freeze())),
            };
            futures_util::future::ready(Some(futures_util::stream::iter(out)))
        })
        .flatten()
}

/// Where the first complete event in `buffer` ends (after its blank line), if one is complete.
/// Lines end in `\n`, `\r\n` or `\r`, as the SSE format allows.
fn event_end(buffer: &[u8]) -> Option<usize> {
    let mut i = 0;
    let mut line_empty = true;
    while i < buffer.len() {
        let newline_len = match buffer[i] {
            b'\n' => 1,
            b'\r' if buffer.get(i + 1) == Some(&b'\n') => 2,
            // A lone `\r` at the end may yet be followed by `\n`: wait for more.
            b'\r' if i + 1 == buffer.len() => return None,
            b'\r' => 1,
            _ => {
                line_empty = false;
                i += 1;
                continue;
            }
        };
        if line_empty {
            return Some(i + newline_len);
        }
        line_empty = true;
        i += newline_len;
    }
    None
}

/// An event with at least one field and no data but empty `data` lines: a priming event.
fn is_priming(event: &[u8]) -> bool {
    let mut has_data_field = false;
    for line in event.split(|b| *b == b'\n' || *b == b'\r') {
        if line.is_empty() || line.starts_with(b":") {
            continue;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => (&line[..colon], &line[colon + 1..]),
            None => (line, &[][..]),
        };
        if field == b"data" {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if !value.is_empty() {
                return false;
            }
            has_data_field = true;
        }
    }
    has_data_field
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_a_blank_line_whatever_the_line_endings() {
        assert_eq!(event_end(b"data: {}\n\nrest"), Some(10));
        assert_eq!(event_end(b"id: 0\r\ndata:\r\n\r\n"), Some(16));
        assert_eq!(event_end(b"data: x\r\rdata: y"), Some(9));
        assert_eq!(event_end(b"data: x\n"), None);
        assert_eq!(event_end(b"data: x\r"), None);
    }

    #[test]
    fn only_empty_data_events_are_priming() {
        assert!(is_priming(b"id: 0\nretry: 3000\ndata:\n\n"));
        assert!(is_priming(b"id: 0\ndata: \n\n"));
        assert!(!is_priming(b"data: {\"jsonrpc\":\"2.0\"}\nid: 1\n\n"));
        assert!(!is_priming(b": keep-alive\n\n"));
        assert!(!is_priming(b"retry: 3000\n\n"));
    }

    #[tokio::test]
    async fn the_filter_drops_priming_events_split_across_chunks() {
        let chunks = [
            "id: 0\nretry: 30",
            "00\ndata:\n\nid: 1\ndata: {\"a\"",
            ":1}\n\n: ping\n\n",
            "data: tail",
        ];
        let body = futures_util::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Bytes::from_static(c.as_bytes()))),
        );
        let out: Vec<u8> = without_priming(body)
            .map(|chunk| chunk.unwrap_or_default())
            .collect::<Vec<_>>()
            .await
            .concat();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "id: 1\ndata: {\"a\":1}\n\n: ping\n\ndata: tail"
        );
    }

    #[test]
    fn revisions_before_2025_11_25_get_no_priming() {
        for old in ["2024-11-05", "2025-03-26", "2025-06-18"] {
            assert!(!expects_priming(old), "{old}");
        }
        for new in ["2025-11-25", "2026-07-28"] {
            assert!(expects_priming(new), "{new}");
        }
        assert_eq!(request_revision(None, None), "2025-03-26");
        assert_eq!(request_revision(None, Some("2025-11-25")), "2025-11-25");
        assert_eq!(
            request_revision(Some("2025-06-18"), Some("2025-11-25")),
            "2025-06-18"
        );
    }
}
