"""The stop rules agree with what reads the turn they end (`infra.inference.stops`), token by
token over the `tiny` preset's byte-level vocabulary: `stop_after_tool_call` ends a turn at the
closing tag of the call `parse_tool_call` takes (not a mentioned tag's, not a think block's), and
`stop_after_code_block` after the block `extract_code` runs (not a bash block, not an example)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts.episode import WORKSPACE_TOOLS, ToolCall
from contracts.task import SamplingParams
from infra.inference.prompts import extract_code
from infra.inference.stops import StopRules
from infra.inference.toolcalls import parse_tool_call

LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
ADD = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def stopped(tokenizer: Any, params: SamplingParams, text: str) -> str:
    """What of `text` a row writing it token by token keeps under `params`' stop rule."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    watch = StopRules.of(tokenizer).watch(params)
    assert watch is not None
    for at, token in enumerate(ids):
        if watch.add(token):
            return str(tokenizer.decode(ids[: at + 1]))
    return str(tokenizer.decode(ids))


TOOLS = SamplingParams(stop_after_tool_call=True)
CODE = SamplingParams(stop_after_code_block=True)


@pytest.mark.parametrize(
    "before",
    [
        f"<think>I could call {SUBMIT} but no</think>",
        "Calls go in <tool_call></tool_call> tags.\n",
        '<tool_call>{"name": "bash" "arguments": {}}</tool_call>\n',  # broken: no call
    ],
)
def test_a_tool_call_turn_ends_after_the_call_the_parser_takes(tokenizer: Any, before: str) -> None:
    kept = stopped(tokenizer, TOOLS, f"{before}{LS}\nand more after it")
    assert kept == f"{before}{LS}"
    assert parse_tool_call(kept, WORKSPACE_TOOLS) == ToolCall(
        name="bash", arguments={"command": "ls"}
    )


def test_an_unclosed_think_block_does_not_end_the_turn(tokenizer: Any) -> None:
    text = f"<think>first {SUBMIT} then maybe"
    assert stopped(tokenizer, TOOLS, text) == text
    assert stopped(tokenizer, TOOLS, f"{SUBMIT} more") == SUBMIT  # a plain call still ends it


@pytest.mark.parametrize(
    "before",
    [
        "Run it like this:\n```bash\npython sol.py\n```\n",
        "Example input:\n```\n>>> add(1, 2)\n3\n```\nHere is the solution:\n",
    ],
)
def test_a_code_turn_ends_after_the_block_extract_code_runs(tokenizer: Any, before: str) -> None:
    kept = stopped(tokenizer, CODE, f"{before}{ADD}\nMore text.\n```python\nprint(1)\n```")
    assert kept == f"{before}{ADD}"
    assert extract_code(kept) == "def add(a, b):\n    return a + b\n"
