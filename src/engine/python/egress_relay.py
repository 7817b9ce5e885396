# The egress proxy container's pid 1: runs as `python3 -c SOURCE CONFIG_JSON` (see
# src/engine/egress/). The proxy itself is Squid; this relay only carries words between Squid and
# the server, which decides everything:
#   - Squid asks about every request (`external_acl_type`, ttl=0) through a helper it spawns; the
#     helper passes each line to this relay over a Unix socket, the relay asks the server over its
#     attached stdin/stdout (one JSON document a line) and hands the server's answer back;
#   - Squid's access log (its stdout, a pipe to this relay) becomes the server's record of each
#     request: outcome, bytes, and why one failed;
#   - the files Squid reads (its configuration, written by the server; the networks this container
#     sits on, found here; the test-only name map; the refusal pages) are written before it starts;
#   - with secrets (CONF["bump"]), the proxy's CA is made here at start-up (its key stays in this
#     container's tmpfs, readable by this uid only) and its certificate is sent to the server,
#     which makes the code's sandboxes trust it; Squid asks a second question with a tunnel's SNI
#     before bumping it, over a socket of its own (SNI_SOCKET), and the server's yes to a request
#     inside a bumped tunnel carries the header values Squid adds (notes `pcs_h0`, ...).
# When the server goes away (stdin closes), Squid is stopped and the container ends.
import asyncio, ipaddress, json, os, signal, socket, sys, urllib.parse

CONF = json.loads(sys.argv[1])
HOME = "/tmp/pcs"
SOCKET = HOME + "/decide.sock"
SNI_SOCKET = HOME + "/sni.sock"
NOTE_NAME = __import__("re").compile(r"^[a-z][a-z0-9_]{0,31}$")
# What Squid runs as its helper: a pipe between Squid and the relay's socket, nothing more.
HELPER = r'''
import socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def back():
    for line in s.makefile("rb"):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    sys.exit(0)
threading.Thread(target=back, daemon=True).start()
for line in sys.stdin.buffer:
    s.sendall(line)
'''
# A line Squid or the server writes is at most this long; a longer one is dropped. Squid's
# questions quote a request's headers, at most `request_header_max_size` (64 KB, squid.conf) in
# all, each byte at most three once quoted: well below it.
MAX_LINE = 1 << 18
# At most this many header values follow a question (the headers the proxy can set).
MAX_SENT = 256

questions = {}  # question id -> (helper writer, Squid's channel id)
unlogged = {}  # source address -> ids of Squid transactions asked about and not logged yet
flushes = []  # (source, flush id, deadline) waiting for those transactions' log lines
counter = [0]


def send(message):
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def own_networks():
    """The networks this container is on, minus its default gateway (the engine's host, which an
    allow entry may name): no request may reach the proxy's neighbours on its uplink."""
    networks, gateways = [], []
    with open("/proc/net/route") as routes:
        next(routes)
        for line in routes:
            fields = line.split()
            destination, gateway, mask = (int(fields[i], 16) for i in (1, 2, 7))
            to_address = lambda n: ipaddress.IPv4Address(socket.ntohl(n))
            if destination == 0 and mask == 0:
                gateways.append(to_address(gateway))
            elif gateway == 0:
                networks.append(ipaddress.IPv4Network("%s/%s" % (to_address(destination), to_address(mask))))
    pieces = []
    for network in networks:
        parts = [network]
        for gateway in gateways:
            if gateway in network:
                parts = [p for part in parts for p in (part.address_exclude(ipaddress.IPv4Network(gateway))
                                                      if gateway in part else [part])]
        pieces.extend(parts)
    return [str(p) for p in pieces]


def write(path, text):
    with open(path, "w") as out:
        out.write(text)


def prepare():
    os.makedirs(HOME + "/errors", exist_ok=True)
    write(HOME + "/squid.conf", CONF["squid_conf"])
    write(HOME + "/helper.py", HELPER)
    write(HOME + "/hosts", "".join("%s %s\n" % (address, name) for name, address in CONF["resolve"].items()))
    write(HOME + "/forbidden", "".join(n + "\n" for n in CONF["forbidden"] + own_networks()))
    for name, text in CONF["pages"].items():
        write(HOME + "/errors/" + name, text)
    if CONF.get("bump"):
        make_ca()


