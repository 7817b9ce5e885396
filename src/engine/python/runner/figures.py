# Matplotlib figures an execution showed (plt.show) or left open, sent to the host as PNG.

import io
import sys
import warnings

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


class PyplotHook:
    """When the code imports matplotlib.pyplot, make plt.show() hand the figures to the host
    (the Agg backend cannot show anything). Nothing happens when matplotlib is not installed.
    A meta path finder needs only find_spec: importlib.abc's base class would cost the runner's
    start importlib.resources, pathlib and more (about a third of its imports)."""

    def __init__(self, figures):
        self.figures = figures

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        figures = self.figures
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                original = spec.loader.exec_module

                def exec_module(module, original=original):
                    original(module)
                    module.show = lambda *args, **kwargs: figures.capture(module)
                    # Remember which figures the code saved itself (they are not sent twice).
                    figure_class = sys.modules["matplotlib.figure"].Figure
                    savefig = figure_class.savefig

                    def marking_savefig(self, *args, **kwargs):
                        self._sandbox_saved = True
                        return savefig(self, *args, **kwargs)

                    figure_class.savefig = marking_savefig

                spec.loader.exec_module = exec_module
                return spec
        return None


def install():
    """Hooks matplotlib.pyplot for this process; returns the Figures its plt.show() fills."""
    figures = Figures()
    sys.meta_path.insert(0, PyplotHook(figures))
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    return figures
