# The IPython shell every execution of code runs in (execute.py calls its run_cell): one
# InteractiveShell for the runner's life, made before the runner says ready, whose user_ns is the
# session's namespace. What IPython would show on a terminal goes to the execution's outputs
# instead (display.py): its display publisher and display hook feed them, its tracebacks become
# `error` outputs. Made to suit a sandbox: no history database and no copy of the streams in its
# history (below), no colours, no autocall, its directory under /tmp; `!cmd` runs /bin/sh as the sandbox's user with the captured streams;
# `%pip` and `!pip` go to the server's installer (pip.py); `input()` fails at once; `kernel` and
# `parent_header` serve code written for a Jupyter kernel (kernel.py).

import builtins
import contextlib
import os
import re
import shlex
import subprocess
import sys

from . import compiler as cell_compiler
from . import kernel as kernel_face

# How IPython's traceback names a frame of the runner's own code (load_runner.py names them).
RUNNER_FRAME = "File <sandbox-runner"
# Where IPython keeps its profile (never the workspace, which the code's results are made of).
IPYTHON_DIR = "/tmp/.ipython"



class Exited(BaseException):
    """exit() or quit(): the execution ends with the status `code`, quietly. ipykernel's exit()
    shuts its kernel down after the cell, without an error; a sandbox stays, so the execution
    just ends. Not a SystemExit: IPython shows a SystemExit as an error and warns that a terminal
    would have exited (as ipykernel does for sys.exit and `raise SystemExit`)."""

    def __init__(self, code=None):
        super().__init__(code)
        self.code = code


# ipykernel's words when its frontend does not take input (nbclient's), so that code that reads
# them finds what a notebook gives (docs/tools.md says what to do instead).
INPUT_MESSAGE = "%s was called, but this frontend does not support input requests."
CONDA_MESSAGE = (
    "%%%s is not available in the sandbox: install packages with %%pip install NAME, which goes "
    "through the server's installer"
)
MATPLOTLIB_MESSAGE = (
    "The sandbox has no screen: %s is ignored, figures are shown inline (matplotlib's inline "
    "backend)"
)
# Matplotlib's backends that need no screen (`%matplotlib NAME` passes them to IPython).
DRAWING_BACKENDS = ("inline", "agg", "svg", "pdf", "ps", "cairo", "template")
# What IPython's input transformers act on (escapes and magics, help, prompts pasted with the
# code, a cell's leading indentation or empty lines): a cell with none of it, and not a single
# line IPython's prefilter would treat as a magic (automagic) or macro, is plain Python, and
# run_cell skips the transformers, which cost most of its own time (tokenizing every cell).
IPYTHON_SYNTAX = re.compile(r"[%!?]|>>>|\]:|\.\.\.:|^[ \t]*[,;/]", re.M)
FIRST_WORD = re.compile(r"\s*([\w*.]+)")
# Python executables whose `-m pip` goes to the installer; the first word of a command, its
# directory stripped.
PYTHON_NAMES = ("python", "python3", os.path.basename(sys.executable or "python3"))


def pip_arguments(command):
    """The text after `pip` when a shell command runs pip (`pip ...`, `pip3 ...`, `python -m pip
    ...`, `python3 -m pip ...`, with or without a directory), else None."""
    stripped = command.strip()
    try:
        words = shlex.split(stripped)
    except ValueError:
        words = stripped.split()
    if not words:
        return None
    first = os.path.basename(words[0])
    if first in ("pip", "pip3") or (first.startswith("pip3.") and first[5:].isdigit()):
        skip = 1
    elif (first in PYTHON_NAMES or first.startswith("python3.")) and words[1:3] == ["-m", "pip"]:
        skip = 3
    else:
        return None
    # The rest of the command's own text (not re-joined words), so the installer sees what was
    # written, shell syntax included, and can refuse it by name.
    rest = stripped
    for _ in range(skip):
        rest = rest.lstrip()
        rest = rest[len(rest.split(None, 1)[0]) :]
    return rest.strip()


def run_pip(line):
    """`line` (what follows `pip`) through the server's installer."""
    try:
        from . import pip as pip_client
    except ImportError as exc:
        print(
            "pip is not available in this sandbox yet: the runner has no installer client (%s)" % exc,
            file=sys.stderr,
        )
        return 1
    return pip_client.run(line)


