"""Operations of `serve --http` (issue 20): /healthz and /readyz (during start-up, running, with
the engine gone), /metrics in Prometheus text format, the audit log on stderr, and the drain on
SIGTERM. The real binary on a loopback port, the official MCP SDK over streamable HTTP, the real
engine; the engine's socket is reached through a proxy the test controls where a test needs the
engine to be slow or gone."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, SNAPSHOT_DIR, text_of
from test_http import INITIALIZE, MCP_HEADERS, TOKEN, mcp_client

pytestmark = pytest.mark.anyio

DOCKER_SOCKET = "/var/run/docker.sock"


class Server:
    """A `serve --http` process on a free loopback port, known from the moment it listens (before
    its start-up is done); stderr is drained in a thread."""

    def __init__(self, wait_for_mcp=True, **env):
        merged = dict(os.environ)
        # No pool and no recycled run sandboxes: the counts of sandboxes started stay exact.
        merged.update({"LOG_LEVEL": "info", "SANDBOX_POOL_SIZE": "0", "SANDBOX_RECYCLE": "false", "SANDBOX_HTTP_TOKEN": TOKEN})
        merged.setdefault("SANDBOX_SNAPSHOT_DIR", SNAPSHOT_DIR)
        merged.update({k: str(v) for k, v in env.items() if v is not None})
        for name in [k for k, v in env.items() if v is None]:
            merged.pop(name, None)
        self.proc = subprocess.Popen(
            [os.path.abspath(BIN), "serve", "--http", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=merged, text=True,
        )
        self.log = []
        self.base = None
        self.serving = threading.Event()
        listening = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                found = re.search(r"listening on (http://[0-9.]+:[0-9]+)", line)
                if found:
                    self.base = found.group(1)
                    listening.set()
                if "serving MCP over streamable HTTP" in line:
                    self.serving.set()
            listening.set()
            self.serving.set()

        threading.Thread(target=drain, daemon=True).start()
        listening.wait(timeout=60)
        if self.base is None:
            self.stop()
            raise AssertionError("the server did not listen:\n" + "".join(self.log))
        if wait_for_mcp:
            self.wait_serving()

    def wait_serving(self):
        assert self.serving.wait(timeout=120), "start-up did not end:\n" + "".join(self.log)
        assert self.proc.poll() is None, "the server stopped:\n" + "".join(self.log)

    @property
    def url(self):
        return self.base + "/mcp"

    def get(self, path, token=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx2.Client(timeout=30) as http:
            return http.get(self.base + path, headers=headers)

    def metrics(self, token=TOKEN):
        answer = self.get("/metrics", token=token)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4"), answer.headers
        return {f.name: f for f in text_string_to_metric_families(answer.text)}

    def audit(self):
        """The audit lines so far, parsed (LOG_FORMAT=json)."""
        lines = [json.loads(line) for line in self.log if line.startswith("{")]
        return [line for line in lines if line.get("target") == "audit"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
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


def value(families, name, **labels):
    """The value of the sample `name` with exactly these labels (0 when there is none)."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0


def poll(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for: {what}"
        time.sleep(0.1)


class EngineProxy:
    """A Unix socket standing for the Docker engine's, forwarding to the real one. `hold()` keeps
    new requests waiting (an engine that does not answer yet), `down()` drops every connection and
    the socket (an engine that is gone), `up()` forwards again."""

    def __init__(self, path):
        self.path = path
        self.forwarding = threading.Event()
        self.listener = None
        self.lock = threading.Lock()
        self.sockets = []

    def hold(self):
        self.forwarding.clear()
        self._listen()

    def up(self):
        self._listen()
        self.forwarding.set()

    def down(self):
        self.forwarding.clear()
        with self.lock:
            listener, self.listener = self.listener, None
            sockets, self.sockets = self.sockets, []
        if listener is not None:
            listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _listen(self):
        with self.lock:
            if self.listener is not None:
                return
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(self.path)
            listener.listen(64)
            self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        with self.lock:
            self.sockets.append(client)
        while not self.forwarding.wait(timeout=0.2):
            if client.fileno() < 0:
                return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(DOCKER_SOCKET)
        with self.lock:
            self.sockets.append(upstream)

        def pipe(source, target):
            try:
                while data := source.recv(65536):
                    target.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)


@pytest.fixture
def engine_proxy(tmp_path):
    proxy = EngineProxy(str(tmp_path / "docker.sock"))
    try:
        yield proxy
    finally:
        proxy.down()


