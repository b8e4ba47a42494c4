"""Which `<tool_call>` of a turn is its call (`infra.inference.toolcalls`): a tag that is only
mentioned, or a call drafted inside a `<think>` block, is not; and a turn its token limit cut
before any call began is told to answer with the call first, not to write less per call."""

from __future__ import annotations

from contracts.episode import WORKSPACE_TOOLS, ToolCall
from infra.inference.toolcalls import CUT_ADVICE, further_calls, parse_tool_call

LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
BASH_LS = ToolCall(name="bash", arguments={"command": "ls"})


def parse(text: str, cut_at: int | None = None) -> ToolCall:
    return parse_tool_call(text, WORKSPACE_TOOLS, cut_at=cut_at)


def test_a_tag_mentioned_before_the_call_is_no_call() -> None:
    text = f"I will use <tool_call> tags.\n{LS}"
    assert parse(text) == BASH_LS
    assert further_calls(text) == 0
    empty = f"Calls go in <tool_call></tool_call> tags.\n{LS}"
    assert parse(empty) == BASH_LS and further_calls(empty) == 0


def test_a_call_drafted_inside_a_think_block_is_not_the_call() -> None:
    text = f"<think>I could call {SUBMIT} but no</think>{LS}"
    assert parse(text) == BASH_LS
    assert further_calls(text) == 0
    # a call after the think block is counted as further only when it is well formed
    assert further_calls(f"{text}\n{SUBMIT}") == 1
    assert further_calls(f"{text}\n<tool_call> and more prose") == 0


def test_nothing_after_an_unclosed_think_block_is_a_call() -> None:
    unclosed = f"<think>maybe {LS}"
    assert parse(unclosed).error is not None and parse(unclosed).name == ""
    assert "no tool call found" in (parse(unclosed).error or "")
    # a `<think>` that does not start the turn is text: the call after it is a further call
    assert further_calls(f"{SUBMIT}<think>then {LS}") == 1
    # a think tag inside the call's own argument opens no think block
    echo = '<tool_call>{"name": "bash", "arguments": {"command": "echo \'<think>\'"}}</tool_call>'
    assert parse(echo) == ToolCall(name="bash", arguments={"command": "echo '<think>'"})
    assert further_calls(f"{echo}{SUBMIT}") == 1


def test_the_call_is_the_first_tag_whose_json_is_a_call() -> None:
    broken = '<tool_call>{"name": "bash" "arguments": {}}</tool_call>'
    assert parse(f"{broken}\n{LS}") == BASH_LS
    # an error of the call itself (an unknown tool) is still the call: the later one does not run
    unknown = '<tool_call>{"name": "python", "arguments": {}}</tool_call>'
    assert (parse(f"{unknown}{LS}").error or "").startswith("unknown tool 'python'")
    assert further_calls(f"{unknown}{LS}") == 1
    # no tag holds a call: the error is the last tag's (the one the model was writing)
    assert parse(f"I use <tool_call> tags.\n{broken}").error == (
        "the tool call is not valid JSON: Expecting ',' delimiter (position 16)"
    )


def test_a_turn_cut_before_any_call_is_told_to_call_first() -> None:
    error = parse("Let me think. " * 40, cut_at=128).error or ""
    assert error.startswith("the turn ran out of its 128 tokens before any tool call")
    assert "call first" in error
    assert CUT_ADVICE not in error and "write_file" not in error
    thinking = parse(f"<think>I could {LS} and then", cut_at=64).error or ""
    assert thinking.startswith("the turn ran out of its 64 tokens before any tool call")
    # a begun call keeps the advice to write less per call
    begun = parse('<tool_call>{"name": "write_file", "arguments": {"content": "', cut_at=9).error
    assert begun is not None and CUT_ADVICE in begun