def make_shell_class(IPython):
    """The InteractiveShell subclass, made once IPython is imported (from its set)."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.autocall import IPyAutocall
    from IPython.core.compilerop import CachingCompiler
    from IPython.core.error import StdinNotImplementedError, UsageError
    from IPython.core.macro import Macro
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.text import LSString, SList
    from traitlets import Type

    class Publisher(DisplayPublisher):
        """display(), update_display() and clear_output() into the running execution's outputs."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            __tracebackhide__ = True
            outputs = self.shell.outputs
            if outputs is None:
                # A thread of the code that outlived its execution: plain text, as a terminal shows.
                if isinstance(data, dict) and isinstance(data.get("text/plain"), str):
                    print(data["text/plain"])
                return
            display_id = transient.get("display_id") if isinstance(transient, dict) else None
            if update:
                outputs.update(data, metadata, display_id)
            else:
                outputs.display(data, metadata, display_id)

        def clear_output(self, wait=False):
            __tracebackhide__ = True
            outputs = self.shell.outputs
            if outputs is not None:
                outputs.clear(bool(wait))

    class ResultHook(DisplayHook):
        """The last expression's value as an `execute_result` (the base class keeps Out, _, __, _N)."""

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            __tracebackhide__ = True
            outputs = self.shell.outputs
            if outputs is not None:
                outputs.result(format_dict, md_dict, self.prompt_count)

        def log_output(self, format_dict):
            pass  # no second copy of every value's bundle in the history

        def finish_displayhook(self):
            self._is_active = False

    def no_input(prompt=""):
        __tracebackhide__ = True
        raise StdinNotImplementedError(INPUT_MESSAGE % "raw_input")

    def no_getpass(prompt="Password: ", stream=None):
        __tracebackhide__ = True
        raise StdinNotImplementedError(INPUT_MESSAGE % "getpass")

    class SandboxShell(InteractiveShell):
        displayhook_class = Type(ResultHook)
        display_pub_class = Type(Publisher)
        # Cells named as ipykernel names them (compiler.py).
        compiler_class = Type(cell_compiler.compiler_class(CachingCompiler))

        def __init__(self, **kwargs):
            # The running execution's outputs (display.Outputs), and what receives a traceback:
            # set by execute.py around each run_cell.
            self.outputs = None
            self.on_traceback = None
            # A script is running (execute.py): a SystemExit is its exit status only, quietly,
            # and the figures it saved are not shown again at its end (figures.py).
            self.running_script = False
            super().__init__(**kwargs)
            # What code written for a Jupyter kernel publishes through (kernel.py).
            self.kernel = kernel_face.Kernel(self)
            # exit() and quit() end the execution quietly (Exited), not a terminal session:
            # IPython's own exiter only asks its terminal to stop.
            exiter = Exit()
            for name in ("exit", "quit"):
                self.user_ns[name] = exiter
                self.user_ns_hidden[name] = exiter
            self.set_hook("show_in_pager", show_in_pager)
            self.register_magic_function(self.pip_magic, "line", "pip")
            self.register_magic_function(self.uv_magic, "line", "uv")
            for name in ("conda", "mamba", "micromamba"):
                self.register_magic_function(refuse(name), "line", name)
            self.init_transformers_snapshot()

        @property
        def parent_header(self):
            """ipykernel's header of the request being run: here there is no request message."""
            return {}

        def init_transformers_snapshot(self):
            manager = self.input_transformer_manager
            self.default_transformers = (
                list(manager.cleanup_transforms),
                list(manager.line_transforms),
                list(manager.token_transformers),
            )

        def plain_python(self, cell):
            """True when IPython's transformers would leave `cell` as it is (see IPYTHON_SYNTAX)."""
            if not cell or cell[0] in " \t\r\n\f\v" or IPYTHON_SYNTAX.search(cell):
                return False
            manager = self.input_transformer_manager
            if self.input_transformers_post or self.default_transformers != (
                manager.cleanup_transforms,
                manager.line_transforms,
                manager.token_transformers,
            ):
                return False  # the code or an extension added transformers of its own
            if "\n" not in cell.rstrip("\n"):
                # One line: IPython's prefilter may take its first word as a magic or a macro.
                word = FIRST_WORD.match(cell)
                if word is not None:
                    name = word.group(1)
                    if self.automagic and name in self.magics_manager.magics["line"]:
                        return False
                    value = self.user_ns.get(name)
                    if value is not None and isinstance(value, (Macro, IPyAutocall)):
                        return False
            return True

        def transform_cell(self, raw_cell):
            if self.plain_python(raw_cell):
                return raw_cell if raw_cell.endswith("\n") else raw_cell + "\n"
            return super().transform_cell(raw_cell)

        def should_run_async(self, raw_cell, *, transformed_cell=None, preprocessing_exc_tuple=None):
            # Only a cell that says await (or async for/with) needs the event loop; asking IPython
            # costs one more compilation of every cell.
            cell = transformed_cell if transformed_cell is not None else raw_cell
            if "await" not in cell and "async" not in cell:
                return False
            return super().should_run_async(
                raw_cell, transformed_cell=transformed_cell, preprocessing_exc_tuple=preprocessing_exc_tuple
            )

        def init_virtualenv(self):
            pass  # the sandbox's Python is the one that runs; no virtualenv to adopt

        @contextlib.contextmanager
        def _tee(self, channel):
            # IPython 9 copies each write to sys.stdout and sys.stderr into its history (for
            # `%notebook`) through a Python wrapper of the stream's `write`, for the whole run of
            # every cell. Printing then costs several Python calls a write (2,000,000 lines took
            # 17 s instead of 2.7 s, on the host), and the copy keeps every piece printed, a list
            # entry each, for the session's life, without bound (2,000,000 lines: ~170 MB). The
            # host keeps the outputs, within their limits: the sandbox keeps no copy.
            yield

        def showtraceback(self, exc_tuple=None, filename=None, tb_offset=None, exception_only=False,
                          running_compiled_code=False):
            __tracebackhide__ = True
            if exc_tuple is None:
                exc_type = sys.exc_info()[0]
            else:
                exc_type = exc_tuple[0]
            if exc_type is not None and (
                issubclass(exc_type, Exited) or self.running_script and issubclass(exc_type, SystemExit)
            ):
                return  # exit(), or a script's SystemExit: its exit status, not an error (execute.py)
            return super().showtraceback(exc_tuple, filename, tb_offset, exception_only,
                                         running_compiled_code)

        def _showtraceback(self, etype, evalue, stb):
            # The runner's own frames (input() failing, say) are not the code's: each frame is
            # one entry, named by its file.
            stb = [entry for entry in stb if not (isinstance(entry, str) and entry.startswith(RUNNER_FRAME))]
            text = self.InteractiveTB.stb2text(stb)
            if self.on_traceback is not None:
                self.on_traceback(etype, evalue, stb, text)
            else:
                print(text, file=sys.stderr)

        def system(self, cmd):
            """`!cmd`: /bin/sh -c as the sandbox's user, on the execution's stdout and stderr;
            pip through the installer. The status is in `_exit_code`, as IPython keeps it."""
            __tracebackhide__ = True
            command = self.var_expand(cmd, depth=1)
            pip_line = pip_arguments(command)
            if pip_line is not None:
                status = run_pip(pip_line)
            else:
                # An interrupt (the host's, a timeout) ends the command and the cell, unlike
                # IPython's terminal, which goes on with the next line.
                try:
                    status = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL).returncode
                except KeyboardInterrupt:
                    raise KeyboardInterrupt from None  # subprocess's frames are not the code's
            if isinstance(status, int) and status < 0:
                status = 128 - status  # killed by a signal, as a shell reports it
            self.user_ns["_exit_code"] = status if isinstance(status, int) else 0
            if self.system_raise_on_error and status:
                raise subprocess.CalledProcessError(status, cmd)

        def getoutput(self, cmd, split=True, depth=0):
            """`x = !cmd`: the command's stdout and stderr, as lines (IPython's SList)."""
            __tracebackhide__ = True
            command = self.var_expand(cmd, depth=depth + 1)
            completed = subprocess.run(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.user_ns["_exit_code"] = completed.returncode
            if self.system_raise_on_error and completed.returncode:
                raise subprocess.CalledProcessError(completed.returncode, cmd)
            text = completed.stdout.decode("utf-8", "replace")
            return SList(text.splitlines()) if split else LSString(text)

        def enable_matplotlib(self, gui=None):
            """%matplotlib: IPython's own, for the inline backend and the ones that draw into
            files; a backend that needs a screen is refused for the inline one."""
            if gui == "auto":
                gui = None
            if gui is not None and gui not in DRAWING_BACKENDS:
                print(MATPLOTLIB_MESSAGE % ("%matplotlib " + str(gui)), file=sys.stderr)
                gui = "inline"
            return super().enable_matplotlib(gui)

        def enable_gui(self, gui=None):
            pass  # no screen and no event loop to join: the backends above need none

        def pip_magic(self, line):
            """%pip: the server's installer (not the sandbox's pip, which has no network)."""
            status = run_pip(line)
            self.user_ns["_exit_code"] = status if isinstance(status, int) else 0

        def uv_magic(self, line):
            words = line.split(None, 1)
            if words and words[0] == "pip":
                return self.pip_magic(words[1] if len(words) > 1 else "")
            raise UsageError(CONDA_MESSAGE % "uv")

    class Exit:
        def __repr__(self):
            return "Use exit() or quit() to end the execution"

        def __call__(self, code=None):
            raise Exited(code)

    def refuse(name):
        def magic(line):
            raise UsageError(CONDA_MESSAGE % name)

        magic.__name__ = name
        return magic

    def show_in_pager(self, data, start=0, screen_lines=0):
        # `?` and `??`: what a pager would show, on stdout.
        text = data.get("text/plain", "") if isinstance(data, dict) else data
        if not isinstance(text, str):
            text = str(text)
        lines = text.splitlines()
        print("\n".join(lines[max(0, int(start or 0)) :]))

    for cls in (Publisher, ResultHook, SandboxShell):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    # What libraries look for to know they run in a Jupyter kernel (pandas' in_ipython_frontend
    # looks for "zmq" in the shell's type; others for this name): the code's results are shown as
    # a notebook shows them, so they should format for one.
    SandboxShell.__name__ = SandboxShell.__qualname__ = "ZMQInteractiveShell"
    SandboxShell.no_input = staticmethod(no_input)
    SandboxShell.no_getpass = staticmethod(no_getpass)
    return SandboxShell


def _no_getpass_on(shell):
    def hook(module):
        module.getpass = shell.no_getpass

    return hook


def create(IPython):
    """The runner's shell (IPython's singleton instance, which get_ipython() returns)."""
    from traitlets.config import Config

    from . import after_import

    os.environ["IPYTHONDIR"] = IPYTHON_DIR
    config = Config()
    config.HistoryManager.enabled = False
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.autocall = 0
    config.InteractiveShell.xmode = "Context"
    shell_class = make_shell_class(IPython)
    shell = shell_class.instance(config=config, ipython_dir=IPYTHON_DIR)
    # A terminal shell formats values as text only; a notebook's frontend takes every form.
    formatter = shell.display_formatter
    formatter.active_types = list(formatter.format_types)
    builtins.input = shell.no_input
    if "getpass" in sys.modules:
        sys.modules["getpass"].getpass = shell.no_getpass
    else:
        after_import.on_import("getpass", _no_getpass_on(shell))
    return shell


# Cells run once before the runner says ready: a shell's first cells cost several milliseconds each
# (IPython's lazy imports and caches on the way of a statement, a print, a value), which a pooled
# sandbox pays here instead of on its first call.
WARM_UP = ("pass", "print(end='')", "0")


def warm(shell):
    """Runs WARM_UP as cells (their output goes nowhere: no execution is running), then puts the
    count, the input and output caches and their names back as a new shell has them."""
    count = shell.execution_count
    namespace, hidden = shell.user_ns, shell.user_ns_hidden
    names = ("_", "__", "___", "_i", "_ii", "_iii")
    kept = {name: namespace[name] for name in names if name in namespace}
    kept_hidden = {name: hidden[name] for name in names if name in hidden}
    for cell in WARM_UP:
        shell.run_cell(cell, store_history=True)
    shell.execution_count = count
    history = shell.history_manager
    del history.input_hist_parsed[1:]
    del history.input_hist_raw[1:]
    history.output_hist.clear()
    history.output_hist_reprs.clear()
    history.db_input_cache.clear()
    history.db_output_cache.clear()
    for space, before in ((namespace, kept), (hidden, kept_hidden)):
        for name in [n for n in space if isinstance(n, str) and re.fullmatch(r"_i?\d+", n)]:
            del space[name]
        for name in names:
            if name in before:
                space[name] = before[name]
            else:
                space.pop(name, None)
    hook = shell.displayhook
    hook._ = hook.__ = hook.___ = ""

