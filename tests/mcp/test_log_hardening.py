"""The server's log and metrics against what clients send (issue 33, items 6 and 7): a tool name
or an argument with a newline and terminal escapes forges no log line, in either log format
(every line of stderr is one record, the forged text appears only escaped), and calls of unknown
tools, however long their names, are refused before they become metric labels or fill the log.
The real binary on a loopback port, the official MCP SDK over streamable HTTP."""

import json
import re
import uuid

import pytest
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from conftest import text_of
from test_http import TOKEN, mcp_client
from test_operations import http_server, value

pytestmark = pytest.mark.anyio

# What a forged line would say: a complete audit record of an admin, then terminal control (erase
# the line, set the window title) and a C1 CSI.
FORGERY = (
    "\n2026-12-01T21:00:00.000000Z  INFO audit: tool call principal=\"admin\" tool=\"run_python\" "
    "outcome=\"ok\"\r\x1b[2K\x1b]0;owned\x07\x9b31m"
)

# A line of the text format begins as the formatter begins one: a UTC timestamp, then a level.
TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z +(TRACE|DEBUG|INFO|WARN|ERROR) ")

# An audit record of the text format: level, the spans it is in, then the target `audit`.
TEXT_AUDIT = re.compile(r"^\S+ +INFO (?:\S+: )*?audit: tool call ")


def unsafe(line):
    """The characters of a log line (its newline aside) that could end it or drive a terminal."""
    return [c for c in line.rstrip("\n") if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029"]


def records(server, log_format):
    """Every line the server wrote to stderr, each checked to be one record of `log_format`."""
    parsed = []
    for line in server.log:
        assert line.endswith("\n"), repr(line)
        assert not unsafe(line), repr(line)
        if log_format == "json":
            record = json.loads(line)
            assert isinstance(record, dict), line
            parsed.append(record)
        else:
            assert TEXT_RECORD.match(line), repr(line)
            parsed.append(line)
    assert parsed, "the server logged nothing"
    return parsed


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_tool_name_with_a_newline_and_escapes_forges_no_log_line(log_format):
    name = "run\x1b[31m_python" + FORGERY
    with http_server(LOG_FORMAT=log_format) as server:
        async with mcp_client(server.url) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, {"code": "print(1)"})
            error = refused.value.error
            assert error.code == -32602, error
            # The error names the problem, with the name escaped.
            assert error.message.startswith('unknown tool "run\\u{1b}[31m_python\\n2026-12-01T21:00:00'), error.message
            assert "this server's tools are " in error.message and "sandbox_list" in error.message, error.message
            assert not unsafe(error.message), repr(error.message)
            # A known tool with the forgery in a session id the client gave.
            stopped = await client.call_tool("sandbox_stop", {"container_id": "abc" + FORGERY})
            assert stopped.is_error is True, text_of(stopped)
            listed = await client.call_tool("sandbox_list", {})
            assert listed.is_error is False, text_of(listed)

    lines = records(server, log_format)
    if log_format == "json":
        audit = [r for r in lines if r.get("target") == "audit"]
        assert [(a["principal"], a["tool"], a["outcome"]) for a in audit] == [
            ("anonymous", "<unknown>", "error"),
            ("anonymous", "sandbox_stop", "error"),
            ("anonymous", "sandbox_list", "ok"),
        ], audit
        # The unknown name is kept only escaped, even after JSON decoding.
        requested = audit[0]["requested"]
        assert requested.startswith("run\\u{1b}[31m_python\\n2026-12-01T21:00:00"), requested
        assert not unsafe(requested), requested
        # So is a session id the client gave, cut to a bound.
        session = audit[1]["session"]
        assert session.startswith("abc\\n2026-12-01T21:00:00") and session.endswith(" bytes)"), session
        assert not unsafe(session), session
        assert not any(r.get("principal") == "admin" for r in lines)
    else:
        audit = [line for line in lines if TEXT_AUDIT.match(line)]
        assert len(audit) == 3, audit
        assert 'principal="anonymous" tool="<unknown>" requested="run\\\\u{1b}[31m_python\\\\n2026-12-01T21:00:00' in audit[0], audit[0]
        assert 'tool="sandbox_stop"' in audit[1] and 'session="abc\\\\n2026-12-01T21:00:00' in audit[1], audit[1]
        assert 'tool="sandbox_list"' in audit[2], audit[2]
        # The forged record begins no line: it is inside the real ones, escaped.
        assert not any(line.startswith("2026-12-01T21:00:00.000000Z") for line in lines)
        assert not any('principal="admin"' in line for line in lines), audit


async def test_unknown_tool_names_become_no_metric_label_and_stay_bounded():
    calls, size = 20, 64 << 10
    with http_server(LOG_FORMAT="json") as server:
        async with mcp_client(server.url) as client:
            # One call first, so the families of tool calls exist before the size is taken.
            listed = await client.call_tool("sandbox_list", {})
            assert listed.is_error is False, text_of(listed)
            before = server.get("/metrics", token=TOKEN)
            assert before.status_code == 200, before.text
            names = [f"pcs-{uuid.uuid4().hex}-" + "n" * size for _ in range(calls)]
            for name in names:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(name, {})
                error = refused.value.error
                assert error.code == -32602, error.message[:200]
                assert error.message.startswith(f'unknown tool "{name[:64]}…(64.0 KiB)"'), error.message[:200]
                assert "tool names are at most 128 bytes" in error.message, error.message[:300]
                assert len(error.message) < 2048, len(error.message)
        after = server.get("/metrics", token=TOKEN)
        assert after.status_code == 200, after.text

    text = after.text
    for name in names:
        assert name[:40] not in text
    assert "nnnnnnnnnnnnnnnn" not in text
    # Twenty unknown calls add one label, `<unknown>`: a counter and a histogram, a bounded size.
    assert len(text) - len(before.text) < 4096, (len(before.text), len(text))
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert value(parsed, "sandbox_tool_calls_total", tool="<unknown>", outcome="error") == calls
    assert value(parsed, "sandbox_tool_calls_total", tool="sandbox_list", outcome="ok") == 1
    tools = {s.labels["tool"] for f in parsed.values() for s in f.samples if "tool" in s.labels}
    assert tools == {"<unknown>", "sandbox_list"}, tools
    # The log holds an excerpt of each name, not the name: bounded too.
    lines = records(server, "json")
    audit = [r for r in lines if r.get("target") == "audit" and r["tool"] == "<unknown>"]
    assert len(audit) == calls, len(audit)
    assert [a["requested"] for a in audit] == [f"{n[:64]}…(64.0 KiB)" for n in names]
    assert sum(len(line) for line in server.log) < 256 << 10, sum(len(line) for line in server.log)
