"""Which `<tool_call>` tag of a turn is its call: one rule, read over a whole turn (`tags`, what
`infra.inference.toolcalls` parses by) and over a turn growing token by token (`CallWatch`, the
stop rule `stop_after_tool_call`'s, `infra.inference.stops`).

Thinking. A thinking model drafts calls while it reasons, and a draft is no call. Whether a turn
starts inside a think block its prompt says: Qwen3-*-Thinking-2507's and the R1 distills' chat
templates end the generation prompt with an open `<think>`, so the completion holds only the
`</think>`. `starts_thinking` reads that from a row's prompt ids, once, for what reads the turn
(the flag `thinking`); a guided row (`tool_choice="required"`) writes its call from its first
token and never starts thinking. Then (`think_end`):

- a turn that starts thinking thinks up to its first `</think>`;
- otherwise a think block opens only where `<think>` starts the turn (after whitespace: Qwen3's
  hybrid models write the block themselves), and ends at the first `</think>` after it;
- a `<think>` anywhere else is text (prose about the tag, a command that greps for it);
- nothing of a turn still thinking is a call.

The call. Of the tags after the thinking, the call is the first whose JSON (after blanks and a
code fence's opening line, `value_start`) reads as a call (`reads_as_call`): an object with a
string "name", read as Python reads JSON (`_LENIENT`: NaN and repeated keys taken; the parser
tells what is wrong with it). A tag only mentioned or a broken draft is passed over and the scan
goes on right after it; after a call it goes on after the call's JSON.

Growing. `CallWatch.closed(text)` is `toolcalls.call_closed` of a text that each call extends;
it examines only what was added since the call before, so a row's stop rule costs time linear in
the row however many closing tags it writes. Each tag is followed by a scanner of brackets and
strings that resumes where it stopped (`_Tag`): a JSON object ends at its matching bracket, so
the decoder reads it once, when its brackets close, for a verdict that more text cannot change.
While they are open the decoder reads it only each time its text has doubled, to drop a JSON
broken for good (a model repeating a broken call piles up no open tags).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FENCE_OPEN = "```"
PROMPT_TAIL_TOKENS = 16
"""The prompt's last tokens `starts_thinking` decodes (a byte-level vocabulary writes
`<think>\\n` in 8)."""
DECODER_READS_PAST = 9
"""How far past where it fails Python's JSON decoder may have read (`-Infinity` at the failure);
a failure at least this far from the text's end, other than an unterminated string's (whose
position is where the string began), is one no more text mends."""
_BLANKS = re.compile(r"\s*")
_OUTSIDE = re.compile(r'[^{}\[\]"]*')
"""What a JSON scanner passes over outside strings: all but brackets and quotes."""
_INSIDE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
"""A string's characters up to its closing quote (an escape taken whole)."""
_LENIENT = json.JSONDecoder(strict=False)
"""What finds the call: JSON as Python reads it, NaN and repeated keys taken."""


def starts_thinking(
    prompt: Sequence[int], decode: Callable[[list[int]], str], *, guided: bool = False
) -> bool:
    """Whether a row's completion starts inside a think block: its prompt (`decode`: the
    tokenizer's, special tokens kept) ends with an open `<think>` and the row is not guided."""
    if guided or not prompt:
        return False
    return str(decode(list(prompt[-PROMPT_TAIL_TOKENS:]))).rstrip().endswith(THINK_OPEN)


def think_end(text: str, thinking: bool, close_from: int = 0) -> int | None:
    """Where the thinking of a turn ends (0: the turn does not think), None while it still
    thinks; `close_from`: where to look for its `</think>` from (a growing text's last look
    found none before)."""
    if not thinking:
        at = after_blanks(text, 0)
        if not text.startswith(THINK_OPEN, at):
            return 0
        close_from = max(close_from, at + len(THINK_OPEN))
    close = text.find(THINK_CLOSE, close_from)
    return None if close < 0 else close + len(THINK_CLOSE)


