"""Cells as IPython runs them, through the official MCP client and the real engine: magics and
shell escapes, the output cache and get_ipython(), display handles updated in the same and in a
later call, clear_output with and without wait, input(), IPython's tracebacks, exit codes,
matplotlib figures as its inline backend shows them, and a snapshot that leaves IPython's own names
out."""

import base64
import struct

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio


def outputs(result):
    return result.structured_content["outputs"]


def value(result):
    [shown] = [o for o in outputs(result) if o["output_type"] == "execute_result"]
    return shown["data"]["text/plain"], shown["execution_count"]


async def start(client, **args):
    result = await client.call_tool("sandbox_initialize", args)
    assert result.is_error is False, text_of(result)
    return result.structured_content["container_id"]


async def run(client, session, code):
    return await client.call_tool("run_python", {"container_id": session, "code": code})


async def ok(client, session, code):
    result = await run(client, session, code)
    assert result.is_error is False, (code, text_of(result))
    return result


async def test_the_output_cache_and_get_ipython_work_as_in_ipython():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        assert value(await ok(client, session, "x = 6\nx * 7")) == ("42", 1)
        assert value(await ok(client, session, "_ + 1")) == ("43", 2)
        assert value(await ok(client, session, "__")) == ("42", 3)
        assert value(await ok(client, session, "_1 + _2")) == ("85", 4)
        assert value(await ok(client, session, "Out[2], In[1]")) == ("(43, 'x = 6\\nx * 7')", 5)
        shell = await ok(client, session, "type(get_ipython()).__mro__[1].__name__")
        assert value(shell)[0] == "'InteractiveShell'"
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_magics_and_shell_escapes():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        timed = await ok(client, session, "%time y = sum(range(10))\nprint(y)")
        assert "Wall time:" in timed.structured_content["stdout"]
        timeit = await ok(client, session, "%timeit -n 5 -r 2 sum(range(10))")
        assert "2 runs, 5 loops each" in timeit.structured_content["stdout"]
        cell_time = await ok(client, session, "%%time\nprint(2)")
        assert cell_time.structured_content["stdout"].startswith("2\n")
        captured = await ok(client, session, "%%capture kept\nprint('hidden')")
        assert captured.structured_content["stdout"] == ""
        assert (await ok(client, session, "print(kept.stdout, end='')")).structured_content["stdout"] == "hidden\n"
        written = await ok(client, session, "%%writefile notes.txt\nline one\n")
        assert written.structured_content["stdout"] == "Writing notes.txt\n"
        assert value(await ok(client, session, "open('/workspace/notes.txt').read()"))[0] == "'line one\\n'"
        moved = await ok(client, session, "%cd /tmp\nimport os\nos.getcwd()")
        assert value(moved)[0] == "'/tmp'"
        await ok(client, session, "%cd /workspace")
        env = await ok(client, session, "%env CELL_SETTING=on\nread = %env CELL_SETTING\nread")
        assert value(env)[0] == "'on'"
        who = await ok(client, session, "%who")
        assert "kept" in who.structured_content["stdout"] and "In" not in who.structured_content["stdout"]
        helped = await ok(client, session, "len?")
        assert "Return the number of items in a container." in helped.structured_content["stdout"]
        source = await ok(client, session, "def twice(n):\n    return 2 * n\ntwice??")
        assert "return 2 * n" in source.structured_content["stdout"]
        escaped = await ok(client, session, "!echo out; echo err >&2; id -u")
        lines = escaped.structured_content["stdout"].splitlines()
        assert lines[0] == "out" and lines[1] != "0", "the sandbox's user, not root"
        assert escaped.structured_content["stderr"] == "err\n"
        assigned = await ok(client, session, "name = 'x'\nfound = !echo a-$name; echo b\nfound")
        assert value(assigned)[0] == "['a-x', 'b']"
        conda = await run(client, session, "%conda install numpy")
        assert conda.is_error is True
        assert conda.structured_content["error"]["type"] == "UsageError"
        assert "%pip install" in conda.structured_content["stderr"]
        await client.call_tool("sandbox_stop", {"container_id": session})


FIGURE = """
%matplotlib inline
import matplotlib, matplotlib.pyplot as plt
print(matplotlib.get_backend())
plt.plot([1, 2, 3])
plt.show()
fig, ax = plt.subplots()
ax.plot([3, 2, 1])
"""


