"""Fixtures of the sandbox tests: `box` (the local backend) and `any_box` (local, then gVisor),
one backend per test module, driven synchronously (verifier_box.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.sandbox.verifier_box import Box, gvisor_missing


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    local = Box("local")
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module", params=["local", "gvisor"])
def any_box(request: pytest.FixtureRequest) -> Iterator[Box]:
    """Every backend that can run here: gVisor is skipped, with the reason, where it cannot."""
    if request.param == "gvisor" and (reason := gvisor_missing()):
        pytest.skip(reason)
    chosen = Box(request.param)
    try:
        yield chosen
    finally:
        chosen.close()
