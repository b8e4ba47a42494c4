"""`tempered train`: one training run end to end, with live progress and a report.

    tempered train                              # SmolLM2-135M-Instruct, starter suite (make train)
    tempered train --preset tiny --steps 3      # about a minute; what the tests use
    tempered train --preset tiny --dry-run      # print the plan as JSON; start nothing

`train` brings the embedded stack and one background worker per queue up if they are not
running, starts a `TrainingRunWorkflow` (`workers.training`), shows its progress, and writes
`report.json` and `reward_curve.png` under `<home>/reports/<run>/`. Presets are
`infra.presets`; `tempered eval` measures a policy on its own (`workers/cli/evaluate.py`).
Exit status: 0 done, 1 the run failed, 2 a bad preset or override (nothing started).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from contracts.learner import TrainingRunInput, TrainingRunResult
from contracts.names import Queue, Workflow
from infra import stack
from infra.presets import DEFAULT, load_preset, preset_names
from infra.settings import Settings
from workers.background import ensure_workers
from workers.cli.progress import follow
from workers.cli.report import report_dir, write_report
from workers.runtime import connect
from workers.training import start_run, workflow_id


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = commands.add_parser("train", help="run a training run end to end")
    train.add_argument(
        "--preset", default=DEFAULT, help=f"{' | '.join(preset_names())} or a TOML path"
    )
    train.add_argument("--steps", type=int, help="learner steps (overrides the preset)")
    train.add_argument("--base-model", help="tiny | smollm2 | HF dir | s3://prefix")
    train.add_argument("--suite", help="starter | humaneval | tasks.jsonl")
    train.add_argument("--run-id", help="default: run-<timestamp>")
    train.add_argument("--time-budget", type=float, help="stop rolling out after N seconds")
    train.add_argument(
        "--seed", type=int, help="order of the training tasks (default: the preset's)"
    )
    train.add_argument("--no-workers", action="store_true", help="do not start background workers")
    train.add_argument(
        "--dry-run", action="store_true", help="print the plan as JSON and start nothing"
    )
    train.set_defaults(func=train_cmd)


def train_cmd(args: argparse.Namespace, settings: Settings) -> int:
    try:
        run_input = load_preset(
            args.preset,
            steps=args.steps,
            base_model=args.base_model,
            suite=args.suite,
            run_id=args.run_id,
            time_budget_s=args.time_budget,
            seed=args.seed,
        )
    except ValueError as exc:  # unknown preset, bad TOML, an override out of bounds
        print(f"tempered train: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(plan(settings, run_input, workers=not args.no_workers), indent=2))
        return 0
    for line in stack.up(settings):
        print(line)
    if not args.no_workers:
        for line in ensure_workers(settings):
            print(line)
    started = time.monotonic()
    result = asyncio.run(_train(settings, run_input))
    out = write_report(settings, run_input, result, time.monotonic() - started)
    ui = f"http://127.0.0.1:{settings.temporal.ui_port}/namespaces/{settings.temporal.namespace}"
    print(f"report: {out / 'report.json'}  curve: {out / 'reward_curve.png'}")
    print(f"Temporal UI: {ui}/workflows?query=TemperedRunId%3D%22{run_input.run_id}%22")
    return 0


def plan(settings: Settings, run_input: TrainingRunInput, workers: bool) -> dict[str, Any]:
    """What `train` would do: the stack it brings up (unless running), the background workers
    it starts (unless running), the workflow it starts, where the report goes."""
    s3 = stack.s3_endpoint(settings)
    return {
        "stack": {
            "temporal": str(stack.temporal_endpoint(settings)),
            "temporal_ui": f"http://127.0.0.1:{settings.temporal.ui_port}",
            "s3": f"http://{s3} (embedded)"
            if s3
            else f"{settings.s3.endpoint or 'AWS'} (external)",
            "bucket": settings.s3.bucket,
        },
        "workers": [queue.value for queue in Queue] if workers else [],
        "workflow": {
            "type": Workflow.TRAINING_RUN.value,
            "id": workflow_id(run_input.run_id),
            "task_queue": Queue.AGENT_TASKS.value,
            "namespace": settings.temporal.namespace,
        },
        "report": str(report_dir(settings, run_input.run_id)),
        "input": run_input.model_dump(mode="json"),
    }


async def _train(settings: Settings, run_input: TrainingRunInput) -> TrainingRunResult:
    client = await connect(settings)
    handle = await start_run(client, run_input)
    print(f"started {Workflow.TRAINING_RUN.value} {handle.id}")
    return await follow(client, handle, run_input, settings)
