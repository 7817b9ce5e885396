"""Files and dependencies through the official MCP client: images and resources come back,
files persist where configured, and dependencies install once."""

import base64
import os
import pathlib

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

SINE_SAVEFIG = """
import numpy as np
import matplotlib.pyplot as plt
x = np.linspace(0, 2 * np.pi, 200)
plt.plot(x, np.sin(x))
plt.title('sine')
plt.savefig('sine.png')
print('saved')
"""

SINE_SHOW = """
import numpy as np
import matplotlib.pyplot as plt
x = np.linspace(0, 2 * np.pi, 200)
plt.plot(x, np.sin(x))
plt.show()
"""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def images(result):
    return [block for block in result.content if block.type == "image"]


def resources(result):
    return [block.resource for block in result.content if block.type == "resource"]


async def test_a_sine_plot_saved_with_savefig_comes_back_as_a_png(tmp_path):
    async with connect(SANDBOX_FILES_DIR=str(tmp_path)) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": SINE_SAVEFIG, "dependencies": ["matplotlib", "numpy"]})
        assert result.is_error is False, text_of(result)
        # A script: the figure it saved comes back as its file, once (not shown again at its end).
        assert [o for o in result.structured_content["outputs"] if o["output_type"] == "display_data"] == []
        [image] = images(result)
        assert image.mime_type == "image/png"
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        [saved] = result.structured_content["files"]
        assert saved["path"] == "sine.png" and saved["returned"] is True
        assert pathlib.Path(saved["saved_to"]).read_bytes().startswith(PNG_MAGIC)
        assert saved["saved_to"].startswith(str(tmp_path))
        assert "sine.png" in text_of(result)


# A figure shown, then one saved (plt.savefig), one saved through its Figure, one left open unsaved,
# one saved to a buffer (which does not come back).
SAVED_AND_OPEN = """
import io
import matplotlib.pyplot as plt
plt.figure(); plt.plot([0, 2]); plt.show()
plt.plot([0, 1]); plt.savefig('a.png')
fig, ax = plt.subplots(); ax.plot([1, 0]); fig.savefig('b.png')
plt.figure(); plt.plot([2, 2])
plt.figure(); plt.plot([3, 3]); plt.savefig(io.BytesIO(), format='png')
"""


def shown(result):
    return [o["data"]["text/plain"] for o in result.structured_content["outputs"] if o["output_type"] == "display_data"]


async def test_a_script_shows_at_its_end_only_the_figures_it_did_not_save():
    async with connect(SANDBOX_FILES_DIR="") as client:
        script = await client.call_tool("run_python_ephemeral", {"code": SAVED_AND_OPEN, "dependencies": ["matplotlib"]})
        assert script.is_error is False, text_of(script)
        # plt.show()'s figure, then the one left open unsaved and the one saved to a buffer; those
        # saved to files come back as files.
        assert shown(script) == ["<Figure size 640x480 with 1 Axes>"] * 3, script.structured_content["outputs"]
        assert sorted(f["path"] for f in script.structured_content["files"] if not f["figure"]) == ["a.png", "b.png"]
        # A notebook's cell shows every figure still open at its end, saved or not, as Jupyter does.
        started = await client.call_tool("sandbox_initialize", {"dependencies": ["matplotlib"]})
        cid = started.structured_content["container_id"]
        cell = await client.call_tool("run_python", {"container_id": cid, "code": SAVED_AND_OPEN})
        assert cell.is_error is False, text_of(cell)
        assert shown(cell) == ["<Figure size 640x480 with 1 Axes>"] * 5, cell.structured_content["outputs"]
        # Nothing of the script's saves carries over to the next cell.
        again = await client.call_tool("run_python", {"container_id": cid, "code": "plt.plot([1, 1]); plt.savefig('d.png')"})
        assert shown(again) == ["<Figure size 640x480 with 1 Axes>"]
        await client.call_tool("sandbox_stop", {"container_id": cid})


SAVE_WITHOUT_REDRAW = """
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg
drawn = []
plain_draw = FigureCanvasAgg.draw
def counting_draw(self, *args, **kwargs):
    drawn.append(1)
    return plain_draw(self, *args, **kwargs)
FigureCanvasAgg.draw = counting_draw
fig = plt.figure()
plt.plot([0, 1], [1, 0])
plt.savefig('a.png')
print('draws for one save:', len(drawn))
after_save = bytes(fig.canvas.buffer_rgba())
fig.canvas.draw()
print('canvas as a redraw leaves it:', after_save == bytes(fig.canvas.buffer_rgba()))
plt.savefig('t.png', transparent=True)
print('opaque after a transparent save:', np.asarray(fig.canvas.buffer_rgba())[0, 0, 3] == 255)
events = []
fig.canvas.mpl_connect('draw_event', lambda event: events.append(1))
plt.savefig('b.png')
print('draw events for a save:', len(events))
"""


