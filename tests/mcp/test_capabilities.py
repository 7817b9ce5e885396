"""Resources, prompts, completion, logging and tool schemas, through the official client over
stdio (the client negotiates the newest revision, 2026-07-28) and, pinned, the handshake-era
revision 2025-11-25."""

import base64

import jsonschema
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from conftest import connect, text_of

pytestmark = pytest.mark.anyio

TEMPLATE = "sandbox://{session}/{path}"
# The formats JSON Schema 2020-12 defines; any other is non-standard.
STANDARD_FORMATS = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4",
    "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
}


def formats_in(schema):
    if isinstance(schema, dict):
        found = [schema["format"]] if isinstance(schema.get("format"), str) else []
        return found + [f for value in schema.values() for f in formats_in(value)]
    if isinstance(schema, list):
        return [f for value in schema for f in formats_in(value)]
    return []


async def test_every_tool_schema_is_standard_json_schema_2020_12():
    async with connect(SANDBOX_POOL_SIZE=0) as client:
        tools = (await client.list_tools()).tools
        assert len(tools) == 16
        for tool in tools:
            for schema in (tool.input_schema, tool.output_schema):
                if schema is None:
                    continue
                jsonschema.Draft202012Validator.check_schema(schema)
                odd = set(formats_in(schema)) - STANDARD_FORMATS
                assert not odd, f"{tool.name}: non-standard formats {odd}"
            assert tool.output_schema is not None, tool.name


async def test_workspace_files_are_resources_listed_read_and_completed():
    async with connect(SANDBOX_POOL_SIZE=0) as client:
        caps = client.server_capabilities
        assert caps.resources is not None and caps.completions is not None and caps.prompts is not None
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == [TEMPLATE]

        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        made = await client.call_tool("run_python", {"container_id": cid, "code": (
            "import os\n"
            "os.makedirs('data/deep', exist_ok=True)\n"
            "open('notes.txt', 'w').write('hello resources')\n"
            "open('data/deep/raw.bin', 'wb').write(bytes(range(256)))\n"
            "open('data/with space.csv', 'w').write('a,b\\n1,2\\n')\n"
            "os.symlink('/etc/passwd', 'passwd-link')\n"
        )})
        assert made.is_error is False, text_of(made)

        listed = {r.name: r for r in (await client.list_resources(cache_mode="refresh")).resources}
        assert set(listed) == {"notes.txt", "data/deep/raw.bin", "data/with space.csv"}, "links are not resources"
        assert listed["notes.txt"].uri == f"sandbox://{cid}/notes.txt"
        assert listed["notes.txt"].size == 15
        assert listed["data/with space.csv"].uri == f"sandbox://{cid}/data/with%20space.csv"

        text = (await client.read_resource(f"sandbox://{cid}/notes.txt")).contents
        assert [(c.uri, c.text) for c in text] == [(f"sandbox://{cid}/notes.txt", "hello resources")]
        spaced = (await client.read_resource(listed["data/with space.csv"].uri)).contents[0]
        assert spaced.text == "a,b\n1,2\n"
        blob = (await client.read_resource(f"sandbox://{cid}/data/deep/raw.bin")).contents[0]
        assert isinstance(blob, types.BlobResourceContents)
        assert base64.b64decode(blob.blob) == bytes(range(256))

        for missing in (f"sandbox://{cid}/nope.txt", f"sandbox://{cid}/passwd-link", "sandbox://0123456789abcdef/x",
                        f"sandbox://{cid}/../etc/passwd", "file:///etc/passwd"):
            with pytest.raises(MCPError) as refused:
                await client.read_resource(missing)
            assert refused.value.error.code in (-32002, -32602), (missing, refused.value.error)
            assert "root:" not in str(refused.value.error)

        ref = types.ResourceTemplateReference(type="ref/resource", uri=TEMPLATE)
        sessions = await client.complete(ref, {"name": "session", "value": cid[:4]})
        assert sessions.completion.values == [cid]
        paths = await client.complete(ref, {"name": "path", "value": "da"}, context_arguments={"session": cid})
        assert paths.completion.values == ["data/"]
        deeper = await client.complete(ref, {"name": "path", "value": "data/"}, context_arguments={"session": cid})
        assert deeper.completion.values == ["data/deep/", "data/with space.csv"]
        with pytest.raises(MCPError):
            await client.complete(types.ResourceTemplateReference(type="ref/resource", uri="test://x/{id}"),
                                  {"name": "id", "value": ""})

        await client.call_tool("sandbox_stop", {"container_id": cid})
        assert (await client.list_resources(cache_mode="refresh")).resources == []
        with pytest.raises(MCPError):
            await client.read_resource(f"sandbox://{cid}/notes.txt")


