"""Finding a server process the official SDK started (it does not expose the pid), shared by the
MCP suite and the adversarial suite: by a tag in its environment, the server itself or the warden
it started beside itself (the same program, `warden <instance>`, with the same environment)."""

import os


def find_server_pid(variable, tag, warden=False):
    """The pid of the process named `python-code-sa…` whose environment has `variable=tag`: the
    server, or with `warden` its warden; None when there is none."""
    wanted = f"{variable}={tag}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/comm") as f:
                if not f.read().strip().startswith("python-code-sa"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if (f.read().split(b"\0")[1:2] == [b"warden"]) == warden:
                    return int(name)
        except OSError:
            continue
    return None
