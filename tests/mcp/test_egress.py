"""SANDBOX_NETWORK=allowlist (issue 18): the code's only way out is the server's egress proxy,
which reaches the hosts SANDBOX_EGRESS_ALLOW names and those the user approves
(SANDBOX_EGRESS_ASK, asked through MCP elicitation), through the official MCP Python SDK against
the real engine.

No traffic leaves this machine: the proxy's uplink (SANDBOX_EGRESS_UPLINK) is an `--internal`
network this module creates, every allowed name is mapped (SANDBOX_EGRESS_RESOLVE, `.test`
names only) to the host's address on that network, where this process serves the endpoints; every
other target is refused by the proxy before it connects anywhere (see egress_endpoints.py).
"""

import json
import os
import select
import signal
import subprocess
import time
import uuid

import anyio
import pytest
from mcp import types

from conftest import BIN, LABEL, connect, find_server_pid, sandboxes, server_params, text_of
from mcp import Client
from mcp.client.stdio import stdio_client
from egress_endpoints import PROBE_WHEEL, Lab, docker

pytestmark = pytest.mark.anyio

# Networked code keeps gVisor (issue 46): these servers choose their runtime themselves, so the
# code's sandboxes run under gVisor's networked entry (runsc-net) where scripts/runsc.sh
# registered it, as the product does by default.
UNDER_DEFAULT_RUNTIME = True

LABEL_PID = "io.python-code-sandbox.pid"
LABEL_INSTANCE = "io.python-code-sandbox.instance"
LABEL_KIND = "io.python-code-sandbox.kind"
SANDBOX_KINDS = {"session", "ephemeral", "pool", "installer"}
# The handshake-era revision: the server can send the client a request (the elicitation) of its
# own. Under 2026-07-28, which the SDK negotiates by default over stdio, a server asks only inside a
# call's own exchange.
LEGACY = "legacy"


@pytest.fixture(scope="module")
def lab():
    made = Lab()
    try:
        yield made
    finally:
        made.close()


# --- Helpers -------------------------------------------------------------------------------------

# Run in the sandbox: fetch(url) through whatever proxy the environment names (urllib reads
# HTTP_PROXY/HTTPS_PROXY), answering the status and body, also of an HTTP error.
FETCH = r"""
import json, urllib.error, urllib.request
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return {"status": r.status, "body": r.read().decode(errors="replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode(errors="replace")}
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}
"""


def fetch_code(*urls):
    """Code that fetches each url in turn and prints one JSON line per url."""
    return FETCH + "".join(f"print(json.dumps(fetch({url!r})))\n" for url in urls)


def fetched(result, count):
    """The JSON lines fetch_code printed (the call must have succeeded)."""
    assert result.is_error is False, text_of(result)
    lines = result.structured_content["stdout"].splitlines()
    assert len(lines) == count, text_of(result)
    return [json.loads(line) for line in lines]


def network_of(result):
    network = (result.structured_content or {}).get("network")
    assert isinstance(network, list), f"no `network` record: {result.structured_content}"
    return network


def entries(result, host, port):
    return [e for e in network_of(result) if e["host"] == host and e["port"] == port]


def only_entry(result, host, port, outcome):
    found = entries(result, host, port)
    assert [e["outcome"] for e in found] == [outcome], (host, port, network_of(result))
    entry = found[0]
    if outcome == "reached":
        assert "reason" not in entry, entry
    else:
        assert entry.get("reason"), entry
    return entry


def network_line(result):
    lines = [line for line in text_of(result).splitlines() if line.startswith("network:")]
    assert len(lines) == 1, text_of(result)
    return lines[0]


def refused(answer, fragment):
    """A 403 from the proxy whose body gives the reason."""
    assert answer.get("status") == 403, answer
    assert answer["body"].startswith("refused by the sandbox's egress proxy: "), answer
    assert fragment in answer["body"], answer


class Consent:
    """An elicitation callback standing for the user: answers every question with `action`, and
    records the messages."""

    def __init__(self, action):
        self.action = action
        self.messages = []

    async def __call__(self, context, params):
        self.messages.append(params.message)
        return types.ElicitResult(action=self.action, content={} if self.action == "accept" else None)

    async def wait_asked(self, count=1, timeout=30):
        deadline = time.monotonic() + timeout
        while len(self.messages) < count and time.monotonic() < deadline:
            await anyio.sleep(0.1)
        assert len(self.messages) >= count, f"the user was not asked within {timeout}s: {self.messages}"


