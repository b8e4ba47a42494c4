"""`tempered train`: one training run end to end, with live progress and a report.

    tempered train                              # SmolLM2-135M-Instruct, starter suite (make train)
    tempered train --preset tiny --steps 3      # about a minute; what the tests use
    tempered train --preset tiny --dry-run      # print the plan as JSON; start nothing

`train` brings the embedded stack and one background worker per queue up if they are not
running (an external Temporal, `temporal.embedded = false`, is used as it is), starts a
`TrainingRunWorkflow` (`workers.training`), shows its progress, and writes `report.json` and
`reward_curve.png` under `<home>/reports/<run>/`. Presets are `infra.presets`; `tempered eval`
measures a policy on its own (`workers/cli/evaluate.py`); what `--dry-run` prints is
`workers/cli/train_plan.py`'s.

The run is a durable workflow and does not depend on this command: Ctrl-C detaches (the run
goes on in the background workers), and

    tempered train --attach RUN                 # follows it again and writes its report
    tempered stop RUN [--reason TEXT]           # no new tasks; it ends as a finished run does
    tempered stop RUN --cancel                  # cancel it now, learner included; no report

`--attach` looks the run up once the stack answers, before it starts a worker (for an unknown
run, exit 2, it stops the services it started); a run that ended while no command followed it
gets its report then, from its workflow's result (wall time: its close minus its start), and one
that failed, was cancelled or terminated has none (exit 1). The checks of a new run's inputs and
id are `workers/cli/train_inputs.py`'s.

A new run does not start beside training runs that run already (a `train` that Ctrl-C detached
left its run running) unless `--alongside` (`workers/cli/train_running.py`). Its id must be
new. One with objects under `runs/<id>/` (a finished or failed run, or one in progress, which
`--attach` follows) or one `tempered runs rm` removed (`removed/<id>.json`) is refused once the
store answers, before the workers and the run start (`--dry-run` checks it where S3 answers,
and says where not); one whose workflow runs, when its start is refused. A home that is no
writable directory is refused before anything (`infra.stack.check_home`).

A `train` that loses Temporal while it follows the run (`tempered down`, the server's machine
gone) detaches as Ctrl-C does, saying so: the run is durable and goes on once Temporal answers
again. Its client's retries are not printed (`quiet_runtime`), only that.

Exit status: 0 done, 1 the run failed, 2 a bad preset, override, base model, suite, home, run
id or run, or other runs running (nothing started), 75 lost Temporal while following (sysexits'
EX_TEMPFAIL: the run is not known to have failed; `--attach` once Temporal answers), 130
detached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from rich.console import Console
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError, TerminatedError, WorkflowAlreadyStartedError
from temporalio.exceptions import TimeoutError as WorkflowTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue, Workflow
from contracts.run import TrainingRunInput, TrainingRunResult
from infra import stack
from infra.presets import DEFAULT, load_preset, preset_names
from infra.processes import port_open
from infra.settings import Settings
from infra.stack_services import temporal_endpoint
from infra.storage import ObjectStore, StorageError
from infra.tasks import BUILTIN_SUITES
from workers.background import background_workers, ensure_workers
from workers.cli.errors import describe, natural, number, run_id
from workers.cli.progress import follow, summary
from workers.cli.report import write_report
from workers.cli.train_inputs import (
    RunIdTaken,
    absolute,
    check_inputs,
    check_run_id,
    check_run_id_if_up,
)
from workers.cli.train_plan import plan
from workers.cli.train_running import RunsRunning, check_none_running
from workers.runtime import connect, quiet_runtime
from workers.training import NoSuchRun, RunHandle, attach, start_run, stop_run

LOST = 75
"""Exit status of a `train` that lost Temporal while following its run (`LostTemporal`)."""
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
    train.add_argument(
        "--time-budget", type=number, help="stop rolling out after N seconds (0: no budget)"
    )
    train.add_argument(
        "--seed", type=natural, help="order of the training tasks (default: the preset's)"
    )
    train.add_argument(
        "--keep-versions",
        type=int,
        metavar="N",
        help="delete policy versions as the run goes but v0, the newest N and those still read",
    )
    train.add_argument("--no-workers", action="store_true", help="do not start background workers")
    train.add_argument(
        "--alongside",
        action="store_true",
        help="start the run even while other training runs run (refused otherwise)",
    )
    train.add_argument(
        "--dry-run", action="store_true", help="print the plan as JSON and start nothing"
    )
    train.add_argument(
        "--attach",
        metavar="RUN",
        type=run_id,
        help="follow a run, write its report (also once ended)",
    )
    train.set_defaults(func=train_cmd)
    stop = commands.add_parser("stop", help="stop a running training run")
    stop.add_argument("run", type=run_id)
    stop.add_argument("--reason", default="stopped from the command line", help="recorded")
    stop.add_argument(
        "--cancel", action="store_true", help="cancel now, learner included (no final eval)"
    )
    stop.set_defaults(func=stop_cmd)


def train_cmd(args: argparse.Namespace, settings: Settings) -> int:
    if args.attach is not None:
        return _attach_cmd(args, settings)
    unchecked = None
    try:
        run_input = load_preset(
            args.preset,
            given_as=FLAGS,
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
            unchecked = check_run_id_if_up(settings, run_input.run_id)
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
        _bring_up(settings, not args.no_workers, run_input.run_id, alongside=args.alongside)
        result, wall_s = asyncio.run(_train(settings, run_input))
        ended_at = None  # now
    except (RunIdTaken, RunsRunning) as exc:
        print(f"tempered train: {exc}", file=sys.stderr)
        return 2
    except WorkflowFailureError as err:
        print(f"tempered train: run {run_input.run_id} {ended(err)}", file=sys.stderr)
        return 1
    except LostTemporal:
        return LOST
    return _report(settings, run_input, result, wall_s, ended_at)


RUN_OPTIONS = (
    "steps",
    "base_model",
    "suite",
    "run_id",
    "time_budget",
    "seed",
    "keep_versions",
    "dry_run",
    "alongside",
)
"""What shapes a new run: `--attach` follows a run as it was started and takes none of them."""
FLAGS = {
    "steps": "--steps",
    "base_model": "--base-model",
    "suite": "--suite",
    "run_id": "--run-id",
    "time_budget_s": "--time-budget",
    "seed": "--seed",
    "keep_versions": "--keep-versions",
}
"""The flag that sets each field of a new run, to blame for a value no run could take."""


def _attach_cmd(args: argparse.Namespace, settings: Settings) -> int:
    """Follow run `--attach` to its end, or take the result of one that ended unfollowed, and
    write its report. The run is looked up once the stack answers, before any worker starts."""
    values = {name: getattr(args, name) for name in RUN_OPTIONS}
    given = [  # not by truth: `--seed 0` or `--keep-versions 0` passed unseen
        f"--{name.replace('_', '-')}"
        for name, value in values.items()
        if value is not None and value is not False  # False: `--dry-run` not given
    ]
    given += ["--preset"] if args.preset != DEFAULT else []
    if given:
        problem = f"--attach takes no run options (got {', '.join(given)})"
        print(f"tempered train: {problem}", file=sys.stderr)
        return 2
    before = stack.running(settings)
    _bring_up(settings, workers=False)  # Temporal, to ask; the workers once the run is found
    try:
        run_input, result, wall_s, ended_at = asyncio.run(
            _attach(settings, args.attach, workers=not args.no_workers)
        )
    except ValueError as exc:  # no such run (exit 2: nothing started), or found and refused
        print(f"tempered train: {exc}", file=sys.stderr)
        if isinstance(exc, NoSuchRun) and (stopped := stack.stop_new(settings, before)):
            print(f"tempered train: stopped what it started: {stopped}", file=sys.stderr)
        return 2
    except WorkflowFailureError as err:
        print(f"tempered train: run {args.attach} {ended(err)}", file=sys.stderr)
        return 1
    except LostTemporal:
        return LOST
    return _report(settings, run_input, result, wall_s, ended_at)


def ended(err: WorkflowFailureError) -> str:
    """How a run that has no result ended, for `run RUN …`."""
    cause = err.cause
    if isinstance(cause, TerminatedError):
        return f"was terminated ({cause.message}): no result, no report"
    if isinstance(cause, CancelledError):
        return "was cancelled: no result, no report"
    if isinstance(cause, WorkflowTimeoutError):
        return f"timed out ({cause.message}): no result, no report"
    return f"failed: {describe(cause or err)}"


def stop_cmd(args: argparse.Namespace, settings: Settings) -> int:
    async def stop() -> str:
        client = await connect(settings, runtime=quiet_runtime())
        return await stop_run(client, args.run, reason=args.reason, cancel=args.cancel)

    try:
        print(asyncio.run(stop()))
    except ValueError as exc:
        print(f"tempered stop: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(
    settings: Settings,
    run_input: TrainingRunInput,
    result: TrainingRunResult,
    wall_s: float,
    ended_at: float | None,
) -> int:
    """The closing summary, the report and where to look, all with the run's own wall time (an
    `--attach`'s summary once counted from when following began, its report from the start)
    and, for a run that ended unfollowed, its own end (`ended_at`; None: now)."""
    Console().print(summary(result, wall_s))
    out = write_report(settings, run_input, result, wall_s, ended_at)
    print(f"report: {out / 'report.json'}  curve: {out / 'reward_curve.png'}")
    ui = stack.temporal_ui(settings)
    if ui is not None:  # an external Temporal's UI is not ours to know
        runs = f"workflows?query=TemperedRunId%3D%22{run_input.run_id}%22"
        print(f"Temporal UI: {ui}/namespaces/{settings.temporal.namespace}/{runs}")
    return 0


def _bring_up(
    settings: Settings, workers: bool, new_run: str | None = None, alongside: bool = False
) -> None:
    """The stack and the background workers, where not running (a rebooted machine's stack
    restarts from its files, and the runs it held go on); an external Temporal is only checked
    to answer (`stack.up`). For a `new_run`, once Temporal answers, that no run runs (unless
    `alongside`), and its id once the store answers, both before the workers start."""
    stack.up(settings, say=lambda line: print(line, flush=True))  # each line as it comes
    if new_run is not None:
        if not alongside:
            check_none_running(settings)
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
    client = await connect(settings, runtime=quiet_runtime())
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
    settings: Settings, run_id: str, workers: bool
) -> tuple[TrainingRunInput, TrainingRunResult, float, float | None]:
    """Run `run_id`'s input, result, wall time and end (None: now): followed to its end where
    it runs (with the `workers` up), else from its closed workflow (close minus start)."""
    client = await connect(settings, runtime=quiet_runtime())
    found = await attach(client, run_id)
    since, closed = found.started, found.closed
    if closed is not None:  # it ended while no one followed it: its report was never written
        print(f"run {run_id} ended ({found.state}) at {closed:%H:%M:%S} UTC: nothing to follow")
        result = await found.handle.result()  # WorkflowFailureError: none to report
        return found.run_input, result, (closed - since).total_seconds(), closed.timestamp()
    for line in await asyncio.to_thread(ensure_workers, settings) if workers else []:
        print(line)
    print(
        f"attached to {Workflow.TRAINING_RUN.value} {found.handle.id} (started {since:%H:%M:%S} UTC)"
    )
    result = await _follow(client, found.handle, found.run_input, settings, since.timestamp())
    return found.run_input, result, time.time() - since.timestamp(), None


async def _follow(
    client: Client,
    handle: RunHandle,
    run_input: TrainingRunInput,
    settings: Settings,
    started: float,
) -> TrainingRunResult:
    run = run_input.run_id
    try:
        return await follow(client, handle, run_input, settings, started)
    except asyncio.CancelledError:  # Ctrl-C: the run is durable and goes on without us
        _detached(run, f"detached; {goes_on(run, settings)}")
        raise
    except RPCError as err:
        temporal = temporal_endpoint(settings)
        if err.status is not RPCStatusCode.UNAVAILABLE and port_open(
            temporal.host, temporal.port, 2.0
        ):
            raise  # a cut long poll reads "transport error" (UNKNOWN): lost if none answers
        # the run is durable: it waits for Temporal and goes on; it has not failed (exit 1)
        where, why = settings.temporal.address, str(err).splitlines()[0]
        told = f"lost Temporal at {where} ({why}); detached: run {run} goes on once it answers"
        _detached(run, f"{told} again (after `tempered down`: `tempered up`).")
        raise LostTemporal from None


class LostTemporal(Exception):
    """Temporal stopped answering while `train` followed a run (said on stderr): exit `LOST`."""


def goes_on(run: str, settings: Settings) -> str:
    """Where detached run `run` goes on, from what this machine knows: the background workers
    of its home that live (it said "in the background workers" after `--no-workers` too)."""
    missing = [queue.value for queue in Queue if queue not in background_workers(settings)]
    if not missing:
        return f"run {run} goes on in the background workers."
    none = "no background worker" if len(missing) == len(Queue) else "none"
    return (
        f"run {run} goes on where workers poll its queues, and waits while none does: {none} "
        f"of this home serves {', '.join(missing)} (`tempered status` shows the pollers; "
        "`tempered worker all` starts them)."
    )


def _detached(run: str, why: str) -> None:
    print(
        f"{why}\n"
        f"  follow it again: tempered train --attach {run}\n"
        f"  stop it:         tempered stop {run} [--cancel]",
        file=sys.stderr,
    )
