"""Stop rules token by token (`infra/inference/stops.py`) over a vocabulary small enough to
read; test_local.py and test_vllm.py check the same rules inside both backends' decoding."""

from __future__ import annotations

from contracts.task import SamplingParams
from infra.inference.stops import TAIL_TOKENS, StopRules

VOCAB = [
    *("```", "python", "\n", "x = 1", "</", "tool", "_call", ">", "a>", "``` ", "<tool_call>"),
    *("def f(): pass", '{"name": "submit"}'),
]
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
    block = ["x = 1", "```", "python", "\n", "def f(): pass", "\n", "``` ", "x = 1"]
    code = SamplingParams(stop_after_code_block=True)
    assert ends(code, block) == [False] * 6 + [True, False]
    tools_only = SamplingParams(stop_after_tool_call=True)
    assert not any(ends(tools_only, block))  # fences do not end a tool-call row
    # a block that defines no function (an example) does not end the turn (test_stops61.py)
    assert not any(ends(code, ["```", "\n", "x = 1", "\n", "```"]))


def test_a_tool_call_ends_at_the_token_that_completes_its_closing_tag() -> None:
    call = ["<tool_call>", '{"name": "submit"}', "a>", "</", "tool", "_call", ">", "x = 1"]
    tools = SamplingParams(stop_after_tool_call=True)
    assert ends(tools, call) == [False] * 6 + [True, False]  # `>` elsewhere is no close
    assert not any(ends(SamplingParams(stop_after_code_block=True), call))
    no_call = ["<tool_call>", "x = 1", "</", "tool", "_call", ">"]  # a tag closing no call
    assert not any(ends(tools, no_call))


def test_the_closing_tag_is_looked_for_in_the_last_tokens_only() -> None:
    call = [IDS["<tool_call>"], IDS['{"name": "submit"}']]
    tag = [IDS["</"], IDS["tool"], IDS["_call"], IDS[">"]]
    assert RULES.closes_tool_call([*call, *tag])
    assert not RULES.closes_tool_call([]) and not RULES.closes_tool_call([*call, *tag[:-1]])
    assert not RULES.closes_tool_call(tag)  # no call before it
    padding = [IDS["x = 1"]] * (TAIL_TOKENS - len(tag))
    assert RULES.closes_tool_call([*call, *tag, *padding, IDS["a>"]]) is False
    assert RULES.closes_tool_call([*call, *tag[:-1], *padding, IDS[">"]]) is False
    assert RULES.closes_tool_call([*call, *padding, *tag])
