"""One decode step of a running batch: the local backend's KV store vs transformers' own cache,
side by side in one run, at the shapes a default run's batch goes through.

    .venv/bin/python bench/decode.py [--rows 16,64] [--columns 300,800] [--steps 10]
        [--device cpu|cuda]

For each (rows, columns) both sides decode the same batch of SmolLM2-135M-Instruct (the
smollm2 preset's fp32 model; `make train` or `tempered eval --policy smollm2` materialises it):
prompts of columns/3..columns random tokens, left-padded as a running batch is.

- `transformers`: the model with SDPA attention and a `DynamicCache`, stepped as
  `generate` steps a padded batch (the cache concatenated anew each step; with a padding mask,
  SDPA gets the KV heads repeated to the query heads);
- `tempered`: `infra.inference.decoder.RowBatch`, the local backend's batch (its `SlotCache`
  appends in place and its decode attention reads the grouped KV heads directly).

Both sides pick greedily (argmax), so only the model step differs. Each takes one decode step
untimed (the first pays one-time costs), then prints milliseconds per timed step and tokens/s;
the ratio is tempered over transformers tokens/s. The shapes alternate which side goes first
(`first` in each run's figures; before 7 December transformers always went first and the first
decode step was timed).
The rows never end here (no EOS), so neither side pays for rows leaving. Merged into
bench/results.json under "decode". Not covered: prefill, and sampling (top-p sorts on CPU).
It refuses a busy machine (`common.require_idle`, and after each measured side if other
processes took the cores; `--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from common import (  # first: puts the repo root on sys.path
    add_busy_flag,
    idle_side,
    machine,
    merge_results,
    require_idle,
)

from contracts.task import SamplingParams
from infra.base_models import materialize_base_model
from infra.inference.decoder import RowBatch
from infra.inference.local import _choose, load_policy
from infra.settings import Settings

SIDES = ("transformers", "tempered")
WARM_STEPS = 1
"""Decode steps each side takes, per shape, before its timed ones (the first pays one-time
costs: 560 ms against 145-220 ms after, on the tempered side at 16 x 300)."""


def prompts(rows: int, columns: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(100, 40_000) for _ in range(rng.randint(columns // 3, columns))]
        for _ in range(rows)
    ]


@torch.inference_mode()
def transformers_step_s(model: Any, rows: list[list[int]], steps: int) -> float:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache)
    token = out.logits[:, -1:].argmax(-1)
    position = positions[:, -1:]

    def step() -> None:
        nonlocal mask, position, token
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        position = position + 1
        out = model(
            input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache
        )
        token = out.logits[:, -1:].argmax(-1)
        token.tolist()  # waits for the device, as the tempered side's every step does

    return warm_then_timed(step, steps)


def tempered_step_s(
    policy: Any, rows: list[list[int]], steps: int, budget: int | None = None
) -> float:
    """`budget` (tokens a row may sample; default: the warm step's and the timed steps' and
    one more, as the last token needs no forward) is there to test that a row ending is
    refused, not reported as a smaller batch's steps."""
    batch = RowBatch(policy, _choose)
    tokens = WARM_STEPS + steps + 1 if budget is None else budget
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    batch.admit([batch.row(row, params) for row in rows])
    for row in batch.rows:
        row.watch = None
    batch.eos_ids = frozenset()

    def step() -> None:
        ended = batch.step()
        assert not ended, f"{len(ended)} rows ended: the batch would shrink while timed"

    return warm_then_timed(step, steps)


def warm_then_timed(step: Callable[[], None], steps: int) -> float:
    """Seconds per step of `steps` calls of `step`, after WARM_STEPS untimed ones."""
    for _ in range(WARM_STEPS):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def side_order(index: int) -> tuple[str, ...]:
    """The sides in the order the `index`-th shape measures them: they take turns first."""
    return SIDES if index % 2 == 0 else SIDES[::-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--columns", default="300,800")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cpu", help="torch device of both sides")
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    from transformers import AutoModelForCausalLM

    path = str(materialize_base_model("smollm2", Settings()))
    policy = load_policy(path, torch.device(args.device))
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    plain.set_attn_implementation("sdpa")
    results = []
    shapes = [(int(r), int(c)) for r in args.rows.split(",") for c in args.columns.split(",")]
    for index, (rows, columns) in enumerate(shapes):
        batch = prompts(rows, columns, seed=rows * 1000 + columns)
        load = os.getloadavg()[0]
        step_s: dict[str, float] = {}
        for side in side_order(index):
            with idle_side(f"{side} {rows}x{columns}"):
                step_s[side] = (
                    transformers_step_s(plain, batch, args.steps)
                    if side == "transformers"
                    else tempered_step_s(policy, batch, args.steps)
                )
        before, after = step_s["transformers"], step_s["tempered"]
        figure = {
            "rows": rows,
            "columns": columns,
            "first": side_order(index)[0],
            "load": load,
            "transformers_ms": round(before * 1000, 1),
            "tempered_ms": round(after * 1000, 1),
            "transformers_tok_s": round(rows / before, 1),
            "tempered_tok_s": round(rows / after, 1),
            "ratio": round(before / after, 2),
        }
        results.append(figure)
        print(
            f"{rows:>3} rows × {columns:>4} columns (load {load:.1f}): transformers "
            f"{figure['transformers_ms']:>7} ms/step {figure['transformers_tok_s']:>6} tok/s"
            f" | tempered {figure['tempered_ms']:>6} ms/step "
            f"{figure['tempered_tok_s']:>6} tok/s | {figure['ratio']}×",
            flush=True,
        )
    merge_results(
        "decode",
        {
            "machine": machine(),
            "device": args.device,
            "threads": torch.get_num_threads(),
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()
