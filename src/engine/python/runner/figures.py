# Matplotlib as a notebook has it: its inline backend (matplotlib-inline, the package ipykernel
# uses, from the runner's IPython set) is the backend unless the code chose one (MPLBACKEND), as
# ipykernel makes it. So figures are shown as Jupyter shows them: as displays, by plt.show() and
# at the end of a cell (closed then), cropped to what is drawn (`bbox_inches="tight"`), in the
# formats `InlineBackend.figure_formats` names (`%config`, `set_matplotlib_formats`), with
# `<Figure size 640x480 with 1 Axes>` as their text. `%matplotlib inline` is IPython's own.
#
# What is the sandbox's own: the PNG of each figure displayed is also kept as a figure of the
# result (`figures/figure-N.png`, saved where the server saves files; bounded), plt.savefig
# leaves out a redraw that cannot change anything (below), and a script (run_python_ephemeral,
# the CLI's `run`: a program, not a notebook's cell) does not show again at its end a figure it
# saved to a file: that file is the figure's picture, returned once, as `python` would leave it
# (which shows nothing at a script's end), without a second rendering of the same figure.

import base64
import functools
import os
import sys
import weakref

from . import after_import
from .workspace import WORKSPACE

MAX_FIGURES = 8
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_FIGURES_BYTES = 16 << 20
# The backend ipykernel sets (MPLBACKEND) for the code's matplotlib.
INLINE = "module://matplotlib_inline.backend_inline"


class Figures:
    """The PNG images of the figures an execution displayed, within their bounds."""

    def __init__(self):
        self.captured = []
        self.size = 0

    def note(self, png):
        if len(self.captured) < MAX_FIGURES and self.size + len(png) <= MAX_FIGURES_BYTES:
            self.captured.append(png)
            self.size += len(png)

    def take(self):
        captured, self.captured, self.size = self.captured, [], 0
        return captured


# The settings file matplotlib read at its import (for read_settings_again).
read_at_import = []


def choose_inline(matplotlib):
    """Once matplotlib is imported: its backend is the inline one unless the code set MPLBACKEND
    (ipykernel sets it in its environment; here it is left unset, so that a subprocess, which
    cannot show a figure inline, gets matplotlib's own choice: Agg, without a screen)."""
    if "MPLBACKEND" not in os.environ:
        matplotlib.rcParams["backend"] = INLINE
    try:
        read_at_import[:] = [matplotlib.matplotlib_fname()]
    except Exception:
        pass


def read_settings_again(matplotlib):
    """A matplotlib imported ahead (prepared.py), given back at the code's first import: what its
    import reads from the process, read again as the code left it (a `matplotlibrc` in the
    working directory or named by MATPLOTLIBRC, and MPLBACKEND), as a cold import would."""
    try:
        fname = matplotlib.matplotlib_fname()
        if read_at_import and fname != read_at_import[0]:
            matplotlib.rc_file(fname)
        if os.environ.get("MPLBACKEND"):
            matplotlib.rcParams["backend"] = os.environ["MPLBACKEND"]
    except Exception:
        pass  # an unreadable file or an unknown backend: matplotlib says so when it is used


def noting_figures(formatter, figures):
    """Wraps IPython's display formatter: the PNG a matplotlib Figure is shown as is kept too."""
    original = formatter.format

    def format(obj, include=None, exclude=None):
        data, metadata = original(obj, include=include, exclude=exclude)
        try:
            figure_class = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
            png = data.get("image/png") if isinstance(data, dict) else None
            if figure_class is not None and isinstance(obj, figure_class) and png is not None:
                # IPython's figure formatter gives base64 text (bytes from other formatters); a
                # formatter of the code's may give anything: only a PNG is kept as a figure.
                png = png if isinstance(png, bytes) else base64.b64decode(png)
                if png.startswith(PNG_SIGNATURE):
                    figures.note(png)
        except Exception:
            pass  # only a copy for the result's files: the display itself stands
        return data, metadata

    formatter.format = format


def patch_pyplot(pyplot):
    pyplot.savefig = without_redundant_redraw(pyplot, pyplot.savefig)