async def test_plt_savefig_leaves_out_only_a_redraw_that_changes_nothing():
    # matplotlib's plt.savefig draws the figure again after saving it; the sandbox leaves that
    # out when the save left the same picture on the canvas, and keeps it when it did not (a
    # transparent save) or when the code listens for draw events.
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool(
            "run_python_ephemeral", {"code": SAVE_WITHOUT_REDRAW, "dependencies": ["matplotlib", "numpy"]}
        )
        assert result.is_error is False, text_of(result)
        assert result.structured_content["stdout"].splitlines() == [
            "draws for one save: 1",
            "canvas as a redraw leaves it: True",
            "opaque after a transparent save: True",
            "draw events for a save: 2",
        ]


async def test_plt_show_alone_returns_the_figure():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": SINE_SHOW, "dependencies": ["matplotlib"]})
        assert result.is_error is False, text_of(result)
        [image] = images(result)
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        [figure] = result.structured_content["files"]
        assert figure["figure"] is True and figure["saved_to"] is None
        assert "non-interactive" not in result.structured_content["stderr"]


async def test_figures_work_without_matplotlib_installed():
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": "try:\n    import matplotlib\nexcept ImportError:\n    print('no matplotlib')"})
        assert result.structured_content["stdout"] == "no matplotlib\n"
        assert result.structured_content["files"] == []


async def test_a_csv_is_a_text_resource_and_a_zip_a_blob():
    code = (
        "import zipfile\n"
        "open('table.csv', 'w').write('a,b\\n1,2\\n')\n"
        "with zipfile.ZipFile('bundle.zip', 'w') as z:\n"
        "    z.writestr('inner.txt', 'inside')\n"
    )
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        by_uri = {str(r.uri): r for r in resources(result)}
        csv = by_uri["file:///workspace/table.csv"]
        assert csv.mime_type == "text/csv" and csv.text == "a,b\n1,2\n"
        zipped = by_uri["file:///workspace/bundle.zip"]
        assert zipped.mime_type == "application/zip"
        assert base64.b64decode(zipped.blob).startswith(b"PK\x03\x04")


async def test_two_ephemeral_runs_never_see_each_others_files():
    async with connect(SANDBOX_FILES_DIR="") as client:
        first = await client.call_tool("run_python_ephemeral", {"code": "open('secret.txt', 'w').write('run one')\nopen('/tmp/t', 'w').write('x')"})
        assert first.is_error is False
        second = await client.call_tool("run_python_ephemeral", {"code": "import os\nprint(os.listdir('.'), os.path.exists('/tmp/t'))"})
        assert second.structured_content["stdout"] == "[] False\n"


async def test_persistence_default_custom_and_off(tmp_path):
    code = "open('kept.txt', 'w').write('persisted')"
    # Default: per user, $XDG_STATE_HOME/python-code-sandbox/files/<run>/, created private.
    state = tmp_path / "state"
    async with connect(XDG_STATE_HOME=str(state)) as client:
        env_files = os.environ.get("SANDBOX_FILES_DIR")
        assert env_files is None, "the suite runs with the default persistence setting"
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        [kept] = result.structured_content["files"]
        assert kept["saved_to"].startswith(str(state / "python-code-sandbox" / "files" / "run-"))
        assert pathlib.Path(kept["saved_to"]).read_text() == "persisted"
        assert kept["saved_to"] in text_of(result)
        for private in (state, state / "python-code-sandbox", state / "python-code-sandbox" / "files"):
            assert private.stat().st_mode & 0o777 == 0o700, private
    # Custom directory.
    async with connect(SANDBOX_FILES_DIR=str(tmp_path)) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        [kept] = result.structured_content["files"]
        assert kept["saved_to"].startswith(str(tmp_path) + "/run-")
    # Off.
    async with connect(SANDBOX_FILES_DIR="") as client:
        result = await client.call_tool("run_python_ephemeral", {"code": code})
        [kept] = result.structured_content["files"]
        assert kept["saved_to"] is None and kept["returned"] is True


async def test_write_then_run_then_read_back():
    async with connect(SANDBOX_FILES_DIR="") as client:
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        written = await client.call_tool("sandbox_write_file", {"container_id": cid, "path": "input/numbers.txt", "content": "1 2 3"})
        assert written.is_error is False, text_of(written)
        ran = await client.call_tool("run_python", {"container_id": cid, "code": "n = sum(map(int, open('input/numbers.txt').read().split()))\nopen('output.txt', 'w').write(str(n))"})
        assert ran.is_error is False
        read = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": "output.txt"})
        [resource] = resources(read)
        assert resource.text == "6"
        binary = base64.b64encode(PNG_MAGIC + b"not really").decode()
        await client.call_tool("sandbox_write_file", {"container_id": cid, "path": "blob.bin", "content_base64": binary})
        listed = await client.call_tool("sandbox_list_files", {"container_id": cid})
        names = {e["name"]: e for e in listed.structured_content["entries"]}
        assert set(names) == {"input", "output.txt", "blob.bin"}
        assert names["input"]["kind"] == "directory" and names["blob.bin"]["size"] == 18
        for bad in ("../etc/passwd", "/etc/passwd", "input/../../x"):
            refused = await client.call_tool("sandbox_write_file", {"container_id": cid, "path": bad, "content": "x"})
            assert refused.is_error is True and "not a path inside /workspace" in text_of(refused)
        missing = await client.call_tool("sandbox_read_file", {"container_id": cid, "path": "nope.txt"})
        assert missing.is_error is True


