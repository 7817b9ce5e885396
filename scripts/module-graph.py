#!/usr/bin/env python3
"""The crate's module graph, checked for circles.

    python3 scripts/module-graph.py [--print]

Every `crate::…`, `super::…` and child-module path in the non-test code of src/ is resolved to the
unit it names: a top-level module (`config`, `engine`, `mcp`, `pypi`, `cli`, `text`) or, inside the
engine, one of its direct submodules (`engine::sandbox`, `engine::service`, …). Re-exports of a
module root are followed to where the item is defined. Test code (`#[cfg(test)]` items, the
`engine::testing` module) is left out: tests may use anything. Exits 1, naming the circle, when a
unit depends on itself through others; `--print` lists every edge. It also fails when
docs/architecture.md does not name a module (as `module::path` in backquotes).
"""

import os
import re
import sys

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "architecture.md")

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
SPLIT = {"engine"}  # top-level modules whose submodules are units of their own
TEST_ONLY = {("engine", "testing")}


def module_path(file):
    rel = os.path.relpath(file, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def unit_of(path, files):
    """The unit a path names: a child of a split module, else its top-level module (items
    defined in a split module's root belong to the root)."""
    if not path:
        return None
    if path[0] in SPLIT and len(path) > 1 and path[1] in children(files, path[:1]):
        return path[:2]
    return path[:1]


def strip_tests(text):
    # `#[cfg(test)]` followed by an item: drop the item (a block by brace matching, or a line).
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        j = m.end()
        brace = text.find("{", j)
        semi = text.find(";", j)
        if semi != -1 and (brace == -1 or semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    out.append(text[i:])
    text = "".join(out)
    text = re.sub(r"//[^\n]*", "", text)  # comments, doc comments
    return text


def read_units():
    files = {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                mod = module_path(path)
                if any(mod[: len(t)] == t for t in TEST_ONLY):
                    continue
                with open(path, encoding="utf-8") as f:
                    files[mod] = strip_tests(f.read())
    return files


def children(files, mod):
    return {m[len(mod)] for m in files if len(m) > len(mod) and m[: len(mod)] == mod}


def reexports(files):
    """name -> defining module path, for `pub use child::{a, b}` in module roots."""
    table = {}
    for mod, text in files.items():
        for m in re.finditer(r"pub use ([\w:]+)::\{([^}]*)\};|pub use ([\w:]+)::(\w+)(?: as (\w+))?;", text):
            if m.group(1):
                base, names = m.group(1), [n.strip().split(" as ")[-1] for n in m.group(2).split(",") if n.strip()]
            else:
                base, names = m.group(3), [m.group(5) or m.group(4)]
            target = resolve(mod, base.split("::"), files)
            for n in names:
                if target:
                    table[mod + (n,)] = target
    return table


def resolve(mod, parts, files):
    if parts[0] == "crate":
        return tuple(parts[1:])
    base = list(mod)
    while parts and parts[0] in ("super", "self"):
        if parts[0] == "super":
            base = base[:-1]
        parts = parts[1:]
    return tuple(base) + tuple(parts)


def expand_uses(text):
    """`use a::{b, c::{d, e}};` becomes `use a::b; use a::c::d; use a::c::e;`."""

    def split_top(inner):
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        return [p.strip() for p in parts if p.strip()]

    def flatten(tree):
        m = re.match(r"^([\w:]*?)::\{(.*)\}$", tree, re.S)
        if not m:
            return [tree]
        return [x for sub in split_top(m.group(2)) for x in flatten(f"{m.group(1)}::{sub}")]

    def repl(m):
        visibility = m.group(1) or ""
        return " ".join(f"{visibility}use {p};" for p in flatten(m.group(2).strip()))

    return re.sub(r"\b(pub(?:\([\w:]+\))?\s+)?use\s+([^;]*\{[^;]*);", repl, text)


def edges(files):
    files = {mod: expand_uses(text) for mod, text in files.items()}
    table = reexports(files)
    found = set()
    top = children(files, ())
    for mod, text in files.items():
        me = unit_of(mod, files)
        kids = children(files, mod)
        if len(mod) == 1 and mod[0] in SPLIT:
            # The root's re-exports are followed where they are used, not counted as its own.
            text = re.sub(r"\bpub use [^;]*;", "", text)
        for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+|\w+(?:::\w+)+)", text):
            parts = m.group(1).split("::")
            if parts[0] not in ("crate", "super", "self") and parts[0] not in kids:
                continue
            path = resolve(mod, parts, files)
            # follow a re-export of a module root to where the item lives
            for n in range(len(path), 0, -1):
                if path[:n] in table:
                    path = table[path[:n]] + path[n:]
                    break
            if not path or path[0] not in top:
                continue
            if any(path[: len(t)] == t for t in TEST_ONLY):
                continue
            other = unit_of(path, files)
            if other and other != me:
                found.add((me, other))
    return found


def find_cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def undocumented():
    """Modules (test modules aside) that docs/architecture.md does not name."""
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    missing = []
    for root, _, names in os.walk(SRC):
        for name in names:
            if not name.endswith(".rs"):
                continue
            mod = module_path(os.path.join(root, name))
            if not mod or mod[-1] == "tests" or mod[-1].endswith("_tests"):
                continue
            if mod[:2] == ("engine", "testing") and len(mod) > 2:
                continue
            if f"`{'::'.join(mod)}`" not in doc:
                missing.append("::".join(mod))
    return sorted(missing)


def main():
    missing = undocumented()
    if missing:
        print("module graph: docs/architecture.md does not name: " + ", ".join(missing), file=sys.stderr)
        return 1
    files = read_units()
    found = edges(files)
    graph = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    name = "::".join
    if "--print" in sys.argv:
        for a in sorted(graph):
            print(f"{name(a):22} -> {', '.join(name(b) for b in sorted(graph[a]))}")
    cycle = find_cycle(graph)
    if cycle:
        print("module graph: a circle: " + " -> ".join(name(c) for c in cycle), file=sys.stderr)
        return 1
    print(f"module graph: {len(found)} dependencies between {len({u for e in found for u in e})} modules, no circle", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
