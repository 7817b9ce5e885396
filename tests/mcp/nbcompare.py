"""What the fidelity suite (test_fidelity.py) and the script that makes its reference run
(scripts/fidelity-reference.sh) share: the corpus (other projects' notebooks under tests/data,
each with how it is run), the packages both the sandbox's sessions and the reference's virtual
environment have, and the normalisation outputs are compared after.

Standard library only: scripts/fidelity_reference.py imports it from a virtual environment that
has nbclient and ipykernel but not the MCP SDK, and the MCP suite's from one that has the SDK but
no kernel.
"""

import base64
import copy
import os
import re
import xml.etree.ElementTree as ET

DATA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
REFERENCE = os.path.join(DATA, "fidelity-reference.json")

# The sdists the notebooks come from (tests/data/<project>/ keeps each one's paths, and its LICENSE).
SOURCES = {
    "nbconvert": "nbconvert-7.17.2.tar.gz",
    "nbformat": "nbformat-5.11.1.tar.gz",
    "nbval": "nbval-0.11.0.tar.gz",
    "papermill": "papermill-2.7.0.tar.gz",
    "jupytext": "jupytext-1.19.7.tar.gz",
}

# What the notebooks import, with everything it needs, pinned: installed as `dependencies` into
# every session the suite starts (one set, installed once and then found in the cache) and into
# the reference's virtual environment. numpy, pandas and matplotlib (and what they need) at the
# versions of the datascience flavour (src/engine/docker/image/flavour.rs); the rest at what was
# current when the corpus was taken. A new version here needs a new reference run.
PACKAGES = [
    "numpy==2.4.6", "pandas==3.1.1", "matplotlib==3.11.2",
    "contourpy==1.3.3", "cycler==0.12.1", "fonttools==4.68.0", "kiwisolver==1.5.1", "packaging==26.4",
    "pillow==13.0.0", "pyparsing==3.3.3", "python-dateutil==4.0.0", "tzdata==2026.6",
    "sympy==1.14.0", "mpmath==1.3.0",
    "pyyaml==6.0.4",
    "ipywidgets==8.1.9", "comm==0.2.3", "widgetsnbextension==4.0.16", "jupyterlab_widgets==3.0.17",
]

NETWORK = "fetches an image from ipython.org: the sandbox has no network (and the reference run sends nothing off the machine)"

# Every notebook compared, by its path under tests/data, with how both sides run it:
# - allow_errors: nbclient's option (the run goes on after a cell that raises); without it the
#   notebook runs through without an error on the reference side;
# - files: files beside the notebook that it reads, put into the kernel's working directory;
# - not_run: cells that neither side runs (tagged `skip-execution`, which nbclient and
#   sandbox_run_notebook both honour, and left out of the cell-by-cell run), with the reason.
# The cells a run gives that cannot be compared (time, randomness) are test_fidelity.py's EXCLUDED.
CORPUS = {
    # nbconvert 7.17.2: the notebooks its exporters' and preprocessors' tests convert.
    "nbconvert/tests/exporters/files/notebook2.ipynb": {},
    "nbconvert/tests/exporters/files/notebook3.ipynb": {"allow_errors": True},
    "nbconvert/tests/exporters/files/notebook_inject.ipynb": {},
    "nbconvert/tests/exporters/files/pngmetadata.ipynb": {},
    "nbconvert/tests/exporters/files/prompt_numbers.ipynb": {},
    "nbconvert/tests/exporters/files/rst_output.ipynb": {},
    "nbconvert/tests/exporters/files/svg.ipynb": {},
    "nbconvert/tests/files/Widget_List.ipynb": {"files": ["testimage.png"]},
    "nbconvert/tests/files/markdown_display_priority.ipynb": {"allow_errors": True},
    "nbconvert/tests/files/notebook1.ipynb": {},
    "nbconvert/tests/files/notebook2.ipynb": {"allow_errors": True},
    "nbconvert/tests/files/notebook4_jpeg.ipynb": {"files": ["containerized_deployments.jpeg"]},
    "nbconvert/tests/files/notebook_tags.ipynb": {},
    "nbconvert/tests/preprocessors/files/HelloWorld.ipynb": {},
    "nbconvert/tests/preprocessors/files/MixedMarkdown.ipynb": {},
    # nbformat 5.11.1: its valid version-4 test notebooks.
    "nbformat/tests/many_tracebacks.ipynb": {},
    "nbformat/tests/test4.ipynb": {"not_run": {8: NETWORK}},
    "nbformat/tests/test4.5.ipynb": {"not_run": {8: NETWORK}},
    "nbformat/tests/test4docinfo.ipynb": {"not_run": {8: NETWORK}},
    "nbformat/tests/test4plus.ipynb": {"allow_errors": True, "not_run": {8: NETWORK}},
    "nbformat/tests/test4custom.ipynb": {},
    "nbformat/tests/test4jupyter_metadata.ipynb": {},
    "nbformat/tests/test4jupyter_metadata_timings.ipynb": {},
    # nbval 0.11.0: its documentation's notebook and its tests' notebooks.
    "nbval/docs/source/index.ipynb": {"allow_errors": True},
    "nbval/tests/exceptions.ipynb": {"allow_errors": True},
    "nbval/tests/latex-example.ipynb": {},
    "nbval/tests/minimal_example.ipynb": {},
    "nbval/tests/sample_notebook.ipynb": {"allow_errors": True},
    "nbval/tests/test_coalesce.ipynb": {},
    "nbval/tests/ipynb-test-samples/test-exceptions-fail-storedmismatch.ipynb": {"allow_errors": True},
    "nbval/tests/ipynb-test-samples/test-latex-fail-randomoutput.ipynb": {},
    "nbval/tests/ipynb-test-samples/test-latex-pass-correctouput.ipynb": {},
    "nbval/tests/ipynb-test-samples/test-latex-pass-failsbutignoreoutput.ipynb": {},
    "nbval/tests/ipynb-test-samples/test-stream-fail-missingoutput.ipynb": {},
    "nbval/tests/ipynb-test-samples/test-stream-pass-missing-unexecuted-output.ipynb": {},
    # papermill 2.7.0: its tests' notebooks that have stored outputs.
    "papermill/papermill/tests/notebooks/broken.ipynb": {"allow_errors": True},
    "papermill/papermill/tests/notebooks/broken1.ipynb": {"allow_errors": True},
    "papermill/papermill/tests/notebooks/broken2.ipynb": {"allow_errors": True},
    "papermill/papermill/tests/notebooks/nb_version_4.4.ipynb": {},
    "papermill/papermill/tests/notebooks/test_autosave.ipynb": {},
    "papermill/papermill/tests/notebooks/test_logging.ipynb": {"allow_errors": True},
    # jupytext 1.19.7: its Python test notebooks that have stored outputs.
    **{f"jupytext/tests/data/notebooks/inputs/ipynb_py/{name}.ipynb": opts for name, opts in {
        "Notebook with function and cell metadata 164": {},
        "Notebook with html and latex cells": {"allow_errors": True},
        "Notebook with many hash signs": {},
        "Notebook with metadata and long cells": {},
        "Notebook_with_more_R_magic_111": {"allow_errors": True},
        "convert_to_py_then_test_with_update83": {},
        "frozen_cell": {},
        "jupyter": {},
        "jupyter_again": {"allow_errors": True},
        "jupyter_with_raw_cell_in_body": {},
        "jupyter_with_raw_cell_on_top": {},
        "jupyter_with_raw_cell_with_invalid_yaml": {},
        "nteract_with_parameter": {},
        "text_outputs_and_images": {"allow_errors": True},
    }.items()},
}


