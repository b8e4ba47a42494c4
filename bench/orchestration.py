"""What Temporal costs a rollout: AgentTaskWorkflow vs the same activity calls in a plain loop.

    .venv/bin/python bench/orchestration.py [--tasks 16] [--group-size 4] [--max-turns 2]
        [--concurrency 8] [--rounds 2] [--max-new-tokens 48]

One private stack (`tempered up` on free ports: Temporal dev server with WAL SQLite, SeaweedFS),
and in this process the production workers of agent-tasks, inference (the `tiny` model),
sandbox (local bubblewrap) and rewards, built by `workers.runtime.build_worker`. The same
starter-suite tasks are then rolled out twice per round, `--concurrency` tasks in flight:

  tempered   each task is an AgentTaskWorkflow (generate, execute, FEEDBACK, ...,
             write_trajectories, in parts within a payload each, as activities through task
             queues; its search attributes upserted at every GENERATE and EXECUTE, at
             FEEDBACK as it writes (since CODE_FEEDBACK_PATCH, 7 December: one upsert more a
             task) and at DONE once written), started as a child of a parent workflow
             by `workflows.agent_task.run_agent_task`, the function TrainingRunWorkflow runs
             its tasks with (bench/task_parent.py): no eager start, the child's start and
             completion are the parent's events and workflow tasks too, memo and search
             attributes on the start. One parent per round, `--concurrency` children at once;
  plain      an asyncio loop calls the very same bound activity methods (same objects, same
             loaded model, same sandbox pool, same S3) directly, with the workflow's own
             requests (workflows/requests.py) and its own FEEDBACK step scoring the turns: no
             Temporal anywhere.

Until 6 December the tempered side started each AgentTaskWorkflow from the client with
`request_eager_start` (its first workflow task run in this process, no queue round trip and no
parent): a path the pipeline never takes, so the Temporal shares measured before then are of
that path (README's rows say which).

The order alternates every round (plain first, then tempered first, ...) and medians are
reported, so drifting machine load hits both sides. Printed and merged into bench/results.json
under "orchestration": rollouts/s (a rollout = one sample of a group) of both, the Temporal
share of wall time 1 - plain/tempered (target <= 10%), workflows/s, the dev server's CPU
seconds per task workflow (psutil, server process and children; the parent's share included),
and this process's CPU seconds per mode (the difference is the worker side's cost: SDK,
workflow sandbox, payload conversion). On a machine with few cores every CPU second of either
counts straight into wall time. It refuses a busy machine (`common.require_idle`, and after
every measured mode if other processes took the cores; `--allow-busy` measures anyway, marked
`busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from collections.abc import Awaitable, Callable
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
from task_parent import PARENT_QUEUE, PATH, TaskParent, run_as_children
from temporalio.worker import Worker

from contracts.episode import EpisodeEnd
from contracts.names import Queue
from contracts.task import AgentTaskInput, SamplingParams, TaskSpec
from infra.settings import InferenceSettings, Settings
from workflows.requests import execute_request, generate_request, write_trajectories_parts

POLICY_RUN = "bench-orchestration-policy"
QUEUES = [Queue.AGENT_TASKS, Queue.INFERENCE, Queue.SANDBOX, Queue.REWARDS]
Rollout = Callable[[list[AgentTaskInput], int], Awaitable[list[int]]]
"""Roll every input out, at most so many tasks in flight; the turns of each."""


class PlainRollout:
    """One task's rollout as a plain asyncio function over the workers' own activity methods."""

    def __init__(self, plans: dict[Queue, Any]) -> None:
        from temporalio.testing import ActivityEnvironment

        self.env = ActivityEnvironment()  # activity context only (heartbeats go nowhere)
        self.generate = activity_method(plans, Queue.INFERENCE, "generate")
        self.execute = activity_method(plans, Queue.SANDBOX, "execute")
        self.write = activity_method(plans, Queue.REWARDS, "write_trajectories")

    async def __call__(self, task_input: AgentTaskInput) -> int:
        """Roll `task_input` out as AgentTaskWorkflow would; returns the steps taken."""
        from workflows.episodes import EpisodeGroup

        group = EpisodeGroup(task_input)  # the workflow's own FEEDBACK: both sides score alike
        for step in range(task_input.max_turns):
            generated = await self.env.run(
                self.generate, generate_request(task_input, step, group.acting())
            )
            executed = await self.env.run(
                self.execute, execute_request(task_input, step, generated.completions)
            )
            group.feedback(step, generated, {o.sample: o for o in executed.outcomes})
            if group.all_ended():
                break
        group.end_acting(EpisodeEnd.STEP_BUDGET)
        for part in write_trajectories_parts(task_input, group.episodes):  # one after the other
            await self.env.run(self.write, part)
        return max(len(e.steps) for e in group.episodes)


def tempered_rollout(client: Any) -> Rollout:
    """The inputs as children of one TaskParent (as a training run starts its tasks)."""

    async def run(inputs: list[AgentTaskInput], concurrency: int) -> list[int]:
        return await run_as_children(client, inputs, concurrency, inputs[0].run_id)

    return run


def plain_rollout(plans: dict[Queue, Any]) -> Rollout:
    """The inputs through PlainRollout, at most `concurrency` in flight."""
    rollout = PlainRollout(plans)

    async def run(inputs: list[AgentTaskInput], concurrency: int) -> list[int]:
        slots = asyncio.Semaphore(concurrency)

        async def one(task_input: AgentTaskInput) -> int:
            async with slots:
                return await rollout(task_input)

        return list(await asyncio.gather(*(one(i) for i in inputs)))

    return run


def task_inputs(
    tasks: list[TaskSpec], args: argparse.Namespace, run_id: str
) -> list[AgentTaskInput]:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    return [
        AgentTaskInput(
            task=task,
            run_id=run_id,
            group_size=args.group_size,
            max_turns=args.max_turns,
            sampling=sampling,
            policy_run=POLICY_RUN,
            policy_version=0,
        )
        for task in tasks
    ]


async def measure(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    from infra.base_models import materialize_base_model
    from infra.policy import publish_policy
    from infra.storage import ObjectStore
    from infra.tasks import load_suite

    store = ObjectStore.from_settings(settings)
    base = await asyncio.to_thread(materialize_base_model, args.model, settings)
    await asyncio.to_thread(publish_policy, store, POLICY_RUN, 0, base)
    tasks = (load_suite("starter", split="train") * 4)[: args.tasks]
    tasks = [t.model_copy(update={"id": f"{t.id}-{i}"}) for i, t in enumerate(tasks)]
    server = temporal_pid(settings)
    rows: dict[str, dict[str, list[float]]] = {"plain": {}, "tempered": {}}
    print(f"tempered side: {PATH}", flush=True)
    async with (
        production_workers(settings, QUEUES) as (client, plans),
        Worker(client, task_queue=PARENT_QUEUE, workflows=[TaskParent]),
    ):
        modes: dict[str, Rollout] = {
            "plain": plain_rollout(plans),
            "tempered": tempered_rollout(client),
        }
        for mode, rollout in modes.items():  # warm-up: model, tokenizer, sandbox pool, workers
            await rollout(task_inputs(tasks[:2], args, f"warm-{mode}"), 2)
        for round_index in range(args.rounds):
            order = list(modes) if round_index % 2 == 0 else list(reversed(modes))
            for mode in order:
                run_id = f"bench-{mode}-{round_index}-{uuid.uuid4().hex[:6]}"
                server_cpu, own_cpu = cpu_seconds(server), cpu_seconds(children=False)
                inputs = task_inputs(tasks, args, run_id)
                with idle_side(f"{mode} round {round_index}"), Stopwatch() as watch:
                    turns = await modes[mode](inputs, args.concurrency)
                row = rows[mode]
                row.setdefault("wall_s", []).append(watch.seconds)
                row.setdefault("server_cpu_s", []).append(cpu_seconds(server) - server_cpu)
                row.setdefault("worker_cpu_s", []).append(cpu_seconds(children=False) - own_cpu)
                row.setdefault("turns", []).append(sum(turns) / len(turns))
                print(
                    f"round {round_index} {mode:8s} {len(tasks)} tasks x G={args.group_size} in "
                    f"{watch.seconds:6.2f} s = {len(tasks) * args.group_size / watch.seconds:6.2f} "
                    f"rollouts/s (mean turns {sum(turns) / len(turns):.2f})",
                    flush=True,
                )
    return summarize(rows, len(tasks), args)


def summarize(
    rows: dict[str, dict[str, list[float]]], tasks: int, args: argparse.Namespace
) -> dict[str, Any]:
    rollouts = tasks * args.group_size
    plain_s, tempered_s = median_of(rows["plain"]["wall_s"]), median_of(rows["tempered"]["wall_s"])
    server_cpu = median_of(rows["tempered"]["server_cpu_s"])
    return {
        "path": PATH,
        "model": args.model,
        "tasks": tasks,
        "group_size": args.group_size,
        "max_turns": args.max_turns,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "plain_wall_s": round(plain_s, 3),
        "tempered_wall_s": round(tempered_s, 3),
        "plain_rollouts_per_s": round(rollouts / plain_s, 3),
        "tempered_rollouts_per_s": round(rollouts / tempered_s, 3),
        "temporal_share": round(1 - plain_s / tempered_s, 4),
        "target_temporal_share": 0.10,
        "workflows_per_s": round(tasks / tempered_s, 3),
        "server_cpu_s_per_workflow": round(server_cpu / tasks, 4),
        "server_cpu_s_during_plain": round(median_of(rows["plain"]["server_cpu_s"]), 3),
        "worker_process_cpu_s": {
            m: round(median_of(r["worker_cpu_s"]), 2) for m, r in rows.items()
        },
        "mean_turns": {m: round(median_of(r["turns"]), 3) for m, r in rows.items()},
        "wall_s_per_round": {m: [round(x, 3) for x in r["wall_s"]] for m, r in rows.items()},
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16, help="starter tasks per round and mode")
    parser.add_argument("--group-size", type=int, default=4, help="G, samples per task")
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="tasks in flight")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds (order alternates)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--model", default="tiny", help="base model preset (tiny | smollm2)")
    parser.add_argument("--seed", type=int, default=7)
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    with tempfile.TemporaryDirectory(prefix="tempered-bench-") as tmp:
        home = Path(tmp)
        with bench_stack(home, inference=InferenceSettings(base_model=args.model)) as settings:
            report = asyncio.run(measure(settings, args))
    share = report["temporal_share"]
    print(
        f"orchestration: tempered {report['tempered_rollouts_per_s']:.2f} rollouts/s vs plain "
        f"{report['plain_rollouts_per_s']:.2f} rollouts/s -> Temporal share of wall time "
        f"{100 * share:.1f}% (target <= 10%: {'met' if share <= 0.10 else 'NOT met'}; "
        f"tempered side: {PATH}); "
        f"{report['workflows_per_s']:.2f} workflows/s; dev server "
        f"{report['server_cpu_s_per_workflow'] * 1000:.1f} ms CPU per workflow; "
        f"load average {report['machine']['load_average']}",
        flush=True,
    )
    merge_results("orchestration", report)


if __name__ == "__main__":
    main()
