"""Batcher: coalescing, routing, bounded wait, per-version batches, failures, cancellation.

The backend here is a recording implementation of our own `InferenceBackend` Protocol (no
server is involved); its outputs are a function of each row's own prompt, params and policy,
so a result routed to the wrong caller is caught. The real model runs through the batcher in
test_local.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from contracts.task import SamplingParams
from infra.inference import Batcher, GenerationOutput, PolicyHandle


def handle(version: int) -> PolicyHandle:
    return PolicyHandle("run-b", version, Path(f"/nonexistent/v{version}"))


class RecordingBackend:
    """Answers each row with [sum(prompt), max_new_tokens, seed, version]; records every call."""

    name = "recording"
    continuous_batching = False
    max_model_len: int | None = None

    def __init__(self, delay_s: float = 0.02, fail_first: int = 0):
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.calls: list[tuple[int, int]] = []  # (rows, version)
        self.active = 0
        self.max_active = 0

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        self.calls.append((len(prompts), policy.version))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.delay_s)
            if len(self.calls) <= self.fail_first:
                raise RuntimeError("backend exploded")
            return [
                GenerationOutput(
                    [sum(p), q.max_new_tokens, q.seed or 0, policy.version], [-1.0] * 4, "stop"
                )
                for p, q in zip(prompts, params, strict=True)
            ]
        finally:
            self.active -= 1

    async def close(self) -> None:
        pass


@pytest.mark.asyncio
async def test_concurrent_requests_coalesce_and_each_gets_its_own_result() -> None:
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch=8, max_wait_ms=50)
    params = [
        SamplingParams(temperature=0.1 * (i % 4), max_new_tokens=10 + i, seed=i) for i in range(20)
    ]
    results = await asyncio.gather(
        *(batcher.submit([i, 100], params[i], handle(0)) for i in range(20))
    )
    assert [r.output.token_ids for r in results] == [[i + 100, 10 + i, i, 0] for i in range(20)]
    assert len(backend.calls) == math.ceil(20 / 8)
    assert max(rows for rows, _ in backend.calls) == 8
    assert sum(rows for rows, _ in backend.calls) == 20
    assert backend.max_active == 1  # one backend call at a time
    assert batcher.batches == 3 and batcher.rows == 20
    for result in results:  # the batch's tokens (4 a row) over its call's time (>= 0.02 s)
        assert result.batch_size * 4 < result.batch_tokens_per_s <= result.batch_size * 4 / 0.02
    await batcher.close()


@pytest.mark.asyncio
async def test_a_lone_request_waits_at_most_max_wait() -> None:
    backend = RecordingBackend(delay_s=0.0)
    batcher = Batcher(backend, max_batch=32, max_wait_ms=150)
    started = time.monotonic()
    await batcher.submit([1], SamplingParams(), handle(0))
    waited = time.monotonic() - started
    assert 0.14 <= waited < 0.6, waited
    await batcher.close()


@pytest.mark.asyncio
async def test_a_full_batch_does_not_wait() -> None:
    backend = RecordingBackend(delay_s=0.0)
    batcher = Batcher(backend, max_batch=4, max_wait_ms=2000)
    started = time.monotonic()
    await asyncio.gather(*(batcher.submit([i], SamplingParams(), handle(0)) for i in range(4)))
    assert time.monotonic() - started < 1.0
    assert backend.calls == [(4, 0)]
    await batcher.close()


@pytest.mark.asyncio
async def test_batches_never_mix_policy_versions() -> None:
    backend = RecordingBackend()
    batcher = Batcher(backend, max_batch=16, max_wait_ms=30)
    versions = [i % 3 for i in range(12)]
    results = await asyncio.gather(
        *(batcher.submit([i], SamplingParams(), handle(v)) for i, v in enumerate(versions))
    )
    assert [r.output.token_ids[-1] for r in results] == versions
    assert [r.policy.version for r in results] == versions
    assert sorted(backend.calls) == [(4, 0), (4, 1), (4, 2)]
    await batcher.close()


@pytest.mark.asyncio
async def test_a_failed_batch_fails_its_callers_and_the_batcher_keeps_serving() -> None:
    backend = RecordingBackend(fail_first=1)
    batcher = Batcher(backend, max_batch=4, max_wait_ms=10)
    first = await asyncio.gather(
        *(batcher.submit([i], SamplingParams(), handle(0)) for i in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(r, RuntimeError) for r in first)
    again = await batcher.submit([5], SamplingParams(), handle(0))
    assert again.output.token_ids[0] == 5
    await batcher.close()


@pytest.mark.asyncio
async def test_a_cancelled_caller_is_left_out_of_its_batch() -> None:
    backend = RecordingBackend(delay_s=0.0)
    batcher = Batcher(backend, max_batch=8, max_wait_ms=200)
    doomed = asyncio.create_task(batcher.submit([1], SamplingParams(), handle(0)))
    kept = asyncio.create_task(batcher.submit([2], SamplingParams(), handle(0)))
    await asyncio.sleep(0.05)
    doomed.cancel()
    result = await kept
    assert result.output.token_ids[0] == 2
    assert backend.calls == [(1, 0)]
    await batcher.close()


@pytest.mark.asyncio
async def test_close_fails_waiting_callers() -> None:
    backend = RecordingBackend(delay_s=5.0)
    batcher = Batcher(backend, max_batch=1, max_wait_ms=0)
    running = asyncio.create_task(batcher.submit([1], SamplingParams(), handle(0)))
    queued = asyncio.create_task(batcher.submit([2], SamplingParams(), handle(0)))
    await asyncio.sleep(0.05)
    assert batcher.running == 1 and batcher.waiting == 1
    await batcher.close()
    for task in (running, queued):
        with pytest.raises(RuntimeError, match="closed"):
            await task
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.submit([3], SamplingParams(), handle(0))


@pytest.mark.asyncio
async def test_a_continuous_batching_backend_gets_every_request_at_once() -> None:
    backend = RecordingBackend(delay_s=0.05)
    backend.continuous_batching = True  # type: ignore[misc]
    batcher = Batcher(backend, max_batch=4, max_wait_ms=1000)
    started = time.monotonic()
    calls = [batcher.submit([i], SamplingParams(seed=i), handle(i % 2)) for i in range(10)]
    requests = [asyncio.create_task(call) for call in calls]
    await asyncio.sleep(0.02)
    assert batcher.running == 10 and batcher.waiting == 0
    results = await asyncio.gather(*requests)
    assert time.monotonic() - started < 0.9  # nobody waited for a batch to fill
    assert [r.output.token_ids[2:] for r in results] == [[i, i % 2] for i in range(10)]
    assert backend.calls == [(1, i % 2) for i in range(10)]  # straight through, both versions
    assert backend.max_active == 10 and batcher.running == 0
    assert results[-1].batch_size == 10 and batcher.batches == batcher.rows == 10
    assert 0.04 < batcher.busy_s < 0.3  # the union of the requests' times, not their sum (0.5)
    # a request's figure: the tokens finished while it ran (its own, and the earlier ones')
    speeds = sorted(r.batch_tokens_per_s for r in results)
    assert speeds[-1] > 3 * speeds[0], speeds
    alone = await batcher.submit([1], SamplingParams(), handle(0))
    assert 4 < alone.batch_tokens_per_s <= 4 / 0.05  # 4 tokens in one request of 0.05 s to 1 s
    # busy from the first start to the last end: two requests of 0.05 s, the second started
    # halfway through the first (0.075 s; 0.05 from either end alone)
    before = batcher.busy_s
    first = asyncio.create_task(batcher.submit([1], SamplingParams(), handle(0)))
    await asyncio.sleep(0.025)
    await asyncio.gather(first, batcher.submit([2], SamplingParams(), handle(0)))
    assert 0.074 <= batcher.busy_s - before < 0.3
    await batcher.close()


@pytest.mark.asyncio
async def test_a_batch_short_of_its_own_version_waits_for_more() -> None:
    """Rows of another version do not fill the head's batch: two of v0 and two of v1, with
    room for four, wait out `max_wait` and run as two batches."""
    backend = RecordingBackend(delay_s=0.0)
    batcher = Batcher(backend, max_batch=4, max_wait_ms=300)
    started = time.monotonic()
    calls = [batcher.submit([i], SamplingParams(), handle(i % 2)) for i in range(4)]
    requests = [asyncio.create_task(call) for call in calls]
    await asyncio.gather(requests[0], requests[2])  # v0's
    assert time.monotonic() - started >= 0.29
    await asyncio.gather(*requests)
    assert sorted(backend.calls) == [(2, 0), (2, 1)]
    await batcher.close()
