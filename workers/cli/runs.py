"""`tempered runs ls`, `tempered runs show RUN`, `runs rm`, `runs prune`: what a run stored
(`tempered regrade RUN` is `workers/cli/regrade.py`).

    tempered runs ls                              every run in the bucket, one line each
    tempered runs show RUN                        tasks, trajectories, reward records, policies
    tempered runs show RUN --task ID [--sample N] an episode step by step: the model's call
                                                  (code or tool call), what it was shown back
                                                  (printed by `episodes.py`)
    tempered runs rm RUN [RUN ...] [--force]      delete runs: their objects (their evaluations'
                                                  too) and their locally cached policy versions
    tempered runs prune RUN [...] [--keep K]      delete policy versions but v0 and the newest K,
                                                  the workspace snapshots of the run and of its
                                                  evaluations, and its learner's stored groups

`rm` and `prune` refuse a run that a workflow still works on (its training run, its learner, its
tasks, or an evaluation of it: `runs_busy.py`), and (without `--force`) any run when Temporal
cannot be asked; `prune` refuses `--keep 0`, which would delete the version `latest.json` names.
An `rm` that stopped half way is finished by running it again (`runs_remove.py` deletes the
run's own prefix last). Content-addressed workspace objects (`trees/`, `packs/`) are shared
between runs and stay. Exit codes: 0 done, 2 bad input or S3 unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from temporalio.service import RPCError

from contracts.run import RunRecord
from contracts.trajectory import RewardRecord, Trajectory
from infra import keys
from infra.policy import latest_policy, policy_manifest, policy_versions
from infra.policy_cache import forget_run
from infra.retention import prune_versions
from infra.run_ids import removal_record, run_stored
from infra.settings import Settings
from infra.storage import ObjectNotFound, ObjectStore, StorageError
from workers.cli.episodes import print_episode
from workers.cli.errors import natural, run_id
from workers.cli.runs_busy import busy
from workers.cli.runs_remove import refuse_read, remove_run
from workers.cli.table_fit import fit_first_column

Command = Callable[[argparse.Namespace, Settings], int]
Record = TypeVar("Record", bound=BaseModel)
READERS = 8
"""Objects `runs show` reads at once."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `runs ls/show/rm/prune` to the `tempered` CLI."""
    runs = commands.add_parser("runs", help="list and inspect stored runs")
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    actions.add_parser("ls", help="every run in the bucket").set_defaults(func=runs_ls)
    show = actions.add_parser("show", help="one run: tasks, trajectories, rewards, policies")
    show.add_argument("run", type=run_id)
    show.add_argument("--task", help="print this task's episodes step by step")
    show.add_argument("--sample", type=natural, help="with --task: only this sample")
    show.set_defaults(func=runs_show)
    remove = actions.add_parser("rm", help="delete runs' objects and cached policy versions")
    remove.add_argument("runs", nargs="+", metavar="RUN", type=run_id)
    remove.add_argument(
        "--force", action="store_true", help="also when Temporal cannot say whether they run"
    )
    remove.set_defaults(func=runs_rm)
    prune = actions.add_parser(
        "prune",
        help="delete finished runs' older policy versions, their workspace snapshots and their "
        "learner's stored groups",
    )
    prune.add_argument("runs", nargs="+", metavar="RUN", type=run_id)
    prune.add_argument(
        "--keep", type=natural, default=1, help="newest versions to keep besides v0 (default 1)"
    )
    prune.add_argument(
        "--force", action="store_true", help="also when Temporal cannot say whether they run"
    )
    prune.set_defaults(func=runs_prune)


