"""What durable workspaces cost: snapshots vs step time, and Temporal vs a plain loop for steps.

    .venv/bin/python bench/episodes.py [--steps 20] [--episodes 8] [--group-size 4]
        [--concurrency 4] [--rounds 2] [--path agent-task | scripted]

One private stack (`tempered up` on free ports: Temporal dev server, SeaweedFS) and, in this
process, the production sandbox worker (`workers.runtime.build_worker` plus its own queue).

1. snapshot: a 1 MiB workspace (64 Python files of 16 KiB). Each step is a `bash` call that
   runs a script reading every file and then edits one line of one file (a test run and an
   edit). Reported: the step's wall time, the share of it spent snapshotting (scan + upload of
   the changed file + manifest), and a restore of the final tree on a cold worker (a new blob
   cache: every file fetched from S3) — what a crash costs once. Target: snapshot + restore
   ≤ 15% of a step.
2. throughput: the same scripted episodes (a built-in workspace task, G samples, read/run/
   fix/run/write/list/submit steps: `episodes_common.episodes`) driven through Temporal and by
   a plain asyncio loop calling the very same activity methods on the same sessions, in the
   same order. Rounds alternate the order; medians of steps/s (`episodes_common.compare`).
   `--concurrency` bounds how many of the `--episodes` episodes run at once, so it cannot
   exceed them (the bench refuses: before 6 December "16 in flight" ran 8 episodes, 8 at a
   time). Target: Temporal ≥ 0.8× plain. Each side's CPU milliseconds a step are printed
   beside it: the dev server's, this process's (activities, and on the Temporal side the SDK
   and the workflows) and the rest's (sandboxes, SeaweedFS): on a machine of few cores the
   difference between the sides is where the gap goes. `--path` picks what the Temporal side
   runs (`path` in the report names it):

   agent-task  (the default: the target is about real episodes) the production
               AgentTaskWorkflow, each episode a task run as a training run's child
               (bench/task_parent.py), GENERATE on `inference` answered by a scripted model,
               the sandbox and rewards workers' activities, its search-attribute upserts and
               write_trajectories; the plain loop makes the very same calls
               (bench/episodes_agent.py).
   scripted    `tests/episode_driver.ScriptedEpisodes`, a test driver started from the client:
               the session activities alone (each step an `env_step` on the worker's own
               queue); the plain loop is its `drive_plain`. The figures before 7 December are
               of this path.

   What this does not measure: a model. GENERATE costs what the scripted model's store reads
   and writes cost (a completion record a sample), not a forward pass, so with a real model
   each step is longer and Temporal's share of it smaller than here: the agent-task ratio is
   the orchestration of real episodes, a lower bound on a real run's ratio. Nor does it
   measure a training run's own work between tasks (drawing tasks, the learner: see
   bench/task_parent.py), lost sandbox workers (no session is restored) or the circuit
   breaker. `--path scripted` also leaves out the model turn, the search-attribute upserts
   (an event and a visibility write at every GENERATE and EXECUTE move), the trajectories and
   the parent: its ratio is the sessions' activities alone through Temporal.

Printed and merged into bench/results.json under "episodes" (with the machine's load average:
other work on the machine slows both sides alike, not their ratio). It refuses a busy machine
(`common.require_idle`, and after every measured run if other processes took the cores;
`--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import episodes_agent
from common import (
    Stopwatch,
    add_busy_flag,
    bench_stack,
    idle_side,
    machine,
    median_of,
    merge_results,
    require_idle,
)
from episodes_common import episodes, in_flight, measure, sandbox_stack
from temporalio.worker import Worker

from contracts.episode import ToolCall
from contracts.names import Queue
from contracts.task import SandboxLimits, WorkspaceSpec
from infra.environments.mounts import remove_tree
from infra.environments.sessions import SessionHost
from infra.environments.snapshots import StoreObjects, Trees
from infra.environments.tree import pack_files
from infra.environments.workspace import WorkspaceEnvironment
from infra.sandbox.local import LocalBackend
from infra.sandbox.workspace import CommandRunner
from infra.settings import LocalSandboxSettings, SandboxSettings, Settings, WorkspaceSettings
from infra.storage import ObjectStore
from tests.episode_driver import DRIVER_QUEUE, DriverInput, ScriptedEpisodes, drive_plain

SCRIPTED_PATH = (
    "tests/episode_driver.ScriptedEpisodes started from the client: session activities only "
    "(no GENERATE, no search-attribute upserts, no trajectories, no parent workflow)"
)
"""What `--path scripted`'s Temporal side runs (not AgentTaskWorkflow: see the docstring)."""
HOME_PREFIX = "tempered-bench-"
"""The stack's folder under the temp dir (`main` removes it, however the run ends)."""
FILES, FILE_BYTES = 64, 16 << 10
LIMITS = SandboxLimits(timeout_s=30)
CHECK = """import pathlib
total = sum(len(p.read_text().splitlines()) for p in sorted(pathlib.Path("src").glob("*.py")))
print(total, "lines")
"""


