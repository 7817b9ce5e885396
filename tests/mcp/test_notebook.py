"""Notebook-grade execution through the official MCP client: the last expression's value,
display(), outputs in order (nbformat v4), misbehaving objects, and input()."""

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio


def outputs(result):
    return result.structured_content["outputs"]


def kinds(result):
    return [o["output_type"] + (":" + o["name"] if o["output_type"] == "stream" else "") for o in outputs(result)]


async def run(client, code, session=None):
    if session is None:
        return await client.call_tool("run_python_ephemeral", {"code": code})
    return await client.call_tool("run_python", {"container_id": session, "code": code})


async def test_the_last_value_is_shown_unless_none_or_after_a_semicolon():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await run(client, "x = 5\nx * 2")
        assert result.is_error is False, text_of(result)
        [value] = outputs(result)
        assert value["output_type"] == "execute_result"
        assert value["data"]["text/plain"] == "10"
        assert "Out[" in text_of(result) and "]: 10" in text_of(result)
        assert result.structured_content["stdout"] == ""
        for quiet in ["x = 5\nx;", "x = 5\nx ;  # a comment", "None", "print('hi')"]:
            result = await run(client, quiet)
            assert [o["output_type"] for o in outputs(result)] in ([], ["stream"]), quiet


async def test_underscore_holds_the_last_value_in_a_session_and_tracebacks_name_user_lines():
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        first = await run(client, "21", session)
        assert outputs(first)[0]["data"]["text/plain"] == "21"
        second = await run(client, "_ * 2", session)
        [value] = outputs(second)
        assert value["data"]["text/plain"] == "42"
        assert value["execution_count"] > outputs(first)[0]["execution_count"]
        failing = await run(client, "a = 1\nb = 2\n1 / 0", session)
        assert failing.structured_content["exit_code"] == 1
        [error] = outputs(failing)
        assert error["output_type"] == "error" and error["ename"] == "ZeroDivisionError"
        assert any("line 3" in line for line in error["traceback"]), error["traceback"]
        assert "line 3" in failing.structured_content["stderr"]
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_prints_and_displays_come_back_in_order():
    code = (
        "import sys\n"
        "print('one')\n"
        "print('two')\n"
        "display('shown')\n"
        "print('warn', file=sys.stderr)\n"
        "display({'k': 1})\n"
        "print('three')\n"
        "'last'"
    )
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await run(client, code)
        # Between two outputs the order of stdout against stderr is not recorded: one of each.
        assert kinds(result) == ["stream:stdout", "display_data", "stream:stderr", "display_data", "stream:stdout", "execute_result"]
        out = outputs(result)
        assert out[0]["text"] == "one\ntwo\n"
        assert out[1]["data"]["text/plain"] == "'shown'"
        assert out[2]["text"] == "warn\n" and out[4]["text"] == "three\n"
        assert result.structured_content["stdout"] == "one\ntwo\nthree\n"
        texts = [b.text for b in result.content if b.type == "text"][1:]
        assert texts == ["--- stdout ---\none\ntwo\n", "'shown'", "--- stderr ---\nwarn\n", "{'k': 1}", "--- stdout ---\nthree\n", "Out[%d]: 'last'" % out[5]["execution_count"]]


RICH = '''
class Html:
    def _repr_html_(self): return "<b>bold</b>"
class Md:
    def _repr_markdown_(self): return "# Title"
class Tex:
    def _repr_latex_(self): return r"$x^2$"
class Js:
    def _repr_json_(self): return {"a": [1, 2]}
display(Html(), Md(), Tex())
Js()
'''


async def test_html_markdown_latex_and_json_come_as_resources_with_a_text_rendering():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await run(client, RICH)
        assert result.is_error is False, text_of(result)
        out = outputs(result)
        assert [o["output_type"] for o in out] == ["display_data"] * 3 + ["execute_result"]
        assert out[0]["data"]["text/html"] == "<b>bold</b>"
        assert out[1]["data"]["text/markdown"] == "# Title"
        assert out[2]["data"]["text/latex"] == "$x^2$"
        assert out[3]["data"]["application/json"] == {"a": [1, 2]}
        assert all("text/plain" in o["data"] for o in out)
        resources = [b.resource for b in result.content if b.type == "resource"]
        assert [r.mime_type for r in resources] == ["text/html", "text/markdown", "text/latex", "application/json"]
        assert resources[0].text == "<b>bold</b>"
        assert all(str(r.uri).startswith("sandbox-output://") for r in resources)
        text = text_of(result)
        assert "# Title" in text and "$x^2$" in text and '"a"' in text


