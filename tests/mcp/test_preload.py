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
        # What was imported ahead is out of the code's sight until it imports it.
        code = "import sys\nprint('six' in sys.modules, 'six' in globals())\nimport six\nprint(six.__name__)"
        # The first call may come before the set is prepared (or installed): ask until one is.
        for _ in range(120):
            run = await client.call_tool(
                "run_python_ephemeral", {"code": code, "dependencies": ["six==1.16.0"]}
            )
            assert not run.is_error, run.content
            assert run.structured_content["stdout"] == "False False\nsix\n", run.content
            if run.structured_content["dependencies"]["prepared"]:
                assert "prepared ahead" in run.content[0].text, run.content
                break
            await asyncio.sleep(1)
        else:
            pytest.fail("no call was served by a prepared sandbox")


# What the code finds of matplotlib: whether pyplot was imported ahead (a prepared sandbox), then,
# after its own import, what a cold import leaves: the inline backend named but not yet loaded,
# no figure, and the first figure numbered 1 and shown inline at the end.
MATPLOTLIB_STATE = """
import hashlib, sys
def names():
    listed = sorted(sys.modules)
    return len(listed), hashlib.sha256(' '.join(listed).encode()).hexdigest()[:16]
before = names()
import matplotlib
between = names()
import matplotlib.pyplot as plt
print(matplotlib.get_backend(), plt.get_fignums(), 'matplotlib_inline.backend_inline' in sys.modules)
print(plt.figure().number)
print(before, between, names())
"""


async def prepared_and_cold(code):
    """`code` with dependency matplotlib, run by a prepared sandbox and by a cold one."""
    seen = {}
    async with connect(SANDBOX_PRELOAD="matplotlib", SANDBOX_POOL_SIZE="1") as client:
        for _ in range(120):
            run = await client.call_tool("run_python_ephemeral", {"code": code, "dependencies": ["matplotlib"]})
            assert not run.is_error, run.content
            if run.structured_content["dependencies"]["prepared"]:
                seen["prepared"] = run
                break
            await asyncio.sleep(1)
        else:
            pytest.fail("no call was served by a prepared sandbox")
    async with connect(SANDBOX_POOL_SIZE="0") as client:
        seen["cold"] = await client.call_tool("run_python_ephemeral", {"code": code, "dependencies": ["matplotlib"]})
    return seen


async def test_a_prepared_sandbox_looks_to_the_code_as_a_cold_one_does():
    seen = await prepared_and_cold(MATPLOTLIB_STATE)
    state = {kind: run.structured_content["stdout"].split("\n") for kind, run in seen.items()}
    assert state["prepared"][:2] == state["cold"][:2] == ["module://matplotlib_inline.backend_inline [] False", "1"], state
    # sys.modules before the code's imports, after `import matplotlib`, after pyplot's: a cold
    # sandbox's, module for module (their counts and a digest of their names).
    assert state["prepared"][2] == state["cold"][2], state
    for run in seen.values():
        shown = [o for o in run.structured_content["outputs"] if o["output_type"] == "display_data"]
        assert [o["data"]["text/plain"] for o in shown] == ["<Figure size 640x480 with 0 Axes>"], shown


# What the code may do before importing what a prepared sandbox imported ahead (found by an
# independent review): a module of its own that shadows a standard one, a module run by runpy,
# settings matplotlib reads at its import (MPLBACKEND, a matplotlibrc in the working directory),
# a submodule attribute it replaced, and a module it blocked with None in sys.modules.
BEFORE_THE_IMPORT = """
import importlib, os, runpy, sys
open('calendar.py', 'w').write('WHO = "mine"\\n')
importlib.invalidate_caches()
import calendar
print('calendar:', getattr(calendar, 'WHO', 'the standard one'))
print('timeit:', 'ran' if runpy.run_module('timeit', run_name='not_main') else '')
import numpy as np
np.linalg = 'replaced'
os.environ['MPLBACKEND'] = 'agg'
open('matplotlibrc', 'w').write('lines.linewidth: 7\\n')
import matplotlib
print('backend:', matplotlib.get_backend(), matplotlib.rcParams['lines.linewidth'], np.linalg)
sys.modules['PIL'] = None
import csv, gc
print('imports after a block: ok')
"""


async def test_what_the_code_does_before_its_import_counts_as_in_a_cold_sandbox():
    seen = await prepared_and_cold(BEFORE_THE_IMPORT)
    for kind, run in seen.items():
        assert not run.is_error, (kind, run.content)
        assert run.structured_content["stdout"].splitlines() == [
            "calendar: mine",
            "timeit: ran",
            "backend: agg 7.0 replaced",
            "imports after a block: ok",
        ], (kind, run.structured_content)
