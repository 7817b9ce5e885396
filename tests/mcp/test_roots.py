"""MCP roots (SANDBOX_ROOTS): the client's directories mounted into its sandboxes at
/mnt/roots/<name>, through the official SDK's roots callback, against the real engine.

Each test makes its own directory tree under a home of its own (the server's HOME, so the
default SANDBOX_ROOTS_ALLOW) and lists roots from it; nothing outside that tree is touched. The
core cases (read-only reads, refused writes, links that lead outside, and a write through a
writable root owned by the server's user) run under runc and gVisor; the rest under runc.
"""

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile

import anyio
import pytest
from mcp import Client, StdioServerParameters, types

from conftest import BIN, server_params, text_of

# The roots capability is deprecated from revision 2026-07-28 (SEP-2577), which clients still
# send; the SDK says so on every use, and the refused URIs are sent as given.
pytestmark = [
    pytest.mark.filterwarnings("ignore:The roots capability is deprecated"),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
]

LEGACY = "legacy"
RUNTIMES = ["runc", "runsc"]
# The uid the writable-roots server runs as (a user of no account here, which is the point: the
# files it writes must be owned by it, not by the sandbox's usual uid 1000).
SERVER_UID = 4242


class Tree:
    """A home of the test's own, with project directories in it."""

    def __init__(self, owner=None):
        self.base = tempfile.mkdtemp(prefix="pcs-roots-")
        os.chmod(self.base, 0o755)
        self.home = os.path.join(self.base, "home")
        self.owner = owner
        self.mkdir("home")

    def path(self, rel):
        return os.path.join(self.base, rel)

    def mkdir(self, rel):
        path = self.path(rel)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o755)
        if self.owner is not None:
            os.chown(path, self.owner, self.owner)
        return path

    def write(self, rel, text):
        path = self.path(rel)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
        return path

    def env(self, mode, **extra):
        state = self.mkdir("home/.local/state")
        env = {
            "HOME": self.home,
            "SANDBOX_FILES_DIR": os.path.join(state, "files"),
            "SANDBOX_SNAPSHOT_DIR": os.path.join(state, "snapshots"),
            "SANDBOX_CACHE_DIR": os.path.join(self.home, ".cache", "pcs"),
        }
        if mode is not None:
            env["SANDBOX_ROOTS"] = mode
        env.update(extra)
        return env

    def remove(self):
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def tree():
    made = Tree()
    yield made
    made.remove()


def root(path, name=None):
    return types.Root(uri="file://" + path, name=name)


class Listing:
    """The client's roots: a list the test changes, handed out by the SDK's roots callback."""

    def __init__(self, *roots):
        self.roots = list(roots)
        self.asked = 0

    async def __call__(self, context):
        self.asked += 1
        return types.ListRootsResult(roots=self.roots)


@contextlib.asynccontextmanager
async def client_of(env, listing=None, mode=LEGACY, params=None):
    extra = {"mode": mode}
    if listing is not None:
        extra["list_roots_callback"] = listing
    async with Client(params or server_params(**env), read_timeout_seconds=180, **extra) as client:
        yield client


async def ephemeral(client, code):
    result = await client.call_tool("run_python_ephemeral", {"code": code})
    return result


async def first_listing(client, listing):
    """Starts a session once the server has the client's roots (it asks for them right after the
    client is initialized, and a call waits for that answer); returns its result."""
    return await client.call_tool("sandbox_initialize", {})


def refused_of(result):
    return (result.structured_content or {}).get("roots_refused", [])


@pytest.mark.anyio
async def test_roots_are_off_by_default(tree):
    project = tree.mkdir("home/proj")
    listing = Listing(root(project))
    async with client_of(tree.env(None), listing) as client:
        started = await first_listing(client, listing)
        assert started.structured_content["roots"] == []
        assert "root:" not in text_of(started)
        run = await ephemeral(client, "import os; print(os.path.exists('/mnt/roots'))")
        assert run.structured_content["stdout"] == "False\n"
        tools = await client.list_tools()
        assert all("/mnt/roots" not in (t.description or "") for t in tools.tools)
    # Off, the client is never asked.
    assert listing.asked == 0


