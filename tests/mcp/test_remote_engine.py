"""A Docker engine on "another machine" (issue 19): the second engine of scripts/remote-engine.sh,
in a network namespace of its own, reached over mutual TLS and over SSH.

Skipped unless PCS_REMOTE_ENGINE_DIR names the directory of a started remote engine (the CI stage
scripts/test-remote.sh sets it). Each test sets the environment of the server it starts from that
engine's tls.env, ssh.env or wrong-ca.env, whatever DOCKER_HOST the test run itself has."""

import os
import shutil
import subprocess

import pytest

from conftest import BIN, connect, text_of

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.environ.get("PCS_REMOTE_ENGINE_DIR"), reason="PCS_REMOTE_ENGINE_DIR is not set"),
]

ENGINE_DIR = os.environ.get("PCS_REMOTE_ENGINE_DIR", "")
MAIN_ENGINE = "unix:///var/run/docker.sock"
# The variables an env file may set or unset: the server gets exactly the file's view of them.
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "PATH")


def engine_env(name):
    """The engine variables after sourcing DIR/<name>.env in a shell (as a user would); a variable
    the file unsets is "" here, which the server and the docker CLI treat as unset."""
    path = os.path.join(ENGINE_DIR, f"{name}.env")
    script = f'. "{path}"; ' + "; ".join(f'printf "%s\\0" "${{{v}:-}}"' for v in ENGINE_VARIABLES)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    values = out.split("\0")[: len(ENGINE_VARIABLES)]
    return dict(zip(ENGINE_VARIABLES, values))


def docker_on(host, *args):
    """The docker CLI against one engine by its socket, whatever the test run's DOCKER_HOST."""
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_CONTEXT")}
    env["DOCKER_HOST"] = host
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, env=env, timeout=60).stdout


def remote_socket():
    return "unix://" + os.path.join(ENGINE_DIR, "docker.sock")


def doctor(env):
    merged = {k: v for k, v in os.environ.items() if k not in ENGINE_VARIABLES}
    merged.update(env)
    return subprocess.run([BIN, "doctor"], capture_output=True, text=True, env=merged, timeout=300)


async def test_a_client_certificate_from_another_ca_is_refused_and_the_server_keeps_running():
    wrong = engine_env("wrong-ca")
    assert wrong["DOCKER_CERT_PATH"].endswith("tls-wrong-ca"), wrong
    async with connect(**wrong) as client:
        refused = await client.call_tool("run_python_ephemeral", {"code": "print('must not run')"})
        assert refused.is_error is True
        message = text_of(refused)
        assert "must not run" not in message
        # Actionable: it names the engine, the TLS failure and where the certificates come from.
        assert wrong["DOCKER_HOST"] in message, message
        assert "BadCertificate" in message or "certificate" in message.lower(), message
        assert "TLS" in message and wrong["DOCKER_CERT_PATH"] in message, message
        # The server keeps serving: a second call gets the same clear answer, not a dead pipe.
        again = await client.call_tool("sandbox_list", {})
        assert again.is_error is False or "not reachable" in text_of(again), text_of(again)
        tools = await client.list_tools()
        assert any(tool.name == "run_python_ephemeral" for tool in tools.tools)
    # Nothing was created on the engine the certificate was refused by.
    assert docker_on(remote_socket(), "ps", "-aq", "--filter", "label=io.python-code-sandbox.managed=true") == ""


@pytest.mark.parametrize("transport", ["tls", "ssh"])
def test_doctor_names_the_engine_as_remote_with_its_endpoint(transport):
    env = engine_env(transport)
    done = doctor(env)
    assert done.returncode == 0, done.stdout + done.stderr
    engine_lines = [line for line in done.stdout.splitlines() if line.startswith("ok   engine:")]
    assert len(engine_lines) == 1, done.stdout
    assert "remote" in engine_lines[0] and env["DOCKER_HOST"] in engine_lines[0], engine_lines[0]
    # The second engine has no runsc registered (its own empty daemon.json): the runc fallback.
    assert "runs under runc" in done.stdout, done.stdout


