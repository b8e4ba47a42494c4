"""`tempered eval`: pass@1 of a policy through the same pipeline (agent tasks, greedy turns).

    tempered eval --run RUN --policy 3                      # version 3 of a training run, as the
                                                            # run's own held-out evals measure it
    tempered eval --policy smollm2 --suite humaneval        # a preset or HF dir, published as v0
                                                            # of `eval-base-<content digest>`

With `--run`, the settings are the run's (its input, `runs/<run>/run.json`): `eval_sampling`,
`max_context_tokens`, `eval_turns`, sandbox limits, and its suite; each one given on the command
line wins. Without a run (or one without run.json) they are this command's own: greedy, 256 new
tokens, a 4096-token context, one turn. The settings used go to stderr. `--run` with a preset or
dir is refused (it was ignored, settings and held-out set, even a run never made): the baseline
under a run's settings is its version 0, `--run RUN --policy 0`.

The tasks of a run's version are the held-out tasks its run.json records (`HeldoutSet`, by id
and digest), so the figures are those of the run's held-out evaluation of that version: a
task quarantined or a held-out set rewritten since does not change them. Where one of those
tasks is gone from the suite or changed since, the command exits 2 before any task starts,
naming them; `--current-tasks` evaluates the suite's held-out tasks as they are today instead
(quarantined ones left out, `spread` to the run's `heldout_limit`), as does a run.json of an
earlier build, which records none (one line says so). `--limit N`, another `--split` or
another `--suite` evaluate today's list too: N tasks spread over it (`spread`, every family
kept), all of them without `--limit` (`eval_tasks.py`).

Each evaluation has a run of its own, `<run>-eval-v<N>--<suite>-<settings digest>-<nonce>`: the
inference activity hands back a turn stored under the same run id and task whenever its prompt
matches, so a shared id gave a rerun with other settings the earlier completions. The same
settings get a fresh id too: the sandbox results of a rerun never match the stored trajectories
byte for byte (attempt keys, timings), so a shared id failed its writes (`StoredConflict`).

Needs the stack and the workers running (`tempered up`, `tempered worker all`); prints one JSON
line: `solved` counts the tasks solved within its `turns` (`solve_rate`), `solved_at_turn_1`
those at the first (`pass_at_1`). Before any task starts, bad input (a suite, a version never
published, a model that is not one, sampling that does not fit the suite's tasks:
`sampling_misfit`, as `train` refuses it) exits 2, and a queue no worker polls exits 1, naming
it (the tasks waited for it without a word). Nothing is written before all of that passed; then
a workspace suite's trees of the tasks taken are put in the store, as a run's `load_tasks` puts
them (`eval_tasks.store_trees`).
A task whose workflow fails exits 1, naming it, once the other tasks started are cancelled in
Temporal (`eval_workflows.py`); Ctrl-C exits 130 once every task started is (they waited for a
model there, for ever where no worker served them); any other error (Temporal lost) exits 1
once every task started is cancelled. Held-out evals during training are the
TrainingRunWorkflow's, not this command's.

A run that still trains with `keep_versions` deletes its old versions as it goes, and knows
only the evaluations it started: while this command evaluates version N of it, a marker in the
store keeps N (`infra.retention.reading`, refreshed as it runs, marked ended when it ends). A
version deleted between the first look and the marker exits 2 before any task starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import secrets
import sys

from contracts.common import is_identifier
from contracts.evaluation import EvalResult
from contracts.names import eval_run_id
from contracts.rollout import AgentTaskResult
from contracts.run import RunRecord, TrainingRunInput
from contracts.task import SamplingParams, TaskSpec
from infra.base_models import check_base_model, materialize_base_model
from infra.policy import (
    file_digests,
    policy_digest,
    policy_manifest,
    policy_versions,
    publish_policy,
)
from infra.retention import reading
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import SUITE_HELP
from workers.cli.errors import describe, positive, run_id
from workers.cli.eval_tasks import recorded_tasks, store_trees, suite_tasks
from workers.cli.eval_workflows import TaskFailed, evaluate, unserved_queues
from workers.cli.runs import require_run, run_record
from workers.cli.train_inputs import sampling_misfit

OWN_SETTINGS = TrainingRunInput(
    run_id="eval",
    eval_sampling=SamplingParams(temperature=0.0, max_new_tokens=256, stop_after_code_block=True),
    eval_max_turns=1,
    max_context_tokens=4096,
)
"""The evaluation settings of a policy that is not a run's version (or of a run without
run.json), as the run input whose `eval_input` builds each task's input."""


