"""Notebooks in and out through the official MCP client: nbclient 0.11.0's own test notebooks
(tests/data/nbclient, from its published sdist, with its LICENSE) executed with
sandbox_run_notebook and cell by cell with run_python, compared with their stored outputs after
the normalisation nbclient's tests apply; sandbox_export_notebook's notebook validated with
nbformat and run again to the same outputs; parameters; stopping at an error; malformed notebooks.
"""

import base64
import copy
import json
import os
import re

import nbformat
import pytest

from conftest import connect, text_of
from nbcompare import apply_update
from nbcompare import normalize_output as nbcompare_normalize

pytestmark = pytest.mark.anyio

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "nbclient")

# The notebooks nbclient's `test_run_all_notebooks` compares with their stored outputs, with the
# options it runs each with (`timeout` per cell, `allow_errors`).
COMPARED = {
    "Other Comms.ipynb": {},
    "Clear Output.ipynb": {},
    "Empty Cell.ipynb": {},
    "Factorials.ipynb": {},
    "HelloWorld.ipynb": {},
    "Inline Image.ipynb": {},
    "Interrupt.ipynb": {"timeout": 3, "allow_errors": True},
    "JupyterWidgets.ipynb": {},
    "Skip Exceptions with Cell Tags.ipynb": {},
    "Skip Exceptions.ipynb": {"allow_errors": True},
    "Skip Execution with Cell Tag.ipynb": {},
    "SVG.ipynb": {},
    "Unicode.ipynb": {},
    "UnicodePy3.ipynb": {},
    "update-display-id.ipynb": {},
    "Check History in Memory.ipynb": {},
}

# What the notebooks import that the sandbox's image does not have, installed in their session
# as nbclient's test environment has it. With no frontend, `comm` gives its own stand-in comm
# (messages go nowhere, as to a frontend without the handler): the widgets' outputs are still
# what a kernel shows.
DEPENDENCIES = {
    "JupyterWidgets.ipynb": ["ipywidgets==8.1.9", "comm==0.2.3"],
    "Other Comms.ipynb": ["comm==0.2.3"],
}

# Every cell of the notebooks above is compared; of nbclient's notebooks, those below are not.
COMMS = "needs a Jupyter frontend's comms (a kernel's comm channel to widgets): a sandbox has no frontend"

# The other notebooks of nbclient's tests/files, and why none is compared with stored outputs
# (nbclient does not compare them either: each serves a test of its own).
NOT_COMPARED = {
    "Parallel Execute A.ipynb": "its cells need a second sandbox running at the same time and sharing /tmp "
                                "with it (NBEXECUTE_TEST_PARALLEL_TMPDIR), which isolation forbids",
    "Parallel Execute B.ipynb": "the other half of Parallel Execute A: the same reason",
    "Output.ipynb": COMMS + " (ipywidgets.Output captures through comms)",
    "Autokill.ipynb": "kills its own kernel (SIGTERM): nbclient tests the kernel's death, no outputs are stored",
    "Sleep1s.ipynb": "prints timestamps: nbclient tests timing, no outputs are stored",
    "Disable Stdin.ipynb": "nbclient tests that input() raises; no outputs are stored",
    "Error.ipynb": "nbclient tests the error raised; its stored traceback names an ipykernel temporary file",
}


def test_every_notebook_of_nbclients_tests_is_here_and_either_compared_or_excluded_with_a_reason():
    here = {name for name in os.listdir(DATA) if name.endswith(".ipynb")}
    assert here == set(COMPARED) | set(NOT_COMPARED)
    assert os.path.exists(os.path.join(DATA, "LICENSE"))


# nbclient's tests/test_client.py normalisation, exactly (nbcompare.py's `as_nbclient`): the stored
# outputs were made by older kernels (the stored Inline Image's base64 has the line breaks an older
# kernel wrapped it at).
def normalize_output(output):
    return nbcompare_normalize(output, as_nbclient=True)


