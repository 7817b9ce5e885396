# Matplotlib figures an execution showed (plt.show) or left open, sent to the host as PNG.

import io
import sys
import warnings

from . import after_import

MAX_FIGURES = 8
MAX_FIGURES_BYTES = 16 << 20


class Figures:
    """Matplotlib figures an execution showed (plt.show) or left open, as PNG bytes."""

    def __init__(self):
        self.captured = []
        self.size = 0
        # The running execution's outputs (display.Outputs): a figure is also a display there.
        self.outputs = None

    def capture(self, pyplot, skip_saved=False):
        try:
            for number in pyplot.get_fignums():
                if len(self.captured) >= MAX_FIGURES:
                    break
                figure = pyplot.figure(number)
                if skip_saved and getattr(figure, "_sandbox_saved", False):
                    continue  # already written to a file, which comes back as such
                buffer = io.BytesIO()
                figure.savefig(buffer, format="png")
                data = buffer.getvalue()
                if self.size + len(data) <= MAX_FIGURES_BYTES:
                    self.captured.append(data)
                    self.size += len(data)
                    if self.outputs is not None:
                        self.outputs.image(data)
            pyplot.close("all")
        except Exception:
            pass

    def take(self):
        captured, self.captured, self.size = self.captured, [], 0
        return captured


def patch_pyplot(figures):
    """The hook run once matplotlib.pyplot is imported: plt.show() hands the figures to the host
    (the Agg backend cannot show anything), figures the code saves itself are marked (they come
    back as files, not twice), and plt.savefig skips a redraw that cannot change anything."""

    def patch(pyplot):
        pyplot.show = lambda *args, **kwargs: figures.capture(pyplot)
        figure_class = sys.modules["matplotlib.figure"].Figure
        savefig = figure_class.savefig

        def marking_savefig(self, *args, **kwargs):
            self._sandbox_saved = True
            return savefig(self, *args, **kwargs)

        figure_class.savefig = marking_savefig
        pyplot.savefig = without_redundant_redraw(pyplot, pyplot.savefig)

    return patch


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
    import os

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


def install():
    """Hooks matplotlib.pyplot for this process; returns the Figures its plt.show() fills."""
    figures = Figures()
    after_import.on_import("matplotlib.pyplot", patch_pyplot(figures))
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    return figures
