# Notebook-grade results: the value of the code's last expression, display(), and the outputs of an
# execution in production order, shaped like Jupyter's nbformat v4 outputs.
#
# Objects are rendered through IPython's display protocol (_repr_mimebundle_, _repr_html_, ...,
# then repr), all of it the code's own methods: they run while the execution does, so the timeout
# and interrupts apply to them as to the code. One that raises or returns the wrong type costs only
# that MIME type (a failing repr shows the error as text/plain); values and the whole list are
# bounded, and what goes over is dropped and counted.
#
# Stream text is not copied here: each output records how many bytes of stdout and stderr had been
# written when it was produced (capture.py's positions), and the host cuts the streams it already
# has at those offsets. So outputs and prints interleave exactly, at no cost in the reply's size.

# ast is imported with the runner, not at the first execution: there it cost a pooled sandbox's
# first call about 3 ms of its 0.5 CPU, which the pool now spends before the call arrives.
import ast
import base64
import builtins
import json
import sys

from . import after_import

# Outputs other than streams an execution may return, the bytes of one MIME value, and of
# text/plain (cut, not dropped: the model still sees the head).
MAX_OUTPUTS = 200
MAX_VALUE_BYTES = 4 << 20
MAX_PLAIN_CHARS = 100_000
MAX_TRACEBACK_LINES = 200

# IPython's order: the first method an object has for a MIME type gives that type.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)
BINARY = ("image/png", "image/jpeg")

INPUT_MESSAGE = (
    "input() is not available: the sandbox has no terminal. Put the data in the code, or write "
    "a file with sandbox_write_file and read it."
)


def no_input(prompt=""):
    raise EOFError(INPUT_MESSAGE)


def _warn(text):
    try:
        sys.stderr.write(text + "\n")
    except Exception:
        pass


def _describe_failure(obj, method, exc):
    try:
        detail = "%s: %s" % (type(exc).__name__, str(exc)[:500])
    except Exception:
        detail = type(exc).__name__
    return "<%s object: %s failed with %s>" % (type(obj).__name__, method, detail)


def _plain(obj):
    try:
        text = repr(obj)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned %s" % type(text).__name__)
    except Exception as exc:  # user code; KeyboardInterrupt passes (the timeout)
        return _describe_failure(obj, "__repr__", exc)
    if len(text) > MAX_PLAIN_CHARS:
        text = "%s\n... [%d more characters of the repr cut]" % (
            text[:MAX_PLAIN_CHARS],
            len(text) - MAX_PLAIN_CHARS,
        )
    return text


