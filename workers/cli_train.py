"""`tempered train` and `tempered eval`.

    tempered train                          # SmolLM2-135M-Instruct, starter suite (make train)
    tempered train --preset tiny --steps 3  # about a minute; what the tests use
    tempered eval --run RUN --policy 3 --suite starter

`train` brings the embedded stack and one worker per queue up if they are not running, starts a
`TrainingRunWorkflow`, shows its progress, and writes `report.json` and `reward_curve.png`
under `<home>/reports/<run>/`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

from contracts.learner import TrainingRunInput, TrainingRunResult
from contracts.names import Queue, Workflow
from infra.settings import REPO_ROOT, Settings

PRESETS_DIR = REPO_ROOT / "configs" / "presets"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    train = sub.add_parser("train", help="run a training run end to end")
    train.add_argument("--preset", default="smollm2", help="preset name in configs/presets or a TOML path")
    train.add_argument("--steps", type=int, help="learner steps (overrides the preset)")
    train.add_argument("--base-model", help="tiny | smollm2 | HF dir | s3://prefix")
    train.add_argument("--suite", help="starter | humaneval | tasks.jsonl")
    train.add_argument("--run-id", help="default: run-<timestamp>")
    train.add_argument("--time-budget", type=float, help="stop rolling out after N seconds")
    train.add_argument("--no-workers", action="store_true", help="do not start background workers")
    train.set_defaults(func=train_cmd)


def load_preset(name: str, **overrides: Any) -> TrainingRunInput:
    """The preset TOML (by name or path) as a TrainingRunInput, with CLI overrides applied."""
    path = Path(name) if name.endswith(".toml") else PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
        raise ValueError(f"unknown preset {name!r} (known: {known}; or give a .toml path)")
    values = tomllib.loads(path.read_text())
    values.update({k: v for k, v in overrides.items() if v is not None})
    values.setdefault("run_id", datetime.now().strftime("run-%Y%m%d-%H%M%S"))
    return TrainingRunInput.model_validate(values)


def train_cmd(args: argparse.Namespace, settings: Settings) -> int:
    run_input = load_preset(
        args.preset, steps=args.steps, base_model=args.base_model, suite=args.suite,
        run_id=args.run_id, time_budget_s=args.time_budget,
    )
    from infra import stack
    from workers.background import ensure_workers

    for line in stack.up(settings):
        print(line)
    if not args.no_workers:
        for line in ensure_workers(settings):
            print(line)
    started = time.monotonic()
    result = asyncio.run(_run_training(settings, run_input))
    from workers.report import write_report

    report_dir = write_report(settings, run_input, result, time.monotonic() - started)
    ui = f"http://127.0.0.1:{settings.temporal.ui_port}/namespaces/{settings.temporal.namespace}"
    print(f"report: {report_dir / 'report.json'}  curve: {report_dir / 'reward_curve.png'}")
    print(f"Temporal UI: {ui}/workflows?query=TemperedRunId%3D%22{run_input.run_id}%22")
    return 0


async def _run_training(settings: Settings, run_input: TrainingRunInput) -> TrainingRunResult:
    from workers.progress import follow
    from workers.runtime import connect

    client = await connect(settings)
    handle = await client.start_workflow(
        Workflow.TRAINING_RUN.value,
        run_input,
        id=f"train-{run_input.run_id}",
        task_queue=Queue.AGENT_TASKS.value,
        result_type=TrainingRunResult,
    )
    print(f"started {Workflow.TRAINING_RUN.value} {handle.id}")
    return await follow(handle, run_input, settings)
