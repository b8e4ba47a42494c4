"""`stop_after_code_block` over a byte-level vocabulary (the `tiny` preset's), where a fence is
written by several tokens of one or two backticks: the row ends at the token closing its first
block (`infra.inference.stops`)."""

from __future__ import annotations

from pathlib import Path

from contracts.task import SamplingParams
from infra.inference.stops import StopRules
from tests.infra.inference.test_stops import Tokenizer


def test_a_fence_written_by_several_tokens_ends_the_block(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    text = "```python\ndef f():\n    return 1\n```"
    ids = tokenizer.encode(text + "\nmore text after the block", add_special_tokens=False)
    watch = StopRules.of(tokenizer).watch(SamplingParams(stop_after_code_block=True))
    assert watch is not None
    ends = [watch.add(i) for i in ids]
    assert True in ends
    assert tokenizer.decode(ids[: ends.index(True) + 1]) == text


class Ticks(Tokenizer):
    """Single backticks and a whole fence: the text of each token is itself (`x` a block's
    lines, which define a function: a block `extract_code` runs)."""

    VOCAB = ["`", "``", "```", "\ndef f(): pass\n", "````"]

    def get_vocab(self) -> dict[str, int]:
        return {text: i for i, text in enumerate(self.VOCAB)}

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids)


def test_fences_are_counted_once_however_they_are_written() -> None:
    rules = StopRules.of(Ticks())
    assert rules.fence_ids == {2, 4} and rules.tick_ids == {0, 1}
    tick, ticks, fence, x = 0, 1, 2, 3
    params = SamplingParams(stop_after_code_block=True)
    for tokens, end in [
        ([tick, ticks, x, ticks, tick], 4),  # `+`` opens, ``+` closes
        ([fence, tick, x, tick, tick, tick], 5),  # the extra backtick after a fence is no fence
        ([fence, x, fence], 2),
    ]:
        watch = rules.watch(params)
        assert watch is not None
        assert [watch.add(t) for t in tokens].index(True) == end, tokens