READ_AND_ESCAPE = r"""
import errno, json, os
base = '/mnt/roots/proj'
out = {'data': open(base + '/data.csv').read()}
try:
    open(base + '/new.txt', 'w').write('x')
    out['write'] = 'written'
except OSError as e:
    out['write'] = e.errno
for link in ('absolute', 'relative'):
    try:
        out[link] = open(base + '/' + link).read()
    except OSError as e:
        out[link] = 'error %d' % e.errno
print(json.dumps(out))
"""


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_read_only_root_is_read_not_written_and_its_links_stay_inside(tree, runtime):
    project = tree.mkdir("home/proj")
    tree.write("home/proj/data.csv", "a,b\n1,2\n")
    secret = tree.write("home/secret.txt", "HOST-SECRET\n")
    # One link by the host's absolute path, one climbing out of the root.
    os.symlink(secret, os.path.join(project, "absolute"))
    os.symlink("../secret.txt", os.path.join(project, "relative"))
    listing = Listing(root(project))
    async with client_of(tree.env("ro", SANDBOX_RUNTIME=runtime), listing) as client:
        started = await first_listing(client, listing)
        roots = started.structured_content["roots"]
        assert roots == [{"name": "proj", "path": "/mnt/roots/proj", "host_path": os.path.realpath(project), "read_only": True}]
        assert f"root: /mnt/roots/proj = {os.path.realpath(project)} (read-only)" in text_of(started)
        session = started.structured_content["container_id"]
        for call in (
            client.call_tool("run_python", {"container_id": session, "code": READ_AND_ESCAPE}),
            ephemeral(client, READ_AND_ESCAPE),
        ):
            result = await call
            seen = json.loads(result.structured_content["stdout"])
            assert seen["data"] == "a,b\n1,2\n"
            # runc says EROFS; gVisor (its gofer refuses the open) EACCES.
            assert seen["write"] in (errno.EROFS, errno.EACCES), seen
            # Each link resolves in the sandbox's own file system, where neither leads anywhere.
            assert seen["absolute"] == "error %d" % errno.ENOENT, seen
            assert seen["relative"] == "error %d" % errno.ENOENT, seen
            assert "HOST-SECRET" not in json.dumps(result.structured_content)
        tools = await client.list_tools()
        described = {t.name: t.description for t in tools.tools}
        assert "/mnt/roots/<name>" in described["run_python_ephemeral"]
        assert "read-only" in described["sandbox_initialize"]
        assert "the roots the original mounts" in described["sandbox_fork"]
    assert not os.path.exists(os.path.join(project, "new.txt"))


def prepared_with(host_dir):
    """The sandboxes started for the pool that mount `host_dir` as a root (one handed out to a
    session keeps its label)."""
    ids = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", "label=io.python-code-sandbox.kind=pool"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    if not ids:
        return []
    # A sandbox removed meanwhile is missing from the answer, not an error of the test.
    inspected = subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True).stdout
    return [
        c["Id"] for c in json.loads(inspected or "[]")
        if any(m.get("Source") == host_dir and m.get("Destination", "").startswith("/mnt/roots/") for m in c.get("Mounts", []))
    ]


async def until(found, what, limit=180):
    """Polls `found` until it returns something (the limit only guards against a hang)."""
    with anyio.fail_after(limit):
        while not (seen := found()):
            await anyio.sleep(0.2)
    return seen


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_sandbox_is_prepared_with_the_listed_roots_and_serves_the_next_session(tree, runtime):
    first = tree.mkdir("home/first")
    tree.write("home/first/data.csv", "prepared\n")
    second = tree.mkdir("home/second")
    first_host, second_host = os.path.realpath(first), os.path.realpath(second)
    listing = Listing(root(first))
    async with client_of(tree.env("ro", SANDBOX_RUNTIME=runtime), listing) as client:
        # The listing is learned: a sandbox is prepared with exactly its roots, ahead of any call.
        [waiting] = await until(lambda: prepared_with(first_host), "a sandbox prepared with the root")
        started = await client.call_tool("sandbox_initialize", {})
        assert started.structured_content["container_id"] == waiting, text_of(started)
        assert [r["name"] for r in started.structured_content["roots"]] == ["first"]
        run = await client.call_tool(
            "run_python", {"container_id": waiting, "code": "import os; print(open('/mnt/roots/first/data.csv').read() + str(os.getuid()), end='')"}
        )
        # As read-only roots run under a server that is root: the sandbox's usual user.
        assert run.structured_content["stdout"] == "prepared\n1000", run
        # The next one is prepared; when the listing changes, the old roots' go and the new ones'
        # come.
        await until(lambda: [i for i in prepared_with(first_host) if i != waiting], "the next sandbox prepared")
        listing.roots = [root(second)]
        await client.send_roots_list_changed()
        await until(lambda: prepared_with(second_host), "a sandbox prepared with the new root")
        await until(lambda: prepared_with(first_host) == [waiting], "the old roots' sandbox removed")
        # The session keeps its own roots.
        run = await client.call_tool("run_python", {"container_id": waiting, "code": "import os; print(os.listdir('/mnt/roots'))"})
        assert run.structured_content["stdout"] == "['first']\n"


