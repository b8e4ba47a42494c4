"""An episode's second turn with and without the prefix store, side by side in one run.

    .venv/bin/python bench/prefix.py [--tasks 16] [--group-size 4] [--rounds 2]

SmolLM2-135M-Instruct (the smollm2 preset's fp32 model; `make train` or `tempered eval --policy
smollm2` materialises it) samples the first turn of `--tasks` held-out starter tasks, G rows
each, as the default run does (temperature 0.9, 128 new tokens, stopped after the code block),
through the local backend's `RowBatch`. Each row's second-turn prompt is then built as the
rollout builds it (`ChatFormat.next_prompt`: its first prompt and completion, end of turn, a
failing-tests observation rendered by `feedback_text`), and the second turns are decoded, in
one batch, twice per round in alternating order:

  whole     every second-turn prompt prefilled from its first token (the store off);
  prefixes  the first turn's rows left their KV in an `infra.inference.prefixes.PrefixStore`,
            so each second turn prefills its observation only.

Both sides sample with the same seeds, so they decode the same tokens (checked: the bench
stops if they differ). Prints seconds per second turn (prefill and decode), the tokens
prefilled, and the ratio whole/prefixes; merged into bench/results.json under "prefix".
Not covered: turns past the second, and memory (the store holds 46 KB a token in fp32).
It refuses a busy machine (`common.require_idle`, and after each measured side if other
processes took the cores; `--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from common import (  # first: puts the repo root on sys.path
    add_busy_flag,
    idle_side,
    machine,
    median_of,
    merge_results,
    require_idle,
)

from contracts.rollout import CompletionRecord
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SamplingParams
from infra.base_models import materialize_base_model
from infra.inference.decoder import RowBatch
from infra.inference.local import _choose, load_policy
from infra.inference.prefixes import PrefixStore
from infra.inference.prompts import ChatFormat, feedback_text
from infra.settings import Settings
from infra.tasks import load_suite

FAILURE = ExecutionResult(
    status=ExecStatus.FAILED,
    exit_code=1,
    tests_total=1,
    stderr=(
        'Traceback (most recent call last):\n  File "/work/test.py", line 14, in <module>\n'
        '    check(candidate)\n  File "/work/test.py", line 6, in check\n'
        "    assert candidate([1, 2, 3]) == [3, 2, 1]\nAssertionError\n"
    ),
)


def decode(policy: Any, prompts: list[list[int]], params: list[SamplingParams], store: Any) -> Any:
    """Every prompt through one `RowBatch`; the outputs and the seconds it took."""
    batch = RowBatch(policy, _choose, store.version("v0") if store is not None else None)
    rows = [batch.row(p, s) for p, s in zip(prompts, params, strict=True)]
    started = time.perf_counter()
    batch.admit(rows)
    while batch.rows:
        batch.step()
    return [row.output for row in rows], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    from transformers import AutoTokenizer

    path = str(materialize_base_model("smollm2", Settings()))
    policy = load_policy(path, torch.device("cpu"))
    chat = ChatFormat(AutoTokenizer.from_pretrained(path), EnvName.CODE)
    tasks = load_suite("starter", split="heldout")[: args.tasks]
    firsts = [chat.first_prompt(t.prompt) for t in tasks for _ in range(args.group_size)]
    params = [
        SamplingParams(temperature=0.9, max_new_tokens=128, seed=i, stop_after_code_block=True)
        for i in range(len(firsts))
    ]
    observation = feedback_text(FAILURE)
    rows: dict[str, list[float]] = {"whole": [], "prefixes": []}
    prefilled: dict[str, int] = {}
    tokens: dict[str, list[list[int]]] = {}
    for round_index in range(args.rounds):
        order = ["whole", "prefixes"] if round_index % 2 == 0 else ["prefixes", "whole"]
        for mode in order:
            store = PrefixStore(8 << 30) if mode == "prefixes" else None
            outputs, _ = decode(policy, firsts, params, store)
            seconds = [
                CompletionRecord(
                    text="",
                    prompt_token_ids=p,
                    completion_token_ids=o.token_ids,
                    logprobs=o.logprobs,
                    policy_version=0,
                )
                for p, o in zip(firsts, outputs, strict=True)
            ]
            nexts = [chat.next_prompt(record, observation) for record in seconds]
            with idle_side(f"{mode} round {round_index}"):
                second, took = decode(policy, nexts, params, store)
            rows[mode].append(took)
            saved = store.reused_tokens if store is not None else 0
            prefilled[mode] = sum(len(p) for p in nexts) - saved
            tokens.setdefault(mode, [o.token_ids for o in second])
            print(
                f"round {round_index} {mode:8s} {len(nexts)} second turns in {took:6.2f} s "
                f"({prefilled[mode]} prompt tokens prefilled of {sum(len(p) for p in nexts)})",
                flush=True,
            )
    if tokens["whole"] != tokens["prefixes"]:
        raise SystemExit("the two modes sampled different tokens: the prefix store is wrong")
    whole, reused = median_of(rows["whole"]), median_of(rows["prefixes"])  # seconds
    report: dict[str, Any] = {
        "tasks": args.tasks,
        "group_size": args.group_size,
        "second_turns": len(firsts),
        "whole_s": round(whole, 2),
        "prefixes_s": round(reused, 2),
        "speedup": round(whole / reused, 3),
        "prefilled_tokens": prefilled,
        "machine": machine(),
    }
    print(
        f"prefix: {len(firsts)} second turns in {whole:.2f} s prefilled whole vs {reused:.2f} s "
        f"from the first turn's KV = {whole / reused:.2f}x; prompt tokens prefilled "
        f"{prefilled['whole']} vs {prefilled['prefixes']}",
        flush=True,
    )
    merge_results("prefix", report)


if __name__ == "__main__":
    main()
