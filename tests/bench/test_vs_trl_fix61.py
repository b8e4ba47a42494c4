"""bench/trl_side.py against TRL itself (its GRPOTrainer on the `tiny` model, on CPU): TRL's
loss is normalized as Tempered's learner normalizes it, and its run evaluates its last model
as Tempered's does, whatever `eval_every`. The tests that run TRL are `slow` and need the bench's
extra (`pip install -e '.[bench]'`, which `make bench` runs; `make test` installs no TRL): the
rule of when TRL evaluates (`eval_due`) is tested in every suite."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest


def bench_args(**given: object) -> argparse.Namespace:
    """vs_trl's command line for a `tiny` run (`--target 0`: every step runs)."""
    defaults = {
        "preset": "tiny",
        "target": 0.0,
        "gain": 0.1,
        "steps": 1,
        "seed": 0,
        "lr": None,
        "prompts_per_step": None,
        "group_size": None,
        "max_new_tokens": 8,
        "train_last_layers": None,
        "max_turns": 1,
        "eval_every": 0,
    }
    return argparse.Namespace(**{**defaults, **given})


@pytest.mark.slow  # a real TRL run, ~1 min here: `eval_due` below is its rule, in the suite
def test_trl_evaluates_its_last_model_with_eval_every_0(tmp_path: Path, tiny_dir: Path) -> None:
    """Tempered's run evaluates before its first step and after its last whatever `eval_every`
    (0: only then); TRL's side evaluated step 0 alone with `--eval-every 0`."""
    pytest.importorskip("trl")
    from trl_side import trl_side
    from vs_trl import Timeline, experiment

    from infra.settings import Settings

    args = bench_args(steps=1, eval_every=0)
    run = experiment(args).model_copy(update={"base_model": str(tiny_dir)})
    timeline = Timeline("trl", args)
    trl_side(Settings(home=tmp_path / "home"), run, tiny_dir, 0, timeline, tmp_path / "trl")
    assert sorted(timeline.evals) == [0, 1], timeline.evals


REWARDS = {"a": [1.0, -0.1], "b": [-0.1, 1.0], "c": [1.0, 1.0], "d": [-0.1, -0.1]}
"""One step of 4 groups of 2 (the sandbox's 1.0 and -0.1), two of them flat (no signal)."""


@pytest.mark.slow  # TRL's generation on `tiny`: needs the bench's extra
def test_trl_normalizes_the_loss_over_the_tokens_tempered_does(
    tmp_path: Path, tiny_dir: Path
) -> None:
    """Tempered's learner leaves a flat group out of the step (no KL term: it has no gradient)
    and scales each token by 1/(sampled tokens of the groups with a signal) (infra/grpo_plan.py);
    TRL's `dapo` divided by every completion token of the generation batch, flat groups' too
    (half as much a step here). TRL's real generation, on the `tiny` model."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_side import grpo_config, grpo_trainer
    from vs_trl import experiment

    from infra import grpo_plan
    from infra.inference.prompts import task_messages
    from tests.trajectories import Step, trajectory

    args = bench_args(group_size=2, prompts_per_step=4)
    run = experiment(args)
    assert run.grpo.kl_coef == 0.0

    def fixed(completions: list[object], task_id: list[str], **_: object) -> list[float]:
        seen: dict[str, int] = {}
        out = []
        for task in task_id:
            out.append(REWARDS[task][seen.get(task, 0)])
            seen[task] = seen.get(task, 0) + 1
        return out

    rows = [{"prompt": task_messages(f"write {t}"), "task_id": t} for t in REWARDS]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    trainer = grpo_trainer()(
        model=model,
        reward_funcs=fixed,
        args=grpo_config(run, 0, tmp_path / "trl"),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir),
    )
    config = trainer.args
    assert (config.gradient_accumulation_steps, config.steps_per_generation) == (1, 1)
    assert trainer.accelerator.num_processes == 1 and trainer.loss_type == "dapo"
    model.train()
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(2)])
    # TRL's dapo loss: sum(per-token loss * mask) / num_items_in_batch (one process, no
    # accumulation, one step a generation): its per-token scale
    trl_scale = 1.0 / float(batch["num_items_in_batch"])

    lengths = [int(n) for n in batch["completion_mask"].sum(dim=1)]
    groups = [
        [
            trajectory([Step([1, 2], [3] * lengths[2 * g + i])], reward=r, task_id=t, sample=i)
            for i, r in enumerate(REWARDS[t])
        ]
        for g, t in enumerate(REWARDS)
    ]
    plan = grpo_plan.plan_step(groups, step=0, config=run.grpo, pad_id=0)
    (tempered_scale,) = {r.scale for r in plan.rows}
    assert trl_scale == pytest.approx(tempered_scale), (lengths, trl_scale, tempered_scale)
    flat = batch["advantages"].view(-1, 2)[2:]  # c and d: no signal, nothing learnt
    assert not flat.any(), batch["advantages"]


def test_trl_evaluates_when_tempereds_run_does() -> None:
    """Every `eval_every` steps and after the last (step 0: before training, apart)."""
    from trl_side import eval_due
    from vs_trl import experiment

    def due(steps: int, every: int) -> list[int]:
        run = experiment(bench_args(steps=steps, eval_every=every))
        return [step for step in range(1, steps + 1) if eval_due(step, run)]

    assert due(5, 0) == [5]
    assert due(5, 2) == [2, 4, 5]
    assert due(4, 2) == [2, 4]
