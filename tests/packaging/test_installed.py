"""The server as a package installs it: the command scripts/test-packaging.sh installed (the wheel's
`python-code-sandbox-mcp` in a fresh virtualenv, or `uvx --from WHEEL python-code-sandbox-mcp`),
started the way a client config starts it (no arguments: MCP over stdio), from a directory that
is not the checkout, driven by the official MCP Python SDK against the real Docker engine.

Environment (set by the script):
  PCS_PACKAGED_COMMAND  the command line that starts the server (shell words), required
  PCS_PACKAGED_VERSION  the version the server must report (the crate's), optional
"""

import atexit
import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time

import pytest
from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.anyio

LABEL = "io.python-code-sandbox.managed=true"
# The tools of the original server (the seed's API), which a client config written for it uses.
SEED_TOOLS = {"run_python_ephemeral", "sandbox_initialize", "run_python", "sandbox_stop", "search_pypi_packages"}

# What the server writes on the host (snapshots of sessions, files the code made) goes here, not
# into the user's state directories; the server starts in an empty directory of its own.
STATE = tempfile.mkdtemp(prefix="pcs-packaging-")
atexit.register(shutil.rmtree, STATE, True)


def command():
    line = os.environ.get("PCS_PACKAGED_COMMAND", "")
    words = shlex.split(line)
    if not words:
        pytest.fail("PCS_PACKAGED_COMMAND is not set: run scripts/test-packaging.sh (it installs the wheel and sets it)")
    return words


@pytest.fixture
def anyio_backend():
    return "asyncio"


@contextlib.asynccontextmanager
async def connect():
    program, *args = command()
    env = dict(os.environ)
    env.setdefault("LOG_LEVEL", "warn")
    env["SANDBOX_SNAPSHOT_DIR"] = os.path.join(STATE, "snapshots")
    env["SANDBOX_FILES_DIR"] = os.path.join(STATE, "files")
    cwd = os.path.join(STATE, "cwd")
    os.makedirs(cwd, exist_ok=True)
    params = StdioServerParameters(command=program, args=args, env=env, cwd=cwd)
    async with Client(params, read_timeout_seconds=180) as client:
        yield client


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def sandboxes():
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "label=" + LABEL], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test starts and ends with no sandbox on the engine (the suite runs alone)."""
    assert sandboxes() == [], "a sandbox existed before the test"
    yield
    deadline = time.monotonic() + 60
    while sandboxes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sandboxes() == [], "a sandbox outlived its server"


async def test_the_installed_command_is_the_server_and_lists_its_tools():
    async with connect() as client:
        assert client.server_info.name == "python-code-sandbox-mcp"
        expected = os.environ.get("PCS_PACKAGED_VERSION")
        if expected:
            assert client.server_info.version == expected
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert SEED_TOOLS <= listed, SEED_TOOLS - listed


async def test_hello_prompt_through_run_python_ephemeral():
    # README's first prompt: "Create and run a Python script with print("Hello MCP")".
    async with connect() as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print('Hello MCP')"})
        assert result.is_error is False, text_of(result)
        assert "Hello MCP" in text_of(result)
        assert result.structured_content["stdout"] == "Hello MCP\n"
        assert result.structured_content["exit_code"] == 0


async def test_a_session_keeps_a_variable_and_stops():
    async with connect() as client:
        started = await client.call_tool("sandbox_initialize", {})
        assert started.is_error is False, text_of(started)
        cid = started.structured_content["container_id"]
        first = await client.call_tool("run_python", {"container_id": cid, "code": "greeting = 'Hello, World!'"})
        assert first.is_error is False, text_of(first)
        shown = await client.call_tool("run_python", {"container_id": cid, "code": "print(greeting)"})
        assert shown.structured_content["stdout"] == "Hello, World!\n"
        stopped = await client.call_tool("sandbox_stop", {"container_id": cid})
        assert stopped.is_error is False and stopped.structured_content["stopped"] is True, text_of(stopped)
        assert cid not in sandboxes()
