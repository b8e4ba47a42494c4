"""The rules every backend shares (infra/inference/base.py): a row's token budget, an error as
one line, the synthetic prompts of warm-ups and benchmarks. The resolver is test_resolver.py's."""

from __future__ import annotations

from contracts.task import SamplingParams
from infra.inference.base import one_line, row_budget, synthetic_prompts


def test_a_rows_budget_is_clamped_to_the_context_and_zero_with_nothing_to_sample() -> None:
    ten = SamplingParams(max_new_tokens=10)
    assert row_budget([1, 2, 3], ten, context=100) == 10
    assert row_budget([1, 2, 3], ten, context=8) == 5  # the context's room after the prompt
    assert row_budget([1] * 8, ten, context=8) == 0
    assert row_budget([1] * 9, ten, context=8) == 0  # past the context: none, never negative
    assert row_budget([], ten, context=100) == 0  # an empty prompt: nothing to condition on


def test_an_error_in_one_line_is_its_type_and_first_line() -> None:
    assert one_line(ValueError("  bad value\n  Traceback more\n")) == "ValueError: bad value"
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(OSError(" \n ")) == "OSError"


def test_synthetic_prompts_are_the_same_tokens_on_every_call_and_in_the_vocabulary() -> None:
    prompts = synthetic_prompts(rows=3, tokens=5, vocab=50)
    assert prompts == synthetic_prompts(rows=3, tokens=5, vocab=50)
    assert [len(p) for p in prompts] == [5, 5, 5] and len({tuple(p) for p in prompts}) == 3
    assert prompts[1] == [(97 + 31 + 7 * k) % 50 for k in range(5)]
    assert all(0 <= t < 50 for p in synthetic_prompts(rows=40, tokens=40, vocab=50) for t in p)
