"""The decoder's requests (`infra.inference.decoder_thread.Decoder`, the local backend's
continuous batching thread) on the `tiny` preset: at most `max_rows` decode, a cancelled one
leaves at the next step, another version's waits for the running batch to drain, one with
nothing to sample is answered at once, and closing fails the rest. How rows decode is
test_local.py's and test_kvcache.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from contracts.task import SamplingParams
from infra.inference import decoder, decoder_thread
from infra.inference.base import InferenceError
from infra.inference.local import LoadedPolicy, _choose
from tests.infra.inference.test_local import prompts


def running_decoder(
    policy: LoadedPolicy, max_rows: int
) -> tuple[decoder_thread.Decoder, list[decoder.RowBatch]]:
    """A decoder of `policy`, and the batches it made."""
    batches: list[decoder.RowBatch] = []

    def start(key: object) -> decoder.RowBatch:
        batches.append(decoder.RowBatch(policy, _choose))
        return batches[-1]

    return decoder_thread.Decoder(max_rows, start), batches


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


LONG = SamplingParams(temperature=0.0, max_new_tokens=400)


def test_a_cancelled_request_frees_its_place_at_the_next_step(endless_policy: LoadedPolicy) -> None:
    engine, batches = running_decoder(endless_policy, max_rows=2)
    try:
        gone, kept = (engine.submit("v", p, LONG) for p in prompts(2))
        wait_until(lambda: bool(batches) and len(batches[0].rows) == 2)
        assert gone.cancel()  # its caller gave up (a cancelled activity)
        short = engine.submit("v", prompts(3)[2], SamplingParams(temperature=0.0, max_new_tokens=4))
        assert len(short.result(timeout=60).token_ids) == 4
        assert not kept.done()  # it entered the place the cancelled row left
    finally:
        engine.close()


def test_closing_fails_every_request_decoding_or_waiting(endless_policy: LoadedPolicy) -> None:
    engine, batches = running_decoder(endless_policy, max_rows=1)
    decoding, waiting = (engine.submit("v", p, LONG) for p in prompts(2))
    wait_until(lambda: bool(batches) and len(batches[0].rows) == 1)
    wait_until(lambda: len(batches[0].rows[0].output.token_ids) >= 5)
    assert len(batches[0].rows) == 1 and not waiting.done()  # 5 steps on: it still waits
    engine.close()
    for future in (decoding, waiting):
        with pytest.raises(InferenceError, match="closed"):
            future.result(timeout=10)


def test_a_request_with_nothing_to_sample_is_answered_at_once(endless_policy: LoadedPolicy) -> None:
    engine, _ = running_decoder(endless_policy, max_rows=2)
    try:
        full = engine.submit("v", [5] * endless_policy.max_context, LONG)  # no room left to sample
        empty = engine.submit("v", [], LONG)
        for future in (full, empty):
            assert future.result(timeout=30).token_ids == []
        last = engine.submit("v", [5] * (endless_policy.max_context - 1), LONG)  # room for one
        assert len(last.result(timeout=30).token_ids) == 1
    finally:
        engine.close()


def test_another_versions_request_waits_for_the_running_batch_to_drain(
    endless_policy: LoadedPolicy,
) -> None:
    engine, batches = running_decoder(endless_policy, max_rows=4)
    try:
        running = engine.submit("v1", prompts(1)[0], LONG)
        wait_until(lambda: bool(batches) and len(batches[0].rows) == 1)
        other = engine.submit(
            "v2", prompts(2)[1], SamplingParams(temperature=0.0, max_new_tokens=4)
        )
        assert len(other.result(timeout=60).token_ids) == 4
        assert running.done() and len(batches) == 2  # v1 ran to its end, then v2's batch
    finally:
        engine.close()


def test_a_prompt_outside_the_vocabulary_fails_alone_and_for_good(
    endless_policy: LoadedPolicy,
) -> None:
    """An id the model has no embedding for failed the whole batch, as a fault to retry: the
    rows decoding beside it failed too, and its retries failed theirs again."""
    engine, _ = running_decoder(endless_policy, max_rows=4)
    vocab = endless_policy.model.get_input_embeddings().num_embeddings
    short = SamplingParams(temperature=0.0, max_new_tokens=4)
    try:
        with engine._changed:  # admitted in one step
            good = engine.submit("v", prompts(1)[0], short)
            bad = [engine.submit("v", [5, id, 6], short) for id in (vocab, -1)]
        for future in bad:
            with pytest.raises(InferenceError, match=r"prompt token ids? .* outside") as refused:
                future.result(timeout=60)
            assert not refused.value.retryable
        assert len(good.result(timeout=60).token_ids) == 4
    finally:
        engine.close()
