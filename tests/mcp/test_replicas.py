"""Several replicas (issue 20): two `serve --http` servers on one engine, HAProxy in front (the
least busy replica for a new MCP session, sticky on `Mcp-Session-Id` afterwards), driven by the official Python
SDK's streamable HTTP client through the balancer. Each replica owns the sandboxes it started (its
labels name its instance and process); stopping one removes only its own; one killed outright
leaves its sandboxes until a server starts again on this machine and removes what dead servers
left. Every address is 127.0.0.1; HAProxy (scripts/haproxy.sh installs it) runs as a process of
the test, with the configuration docs/http.md shows (its ports replaced) written to a temporary
directory."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import BIN, LABEL, sandboxes, text_of
from test_http import TOKEN, Server, leaves, mcp_client

pytestmark = pytest.mark.anyio

LABEL_PID = "io.python-code-sandbox.pid"
LABEL_INSTANCE = "io.python-code-sandbox.instance"

HTTP_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "http.md")


def haproxy_config(port, port_a, port_b):
    """The HAProxy configuration docs/http.md shows ("Running several replicas"), on these ports."""
    with open(HTTP_DOC, encoding="utf-8") as f:
        blocks = re.findall(r"```haproxy\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 1, "docs/http.md should show one haproxy block"
    config = blocks[0]
    for example, actual in (("127.0.0.1:8080", port), ("127.0.0.1:8081", port_a), ("127.0.0.1:8082", port_b)):
        assert config.count(example) == 1, example
        config = config.replace(example, f"127.0.0.1:{actual}")
    return config


def haproxy_binary():
    """HAProxy's path; without it the test fails when the run requires the engine's tests
    (PCS_REQUIRE_ENGINE=1, as scripts/test.sh sets), and is skipped otherwise."""
    found = shutil.which("haproxy")
    if found is None:
        message = "haproxy is not installed: run scripts/haproxy.sh (as root) first"
        if os.environ.get("PCS_REQUIRE_ENGINE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_of(url):
    return int(url.split(":")[2].split("/")[0])


class Balancer:
    """An haproxy process in the foreground (-db) in front of two replicas; its log is kept."""

    def __init__(self, directory, port_a, port_b):
        binary = haproxy_binary()
        self.port = free_port()
        config = directory / "haproxy.cfg"
        config.write_text(haproxy_config(self.port, port_a, port_b))
        checked = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        self.proc = subprocess.Popen(
            [binary, "-db", "-f", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.log = []

        def drain():
            for line in self.proc.stdout:
                self.log.append(line)

        threading.Thread(target=drain, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError("haproxy did not start:\n" + "".join(self.log))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


class Replicas:
    """Two replicas on one engine, one token, a files and a snapshots directory each, and the
    balancer in front."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.servers = {}
        self.balancer = None
        try:
            for name in ("a", "b"):
                self.servers[name] = self.start(name)
            self.balancer = Balancer(tmp_path, port_of(self.servers["a"].url), port_of(self.servers["b"].url))
        except BaseException:
            self.close()
            raise

    def start(self, name, addr="127.0.0.1:0"):
        return Server(
            addr=addr,
            SANDBOX_HTTP_TOKEN=TOKEN,
            SANDBOX_FILES_DIR=self.tmp_path / f"files-{name}",
            SANDBOX_SNAPSHOT_DIR=self.tmp_path / f"snapshots-{name}",
        )

    def restart(self, name):
        """Starts a new server on the port of `name` (which must have exited)."""
        old = self.servers[name]
        assert old.proc.poll() is not None
        self.servers[name] = self.start(name, addr=f"127.0.0.1:{port_of(old.url)}")
        return self.servers[name]

    def owner_of(self, cid):
        """Which replica started sandbox `cid`, by the server pid its labels name."""
        labels = inspect_labels(cid)
        owners = [name for name, server in self.servers.items() if labels.get(LABEL_PID) == str(server.proc.pid)]
        assert len(owners) == 1, (cid, labels, {n: s.proc.pid for n, s in self.servers.items()})
        return owners[0]

    def close(self):
        if self.balancer is not None:
            self.balancer.stop()
        codes = {}
        for name, server in self.servers.items():
            if server.proc.poll() is None:
                codes[name] = server.stop()
        assert all(code == 0 for code in codes.values()), (codes, {n: "".join(s.log) for n, s in self.servers.items()})


