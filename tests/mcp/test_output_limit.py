"""Output over the capture's limit (SANDBOX_MAX_OUTPUT): each stream over its share keeps its
first and its last lines, and one line where the rest was says exactly how many bytes (and lines)
were not kept; the result says it again in its text and in `stdout_dropped_bytes` and friends,
the model's own cut (SANDBOX_MODEL_OUTPUT) composes with it, and displays keep their order around
the cut."""

import re
import sys

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

MARKER = re.compile(
    r"\[… (\d+) bytes? \((\d+) lines?\) of (stdout|stderr) not kept here: "
    r"over the ([0-9.]+ [KMG]iB|\d+ bytes) output limit \(SANDBOX_MAX_OUTPUT\) …\]\n"
)

TWO_MILLION = "for i in range(2_000_000):\n    print(i)\nprint('FINAL RESULT 42')\n"
TWO_MILLION_WHOLE = "".join(f"{i}\n" for i in range(2_000_000)) + "FINAL RESULT 42\n"


def split_kept(kept, stream):
    """A stream as kept: its head, the marker's numbers, its tail (the marker there once)."""
    markers = list(MARKER.finditer(kept))
    assert len(markers) == 1, kept[:300]
    marker = markers[0]
    assert marker.group(3) == stream
    return kept[: marker.start()], (int(marker.group(1)), int(marker.group(2)), marker.group(4)), kept[marker.end() :]


def check_against(whole, head, numbers, tail):
    """Head and tail are the first and last whole lines written; the marker counts exactly what
    lies between. Returns the bytes and lines dropped."""
    assert whole.startswith(head) and whole.endswith(tail)
    dropped = whole[len(head) : len(whole) - len(tail)]
    assert head.endswith("\n") and dropped.endswith("\n"), "cut at line boundaries"
    counted = (len(dropped.encode()), dropped.count("\n"))
    assert numbers[:2] == counted, (numbers, counted)
    return counted


def model_lines(text):
    """The lines of a stream as the model reads it, without the bracketed lines."""
    return [line for line in text.splitlines() if not line.startswith("[… ")]


def numbered_in_order(lines):
    """Every line a number (or the final one), consecutive within head and within tail."""
    numbers = [int(line) for line in lines if line != "FINAL RESULT 42"]
    breaks = sum(1 for a, b in zip(numbers, numbers[1:]) if b != a + 1)
    return numbers, breaks


async def test_two_million_lines_keep_the_first_and_the_last_and_say_what_was_not_kept(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path), SANDBOX_TIMEOUT="300") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": TWO_MILLION})
        assert result.is_error is False, text_of(result)[:2000]
        sc = result.structured_content
        text = text_of(result)
        # The capture kept the head and tail (as saved); the marker counts exactly the rest.
        with open(sc["stdout_cut"]["saved_to"], encoding="utf-8") as saved:
            head, numbers, tail = split_kept(saved.read(), "stdout")
        assert numbers[2] == "1 MiB"
        dropped, lines = check_against(TWO_MILLION_WHOLE, head, numbers, tail)
        assert head.startswith("0\n1\n2\n") and tail.endswith("1999999\nFINAL RESULT 42\n")
        assert (sc["stdout_dropped_bytes"], sc["stdout_dropped_lines"]) == (dropped, lines)
        assert (sc["stderr_dropped_bytes"], sc["stderr_dropped_lines"]) == (0, 0)
        assert sc["truncated"] is True and sc["truncated_bytes"] == dropped
        assert lines == 2_000_001 - head.count("\n") - tail.count("\n")
        # The model reads a head and tail of that (SANDBOX_MODEL_OUTPUT): its one cut line says
        # what the capture dropped within it, and the last line is the result.
        stdout = sc["stdout"]
        assert stdout in text
        assert stdout.startswith("0\n1\n2\n") and stdout.endswith("\n1999999\nFINAL RESULT 42\n")
        [cut] = [line for line in stdout.splitlines() if line.startswith("[… ")]
        assert f" cut here; within them {dropped} bytes ({lines} lines) were not kept at all (over the 1 MiB output limit); the whole stdout (" in cut, cut
        numbers_shown, breaks = numbered_in_order(model_lines(stdout))
        assert numbers_shown[0] == 0 and numbers_shown[-1] == 1_999_999 and breaks == 1, "no line cut partway"
        assert f"[output over the 1 MiB limit (SANDBOX_MAX_OUTPUT): stdout keeps its first 512" in text
        assert f", the {dropped} bytes ({lines} lines) between them were discarded]" in text
        # The stream among the outputs is the same text.
        [stream] = [o for o in sc["outputs"] if o["output_type"] == "stream"]
        assert stream["text"] == stdout


