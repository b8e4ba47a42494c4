"""Wall time to a held-out pass@1 target: Tempered's training run vs TRL's GRPOTrainer.

    .venv/bin/python bench/vs_trl.py --preset smollm2 [--target 0.3 | --gain 0.1] [--steps 30]
    .venv/bin/python bench/vs_trl.py --full       # smollm2, to +10 points, <= 30 steps, eval every 2
    .venv/bin/python bench/vs_trl.py --preset tiny --target 0 --steps 3    # smoke: s/step only

Same machine, same base model (the preset's, materialized once), same starter suite (train
split to learn from, held-out split to evaluate), same reward (`RewardConfig.score` of the
tests' verdict in the same sandbox backend, `infra.sandbox.get_backend(settings).run`), same G,
prompts per step, learning rate (constant), clip, KL, max_new_tokens, temperature and top_p.
Each side runs in a subprocess of its own (one after the other) and evaluates held-out pass@1
greedily on the same held-out tasks (the suite's `spread` to the preset's `heldout_limit`: 20
of 80 with `tiny`; one sample, one turn, every `--eval-every` steps, and before the first step):

  tempered  a private stack (`tempered up` on free ports) and the production workers of every
            queue in one process; a `TrainingRunWorkflow` started with eval_every=N; evals are
            read from its `progress` query. Clock: from start_workflow (workers built, torch
            and transformers imported) to the run's result (or the target reached), not its
            workers' shutdown nor the stack's teardown (counted in its wall time until 7
            December, TRL's side having neither). The run's own loads stay inside it, as in any
            `tempered train`: the inference worker loads the policy at its first GENERATE and
            the learner its model at its first step (a few seconds of SmolLM2, counted against
            Tempered).
  trl       bench/trl_side.py: `trl.GRPOTrainer` (single-turn, batch = prompts_per_step x G,
            one optimizer step per generation, DAPO token normalization over the groups with
            a signal like Tempered's, the same trainable layers), reward function running
            the completion's code with the task's tests in the sandbox; a callback evaluates
            held-out pass@1 with greedy `generate`. Clock: from `trainer.train()` (torch,
            transformers, TRL and the datasets imported, the sandbox pool up, model and
            trainer built) to its return. Until 6 December it ran from before those imports,
            and TRL's setup counted in its time.

What each side spent before its clock (imports, stack, workers; TRL's model and trainer) is
reported apart as `setup_s`. One invocation measures each side once, so the order cannot
alternate within it: the side that goes first alternates with `--seed` (even: Tempered first,
odd: TRL first; `--first` overrides), and the report names it (`order`). Until 6 December
Tempered always went first.

`--max-turns` (default 1) applies to Tempered only (TRL's GRPOTrainer is single-turn here).
Each side trains with its own method: Tempered keeps the preset's dynamic sampling
(`redraw_flat_groups`) and bounded staleness (`max_staleness`, rollouts one version ahead),
which TRL's trainer has no equivalent of, so a step is not the same work on both sides. TRL's
held-out evaluations stop its training while they run, Tempered's run beside it: each side's
report gives its time to target as measured and, net of evaluations that stopped training
(`…_net_s`, the TRL side's only), what its training alone took; `median_step_gap_s` is net.
`--seed` reaches both sides (Tempered's draw order, TRL's sampler and init). Target: `--target
P` (absolute pass@1), else `--gain G` over the side's own step-0 pass@1, both counted in whole
held-out tasks, a part of one rounded up (+10 points of 80 is +8 tasks: 9/80 -> 17/80 reaches
it, which comparing floats did not until 6 December; of 25, +3, not +2 as until 7 December). A
side stops once an eval reaches the target; the ratio Tempered/TRL of the times to target is
reported (goal <= 0.8). With `--target 0` (the `tiny` model never passes a test) there is no
time to target: every step runs, and wall time per step (evals included on both sides) is what
is compared. Merged into bench/results.json ("vs_trl").
TRL is a bench-only dependency (`pip install -e '.[bench]'`); without it the bench says so and
exits 0 without writing results. It refuses a busy machine before it starts and after a side
that others shared the cores with (`common.require_idle`; `--allow-busy`: marked `busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    add_busy_flag,
    bench_stack,
    idle_side,
    machine,
    median_of,
    merge_results,
    production_workers,
    require_idle,
)
from trl_side import trl_side

from contracts.names import Queue
from contracts.run import TrainingRunInput
from infra.presets import load_preset
from infra.settings import InferenceSettings, Settings
from workers.training import start_run, watch

POLL_S = 0.5
FULL = ["--preset", "smollm2", "--gain", "0.1", "--steps", "30", "--eval-every", "2"]
"""`--full`: the default run's model and suite, to +10 points held-out, at most 30 steps."""


