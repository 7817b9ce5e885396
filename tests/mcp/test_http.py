"""MCP over streamable HTTP (`serve --http`): the real binary on a loopback port, driven by the
official Python SDK's streamable HTTP client, and raw HTTP requests for the access rules.
Every request goes to 127.0.0.1."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import anyio
import httpx2
import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import BIN, SNAPSHOT_DIR, sandboxes, text_of

pytestmark = pytest.mark.anyio

TOKEN = "test-token-" + "0123456789abcdef" * 2
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class Server:
    """A `serve --http` process on a free loopback port; its stderr is drained in a thread."""

    def __init__(self, addr="127.0.0.1:0", **env):
        merged = dict(os.environ)
        merged.update({"LOG_LEVEL": "info", "SANDBOX_POOL_SIZE": "0"})
        merged.setdefault("SANDBOX_SNAPSHOT_DIR", SNAPSHOT_DIR)
        merged.update({k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen(
            [os.path.abspath(BIN), "serve", "--http", addr],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=merged, text=True,
        )
        self.log = []
        self.url = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                found = re.search(r"serving MCP over streamable HTTP at (http://\S+/mcp)", line)
                if found:
                    self.url = found.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(timeout=30)
        if self.url is None:
            self.stop()
            raise AssertionError("the server did not start:\n" + "".join(self.log))

    def stop(self):
        """SIGTERM, then wait (bounded) for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@contextlib.contextmanager
def http_server(**env):
    server = Server(**env)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.log)


@contextlib.asynccontextmanager
async def mcp_client(url, token=TOKEN, **headers):
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=180) as client:
            yield client


