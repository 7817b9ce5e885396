"""Maintains the dependency cache volume; the only code that writes it.

Runs in a maintenance sandbox (root with only CHOWN, FOWNER and DAC_OVERRIDE, no network). The host
passes what to do as one JSON document in the environment (never spliced into this source): `op`
is `publish` (the staged set of `key`), `verify` (a key's set against `expected`) or `list`, after
removing the sets of the keys in `remove`. Every run first puts the volume's root in order and
removes whatever is no set. Prints one JSON object.
"""
import hashlib, json, os, re, secrets, shutil, stat, time
OP = json.loads(os.environ.pop("PCS_MAINTENANCE_OPERATION"))
ROOT = "/opt/deps"
META = os.path.join(ROOT, ".meta")
STAGED = "/opt/stage/target"
KEY = re.compile(r"d-[0-9a-f]{32}\Z")
NAME = re.compile(r"s-[0-9a-f]{32}\Z")
YOUNG = 600  # seconds a publisher may take between its steps

def remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for top, dirs, files in os.walk(path):
            os.chmod(top, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)

def read_manifest(key):
    try:
        fd = os.open(os.path.join(META, key + ".json"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(1 << 20)
    try:
        m = json.loads(data)
    except ValueError:
        return None
    if not isinstance(m, dict) or not NAME.fullmatch(str(m.get("name", ""))):
        return None
    return m

def manifests():
    out = {}
    for entry in os.listdir(META):
        key = entry[:-5] if entry.endswith(".json") else ""
        m = read_manifest(key) if KEY.fullmatch(key) else None
        path = os.path.join(META, entry)
        if m is None or not os.path.isdir(os.path.join(ROOT, m["name"])) or os.path.islink(os.path.join(ROOT, m["name"])):
            if not (entry.startswith(".tmp-") and time.time() - os.lstat(path).st_mtime < YOUNG):
                remove(path)
            continue
        out[key] = m
    return out

def tidy():
    """The root is root's and only traversable; the manifests root's only; no stray entries."""
    os.chown(ROOT, 0, 0)
    os.chmod(ROOT, 0o711)
    if os.path.islink(META) or (os.path.exists(META) and not os.path.isdir(META)):
        remove(META)
    os.makedirs(META, exist_ok=True)
    os.chown(META, 0, 0)
    os.chmod(META, 0o700)
    sets = manifests()
    named = {m["name"] for m in sets.values()}
    removed = []
    for entry in os.listdir(ROOT):
        if entry == ".meta" or entry in named:
            continue
        path = os.path.join(ROOT, entry)
        publishing = NAME.fullmatch(entry) or (entry.startswith(".tmp-") and NAME.fullmatch(entry[5:]))
        if publishing and time.time() - os.lstat(path).st_mtime < YOUNG:
            continue
        remove(path)
        removed.append(entry)
    return sets, removed

def walk(top):
    """Every path under top (top included), relative, sorted; never follows a link."""
    paths = ["."]
    for directory, dirs, files in os.walk(top):
        rel = os.path.relpath(directory, top)
        for name in dirs + files:
            paths.append(os.path.normpath(os.path.join(rel, name)))
    return sorted(paths)

def measure(top):
    digest = hashlib.sha256()
    size = 0
    for rel in walk(top):
        path = os.path.join(top, rel)
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            content = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    content.update(chunk)
            extra = content.hexdigest()
            size += st.st_size
        elif stat.S_ISLNK(st.st_mode):
            extra = os.readlink(path)
        else:
            extra = ""
        kind = stat.S_IFMT(st.st_mode)
        digest.update(json.dumps([rel, kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra]).encode() + b"\n")
    return "sha256:" + digest.hexdigest(), size

def copy(source, dest):
    """Regular files, directories and symlinks, owned by root, without write bits."""
    skipped = 0
    os.mkdir(dest, 0o700)
    for rel in walk(source)[1:]:
        src, dst = os.path.join(source, rel), os.path.join(dest, rel)
        st = os.lstat(src)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst, 0o700)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f, open(dst, "xb") as out:
                shutil.copyfileobj(f, out, 1 << 20)
            os.chmod(dst, 0o555 if st.st_mode & 0o111 else 0o444)
        else:
            skipped += 1
    for rel in reversed(walk(dest)):
        path = os.path.join(dest, rel)
        os.lchown(path, 0, 0)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o555)
    return skipped

def publish(key, requirements):
    existing = read_manifest(key)
    if existing is not None and os.path.isdir(os.path.join(ROOT, existing["name"])):
        return {"status": "exists"}
    name = "s-" + secrets.token_hex(16)
    staging = os.path.join(ROOT, ".tmp-" + name)
    try:
        skipped = copy(STAGED, staging)
        digest, size = measure(staging)
        os.rename(staging, os.path.join(ROOT, name))
    except BaseException:
        remove(staging)
        raise
    manifest = {"key": key, "name": name, "digest": digest, "size": size,
                "requirements": requirements, "published": int(time.time())}
    temp = os.path.join(META, ".tmp-" + name)
    with open(temp, "x") as f:
        json.dump(manifest, f)
    os.chmod(temp, 0o600)
    os.rename(temp, os.path.join(META, key + ".json"))
    return {"status": "published", "name": name, "digest": digest, "size": size, "skipped": skipped}

def verify(key, expected, sets):
    m = sets.get(key)
    if m is None:
        return {"status": "missing"}
    digest, size = measure(os.path.join(ROOT, m["name"]))
    if digest != (expected or m.get("digest")) or digest != m.get("digest"):
        remove(os.path.join(ROOT, m["name"]))
        remove(os.path.join(META, key + ".json"))
        return {"status": "tampered", "digest": digest}
    return {"status": "ok", "name": m["name"], "digest": digest, "size": size}

for key in OP.get("remove", []):
    m = read_manifest(key) if KEY.fullmatch(key) else None
    if m is not None:
        remove(os.path.join(ROOT, m["name"]))
        remove(os.path.join(META, key + ".json"))
sets, strays = tidy()
if OP["op"] == "publish":
    result = publish(OP["key"], OP["requirements"])
elif OP["op"] == "verify":
    result = verify(OP["key"], OP.get("expected"), sets)
else:
    result = {"sets": [{"key": k, "name": m["name"], "size": int(m.get("size", 0)), "digest": m.get("digest", ""),
                        "requirements": m.get("requirements", []), "mtime": int(m.get("published", 0))}
                       for k, m in sorted(sets.items())]}
result["strays"] = strays
print(json.dumps(result))
