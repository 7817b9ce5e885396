"""Fixtures: the real server binary, driven over stdio by the official MCP Python SDK."""

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from mcp import Client, StdioServerParameters

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import server_processes  # noqa: E402

BIN = os.environ.get("PCS_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "target", "debug", "python-code-sandbox"))
LABEL = "io.python-code-sandbox.managed=true"
# Snapshots the servers make (sessions that expire are saved first) go here, not into the user's
# state directory; a test that looks at snapshots sets its own.
SNAPSHOT_DIR = tempfile.mkdtemp(prefix="pcs-mcp-snapshots-")
# The runtime the suite's servers (and the commands its tests run) use: runc unless
# PCS_MCP_RUNTIME says otherwise ("default": the server's own choice, gVisor where registered).
# The suite is about the protocol and the tools; under gVisor on this kind of machine (the ptrace
# platform) each of its ~400 sandbox starts costs about 2 s of CPU. A module that sets
# UNDER_DEFAULT_RUNTIME = True (the original tool set's, test_server.py) runs under the server's
# default anyway, as do the tests that name a runtime (test_load.py: both) and the server image's
# `docker run` line; the engine tests and the adversarial suite run under gVisor.
SUITE_RUNTIME = os.environ.get("PCS_MCP_RUNTIME", "runc")
RUNTIME_SET_HERE = SUITE_RUNTIME != "default" and "SANDBOX_RUNTIME" not in os.environ
if RUNTIME_SET_HERE:
    os.environ["SANDBOX_RUNTIME"] = SUITE_RUNTIME
atexit.register(shutil.rmtree, SNAPSHOT_DIR, True)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(autouse=True)
def _default_runtime_where_asked(request, monkeypatch):
    """The servers of a module with UNDER_DEFAULT_RUNTIME = True choose their runtime themselves."""
    if getattr(request.module, "UNDER_DEFAULT_RUNTIME", False) and RUNTIME_SET_HERE:
        monkeypatch.delenv("SANDBOX_RUNTIME", raising=False)


def server_params(**env):
    merged = dict(os.environ)
    merged.setdefault("LOG_LEVEL", os.environ.get("PCS_TEST_LOG", "warn"))
    merged.setdefault("SANDBOX_SNAPSHOT_DIR", SNAPSHOT_DIR)
    # One pooled sandbox, not the default two: most tests make a call or two, and each sandbox
    # started costs the suite about a second of CPU under gVisor. Tests of the pool set theirs.
    merged.setdefault("SANDBOX_POOL_SIZE", "1")
    merged.update({k: str(v) for k, v in env.items()})
    return StdioServerParameters(command=os.path.abspath(BIN), args=[], env=merged)


@contextlib.asynccontextmanager
async def connect(_client=None, **env):
    """A client connected to a fresh server process with extra environment variables; `_client`
    holds extra arguments of the client (callbacks, the revision to negotiate)."""
    async with Client(server_params(**env), read_timeout_seconds=180, **(_client or {})) as client:
        yield client


def sandboxes():
    """Ids of every container this project's servers own on the engine."""
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "label=" + LABEL], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.split() if line]


def volumes():
    out = subprocess.run(["docker", "volume", "ls", "-q", "--filter", "label=" + LABEL], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.split() if line]


def find_server_pid(tag, warden=False):
    """The server process started with PCS_TEST_TAG=tag, or with `warden` its warden."""
    return server_processes.find_server_pid("PCS_TEST_TAG", tag, warden)


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", None) == "text")


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test starts and ends with no sandbox on the engine (the suite runs alone)."""
    assert sandboxes() == [], "a sandbox existed before the test"
    yield
    # The server removes its sandboxes before it exits. The engine may still be deleting a large
    # workspace (100 000 files take it seconds), so allow it a bounded time to finish.
    deadline = time.monotonic() + 60
    while (sandboxes() or volumes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sandboxes() == [], "a sandbox outlived its server"
    assert volumes() == [], "a volume outlived its server"
