#!/usr/bin/env python3
"""Runs the README's own commands, as written, and checks what they print.

A fenced ``sh`` block of README.md preceded by a marker line is a test:

    <!-- readme-test: NAME expect="TEXT" expect="TEXT" -->

Each line of the block runs through ``bash -c`` from the repository's root (a comment after the
command is bash's), one after another, stopping at the first that fails; each TEXT must then
appear in what the block printed (stdout and stderr). The commands are read from the README
itself, never copied here, so the README cannot drift from what is tested.

    python3 scripts/test-readme.py            # every marked block
    python3 scripts/test-readme.py quickstart # the blocks named
    python3 scripts/test-readme.py --list     # the blocks and their commands, nothing run
    python3 scripts/test-readme.py --clean-env quickstart
                                              # as a newcomer types them: each line in a login
                                              # shell started from an empty environment

With ``--clean-env`` each line runs as ``env -i HOME=… PATH=… TERM=… bash -l -c LINE``: only
what a login shell sets (its profile files) besides those three, so nothing this script's caller
exported (``SANDBOX_*``, ``DOCKER_HOST``, ``SSL_CERT_FILE``, ...) reaches the commands, as in a
newcomer's shell.

Each command's time is printed. Exit 1 when a command fails or an expected text is missing,
2 when the README has no marked block (or not the one named).
"""

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<args>.*?)\s*-->\s*$")
# A command taking longer than this is hung (the first release build takes minutes).
COMMAND_TIMEOUT = 30 * 60


def blocks(readme):
    """(name, expected texts, commands) of every marked block, in order."""
    lines = readme.splitlines()
    found = []
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if not marker:
            continue
        words = shlex.split(marker.group("args"))
        if not words:
            sys.exit(f"README.md:{i + 1}: a readme-test marker needs a name")
        name, expect = words[0], []
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key != "expect" or not value:
                sys.exit(f"README.md:{i + 1}: unknown marker argument {word!r}")
            expect.append(value)
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
            sys.exit(f"README.md:{i + 1}: the marker must stand right above a ```sh block")
        commands = []
        for body in lines[i + 2 :]:
            if body.strip() == "```":
                break
            if body.strip():
                commands.append(body.strip())
        else:
            sys.exit(f"README.md:{i + 1}: the block is not closed")
        found.append((name, expect, commands))
    return found


def argv(command, clean):
    """How a line runs: in bash, or in a login shell from an empty environment."""
    if not clean:
        return ["bash", "-c", command]
    import os

    kept = [f"{name}={os.environ[name]}" for name in ("HOME", "PATH", "TERM") if name in os.environ]
    return ["env", "-i", *kept, "bash", "-l", "-c", command]


def run(name, expect, commands, clean=False):
    printed = []
    for command in commands:
        print(f"readme-test {name}: $ {command}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv(command, clean),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            print(f"FAIL: {command!r} did not end within {COMMAND_TIMEOUT} s", file=sys.stderr)
            return False
        output = done.stdout.decode("utf-8", "replace")
        printed.append(output)
        sys.stderr.write(output)
        print(
            f"readme-test {name}: {time.monotonic() - started:.1f} s, exit {done.returncode}",
            file=sys.stderr,
            flush=True,
        )
        if done.returncode != 0:
            print(f"FAIL: {command!r} exited {done.returncode}", file=sys.stderr)
            return False
    everything = "".join(printed)
    missing = [text for text in expect if text not in everything]
    for text in missing:
        print(f"FAIL: block {name!r} did not print {text!r}", file=sys.stderr)
    return not missing


def main():
    args = sys.argv[1:]
    listing = "--list" in args
    clean = "--clean-env" in args
    names = [a for a in args if a not in ("--list", "--clean-env")]
    found = blocks((ROOT / "README.md").read_text())
    chosen = [b for b in found if not names or b[0] in names]
    if not chosen or (names and {b[0] for b in chosen} != set(names)):
        print(f"readme-test: no marked block {names or ''} in README.md", file=sys.stderr)
        return 2
    if listing:
        for name, expect, commands in chosen:
            print(f"{name} (expects {expect}):")
            for command in commands:
                print(f"  {command}")
        return 0
    failed = [name for name, expect, commands in chosen if not run(name, expect, commands, clean)]
    passed = len(chosen) - len(failed)
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
