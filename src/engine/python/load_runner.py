# The runner's loader: the first frame the container's bootstrap executes (see protocol.rs).
#
# The runner is a package of modules (runner/ beside this file), all embedded in the host's binary.
# The host sends their sources in the next frame, a JSON object {module name: source}; this loader
# compiles them all once, here in pid 1, and serves them to `import` from memory. Nothing is written
# to a disk: a runner the supervisor forks later imports the same code objects, never a file the
# executed code could have changed. Then it hands over to the package's `run`.

import json
import os
import sys
from importlib.machinery import ModuleSpec

PACKAGE = "sandbox_runner"


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)  # the host went away before the runner started
        data += chunk
    return data


class InMemoryModules:
    """A meta path finder and loader for the runner's own modules, and only those."""

    def __init__(self, sources):
        # Each module's frames are named <sandbox-runner/...>: the runner keeps them out of the
        # tracebacks it reports for the executed code.
        self.code = {
            name: compile(source, "<sandbox-runner/%s>" % name, "exec") for name, source in sources.items()
        }

    def find_spec(self, name, path=None, target=None):
        if name not in self.code:
            return None
        return ModuleSpec(name, self, origin="<sandbox-runner/%s>" % name, is_package=name == PACKAGE)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        exec(self.code[module.__spec__.name], module.__dict__)


sys.meta_path.insert(0, InMemoryModules(json.loads(read_exact(int.from_bytes(read_exact(4), "big")))))

import sandbox_runner  # noqa: E402  (served by the finder just installed)

sandbox_runner.run()
