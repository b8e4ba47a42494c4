"""Each worker's pod outlives its drain: on SIGTERM a worker lets in-flight activities finish
for its plan's `drain_s` (workers/runtime.py), and Kubernetes kills the pod at its
terminationGracePeriodSeconds. The learner drained 30 s in a 300 s grace: a step in flight was
cancelled after 30 s and redone from its start.

Rendering and validation of every value set are tests/charts/test_chart.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.names import Queue
from tests.charts.chart import VALUE_SETS, deployments, needs_helm, render, value_set_id
from workers.background import STOP_MARGIN_S, drain_s
from workers.plan import WorkerPlan

pytestmark = needs_helm


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_worker_drains_within_its_pods_grace(values: Path | None) -> None:
    for name, deployment in deployments(render(values)).items():
        queues = {queue.value: queue for queue in Queue}
        drain = drain_s(queues[name]) if name in queues else WorkerPlan.drain_s
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= drain + STOP_MARGIN_S, (name, grace, drain)  # room for its own shutdown