@pytest.mark.anyio
async def test_a_client_of_revision_2026_07_28_is_asked_within_each_call(tree):
    project = tree.mkdir("home/proj")
    tree.write("home/proj/data.csv", "x\n")
    listing = Listing(root(project, name="my project"))
    # The SDK's default: the newest revision, which takes no request outside a call.
    async with client_of(tree.env("ro"), listing, mode="auto") as client:
        run = await ephemeral(client, "print(open('/mnt/roots/my_project/data.csv').read(), end='')")
        assert run.structured_content["stdout"] == "x\n", run
        asked = listing.asked
        assert asked >= 1
        # The listing changes; the next call mounts the new one.
        other = tree.mkdir("home/other")
        tree.write("home/other/b.txt", "b\n")
        listing.roots = [root(other)]
        run = await ephemeral(client, "import os; print(sorted(os.listdir('/mnt/roots')))")
        assert run.structured_content["stdout"] == "['other']\n"
        assert listing.asked > asked


@pytest.mark.anyio
async def test_a_change_of_roots_reaches_new_sandboxes_and_marks_sessions_stale(tree):
    first = tree.mkdir("home/first")
    second = tree.mkdir("home/second")
    listing = Listing(root(first))
    async with client_of(tree.env("ro"), listing) as client:
        started = await first_listing(client, listing)
        session = started.structured_content["container_id"]
        assert [r["name"] for r in started.structured_content["roots"]] == ["first"]
        listing.roots = [root(second)]
        asked = listing.asked
        await client.send_roots_list_changed()
        # The server asks again in the background: new sandboxes see the new roots once it has.
        seen = None
        for _ in range(50):
            run = await ephemeral(client, "import os; print(sorted(os.listdir('/mnt/roots')))")
            seen = run.structured_content["stdout"]
            if seen == "['second']\n":
                break
            await anyio.sleep(0.2)
        assert seen == "['second']\n"
        assert listing.asked > asked
        # The session keeps the roots it started with, and says they are stale.
        result = await client.call_tool(
            "run_python", {"container_id": session, "code": "import os; print(sorted(os.listdir('/mnt/roots')))"}
        )
        assert result.structured_content["stdout"] == "['first']\n"
        assert result.structured_content["roots_stale"] is True
        assert "roots are stale" in text_of(result)
        exec_result = await client.call_tool("sandbox_exec", {"container_id": session, "command": "true"})
        assert exec_result.structured_content["roots_stale"] is True
        # A fork is a copy of the session: it mounts what its source mounts, stale as that is.
        forked = await client.call_tool("sandbox_fork", {"container_id": session})
        assert forked.is_error is False, text_of(forked)
        assert [r["name"] for r in forked.structured_content["roots"]] == ["first"]
        assert f"root: /mnt/roots/first = {os.path.realpath(first)} (read-only)" in text_of(forked)
        result = await client.call_tool(
            "run_python",
            {"container_id": forked.structured_content["container_id"], "code": "import os; print(sorted(os.listdir('/mnt/roots')))"},
        )
        assert result.structured_content["stdout"] == "['first']\n"
        assert result.structured_content["roots_stale"] is True
        # A session started now is not stale.
        fresh = await client.call_tool("sandbox_initialize", {})
        fresh_id = fresh.structured_content["container_id"]
        result = await client.call_tool("run_python", {"container_id": fresh_id, "code": "print(1)"})
        assert "roots_stale" not in result.structured_content
        assert "roots are stale" not in text_of(result)


