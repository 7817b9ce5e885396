# Cells compiled under the names ipykernel gives them: /tmp/ipykernel_<pid>/<hash>.py, the hash
# being MurmurHash2 (32-bit, x86) of the cell's source with ipykernel's seed. IPython's own
# compiler names a cell `<ipython-input-N-...>`; the name shows in warnings ("…/123.py:4:
# UserWarning"), in a SyntaxError's message, and decides how IPython's traceback shows the cell's
# lines (a name that looks like a file gets the window of lines around the failing one, as in
# Jupyter). Nothing is written there: IPython keeps the source in linecache under that name.

import os
import tempfile

# ipykernel's seed for the cells' hash (ipykernel.compiler.get_tmp_hash_seed).
SEED = 0xC70F6907
MASK = 0xFFFFFFFF
M = 0x5BD1E995


def murmur2_x86(text, seed=SEED):
    """MurmurHash2, 32-bit, of the text's UTF-8 bytes."""
    data = text.encode("utf-8", "surrogatepass")
    length = len(data)
    h = (seed ^ length) & MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * M) & MASK
        k ^= k >> 24
        k = (k * M) & MASK
        h = (h * M) & MASK
        h ^= k
    rest = length - whole
    if rest:
        if rest == 3:
            h ^= data[whole + 2] << 16
        if rest >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * M) & MASK
    h ^= h >> 13
    h = (h * M) & MASK
    h ^= h >> 15
    return h


def cell_file_name(raw_code):
    """The name ipykernel gives a cell: in a directory of its process's, after the cell's source."""
    directory = os.path.join(tempfile.gettempdir(), "ipykernel_%d" % os.getpid())
    return os.path.join(directory, "%d.py" % murmur2_x86(raw_code))


def compiler_class(CachingCompiler):
    class CellCompiler(CachingCompiler):
        """IPython's caching compiler, naming each cell as ipykernel does."""

        def get_code_name(self, raw_code, transformed_code, number):
            return cell_file_name(raw_code)

    CellCompiler.__module__ = __name__
    return CellCompiler