async def test_misbehaving_reprs_do_not_break_the_session():
    code_raising = "class Bad:\n    def __repr__(self): raise ValueError('boom')\n    def _repr_html_(self): return 42\nBad()"
    code_huge = "class Huge:\n    def __repr__(self): return 'x' * 5_000_000\nHuge()"
    async with connect(SANDBOX_FILES_DIR="") as client:
        session = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        raising = await run(client, code_raising, session)
        assert raising.is_error is False, text_of(raising)
        # As Jupyter shows it (IPython's formatters): the repr's traceback, the formatter's warning
        # about the HTML of the wrong type, no value; the call itself did not fail.
        shown = outputs(raising)
        errors = [o for o in shown if o["output_type"] == "error"]
        assert [(e["ename"], e["evalue"]) for e in errors] == [("ValueError", "boom")], shown
        assert not [o for o in shown if o["output_type"] in ("execute_result", "display_data")], shown
        assert any("FormatterWarning" in o.get("text", "") for o in shown), shown
        huge = await run(client, code_huge, session)
        [value] = outputs(huge)
        # The runner keeps 100 000 characters; the result keeps head and tail of half the budget.
        plain = value["data"]["text/plain"]
        assert len(plain) < 10_000 + 300 and plain.startswith("xxx"), len(plain)
        assert "of this value cut …]" in plain and "more characters" in plain
        after = await run(client, "1 + 1", session)
        assert outputs(after)[0]["data"]["text/plain"] == "2"
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_a_repr_that_never_returns_meets_the_timeout_and_the_session_goes_on():
    code = "class Endless:\n    def __repr__(self):\n        while True:\n            pass\nx = 41\nEndless()"
    async with connect(SANDBOX_FILES_DIR="", SANDBOX_TIMEOUT="3s") as client:
        session = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        endless = await run(client, code, session)
        assert endless.is_error is True
        assert endless.structured_content["timed_out"] is True, text_of(endless)
        # Interrupted like the code itself: the session keeps its state.
        assert endless.structured_content["state_lost"] is False
        after = await run(client, "x + 1", session)
        assert outputs(after)[0]["data"]["text/plain"] == "42", text_of(after)
        await client.call_tool("sandbox_stop", {"container_id": session})


async def test_input_fails_at_once_with_a_clear_error():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await run(client, "name = input('your name? ')")
        assert result.is_error is True
        assert result.structured_content["error"]["type"] == "StdinNotImplementedError"
        # ipykernel's words, as nbclient's kernel says them.
        assert result.structured_content["error"]["message"] == "raw_input was called, but this frontend does not support input requests."


FIGURES = """
import matplotlib
import matplotlib.pyplot as plt
print('before')
plt.plot([1, 2, 3])
plt.show()
print('between')
fig, ax = plt.subplots()
ax.plot([3, 2, 1])
fig
"""


async def test_a_figure_shown_and_a_figure_as_last_value_are_images_in_order():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": FIGURES, "dependencies": ["matplotlib"]})
        assert result.is_error is False, text_of(result)
        # As Jupyter's inline backend shows them: the figure returned as the value is shown again
        # at the end of the cell (it is still open then).
        assert kinds(result) == ["stream:stdout", "display_data", "stream:stdout", "execute_result", "display_data"]
        out = outputs(result)
        assert out[1]["data"]["image/png"] and out[3]["data"]["image/png"]
        assert out[4]["data"]["image/png"] == out[3]["data"]["image/png"]
        images = [b for b in result.content if b.type == "image"]
        assert len(images) == 3, "each display, in order among the text"
        assert [b.type for b in result.content] == ["text", "text", "image", "text", "text", "image", "image"]
        # Each figure shown is a figure of the result.
        assert [f["figure"] for f in result.structured_content["files"]] == [True, True, True]


LIBRARIES = """
import pandas as pd
from PIL import Image
from IPython.display import display, HTML, Markdown
display(HTML('<i>from IPython</i>'), Markdown('**bold**'))
display(Image.new('RGB', (4, 4), 'red'))
pd.DataFrame({'n': range(1000), 'sq': [i * i for i in range(1000)]})
"""


async def test_pandas_pil_and_ipython_display_render_through_the_protocol():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": LIBRARIES, "dependencies": ["pandas", "pillow", "ipython"]})
        assert result.is_error is False, text_of(result)
        out = outputs(result)
        assert [o["output_type"] for o in out] == ["display_data"] * 3 + ["execute_result"]
        assert out[0]["data"]["text/html"] == "<i>from IPython</i>"
        assert out[1]["data"]["text/markdown"] == "**bold**"
        assert "image/png" in out[2]["data"]
        table = out[3]["data"]["text/plain"]
        # Head and tail, the shape stated, a bounded size.
        assert "[1000 rows x 2 columns]" in table and "999" in table and len(table.splitlines()) < 30
        assert "<table" in out[3]["data"]["text/html"]
        blocks = [b.type for b in result.content]
        assert blocks.count("image") == 1 and blocks.count("resource") == 3