async def call_ok(client, tool, args):
    result = await client.call_tool(tool, args)
    assert result.is_error is False, (tool, text_of(result))
    return result


async def start_session(client, **args):
    return (await call_ok(client, "sandbox_initialize", args)).structured_content["container_id"]


async def in_session(client, cid, code):
    return await client.call_tool("run_python", {"container_id": cid, "code": code})


def containers_of(pid):
    out = docker("ps", "-aq", "--no-trunc", "--filter", f"label={LABEL_PID}={pid}")
    return [c for c in out.split() if c]


def networks_with(label):
    out = docker("network", "ls", "-q", "--no-trunc", "--filter", f"label={label}")
    return [n for n in out.split() if n]


def labels_of(container):
    return json.loads(docker("inspect", "--format", "{{json .Config.Labels}}", container))


def networks_of_container(container):
    return sorted(json.loads(docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", container)))


def poll(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(0.2)


def the_proxy(pid):
    """The proxy of the server with this pid: its only container while no code runs (pool size
    0, no session). Returns (container id, the instance label that also marks its networks)."""
    poll(lambda: len(containers_of(pid)) == 1, 60, f"server {pid} to have exactly one container")
    [proxy] = containers_of(pid)
    labels = labels_of(proxy)
    assert labels.get(LABEL.split("=")[0]) == "true", labels
    assert labels.get(LABEL_KIND) not in SANDBOX_KINDS, labels
    return proxy, f"{LABEL_INSTANCE}={labels[LABEL_INSTANCE]}"


def members(network):
    """Ids of the containers attached to a network."""
    return sorted(json.loads(docker("network", "inspect", network))[0].get("Containers") or {})


def address_on(container, network_id):
    for net in json.loads(docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", container)).values():
        if net.get("NetworkID") == network_id:
            return net["IPAddress"]
    raise AssertionError(f"{container} is not on {network_id}")


# --- 1. Allowed names are reached, through the proxy only --------------------------------------


async def test_allowed_names_are_reached_with_requests_urllib_tls_and_pip(lab):
    p_http, p_https, p_index = lab.data.port, lab.secure.port, lab.index.port
    before = {e: len(e.seen()) for e in (lab.data, lab.secure, lab.index)}
    code = FETCH + f"""
import os, subprocess, sys
from pip._vendor import requests
r = requests.get("http://data.test:{p_http}/requests", timeout=60)
print("requests http", r.status_code, r.text.strip())
r = requests.get("https://secure.test:{p_https}/", timeout=60)
print("requests https", r.status_code, r.text.strip())
print("urllib http", json.dumps(fetch("http://data.test:{p_http}/urllib")))
print("urllib https", json.dumps(fetch("https://secure.test:{p_https}/urllib")))
pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                      "--disable-pip-version-check", "-d", "/tmp/dl", "--index-url", "http://index.test:{p_index}/simple/",
                      "--trusted-host", "index.test", "pcs_egress_probe"], capture_output=True, text=True)
print("pip", pip.returncode, sorted(os.listdir("/tmp/dl")) if pip.returncode == 0 else (pip.stdout + pip.stderr)[-3000:])
"""
    async with connect(**lab.env()) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": code})
    assert result.is_error is False, text_of(result)
    out = result.structured_content["stdout"].splitlines()
    assert out[0] == "requests http 200 hello from data.test", out
    assert out[1] == "requests https 200 hello from secure.test", out
    assert json.loads(out[2].split(" ", 2)[2]) == {"status": 200, "body": "hello from data.test\n"}, out
    assert json.loads(out[3].split(" ", 2)[2]) == {"status": 200, "body": "hello from secure.test\n"}, out
    assert out[4] == f"pip 0 ['{PROBE_WHEEL}']", out
    # The endpoints saw the requests, by the names the code used.
    data = lab.data.seen()[before[lab.data]:]
    assert [path for _, path, _ in data] == ["/requests", "/urllib"], data
    assert {host for _, _, host in data} == {f"data.test:{p_http}"}, data
    assert [path for _, path, _ in lab.secure.seen()[before[lab.secure]:]] == ["/", "/urllib"]
    index_paths = [path for _, path, _ in lab.index.seen()[before[lab.index]:]]
    assert "/simple/pcs-egress-probe/" in index_paths and f"/files/{PROBE_WHEEL}" in index_paths, index_paths
    # The record: each target reached, with its traffic counted.
    for host, port, connections in (("data.test", p_http, 2), ("secure.test", p_https, 2), ("index.test", p_index, 1)):
        entry = only_entry(result, host, port, "reached")
        assert entry["connections"] >= connections, entry
        assert entry["bytes_sent"] > 0 and entry["bytes_received"] > 0, entry
    assert {e["outcome"] for e in network_of(result)} == {"reached"}, network_of(result)
    line = network_line(result)
    for host in ("data.test", "secure.test", "index.test"):
        assert host in line, line


# --- 2. Everything else is refused, before it reaches anything ----------------------------------


async def test_names_not_allowed_ip_literals_and_private_resolutions_are_refused(lab):
    p_http, p_https = lab.data.port, lab.secure.port
    before = len(lab.data.seen()), len(lab.secure.seen())
    urls = [
        f"http://other.test:{p_http}/other",
        f"https://other.test:{p_https}/other",
        f"http://127.0.0.2:{p_http}/loopback",
        "http://169.254.169.254/latest/meta-data/",
        f"http://private.test:{p_http}/private",
    ]
    async with connect(**lab.env()) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": fetch_code(*urls)})
    other, tunnel, loopback, metadata, private = fetched(result, len(urls))
    reasons = {
        ("other.test", p_http): f"other.test:{p_http} is not in SANDBOX_EGRESS_ALLOW",
        ("other.test", p_https): f"other.test:{p_https} is not in SANDBOX_EGRESS_ALLOW",
        ("127.0.0.2", p_http): f"127.0.0.2:{p_http} is an IP address; only addresses SANDBOX_EGRESS_ALLOW names are allowed",
        ("169.254.169.254", 80): "169.254.169.254:80 is an IP address; only addresses SANDBOX_EGRESS_ALLOW names are allowed",
        ("private.test", p_http): "private.test resolves to the non-public address 127.0.0.1",
    }
    refused(other, reasons[("other.test", p_http)])
    # A refused CONNECT: urllib reports the tunnel's status, not a body.
    assert "403" in tunnel.get("error", ""), tunnel
    refused(loopback, reasons[("127.0.0.2", p_http)])
    refused(metadata, reasons[("169.254.169.254", 80)])
    # Squid's page says why without the address (it refused before connecting); the record names it.
    refused(private, f"private.test resolves to a non-public address that no setting allows this sandbox on port {p_http}")
    for (host, port), reason in reasons.items():
        assert reason in only_entry(result, host, port, "refused")["reason"], network_of(result)
    assert {e["outcome"] for e in network_of(result)} == {"refused"}, network_of(result)
    assert "other.test" in network_line(result)
    assert (len(lab.data.seen()), len(lab.secure.seen())) == before, "a refused request reached an endpoint"


DIRECT = r"""
import errno, json, os, socket
def failure(e):
    return errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
print("interfaces", json.dumps(sorted(name for _, name in socket.if_nameindex())))
print("kernel", open("/proc/version").read().split()[2])
routes = [l.split() for l in open("/proc/net/route").read().splitlines()[1:] if l.strip()]
print("routes", json.dumps([(r[0], r[1], r[2], r[7]) for r in routes]))
def tcp(address, port):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((address, port))
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return failure(e)
    finally:
        s.close()
print("direct", tcp("GATEWAY", PORT))
# A documentation address (RFC 5737), routed nowhere: it shows where the default route, if any, leads.
print("route-probe", tcp("192.0.2.1", 80))
try:
    print("dns", socket.getaddrinfo("pypi.org", 443))
except OSError as e:
    print("dns fails", e.errno)
def udp_route(address):
    # connect() on a UDP socket only looks up a route: no packet is sent.
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.connect((address, 53))
        return "routable"
    except OSError as e:
        return failure(e)
    finally:
        u.close()
print("route to the metadata address", udp_route("169.254.169.254"))
print("route to a public address", udp_route("192.0.2.1"))
print("route to the uplink", udp_route("GATEWAY"))
print("nameservers", json.dumps([l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]))
names = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy",
         "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"]
print("env", json.dumps({n: os.environ.get(n) for n in names}))
bundle = os.environ.get("SSL_CERT_FILE")
print("bundle", json.dumps(bool(bundle and os.path.isfile(bundle) and "".join(CA_PEM.split()) in "".join(open(bundle).read().split()))))
"""


async def test_the_code_has_no_direct_way_out(lab):
    before = len(lab.data.seen())
    with open(lab.ca_cert) as f:
        ca_pem = f.read()
    code = f"CA_PEM = {ca_pem!r}\n" + DIRECT.replace("GATEWAY", lab.gateway).replace("PORT", str(lab.data.port))
    async with connect(**lab.env()) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": code})
    assert result.is_error is False, text_of(result)
    out = dict(line.rsplit(" ", 1) if line.startswith("route ") else line.split(" ", 1)
               for line in result.structured_content["stdout"].splitlines())
    seen = result.structured_content["stdout"]
    # One interface besides loopback: the egress network's; no default route, only that network's.
    interfaces = json.loads(out["interfaces"])
    assert "lo" in interfaces and len(interfaces) == 2, seen
    # Networked code keeps gVisor where scripts/runsc.sh registered its networked entry: gVisor's
    # kernel says 4.4.0 whatever the host runs.
    if os.environ.get("PCS_TEST_RUNTIME") == "runsc":
        assert out["kernel"] == "4.4.0", seen
    # Docker gives a container on an --internal network a default route through the network's
    # gateway address; with inhibit_ipv4 nobody holds that address (the host has none on the
    # bridge), so every route ends on the egress network: a connection beyond it finds no host
    # (EHOSTUNREACH at once, after ARP), rather than timing out somewhere.
    routes = json.loads(out["routes"])
    egress = [name for name in interfaces if name != "lo"]
    assert routes and {interface for interface, _, _, _ in routes} == set(egress), seen
    assert out["direct"] in ("ENETUNREACH", "EHOSTUNREACH"), seen
    assert out["route-probe"] in ("ENETUNREACH", "EHOSTUNREACH"), seen
    assert out["dns"].startswith("fails"), seen
    assert len(lab.data.seen()) == before, "the code reached the endpoint directly"
    # The way it has: the proxy, named in every variable clients read, and the CA bundle.
    env = json.loads(out["env"])
    proxies = {env[n] for n in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")}
    assert len(proxies) == 1 and proxies.pop().endswith(":3128"), env
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1", env
    assert len({env[n] for n in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE")}) == 1, env
    assert json.loads(out["bundle"]) is True, "the sandbox's CA bundle (SSL_CERT_FILE) lacks the test CA"
    # Nothing went through the proxy either (pypi.org was never asked for).
    assert network_of(result) == [], network_of(result)
    print("seen inside the sandbox:\n" + seen)


# --- 3. Consent: SANDBOX_EGRESS_ASK, per session -------------------------------------------------


async def test_an_approved_host_is_reached_on_the_retry(lab):
    consent = Consent("accept")
    url = f"http://ask.test:{lab.data.port}/asked"
    before = len(lab.data.seen())
    async with connect(_client={"elicitation_callback": consent, "mode": LEGACY}, **lab.env()) as client:
        cid = await start_session(client)
        first = await in_session(client, cid, fetch_code(url))
        [answer] = fetched(first, 1)
        assert answer.get("status") == 403 and "ask.test" in answer["body"], answer
        pending = only_entry(first, "ask.test", lab.data.port, "pending")
        assert "retry" in pending["reason"].lower(), pending
        assert len(lab.data.seen()) == before, "reached before the user answered"
        await consent.wait_asked()
        [message] = consent.messages
        assert message.startswith(f"Allow this sandbox to reach ask.test:{lab.data.port}?"), message
        retry = await in_session(client, cid, fetch_code(url))
        [answer] = fetched(retry, 1)
        assert answer == {"status": 200, "body": "hello from data.test\n"}, answer
        entry = only_entry(retry, "ask.test", lab.data.port, "reached")
        assert entry["bytes_received"] > 0, entry
        assert len(consent.messages) == 1, consent.messages
        await call_ok(client, "sandbox_stop", {"container_id": cid})
    assert [(path, host) for _, path, host in lab.data.seen()[before:]] == [("/asked", f"ask.test:{lab.data.port}")]


async def test_a_declined_host_stays_refused_and_is_asked_once(lab):
    consent = Consent("decline")
    url = f"http://ask.test:{lab.data.port}/declined"
    before = len(lab.data.seen())
    async with connect(_client={"elicitation_callback": consent, "mode": LEGACY}, **lab.env()) as client:
        cid = await start_session(client)
        first = await in_session(client, cid, fetch_code(url))
        only_entry(first, "ask.test", lab.data.port, "pending")
        await consent.wait_asked()
        for _ in range(2):
            again = await in_session(client, cid, fetch_code(url))
            [answer] = fetched(again, 1)
            refused(answer, f"the user declined ask.test:{lab.data.port} for this session")
            entry = only_entry(again, "ask.test", lab.data.port, "refused")
            assert "declined" in entry["reason"], entry
        # One more round trip: a second question, had there been one, has arrived by now.
        await call_ok(client, "sandbox_list", {})
        assert len(consent.messages) == 1, consent.messages
        await call_ok(client, "sandbox_stop", {"container_id": cid})
    assert len(lab.data.seen()) == before, "a declined host was reached"


async def test_a_client_that_cannot_ask_gets_a_refusal_naming_the_setting(lab):
    async with connect(**lab.env()) as client:
        cid = await start_session(client)
        result = await in_session(client, cid, fetch_code(f"http://ask.test:{lab.data.port}/"))
        [answer] = fetched(result, 1)
        assert answer.get("status") == 403, answer
        entry = only_entry(result, "ask.test", lab.data.port, "refused")
        for fragment in ("ask.test", "SANDBOX_EGRESS_ASK"):
            assert fragment in entry["reason"] and fragment in answer["body"], (entry, answer)
        await call_ok(client, "sandbox_stop", {"container_id": cid})


async def test_a_client_on_2026_07_28_is_not_asked_and_is_told_why(lab):
    """The SDK's default revision over stdio has no channel for a question outside a call: the
    host is refused at once (not left pending), the reason names the setting, nobody is asked."""
    consent = Consent("accept")
    async with connect(_client={"elicitation_callback": consent}, **lab.env()) as client:
        assert client.protocol_version == "2026-07-28"
        cid = await start_session(client)
        result = await in_session(client, cid, fetch_code(f"http://ask.test:{lab.data.port}/"))
        [answer] = fetched(result, 1)
        assert answer.get("status") == 403, answer
        entry = only_entry(result, "ask.test", lab.data.port, "refused")
        assert "ask.test" in entry["reason"] and "SANDBOX_EGRESS_ASK" in entry["reason"], entry
        assert "2026-07-28" in entry["reason"], entry
        await call_ok(client, "sandbox_stop", {"container_id": cid})
    assert consent.messages == [], consent.messages


async def test_hosts_asked_for_up_front_in_sandbox_initialize(lab):
    consent = Consent("accept")
    p = lab.data.port
    before = len(lab.data.seen())
    async with connect(_client={"elicitation_callback": consent, "mode": LEGACY}, **lab.env()) as client:
        started = await call_ok(client, "sandbox_initialize",
                                {"network": [f"ask2.test:{p}", f"data.test:{p}", f"nope.test:{p}"]})
        cid = started.structured_content["container_id"]
        statuses = {(e["host"], e["port"]): e for e in started.structured_content["network"]}
        assert statuses[("ask2.test", p)]["status"] == "allowed", statuses
        assert statuses[("data.test", p)]["status"] == "allowed", statuses
        assert statuses[("nope.test", p)]["status"] == "refused", statuses
        assert statuses[("nope.test", p)].get("reason"), statuses
        [message] = consent.messages
        assert message.startswith(f"Allow this sandbox to reach ask2.test:{p}?"), message
        result = await in_session(client, cid, fetch_code(f"http://ask2.test:{p}/upfront"))
        [answer] = fetched(result, 1)
        assert answer == {"status": 200, "body": "hello from data.test\n"}, answer
        only_entry(result, "ask2.test", p, "reached")
        assert len(consent.messages) == 1, consent.messages
        await call_ok(client, "sandbox_stop", {"container_id": cid})
    assert [path for _, path, _ in lab.data.seen()[before:]] == ["/upfront"]


async def test_no_consent_outside_a_session(lab):
    consent = Consent("accept")
    async with connect(_client={"elicitation_callback": consent, "mode": LEGACY}, **lab.env()) as client:
        result = await client.call_tool("run_python_ephemeral", {"code": fetch_code(f"http://ask.test:{lab.data.port}/")})
        [answer] = fetched(result, 1)
        assert answer.get("status") == 403, answer
        entry = only_entry(result, "ask.test", lab.data.port, "refused")
        assert "session" in entry["reason"] and "sandbox_initialize" in entry["reason"], entry
        await call_ok(client, "sandbox_list", {})
    assert consent.messages == [], consent.messages


async def test_each_execution_records_only_its_own_attempts(lab):
    p_http, p_https = lab.data.port, lab.secure.port
    async with connect(**lab.env()) as client:
        cid = await start_session(client)
        first = await in_session(client, cid, fetch_code(f"http://data.test:{p_http}/one", f"http://other.test:{p_http}/"))
        fetched(first, 2)
        assert [(e["host"], e["outcome"]) for e in network_of(first)] == [("data.test", "reached"), ("other.test", "refused")]
        second = await in_session(client, cid, fetch_code(f"https://secure.test:{p_https}/two"))
        fetched(second, 1)
        assert [(e["host"], e["port"], e["outcome"]) for e in network_of(second)] == [("secure.test", p_https, "reached")]
        quiet = await in_session(client, cid, "print('no network')")
        assert network_of(quiet) == [], network_of(quiet)
        assert not any(line.startswith("network:") for line in text_of(quiet).splitlines()), text_of(quiet)
        await call_ok(client, "sandbox_stop", {"container_id": cid})


async def test_without_allowlist_there_is_no_record_and_no_network_argument():
    async with connect() as client:
        result = await call_ok(client, "run_python_ephemeral", {"code": "print(1)"})
        assert "network" not in result.structured_content, result.structured_content
        refused_call = await client.call_tool("sandbox_initialize", {"network": ["data.test:80"]})
        assert refused_call.is_error is True and "SANDBOX_NETWORK" in text_of(refused_call), text_of(refused_call)


# --- 4. The proxy's lifecycle ---------------------------------------------------------------------


def managed_networks():
    return networks_with(LABEL)


async def test_one_proxy_per_server_and_one_network_per_sandbox_all_gone_when_it_exits(lab):
    tag = uuid.uuid4().hex
    async with connect(PCS_TEST_TAG=tag, **lab.env()) as client:
        pid = find_server_pid(tag)
        assert pid is not None
        # Started with the server, before any code runs; no sandbox, no egress network.
        proxy, instance = the_proxy(pid)
        assert networks_with(instance) == [], networks_with(instance)
        config = json.loads(docker("inspect", "--format", "{{json .HostConfig}}", proxy))
        assert config["ReadonlyRootfs"] is True and "ALL" in (config["CapDrop"] or []), config
        assert docker("inspect", "--format", "{{.Config.User}}", proxy).strip().startswith("1000"), proxy
        assert lab.network in networks_of_container(proxy)
        # Each session gets an internal network of its own, shared only with the proxy.
        first, second = await start_session(client), await start_session(client)
        nets = networks_with(instance)
        assert len(nets) == 2, nets
        for net in nets:
            inspected = json.loads(docker("network", "inspect", net))[0]
            assert inspected["Internal"] is True, inspected
            assert inspected["Options"].get("com.docker.network.bridge.inhibit_ipv4") == "true", inspected["Options"]
            assert proxy in members(net) and len(members(net)) == 2, members(net)
        on = {cid: next(n for n in nets if any(m.startswith(cid) for m in members(n))) for cid in (first, second)}
        assert on[first] != on[second], on
        assert sorted(networks_of_container(proxy)) == sorted(
            [lab.network] + [json.loads(docker("network", "inspect", n))[0]["Name"] for n in nets])
        # The sessions cannot reach each other: no host answers at the other's address.
        other = address_on(second, on[second])
        reach = await in_session(client, first, f"""
import errno, socket
s = socket.socket()
s.settimeout(10)
try:
    s.connect(({other!r}, 22))
    print("connected")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
""")
        assert reach.structured_content["stdout"].strip() in ("EHOSTUNREACH", "ENETUNREACH"), text_of(reach)
        # A sandbox's network goes with it.
        await call_ok(client, "sandbox_stop", {"container_id": first})
        poll(lambda: networks_with(instance) == [on[second]], 60, "the stopped session's network to go")
        await call_ok(client, "run_python_ephemeral", {"code": "print(1)"})
        poll(lambda: networks_with(instance) == [on[second]], 60, "the ephemeral run's network to go")
        await call_ok(client, "sandbox_stop", {"container_id": second})
        poll(lambda: networks_with(instance) == [], 60, "the last session's network to go")
        assert containers_of(pid) == [proxy]
    poll(lambda: containers_of(pid) == [] and networks_with(instance) == [], 60,
         "the proxy and the networks to be removed when the server exits")
    assert lab.attached() == []


class RawServer:
    """The binary with stdio pipes, spoken to in raw JSON-RPC (so that it can be SIGKILLed)."""

    def __init__(self, env):
        self.proc = subprocess.Popen([BIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=server_params(**env).env)
        self.buffer = b""

    def send(self, message):
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, timeout=180):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, "the server did not answer"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, "the server closed its output"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def call(self, request_id, method, params):
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            reply = self.receive()
            if reply.get("id") == request_id:
                return reply

    def start(self):
        reply = self.call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                            "clientInfo": {"name": "raw", "version": "0"}})
        assert "result" in reply, reply
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self


async def test_a_killed_servers_proxy_and_networks_are_removed_by_the_next_server(lab):
    dead = RawServer(lab.env()).start()
    try:
        proxy, instance = the_proxy(dead.proc.pid)
        reply = dead.call(2, "tools/call", {"name": "sandbox_initialize", "arguments": {}})
        session = reply["result"]["structuredContent"]["container_id"]
        assert len(networks_with(instance)) == 1, networks_with(instance)
        dead.proc.send_signal(signal.SIGKILL)
        dead.proc.wait(timeout=60)
    finally:
        if dead.proc.poll() is None:
            dead.proc.kill()
            dead.proc.wait()
    # The session may be ending by itself (its supervisor saw the attachment hang up); the proxy
    # and the network stay until a server removes them.
    left = containers_of(dead.proc.pid)
    assert proxy in left and set(left) <= {proxy, session} and len(networks_with(instance)) == 1, "nothing was left to clean"
    async with connect(**lab.env()) as client:
        await call_ok(client, "run_python_ephemeral", {"code": "print(2)"})
        poll(lambda: containers_of(dead.proc.pid) == [] and networks_with(instance) == [], 60,
             "the next server to remove the dead one's proxy, session and network")
    poll(lambda: sandboxes() == [] and managed_networks() == [], 60, "nothing left after the second server")
    assert lab.attached() == []


# --- 5. Settings the server refuses at start-up ---------------------------------------------------


def start_refused(env):
    """Starts the server with `env`; it must exit 2 before serving. Returns its stderr."""
    process = subprocess.Popen([BIN], env=server_params(**env).env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
    try:
        out, err = process.communicate(json.dumps(initialize).encode() + b"\n", timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError(f"the server kept running with {env}")
    err = err.decode(errors="replace")
    assert process.returncode == 2, f"exit {process.returncode}: {err}"
    assert out == b"", f"it answered before refusing: {out[:300]!r}"
    return err


@pytest.mark.parametrize("overrides, setting, fragment", [
    ({"SANDBOX_EGRESS_ALLOW": "*"}, "SANDBOX_EGRESS_ALLOW", "SANDBOX_EGRESS_ALLOW_ALL"),
    ({"SANDBOX_EGRESS_ALLOW": "bad..name"}, "SANDBOX_EGRESS_ALLOW", "bad..name"),
    ({"SANDBOX_EGRESS_RESOLVE": "pypi.org=127.0.0.1"}, "SANDBOX_EGRESS_RESOLVE", "pypi.org"),
    ({"SANDBOX_EGRESS_ALLOW": None, "SANDBOX_EGRESS_ASK": None}, "SANDBOX_EGRESS_ALLOW", "SANDBOX_EGRESS_ASK"),
    ({"SANDBOX_NETWORK": "none"}, "SANDBOX_NETWORK", "SANDBOX_EGRESS_"),
    ({"SANDBOX_EGRESS_UPLINK": "pcs-no-such-network"}, "SANDBOX_EGRESS_UPLINK", "SANDBOX_EGRESS_UPLINK"),
], ids=["star-without-allow-all", "malformed-name", "resolve-public-name", "nothing-allowed", "egress-without-allowlist",
        "uplink-missing"])
async def test_bad_settings_stop_the_server_at_start_up(lab, overrides, setting, fragment):
    err = start_refused(lab.env(**overrides))
    assert setting in err and fragment in err, err
    poll(lambda: sandboxes() == [] and managed_networks() == [], 60, "nothing left by a refused start")


SECRET_CALL = r"""
import os, urllib.request
key = os.environ["API_KEY"]
print("placeholder", key.startswith("pcs-placeholder-api-"))
request = urllib.request.Request("https://secure.test:PORT/with-key", headers={"Authorization": "Bearer " + key})
print("answer", urllib.request.urlopen(request, timeout=30).read().decode().strip())
environ = open("/proc/self/environ", "rb").read()
print("environ", b"sk-mcp-" not in environ)
"""


async def test_a_secrets_file_brokers_a_key_the_sandbox_never_holds(lab):
    """SANDBOX_SECRETS_FILE (issue 46): the tools say which secret the code may use, where; the
    code holds a placeholder, and the HTTPS request to the bound host carries the real key,
    added by the egress proxy; the value is in no result and nowhere in the server's log, whose
    audit line for the call names the secret's use."""
    value = "sk-mcp-" + uuid.uuid4().hex
    secrets = os.path.join(lab.dir, "secrets.toml")
    with open(secrets, "w") as f:
        f.write('[[secret]]\nname = "api"\nvalue_env = "PCS_TEST_SECRET_VALUE"\n'
                f'hosts = ["secure.test:{lab.secure.port}"]\nenv = "API_KEY"\n')
    env = lab.env(SANDBOX_SECRETS_FILE=secrets, PCS_TEST_SECRET_VALUE=value, LOG_FORMAT="json",
                  LOG_LEVEL="info")
    before = len(lab.secure.seen())
    log_path = os.path.join(lab.dir, "server-log.jsonl")
    with open(log_path, "w") as log:
        async with Client(stdio_client(server_params(**env), errlog=log), read_timeout_seconds=180) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            described = tools["run_python_ephemeral"].description
            assert "api in $API_KEY" in described and "secure.test" in described, described
            assert value not in described
            result = await client.call_tool("run_python_ephemeral",
                                            {"code": SECRET_CALL.replace("PORT", str(lab.secure.port))})
    assert result.is_error is False, text_of(result)
    out = result.structured_content["stdout"]
    assert "placeholder True" in out and "answer hello from secure.test" in out and "environ True" in out, out
    whole = json.dumps(result.structured_content) + text_of(result)
    assert value not in whole, "the value is in the result"
    # The upstream got the value, in place of the placeholder, once.
    assert lab.secure.authorizations[before:] == [["Bearer " + value]], lab.secure.authorizations[before:]
    record = result.structured_content.get("network") or []
    assert any(e["host"] == "secure.test" and e.get("secret") == "api" for e in record), record
    with open(log_path) as log:
        logged = log.read()
    assert value not in logged, "the value is in the server's log"
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    runs = [line for line in lines if line.get("target") == "audit" and line.get("tool") == "run_python_ephemeral"]
    assert len(runs) == 1 and runs[0].get("secrets", "").startswith(f"api -> secure.test:{lab.secure.port} reached, "), runs
