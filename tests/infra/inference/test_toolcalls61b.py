"""Where a turn thinks (`infra.inference.calltags`): a completion whose prompt opened the think
block (Qwen3-*-Thinking-2507, the R1 distills: the generation prompt ends with `<think>`) thinks
up to its first `</think>`, and a call drafted there is no call; otherwise only a `<think>` that
starts the completion opens a block, and a `<think>` written anywhere else (prose, a command's
JSON) is text: the call after it is still the call."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from contracts.episode import WORKSPACE_TOOLS, ToolCall
from contracts.task import EnvName
from infra.inference.prompts import ChatFormat
from infra.inference.toolcalls import call_closed, full_call, further_calls, parse_tool_call

REAL = '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>'
DRAFT = '<tool_call>\n{"name": "bash", "arguments": {"command": "rm -rf src"}}\n</tool_call>'
PYTEST = ToolCall(name="bash", arguments={"command": "pytest -q"})
OPENED = f"Maybe {DRAFT} no, that deletes the code.\n</think>\n\n{REAL}"
"""A turn of a template that opened the think block: the completion holds only `</think>`."""


def parse(text: str, thinking: bool = False) -> ToolCall:
    if thinking:
        return parse_tool_call(text, WORKSPACE_TOOLS, thinking=True)
    return parse_tool_call(text, WORKSPACE_TOOLS)


def test_a_call_drafted_in_a_think_block_the_prompt_opened_is_no_call() -> None:
    assert parse(OPENED, thinking=True) == PYTEST
    assert further_calls(OPENED, thinking=True) == 0
    draft_closed = OPENED[: OPENED.index(DRAFT) + len(DRAFT)]
    assert not call_closed(draft_closed, thinking=True)  # the stop rule does not end it there
    assert call_closed(OPENED, thinking=True)
    # still thinking: nothing is a call, and the turn is not ended
    assert (parse(draft_closed, thinking=True).error or "").startswith("no tool call found")
    # a prompt that opened no block: the same text's first call is the call (and the other a
    # further one), as the parser read it before
    assert parse(OPENED).arguments == {"command": "rm -rf src"} and further_calls(OPENED) == 1


def test_a_think_tag_mentioned_in_prose_is_text() -> None:
    text = f"The bug: parse() keeps the <think> tag. Let me run the tests first.\n{REAL}"
    assert parse(text) == PYTEST
    assert call_closed(text) and further_calls(text) == 0
    # and a `</think>` in prose after a call is text too
    assert parse(f"{REAL} then I strip </think> tags") == PYTEST


def test_a_think_tag_in_a_broken_call_does_not_hide_the_next_call() -> None:
    broken = '<tool_call>\n{"name": "bash", "arguments": {"command": "grep -n \'<think>\' a.py"}\n'
    text = f"{broken}</tool_call>\n{REAL}"
    assert parse(text) == PYTEST
    assert call_closed(text)


def test_a_block_the_completion_opens_is_thinking_until_it_closes() -> None:
    assert parse(f"  <think>maybe {DRAFT}</think>{REAL}") == PYTEST
    assert further_calls(f"<think>maybe {DRAFT}</think>{REAL}") == 0
    assert (parse(f"<think>maybe {DRAFT}").error or "").startswith("no tool call found")
    # a guided row's text starts with its call (the flag is never set for it: starts_thinking)
    assert parse(REAL) == PYTEST and call_closed(REAL)


def test_full_call_reads_the_turn_as_its_brief_was_read() -> None:
    long = "x" * 600
    draft = DRAFT.replace("rm -rf src", f"echo {long}z")
    real = REAL.replace("pytest -q", f"echo {long}y")
    text = f"Maybe {draft} or rather\n</think>\n{real}"
    call = parse(text, thinking=True)
    assert call.arguments == {"command": f"echo {long}y"} and call.brief().cut
    assert full_call(call.brief(), text, WORKSPACE_TOOLS, thinking=True) == call
    # the draft's brief is the same: read as not thinking, the draft would be taken (the turn's
    # record says which: `CompletionRecord.thinking`)
    assert full_call(call.brief(), text, WORKSPACE_TOOLS).arguments != call.arguments


THINKING_2507 = (  # Qwen3-*-Thinking-2507's generation prompt: the think block opened for the model
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
HYBRID = (  # Qwen3 with thinking off: the generation prompt holds an empty, closed block
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def template(tokenizer: Any, text: str) -> Any:
    other = copy.deepcopy(tokenizer)
    other.chat_template = text
    return other


def test_the_flag_is_read_from_the_rendered_prompt(tokenizer: Any) -> None:
    from infra.inference.calltags import starts_thinking

    for chat_template, thinks in ((THINKING_2507, True), (HYBRID, False), (None, False)):
        chat = ChatFormat(
            template(tokenizer, chat_template) if chat_template else tokenizer, EnvName.WORKSPACE
        )
        prompt = chat.first_prompt("Fix the bug.")
        assert starts_thinking(prompt, chat.tokenizer.decode) is thinks
        assert starts_thinking(prompt, chat.tokenizer.decode, guided=True) is False


def test_the_next_prompt_counts_further_calls_as_the_turn_was_read(tokenizer: Any) -> None:
    from contracts.rollout import CompletionRecord

    chat = ChatFormat(template(tokenizer, THINKING_2507), EnvName.WORKSPACE)
    prompt = chat.first_prompt("Fix the bug.")
    completion = tokenizer.encode(OPENED, add_special_tokens=False)
    previous = CompletionRecord(
        text=OPENED,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        policy_version=0,
    )
    shown = tokenizer.decode(chat.next_prompt(previous, "1 passed", turn=1, turns=3))
    assert "further call" not in shown  # the draft, in the think block, is no call