def repository() -> dict[str, str]:
    """64 files of 16 KiB of Python-like text (1 MiB), and the script a step runs."""
    rng = random.Random("tempered-bench-episodes")
    words = ["value", "total", "items", "result", "index", "count", "name", "data", "row"]
    files = {"check.py": CHECK}
    for n in range(FILES):
        lines, size = [], 0
        while size < FILE_BYTES:
            line = f"{rng.choice(words)}_{rng.randint(0, 99)} = {rng.choice(words)}({rng.randint(0, 999)})\n"
            lines.append(line)
            size += len(line)
        files[f"src/mod_{n:02d}.py"] = "".join(lines)[:FILE_BYTES]
    return files


async def snapshot_cost(settings: Settings, steps: int) -> dict[str, Any]:
    store = ObjectStore.from_settings(settings)
    trees = Trees(StoreObjects(store))
    root = Path(tempfile.mkdtemp(prefix="tempered-bench-sessions-"))
    host = SessionHost(WorkspaceSettings(root=root))
    env = WorkspaceEnvironment(host, trees, CommandRunner(), LocalBackend(warm=0))
    files, tests = pack_files(repository()), pack_files({"test.sh": "exit 0\n"})
    for key, data in {**files.objects, **tests.objects}.items():
        store.put_bytes(key, data)
    spec = WorkspaceSpec(files=files.ref, verifier=tests.ref)
    snapshot_s: list[float] = []
    original = env._snapshot  # time the snapshot inside each step

    async def timed(*args: Any) -> Any:
        with Stopwatch() as watch:
            result = await original(*args)
        snapshot_s.append(watch.seconds)
        return result

    env._snapshot = timed  # type: ignore[method-assign,assignment]
    try:
        state = await env.reset(spec, "bench")
        step_s = []
        for n in range(steps):
            command = f"python3 check.py && sed -i '1s/.*/# edited at step {n}/' src/mod_{n % FILES:02d}.py"
            call = ToolCall(name="bash", arguments={"command": command})
            with Stopwatch() as watch:
                state, seen = await env.step(state, call, LIMITS)
            assert seen.status is not None and seen.status.value == "passed", seen.text
            step_s.append(watch.seconds)
        restore_s = []
        for n in range(5):
            cold = WorkspaceEnvironment(
                host, Trees(StoreObjects(store)), CommandRunner(), env.backend
            )
            with Stopwatch() as watch:
                restored = await cold.reset(spec, f"restored-{n}", state.snapshot)
            assert restored.tree_digest == state.tree_digest
            restore_s.append(watch.seconds)
            await cold.close([f"restored-{n}"])
    finally:
        await host.shutdown()
        trees.close()
        remove_tree(root)
    step, snap, restore = median_of(step_s), median_of(snapshot_s), median_of(restore_s)
    report = {
        "workspace_bytes": FILES * FILE_BYTES,
        "steps": steps,
        "step_ms": round(step * 1000, 1),
        "snapshot_ms": round(snap * 1000, 1),
        "restore_cold_ms": round(restore * 1000, 1),
        "snapshot_share": round(snap / step, 3),
        "snapshot_plus_restore_share": round((snap + restore) / step, 3),
        "target_share": 0.15,
    }
    print(f"snapshot: {report}", flush=True)
    return report


