"""A tool call whose JSON repeats a key in one object: Python's decoder keeps the last value, so
`{"command": "ls", "command": "rm -rf *"}` ran the second command while the model (or a reader
of the transcript) may have meant the first. Such a call is an error call naming the key (an
error observation, counted as a step, as other malformed calls are), at any depth, in the
arguments given as a JSON string too; it keeps no arguments."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.episode import WORKSPACE_TOOLS, ToolCall
from infra.inference.toolcalls import full_call, further_calls, parse_tool_call


def parse(text: str) -> ToolCall:
    return parse_tool_call(text, WORKSPACE_TOOLS)


@pytest.mark.parametrize(
    ("json_text", "key"),
    [
        ('{"name": "bash", "arguments": {"command": "ls", "command": "rm -rf *"}}', "command"),
        ('{"name": "read_file", "name": "bash", "arguments": {"command": "ls"}}', "name"),
        (
            '{"name": "bash", "arguments": {"command": "ls"}, "arguments": {"command": "x"}}',
            "arguments",
        ),
        # the arguments as a JSON string (OpenAI's style): decoded by the same rule
        (
            '{"name": "bash", "arguments": "{\\"command\\": \\"ls\\", \\"command\\": \\"x\\"}"}',
            "command",
        ),
        # deeper: an object inside an argument value
        ('{"name": "bash", "arguments": {"command": "ls", "x": {"a": 1, "a": 2}}}', "a"),
    ],
)
def test_a_repeated_key_is_an_error_call_naming_it(json_text: str, key: str) -> None:
    text = f"<tool_call>\n{json_text}\n</tool_call>"
    call = parse(text)
    assert call.error is not None and f"repeats the key {key!r}" in call.error, call
    assert call.arguments == {}  # nothing of it runs, nor is shown as if it were the call
    assert full_call(call.brief(), text, WORKSPACE_TOOLS) == call
    assert further_calls(text) == 0
    payload = pydantic_data_converter.payload_converter.to_payloads([call])
    assert pydantic_data_converter.payload_converter.from_payloads(payload, [ToolCall]) == [call]


def test_a_repeated_key_is_named_safely() -> None:
    """A key no payload can hold (a lone surrogate) or a long one is named by its escaped,
    shortened text: the error call still crosses Temporal."""
    for key in ("\\ud83d", "k" * 5000):
        text = f'<tool_call>{{"name": "bash", "arguments": {{"{key}": 1, "{key}": 2}}}}</tool_call>'
        call = parse(text)
        assert call.error is not None and "repeats the key" in call.error, call
        assert len(call.error) < 400
        payload = pydantic_data_converter.payload_converter.to_payloads([call])
        assert pydantic_data_converter.payload_converter.from_payloads(payload, [ToolCall]) == [
            call
        ]


def test_equal_keys_in_different_objects_are_no_repeat() -> None:
    call = parse(
        '<tool_call>{"name": "write_file", "arguments": {"path": "a.json", '
        '"content": "{\\"name\\": 1, \\"name\\": 2}"}}</tool_call>'
    )
    assert call.error is None and call.arguments["content"] == '{"name": 1, "name": 2}'