def user_errors(func: Command) -> Command:
    """Storage problems and bad input: one line on stderr, exit 2, no traceback."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace, settings: Settings) -> int:
        try:
            return func(args, settings)
        except (StorageError, ValueError) as exc:
            print(f"tempered {args.command}: {exc}", file=sys.stderr)
            return 2

    return wrapper


def open_store(settings: Settings) -> ObjectStore:
    store = ObjectStore.from_settings(settings)
    store.check()
    return store


def _names(store: ObjectStore, prefix: str) -> list[str]:
    """Last path segment of each prefix right under `prefix`."""
    return [p[len(prefix) :].rstrip("/") for p in store.list_prefixes(prefix)]


def require_run(store: ObjectStore, run: str, removing: bool = False) -> None:
    """ValueError unless `run` names a run; `removing`: or one an interrupted `rm` removed in
    part (its removal record written: a rerun finishes it)."""
    if not run_stored(store, run) and not (removing and removal_record(store, run)):
        raise ValueError(
            f"unknown run {run!r}: nothing stored under s3://{store.bucket}/runs/{run}/"
        )


def _stream(store: ObjectStore, keys_: Iterable[str], cls: type[Record]) -> Iterator[Record]:
    """Each object of `keys_` as `cls`, in order, `READERS` read at once and at most twice as
    many held: a run's trajectories (~330 kB each in memory) are never all in memory."""
    with ThreadPoolExecutor(READERS) as pool:
        window: deque[Future[Record]] = deque()
        for key in keys_:
            window.append(pool.submit(store.get_model, key, cls))
            if len(window) >= 2 * READERS:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def run_record(store: ObjectStore, run: str) -> RunRecord | None:
    """What `run` recorded as it started (`runs/<run>/run.json`: its input and, since runs
    record it, its held-out set), None if it has none."""
    try:
        return store.get_model(keys.run_record_key(run), RunRecord)
    except ObjectNotFound:
        return None


@dataclass
class _Tally:
    """What `runs show` prints of some trajectories or reward records: sums, never the records."""

    count: int = 0
    solved: int = 0
    reward: float = 0.0
    changed: int = 0
    steps: int = 0
    versions: set[int] = field(default_factory=set)

    def add(self, record: Trajectory | RewardRecord) -> None:
        self.count += 1
        self.solved += record.solved
        self.reward += record.reward
        if isinstance(record, RewardRecord):
            self.changed += record.solved != record.previous_solved
        else:
            self.steps = max(self.steps, len(record.steps))
            self.versions.add(record.policy_version)

    @property
    def mean(self) -> str:
        return f"{self.reward / self.count:+.3f}" if self.count else "-"


@user_errors
def runs_ls(args: argparse.Namespace, settings: Settings) -> int:
    store = open_store(settings)
    table = Table(title=f"runs in s3://{store.bucket}")
    for column in ("run", "tasks", "trajectories", "policy versions", "latest", "graders"):
        left = column in ("run", "graders")
        table.add_column(column, justify="left" if left else "right", overflow="fold")  # no …
    # an S3 store may go on listing an emptied prefix: a removed run's, a pruned version's
    for run in filter(functools.partial(run_stored, store), _names(store, keys.RUNS_PREFIX)):
        latest = latest_policy(store, run)
        published = [  # with a manifest: published and not pruned since
            v for v in policy_versions(store, run) if store.exists(keys.policy_manifest_key(run, v))
        ]
        table.add_row(
            # an `rm` that stopped half way: running it again finishes it
            f"{run} (removed in part)" if removal_record(store, run) else run,
            str(len(_names(store, keys.tasks_prefix(run)))),
            str(sum(1 for _ in store.list_keys(keys.trajectories_prefix(run)))),
            str(len(published)),
            f"v{latest.version}" if latest else "-",
            ", ".join(_names(store, keys.rewards_prefix(run))) or "-",
        )
    console = Console()
    fit_first_column(table, console)  # ids whole, never cut by an ellipsis
    console.print(table)
    return 0


@user_errors
def runs_show(args: argparse.Namespace, settings: Settings) -> int:
    store = open_store(settings)
    run = args.run
    require_run(store, run)
    console = Console()
    if args.task is not None:
        return show_episodes(console, store, run, args.task, args.sample)
    if args.sample is not None:
        raise ValueError("--sample needs --task")
    spec = run_record(store, run)
    about = (
        f"suite {spec.suite}, base {spec.base_model}, G={spec.group_size}"
        if spec
        else "no run.json"
    )
    console.print(f"[bold]{run}[/]  ({about})")
    tasks = _names(store, keys.tasks_prefix(run))
    every, per_task = _Tally(), dict[str, _Tally]()
    for t in _stream(store, store.list_keys(keys.trajectories_prefix(run)), Trajectory):
        every.add(t)
        per_task.setdefault(t.task_id, _Tally()).add(t)
    console.print(
        f"tasks {len(tasks)}  trajectories {every.count}  mean reward {every.mean}  "
        f"solved {every.solved}/{every.count}"
    )
    by_task = Table(title="trajectories by task")
    for column in ("task", "samples", "solved", "mean reward", "steps", "policy versions"):
        by_task.add_column(column, justify="left" if column == "task" else "right")
    for task, tally in sorted(per_task.items()):
        versions = ",".join(str(v) for v in sorted(tally.versions))
        row = (str(tally.count), f"{tally.solved}/{tally.count}", tally.mean, str(tally.steps))
        by_task.add_row(task, *row, versions)
    console.print(by_task)
    graders = Table(title="reward records")
    for column in ("grader", "records", "solved", "mean reward", "changed"):
        graders.add_column(column, justify="left" if column == "grader" else "right")
    for grader in _names(store, keys.rewards_prefix(run)):
        prefix = keys.rewards_prefix(run, grader)
        tally = _Tally()
        for record in _stream(store, store.list_keys(prefix), RewardRecord):
            tally.add(record)
        row = (str(tally.count), f"{tally.solved}/{tally.count}", tally.mean, str(tally.changed))
        graders.add_row(grader, *row)
    console.print(graders)
    policies = Table(title="policy versions")
    latest = latest_policy(store, run)
    for column in ("version", "step", "created", "latest"):
        policies.add_column(column)
    gone = []  # an S3 store may go on listing a deleted version's emptied prefix
    for version in policy_versions(store, run):
        manifest = policy_manifest(store, run, version)
        if manifest is None:
            gone.append(f"v{version}")
            continue
        mark = "*" if latest and latest.version == version else ""
        policies.add_row(f"v{version}", str(manifest.policy.step), manifest.policy.created_at, mark)
    console.print(policies)
    if gone:
        console.print(f"no manifest (deleted, or a publish that never finished): {', '.join(gone)}")
    return 0


