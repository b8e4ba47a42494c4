"""Timeouts and retry policies per activity type, in one table.

Infrastructure failures retry without limit, with the backoff of `contracts.errors.INFRA_RETRY`:
a rollout waits out a dead worker or a restarting S3 instead of turning the outage into a
reward. The error types that are never retried come from `contracts.errors.NON_RETRYABLE`.
"""

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contracts.errors import INFRA_RETRY, NON_RETRYABLE
    from contracts.names import ACTIVITY_QUEUE, Activity

_START_TO_CLOSE: dict[Activity, timedelta] = {
    Activity.GENERATE: timedelta(minutes=20),
    Activity.EXECUTE: timedelta(minutes=20),
    Activity.WRITE_TRAJECTORIES: timedelta(minutes=5),
    Activity.LOAD_TASKS: timedelta(minutes=5),
    Activity.PREPARE_RUN: timedelta(minutes=30),
    Activity.TRAIN_STEP: timedelta(minutes=60),
}


def activity_options(activity: Activity, heartbeat_timeout_s: float) -> dict[str, Any]:
    """Keyword arguments for `workflow.execute_activity` of `activity`."""
    return {
        "task_queue": ACTIVITY_QUEUE[activity].value,
        "start_to_close_timeout": _START_TO_CLOSE[activity],
        "heartbeat_timeout": timedelta(seconds=heartbeat_timeout_s),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=INFRA_RETRY.initial_s),
            backoff_coefficient=INFRA_RETRY.coefficient,
            maximum_interval=timedelta(seconds=INFRA_RETRY.max_s),
            non_retryable_error_types=NON_RETRYABLE,
        ),
    }
