"""Under load, through the official SDK against the real engine, under both runtimes: calls beyond
the server's capacity wait their turn and every one is answered correctly; nothing is left when
the client closes right after a burst, nor after the server is killed outright (the sandboxes end
themselves); a run's sandbox serves the same client's next run only once nothing of the last
run is left in it."""

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from mcp import ClientSession
from mcp.client.stdio import stdio_client

from conftest import connect, find_server_pid, sandboxes, server_params, text_of

RUNTIMES = ["runc", "runsc"]


async def run(client, code):
    result = await client.call_tool("run_python_ephemeral", {"code": code})
    assert not result.is_error, text_of(result)
    return result.structured_content


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_burst_beyond_the_capacity_is_answered_and_closing_leaves_nothing(runtime):
    # Two sandboxes at most: twelve concurrent calls wait their turn; every answer is right.
    async with connect(SANDBOX_RUNTIME=runtime, SANDBOX_MAX_SANDBOXES="2", SANDBOX_POOL_SIZE="2") as client:
        results = await asyncio.gather(*(run(client, f"print(sum(range({n})))") for n in range(12)))
        assert [r["stdout"] for r in results] == [f"{sum(range(n))}\n" for n in range(12)]
        assert 0 < len(sandboxes()) <= 2
        # Another burst, and the client closes while its calls are still in flight.
        burst = [asyncio.ensure_future(run(client, "import time; time.sleep(0.5); print(1)")) for _ in range(6)]
        await asyncio.sleep(0.3)
        closed_at = time.monotonic()
    for call in burst:
        call.cancel()
    # The SDK gives a closing server 2 s before it signals it: everything is gone by then.
    await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - closed_at)))
    assert sandboxes() == [], "sandboxes outlived the client's close by 2 s"


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_after_a_kill_the_sandboxes_end_themselves(runtime):
    tag = uuid.uuid4().hex
    params = server_params(SANDBOX_RUNTIME=runtime, SANDBOX_POOL_SIZE="2", PCS_TEST_TAG=tag)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            session = await client.call_tool("sandbox_initialize", {})
            assert not session.is_error, text_of(session)
            await run(client, "print('recycled next')")
            busy = asyncio.ensure_future(
                client.call_tool("run_python_ephemeral", {"code": "while True: pass"})
            )
            deadline = time.monotonic() + 60
            while len(sandboxes()) < 4:  # the pool's, the session's, the busy run's (and recycled)
                assert time.monotonic() < deadline, sandboxes()
                await asyncio.sleep(0.2)
            # A container the server created but had not started yet when it was killed (the
            # window between create and start): nothing in it runs to end it.
            created = created_like_the_server(sandboxes()[0])
            pid = find_server_pid(tag)
            warden = find_server_pid(tag, warden=True)
            assert pid is not None and warden is not None
            os.kill(pid, signal.SIGKILL)
            busy.cancel()
            # No other server runs: the started sandboxes end themselves, and the server's warden
            # removes what is left (the created one among them), then exits.
            deadline = time.monotonic() + 30
            while sandboxes() or find_server_pid(tag, warden=True):
                assert time.monotonic() < deadline, f"left after the kill: {sandboxes()}"
                await asyncio.sleep(0.2)
            assert created not in sandboxes()


