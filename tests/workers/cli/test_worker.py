"""`tempered worker`: the process's torch threads spin briefly (`Settings.omp_spin_count`)."""

from __future__ import annotations

import argparse
import os

import pytest

from contracts.names import Queue
from infra.settings import Settings
from workers.cli import stack


def test_the_spin_limit_is_set_before_the_workers_run(
    fresh_worker_env: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    async def workers(queues: list[Queue], settings: Settings) -> None:
        seen.append(os.environ.get("GOMP_SPINCOUNT"))

    fresh_worker_env.setattr(stack, "run_workers", workers)
    settings = Settings(omp_spin_count=1234)
    assert stack.worker(argparse.Namespace(queue=Queue.LEARNER.value), settings) == 0
    assert seen == ["1234"]