class Collision(Exception):
    """The base run's version 0 holds other weights than the ones this eval published."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("eval", help="pass@1 of a policy on a suite")
    parser.add_argument(
        "--policy", required=True, help="version number (with --run), preset or HF dir"
    )
    parser.add_argument(
        "--run",
        type=run_id,
        help="training run whose version --policy names (and its settings); not with a model",
    )
    parser.add_argument("--suite", help=f"{SUITE_HELP} (default: the run's, else starter)")
    parser.add_argument("--split", default="heldout", choices=["heldout", "train", "all"])
    parser.add_argument(
        "--limit", type=positive, help="N tasks spread over the suite (default: the run's)"
    )
    parser.add_argument(
        "--current-tasks",
        action="store_true",
        help="with --run: the suite's held-out tasks as they are today, not the ones the run "
        "recorded (spread to its heldout_limit)",
    )
    parser.add_argument("--max-new-tokens", type=positive, help="default: the run's, else 256")
    parser.add_argument("--max-turns", type=positive, help="default: the run's, else 1")
    parser.add_argument("--max-context-tokens", type=positive, help="default: the run's, else 4096")
    parser.add_argument("--concurrency", type=positive, default=64, help="agent tasks in flight")
    parser.add_argument(
        "--wait-for-workers",
        action="store_true",
        help="start even where no worker polls a queue yet (workers scaled to zero by KEDA)",
    )
    parser.set_defaults(func=eval_cmd)


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", re.ASCII | re.IGNORECASE)
"""A `--policy` spelt as a number (`-1`, `1.5`, `2e3`): with `--run`, a version that is not a
whole number 0 or more, refused as such (it was taken for a model's name)."""
BASE_RUN = "eval-base-"
"""A preset or dir is published as version 0 of the run its content names (`BASE_RUN` and its
`policy_digest`): an eval of the same weights again publishes nothing (each eval of a 517 MB
model left a copy in a run of its own), and evals of other weights never share a run."""


def eval_cmd(args: argparse.Namespace, settings: Settings) -> int:
    try:
        store = ObjectStore.from_settings(settings)
        target = _policy(args, store)
        policy_run, version = target or (BASE_RUN + "0" * 16, 0)  # named once it is built
        record = run_record(store, args.run) if target else None
        spec, source = _spec(args, record, policy_run, recorded=target is not None)
        tasks, chosen = _tasks(args, spec, settings, record)
        _check_fit(args, spec, tasks, record)
        eval_run = _eval_run(policy_run, version, spec)
    except ValueError as exc:  # bad input: exit 2, as every command's (it was 1)
        return _bad_input(exc)
    if not args.wait_for_workers and (unserved := asyncio.run(unserved_queues(settings))):
        print(
            f"tempered eval: no worker polls {', '.join(unserved)}, so its tasks would wait "
            "without end; start the workers (`tempered worker all`) and run it again, or pass "
            "--wait-for-workers where they start on demand (KEDA)",
            file=sys.stderr,
        )
        return 1
    if target is None:  # a preset or HF dir: version 0 of the run its content names
        try:
            policy_run = _publish(args.policy, settings, store)
        except ValueError as exc:  # e.g. smollm2 without its package, an empty s3:// prefix
            return _bad_input(exc)
        except Collision as exc:
            print(f"tempered eval: {exc}", file=sys.stderr)
            return 1
        spec = spec.model_copy(update={"run_id": policy_run})
        eval_run = _eval_run(policy_run, version, spec)  # as long as the one checked above
    sampling = spec.eval_sampling
    print(
        f"tempered eval: {source}: temperature {sampling.temperature}, max_new_tokens "
        f"{sampling.max_new_tokens}, max_context_tokens {spec.max_context_tokens}, turns "
        f"{spec.eval_turns}; {chosen}",
        file=sys.stderr,
    )
    # a training run's prunes keep the version while it is marked; 0 of a base run never goes
    marked = reading(store, policy_run, version, eval_run) if target else contextlib.nullcontext()
    with marked:
        if target is not None and policy_manifest(store, policy_run, version) is None:
            return _bad_input(
                ValueError(
                    f"run {policy_run!r} has no policy version {version} any more: the run's "
                    "prunes (keep_versions) deleted it since this command found it; evaluate a "
                    "newer one (`tempered runs show RUN` lists them)"
                )
            )
        try:  # only now: refused input wrote nothing
            store_trees(spec.suite, tasks, store)
        except ValueError as exc:  # a task changed since it was loaded
            return _bad_input(exc)
        try:
            results = asyncio.run(_evaluate(settings, args, spec, tasks, eval_run, version))
        except TaskFailed as exc:
            print(f"tempered eval: {exc}", file=sys.stderr)
            return 1
    result = EvalResult.of(version, results, spec.eval_turns, tasks)
    summary = {
        "suite": spec.suite,
        "split": args.split,
        "policy_run": policy_run,
        "policy_version": version,
        "eval_run": eval_run,
        "tasks": result.tasks,
        "solved": round((result.solve_rate or 0.0) * result.tasks),  # within `turns` turns
        "solved_at_turn_1": round(result.pass_at_1 * result.tasks),
        "pass_at_1": result.pass_at_1,
        "solve_rate": result.solve_rate,
        "turns": result.turns,
        "max_new_tokens": sampling.max_new_tokens,
        "max_context_tokens": spec.max_context_tokens,
    }
    print(json.dumps(summary))
    return 0


def _bad_input(exc: ValueError) -> int:
    print(f"tempered eval: {describe(exc)}", file=sys.stderr)
    return 2


def _check_fit(
    args: argparse.Namespace,
    spec: TrainingRunInput,
    tasks: list[TaskSpec],
    record: RunRecord | None,
) -> None:
    """ValueError where the evaluation's sampling does not fit its tasks (`sampling_misfit`, as
    `train` refuses it): a run's tool-call turns on code tasks failed at their first generate,
    and code-block turns on workspace tasks made no tool call (pass@1 about 0, without a word)."""
    if record is not None:
        whose = f"run {args.run!r}'s"
        way_out = "evaluate it on a suite of the env it was trained for"
    else:
        whose = "tempered eval's own"
        way_out = (
            "evaluate the model under the settings of a run made for them, "
            "`tempered eval --run RUN --policy 0` (the run's base model)"
        )
    problem = sampling_misfit(
        spec.eval_sampling, "eval_sampling", spec.suite, tasks, whose=whose, way_out=way_out
    )
    if problem:
        raise ValueError(problem)


def settings_digest(spec: TrainingRunInput) -> str:
    """8 hex digits of what decides an evaluation's turns: sampling, turns, context, limits
    (in its run id: evaluations with the same digest measured the same way)."""
    chosen = {
        "sampling": spec.eval_sampling.model_dump(mode="json"),
        "turns": spec.eval_turns,
        "context": spec.max_context_tokens,
        "limits": spec.limits.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:8]


def _eval_run(policy_run: str, version: int, spec: TrainingRunInput) -> str:
    """This evaluation's run id (`eval_run_id`): the settings' digest and a nonce of its own.
    ValueError where it is not an id (a run id near the 128-character limit)."""
    tag = f"{settings_digest(spec)}-{secrets.token_hex(3)}"
    eval_run = eval_run_id(policy_run, version, spec.suite, tag)
    if not is_identifier(eval_run):
        raise ValueError(
            f"the evaluation's run id {eval_run!r} is not one (at most 128 characters); "
            "evaluate a run with a shorter id"
        )
    return eval_run


def _spec(
    args: argparse.Namespace, record: RunRecord | None, policy_run: str, recorded: bool
) -> tuple[TrainingRunInput, str]:
    """The evaluation's settings, as a run input (`eval_input` builds each task's from it), and
    a line saying where they come from (`record`: the run's run.json, if `recorded`). ValueError
    for a setting out of bounds."""
    if record is not None:
        source = f"settings of run {args.run!r} (its run.json)"
    else:
        lacking = f" (run {args.run!r} has no run.json)" if recorded else ""
        source = f"tempered eval's own settings{lacking}"
    base = record or OWN_SETTINGS
    data = base.model_dump(exclude={"heldout"}) | {"run_id": policy_run, "resume": None}
    data["suite"] = args.suite or base.suite
    given = {
        "--max-new-tokens": args.max_new_tokens,
        "--max-turns": args.max_turns,
        "--max-context-tokens": args.max_context_tokens,
        "--limit": args.limit,
    }
    if args.max_new_tokens is not None:
        data["eval_sampling"]["max_new_tokens"] = args.max_new_tokens
    if args.max_turns is not None:
        data["eval_max_turns"] = args.max_turns
    if args.max_context_tokens is not None:
        data["max_context_tokens"] = args.max_context_tokens
    data["heldout_limit"] = args.limit or 0
    if record is not None and _runs_own(args, data["suite"], record):
        data["heldout_limit"] = record.heldout_limit  # the run's own held-out tasks
    named = [flag for flag, value in given.items() if value is not None]
    if named:
        source += f"; {', '.join(named)} from the command line"
    return TrainingRunInput.model_validate(data), source


def _runs_own(args: argparse.Namespace, suite: str, record: RunRecord) -> bool:
    """Whether the eval's tasks are the held-out set of the run `record` is of: the run's suite,
    its held-out split, no `--limit`."""
    return args.limit is None and (suite, args.split) == (record.suite, "heldout")


def _tasks(
    args: argparse.Namespace, spec: TrainingRunInput, settings: Settings, record: RunRecord | None
) -> tuple[list[TaskSpec], str]:
    """The tasks to evaluate (`eval_tasks.py`) and a phrase saying which: the held-out set the
    run recorded, unless `--current-tasks` or a run.json that records none (a line says so)
    rebuilds it from today's suite. ValueError where the tasks cannot be had."""
    if args.current_tasks and not args.run:
        raise ValueError("--current-tasks needs --run RUN (without a run the tasks are today's)")
    if record is not None and _runs_own(args, spec.suite, record) and not args.current_tasks:
        if record.heldout is not None:
            return recorded_tasks(args.run, spec.suite, record.heldout, settings)
        print(
            f"tempered eval: run {args.run!r} recorded no held-out task ids (its run.json is "
            f"from an earlier build): its held-out set is rebuilt from suite {spec.suite!r} and "
            "its quarantine list as they are today",
            file=sys.stderr,
        )
    return suite_tasks(spec.suite, args.split, spec.heldout_limit, settings)


def _policy(args: argparse.Namespace, store: ObjectStore) -> tuple[str, int] | None:
    """(run, version) to sample from, or None for a preset/dir to publish (its form checked).
    ValueError for a run that does not exist (`require_run`) or a version it never published,
    before any task starts: the tasks
    waited for it without a word (`inference.policy_wait_s` each) and stayed in Temporal; and
    for a preset/dir with `--run`, which ignored the run (a baseline under a run's settings is
    its version 0: `--run RUN --policy 0`)."""
    if not (args.policy.isascii() and args.policy.isdigit()):
        if args.run and NUMBER.fullmatch(args.policy):  # -1, 1.5: meant as a version
            raise ValueError(f"--policy VERSION: a whole number, 0 or more, not {args.policy!r}")
        if args.run:  # it was ignored: its settings, its held-out set, even a run never made
            raise ValueError(
                f"--run names a run whose version to evaluate (--policy N; its base model is "
                f"--policy 0); --policy {args.policy} is a model (a preset, a directory or an "
                "s3:// prefix), evaluated under this command's own settings: leave --run out"
            )
        check_base_model(args.policy)
        return None
    if not args.run:
        raise ValueError("--policy VERSION needs --run RUN")
    require_run(store, args.run)  # as `runs show` and `regrade`: not "no version N" of no run
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


def _publish(model: str, settings: Settings, store: ObjectStore) -> str:
    """Publish the preset or dir `model` as version 0 of the run its content names (a no-op
    when it is there); that run. Collision where version 0 holds other files than these."""
    local = materialize_base_model(model, settings, store)
    digests = file_digests(local)  # once: the run's name and the upload both use them
    digest = policy_digest(digests)
    run = BASE_RUN + digest
    policy = publish_policy(store, run, 0, local, digests=digests)
    if not policy.prefix.endswith(f"/{digest}/"):
        raise Collision(
            f"run {run!r} already has a version 0 of other weights (s3://{store.bucket}/"
            f"{policy.prefix}); nothing was evaluated"
        )
    return run


async def _evaluate(
    settings: Settings,
    args: argparse.Namespace,
    spec: TrainingRunInput,
    tasks: list[TaskSpec],
    eval_run: str,
    version: int,
) -> list[AgentTaskResult]:
    """The tasks' results, `--concurrency` at a time (`eval_workflows.evaluate`); TaskFailed
    at the first that fails, the others cancelled."""
    return await evaluate(settings, spec, tasks, eval_run, version, args.concurrency)
