"""Live output: while code runs, what it prints reaches the client as progress notifications
(when the call carries a progress token) and as `info` log messages (when the call asks for that
level), before the call's result, which still carries everything.

Ordering is checked by noting, for each notification, whether the call had returned when it was
handled; the SDK handles them in the order they arrive. The first ticks are printed seconds before
the code ends, so they must all have come while the call was still running."""

import pytest

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

INFO = {"io.modelcontextprotocol/logLevel": "info"}
TICKS = 10
LOOP = (
    "import sys, time\n"
    "print('starting', file=sys.stderr)\n"
    f"for i in range({TICKS}):\n"
    "    print(f'tick {i}')\n"
    "    time.sleep(0.3)\n"
)


class Recorder:
    def __init__(self):
        self.running = False
        self.progress = []  # (call still running, message)
        self.logs = []  # (call still running, logger, data)

    def reset(self):
        self.progress, self.logs = [], []

    async def on_progress(self, progress, total, message):
        self.progress.append((self.running, message))

    async def on_log(self, params):
        self.logs.append((self.running, params.logger, params.data))

    async def call(self, client, name, arguments, **kwargs):
        self.running = True
        try:
            return await client.call_tool(name, arguments, **kwargs)
        finally:
            self.running = False

    def check(self, result, progress=True, logs=True):
        assert result.is_error is False, text_of(result)
        # The result carries everything, as without live output.
        assert result.structured_content["stdout"] == "".join(f"tick {i}\n" for i in range(TICKS))
        assert result.structured_content["stderr"] == "starting\n"
        early = [f"tick {i}" for i in range(3)]
        if progress:
            live = [message for running, message in self.progress if running and message]
            for tick in early:
                assert any(tick in message for message in live), (tick, self.progress)
            # A message shows the latest lines, a few at most.
            assert all(len(message) <= 300 and message.count("\n") < 3 for message in live), live
        else:
            assert not any("tick" in (message or "") for _, message in self.progress), self.progress
        if logs:
            stdout = "".join(data for running, logger, data in self.logs if running and data.startswith("stdout: "))
            for tick in early:
                assert tick in stdout, (tick, self.logs)
            assert (True, "python-code-sandbox", "stderr: starting") in self.logs, self.logs
        else:
            assert not any("tick" in str(data) for _, _, data in self.logs), self.logs


async def test_a_session_shows_output_while_the_code_runs():
    recorder = Recorder()
    async with connect(_client={"logging_callback": recorder.on_log}) as client:
        started = await client.call_tool("sandbox_initialize", {})
        cid = started.structured_content["container_id"]
        args = {"container_id": cid, "code": LOOP}
        result = await recorder.call(client, "run_python", args, progress_callback=recorder.on_progress, meta=INFO)
        recorder.check(result)
        # Without a progress token or a log level: no live output at all.
        recorder.reset()
        result = await recorder.call(client, "run_python", args)
        # One more call: whatever the quiet one sent has been handled by its end.
        await client.call_tool("run_python", {"container_id": cid, "code": "pass"})
        recorder.check(result, progress=False, logs=False)
        # Only a progress token: progress, no log messages.
        recorder.reset()
        result = await recorder.call(client, "run_python", args, progress_callback=recorder.on_progress)
        await client.call_tool("run_python", {"container_id": cid, "code": "pass"})
        recorder.check(result, logs=False)
        # A shell command in the session shows its output the same way.
        recorder.reset()
        shell = "for i in 0 1 2; do echo tick $i; sleep 0.3; done; echo done"
        result = await recorder.call(client, "sandbox_exec", {"container_id": cid, "command": shell},
                                     progress_callback=recorder.on_progress, meta=INFO)
        assert result.structured_content["stdout"].endswith("done\n"), text_of(result)
        assert any(running and "tick 0" in (m or "") for running, m in recorder.progress), recorder.progress
        assert any(running and data.startswith("stdout: ") and "tick 0" in data
                   for running, _, data in recorder.logs), recorder.logs
        await client.call_tool("sandbox_stop", {"container_id": cid})


async def test_an_ephemeral_run_shows_output_while_the_code_runs():
    recorder = Recorder()
    async with connect(_client={"logging_callback": recorder.on_log}) as client:
        result = await recorder.call(client, "run_python_ephemeral", {"code": LOOP},
                                     progress_callback=recorder.on_progress, meta=INFO)
        recorder.check(result)
        # A log level alone: log messages, and no live progress without a token.
        recorder.reset()
        result = await recorder.call(client, "run_python_ephemeral", {"code": LOOP}, meta=INFO)
        await client.call_tool("run_python_ephemeral", {"code": "pass"})
        recorder.check(result, progress=False)


CLEARING = (
    "import time\n"
    "from IPython.display import clear_output\n"
    "for i in range(3):\n"
    "    clear_output(wait=True)\n"
    "    print(f'step {i}')\n"
    "    time.sleep(0.6)\n"  # frames go out 4 a second: each step is shown live
    "print('done')\n"
    "clear_output()\n"
)


async def test_clear_output_clears_what_the_client_is_shown_live():
    recorder = Recorder()
    async with connect(_client={"logging_callback": recorder.on_log}) as client:
        started = await client.call_tool("sandbox_initialize", {})
        cid = started.structured_content["container_id"]
        result = await recorder.call(client, "run_python", {"container_id": cid, "code": CLEARING},
                                     progress_callback=recorder.on_progress, meta=INFO)
        assert result.is_error is False, text_of(result)
        logs = [data for running, logger, data in recorder.logs if running and logger == "python-code-sandbox"]
        progress = [message for running, message in recorder.progress if running and message]
        for i in range(3):
            # wait=True: each step's text came with its clear, the earlier steps gone.
            step = f"step {i}"
            assert [data for data in logs if step in data] == [f"stdout (output cleared): {step}"], logs
            assert [message for message in progress if step in message] == [step], progress
        # The last clear, with nothing after it: the client is told the output is gone.
        assert logs[-1] == "(output cleared)", logs
        assert progress[-1] == "(output cleared)", progress
        await client.call_tool("sandbox_stop", {"container_id": cid})
