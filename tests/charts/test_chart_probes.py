"""Every worker's pod has a startup, a readiness and a liveness probe, on the health files the
worker writes in its state dir (workers/health.py).

The chart had none: a pod was Ready at container start, so a rolling update of the inference
worker (one replica) drained the old pod while the new one loaded its engine for up to 900 s,
and nothing polled `inference` meanwhile; a worker whose event loop was wedged was never
restarted. The probes' commands are run here, as rendered, against files `Health` wrote (sh and
coreutils, as in the image); each value set renders and validates (kubernetes-validate, strict,
1.33) in tests/charts/test_chart.py, these probes with them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from temporalio.worker import Worker

from infra.settings_backends import VLLMSettings
from tests.charts.chart import VALUE_SETS, container, deployments, needs_helm, render, value_set_id
from tests.charts.test_chart import KUBERNETES_VERSION
from workers import health
from workers.health import Health

pytestmark = needs_helm

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def window_s(probe: dict[str, Any]) -> int:
    """How long a probe waits before it gives up: its failures in a row, its period apart."""
    return int(
        probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    )


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_worker_has_the_three_probes(values: Path | None) -> None:
    for name, deployment in deployments(render(values)).items():
        worker = container(deployment)
        for probe in PROBES:
            assert worker[probe]["exec"]["command"][:2] == ["sh", "-c"], (name, probe)
        assert worker["startupProbe"]["exec"] == worker["readinessProbe"]["exec"]
        assert window_s(worker["startupProbe"]) >= 300, name  # connect, build, first poll
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_inference_worker_may_start_its_engine() -> None:
    """A vLLM engine starts within `startup_timeout_s` (else the worker fails by itself),
    after the worker's connect and the model's fetch."""
    (inference,) = [d for q, d in deployments(render()).items() if q == "inference"]
    startup = container(inference)["startupProbe"]
    assert window_s(startup) >= VLLMSettings().startup_timeout_s + 120


class Running(Worker):
    """A Worker that polls, as far as `Health.serve` asks."""

    def __init__(self) -> None:
        pass

    @property
    def is_running(self) -> bool:
        return True


def written(home: Path, name: str) -> Health:
    """The health files of a worker of `name` that polls, as `Health.serve` writes them."""
    files = Health(home, name)
    files.clear()

    async def serve() -> None:
        task = asyncio.create_task(files.serve([Running()], lambda: None))
        while not files.ready.exists():
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(serve())
    return files


def passes(probe: dict[str, Any]) -> bool:
    done = subprocess.run(probe["exec"]["command"], capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.mark.parametrize("name", ["inference", "sandbox"])
def test_the_probes_read_what_the_worker_writes(name: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    (found,) = [d for q, d in deployments(render(None, f"stateDir={state}")).items() if q == name]
    worker = container(found)
    ready, alive = worker["readinessProbe"], worker["livenessProbe"]
    assert not passes(ready) and not passes(alive)  # starting: nothing written yet

    files = written(state, name)
    assert passes(ready) and passes(alive)

    now = time.time()
    os.utime(files.alive, (now - health.STALE_S + 5, now - health.STALE_S + 5))
    assert passes(ready) and passes(alive)  # touched every few seconds: not stale yet
    os.utime(files.alive, (now - health.STALE_S - 1, now - health.STALE_S - 1))
    assert not passes(alive) and not passes(ready)  # its event loop is blocked

    files = written(state, name)
    files.ready.write_text("12345")  # the pod's last container's (the emptyDir keeps it)
    assert not passes(ready) and passes(alive)
    files.clear()
    assert not passes(ready) and not passes(alive)
