# What a dependency set brings prepared (python/prepare_set.py made it when the set was installed),
# put to use in this sandbox, and a prepared sandbox's imports done before its first request.

import importlib
import json
import os
import sys

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