@pytest.mark.parametrize("transport", ["ssh", "tls"])
async def test_a_sandbox_started_remotely_runs_on_the_second_engine_not_the_main_one(transport):
    env = engine_env(transport)
    async with connect(SANDBOX_POOL_SIZE="0", **env) as client:
        started = await client.call_tool("sandbox_initialize", {})
        assert started.is_error is False, text_of(started)
        cid = started.structured_content["container_id"]
        ran = await client.call_tool("run_python", {"container_id": cid, "code": "print('on the far side')"})
        assert ran.structured_content["stdout"] == "on the far side\n", text_of(ran)

        def listed_on(host):
            ids = docker_on(host, "ps", "-q", "--no-trunc").split()
            return [i for i in ids if i.startswith(cid) or cid.startswith(i)]

        assert listed_on(remote_socket()), f"{cid} is not a container of the second engine"
        assert listed_on(MAIN_ENGINE) == [], f"{cid} runs on the main engine"
        await client.call_tool("sandbox_stop", {"container_id": cid})


def test_an_ssh_host_whose_key_is_not_the_pinned_one_is_refused(tmp_path):
    """bollard's ssh connector asks ssh for StrictHostKeyChecking=accept-new (trust on first use),
    which overrides the config file's `yes`: a host key already pinned must still be enforced."""
    env = engine_env("ssh")
    other_key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    host = env["DOCKER_HOST"].split("@", 1)[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"{host} {' '.join((tmp_path / 'other_host_key.pub').read_text().split()[:2])}\n")
    config = tmp_path / "ssh_config"
    original = open(os.path.join(ENGINE_DIR, "ssh_config")).read()
    config.write_text(original.replace(os.path.join(ENGINE_DIR, "ssh", "known_hosts"), str(known)))
    assert str(known) in config.read_text(), "the pinned known_hosts line of ssh_config moved"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
    wrapper.chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH'].split(':', 1)[1]}"
    code = tmp_path / "code.py"
    code.write_text("print('must not run')\n")
    done = subprocess.run(
        [BIN, "run", str(code)], capture_output=True, text=True,
        env={**{k: v for k, v in os.environ.items() if k not in ENGINE_VARIABLES}, **env}, timeout=120,
    )
    assert done.returncode != 0 and "must not run" not in done.stdout, done.stdout + done.stderr
    assert "Host key verification failed" in done.stderr or "REMOTE HOST IDENTIFICATION" in done.stderr, done.stderr
    assert env["DOCKER_HOST"] in done.stderr, done.stderr
    # The mismatched key was not replaced by the engine's real one.
    assert other_key.with_suffix(".pub").read_text().split()[1] in known.read_text()
    assert shutil.which("ssh", path=env["PATH"]) == str(wrapper)


async def test_host_paths_the_remote_engine_cannot_see_are_reported_not_ignored():
    # Paths in SANDBOX_CA_BUNDLE and SANDBOX_MOUNTS are the engine's machine's: the server cannot
    # check them itself (with a local engine this value stops start-up), so the engine is asked.
    absent = "/nonexistent/pcs-remote-ca.pem"
    env = {**engine_env("tls"), "SANDBOX_CA_BUNDLE": absent, "SANDBOX_POOL_SIZE": "0"}
    async with connect(**env) as client:
        refused = await client.call_tool("run_python_ephemeral", {"code": "print('must not run')"})
        assert refused.is_error is True
        message = text_of(refused)
        assert "SANDBOX_CA_BUNDLE" in message and absent in message, message
        assert "another machine" in message, message
    done = doctor(env)
    assert done.returncode != 0
    assert "FAIL sandboxes: refusing" in done.stdout and "SANDBOX_CA_BUNDLE" in done.stdout, done.stdout
    # The check's own containers are gone too.
    assert docker_on(remote_socket(), "ps", "-aq", "--filter", "label=io.python-code-sandbox.managed=true") == ""