def leaves(error):
    """The exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def post(url, body=None, token=TOKEN, **headers):
    """One raw POST; returns the response (its body read)."""
    all_headers = dict(MCP_HEADERS)
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    all_headers.update(headers)
    content = body if isinstance(body, (bytes, str)) else json.dumps(body if body is not None else INITIALIZE)
    with httpx2.Client(timeout=30) as http:
        return http.post(url, content=content, headers=all_headers)


async def test_hello_world_over_http():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        async with mcp_client(server.url) as client:
            assert client.server_info.name == "python-code-sandbox-mcp"
            result = await client.call_tool("run_python_ephemeral", {"code": "print('Hello MCP')"})
            assert result.is_error is False, text_of(result)
            assert result.structured_content["stdout"] == "Hello MCP\n"


async def test_a_session_keeps_its_state_across_calls_and_ends_with_the_mcp_session():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        async with mcp_client(server.url) as client:
            cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            for code in ("counter = 1", "counter += 1", "counter *= 21"):
                step = await client.call_tool("run_python", {"container_id": cid, "code": code})
                assert step.is_error is False, text_of(step)
            shown = await client.call_tool("run_python", {"container_id": cid, "code": "print(counter)"})
            assert shown.structured_content["stdout"] == "42\n"
            listed = await client.call_tool("sandbox_list", {})
            assert [s["container_id"] for s in listed.structured_content["sessions"]] == [cid]
            assert cid in sandboxes()
        # The client closed its MCP session (DELETE): its sandbox goes while the server runs on.
        deadline = time.monotonic() + 60
        while cid in sandboxes() and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        assert cid not in sandboxes(), "the session's sandbox outlived its MCP session"
        assert server.proc.poll() is None
        assert any("an MCP session ended: stopping its 1 sandbox session(s)" in line for line in server.log)


async def test_two_clients_at_once_cannot_touch_each_others_sessions():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        async with mcp_client(server.url) as alice, mcp_client(server.url) as bob:
            a = (await alice.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            b = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            await alice.call_tool("run_python", {"container_id": a, "code": "secret = 'alice'"})
            await alice.call_tool("sandbox_write_file", {"container_id": a, "path": "note.txt", "content": "alice's"})

            # Both run at once: each sees only its own state.
            results = {}

            async def run(name, client, cid):
                code = "import time; time.sleep(1); print(globals().get('secret', 'none'))"
                results[name] = await client.call_tool("run_python", {"container_id": cid, "code": code})

            async with anyio.create_task_group() as group:
                group.start_soon(run, "alice", alice, a)
                group.start_soon(run, "bob", bob, b)
            assert results["alice"].structured_content["stdout"] == "alice\n"
            assert results["bob"].structured_content["stdout"] == "none\n"

            for cid in (a, a[:12]):
                for tool, args in (
                    ("run_python", {"code": "print(secret)"}),
                    ("sandbox_exec", {"command": "cat note.txt"}),
                    ("sandbox_write_file", {"path": "note.txt", "content": "bob was here"}),
                    ("sandbox_read_file", {"path": "note.txt"}),
                    ("sandbox_list_files", {}),
                    ("sandbox_stop", {}),
                ):
                    refused = await bob.call_tool(tool, {"container_id": cid, **args})
                    assert refused.is_error is True, (tool, text_of(refused))
                    assert "no session" in text_of(refused), text_of(refused)
                    assert "alice" not in text_of(refused)
            bobs = await bob.call_tool("sandbox_list", {})
            assert [s["container_id"] for s in bobs.structured_content["sessions"]] == [b]

            # Alice's session is untouched.
            after = await alice.call_tool("run_python", {"container_id": a, "code": "print(secret, open('note.txt').read())"})
            assert after.structured_content["stdout"] == "alice alice's\n", text_of(after)
            alices = await alice.call_tool("sandbox_list", {})
            assert [s["container_id"] for s in alices.structured_content["sessions"]] == [a]
            assert {a, b} <= set(sandboxes())


async def test_a_client_pinned_to_the_sessionless_revision_is_told_what_is_supported():
    """2026-07-28 has no MCP sessions to own sandboxes: the server serves the revisions that do,
    and says so (the default client negotiates and falls back, as the other tests show)."""
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        with pytest.raises(BaseException) as raised:
            with anyio.fail_after(60):
                async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                    async with Client(streamable_http_client(server.url, http_client=http), mode="2026-07-28") as client:
                        await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
        [error] = [e for e in leaves(raised.value) if isinstance(e, MCPError)]
        assert error.error.code == -32022
        assert "2025-11-25" in error.error.data["supported"]


async def test_a_missing_or_wrong_token_is_401():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        for token in (None, "wrong-" + TOKEN, TOKEN[:-1]):
            response = post(server.url, token=token)
            assert response.status_code == 401, (token, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
        # The official client with a wrong token gets nowhere.
        with pytest.raises(Exception):
            with anyio.fail_after(60):
                async with mcp_client(server.url, token="wrong-" + TOKEN) as client:
                    await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
        # With the token the same request is served.
        assert post(server.url).status_code == 200
    assert sandboxes() == []


async def test_a_session_id_is_no_credential():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        opened = post(server.url)
        assert opened.status_code == 200
        session_id = opened.headers["mcp-session-id"]
        assert len(session_id) >= 32
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        refused = post(server.url, call, token=None, **{"Mcp-Session-Id": session_id})
        assert refused.status_code == 401
        another = post(server.url)
        assert another.headers["mcp-session-id"] != session_id


async def test_a_token_in_the_query_string_is_refused():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        for query in (f"access_token={TOKEN}", f"token={TOKEN}"):
            with_header = post(f"{server.url}?{query}")
            assert with_header.status_code == 400, with_header.text
            alone = post(f"{server.url}?{query}", token=None)
            assert alone.status_code in (400, 401)
        assert not any(TOKEN in line for line in server.log), "the token was logged"


async def test_origins_and_hosts_are_checked():
    allowed = "http://localhost:5173"
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_ALLOWED_ORIGINS=allowed) as server:
        assert post(server.url, Origin="https://evil.example").status_code == 403
        assert post(server.url, Origin="null").status_code == 403
        served = post(server.url, Origin=allowed)
        assert served.status_code == 200
        assert served.headers["access-control-allow-origin"] == allowed
        with httpx2.Client(timeout=30) as http:
            preflight = http.options(server.url, headers={
                "Origin": allowed, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, mcp-session-id"})
        assert preflight.status_code == 204
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        # DNS rebinding: a name that resolves to loopback is still not an allowed Host.
        assert post(server.url, Host="attacker.example:8080").status_code == 403
        # No Origin at all (a non-browser client) is fine.
        async with mcp_client(server.url) as client:
            result = await client.call_tool("run_python_ephemeral", {"code": "print('no origin')"})
            assert result.structured_content["stdout"] == "no origin\n"


async def test_the_servers_own_origin_is_allowed_by_default_and_no_other():
    """A page the server itself serves (same host and port) is no rebinding attack."""
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        port = server.url.split(":")[2].split("/")[0]
        for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            assert post(server.url, Origin=own, Host=f"127.0.0.1:{port}").status_code == 200, own
        other_port = "1" if port != "1" else "2"
        for other in (f"http://127.0.0.1:{other_port}", "http://localhost", f"http://evil.example:{port}"):
            assert post(server.url, Origin=other, Host=f"127.0.0.1:{port}").status_code == 403, other


async def test_unreadable_bodies_get_json_rpc_errors_with_400():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        for body, code in (("{not json", -32700), ('{"jsonrpc": "2.0", "id": 1', -32700),
                           ('{"hello": "world"}', -32600), ("[1, 2]", -32600)):
            response = post(server.url, body)
            assert response.status_code == 400, (body, response.status_code, response.text)
            assert response.headers["content-type"].startswith("application/json")
            answer = response.json()
            assert answer["jsonrpc"] == "2.0" and answer["id"] is None, answer
            assert answer["error"]["code"] == code, (body, answer)
        # The server still serves.
        assert post(server.url).status_code == 200


def sse_events(text):
    """The events of an SSE body, each as a dict of its fields (data lines joined)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name in fields and name == "data" else value
        if fields:
            events.append(fields)
    return events