@pytest.fixture
def replicas(tmp_path):
    haproxy_binary()
    group = Replicas(tmp_path)
    try:
        yield group
    finally:
        group.close()


def inspect_labels(cid):
    out = subprocess.run(["docker", "inspect", "--format", "{{json .Config.Labels}}", cid],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def sandboxes_of_pid(pid):
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "label=" + LABEL,
                          "--filter", f"label={LABEL_PID}={pid}"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


async def wait_until(condition, what, seconds=60):
    """Polls `condition` (bounded: it guards a hang, it times nothing)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        await anyio.sleep(0.2)


class Session:
    """One client through the balancer with one sandbox session holding a counter."""

    def __init__(self, client, cid):
        self.client, self.cid, self.counter = client, cid, 0

    @classmethod
    async def open(cls, stack, url):
        client = await stack.enter_async_context(mcp_client(url))
        assert client.protocol_version == "2025-11-25", client.protocol_version
        started = await client.call_tool("sandbox_initialize", {})
        assert started.is_error is False, text_of(started)
        session = cls(client, started.structured_content["container_id"])
        await session.step()
        return session

    async def step(self):
        """Adds one to the counter in the sandbox's interpreter and checks the total."""
        code = "counter = globals().get('counter', 0) + 1\nprint(counter)"
        ran = await self.client.call_tool("run_python", {"container_id": self.cid, "code": code})
        assert ran.is_error is False, text_of(ran)
        self.counter += 1
        assert ran.structured_content["stdout"] == f"{self.counter}\n", (self.cid, text_of(ran))


async def open_sessions(stack, replicas, count):
    """`count` clients through the balancer; returns them by the replica that owns their sandbox."""
    by_replica = {"a": [], "b": []}
    for _ in range(count):
        session = await Session.open(stack, replicas.balancer.url)
        by_replica[replicas.owner_of(session.cid)].append(session)
    return by_replica


async def expect_session_gone(session):
    """A client whose replica is gone is told its MCP session no longer exists (HTTP 404, which
    the SDK reports as "Session terminated"): it must initialize again."""
    with pytest.raises(BaseException) as raised:
        with anyio.fail_after(60):
            await session.client.call_tool("run_python", {"container_id": session.cid, "code": "print(1)"})
    errors = [e for e in leaves(raised.value) if isinstance(e, MCPError)]
    assert errors, repr(raised.value)
    assert "Session terminated" in str(errors[0].error.message), errors[0].error


async def test_clients_through_the_balancer_spread_over_both_replicas_and_keep_their_state(replicas):
    async with contextlib.AsyncExitStack() as stack:
        by_replica = await open_sessions(stack, replicas, 4)
        # New MCP sessions go to both replicas; stickiness keeps every later request of a session
        # (its calls, its stream, its DELETE) on the replica that holds it.
        assert by_replica["a"] and by_replica["b"], {n: [s.cid for s in v] for n, v in by_replica.items()}
        everyone = by_replica["a"] + by_replica["b"]
        for _ in range(3):
            for session in everyone:
                await session.step()
        # Each replica's sandboxes carry its own instance; each client lists only its own session.
        instances = {name: {inspect_labels(s.cid)[LABEL_INSTANCE] for s in sessions} for name, sessions in by_replica.items()}
        assert len(instances["a"]) == len(instances["b"]) == 1 and instances["a"] != instances["b"], instances
        for session in everyone:
            listed = await session.client.call_tool("sandbox_list", {})
            assert [s["container_id"] for s in listed.structured_content["sessions"]] == [session.cid]
        for name, server in replicas.servers.items():
            assert sandboxes_of_pid(server.proc.pid) == {s.cid for s in by_replica[name]}
        # A sandbox of one replica is unknown to the other: a client connected straight to
        # replica b cannot name one of a's.
        async with mcp_client(replicas.servers["b"].url) as direct:
            refused = await direct.call_tool("run_python", {"container_id": by_replica["a"][0].cid, "code": "print(counter)"})
            assert refused.is_error is True and "no session" in text_of(refused), text_of(refused)
    # The clients closed their MCP sessions (DELETE, routed to the replica that holds each).
    await wait_until(lambda: sandboxes() == [], "every client's sandbox removed after its MCP session ended")
    for server in replicas.servers.values():
        assert server.proc.poll() is None
        assert any("an MCP session ended: stopping its 1 sandbox session(s)" in line for line in server.log)


async def test_a_replica_stopped_gracefully_removes_only_its_own_sandboxes(replicas):
    async with contextlib.AsyncExitStack() as stack:
        by_replica = await open_sessions(stack, replicas, 4)
        a, b = replicas.servers["a"], replicas.servers["b"]
        assert by_replica["a"] and by_replica["b"]
        a_pid = a.proc.pid
        assert a.stop() == 0, "".join(a.log)
        # Every sandbox of a is gone; every sandbox of b is still there, its state too.
        assert sandboxes_of_pid(a_pid) == set()
        assert sandboxes_of_pid(b.proc.pid) == {s.cid for s in by_replica["b"]}
        assert set(sandboxes()) == {s.cid for s in by_replica["b"]}
        for session in by_replica["b"]:
            await session.step()
        # A client of a is told its MCP session is gone; a new one is served (by b).
        await expect_session_gone(by_replica["a"][0])
        fresh = await Session.open(stack, replicas.balancer.url)
        assert replicas.owner_of(fresh.cid) == "b"
        await fresh.step()


async def test_a_killed_replicas_sandboxes_are_removed_when_a_server_starts_again(replicas):
    """A replica killed outright (SIGKILL) cannot remove its sandboxes: they end themselves once
    their server's attachment is gone (the engine removes them), its warden removes what is
    left, and what is still there when a server starts is removed then (and by
    `python-code-sandbox cleanup`). The survivor's are never touched. Here the killed replica is
    started again on its port."""
    async with contextlib.AsyncExitStack() as stack:
        by_replica = await open_sessions(stack, replicas, 4)
        b = replicas.servers["b"]
        b_pid = b.proc.pid
        b.proc.send_signal(signal.SIGKILL)
        assert b.proc.wait(timeout=30) == -signal.SIGKILL
        left = {s.cid for s in by_replica["b"]}
        # They may be ending already (their supervisors saw the hang-up, the warden removes them).
        assert left and sandboxes_of_pid(b_pid) <= left
        # Its clients are told their MCP session is gone (the balancer sends them to a, which does
        # not know it); a's clients go on.
        await expect_session_gone(by_replica["b"][0])
        for session in by_replica["a"]:
            await session.step()

        replicas.restart("b")
        await wait_until(lambda: sandboxes_of_pid(b_pid) == set(), "nothing the killed replica had is left")
        # a's sandboxes and state are untouched.
        assert sandboxes_of_pid(replicas.servers["a"].proc.pid) == {s.cid for s in by_replica["a"]}
        for session in by_replica["a"]:
            await session.step()
        # The killed replica's clients are told so by the replica now on its port too; a new
        # client goes to the restarted replica (the one with the fewest sessions).
        await expect_session_gone(by_replica["b"][-1])
        fresh = await Session.open(stack, replicas.balancer.url)
        assert replicas.owner_of(fresh.cid) == "b"
        await fresh.step()


async def test_cleanup_removes_a_killed_replicas_sandboxes_and_not_the_survivors(replicas):
    """Without a restart (a replica scaled down, or its node's server gone for good), the
    operator's `python-code-sandbox cleanup` on this machine removes what the killed replica left
    and leaves the running one's sandboxes alone."""
    async with contextlib.AsyncExitStack() as stack:
        by_replica = await open_sessions(stack, replicas, 2)
        a, b = replicas.servers["a"], replicas.servers["b"]
        assert by_replica["a"] and by_replica["b"]
        b.proc.send_signal(signal.SIGKILL)
        assert b.proc.wait(timeout=30) == -signal.SIGKILL
        assert sandboxes_of_pid(b.proc.pid) <= {s.cid for s in by_replica["b"]}
        done = subprocess.run([os.path.abspath(BIN), "cleanup"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "LOG_LEVEL": "warn"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert sandboxes_of_pid(b.proc.pid) == set(), done.stdout
        assert sandboxes_of_pid(a.proc.pid) == {s.cid for s in by_replica["a"]}
        for session in by_replica["a"]:
            await session.step()