def make_ca():
    """The proxy's CA: made here, for this proxy only; the key never leaves this container."""
    import subprocess
    old = os.umask(0o077)
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", HOME + "/ca.key", "-out", HOME + "/ca.pem", "-days", "30",
             "-subj", "/O=python-code-sandbox/CN=python-code-sandbox egress proxy " + os.urandom(6).hex(),
             "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
        subprocess.run(["/usr/lib/squid/security_file_certgen", "-c", "-s", HOME + "/ssl_db", "-M", "4MB"],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=60)
    finally:
        os.umask(old)

def field(text):
    return urllib.parse.unquote(text)


def optional(text):
    """A format field Squid may leave empty (it sends `-` then)."""
    return None if text == "-" else field(text)


def from_squid(line, writer, kind="ask"):
    """A helper line: `channel transaction source host port method host-header sni [header...]`
    (`ask`), or
    `channel transaction source host port sni` (`sni`: the question before a tunnel is bumped)."""
    parts = line.decode("latin-1").split()
    wanted = 8 if kind == "ask" else 6
    if len(parts) < wanted:
        if parts:
            writer.write(("%s ERR message=%s\n" % (parts[0], urllib.parse.quote("unreadable question"))).encode())
        return
    channel, conn, source, host, port = parts[:5]
    counter[0] += 1
    q = counter[0]
    questions[q] = (writer, channel)
    try:
        port = int(port)
    except ValueError:
        port = 0
    message = {"op": kind, "q": q, "conn": int(conn) if conn.isdigit() else None, "src": source,
               "host": field(host), "port": port}
    if kind == "ask":
        if conn.isdigit():
            unlogged.setdefault(source, set()).add(int(conn))
        # Then, with secrets, the values of the headers the proxy can set (as sent).
        message.update(method=field(parts[5]), host_header=optional(parts[6]), sni=optional(parts[7]),
                       sent=[optional(p) for p in parts[8:8 + MAX_SENT]])
    else:
        message.update(sni=optional(parts[5]))
    send(message)


def answer(message):
    asked = questions.pop(message.get("a"), None)
    if asked is None:
        return
    writer, channel = asked
    if message.get("ok"):
        line = "%s OK tag=%s" % (channel, urllib.parse.quote(str(message.get("tag", "code"))))
        for key, value in (message.get("notes") or {}).items():
            # The server's notes (the bump, a header's value): printable ASCII, no quotes.
            value = str(value)
            if NOTE_NAME.match(str(key)) and value and all(32 <= ord(c) < 127 and c not in '"\\' for c in value):
                line += ' %s="%s"' % (key, value)
        line += "\n"
    else:
        why = urllib.parse.quote(str(message.get("why", "refused"))[:2000])
        line = "%s ERR message=%s\n" % (channel, why)
    try:
        writer.write(line.encode())
    except (OSError, RuntimeError):
        pass


async def helper_connected(reader, writer, kind="ask"):
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            if len(line) <= MAX_LINE:
                from_squid(line, writer, kind)
    except (OSError, ValueError, asyncio.LimitOverrunError):
        pass
    finally:
        for q in [q for q, (w, _) in questions.items() if w is writer]:
            questions.pop(q, None)
        writer.close()


def number(text):
    return int(text) if text.isdigit() else 0


def resolved(host):
    """The addresses of a name Squid refused for where it resolves (the reason names one)."""
    if host in CONF["resolve"]:
        return [CONF["resolve"][host]]
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return []


def connect_errno(address, port):
    """Why a connection to the address Squid just failed to reach fails (Squid logs the errno of a
    tunnel's failure, not of a plain request's): the address it tried, never a new lookup."""
    try:
        socket.create_connection((address, port), timeout=3).close()
        return None
    except socket.timeout:
        return 110
    except OSError as e:
        return e.errno


# Lookups that explain a refusal or a failure (below) run beside the log, never in its way: Squid
# writes its log into a pipe, and a relay that stopped reading it would stop Squid for everyone.
# At most this many at once; beyond them a line goes as it is.
MAX_EXPLAINING = 8
explaining = [0]


