"""What a secret brokered at the egress costs a request: HTTPS requests from a session's code to a
host a secret is bound to (the proxy bumps the tunnel and adds the header) against requests to a
host without one (the tunnel is spliced), each on a new connection, through the official MCP
Python SDK over stdio with SANDBOX_NETWORK=allowlist.

    .cache/venv-mcp/bin/python scripts/bench_egress.py [--requests 50] [--bin target/release/python-code-sandbox]
        [--runtime runc]

The upstream is an HTTPS server this script starts on the Docker bridge's address with a CA of its
own (given to the server as SANDBOX_CA_BUNDLE), for two `.test` names mapped there with
SANDBOX_EGRESS_RESOLVE: nothing leaves this machine. Times are measured inside the sandbox around
each `urllib.request.urlopen` (connection, TLS, request and answer). Prints p50/p95 of each, and
the runtime the code ran under. A benchmark, not a test: nothing here asserts on time.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile

from mcp import Client, StdioServerParameters

UPSTREAM = r"""
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"ok" if self.headers.get("Authorization") == "Bearer " + sys.argv[4] else b"no"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((sys.argv[1], 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

CODE = r"""
import json, os, time, urllib.request
def timed(host, n):
    times, answers = [], set()
    for _ in range(n):
        started = time.perf_counter()
        request = urllib.request.Request("https://%s:PORT/" % host, headers={"Authorization": "Bearer " + os.environ["BENCH_KEY"]})
        with urllib.request.urlopen(request, timeout=30) as response:
            answers.add(response.read().decode())
        times.append((time.perf_counter() - started) * 1000)
    return times, sorted(answers)
timed("bumped.test", 3)
timed("spliced.test", 3)
bumped, bumped_answers = timed("bumped.test", N)
spliced, spliced_answers = timed("spliced.test", N)
print(json.dumps({"bumped": bumped, "spliced": spliced, "answers": [bumped_answers, spliced_answers],
                  "kernel": open("/proc/version").read().split()[2]}))
"""


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def bridge_address():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    return words[words.index("inet") + 1].split("/")[0]


def certificates(directory):
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=bench CA", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=bench", "-keyout", "key.pem", "-out", "req.pem")
    with open(os.path.join(directory, "ext"), "w") as f:
        f.write("subjectAltName=DNS:bumped.test,DNS:spliced.test\n")
    openssl("x509", "-req", "-in", "req.pem", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "ext", "-out", "cert.pem")


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--bin", default="target/release/python-code-sandbox")
    parser.add_argument("--runtime", help="SANDBOX_RUNTIME (default: the server's choice, gVisor where registered)")
    args = parser.parse_args()
    host = bridge_address()
    value = "sk-bench-" + os.urandom(8).hex()
    with tempfile.TemporaryDirectory() as directory:
        certificates(directory)
        upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, host, os.path.join(directory, "cert.pem"),
                                     os.path.join(directory, "key.pem"), value], stdout=subprocess.PIPE, text=True)
        try:
            port = int(upstream.stdout.readline())
            secrets = os.path.join(directory, "secrets.toml")
            with open(secrets, "w") as f:
                f.write('[[secret]]\nname = "bench"\nvalue_env = "PCS_BENCH_SECRET"\nhosts = ["bumped.test:%d"]\n'
                        'header = "Authorization"\nformat = "Bearer {value}"\nenv = "BENCH_KEY"\n' % port)
            env = {**os.environ, "LOG_LEVEL": "warn", "SANDBOX_NETWORK": "allowlist",
                   "SANDBOX_EGRESS_ALLOW": "spliced.test:%d,%s/32:%d" % (port, host, port),
                   "SANDBOX_EGRESS_RESOLVE": "bumped.test=%s,spliced.test=%s" % (host, host),
                   "SANDBOX_CA_BUNDLE": os.path.join(directory, "ca.pem"),
                   "SANDBOX_SECRETS_FILE": secrets, "PCS_BENCH_SECRET": value, "SANDBOX_TIMEOUT": "300s"}
            if args.runtime:
                env["SANDBOX_RUNTIME"] = args.runtime
            params = StdioServerParameters(command=os.path.abspath(args.bin), args=[], env=env)
            async with Client(params, read_timeout_seconds=600) as client:
                code = CODE.replace("PORT", str(port)).replace("N)", "%d)" % args.requests)
                result = await client.call_tool("run_python_ephemeral", {"code": code})
                out = (result.structured_content or {}).get("stdout", "")
                if result.is_error or not out.strip():
                    sys.exit("the benchmark's code failed: %s" % (result.content[0].text if result.content else result))
                seen = json.loads(out.strip().splitlines()[-1])
        finally:
            upstream.kill()
    runtime = "gVisor" if seen["kernel"] == "4.4.0" else "runc"
    print("runtime: %s (the kernel the code sees: %s); %d requests each, a new connection each" % (runtime, seen["kernel"], args.requests))
    print("upstream saw the secret: bumped %s, spliced %s" % tuple(seen["answers"]))
    for name in ("spliced", "bumped"):
        samples = seen[name]
        print("%-8s p50 %6.1f ms  p95 %6.1f ms" % (name, percentile(samples, 50), percentile(samples, 95)))


asyncio.run(main())
