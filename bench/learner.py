"""A learner step with each group's prompt run once vs every sample run whole, side by side.

    .venv/bin/python bench/learner.py [--steps 3] [--seed 0] [--device cpu|cuda]
        [--train-last-layers N]

SmolLM2-135M-Instruct (the smollm2 preset's fp32 model; `make train` or `tempered eval --policy
smollm2` materialises it) in the learner engine with the preset's GRPO settings (top 6 of 30
layers trained, micro-batches of 8, 4 groups a step). The groups have the default run's shape:
G = 6 samples of one starter task's real first prompt (the chat template's tokens, 126-168
of them); a sample solves at turn 1 (20-60 sampled tokens) or takes a second turn (a first
turn of 40-128 tokens, a test log of 100-220, a second turn of 20-128), half and half, with
random token ids (a step's cost depends on the lengths, not on the tokens). First one
unmeasured step per mode (groups of its own), so neither measured mode pays first-call costs
(on a GPU: kernel loads, the allocator's growth); until 6 December there was none, and
`shared` went first at step 0, paying them. Every step then trains new groups with
`share_prompt` on and off, in alternating order; reported are median seconds per step, the
tokens each mode computes (padding included) and the ratio. Printed and merged into
bench/results.json under "learner".

Not covered: the publish and save that follow a step (bench/publish.py), and the decoder that
shares the CPU with the learner in a real run. It refuses a busy machine
(`common.require_idle`, and after each measured step if other processes took the cores;
`--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from common import (  # first: puts the repo root on sys.path
    add_busy_flag,
    idle_side,
    machine,
    median_of,
    merge_results,
    require_idle,
)

from contracts.learner import GRPOConfig
from contracts.task import EnvName
from contracts.trajectory import Trajectory
from infra import grpo_plan
from infra.base_models import materialize_base_model
from infra.inference.prompts import ChatFormat
from infra.learner_engine import LearnerEngine
from infra.presets import load_preset
from infra.settings import Settings
from infra.tasks import load_suite
from tests.trajectories import Step, trajectory


def episode(rng: random.Random, prompt: list[int]) -> list[Step]:
    """One sample's steps: solved at turn 1, or a failing first turn, its log and a second."""

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(3, 49_000) for _ in range(rng.randint(low, high))]

    if rng.random() < 0.5:
        first = tokens(20, 60)
        return [Step(prompt, first, [-1.0] * len(first))]
    first, log, second = tokens(40, 128), tokens(100, 220), tokens(20, 128)
    return [
        Step(prompt, first, [-1.0] * len(first)),
        Step(log, second, [-1.0] * len(second)),  # `added`: the tokens since the last step
    ]


def make_groups(rng: random.Random, prompts: list[list[int]], count: int, g: int) -> list[Any]:
    groups = []
    for _ in range(count):
        task = rng.randrange(len(prompts))
        groups.append(
            [
                trajectory(
                    episode(rng, prompts[task]), reward=float(s % 2), task_id=f"t{task}", sample=s
                )
                for s in range(g)
            ]
        )
    return groups


def computed_tokens(groups: list[list[Trajectory]], config: GRPOConfig) -> int:
    """Tokens the step's forwards run, padding included (a shared prompt once per pass)."""
    passes = grpo_plan.plan_step(groups, 0, config, pad_id=0).passes
    return sum(
        p.prefix + sum(b.input_ids.numel() - p.prefix * b.input_ids.size(0) for b in p.batches)
        for p in passes
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--micro-batch-size", type=int, default=0, help="default: the preset's")
    parser.add_argument("--micro-batch-tokens", type=int, default=-1, help="default: the preset's")
    parser.add_argument(
        "--train-last-layers", type=int, default=-1, help="0 trains all; default: the preset's"
    )
    parser.add_argument("--device", default="cpu", help="the learner's torch device")
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    from transformers import AutoTokenizer

    preset = load_preset("smollm2")
    config = preset.grpo.model_copy(update={"max_staleness": 1000})
    if args.micro_batch_size:
        config = config.model_copy(update={"micro_batch_size": args.micro_batch_size})
    if args.micro_batch_tokens >= 0:
        config = config.model_copy(update={"micro_batch_tokens": args.micro_batch_tokens})
    if args.train_last_layers >= 0:
        config = config.model_copy(update={"train_last_layers": args.train_last_layers})
    path = materialize_base_model("smollm2", Settings())
    chat = ChatFormat(AutoTokenizer.from_pretrained(str(path)), EnvName.CODE)
    prompts = [chat.first_prompt(t.prompt) for t in load_suite("starter", split="train")]
    rng = random.Random(args.seed)
    engine = LearnerEngine(args.device)
    engine.load(path, 0, config)
    warm_rng = random.Random(f"warm-up {args.seed}")  # the measured groups stay as before
    warm = make_groups(warm_rng, prompts, config.groups_per_step, preset.group_size)
    for mode in ("shared", "whole"):  # first calls: not measured, groups of their own
        engine.train_step(warm, config.model_copy(update={"share_prompt": mode == "shared"}))
    seconds: dict[str, list[float]] = {"shared": [], "whole": []}
    tokens: dict[str, int] = {"shared": 0, "whole": 0}
    for step in range(args.steps):
        groups = make_groups(rng, prompts, config.groups_per_step, preset.group_size)
        order = ["shared", "whole"] if step % 2 == 0 else ["whole", "shared"]
        for mode in order:
            shared = mode == "shared"
            mode_config = config.model_copy(update={"share_prompt": shared})
            with idle_side(f"{mode} step {step}"):
                metrics = engine.train_step(groups, mode_config)
            seconds[mode].append(metrics.duration_s)
            tokens[mode] += computed_tokens(groups, mode_config)
            print(
                f"step {step} {mode:6s} {metrics.rows} rows, {metrics.tokens} sampled tokens: "
                f"{metrics.duration_s:6.2f} s",
                flush=True,
            )
    shared_s, whole_s = median_of(seconds["shared"]), median_of(seconds["whole"])
    report: dict[str, Any] = {
        "steps": args.steps,
        "device": args.device,
        "train_last_layers": config.train_last_layers,
        "groups_per_step": config.groups_per_step,
        "group_size": preset.group_size,
        "shared_s": round(shared_s, 2),
        "whole_s": round(whole_s, 2),
        "speedup": round(whole_s / shared_s, 2),
        "tokens_shared": tokens["shared"],
        "tokens_whole": tokens["whole"],
        "machine": machine(),
    }
    print(
        f"learner step: prompt shared {shared_s:.2f} s vs whole {whole_s:.2f} s -> "
        f"{whole_s / shared_s:.2f}x; tokens computed {tokens['shared']} vs {tokens['whole']} "
        f"({tokens['shared'] / tokens['whole']:.2f}x)"
    )
    merge_results("learner", report)


if __name__ == "__main__":
    main()