def _checked(mime, value):
    """The value in nbformat's form (str; base64 for images; JSON text for application/json, which
    the host parses), or None when it is of the wrong type or too big."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]  # (data, metadata), as _repr_*_ may return
    if value is None:
        return None
    if mime in BINARY:
        if isinstance(value, str):  # already base64, as IPython allows (the host checks it)
            return value if len(value) <= MAX_VALUE_BYTES * 4 // 3 else None
        if not isinstance(value, (bytes, bytearray)) or len(value) > MAX_VALUE_BYTES:
            return None
        return base64.b64encode(bytes(value)).decode("ascii")
    if mime == "application/json":
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                return None
            text = value
        else:
            try:
                text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=None)
            except (TypeError, ValueError, RecursionError):
                return None
    elif isinstance(value, str):
        text = value
    else:
        return None
    return text if len(text) <= MAX_VALUE_BYTES else None


def mime_bundle(obj):
    """The MIME bundle of an object: [(mime, value)], text/plain always last."""
    data = {}
    method = getattr(type(obj), "_repr_mimebundle_", None)
    if method is not None:
        try:
            bundle = obj._repr_mimebundle_(include=None, exclude=None)
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            if isinstance(bundle, dict):
                for mime, value in list(bundle.items())[:32]:
                    if isinstance(mime, str) and 0 < len(mime) <= 100 and "/" in mime:
                        checked = _checked(mime, value)
                        if checked is not None:
                            data[mime] = checked
        except Exception as exc:
            _warn(_describe_failure(obj, "_repr_mimebundle_", exc))
    for mime, name in REPR_METHODS:
        if mime in data or not hasattr(type(obj), name):
            continue
        try:
            checked = _checked(mime, getattr(obj, name)())
        except Exception as exc:
            _warn(_describe_failure(obj, name, exc))
            continue
        if checked is not None:
            data[mime] = checked
    figure_png = _figure_png(obj)
    if figure_png is not None and "image/png" not in data:
        data["image/png"] = figure_png
    if not isinstance(data.get("text/plain"), str):
        data["text/plain"] = _plain(obj)
    plain = data.pop("text/plain")
    return list(data.items()) + [("text/plain", plain)]


def _figure_png(obj):
    """A matplotlib Figure has no PNG repr outside a notebook: drawn here, and closed in pyplot so
    that it does not come back a second time as a figure left open."""
    figure_module = sys.modules.get("matplotlib.figure")
    if figure_module is None or not isinstance(obj, figure_module.Figure):
        return None
    import io

    buffer = io.BytesIO()
    try:
        obj.savefig(buffer, format="png")
    except Exception as exc:
        _warn(_describe_failure(obj, "savefig", exc))
        return None
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        try:
            pyplot.close(obj)
        except Exception:
            pass
    return _checked("image/png", buffer.getvalue())


class Outputs:
    """One execution's outputs other than streams, each with the stream positions it came at."""

    def __init__(self, position, budget, execution_count):
        self.position = position  # () -> [stdout bytes, stderr bytes] written so far
        self.room = budget
        self.execution_count = execution_count
        self.items = []
        self.dropped = 0

    def _add(self, item, size):
        if len(self.items) >= MAX_OUTPUTS or size > self.room:
            self.dropped += 1
            return False
        self.room -= size
        self.items.append(item)
        return True

    def display(self, obj, result=False):
        data = mime_bundle(obj)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        item = {"output_type": "execute_result" if result else "display_data", "data": data}
        if result:
            item["execution_count"] = self.execution_count
        item["at"] = self.position()
        # Its size in the reply: JSON with every non-ASCII character escaped is an upper bound.
        return self._add(item, len(json.dumps(data)) + 100)

    def image(self, png):
        """A matplotlib figure shown or left open."""
        data = [("image/png", base64.b64encode(png).decode("ascii")), ("text/plain", "<Figure>")]
        item = {"output_type": "display_data", "data": data, "at": self.position()}
        return self._add(item, len(data[0][1]) + 100)

    def error(self, exc, traceback_text, at, through):
        lines = traceback_text.splitlines()
        if len(lines) > MAX_TRACEBACK_LINES:
            half = MAX_TRACEBACK_LINES // 2
            lines = lines[:half] + ["... [%d lines cut]" % (len(lines) - 2 * half)] + lines[-half:]
        lines = [line[:2000] for line in lines]
        try:
            evalue = str(exc)[:1000]
        except Exception:
            evalue = "(the exception's message could not be read)"
        item = {
            "output_type": "error",
            "ename": type(exc).__name__,
            "evalue": evalue,
            "traceback": lines,
            "at": at,
            "through": through,
        }
        self._add(item, len(json.dumps(lines)) + len(json.dumps(evalue)) + 200)


class Display:
    """The `display` builtin, writing to the outputs of the execution that runs."""

    def __init__(self):
        self.outputs = None

    def __call__(self, *objs, **kwargs):
        outputs = self.outputs
        for obj in objs:
            if outputs is None:
                print(repr(obj))  # code that outlived its execution (a thread): plain text
            else:
                outputs.display(obj)


def last_expression_split(code, filename):
    """(body, expression): the code compiled without its last top-level statement and that
    statement's expression, when it is an expression not ended by `;` (IPython's rule, read from
    the source text); else (code compiled whole, None). Both halves keep the user's line numbers."""
    tree = ast.parse(code, filename)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return compile(tree, filename, "exec"), None
    lines = code.splitlines(True)
    tail = lines[last.end_lineno - 1].encode("utf-8", "surrogatepass")[last.end_col_offset :]
    rest = [tail.decode("utf-8", "replace")] + lines[last.end_lineno :]
    # Only `;`, blanks and comments can follow the last statement (no strings): a `#` starts one.
    if any(";" in line.split("#", 1)[0] for line in rest):
        return compile(tree, filename, "exec"), None
    tree.body.pop()
    expression = compile(ast.Expression(last.value), filename, "eval")
    return compile(tree, filename, "exec"), expression


def _bound_pandas(pandas):
    # Head and tail of long frames, the shape stated: a table a model can read.
    for option, value in (
        ("display.max_rows", 20),
        ("display.min_rows", 10),
        ("display.max_columns", 20),
        ("display.max_colwidth", 50),
        ("display.show_dimensions", True),
        # One table, a row to a line: wrapped column blocks are hard for a model to line up.
        ("display.expand_frame_repr", False),
    ):
        pandas.set_option(option, value)


def _route_ipython(module):
    # IPython.display.display outside a kernel prints reprs; in the sandbox it is ours.
    module.display = builtins.display


def install():
    """`display` and a failing `input` as builtins, bounded pandas display; returns the Display."""
    display = Display()
    builtins.display = display
    builtins.input = no_input
    after_import.on_import("pandas", _bound_pandas)
    after_import.on_import("IPython.core.display_functions", _route_ipython)
    return display