SESSION_CODE = r"""
import sys
for i in range(2_000_000):
    print(i)
# In large writes: stderr is line-buffered, and a write a line is slow under gVisor.
for start in range(0, 300_000, 10_000):
    print("\n".join(f'warn {i}' for i in range(start, start + 10_000)), file=sys.stderr)
print('FINAL RESULT 42')
print('FINAL ERROR 7', file=sys.stderr)
"""


async def test_a_session_keeps_both_streams_head_and_tail_and_its_workspace_copy_says_so(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path), SANDBOX_TIMEOUT="300") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        result = await client.call_tool("run_python", {"container_id": cid, "code": SESSION_CODE})
        assert result.is_error is False, text_of(result)[:2000]
        sc = result.structured_content
        wholes = {
            "stdout": TWO_MILLION_WHOLE,
            "stderr": "".join(f"warn {i}\n" for i in range(300_000)) + "FINAL ERROR 7\n",
        }
        total = 0
        for stream, whole in wholes.items():
            path = sc[f"{stream}_cut"]["workspace_path"]
            assert path == f"/workspace/.outputs/{stream}.txt"
            read = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": path})
            [resource] = [block.resource for block in read.content if block.type == "resource"]
            head, numbers, tail = split_kept(resource.text, stream)
            dropped, lines = check_against(whole, head, numbers, tail)
            assert (sc[f"{stream}_dropped_bytes"], sc[f"{stream}_dropped_lines"]) == (dropped, lines)
            # Both over half the limit: half each, head and tail a quarter each (less a line).
            assert 256 * 1024 - 20 < len(head) <= 256 * 1024 and 256 * 1024 - 20 < len(tail) <= 256 * 1024
            assert sc[stream].endswith(whole.splitlines()[-1] + "\n"), sc[stream][-200:]
            total += dropped
        assert sc["truncated_bytes"] == total
        text = text_of(result)
        assert "stdout keeps its first " in text and "; stderr keeps its first " in text
        await client.call_tool("sandbox_stop", {"container_id": cid})


DISPLAYS = """
for i in range(100):
    print(f'line {i:05}')
display('before')
for i in range(100, 10_000):
    print(f'line {i:05}')
display('middle')
for i in range(10_000, 19_990):
    print(f'line {i:05}')
display('end')
for i in range(19_990, 20_000):
    print(f'line {i:05}')
"""


async def test_displays_around_the_cut_keep_their_order_and_the_marker_shows_once():
    # The model reads all that is kept: the marker is in its text as it is in the stream.
    async with connect(SANDBOX_MAX_OUTPUT="64k", SANDBOX_MODEL_OUTPUT="1000000") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": DISPLAYS})
        assert result.is_error is False, text_of(result)[:2000]
        sc = result.structured_content
        assert sc["stdout_cut"] is None, "the model reads all that was kept"
        head, numbers, tail = split_kept(sc["stdout"], "stdout")
        whole = "".join(f"line {i:05}\n" for i in range(20_000))
        dropped, _ = check_against(whole, head, numbers, tail)
        assert numbers[2] == "64 KiB" and sc["stdout_dropped_bytes"] == dropped
        kinds = []
        for output in sc["outputs"]:
            if output["output_type"] == "stream":
                kinds.append("stream with the marker" if MARKER.search(output["text"]) else "stream")
            else:
                kinds.append(output["data"]["text/plain"])
        # 'middle' came while the dropped part was written: right after the marker.
        assert kinds == ["stream", "'before'", "stream with the marker", "'middle'", "stream", "'end'", "stream"], kinds
        assert "".join(o["text"] for o in sc["outputs"] if o["output_type"] == "stream") == sc["stdout"]
        text = "".join(block.text for block in result.content if block.type == "text")
        assert len(MARKER.findall(text)) == 1
        assert text.index("'before'") < MARKER.search(text).start() < text.index("'middle'") < text.index("'end'")
        assert text.rstrip().endswith("line 19999")
