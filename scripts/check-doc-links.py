#!/usr/bin/env python3
"""Checks every relative link in README.md and docs/*.md: the file exists, and an anchor
(#...) names a heading of that file (GitHub's slugs). Run from the repository root; exits 1 on
a broken link. Links inside code (fenced blocks, `inline`) are not links."""
import glob, os, re, sys

def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # GitHub keeps letters, digits, _, -, spaces
    return s.replace(" ", "-")

def strip_code(text):
    out, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`[^`]*`", "", line))
    return out

def anchors(path):
    seen, result = {}, set()
    for line in strip_code(open(path, encoding="utf-8").read()):
        m = re.match(r"^#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result

broken, checked = [], 0
for md in ["README.md"] + sorted(glob.glob("docs/*.md")):
    for number, line in enumerate(strip_code(open(md, encoding="utf-8").read()), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.isfile(file):
                broken.append(f"{md}:{number}: {target}: no file {file}")
            elif anchor and file.endswith(".md") and anchor not in anchors(file):
                broken.append(f"{md}:{number}: {target}: no heading #{anchor} in {file}")
print(f"{checked} relative links checked")
for b in broken:
    print(b)
sys.exit(1 if broken else 0)
