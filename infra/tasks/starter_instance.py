"""What a `starter` family produces (`Instance`), and the words and numbers families draw on.

A family (`starter_families_numeric.py`, `starter_families_text.py`) is a function
`rng -> Instance` that picks its constants, function name, variant and test inputs from `rng`
only, so the suite is the same on every machine; the tests' expected values are computed later
from `body` (by `infra/tasks/starter.py`). Every `wrong_body` is a plausible mistake
(off-by-one, wrong comparison, forgotten case) and the inputs always include a case that
exposes it: among all of them, which the verdict runs, not necessarily among the shown half
(`starter.render` splits them into shown and hidden tests; the feedback quotes only the shown).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)
"""English names of 0..12: `WORDS[k]` spells a constant in a function name (`add_five`)."""
SAMPLE_WORDS = (
    "apple",
    "river",
    "Stone",
    "level",
    "Noon",
    "racecar",
    "moon",
    "Kayak",
    "tree",
    "banana",
    "Civic",
    "python",
    "radar",
    "open",
    "Level",
    "sky",
    "madam",
    "Hello",
    "world",
    "refer",
    "stats",
    "Otto",
    "piano",
)
"""Words for string inputs: mixed case, several palindromes (some only when case is ignored)."""


@dataclass(frozen=True)
class Instance:
    """One concrete task of a family, before it is rendered into a `TaskSpec`."""

    name: str
    params: str  # e.g. "nums: list[int], k: int"
    returns: str  # e.g. "list[int]"
    spec: str  # docstring sentence(s): what the function returns
    body: str  # canonical body, indented by four spaces
    wrong_body: str  # a plausible mistake, indented by four spaces
    inputs: tuple[tuple[Any, ...], ...]  # argument tuples the tests call the function with


def random_ints(rng: random.Random, count: int, low: int = -9, high: int = 20) -> list[int]:
    """`count` integers drawn uniformly from low..high (both included)."""
    return [rng.randint(low, high) for _ in range(count)]


def random_word(rng: random.Random) -> str:
    """One of `SAMPLE_WORDS`."""
    return rng.choice(SAMPLE_WORDS)


def random_text(rng: random.Random, words: int) -> str:
    """`words` sample words joined by single spaces."""
    return " ".join(random_word(rng) for _ in range(words))