async def test_large_files_of_a_session_come_back_as_resource_links():
    async with connect(SANDBOX_POOL_SIZE=0) as client:
        code = "open('big.txt', 'w').write('x' * 300_000); open('small.txt', 'w').write('tiny')"
        cid = (await client.call_tool("sandbox_initialize", {})).structured_content["container_id"]
        result = await client.call_tool("run_python", {"container_id": cid, "code": code})
        assert result.is_error is False, text_of(result)
        links = [b for b in result.content if b.type == "resource_link"]
        assert [(l.uri, l.size) for l in links] == [(f"sandbox://{cid}/big.txt", 300_000)]
        embedded = [b.resource.uri for b in result.content if b.type == "resource"]
        assert embedded == ["file:///workspace/small.txt"]
        files = {f["path"]: f for f in result.structured_content["files"]}
        assert files["big.txt"]["resource_uri"] == links[0].uri and files["big.txt"]["returned"] is False
        assert files["small.txt"]["resource_uri"] is None
        content = (await client.read_resource(links[0].uri)).contents[0]
        assert content.text == "x" * 300_000

        # Without a session there is nothing to read later: the file comes inline.
        ephemeral = await client.call_tool("run_python_ephemeral", {"code": code})
        assert [b.type for b in ephemeral.content].count("resource_link") == 0
        assert "file:///workspace/big.txt" in [b.resource.uri for b in ephemeral.content if b.type == "resource"]


async def test_the_run_python_prompt():
    async with connect(SANDBOX_POOL_SIZE=0) as client:
        prompts = (await client.list_prompts()).prompts
        assert [p.name for p in prompts] == ["run-python"]
        assert [(a.name, a.required) for a in prompts[0].arguments] == [("task", True), ("packages", None)]
        got = await client.get_prompt("run-python", {"task": "plot a sine wave", "packages": "matplotlib"})
        text = got.messages[0].content.text
        assert "plot a sine wave" in text and "matplotlib" in text and "run_python_ephemeral" in text
        for name, arguments in (("run-python", {}), ("test_simple_prompt", {"task": "x"})):
            with pytest.raises(MCPError) as refused:
                await client.get_prompt(name, arguments)
            assert refused.value.error.code == -32602
        done = await client.complete(types.PromptReference(type="ref/prompt", name="run-python"),
                                     {"name": "task", "value": "pl"})
        assert done.completion.values == []
        with pytest.raises(MCPError) as refused:
            await client.complete(types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
                                  {"name": "arg1", "value": "x"})
        assert refused.value.error.code == -32602


@pytest.mark.parametrize("revision", ["2026-07-28", "2025-11-25"])
async def test_log_messages_follow_the_level_the_client_asked_for(revision):
    """2025-11-25: `logging/setLevel`; 2026-07-28: the level in each request's `_meta`."""
    received = []

    async def on_log(params):
        received.append((params.level, params.data))

    legacy = revision != "2026-07-28"
    async with connect(SANDBOX_POOL_SIZE=0, _client={"logging_callback": on_log, "mode": "legacy" if legacy else "auto"}) as client:
        assert client.protocol_version == revision
        quiet = await client.call_tool("run_python_ephemeral", {"code": "print(1)"})
        assert quiet.is_error is False
        assert received == [], "no info messages before the client asks for them"
        if legacy:
            await client.set_logging_level("info")
            meta = None
        else:
            meta = {"io.modelcontextprotocol/logLevel": "info"}
        loud = await client.call_tool("run_python_ephemeral", {"code": "print(2)"}, meta=meta)
        assert loud.is_error is False
        assert ("info", "running") in received, received
        assert all(level == "info" for level, _ in received)
