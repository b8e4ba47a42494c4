"""A call's brief (what crosses Temporal) and the whole call given back from the turn's text:
small calls travel whole, large values are cut with a note and the `cut` flag, and `full_call`
re-parses only a brief that was cut, refusing a text that gives another call."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.episode import BRIEF_CHARS, WORKSPACE_TOOLS, ToolCall
from infra.inference.toolcalls import full_call, parse_tool_call
from tests.infra.inference.scripted import render_tool_call

BIG = "print('a line of a realistic source file')\n" * 1600  # 68 KB


def payload_bytes(call: ToolCall) -> int:
    return len(pydantic_data_converter.payload_converter.to_payloads([call])[0].data)


def test_a_small_call_is_its_own_brief() -> None:
    call = ToolCall(name="write_file", arguments={"path": "a.py", "content": "x = 1\n"})
    assert call.brief() is call and not call.brief().cut
    error = parse_tool_call("no call here", WORKSPACE_TOOLS)
    assert error.brief() is error


def test_a_brief_cuts_each_long_value_and_says_so() -> None:
    call = ToolCall(name="write_file", arguments={"path": "a.py", "content": BIG})
    brief = call.brief()
    assert brief.cut and brief.name == "write_file" and brief.error is None
    assert brief.arguments["path"] == "a.py"
    assert brief.arguments["content"] == f"{BIG[:BRIEF_CHARS]}… [cut: {len(BIG)} characters]"
    assert payload_bytes(call) > 68_000 and payload_bytes(brief) < 1024
    nested = ToolCall(name="x", arguments={"rows": [BIG[:100]] * 50, "n": 7}).brief()
    assert nested.cut and nested.arguments["n"] == 7
    assert nested.arguments["rows"].startswith('["print(') and "[cut: " in nested.arguments["rows"]


def test_an_error_calls_brief_cuts_its_name_and_error() -> None:
    """An unknown tool's name is the model's, of any length, and its error repeats it."""
    name = "n" * 5000
    call = parse_tool_call(f'<tool_call>{{"name": "{name}", "arguments": {{}}}}', WORKSPACE_TOOLS)
    assert call.error and name in call.error
    brief = call.brief()
    assert brief.cut and brief.error and len(brief.error) < BRIEF_CHARS + 40
    assert len(brief.name) < BRIEF_CHARS + 40 and payload_bytes(brief) < 1024


def test_full_call_parses_a_cut_brief_again_and_only_that() -> None:
    call = ToolCall(name="write_file", arguments={"path": "a.py", "content": BIG})
    text = f"I will write it.\n{render_tool_call(call)}"
    brief = parse_tool_call(text, WORKSPACE_TOOLS).brief()
    whole = full_call(brief, text, WORKSPACE_TOOLS)
    assert whole == call and not whole.cut
    small = ToolCall(name="submit")
    assert full_call(small, "any text: not parsed", WORKSPACE_TOOLS) is small
    other = render_tool_call(
        ToolCall(name="write_file", arguments={"path": "a.py", "content": BIG + "!"})
    )
    with pytest.raises(ValueError, match="does not parse to the call whose brief came with it"):
        full_call(brief, other, WORKSPACE_TOOLS)