def project_of(name):
    return name.split("/", 1)[0]


def to_run(notebook, name):
    """The notebook (nbformat's JSON, as a dict) as both sides run it: no outputs and no counts
    (nbclient leaves a cell it does not run as it was), and the cells not run tagged
    `skip-execution`."""
    notebook = copy.deepcopy(notebook)
    not_run = CORPUS[name].get("not_run", {})
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        cell["outputs"] = []
        cell["execution_count"] = None
        if index in not_run:
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if "skip-execution" not in tags:
                tags.append("skip-execution")
    return notebook


def source_of(cell):
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def runs(cell):
    """Whether nbclient runs the cell (its `execute_cell`): a code cell with source that is not
    only whitespace and not tagged `skip-execution`."""
    return cell["cell_type"] == "code" and bool(source_of(cell).strip()) and \
        "skip-execution" not in cell.get("metadata", {}).get("tags", [])


# nbclient's tests/test_client.py normalisation (as tests/mcp/test_notebooks.py writes it again),
# with what is added here said where it is.
# An object's address: nbclient's pattern takes 7 to 9 hex digits, which leaves the tail of a
# 64-bit address (0x7f3a5c2e1590: 12 digits) in the text; here it takes them all.
ADDR = re.compile(r"0x[0-9a-f]{7,16}")
IPYTHON_INPUT = re.compile(r"(<ipython-input-\d+-[0-9a-f]+>|<IPY-INPUT>) in (<module>|<cell line: \d>\(\))")
IPYTHON8_INPUT = re.compile(r"((Cell|Input) In\s?\[\d+\]|<IPY-INPUT>), (in )?(line \d|<module>|<cell line: \d>\(\))")
ANSI = re.compile(r"\x1b(\[(.*?)[@-~]|\].*?(\x07|\x1b\\))")  # nbconvert's strip_ansi
# Added here: where a package's frames sit in a traceback. The reference's virtual environment's
# site-packages and the sandbox's dependency set or its own IPython are the same files in
# different places.
PACKAGE_PATH = re.compile(r"(/[^\s\"',:]*)?/(site-packages|dist-packages|sandbox-ipython|deps/s-[0-9a-f]+)/")
# And the standard library's: the reference's CPython (3.11.7, from pyenv) is not the image's
# (Debian's 3.11.2), so its modules are elsewhere and frozen importlib's line numbers differ.
STDLIB_PATH = re.compile(r"File /[^\s\"',:]*/lib/python3\.\d+/")
FROZEN_LINE = re.compile(r"(<frozen [\w.]+>):\d+")


