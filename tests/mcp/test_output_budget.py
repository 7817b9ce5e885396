"""Results sized for a model (SANDBOX_MODEL_OUTPUT): whatever the code prints, the text and
structured content a model reads stay within a small multiple of the budget (a stream's text is
there three times: in the text block, in `stdout`/`stderr` and in `outputs`; displays and values
share twice the budget, in a text block and in `outputs`), the cut part is one
line saying how much was cut and where the whole output is, and the whole output is kept: saved
with the run's files on the host and, in a session, in /workspace/.outputs/."""

import json
import os

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

BUDGET = 20_000  # the default
CAPTURE = 8 << 20  # SANDBOX_MAX_OUTPUT for these tests: more than the budget, less than printed

# Three copies of the streams' budget, and room for the JSON around them.
STREAMS_BOUND = 3 * BUDGET + BUDGET // 2
# The streams' copies, and two of the displays' share (twice the budget).
DISPLAYS_BOUND = STREAMS_BOUND + 4 * BUDGET + BUDGET // 2

# About 50 MB: 50 000 numbered lines of 1 000 characters.
FIFTY_MB = "line = 'x' * 992\nfor i in range(50_000):\n    print(f'{i:06d}', line)\n"


def result_size(result):
    """What a client hands a model: every text block and the structured content, serialized."""
    blocks = sum(len(block.text) for block in result.content if block.type == "text")
    return blocks + len(json.dumps(result.structured_content))


def cut_lines(text):
    return [line for line in text.splitlines() if line.startswith("[… ") and " cut here; " in line]


async def test_fifty_megabytes_of_output_come_back_within_the_budget_and_are_saved(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path), SANDBOX_MAX_OUTPUT="8m", SANDBOX_TIMEOUT="300") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": FIFTY_MB})
        assert result.is_error is False, text_of(result)[:2000]
        assert result_size(result) <= STREAMS_BOUND, result_size(result)
        text = text_of(result)
        structured = result.structured_content
        assert structured["truncated"] is True  # the capture itself stopped at SANDBOX_MAX_OUTPUT
        cut = structured["stdout_cut"]
        [line] = cut_lines(text)
        assert cut["saved_to"] and cut["saved_to"] in line, line
        assert cut["workspace_path"] is None  # the sandbox is gone: the host keeps the only copy
        # Head and tail are whole lines of what the code printed; the structured stdout is the text's.
        assert structured["stdout"] in text
        assert structured["stdout"].startswith("000000 xxx")
        assert structured["stdout"].rstrip("\n").endswith("xxx")
        # The saved file holds every byte captured, as captured: the first and the last lines
        # written, and between them the line saying how much the capture did not keep.
        with open(cut["saved_to"], "rb") as saved:
            whole = saved.read()
        assert len(whole) == cut["whole_bytes"]
        assert whole.startswith(b"000000 " + b"x" * 992 + b"\n000001 ")
        lines = whole.split(b"\n")
        [marker] = [n for n, l in enumerate(lines) if l.startswith("[… ".encode())]
        dropped = structured["stdout_dropped_bytes"]
        assert lines[marker] == (
            f"[… {dropped} bytes ({dropped // 1000} lines) of stdout not kept here: "
            "over the 8 MiB output limit (SANDBOX_MAX_OUTPUT) …]"
        ).encode()
        assert CAPTURE - 2000 <= len(whole) - len(lines[marker]) - 1 <= CAPTURE
        assert all(l == b"%06d %s" % (n, b"x" * 992) for n, l in enumerate(lines[:marker])), "head in order"
        first = 50_000 - (len(lines) - 1 - marker - 1)
        assert all(l == b"%06d %s" % (n, b"x" * 992) for n, l in enumerate(lines[marker + 1 : -1], first)), "tail in order"
        assert (marker + dropped // 1000 + len(lines) - 1 - marker - 1) == 50_000
        assert "cut here; within them %d bytes" % dropped in line, line
        assert cut["cut_lines"] >= len(lines) - 40


async def test_a_session_can_read_its_whole_output_in_the_workspace(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path)) as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        code = "import sys\nfor i in range(3000):\n    print(f'out {i:05d}')\nprint('boom ' * 5000, file=sys.stderr)\n"
        result = await client.call_tool("run_python", {"container_id": cid, "code": code})
        assert result.is_error is False, text_of(result)[:2000]
        assert result_size(result) <= STREAMS_BOUND
        structured = result.structured_content
        expected = "".join(f"out {i:05d}\n" for i in range(3000))
        assert len(cut_lines(text_of(result))) == 2  # one for each stream
        cut = structured["stdout_cut"]
        assert cut["workspace_path"] == "/workspace/.outputs/stdout.txt"
        assert cut["resource_uri"] == f"sandbox://{cid}/.outputs/stdout.txt"
        assert "/workspace/.outputs/stdout.txt" in text_of(result)
        read = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": cut["workspace_path"]})
        assert read.is_error is False, text_of(read)
        [resource] = [block.resource for block in read.content if block.type == "resource"]
        assert resource.text == expected
        err = structured["stderr_cut"]["workspace_path"]
        # The code can search it too; writing it was no change of the code's, so it is not listed.
        grep = await client.call_tool("run_python", {"container_id": cid, "code": f"print(open({err!r}).read().count('boom'))"})
        assert grep.structured_content["stdout"] == "5000\n"
        assert grep.structured_content["files"] == []
        with open(cut["saved_to"]) as saved:
            assert saved.read() == expected
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_without_a_files_directory_the_cut_line_says_nothing_was_saved():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "print('y' * 100_000)"})
        [line] = cut_lines(text_of(result))
        assert "was not kept; not saved on the host (SANDBOX_FILES_DIR is empty)" in line, line
        assert result.structured_content["stdout_cut"]["saved_to"] is None
        assert "SANDBOX_FILES_DIR is empty" in result.structured_content["stdout_cut"]["note"]


