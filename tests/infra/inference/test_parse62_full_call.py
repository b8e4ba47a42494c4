"""`full_call` of a turn recorded before `CompletionRecord.thinking` existed.

Such a record reads as `thinking=False` (the field is left out while False: a record cannot say
it predates it), but the release that wrote it read a turn by its own rule: every
`<think>…</think>` block hid the calls in it, wherever it stood. Where that reading and this
release's `thinking=False` reading differ (a think block after some prose, a stray `</think>`
first), the record's cut brief matched no reading `full_call` tried: it raised ValueError and
failed the episode, though its docstring promised the reading whose brief it is."""

from __future__ import annotations

import pytest

from contracts.episode import WORKSPACE_TOOLS, ToolCall
from contracts.rollout import CompletionRecord
from infra.inference.toolcalls import full_call, parse_tool_call

LONG = "x" * 600  # over a brief's characters: the brief is cut, `full_call` parses again


def call_tag(command: str) -> str:
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{command}"}}}}\n</tool_call>'


REAL = ToolCall(name="bash", arguments={"command": f"echo real {LONG}"})
TURNS = {  # each as the release before parsed it: `REAL`, the draft hidden in its think block
    "prose then a think block": f"Let me see. <think>{call_tag(f'rm draft {LONG}')}</think>\n"
    + call_tag(f"echo real {LONG}"),
    "a stray close first": f"</think>ok <think>{call_tag(f'rm draft {LONG}')}</think> "
    + call_tag(f"echo real {LONG}"),
}


def old_record(text: str) -> CompletionRecord:
    """A record as the release before wrote it: no `thinking`."""
    return CompletionRecord.model_validate(
        {
            "text": text,
            "prompt_token_ids": [1],
            "completion_token_ids": [2],
            "logprobs": [-0.5],
            "policy_version": 0,
        }
    )


@pytest.mark.parametrize("text", list(TURNS.values()), ids=list(TURNS))
def test_a_record_from_before_the_thinking_flag_gives_the_call_its_brief_names(text: str) -> None:
    record = old_record(text)
    assert record.thinking is False and "thinking" not in record.model_fields_set
    brief = REAL.brief()  # the release before's worker sent this with the record
    assert brief.cut and parse_tool_call(text, WORKSPACE_TOOLS).brief() != brief
    assert full_call(brief, record.text, WORKSPACE_TOOLS, thinking=record.thinking) == REAL


def test_a_record_of_this_release_is_read_as_it_says() -> None:
    """Its own reading first: `thinking=False` takes a call after prose's `<think>`, and a turn
    that started thinking never gives the draft of its thinking."""
    text = TURNS["prose then a think block"]
    draft = parse_tool_call(text, WORKSPACE_TOOLS)
    assert draft.arguments == {"command": f"rm draft {LONG}"}
    assert full_call(draft.brief(), text, WORKSPACE_TOOLS) == draft
    opened = f"maybe {call_tag(f'rm draft {LONG}')}</think>\n{call_tag(f'echo real {LONG}')}"
    assert full_call(REAL.brief(), opened, WORKSPACE_TOOLS, thinking=True) == REAL
    with pytest.raises(ValueError):  # a thinking turn's draft is never its call
        full_call(draft.brief(), opened, WORKSPACE_TOOLS, thinking=True)
    with pytest.raises(ValueError):  # the text of another turn
        full_call(REAL.brief(), call_tag(f"echo other {LONG}"), WORKSPACE_TOOLS)
