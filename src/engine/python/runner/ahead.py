# Modules a prepared sandbox imported ahead of the code (prepared.py), kept out of the code's sight
# until it imports them: to the code, a prepared sandbox looks as a cold one does.
#
# The runner imports ahead one module at a time (a "unit": numpy, matplotlib, matplotlib.pyplot,
# pandas, ...), and before each one hides what the earlier ones brought: every module imported
# ahead is out of sys.modules, and each submodule out of its parent's attributes, behind a finder
# first on sys.meta_path. A unit's import then meets the earlier units' modules as a cold import
# would, through the finder, which puts each back with its own closure: what the unit's import
# added to sys.modules, those put back included, is exactly what its cold import brings. For a
# module that is not a unit (matplotlib.colors imported first), its closure is what `Recording`
# saw: what was added while it ran and which loaded modules it asked for (import statements and
# import_module; one asked for from C code below Python's hooks is not seen, the one gap).
#
# At the first import of a hidden module, by the code, a package or the runner, the finder puts it
# back with its closure, parents' attributes included. The module objects are the ones imported
# ahead: nothing is imported twice, so a C extension that can be initialised only once is never
# asked to be again. importlib.util.find_spec of a hidden module gives its own spec (origin,
# locations), with no side effect; its import then sets that spec back on the module.
#
# A hidden module is given back only while a cold import would find the same file: a module of the
# code's own in /workspace, or a newer set first on sys.path (`%pip`), shadows it as it would in a
# cold sandbox (the hidden one is then forgotten, and the import runs as without us). A module the
# code blocked (`sys.modules[name] = None`) stops the import of what needs it, as it would cold.

import builtins
import importlib
import importlib.machinery
import importlib.util  # here, not when used: never among what a prepared sandbox hides
import sys
import threading

# Where modules that no file on sys.path can shadow come from.
NOT_ON_PATH = ("built-in", "frozen")


class Recording:
    """What each module executed during a `with` block added and asked for."""

    def __init__(self):
        self.added = {}
        self.asked = {}
        self.stack = []
        # Names being looked up through the other finders: one of them may ask the finders in
        # turn (after_import.py's does), this one among them.
        self.looking = set()

    def find_spec(self, name, path=None, target=None):
        if name in self.looking:
            return None
        self.looking.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.looking.discard(name)
        if spec.loader is not None and hasattr(spec.loader, "exec_module") and not isinstance(spec.loader, Restoring):
            spec.loader = Watched(self, spec.loader)
        return spec

    def note(self, name):
        if self.stack and name in sys.modules:
            self.asked[self.stack[-1]].add(name)

    def note_import(self, name, globals=None, fromlist=(), level=0):
        if not self.stack:
            return
        try:
            if level:
                name = importlib.util.resolve_name("." * level + name, (globals or {}).get("__package__") or "")
        except Exception:
            return
        self.note(name)
        for item in fromlist or ():
            if isinstance(item, str) and item != "*":
                self.note(name + "." + item)

    def __enter__(self):
        self.real_import = builtins.__import__
        self.real_import_module = importlib.import_module
        real_import, real_import_module = self.real_import, self.real_import_module

        def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
            self.note_import(name, globals, fromlist, level)
            return real_import(name, globals, locals, fromlist, level)

        def recording_import_module(name, package=None):
            if self.stack:
                try:
                    self.note(importlib.util.resolve_name(name, package) if name.startswith(".") else name)
                except Exception:
                    pass
            return real_import_module(name, package)

        builtins.__import__ = recording_import
        importlib.import_module = recording_import_module
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        builtins.__import__ = self.real_import
        importlib.import_module = self.real_import_module
        return False


class Watched:
    """A loader whose exec_module is recorded; the module keeps the real loader."""

    def __init__(self, recording, loader):
        self.recording = recording
        self.loader = loader

    def __getattr__(self, attr):
        return getattr(self.loader, attr)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        recording, name = self.recording, module.__name__
        before = set(sys.modules)
        recording.stack.append(name)
        recording.asked.setdefault(name, set())
        try:
            self.loader.exec_module(module)
        finally:
            recording.stack.pop()
            recording.added[name] = (set(sys.modules) - before) | {name}
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self.loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self.loader


