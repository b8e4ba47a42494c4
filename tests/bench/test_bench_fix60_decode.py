"""bench/decode.py times warm steps only and alternates which side goes first: its tempered
side's first decode step (560 ms against 145-220 ms after, one-time costs) was timed, and
transformers always went first."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

SLOW_FIRST_S = 3.0


def _slow_first_decode_step(model: Any) -> Any:
    """A forward hook on the real model: its first one-token (decode) forward pays
    SLOW_FIRST_S more, as a first call's one-time costs do."""
    decoded: list[int] = []

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] == 1:
            decoded.append(1)
            if len(decoded) == 1:
                time.sleep(SLOW_FIRST_S)

    return model.register_forward_pre_hook(hook, with_kwargs=True), decoded


ROWS = [[5 + (i * 7 + j) % 90 for j in range(8 + 3 * i)] for i in range(4)]
STEPS = 2


def test_the_tempered_sides_first_decode_step_is_not_timed(tiny_dir: Path) -> None:
    from decode import tempered_step_s

    from infra.inference.local import load_policy

    policy = load_policy(str(tiny_dir), torch.device("cpu"))
    handle, decoded = _slow_first_decode_step(policy.model)
    try:
        seconds = tempered_step_s(policy, ROWS, STEPS)
    finally:
        handle.remove()
    assert len(decoded) == STEPS + 1  # one warm step, then the timed ones, every row still in
    assert seconds < SLOW_FIRST_S / (2 * STEPS), seconds


def test_the_transformers_sides_first_decode_step_is_not_timed(tiny_dir: Path) -> None:
    from decode import transformers_step_s
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    model.set_attn_implementation("sdpa")
    handle, decoded = _slow_first_decode_step(model)
    try:
        seconds = transformers_step_s(model, ROWS, STEPS)
    finally:
        handle.remove()
    assert len(decoded) == STEPS + 1
    assert seconds < SLOW_FIRST_S / (2 * STEPS), seconds


def test_a_row_that_ends_during_the_timed_steps_is_refused(tiny_dir: Path) -> None:
    """The tempered side's budget covers the warm step and every timed one: a batch that
    shrank would time smaller steps, so it stops instead of reporting them."""
    import decode

    from infra.inference.local import load_policy

    policy = load_policy(str(tiny_dir), torch.device("cpu"))
    with pytest.raises(AssertionError, match="ended"):
        decode.tempered_step_s(policy, ROWS, STEPS, budget=STEPS)


def test_the_sides_take_turns_going_first() -> None:
    from decode import SIDES, side_order

    orders = [side_order(index) for index in range(4)]
    assert all(sorted(order) == sorted(SIDES) for order in orders)
    assert [order[0] for order in orders] == ["transformers", "tempered"] * 2