async def test_matplotlib_inline_shows_figures_as_jupyter_does():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client, dependencies=["matplotlib"])
        result = await ok(client, session, FIGURE)
        # `%matplotlib inline` names the backend as IPython does (without it: the module's name,
        # tests/mcp/test_preload.py).
        assert outputs(result)[0]["text"] == "inline\n"
        images = [o for o in outputs(result) if "image/png" in o.get("data", {})]
        # plt.show()'s, and the figure still open at the end of the cell: matplotlib-inline's
        # displays, cropped to what is drawn (the figure is 640x480), with Jupyter's text.
        assert [o["data"]["text/plain"] for o in images] == ["<Figure size 640x480 with 1 Axes>"] * 2, outputs(result)
        width, height = struct.unpack(">II", base64.b64decode(images[0]["data"]["image/png"])[16:24])
        assert width < 640 and height < 480, (width, height)
        assert [b.type for b in result.content].count("image") == 2
        # Each is a figure of the result too (figures/figure-N.png).
        assert [f["figure"] for f in result.structured_content["files"]] == [True, True]
        # Nothing left open comes back in the next call.
        assert [o for o in outputs(await ok(client, session, "1")) if "image/png" in o.get("data", {})] == []
        # InlineBackend's configuration is matplotlib-inline's: SVG when asked for.
        svg = await ok(client, session, "%config InlineBackend.figure_formats = ['svg']\nplt.plot([1, 2])\nplt.show()")
        [shown] = [o for o in outputs(svg) if o["output_type"] == "display_data"]
        assert sorted(shown["data"]) == ["image/svg+xml", "text/plain"], shown
        # A backend that needs a screen is refused for the inline one.
        qt = await ok(client, session, "%matplotlib qt")
        assert "has no screen" in qt.structured_content["stderr"], text_of(qt)
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_display_handles_update_in_the_same_and_in_a_later_call():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        same = await ok(client, session, "h = display('v1', display_id=True)\nprint('between')\nh.update('v2')")
        shown = [o for o in outputs(same) if o["output_type"] == "display_data"]
        assert [o["data"]["text/plain"] for o in shown] == ["'v2'"], outputs(same)
        later = await ok(client, session, "h.update('v3')")
        [update] = outputs(later)
        assert update["output_type"] == "update_display_data"
        assert update["data"]["text/plain"] == "'v3'"
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_clear_output_with_and_without_wait():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        cleared = await ok(
            client, session, "from IPython.display import clear_output\nprint('old')\nclear_output()\nprint('new')"
        )
        assert [(o["output_type"], o.get("text")) for o in outputs(cleared)] == [("stream", "new\n")]
        assert "\x1b[2K" not in text_of(cleared) and "old" not in text_of(cleared)
        progress = await ok(
            client,
            session,
            "from IPython.display import clear_output\nfor i in range(500):\n    clear_output(wait=True)\n    print(f'step {i}')",
        )
        assert [o.get("text") for o in outputs(progress)] == ["step 499\n"]
        kept = await ok(client, session, "print('stays')\nclear_output(wait=True)")
        assert [o.get("text") for o in outputs(kept)] == ["stays\n"]
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_input_tracebacks_and_exit_codes():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        asked = await run(client, session, "input('name? ')")
        assert asked.is_error is True
        assert asked.structured_content["error"]["type"] == "StdinNotImplementedError"
        failed = await run(client, session, "def f():\n    return 1 / 0\nf()")
        assert failed.structured_content["exit_code"] == 1
        [error] = [o for o in outputs(failed) if o["output_type"] == "error"]
        text = "\n".join(error["traceback"])
        assert "Cell In[2], line 3" in text and "Cell In[2], line 2, in f()" in text, text
        assert "\x1b" not in text and "sandbox-runner" not in text
        # sys.exit is an error output, as ipykernel shows it, with IPython's advice on stderr;
        # exit() ends the execution quietly.
        exited = await run(client, session, "import sys\nsys.exit(3)")
        assert exited.is_error is True
        assert exited.structured_content["exit_code"] == 3
        assert exited.structured_content["error"]["type"] == "SystemExit"
        shown = [(o["output_type"], o.get("ename"), o.get("evalue"), o.get("traceback"), o.get("name")) for o in outputs(exited)]
        assert shown[0] == ("error", "SystemExit", "3", ["An exception has occurred, use %tb to see the full traceback.\n", "SystemExit: 3\n"], None), shown
        assert [o["name"] for o in outputs(exited)[1:]] == ["stderr"], shown
        assert "UserWarning: To exit: use 'exit', 'quit', or Ctrl-D." in outputs(exited)[1]["text"]
        quit = await run(client, session, "exit(4)")
        assert (quit.is_error, quit.structured_content["exit_code"], outputs(quit)) == (True, 4, [])
        ephemeral = await client.call_tool("run_python_ephemeral", {"code": "7"})
        assert value(ephemeral) == ("7", 1)
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_a_snapshot_keeps_the_sessions_variables_not_ipythons(tmp_path):
    async with connect(SANDBOX_FILES_DIR="", SANDBOX_SNAPSHOT_DIR=tmp_path / "snapshots", SANDBOX_POOL_SIZE="0") as client:
        session = await start(client)
        await ok(client, session, "kept = [1, 2]\nkept")
        await ok(client, session, "also = 3\nalso")
        taken = await client.call_tool("sandbox_snapshot", {"container_id": session})
        assert taken.is_error is False, text_of(taken)
        snap = taken.structured_content
        assert sorted(snap["saved"]) == ["also", "kept"], snap["saved"]
        await client.call_tool("sandbox_stop", {"container_id": session})
        restored = await client.call_tool("sandbox_initialize", {"snapshot_id": snap["snapshot_id"]})
        assert restored.is_error is False, text_of(restored)
        new = restored.structured_content["container_id"]
        assert sorted(restored.structured_content["restored"]["variables"]) == ["also", "kept"]
        assert value(await ok(client, new, "kept + [also], len(Out)")) == ("([1, 2, 3], 0)", 1)
        await client.call_tool("sandbox_stop", {"container_id": new})


async def test_stdout_stderr_and_displays_come_back_in_the_order_they_were_written():
    # nbformat's own test notebook's cell, as ipykernel gives it: three outputs in order.
    code = ("import sys\nprint('Bar!', file=sys.stderr); print('Combo breaker!'); print('Foo!', file=sys.stderr)\n"
            "print('before', flush=True)\ndisplay('shown')\nimport logging\nlogging.basicConfig(format='%(message)s')\n"
            "logging.getLogger('x').warning('logged')\nprint('end')")
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = await start(client)
        result = await ok(client, session, code)
        shown = [(o.get("name") or o["output_type"], o.get("text") or o["data"]["text/plain"]) for o in outputs(result)]
        assert shown == [
            ("stderr", "Bar!\n"), ("stdout", "Combo breaker!\n"), ("stderr", "Foo!\n"), ("stdout", "before\n"),
            ("display_data", "'shown'"), ("stderr", "logged\n"), ("stdout", "end\n"),
        ], shown
        await client.call_tool("sandbox_stop", {"container_id": session})
