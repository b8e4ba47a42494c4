"""What durable workspaces cost: snapshots vs step time, and Temporal vs a plain loop for steps.

    .venv/bin/python bench/episodes.py [--steps 20] [--episodes 8] [--group-size 4]
        [--concurrency 4] [--rounds 2]

One private stack (`tempered up` on free ports: Temporal dev server, SeaweedFS) and, in this
process, the production sandbox worker (`workers.runtime.build_worker` plus its own queue).

1. snapshot: a 1 MiB workspace (64 Python files of 16 KiB). Each step is a `bash` call that
   runs a script reading every file and then edits one line of one file (a test run and an
   edit). Reported: the step's wall time, the share of it spent snapshotting (scan + upload of
   the changed file + manifest), and a restore of the final tree on a cold worker (a new blob
   cache: every file fetched from S3) — what a crash costs once. Target: snapshot + restore
   ≤ 15% of a step.
2. throughput: the same scripted episodes (a built-in task, G samples, read/run/write/submit
   steps) driven through Temporal (`tests/episode_driver.ScriptedEpisodes`: each step an
   `env_step` activity on the worker's own queue) and by a plain asyncio loop calling the very
   same activity methods on the same sessions. Rounds alternate the order; medians of steps/s.
   `--concurrency` bounds how many of the `--episodes` episodes run at once, so it cannot
   exceed them (the bench refuses: before 6 December "16 in flight" ran 8 episodes, 8 at a
   time). Target: Temporal ≥ 0.8× plain. Each mode's CPU milliseconds a step are printed
   beside it: the dev server's, this process's (activities, and in tempered mode the SDK and
   the workflow) and the rest's (sandboxes, SeaweedFS): on a machine of few cores the
   difference between the modes is where the gap goes.

   What this does not measure (the gap to a real episode): `ScriptedEpisodes` is a test
   driver, not AgentTaskWorkflow. It has no model turn (no GENERATE activity, no inference
   queue), upserts no search attributes (AgentTaskWorkflow upserts `TemperedState` and the
   rest at every GENERATE and EXECUTE move: an event and a visibility write each), writes no
   trajectories, and is started from the client rather than as a training run's child
   (bench/task_parent.py). So its Temporal/plain ratio is the sessions' activities alone
   through Temporal, a bound on a workspace task's cost that leaves those writes out; running
   AgentTaskWorkflow itself with a scripted `generate` (tests/workflows/harness.py's
   ScriptedModel) and the plain loop doing the same calls is not done yet. The bench prints
   the path it measures (`path` in the report).

Printed and merged into bench/results.json under "episodes" (with the machine's load average:
other work on the machine slows both sides alike, not their ratio). It refuses a busy machine
(`common.require_idle`, and after every measured run if other processes took the cores;
`--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    Stopwatch,
    activity_method,
    add_busy_flag,
    bench_stack,
    cpu_seconds,
    idle_side,
    machine,
    median_of,
    merge_results,
    production_workers,
    require_idle,
    temporal_pid,
)

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
from infra.tasks.workspace import workspace_tasks
from tests.episode_driver import DRIVER_QUEUE, DriverInput, ScriptedEpisodes, drive_plain

PATH = (
    "tests/episode_driver.ScriptedEpisodes started from the client: session activities only "
    "(no GENERATE, no search-attribute upserts, no trajectories, no parent workflow)"
)
"""What the throughput part's Temporal side runs (not AgentTaskWorkflow: see the docstring)."""
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


def episode_script(task_index: int) -> tuple[Any, list[ToolCall]]:
    task = workspace_tasks()[task_index]
    module = next(
        e.path for e in task.files.manifest.files() if e.path.startswith("test_")
    ).removeprefix("test_")
    fix = task.spec.canonical_solution or ""
    steps = [
        ToolCall(name="read_file", arguments={"path": "README.md"}),
        ToolCall(name="bash", arguments={"command": f"python3 test_{module}"}),
        ToolCall(name="read_file", arguments={"path": module}),
        ToolCall(name="bash", arguments={"command": fix}),
        ToolCall(name="bash", arguments={"command": f"python3 test_{module}"}),
        ToolCall(name="write_file", arguments={"path": "NOTES.md", "content": "fixed\n"}),
        ToolCall(name="bash", arguments={"command": "ls -la && git status 2>/dev/null || true"}),
        ToolCall(name="submit"),
    ]
    return task, steps