# Formats the Agg canvas itself renders when it saves (no other backend's canvas is switched in).
AGG_FORMATS = ("png", "jpg", "jpeg")
# savefig's keywords that do not change what is drawn on the canvas.
INERT_KEYWORDS = ("format", "metadata", "pil_kwargs")


def without_redundant_redraw(pyplot, original):
    """plt.savefig as matplotlib writes it saves the figure, then draws it again on its canvas
    (`draw_idle`, to refresh an interactive window after a save with other colours). On the Agg
    canvas draw_idle draws at once, and the second drawing costs as much as the save: a third of
    the plot prompt's CPU time. When the save drew on the same canvas exactly what the redraw would
    draw (an Agg format, the figure's own dpi and colours, no tight bounding box) and nothing listens
    for draw events, the canvas already holds that picture: the redraw is left out. Otherwise
    matplotlib's own savefig runs."""

    def savefig(*args, **kwargs):
        figure = pyplot.gcf()
        try:
            redundant = redraw_is_redundant(pyplot, figure, args, kwargs)
        except Exception:
            redundant = False
        if not redundant:
            return original(*args, **kwargs)
        return figure.savefig(*args, **kwargs)

    savefig.__doc__ = original.__doc__
    savefig.__wrapped__ = original
    return savefig


def redraw_is_redundant(pyplot, figure, args, kwargs):
    if len(args) != 1 or any(key not in INERT_KEYWORDS for key in kwargs):
        return False
    if type(figure.canvas).__name__ != "FigureCanvasAgg":
        return False
    callbacks = getattr(figure.canvas.callbacks, "callbacks", None)
    if not isinstance(callbacks, dict) or callbacks.get("draw_event"):
        return False
    rc = pyplot.rcParams
    if rc["savefig.dpi"] != "figure" and rc["savefig.dpi"] != figure.dpi:
        return False
    if rc["savefig.transparent"] or rc["savefig.bbox"] is not None:
        return False
    if rc["savefig.facecolor"] != "auto" or rc["savefig.edgecolor"] != "auto":
        return False
    file_format = kwargs.get("format")
    if file_format is None:
        target = args[0]
        if isinstance(target, (str, os.PathLike)):
            file_format = os.path.splitext(os.fspath(target))[1][1:] or None
        if file_format is None:
            file_format = rc["savefig.format"]
    return isinstance(file_format, str) and file_format.lower() in AGG_FORMATS


def noting_saves(saved):
    """A hook for matplotlib.figure: Figure.savefig (which plt.savefig calls) notes the figure
    it saved to a file of the workspace (which comes back to the client), in `saved`, a set that
    keeps no figure alive. A figure saved elsewhere (a buffer, /tmp) is not noted: it is shown."""

    def hook(module):
        original = module.Figure.savefig

        @functools.wraps(original)
        def savefig(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            try:
                target = args[0] if args else kwargs.get("fname")
                if isinstance(target, (str, os.PathLike)):
                    path = os.path.abspath(os.fspath(target))
                    if isinstance(path, str) and path.startswith(WORKSPACE + "/"):
                        saved.add(self)
            except Exception:
                pass  # a figure of a class that cannot be noted (unhashable): it is shown
            return result

        module.Figure.savefig = savefig

    return hook


def closing_saved(shell, saved):
    """Run after each execution, before the inline backend shows the figures still open: at the
    end of a script, the figures it saved are closed, so that their files alone return them."""

    def post_execute():
        try:
            pyplot = sys.modules.get("matplotlib.pyplot")
            if shell.running_script and pyplot is not None:
                for figure in list(saved):
                    pyplot.close(figure)
        except Exception:
            pass  # then the figure is shown, as a notebook's cell would show it
        finally:
            saved.clear()

    return post_execute


def install(shell):
    """Matplotlib's inline backend for the code; returns the Figures its displays fill."""
    figures = Figures()
    after_import.on_import("matplotlib", choose_inline)
    after_import.on_import("matplotlib.pyplot", patch_pyplot)
    saved = weakref.WeakSet()
    after_import.on_import("matplotlib.figure", noting_saves(saved))
    if shell is not None:
        noting_figures(shell.display_formatter, figures)
        # Registered before any backend: the inline one's flush comes after it.
        shell.events.register("post_execute", closing_saved(shell, saved))
    return figures
