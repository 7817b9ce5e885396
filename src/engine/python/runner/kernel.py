# A kernel's face for code written for Jupyter: `get_ipython().kernel` with what such code uses to
# publish outputs itself, `kernel.iopub_socket` and `kernel.session.send(stream, msg_type, content,
# parent=...)` (ipykernel's API; nbclient's own test notebooks use it), and the shell's
# `parent_header` (shell.py). There is no ZeroMQ socket and no frontend: a message sent to the
# iopub socket becomes an output of the running execution, as a notebook would show it:
# `display_data`, `update_display_data` and `execute_result` (with their `transient.display_id`),
# `clear_output`, `stream` (written to the execution's stdout or stderr) and `error`. Any other
# message (comms, status, a reply) has no one to receive it here and is dropped, as is a message
# to another socket. The content is the code's: display.py checks and bounds it as it does what
# display() sends.

import sys
import uuid


# A message type longer than this is none of Jupyter's.
MAX_MSG_TYPE_CHARS = 100


class Socket:
    """Stands for a kernel's socket; `session.send` acts only on the iopub one."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "<sandbox %s socket: messages become the execution's outputs>" % self.name


def _transient_id(content):
    transient = content.get("transient")
    if isinstance(transient, dict):
        return transient.get("display_id")
    return None


def _text(value, limit):
    return value[:limit] if isinstance(value, str) else ""


class Session:
    """jupyter_client's Session.send, into the running execution's outputs."""

    def __init__(self, shell, iopub):
        self._shell = shell
        self._iopub = iopub
        self.session = uuid.uuid4().hex
        self.username = "sandbox"

    def msg(self, msg_type, content=None, parent=None, header=None, metadata=None):
        """A message as jupyter_client builds one (no signature: nothing is sent over a wire)."""
        msg_id = uuid.uuid4().hex
        header = dict(header) if isinstance(header, dict) else {}
        header.setdefault("msg_id", msg_id)
        header.setdefault("msg_type", msg_type)
        header.setdefault("session", self.session)
        header.setdefault("username", self.username)
        header.setdefault("version", "5.3")
        return {
            "header": header,
            "msg_id": header["msg_id"],
            "msg_type": header["msg_type"],
            "parent_header": parent if isinstance(parent, dict) else {},
            "content": content if isinstance(content, dict) else {},
            "metadata": metadata if isinstance(metadata, dict) else {},
        }

    def send(self, stream, msg_or_type, content=None, parent=None, ident=None, buffers=None,
             track=False, header=None, metadata=None):
        __tracebackhide__ = True
        if isinstance(msg_or_type, dict):
            msg = msg_or_type
            given = msg.get("header")
            msg_type = given.get("msg_type") if isinstance(given, dict) else msg.get("msg_type")
        else:
            msg = self.msg(msg_or_type, content, parent, header, metadata)
            msg_type = msg_or_type
        if stream is self._iopub and isinstance(msg_type, str) and len(msg_type) <= MAX_MSG_TYPE_CHARS:
            body = msg.get("content")
            self._publish(msg_type, body if isinstance(body, dict) else {})
        return msg

    def _publish(self, msg_type, content):
        __tracebackhide__ = True
        outputs = self._shell.outputs
        if msg_type == "stream":
            target = sys.stderr if content.get("name") == "stderr" else sys.stdout
            text = content.get("text")
            if isinstance(text, str):
                target.write(text)
            return
        if outputs is None:
            return  # a thread of the code that outlived its execution: no one to show it to
        data = content.get("data")
        metadata = content.get("metadata")
        display_id = _transient_id(content)
        if msg_type == "display_data":
            outputs.display(data, metadata, display_id)
        elif msg_type == "update_display_data":
            outputs.update(data, metadata, display_id)
        elif msg_type == "execute_result":
            count = content.get("execution_count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                count = self._shell.execution_count - 1
            outputs.result(data, metadata, count, display_id)
        elif msg_type == "clear_output":
            outputs.clear(bool(content.get("wait", False)))
        elif msg_type == "error":
            traceback = content.get("traceback")
            lines = [line for line in traceback if isinstance(line, str)] if isinstance(traceback, list) else []
            at = outputs.position()
            outputs.error(
                _text(content.get("ename"), 200) or "Error",
                _text(content.get("evalue"), 1000),
                lines,
                at,
                at,
            )


class Kernel:
    """`get_ipython().kernel`: the iopub socket and the session that sends to it."""

    def __init__(self, shell):
        self.iopub_socket = Socket("iopub")
        self.session = Session(shell, self.iopub_socket)

    def __repr__(self):
        return "<sandbox kernel: no frontend; iopub messages become the execution's outputs>"
