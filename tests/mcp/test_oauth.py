"""`serve --http` as an OAuth 2.1 resource server (SANDBOX_OAUTH_ISSUER, SANDBOX_OAUTH_JWKS,
SANDBOX_HTTP_RESOURCE_URL): JWT access tokens signed by a key the test makes, checked against the
issuer's JWKS read from a file or fetched from a local HTTP server the test starts. Driven by the
official Python SDK over streamable HTTP against the real binary on a loopback port."""

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import threading
import time

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import BIN, sandboxes
from test_http import http_server, mcp_client, post

pytestmark = pytest.mark.anyio

ISSUER = "https://issuer.test/realms/team"
KID = "key-1"


def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk_of(private_key, kid=KID):
    jwk = jwt.algorithms.RSAAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    jwk.update({"kid": kid, "use": "sig", "alg": "RS256"})
    return jwk


KEY = rsa_key()
JWKS = {"keys": [jwk_of(KEY)]}


def free_port():
    """A loopback port free now, so that the resource URL is known before the server starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token(resource, key=KEY, kid=KID, **changes):
    """An access token for `resource`; `changes` replace claims (None removes one)."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": resource, "sub": "alice", "iat": now, "exp": now + 300, "scope": "openid sandbox:run"}
    for name, value in changes.items():
        if value is None:
            claims.pop(name, None)
        else:
            claims[name] = value
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


@contextlib.contextmanager
def oauth_server(jwks_source, port):
    resource = f"http://127.0.0.1:{port}/mcp"
    with http_server(
        addr=f"127.0.0.1:{port}",
        SANDBOX_OAUTH_ISSUER=ISSUER,
        SANDBOX_OAUTH_JWKS=jwks_source,
        SANDBOX_HTTP_RESOURCE_URL=resource,
    ) as server:
        assert server.url == resource
        yield server


@contextlib.contextmanager
def jwks_endpoint(document):
    """The issuer's jwks_uri, served on a loopback port in a thread; counts its requests."""
    body = json.dumps(document).encode()
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path != "/jwks":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/jwks", hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def challenge_of(response):
    header = response.headers["www-authenticate"]
    assert header.startswith("Bearer "), header
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


async def test_a_valid_access_token_runs_code_and_every_bad_one_is_refused_with_its_reason(tmp_path):
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(JWKS))
    port = free_port()
    with oauth_server(jwks, port) as server:
        resource = server.url
        origin = f"http://127.0.0.1:{port}"
        metadata_url = f"{origin}/.well-known/oauth-protected-resource/mcp"

        # The metadata, without a token, at both well-known paths.
        with httpx2.Client(timeout=30) as http:
            for url in (metadata_url, f"{origin}/.well-known/oauth-protected-resource"):
                answer = http.get(url)
                assert answer.status_code == 200, (url, answer.text)
                assert answer.json() == {
                    "resource": resource,
                    "authorization_servers": [ISSUER],
                    "scopes_supported": ["sandbox:run", "sandbox:admin"],
                    "bearer_methods_supported": ["header"],
                }

        # No token: 401 pointing at the metadata, with no error (nothing was wrong but absence).
        missing = post(resource, token=None)
        assert missing.status_code == 401, missing.text
        assert challenge_of(missing) == {"resource_metadata": metadata_url, "scope": "sandbox:run"}

        # A valid token: the official client runs code.
        async with mcp_client(resource, token=token(resource)) as client:
            result = await client.call_tool("run_python_ephemeral", {"code": "print('hello oauth')"})
            assert result.is_error is False
            assert result.structured_content["stdout"] == "hello oauth\n"

        # Each bad token: 401 invalid_token, saying what is wrong.
        other_key = rsa_key()
        now = int(time.time())
        for bad, reason in [
            (token("https://another.example.com/mcp"), "aud must include " + resource),
            (token(resource, exp=now - 600), "expired"),
            (token(resource, nbf=now + 600), "not valid yet"),
            (token(resource, key=other_key), "signature"),
            (token(resource, key=other_key, kid="key-2"), "kid `key-2`"),
            (token(resource, iss="https://evil.test"), "another issuer"),
            (token(resource, sub=None), "no sub claim"),
            (jwt.encode({"iss": ISSUER, "aud": resource, "sub": "x", "exp": now + 60, "scope": "sandbox:run"}, "s" * 32, algorithm="HS256"), "HS256"),
        ]:
            refused = post(resource, token=bad)
            assert refused.status_code == 401, (reason, refused.text)
            challenge = challenge_of(refused)
            assert challenge["error"] == "invalid_token", challenge
            assert reason in challenge["error_description"], challenge
            assert challenge["resource_metadata"] == metadata_url
            assert reason in refused.text

        # A valid token without sandbox:run: 403 insufficient_scope.
        unscoped = post(resource, token=token(resource, scope="openid profile"))
        assert unscoped.status_code == 403, unscoped.text
        challenge = challenge_of(unscoped)
        assert challenge["error"] == "insufficient_scope"
        assert challenge["scope"] == "sandbox:run"

        # The official client with a bad token gets nowhere.
        with pytest.raises(Exception):
            async with mcp_client(resource, token=token(resource, exp=now - 600)) as client:
                await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
    assert sandboxes() == []