async def test_output_within_the_budget_is_unchanged():
    async with connect(SANDBOX_MODEL_OUTPUT="1000") as client:
        code = "import sys\nprint('a' * 500)\nprint('b' * 400, file=sys.stderr)\n"
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        structured = result.structured_content
        assert structured["stdout"] == "a" * 500 + "\n"
        assert structured["stderr"] == "b" * 400 + "\n"
        assert structured["stdout_cut"] is None and structured["stderr_cut"] is None
        assert cut_lines(text_of(result)) == []
        # One more character over the budget, and the longer stream is cut.
        longer = await client.call_tool("run_python_ephemeral", {"code": code.replace("500", "700")})
        assert longer.structured_content["stdout_cut"]["cut_chars"] > 0
        assert longer.structured_content["stderr_cut"] is None


# Each display is large in both its plain and its HTML form; there are more than fit.
MANY_LARGE_DISPLAYS = """
class Big:
    def __init__(self, n):
        self.n = n
    def _repr_html_(self):
        return '<p>' + 'h' * 20_000 + '</p>'
    def __repr__(self):
        return f'big {self.n} ' + 'r' * 50_000
for i in range(10):
    display(Big(i))
print('printed ' * 10_000)
Big('last')
"""


async def test_displays_and_values_beyond_the_budget_stay_within_a_small_multiple():
    async with connect() as client:
        result = await client.call_tool("run_python_ephemeral", {"code": MANY_LARGE_DISPLAYS})
        assert result.is_error is False, text_of(result)[:2000]
        assert result_size(result) <= DISPLAYS_BOUND, result_size(result)
        outputs = result.structured_content["outputs"]
        kinds = [o["output_type"] for o in outputs]
        assert kinds == ["display_data"] * 10 + ["stream", "execute_result"], kinds
        first = outputs[0]["data"]
        assert first["text/html"].startswith("<p>hhh"), "the first HTML fits whole"
        assert first["text/plain"].startswith("big 0 rrr")
        assert "characters (1 line) of this value cut …]" in first["text/plain"]
        # Later ones are left out whole (never cut into broken HTML), and their text says so.
        last = outputs[-1]["data"]
        assert "text/html" not in last
        assert "[text/html of 20007 characters left out: over this result's budget" in last["text/plain"]
        assert outputs[-1]["execution_count"] == 1
        # The stream among them is cut like the stdout field, with the same line.
        assert outputs[10]["text"] == result.structured_content["stdout"]
        assert "cut here; the whole stdout" in outputs[10]["text"]
