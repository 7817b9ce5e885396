"""Test packages built in memory: a minimal valid pure-Python wheel (METADATA, WHEEL, RECORD with
hashes), for the local indexes the egress tests and the adversarial suite serve."""

import base64
import hashlib
import io
import zipfile


def make_wheel(name, version, module_source):
    """One module `name`.py in a wheel: (filename, bytes)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": module_source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: pcs-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{dist}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", record)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()