async def session_ids(client):
    listed = await client.call_tool("sandbox_list", {})
    return sorted(s["container_id"] for s in listed.structured_content["sessions"])


async def test_subjects_are_principals_and_the_admin_scope_sees_them_all():
    with jwks_endpoint(JWKS) as (jwks_url, hits):
        port = free_port()
        with oauth_server(jwks_url, port) as server:
            resource = server.url
            assert hits == ["/jwks"], "fetched once at start"
            alice = token(resource, sub="alice")
            bob = token(resource, sub="bob")
            root = token(resource, sub="root", scope=None, scp=["sandbox:run", "sandbox:admin"])
            async with mcp_client(resource, token=alice) as a_client, mcp_client(resource, token=bob) as b_client:
                a = (await a_client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
                await a_client.call_tool("run_python", {"container_id": a, "code": "secret = 'alice'"})
                assert await session_ids(b_client) == []
                stolen = await b_client.call_tool("run_python", {"container_id": a, "code": "print(secret)"})
                assert stolen.is_error, stolen
            async with mcp_client(resource, token=root) as admin:
                assert await session_ids(admin) == [a]
            # A quota from the token's sandbox_quotas claim: one session at most.
            capped = token(resource, sub="carol", sandbox_quotas={"sessions": 1})
            async with mcp_client(resource, token=capped) as carol:
                assert not (await carol.call_tool("sandbox_initialize", {})).is_error
                over = await carol.call_tool("sandbox_initialize", {})
                assert over.is_error and "Over quota" in "".join(b.text for b in over.content), over
            # A token naming a key the server does not hold does not make it fetch again at once.
            stranger = token(resource, key=rsa_key(), kid="key-9")
            assert post(resource, token=stranger).status_code == 401
            assert hits == ["/jwks"], "no refetch within a minute of the last"
    assert sandboxes() == []


def test_a_jwks_that_cannot_be_loaded_stops_the_start(tmp_path):
    empty = tmp_path / "jwks.json"
    empty.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}]}))
    port = free_port()
    env = dict(os.environ)
    env.update({
        "SANDBOX_OAUTH_ISSUER": ISSUER,
        "SANDBOX_OAUTH_JWKS": str(empty),
        "SANDBOX_HTTP_RESOURCE_URL": f"http://127.0.0.1:{port}/mcp",
        "SANDBOX_POOL_SIZE": "0",
    })
    done = subprocess.run([os.path.abspath(BIN), "serve", "--http", f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "no signing key" in done.stderr, done.stderr
    # Half the settings: refused before anything starts, naming what is missing.
    del env["SANDBOX_OAUTH_JWKS"]
    done = subprocess.run([os.path.abspath(BIN), "serve", "--http", f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "SANDBOX_OAUTH_JWKS" in done.stderr
