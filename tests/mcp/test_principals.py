"""Principals of `serve --http` (SANDBOX_HTTP_TOKENS_FILE): each caller is told apart by its
own token, owns what it creates whichever MCP session (or none, in revision 2026-07-28) it comes
through, and has its own quotas. Driven by the official Python SDK over streamable HTTP against
the real binary on a loopback port; every request goes to 127.0.0.1."""

import os
import re
import signal
import subprocess

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import BIN, sandboxes, text_of
from test_http import http_server, mcp_client, post

pytestmark = pytest.mark.anyio


def new_principal(name, *options):
    """A token and its tokens-file line, made by the binary's own `token` command."""
    out = subprocess.run([os.path.abspath(BIN), "token", name, *options], capture_output=True, text=True, check=True)
    fields = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert fields["token"] not in fields["line"], "the file must hold only the token's hash"
    return fields["token"], fields["line"]


@pytest.fixture
def team(tmp_path):
    """A tokens file with alice (one session at most, one execution at once), bob, and root (admin)."""
    alice, alice_line = new_principal("alice", "--sessions", "1", "--executions", "1")
    bob, bob_line = new_principal("bob")
    root, root_line = new_principal("root", "--admin")
    path = tmp_path / "tokens"
    path.write_text(f"# the team\n{alice_line}\n{bob_line}\n{root_line}\n")
    return {"alice": alice, "bob": bob, "root": root, "file": path}


def served(team, **env):
    return http_server(SANDBOX_HTTP_TOKENS_FILE=team["file"], **env)


async def session_ids(client):
    listed = await client.call_tool("sandbox_list", {})
    return sorted(s["container_id"] for s in listed.structured_content["sessions"])


