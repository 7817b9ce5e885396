# The installer's egress proxy: runs in the proxy container as `python3 -c SOURCE CONFIG_JSON`
# (see src/engine/egress.rs). Allows CONNECT only to the configured hosts and ports, and connects
# only to the global addresses it resolved itself.
import asyncio, ipaddress, json, socket, sys
CONF = json.loads(sys.argv[1])
ALLOW = {(h, p) for h, p in CONF["allow"]}
PRIVATE = set(CONF["private"])
PORT = CONF["port"]
CGNAT = ipaddress.ip_network("100.64.0.0/10")

class Refused(Exception):
    pass

def public(ip):
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                                 or ip.is_unspecified or ip.is_reserved or ip in CGNAT
                                 if isinstance(ip, ipaddress.IPv4Address) else
                                 ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                                 or ip.is_unspecified or ip.is_reserved or ip.is_site_local)

async def open_checked(host, port):
    host = host.lower().rstrip(".")
    if (host, port) not in ALLOW:
        raise Refused("%s:%d is not an allowed index host" % (host, port))
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise Refused("%s does not resolve" % host)
    if host not in PRIVATE:
        for address in addresses:
            if not public(ipaddress.ip_address(address.split("%")[0])):
                raise Refused("%s resolves to the non-public address %s" % (host, address))
    error = None
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port), 30)
        except (OSError, asyncio.TimeoutError) as e:
            error = e
    raise Refused("cannot connect to %s:%d: %s" % (host, port, error))

def split_host_port(text, default):
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = text.partition(":")
    return host, int(port) if port else default

async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass

async def handle(reader, writer):
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if len(head) > 16384:
            raise Refused("request head too large")
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.decode("latin-1").split(" ", 2)
        if method == "CONNECT":
            host, port = split_host_port(target, 443)
            up_reader, up_writer = await open_checked(host, port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif target.startswith("http://"):
            authority, _, path = target[7:].partition("/")
            host, port = split_host_port(authority, 80)
            up_reader, up_writer = await open_checked(host, port)
            up_writer.write(("%s /%s %s\r\n" % (method, path, version)).encode("latin-1") + rest)
        else:
            raise Refused("only CONNECT and absolute http:// requests are proxied")
        await writer.drain()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    except Refused as e:
        body = ("refused by the installer's egress proxy: %s\n" % e).encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            await writer.drain()
        except OSError:
            pass
        writer.close()
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "0.0.0.0", PORT, limit=16384)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
