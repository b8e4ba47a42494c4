"""A code block whose opening line has backticks after its tag (```` ```python  # uses `x` ````)
is a block: `extract_code` runs it, and the stop rule ends the turn after it; in time linear in
the text however many backticks it holds.

Before, the opening fence's rest of line could hold no backtick (`[^\\n`]*`, to keep a run of
backticks from costing quadratic time): such a lone block was no block, and `extract_code`
returned "" (an empty program ran), nor did the turn end after it. Taking any rest of line
(`[^\\n]*`, even atomic) is quadratic in a row of backticks: each fence of the run scans to the
line's end.

Only a fence that starts its line (after the text's start or a newline, as Markdown's do) may
have backticks after its tag: one mid-line keeps the old rule. Prose that mentions a fence
(```` You can use ``` and `print` here. ````) opened a block there, tagged `and`, whose body ran to
the real ```` ```python ```` fence, used up as its closing one: `extract_code` returned "" and the
turn did not end after the block."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference.prompts import extract_code, program_closed, program_scan
from infra.inference.stops import StopRules

BLOCK = "```python  # uses `x`, see ``y``\ndef f(x):\n    return x\n```"
PROSE = "You can use ``` and `print` here.\n```python\ndef add(a, b):\n    return a + b\n```"
MENTION = "Wrap code in ``` like `this`.\n```python\ndef f(x):\n    return x + 1\n```"
ADD, F = "def add(a, b):\n    return a + b\n", "def f(x):\n    return x + 1\n"
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
    for turn in (BLOCK, "Sure:\n" + BLOCK, PROSE, MENTION, "Use `x` and ``y``:\n" + MENTION):
        ids = tokenizer.encode(turn + "\nand then more text", add_special_tokens=False)
        watch = StopRules.of(tokenizer).watch(CODE)
        assert watch is not None
        stop = next((at for at, token in enumerate(ids) if watch.add(token)), None)
        assert stop is not None, turn
        assert tokenizer.decode(ids[: stop + 1]) == turn


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        (PROSE, ADD),
        (MENTION, F),
        (MENTION + "\n", F),
        ("Use ``` `x` ``` here.\n" + PROSE, ADD),  # two fences mid-line, then the block
        ("See ```py `a`.\n```py\ndef g(): pass\n```", "def g(): pass\n"),  # a tag mid-line
        ("x ```\ndef g(): pass\n```", "def g(): pass\n"),  # mid-line, no backtick: a block
    ],
    ids=["prose", "mention", "mention-newline", "two-mid-line", "tag-mid-line", "mid-line-bare"],
)
def test_a_fence_mid_line_takes_no_backtick_after_its_tag(completion: str, code: str) -> None:
    assert extract_code(completion) == code
    assert program_closed(completion)


def test_a_block_opened_mid_line_with_backticks_after_its_tag_is_none() -> None:
    # not Markdown's fence: the rest of the line is prose (`Sure: ```python  # uses `x``)
    for text in ("Sure: " + BLOCK, "Use `x` and ``y``: " + BLOCK):
        assert extract_code(text) == ""
        assert not program_closed(text)


@pytest.mark.parametrize(
    "text",
    [PROSE, MENTION, BLOCK, "Sure:\n" + BLOCK, "a ```py `x`\n" + BLOCK],
    ids=["prose", "mention", "block", "block-on-its-line", "after-a-mid-line-fence"],
)
def test_a_growing_turn_is_read_as_the_whole_one(text: str) -> None:
    at = 0
    for end in range(len(text) + 1):
        closed, at = program_scan(text[:end], at)
        assert closed == program_closed(text[:end]), text[:end]
        if closed:
            assert end == len(text), text[:end]
            break
    assert closed


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
