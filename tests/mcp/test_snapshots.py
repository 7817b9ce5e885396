"""Sessions that outlive their sandbox (issue 17): snapshot, resume and fork, through the official
MCP Python SDK against the real engine. Every test keeps its snapshots in its own
SANDBOX_SNAPSHOT_DIR under pytest's tmp_path, so no test sees another's (or the user's) snapshots."""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import threading
import time
import uuid

import anyio
import pytest

from conftest import BIN, connect, sandboxes, server_params, text_of
from test_http import TOKEN, http_server, mcp_client

pytestmark = pytest.mark.anyio

SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{32}")
BLOB = bytes(range(256)) * 4  # every byte value, to catch any text conversion of a binary file


@pytest.fixture
def snapshot_dir(tmp_path):
    """This test's own snapshot directory (not created: the server makes it, as it would its
    default under ~/.local/state)."""
    return tmp_path / "snapshots"


async def call_ok(client, tool, args):
    result = await client.call_tool(tool, args)
    assert result.is_error is False, (tool, text_of(result))
    return result


async def start(client, **args):
    return (await call_ok(client, "sandbox_initialize", args)).structured_content["container_id"]


async def run(client, cid, code):
    """Runs `code` in session `cid`; returns its stdout (the call must succeed)."""
    result = await call_ok(client, "run_python", {"container_id": cid, "code": code})
    return result.structured_content["stdout"]


async def snapshot(client, cid, name=None):
    args = {"container_id": cid} if name is None else {"container_id": cid, "name": name}
    result = await call_ok(client, "sandbox_snapshot", args)
    snap = result.structured_content
    assert SNAPSHOT_ID.fullmatch(snap["snapshot_id"]), snap
    assert snap["snapshot_id"] in text_of(result)
    assert snap["container_id"] == cid
    return result


async def listed_ids(client):
    result = await call_ok(client, "sandbox_snapshots", {})
    return [s["snapshot_id"] for s in result.structured_content["snapshots"]]


async def live_sessions(client):
    return [s["container_id"] for s in (await call_ok(client, "sandbox_list", {})).structured_content["sessions"]]


def snap_files(directory, snapshot_id):
    """The stored files of one snapshot, wherever the owner's subdirectory is."""
    return sorted(pathlib.Path(directory).glob(f"**/{snapshot_id}.*"))


def unknown_snapshot_id():
    return "snap-" + uuid.uuid4().hex


async def wait_until(predicate, timeout, interval=0.2):
    """Polls an async predicate until it is true or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value or time.monotonic() >= deadline:
            return value
        await anyio.sleep(interval)


# --- The tools are offered with their schemas -------------------------------------------------


async def test_the_snapshot_tools_are_listed_with_their_required_arguments(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        for name, required in (
            ("sandbox_snapshot", {"container_id"}),
            ("sandbox_fork", {"container_id"}),
            ("sandbox_snapshots", set()),
            ("sandbox_snapshot_delete", {"snapshot_id"}),
        ):
            assert name in listed, sorted(listed)
            assert set(listed[name].input_schema.get("required", [])) == required, name
            assert listed[name].output_schema and listed[name].output_schema["type"] == "object", name
        initialize = listed["sandbox_initialize"].input_schema
        assert "snapshot_id" in initialize["properties"]
        assert "snapshot_id" not in initialize.get("required", [])


# --- 1. Round trip ----------------------------------------------------------------------------

ROUND_TRIP_STATE = """
import os
import numpy as np
d = {"a": 1, "nested": [1, 2, {"b": "c"}], "t": (1, 2), "s": {3}}
arr = np.arange(12, dtype=np.int64).reshape(3, 4)
big = np.full(300_000, 2.5)  # 2.4 MB: pickled out of band (a PickleBuffer), not inline
def f(n=3):
    return n * 2 + len(d)
class C:
    def __init__(self, v):
        self.v = v
    def double(self):
        return self.v * 2
c = C(21)
lam = lambda x: x + 1
os.makedirs("deep/er/dir", exist_ok=True)
with open("deep/er/dir/note.txt", "w") as out:
    out.write("nested file\\n")
with open("blob.bin", "wb") as out:
    out.write(bytes(range(256)) * 4)
