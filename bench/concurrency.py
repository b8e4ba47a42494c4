"""How many agent tasks the embedded dev server holds in flight at once, and what each costs.

    .venv/bin/python bench/concurrency.py [--levels 1000,10000] [--start-concurrency 50]
        [--out FILE]

One private stack (`tempered up` on free ports: the Temporal dev server on WAL SQLite), the
production agent-tasks worker (`workers.runtime.build_worker`: the real AgentTaskWorkflow,
versioned as `tempered worker` runs it) and, in this process, scripted activity workers: a
model that answers once released, a trivial sandbox (every program passes) and a trajectory
writer that stores nothing. For each level N:

  fill    start N AgentTaskWorkflows (G = 1, one turn), `--start-concurrency` starts at a
          time; every one then waits in its GENERATE activity, held until all N are in flight
  hold    N tasks in flight: the worker process's memory is measured
  drain   release the model: each task executes, scores and writes, and completes

Reported per level (a table, and merged into bench/results.json under "concurrency"): start
rate, completion rate, schedule-to-start p50/p99 of the activities (GENERATE during the fill,
EXECUTE and WRITE during the drain), the dev server's CPU per task (fill and drain), and this
process's resident memory per 1,000 tasks in flight (workers, client, bench bookkeeping), and how
each grows from the first level to the last. The activity workers are scripted so that what is
measured is Temporal and the workflow worker, not a model or a sandbox. Percentiles are
nearest-rank (`common.percentile`: p99 of 100 latencies is the 99th; until 6 December it was
the largest, and of 1,000 the 991st). It refuses a busy machine (`common.require_idle`, and
after each level if other processes took the cores; `--allow-busy` measures anyway, marked
`busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from common import (
    add_busy_flag,
    bench_stack,
    cpu_seconds,
    idle_side,
    machine,
    merge_results,
    percentile,
    require_idle,
    temporal_pid,
)
from temporalio import activity
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from activities.heartbeat import heartbeating
from contracts.common import ObjectRef
from contracts.names import Activity, Queue, Workflow
from contracts.rollout import (
    AgentTaskResult,
    Completion,
    GenerateRequest,
    GenerateResponse,
    WriteTrajectoriesRequest,
    WriteTrajectoriesResponse,
)
from contracts.sandbox import ExecStatus, ExecuteOutcome, ExecuteRequest, ExecuteResponse
from contracts.task import AgentTaskInput, TaskSpec
from infra.settings import Settings
from workflows.search import task_start_options

REF = ObjectRef(key="bench/none", size=1, sha256="0" * 64)
HEARTBEAT_TIMEOUT_S = 120.0
"""A held GENERATE heartbeats (the SDK sends one per 0.8 × this at most); an activity task the
server handed to a poll that had just given up is retried after this, not after 20 minutes."""
TRANSIENT = {
    RPCStatusCode.NOT_FOUND,  # "Namespace default is not found": a busy dev server's cache
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.CANCELLED,
}
"""What a dev server under a burst of starts answers now and then; a start retries them."""
TASK = TaskSpec(
    id="t",
    prompt="Write f() returning 1.",
    entry_point="f",
    tests="def check(candidate):\n    assert candidate() == 1\n",
)


class Scripted:
    """The activity side: a held model, a sandbox where all passes, a writer that stores nothing.
    Each records its attempts' schedule-to-start latency."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0
        self.latency: dict[str, list[float]] = {"generate": [], "execute": [], "write": []}

    def _started(self, name: str) -> None:
        info = activity.info()
        scheduled = info.current_attempt_scheduled_time.timestamp()
        self.latency[name].append(max(time.time() - scheduled, 0.0))

    @activity.defn(name=Activity.GENERATE.value)
    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        self._started("generate")
        self.waiting += 1
        await heartbeating(self.release.wait())  # held until all started
        completions = [
            Completion(sample=i.sample, completion=REF, code=REF, num_tokens=1)
            for i in request.items
        ]
        return GenerateResponse(policy_version=0, completions=completions)

    @activity.defn(name=Activity.EXECUTE.value)
    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        self._started("execute")
        outcomes = [
            ExecuteOutcome(
                sample=i.sample, status=ExecStatus.PASSED, tests_passed=1, tests_total=1, result=REF
            )
            for i in request.items
        ]
        return ExecuteResponse(outcomes=outcomes)

    @activity.defn(name=Activity.WRITE_TRAJECTORIES.value)
    async def write(self, request: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        self._started("write")
        return WriteTrajectoriesResponse(trajectories=[REF] * request.group_size, created=0)


async def level(
    client: Client, settings: Settings, n: int, start_concurrency: int
) -> dict[str, Any]:
    from workers.runtime import build_worker

    scripted = Scripted()
    server = temporal_pid(settings)
    process = psutil.Process()
    agent_tasks, _ = await build_worker(client, Queue.AGENT_TASKS, settings)
    workers = [
        agent_tasks,
        Worker(
            client,
            task_queue=Queue.INFERENCE.value,
            activities=[scripted.generate],
            max_concurrent_activities=n + 100,
        ),
        Worker(
            client,
            task_queue=Queue.SANDBOX.value,
            activities=[scripted.execute],
            max_concurrent_activities=1000,
        ),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[scripted.write],
            max_concurrent_activities=1000,
        ),
    ]
    run_id = f"conc-{n}-{uuid.uuid4().hex[:6]}"
    task_input = AgentTaskInput(
        task=TASK, run_id=run_id, group_size=1, max_turns=1, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S
    )
    async with workers[0], workers[1], workers[2], workers[3]:
        rss_before = process.memory_info().rss  # workers up, nothing in flight
        slots = asyncio.Semaphore(start_concurrency)

        async def start(i: int) -> None:
            async with slots:
                async for attempt in retrying():
                    with attempt, contextlib.suppress(WorkflowAlreadyStartedError):
                        await client.start_workflow(  # an earlier attempt may have started it
                            Workflow.AGENT_TASK.value,
                            task_input,
                            id=f"{run_id}-{i}",
                            task_queue=Queue.AGENT_TASKS.value,
                            result_type=AgentTaskResult,
                            **task_start_options(task_input),  # as the training run starts them
                        )

        cpu0, began = cpu_seconds(server), time.perf_counter()
        await asyncio.gather(*(start(i) for i in range(n)))
        started_s = time.perf_counter() - began
        while scripted.waiting < n:
            await asyncio.sleep(0.2)
        filled_s = time.perf_counter() - began
        fill_cpu = cpu_seconds(server) - cpu0
        rss_in_flight = process.memory_info().rss
        cpu1, released = cpu_seconds(server), time.perf_counter()
        scripted.release.set()
        await all_closed(client, run_id)
        drain_s = time.perf_counter() - released
        drain_cpu = cpu_seconds(server) - cpu1
    drain_latency = scripted.latency["execute"] + scripted.latency["write"]
    return {
        "in_flight": n,
        "start_per_s": round(n / started_s, 1),
        "fill_s": round(filled_s, 1),
        "completion_per_s": round(n / drain_s, 1),
        "schedule_to_start_fill_ms": {
            "p50": round(1000 * percentile(scripted.latency["generate"], 0.5), 1),
            "p99": round(1000 * percentile(scripted.latency["generate"], 0.99), 1),
        },
        "schedule_to_start_drain_ms": {
            "p50": round(1000 * percentile(drain_latency, 0.5), 1),
            "p99": round(1000 * percentile(drain_latency, 0.99), 1),
        },
        "server_cpu_ms_per_task": {
            "fill": round(1000 * fill_cpu / n, 2),
            "drain": round(1000 * drain_cpu / n, 2),
            "total": round(1000 * (fill_cpu + drain_cpu) / n, 2),
        },
        "worker_mb_per_1000_in_flight": round((rss_in_flight - rss_before) / 2**20 / (n / 1000), 1),
        "worker_rss_mb_in_flight": round(rss_in_flight / 2**20, 1),
    }


