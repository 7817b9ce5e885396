# Functions run on a module right after its first import, whoever imports it (the code, a package,
# the runner's preload). One meta path finder serves every such hook: figures.py patches
# matplotlib.pyplot this way, display.py gives pandas bounded display options, shell.py makes
# getpass fail at once, all without the runner importing any of them. A meta path finder needs only
# find_spec: importlib.abc's base class would cost the runner's start importlib.resources, pathlib
# and more (about a third of its imports).

import sys


class AfterImport:
    """The finder: for a hooked name it asks the finders after it for the module's spec and wraps
    the loader's exec_module, so that the hook sees the module once its code has run."""

    def __init__(self):
        self.hooks = {}

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                original = spec.loader.exec_module

                def exec_module(module, original=original):
                    original(module)
                    try:
                        hook(module)
                    except Exception:
                        pass  # a hook only adapts the module; the import itself succeeded

                spec.loader.exec_module = exec_module
                return spec
        return None


_finder = AfterImport()


def on_import(name, hook):
    """Runs hook(module) once the module `name` has been imported."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    _finder.hooks[name] = hook
