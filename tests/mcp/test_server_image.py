"""The server image (docker/server/Dockerfile, built by scripts/server-image.sh): the server runs in
a container with the host's Docker socket, driven by the official MCP client through the original project's
`docker run -i --rm -v /var/run/docker.sock:/var/run/docker.sock ... IMAGE stdio` line."""

import base64
import contextlib
import json
import os
import pathlib
import re
import subprocess
import time
import uuid

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import connect, sandboxes, text_of

pytestmark = pytest.mark.anyio

IMAGE = os.environ.get("PCS_SERVER_IMAGE", "python-code-sandbox-server:latest")
SOCKET = "/var/run/docker.sock"
SERVER_UID = 10001
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = """
import matplotlib.pyplot as plt
plt.plot([0, 1, 2, 3], [0, 1, 4, 9])
plt.title('squares')
plt.savefig('plot.png')
print('plotted')
"""


@pytest.fixture(autouse=True, scope="module")
def server_image():
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    if found.returncode != 0:
        pytest.fail(f"the server image {IMAGE} is missing: build it with `bash scripts/server-image.sh --offline`")


def docker_run(*extra, env=None, name=None):
    """The original project's line: `docker run -i --rm -v SOCKET:SOCKET -e SANDBOX_MEMORY_LIMIT=1g ...`, with
    the socket's group (the server runs as uid 10001) and what the test environment configures:
    the host CA bundle mounted at its own path, the dependency volume, the download cache (a host
    path, used as is)."""
    args = ["run", "-i", "--rm", "--name", name or f"pcs-server-test-{uuid.uuid4().hex[:12]}",
            "--group-add", str(os.stat(SOCKET).st_gid),
            "-v", f"{SOCKET}:{SOCKET}", "-e", "SANDBOX_MEMORY_LIMIT=1g", "-e", "SANDBOX_POOL_SIZE=0",
            "-e", "LOG_LEVEL=" + os.environ.get("PCS_TEST_LOG", "warn")]
    bundle = os.environ.get("SANDBOX_CA_BUNDLE")
    if bundle:
        args += ["-v", f"{bundle}:{bundle}:ro", "-e", f"SANDBOX_CA_BUNDLE={bundle}"]
    for var in ("SANDBOX_DEPS_VOLUME", "PIP_CACHE_PATH", "ENABLE_PIP_CACHE", "SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE"):
        if os.environ.get(var):
            args += ["-e", f"{var}={os.environ[var]}"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return args + list(extra)


@contextlib.asynccontextmanager
async def containerized(*extra, env=None):
    name = f"pcs-server-test-{uuid.uuid4().hex[:12]}"
    params = StdioServerParameters(command="docker", args=docker_run(*extra, env=env, name=name) + [IMAGE, "stdio"])
    try:
        async with Client(params, read_timeout_seconds=600) as client:
            yield client
    finally:
        # The server removes its sandboxes when its stdin closes; this only guards against a hang.
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def owned_by_the_server(directory: pathlib.Path):
    """The files directory is written by the server's uid, as on the host."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, SERVER_UID, SERVER_UID)
    return directory


async def test_hello_world_and_a_plot_through_the_server_image(tmp_path):
    files = owned_by_the_server(tmp_path / "files")
    # A host directory mounted at the same path: the paths the server reports are the host's.
    async with containerized("-v", f"{files}:{files}", env={"SANDBOX_FILES_DIR": files}) as client:
        hello = await client.call_tool("run_python_ephemeral", {"code": "print('Hello MCP')"})
        assert hello.is_error is False, text_of(hello)
        assert hello.structured_content["stdout"] == "Hello MCP\n"

        plot = await client.call_tool("run_python_ephemeral", {"code": PLOT, "dependencies": ["matplotlib"]})
        assert plot.is_error is False, text_of(plot)
        assert plot.structured_content["stdout"] == "plotted\n"
        # The saved file (a script does not show again at its end the figure it saved).
        images = [block for block in plot.content if block.type == "image"]
        assert len(images) == 1, plot.content
        for image in images:
            assert image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        [saved] = [f for f in plot.structured_content["files"] if f["path"] == "plot.png"]
        assert saved["saved_to"].startswith(str(files) + "/")
        assert pathlib.Path(saved["saved_to"]).read_bytes().startswith(PNG_MAGIC)


async def test_a_session_in_the_container_and_nothing_left_when_it_exits():
    async with containerized() as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        await client.call_tool("run_python", {"container_id": cid, "code": "x = 6 * 7"})
        shown = await client.call_tool("run_python", {"container_id": cid, "code": "print(x)"})
        assert shown.structured_content["stdout"] == "42\n"
        labels = subprocess.run(
            ["docker", "inspect", "-f", '{{index .Config.Labels "io.python-code-sandbox.pid-namespace"}}', cid],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        assert re.fullmatch(r"pid:\[\d+\]", labels) and labels != os.readlink("/proc/self/ns/pid")
    # The autouse fixture checks that the server removed its sandboxes when its stdin closed.


async def test_a_server_in_a_container_leaves_a_live_host_servers_sandboxes_alone():
    """Same host name (--uts=host), same boot: only the pid namespace tells the two servers
    apart. The containerized server's clean-up must not take the host server's pid for dead."""
    async with connect(SANDBOX_POOL_SIZE="0") as host_server:
        cid = (await host_server.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        done = subprocess.run(["docker"] + docker_run("--uts=host") + [IMAGE, "cleanup"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert cid in sandboxes(), "the containerized server removed a live server's sandbox"
        alive = await host_server.call_tool("run_python", {"container_id": cid, "code": "print('still here')"})
        assert alive.structured_content["stdout"] == "still here\n", text_of(alive)


async def test_a_containerized_server_killed_outright_leaves_nothing_behind():
    """SIGKILL leaves the server no chance to clean up, and its pid is in a namespace no other
    server can look into. Its session ends by itself (its attachment to the server hangs up); what
    an engine would still hold of it (here a container with the session's labels, made by the test
    as a session that could not end itself would stay) names the server's container, which the
    engine says is gone: the next server's clean-up removes it."""
    name = f"pcs-server-test-{uuid.uuid4().hex[:12]}"
    params = StdioServerParameters(command="docker", args=docker_run(name=name) + [IMAGE, "stdio"])
    cid = server = labels = image = None
    # Only the client's own exit may fail (the server dies under it); checks come after.
    with contextlib.suppress(Exception):
        async with Client(params, read_timeout_seconds=600) as client:
            cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            server = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name],
                                    capture_output=True, text=True).stdout.strip()
            labels = json.loads(subprocess.run(["docker", "inspect", "-f", "{{json .Config.Labels}}", cid],
                                               capture_output=True, text=True).stdout)
            image = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}}", cid],
                                   capture_output=True, text=True).stdout.strip()
            subprocess.run(["docker", "kill", name], capture_output=True)
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert cid is not None, "the session did not start"
    named = labels.get("io.python-code-sandbox.server-container")
    assert named == server, f"the session names {named!r}, not the server's container {server!r}"
    deadline = time.monotonic() + 60
    while cid in sandboxes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cid not in sandboxes(), "the killed server's session did not end by itself"
    args = ["docker", "run", "-d", "--network", "none", "--entrypoint", "sleep"]
    for key, value in labels.items():
        args += ["--label", f"{key}={value}"]
    stand_in = subprocess.run(args + [image, "600"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        assert stand_in in sandboxes()
        done = subprocess.run(["docker"] + docker_run() + [IMAGE, "cleanup"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert stand_in not in sandboxes(), "the next server's clean-up left what the dead server had"
    finally:
        subprocess.run(["docker", "rm", "-f", stand_in], capture_output=True)


async def test_streamable_http_from_the_container():
    token = uuid.uuid4().hex
    name = f"pcs-server-test-{uuid.uuid4().hex[:12]}"
    args = docker_run("-d", "-p", "127.0.0.1::8080", name=name, env={"SANDBOX_HTTP_TOKEN": token})
    args.remove("-i")
    started = subprocess.run(["docker"] + args + [IMAGE, "serve", "--http", "0.0.0.0:8080"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    try:
        port = subprocess.run(["docker", "port", name, "8080/tcp"], capture_output=True, text=True,
                              check=True).stdout.split()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}/mcp"
        headers = {"Authorization": f"Bearer {token}"}
        for _ in range(100):  # until the server listens (bounded)
            with contextlib.suppress(Exception):
                async with create_mcp_http_client(headers=headers) as http:
                    async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=180) as client:
                        result = await client.call_tool("run_python_ephemeral", {"code": "print('over http')"})
                        break
            await anyio.sleep(0.2)
        else:
            pytest.fail("the containerized HTTP server never answered")
        assert result.structured_content["stdout"] == "over http\n", text_of(result)
        # docker stop sends SIGTERM: the server removes its sandboxes and exits 0.
        subprocess.run(["docker", "stop", "-t", "60", name], capture_output=True, check=True)
        deadline = time.monotonic() + 60
        while sandboxes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sandboxes() == []
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_killing_the_docker_client_still_removes_the_servers_sandboxes():
    """The MCP client kills `docker run` outright: the container's stdin closes (docker run -i
    attaches it once), so the server ends as on end of input and removes its sandboxes."""
    name = f"pcs-server-test-{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen(["docker"] + docker_run(name=name) + [IMAGE, "stdio"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(message):
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def receive(request_id):
        while True:
            reply = json.loads(proc.stdout.readline())
            if reply.get("id") == request_id:
                return reply

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert receive(1)["result"]["serverInfo"]["name"] == "python-code-sandbox-mcp"
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sandbox_initialize", "arguments": {}}})
        cid = receive(2)["result"]["structuredContent"]["container_id"]
        assert cid in sandboxes()
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while cid in sandboxes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cid not in sandboxes(), "the killed client's server left its session behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


async def test_snapshots_work_in_the_server_image():
    """The image's snapshot directory is the server's own (uid 10001): a session saved and
    started again from its snapshot, through the containerized server."""
    async with containerized() as client:
        started = await client.call_tool("sandbox_initialize", {})
        assert started.is_error is False, text_of(started)
        cid = started.structured_content["container_id"]
        ran = await client.call_tool("run_python", {"container_id": cid, "code": "x = 'saved'"})
        assert ran.is_error is False, text_of(ran)
        saved = await client.call_tool("sandbox_snapshot", {"container_id": cid})
        assert saved.is_error is False, text_of(saved)
        restored = await client.call_tool("sandbox_initialize", {"snapshot_id": saved.structured_content["snapshot_id"]})
        assert restored.is_error is False, text_of(restored)
        again = await client.call_tool(
            "run_python", {"container_id": restored.structured_content["container_id"], "code": "print(x)"})
        assert again.is_error is False and again.structured_content["stdout"] == "saved\n", text_of(again)
