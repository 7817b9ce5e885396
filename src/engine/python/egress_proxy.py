# The egress proxy: runs in the proxy container as `python3 -c SOURCE CONFIG_JSON` (see
# src/engine/egress/). It decides nothing itself: for every connection it asks the server, over its
# own stdin/stdout (one JSON document a line), whether the sandbox at the connection's source
# address may reach the host and port it names; for an allowed name it resolves the name and asks
# again with the addresses (the server refuses non-public ones); then it connects only to the
# addresses the server accepted and reports the bytes each way when the connection ends.
import asyncio, json, socket, sys

CONF = json.loads(sys.argv[1])
PORT = CONF["port"]
# Test-only names (`*.test`), mapped to addresses without asking any resolver.
RESOLVE = CONF.get("resolve", {})
CONNECT_TIMEOUT = 10
HEAD_LIMIT = 16384

questions = {}   # question id -> future of the server's answer
connections = {}  # connection id -> [source, bytes sent, bytes received]
counter = [0]


def send(message):
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def next_id():
    counter[0] += 1
    return counter[0]


class Refused(Exception):
    pass


class Unresolved(Refused):
    """The name does not resolve (the proxy's own finding: the server allowed the name)."""


async def ask(message):
    """Sends a question to the server and waits for its answer (a closed channel refuses)."""
    q = next_id()
    future = asyncio.get_running_loop().create_future()
    questions[q] = future
    message["q"] = q
    send(message)
    try:
        answer = await asyncio.wait_for(future, 30)
    except asyncio.TimeoutError:
        raise Refused("the server did not answer")
    finally:
        questions.pop(q, None)
    if not answer.get("ok"):
        raise Refused(str(answer.get("why", "refused")))
    return answer


def is_address(host):
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


async def open_checked(conn, source, host, port):
    host = host.lower().rstrip(".")
    await ask({"op": "ask", "conn": conn, "src": source, "host": host, "port": port})
    if is_address(host):
        addresses = [host]
    else:
        if host in RESOLVE:
            addresses = [RESOLVE[host]]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                raise Unresolved("%s does not resolve (%s)" % (host, e.strerror or e))
            addresses = list(dict.fromkeys(info[4][0] for info in infos))
        # Every address of a name is judged, mapped ones too.
        await ask({"op": "resolved", "conn": conn, "host": host, "port": port, "addresses": addresses})
    error = None
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            error = e
    raise ConnectFailed("cannot connect to %s:%d: %s" % (host, port, error or "no address"),
                        failure_of(error))


class ConnectFailed(Exception):
    def __init__(self, message, failure):
        super().__init__(message)
        self.failure = failure


def failure_of(error):
    """The word the server reads for why a connection could not be made."""
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    return "unreachable"


def split_host_port(text, default):
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.partition(":")
    return host, int(port) if port else default


async def pipe(reader, writer, conn, index):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            record = connections.get(conn)
            if record is not None:
                record[index] += len(data)
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def refuse(writer, reason):
    body = ("refused by the sandbox's egress proxy: %s\n" % reason).encode()
    writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def handle(reader, writer):
    conn = next_id()
    peer = writer.get_extra_info("peername") or ("", 0)
    source = peer[0]
    error = None
    failure = None
    opened = False
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.decode("latin-1").split(" ", 2)
        connections[conn] = [source, 0, 0]
        if method == "CONNECT":
            host, port = split_host_port(target, 443)
            up_reader, up_writer = await open_checked(conn, source, host, port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif target.startswith("http://"):
            authority, _, path = target[7:].partition("/")
            host, port = split_host_port(authority, 80)
            up_reader, up_writer = await open_checked(conn, source, host, port)
            first = ("%s /%s %s\r\n" % (method, path, version)).encode("latin-1") + rest
            connections[conn][1] += len(first)
            up_writer.write(first)
        else:
            connections.pop(conn, None)
            raise ValueError("not a proxy request")
        opened = True
        await writer.drain()
        await asyncio.gather(pipe(reader, up_writer, conn, 1), pipe(up_reader, writer, conn, 2))
    except (Refused, ConnectFailed) as e:
        error = str(e)
        if isinstance(e, ConnectFailed):
            failure = e.failure
        elif isinstance(e, Unresolved):
            failure = "unresolved"
        refuse(writer, e)
        try:
            await writer.drain()
        except OSError:
            pass
        writer.close()
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
        if conn in connections and not opened:
            error = "the connection ended before it was made (%s)" % type(e).__name__
        writer.close()
    finally:
        record = connections.pop(conn, None)
        if record is not None:
            send({"op": "closed", "conn": conn, "sent": record[1], "received": record[2], "error": error,
                  "failure": failure})


async def control():
    """Reads the server's answers and requests from stdin; exits when the server goes away."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "a" in message:
            future = questions.get(message["a"])
            if future is not None and not future.done():
                future.set_result(message)
        elif "flush" in message:
            source = message.get("src")
            send({"op": "flushed", "flush": message["flush"],
                  "open": [[c, r[1], r[2]] for c, r in connections.items() if r[0] == source]})


async def main():
    server = await asyncio.start_server(handle, "0.0.0.0", PORT, limit=HEAD_LIMIT)
    send({"op": "listening"})
    async with server:
        await control()
    # The server that started this proxy is gone: so is the proxy.
    sys.exit(0)


asyncio.run(main())