@user_errors
def runs_rm(args: argparse.Namespace, settings: Settings) -> int:
    store = open_store(settings)
    _refuse_running(store, settings, args.runs, args.force, "deleted", removing=True)
    for run in args.runs:  # in an order a rerun finishes (runs_remove.py)
        print(remove_run(store, settings.policy_cache, run))
    return 0


@user_errors
def runs_prune(args: argparse.Namespace, settings: Settings) -> int:
    if args.keep < 1:  # latest.json names the newest version and never moves back
        raise ValueError(
            "--keep 0 would delete the run's latest policy version (latest.json names it: what "
            "the run trained to); keep 1 or more, or `tempered runs rm` the run"
        )
    store = open_store(settings)
    _refuse_running(store, settings, args.runs, args.force, "pruned")
    for run in args.runs:
        doomed = prune_versions(store, run, args.keep)
        forget_run(settings.policy_cache, run)
        named = ", ".join(f"v{v}" for v in doomed) or "none"
        print(
            f"pruned run {run}: deleted policy versions {named}, the workspace snapshots of the "
            "run and of its evaluations, its learner's stored groups and its cached policies"
        )
    return 0


def _refuse_running(
    store: ObjectStore,
    settings: Settings,
    runs: list[str],
    force: bool,
    done: str,
    removing: bool = False,
) -> None:
    """ValueError for an unknown run, a running one, or (unless `force`) no Temporal to ask;
    `removing`, also for a run a live reader reads (`remove_run` asks again, before deleting)."""
    for run in runs:
        require_run(store, run, removing)
        if removing:  # every run's before any is deleted (`remove_run` asks again)
            refuse_read(store, run)
    try:
        running = asyncio.run(busy(settings, runs))
    except (OSError, RuntimeError, RPCError) as exc:  # no Temporal to ask, or it failed
        if not force:
            raise ValueError(
                f"cannot tell whether {', '.join(runs)} still run (Temporal at "
                f"{settings.temporal.address}: {exc}); nothing {done} (--force anyway)"
            ) from None
        running = []
    if running:
        raise ValueError(
            f"still running: {', '.join(running)} (`tempered stop` a training run first; let "
            "an evaluation or a learner finish, or cancel their workflows)"
        )


def show_episodes(
    console: Console, store: ObjectStore, run: str, task: str, sample: int | None
) -> int:
    """Each stored episode of `task` (or only `sample`), step by step, from the store."""
    names = [  # exactly this task's (not those of a task `<task>--s<N>...`), before reading
        key
        for key in store.list_keys(keys.trajectories_prefix(run))
        if (episode := keys.episode_of(keys.trajectory_episode(run, key) or "")) is not None
        and episode[0] == task
        and (sample is None or episode[1] == sample)
    ]
    trajectories = sorted(_stream(store, names, Trajectory), key=lambda t: t.sample)
    if not trajectories:
        which = f"task {task!r}" + (f" sample {sample}" if sample is not None else "")
        raise ValueError(f"run {run!r} has no trajectory of {which}")
    for trajectory in trajectories:
        print_episode(console, store, trajectory)
    return 0
