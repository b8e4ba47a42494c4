"""bench/engines.py's comparisons: the pipeline and bare must sample the same tokens, and each
vLLM variant is set against the transformers runs paired with it."""

from __future__ import annotations

import pytest


def test_pipeline_and_bare_must_have_sampled_the_same_tokens_row_by_row() -> None:
    from engines import check_same_tokens

    reference = {("a", i): 50 for i in range(4)}  # 200 tokens: 1% is 2
    assert check_same_tokens(dict(reverse_items(reference)), reference) == 0
    assert check_same_tokens({**reference, ("a", 1): 48}, reference) == 2  # a rounding's flip
    with pytest.raises(SystemExit, match=r"2 of 4 rows.*3 tokens in all.*\('a', 1\): 49 vs 50"):
        check_same_tokens({**reference, ("a", 1): 49, ("a", 2): 52}, reference)
    with pytest.raises(SystemExit, match="rows"):
        check_same_tokens({("a", 0): 50}, reference)


def reverse_items(counts: dict) -> list:
    return list(reversed(counts.items()))


def test_each_vllm_variant_is_set_against_its_own_paired_transformers_runs() -> None:
    from engines import paired_summary

    def run(tok_s: float) -> dict[str, float]:
        return {"tok_s": tok_s}

    pairs = {
        "vllm": {"local": [run(100.0), run(110.0)], "vllm": [run(50.0), run(60.0)]},
        "vllm-nolora": {"local": [run(50.0), run(50.0)], "vllm-nolora": [run(40.0), run(40.0)]},
    }
    summary = paired_summary(pairs)
    assert summary["vllm"]["tok_s"] == 55.0 and summary["vllm"]["local_tok_s"] == 105.0
    assert summary["vllm"]["vs_local"] == 0.524
    assert summary["vllm-nolora"]["local_tok_s"] == 50.0
    assert summary["vllm-nolora"]["vs_local"] == 0.8