def tags(text: str, thinking: bool) -> Iterator[tuple[int, int | None]]:
    """Each call tag of a whole turn after its thinking, in order: its position, and where its
    JSON ends when that JSON reads as a call (else None: the scan goes on after the tag)."""
    at = think_end(text, thinking)
    if at is None:
        return
    while (tag := text.find(CALL_OPEN, at)) >= 0:
        end = reads_as_call(text, value_start(text, tag))
        yield tag, end
        at = tag + len(CALL_OPEN) if end is None else end


def tags_before_the_flag(text: str) -> Iterator[tuple[int, int | None]]:
    """`tags` as the release before `thinking` read a turn (its records carry no flag, and
    `toolcalls.full_call` reads them so too): every `<think>…</think>` block hides the tags in
    it, wherever it stands, and nothing after an unclosed one is a call."""
    at = 0
    while (tag := text.find(CALL_OPEN, at)) >= 0:
        think = text.find(THINK_OPEN, at, tag)
        if think >= 0:
            close = text.find(THINK_CLOSE, think + len(THINK_OPEN))
            if close < 0:
                return
            at = close + len(THINK_CLOSE)
            continue
        end = reads_as_call(text, value_start(text, tag))
        yield tag, end
        at = tag + len(CALL_OPEN) if end is None else end


def reads_as_call(text: str, at: int) -> int | None:
    """Where the JSON value at `at` ends, if it is an object with a string "name"; else None."""
    try:  # `text` itself, not a copy of its rest (`tags` reads a whole turn)
        value, end = _LENIENT.raw_decode(text, at)
    except Exception:  # JSONDecodeError, RecursionError, …: no call
        return None
    return end if isinstance(value, dict) and isinstance(value.get("name"), str) else None


def value_start(text: str, tag: int) -> int:
    """Where the JSON of the opening tag at `tag` begins: after blanks and a code fence's
    opening line (a fence inside the tags)."""
    at = after_blanks(text, tag + len(CALL_OPEN))
    if text.startswith(FENCE_OPEN, at):
        newline = text.find("\n", at)
        at = len(text) if newline < 0 else after_blanks(text, newline + 1)
    return at


def after_blanks(text: str, at: int) -> int:
    """The first position from `at` that is not whitespace (`str.isspace`'s)."""
    blanks = _BLANKS.match(text, at)
    return blanks.end() if blanks else at


class CallWatch:
    """`call_closed` of a turn that grows: `closed(text)`, each `text` extending the last."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.start: int | None = None
        """Where tags may begin: the end of the thinking, once it ended."""
        self.think_from = 0
        self.tag_from = 0
        self.tags: list[_Tag] = []
        """The tags that may still become the call, in order; the last one the call, where one
        reads as a call (the earlier ones may yet: a call whose JSON holds the later one)."""

    def closed(self, text: str) -> bool:
        """Whether `text` holds its call and a closing tag after the call's JSON."""
        if self.start is None:
            self.start = self._start(text)
            if self.start is None:
                return False
            self.tag_from = self.start
        if not (self.tags and self.tags[-1].end is not None):
            while (at := text.find(CALL_OPEN, self.tag_from)) >= 0:
                self.tag_from = at + len(CALL_OPEN)
                self.tags.append(_Tag(at, self.tag_from))
            self.tag_from = max(self.tag_from, len(text) - len(CALL_OPEN) + 1)
        kept: list[_Tag] = []
        for tag in self.tags:
            verdict = tag.advance(text)
            if verdict is not False:
                kept.append(tag)
            if verdict:
                break  # the call: no later tag is ever the call
        self.tags = kept
        if not kept or kept[-1].end is None:
            return False
        call = kept[-1]
        found = text.find(CALL_CLOSE, call.close_from)
        call.close_from = (
            found if found >= 0 else max(call.close_from, len(text) - len(CALL_CLOSE) + 1)
        )
        return found >= 0

    def _start(self, text: str) -> int | None:
        """`think_end`, None also while a turn of blanks may still open a block."""
        if not self.thinking:
            at = after_blanks(text, 0)
            if len(text) - at < len(THINK_OPEN) and THINK_OPEN.startswith(text[at:]):
                return None
        end = think_end(text, self.thinking, self.think_from)
        if end is None:
            self.think_from = max(self.think_from, len(text) - len(THINK_CLOSE) + 1)
        return end


