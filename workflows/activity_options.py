"""Timeouts and retry policies per activity type, in one table, and the work a request adds.

Infrastructure failures retry without limit, with the backoff of `contracts.errors.INFRA_RETRY`:
a rollout waits out a dead worker or a restarting S3 instead of turning the outage into a
reward; but a step of a workspace session (`env_step`, on its worker's own queue) tries
`workflows.sessions.STEP_ATTEMPTS` times, then the workflow moves the session to another worker.
The error types that are never retried come from `contracts.errors.NON_RETRYABLE`.

A start-to-close is the table's allowance plus the `work` of the request at hand: the longest
its own items take run one at a time (`programs_work`: every item of `execute`, `env_step` and
`verify_episodes` waits for one of its worker's `sandbox.concurrency` program slots, so an
attempt takes from ceil(items / concurrency) to `items` program limits: a G = 16 execute at the
1-hour limit takes 2 hours on a worker of 8 slots, a fixed 2-hour start-to-close cut it at every
attempt, and each retry ran every item again, for ever) or the samples it trains on
(`training_work`).
A dead worker is the heartbeat timeout's to find, whatever the start-to-close.

Steps of a workspace session go to the queue of the sandbox worker that holds it (`queue=`)
with a schedule-to-start timeout: a worker that is gone never picks the step up, the timeout
(which Temporal does not retry) ends the activity, and the workflow restores the session
elsewhere. `attempts` bounds the calls a workflow moves past when they fail (closing sessions
and pruning policy versions, best effort; a session's step, restored elsewhere); 0: unlimited.
`within` bounds the whole activity, from its scheduling, all attempts together (its
schedule-to-close, and no start-to-close beyond it): a best-effort call the workflow must not
wait on for long (the close of sessions on a worker that failed their step).
`wait_for_cancel`: a cancelled workflow waits for the activity to stop (it reports the cancel
once its work has ended) instead of moving on while the work runs (the SDK's TRY_CANCEL).

Options are not part of Temporal's determinism check (a command's type and its activity's type
and id are): a workflow replays its history whatever timeouts it was scheduled with.
"""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contracts.episode import EnvStepRequest, VerifyRequest
    from contracts.errors import INFRA_RETRY, NON_RETRYABLE
    from contracts.learner import GRPOConfig, TrajectoryGroup
    from contracts.names import ACTIVITY_QUEUE, Activity
    from contracts.sandbox import ExecuteRequest
    from contracts.task import MAX_CHECK_S

SANDBOX_BACKSTOP = timedelta(hours=2)
"""Start-to-close of `open_sessions`, which waits inside the activity for the sandbox slots
that the activities running model code hold, and the part of theirs beyond their own items'
work (`programs_work`): a backstop only (a dead worker is the heartbeat timeout's to find;
these heartbeat while they wait for a slot). Above the longest program (`SandboxLimits.timeout_s`
≤ 3600 s) plus the wait for a slot on a busy worker: at 20 minutes an item allowed an hour never
finished, and a loaded worker's queued items all timed out together and started over; at 10
minutes an open behind them timed out, closed what it had opened and went to the back of the
queue, again."""

ITEM_OVERHEAD = timedelta(minutes=1)
"""What an item of a sandbox activity takes beyond its program's limit: reading its input,
starting its sandbox, storing its result (and a session's snapshot)."""

LONGEST_CHECK = timedelta(seconds=MAX_CHECK_S)
"""The longest a workspace task's check may run (`contracts.task.MAX_CHECK_S`). A
verify's item may run under its check's timeout instead of the run's limits
(`checks.check_limits`), and the check is read from the hidden tests in the store, which the
workflow never sees: every verified item is allowed the longest."""

TRAIN_SAMPLE = timedelta(minutes=1)
"""A `train_step`'s allowance per sample (trajectory) and epoch beyond `TRAIN_STEP`'s: a forward
and backward of one sample took 0.4 s on 2 CPU cores (SmolLM2-135M, bench/learner.py), so only
a step that no longer advances (its thread hung: the heartbeats come from the event loop and
go on) reaches it."""