@pytest.mark.parametrize("revision", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
async def test_sse_priming_events_only_for_2025_11_25(revision):
    """An event with an empty `data` (SEP-1699) breaks clients of earlier revisions."""
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        hello = dict(INITIALIZE, params=dict(INITIALIZE["params"], protocolVersion=revision))
        response = post(server.url, hello)
        assert response.status_code == 200, response.text
        events = sse_events(response.text)
        assert [json.loads(e["data"])["result"]["protocolVersion"] for e in events if e.get("data")] == [revision]
        priming = [e for e in events if e.get("data", "") == ""]
        headers = {"mcp-session-id": response.headers["mcp-session-id"]}
        if revision >= "2025-06-18":
            headers["mcp-protocol-version"] = revision
        post(server.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **headers)
        listed = post(server.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, **headers)
        later = sse_events(listed.text)
        assert len([e for e in later if e.get("data")]) == 1
        priming += [e for e in later if e.get("data", "") == ""]
        if revision >= "2025-11-25":
            assert priming and all("id" in e for e in priming), events + later
        else:
            assert priming == [], f"{revision} got priming events: {events + later}"


async def test_workspace_resources_are_scoped_to_their_mcp_session():
    template = "sandbox://{session}/{path}"
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        async with mcp_client(server.url) as alice, mcp_client(server.url) as bob:
            a = (await alice.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            await alice.call_tool("sandbox_write_file", {"container_id": a, "path": "secret.txt", "content": "alice's"})
            uri = f"sandbox://{a}/secret.txt"
            assert [r.uri for r in (await alice.list_resources()).resources] == [uri]
            assert (await alice.read_resource(uri)).contents[0].text == "alice's"
            assert (await bob.list_resources()).resources == []
            with pytest.raises(MCPError) as refused:
                await bob.read_resource(uri)
            assert "alice's" not in str(refused.value.error)
            ref = types.ResourceTemplateReference(type="ref/resource", uri=template)
            assert (await bob.complete(ref, {"name": "session", "value": ""})).completion.values == []
            assert (await alice.complete(ref, {"name": "session", "value": ""})).completion.values == [a]


async def test_an_oversized_body_is_413():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_MAX_BODY="64k") as server:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "run_python_ephemeral", "arguments": {"code": "#" * (100 << 10)}}}
        assert post(server.url, call).status_code == 413
        # Without Content-Length (chunked), the limit holds while the body streams in.
        body = json.dumps(call).encode()

        def chunks():
            for start in range(0, len(body), 8192):
                yield body[start:start + 8192]

        headers = dict(MCP_HEADERS, Authorization=f"Bearer {TOKEN}")
        with httpx2.Client(timeout=30) as http:
            streamed = http.post(server.url, content=chunks(), headers=headers)
        assert streamed.status_code == 413
        # A body within the limit is served.
        assert post(server.url).status_code == 200


