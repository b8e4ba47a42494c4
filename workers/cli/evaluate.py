"""`tempered eval`: pass@1 of a policy through the same pipeline (agent tasks, one greedy turn).

    tempered eval --run RUN --policy 3 --suite starter      # version 3 of a training run
    tempered eval --policy smollm2 --suite humaneval        # a preset or HF dir, published as v0
                                                            # of a fresh run `eval-<timestamp>`

Needs the stack and the workers running (`tempered up`, `tempered worker all`); prints one JSON
line. Before any task starts, bad input (a suite, a version never published, a model that is
not one) exits 2, and a queue no worker polls exits 1, naming it (the tasks waited for it without
a word). Held-out evals during training are the TrainingRunWorkflow's, not this command's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime

from contracts.names import Queue, eval_run_id
from contracts.rollout import AgentTaskResult
from contracts.task import SamplingParams, SandboxLimits, TaskSpec, eval_task_input
from infra.policy import (
    check_base_model,
    materialize_base_model,
    policy_manifest,
    policy_versions,
    publish_policy,
)
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import SUITE_HELP, load_suite
from workers.backlog import queue_backlogs
from workers.cli.errors import describe, positive, run_id
from workers.runtime import connect
from workflows.agent_task import AgentTaskWorkflow

EVAL_QUEUES = frozenset(q.value for q in Queue) - {Queue.LEARNER.value}
"""The queues an evaluation's tasks go through: the workflows', inference, sandbox, rewards."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("eval", help="pass@1 of a policy on a suite")
    parser.add_argument(
        "--policy", required=True, help="version number (with --run), preset or HF dir"
    )
    parser.add_argument("--run", type=run_id, help="training run whose version --policy names")
    parser.add_argument("--suite", default="starter", help=SUITE_HELP)
    parser.add_argument("--split", default="heldout", choices=["heldout", "train", "all"])
    parser.add_argument("--limit", type=positive, help="only the first N tasks")
    parser.add_argument("--max-new-tokens", type=positive, default=256)
    parser.add_argument("--concurrency", type=positive, default=64, help="agent tasks in flight")
    parser.add_argument(
        "--wait-for-workers",
        action="store_true",
        help="start even where no worker polls a queue yet (workers scaled to zero by KEDA)",
    )
    parser.set_defaults(func=eval_cmd)


def eval_cmd(args: argparse.Namespace, settings: Settings) -> int:
    try:
        tasks = _tasks(args)
        store = ObjectStore.from_settings(settings)
        target = _policy(args, store)
    except ValueError as exc:  # bad input: exit 2, as every command's (it was 1)
        return _bad_input(exc)
    if not args.wait_for_workers and (unserved := asyncio.run(_unserved(settings))):
        print(
            f"tempered eval: no worker polls {', '.join(unserved)}, so its tasks would wait "
            "without end; start the workers (`tempered worker all`) and run it again, or pass "
            "--wait-for-workers where they start on demand (KEDA)",
            file=sys.stderr,
        )
        return 1
    if target is None:  # a preset or HF dir: published as version 0 of a fresh run
        run = datetime.now().strftime("eval-%Y%m%d-%H%M%S")
        try:
            base = materialize_base_model(args.policy, settings, store)
        except ValueError as exc:  # e.g. smollm2 without its package, an empty s3:// prefix
            return _bad_input(exc)
        target = run, publish_policy(store, run, 0, base).version
    policy_run, version = target
    results = asyncio.run(_evaluate(settings, args, tasks, policy_run, version))
    solved = sum(r.solved[0] for r in results)
    summary = {
        "suite": args.suite,
        "split": args.split,
        "policy_run": policy_run,
        "policy_version": version,
        "tasks": len(results),
        "solved": solved,
        "pass_at_1": solved / len(results),
    }
    print(json.dumps(summary))
    return 0


def _bad_input(exc: ValueError) -> int:
    print(f"tempered eval: {describe(exc)}", file=sys.stderr)
    return 2


def _tasks(args: argparse.Namespace) -> list[TaskSpec]:
    """The suite's tasks to evaluate; ValueError for a suite that does not load or has none."""
    tasks = load_suite(args.suite, split=None if args.split == "all" else args.split)
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise ValueError(f"suite {args.suite!r} has no {args.split} tasks")
    return tasks


def _policy(args: argparse.Namespace, store: ObjectStore) -> tuple[str, int] | None:
    """(run, version) to sample from, or None for a preset/dir to publish (its form checked).
    ValueError for a version that was never published, before any task starts: the tasks
    waited for it without a word (`inference.policy_wait_s` each) and stayed in Temporal."""
    if not args.policy.isdigit():
        check_base_model(args.policy)
        return None
    if not args.run:
        raise ValueError("--policy VERSION needs --run RUN")
    version = int(args.policy)
    if policy_manifest(store, args.run, version) is None:
        published = [
            v for v in policy_versions(store, args.run) if policy_manifest(store, args.run, v)
        ]
        known = ", ".join(f"v{v}" for v in published) or "none"
        raise ValueError(
            f"run {args.run!r} has no policy version {version} (published: {known}; "
            "`tempered runs show RUN` lists them)"
        )
    return args.run, version


async def _unserved(settings: Settings) -> list[str]:
    """The queues an evaluation needs that no worker polls (`DescribeTaskQueue`'s pollers, as
    `tempered status` shows them): with none, `eval` waited for them without a word."""
    backlogs = await queue_backlogs(await connect(settings))
    return [b.queue for b in backlogs if b.queue in EVAL_QUEUES and not b.pollers]


async def _evaluate(
    settings: Settings, args: argparse.Namespace, tasks: list[TaskSpec], run: str, version: int
) -> list[AgentTaskResult]:
    client = await connect(settings)
    slots = asyncio.Semaphore(args.concurrency)
    eval_run = eval_run_id(run, version, args.suite)
    sampling = SamplingParams(
        temperature=0.0, max_new_tokens=args.max_new_tokens, stop_after_code_block=True
    )

    async def one(task: TaskSpec) -> AgentTaskResult:
        request = eval_task_input(
            task,
            run_id=eval_run,
            policy_run=run,
            policy_version=version,
            sampling=sampling,
            limits=SandboxLimits(),
        )
        async with slots:
            return await client.execute_workflow(
                AgentTaskWorkflow.run,
                request,
                id=f"{eval_run}-{task.id}",
                task_queue=Queue.AGENT_TASKS.value,
            )

    return list(await asyncio.gather(*(one(t) for t in tasks)))