def experiment(args: argparse.Namespace) -> TrainingRunInput:
    """The preset with this bench's overrides: what both sides train with."""
    run = load_preset(
        args.preset, steps=args.steps, seed=args.seed, run_id=f"vs-trl-{uuid.uuid4().hex[:8]}"
    )
    given = {
        "learning_rate": args.lr,
        "groups_per_step": args.prompts_per_step,
        "train_last_layers": args.train_last_layers,
    }
    grpo = run.grpo.model_copy(update={k: v for k, v in given.items() if v is not None})
    tokens = args.max_new_tokens or run.sampling.max_new_tokens
    unstopped = {"max_new_tokens": tokens, "stop_after_code_block": False}  # TRL has no such stop
    return run.model_copy(
        update={
            "group_size": args.group_size or run.group_size,
            "max_turns": args.max_turns,
            "eval_every": args.eval_every,
            "grpo": grpo,
            "sampling": run.sampling.model_copy(update=unstopped),
            "eval_sampling": run.eval_sampling.model_copy(  # the preset's (priority 1), greedy
                update={**unstopped, "temperature": 0.0}
            ),
        }
    )


def base_model_dir(spec: str) -> Path:
    """The preset's HF directory, materialized once in the shared model cache (not per run)."""
    from infra.base_models import materialize_base_model
    from infra.settings import load_settings

    return materialize_base_model(spec, load_settings())


def reached(pass_at_1: float, base: float | None, tasks: int, args: argparse.Namespace) -> bool:
    """Whether an eval of `tasks` held-out tasks reached the target, counted in whole tasks, a part
    of one rounded up (as floats, 17/80 < 9/80 + 0.1; +10 points of 25 is +3 tasks, not +2)."""
    solved = round(pass_at_1 * tasks)
    if args.target is not None:
        return args.target > 0 and solved >= math.ceil(args.target * tasks - 1e-9)
    return base is not None and solved >= round(base * tasks) + math.ceil(args.gain * tasks - 1e-9)


def side_order(seed: int, first: str | None) -> list[str]:
    """Which side runs first: `first`, else Tempered for an even seed and TRL for an odd one."""
    sides = ["tempered", "trl"]
    if first is None:
        first = sides[seed % 2]
    return sides if first == "tempered" else sides[::-1]


