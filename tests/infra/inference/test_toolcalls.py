"""The tool-call format on messy model output: what parses, what becomes an error observation,
and that the fallback tool list and tool responses render as documented."""

from __future__ import annotations

import json

import pytest

from contracts.episode import WORKSPACE_TOOLS, ToolCall, ToolSpec
from infra.inference.toolcalls import (
    observation_message,
    parse_tool_call,
    render_tool_call,
    tool_schemas,
    tools_system_block,
)


def parse(text: str) -> ToolCall:
    return parse_tool_call(text, WORKSPACE_TOOLS)


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
         "bash", {"command": "ls"}),
        # prose around it, no newlines, trailing junk after the JSON inside the tags
        ('Let me look.<tool_call>{"name":"read_file","arguments":{"path":"a.py"}} oops</tool_call>',
         "read_file", {"path": "a.py"}),
        # cut before the closing tag (max_new_tokens), JSON complete
        ('<tool_call>\n{"name": "submit", "arguments": {}}', "submit", {}),
        # OpenAI style: arguments as a JSON string; `parameters` instead of `arguments`
        ('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pytest -q\\"}"}</tool_call>',
         "bash", {"command": "pytest -q"}),
        ('<tool_call>{"name": "bash", "parameters": {"command": "pwd"}}</tool_call>',
         "bash", {"command": "pwd"}),
        # a code fence inside the tags; submit without arguments at all
        ('<tool_call>\n```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```\n</tool_call>',
         "bash", {"command": "ls"}),
        ('<tool_call>{"name": "submit"}</tool_call>', "submit", {}),
        # raw newlines and tabs inside a string (code as a model writes it)
        ('<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "if x:\n\treturn 1\n"}}</tool_call>',
         "write_file", {"path": "a.py", "content": "if x:\n\treturn 1\n"}),
        # two calls: one per turn, the first wins
        ('<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
         '<tool_call>{"name": "bash", "arguments": {"command": "rm -rf /"}}</tool_call>',
         "submit", {}),
    ],
)  # fmt: skip
def test_calls_that_parse(text: str, name: str, arguments: dict[str, str]) -> None:
    assert parse(text) == ToolCall(name=name, arguments=arguments)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("I will now run the tests.", "no tool call found"),
        ('{"name": "bash", "arguments": {"command": "ls"}}', "no tool call found"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>', "not valid JSON"),
        ("<tool_call>{'name': 'bash'}</tool_call>", "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
        ('<tool_call>["bash", "ls"]</tool_call>', 'JSON object with a "name"'),
        ('<tool_call>{"tool": "bash"}</tool_call>', 'JSON object with a "name"'),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "unknown tool 'python'"),
        ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "missing 'command'"),
        ('<tool_call>{"name": "bash", "arguments": {"cmd": "ls", "command": "ls"}}</tool_call>',
         "unexpected 'cmd'"),
        ('<tool_call>{"name": "bash", "arguments": {"command": 42}}</tool_call>',
         "'command' must be a string"),
        ('<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>',
         "are not a JSON object"),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ],
)  # fmt: skip
def test_bad_calls_become_errors_never_exceptions(text: str, error: str) -> None:
    call = parse(text)
    assert call.error is not None and error in call.error, call.error


def test_an_unknown_tool_keeps_what_the_model_asked_for() -> None:
    call = parse('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
    assert (call.name, call.arguments) == ("python", {"code": "1"})
    assert "bash, read_file, write_file, submit" in (call.error or "")


def test_argument_types_follow_json_schema() -> None:
    typed = ToolSpec(
        name="wait",
        description="sleep",
        parameters={
            "type": "object",
            "properties": {
                "seconds": {"type": "integer"},
                "factor": {"type": "number"},
                "quiet": {"type": "boolean"},
            },
        },
    )

    def problem(arguments: str) -> str | None:
        text = f'<tool_call>{{"name": "wait", "arguments": {arguments}}}</tool_call>'
        return parse_tool_call(text, [typed]).error

    assert problem('{"seconds": 3, "factor": 1.5, "quiet": false}') is None
    assert problem('{"factor": 2}') is None  # an integer is a number
    assert "'seconds' must be an integer" in (problem('{"seconds": true}') or "")
    assert "'factor' must be a number" in (problem('{"factor": false}') or "")
    assert "'seconds' must be an integer" in (problem('{"seconds": 1.5}') or "")
    assert "'quiet' must be a boolean" in (problem('{"quiet": 1}') or "")


def test_render_then_parse_round_trips_any_content() -> None:
    content = 'def f():\n    return "</tool_call>"  # a tag inside a string\n'
    call = ToolCall(name="write_file", arguments={"path": "f.py", "content": content})
    rendered = render_tool_call(call)
    assert json.loads(rendered.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert parse(rendered) == call


def test_fallback_system_block_lists_every_tool_and_the_format() -> None:
    block = tools_system_block(WORKSPACE_TOOLS)
    listed = block.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == tool_schemas(WORKSPACE_TOOLS)
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in block


def test_observation_messages() -> None:
    assert observation_message("ok", tool_role=True) == {"role": "tool", "content": "ok"}
    assert observation_message("ok", tool_role=False) == {
        "role": "user",
        "content": "<tool_response>\nok\n</tool_response>",
    }
