"""The MCP server as a client sees it: the real binary over stdio, the official Python SDK, the
real Docker engine. Run by scripts/test.sh after the Rust tests."""

import asyncio
import http.server
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading

import anyio
import pytest

from conftest import BIN, connect, sandboxes, server_params, text_of

pytestmark = pytest.mark.anyio
# The original tool set runs under the server's default runtime (gVisor where registered).
UNDER_DEFAULT_RUNTIME = True

TOOLS = {
    "run_python_ephemeral": {"code"},
    "sandbox_initialize": set(),
    "run_python": {"container_id", "code"},
    "sandbox_exec": {"container_id", "command"},
    "sandbox_stop": {"container_id"},
    "sandbox_list": set(),
    "search_pypi_packages": {"query"},
    "sandbox_write_file": {"container_id", "path"},
    "sandbox_read_file": {"container_id", "path"},
    "sandbox_list_files": {"container_id"},
    "sandbox_snapshot": {"container_id"},
    "sandbox_fork": {"container_id"},
    "sandbox_snapshots": set(),
    "sandbox_snapshot_delete": {"snapshot_id"},
    "sandbox_export_notebook": {"container_id"},
    "sandbox_run_notebook": set(),
}


async def test_lists_every_tool_with_schemas():
    async with connect() as client:
        assert client.server_info.name == "python-code-sandbox-mcp"
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == set(TOOLS)
        for name, required in TOOLS.items():
            tool = listed[name]
            assert tool.input_schema["type"] == "object"
            assert set(tool.input_schema.get("required", [])) == required, name
            assert tool.output_schema and tool.output_schema["type"] == "object", name
            assert len(tool.description) > 60, name
        # Descriptions carry the limits in force, read from the live configuration.
        assert "1m wall clock" in listed["run_python_ephemeral"].description
        assert "persist" in listed["run_python"].description
        assert {"stdout", "stderr", "exit_code", "duration_ms", "timed_out", "truncated"} <= set(
            listed["run_python_ephemeral"].output_schema["properties"]
        )


async def test_ephemeral_hello_world():
    async with connect() as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print('Hello MCP')"})
        assert result.is_error is False
        assert "Hello MCP" in text_of(result)
        assert result.structured_content["stdout"] == "Hello MCP\n"
        assert result.structured_content["exit_code"] == 0
        assert result.structured_content["timed_out"] is False


async def test_a_session_keeps_a_variable_across_three_calls_and_execs():
    async with connect() as client:
        started = await client.call_tool("sandbox_initialize", {})
        assert started.is_error is False
        cid = started.structured_content["container_id"]
        assert cid in text_of(started)
        for code in ("counter = 1", "counter += 1", "counter *= 21"):
            step = await client.call_tool("run_python", {"container_id": cid, "code": code})
            assert step.is_error is False, text_of(step)
        shown = await client.call_tool("run_python", {"container_id": cid, "code": "print(counter)"})
        assert shown.structured_content["stdout"] == "42\n"

        executed = await client.call_tool("sandbox_exec", {"container_id": cid, "command": "echo out; echo err >&2; id -u; exit 3"})
        assert executed.is_error is True  # non-zero exit
        assert executed.structured_content["exit_code"] == 3
        assert executed.structured_content["stdout"] == "out\n1000\n"
        assert executed.structured_content["stderr"] == "err\n"

        listed = await client.call_tool("sandbox_list", {})
        assert [s["container_id"] for s in listed.structured_content["sessions"]] == [cid]
        assert listed.structured_content["limits"]["network"] == "none"

        stopped = await client.call_tool("sandbox_stop", {"container_id": cid})
        assert stopped.is_error is False and stopped.structured_content["stopped"] is True
        assert cid not in sandboxes()
        after = await client.call_tool("run_python", {"container_id": cid, "code": "print(1)"})
        assert after.is_error is True
        assert "no session" in text_of(after)


async def test_an_exception_is_an_error_with_its_traceback():
    async with connect() as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "def f():\n    raise ValueError('boom')\nf()"})
        assert result.is_error is True
        text = text_of(result)
        assert "Traceback (most recent call last)" in text and "ValueError: boom" in text
        assert result.structured_content["error"] == {"type": "ValueError", "message": "boom"}
        assert result.structured_content["exit_code"] == 1


async def test_a_timeout_is_an_error_and_says_so():
    async with connect(SANDBOX_TIMEOUT="2s") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print('working', flush=True)\nwhile True: pass"})
        assert result.is_error is True
        assert result.structured_content["timed_out"] is True
        assert result.structured_content["stdout"] == "working\n"
        assert "timed out after 2s" in text_of(result)