class Timeline:
    """When one side finished each optimizer step and each held-out eval (s since its clock, which
    `start` starts once the side is set up; the time before it is `setup_s`) and, once `finish`
    stops the clock when its run ends, its wall time: what comes after (Tempered's workers
    stopping and its stack going down, TRL's pool closing) is not the side's training."""

    def __init__(self, side: str, args: argparse.Namespace) -> None:
        self.side, self.args = side, args
        self.created = self.started = time.perf_counter()
        self.setup_s: float | None = None
        self.steps: dict[int, float] = {}
        self.evals: dict[int, dict[str, Any]] = {}
        self.target_s: float | None = None
        self.target_net_s: float | None = None
        self.stopped_s = 0.0  # evaluations that stopped training (TRL's), so far
        self.ended: float | None = None

    def start(self) -> None:
        """The side is set up: its clock starts now."""
        self.started = time.perf_counter()
        self.setup_s = self.started - self.created

    def finish(self) -> None:
        """The side's run ended (its result arrived, `train()` returned): its clock stops (the
        first call's)."""
        if self.ended is None:
            self.ended = time.perf_counter()

    def now(self) -> float:
        """Seconds since the clock started, to its stop once stopped."""
        return (self.ended or time.perf_counter()) - self.started

    def net(self) -> float:
        """Seconds since the clock, less the evaluations that stopped training."""
        return self.now() - self.stopped_s

    def stepped(self, step: int) -> None:
        self.steps.setdefault(step, self.net())

    def evaluated(self, step: int, pass_at_1: float, tasks: int, stopped_s: float = 0.0) -> None:
        """An eval of `step` over `tasks` held-out tasks ended; `stopped_s`: how long it stopped
        training (0: it ran beside training)."""
        if step in self.evals:
            return
        self.stopped_s += stopped_s
        now = self.now()
        self.evals[step] = {
            "step": step,
            "pass_at_1": pass_at_1,
            "tasks": tasks,
            "t_s": round(now, 2),
        }
        print(f"{self.side}: step {step} held-out pass@1 {pass_at_1:.3f} at {now:.1f}s", flush=True)
        base = self.evals.get(0, {}).get("pass_at_1")
        if self.target_s is None and any(
            reached(e["pass_at_1"], base, e["tasks"], self.args) for e in self.evals.values()
        ):
            self.target_s, self.target_net_s = now, self.net()

    def report(self) -> dict[str, Any]:
        wall = self.now()
        step_at = [self.steps[k] for k in sorted(self.steps)]
        gaps = [b - a for a, b in zip([0.0, *step_at], step_at, strict=False)]
        return {
            "setup_s": None if self.setup_s is None else round(self.setup_s, 2),
            "wall_s": round(wall, 2),
            "time_to_target_s": None if self.target_s is None else round(self.target_s, 2),
            "time_to_target_net_s": None
            if self.target_net_s is None
            else round(self.target_net_s, 2),
            "evals_stopped_training_s": round(self.stopped_s, 2),
            "steps": len(step_at),
            "s_per_step": round(wall / max(1, len(step_at)), 2),
            "median_step_gap_s": round(median_of(gaps), 2),
            "step_t_s": [round(t, 2) for t in step_at],
            "evals": [self.evals[k] for k in sorted(self.evals)],
            "load_average_at_end": machine()["load_average"],
        }


# -- Tempered --------------------------------------------------------------------------------


async def tempered_side(settings: Settings, run: TrainingRunInput, timeline: Timeline) -> None:
    async with production_workers(settings, list(Queue)) as (client, _):
        timeline.start()  # stack up, workers built (torch and transformers imported)
        handle = await start_run(client, run)
        result = asyncio.ensure_future(handle.result())
        result.add_done_callback(lambda _: timeline.finish())  # when it arrives, not when seen
        async for progress in watch(handle, result, POLL_S):
            if progress is None:
                continue  # not queryable before its first workflow task
            for step in progress.learner:
                timeline.stepped(step.step)
            for evaluation in progress.evals:
                timeline.evaluated(
                    evaluation.policy_version, evaluation.pass_at_1, evaluation.tasks
                )
            if timeline.target_s is not None:
                break
        timeline.finish()  # the target was reached (else the result arrived: stopped then)
        if timeline.target_s is None:
            for evaluation in (await result).evals:
                timeline.evaluated(
                    evaluation.policy_version, evaluation.pass_at_1, evaluation.tasks
                )
        else:
            result.cancel()
            await handle.terminate("bench: target reached")


