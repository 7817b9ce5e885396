"""Results sized for a model (SANDBOX_MODEL_OUTPUT): whatever the code prints, the text and
structured content a model reads stay within a small multiple of the budget, the cut part is one
line saying how much was cut and where the whole output is, and the whole output is kept: saved
with the run's files on the host and, in a session, in /workspace/.outputs/."""

import json
import os

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

BUDGET = 20_000  # the default
CAPTURE = 8 << 20  # SANDBOX_MAX_OUTPUT for these tests: more than the budget, less than printed

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
        assert result_size(result) <= 3 * BUDGET, result_size(result)
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
        # The saved file holds every byte captured, as captured.
        with open(cut["saved_to"], "rb") as saved:
            whole = saved.read()
        assert len(whole) == cut["whole_bytes"]
        assert CAPTURE - 1000 <= len(whole) <= CAPTURE
        assert whole.startswith(b"000000 " + b"x" * 992 + b"\n000001 ")
        lines = whole.split(b"\n")
        assert all(l == b"%06d %s" % (n, b"x" * 992) for n, l in enumerate(lines[:-2])), "lines in order"
        assert cut["cut_lines"] >= len(lines) - 40


async def test_a_session_can_read_its_whole_output_in_the_workspace(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path)) as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        code = "import sys\nfor i in range(3000):\n    print(f'out {i:05d}')\nprint('boom ' * 5000, file=sys.stderr)\n"
        result = await client.call_tool("run_python", {"container_id": cid, "code": code})
        assert result.is_error is False, text_of(result)[:2000]
        assert result_size(result) <= 3 * BUDGET
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
