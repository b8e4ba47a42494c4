"""`limit_openmp_spin`: a worker's torch threads spin briefly unless the environment chose."""

from __future__ import annotations

import os
import sys

import pytest

from infra.processes import limit_openmp_spin
from infra.settings import Settings


def test_the_settings_spin_count_is_set_for_the_worker(
    fresh_worker_env: pytest.MonkeyPatch,
) -> None:
    limit_openmp_spin(Settings().omp_spin_count)
    assert os.environ["GOMP_SPINCOUNT"] == "20000"


@pytest.mark.parametrize("variable", ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY"])
def test_what_the_environment_chose_stays(
    fresh_worker_env: pytest.MonkeyPatch, variable: str
) -> None:
    fresh_worker_env.setenv(variable, "PASSIVE" if variable == "OMP_WAIT_POLICY" else "7")
    limit_openmp_spin(1)
    assert os.environ.get("GOMP_SPINCOUNT") == (None if variable == "OMP_WAIT_POLICY" else "7")


def test_none_leaves_libgomp_its_default(fresh_worker_env: pytest.MonkeyPatch) -> None:
    limit_openmp_spin(None)
    assert "GOMP_SPINCOUNT" not in os.environ


def test_too_late_once_torch_is_loaded(fresh_worker_env: pytest.MonkeyPatch) -> None:
    fresh_worker_env.setitem(sys.modules, "torch", object())
    with pytest.raises(RuntimeError, match="after torch was imported"):
        limit_openmp_spin(20_000)