fh = open("log.txt", "w")
fh.write("pending")
fh.flush()
print("ready")
"""

ROUND_TRIP_CHECK = """
import hashlib
import numpy
print(repr(d))
print(f(), isinstance(c, C), c.double(), lam(1))
print(int(arr.sum()), arr.shape, str(arr.dtype), type(arr) is numpy.ndarray)
print(float(big.sum()), big.shape)
print(np.__name__)
print(open("deep/er/dir/note.txt").read(), end="")
print(hashlib.sha256(open("blob.bin", "rb").read()).hexdigest())
print(open("log.txt").read())
print("fh" in globals())
"""


async def test_round_trip_of_variables_files_and_dependencies(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client, dependencies=["numpy"])
        assert await run(client, cid, ROUND_TRIP_STATE) == "ready\n"

        taken = await snapshot(client, cid, name="round-trip")
        snap = taken.structured_content
        sid = snap["snapshot_id"]
        assert snap["name"] == "round-trip"
        assert snap["size_bytes"] > 0
        assert snap["files"] >= 3 and snap["file_bytes"] >= len(BLOB) + len("nested file\n") + len("pending")
        assert {"d", "arr", "big", "f", "C", "c", "lam"} <= set(snap["saved"]), snap["saved"]
        assert snap["size_bytes"] > 2_400_000, snap
        # The open file is not saved, and says why (never silently dropped).
        reasons = {u["name"]: u["reason"] for u in snap["unsaved"]}
        assert "fh" in reasons and reasons["fh"].strip(), snap["unsaved"]
        assert "fh" not in snap["saved"]
        assert "fh" in text_of(taken) and reasons["fh"] in text_of(taken), text_of(taken)
        assert "np" in snap["modules"] or "numpy" in snap["modules"], snap["modules"]
        assert any(dep.lower().startswith("numpy") for dep in snap["dependencies"]), snap["dependencies"]

        await call_ok(client, "sandbox_stop", {"container_id": cid})
        assert await live_sessions(client) == []

        # No dependencies given: the snapshot's own set must be mounted.
        restored_result = await call_ok(client, "sandbox_initialize", {"snapshot_id": sid})
        started = restored_result.structured_content
        new = started["container_id"]
        assert new != cid
        assert started["image"] == snap["image"]
        restored = started["restored"]
        assert restored["snapshot_id"] == sid
        assert restored["failed"] == [], restored["failed"]
        assert {"d", "arr", "f", "C", "c", "lam"} <= set(restored["variables"]), restored["variables"]
        assert "fh" not in restored["variables"]
        assert (restored["files"], restored["file_bytes"]) == (snap["files"], snap["file_bytes"])
        assert any(dep.lower().startswith("numpy") for dep in restored["dependencies"]), restored

        out = await run(client, new, ROUND_TRIP_CHECK)
        expected_d = {"a": 1, "nested": [1, 2, {"b": "c"}], "t": (1, 2), "s": {3}}
        assert out.splitlines() == [
            repr(expected_d),
            f"{3 * 2 + len(expected_d)} True 42 2",
            "66 (3, 4) int64 True",
            "750000.0 (300000,)",
            "numpy",
            "nested file",
            hashlib.sha256(BLOB).hexdigest(),
            "pending",
            "False",
        ], out
        # The open handle is really gone (not a dangling name), as reported.
        missing = await client.call_tool("run_python", {"container_id": new, "code": "fh.write('x')"})
        assert missing.is_error is True and "NameError" in text_of(missing), text_of(missing)
        assert await live_sessions(client) == [new]


# --- 2. Fork then diverge ---------------------------------------------------------------------


async def test_a_fork_and_its_original_diverge_without_touching_each_other(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        original = await start(client)
        setup = (
            "x = 1\n"
            "items = [1]\n"
            "gen = (i for i in range(3))\n"
            "open('shared.txt', 'w').write('base')\n"
            "print('ready')\n"
        )
        assert await run(client, original, setup) == "ready\n"

        forked = (await call_ok(client, "sandbox_fork", {"container_id": original})).structured_content
        copy = forked["container_id"]
        assert copy != original and forked["forked_from"] == original
        assert {"x", "items"} <= set(forked["variables"]), forked
        assert forked["failed"] == [], forked["failed"]
        assert "gen" in {u["name"] for u in forked["unsaved"]}, forked["unsaved"]
        assert forked["files"] >= 1
        assert set(await live_sessions(client)) == {original, copy}

        # Each side changes the same names and files its own way.
        await run(client, original, "x = 2\nitems.append('original')\nopen('shared.txt', 'w').write('original')")
        await run(client, copy, "x = 3\nitems.append('copy')\nopen('shared.txt', 'w').write('copy')\nopen('only_copy.txt', 'w').write('c')")

        show = "import os\nprint(x, items, open('shared.txt').read(), os.path.exists('only_copy.txt'))"
        assert await run(client, original, show) == "2 [1, 'original'] original False\n"
        assert await run(client, copy, show) == "3 [1, 'copy'] copy True\n"
        # The original goes on serving, and keeps its unpicklable generator.
        assert await run(client, original, "print(list(gen))") == "[0, 1, 2]\n"
        assert set(await live_sessions(client)) == {original, copy}


# --- 3. Restore after the server is gone ------------------------------------------------------


async def test_a_new_server_lists_and_restores_a_snapshot_of_an_exited_one(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        await run(client, cid, "x = 'survives'\nopen('kept.txt', 'w').write('on disk')")
        sid = (await snapshot(client, cid, name="before-exit")).structured_content["snapshot_id"]
    # That server exited and removed its sandboxes (bounded: the engine may still be deleting).
    for _ in range(300):
        if cid not in sandboxes():
            break
        await anyio.sleep(0.2)
    assert cid not in sandboxes()

    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        listed = (await call_ok(client, "sandbox_snapshots", {})).structured_content
        [entry] = [s for s in listed["snapshots"] if s["snapshot_id"] == sid]
        assert entry["name"] == "before-exit" and entry["container_id"] == cid, entry
        assert entry["size_bytes"] > 0 and entry["age_seconds"] >= 0 and entry["created"], entry
        # The old session's id is unknown to this server, which says which snapshot resumes it.
        gone = await client.call_tool("run_python", {"container_id": cid, "code": "print(x)"})
        assert gone.is_error is True and sid in text_of(gone), text_of(gone)
        new = (await call_ok(client, "sandbox_initialize", {"snapshot_id": sid})).structured_content["container_id"]
        assert await run(client, new, "print(x, open('kept.txt').read())") == "survives on disk\n"


class RawServer:
    """The server binary on stdio spoken to with raw JSON-RPC, so that the test holds its process
    and can SIGKILL it. A watchdog kills it if the test hangs on a reply."""

    def __init__(self, **env):
        self.proc = subprocess.Popen(
            [os.path.abspath(BIN)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=server_params(**env).env,
        )
        self.watchdog = threading.Timer(300, self.proc.kill)
        self.watchdog.daemon = True
        self.watchdog.start()
        self.next_id = 1
        try:
            hello = self.request("initialize", {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}})
            assert hello["serverInfo"]["name"] == "python-code-sandbox-mcp"
            self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except BaseException:
            self.kill()
            raise

    def send(self, message):
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        wanted = self.next_id
        self.send({"jsonrpc": "2.0", "id": wanted, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            assert line, "the server closed its output"
            reply = json.loads(line)
            if reply.get("id") == wanted:  # notifications and server requests are skipped
                assert "result" in reply, reply
                return reply["result"]

    def tool(self, name, arguments):
        result = self.request("tools/call", {"name": name, "arguments": arguments})
        assert not result.get("isError"), result
        return result["structuredContent"]

    def kill(self):
        self.proc.kill()  # SIGKILL: no shutdown, its sandboxes stay on the engine
        self.proc.wait(timeout=30)
        self.watchdog.cancel()


async def test_a_snapshot_survives_a_killed_server_and_the_next_server_restores_it(snapshot_dir):
    server = RawServer(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0")
    try:
        cid = server.tool("sandbox_initialize", {})["container_id"]
        server.tool("run_python", {"container_id": cid, "code": "x = 'outlived a SIGKILL'\nopen('k.txt', 'w').write('k')"})
        sid = server.tool("sandbox_snapshot", {"container_id": cid})["snapshot_id"]
        assert SNAPSHOT_ID.fullmatch(sid)
    finally:
        server.kill()
    left = set(sandboxes())
    assert cid in left, "a killed server cannot have removed its session's sandbox"

    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        assert sid in await listed_ids(client)
        new = (await call_ok(client, "sandbox_initialize", {"snapshot_id": sid})).structured_content["container_id"]
        assert await run(client, new, "print(x, open('k.txt').read())") == "outlived a SIGKILL k\n"

        # The new server removes what the killed one left (in the background, bounded), before it
        # exits itself: the autouse fixture requires nothing left at the end.
        async def swept():
            return not (left & set(sandboxes()))

        assert await wait_until(swept, timeout=60), "the killed server's sandboxes were not removed"


# --- 4. Expiry then resume --------------------------------------------------------------------


async def test_an_expired_session_is_snapshotted_and_resumed(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_SESSION_IDLE_TIMEOUT="2s", SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        await run(client, cid, "x = 'paused, not lost'")

        # Calling run_python on the id would keep it alive: wait (bounded) on the listing instead.
        async def gone():
            return cid not in await live_sessions(client)

        assert await wait_until(gone, timeout=60), "the idle session did not expire"

        # The expiry error names the snapshot; the snapshot may still be being written right as
        # the session leaves the listing, so ask again a bounded number of times.
        async def expired_error():
            result = await client.call_tool("run_python", {"container_id": cid, "code": "print(x)"})
            assert result.is_error is True, text_of(result)
            return SNAPSHOT_ID.search(text_of(result)) and result

        failed = await wait_until(expired_error, timeout=30, interval=0.5)
        assert failed, "the expiry error names no snapshot to resume from"
        assert "expired" in text_of(failed), text_of(failed)
        sid = SNAPSHOT_ID.search(text_of(failed)).group(0)

        listed = (await call_ok(client, "sandbox_snapshots", {})).structured_content["snapshots"]
        [entry] = [s for s in listed if s["snapshot_id"] == sid]
        assert entry["container_id"] == cid, entry

        # The restored session has the same 2 s idle timeout: ask at once.
        new = (await call_ok(client, "sandbox_initialize", {"snapshot_id": sid})).structured_content["container_id"]
        assert await run(client, new, "print(x)") == "paused, not lost\n"


# --- 5. Another HTTP client cannot reach the snapshot -----------------------------------------


async def test_a_snapshot_belongs_to_the_shared_token_not_to_the_mcp_session(snapshot_dir):
    """With the one shared SANDBOX_HTTP_TOKEN (no principals), each MCP session is a client of its
    own for sandbox sessions, but a snapshot outlives the MCP session that made it: a later MCP
    session with the token lists and restores it. A server with another token is another owner,
    and gets the same "Unknown snapshot" as for an id that never existed."""
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_SNAPSHOT_DIR=str(snapshot_dir)) as server:
        async with mcp_client(server.url) as first:
            a = await start(first)
            await run(first, a, "secret = 'kept'")
            sid = (await snapshot(first, a, name="first's")).structured_content["snapshot_id"]
        # The first MCP session has ended (its sandbox session with it); its snapshot has not.
        async with mcp_client(server.url) as second, mcp_client(server.url) as third:
            assert await live_sessions(second) == []
            assert await listed_ids(second) == [sid]
            restored = await start(second, snapshot_id=sid)
            assert await run(second, restored, "print(secret)") == "kept\n"
            # Sandbox sessions stay each MCP session's own.
            assert restored not in await live_sessions(third)
            refused = await third.call_tool("run_python", {"container_id": restored, "code": "print(1)"})
            assert refused.is_error is True and "no session" in text_of(refused), text_of(refused)
            assert await listed_ids(third) == [sid]

    other_token = "another-token-" + "fedcba9876543210" * 2
    with http_server(SANDBOX_HTTP_TOKEN=other_token, SANDBOX_SNAPSHOT_DIR=str(snapshot_dir)) as server:
        async with mcp_client(server.url, token=other_token) as stranger:
            assert await listed_ids(stranger) == []

            def same_refusal(foreign, unknown, unknown_id):
                """A foreign id is refused exactly as an unknown one: nothing tells it exists."""
                assert foreign.is_error is True and unknown.is_error is True
                assert "Unknown snapshot" in text_of(foreign), text_of(foreign)
                assert text_of(foreign).replace(sid, "<id>") == text_of(unknown).replace(unknown_id, "<id>")

            other = unknown_snapshot_id()
            for tool in ("sandbox_initialize", "sandbox_snapshot_delete"):
                foreign = await stranger.call_tool(tool, {"snapshot_id": sid})
                unknown = await stranger.call_tool(tool, {"snapshot_id": other})
                same_refusal(foreign, unknown, other)
            assert await live_sessions(stranger) == []
            assert await listed_ids(stranger) == []
    assert len(snap_files(snapshot_dir, sid)) == 2

    # The first token's holders still have it, and can delete it.
    with http_server(SANDBOX_HTTP_TOKEN=TOKEN, SANDBOX_SNAPSHOT_DIR=str(snapshot_dir)) as server:
        async with mcp_client(server.url) as again:
            deleted = (await call_ok(again, "sandbox_snapshot_delete", {"snapshot_id": sid})).structured_content
            assert deleted == {"snapshot_id": sid, "deleted": True}
            assert sid not in await listed_ids(again)
            assert snap_files(snapshot_dir, sid) == []


# --- 6. A tampered snapshot is refused --------------------------------------------------------


async def test_a_tampered_or_truncated_snapshot_is_refused_and_nothing_is_left_running(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        await run(client, cid, "x = list(range(1000))\nopen('f.txt', 'w').write('f' * 4096)")
        flipped = (await snapshot(client, cid)).structured_content["snapshot_id"]
        truncated = (await snapshot(client, cid)).structured_content["snapshot_id"]
        await call_ok(client, "sandbox_stop", {"container_id": cid})

        for sid, damage in ((flipped, "flip"), (truncated, "truncate")):
            [blob] = [p for p in snap_files(snapshot_dir, sid) if p.suffix == ".snap"]
            data = bytearray(blob.read_bytes())
            assert len(data) > 16
            if damage == "flip":
                data[len(data) // 2] ^= 0xFF
            else:
                del data[len(data) // 2:]
            blob.write_bytes(bytes(data))

            refused = await client.call_tool("sandbox_initialize", {"snapshot_id": sid})
            assert refused.is_error is True, (damage, text_of(refused))
            assert "corrupted" in text_of(refused), (damage, text_of(refused))
            assert await live_sessions(client) == [], damage

            async def nothing_running():
                return sandboxes() == []

            assert await wait_until(nothing_running, timeout=60), f"a half-restored sandbox was left ({damage})"


# --- 7. Retention -----------------------------------------------------------------------------


async def test_retention_removes_the_oldest_beyond_the_maximum_count(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_SNAPSHOT_MAX_COUNT="2", SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        taken = []
        for n in range(3):
            await run(client, cid, f"x = {n}")
            taken.append((await snapshot(client, cid, name=f"n{n}")).structured_content["snapshot_id"])
            await anyio.sleep(0.05)  # distinct creation times (recorded in milliseconds)
        oldest, middle, newest = taken

        async def trimmed():
            return await listed_ids(client) == [newest, middle]

        assert await wait_until(trimmed, timeout=30), await listed_ids(client)
        listed = (await call_ok(client, "sandbox_snapshots", {})).structured_content
        assert listed["max_count"] == 2
        assert snap_files(snapshot_dir, oldest) == []
        assert snap_files(snapshot_dir, newest) and snap_files(snapshot_dir, middle)
        gone = await client.call_tool("sandbox_initialize", {"snapshot_id": oldest})
        assert gone.is_error is True and "Unknown snapshot" in text_of(gone), text_of(gone)
        # The newest is whole.
        new = await start(client, snapshot_id=newest)
        assert await run(client, new, "print(x)") == "2\n"


# --- 8. Bad input -----------------------------------------------------------------------------


async def test_unknown_and_malformed_ids_are_clear_errors(snapshot_dir, tmp_path):
    # Files a path-like id would name if it were joined to the snapshot directory.
    canaries = [tmp_path / f"canary{suffix}" for suffix in (".snap", ".json")]
    canaries += [tmp_path / f"abs-canary{suffix}" for suffix in (".snap", ".json")]
    for canary in canaries:
        canary.write_text("not yours")

    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        unknown = unknown_snapshot_id()
        for tool in ("sandbox_initialize", "sandbox_snapshot_delete"):
            result = await client.call_tool(tool, {"snapshot_id": unknown})
            assert result.is_error is True, tool
            assert "Unknown snapshot" in text_of(result), (tool, text_of(result))

        malformed = [
            "snap-xyz",
            "snap-" + "0" * 31,
            "snap-" + "g" * 32,
            "../../canary",
            str(tmp_path / "abs-canary"),
            unknown + "/../" + unknown,
            "a" * 500,
        ]
        for junk in malformed:
            for tool in ("sandbox_initialize", "sandbox_snapshot_delete"):
                result = await client.call_tool(tool, {"snapshot_id": junk})
                assert result.is_error is True, (tool, junk, text_of(result))
                text = text_of(result)
                assert "snapshot_id" in text or "Unknown snapshot" in text, (tool, junk, text)
        for canary in canaries:
            assert canary.read_text() == "not yours", f"{canary} was touched"
        assert await live_sessions(client) == []

        # Snapshots and forks of sessions that do not exist (never did, or stopped).
        stopped = await start(client)
        await call_ok(client, "sandbox_stop", {"container_id": stopped})
        for tool in ("sandbox_snapshot", "sandbox_fork"):
            for cid in ("f" * 64, stopped):
                result = await client.call_tool(tool, {"container_id": cid})
                assert result.is_error is True, (tool, cid)
                assert "no session" in text_of(result), (tool, text_of(result))
            junk = await client.call_tool(tool, {"container_id": "../../etc"})
            assert junk.is_error is True and "not a valid container_id" in text_of(junk), text_of(junk)
            missing = await client.call_tool(tool, {})
            assert missing.is_error is True and "missing field `container_id`" in text_of(missing), text_of(missing)
        assert await listed_ids(client) == []
        assert await live_sessions(client) == []


# --- 9. Limits, a full disk, an image no longer allowed, a lost session -------------------------


async def test_a_snapshot_over_the_size_limit_is_refused_and_the_session_goes_on(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_SNAPSHOT_MAX_SIZE="1m", SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        await run(client, cid, "x = 1\nopen('big.bin', 'wb').write(bytes(3 << 20))")
        refused = await client.call_tool("sandbox_snapshot", {"container_id": cid})
        assert refused.is_error is True, text_of(refused)
        assert "SANDBOX_SNAPSHOT_MAX_SIZE" in text_of(refused) or "limit" in text_of(refused), text_of(refused)
        assert await listed_ids(client) == []
        assert not list(pathlib.Path(snapshot_dir).glob("**/*.snap"))
        assert await run(client, cid, "print(x)") == "1\n"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a host whose disk is full once a snapshot is written to it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_is_a_clear_error_that_leaves_nothing_half_written(small_disk):
    snapshot_dir = small_disk / "snapshots"
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        await run(client, cid, "x = 2\nimport os\nopen('noise.bin', 'wb').write(os.urandom(4 << 20))")
        refused = await client.call_tool("sandbox_snapshot", {"container_id": cid})
        assert refused.is_error is True, text_of(refused)
        assert "No space left on device" in text_of(refused), text_of(refused)
        # Nothing half-written stays on the disk, and the session is unharmed.
        assert [p for p in snapshot_dir.rglob("*") if p.is_file()] == []
        assert await listed_ids(client) == []
        assert await run(client, cid, "print(x)") == "2\n"
        # Once there is room again (a smaller workspace), snapshots work.
        await run(client, cid, "os.remove('noise.bin')")
        sid = (await snapshot(client, cid)).structured_content["snapshot_id"]
        assert await listed_ids(client) == [sid]


async def test_a_snapshot_whose_image_is_no_longer_allowed_is_refused(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        cid = await start(client)
        sid = (await snapshot(client, cid)).structured_content["snapshot_id"]
        image = (await call_ok(client, "sandbox_snapshots", {})).structured_content["snapshots"][0]["image"]
    # The operator moved to another image (never started here: the refusal comes first).
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0",
                       SANDBOX_IMAGE="pcs-test-another-image:1") as client:
        refused = await client.call_tool("sandbox_initialize", {"snapshot_id": sid})
        assert refused.is_error is True, text_of(refused)
        assert "no longer allowed" in text_of(refused) and image in text_of(refused), text_of(refused)
        assert await live_sessions(client) == []
        assert sid in await listed_ids(client)


async def test_a_session_lost_from_outside_says_whether_a_snapshot_can_resume_it(snapshot_dir):
    async with connect(SANDBOX_SNAPSHOT_DIR=snapshot_dir, SANDBOX_POOL_SIZE="0") as client:
        saved, unsaved = await start(client), await start(client)
        await run(client, saved, "x = 'kept'")
        sid = (await snapshot(client, saved)).structured_content["snapshot_id"]
        for cid in (saved, unsaved):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=True)
        lost = await client.call_tool("run_python", {"container_id": saved, "code": "print(x)"})
        assert lost.is_error is True and sid in text_of(lost), text_of(lost)
        lost = await client.call_tool("run_python", {"container_id": unsaved, "code": "print(1)"})
        assert lost.is_error is True and "no snapshot" in text_of(lost), text_of(lost)
        # Later calls on the ended session still name it.
        again = await client.call_tool("run_python", {"container_id": saved, "code": "print(x)"})
        assert again.is_error is True and sid in text_of(again), text_of(again)
        new = await start(client, snapshot_id=sid)
        assert await run(client, new, "print(x)") == "kept\n"
