"""Does once, for a staged dependency set, the import-time work every fresh process would repeat.

Runs in a preparer sandbox after the install: the sandbox user and limits, no network, the staging
volume read-write and nothing else (no download cache, no cache volume, no operator mounts), since
importing a package runs its code. Takes no arguments; the staged set is at TARGET.

- Bytecode: every module compiled with unchecked hash-based pycs. The set is read-only and
  digest-checked once published, so a pyc need not be checked against its source (a published
  copy's mtimes differ from the staged ones, which would make timestamp pycs stale), and sandboxes
  run with PYTHONDONTWRITEBYTECODE, so without these every import compiles from source again.
- Matplotlib's font cache (fontlist-v*.json), built with the set's own matplotlib into
  PREPARED/matplotlib. The runner copies it into the sandbox's writable MPLCONFIGDIR before the
  code runs (runner/prepared.py), so matplotlib reads it instead of scanning every font.

Prints one JSON object: what was done.
"""
import compileall, glob, json, os, py_compile, re, shutil, subprocess, sys

TARGET = "/opt/stage/target"
PREPARED = os.path.join(TARGET, ".pcs-prepared")  # a dot and a dash: never an import name
report = {"compiled": False, "matplotlib": None}

# Quiet: a package may ship files that do not compile (templates, other Pythons); they stay as they are.
report["compiled"] = bool(compileall.compile_dir(
    TARGET, quiet=2, force=True, workers=1,
    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH))

if os.path.isdir(os.path.join(TARGET, "matplotlib")):
    config = os.path.join(PREPARED, "matplotlib")
    os.makedirs(config, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=TARGET, MPLCONFIGDIR=config, MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=600)
    caches = [os.path.basename(p) for p in glob.glob(os.path.join(config, "fontlist-v*.json"))]
    # Only the font cache is kept: nothing else matplotlib may have written there.
    for entry in os.listdir(config):
        if entry not in caches:
            path = os.path.join(config, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    if done.returncode == 0 and len(caches) == 1 and re.fullmatch(r"fontlist-v[0-9][0-9.]*\.json", caches[0]):
        report["matplotlib"] = caches[0]
    else:
        print(done.stderr.decode("utf-8", "replace")[-2000:], file=sys.stderr)

os.makedirs(PREPARED, exist_ok=True)
manifest = {"prefix": TARGET, "matplotlib": report["matplotlib"] and "matplotlib/" + report["matplotlib"]}
with open(os.path.join(PREPARED, "prepared.json"), "w") as f:
    json.dump(manifest, f)
print(json.dumps(report))