def retrying() -> AsyncRetrying:
    """Retries of one call to a busy dev server: transient answers only, for a minute."""
    return AsyncRetrying(
        retry=retry_if_exception(lambda e: isinstance(e, RPCError) and e.status in TRANSIENT),
        wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
        stop=stop_after_delay(60),
        reraise=True,
    )


async def namespace_ready(client: Client) -> None:
    """Wait until the server serves the client's namespace (a fresh dev server takes a moment)."""
    async for attempt in retrying():
        with attempt:
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=client.namespace)
            )


async def all_closed(client: Client, run_id: str) -> None:
    """Wait until no workflow of `run_id` runs (one visibility count a second, not N polls)."""
    query = f'TemperedRunId = "{run_id}" AND ExecutionStatus = "Running"'
    while True:
        async for attempt in retrying():
            with attempt:
                running = (await client.count_workflows(query)).count
        if not running:
            return
        await asyncio.sleep(1.0)


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'in flight':>9} {'start/s':>8} {'done/s':>8} {'s2s p50':>8} {'s2s p99':>8} "
        f"{'drain p99':>9} {'srv ms/task':>11} {'MB/1k':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['in_flight']:>9} {r['start_per_s']:>8} {r['completion_per_s']:>8} "
            f"{r['schedule_to_start_fill_ms']['p50']:>8} {r['schedule_to_start_fill_ms']['p99']:>8} "
            f"{r['schedule_to_start_drain_ms']['p99']:>9} "
            f"{r['server_cpu_ms_per_task']['total']:>11} {r['worker_mb_per_1000_in_flight']:>7}"
        )
    return "\n".join(lines)


def growth(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Last level's figure over the first's, per figure (1.0: flat)."""
    first, last = rows[0], rows[-1]

    def ratio(get: Any) -> float:
        a, b = get(first), get(last)
        return round(b / a, 2) if a else float("nan")

    return {
        "start_per_s": ratio(lambda r: r["start_per_s"]),
        "completion_per_s": ratio(lambda r: r["completion_per_s"]),
        "schedule_to_start_p50": ratio(lambda r: r["schedule_to_start_fill_ms"]["p50"]),
        "schedule_to_start_p99": ratio(lambda r: r["schedule_to_start_fill_ms"]["p99"]),
        "server_cpu_ms_per_task": ratio(lambda r: r["server_cpu_ms_per_task"]["total"]),
        "worker_mb_per_1000_in_flight": ratio(lambda r: r["worker_mb_per_1000_in_flight"]),
    }


async def measure(settings: Settings, levels: list[int], start_concurrency: int) -> dict[str, Any]:
    from workers.runtime import connect

    client = await connect(settings)
    await namespace_ready(client)
    rows = []
    for n in levels:
        with idle_side(f"{n} in flight"):
            row = await level(client, settings, n, start_concurrency)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    return {"levels": rows, "growth": growth(rows), "machine": machine()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1000,10000", help="tasks in flight, comma-separated")
    parser.add_argument("--start-concurrency", type=int, default=50)
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    levels = [int(x) for x in args.levels.split(",")]
    with (
        tempfile.TemporaryDirectory(prefix="tempered-bench-") as tmp,
        bench_stack(Path(tmp)) as settings,
    ):
        report = asyncio.run(measure(settings, levels, args.start_concurrency))
    print(table(report["levels"]))
    print(f"growth {levels[0]} -> {levels[-1]} (last / first): {report['growth']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    merge_results("concurrency", report)


if __name__ == "__main__":
    main()