@pytest.mark.anyio
async def test_what_a_user_would_not_mean_to_share_is_refused_once_with_its_reason(tree):
    good = tree.mkdir("home/good")
    tree.mkdir("home/.ssh")
    tree.mkdir("home/state/files")
    tree.mkdir("home/run")
    tree.write("home/file.txt", "x")
    outside = tree.mkdir("elsewhere")
    cases = [
        ("https://example.invalid/repo", "file://"),
        ("file://" + tree.path("home/missing"), "does not exist"),
        ("file://" + tree.path("home/file.txt"), "not a directory"),
        ("file:///", "whole file system"),
        ("file://" + tree.home, "home directory itself"),
        ("file://" + tree.base, "holds the home directory"),
        ("file://" + tree.path("home/.ssh"), "hidden directory"),
        ("file:///etc", "system directory"),
        ("file:///usr/lib", "system directory"),
        # The engine's socket as a rootless engine keeps it ($XDG_RUNTIME_DIR/docker.sock).
        ("file://" + tree.path("home/run"), "engine's socket"),
        ("file://" + tree.path("home/state"), "server's own state"),
        ("file://" + outside, "SANDBOX_ROOTS_ALLOW"),
    ]
    # As given (the SDK's own type would refuse the URI that is not file://).
    listing = Listing(root(good), *[types.Root.model_construct(uri=uri, name=None, meta=None) for uri, _ in cases])
    env = tree.env(
        "ro",
        XDG_RUNTIME_DIR=tree.path("home/run"),
        SANDBOX_FILES_DIR=tree.path("home/state/files"),
    )
    async with client_of(env, listing) as client:
        started = await first_listing(client, listing)
        assert [r["name"] for r in started.structured_content["roots"]] == ["good"]
        refused = {r["uri"]: r["reason"] for r in refused_of(started)}
        text = text_of(started)
        for uri, reason in cases:
            assert reason in refused.get(uri, ""), (uri, refused)
            assert f"root refused: {uri}: " in text
        # Shown once: the next result does not repeat them.
        run = await ephemeral(client, "import os; print(sorted(os.listdir('/mnt/roots')))")
        assert run.structured_content["stdout"] == "['good']\n"
        assert refused_of(run) == []
        assert "root refused" not in text_of(run)


@pytest.mark.anyio
async def test_a_client_without_roots_gets_sandboxes_without_them(tree):
    tree.mkdir("home/proj")
    async with client_of(tree.env("ro")) as client:
        started = await client.call_tool("sandbox_initialize", {})
        assert started.structured_content["roots"] == []
        run = await ephemeral(client, "import os; print(os.path.exists('/mnt/roots'))")
        assert run.structured_content["stdout"] == "False\n"


