"""What a workspace episode's prompts tell the model besides the task and the tools' results:
its turns and when its workspace is graded, which turn it is on, and the calls of a turn that
were not run. Before, the model was told none of these: a task asked for four steps of an
episode of three, and a second call in a turn was dropped without a word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts.episode import ToolCall
from contracts.rollout import CompletionRecord
from contracts.task import EnvName
from infra.inference.prompts import (
    OBSERVATION_CHARS,
    WORKSPACE_SYSTEM_PROMPT,
    ChatFormat,
    grading_text,
)
from tests.infra.inference.scripted import render_tool_call

SUBMIT = render_tool_call(ToolCall(name="submit"))
LS = render_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def turn_of(chat: ChatFormat, text: str) -> CompletionRecord:
    first = chat.first_prompt("Fix it.", turns=3)
    return CompletionRecord(
        text=text, prompt_token_ids=first, completion_token_ids=[5], logprobs=[-1.0],
        policy_version=0,
    )  # fmt: skip


def test_the_system_prompt_asks_for_one_function_per_turn() -> None:
    assert "Call exactly one function per turn" in WORKSPACE_SYSTEM_PROMPT


def test_the_task_says_how_many_turns_and_when_the_workspace_is_graded(tokenizer: Any) -> None:
    chat = ChatFormat(tokenizer, EnvName.WORKSPACE)
    told = tokenizer.decode(chat.first_prompt("Fix it.", turns=3))
    assert (
        "Fix it.\n\nYou have 3 turns; your workspace is graded when they run out or when you "
        "call submit.<|im_end|>"
    ) in told
    assert grading_text(1).startswith("You have 1 turn;")
    untold = tokenizer.decode(chat.first_prompt("Fix it."))  # a request that names no count
    assert f"Fix it.\n\n{grading_text(None)}<|im_end|>" in untold
    assert "graded when your turns run out or when you call submit" in grading_text(None)
    code = ChatFormat(tokenizer, EnvName.CODE)  # graded by its answer's tests: nothing to add
    assert "Fix it.<|im_end|>" in tokenizer.decode(code.first_prompt("Fix it.", turns=3))


def test_each_observation_says_the_turn_and_the_calls_not_run(tokenizer: Any) -> None:
    chat = ChatFormat(tokenizer, EnvName.WORKSPACE)
    three = turn_of(chat, f"{LS}\n{SUBMIT}{LS}")
    ids = chat.next_prompt(three, "exit code: 0", turn=1, turns=3)
    start = len(three.prompt_token_ids) + len(three.completion_token_ids) + 1
    assert tokenizer.decode(ids[start:]) == (
        "\n<|im_start|>user\n<tool_response>\nexit code: 0\n"
        "(2 further calls ignored: one call per turn)\n(turn 2 of 3)\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    two = turn_of(chat, f"{LS}{LS}")
    last = tokenizer.decode(chat.next_prompt(two, "ok", turn=2, turns=3)[start:])
    assert "ok\n(1 further call ignored: one call per turn)\n(turn 3 of 3, the last)\n<" in last
    one = turn_of(chat, LS)
    assert chat.next_prompt(one, "ok") == chat.next_prompt(one, "ok", turn=1)  # no count: no turn
    assert "ok\n</tool_response>" in tokenizer.decode(chat.next_prompt(one, "ok")[start:])


def test_a_long_observation_is_clipped_and_its_notes_are_not(tokenizer: Any) -> None:
    chat = ChatFormat(tokenizer, EnvName.WORKSPACE)
    long = "x" * (4 * OBSERVATION_CHARS)
    shown = tokenizer.decode(chat.next_prompt(turn_of(chat, f"{LS}{LS}"), long, turn=1, turns=3))
    assert "characters left out" in shown
    assert shown.endswith(
        "x\n(1 further call ignored: one call per turn)\n(turn 2 of 3)\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
