"""Coalesces concurrent generate calls from many workflows into batched backend calls.

    batcher = Batcher(backend, max_batch=32, max_wait_ms=20)
    result = await batcher.submit(prompt_ids, params, policy)    # from any number of tasks
    await batcher.close()

A single runner task owns the backend: it takes the oldest waiting request, waits at most
`max_wait_ms` (from that request's arrival) for others *of the same policy version* to join,
up to `max_batch` rows, and runs one backend call at a time. Results are routed back to each
caller's future. Requests for another version wait for the next batch, so a newly published
version is picked up by new requests while a running batch finishes on the old one; nothing is
dropped. A caller that is cancelled before its batch starts is skipped.

A backend with `continuous_batching` (vLLM) batches inside itself and takes concurrent calls:
every request then goes straight to it, so rows join the engine's running batch as they arrive.

Either way every backend call is a `model.generate` span (the run report's profile takes the
engine's busy time from their union) and the batcher keeps `busy_s`: seconds with at least one
request in the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from contracts.task import SamplingParams
from infra.inference.base import GenerationOutput, InferenceBackend, PolicyHandle
from infra.telemetry import record_inference_batch, span

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """A caller's completion, with how the batch that produced it went."""

    output: GenerationOutput
    policy: PolicyHandle
    batch_size: int
    batch_tokens_per_s: float


@dataclass
class _Pending:
    prompt: list[int]
    params: SamplingParams
    policy: PolicyHandle
    future: asyncio.Future[BatchResult]
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Groups requests per policy version into bounded batches; one backend call at a time."""

    def __init__(self, backend: InferenceBackend, max_batch: int, max_wait_ms: int):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.batches = 0
        self.rows = 0
        self._pending: deque[_Pending] = deque()
        self._arrived = asyncio.Event()
        self._running: list[_Pending] = []
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self._direct = 0  # requests in a continuous-batching backend now
        self._tokens = 0  # tokens of every finished request, for per-request engine throughput
        self._busy_since: float | None = None
        self.busy_s = 0.0

    @property
    def running(self) -> int:
        """Rows the backend is working on now (0 when idle)."""
        return len(self._running) + self._direct

    @property
    def waiting(self) -> int:
        """Rows queued for a later batch."""
        return sum(1 for p in self._pending if not p.future.done())

    async def submit(
        self, prompt: list[int], params: SamplingParams, policy: PolicyHandle
    ) -> BatchResult:
        """Generate one completion; returns when the batch holding it is done."""
        if self._closed:
            raise RuntimeError("batcher is closed")
        if self.backend.continuous_batching:
            return await self._pass_through(prompt, params, policy)
        future: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(prompt, params, policy, future))
        self._arrived.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="inference-batcher")
        return await future

    async def _pass_through(
        self, prompt: list[int], params: SamplingParams, policy: PolicyHandle
    ) -> BatchResult:
        """One request straight into a continuous-batching backend. Its throughput figure is
        the engine's over the request's lifetime: every token finished meanwhile, per second."""
        if self._direct == 0:
            self._busy(True)
        self._direct += 1
        in_batch, tokens_before = self._direct, self._tokens
        started = time.perf_counter()
        try:
            with span("model.generate", policy_version=policy.version, batch_size=1):
                (output,) = await self.backend.generate([prompt], [params], policy)
        finally:
            self._direct -= 1
            if self._direct == 0:
                self._busy(False)
        elapsed = max(time.perf_counter() - started, 1e-9)
        self._tokens += len(output.token_ids)
        self.batches += 1
        self.rows += 1
        record_inference_batch(1, len(output.token_ids), elapsed)
        return BatchResult(output, policy, in_batch, (self._tokens - tokens_before) / elapsed)

    def _busy(self, busy: bool) -> None:
        now = time.perf_counter()
        if busy:
            self._busy_since = now
        elif self._busy_since is not None:
            self.busy_s += now - self._busy_since
            self._busy_since = None

    def _same_policy(self, policy: PolicyHandle) -> int:
        return sum(1 for p in self._pending if p.policy == policy and not p.future.done())

    async def _next_batch(self) -> list[_Pending]:
        """Wait for work, then for the head's batch to fill or its wait to run out."""
        while True:
            while self._pending and self._pending[0].future.done():  # cancelled callers
                self._pending.popleft()
            if self._pending:
                break
            self._arrived.clear()
            await self._arrived.wait()
        head = self._pending[0]
        deadline = head.arrived + self.max_wait_s
        while self._same_policy(head.policy) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        batch: list[_Pending] = []
        rest: deque[_Pending] = deque()
        for pending in self._pending:
            if pending.future.done():
                continue
            if pending.policy == head.policy and len(batch) < self.max_batch:
                batch.append(pending)
            else:
                rest.append(pending)
        self._pending = rest
        return batch

    async def _run(self) -> None:
        while not self._closed:
            batch = await self._next_batch()
            if batch:
                await self._execute(batch)

    async def _execute(self, batch: list[_Pending]) -> None:
        policy = batch[0].policy
        started = time.perf_counter()
        self._running = batch
        self._busy(True)
        try:
            with span("model.generate", policy_version=policy.version, batch_size=len(batch)):
                outputs = await self.backend.generate(
                    [p.prompt for p in batch], [p.params for p in batch], policy
                )
            if len(outputs) != len(batch):
                raise RuntimeError(
                    f"backend returned {len(outputs)} outputs for {len(batch)} prompts"
                )
        except Exception as exc:  # every caller of the batch sees the failure
            log.warning("batch of %d on %s failed: %r", len(batch), policy.name, exc)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        finally:
            self._running = []
            self._busy(False)
        elapsed = max(time.perf_counter() - started, 1e-9)
        tokens = sum(len(o.token_ids) for o in outputs)
        record_inference_batch(len(batch), tokens, elapsed)
        self.batches += 1
        self.rows += len(batch)
        log.debug(
            "batch %d: %d rows, %d tokens, %.1f tok/s",
            self.batches,
            len(batch),
            tokens,
            tokens / elapsed,
        )
        for pending, output in zip(batch, outputs, strict=True):
            if not pending.future.done():
                pending.future.set_result(BatchResult(output, policy, len(batch), tokens / elapsed))

    async def close(self) -> None:
        """Stop the runner; callers still waiting get a `RuntimeError`."""
        self._closed = True
        stranded = [*self._running, *self._pending]
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for pending in stranded:
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("batcher closed"))
        self._pending.clear()
