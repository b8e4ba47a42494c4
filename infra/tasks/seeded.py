"""The built-in suites' one rule for seeded families: task ids, splits and random streams.

    for task_id, instance, split, rng in seeded("basics", FAMILIES, per_family=10, train=6):
        tasks.append(render(instance, task_id, split))

A family is a function `rng -> instance` that draws everything from `rng`; each family's
stream is `random.Random("tempered-<suite>-<family>")` (a str seed hashes stably, by sha512),
so a suite is the same on every machine. Instances 0 .. train - 1 of a family are `train`, the
rest `heldout`: held-out tasks are new instances of the families trained on. The stream is
yielded too, for a suite that draws more from it after the instance (its hidden inputs).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Literal, TypeVar

Split = Literal["train", "heldout"]
T = TypeVar("T")


def seeded(
    suite: str, families: Mapping[str, Callable[[random.Random], T]], *, per_family: int, train: int
) -> Iterator[tuple[str, T, Split, random.Random]]:
    """(task id `<suite>-<family>-<n>`, instance, split, the family's stream), family by family."""
    for family, make in families.items():
        rng = random.Random(f"tempered-{suite}-{family}")
        for n in range(per_family):
            split: Split = "train" if n < train else "heldout"
            yield f"{suite}-{family}-{n}", make(rng), split, rng
