"""The stop rules (`infra.inference.stops`) read a turn as its parser does where the prompt opened
the think block, and cost time linear in the row: each fence or closing tag examines only the
text added since the last (a degenerate row of 5,000+ tokens of bash blocks or of bare closing
tags took seconds, rescanning the whole row at each). Over the `tiny` preset's byte-level
vocabulary, where every byte is a token."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from contracts.episode import WORKSPACE_TOOLS
from contracts.task import EnvName, SamplingParams
from infra.inference.prompts import ChatFormat
from infra.inference.stops import RowWatch, StopRules
from infra.inference.toolcalls import parse_tool_call

REAL = '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>'
DRAFT = '<tool_call>\n{"name": "bash", "arguments": {"command": "rm -rf src"}}\n</tool_call>'
TOOLS = SamplingParams(stop_after_tool_call=True, max_new_tokens=8192)
CODE = SamplingParams(stop_after_code_block=True, max_new_tokens=8192)
THINKING_2507 = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


@pytest.fixture(scope="module")
def rules(tokenizer: Any) -> StopRules:
    return StopRules.of(tokenizer)


def feed(watch: RowWatch, ids: list[int]) -> int | None:
    """Where the row stops (the index of its last token), None where it runs on."""
    for at, token in enumerate(ids):
        if watch.add(token):
            return at
    return None


def stopped(tokenizer: Any, rules: StopRules, text: str, prompt: list[int] | None = None) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    watch = rules.watch(TOOLS, prompt=prompt or [])
    assert watch is not None
    at = feed(watch, ids)
    return str(tokenizer.decode(ids if at is None else ids[: at + 1]))


def test_a_row_whose_prompt_opened_the_think_block_ends_after_the_real_call(
    tokenizer: Any, rules: StopRules
) -> None:
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = THINKING_2507
    prompt = ChatFormat(chat_tokenizer, EnvName.WORKSPACE).first_prompt("Fix the bug.")
    turn = f"Maybe {DRAFT} no, that deletes the code.\n</think>\n\n{REAL}"
    kept = stopped(tokenizer, rules, f"{turn}\nmore", prompt)
    assert kept == turn  # not at the draft's closing tag
    assert parse_tool_call(kept, WORKSPACE_TOOLS, thinking=True).arguments == {
        "command": "pytest -q"
    }
    # the same prompt, guided: its call is its first token on, never thinking
    guided = rules.watch(TOOLS.model_copy(update={"tool_choice": "required"}), prompt=prompt)
    assert guided is not None and guided.thinking is False


def test_a_think_tag_in_prose_does_not_keep_the_row_running(
    tokenizer: Any, rules: StopRules
) -> None:
    turn = f"The bug: parse() keeps the <think> tag. Let me run the tests first.\n{REAL}"
    assert stopped(tokenizer, rules, f"{turn}\nand more") == turn
    broken = '<tool_call>\n{"name": "bash", "arguments": {"command": "grep \'<think>\' a"}\n'
    turn = f"{broken}</tool_call>\n{REAL}"
    assert stopped(tokenizer, rules, f"{turn}\nand more") == turn


def cost(rules: StopRules, params: SamplingParams, ids: list[int]) -> tuple[float, RowWatch]:
    """The fastest of three rows writing `ids` (seconds), and the last row's watch."""
    best, last = float("inf"), None
    for _ in range(3):
        watch = last = rules.watch(params)
        assert watch is not None
        began = time.perf_counter()
        assert feed(watch, ids) is None
        best = min(best, time.perf_counter() - began)
    assert last is not None
    return best, last


@pytest.mark.parametrize(
    ("params", "unit", "count"),
    [(CODE, "```bash\nls\n```\n", 350), (TOOLS, "</tool_call>\n", 400)],
    ids=["bash-blocks", "closing-tags"],
)
def test_a_degenerate_row_costs_time_linear_in_its_length(
    tokenizer: Any, rules: StopRules, params: SamplingParams, unit: str, count: int
) -> None:
    row = tokenizer.encode(unit * count, add_special_tokens=False)
    assert len(row) >= 5000
    double = tokenizer.encode(unit * 2 * count, add_special_tokens=False)
    (once, watch), (twice, watch_twice) = cost(rules, params, row), cost(rules, params, double)
    assert twice / once < 3.0, (once, twice)  # quadratic: about 4
    # each token decoded a few times at most, however many fences or tags the row holds
    assert watch.decoded <= 3 * len(row) and watch_twice.decoded <= 3 * len(double)


def test_the_row_text_is_its_decode_across_characters_of_several_tokens(
    tokenizer: Any, rules: StopRules
) -> None:
    text = "é漢🎉`" * 30 + "```python\ndef f():\n    return 'é漢🎉'\n```"
    ids = tokenizer.encode(text, add_special_tokens=False)
    watch = rules.watch(CODE)
    assert watch is not None
    for at, token in enumerate(ids):
        done = watch.add(token)
        assert watch.text == tokenizer.decode(ids[: watch.read])
        if done:
            assert at == len(ids) - 1
    assert watch.read == len(ids) and watch.text == text


def test_the_local_decoder_gives_each_row_its_prompt_s_flag(policy: Any, tokenizer: Any) -> None:
    from infra.inference.decoder import RowBatch
    from infra.inference.local import _choose

    batch = RowBatch(policy, _choose)
    opened = tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    plain = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert batch.row(opened, TOOLS).watch.thinking is True  # type: ignore[union-attr]
    assert batch.row(plain, TOOLS).watch.thinking is False  # type: ignore[union-attr]
