# The steps of an image flavour's build (engine/docker/image/flavour.rs), run by the image's own
# python3 with the standard library only:
#
#   fetch   CONF MANIFEST ROOT  pip installs exactly the pinned set under ROOT (copied onto / later)
#   prepare HOME                bytecode, matplotlib's font cache and its start-up hook, a check
#
# Lines starting with "==> " are progress for people; a line starting with "pcs-flavour-error: "
# says why a step failed, in a form the host reads ("pip LINE", ...): after "pip", the host explains
# the failure from pip's own lines, as it does an installer's (engine::deps::failure).

import compileall
import filecmp
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HOOK_MODULE = "_python_code_sandbox_flavour"
HOOK_PTH = "python_code_sandbox_flavour.pth"


def say(line):
    print("==> " + line, flush=True)


def fail(kind, detail, status=3):
    print("pcs-flavour-error: %s %s" % (kind, " ".join(str(detail).split())), flush=True)
    sys.exit(status)


def manifest(path):
    """The flavour as the host wrote it: packages as [name, version] pairs, the requested first."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data["packages"] = dict(data["packages"])
    return data


def fetch(conf_path, manifest_path, root):
    """pip installs the pinned set (wheels only, nothing already in the image reused) under root,
    telling each package as it comes; then nothing but the pinned set may be there."""
    pinned = manifest(manifest_path)["packages"]
    requirements = os.path.join(os.path.dirname(manifest_path), "requirements.txt")
    with open(requirements, "w", encoding="utf-8") as f:
        f.write("".join("%s==%s\n" % item for item in pinned.items()))
    argv = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "--progress-bar", "off", "--no-cache-dir", "--no-compile", "--no-warn-script-location",
            "--ignore-installed", "--only-binary", ":all:", "--root", root, "-r", requirements]
    if subprocess.run([sys.executable, "-m", "pip", "install", "--help"], capture_output=True,
                      text=True).stdout.count("--root-user-action"):
        argv[4:4] = ["--root-user-action", "ignore"]
    env = dict(os.environ, PIP_CONFIG_FILE=conf_path)
    say("installing %d pinned packages" % len(pinned))
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors, count = [], 0
    for line in process.stdout:
        line = line.rstrip()
        print(line, flush=True)
        text = line.strip()
        if text.startswith("Downloading ") or text.startswith("Using cached "):
            count += 1
            say("%s [%d/%d]" % (text, count, len(pinned)))
        elif text.startswith("Installing collected packages"):
            say("unpacking %d packages" % len(pinned))
        elif text.startswith("ERROR:"):
            errors.append(text)
    if process.wait() != 0:
        fail("pip", " / ".join(errors[-3:]) or "pip exited with status %d" % process.returncode, 4)
    found = {}
    for dist in importlib.metadata.distributions(path=site_dirs(root)):
        found[normalize(dist.metadata["Name"])] = dist.version
    expected = {normalize(name): version for name, version in pinned.items()}
    if found != expected:
        extra = sorted(set(found.items()) - set(expected.items()))
        missing = sorted(set(expected.items()) - set(found.items()))
        fail("pin", "installed %s beyond the pinned set, missing %s" % (extra, missing), 5)


def site_dirs(root):
    dirs = []
    for top, subdirs, _ in os.walk(root):
        if os.path.basename(top) in ("site-packages", "dist-packages"):
            dirs.append(top)
            subdirs.clear()
    return dirs


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def prepare(home):
    """Run in the final image as root: checks the versions, compiles every installed module (the
    sandbox's root is read-only and PYTHONDONTWRITEBYTECODE is set, so nothing is compiled later),
    builds matplotlib's font cache into HOME/matplotlib, installs the start-up hook that seeds
    MPLCONFIGDIR with it, and imports the set once the way a sandbox will."""
    data = manifest(os.path.join(home, "flavour.json"))
    for name, version in data["packages"].items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = None
        if found != version:
            fail("prepare", "%s is %s in the image, not the pinned %s" % (name, found, version), 6)
    site = str(importlib.metadata.distribution(next(iter(data["packages"]))).locate_file(""))
    say("compiling bytecode in %s" % site)
    compileall.compile_dir(site, quiet=1, workers=0)  # as pip: a module that does not compile stays so

    fonts = os.path.join(home, "matplotlib")
    if "matplotlib" in {normalize(n) for n in data["packages"]}:
        say("building matplotlib's font cache")
        os.makedirs(fonts, exist_ok=True)
        env = dict(os.environ, MPLCONFIGDIR=fonts, MPLBACKEND="Agg")
        done = subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=env,
                              capture_output=True, text=True)
        caches = [n for n in os.listdir(fonts) if n.startswith("fontlist-") and n.endswith(".json")]
        if done.returncode != 0 or not caches:
            fail("prepare", "matplotlib's font cache was not built: %s" % done.stderr[-500:], 6)
        for name in os.listdir(fonts):  # only the font cache: nothing else matplotlib wrote
            if name not in caches:
                path = os.path.join(fonts, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        os.chmod(fonts, 0o755)
        for name in caches:
            os.chmod(os.path.join(fonts, name), 0o644)
        shutil.copyfile(os.path.join(home, "flavour_startup.py"), os.path.join(site, HOOK_MODULE + ".py"))
        with open(os.path.join(site, HOOK_PTH), "w", encoding="utf-8") as f:
            f.write("import %s\n" % HOOK_MODULE)
        compileall.compile_file(os.path.join(site, HOOK_MODULE + ".py"), quiet=1)

    say("importing %s" % ", ".join(data["imports"]))
    with tempfile.TemporaryDirectory() as config:
        env = dict(os.environ, MPLCONFIGDIR=os.path.join(config, "mpl"), MPLBACKEND="Agg")
        code = "".join("import %s\n" % module for module in data["imports"])
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            fail("prepare", "the pinned set does not import: %s" % done.stderr[-800:], 6)
        if os.path.isdir(fonts):
            for name in os.listdir(fonts):
                seeded = os.path.join(config, "mpl", name)
                if not (os.path.exists(seeded) and filecmp.cmp(seeded, os.path.join(fonts, name), shallow=False)):
                    fail("prepare", "the start-up hook did not seed matplotlib's font cache", 6)


def main(argv):
    steps = {"fetch": (fetch, 3), "prepare": (prepare, 1)}
    if len(argv) < 1 or argv[0] not in steps or len(argv) - 1 != steps[argv[0]][1]:
        sys.exit("usage: flavour_build.py fetch CONF MANIFEST ROOT | prepare HOME")
    step, _ = steps[argv[0]]
    step(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
