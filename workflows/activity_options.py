"""Timeouts and retry policies per activity type, in one table.

Infrastructure failures retry without limit, with the backoff of `contracts.errors.INFRA_RETRY`:
a rollout waits out a dead worker or a restarting S3 instead of turning the outage into a
reward; but a step of a workspace session (`env_step`, on its worker's own queue) tries
`workflows.sessions.STEP_ATTEMPTS` times, then the workflow moves the session to another worker.
The error types that are never retried come from `contracts.errors.NON_RETRYABLE`.

Steps of a workspace session go to the queue of the sandbox worker that holds it (`queue=`)
with a schedule-to-start timeout: a worker that is gone never picks the step up, the timeout
(which Temporal does not retry) ends the activity, and the workflow restores the session
elsewhere. `attempts` bounds the calls a workflow moves past when they fail (closing sessions
and pruning policy versions, best effort; a session's step, restored elsewhere); 0: unlimited.
`wait_for_cancel`: a cancelled workflow waits for the activity to stop (it reports the cancel
once its work has ended) instead of moving on while the work runs (the SDK's TRY_CANCEL).
"""

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contracts.errors import INFRA_RETRY, NON_RETRYABLE
    from contracts.names import ACTIVITY_QUEUE, Activity

SANDBOX_BACKSTOP = timedelta(hours=2)
"""Start-to-close of the activities that run model code, and of `open_sessions`, which waits
inside the activity for the sandbox slots they hold: a backstop only (a dead worker is the
heartbeat timeout's to find; these heartbeat while they wait for a slot). Above the longest
program (`SandboxLimits.timeout_s` ≤ 3600 s) plus the wait for a slot on a busy worker: at 20
minutes an item allowed an hour never finished, and a loaded worker's queued items all timed
out together and started over; at 10 minutes an open behind them timed out, closed what it had
opened and went to the back of the queue, again."""

_START_TO_CLOSE: dict[Activity, timedelta] = {
    Activity.GENERATE: timedelta(minutes=20),
    Activity.EXECUTE: SANDBOX_BACKSTOP,
    Activity.WRITE_TRAJECTORIES: timedelta(minutes=5),
    Activity.LOAD_TASKS: timedelta(minutes=5),
    Activity.PREPARE_RUN: timedelta(minutes=30),
    Activity.TRAIN_STEP: timedelta(minutes=60),
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


def activity_options(
    activity: Activity,
    heartbeat_timeout_s: float,
    *,
    queue: str | None = None,
    schedule_to_start_s: float | None = None,
    attempts: int = 0,
    wait_for_cancel: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for `workflow.execute_activity` of `activity` (on `queue` if given)."""
    options: dict[str, Any] = {
        "task_queue": queue or ACTIVITY_QUEUE[activity].value,
        "start_to_close_timeout": _START_TO_CLOSE[activity],
        "heartbeat_timeout": timedelta(seconds=heartbeat_timeout_s),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=INFRA_RETRY.initial_s),
            backoff_coefficient=INFRA_RETRY.coefficient,
            maximum_interval=timedelta(seconds=INFRA_RETRY.max_s),
            maximum_attempts=attempts,
            non_retryable_error_types=NON_RETRYABLE,
        ),
    }
    if wait_for_cancel:
        options["cancellation_type"] = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
    if schedule_to_start_s is not None:
        options["schedule_to_start_timeout"] = timedelta(seconds=schedule_to_start_s)
    return options
