"""`tempered eval`: pass@1 of a policy through the same pipeline (agent tasks, one greedy turn).

    tempered eval --run RUN --policy 3 --suite starter      # version 3 of a training run
    tempered eval --policy smollm2 --suite humaneval        # a preset or HF dir, published as v0
                                                            # of a fresh run `eval-<timestamp>`

Needs the stack and the workers running (`tempered up`, `tempered worker all`); prints one JSON
line. A version that was never published is refused before any task starts. Held-out evals
during training are the TrainingRunWorkflow's, not this command's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime

from contracts.names import Queue, eval_run_id
from contracts.rollout import AgentTaskResult
from contracts.task import SamplingParams, SandboxLimits, TaskSpec, eval_task_input
from infra.policy import materialize_base_model, policy_manifest, policy_versions, publish_policy
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import SUITE_HELP, load_suite
from workers.cli.errors import positive, run_id
from workers.runtime import connect
from workflows.agent_task import AgentTaskWorkflow


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
    parser.set_defaults(func=eval_cmd)


def eval_cmd(args: argparse.Namespace, settings: Settings) -> int:
    tasks = load_suite(args.suite, split=None if args.split == "all" else args.split)
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise ValueError(f"suite {args.suite!r} has no {args.split} tasks")
    policy_run, version = _policy(args, settings)
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


def _policy(args: argparse.Namespace, settings: Settings) -> tuple[str, int]:
    """(run, version) to sample from; a preset/dir is published as version 0 of a new run.
    ValueError for a version that was never published, before any task starts: the tasks
    waited for it without a word (`inference.policy_wait_s` each) and stayed in Temporal."""
    if args.policy.isdigit() and not args.run:
        raise ValueError("--policy VERSION needs --run RUN")
    store = ObjectStore.from_settings(settings)
    if args.policy.isdigit():
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
    run = datetime.now().strftime("eval-%Y%m%d-%H%M%S")
    publish_policy(store, run, 0, materialize_base_model(args.policy, settings, store))
    return run, 0


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