async def test_each_principal_sees_only_its_own_and_a_quota_stops_only_its_owner(team):
    with served(team) as server:
        async with mcp_client(server.url, token=team["alice"]) as alice, mcp_client(server.url, token=team["bob"]) as bob:
            a = (await alice.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            await alice.call_tool("run_python", {"container_id": a, "code": "secret = 'alice'"})
            # Alice is at her quota of one session: refused, saying which quota and how it frees.
            over = await alice.call_tool("sandbox_initialize", {})
            assert over.is_error, text_of(over)
            assert "Over quota" in text_of(over) and "live sandbox sessions" in text_of(over), text_of(over)
            assert "sandbox_stop" in text_of(over)
            # Bob is not: his sessions are his, and he cannot reach hers.
            b = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            assert await bob.call_tool("sandbox_list", {}) and await session_ids(bob) == [b]
            assert await session_ids(alice) == [a]
            stolen = await bob.call_tool("run_python", {"container_id": a, "code": "print(secret)"})
            assert stolen.is_error and "alice" not in text_of(stolen), text_of(stolen)
            assert {a, b} <= set(sandboxes())
        # The admin sees every principal's sessions.
        async with mcp_client(server.url, token=team["root"]) as root:
            assert await session_ids(root) == sorted([a, b])
        # Alice's session outlives her MCP session: a new one reaches it, state and all.
        async with mcp_client(server.url, token=team["alice"]) as alice:
            assert await session_ids(alice) == [a]
            again = await alice.call_tool("run_python", {"container_id": a, "code": "print(secret)"})
            assert again.structured_content["stdout"] == "alice\n", text_of(again)
            await alice.call_tool("sandbox_stop", {"container_id": a})
            assert not (await alice.call_tool("sandbox_initialize", {})).is_error


async def test_saved_files_go_to_a_directory_per_principal(team, tmp_path):
    files = tmp_path / "files"
    with served(team, SANDBOX_FILES_DIR=files) as server:
        for name in ("alice", "bob"):
            async with mcp_client(server.url, token=team[name]) as client:
                result = await client.call_tool("run_python_ephemeral", {"code": f"open('out.txt', 'w').write('{name}')"})
                [saved] = [f["saved_to"] for f in result.structured_content["files"] if f["path"] == "out.txt"]
                assert saved.startswith(str(files / f"principal-{name}") + "/"), saved
                with open(saved) as f:
                    assert f.read() == name


async def test_snapshots_belong_to_their_principal_and_outlive_the_server(team, tmp_path):
    snapshots = tmp_path / "snapshots"
    with served(team, SANDBOX_SNAPSHOT_DIR=snapshots) as server:
        async with mcp_client(server.url, token=team["alice"]) as alice, mcp_client(server.url, token=team["bob"]) as bob:
            cid = (await alice.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            await alice.call_tool("run_python", {"container_id": cid, "code": "kept = 7"})
            made = await alice.call_tool("sandbox_snapshot", {"container_id": cid, "name": "mine"})
            assert not made.is_error, text_of(made)
            snap = made.structured_content["snapshot_id"]
            assert (await bob.call_tool("sandbox_snapshots", {})).structured_content["snapshots"] == []
            taken = await bob.call_tool("sandbox_initialize", {"snapshot_id": snap})
            assert taken.is_error, text_of(taken)
    # A new server: alice's snapshot is still hers, restored with its state.
    with served(team, SANDBOX_SNAPSHOT_DIR=snapshots) as server:
        async with mcp_client(server.url, token=team["alice"]) as alice:
            listed = (await alice.call_tool("sandbox_snapshots", {})).structured_content["snapshots"]
            assert [s["snapshot_id"] for s in listed] == [snap]
            restored = await alice.call_tool("sandbox_initialize", {"snapshot_id": snap})
            cid = restored.structured_content["container_id"]
            seen = await alice.call_tool("run_python", {"container_id": cid, "code": "print(kept)"})
            assert seen.structured_content["stdout"] == "7\n", text_of(seen)


async def test_a_new_mcp_session_of_a_principal_restores_its_snapshot_and_no_other_principal_can(team, tmp_path):
    snapshots = tmp_path / "snapshots"
    with served(team, SANDBOX_SNAPSHOT_DIR=snapshots) as server:
        async with mcp_client(server.url, token=team["bob"]) as bob:
            cid = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
            await bob.call_tool("run_python", {"container_id": cid, "code": "kept = 'bob'"})
            made = await bob.call_tool("sandbox_snapshot", {"container_id": cid})
            assert not made.is_error, text_of(made)
            snap = made.structured_content["snapshot_id"]
            await bob.call_tool("sandbox_stop", {"container_id": cid})
        # Bob's first MCP session has ended; a new one lists and restores his snapshot.
        async with mcp_client(server.url, token=team["bob"]) as bob:
            listed = (await bob.call_tool("sandbox_snapshots", {})).structured_content["snapshots"]
            assert [s["snapshot_id"] for s in listed] == [snap]
            restored = await bob.call_tool("sandbox_initialize", {"snapshot_id": snap})
            assert not restored.is_error, text_of(restored)
            cid = restored.structured_content["container_id"]
            seen = await bob.call_tool("run_python", {"container_id": cid, "code": "print(kept)"})
            assert seen.structured_content["stdout"] == "bob\n", text_of(seen)
            await bob.call_tool("sandbox_stop", {"container_id": cid})
        # Alice, in any MCP session, neither sees nor restores nor deletes it.
        async with mcp_client(server.url, token=team["alice"]) as alice:
            assert (await alice.call_tool("sandbox_snapshots", {})).structured_content["snapshots"] == []
            for tool in ("sandbox_initialize", "sandbox_snapshot_delete"):
                taken = await alice.call_tool(tool, {"snapshot_id": snap})
                assert taken.is_error and "Unknown snapshot" in text_of(taken), (tool, text_of(taken))
            assert (await alice.call_tool("sandbox_list", {})).structured_content["sessions"] == []
        async with mcp_client(server.url, token=team["bob"]) as bob:
            listed = (await bob.call_tool("sandbox_snapshots", {})).structured_content["snapshots"]
            assert [s["snapshot_id"] for s in listed] == [snap]


async def test_a_2026_07_28_client_keeps_a_session_across_calls(team):
    with served(team) as server:
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {team['bob']}"}) as http:
            async with Client(streamable_http_client(server.url, http_client=http), mode="2026-07-28", read_timeout_seconds=180) as client:
                assert client.protocol_version == "2026-07-28"
                cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
                await client.call_tool("run_python", {"container_id": cid, "code": "x = 41"})
                result = await client.call_tool("run_python", {"container_id": cid, "code": "print(x + 1)"})
                assert result.structured_content["stdout"] == "42\n", text_of(result)
        # The session belongs to bob, not to a request: a 2025-11-25 client of his sees it.
        async with mcp_client(server.url, token=team["bob"]) as bob:
            assert await session_ids(bob) == [cid]


async def test_an_mcp_session_serves_only_the_principal_that_opened_it(team):
    with served(team) as server:
        opened = post(server.url, token=team["alice"])
        assert opened.status_code == 200, opened.text
        sid = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        other = post(server.url, listing, token=team["bob"], **{"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"})
        assert other.status_code == 404, other.text
        nobody = post(server.url, listing, token="x" * 64, **{"mcp-session-id": sid})
        assert nobody.status_code == 401
        assert nobody.headers["www-authenticate"].startswith("Bearer")


async def test_an_execution_quota_is_per_principal_and_frees_when_the_call_returns(team):
    with served(team) as server:
        async with mcp_client(server.url, token=team["alice"]) as alice, mcp_client(server.url, token=team["bob"]) as bob:
            results = []
            first_result = anyio.Event()

            async def long_call():
                results.append(await alice.call_tool("run_python_ephemeral", {"code": "import time\ntime.sleep(60)"}))
                first_result.set()

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tasks:
                    # Two at once with a quota of one: one runs, the other is refused at once.
                    tasks.start_soon(long_call)
                    tasks.start_soon(long_call)
                    await first_result.wait()
                    [refused] = results
                    assert refused.is_error and "executions running" in text_of(refused), text_of(refused)
                    # Bob runs code meanwhile.
                    theirs = await bob.call_tool("run_python_ephemeral", {"code": "print('bob')"})
                    assert theirs.structured_content["stdout"] == "bob\n", text_of(theirs)
                    # Cancelling the long call (the client sends notifications/cancelled) frees it.
                    tasks.cancel_scope.cancel()
                while True:
                    after = await alice.call_tool("run_python_ephemeral", {"code": "print(2)"})
                    if not after.is_error:
                        break
                    assert "executions running" in text_of(after), text_of(after)
                    await anyio.sleep(0.1)
            assert after.structured_content["stdout"] == "2\n", text_of(after)


async def test_cpu_seconds_per_day_are_charged_and_refused_past_the_quota(team):
    with served(team, SANDBOX_QUOTA_CPU_SECONDS="1", SANDBOX_CPU_LIMIT="1") as server:
        async with mcp_client(server.url, token=team["bob"]) as bob, mcp_client(server.url, token=team["root"]) as root:
            burn = await bob.call_tool("run_python_ephemeral", {"code": "import time\ntime.sleep(1.2)"})
            assert not burn.is_error, text_of(burn)
            over = await bob.call_tool("run_python_ephemeral", {"code": "print(1)"})
            assert over.is_error, text_of(over)
            assert "CPU-seconds" in text_of(over) and "00:00 UTC" in text_of(over), text_of(over)
            fine = await root.call_tool("run_python_ephemeral", {"code": "print(1)"})
            assert fine.structured_content["stdout"] == "1\n", text_of(fine)


async def test_the_tokens_file_is_reloaded_on_sighup_and_a_broken_one_keeps_the_principals(team):
    carol, carol_line = new_principal("carol")
    with served(team) as server:
        assert post(server.url, token=carol).status_code == 401
        team["file"].write_text(team["file"].read_text() + carol_line + "\n")
        server.proc.send_signal(signal.SIGHUP)
        with anyio.fail_after(30):
            while not any("SIGHUP: reloaded" in line for line in server.log):
                await anyio.sleep(0.05)
        async with mcp_client(server.url, token=carol) as client:
            result = await client.call_tool("run_python_ephemeral", {"code": "print('carol')"})
            assert result.structured_content["stdout"] == "carol\n"
            # A file that no longer parses is not applied: everyone keeps working, the log says why.
            team["file"].write_text("carol not-a-hash\n")
            server.proc.send_signal(signal.SIGHUP)
            with anyio.fail_after(30):
                while not any("not reloaded" in line for line in server.log):
                    await anyio.sleep(0.05)
            still = await client.call_tool("run_python_ephemeral", {"code": "print('still')"})
            assert still.structured_content["stdout"] == "still\n"
        assert post(server.url, token=team["alice"]).status_code == 200


def test_a_bad_tokens_file_stops_the_start_with_the_line(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice secret-token-in-clear\n")
    proc = subprocess.run(
        [os.path.abspath(BIN), "serve", "--http", "127.0.0.1:0"],
        env={**os.environ, "SANDBOX_HTTP_TOKENS_FILE": str(path)}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "line 1" in proc.stderr and "never the token itself" in proc.stderr, proc.stderr
    both = subprocess.run(
        [os.path.abspath(BIN), "serve", "--http", "127.0.0.1:0"],
        env={**os.environ, "SANDBOX_HTTP_TOKENS_FILE": str(path), "SANDBOX_HTTP_TOKEN": "t" * 32},
        capture_output=True, text=True, timeout=60,
    )
    assert both.returncode != 0 and "not both" in both.stderr, both.stderr


SPIN_REDUCE = """
class Spin:
    def __reduce__(self):
        while True:
            pass

x = 41
"""
STUBBORN_REDUCE = """
class Stubborn:
    def __reduce__(self):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass

stubborn = Stubborn()
"""


async def test_a_snapshot_is_an_execution_stopped_at_the_timeout_and_charged(team):
    """Issue 33, item 8: a snapshot runs the session's own code (a __reduce__): the call's timeout
    stops it as it stops an execution, its time is charged, and a spent quota refuses snapshots,
    forks and restores."""
    with served(team, SANDBOX_TIMEOUT="5s", SANDBOX_QUOTA_CPU_SECONDS="4", SANDBOX_CPU_LIMIT="1") as server:
        async with mcp_client(server.url, token=team["bob"]) as bob:
            with anyio.fail_after(180):
                sid = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
                ran = await bob.call_tool("run_python", {"container_id": sid, "code": SPIN_REDUCE})
                assert not ran.is_error, text_of(ran)
                saved = await bob.call_tool("sandbox_snapshot", {"container_id": sid})
                assert not saved.is_error, text_of(saved)
                snapshot_id = saved.structured_content["snapshot_id"]
                await bob.call_tool("run_python", {"container_id": sid, "code": "s = Spin()"})
                stopped = await bob.call_tool("sandbox_snapshot", {"container_id": sid})
                text = text_of(stopped)
                assert stopped.is_error, text
                assert "timeout of 5s" in text and "SANDBOX_TIMEOUT" in text and "__reduce__" in text, text
                assert "keeps its variables" in text, text
                # Its 5 s were charged: the quota of 4 CPU-seconds is spent, and refuses what runs code.
                for tool, args in [
                    ("run_python", {"container_id": sid, "code": "print(x)"}),
                    ("sandbox_snapshot", {"container_id": sid}),
                    ("sandbox_fork", {"container_id": sid}),
                    ("sandbox_initialize", {"snapshot_id": snapshot_id}),
                ]:
                    over = await bob.call_tool(tool, args)
                    assert over.is_error and "Over quota" in text_of(over), (tool, text_of(over))
                    assert "CPU-seconds" in text_of(over), (tool, text_of(over))


async def test_a_snapshot_whose_code_ignores_the_interrupt_loses_the_variables_not_the_server(team):
    with served(team, SANDBOX_TIMEOUT="3s") as server:
        async with mcp_client(server.url, token=team["bob"]) as bob:
            with anyio.fail_after(180):
                sid = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
                await bob.call_tool("run_python", {"container_id": sid, "code": "x = 41\n" + SPIN_REDUCE + "s = Spin()"})
                # Interrupted in time: the session keeps its variables.
                stopped = await bob.call_tool("sandbox_snapshot", {"container_id": sid})
                assert stopped.is_error and "keeps its variables" in text_of(stopped), text_of(stopped)
                kept = await bob.call_tool("run_python", {"container_id": sid, "code": "del s\nprint(x + 1)"})
                assert kept.structured_content["stdout"] == "42\n", text_of(kept)
                # Code that swallows the interrupt: its processes are killed, as an execution's are.
                await bob.call_tool("sandbox_write_file", {"container_id": sid, "path": "kept.txt", "content": "yes"})
                await bob.call_tool("run_python", {"container_id": sid, "code": STUBBORN_REDUCE})
                killed = await bob.call_tool("sandbox_snapshot", {"container_id": sid})
                text = text_of(killed)
                assert killed.is_error and "did not stop on interrupt" in text and "variables are lost" in text, text
                after = await bob.call_tool("run_python", {"container_id": sid, "code": "print('x' in dir(), open('kept.txt').read())"})
                assert after.structured_content["stdout"] == "False yes\n", text_of(after)
                # The session snapshots again.
                again = await bob.call_tool("sandbox_snapshot", {"container_id": sid})
                assert not again.is_error, text_of(again)


BACKGROUND_SPIN = """
import threading, time

def spin():
    while time.thread_time() < 5.0:
        pass
    open("/workspace/done", "w").close()

threading.Thread(target=spin, daemon=True).start()
print("started")
"""


async def test_cpu_a_thread_uses_after_its_call_returned_is_charged(team):
    """Issue 33, item 8: a thread that goes on after run_python returned burns CPU between calls;
    the engine measures the container's CPU time (its cgroup's) and the principal pays for it."""
    with served(team, SANDBOX_QUOTA_CPU_SECONDS="3", SANDBOX_CPU_LIMIT="1", LOG_LEVEL="debug",
                SANDBOX_SESSION_IDLE_TIMEOUT="40s") as server:
        async with mcp_client(server.url, token=team["bob"]) as bob:
            with anyio.fail_after(180):
                sid = (await bob.call_tool("sandbox_initialize", {})).structured_content["container_id"]
                started = await bob.call_tool("run_python", {"container_id": sid, "code": BACKGROUND_SPIN})
                assert started.structured_content["stdout"] == "started\n", text_of(started)
                # Wait for the thread through the file tools, which run no code and charge nothing.
                while "done" not in text_of(await bob.call_tool("sandbox_list_files", {"container_id": sid})):
                    await anyio.sleep(0.2)
                # The end of a call measures the session's CPU in the background, as soon as the
                # call lets go of the session (and the reaper does, periodically): the thread had
                # finished, so any measurement after this call sees all of its CPU.
                ran = await bob.call_tool("run_python", {"container_id": sid, "code": "print(1)"})
                assert not ran.is_error, text_of(ran)
                measured = len([line for line in server.log if "session CPU measured" in line])
                while len([line for line in server.log if "session CPU measured" in line]) <= measured:
                    await anyio.sleep(0.1)
                # Two short calls charged well under 1 CPU-second; with the thread's 5 the quota
                # of 3 is spent.
                over = await bob.call_tool("run_python", {"container_id": sid, "code": "print(2)"})
                assert over.is_error and "Over quota" in text_of(over), text_of(over)
                used = int(text_of(over).split("has used ")[1].split(" ")[0])
                assert used >= 3, text_of(over)
