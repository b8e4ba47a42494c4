"""`CompletionRecord` (completion.json): what a row sampled is written once and read back by the
next step, the trajectory writer and the learner, so it must survive its own JSON. A log-prob
that is not finite cannot: JSON has no NaN (pydantic wrote it as null) and the record no longer
decoded, failing every reader of it. It is the inference engine's fault, never a sample's: the
record refuses it where it is built, as a retried `InferenceError` (contracts/errors.py), so the
activity that sampled it runs again instead of storing what nobody can read."""

from __future__ import annotations

import math

import pytest
from temporalio.exceptions import ApplicationError

from contracts.errors import NON_RETRYABLE, ErrorType
from contracts.rollout import CompletionRecord


def record(logprobs: list[float]) -> CompletionRecord:
    return CompletionRecord(
        text="x",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3] * len(logprobs),
        logprobs=logprobs,
        logprob_temperature=0.7,
        policy_version=4,
    )


@pytest.mark.parametrize("value", [-1e-12, -87.5, 0.0, math.nan, math.inf, -math.inf])
def test_every_record_that_is_built_reads_back_as_it_was_written(value: float) -> None:
    try:
        written = record([-0.25, value])
    except ApplicationError:
        return  # refused where it is built: below
    assert CompletionRecord.model_validate_json(written.model_dump_json()) == written


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_log_prob_that_is_not_finite_is_the_engines_fault_and_retried(value: float) -> None:
    with pytest.raises(ApplicationError, match=r"logprobs\[1\] = (nan|inf|-inf): ") as refused:
        record([-0.5, value, -0.25])
    assert refused.value.type == ErrorType.INFERENCE == "InferenceError"
    assert not refused.value.non_retryable and refused.value.type not in NON_RETRYABLE
    assert "the inference engine" in str(refused.value)
