"""Where a completion stops besides EOS and its token budget, decided token by token.

    rules = StopRules.of(tokenizer)                 # once per tokenizer
    watch = rules.watch(params, prompt=prompt_ids)  # once per row; None: no rule applies
    if watch is not None and watch.add(token):      # after each sampled token
        ...                                         # the row is done, this token included

Each rule ends a turn where what reads the turn agrees, the rule's text test having one home
there: `stop_after_code_block` at the token that closes the first block `extract_code` would run
(`prompts.program_closed`: a python or untagged block defining a function; a ```bash block or an
example before it does not end the turn), `stop_after_tool_call` at the token that completes the
`</tool_call>` after the call `parse_tool_call` takes (`toolcalls.call_closed`: not a tag only
mentioned, not one drafted while thinking: the row's prompt says whether the completion starts
inside a think block, `calltags.starts_thinking`).

Both are tested only at the tokens that may complete what they look for, found by token id: a
fence (`FENCE`, a run of at least three backticks, whether one token holds it or several tokens
of a byte-level vocabulary write it together: a token holding a backtick but no whole fence is
checked by decoding the row's last few tokens), or the closing tag (a token holding `>` whose
last few tokens' text has the tag). There, the row's text is the text decoded before and the new
tokens' (`RowWatch.text`: decoded after a few tokens of context, so a character of several
tokens reads whole), and each rule reads on from where it stopped (`prompts.program_scan`,
`calltags.CallWatch`): a row costs time linear in its length, however many fences or tags it
writes. Both backends use it: the local decode loop (`infra.inference.decoder`) after every
step, the `vllm` backend on the tokens it streams; token ids and the tokenizer's decode, never a
re-tokenisation.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.task import SamplingParams
from infra.inference.calltags import CALL_CLOSE, CallWatch, starts_thinking
from infra.inference.prompts import program_scan

TAIL_TOKENS = 16
"""Tokens decoded to find `</tool_call>` or a fence written by several tokens (each is at most
a dozen tokens in any vocabulary) before the row's text is read."""
FENCE = re.compile("`{3,}")
"""A code fence: a run of at least three backticks."""
CONTEXT_TOKENS = 4
"""Tokens decoded again before a row's new ones, so that the new ones' text reads as in the whole
row's decode (a SentencePiece token's leading space, the bytes of one character)."""


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

    def new_close(self, tokens: list[int]) -> bool:
        """Whether the completion `tokens`' last token completed a `</tool_call>`: it holds `>`,
        and the text of the last few tokens has more tags than without it."""
        if not tokens or tokens[-1] not in self.close_ids:
            return False
        tail = tokens[-TAIL_TOKENS:]
        return self.decode(tail).count(CALL_CLOSE) > self.decode(tail[:-1]).count(CALL_CLOSE)

    def closes_tool_call(self, tokens: list[int], thinking: bool = False) -> bool:
        """Whether a row writing the completion `tokens` ends at the last under
        `stop_after_tool_call` (`thinking`: its prompt opened a think block)."""
        watch = RowWatch(self, code_block=False, tool_call=True, thinking=thinking)
        return [watch.add(token) for token in tokens][-1:] == [True]

    def closes_program(self, tokens: list[int]) -> bool:
        """Whether a row writing the completion `tokens` ends at the last under
        `stop_after_code_block`."""
        watch = RowWatch(self, code_block=True, tool_call=False)
        return [watch.add(token) for token in tokens][-1:] == [True]

    def watch(self, params: SamplingParams, prompt: Sequence[int] = ()) -> RowWatch | None:
        """A watch over one row's tokens, or None when none of its stop options is set;
        `prompt`: the row's, which says whether the completion starts inside a think block."""
        if not (params.stop_after_code_block or params.stop_after_tool_call):
            return None
        guided = params.tool_choice == "required"
        thinking = params.stop_after_tool_call and starts_thinking(
            prompt, self.decode, guided=guided
        )
        return RowWatch(self, params.stop_after_code_block, params.stop_after_tool_call, thinking)


@dataclass
class RowWatch:
    """The stop state of one row: fed every sampled token in order."""

    rules: StopRules
    code_block: bool
    tool_call: bool
    thinking: bool = False
    """The completion starts inside a think block its prompt opened (`calltags`)."""
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    """The text of `tokens[:read]`: decoded at the fences and tags, the new tokens only."""
    read: int = 0
    decoded: int = 0
    """Tokens decoded for `text`, counted: each a few times at most, however long the row."""
    program_from: int = 0
    """Where `prompts.program_scan` reads on from."""
    calls: CallWatch = field(init=False)

    def __post_init__(self) -> None:
        self.calls = CallWatch(self.thinking)

    def add(self, token: int) -> bool:
        """Whether the row ends with `token`."""
        self.tokens.append(token)
        fence = self.code_block and self.rules.new_fences(self.tokens) > 0
        close = self.tool_call and self.rules.new_close(self.tokens)
        if not (fence or close):
            return False
        text, whole = self._text()
        if fence:
            closed, at = program_scan(text, self.program_from)
            if whole:
                self.program_from = at
            if closed:
                return True
        # a text ending in part of a character is read by a copy: more of it changes the text
        return close and (self.calls if whole else copy.deepcopy(self.calls)).closed(text)

    def _text(self) -> tuple[str, bool]:
        """The row's text (its tokens' decode): the text decoded before and the new tokens'
        (after `CONTEXT_TOKENS` of the old for context); and whether it ends with a whole
        character (else it is not kept: the next token may hold the rest)."""
        start = max(self.read - CONTEXT_TOKENS, 0)
        before = self.rules.decode(self.tokens[start : self.read]) if self.read else ""
        after = self.rules.decode(self.tokens[start:])
        self.decoded += (self.read - start) + (len(self.tokens) - start)
        if after.startswith(before):
            new = after[len(before) :]
            text, self.text = self.text, ""
            text += new  # in place: the row's text is not copied at each fence or tag
        else:  # a decode that is not its parts': the whole row, read again from its start
            text = new = self.rules.decode(self.tokens)
            self.decoded += len(self.tokens)
            self.read, self.program_from, self.calls = 0, 0, CallWatch(self.thinking)
        whole = not text.endswith("\ufffd")
        if whole:
            self.text, self.read = text, len(self.tokens)
        else:  # kept as it was (a copy: a rare row)
            self.text = text[: len(text) - len(new)]
        return text, whole