def test_a_non_loopback_address_without_a_token_is_refused():
    env = dict(os.environ)
    env.pop("SANDBOX_HTTP_TOKEN", None)
    env.pop("SANDBOX_HTTP_TOKEN_FILE", None)
    for addr in ("0.0.0.0:0", "[::]:0"):
        done = subprocess.run([BIN, "serve", "--http", addr], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, done.stderr
        assert "without a token" in done.stderr and "SANDBOX_HTTP_TOKEN" in done.stderr
    bad = subprocess.run([BIN, "serve", "--http", "not-an-address"], env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "invalid --http address" in bad.stderr


def test_a_token_file_works(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with http_server(SANDBOX_HTTP_TOKEN_FILE=str(token_file)) as server:
        assert post(server.url, token=None).status_code == 401
        assert post(server.url).status_code == 200


async def test_sigterm_cancels_calls_and_removes_every_sandbox():
    server = Server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_TIMEOUT="300s")
    try:
        async with mcp_client(server.url) as client:
            await client.call_tool("sandbox_initialize", {})
            started = anyio.Event()

            async def endless():
                started.set()
                with contextlib.suppress(Exception):
                    await client.call_tool("run_python_ephemeral", {"code": "while True: pass"})

            async with anyio.create_task_group() as group:
                group.start_soon(endless)
                await started.wait()
                # Wait (bounded) until both sandboxes exist: the session and the endless run.
                for _ in range(300):
                    if len(sandboxes()) >= 2:
                        break
                    await anyio.sleep(0.1)
                assert len(sandboxes()) >= 2
                server.proc.send_signal(signal.SIGTERM)
                assert await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=90)) == 0
                group.cancel_scope.cancel()
        assert sandboxes() == []
    finally:
        server.stop()


# --- Limits: connections, request heads, MCP sessions, repeated headers (issue 13, item 6) ---


def port_of(url):
    return int(url.split(":")[2].split("/")[0])


