"""A prefill that fails on the local backend's decoder thread (as a sliding-window model's long
prompt did, or a long prompt running the GPU out of memory), on the `tiny` preset: only the rows
of that prefill fail (retryable); the running batch decodes on, its rows as they would alone,
and rows admitted after it join as before. The fault used to lose the whole running batch.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference import decoder, decoder_thread
from infra.inference.base import InferenceError
from infra.inference.local import LoadedPolicy, _choose, sample_batch
from tests.infra.inference.test_decoder import wait_until
from tests.infra.inference.test_kvcache import prompt

MARK = 250
"""A prompt holding this token fails its prefill."""


class FailingPrefill:
    """The model, whose prefill forwards of prompts holding `MARK` fail."""

    def __init__(self, model: Any):
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, **kw: Any) -> Any:
        ids = kw["input_ids"]
        if ids.shape[1] > 1 and bool((ids == MARK).any()):
            raise RuntimeError("CUDA out of memory (simulated)")
        return self.model(**kw)


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=tokens)


def test_a_failing_prefill_fails_its_rows_not_the_running_batch(
    endless_policy: LoadedPolicy,
) -> None:
    batches: list[decoder.RowBatch] = []

    def start(key: object) -> decoder.RowBatch:
        batches.append(decoder.RowBatch(endless_policy, _choose))
        batches[-1].model = FailingPrefill(endless_policy.model)
        return batches[-1]

    engine = decoder_thread.Decoder(max_rows=8, start=start)
    try:
        first, last = prompt(9, 1), prompt(6, 3)
        assert MARK not in first + last
        healthy = engine.submit("v", first, greedy(300))
        wait_until(lambda: bool(batches) and len(batches[0].rows) == 1)
        failing = engine.submit("v", [*prompt(20, 2), MARK], greedy(5))
        with pytest.raises(InferenceError, match="out of memory") as caught:
            failing.result(timeout=60)
        assert caught.value.retryable
        after = engine.submit("v", last, greedy(5)).result(timeout=60)
        out = healthy.result(timeout=60)
        assert len(batches) == 1  # every row ran in the one batch
        alone = sample_batch(endless_policy, [first, last], [greedy(300), greedy(5)])
        for got, expected in zip((out, after), alone, strict=True):
            assert got.token_ids == expected.token_ids
            assert (
                max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs, strict=True)) < 1e-4
            )
    finally:
        engine.close()