async def throughput(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    print(f"throughput, tempered side: {PATH}", flush=True)
    async with production_workers(settings, [Queue.SANDBOX]) as (client, plans):
        from temporalio.worker import Worker

        from workers.runtime import own_queue_worker

        sessions = activity_method(plans, Queue.SANDBOX, "env_step").__self__  # type: ignore[attr-defined]
        store = sessions.store
        jobs = []
        for n in range(args.episodes):
            task, steps = episode_script(n * 3 % 60)
            for key, data in task.objects.items():
                store.put_bytes(key, data)
            script = [dict.fromkeys(range(args.group_size), call) for call in steps]
            jobs.append((task, script))
        total_steps = args.episodes * args.group_size * len(jobs[0][1])

        server = temporal_pid(settings)
        cpu: dict[str, dict[str, list[float]]] = {"tempered": {}, "plain": {}}

        async def run(mode: str) -> float:
            gate = asyncio.Semaphore(args.concurrency)
            tag = uuid.uuid4().hex[:8]

            async def one(n: int) -> None:
                task, script = jobs[n]
                job = DriverInput(
                    run_id=f"bench-{tag}-{n}",
                    task_id=task.spec.id,
                    workspace=task.spec.workspace,
                    script=script,
                    heartbeat_s=30,
                )
                async with gate:
                    if mode == "tempered":
                        await client.execute_workflow(
                            ScriptedEpisodes.run,
                            job,
                            id=f"bench-episodes-{tag}-{n}",
                            task_queue=DRIVER_QUEUE,
                        )
                    else:
                        await drive_plain(sessions, job)

            before = cpu_split(server)
            with Stopwatch() as watch:
                await asyncio.gather(*(one(n) for n in range(args.episodes)))
            rate = total_steps / watch.seconds
            for side, seconds in cpu_split(server).items():
                cpu[mode].setdefault(side, []).append((seconds - before[side]) * 1000 / total_steps)
            print(
                f"  {mode}: {total_steps} steps in {watch.seconds:.1f}s = {rate:.1f} steps/s; CPU "
                + ", ".join(f"{side} {ms[-1]:.1f}" for side, ms in cpu[mode].items())
                + " ms a step",
                flush=True,
            )
            return rate

        rates: dict[str, list[float]] = {"tempered": [], "plain": []}
        async with (
            own_queue_worker(client, plans[Queue.SANDBOX]),
            Worker(client, task_queue=DRIVER_QUEUE, workflows=[ScriptedEpisodes]),
        ):
            for mode in ("plain", "tempered"):  # warm-up of both sides: caches, start-up paths,
                await run(mode)  # a new queue's first workflow and activity tasks
            for sides in cpu.values():
                sides.clear()  # the warm-up's CPU is not a round's
            for round_ in range(args.rounds):
                for mode in ("plain", "tempered") if round_ % 2 == 0 else ("tempered", "plain"):
                    with idle_side(f"{mode} round {round_}"):
                        rates[mode].append(await run(mode))
    tempered, plain = median_of(rates["tempered"]), median_of(rates["plain"])
    report = {
        "path": PATH,
        "episodes": args.episodes,
        "group_size": args.group_size,
        "steps_per_episode": len(jobs[0][1]),
        "concurrency": args.concurrency,
        "tempered_steps_per_s": round(tempered, 2),
        "plain_steps_per_s": round(plain, 2),
        "ratio": round(tempered / plain, 3),
        "target_ratio": 0.8,
        "rounds": rates,
        "cpu_ms_per_step": {
            mode: {side: round(median_of(values), 1) for side, values in sides.items()}
            for mode, sides in cpu.items()
        },
    }
    print(f"throughput: {report}", flush=True)
    return report


def cpu_split(server: int) -> dict[str, float]:
    """CPU seconds so far: the dev server's, this process's, and its other children's."""
    own_s = cpu_seconds(children=False)
    return {
        "server": cpu_seconds(server),
        "bench": own_s,
        "rest": cpu_seconds(exclude=server) - own_s,
    }


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="tempered-bench-"))
    sandbox = SandboxSettings(local=LocalSandboxSettings(warm=2), concurrency=8)
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
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="snapshot: steps over 1 MiB")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="episodes in flight, at most --episodes"
    )
    parser.add_argument("--rounds", type=int, default=2)
    add_busy_flag(parser)
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error(f"--concurrency {args.concurrency}: at least 1 episode must be in flight")
    if args.concurrency > args.episodes:
        # Refused, not raised to match: more episodes would change the work a run measures.
        parser.error(
            f"--concurrency {args.concurrency} > --episodes {args.episodes}: only "
            f"{args.episodes} episodes exist to be in flight; pass --episodes "
            f"{args.concurrency} (or more) for {args.concurrency} at once"
        )
    require_idle(args.allow_busy)
    asyncio.run(main(args))
