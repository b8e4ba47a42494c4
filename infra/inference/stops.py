"""Where a completion stops besides EOS and its token budget, decided token by token.

    rules = StopRules.of(tokenizer)                 # once per tokenizer
    watch = rules.watch(params)                     # once per row; None: no rule applies
    if watch is not None and watch.add(token):      # after each sampled token
        ...                                         # the row is done, this token included

Each rule ends a turn where what reads the turn agrees, the rule's text test having one home
there: `stop_after_code_block` at the token that closes the first block `extract_code` would run
(`prompts.program_closed`: a python or untagged block defining a function; a ```bash block or an
example before it does not end the turn), `stop_after_tool_call` at the token that completes the
`</tool_call>` after the call `parse_tool_call` takes (`toolcalls.call_closed`: not a tag only
mentioned, not one inside a `<think>` block).

Both are tested on the row's decoded text only at the tokens that may complete what they look
for, found by token id: a fence (`FENCE`, a run of at least three backticks, whether one token
holds it or several tokens of a byte-level vocabulary write it together: a token holding a
backtick but no whole fence is checked by decoding the row's last few tokens), or the closing
tag (a token holding `>` whose last few tokens' text has the tag). Both backends use it: the
local decode loop (`infra.inference.decoder`) after every step, the `vllm` backend on the
tokens it streams; token ids and the tokenizer's decode, never a re-tokenisation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.task import SamplingParams
from infra.inference.prompts import program_closed
from infra.inference.toolcalls import CALL_CLOSE, call_closed

TAIL_TOKENS = 16
"""Tokens decoded to find `</tool_call>` or a fence written by several tokens (each is at most
a dozen tokens in any vocabulary) before the whole row's text is tested."""
FENCE = re.compile("`{3,}")
"""A code fence: a run of at least three backticks."""


def token_texts(tokenizer: Any, size: int = 0) -> list[str]:
    """Each token id's text (the tokenizer's own reading of that one token), for at least
    `size` ids: ids without a token (a model's output may be wider) are ""."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    texts = [""] * max(size, max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        texts[token_id] = tokenizer.convert_tokens_to_string([token])
    return texts


@dataclass(frozen=True)
class StopRules:
    """What a tokenizer's vocabulary says about fences and tags."""

    fence_ids: frozenset[int]
    """Tokens whose text contains a whole code fence (`FENCE`)."""
    close_ids: frozenset[int]
    """Tokens whose text contains `>`, the end of `</tool_call>`."""
    decode: Callable[[list[int]], str]
    """The tokenizer's decode, special tokens kept."""
    tick_ids: frozenset[int] = frozenset()
    """Tokens holding a backtick but no whole fence: part of a fence that several write."""

    @classmethod
    def of(cls, tokenizer: Any) -> StopRules:
        texts = token_texts(tokenizer)
        fences = frozenset(i for i, text in enumerate(texts) if FENCE.search(text))
        return cls(
            fence_ids=fences,
            close_ids=frozenset(i for i, text in enumerate(texts) if ">" in text),
            decode=lambda ids: str(tokenizer.decode(ids)),
            tick_ids=frozenset(
                i for i, text in enumerate(texts) if "`" in text and i not in fences
            ),
        )

    def new_fences(self, tokens: list[int]) -> int:
        """How many fences the completion `tokens`' last token completed: 1 for a token holding
        a whole fence; for one holding a backtick, the fences in the text of the last few tokens
        less those in the same text without it."""
        if not tokens:
            return 0
        if tokens[-1] in self.fence_ids:
            return 1
        if tokens[-1] not in self.tick_ids:
            return 0
        tail = tokens[-TAIL_TOKENS:]
        after, before = self.decode(tail), self.decode(tail[:-1])
        return max(len(FENCE.findall(after)) - len(FENCE.findall(before)), 0)

    def closes_tool_call(self, tokens: list[int]) -> bool:
        """Whether the completion `tokens` just closed its call (`toolcalls.call_closed`),
        tested where its last token holds `>` and completed a closing tag (the text of the last
        few tokens has more tags than without it): once per tag, however long the row."""
        if not tokens or tokens[-1] not in self.close_ids:
            return False
        tail = tokens[-TAIL_TOKENS:]
        if self.decode(tail).count(CALL_CLOSE) <= self.decode(tail[:-1]).count(CALL_CLOSE):
            return False
        return call_closed(self.decode(tokens))

    def closes_program(self, tokens: list[int]) -> bool:
        """Whether the completion `tokens` just closed the block `extract_code` would run
        (`prompts.program_closed`), tested where its last token completed a fence."""
        return self.new_fences(tokens) > 0 and program_closed(self.decode(tokens))

    def watch(self, params: SamplingParams) -> RowWatch | None:
        """A watch over one row's tokens, or None when none of its stop options is set."""
        if not (params.stop_after_code_block or params.stop_after_tool_call):
            return None
        return RowWatch(self, params.stop_after_code_block, params.stop_after_tool_call)


@dataclass
class RowWatch:
    """The stop state of one row: fed every sampled token in order."""

    rules: StopRules
    code_block: bool
    tool_call: bool
    tokens: list[int] = field(default_factory=list)

    def add(self, token: int) -> bool:
        """Whether the row ends with `token`."""
        self.tokens.append(token)
        if self.code_block and self.rules.closes_program(self.tokens):
            return True
        return self.tool_call and self.rules.closes_tool_call(self.tokens)