async def test_foreign_and_malformed_container_ids_are_refused():
    image = os.environ.get("SANDBOX_IMAGE", "python-code-sandbox:py3.11")
    # Explicit ulimits, as the server gives its sandboxes: Podman's defaults exceed this host's
    # hard limits and runc then cannot start the container.
    ulimits = ["--ulimit", "nofile=1024:4096", "--ulimit", "nproc=32768:32768"]
    foreign = subprocess.run(
        ["docker", "run", "-d", "--rm", *ulimits, "--network", "none", image, "sleep", "300"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    try:
        async with connect() as client:
            for tool, args in (
                ("run_python", {"code": "print(1)"}),
                ("sandbox_exec", {"command": "id"}),
                ("sandbox_stop", {}),
            ):
                for cid in (foreign, foreign[:12]):
                    result = await client.call_tool(tool, {"container_id": cid, **args})
                    assert result.is_error is True, tool
                    assert "no session" in text_of(result), text_of(result)
                for junk in ("../../etc", "x", "'; rm -rf /", "a" * 500):
                    result = await client.call_tool(tool, {"container_id": junk, **args})
                    assert result.is_error is True
                    assert "not a valid container_id" in text_of(result)
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", foreign], capture_output=True, text=True)
        assert running.stdout.strip() == "true", "the foreign container was touched"
    finally:
        subprocess.run(["docker", "rm", "-f", foreign], capture_output=True)


async def test_an_image_that_is_not_allowed_is_refused_with_the_list():
    async with connect(SANDBOX_ALLOWED_IMAGES="python:3.12-*") as client:
        for tool, args in (("run_python_ephemeral", {"code": "print(1)"}), ("sandbox_initialize", {})):
            result = await client.call_tool(tool, {"image": "alpine:latest", **args})
            assert result.is_error is True
            text = text_of(result)
            assert "alpine:latest is not allowed" in text and "python:3.12-*" in text, text


async def test_the_session_limit_is_enforced():
    async with connect(SANDBOX_MAX_SESSIONS="1") as client:
        first = await client.call_tool("sandbox_initialize", {})
        assert first.is_error is False
        second = await client.call_tool("sandbox_initialize", {})
        assert second.is_error is True
        assert "limit of 1 live sessions" in text_of(second)


async def test_an_idle_session_expires_and_says_so():
    async with connect(SANDBOX_SESSION_IDLE_TIMEOUT="1s") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        # The reaper runs in the background; wait (bounded) until the session is gone.
        for _ in range(100):
            listed = await client.call_tool("sandbox_list", {})
            if not listed.structured_content["sessions"]:
                break
            await anyio.sleep(0.2)
        assert not listed.structured_content["sessions"]
        result = await client.call_tool("run_python", {"container_id": cid, "code": "print(1)"})
        assert result.is_error is True
        assert "expired" in text_of(result) and "idle" in text_of(result)


async def test_an_endless_loop_does_not_delay_another_call():
    async with connect(SANDBOX_TIMEOUT="120s") as client:
        loop_done = anyio.Event()

        async def looping():
            await client.call_tool("run_python_ephemeral", {"code": "while True: pass"})
            loop_done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(looping)
            await anyio.sleep(0.5)
            hello = await client.call_tool("run_python_ephemeral", {"code": "print('still answering')"})
            assert hello.structured_content["stdout"] == "still answering\n"
            assert not loop_done.is_set(), "the loop must still be running"
            group.cancel_scope.cancel()


async def test_cancelling_a_call_interrupts_the_execution():
    async with connect(SANDBOX_TIMEOUT="120s") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        await client.call_tool("run_python", {"container_id": cid, "code": "kept = 'yes'"})
        code = (
            "import time\n"
            "open('state', 'w').write('started')\n"
            "try:\n"
            "    while True:\n"
            "        time.sleep(0.05)\n"
            "except KeyboardInterrupt:\n"
            "    open('state', 'w').write('interrupted')\n"
            "    raise\n"
        )
        with anyio.move_on_after(3):
            await client.call_tool("run_python", {"container_id": cid, "code": code})
            pytest.fail("the call should have been cancelled")
        # The session serves the next call only once the cancelled execution has ended.
        after = await client.call_tool("run_python", {"container_id": cid, "code": "print(open('state').read(), kept)"})
        assert after.structured_content["stdout"] == "interrupted yes\n", text_of(after)


async def test_progress_is_reported_while_a_sandbox_starts():
    messages = []

    async def on_progress(progress, total, message):
        messages.append(message)

    # Without a pool every call starts its sandbox, which is what progress is reported for.
    async with connect(SANDBOX_POOL_SIZE="0") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print(1)"}, progress_callback=on_progress)
        assert result.is_error is False
        for _ in range(50):
            if "starting the sandbox" in messages:
                break
            await anyio.sleep(0.05)
        assert "starting the sandbox" in messages, messages


async def test_an_unreachable_engine_is_an_actionable_error_and_the_server_recovers(tmp_path):
    proxy_path = str(tmp_path / "docker.sock")

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_reader, client_writer):
        up_reader, up_writer = await asyncio.open_unix_connection("/var/run/docker.sock")
        await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))

    proxy = None
    try:
        async with connect(DOCKER_HOST="unix://" + proxy_path) as client:
            down = await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
            assert down.is_error is True
            assert "not reachable" in text_of(down) and "Docker engine must be running" in text_of(down)
            # The engine "comes back": a proxy to the real socket appears at that path.
            proxy = await asyncio.start_unix_server(handle, path=proxy_path)
            up = await client.call_tool("run_python_ephemeral", {"code": "print('back')"})
            assert up.is_error is False, text_of(up)
            assert up.structured_content["stdout"] == "back\n"
        # The proxy stays up until the server has exited: it removes its sandboxes through it.
    finally:
        if proxy is not None:
            proxy.close()


