"""`tempered train`: one training run end to end, with live progress and a report.

    tempered train                              # SmolLM2-135M-Instruct, starter suite (make train)
    tempered train --preset tiny --steps 3      # about a minute; what the tests use
    tempered train --preset tiny --dry-run      # print the plan as JSON; start nothing

`train` brings the embedded stack and one background worker per queue up if they are not
running (an external Temporal, `temporal.embedded = false`, is used as it is), starts a `TrainingRunWorkflow` (`workers.training`), shows its progress, and writes
`report.json` and `reward_curve.png` under `<home>/reports/<run>/`. Presets are
`infra.presets`; `tempered eval` measures a policy on its own (`workers/cli/evaluate.py`).

The run is a durable workflow and does not depend on this command: Ctrl-C detaches (the run
goes on in the background workers), and

    tempered train --attach RUN                 # follows it again and writes its report
    tempered stop RUN [--reason TEXT]           # no new tasks; it ends as a finished run does
    tempered stop RUN --cancel                  # cancel it now, learner included; no report

A new run's id must be new. One with objects under `runs/<id>/` (a finished or failed run, or
one in progress, which `--attach` follows) or one `tempered runs rm` removed (`removed/<id>.json`)
is refused once the store answers, before the workers and the run start (`--dry-run` checks it
where S3 answers, and says where not); one whose workflow runs, when its start is refused. A home
that is no writable directory is refused before anything (`infra.stack.check_home`).

Exit status: 0 done, 1 the run failed, 2 a bad preset, override, base model, suite, home, run
id or run (nothing started), 130 detached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError

from contracts.names import Queue, Workflow
from contracts.run import TrainingRunInput, TrainingRunResult
from infra import keys, stack
from infra.policy import SMOLLM2, TINY, check_base_model
from infra.presets import DEFAULT, load_preset, preset_names
from infra.run_ids import removal_record, run_stored
from infra.settings import Settings
from infra.storage import ObjectStore, StorageError
from infra.tasks import BUILTIN_SUITES, absolute_suite, load_quarantine, load_suite
from workers.background import ensure_workers
from workers.cli.errors import number, run_id
from workers.cli.progress import follow, summary
from workers.cli.report import report_dir, write_report
from workers.runtime import connect
from workers.training import RunHandle, attach, start_run, stop_run, workflow_id

EVAL_ONLY_SUITES = ("humaneval",)
"""Built-in suites without training tasks (all 164 of HumanEval's are held out): `tempered eval`
and `tasks validate` take them, `train` refuses them."""
TRAIN_SUITE_HELP = " | ".join(
    (*(name for name in BUILTIN_SUITES if name not in EVAL_ONLY_SUITES), "harbor:DIR", "FILE.jsonl")
)
"""What `train --suite` takes, for its help."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = commands.add_parser("train", help="run a training run end to end")
    train.add_argument(
        "--preset", default=DEFAULT, help=f"{' | '.join(preset_names())} or a TOML path"
    )
    train.add_argument("--steps", type=int, help="learner steps (overrides the preset)")
    train.add_argument("--base-model", help="tiny | smollm2 | HF dir | s3://prefix")
    train.add_argument("--suite", help=f"{TRAIN_SUITE_HELP} (default: the preset's)")
    train.add_argument("--run-id", help="default: run-<timestamp>")
    train.add_argument("--time-budget", type=number, help="stop rolling out after N seconds")
    train.add_argument(
        "--seed", type=int, help="order of the training tasks (default: the preset's)"
    )
    train.add_argument(
        "--keep-versions",
        type=int,
        metavar="N",
        help="delete policy versions as the run goes but v0, the newest N and those still read",
    )
    train.add_argument("--no-workers", action="store_true", help="do not start background workers")
    train.add_argument(
        "--dry-run", action="store_true", help="print the plan as JSON and start nothing"
    )
    train.add_argument(
        "--attach", metavar="RUN", type=run_id, help="follow a running run, write its report"
    )
    train.set_defaults(func=train_cmd)
    stop = commands.add_parser("stop", help="stop a running training run")
    stop.add_argument("run", type=run_id)
    stop.add_argument("--reason", default="stopped from the command line", help="recorded")
    stop.add_argument(
        "--cancel", action="store_true", help="cancel now, learner included (no final eval)"
    )
    stop.set_defaults(func=stop_cmd)


class RunIdTaken(ValueError):
    """A new run's `--run-id` that names a run already, and why."""

    def __init__(self, run: str, why: str):
        super().__init__(f"run id {run!r} is taken ({why}); choose another --run-id")


def train_cmd(args: argparse.Namespace, settings: Settings) -> int:
    if args.attach is not None:
        return _attach_cmd(args, settings)
    unchecked = None
    try:
        run_input = load_preset(
            args.preset,
            steps=args.steps,
            base_model=absolute(args.base_model),
            suite=absolute(args.suite),
            run_id=args.run_id,
            time_budget_s=args.time_budget,
            seed=args.seed,
            keep_versions=args.keep_versions,
        )
        check_inputs(settings, run_input, workers_here=not args.no_workers)
        if args.dry_run:
            unchecked = _check_run_id_if_up(settings, run_input.run_id)
    except ValueError as exc:  # unknown preset, bad TOML, an override out of bounds, bad model…
        print(f"tempered train: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        if unchecked is not None:
            print(
                f"tempered train: run id {run_input.run_id!r} not checked ({unchecked}); a run "
                "checks it once the stack is up",
                file=sys.stderr,
            )
        print(json.dumps(plan(settings, run_input, workers=not args.no_workers), indent=2))
        return 0
    try:
        _bring_up(settings, workers=not args.no_workers, new_run=run_input.run_id)
        result, wall_s = asyncio.run(_train(settings, run_input))
    except RunIdTaken as exc:
        print(f"tempered train: {exc}", file=sys.stderr)
        return 2
    return _report(settings, run_input, result, wall_s)


def absolute(spec: str | None) -> str | None:
    """A model directory, suite file or `harbor:DIR` named relative to here, made absolute: the
    workers that read it run in the stack's home (a relative path failed there, after the dry
    run had passed). Presets, built-in suites, s3:// prefixes and what is not here stay as
    they are."""
    if spec is None or spec in (TINY, SMOLLM2):
        return spec
    made = absolute_suite(spec)  # a model directory is spelled as a suite file is
    return made if Path(made.removeprefix("harbor:")).exists() else spec


def check_inputs(settings: Settings, run_input: TrainingRunInput, workers_here: bool) -> None:
    """ValueError for a home, base model or suite the run could not use, before anything starts.
    The workers read the model and suite: with `--no-workers` they may run elsewhere, so a path
    that is not here is theirs to read (as `absolute` leaves it), and only what this machine
    can see is checked; names (presets, built-in suites) always are."""
    stack.check_home(settings)

    def theirs(spec: str) -> bool:  # a path (not a name) this machine does not have
        path = spec.removeprefix("harbor:")
        return ("/" in path or path.endswith(".jsonl")) and not Path(path).expanduser().exists()

    if workers_here or not theirs(run_input.base_model):
        check_base_model(run_input.base_model)
    if workers_here or not theirs(run_input.suite):
        check_suite(settings, run_input.suite)


def check_run_id(store: ObjectStore, run: str) -> None:
    """RunIdTaken if the store knows run `run`: `tempered runs rm` removed it (prepare_run
    refuses the id: workers may still cache its policies under it), or objects of it are stored
    (a rerun of the same command passed prepare_run's create-only write of an identical
    run.json, then met the old run's trajectories and acks). Both were found only after the
    stack, five workers and the workflow had started; a run in progress is `--attach`ed to."""
    removed = removal_record(store, run)
    if removed is not None:
        where = f"s3://{store.bucket}/{removed.key}"
        raise RunIdTaken(run, f"`tempered runs rm` removed a run with it: {where}")
    if run_stored(store, run):
        prefix = keys.run_prefix(run)
        follow = f"`tempered train --attach {run}` follows it while it runs"
        raise RunIdTaken(
            run, f"a run with it is stored under s3://{store.bucket}/{prefix}; {follow}"
        )


def _check_run_id_if_up(settings: Settings, run: str) -> str | None:
    """`check_run_id` for `--dry-run`, which starts no stack: where S3 answers at the first try;
    else why not (None: checked)."""
    try:
        store = ObjectStore(settings.s3.model_copy(update={"max_attempts": 1}))
        store.check()
        check_run_id(store, run)
    except StorageError as exc:
        return str(exc)
    return None


def check_suite(settings: Settings, suite: str) -> None:
    """ValueError unless `suite` loads and leaves training tasks once quarantined ones are
    skipped, as the run's first activity needs (activities/tasks.py): a missing or malformed
    suite passed `--dry-run`, and a real run failed only after the stack and five workers had
    started and the workflow had begun."""
    skipped = load_quarantine(settings, suite)
    train = [task for task in load_suite(suite, split="train") if task.id not in skipped]
    if not train:
        left = f" left ({len(skipped)} quarantined by `tempered tasks validate`)" if skipped else ""
        raise ValueError(f"suite {suite!r} has no training tasks{left}")


RUN_OPTIONS = (
    "steps",
    "base_model",
    "suite",
    "run_id",
    "time_budget",
    "seed",
    "keep_versions",
    "dry_run",
)
"""What shapes a new run: `--attach` follows a run as it was started and takes none of them."""


def _attach_cmd(args: argparse.Namespace, settings: Settings) -> int:
    given = [f"--{name.replace('_', '-')}" for name in RUN_OPTIONS if getattr(args, name)]
    given += ["--preset"] if args.preset != DEFAULT else []
    if given:
        problem = f"--attach takes no run options (got {', '.join(given)})"
        print(f"tempered train: {problem}", file=sys.stderr)
        return 2
    _bring_up(settings, workers=not args.no_workers)
    try:
        run_input, result, wall_s = asyncio.run(_attach(settings, args.attach))
    except ValueError as exc:  # no such run, or it has ended
        print(f"tempered train: {exc}", file=sys.stderr)
        return 2
    return _report(settings, run_input, result, wall_s)


def stop_cmd(args: argparse.Namespace, settings: Settings) -> int:
    async def stop() -> str:
        client = await connect(settings)
        return await stop_run(client, args.run, reason=args.reason, cancel=args.cancel)

    try:
        print(asyncio.run(stop()))
    except ValueError as exc:
        print(f"tempered stop: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(
    settings: Settings, run_input: TrainingRunInput, result: TrainingRunResult, wall_s: float
) -> int:
    """The closing summary, the report and where to look, all with the run's own wall time (an
    `--attach`'s summary once counted from when following began, its report from the start)."""
    Console().print(summary(result, wall_s))
    out = write_report(settings, run_input, result, wall_s)
    print(f"report: {out / 'report.json'}  curve: {out / 'reward_curve.png'}")
    ui = stack.temporal_ui(settings)
    if ui is not None:  # an external Temporal's UI is not ours to know
        runs = f"workflows?query=TemperedRunId%3D%22{run_input.run_id}%22"
        print(f"Temporal UI: {ui}/namespaces/{settings.temporal.namespace}/{runs}")
    return 0


def plan(settings: Settings, run_input: TrainingRunInput, workers: bool) -> dict[str, Any]:
    """What `train` would do: the stack it brings up (unless running), the background workers
    it starts (unless running), the workflow it starts, where the report goes."""
    s3 = stack.s3_endpoint(settings)
    external = "" if settings.temporal.embedded else " (external)"
    return {
        "stack": {
            "temporal": f"{stack.temporal_endpoint(settings)}{external}",
            "temporal_ui": stack.temporal_ui(settings),
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


def _bring_up(settings: Settings, workers: bool, new_run: str | None = None) -> None:
    """The stack and the background workers, where not running (a rebooted machine's stack
    restarts from its files, and the runs it held go on); an external Temporal is only checked
    to answer (`stack.up`). A `new_run`'s id is checked once the store answers, before the
    workers start."""
    for line in stack.up(settings):
        print(line)
    if new_run is not None:
        try:
            check_run_id(ObjectStore.from_settings(settings), new_run)
        except StorageError as exc:
            if workers:  # their store is this one: a reused id must not pass unchecked
                raise
            # `--no-workers`: the workers' store may be theirs alone (an in-cluster address)
            print(f"tempered train: run id {new_run!r} not checked here ({exc})", file=sys.stderr)
    for line in ensure_workers(settings) if workers else []:
        print(line)


async def _train(
    settings: Settings, run_input: TrainingRunInput
) -> tuple[TrainingRunResult, float]:
    """Start run `run_input` and follow it to its end: its result and wall time."""
    started = time.time()
    client = await connect(settings)
    try:
        handle = await start_run(client, run_input)
    except WorkflowAlreadyStartedError:  # started, and nothing stored yet: `check_run_id` passed
        run = run_input.run_id
        raise RunIdTaken(
            run, f"it is running: `tempered train --attach {run}` follows it"
        ) from None
    print(f"started {Workflow.TRAINING_RUN.value} {handle.id}")
    result = await _follow(client, handle, run_input, settings, started)
    return result, time.time() - started


async def _attach(
    settings: Settings, run_id: str
) -> tuple[TrainingRunInput, TrainingRunResult, float]:
    """Follow running run `run_id` to its end: its input, result and wall time so far."""
    client = await connect(settings)
    handle, run_input, since = await attach(client, run_id)
    print(f"attached to {Workflow.TRAINING_RUN.value} {handle.id} (started {since:%H:%M:%S} UTC)")
    result = await _follow(client, handle, run_input, settings, since.timestamp())
    return run_input, result, time.time() - since.timestamp()


async def _follow(
    client: Client,
    handle: RunHandle,
    run_input: TrainingRunInput,
    settings: Settings,
    started: float,
) -> TrainingRunResult:
    try:
        return await follow(client, handle, run_input, settings, started)
    except asyncio.CancelledError:  # Ctrl-C: the run is durable and goes on without us
        run = run_input.run_id
        print(
            f"detached; run {run} goes on in the background workers.\n"
            f"  follow it again: tempered train --attach {run}\n"
            f"  stop it:         tempered stop {run} [--cancel]",
            file=sys.stderr,
        )
        raise
