"""Long executions as tasks (the tasks extension of revision 2026-07-28, SEP-2663) for the
principals of `serve --http`. The official Python SDK has no tasks client, so these tests speak
raw JSON-RPC at 2026-07-28 (every request carries its revision and the client's capabilities in
`_meta`, and the SEP-2243 headers) to the real binary on a loopback port."""

import json
import time

import httpx2

from conftest import sandboxes
from test_http import MCP_HEADERS
from test_principals import new_principal, served, team  # noqa: F401 (the fixture)

REVISION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
NAME_BEARING = {"tools/call": "name", "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


def rpc(url, token, method, params, tasks=True):
    """One request of revision 2026-07-28; returns the JSON-RPC response object."""
    capabilities = {"extensions": {TASKS: {}}} if tasks else {}
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": REVISION,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-tasks", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    headers = dict(MCP_HEADERS)
    headers.update({"Authorization": f"Bearer {token}", "MCP-Protocol-Version": REVISION, "Mcp-Method": method})
    if method in NAME_BEARING:
        headers["Mcp-Name"] = str(params[NAME_BEARING[method]])
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    with httpx2.Client(timeout=180) as http:
        response = http.post(url, content=json.dumps(body), headers=headers)
    text = response.text
    if response.status_code != 200:
        # Some JSON-RPC errors come with an HTTP error status (SEP-2243).
        answer = json.loads(text)
        assert "error" in answer, (response.status_code, text)
        return answer
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        datas = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        messages = [json.loads(d) for d in datas if d]
        [message] = [m for m in messages if m.get("id") == 1]
        return message
    return json.loads(text)


def call(url, token, tool, arguments, tasks=True):
    return rpc(url, token, "tools/call", {"name": tool, "arguments": arguments}, tasks=tasks)


def settle(url, token, task_id, limit=180):
    """Polls tasks/get until the task ends (the bound only guards a hang)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = rpc(url, token, "tasks/get", {"taskId": task_id})["result"]
        if got["status"] in ("completed", "failed", "cancelled"):
            return got
        time.sleep(0.2)
    raise AssertionError(f"task {task_id} did not end")


def wait_until(predicate, limit=120):
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.2)


def test_a_run_becomes_a_task_that_tasks_get_polls_to_its_result(team):  # noqa: F811
    with served(team) as server:
        info = rpc(server.url, team["bob"], "server/discover", {})
        assert TASKS in info["result"]["capabilities"].get("extensions", {}), info
        created = call(server.url, team["bob"], "run_python_ephemeral", {"code": "import time; time.sleep(1); print(6 * 7)"})["result"]
        assert created["resultType"] == "task", created
        assert created["status"] == "working" and created["ttlMs"] > 0, created
        done = settle(server.url, team["bob"], created["taskId"])
        assert done["status"] == "completed", done
        assert done["result"]["structuredContent"]["stdout"] == "42\n", done
        # A session's run and a shell command are tasks too, and run in the principal's session.
        started = call(server.url, team["bob"], "sandbox_initialize", {})["result"]
        cid = started["structuredContent"]["container_id"]
        task = call(server.url, team["bob"], "run_python", {"container_id": cid, "code": "x = 5\nprint(x)"})["result"]
        assert settle(server.url, team["bob"], task["taskId"])["result"]["structuredContent"]["stdout"] == "5\n"
        task = call(server.url, team["bob"], "sandbox_exec", {"container_id": cid, "command": "echo hi"})["result"]
        assert settle(server.url, team["bob"], task["taskId"])["result"]["structuredContent"]["stdout"] == "hi\n"
        # Other tools answer at once.
        listed = call(server.url, team["bob"], "sandbox_list", {})["result"]
        assert listed["resultType"] == "complete"
        call(server.url, team["bob"], "sandbox_stop", {"container_id": cid})


def test_tasks_cancel_ends_the_run_and_removes_its_sandbox(team):  # noqa: F811
    with served(team) as server:
        created = call(server.url, team["bob"], "run_python_ephemeral", {"code": "import time; time.sleep(600)"})["result"]
        assert created["resultType"] == "task", created
        wait_until(lambda: sandboxes() != [])
        ack = rpc(server.url, team["bob"], "tasks/cancel", {"taskId": created["taskId"]})["result"]
        assert ack == {"resultType": "complete"}, ack
        assert settle(server.url, team["bob"], created["taskId"])["status"] == "cancelled"
        wait_until(lambda: sandboxes() == [])


def test_another_principal_can_neither_see_nor_cancel_a_task(team):  # noqa: F811
    with served(team) as server:
        created = call(server.url, team["bob"], "run_python_ephemeral", {"code": "import time; time.sleep(3); print('bob')"})["result"]
        task_id = created["taskId"]
        for method in ("tasks/get", "tasks/cancel"):
            for who in ("alice", "root"):
                answer = rpc(server.url, team[who], method, {"taskId": task_id})
                assert answer.get("error", {}).get("code") == -32602, (who, method, answer)
        done = settle(server.url, team["bob"], task_id)
        assert done["status"] == "completed", done
        assert done["result"]["structuredContent"]["stdout"] == "bob\n"


def test_a_client_that_did_not_declare_tasks_gets_a_plain_result(team):  # noqa: F811
    with served(team) as server:
        answer = call(server.url, team["bob"], "run_python_ephemeral", {"code": "print(1)"}, tasks=False)["result"]
        assert answer["resultType"] == "complete" and "taskId" not in answer, answer
        assert answer["structuredContent"]["stdout"] == "1\n"
        refused = rpc(server.url, team["bob"], "tasks/get", {"taskId": "x"}, tasks=False)
        assert refused["error"]["code"] == -32021, refused


def test_a_task_holds_the_execution_quota_and_is_audited(team):  # noqa: F811
    """Alice may run one execution at once: her running task holds it after its request has
    ended, so a second is refused until the first is cancelled; each has its audit line."""
    with served(team, LOG_FORMAT="json") as server:
        first = call(server.url, team["alice"], "run_python_ephemeral", {"code": "import time; time.sleep(600)"})["result"]
        wait_until(lambda: sandboxes() != [])
        second = call(server.url, team["alice"], "run_python_ephemeral", {"code": "print(2)"})["result"]
        refused = settle(server.url, team["alice"], second["taskId"])
        assert refused["status"] == "completed" and refused["result"]["isError"] is True, refused
        assert "executions running" in refused["result"]["content"][0]["text"], refused
        rpc(server.url, team["alice"], "tasks/cancel", {"taskId": first["taskId"]})
        assert settle(server.url, team["alice"], first["taskId"])["status"] == "cancelled"
        third = call(server.url, team["alice"], "run_python_ephemeral", {"code": "print(3)"})["result"]
        done = settle(server.url, team["alice"], third["taskId"])
        assert done["result"]["structuredContent"]["stdout"] == "3\n", done
        lines = [json.loads(line) for line in server.log if line.startswith("{")]
        audit = [(a["principal"], a["tool"], a["outcome"]) for a in lines if a.get("target") == "audit"]
        assert ("alice", "run_python_ephemeral", "cancelled") in audit, audit
        assert ("alice", "run_python_ephemeral", "ok") in audit, audit
