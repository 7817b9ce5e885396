#!/usr/bin/env python3
"""A reverse proxy on loopback that adds `Authorization: Bearer TOKEN` to every request.

The official MCP conformance suite has no option to send an Authorization header, and a server
with principals (SANDBOX_HTTP_TOKENS_FILE) answers 401 without one. scripts/conformance.sh puts
this proxy between the two:

    auth_proxy.py --upstream http://127.0.0.1:PORT --token-file FILE --port-file FILE

It listens on 127.0.0.1 (a free port; the port is written to --port-file once it listens) and
forwards each request, headers and body unchanged but for the hop-by-hop headers and
Authorization, to the upstream server. Responses are streamed back as they arrive: a
text/event-stream answer is relayed event by event, never buffered, so SSE behaves as it would
without the proxy. A response without Content-Length is re-sent chunked. Standard library only;
it stops on SIGTERM or SIGINT.
"""

import argparse
import http.client
import http.server
import os
import signal
import socketserver
import sys
import threading
import urllib.parse

# RFC 9110 section 7.6.1: connection-specific headers, not forwarded by a proxy.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}

UPSTREAM_TIMEOUT = 300  # seconds without a byte from the upstream: a hang, not a slow answer


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None  # (host, port, base path), set in main()
    authorization = None

    def log_message(self, fmt, *args):  # quiet: the script keeps the suite's output readable
        pass

    def do_GET(self):
        self.forward()

    def do_POST(self):
        self.forward()

    def do_DELETE(self):
        self.forward()

    def do_PUT(self):
        self.forward()

    def do_PATCH(self):
        self.forward()

    def do_OPTIONS(self):
        self.forward()

    def do_HEAD(self):
        self.forward()

    def retarget(self, value):
        """A Host or Origin naming this proxy (any loopback name, the proxy's port) names the
        upstream server instead: the server's DNS-rebinding checks then judge the request as
        they would without the proxy (its own origin is allowed, evil.example.com is not)."""
        own = f":{self.server.server_address[1]}"
        if value.endswith(own):
            return value[: -len(own)] + f":{self.upstream[1]}"
        return value

    def read_body(self):
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        return None

    def forward(self):
        host, port, base = self.upstream
        try:
            body = self.read_body()
        except (ValueError, OSError) as err:
            self.send_error(400, f"auth_proxy: unreadable request body: {err}")
            return
        headers = {}
        for name, value in self.headers.items():
            lower = name.lower()
            if lower in HOP_BY_HOP or lower in ("authorization", "content-length"):
                continue
            if lower in ("host", "origin"):
                value = self.retarget(value)
            headers[name] = value
        headers["Authorization"] = self.authorization
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT)
        try:
            # Host goes as the client sent it (retargeted), so the server's Host checks see it.
            conn.putrequest(self.command, base + self.path, skip_host=any(n.lower() == "host" for n in headers), skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, value)
            conn.endheaders(body)
            resp = conn.getresponse()
        except OSError as err:
            conn.close()
            self.send_error(502, f"auth_proxy: the upstream server did not answer: {err}")
            return
        try:
            self.relay(resp)
        except OSError:
            # The client went away (it closed an SSE stream, for one): drop the upstream too.
            self.close_connection = True
        finally:
            conn.close()

    def relay(self, resp):
        self.send_response_only(resp.status, resp.reason)
        length = resp.getheader("Content-Length")
        for name, value in resp.getheaders():
            if name.lower() in HOP_BY_HOP or name.lower() == "content-length":
                continue
            self.send_header(name, value)
        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        if no_body:
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            return
        chunked = length is None
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", length)
        if resp.getheader("Connection", "").lower() == "close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()
        while True:
            # read1: whatever has arrived (one SSE event, say), without waiting for a full buffer.
            data = resp.read1(65536)
            if not data:
                break
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self.wfile.write(data)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that drops a kept-alive connection is no error; anything else is reported.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the server's base URL, http://127.0.0.1:PORT")
    parser.add_argument("--token-file", required=True, help="a file holding the bearer token (first line)")
    parser.add_argument("--port-file", required=True, help="where to write the port once listening")
    args = parser.parse_args()

    url = urllib.parse.urlsplit(args.upstream)
    if url.scheme != "http" or not url.hostname:
        parser.error(f"--upstream must be an http:// URL, not {args.upstream!r}")
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--upstream must be on loopback, not {url.hostname!r}")
    try:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as err:
        parser.error(f"cannot read --token-file: {err}")
    if not token:
        parser.error(f"--token-file {args.token_file} holds no token")

    Proxy.upstream = (url.hostname, url.port or 80, url.path.rstrip("/"))
    Proxy.authorization = f"Bearer {token}"
    server = Server(("127.0.0.1", 0), Proxy)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{server.server_address[1]}\n")
    os.replace(tmp, args.port_file)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