# -- both ------------------------------------------------------------------------------------


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side in this process; returns its report (its setup counted from here)."""
    timeline = Timeline(side, args)
    run = experiment(args)
    base_dir = base_model_dir(run.base_model)
    run = run.model_copy(update={"base_model": str(base_dir)})
    with tempfile.TemporaryDirectory(prefix=f"tempered-vs-trl-{side}-") as tmp:
        if side == "trl":
            trl_side(
                Settings(home=Path(tmp)), run, base_dir, args.seed, timeline, Path(tmp) / "trl"
            )
        else:
            inference = InferenceSettings(base_model=str(base_dir))
            with bench_stack(Path(tmp), inference=inference) as settings:
                asyncio.run(tempered_side(settings, run, timeline))
    return timeline.report()


def compare(
    args: argparse.Namespace, sides: dict[str, dict[str, Any]], order: list[str]
) -> dict[str, Any]:
    run = experiment(args)
    tempered, trl = sides["tempered"], sides["trl"]

    def ratio(key: str) -> float | None:
        return round(tempered[key] / trl[key], 3) if tempered[key] and trl[key] else None

    report: dict[str, Any] = {
        "preset": args.preset,
        "steps": run.steps,
        "group_size": run.group_size,
        "prompts_per_step": run.grpo.groups_per_step,
        "learning_rate": run.grpo.learning_rate,
        "max_new_tokens": run.sampling.max_new_tokens,
        "tempered_max_turns": run.max_turns,
        "eval_every": run.eval_every,
        "target": args.target,
        "gain": None if args.target is not None else args.gain,
        "goal_ratio": 0.8,
        "order": order,
        "heldout_tasks": (tempered["evals"] or [{}])[0].get("tasks"),
        "s_per_step_ratio": ratio("s_per_step"),
        "step_gap_ratio": ratio("median_step_gap_s"),
        "tempered": tempered,
        "trl": trl,
        "machine": machine(),
    }
    if tempered["time_to_target_s"] and trl["time_to_target_s"]:
        report["measured"], report["ratio"] = "time_to_target_s", ratio("time_to_target_s")
        report["ratio_net"] = ratio("time_to_target_net_s")
    elif args.target == 0:
        report["measured"] = "s_per_step (target 0: no time to target; evals included)"
        report["ratio"] = report["s_per_step_ratio"]
    else:
        report["measured"], report["ratio"] = "target not reached by both sides", None
    return report


def print_sides(report: dict[str, Any]) -> None:
    for side in ("tempered", "trl"):
        s = report[side]
        evals = " ".join(f"{e['step']}:{e['pass_at_1']:.2f}" for e in s["evals"])
        print(
            f"{side:8s}: setup {s['setup_s']}s, then {s['steps']} steps in {s['wall_s']:.1f}s "
            f"({s['s_per_step']:.1f} s/step, "
            f"median gap {s['median_step_gap_s']:.1f}s), time to target {s['time_to_target_s']}, "
            f"held-out pass@1 by step {evals}"
        )
    print(
        f"vs_trl: measured {report['measured']}: Tempered/TRL = {report['ratio']} (goal <= 0.8), "
        f"{report.get('ratio_net')} net of TRL's evaluations; "
        f"median step gap ratio {report['step_gap_ratio']}; sides in the order "
        f"{', '.join(report['order'])}; load {report['machine']['load_average']}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="configs/presets name (tiny | smollm2)")
    parser.add_argument("--target", type=float, help="held-out pass@1 to reach (0: s/step only)")
    parser.add_argument("--gain", type=float, default=0.1, help="else: pass@1 gain over step 0")
    parser.add_argument("--steps", type=int, help="most optimizer steps (default: the preset's)")
    parser.add_argument("--group-size", type=int, help="G (default: the preset's)")
    parser.add_argument(
        "--prompts-per-step", type=int, help="groups per step (default: the preset's)"
    )
    parser.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the preset's")
    parser.add_argument(
        "--max-turns", type=int, default=1, help="Tempered's turns per task (TRL: 1)"
    )
    parser.add_argument(
        "--train-last-layers", type=int, help="both sides (0: all; default: the preset's)"
    )
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full", action="store_true", help=f"the full comparison: {' '.join(FULL)} unless given"
    )
    parser.add_argument("--side", choices=["both", "tempered", "trl"], default="both")
    parser.add_argument(
        "--first", choices=["tempered", "trl"], help="which side runs first (default: by --seed)"
    )
    add_busy_flag(parser)
    parser.add_argument("--out", type=Path, help="(internal) where a single side writes its JSON")
    args = parser.parse_args()
    if args.full:  # FULL first, so what the command line gives wins (argparse keeps the last)
        args = parser.parse_args([*FULL, *sys.argv[1:]])
    if args.side != "tempered" and importlib.util.find_spec("trl") is None:
        print("vs_trl: skipped, TRL is not installed (pip install -e '.[bench]')", flush=True)
        return
    if args.out is None:  # not a side this bench started: that one's parent checks around it
        require_idle(args.allow_busy)
    if args.side != "both":
        report = run_side(args.side, args)
        if args.out:
            args.out.write_text(json.dumps(report))
        else:
            print(json.dumps(report, indent=2))
        return
    sides = {}
    order = side_order(args.seed, args.first)
    with tempfile.TemporaryDirectory() as tmp:
        for side in order:
            out = Path(tmp) / f"{side}.json"
            print(f"== vs_trl: {side} side", flush=True)
            command = [sys.executable, __file__, *sys.argv[1:], "--side", side, "--out", str(out)]
            with idle_side(side):
                subprocess.run(command, check=True)
            sides[side] = json.loads(out.read_text())
    report = compare(args, sides, order)
    print_sides(report)
    merge_results("vs_trl", report)


if __name__ == "__main__":
    main()