async def test_dependencies_install_once_and_report_it():
    async with connect(SANDBOX_FILES_DIR="") as client:
        args = {"code": "import six\nprint(six.__version__)", "dependencies": ["six==1.16.0"]}
        first = await client.call_tool("run_python_ephemeral", args)
        assert first.structured_content["stdout"] == "1.16.0\n", text_of(first)
        second = await client.call_tool("run_python_ephemeral", args)
        deps = second.structured_content["dependencies"]
        # A sandbox prepared for the set learned from the first call may serve the second.
        assert deps == {"requirements": ["six==1.16.0"], "installed": False, "prepared": deps["prepared"]}, deps
        assert deps["prepared"] in (True, False), deps
        assert "from the cache" in text_of(second)
        refused = await client.call_tool("run_python_ephemeral", {"code": "print(1)", "dependencies": ["numpy; rm -rf /"]})
        assert refused.is_error is True and "numpy; rm -rf /" in text_of(refused)


ATTACKS = """
import os
os.symlink('/etc/passwd', 'leak.txt')
os.symlink('/', 'root')
os.mkfifo('pipe')
try:
    os.link('/etc/passwd', 'hard.txt')
except OSError as e:
    print('hard link refused:', e.strerror)
open('...', 'w').write('dots')
open('big.bin', 'wb').write(b'0' * (3 << 20))
os.mkdir('many')
for i in range(12000):  # past the 10,000 entries a result tracks
    with open(f'many/{i:06d}', 'w') as f:
        f.write('x')
print('done')
"""


async def test_copy_out_attacks_leak_nothing(tmp_path):
    env = dict(SANDBOX_FILES_DIR=str(tmp_path), SANDBOX_FILES_MAX_FILE="1m", SANDBOX_FILES_MAX_COUNT="20", SANDBOX_TIMEOUT="180s")
    async with connect(**env) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": ATTACKS})
        assert "done" in result.structured_content["stdout"], text_of(result)
        files = {f["path"]: f for f in result.structured_content["files"]}
        for path, why in (("leak.txt", "symbolic link"), ("root", "symbolic link"), ("pipe", "special file"), ("big.bin", "larger than")):
            assert files[path]["returned"] is False and files[path]["saved_to"] is None, path
            assert why in files[path]["note"], files[path]
        assert sum(1 for f in files.values() if f["saved_to"]) <= 20
        assert any("not tracked" in (f["note"] or "") for f in files.values())
        # Nothing from the host or the container's system reached the client or the disk, and
        # nothing was written outside the run's directory.
        for block in result.content:
            payload = getattr(block, "text", None) or getattr(getattr(block, "resource", None), "text", None) or ""
            assert "root:x:0:0" not in payload
        runs = list(tmp_path.iterdir())
        assert len(runs) == 1 and runs[0].name.startswith("run-")
        for path in tmp_path.rglob("*"):
            assert not path.is_symlink(), path
            if path.is_file():
                assert b"root:x:0:0" not in path.read_bytes(), path


async def test_sandbox_stop_keeps_the_saved_files_as_its_description_says(tmp_path):
    """The saved files are the user's results (a path a result gave): stopping the session removes
    its sandbox, not them; the tool's description says so, and names the retention."""
    async with connect(SANDBOX_FILES_DIR=str(tmp_path), SANDBOX_FILES_MAX_AGE="3d") as client:
        [stop] = [t for t in (await client.list_tools()).tools if t.name == "sandbox_stop"]
        assert "stay there" in stop.description and str(tmp_path) in stop.description, stop.description
        assert "kept 3days" in stop.description, stop.description
        assert "delete its sandbox and files" not in stop.description
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        result = await client.call_tool("run_python", {"container_id": cid, "code": "open('result.txt', 'w').write('the answer')"})
        assert result.is_error is False, text_of(result)
        [saved] = result.structured_content["files"]
        saved = pathlib.Path(saved["saved_to"])
        assert saved.is_relative_to(tmp_path) and saved.parent.name.startswith("session-")
        stopped = await client.call_tool("sandbox_stop", {"container_id": cid})
        assert stopped.is_error is False and stopped.structured_content["stopped"] is True
        assert "the files it saved stay on the host" in text_of(stopped)
        assert saved.read_text() == "the answer"
        gone = await client.call_tool("run_python", {"container_id": cid, "code": "print(1)"})
        assert gone.is_error is True
    # And after the server is gone: still there (nothing is removed at exit).
    assert saved.read_text() == "the answer"