@pytest.fixture
def uplink():
    """An `--internal` network for the egress proxy's uplink: nothing leaves the machine."""
    name = f"pcs-ops-{uuid.uuid4().hex[:12]}"
    subprocess.run(["docker", "network", "create", "--internal", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["docker", "network", "rm", name], capture_output=True)


def post_initialize(url, results):
    try:
        with httpx2.Client(timeout=120) as http:
            answer = http.post(url, content=json.dumps(INITIALIZE), headers={**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"})
            results.append(answer.status_code)
    except Exception as error:  # noqa: BLE001 - reported by the assertion that reads it
        results.append(repr(error))


async def test_health_answers_during_start_up_and_readiness_follows_the_engine(engine_proxy, uplink):
    # The engine does not answer yet: start-up (the egress proxy of SANDBOX_NETWORK=allowlist)
    # waits for it, and so does every MCP request; health answers at once.
    engine_proxy.hold()
    server = Server(
        wait_for_mcp=False,
        DOCKER_HOST="unix://" + engine_proxy.path,
        SANDBOX_NETWORK="allowlist",
        SANDBOX_EGRESS_ALLOW="ops.test:80",
        SANDBOX_EGRESS_UPLINK=uplink,
    )
    try:
        health = server.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok\n")
        ready = server.get("/readyz")
        assert (ready.status_code, ready.text) == (503, "not ready\n")
        # Health needs no token and reveals nothing: no version, no reason.
        assert "python-code-sandbox" not in ready.text and "version" not in ready.headers.get("server", "")
        early = []
        thread = threading.Thread(target=post_initialize, args=(server.url, early), daemon=True)
        thread.start()
        assert early == [], "an MCP request was answered before start-up was done"
        assert not server.serving.is_set()

        engine_proxy.up()
        server.wait_serving()
        thread.join(timeout=120)
        assert early == [200], early
        poll(lambda: server.get("/readyz").status_code == 200, "ready once started")
        assert server.get("/readyz").text == "ready\n"

        # The engine goes away: not ready (still alive); it comes back: ready again.
        engine_proxy.down()
        poll(lambda: server.get("/readyz").status_code == 503, "not ready without the engine")
        assert server.get("/healthz").status_code == 200
        engine_proxy.up()
        poll(lambda: server.get("/readyz").status_code == 200, "ready again with the engine back")
    finally:
        # The engine stays reachable until the server has exited: it removes its sandboxes.
        engine_proxy.up()
        code = server.stop()
    assert code == 0, "".join(server.log)


async def test_a_missing_image_makes_the_server_not_ready():
    with http_server(SANDBOX_IMAGE="python-code-sandbox:pcs-ops-no-such-tag") as server:
        assert server.get("/healthz").status_code == 200
        assert server.get("/readyz").status_code == 503


async def test_metrics_count_the_calls_and_the_audit_log_has_one_line_per_call():
    marker = "pcs-secret-" + uuid.uuid4().hex
    with http_server(LOG_FORMAT="json", SANDBOX_TIMEOUT="2s") as server:
        # /metrics is behind the same gate as /mcp.
        assert server.get("/metrics").status_code == 401
        assert server.get("/metrics", token="wrong").status_code == 401
        before = server.metrics()
        assert value(before, "sandbox_tool_calls_in_flight") == 0
        assert value(before, "sandbox_sessions_live") == 0
        assert value(before, "sandbox_pool_ready", set="default") == 0

        async with mcp_client(server.url) as client:
            ok = await client.call_tool("run_python_ephemeral", {"code": f"print('{marker}')"})
            assert ok.is_error is False, text_of(ok)
            failed = await client.call_tool("run_python_ephemeral", {"code": f"raise ValueError('{marker}')"})
            assert failed.is_error is True
            slow = await client.call_tool("run_python_ephemeral", {"code": "import time; time.sleep(60)"})
            assert slow.structured_content["timed_out"] is True, text_of(slow)
            cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            wrote = await client.call_tool("run_python", {"container_id": cid, "code": "open('out.bin', 'wb').write(b'x' * 5000)"})
            assert wrote.is_error is False, text_of(wrote)
            assert [f["path"] for f in wrote.structured_content["files"]] == ["out.bin"]
            during = server.metrics()
            assert value(during, "sandbox_sessions_live") == 1
            await client.call_tool("sandbox_stop", {"container_id": cid})

        after = server.metrics()
        calls = {
            ("run_python_ephemeral", "ok"): 1,
            ("run_python_ephemeral", "error"): 1,
            ("run_python_ephemeral", "timeout"): 1,
            ("sandbox_initialize", "ok"): 1,
            ("run_python", "ok"): 1,
            ("sandbox_stop", "ok"): 1,
        }
        for (tool, outcome), count in calls.items():
            assert value(after, "sandbox_tool_calls_total", tool=tool, outcome=outcome) == count, (tool, outcome)
        assert value(after, "sandbox_principal_tool_calls_total", principal="anonymous") == 6
        assert value(after, "sandbox_tool_call_duration_seconds_count", tool="run_python_ephemeral") == 3
        assert value(after, "sandbox_tool_calls_in_flight") == 0
        assert value(after, "sandbox_sessions_live") == 0
        # Four sandboxes started: three ephemeral, one session.
        assert value(after, "sandbox_startup_duration_seconds_count") == 4
        assert value(after, "sandbox_copied_out_bytes_total") == 5000
        assert value(after, "sandbox_dependency_installs_total") == 0

        audit = server.audit()
        assert [(a["tool"], a["outcome"]) for a in audit] == [
            ("run_python_ephemeral", "ok"),
            ("run_python_ephemeral", "error"),
            ("run_python_ephemeral", "timeout"),
            ("sandbox_initialize", "ok"),
            ("run_python", "ok"),
            ("sandbox_stop", "ok"),
        ], audit
        for line in audit:
            assert line["principal"] == "anonymous" and line["message"] == "tool call", line
            assert isinstance(line["duration_ms"], int), line
        assert [a["session"] for a in audit] == ["-", "-", "-", cid, cid, cid]
        assert [a["bytes_out"] for a in audit] == [0, 0, 0, 0, 5000, 0]
        # The code and its output are in no log line (LOG_LEVEL=info).
        assert not any(marker in line for line in server.log), "".join(server.log)


def principal_token(name, *options):
    """A new token for `name` and its tokens-file line, as `python-code-sandbox token` makes them."""
    made = subprocess.run([os.path.abspath(BIN), "token", name, *options], capture_output=True, text=True, check=True, timeout=60)
    fields = dict(line.split(": ", 1) for line in made.stdout.splitlines())
    return fields["token"], fields["line"]


async def test_calls_are_counted_and_audited_by_principal(tmp_path):
    alice, alice_line = principal_token("alice")
    bob, bob_line = principal_token("bob")
    ops, ops_line = principal_token("ops", "--admin")
    tokens = tmp_path / "tokens"
    tokens.write_text(alice_line + "\n" + bob_line + "\n" + ops_line + "\n")
    with http_server(LOG_FORMAT="json", SANDBOX_HTTP_TOKEN=None, SANDBOX_HTTP_TOKENS_FILE=tokens) as server:
        async with mcp_client(server.url, token=alice) as client:
            for _ in range(2):
                done = await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
                assert done.is_error is False, text_of(done)
        async with mcp_client(server.url, token=bob) as client:
            listed = await client.call_tool("sandbox_list", {})
            assert listed.is_error is False, text_of(listed)
        assert server.get("/metrics", token=TOKEN).status_code == 401
        # The metrics name every principal: only an admin reads them.
        assert server.get("/metrics", token=bob).status_code == 403
        metrics = server.metrics(token=ops)
        assert value(metrics, "sandbox_principal_tool_calls_total", principal="alice") == 2
        assert value(metrics, "sandbox_principal_tool_calls_total", principal="bob") == 1
        assert value(metrics, "sandbox_principal_tool_calls_total", principal="anonymous") == 0
        assert [(a["principal"], a["tool"]) for a in server.audit()] == [
            ("alice", "run_python_ephemeral"), ("alice", "run_python_ephemeral"), ("bob", "sandbox_list"),
        ]


async def test_metrics_on_their_own_address_need_no_token():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with http_server(SANDBOX_METRICS_ADDR=f"127.0.0.1:{port}") as server:
        with httpx2.Client(timeout=30) as http:
            answer = http.get(f"http://127.0.0.1:{port}/metrics")
        assert answer.status_code == 200, answer.text
        names = {f.name for f in text_string_to_metric_families(answer.text)}
        assert {"sandbox_tool_calls_in_flight", "sandbox_sessions_live", "sandbox_pool_ready"} <= names, names
        # Not on the MCP port any more.
        assert server.get("/metrics", token=TOKEN).status_code == 404


async def test_the_audit_line_carries_the_arguments_only_at_debug():
    marker = "pcs-debug-" + uuid.uuid4().hex
    with http_server(LOG_FORMAT="json", LOG_LEVEL="info,audit=debug") as server:
        async with mcp_client(server.url) as client:
            done = await client.call_tool("run_python_ephemeral", {"code": f"x = '{marker}'"})
            assert done.is_error is False, text_of(done)
        [line] = server.audit()
        assert marker in line["arguments"], line


async def test_sigterm_drains_the_calls_in_progress_then_exits():
    with http_server(SANDBOX_DRAIN_TIMEOUT="120s") as server:
        async with mcp_client(server.url) as client:
            results = {}

            async def long_call():
                code = "import time; time.sleep(8); print('finished')"
                results["call"] = await client.call_tool("run_python_ephemeral", {"code": code})

            async with anyio.create_task_group() as group:
                group.start_soon(long_call)
                await anyio.to_thread.run_sync(
                    poll, lambda: value(server.metrics(), "sandbox_tool_calls_in_flight") == 1, "the call to start")
                server.proc.send_signal(signal.SIGTERM)
                # Not ready at once; new MCP requests are refused; health still answers.
                await anyio.to_thread.run_sync(
                    poll, lambda: server.get("/readyz").status_code == 503, "not ready after SIGTERM")
                assert server.get("/healthz").status_code == 200
                with httpx2.Client(timeout=30) as http:
                    refused = http.post(server.url, content=json.dumps(INITIALIZE),
                                        headers={**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"})
                assert refused.status_code == 503, refused.text
                assert server.proc.poll() is None, "the server exited while a call was in progress"
            call = results["call"]
            assert call.is_error is False, text_of(call)
            assert call.structured_content["stdout"] == "finished\n"
            assert call.structured_content["cancelled"] is False
        code = server.proc.wait(timeout=120)
        assert code == 0, "".join(server.log)
        assert any("SIGTERM: draining" in line for line in server.log), "".join(server.log)