# MIME types whose value is base64. nbclient normalises every string value as base64, which reduces
# a text/plain to its letters and digits ("<IPython.core.display.HTML object>" and
# "IPython.core.display.HTML-object" compare equal); here text is compared as it is.
BINARY = re.compile(r"image/(png|jpeg|gif|bmp|webp)|application/pdf")


def normalize_base64(text):
    # As nbclient's: b64decode without validation drops the newlines an older kernel wrapped
    # base64 at.
    try:
        return base64.b64encode(base64.b64decode(text.encode("ascii"))).decode("ascii")
    except (ValueError, TypeError):
        return text


# Added here: what matplotlib writes into an SVG that changes from one run to the next, the time
# (its metadata's dc:date) and, with rcParams["svg.hashsalt"] unset, its elements' ids (markers
# "m" and clip paths "p" with 10 random hex digits, and the references to them).
SVG_DATE = re.compile(r"(<dc:date\b[^>]*>)[^<]*(</dc:date>)")
SVG_ID = re.compile(r"\b([mp])[0-9a-f]{10}\b")


def normalize_svg(text):
    # nbclient parses SVG with xmltodict (attribute order and whitespace do not count): C14N 2.0
    # sorts attributes, strip_text drops whitespace between elements.
    text = ET.canonicalize(text, strip_text=True)
    return SVG_ID.sub(r"\1<ID>", SVG_DATE.sub(r"\1\2", text))


# nbclient's own address pattern, for outputs stored by its tests (test_notebooks.py).
NBCLIENT_ADDR = re.compile(r"0x[0-9a-f]{7,9}")


def normalize_output(output, as_nbclient=False):
    """An output as compared here; `as_nbclient`: exactly as nbclient's tests normalise it (its
    address pattern, base64 applied to every string value, tracebacks without the paths added
    here), for outputs older kernels stored."""
    addr = NBCLIENT_ADDR if as_nbclient else ADDR
    output = copy.deepcopy(dict(output))
    output.pop("metadata", None)
    output.pop("transient", None)  # in run_python's outputs only; never in a saved notebook
    if "text" in output:
        output["text"] = addr.sub("<HEXADDR>", output["text"])
    data = output.get("data", {})
    if "text/plain" in data:
        data["text/plain"] = addr.sub("<HEXADDR>", data["text/plain"])
    if "application/vnd.jupyter.widget-view+json" in data:
        data["application/vnd.jupyter.widget-view+json"]["model_id"] = "<MODEL_ID>"
    if "image/svg+xml" in data:
        data["image/svg+xml"] = normalize_svg(data["image/svg+xml"])
    for key, value in data.items():
        if isinstance(value, str) and (as_nbclient or BINARY.fullmatch(key)):
            data[key] = normalize_base64(value)
    if as_nbclient:
        if "traceback" in output:
            output["traceback"] = [
                IPYTHON8_INPUT.sub("<IPY-INPUT>", IPYTHON_INPUT.sub("<IPY-INPUT>", ANSI.sub("", line)))
                for line in output["traceback"]
            ]
        return output
    if "evalue" in output:
        output["evalue"] = PACKAGE_PATH.sub("<SITE>/", output["evalue"])
    if "traceback" in output:
        output["traceback"] = [normalize_traceback_entry(line) for line in output["traceback"]]
    return output


def normalize_traceback_entry(text):
    text = IPYTHON8_INPUT.sub("<IPY-INPUT>", IPYTHON_INPUT.sub("<IPY-INPUT>", ANSI.sub("", text)))
    text = STDLIB_PATH.sub("File <STDLIB>/", PACKAGE_PATH.sub("<SITE>/", text))
    return FROZEN_LINE.sub(r"\1:<LINE>", text)


def merged_streams(outputs):
    """Adjacent stream outputs of one name as one, as a Jupyter frontend shows them and saves them
    (and as the sandbox gives them). nbclient keeps each stream message a kernel sends as an output
    of its own, and how a kernel splits a stream into messages depends on time (ipykernel flushes
    every 0.2 s), so the reference's raw outputs are merged before they are compared."""
    merged = []
    for output in outputs:
        if output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                and merged[-1].get("name") == output.get("name"):
            merged[-1] = dict(merged[-1], text=merged[-1]["text"] + output["text"])
        else:
            merged.append(output)
    return merged


def normalized(outputs):
    return [normalize_output(o) for o in merged_streams(list(outputs))]


def apply_update(cells, update):
    """What a Jupyter frontend (and nbclient's `_update_display_id`) does with an
    update_display_data, and with a display_data or execute_result that has a display id: every
    output shown earlier with that id, in every cell, gets the new data. `cells`: per cell, its
    (outputs, execution_count)."""
    display_id = update["transient"]["display_id"]
    for outputs, _ in cells:
        for output in outputs:
            if output.get("output_type") in ("display_data", "execute_result") and \
                    output.get("transient", {}).get("display_id") == display_id:
                output["data"] = update["data"]
                output["metadata"] = update["metadata"]