@dataclass
class _Tag:
    """One opening tag of a growing turn, and how far its JSON was read."""

    at: int
    scan: int
    """Where reading the text goes on (blanks, a fence's opening line, the JSON)."""
    fence: int = 0
    """0: blanks before the value (a fence may open), 1: in a fence's opening line, 2: blanks
    after it."""
    value: int | None = None
    depth: int = 0
    in_string: bool = False
    end: int | None = None
    """Where the JSON ends, once it reads as a call."""
    checked: int | None = None
    """The text's length when the decoder last read the JSON with its brackets open."""
    close_from: int = 0
    """Where to look for a closing tag after the call from."""

    def advance(self, text: str) -> bool | None:
        """True: the JSON reads as a call (`end`); False: it never will; None: not yet."""
        if self.end is not None:
            return True
        if self.value is None and not self._find_value(text):
            return None
        assert self.value is not None
        if text[self.value] != "{":
            return False
        if self._brackets_closed(text):  # the decoder reads the JSON alone (`_broken`)
            end = reads_as_call(text[self.value : self.scan], 0)
            self.end = None if end is None else self.value + end
            self.close_from = self.end or 0
            return self.end is not None
        if self.checked is None or len(text) - self.value >= 2 * (self.checked - self.value):
            self.checked = len(text)
            if _broken(text, self.value):
                return False
        return None

    def _find_value(self, text: str) -> bool:
        """`value_start`, False while the text ends before it is known."""
        while True:
            if self.fence == 1:
                newline = text.find("\n", self.scan)
                if newline < 0:
                    self.scan = len(text)
                    return False
                self.fence, self.scan = 2, newline + 1
            self.scan = after_blanks(text, self.scan)
            rest = len(text) - self.scan
            if rest == 0:
                return False
            if self.fence == 0 and text.startswith(FENCE_OPEN, self.scan):
                self.fence = 1
                continue
            if self.fence == 0 and rest < len(FENCE_OPEN) and FENCE_OPEN.startswith(text[-rest:]):
                return False  # "`" or "``": a fence may be coming
            self.value = self.scan
            return True

    def _brackets_closed(self, text: str) -> bool:
        """Whether the object's brackets closed (strings and escapes minded), read on from
        where the last look stopped."""
        at, size = self.scan, len(text)
        while True:
            if self.in_string:
                at = _INSIDE.match(text, at).end()  # type: ignore[union-attr]
                if at >= size or text[at] == "\\":  # the text ends in the string or an escape
                    break
                self.in_string = False
            else:
                at = _OUTSIDE.match(text, at).end()  # type: ignore[union-attr]
                if at >= size:
                    break
                if text[at] == '"':
                    self.in_string = True
                elif text[at] in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth == 0:
                        self.scan = at + 1
                        return True
            at += 1
        self.scan = at
        return False


def _broken(text: str, at: int) -> bool:
    """Whether the JSON at `at`, its brackets still open, fails to decode however the text goes
    on: the decoder fails far enough from the end (`DECODER_READS_PAST`), not in a string. It
    reads a copy of the text from `at` on: an error counts the lines before it."""
    rest = text[at:]
    try:
        _LENIENT.raw_decode(rest)
    except json.JSONDecodeError as exc:
        unterminated = exc.msg.startswith("Unterminated string")
        return not unterminated and len(rest) - exc.pos >= DECODER_READS_PAST
    except Exception:  # RecursionError, a 4300-digit integer: more text mends neither
        return True
    return False
