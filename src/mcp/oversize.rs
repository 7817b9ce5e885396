//! A guard in front of the stdio transport for messages that are too large.
//!
//! rmcp drops a line longer than its limit and logs it; the client, never answered, waits until
//! its own timeout (minutes). This guard sits between the process's stdio and rmcp: a message over
//! [`MAX_MESSAGE_BYTES`] is never buffered whole, it is discarded as it streams in and answered
//! with a JSON-RPC error carrying the request's id, so the client learns at once what went wrong.
//! Everything else passes through untouched; replies and injected errors are written whole lines
//! at a time, so they never interleave.

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Largest message accepted (rmcp's own line limit is 16 MiB; this stays under it).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Bytes kept of each end of an oversized message, to find its id.
const KEPT: usize = 4096;

/// The transport rmcp serves on, wired to the process's stdin and stdout through the guard.
pub fn guarded_stdio() -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
    guard(tokio::io::stdin(), tokio::io::stdout(), MAX_MESSAGE_BYTES)
}

/// Wires `input` and `output` to a pair of streams for the server, enforcing `limit`.
pub fn guard<R, W>(
    input: R,
    output: W,
    limit: usize,
) -> (tokio::io::DuplexStream, tokio::io::DuplexStream)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (server_in, to_server) = tokio::io::duplex(1 << 16);
    let (server_out, from_server) = tokio::io::duplex(1 << 16);
    let (rejects, rejected) = mpsc::channel(16);
    tokio::spawn(pump_input(input, to_server, rejects, limit));
    tokio::spawn(pump_output(from_server, output, rejected));
    (server_in, server_out)
}

/// An oversized message as it streams past: its size, its first and its last bytes.
struct Oversized {
    size: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Oversized {
    fn new(line: &[u8]) -> Self {
        let mut seen = Oversized {
            size: 0,
            head: line[..line.len().min(KEPT)].to_vec(),
            tail: Vec::new(),
        };
        seen.push(line);
        seen
    }

    fn push(&mut self, bytes: &[u8]) {
        self.size += bytes.len();
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(KEPT)..]);
        let excess = self.tail.len().saturating_sub(KEPT);
        self.tail.drain(..excess);
    }

    fn error(&self, limit: usize) -> Vec<u8> {
        let id = top_level_id(&self.head)
            .or_else(|| trailing_id(&self.tail))
            .unwrap_or(Value::Null);
        let message = format!(
            "the message is {} bytes, more than the {} MiB this server accepts; send less (a large \
             file can be written in parts with sandbox_write_file)",
            self.size,
            limit >> 20
        );
        let reply =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": message}});
        serde_json::to_vec(&reply).unwrap_or_default()
    }
}

async fn pump_input<R: AsyncRead + Unpin>(
    mut input: R,
    mut to_server: tokio::io::DuplexStream,
    rejects: mpsc::Sender<Vec<u8>>,
    limit: usize,
) {
    let mut buffer = vec![0u8; 1 << 16];
    let mut line: Vec<u8> = Vec::new();
    let mut oversized: Option<Oversized> = None;
    loop {
        let n = match input.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut rest = &buffer[..n];
        while !rest.is_empty() {
            let (segment, complete) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..=i], true),
                None => (rest, false),
            };
            rest = &rest[segment.len()..];
            match oversized.as_mut() {
                Some(seen) => seen.push(segment),
                None => {
                    line.extend_from_slice(segment);
                    if line.len() > limit {
                        oversized = Some(Oversized::new(&line));
                        line = Vec::new();
                    }
                }
            }
            if !complete {
                continue;
            }
            if let Some(seen) = oversized.take() {
                tracing::warn!(bytes = seen.size, "refused a message over the size limit");
                if rejects.send(seen.error(limit)).await.is_err() {
                    return;
                }
            } else if to_server.write_all(&line).await.is_err() {
                return;
            }
            line.clear();
        }
    }
    if oversized.is_none() && !line.is_empty() {
        let _ = to_server.write_all(&line).await;
    }
    let _ = to_server.shutdown().await;
}

