"""What the egress tests talk to: an `--internal` Docker network standing in for the proxy's uplink,
and HTTP, HTTPS and package-index endpoints that this test process serves on the host's address on
that network. The uplink has no route out of the machine, so even a proxy that let everything
through could reach nothing but these endpoints.

Nothing here knows about the server: test_egress.py builds the server's settings from `Lab`.
"""

import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wheels import make_wheel  # noqa: E402

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PROBE_WHEEL = "pcs_egress_probe-1.0-py3-none-any.whl"
PROBE_PROJECT = "pcs-egress-probe"


def docker(*args, check=True):
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


class Endpoint:
    """An HTTP (or, given a TLS context, HTTPS) server on `address`, in threads of this process.
    Known paths answer their route's body; any other path answers `body`. Every request is
    recorded as (method, path, Host header), the path in origin form even when a proxy forwarded
    it in absolute form."""

    def __init__(self, address, body, routes=None, tls=None):
        self.requests = []
        # Every request's Authorization headers (the secrets brokered at the egress).
        self.authorizations = []
        self.lock = threading.Lock()
        endpoint = self
        routes = dict(routes or {})

        class Handler(http.server.BaseHTTPRequestHandler):
            # A client that stalls mid-request never holds a thread for long.
            timeout = 20

            def do_GET(self):
                path = self.path
                if "://" in path:
                    path = "/" + path.split("://", 1)[1].partition("/")[2]
                with endpoint.lock:
                    endpoint.requests.append(("GET", path, self.headers.get("Host", "")))
                    endpoint.authorizations.append(self.headers.get_all("Authorization") or [])
                content_type, data = routes.get(path.split("?", 1)[0], ("text/plain", body))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            # The handshake happens in the request's own thread, on its first read: a client that
            # never completes one cannot block the accepting thread.
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def seen(self):
        with self.lock:
            return list(self.requests)

    def paths(self):
        return [path for _, path, _ in self.seen()]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def index_routes():
    """A PEP 503 simple index with one project, pcs-egress-probe, and its one wheel."""
    filename, wheel = make_wheel("pcs_egress_probe", "1.0", "VALUE = 'probe'\n")
    assert filename == PROBE_WHEEL
    digest = hashlib.sha256(wheel).hexdigest()
    root = f'<!DOCTYPE html><html><body><a href="/simple/{PROBE_PROJECT}/">{PROBE_PROJECT}</a></body></html>'
    project = (f'<!DOCTYPE html><html><body><a href="/files/{filename}#sha256={digest}">{filename}</a>'
               "</body></html>")
    return {
        "/simple/": ("text/html", root.encode()),
        f"/simple/{PROBE_PROJECT}/": ("text/html", project.encode()),
        f"/files/{filename}": ("application/octet-stream", wheel),
    }


def make_ca(directory):
    """A throwaway CA and a certificate for secure.test it signed (openssl CLI): paths of the CA
    certificate, the leaf certificate and the leaf key."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca_cert = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr, cert = (os.path.join(directory, n) for n in ("leaf.key", "leaf.csr", "leaf.pem"))
    extensions = os.path.join(directory, "leaf.ext")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_cert, "-days", "2",
            "-subj", "/CN=python-code-sandbox egress test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=secure.test")
    with open(extensions, "w") as f:
        f.write("subjectAltName=DNS:secure.test\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
            "-days", "2", "-extfile", extensions)
    return ca_cert, cert, key


class Lab:
    """The uplink network, the endpoints on its gateway address, and the CA bundle the sandboxes
    trust. `close()` removes all of it; it raises when a container was still attached to the
    network (something the server should have removed)."""

    def __init__(self):
        self.network = "pcs-test-uplink-" + uuid.uuid4().hex[:12]
        docker("network", "create", "--internal", self.network)
        self.endpoints = []
        self.dir = tempfile.mkdtemp(prefix="pcs-egress-lab-")
        try:
            config = json.loads(docker("network", "inspect", self.network))[0]["IPAM"]["Config"]
            self.gateway = config[0]["Gateway"]
            self.data = self._serve(b"hello from data.test\n")
            ca_cert, cert, key = make_ca(self.dir)
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(cert, key)
            self.secure = self._serve(b"hello from secure.test\n", tls=tls)
            self.index = self._serve(b"not found\n", routes=index_routes())
            # The system's CA bundle plus the test CA: what SANDBOX_CA_BUNDLE names.
            self.ca_bundle = os.path.join(self.dir, "ca-bundle.crt")
            with open(self.ca_bundle, "wb") as out:
                if os.path.exists(SYSTEM_BUNDLE):
                    with open(SYSTEM_BUNDLE, "rb") as system:
                        out.write(system.read().rstrip(b"\n") + b"\n")
                with open(ca_cert, "rb") as ca:
                    out.write(ca.read())
            os.chmod(self.ca_bundle, 0o644)
            self.ca_cert = ca_cert
        except BaseException:
            self.close()
            raise

    def _serve(self, body, routes=None, tls=None):
        endpoint = Endpoint(self.gateway, body, routes=routes, tls=tls)
        self.endpoints.append(endpoint)
        return endpoint

    def env(self, **overrides):
        """The server settings of the egress tests (overrides replace or, as None, remove one)."""
        gw, p_http, p_https, p_index = self.gateway, self.data.port, self.secure.port, self.index.port
        env = {
            "SANDBOX_NETWORK": "allowlist",
            "SANDBOX_EGRESS_UPLINK": self.network,
            "SANDBOX_EGRESS_RESOLVE": ",".join([
                f"data.test={gw}", f"secure.test={gw}", f"index.test={gw}", "private.test=127.0.0.1",
                f"ask.test={gw}", f"ask2.test={gw}"]),
            "SANDBOX_EGRESS_ALLOW": ",".join([
                f"data.test:{p_http}", f"secure.test:{p_https}", f"index.test:{p_index}", f"private.test:{p_http}",
                f"{gw}/32:{p_http}", f"{gw}/32:{p_https}", f"{gw}/32:{p_index}"]),
            "SANDBOX_EGRESS_ASK": f"ask.test:{p_http},ask2.test:{p_http}",
            "SANDBOX_CA_BUNDLE": self.ca_bundle,
            "SANDBOX_POOL_SIZE": "0",
            "SANDBOX_TIMEOUT": "120s",
            "SANDBOX_FILES_DIR": "",
        }
        for name, value in overrides.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        return env

    def attached(self):
        """Names of the containers still attached to the uplink network."""
        try:
            found = json.loads(docker("network", "inspect", self.network))
        except RuntimeError:
            return []
        return sorted(c.get("Name", cid) for cid, c in (found[0].get("Containers") or {}).items())

    def close(self):
        for endpoint in self.endpoints:
            endpoint.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        left = self.attached()
        for name in left:
            docker("network", "disconnect", "-f", self.network, name, check=False)
        docker("network", "rm", self.network, check=False)
        if left:
            raise AssertionError(f"containers were still attached to the uplink network: {left}")