def raw_request(method="POST", body=None, token=TOKEN, extra=(), host=None, port=None):
    """The bytes of one HTTP/1.1 request (Connection: close); `extra` adds header lines as given,
    so a header can appear twice."""
    body = json.dumps(INITIALIZE if body is None else body).encode() if not isinstance(body, bytes) else body
    lines = [f"{method} /mcp HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}",
             "Accept: application/json, text/event-stream", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += list(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(port, data, timeout=30):
    """Sends `data` on a fresh connection and reads until the server closes it (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return read_to_close(s, timeout)


def read_to_close(s, timeout=30):
    s.settimeout(timeout)
    received = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the connection was not closed within {timeout}s: {received[:200]!r}")


def status_of(response):
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def test_a_slow_loris_connection_is_closed_after_the_header_timeout_and_others_are_served():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_HEADER_TIMEOUT="2s") as server:
        port = port_of(server.url)
        loris = []
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # a head that never ends
            loris.append(s)
        try:
            # Meanwhile an honest client is served.
            assert post(server.url).status_code == 200
            # Each stalled connection is closed by the server (an answer, if any, then EOF).
            for s in loris:
                closing = read_to_close(s, timeout=30)
                assert closing == b"" or status_of(closing) in (400, 408), closing[:200]
        finally:
            for s in loris:
                s.close()
        assert post(server.url).status_code == 200


def test_connections_beyond_the_cap_wait_until_one_closes():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_MAX_CONNECTIONS="3",
                     SANDBOX_HTTP_HEADER_TIMEOUT="120s") as server:
        port = port_of(server.url)
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
        try:
            # The fourth connects (the kernel's backlog) but is not served while three are open.
            with socket.create_connection(("127.0.0.1", port), timeout=30) as waiting:
                waiting.sendall(raw_request(port=port))
                waiting.settimeout(1.5)
                with pytest.raises(socket.timeout):
                    waiting.recv(1)
                held.pop().close()
                answer = read_to_close(waiting, timeout=30)
                assert status_of(answer) == 200, answer[:300]
        finally:
            for s in held:
                s.close()
        assert any("SANDBOX_HTTP_MAX_CONNECTIONS" in line for line in server.log)


def test_the_mcp_session_cap_refuses_the_next_initialize_until_one_ends():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_MAX_MCP_SESSIONS="2") as server:
        first, second = post(server.url), post(server.url)
        assert first.status_code == second.status_code == 200
        refused = post(server.url)
        assert refused.status_code == 429, refused.text
        answer = refused.json()
        assert answer["id"] == INITIALIZE["id"] and answer["error"]["code"] == -32000, answer
        assert "SANDBOX_HTTP_MAX_MCP_SESSIONS" in answer["error"]["message"]
        assert "mcp-session-id" not in refused.headers
        # The open sessions go on.
        headers = {"mcp-session-id": first.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        post(server.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **headers)
        listed = post(server.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, **headers)
        assert listed.status_code == 200 and "run_python_ephemeral" in listed.text
        # Ending one frees its place, for exactly one of several initializes sent at once.
        with httpx2.Client(timeout=30) as http:
            ended = http.delete(server.url, headers={**headers, "Authorization": f"Bearer {TOKEN}"})
        assert ended.status_code == 204, ended.text
        results = []
        threads = [threading.Thread(target=lambda: results.append(post(server.url).status_code)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(results) == [200, 429, 429, 429], results


async def test_an_idle_mcp_session_that_owns_no_sandbox_ends_sooner():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_HTTP_MAX_MCP_SESSIONS="2",
                     SANDBOX_HTTP_MCP_IDLE_TIMEOUT="3s") as server:
        async with mcp_client(server.url) as owner:
            cid = (await owner.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            idle = post(server.url)
            assert idle.status_code == 200
            assert post(server.url).status_code == 429  # both places taken
            # The session that owns nothing ends; its place frees (bounded wait).
            deadline = time.monotonic() + 60
            while (opened := post(server.url)).status_code == 429 and time.monotonic() < deadline:
                await anyio.sleep(0.5)
            assert opened.status_code == 200, opened.text
            gone = post(server.url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                        **{"mcp-session-id": idle.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"})
            assert gone.status_code == 404, gone.text
            # The one that owns a sandbox session was idle as long, and is still there.
            shown = await owner.call_tool("run_python", {"container_id": cid, "code": "print('kept')"})
            assert shown.structured_content["stdout"] == "kept\n", text_of(shown)
            assert any("SANDBOX_HTTP_MCP_IDLE_TIMEOUT" in line for line in server.log)


def test_repeated_authorization_host_and_other_single_headers_are_400():
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN) as server:
        port = port_of(server.url)
        bad = f"Authorization: Bearer wrong-{TOKEN}"
        cases = [
            (TOKEN, [bad]),                                  # the right token first, a wrong one after
            (None, [bad, f"Authorization: Bearer {TOKEN}"]),  # a wrong one first, the right one after
            (TOKEN, [f"Authorization: Bearer {TOKEN}"]),      # the same token twice
            (TOKEN, ["Host: attacker.example"]),              # an allowed Host first
            (TOKEN, [f"Origin: http://127.0.0.1:{port}", "Origin: https://evil.example"]),
            (TOKEN, ["Mcp-Session-Id: a", "Mcp-Session-Id: b"]),
        ]
        for token, extra in cases:
            answer = exchange(port, raw_request(port=port, token=token, extra=extra))
            assert status_of(answer) == 400, (extra, answer[:300])
            assert b"more than once" in answer, answer[:300]
        # Two Content-Length headers that differ: refused (by hyper, before the gate).
        answer = exchange(port, raw_request(port=port, extra=["Content-Length: 5"]))
        assert status_of(answer) == 400, answer[:300]
        # The same request with each header once is served.
        assert status_of(exchange(port, raw_request(port=port))) == 200


async def test_consent_to_a_host_is_asked_over_http():
    """The user's consent (SANDBOX_EGRESS_ASK) travels as an elicitation over streamable HTTP
    too; the approved name is then judged by its address like any allowed one (here a test name
    mapped to loopback: refused, never connected)."""
    asked = []

    async def consent(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={})

    env = dict(
        SANDBOX_HTTP_TOKEN=TOKEN,
        SANDBOX_NETWORK="allowlist",
        SANDBOX_EGRESS_ASK="ask.test:47999",
        SANDBOX_EGRESS_RESOLVE="ask.test=127.0.0.1",
    )
    with http_server(**env) as server:
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            client = Client(
                streamable_http_client(server.url, http_client=http),
                read_timeout_seconds=180,
                elicitation_callback=consent,
                mode="legacy",
            )
            async with client:
                started = await client.call_tool("sandbox_initialize", {"network": ["ask.test:47999"]})
                assert started.structured_content["network"] == [
                    {"host": "ask.test", "port": 47999, "status": "allowed"}
                ], started.structured_content
                assert asked == [asked[0]] and asked[0].startswith("Allow this sandbox to reach ask.test:47999?"), asked
                cid = started.structured_content["container_id"]
                code = "import urllib.request\ntry:\n    urllib.request.urlopen('http://ask.test:47999/', timeout=10)\nexcept Exception as e:\n    print(e)"
                ran = await client.call_tool("run_python", {"container_id": cid, "code": code})
                [entry] = ran.structured_content["network"]
                assert entry["outcome"] == "refused", entry
                assert "non-public address 127.0.0.1" in entry["reason"], entry
                assert len(asked) == 1, asked