_START_TO_CLOSE: dict[Activity, timedelta] = {
    Activity.GENERATE: timedelta(minutes=20),
    Activity.EXECUTE: SANDBOX_BACKSTOP,
    Activity.WRITE_TRAJECTORIES: timedelta(minutes=5),
    Activity.LOAD_TASKS: timedelta(minutes=5),
    Activity.PREPARE_RUN: timedelta(minutes=30),
    Activity.TRAIN_STEP: timedelta(minutes=60),  # load a version, read the groups, publish
    Activity.STORE_STEP_GROUPS: timedelta(minutes=2),
    Activity.LOAD_STEP_GROUPS: timedelta(minutes=2),
    Activity.RECORD_LEDGER: timedelta(minutes=2),
    Activity.FIND_CONSUMED: timedelta(minutes=2),
    Activity.OPEN_SESSIONS: SANDBOX_BACKSTOP,
    Activity.ENV_STEP: SANDBOX_BACKSTOP,
    Activity.VERIFY_EPISODES: SANDBOX_BACKSTOP,
    Activity.CLOSE_SESSIONS: timedelta(minutes=2),
    Activity.PRUNE_POLICIES: timedelta(minutes=5),
}

START_TO_CLOSE_FAILS = "TemporalTimeout:StartToClose"
"""The retry policy's name of a start-to-close timeout (the server's `TimeoutFailureTypePrefix`
and the timeout type), listed as non-retryable for the activities of `_TIMEOUT_ENDS`."""

_TIMEOUT_ENDS = frozenset({Activity.TRAIN_STEP})
"""Activities whose start-to-close timeout is not retried: a `train_step` that reaches it did
not advance for far longer than its samples take (`TRAIN_SAMPLE`); another attempt would start
the step over and time out again, for ever, so the learner fails and the run says why. A dead
learner is still retried: its heartbeat timeout is."""


def programs_work(request: ExecuteRequest | EnvStepRequest | VerifyRequest) -> timedelta:
    """The longest `request`'s items take run one at a time, each under its program's limit
    (`limits.timeout_s`; a verify's under `LONGEST_CHECK`, and one item more: the task's
    untouched tree, graded beside them where none of them is it)."""
    limit, items = timedelta(seconds=request.limits.timeout_s), len(request.items)
    if isinstance(request, VerifyRequest):
        limit, items = max(limit, LONGEST_CHECK), items + 1
    return items * (limit + ITEM_OVERHEAD)


def training_work(groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> timedelta:
    """A `train_step`'s allowance for its samples: `TRAIN_SAMPLE` per sample and epoch."""
    samples = sum(len(group.trajectories) for group in groups)
    return samples * config.epochs * TRAIN_SAMPLE


def activity_options(
    activity: Activity,
    heartbeat_timeout_s: float,
    *,
    queue: str | None = None,
    schedule_to_start_s: float | None = None,
    attempts: int = 0,
    wait_for_cancel: bool = False,
    work: timedelta = timedelta(0),
    within: timedelta | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `workflow.execute_activity` of `activity` (on `queue` if given);
    `work`: what the request adds to the table's start-to-close (`programs_work` of an
    `execute`, `env_step` or `verify_episodes`, `training_work` of a `train_step`); `within`:
    the most the activity takes from its scheduling, all attempts together."""
    non_retryable = list(NON_RETRYABLE)
    if activity in _TIMEOUT_ENDS:
        non_retryable.append(START_TO_CLOSE_FAILS)
    start_to_close = _START_TO_CLOSE[activity] + work
    options: dict[str, Any] = {
        "task_queue": queue or ACTIVITY_QUEUE[activity].value,
        "start_to_close_timeout": start_to_close if within is None else min(start_to_close, within),
        "heartbeat_timeout": timedelta(seconds=heartbeat_timeout_s),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=INFRA_RETRY.initial_s),
            backoff_coefficient=INFRA_RETRY.coefficient,
            maximum_interval=timedelta(seconds=INFRA_RETRY.max_s),
            maximum_attempts=attempts,
            non_retryable_error_types=non_retryable,
        ),
    }
    if wait_for_cancel:
        options["cancellation_type"] = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
    if schedule_to_start_s is not None:
        options["schedule_to_start_timeout"] = timedelta(seconds=schedule_to_start_s)
    if within is not None:
        options["schedule_to_close_timeout"] = within
    return options
