# Installed into an image flavour's site-packages by python-code-sandbox (a .pth file imports it
# when any interpreter starts). Matplotlib keeps its font cache in MPLCONFIGDIR, which a sandbox
# puts on its empty /tmp: without this, the first matplotlib import in every sandbox would scan
# the fonts again. The cache the image build made is copied there once (a copy, not a link:
# matplotlib rewrites it when it must). Costs a directory listing; never fails.
import os


def _seed(baked="/opt/python-code-sandbox/flavour/matplotlib"):
    config = os.environ.get("MPLCONFIGDIR")
    if not config:
        return
    try:
        for name in os.listdir(baked):
            target = os.path.join(config, name)
            if not name.startswith("fontlist-") or os.path.exists(target):
                continue
            os.makedirs(config, exist_ok=True)
            with open(os.path.join(baked, name), "rb") as f:
                data = f.read()
            temp = "%s.tmp-%d" % (target, os.getpid())
            with open(temp, "wb") as f:
                f.write(data)
            os.replace(temp, target)
    except Exception:
        pass


_seed()
del _seed
