"""Each worker's pod outlives its drain: on SIGTERM a worker lets in-flight activities finish
for its plan's `drain_s` (workers/runtime.py), and Kubernetes kills the pod at its
terminationGracePeriodSeconds. The learner drained 30 s in a 300 s grace: a step in flight was
cancelled after 30 s and redone from its start.

Rendering and validation of every value set are tests/charts/test_chart.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.charts.chart import VALUE_SETS, deployments, needs_helm, render, value_set_id
from workers.learner import LEARNER_DRAIN_S
from workers.plan import WorkerPlan

pytestmark = needs_helm

MARGIN_S = 10
"""Room after the drain for the worker's own shutdown (closing the engine, flushing telemetry)."""


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_worker_drains_within_its_pods_grace(values: Path | None) -> None:
    for name, deployment in deployments(render(values)).items():
        drain = LEARNER_DRAIN_S if name == "learner" else WorkerPlan().drain_s
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= drain + MARGIN_S, (name, grace, drain)
