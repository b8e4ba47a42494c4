"""The stop rules read a growing turn as the parser reads the whole one: `calltags.CallWatch`
fed ever longer prefixes agrees with the whole-turn tag scan (`calltags.tags`) at each, and
`prompts.program_scan` carried along agrees with the block rule read afresh; and neither reads a
degenerate turn again at each tag (a broken call repeated, closing tags inside a string)."""

from __future__ import annotations

import random
import time

import pytest

from infra.inference.calltags import CALL_CLOSE, CallWatch, tags
from infra.inference.prompts import _DEFINES, _program_blocks, program_scan

CALL_PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    '{"name": "bash", "arguments": {"command": "ls"}}',
    '{"name": "submit"}',
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    '\\"',
    " ",
    "\n",
    "```json\n",
    "```",
    "`",
    "x",
    '"name"',
    ":",
    ",",
    '"bash"',
    "NaN",
    "-Infinity",
    "1.",
    "5",
    "e",
]
BLOCK_PIECES = ["```", "```python\n", "```bash\n", "def f():\n", "`", "``", "\n", "x", " ", "py"]


def closed_afresh(text: str, thinking: bool) -> bool:
    for _, end in tags(text, thinking):
        if end is not None:
            return text.find(CALL_CLOSE, end) >= 0
    return False


def program_afresh(text: str) -> bool:
    return any(m.group(3) and _DEFINES.search(m.group(2)) for m in _program_blocks(text))


@pytest.mark.parametrize("thinking", [False, True])
def test_a_growing_turn_is_read_as_the_whole_one(thinking: bool) -> None:
    draw = random.Random(61)
    for _ in range(400):
        text = "".join(draw.choice(CALL_PIECES) for _ in range(draw.randrange(1, 40)))
        watch = CallWatch(thinking)
        for end in sorted({draw.randrange(len(text) + 1) for _ in range(6)} | {len(text)}):
            prefix = text[:end]
            assert watch.closed(prefix) == closed_afresh(prefix, thinking), (prefix, thinking)


def test_a_growing_turn_ends_at_the_block_read_afresh() -> None:
    draw = random.Random(62)
    for _ in range(600):
        text = "".join(draw.choice(BLOCK_PIECES) for _ in range(draw.randrange(1, 30)))
        at = 0
        for end in range(len(text) + 1):
            closed, at = program_scan(text[:end], at)
            assert closed == program_afresh(text[:end]), text[:end]
            if closed:
                break


def reads(head: str, unit: str, count: int) -> float:
    """Seconds a watch takes over a turn of `head` and `count` units, read after each unit (the
    fastest of three; the turn grows in place, as a row's text does)."""
    best = float("inf")
    for _ in range(3):
        watch, text, began = CallWatch(False), head, time.perf_counter()
        for _ in range(count):
            text += unit
            assert not watch.closed(text), unit
        best = min(best, time.perf_counter() - began)
    return best


@pytest.mark.parametrize(
    ("head", "unit"),
    [
        ("", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>\n'),
        ('<tool_call>{"name": "bash", "arguments": {"command": "echo \'', "</tool_call>\n"),
        ('<tool_call>{"name": "write_file", "arguments": {', '"k": "</tool_call>", '),
        ("<think>", "<tool_call>{}</tool_call>"),
    ],
    ids=["broken-calls", "tags-in-a-string", "tags-in-many-strings", "thinking"],
)
def test_a_degenerate_turn_is_read_once(head: str, unit: str) -> None:
    count = 1500
    once, twice = reads(head, unit, count), reads(head, unit, 2 * count)
    assert twice / once < 3.0, (once, twice)  # read again at each tag: about 4
