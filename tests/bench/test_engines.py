"""bench/engines.py's comparisons: the pipeline and bare must sample the same tokens, and each
vLLM variant is set against the transformers runs paired with it."""

from __future__ import annotations

import pytest


def test_pipeline_and_bare_must_have_sampled_the_same_tokens_row_by_row() -> None:
    from engines import check_same_tokens

    check_same_tokens({("a", 0): 5, ("a", 1): 7}, {("a", 1): 7, ("a", 0): 5})
    with pytest.raises(SystemExit, match=r"1 of 2 rows.*\('a', 1\): 8 vs 7"):
        check_same_tokens({("a", 0): 5, ("a", 1): 8}, {("a", 0): 5, ("a", 1): 7})
    with pytest.raises(SystemExit, match="rows"):
        check_same_tokens({("a", 0): 5}, {("a", 0): 5, ("a", 1): 7})


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