def parse(line):
    """An access log line (see the `logformat` of the configuration), as the server reads it."""
    parts = line.decode("latin-1").split()
    if len(parts) != 12:
        return None, None
    conn, source, method, host, port, status, squid, from_client, to_client, error, detail, server = parts
    return {"op": "logged", "conn": int(conn) if conn.isdigit() else None, "src": source,
            "method": field(method), "host": field(host), "port": number(port), "status": number(status),
            "squid": squid, "sent": number(from_client), "received": number(to_client),
            "error": None if error == "-" else error, "detail": None if detail == "-" else field(detail)}, server


def needs_explaining(record, server):
    if record["error"] == "ERR_PCS_ADDRESS":
        return True
    return (record["error"] == "ERR_CONNECT_FAIL" and not (record["detail"] or "").startswith("errno=")
            and server != "-" and bool(record["port"]))


async def explain(record, server):
    loop = asyncio.get_running_loop()
    try:
        if record["error"] == "ERR_PCS_ADDRESS":
            record["addresses"] = await loop.run_in_executor(None, resolved, record["host"])
        else:
            errno = await loop.run_in_executor(None, connect_errno, server, record["port"])
            if errno:
                record["detail"] = "errno=%d" % errno
    finally:
        explaining[0] -= 1
        deliver(record)


def deliver(record):
    if record["conn"] is not None:
        unlogged.get(record["src"], set()).discard(record["conn"])
    send(record)
    answer_flushes()


def logged(line):
    record, server = parse(line)
    if record is None:
        return
    if needs_explaining(record, server) and explaining[0] < MAX_EXPLAINING:
        explaining[0] += 1
        asyncio.ensure_future(explain(record, server))
    else:
        deliver(record)


def answer_flushes(now=None):
    """Answers each flush whose source has no request left to log, or whose wait is over."""
    now = now if now is not None else asyncio.get_running_loop().time()
    for entry in list(flushes):
        source, flush, deadline = entry
        if not unlogged.get(source) or now >= deadline:
            flushes.remove(entry)
            send({"op": "flushed", "flush": flush})


async def read_log(stream):
    while True:
        try:
            line = await stream.readline()
        except (ValueError, asyncio.LimitOverrunError):
            # An overlong line is dropped (the reader skips it); the log goes on being read.
            continue
        if not line:
            break
        if len(line) <= MAX_LINE:
            logged(line)


async def control(squid):
    """The server's answers and requests, until it goes away."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        try:
            line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            continue
        if not line:
            break
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "a" in message:
            answer(message)
        elif "flush" in message:
            # What the source's requests did so far: their log lines come first (a request that
            # just ended is logged within moments; one still open is counted when it ends).
            flushes.append((message.get("src"), message["flush"], loop.time() + CONF.get("flush_wait", 0.3)))
            answer_flushes()
            loop.call_later(CONF.get("flush_wait", 0.3) + 0.01, answer_flushes)


async def listening(squid, port):
    """Waits until Squid accepts connections (or ends)."""
    for _ in range(600):
        if squid.returncode is not None:
            return False
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return True
        except OSError:
            await asyncio.sleep(0.05)
    return False


async def main():
    prepare()
    helpers = await asyncio.start_unix_server(helper_connected, SOCKET, limit=MAX_LINE * 2)
    sni_helpers = await asyncio.start_unix_server(
        lambda r, w: helper_connected(r, w, "sni"), SNI_SOCKET, limit=MAX_LINE * 2)
    squid = await asyncio.create_subprocess_exec(
        "/usr/sbin/squid", "-N", "-f", HOME + "/squid.conf",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, limit=MAX_LINE * 2)
    log = asyncio.ensure_future(read_log(squid.stdout))
    if await listening(squid, CONF["port"]):
        with open(HOME + "/forbidden") as forbidden:
            listening_message = {"op": "listening", "forbidden": forbidden.read().split()}
        if CONF.get("bump"):
            with open(HOME + "/ca.pem") as ca:
                listening_message["ca"] = ca.read()
        send(listening_message)
        server = asyncio.ensure_future(control(squid))
        ended = asyncio.ensure_future(squid.wait())
        await asyncio.wait([server, ended], return_when=asyncio.FIRST_COMPLETED)
    if squid.returncode is None:
        squid.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(squid.wait(), 5)
        except asyncio.TimeoutError:
            squid.kill()
    log.cancel()
    helpers.close()
    sni_helpers.close()
    # The server that started this proxy is gone (or Squid is): so is the proxy.
    sys.exit(0 if squid.returncode in (0, -signal.SIGTERM) else 1)


asyncio.run(main())
