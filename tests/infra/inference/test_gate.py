"""The version gate alone (pure asyncio): every request runs on the version it named, versions
switch only between drains, waiters of a version are admitted as one cohort, a bounded wait
fails clearly, and a failed load leaves nothing loaded."""

from __future__ import annotations

import asyncio

import pytest

from infra.inference import InferenceError
from infra.inference.gate import VersionGate


class Engine:
    """Holds one version; records what each request ran on and every load."""

    def __init__(self) -> None:
        self.weights: str | None = None
        self.loads: list[str] = []
        self.fail_next = False

    async def load(self, version: str) -> None:
        await asyncio.sleep(0.01)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("reload failed")
        self.weights = version
        self.loads.append(version)


async def request(gate: VersionGate[str], engine: Engine, version: str, seen: list[str]) -> None:
    async with gate.serving(version):
        for _ in range(3):  # the weights must not change under a running request
            seen.append(f"{version}:{engine.weights}")
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_interleaved_versions_each_run_on_their_own_weights_in_few_loads() -> None:
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=10)
    seen: list[str] = []
    versions = ["v0", "v1"] * 6
    await asyncio.gather(*(request(gate, engine, v, seen) for v in versions))
    assert all(entry.split(":")[0] == entry.split(":")[1] for entry in seen)
    assert len(seen) == 3 * len(versions)
    assert engine.loads == ["v0", "v1"]  # cohorts, not a load per request
    assert gate.in_flight == 0


@pytest.mark.asyncio
async def test_a_waiting_version_is_not_starved_by_new_requests_for_the_loaded_one() -> None:
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=10)
    seen: list[str] = []
    first = asyncio.create_task(request(gate, engine, "v0", seen))
    await asyncio.sleep(0.02)
    other = asyncio.create_task(request(gate, engine, "v1", seen))
    await asyncio.sleep(0)
    late = asyncio.create_task(request(gate, engine, "v0", seen))  # after v1 started waiting
    await asyncio.gather(first, other, late)
    assert engine.loads == ["v0", "v1", "v0"]


@pytest.mark.asyncio
async def test_after_a_switch_the_loaded_version_serves_one_request_after_another() -> None:
    """Waiters that were served leave nothing behind: once v1 is loaded, requests for it one at
    a time are admitted at once (a version with no waiter left, or the request itself, counted
    as waiting would hold them until the bound)."""
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=0.5)
    seen: list[str] = []
    await request(gate, engine, "v0", seen)
    for _ in range(3):
        await request(gate, engine, "v1", seen)
    assert engine.loads == ["v0", "v1"] and gate.loads == 2
    assert seen == ["v0:v0"] * 3 + ["v1:v1"] * 9


@pytest.mark.asyncio
async def test_a_wait_longer_than_the_bound_is_a_clear_error() -> None:
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=0.05)
    async with gate.serving("v0"):
        with pytest.raises(InferenceError, match=r"v1 not loaded within 0s \(serving v0, 1 requ"):
            async with gate.serving("v1"):
                pass
    async with gate.serving("v1"):  # and the gate still works
        assert engine.weights == "v1"


@pytest.mark.asyncio
async def test_a_failed_load_fails_its_request_and_the_next_one_loads_again() -> None:
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=10)
    engine.fail_next = True
    with pytest.raises(RuntimeError, match="reload failed"):
        async with gate.serving("v0"):
            pass
    assert gate.loaded is None and gate.in_flight == 0
    async with gate.serving("v0"):
        assert engine.weights == "v0"
    gate.invalidate()  # e.g. the engine died
    async with gate.serving("v0"):
        pass
    assert engine.loads == ["v0", "v0"] and gate.loads == 2  # the failed load not counted


@pytest.mark.asyncio
async def test_a_cohort_member_that_gives_up_as_its_version_loads_does_not_hold_the_gate() -> None:
    """A waiter of the version being loaded, cancelled as the load returns, was counted in the
    cohort: nobody took its turn and every other version waited out its bound, again and again
    (an evaluation pinned to an old version, cancelled: the newest version's requests never
    served)."""
    cohort: list[asyncio.Task[None]] = []

    async def load(version: str) -> None:
        await asyncio.sleep(0.02)
        if version == "old":
            cohort[0].cancel()  # its caller gives up while the load finishes
            await asyncio.sleep(0)  # and the load takes one more step (e.g. a last RPC)

    gate = VersionGate(load, wait_s=0.2)

    async def serve(version: str) -> None:
        async with gate.serving(version):
            await asyncio.sleep(0.01)

    loader = asyncio.create_task(serve("old"))
    await asyncio.sleep(0.005)
    cohort.append(asyncio.create_task(serve("old")))
    await asyncio.gather(loader, cohort[0], return_exceptions=True)
    assert cohort[0].cancelled()
    await serve("new")  # loaded at once, not after the bound
    assert gate.loaded == "new" and gate.in_flight == 0


@pytest.mark.asyncio
async def test_weights_lost_as_a_cohort_is_admitted_leave_no_cohort_behind() -> None:
    """The engine dies right after a load, before the version's cohort is admitted: the cohort
    loads again at once (its budget counted for weights no longer there held every version)."""
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=0.2)

    async def dies_at_once() -> None:
        async with gate.serving("v1"):
            gate.invalidate()
            await asyncio.sleep(0.01)

    loader = asyncio.create_task(dies_at_once())
    await asyncio.sleep(0.001)
    seen: list[str] = []
    await asyncio.gather(loader, request(gate, engine, "v1", seen))
    assert engine.loads == ["v1", "v1"] and seen == ["v1:v1"] * 3


@pytest.mark.asyncio
async def test_versions_with_no_waiter_left_are_forgotten() -> None:
    """A count of 0 was kept for every version ever asked for, and every wake-up scanned them
    all (19 ms per wake at 2,000 versions: a run publishes one a step)."""
    engine = Engine()
    gate = VersionGate(engine.load, wait_s=0.05)
    seen: list[str] = []
    for version in ("v0", "v1", "v2"):  # served
        await request(gate, engine, version, seen)
    async with gate.serving("v2"):
        with pytest.raises(InferenceError, match="not loaded within"):  # timed out
            await request(gate, engine, "v3", seen)
        cancelled = asyncio.create_task(request(gate, engine, "v4", seen))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    assert dict(gate._waiting) == {}
