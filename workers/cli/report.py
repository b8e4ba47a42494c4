"""The report of a training run: `report.json` (per-step metrics; held-out pass@1 at turn 1 and
the solve rate within the run's `eval_turns` turns, before and after training, and the
`headline`: the one of the two the run is judged by, and its gain) and `reward_curve.png` under
`<home>/reports/<run>/`, written by `tempered train` when the run ends.

A step is numbered by the policy version it published (step N publishes version N), so the
reward curve and the evaluations share one axis. The learner keeps only its last `HISTORY_TAIL`
step results (`workflows/learner.py`): `steps` lists those, `steps_taken` says how many the run
took and `steps_listed` whether the list holds them all (every step's ack is in the store). A
step's `reward_mean` is the mean reward of the groups sent to it, the ones it trained or not (a
flat group that gives no gradient, a stale one dropped: `trained` counts the trajectories that
reached the update); flat groups redrawn by dynamic sampling never reach the learner and are not
in it. Its `duration_s` is the whole step's, from its activity's start to its version saved.

The `headline` is the solve rate where every held-out task is graded only once its agent called
`submit` (`workspace`: pass@1 at turn 1 is 0 by construction), else pass@1 (`figure_of`).
`pass_at_1_after` and `solve_rate_after` are the last evaluation's, and null where no trained
version was evaluated (its policy version is 0: the run ended, e.g. at its time budget, before
the learner's first step): the baseline again is no "after". `stopped` says why a run ended
before its steps (`tempered stop`'s reason, or its time budget). `config` is the run's input as
started: a later segment's `resume` (the suite's tasks, counters), which `--attach` reads after a
continue-as-new, is left out. `profile` is where the wall time went (`write_profile`): its
figures are null where no worker wrote telemetry on this machine during the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.evaluation import EvalResult
from contracts.run import TrainingRunInput, TrainingRunResult
from infra.settings import Settings


def report_dir(settings: Settings, run_id: str) -> Path:
    return settings.home / "reports" / run_id


def write_report(
    settings: Settings,
    run_input: TrainingRunInput,
    result: TrainingRunResult,
    wall_s: float,
    ended: float | None = None,
) -> Path:
    """report.json (and the curve and profile) of a run that took `wall_s` and `ended` (epoch
    seconds; None: now) into its report directory."""
    out = report_dir(settings, run_input.run_id)
    out.mkdir(parents=True, exist_ok=True)
    evals = sorted(result.evals, key=lambda e: e.policy_version)
    before, after = before_after(evals)
    report = {
        "run_id": result.run_id,
        "config": run_input.model_dump(mode="json", exclude={"resume"}),
        "wall_time_s": round(wall_s, 1),
        "steps_taken": result.steps,
        "steps_listed": steps_listed(result),
        "steps": [
            {
                "step": h.policy.version,
                "policy_version": h.policy.version,
                "loss": h.loss,
                "reward_mean": h.reward_mean,
                "trained": h.trained,
                "dropped_stale": h.dropped_stale,
                "duration_s": h.duration_s,
            }
            for h in result.history
        ],
        "evals": [e.model_dump() for e in evals],
        "eval_turns": run_input.eval_turns,
        "pass_at_1_before": before.pass_at_1 if before else None,
        "pass_at_1_after": after.pass_at_1 if after else None,
        "solve_rate_before": before.solve_rate if before else None,
        "solve_rate_after": after.solve_rate if after else None,
        "headline": headline(evals),
        "tasks_started": result.tasks_started,
        "tasks_done": result.tasks_done,
        "redrawn": result.redrawn,
        "stopped": result.stopped,
    }
    report["profile"] = write_profile(settings, result.run_id, wall_s, out, ended)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(out / "reward_curve.png", report)
    return out


def before_after(evals: list[EvalResult]) -> tuple[EvalResult | None, EvalResult | None]:
    """The first evaluation and the last, the last only where it measured a trained version
    (above 0)."""
    if not evals:
        return None, None
    first, last = min(evals, key=_version), max(evals, key=_version)
    return first, last if last.policy_version > 0 else None


def _version(evaluation: EvalResult) -> int:
    return evaluation.policy_version


def figure_of(evals: list[EvalResult]) -> str:
    """The figure a run's gain is given in: `solve_rate` where its tasks are graded only at
    `submit` (`EvalResult.by_solve_rate`: pass@1 at turn 1 is 0 there) and each has one, else
    `pass_at_1`."""
    by_solve_rate = any(e.by_solve_rate for e in evals)
    return (
        "solve_rate"
        if by_solve_rate and all(e.solve_rate is not None for e in evals)
        else "pass_at_1"
    )


def figure_label(figure: str, turns: int) -> str:
    """`held-out solved within 4 turns`, `held-out pass@1 at turn 1`, `held-out pass@1`."""
    if figure == "solve_rate":
        return f"held-out solved within {turns} turns"
    return "held-out pass@1" + (" at turn 1" if turns > 1 else "")


def gain_points(before: EvalResult, after: EvalResult, figure: str) -> float | None:
    """`after`'s `figure` over `before`'s, in points (100 × the share of tasks); None where
    either lacks it (a solve rate not run)."""
    old, new = getattr(before, figure), getattr(after, figure)
    return None if old is None or new is None else round(100 * (new - old), 2)


def headline(evals: list[EvalResult]) -> dict[str, Any]:
    """report.json's `headline`: the figure the run is judged by (`figure_of`), its label, the
    first and the last (trained) evaluation's and the gain in points (null without an after)."""
    before, after = before_after(evals)
    figure = figure_of(evals)
    turns = max((e.turns for e in evals), default=1)
    return {
        "figure": figure,
        "label": figure_label(figure, turns),
        "before": getattr(before, figure) if before else None,
        "after": getattr(after, figure) if after else None,
        "gain_points": gain_points(before, after, figure) if before and after else None,
    }


