# The runner's own IPython: imported from its set's directory (PCS_IPYTHON, installed once per
# image into the dependency cache, mounted read-only) through a meta path finder that serves only
# that directory's top-level modules and packages. The directory is never on sys.path, so the
# code's own imports search what they always did; the finder comes after every other one, so a
# package the code installed itself (a dependency set, on sys.path) wins over the set's copy. What
# the runner has imported from the set (IPython, traitlets, ...) stays the one in sys.modules.
# For the runner's own import of IPython, before any code runs, the finder comes first: the
# runner's IPython is its pinned set's, whatever IPython the image itself may have.
#
# Of the set's distributions' metadata, only matplotlib-inline's is found through the finder
# (importlib.metadata): matplotlib finds its backend by the entry point that metadata declares.

import os
import sys
from importlib.machinery import PathFinder

# Entries of a pip --target directory that are not importable names.
NOT_MODULES = ("bin", "share", "__pycache__")
MODULE_SUFFIXES = (".py", ".abi3.so", ".so")
# The one distribution of the set whose metadata the code's importlib.metadata finds.
EXPOSED = "matplotlib_inline"


def top_level_names(directory):
    """The names the directory's entries import as: packages (directories with __init__.py) and
    modules (.py, extension modules)."""
    names = set()
    for entry in os.listdir(directory):
        if entry in NOT_MODULES or entry.endswith((".dist-info", ".egg-info", ".pth")):
            continue
        path = os.path.join(directory, entry)
        if os.path.isdir(path):
            if entry.isidentifier() and os.path.isfile(os.path.join(path, "__init__.py")):
                names.add(entry)
            continue
        for suffix in MODULE_SUFFIXES:
            if entry.endswith(suffix):
                stem = entry[: -len(suffix)].split(".", 1)[0]
                if stem.isidentifier():
                    names.add(stem)
                break
    return frozenset(names)


class SetFinder:
    """A meta path finder for the top-level names of one directory, and only those (their
    submodules are found through the package's own __path__, as always)."""

    def __init__(self, directory):
        self.directory = directory
        self.names = top_level_names(directory)

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in self.names:
            return None
        return PathFinder.find_spec(name, [self.directory], target)

    def find_distributions(self, context=None):
        """importlib.metadata's question: matplotlib-inline's metadata (its entry point names the
        `inline` backend to matplotlib), and no other of the set's."""
        from importlib.metadata import DistributionFinder, MetadataPathFinder

        name = getattr(context, "name", None)
        if name is not None and name.lower().replace("-", "_") != EXPOSED:
            return iter(())
        return MetadataPathFinder.find_distributions(
            DistributionFinder.Context(name=EXPOSED, path=[self.directory])
        )


def install(directory, first=False):
    """Puts the set's finder on sys.meta_path (once): last, or first; returns it."""
    for finder in list(sys.meta_path):
        if isinstance(finder, SetFinder) and finder.directory == directory:
            sys.meta_path.remove(finder)
            break
    else:
        finder = SetFinder(directory)
    if first:
        sys.meta_path.insert(0, finder)
    else:
        sys.meta_path.append(finder)
    return finder


def load_ipython():
    """(the IPython module, None), or (None, why it cannot be used)."""
    directory = os.environ.get("PCS_IPYTHON")
    if not directory:
        return None, "PCS_IPYTHON is not set: the runner was not given its IPython set"
    if not os.path.isabs(directory) or not os.path.isdir(directory):
        return None, "PCS_IPYTHON (%s) is not a directory" % directory[:500]
    try:
        install(directory, first=True)
        try:
            import IPython
        finally:
            install(directory)
    except Exception as exc:  # any failure of the set's import: the host is told why
        return None, "IPython could not be imported from %s: %s: %s" % (
            directory[:500],
            type(exc).__name__,
            str(exc)[:500],
        )
    return IPython, None
