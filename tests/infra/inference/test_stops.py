"""Stop rules token by token (`infra/inference/stops.py`) over a vocabulary small enough to
read; test_local.py and test_vllm.py check the same rules inside both backends' decoding."""

from __future__ import annotations

from contracts.task import SamplingParams
from infra.inference.stops import TAIL_TOKENS, StopRules

VOCAB = ["```", "python", "\n", "x = 1", "</", "tool", "_call", ">", "a>", "``` ", "<tool_call>"]
IDS = {text: i for i, text in enumerate(VOCAB)}


class Tokenizer:
    """Just what `StopRules.of` asks of a tokenizer; a token's text is itself."""

    def get_vocab(self) -> dict[str, int]:
        return dict(IDS)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def decode(self, ids: list[int]) -> str:
        return "".join(VOCAB[i] for i in ids)


RULES = StopRules.of(Tokenizer())


def ends(params: SamplingParams, texts: list[str]) -> list[bool]:
    """For each token of `texts`, whether the row ends with it."""
    watch = RULES.watch(params)
    assert watch is not None
    return [watch.add(IDS[text]) for text in texts]


def test_the_vocabulary_is_read_once_into_fence_and_close_tokens() -> None:
    assert RULES.fence_ids == {IDS["```"], IDS["``` "]}
    assert RULES.close_ids == {IDS[">"], IDS["a>"], IDS["<tool_call>"]}


def test_no_rule_no_watch() -> None:
    assert RULES.watch(SamplingParams()) is None


def test_a_code_block_ends_at_the_token_that_closes_it() -> None:
    block = ["x = 1", "```", "python", "\n", "x = 1", "\n", "``` ", "x = 1"]
    code = SamplingParams(stop_after_code_block=True)
    assert ends(code, block) == [False] * 6 + [True, True]
    tools_only = SamplingParams(stop_after_tool_call=True)
    assert not any(ends(tools_only, block))  # fences do not end a tool-call row


def test_a_tool_call_ends_at_the_token_that_completes_its_closing_tag() -> None:
    call = ["<tool_call>", "x = 1", "a>", "</", "tool", "_call", ">", "x = 1"]
    tools = SamplingParams(stop_after_tool_call=True)
    assert ends(tools, call) == [False] * 6 + [True, False]  # `>` elsewhere is no close
    assert not any(ends(SamplingParams(stop_after_code_block=True), call))


def test_the_closing_tag_is_looked_for_in_the_last_tokens_only() -> None:
    tag = [IDS["</"], IDS["tool"], IDS["_call"], IDS[">"]]
    assert RULES.closes_tool_call(tag)
    assert not RULES.closes_tool_call([]) and not RULES.closes_tool_call(tag[:-1])
    padding = [IDS["x = 1"]] * (TAIL_TOKENS - len(tag))
    assert RULES.closes_tool_call([*tag, *padding, IDS["a>"]]) is False
    assert RULES.closes_tool_call([*tag[:-1], *padding, IDS[">"]]) is False
    assert RULES.closes_tool_call([*padding, *tag])
