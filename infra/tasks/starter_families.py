"""The twenty task families of the `starter` suite (rendered by `infra/tasks/starter.py`).

`FAMILIES` names each family and fixes the suite's order. The families themselves live by
kind: numbers and lists in `starter_families_numeric.py`, strings in
`starter_families_text.py`; what they return (`Instance`) and the rules they follow are in
`starter_instance.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from infra.tasks import starter_families_numeric as numeric
from infra.tasks import starter_families_text as text
from infra.tasks.starter_instance import Instance

__all__ = ["FAMILIES", "Instance"]

FAMILIES: dict[str, Callable[[random.Random], Instance]] = {
    "add": numeric.add_constant,
    "multiply": numeric.multiply_constant,
    "linear": numeric.linear,
    "reverse": text.reverse_string,
    "case": text.change_case,
    "repeat": text.repeat_string,
    "sumabove": numeric.sum_above,
    "extreme": numeric.extreme,
    "parity": numeric.keep_parity,
    "letters": text.count_letters,
    "clamp": numeric.clamp,
    "fizzbuzz": numeric.fizzbuzz,
    "palindrome": text.palindrome,
    "temperature": numeric.temperature,
    "running": numeric.running,
    "dedupe": numeric.dedupe,
    "compare": numeric.count_compared,
    "powers": numeric.powers,
    "digits": numeric.digits,
    "words": text.words,
}
"""Family name (the `<family>` of `starter-<family>-<n>`) → instance generator."""
