"""Fixtures of the sandbox tests: `box` (the local backend) and `any_box` (local, then gVisor),
one backend per test module, driven synchronously (verifier_box.py); `stub`, the STUB
Kubernetes API server (recorded_k8s/stub_server.py) of the test_kubernetes*.py modules, one a
test, and `validate_manifest`, their check of a manifest against Kubernetes 1.33's schema;
`short_starvation_bound`, the starvation rule without its 20 s floor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from infra.sandbox import judge
from tests.infra.sandbox.verifier_box import Box, gvisor_missing

if TYPE_CHECKING:
    from tests.infra.sandbox.recorded_k8s.stub_server import StubKubeApi


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


@pytest.fixture
def short_starvation_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """`judge.starvation_bound` without its 20 s floor (`STARVATION_SLACK_S`): 3 x `timeout_s`
    more, 16 s instead of 24 s for a 4 s deadline. A starved run (1% of a CPU) waits out the
    bound before it is told starved; the rule decided at its end is the same."""
    monkeypatch.setattr(judge, "STARVATION_SLACK_S", 0.0)


@pytest.fixture
def stub() -> Iterator[StubKubeApi]:
    # imported here: the other sandbox tests need neither the kubernetes client nor the stub
    from tests.infra.sandbox.recorded_k8s.stub_server import StubKubeApi

    server = StubKubeApi()
    yield server
    server.close()


def validate_manifest(manifest: dict[str, Any]) -> None:
    """Raise unless `manifest` is valid for Kubernetes 1.33 (strict: no unknown fields)."""
    import kubernetes_validate

    kubernetes_validate.validate(manifest, "1.33.0", strict=True)
