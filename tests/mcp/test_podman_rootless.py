"""Rootless Podman on a cgroup v1 host ignores every resource limit: the server must refuse to start
sandboxes there, say why and what the host needs, and create nothing on the engine.

Skipped unless PCS_PODMAN_ROOTLESS_HOST names the rootless Podman API socket (scripts/podman.sh
--rootless prints it; scripts/test-podman.sh sets it). The rootless engine has the sandbox image,
so a container could be created if the server tried: that none is shows the refusal comes first.
"""

import os
import subprocess

import pytest

from conftest import BIN, LABEL, connect, text_of

pytestmark = pytest.mark.anyio

ROOTLESS = os.environ.get("PCS_PODMAN_ROOTLESS_HOST", "")
skip = pytest.mark.skipif(not ROOTLESS, reason="PCS_PODMAN_ROOTLESS_HOST is not set (scripts/podman.sh --rootless)")


def rootless_containers():
    """Every container on the rootless engine, ours or not: the server must create none."""
    out = subprocess.run(
        ["docker", "-H", ROOTLESS, "ps", "-aq", "--no-trunc"], capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.split() if line]


def rootless_volumes():
    out = subprocess.run(
        ["docker", "-H", ROOTLESS, "volume", "ls", "-q", "--filter", "label=" + LABEL],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.split() if line]


def assert_names_the_refusal(message):
    lowered = message.lower()
    assert "refusing" in lowered, message
    assert "rootless" in lowered, message
    assert "cgroup v2" in lowered, message
    # What is not enforced, and what the host needs.
    for limit in ("memory", "processes", "cpu"):
        assert limit in lowered, (limit, message)
    assert "delegat" in lowered, message


def rootless_is_on_cgroup_v1():
    out = subprocess.run(
        ["docker", "-H", ROOTLESS, "info", "--format", "{{.CgroupVersion}}"], capture_output=True, text=True
    )
    return out.stdout.strip() == "1"


@skip
async def test_a_sandbox_on_rootless_podman_with_cgroup_v1_is_refused_and_nothing_is_created():
    if not rootless_is_on_cgroup_v1():
        pytest.skip("the rootless engine is on cgroup v2 here: it can enforce limits")
    before = rootless_containers()
    # No pool: the refusal must come from the call itself, not from a pool that failed to fill.
    async with connect(DOCKER_HOST=ROOTLESS, SANDBOX_POOL_SIZE=0) as client:
        ephemeral = await client.call_tool("run_python_ephemeral", {"code": "print('ran')"})
        assert ephemeral.is_error, text_of(ephemeral)
        assert "ran" not in text_of(ephemeral)
        assert_names_the_refusal(text_of(ephemeral))
        session = await client.call_tool("sandbox_initialize", {})
        assert session.is_error, text_of(session)
        assert_names_the_refusal(text_of(session))
        assert rootless_containers() == before, "a container was created on the rootless engine"
    assert rootless_containers() == before
    assert rootless_volumes() == []


@skip
def test_doctor_fails_on_rootless_podman_with_cgroup_v1_and_says_why():
    if not rootless_is_on_cgroup_v1():
        pytest.skip("the rootless engine is on cgroup v2 here: it can enforce limits")
    before = rootless_containers()
    env = dict(os.environ, DOCKER_HOST=ROOTLESS)
    done = subprocess.run([os.path.abspath(BIN), "doctor"], env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Podman" in output, output
    assert_names_the_refusal(output)
    # doctor's probe sandbox is refused like any other.
    assert rootless_containers() == before, output