def steps_listed(result: TrainingRunResult) -> str:
    """`all`, or `the last N of M` where the learner's history holds only its tail."""
    listed = len(result.history)
    return "all" if listed >= result.steps else f"the last {listed} of {result.steps}"


def _plot(path: Path, report: dict[str, Any]) -> None:
    # matplotlib costs ~0.35 s to import: only a finished run pays it, not every `tempered` call
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [s["step"] for s in report["steps"]]
    ax.plot(
        steps,
        [s["reward_mean"] for s in report["steps"]],
        marker="o",
        label="mean reward of the groups sent to each step",
    )
    if report["evals"]:
        versions = [e["policy_version"] for e in report["evals"]]
        by_solve_rate = report["headline"]["figure"] == "solve_rate"
        if not by_solve_rate:  # graded only at submit, pass@1 is 0 by construction
            ax.plot(
                versions,
                [e["pass_at_1"] for e in report["evals"]],
                marker="s",
                label="held-out pass@1 (turn 1)",
            )
        if report["eval_turns"] > 1 or by_solve_rate:
            ax.plot(
                versions,
                [e["solve_rate"] or 0.0 for e in report["evals"]],
                marker="^",
                label=f"held-out solved within {report['eval_turns']} turns",
            )
    ax.set_xlabel("learner step (= policy version)")
    ax.set_title(f"Tempered run {report['run_id']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_profile(
    settings: Settings, run_id: str, wall_s: float, out: Path, ended: float | None = None
) -> dict[str, Any]:
    """Where the run's wall time went (`infra.telemetry_profile`, from the workers' span files,
    over the `wall_s` before `ended`, or before now): printed as a table, drawn as a stacked bar
    in `profile.png`, returned for report.json. Without any worker telemetry here (an OTLP
    collector has it, or the workers run on another machine) it says so: null figures, no bar."""
    import time

    from infra.telemetry_profile import DOWN_AFTER_S, run_profile

    ended = time.time() if ended is None else ended
    telemetry = settings.home / "telemetry"
    profile = run_profile(telemetry, run_id, ended - wall_s, ended)
    if profile.segments is None or profile.busy is None:
        print(
            f"where the {profile.wall_s:.0f} s went: no worker telemetry here (no worker wrote"
            f" to {telemetry} during the run: they export to an OTLP collector, or run on"
            " another machine)"
        )
        return profile.model_dump()
    wall = profile.wall_s or 1.0
    print(
        f"where the {profile.wall_s:.0f} s went ({profile.spans} spans; each instant to the first"
        " category active, training before evaluation):"
    )
    for name, seconds in profile.segments.items():
        busy = profile.busy.get(name)
        own = f"   (active {busy:7.1f} s in all)" if busy is not None else ""
        print(f"  {name:<11} {seconds:7.1f} s {100 * seconds / wall:5.1f}%{own}")
    print(f"  inference engine idle {profile.inference_idle_s:.1f} s of {profile.wall_s:.0f} s")
    print(
        f"  (workers_down: {DOWN_AFTER_S:.0f} s or more in which no worker wrote anything, e.g."
        " a reboot; temporal: the rest no span covers, a lower bound of Temporal's cost; see"
        " bench/)"
    )
    import matplotlib  # ~0.35 s to import: only a finished run pays it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.8))
    left = 0.0
    for name, seconds in profile.segments.items():
        ax.barh([0], [seconds], left=left, label=f"{name} {100 * seconds / wall:.0f}%")
        left += seconds
    ax.set_yticks([])
    ax.set_xlabel("wall time (s)")
    ax.set_title(f"Where run {run_id}'s wall time went")
    ax.legend(ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(out / "profile.png", dpi=100)
    plt.close(fig)
    return profile.model_dump()
