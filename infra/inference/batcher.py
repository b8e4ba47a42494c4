"""Hands each row of every concurrent generate call straight to the backend, and measures it.

    batcher = Batcher(backend)
    result = await batcher.submit(prompt_ids, params, policy)    # from any number of tasks

Every backend batches continuously (`infra.inference.base.InferenceBackend`): a row sent now
joins the running batch at the next decode step, and the backend itself orders waiting rows by
`SamplingParams.priority` and switches policy versions (the local decoder's drain, vLLM's
`VersionGate`). So nothing waits here: each row is a backend call of its own, made at once,
and a caller cancelled meanwhile cancels it.

What the batcher adds is measurement, shared by every caller of the worker: each row is a
`model.generate` span (the run report's profile takes the engine's busy time from their union)
and recorded in the inference metrics, and its result carries the engine's throughput while it
ran (`BatchResult.batch_tokens_per_s`), which `GenerateResponse.tokens_per_s` averages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from contracts.task import SamplingParams
from infra.inference.base import GenerationOutput, InferenceBackend, PolicyHandle
from infra.telemetry import record_inference_row, span


@dataclass
class BatchResult:
    """A caller's completion, with how fast the engine went while it was sampled."""

    output: GenerationOutput
    batch_tokens_per_s: float
    """The tokens of every row that finished while this one ran (its own included), per second
    of its time in the backend: the running batch's throughput, not this row's alone."""


class Batcher:
    """One per worker: every `generate` activity's rows go through it into `backend`."""

    def __init__(self, backend: InferenceBackend):
        self.backend = backend
        self._tokens = 0  # of every finished row, for the engine's throughput over a row's life

    async def submit(
        self, prompt: list[int], params: SamplingParams, policy: PolicyHandle
    ) -> BatchResult:
        """Generate one completion; returns when its row ends."""
        tokens_before, started = self._tokens, time.perf_counter()
        with span("model.generate", policy_version=policy.version):
            (output,) = await self.backend.generate([prompt], [params], policy)
        elapsed = max(time.perf_counter() - started, 1e-9)
        self._tokens += len(output.token_ids)
        record_inference_row(len(output.token_ids), elapsed)
        return BatchResult(output, (self._tokens - tokens_before) / elapsed)