async def scripted_throughput(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """`--path scripted`: ScriptedEpisodes through Temporal against its `drive_plain`."""
    played = episodes(args.episodes)
    steps = len(played[0].calls)

    def jobs(tag: str) -> list[DriverInput]:
        return [
            DriverInput(
                run_id=f"bench-{tag}-{n}",
                task_id=e.spec.id,
                workspace=e.spec.workspace,
                script=[dict.fromkeys(range(args.group_size), call) for call in e.calls],
                heartbeat_s=30,
            )
            for n, e in enumerate(played)
        ]

    def check(results: Sequence[Any]) -> None:
        taken = [len(r.history) for r in results]
        if taken != [args.group_size * steps] * len(played):
            raise RuntimeError(f"episodes took {taken} steps, not {args.group_size * steps} each")

    async with sandbox_stack(settings, [Queue.SANDBOX], played) as stack:
        client, sessions = stack.client, stack.sessions

        async def tempered(tag: str) -> None:
            run = jobs(tag)

            async def one(n: int) -> Any:
                return await client.execute_workflow(
                    ScriptedEpisodes.run,
                    run[n],
                    id=f"bench-episodes-{tag}-{n}",
                    task_queue=DRIVER_QUEUE,
                )

            check(await in_flight(len(run), args.concurrency, one))

        async def plain(tag: str) -> None:
            run = jobs(tag)
            check(
                await in_flight(len(run), args.concurrency, lambda n: drive_plain(sessions, run[n]))
            )

        async with Worker(client, task_queue=DRIVER_QUEUE, workflows=[ScriptedEpisodes]):
            timing = await measure(args, played, stack.server, tempered=tempered, plain=plain)
    return {"path": SCRIPTED_PATH, "steps_per_episode": steps, **timing}


PATHS = {
    "agent-task": (episodes_agent.PATH, episodes_agent.throughput),
    "scripted": (SCRIPTED_PATH, scripted_throughput),
}
"""`--path` -> (what its Temporal side runs, how it is measured); the first is the default."""


async def throughput(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    path, measure = PATHS[args.path]
    print(f"throughput (--path {args.path}), tempered side: {path}", flush=True)
    measured = await measure(settings, args)
    report = {
        "path_option": args.path,
        "episodes": args.episodes,
        "group_size": args.group_size,
        "concurrency": args.concurrency,
        **measured,
    }
    print(f"throughput: {report}", flush=True)
    return report


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
    sandbox = SandboxSettings(local=LocalSandboxSettings(warm=2), concurrency=8)
    try:
        with bench_stack(home, sandbox=sandbox) as settings:
            before = machine()
            with idle_side("snapshot"):
                snapshot = await snapshot_cost(settings, args.steps)
            report = {
                "snapshot": snapshot,
                "throughput": await throughput(settings, args),
                "machine_before": before,
                "machine_after": machine(),
                "wall_s": round(time.monotonic() - started, 1),
            }
        merge_results("episodes", report)
    finally:  # however the run ended; bench_stack has taken the stack down by now
        remove_home(home)


def remove_home(home: Path) -> None:
    """Remove the stack's folder that `main` made (mounts in it included); a failure to is
    printed, not raised over the run's own outcome."""
    if not (home.is_absolute() and home.name.startswith(HOME_PREFIX)):
        raise ValueError(f"{home}: not a folder this bench made")
    try:
        remove_tree(home)
    except OSError as exc:
        print(f"could not remove {home}: {exc}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="snapshot: steps over 1 MiB")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="episodes in flight, at most --episodes"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--path",
        choices=list(PATHS),
        default=next(iter(PATHS)),
        help="throughput's Temporal side: AgentTaskWorkflow as a run's child, or the test driver",
    )
    add_busy_flag(parser)
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error(f"--concurrency {args.concurrency}: at least 1 episode must be in flight")
    if args.concurrency > args.episodes:
        # Refused, not raised to match: more episodes would change the work a run measures.
        parser.error(
            f"--concurrency {args.concurrency} > --episodes {args.episodes}: only "
            f"{args.episodes} episodes exist to be in flight; pass --episodes "
            f"{args.concurrency} (or more) for {args.concurrency} at once"
        )
    return args


if __name__ == "__main__":
    arguments = parse_args()
    require_idle(arguments.allow_busy)
    asyncio.run(main(arguments))
