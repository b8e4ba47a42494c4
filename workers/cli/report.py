"""The report of a training run: `report.json` (per-step metrics, pass@1) and `reward_curve.png`
under `<home>/reports/<run>/`, written by `tempered train` when the run ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.learner import TrainingRunInput, TrainingRunResult
from infra.settings import Settings


def report_dir(settings: Settings, run_id: str) -> Path:
    return settings.home / "reports" / run_id


def write_report(
    settings: Settings, run_input: TrainingRunInput, result: TrainingRunResult, wall_s: float
) -> Path:
    out = report_dir(settings, run_input.run_id)
    out.mkdir(parents=True, exist_ok=True)
    evals = sorted(result.evals, key=lambda e: e.policy_version)
    report = {
        "run_id": result.run_id,
        "config": run_input.model_dump(mode="json"),
        "wall_time_s": round(wall_s, 1),
        "steps": [
            {
                "step": i + 1,
                "policy_version": h.policy.version,
                "loss": h.loss,
                "reward_mean": h.reward_mean,
                "trained": h.trained,
                "dropped_stale": h.dropped_stale,
                "duration_s": h.duration_s,
            }
            for i, h in enumerate(result.history)
        ],
        "evals": [e.model_dump() for e in evals],
        "pass_at_1_before": evals[0].pass_at_1 if evals else None,
        "pass_at_1_after": evals[-1].pass_at_1 if evals else None,
        "tasks_started": result.tasks_started,
        "tasks_done": result.tasks_done,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(out / "reward_curve.png", report)
    return out


def _plot(path: Path, report: dict[str, Any]) -> None:
    # matplotlib costs ~0.35 s to import: only a finished run pays it, not every `tempered` call
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [s["step"] for s in report["steps"]]
    ax.plot(
        steps, [s["reward_mean"] for s in report["steps"]], marker="o", label="train reward (mean)"
    )
    if report["evals"]:
        ax.plot(
            [e["policy_version"] for e in report["evals"]],
            [e["pass_at_1"] for e in report["evals"]],
            marker="s",
            label="held-out pass@1",
        )
    ax.set_xlabel("learner step (= policy version)")
    ax.set_title(f"Tempered run {report['run_id']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