async def test_wrong_argument_types_are_errors_and_the_server_keeps_serving():
    async with connect() as client:
        wrong_type = await client.call_tool("run_python_ephemeral", {"code": 42})
        assert wrong_type.is_error is True and "expected a string" in text_of(wrong_type)
        missing = await client.call_tool("run_python_ephemeral", {})
        assert missing.is_error is True and "missing field `code`" in text_of(missing)
        result = await client.call_tool("run_python_ephemeral", {"code": "print('fine')"})
        assert result.structured_content["stdout"] == "fine\n"


class _StubIndex(http.server.BaseHTTPRequestHandler):
    projects = ["requests", "requests-oauthlib", "numpy", "pyyaml", "ruamel-yaml"]

    def do_GET(self):
        if self.path.rstrip("/") == "/simple":
            body = json.dumps({"meta": {"api-version": "1.0"}, "projects": [{"name": p} for p in self.projects]})
            self._send(200, body, "application/vnd.pypi.simple.v1+json")
        elif self.path.startswith("/pypi/") and self.path.endswith("/json"):
            name = self.path.split("/")[2]
            if name in self.projects:
                self._send(200, json.dumps({"info": {"name": name, "version": "1.2.3", "summary": f"The {name} package"}}))
            else:
                self._send(404, "{}")
        else:
            self._send(404, "")

    def _send(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


async def test_search_pypi_packages_against_a_local_index(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        async with connect(SANDBOX_PYPI_URL=url, SANDBOX_CACHE_DIR=str(tmp_path)) as client:
            result = await client.call_tool("search_pypi_packages", {"query": "Requests"})
            assert result.is_error is False, text_of(result)
            names = [r["name"] for r in result.structured_content["results"]]
            assert names[0] == "requests" and "requests-oauthlib" in names
            assert result.structured_content["results"][0]["version"] == "1.2.3"
            assert "The requests package" in text_of(result)
            yaml = await client.call_tool("search_pypi_packages", {"query": "yaml"})
            assert {"pyyaml", "ruamel-yaml"} <= {r["name"] for r in yaml.structured_content["results"]}
    finally:
        server.shutdown()


def test_sigterm_removes_every_sandbox():
    """The server started by hand, spoken to with raw JSON-RPC, then terminated."""
    proc = subprocess.Popen([BIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_params(SANDBOX_POOL_SIZE=0).env)

    def send(message):
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def receive():
        return json.loads(proc.stdout.readline())

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert receive()["result"]["serverInfo"]["name"] == "python-code-sandbox-mcp"
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        # Garbage and a malformed request first: the server must answer and keep serving.
        proc.stdin.write(b"this is not json\n")
        proc.stdin.flush()
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_initialize", "arguments": {}}})
        reply = receive()
        while reply.get("id") != 2:
            reply = receive()
        assert reply["result"]["structuredContent"]["container_id"]
        assert len(sandboxes()) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert sandboxes() == []
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_the_pool_hands_out_fresh_sandboxes_only():
    async with connect(SANDBOX_POOL_SIZE="1", SANDBOX_FILES_DIR="") as client:
        for _ in range(3):
            result = await client.call_tool("run_python_ephemeral", {"code": "import os\nprint(os.listdir('.'))\nopen('mine.txt', 'w').write('x')"})
            assert result.structured_content["stdout"] == "[]\n", text_of(result)


async def test_the_server_removes_a_full_pool_when_it_exits():
    async with connect(SANDBOX_POOL_SIZE="2") as client:
        for _ in range(200):
            if len(sandboxes()) == 2:
                break
            await anyio.sleep(0.05)
        assert len(sandboxes()) == 2, "the pool fills in the background"
        result = await client.call_tool("run_python_ephemeral", {"code": "print('pooled')"})
        assert result.structured_content["stdout"] == "pooled\n"
    # The autouse fixture checks that nothing is left once the client has closed the server.


async def test_pool_size_zero_works():
    async with connect(SANDBOX_POOL_SIZE="0", SANDBOX_RECYCLE="false") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print('no pool')"})
        assert result.structured_content["stdout"] == "no pool\n"
        # The run's sandbox is removed in the background, and no pool sandbox takes its place.
        for _ in range(200):
            if not sandboxes():
                break
            await anyio.sleep(0.05)
        assert sandboxes() == []