async fn pump_output<W: AsyncWrite + Unpin>(
    from_server: tokio::io::DuplexStream,
    mut output: W,
    mut rejected: mpsc::Receiver<Vec<u8>>,
) {
    let mut reader = BufReader::new(from_server);
    let mut line = Vec::new();
    let mut rejects_open = true;
    loop {
        tokio::select! {
            // Bytes read so far stay in `line` when the other branch wins: nothing is lost.
            read = reader.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.ends_with(b"\n") => {
                        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                            return;
                        }
                        line.clear();
                    }
                    Ok(_) => {}
                }
            }
            reject = rejected.recv(), if rejects_open => match reject {
                Some(mut reply) => {
                    reply.push(b'\n');
                    if output.write_all(&reply).await.is_err() || output.flush().await.is_err() {
                        return;
                    }
                }
                None => rejects_open = false,
            },
        }
    }
    if !line.is_empty() {
        let _ = output.write_all(&line).await;
    }
    let _ = output.flush().await;
}

/// The `id` member of the outermost object, found in the message's first bytes.
fn top_level_id(head: &[u8]) -> Option<Value> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let end = string_end(head, i)?;
                if depth == 1 && &head[i..=end] == b"\"id\"" {
                    let mut j = end + 1;
                    while head.get(j).is_some_and(u8::is_ascii_whitespace) {
                        j += 1;
                    }
                    if head.get(j) == Some(&b':') {
                        return scalar_at(head, j + 1);
                    }
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The `id` member when it is the last one of the message (as some clients write it).
fn trailing_id(tail: &[u8]) -> Option<Value> {
    let at = tail.windows(4).rposition(|w| w == b"\"id\"")?;
    let mut j = at + 4;
    while tail.get(j).is_some_and(u8::is_ascii_whitespace) {
        j += 1;
    }
    if tail.get(j) != Some(&b':') {
        return None;
    }
    let value = scalar_at(tail, j + 1)?;
    let rendered = serde_json::to_vec(&value).ok()?;
    let after = tail[j + 1..]
        .windows(rendered.len())
        .position(|w| w == rendered.as_slice())?;
    let rest = &tail[j + 1 + after + rendered.len()..];
    let closes_message = rest.iter().all(|b| b.is_ascii_whitespace() || *b == b'}')
        && rest.iter().filter(|b| **b == b'}').count() == 1;
    closes_message.then_some(value)
}

/// Where the JSON string starting at `start` (a quote) ends (its closing quote).
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A number or a string (the forms a JSON-RPC id takes) starting at `from`, after whitespace.
fn scalar_at(bytes: &[u8], from: usize) -> Option<Value> {
    let mut i = from;
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let end = match bytes.get(i)? {
        b'"' => string_end(bytes, i)? + 1,
        b'-' | b'0'..=b'9' => {
            let mut j = i + 1;
            while bytes.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            j
        }
        _ => return None,
    };
    match serde_json::from_slice(&bytes[i..end]).ok()? {
        id @ (Value::Number(_) | Value::String(_)) => Some(id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_outer_id_not_a_nested_one() {
        let head = br#"{"jsonrpc":"2.0","params":{"arguments":{"id":99,"container_id":"x"}},"id":7,"method":"tools/call""#;
        assert_eq!(top_level_id(head), Some(json!(7)));
        let head = br#"{"id": "abc\"d", "method":"x"#;
        assert_eq!(top_level_id(head), Some(json!("abc\"d")));
        assert_eq!(top_level_id(br#"{"method":"x","params":{"id":3"#), None);
    }

    #[test]
    fn finds_a_trailing_id_only_when_it_closes_the_message() {
        assert_eq!(
            trailing_id(br#"xxxx"}},"jsonrpc":"2.0","id":12}"#),
            Some(json!(12))
        );
        assert_eq!(trailing_id(br#"xxxx","id":12}}"#), None);
        assert_eq!(trailing_id(b"no id at all"), None);
    }

    #[tokio::test]
    async fn an_oversized_line_is_answered_and_the_next_passes() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{{\"code\":\"{}\"}}}}\n",
            "x".repeat(5000)
        );
        let input = format!("{big}{{\"jsonrpc\":\"2.0\",\"id\":6}}\n");
        let (client_out, mut client_in) = tokio::io::duplex(1 << 20);
        let (mut server_in, server_out) =
            guard(std::io::Cursor::new(input.into_bytes()), client_out, 1000);
        let mut passed = String::new();
        server_in.read_to_string(&mut passed).await.unwrap();
        assert_eq!(passed, "{\"jsonrpc\":\"2.0\",\"id\":6}\n");
        drop(server_out);
        let mut answered = String::new();
        client_in.read_to_string(&mut answered).await.unwrap();
        let reply: Value = serde_json::from_str(answered.trim()).unwrap();
        assert_eq!(reply["id"], json!(5));
        assert_eq!(reply["error"]["code"], json!(-32600));
        assert!(reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than"));
    }
}
