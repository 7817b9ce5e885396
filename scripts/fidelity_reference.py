"""The fidelity suite's reference run: every notebook of the corpus (tests/mcp/nbcompare.py's
CORPUS) executed by real nbclient and ipykernel, its outputs written to
tests/data/fidelity-reference.json with the versions they came from.

Run by scripts/fidelity-reference.sh inside .cache/venv-fidelity, which has the kernel's side and
the packages the sandbox's sessions get. `--requirements` prints what that environment installs.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "mcp"))
import nbcompare  # noqa: E402

# The kernel's side, pinned: nbclient and ipykernel and what they need at the versions current
# when the corpus was taken. IPython and its own dependencies come from the sandbox runner's set
# (src/engine/python/ipython-set.txt), so both sides run the same IPython.
KERNEL = [
    "nbclient==0.11.0", "ipykernel==7.4.0", "jupyter_client==8.10.0", "jupyter_core==5.9.1",
    "nbformat==5.11.1", "pyzmq==27.3.0", "tornado==6.6.1", "debugpy==1.8.22", "nest-asyncio2==1.7.4",
    "platformdirs==4.14.9", "fastjsonschema==2.22.3", "jsonschema==4.26.0",
]
IPYTHON_SET = os.path.join(ROOT, "src", "engine", "python", "ipython-set.txt")

# A cell runs at most this long (nbclient's `timeout`); the corpus's longest takes about 3 s.
TIMEOUT = 60


def ipython_set():
    """The runner's IPython set as `name==version` (with its markers), without the hashes."""
    pins = []
    with open(IPYTHON_SET, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                pins.append(line.split(" --hash=", 1)[0].strip())
    return pins


def requirements():
    return KERNEL + ipython_set() + nbcompare.PACKAGES


def versions():
    names = ["ipykernel", "nbclient", "jupyter_client", "ipython", "matplotlib-inline", "nbformat"] + \
            [pin.split("==")[0] for pin in nbcompare.PACKAGES]
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "packages": {name: importlib.metadata.version(name) for name in names},
    }


def kernel_environment(home):
    """The kernel's environment: nothing from the user's (their IPython profile, matplotlib's
    configuration and cache, a backend set in MPLBACKEND, which would stop ipykernel choosing the
    inline one), a UTF-8 locale as the sandbox has."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "SYSTEMROOT", "TMPDIR")}
    keep.update({
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "MPLCONFIGDIR": os.path.join(home, ".matplotlib"),
        "IPYTHONDIR": os.path.join(home, ".ipython"),
        "JUPYTER_CONFIG_DIR": os.path.join(home, ".jupyter"),
        "JUPYTER_DATA_DIR": os.path.join(home, ".local", "share", "jupyter"),
        "JUPYTER_RUNTIME_DIR": os.path.join(home, "runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
    })
    return keep


def run_one(name, opts):
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    path = os.path.join(nbcompare.DATA, name)
    with open(path, encoding="utf-8") as f:
        notebook = nbformat.reads(json.dumps(nbcompare.to_run(json.load(f), name)), as_version=4)
    with tempfile.TemporaryDirectory(prefix="fidelity-") as scratch:
        workdir = os.path.join(scratch, "work")
        home = os.path.join(scratch, "home")
        os.makedirs(workdir)
        os.makedirs(home)
        for file in opts.get("files", []):
            shutil.copy(os.path.join(os.path.dirname(path), file), workdir)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(kernel_environment(home))
        try:
            # Over IPC (the kernel's sockets in the scratch directory, named by an absolute path
            # since the kernel runs in another directory), not on TCP ports.
            config = Config()
            config.KernelManager.transport = "ipc"
            config.KernelManager.ip = os.path.join(scratch, "kernel")
            client = NotebookClient(
                notebook, kernel_name="python3", config=config, timeout=TIMEOUT,
                allow_errors=bool(opts.get("allow_errors")), resources={"metadata": {"path": workdir}},
            )
            # The kernel is this environment's ipykernel (the spec its wheel installs, whose
            # `python` jupyter_client runs as sys.executable), not one installed elsewhere.
            spec = client.create_kernel_manager().kernel_spec
            assert spec.resource_dir.startswith(sys.prefix) and spec.argv[0] == "python", (spec.resource_dir, spec.argv)
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            cells.append(None)
        else:
            cells.append({"execution_count": cell.get("execution_count"), "outputs": cell.get("outputs", [])})
    return cells


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requirements", action="store_true", help="print the pins the environment installs")
    parser.add_argument("--out", default=nbcompare.REFERENCE)
    parser.add_argument("notebooks", nargs="*", help="only these (paths under tests/data), merged into --out")
    args = parser.parse_args()
    if args.requirements:
        print("\n".join(requirements()))
        return
    names = args.notebooks or list(nbcompare.CORPUS)
    reference = {"notebooks": {}}
    if args.notebooks and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            reference = json.load(f)
    reference["about"] = ("nbclient's and ipykernel's outputs for the notebooks of tests/mcp/nbcompare.py's CORPUS, "
                          "per cell (null for a cell that is not code); made by scripts/fidelity-reference.sh")
    reference["versions"] = versions()
    reference["sources"] = nbcompare.SOURCES
    reference["timeout"] = TIMEOUT
    for name in names:
        print(f"running {name}", file=sys.stderr, flush=True)
        reference["notebooks"][name] = {"cells": run_one(name, nbcompare.CORPUS[name])}
    reference["notebooks"] = dict(sorted(reference["notebooks"].items()))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(reference, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(reference['notebooks'])} notebooks", file=sys.stderr)


if __name__ == "__main__":
    main()
