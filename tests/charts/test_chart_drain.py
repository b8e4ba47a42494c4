"""Each worker's pod outlives its drain and its shutdown: on SIGTERM a worker lets in-flight
activities finish for its plan's `drain_s` (workers/runtime.py), then the SDK cancels the rest,
which take up to `CANCEL_GRACE_S` to clean up (activities/heartbeat.py), then the worker closes
its sessions, pools and telemetry (`CLOSE_BUDGET_S`); Kubernetes kills the pod at its
terminationGracePeriodSeconds. The learner drained 30 s in a 300 s grace: a step in flight was
cancelled after 30 s and redone from its start. The margin was 10 s, all of it the cancelled
activities' cleanup, leaving nothing for the closes; then it equalled the budget exactly, and
SIGKILL could land during the interpreter's teardown (`EXIT_SLACK_S`).

Rendering and validation of every value set are tests/charts/test_chart.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.heartbeat import CANCEL_GRACE_S
from contracts.names import Queue
from tests.charts.chart import VALUE_SETS, deployments, needs_helm, render, value_set_id
from workers.background import CLOSE_BUDGET_S, EXIT_SLACK_S, STOP_MARGIN_S, drain_s, stop_timeout_s
from workers.plan import WorkerPlan

pytestmark = needs_helm


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_worker_drains_within_its_pods_grace(values: Path | None) -> None:
    for name, deployment in deployments(render(values)).items():
        queues = {queue.value: queue for queue in Queue}
        drain = drain_s(queues[name]) if name in queues else WorkerPlan.drain_s
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= drain + STOP_MARGIN_S, (name, grace, drain)


def test_a_stop_waits_for_the_cancelled_activities_and_the_closes() -> None:
    """`tempered down` and a restart SIGKILL a worker after `stop_timeout_s`."""
    for queue in Queue:
        assert stop_timeout_s(queue) >= drain_s(queue) + STOP_MARGIN_S, queue


def test_the_margin_leaves_slack_for_the_interpreters_exit() -> None:
    """A grace of exactly drain + cancel grace + closes let SIGKILL land during the
    interpreter's teardown (the last telemetry flush)."""
    assert EXIT_SLACK_S >= 10
    assert STOP_MARGIN_S >= CANCEL_GRACE_S + CLOSE_BUDGET_S + EXIT_SLACK_S
