"""The tool-call format on messy model output: what parses, what becomes an error observation
(deeply nested JSON included: every call survives the trip from activity to workflow), and that
the fallback tool list and tool responses render as documented."""

from __future__ import annotations

import json

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.common import ObjectRef
from contracts.episode import BRIEF_CHARS, WORKSPACE_TOOLS, ToolCall, ToolSpec
from contracts.rollout import Completion, GenerateResponse
from infra.inference.toolcalls import (
    MAX_DEPTH,
    MAX_KEPT_CHARS,
    further_calls,
    observation_message,
    parse_tool_call,
    tool_schemas,
    tools_system_block,
)
from tests.infra.inference.scripted import render_tool_call


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


def round_trip(call: ToolCall) -> None:
    """`call` in a `GenerateResponse` from the activity to the workflow (Temporal's converter),
    and as JSON read back (pydantic reads and writes at most 200 levels)."""
    ref = ObjectRef(key="k", size=1, sha256="0" * 64)
    response = GenerateResponse(
        policy_version=0, completions=[Completion(sample=0, completion=ref, call=call)]
    )
    converter = pydantic_data_converter.payload_converter
    payloads = converter.to_payloads([response])
    assert converter.from_payloads(payloads, [GenerateResponse]) == [response]
    assert GenerateResponse.model_validate_json(response.model_dump_json()) == response


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [220, 300, 1500])
@pytest.mark.parametrize(
    "body",
    [
        pytest.param('{{"name": "bash", "arguments": {{"command": {deep}}}}}', id="not-a-string"),
        pytest.param('{{"name": "python", "arguments": {{"code": {deep}}}}}', id="unknown-tool"),
        pytest.param(
            '{{"name": "bash", "arguments": {{"command": "ls", "cwd": {deep}}}}}', id="unexpected"
        ),
        pytest.param('{{"name": "bash", "arguments": {deep}}}', id="not-an-object"),
        pytest.param(
            '{{"name": "bash", "arguments": "{{\\"command\\": {deep}}}"}}', id="json-string"
        ),
        pytest.param("{deep}", id="bare"),
        pytest.param("{open}", id="cut-off"),  # max_new_tokens ran out inside the nesting
    ],
)
def test_deeply_nested_calls_are_errors_that_reach_the_workflow(depth: int, body: str) -> None:
    """~215 SmolLM2 tokens of brackets (under max_new_tokens) made a response the workflow could
    not decode (its task retried forever), 256 levels one the activity could not send, ~1000 a
    RecursionError out of the parser."""
    text = "<tool_call>\n" + body.format(deep=nested(depth), open="[" * depth) + "\n</tool_call>"
    call = parse(text)
    round_trip(call)
    assert call.error is not None
    assert all(not isinstance(value, dict | list) for value in call.arguments.values())


def test_valid_calls_nest_their_values_a_bounded_depth() -> None:
    """A tool whose schema leaves a value's type open takes lists and objects, not too deep."""
    open_ended = ToolSpec(
        name="plan",
        description="a plan",
        parameters={"type": "object", "properties": {"steps": {"type": "array"}, "notes": {}}},
    )

    def call(steps: str) -> ToolCall:
        text = f'<tool_call>{{"name": "plan", "arguments": {{"steps": {steps}}}}}</tool_call>'
        return parse_tool_call(text, [open_ended])

    shallow = '[{"do": ["a", ["b"]]}]'
    assert call(shallow) == ToolCall(name="plan", arguments={"steps": json.loads(shallow)})
    assert call(nested(MAX_DEPTH)).error is None
    for depth in (MAX_DEPTH + 1, 220, 300):
        deep = call(nested(depth))
        assert f"'steps' nests deeper than {MAX_DEPTH} levels" in (deep.error or "")
        assert deep.arguments == {}
        round_trip(deep)