def read_stored(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return nbformat.read(f, 4)


def cleaned(notebook):
    """The notebook as nbclient's test runs it: no outputs, no counts."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return notebook


# Cells whose stored traceback an older IPython wrote, showing fewer lines of the cell around the
# failing one than today's ipykernel (7.4, IPython 9) shows, and the sandbox with it (the cell's
# lines 1 to 5 where the stored output has 3 to 5; tests/mcp/test_fidelity.py compares with a
# current kernel): their tracebacks are compared without the cell's source lines.
OLDER_KERNEL = {("Skip Exceptions with Cell Tags.ipynb", 0)}
SOURCE_LINE = re.compile(r"^(-*> )?\s*\d+ .*\n?", re.MULTILINE)


def without_source_lines(outputs):
    return [dict(o, traceback=[SOURCE_LINE.sub("", line) for line in o["traceback"]]) if "traceback" in o else o
            for o in outputs]


def compare(name, expected, actual_cells):
    """(equivalent cells, compared cells, what differs) for one notebook; `actual_cells` holds, per
    cell of `expected`, its (outputs, execution_count)."""
    equal, compared, differences = 0, 0, []
    assert len(actual_cells) == len(expected.cells), name
    for index, (cell, (outputs, count)) in enumerate(zip(expected.cells, actual_cells)):
        if cell.cell_type != "code":
            continue
        compared += 1
        want = [normalize_output(o) for o in cell.get("outputs", [])]
        got = [normalize_output(o) for o in outputs]
        if (name, index) in OLDER_KERNEL:
            want, got = without_source_lines(want), without_source_lines(got)
        if want == got and cell.get("execution_count") == count:
            equal += 1
        else:
            differences.append(f"{name} cell {index}: expected {want} (count {cell.get('execution_count')}), "
                               f"got {got} (count {count})")
    return equal, compared, differences


async def session_with_files(client, name):
    started = await client.call_tool("sandbox_initialize", {"dependencies": DEPENDENCIES.get(name, [])})
    assert started.is_error is False, text_of(started)
    cid = started.structured_content["container_id"]
    with open(os.path.join(DATA, "python.png"), "rb") as f:
        png = base64.b64encode(f.read()).decode("ascii")
    wrote = await client.call_tool("sandbox_write_file", {"container_id": cid, "path": "python.png", "content_base64": png})
    assert wrote.is_error is False, text_of(wrote)
    return cid


def notebook_of(result):
    [resource] = [b.resource for b in result.content if getattr(b, "type", None) == "resource"]
    assert resource.mime_type == "application/x-ipynb+json"
    return nbformat.reads(resource.text, 4)


def report(kind, totals, differences):
    equal, compared = totals
    print(f"\n{kind}: {equal} of {compared} compared cells of nbclient's notebooks equivalent")
    assert not differences, f"{kind}: {equal} of {compared} cells equivalent; differences:\n" + "\n".join(differences)


async def test_nbclients_notebooks_run_through_sandbox_run_notebook_as_stored():
    totals, differences = [0, 0], []
    async with connect(SANDBOX_FILES_DIR="") as client:
        for name, opts in COMPARED.items():
            expected = read_stored(name)
            cid = await session_with_files(client, name)
            args = {
                "container_id": cid,
                "content": nbformat.writes(cleaned(expected)),
                "stop_on_error": not opts.get("allow_errors"),
            }
            if "timeout" in opts:
                args["timeout_seconds"] = opts["timeout"]
            result = await client.call_tool("sandbox_run_notebook", args)
            ran = notebook_of(result)
            nbformat.validate(ran)
            cells = [(c.get("outputs", []), c.get("execution_count")) for c in ran.cells]
            equal, compared, diff = compare(name, expected, cells)
            totals[0] += equal
            totals[1] += compared
            differences += diff
            await client.call_tool("sandbox_stop", {"container_id": cid})
    report("sandbox_run_notebook", totals, differences)


async def test_nbclients_notebooks_run_cell_by_cell_through_run_python_as_stored():
    totals, differences = [0, 0], []
    for name, opts in COMPARED.items():
        expected = read_stored(name)
        env = {"SANDBOX_FILES_DIR": ""}
        if "timeout" in opts:
            env["SANDBOX_TIMEOUT"] = f"{opts['timeout']}s"
        async with connect(**env) as client:
            cid = await session_with_files(client, name)
            cells, executed = [], []
            for cell in expected.cells:
                skip = cell.cell_type != "code" or not cell.source.strip() or "skip-execution" in cell.metadata.get("tags", [])
                executed.append(not skip)
                if skip:
                    cells.append(([], None))
                    continue
                result = await client.call_tool("run_python", {"container_id": cid, "code": cell.source})
                own = []
                for output in result.structured_content["outputs"]:
                    if "display_id" in output.get("transient", {}):
                        apply_update(cells, output)
                    if output["output_type"] != "update_display_data":
                        own.append(output)
                cells.append((own, result.structured_content.get("execution_count")))
            equal, compared, diff = compare(name, expected, cells)
            totals[0] += equal
            totals[1] += compared
            differences += diff
            # The session's own notebook says the same.
            exported = notebook_of(await client.call_tool("sandbox_export_notebook", {"container_id": cid}))
            nbformat.validate(exported)
            run = [cell for cell, ran in zip(cells, executed) if ran]
            assert [([normalize_output(o) for o in c.outputs], c.execution_count) for c in exported.cells] == \
                   [([normalize_output(o) for o in outputs], count) for outputs, count in run], name
    report("run_python", totals, differences)


SESSION_CELLS = [
    "import sys\nx = 6 * 7\nprint('x is', x)",
    "print('to stderr', file=sys.stderr)\nx",
    "'two' + ' lines\\nof text'",
    "y = [i * i for i in range(5)]\nprint(y)\ny[-1]",
    "1 / 0",
    "print('after the error')",
    "   \n",
]


async def test_the_exported_notebook_is_valid_nbformat_saved_and_runs_again_to_the_same_outputs():
    async with connect(SANDBOX_FILES_DIR="") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        for code in SESSION_CELLS:
            await client.call_tool("run_python", {"container_id": cid, "code": code})
        result = await client.call_tool("sandbox_export_notebook", {"container_id": cid, "path": "out/session.ipynb"})
        assert result.is_error is False, text_of(result)
        assert result.structured_content["path"] == "/workspace/out/session.ipynb"
        exported = notebook_of(result)
        nbformat.validate(exported)
        assert (exported.nbformat, exported.nbformat_minor) == (4, 5)
        assert exported.metadata.kernelspec.name == "python3" and exported.metadata.language_info.name == "python"
        assert [c.source for c in exported.cells] == SESSION_CELLS
        assert [c.execution_count for c in exported.cells] == [1, 2, 3, 4, 5, 6, None]
        kinds = [[o.output_type for o in c.outputs] for c in exported.cells]
        assert kinds == [["stream"], ["stream", "execute_result"], ["execute_result"], ["stream", "execute_result"],
                         ["error"], ["stream"], []]
        assert exported.cells[1].outputs[1].data["text/plain"] == "42"
        assert exported.cells[4].outputs[0].ename == "ZeroDivisionError"
        # Saved in the workspace: the file tools and resources/read serve the same notebook.
        uri = result.structured_content["resource_uri"]
        read = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": "out/session.ipynb"})
        [file] = [b.resource for b in read.content if getattr(b, "type", None) == "resource"]
        assert nbformat.reads(file.text, 4) == exported
        assert nbformat.reads((await client.read_resource(uri)).contents[0].text, 4) == exported
        # The default name follows the latest count.
        default = await client.call_tool("sandbox_export_notebook", {"container_id": cid})
        assert default.structured_content["path"] == "/workspace/notebook-6.ipynb"

        # Run again in a new session (none given: started for the run and stopped after it).
        rerun = await client.call_tool("sandbox_run_notebook", {"content": nbformat.writes(exported), "stop_on_error": False})
        assert rerun.is_error is False, text_of(rerun)
        summary = rerun.structured_content
        assert summary["container_id"] is None
        assert (summary["cells_run"], summary["cells_skipped"]) == (6, 1)
        assert [(f["index"], f["ename"]) for f in summary["failed"]] == [(4, "ZeroDivisionError")]
        again = notebook_of(rerun)
        nbformat.validate(again)
        assert [(c.execution_count, [normalize_output(o) for o in c.outputs]) for c in again.cells] == \
               [(c.execution_count, [normalize_output(o) for o in c.outputs]) for c in exported.cells]
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_an_update_in_a_later_call_changes_the_exported_display():
    async with connect(SANDBOX_FILES_DIR="") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        await client.call_tool("run_python", {"container_id": cid, "code": "h = display('first', display_id=True)"})
        await client.call_tool("run_python", {"container_id": cid, "code": "h.update('second')"})
        exported = notebook_of(await client.call_tool("sandbox_export_notebook", {"container_id": cid}))
        nbformat.validate(exported)
        assert [o.data["text/plain"] for o in exported.cells[0].outputs] == ["'second'"]
        assert exported.cells[1].outputs == []
        assert "transient" not in json.dumps(exported)


def notebook(*cells, parameters_at=None):
    nb = nbformat.v4.new_notebook()
    for i, source in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        if i == parameters_at:
            cell.metadata["tags"] = ["parameters"]
        nb.cells.append(cell)
    return nbformat.writes(nb)


async def test_parameters_are_injected_after_the_parameters_cell_as_python_literals():
    text = notebook("import json", "alpha = 1\nname = 'default'", "print(json.dumps([alpha, name, items, nothing]))",
                    parameters_at=1)
    weird = "it's \"quoted\"\n\\ and é\u2028"
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("sandbox_run_notebook", {
            "content": text,
            "parameters": {"alpha": 0.5, "name": weird, "items": [1, True, {"k": None}], "nothing": None},
        })
        assert result.is_error is False, text_of(result)
        # Assigned in the order of their names (a JSON object's keys have none).
        assert result.structured_content["parameters"] == ["alpha", "items", "name", "nothing"]
        ran = notebook_of(result)
        nbformat.validate(ran)
        assert ran.cells[2].metadata["tags"] == ["injected-parameters"]
        assert ran.cells[2].source.startswith("# Parameters\n")
        [printed] = ran.cells[3].outputs
        assert json.loads(printed.text) == [0.5, weird, [1, True, {"k": None}], None]
        for bad in ["1x", "class", "a b", "__import__('os').system('id') or x"]:
            refused = await client.call_tool("sandbox_run_notebook", {"content": text, "parameters": {bad: 1}})
            assert refused.is_error is True
            assert "must be a Python identifier" in text_of(refused) or "keyword" in text_of(refused), text_of(refused)


async def test_the_run_stops_at_the_first_error_unless_told_or_tagged():
    text = notebook("print('a')", "raise ValueError('boom')", "print('c')")
    async with connect(SANDBOX_FILES_DIR="") as client:
        steps = []

        async def on_progress(progress, total, message):
            steps.append(message)

        stopped = await client.call_tool("sandbox_run_notebook", {"content": text}, progress_callback=on_progress)
        assert stopped.is_error is True
        summary = stopped.structured_content
        assert (summary["stopped_at"], summary["cells_run"], summary["cells_not_run"], summary["succeeded"]) == (1, 2, 1, False)
        assert summary["failed"] == [{"index": 1, "execution_count": 2, "ename": "ValueError", "evalue": "boom", "allowed": False}]
        assert "cell 1 failed: ValueError: boom" in text_of(stopped)
        ran = notebook_of(stopped)
        assert ran.cells[2].outputs == [] and ran.cells[2].execution_count is None
        assert any(m and "code cell 2 of 3" in m for m in steps), steps

        onward = await client.call_tool("sandbox_run_notebook", {"content": text, "stop_on_error": False})
        assert onward.structured_content["cells_run"] == 3
        assert notebook_of(onward).cells[2].outputs[0].text == "c\n"

        nb = nbformat.reads(text, 4)
        nb.cells[1].metadata["tags"] = ["raises-exception"]
        tagged = await client.call_tool("sandbox_run_notebook", {"content": nbformat.writes(nb)})
        assert tagged.is_error is False, text_of(tagged)
        assert tagged.structured_content["failed"][0]["allowed"] is True
        assert notebook_of(tagged).cells[2].outputs[0].text == "c\n"

        # sys.exit, even with status 0, stops the run as it stops nbclient's: an error output.
        exits = notebook("import sys\nsys.exit(0)", "print('Cell should not execute.')")
        exited = await client.call_tool("sandbox_run_notebook", {"content": exits})
        assert exited.is_error is True
        assert exited.structured_content["stopped_at"] == 0
        assert exited.structured_content["failed"][0]["ename"] == "SystemExit"
        cells = notebook_of(exited).cells
        assert [(o.output_type, o.get("ename"), o.get("evalue")) for o in cells[0].outputs][0] == ("error", "SystemExit", "0")
        assert cells[1].outputs == []


async def test_a_notebook_in_the_workspace_is_run_and_saved_beside_it():
    async with connect(SANDBOX_FILES_DIR="") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        await client.call_tool("sandbox_write_file", {"container_id": cid, "path": "nb/a.ipynb", "content": notebook("z = 3", "z * 2")})
        result = await client.call_tool("sandbox_run_notebook", {"container_id": cid, "path": "nb/a.ipynb"})
        assert result.is_error is False, text_of(result)
        assert result.structured_content["saved_path"] == "/workspace/nb/a.executed.ipynb"
        read = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": "nb/a.executed.ipynb"})
        [file] = [b.resource for b in read.content if getattr(b, "type", None) == "resource"]
        assert nbformat.reads(file.text, 4).cells[1].outputs[0].data["text/plain"] == "6"
        # The session keeps the notebook's variables.
        after = await client.call_tool("run_python", {"container_id": cid, "code": "z"})
        assert after.structured_content["outputs"][0]["data"]["text/plain"] == "3"
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_a_malformed_notebook_is_refused_with_what_is_wrong_and_a_newer_formats_cells_kept():
    cases = {
        "{": "the notebook is not valid JSON",
        "[1]": "its top level is not a JSON object",
        json.dumps({"nbformat": 3, "nbformat_minor": 0, "worksheets": []}): "the notebook is nbformat 3",
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": {}}): "`cells` is not a list",
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                    "cells": [{"cell_type": "code", "source": ["ok"]}, {"cell_type": "code", "source": 7}]}):
            "cell 1: `source` is not a string or a list of strings",
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                    "cells": [{"cell_type": "raw", "source": ""}] * 1001}): "more than the 1000 a run takes",
        # A kind of cell nbformat 4.5 does not have, in a notebook that says it is 4.5.
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                    "cells": [{"cell_type": "future cell", "metadata": {}, "source": ""}]}):
            "cell 0: `cell_type` is \"future cell\"; it must be code, markdown or raw",
    }
    async with connect(SANDBOX_FILES_DIR="") as client:
        for content, words in cases.items():
            result = await client.call_tool("sandbox_run_notebook", {"content": content})
            assert result.is_error is True
            assert words in text_of(result), (content[:60], text_of(result))
        neither = await client.call_tool("sandbox_run_notebook", {})
        assert "exactly one of path and content" in text_of(neither)
        no_session = await client.call_tool("sandbox_run_notebook", {"path": "a.ipynb"})
        assert "give the session's container_id" in text_of(no_session)
        # A notebook of a newer minor format (as nbformat's own test notebook of one): a cell of
        # a kind the server does not know is kept as it came and not run; the code cells run.
        future = {"nbformat": 4, "nbformat_minor": 99, "metadata": {}, "cells": [
            {"cell_type": "future cell", "metadata": {"m": 1}, "future_field": ["x"]},
            {"cell_type": "code", "source": "print('ran')", "metadata": {}, "outputs": [], "execution_count": None},
        ]}
        ran = await client.call_tool("sandbox_run_notebook", {"content": json.dumps(future)})
        assert ran.is_error is False, text_of(ran)
        [resource] = [b.resource for b in ran.content if getattr(b, "type", None) == "resource"]
        back = json.loads(resource.text)
        assert back["nbformat_minor"] == 99
        kept = {k: v for k, v in back["cells"][0].items() if k != "id"}
        assert kept == future["cells"][0], kept
        assert back["cells"][1]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        # nbformat reads it as it reads a newer format's notebook.
        nbformat.reads(resource.text, 4)
