"""A code block whose opening line has backticks after its tag (```` ```python  # uses `x` ````)
is a block: `extract_code` runs it, and the stop rule ends the turn after it; in time linear in
the text however many backticks it holds.

Before, the opening fence's rest of line could hold no backtick (`[^\\n`]*`, to keep a run of
backticks from costing quadratic time): such a lone block was no block, and `extract_code`
returned "" (an empty program ran), nor did the turn end after it. Taking any rest of line
(`[^\\n]*`, even atomic) is quadratic in a row of backticks: each fence of the run scans to the
line's end."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference.prompts import extract_code, program_closed
from infra.inference.stops import StopRules

BLOCK = "```python  # uses `x`, see ``y``\ndef f(x):\n    return x\n```"
CODE = SamplingParams(stop_after_code_block=True, max_new_tokens=8192)


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        (BLOCK, "def f(x):\n    return x\n"),
        ("Here:\n" + BLOCK + "\nDone.", "def f(x):\n    return x\n"),
        ("```py `a` b\nprint(1)\n", "print(1)\n"),  # cut inside the block: runs to the end
        ("``` `x`\ndef g(): pass\n```", "def g(): pass\n"),  # untagged
        ("```bash  # `ls`\nls\n```", ""),  # another language's block still
        ("````bash\nls\n````", ""),  # four backticks: the tag is bash's
        ("````python\ndef h(): pass\n````", "def h(): pass\n"),
    ],
    ids=["lone", "in-prose", "cut", "untagged", "bash", "four-bash", "four-python"],
)
def test_a_block_whose_opening_line_holds_backticks_is_a_block(completion: str, code: str) -> None:
    assert extract_code(completion) == code


def test_the_turn_ends_after_such_a_block(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert program_closed(BLOCK)
    for turn in (BLOCK, "Sure: " + BLOCK, "Use `x` and ``y``: " + BLOCK):
        ids = tokenizer.encode(turn + "\nand then more text", add_special_tokens=False)
        watch = StopRules.of(tokenizer).watch(CODE)
        assert watch is not None
        stop = next((at for at, token in enumerate(ids) if watch.add(token)), None)
        assert stop is not None, turn
        assert tokenizer.decode(ids[: stop + 1]) == turn


def seconds(read: Callable[[str], object], text: str) -> float:
    """The fastest of three reads of `text`."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        read(text)
        best = min(best, time.perf_counter() - began)
    return best


@pytest.mark.parametrize(
    "unit",
    ["`", "``` ", "```python `x` ", "```py ` `` "],
    ids=["backticks", "fences", "ticks-after-tag", "mixed"],
)
def test_a_row_of_backticks_costs_time_linear_in_its_length(unit: str) -> None:
    text = unit * (50_000 // len(unit))
    for read in (extract_code, program_closed):
        once, twice = seconds(read, text), seconds(read, text * 2)
        # linear: milliseconds, twice as many at twice the length (20 ms for a busy machine's
        # noise); quadratic (`(?>[^\n]*)`): over a second, then four times as many
        assert twice < 3 * once + 0.02, (read, unit, once, twice)