def test_an_error_call_keeps_only_flat_small_arguments() -> None:
    kept = parse('<tool_call>{"name": "bash", "arguments": {"command": 1, "n": null}}</tool_call>')
    assert kept.arguments == {"command": 1, "n": None} and "arguments not kept" not in str(kept)
    for arguments in ('{"command": ["ls"]}', json.dumps({"command": 0, "x": "y" * MAX_KEPT_CHARS})):
        dropped = parse(f'<tool_call>{{"name": "bash", "arguments": {arguments}}}</tool_call>')
        assert dropped.arguments == {} and "arguments not kept" in (dropped.error or "")
    huge = parse('<tool_call>{"name": "bash", "arguments": {"command": ' + "9" * 5000 + "}}")
    assert "not valid JSON: ValueError: Exceeds the limit" in (huge.error or "")


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
    # the system prompt above it asks for one call a turn: Qwen's "one or more" said otherwise
    assert "one or more" not in block


CUT = '<tool_call>\n{"name": "write_file", "arguments": {"path": "m.py", "content": "def f(x):\\n'


def test_broken_json_names_what_broke_and_where() -> None:
    assert parse(CUT).error == "the tool call is not valid JSON: Unterminated string (position 64)"
    missing = parse('<tool_call>{"name": "bash" "arguments": {}}</tool_call>').error
    assert missing == "the tool call is not valid JSON: Expecting ',' delimiter (position 16)"


def test_a_call_its_token_limit_cut_says_so_and_how_to_fit() -> None:
    """A guided turn always ends in a call or at its token limit: the error said only that the
    JSON broke, never that the turn ran out of tokens (finish_reason "length")."""
    cut = parse_tool_call(CUT, WORKSPACE_TOOLS, cut_at=128).error or ""
    assert cut.startswith(
        "the turn ran out of its 128 tokens before the call was complete "
        "(Unterminated string (position 64)). Write less per call"
    )
    assert "bash" in cut
    rambling = parse_tool_call("Let me think. " * 40, WORKSPACE_TOOLS, cut_at=128).error or ""
    assert rambling.startswith("the turn ran out of its 128 tokens before any tool call")
    assert "Answer with the call first" in rambling and "write_file" not in rambling
    # a call that is whole, or wrong but whole, is what it is whatever ended its turn
    whole = '<tool_call>\n{"name": "submit", "arguments": {}}'
    assert parse_tool_call(whole, WORKSPACE_TOOLS, cut_at=12) == ToolCall(name="submit")
    wrong = '<tool_call>{"name": "bash", "arguments": {}}</tool_call>'
    assert parse_tool_call(wrong, WORKSPACE_TOOLS, cut_at=12) == parse(wrong)
    # short enough to be its own brief: `full_call`, which knows no limit, never parses it again
    for limited in (
        parse_tool_call(CUT, WORKSPACE_TOOLS, cut_at=10**7),
        parse_tool_call("x", WORKSPACE_TOOLS, cut_at=10**7),
        parse_tool_call("<tool_call>{" + " " * 10**7, WORKSPACE_TOOLS, cut_at=10**7),
    ):  # the last: the decoder's longest complaint, "Expecting property name enclosed in …"
        assert limited.brief() is limited and len(limited.error or "") <= BRIEF_CHARS


def test_further_calls_of_a_turn_are_counted() -> None:
    """One call runs a turn; the rest are counted for the observation to say so."""
    submit = render_tool_call(ToolCall(name="submit"))
    assert further_calls(submit) == 0 and further_calls("no call") == 0
    assert further_calls(f"{submit}\n{submit}{submit} done") == 2
    tag = render_tool_call(
        ToolCall(name="write_file", arguments={"path": "a", "content": "<tool_call>"})
    )
    assert further_calls(tag) == 0  # the tag inside the call's own string
    assert further_calls(f"{CUT} <tool_call>") == 0  # no call: no well-formed call after it
    assert further_calls(f"{submit} <tool_call> and prose") == 0  # a mentioned tag is no call


def test_observation_messages() -> None:
    assert observation_message("ok", tool_role=True) == {"role": "tool", "content": "ok"}
    assert observation_message("ok", tool_role=False) == {
        "role": "user",
        "content": "<tool_response>\nok\n</tool_response>",
    }