def created_like_the_server(sandbox):
    """A container with `sandbox`'s labels (so its server's), created and never started."""
    labels = json.loads(
        subprocess.run(
            ["docker", "inspect", "--format", "{{json .Config.Labels}}", sandbox],
            capture_output=True, text=True, check=True,
        ).stdout
    )
    image = subprocess.run(
        ["docker", "inspect", "--format", "{{.Config.Image}}", sandbox],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    flags = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
    out = subprocess.run(
        ["docker", "create", "--network", "none", *flags, image, "true"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


@pytest.mark.anyio
async def test_a_closing_server_releases_its_warden():
    tag = uuid.uuid4().hex
    async with connect(PCS_TEST_TAG=tag) as client:
        await run(client, "print(1)")
        assert find_server_pid(tag, warden=True) is not None
    # Told that nothing is left, the warden has exited with its server.
    assert find_server_pid(tag, warden=True) is None
    assert sandboxes() == []


LEAVE = r"""
import ctypes, errno, os, subprocess, sys, string
open('/workspace/left.txt', 'w').write('x')
os.makedirs('/workspace/d/e', exist_ok=True); os.chmod('/workspace/d', 0)
open('/tmp/left.txt', 'w').write('x')
open('/dev/shm/left', 'w').write('x')
os.symlink('/etc/passwd', '/tmp/link')
subprocess.Popen(['sleep', '1000'], start_new_session=True)
os.environ['LEFT'] = '1'
string.PATCHED = 1
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0, 4096, 0o1000 | 0o600)
print(os.getpid(), shm, ctypes.get_errno() == errno.ENOSYS)
try:
    open('/proc/1/mem', 'rb')
    print('pid 1 open')
except OSError as e:
    print('pid 1 closed', e.errno)
"""

LOOK = r"""
import os, string
print(os.getpid())
print(sorted(os.listdir('/workspace')), sorted(n for n in os.listdir('/tmp') if not n.startswith(('.', 'pcs-pip-'))), os.listdir('/dev/shm'))
print(os.environ.get('LEFT'), hasattr(string, 'PATCHED'))
print([p for p in os.listdir('/proc') if p.isdigit() and open(f'/proc/{p}/cmdline').read().startswith('sleep')])
"""


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_recycled_sandbox_keeps_nothing_of_the_last_run(runtime):
    async with connect(SANDBOX_RUNTIME=runtime, SANDBOX_POOL_SIZE="1") as client:
        first = (await run(client, LEAVE))["stdout"].split("\n")
        pid, shm, nosys = first[0].split()
        assert (shm, nosys) == ("-1", "True"), "System V IPC is not available to the code"
        assert first[1].startswith("pid 1 closed"), first
        # The next run: the same sandbox (its pid namespace went on), nothing of the last run.
        for _ in range(50):
            second = (await run(client, LOOK))["stdout"].split("\n")
            if int(second[0]) > int(pid):
                break
            await asyncio.sleep(0.1)  # the recycle is still under way: a pooled one served
        else:
            pytest.fail("no run was served by the recycled sandbox")
        assert second[1:5] == ["[] [] []", "None False", "[]", ""], second


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_run_stopped_at_its_limit_is_recycled_with_nothing_of_it_left(runtime):
    """A run the limit stopped, whose runner answered the interrupt, is recycled like any other:
    the recycle kills what it left running and empties what it wrote. The stopped run first has
    a shell start 100 subshells, so a run in its sandbox has a pid past the last of them, which no
    new sandbox (nor a few recycles of one) reaches: a small shell forks in a fraction of the time
    the runner does under gVisor, so the interrupt comes in the sleeping loop, well after (the
    limit is the server's, SANDBOX_TIMEOUT: run_python_ephemeral takes no timeout_seconds)."""
    async with connect(SANDBOX_RUNTIME=runtime, SANDBOX_POOL_SIZE="1", SANDBOX_TIMEOUT="15s") as client:
        push = (
            "import subprocess\n"
            "shell = \"i=0; while [ $i -lt 100 ]; do (:); i=$((i+1)); done; sh -c 'echo $$'\"\n"
            "print(subprocess.run(['sh', '-c', shell], capture_output=True, text=True, check=True).stdout.strip())\n"
        )
        code = push + LEAVE + "import time\nwhile True:\n    time.sleep(0.01)\n"
        stopped = await client.call_tool("run_python_ephemeral", {"code": code})
        first = stopped.structured_content
        assert first["timed_out"] is True and first["stdout"].count("\n") == 3, text_of(stopped)
        last_child = int(first["stdout"].split()[0])
        for _ in range(50):
            second = (await run(client, LOOK))["stdout"].split("\n")
            if int(second[0]) > last_child:
                break
            await asyncio.sleep(0.1)  # the recycle is still under way: a pooled one served
        else:
            pytest.fail("no run was served by the stopped run's sandbox, recycled")
        assert second[1:5] == ["[] [] []", "None False", "[]", ""], second
