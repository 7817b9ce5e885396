"""Latency through the official MCP Python SDK over stdio, as an agent's client sees it.

    .cache/venv-mcp/bin/python scripts/bench_mcp.py [--runs 20] [--bin target/release/python-code-sandbox]
        [--deps] [--roots DIR] [--start-interval 2]

Prints p50/p95 of `run_python_ephemeral` hello, of `sandbox_initialize` (each session stopped
before the next starts) and of session `run_python` hello. `--roots DIR`: the same with
SANDBOX_ROOTS=ro and the client listing DIR as its one root (a sandbox with roots is prepared for
them, as the pool's are; DIR must be inside the server's SANDBOX_ROOTS_ALLOW, by default its HOME).
A benchmark, not a test: nothing here asserts on time.
"""

import argparse
import asyncio
import json
import os
import statistics
import time

from mcp import Client, StdioServerParameters, types


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--bin", default="target/release/python-code-sandbox")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--deps", action="store_true", help="also measure run_python_ephemeral with numpy, first install and repeats")
    parser.add_argument("--roots", metavar="DIR", help="with SANDBOX_ROOTS=ro and DIR listed as the client's root")
    parser.add_argument("--start-interval", type=float, default=2.0, help="seconds between sandbox_initialize calls")
    args = parser.parse_args()
    env = {**os.environ, "LOG_LEVEL": "warn"}
    client_options = {}
    if args.roots:
        env["SANDBOX_ROOTS"] = "ro"
        uri = "file://" + os.path.abspath(args.roots)

        async def list_roots(context):
            return types.ListRootsResult(roots=[types.Root(uri=uri)])

        # A client of a revision before 2026-07-28: asked once, in the background.
        client_options = {"list_roots_callback": list_roots, "mode": "legacy"}
    if args.deps:
        # A cache of its own, and no download cache: the first run really installs.
        suffix = os.urandom(4).hex()
        env.update(SANDBOX_DEPS_VOLUME="pcs-bench-deps-" + suffix, ENABLE_PIP_CACHE="false")
    params = StdioServerParameters(command=os.path.abspath(args.bin), args=[], env=env)
    async with Client(params, read_timeout_seconds=120, **client_options) as client:
        hello = {"code": "print('hello')"}
        await client.call_tool("run_python_ephemeral", hello)  # warm-up: image check, page cache
        ephemeral = []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = await client.call_tool("run_python_ephemeral", hello)
            ephemeral.append((time.perf_counter() - started) * 1000)
            assert result.structured_content["stdout"] == "hello\n", result
        starts = []
        for _ in range(max(3, args.runs // 4)):
            # The pool refills between starts, as between an agent's sessions.
            await asyncio.sleep(args.start_interval)
            started = time.perf_counter()
            result = await client.call_tool("sandbox_initialize", {})
            starts.append((time.perf_counter() - started) * 1000)
            if args.roots:
                assert len(result.structured_content["roots"]) == 1, result
            await client.call_tool("sandbox_stop", {"container_id": result.structured_content["container_id"]})
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        await client.call_tool("run_python", {"container_id": cid, **hello})
        session = []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = await client.call_tool("run_python", {"container_id": cid, **hello})
            session.append((time.perf_counter() - started) * 1000)
            assert result.structured_content["stdout"] == "hello\n", result
        await client.call_tool("sandbox_stop", {"container_id": cid})
        rows = [
            ("run_python_ephemeral hello", ephemeral),
            ("sandbox_initialize", starts),
            ("session run_python hello", session),
        ]
        if args.deps:
            numpy = {"code": "import numpy\nprint(numpy.arange(3).sum())", "dependencies": ["numpy"]}
            started = time.perf_counter()
            result = await client.call_tool("run_python_ephemeral", numpy)
            first = [(time.perf_counter() - started) * 1000]
            assert result.structured_content["dependencies"]["installed"] is True, result
            repeats = []
            for _ in range(args.runs):
                started = time.perf_counter()
                result = await client.call_tool("run_python_ephemeral", numpy)
                repeats.append((time.perf_counter() - started) * 1000)
                assert result.structured_content["dependencies"]["installed"] is False, result
            rows += [("ephemeral numpy, first (installs)", first), ("ephemeral numpy, repeat (cached)", repeats)]
    if args.deps:
        import subprocess
        subprocess.run(["docker", "volume", "rm", env["SANDBOX_DEPS_VOLUME"]], capture_output=True)
    if args.json:
        print(json.dumps({name: {"runs": len(s), "p50_ms": round(percentile(s, 50), 2), "p95_ms": round(percentile(s, 95), 2)} for name, s in rows}))
    else:
        print(f"{'measurement (official MCP client, stdio)':<44} {'runs':>5} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9}")
        for name, s in rows:
            print(f"{name:<44} {len(s):>5} {percentile(s, 50):>9.1f} {percentile(s, 95):>9.1f} {statistics.mean(s):>9.1f}")


asyncio.run(main())
