"""A row that fails ends the rows of its call still in flight, in both backends: the call's
error is raised, the whole attempt is retried, and its other rows would otherwise decode on
for nobody (a slot of the running batch and its KV each) until they ended. Each sibling's
cancellation is observed where the backend sees it: vLLM's row coroutine (whose `finally`
aborts its request in the engine) and the local decoder's future (which the decoder checks at
every step, `infra.inference.decoder.RowBatch`). The helper itself: tests/infra/test_aio.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference import GenerationOutput, InferenceError, PolicyHandle
from infra.inference.gate import VersionGate
from infra.inference.local import LocalBackend
from infra.inference.vllm import VLLMBackend
from infra.settings import LocalInferenceSettings, VLLMSettings

FAILING = [1]
HANDLE = PolicyHandle("run", 0, Path("/nonexistent"))


async def loaded(weights: PolicyHandle) -> None:
    """The gate's load: nothing to load without an engine."""


@pytest.mark.asyncio
async def test_a_vllm_row_that_fails_cancels_its_sibling_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = VLLMBackend(VLLMSettings())
    backend._gate = VersionGate(loaded, wait_s=5.0)
    sibling_started, sibling_cancelled = asyncio.Event(), asyncio.Event()

    async def row(prompt: list[int], params: SamplingParams, *rest: Any) -> GenerationOutput:
        if prompt == FAILING:
            await sibling_started.wait()  # fails while its sibling decodes
            raise InferenceError("vLLM failed: RuntimeError")
        sibling_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise
        return GenerationOutput([], [], "length")

    monkeypatch.setattr(backend, "_row", row)
    generating = backend._generate([FAILING, [2]], [SamplingParams()] * 2, HANDLE)
    with pytest.raises(InferenceError, match="vLLM failed"):
        await asyncio.wait_for(generating, timeout=10)
    assert sibling_cancelled.is_set()
    assert backend._gate.in_flight == 0


@pytest.mark.asyncio
async def test_a_local_row_that_fails_cancels_its_sibling_in_the_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = LocalBackend(LocalInferenceSettings())
    submitted: list[concurrent.futures.Future[GenerationOutput]] = []

    def submit(key: object, prompt: list[int], params: SamplingParams) -> Any:
        submitted.append(concurrent.futures.Future())
        if prompt == FAILING:  # as the decoder fails a prompt outside the vocabulary, alone
            error = InferenceError("prompt token ids [1] outside the vocabulary", retryable=False)
            asyncio.get_running_loop().call_later(0.05, submitted[-1].set_exception, error)
        return submitted[-1]

    monkeypatch.setattr(backend._decoder, "submit", submit)
    try:
        generating = backend.generate([FAILING, [2]], [SamplingParams()] * 2, HANDLE)
        with pytest.raises(InferenceError, match="outside the vocabulary"):
            await asyncio.wait_for(generating, timeout=10)
        assert submitted[1].cancelled()  # the decoder's signal: the row leaves at its next step
    finally:
        await backend.close()