def test_writable_roots_are_refused_to_a_server_running_as_root(tree):
    assert os.geteuid() == 0, "the suite runs as root"
    env = dict(os.environ, **tree.env("rw"))
    done = subprocess.run([BIN], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "SANDBOX_ROOTS" in done.stderr and "root" in done.stderr, done.stderr


WRITE = r"""
import os
os.makedirs('/mnt/roots/proj/out', exist_ok=True)
with open('/mnt/roots/proj/out/result.txt', 'w') as f:
    f.write('from the sandbox\n')
print(os.getuid())
"""


@pytest.mark.anyio
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_write_to_a_writable_root_lands_on_the_host_owned_by_the_server_user(runtime):
    tree = Tree(owner=SERVER_UID)
    try:
        project = tree.mkdir("home/proj")
        os.chown(tree.base, SERVER_UID, SERVER_UID)
        docker_gid = os.stat("/var/run/docker.sock").st_gid
        env = dict(os.environ, **tree.env("rw", SANDBOX_RUNTIME=runtime))
        env.pop("PIP_CACHE_PATH", None)
        for path in (env["SANDBOX_FILES_DIR"], env["SANDBOX_SNAPSHOT_DIR"], env["SANDBOX_CACHE_DIR"]):
            os.makedirs(path, exist_ok=True)
        for top, dirs, files in os.walk(tree.home):
            for name in dirs + files:
                os.chown(os.path.join(top, name), SERVER_UID, SERVER_UID)
        env.setdefault("LOG_LEVEL", "warn")
        params = StdioServerParameters(
            command="setpriv",
            args=[f"--reuid={SERVER_UID}", f"--regid={SERVER_UID}", f"--groups={docker_gid}", os.path.abspath(BIN)],
            env=env,
        )
        listing = Listing(root(project))
        async with client_of(env, listing, params=params) as client:
            started = await first_listing(client, listing)
            assert len(started.structured_content["roots"]) == 1, text_of(started)
            [mounted] = started.structured_content["roots"]
            assert mounted["read_only"] is False
            assert "(read-write)" in text_of(started)
            run = await ephemeral(client, WRITE)
            assert run.structured_content["stdout"] == f"{SERVER_UID}\n", run
            written = os.path.join(project, "out", "result.txt")
            [listed] = [f for f in run.structured_content["files"] if f["path"] == "/mnt/roots/proj/out/result.txt"]
            assert listed["saved_to"] == os.path.realpath(written)
            assert "user's root" in (listed.get("note") or "")
            # In a session too.
            session = started.structured_content["container_id"]
            again = await client.call_tool(
                "run_python", {"container_id": session, "code": "open('/mnt/roots/proj/second.txt', 'w').write('2')"}
            )
            assert [f["path"] for f in again.structured_content["files"]] == ["/mnt/roots/proj/second.txt"]
        with open(written) as f:
            assert f.read() == "from the sandbox\n"
        for path in (written, os.path.dirname(written), os.path.join(project, "second.txt")):
            st = os.lstat(path)
            assert (st.st_uid, st.st_gid) == (SERVER_UID, SERVER_UID), path
            assert not stat.S_ISLNK(st.st_mode)
    finally:
        tree.remove()


@contextlib.asynccontextmanager
async def http_client_of(url, listing):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from test_http import TOKEN

    async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with Client(
            streamable_http_client(url, http_client=http), read_timeout_seconds=180, list_roots_callback=listing
        ) as client:
            yield client


@pytest.mark.anyio
async def test_over_http_roots_are_another_machines_paths_refused_unless_mapped(tree):
    from test_http import TOKEN, http_server

    project = tree.mkdir("home/src/proj")
    tree.write("home/src/proj/data.csv", "mapped\n")
    # The client's own paths: they exist on its machine, not necessarily here.
    listing = Listing(types.Root(uri="file:///client/src/proj"), types.Root(uri="file:///client/other"))
    env = tree.env("ro", SANDBOX_HTTP_TOKEN=TOKEN)
    with http_server(**env) as server:
        async with http_client_of(server.url, listing) as client:
            started = await client.call_tool("sandbox_initialize", {})
            assert started.structured_content["roots"] == []
            [refused] = refused_of(started)
            assert "SANDBOX_ROOTS_MAP" in refused["reason"], refused
            run = await ephemeral(client, "import os; print(os.path.exists('/mnt/roots'))")
            assert run.structured_content["stdout"] == "False\n"
        # Without a mapping the client is not even asked.
        assert listing.asked == 0
    with http_server(**env, SANDBOX_ROOTS_MAP="/client/src=" + tree.path("home/src")) as server:
        async with http_client_of(server.url, listing) as client:
            started = await client.call_tool("sandbox_initialize", {})
            assert started.structured_content["roots"] == [
                {"name": "proj", "path": "/mnt/roots/proj", "host_path": os.path.realpath(project), "read_only": True}
            ]
            refused = {r["uri"]: r["reason"] for r in refused_of(started)}
            assert "SANDBOX_ROOTS_MAP" in refused["file:///client/other"], refused
            run = await ephemeral(client, "print(open('/mnt/roots/proj/data.csv').read(), end='')")
            assert run.structured_content["stdout"] == "mapped\n"
        assert any("roots: /mnt/roots/proj = " in line for line in server.log), "".join(server.log)
