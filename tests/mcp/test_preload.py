"""Dependency sets ahead of the code, through the official MCP SDK: a session started with
dependencies, and a server with SANDBOX_PRELOAD serving its set from a prepared sandbox."""

import asyncio

import pytest

from conftest import connect, sandboxes

pytestmark = pytest.mark.anyio


async def test_a_session_starts_with_its_dependencies():
    async with connect() as client:
        started = await client.call_tool("sandbox_initialize", {"dependencies": ["six==1.16.0"]})
        assert not started.is_error, started.content
        cid = started.structured_content["container_id"]
        run = await client.call_tool(
            "run_python", {"container_id": cid, "code": "import six\nprint(six.__version__)"}
        )
        assert run.structured_content["stdout"] == "1.16.0\n", run.content
        refused = await client.call_tool("sandbox_initialize", {"dependencies": ["--index-url=http://x"]})
        assert refused.is_error
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_a_preloaded_set_is_served_from_a_prepared_sandbox():
    async with connect(SANDBOX_PRELOAD="six==1.16.0", SANDBOX_POOL_SIZE="1") as client:
        code = "import sys\nprint('six' in sys.modules, 'six' in globals())"
        # The first call may come before the set is prepared (or installed): ask until one is.
        for _ in range(120):
            run = await client.call_tool(
                "run_python_ephemeral", {"code": code, "dependencies": ["six==1.16.0"]}
            )
            assert not run.is_error, run.content
            if run.structured_content["stdout"] == "True False\n":
                break
            await asyncio.sleep(1)
        else:
            pytest.fail("no call was served by a prepared sandbox")


# What the code finds of matplotlib: whether pyplot was imported ahead (a prepared sandbox), then,
# after its own import, what a cold import leaves: the inline backend named but not yet loaded,
# no figure, and the first figure numbered 1 and shown inline at the end.
MATPLOTLIB_STATE = """
import sys
ahead = 'matplotlib.pyplot' in sys.modules
import matplotlib, matplotlib.pyplot as plt
print(ahead)
print(matplotlib.get_backend(), plt.get_fignums(), 'matplotlib_inline.backend_inline' in sys.modules)
print(plt.figure().number)
"""


async def test_a_prepared_sandbox_looks_to_the_code_as_a_cold_one_does():
    seen = {}
    async with connect(SANDBOX_PRELOAD="matplotlib", SANDBOX_POOL_SIZE="1") as client:
        for _ in range(120):
            run = await client.call_tool("run_python_ephemeral", {"code": MATPLOTLIB_STATE, "dependencies": ["matplotlib"]})
            assert not run.is_error, run.content
            if run.structured_content["stdout"].startswith("True\n"):
                seen["prepared"] = run
                break
            await asyncio.sleep(1)
        else:
            pytest.fail("no call was served by a prepared sandbox")
    async with connect(SANDBOX_POOL_SIZE="0") as client:
        seen["cold"] = await client.call_tool("run_python_ephemeral", {"code": MATPLOTLIB_STATE, "dependencies": ["matplotlib"]})
    state = {kind: run.structured_content["stdout"].split("\n", 1)[1] for kind, run in seen.items()}
    assert state["prepared"] == state["cold"] == "module://matplotlib_inline.backend_inline [] False\n1\n", state
    for run in seen.values():
        shown = [o for o in run.structured_content["outputs"] if o["output_type"] == "display_data"]
        assert [o["data"]["text/plain"] for o in shown] == ["<Figure size 640x480 with 0 Axes>"], shown
