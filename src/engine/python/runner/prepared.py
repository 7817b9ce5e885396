# What a dependency set brings prepared (python/prepare_set.py made it when the set was installed),
# put to use in this sandbox, and a prepared sandbox's imports done before its first request.

import importlib
import json
import os
import sys

# Imported by every runner, prepared or not: its presence tells nothing.
from . import ahead, figures

PREPARED = ".pcs-prepared"
MAX_MANIFEST = 64 << 10
MAX_FONT_CACHE = 16 << 20


def read_bounded(path, limit):
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError("too large")
    return data


def use_set(directory):
    """Copies the set's prebuilt matplotlib font cache into MPLCONFIGDIR (writable, in /tmp), so a
    fresh process reads it instead of scanning every font. Paths in it that name where the set was
    staged are rewritten to where it is mounted. Nothing happens without one; nothing fails."""
    try:
        manifest = json.loads(read_bounded(os.path.join(directory, PREPARED, "prepared.json"), MAX_MANIFEST))
        name = manifest.get("matplotlib")
        config = os.environ.get("MPLCONFIGDIR")
        if not name or not config or "/" not in name:
            return
        target = os.path.join(config, os.path.basename(name))
        if os.path.exists(target):
            return  # matplotlib's own (rebuilt or written by an earlier set) wins
        text = read_bounded(os.path.join(directory, PREPARED, name), MAX_FONT_CACHE).decode("utf-8")
        prefix = manifest.get("prefix")
        if isinstance(prefix, str) and prefix.startswith("/"):
            text = text.replace(json.dumps(prefix + "/")[:-1], json.dumps(directory + "/")[:-1])
        os.makedirs(config, exist_ok=True)
        temp = target + ".tmp-%d" % os.getpid()
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, target)
    except Exception:
        pass  # matplotlib builds its cache itself, as without a prepared set


# Submodules imported with a distribution's top-level modules: the ones code imports first and
# that cost the most (matplotlib.pyplot is most of matplotlib's import time).
SUBMODULES = {"matplotlib": ["matplotlib.pyplot"]}
DEPS_ROOT = "/opt/deps/"
MAX_MODULES = 64


def normalize(name):
    return "".join("-" if c in "_." else c for c in name.lower())


def top_level(directory, dist_info):
    """The importable top-level names a distribution installed: its top_level.txt, else the
    first components of the paths in its RECORD."""
    names = []
    try:
        text = read_bounded(os.path.join(directory, dist_info, "top_level.txt"), MAX_MANIFEST).decode()
        names = text.split()
    except Exception:
        try:
            record = read_bounded(os.path.join(directory, dist_info, "RECORD"), 16 << 20).decode()
        except Exception:
            return []
        for line in record.splitlines():
            first = line.split(",", 1)[0].split("/", 1)[0]
            if first.endswith(".py"):
                first = first[:-3]
            names.append(first)
    kept = []
    for name in names:
        if name.isidentifier() and not name.startswith("_") and name not in kept:
            kept.append(name)
    return kept


def warm_pyplot(pyplot):
    """Draws and encodes one small figure outside pyplot: the first figure of a process costs
    about twice the next (fonts loaded, renderer and PNG encoder set up), and that first one would
    otherwise be the code's. pyplot never sees it: no figure number is taken and no backend is
    chosen ahead (pyplot chooses the inline one at the code's first figure, as in a cold sandbox)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure()
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([0, 1, 2], [0, 1, 0])
    axes.set_title("warm-up")
    canvas.print_png(io.BytesIO())
    # Pillow loads its common format plugins at its first save, once per process: left for the
    # code's first save, as in a cold sandbox (they are hidden, and given back then).
    image = sys.modules.get("PIL.Image")
    if getattr(image, "_initialized", None) == 1:
        image._initialized = 0


# Work done once a module is imported, so that the code's first use is not the process's first.
WARM_UPS = {"matplotlib.pyplot": warm_pyplot}
# What a module's import reads from the process (files, the environment), read again when the
# code imports it.
READ_AGAIN = {"matplotlib": figures.read_settings_again}


def preload(request):
    """Imports the top-level modules of the requested distributions, as found in the dependency
    sets on sys.path (never into the code's namespace), then hides them (ahead.py): the code's
    first `import` of one gives it back with what its cold import would have brought, without
    running anything. A module that fails to import is left out."""
    wanted = {normalize(str(n)) for n in (request.get("distributions") or [])[:MAX_MODULES]}
    modules = []
    for directory in [p for p in sys.path if isinstance(p, str) and p.startswith(DEPS_ROOT)]:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            if normalize(entry[: -len(".dist-info")].rsplit("-", 1)[0]) not in wanted:
                continue
            for name in top_level(directory, entry):
                for module in [name] + SUBMODULES.get(name, []):
                    if module not in modules:
                        modules.append(module)
    # Out of the code's sight until it imports them (ahead.py).
    imported, failed = ahead.import_ahead(modules[:MAX_MODULES], WARM_UPS, READ_AGAIN)
    return {"type": "preloaded", "id": request.get("id"), "imported": imported, "failed": failed}