class Hidden:
    """The finder that gives the hidden modules back, each with its cold import's closure."""

    def __init__(self, recording, read_again):
        self.read_again = read_again
        self.lock = threading.RLock()
        self.stash = {}
        self.unbound = []
        self.names = set()
        self.recording = recording
        # A unit's closure: what its import added, measured with the earlier units hidden.
        self.units = {}
        self.closures = {}

    def hide(self, names):
        """Takes `names` (imported ahead) out of sys.modules and their parents' attributes."""
        with self.lock:
            taken = {}
            for name in names:
                module = sys.modules.pop(name, None)
                if module is not None:
                    taken[name] = module
            self.stash.update(taken)
            self.names.update(taken)
            self.closures.clear()
            for name, module in taken.items():
                parent, _, child = name.rpartition(".")
                holder = self.stash.get(parent)
                # The module's own dict: a module's __getattr__ (numpy's) may import.
                names = getattr(holder, "__dict__", None)
                if isinstance(names, dict) and names.get(child) is module:
                    del names[child]
                    self.unbound.append((parent, child, name, module))
            if self.stash and self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def closure(self, name):
        found = self.closures.get(name)
        if found is not None:
            return found
        found = set()
        todo = [name]
        while todo:
            current = todo.pop()
            if current in found or current not in self.names:
                continue
            found.add(current)
            if current in self.units:
                todo.extend(self.units[current])
                continue
            parent = current.rpartition(".")[0]
            if parent:
                todo.append(parent)
            todo.extend(self.recording.added.get(current, ()))
            todo.extend(self.recording.asked.get(current, ()))
        self.closures[name] = found
        return found

    def find_spec(self, name, path=None, target=None):
        module = self.stash.get(name)
        if module is None:
            return None
        original = getattr(module, "__spec__", None)
        if not self.found_cold(name, original):
            self.forget(name)
            return None
        spec = importlib.util.spec_from_loader(name, Restoring(self, original))
        if original is not None:
            spec.origin = original.origin
            spec.submodule_search_locations = original.submodule_search_locations
            spec.has_location = original.has_location
            spec.cached = original.cached
        return spec

    def found_cold(self, name, original):
        """Whether a cold import of top-level `name` would find the module imported ahead: the
        same file first on sys.path now (a submodule is found through its parent's path)."""
        if "." in name or original is None or original.origin in NOT_ON_PATH:
            return True
        try:
            found = importlib.machinery.PathFinder.find_spec(name)
        except Exception:
            return True  # sys.path holds something the path finder cannot read: as it was
        return found is None or found.origin == original.origin

    def forget(self, name):
        """`name` is no longer given back: the code's import finds what a cold one would."""
        with self.lock:
            self.stash.pop(name, None)
            if not self.stash:
                try:
                    sys.meta_path.remove(self)
                except ValueError:
                    pass

    def restore(self, name):
        """Puts `name` and its closure back (the import lock of `name` is held by the caller)."""
        with self.lock:
            module = self.stash.get(name)
            if module is None:
                return sys.modules.get(name)
            closure = [other for other in self.closure(name) if other in self.stash]
            restored = {name}
            # The module itself too (the import puts it there once this returns): its own
            # submodules' attributes are set on it below.
            sys.modules[name] = self.stash.pop(name)
            for other in closure:
                hidden = self.stash.pop(other, None)
                if hidden is None:
                    continue
                # One the code put in sys.modules itself (None: blocked) stays as the code left it.
                if other not in sys.modules and self.found_cold(other, getattr(hidden, "__spec__", None)):
                    sys.modules[other] = hidden
                    restored.add(other)
            # Each submodule put back is an attribute of its parent again, as its import sets it;
            # nothing else is touched (what the code set on a module earlier stays).
            kept = []
            for entry in self.unbound:
                parent, child, submodule, hidden = entry
                if submodule in self.stash or parent in self.stash:
                    kept.append(entry)  # bound once both are back
                    continue
                if submodule not in restored and parent not in restored:
                    continue  # bound already, or one of them forgotten
                holder = sys.modules.get(parent)
                names = getattr(holder, "__dict__", None)
                if sys.modules.get(submodule) is hidden and isinstance(names, dict):
                    names[child] = hidden
            self.unbound = kept
            if not self.stash:
                try:
                    sys.meta_path.remove(self)
                except ValueError:
                    pass
            for other in restored & set(self.read_again):
                try:
                    self.read_again[other](sys.modules[other])
                except Exception:
                    pass
            return module


class Restoring:
    """The loader of a hidden module: the module imported ahead, put back with its closure."""

    def __init__(self, hidden, original):
        self.hidden = hidden
        self.original = original

    def __getattr__(self, attr):
        # The rest of a loader's interface (get_code, get_source, get_filename, ...) is the real
        # loader's: runpy, pkgutil and inspect use it.
        loader = getattr(self.original, "loader", None)
        if loader is None:
            raise AttributeError(attr)
        return getattr(loader, attr)

    def create_module(self, spec):
        return self.hidden.restore(spec.name)

    def exec_module(self, module):
        # The import set a spec of ours on it: its own again, so that reload runs its code.
        if self.original is not None:
            module.__spec__ = self.original
            if self.original.loader is not None:
                module.__loader__ = self.original.loader


def import_ahead(units, warm_ups, read_again):
    """Imports each of `units` (names) as a cold import would, the earlier ones hidden, runs its
    warm-up (`warm_ups`: name -> function of the module), and hides everything at the end;
    `read_again` (name -> function of the module) runs when a module is given back. Returns
    (imported, failed)."""
    before = set(sys.modules)
    imported, failed = [], []
    with Recording() as recording:
        hidden = Hidden(recording, read_again)
        for unit in units:
            hidden.hide([name for name in list(sys.modules) if name not in before])
            start = set(sys.modules)
            try:
                module = importlib.import_module(unit)
                imported.append(unit)
            except BaseException:  # the package's own failure: the code will meet it, as without us
                failed.append(unit)
                continue
            # Its closure before the warm-up (which may import what the code's first use would).
            hidden.units[unit] = set(sys.modules) - start
            try:
                if unit in warm_ups:
                    warm_ups[unit](module)
            except BaseException:
                pass  # a warm-up is an optimisation only
        hidden.hide([name for name in list(sys.modules) if name not in before])
    return imported, failed
