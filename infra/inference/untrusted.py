"""Text the template did not write (a task, a tool's output), encoded as text and nothing else.

    text = UntrustedText(tokenizer)
    ids = text.encode(rendered, (start, end))   # rendered[start:end] is the untrusted content
    ids = text.plain_ids(content)               # content alone, special tokens' text split
    cut = clip(content, count_tokens=text.count) # head and tail within a token budget

A tokenizer turns the *text* of its special tokens into those tokens. A tool result (a file the
model wrote, `cat` of anything) or a task containing `<|im_end|>\\n<|im_start|>assistant\\n`
would otherwise become a real end of turn and a real assistant turn in the prompt, which the
model reads and the learner trains on. `encode` keeps the template's own special tokens (those
outside the content) and encodes the content with special tokens split into ordinary ones.

Ids of ordinary text are unchanged: where no special token's text overlaps the content,
`encode` is exactly `tokenizer.encode(rendered, add_special_tokens=False)`, the ids the chat
template gives. Only content with a special token's text takes the split path, whose
segments between the template's special tokens are encoded on their own (as the tokenizer
itself does).

`clip` bounds an observation by tokens too, not only by characters: 4,000 characters of CJK or
of random bytes are about 8,000 and 4,000 tokens, a whole default context (4,096) in one result.
Its note of what it left out repeats the notes of that kind in the part it left out: a stream's
capture marks the bytes it dropped so (infra/sandbox/process.py, `[... stdout: 170468 of its
235004 bytes left out ...]`), and a clip, which keeps a result's first and last characters,
cuts that mark out (before, its note then told only the characters it dropped itself).

A `read_file` result that `clip` may cut (over `contracts.episode.CLIPPED_FROM_BYTES`) starts
with the lines of the file it holds (`contracts.episode.READ_FILE_LINES`): its clip keeps whole
lines where it can, and its note names the lines of the file left out and how to read them
(`read_lines_hint`) in a result that comes back whole: the lines, or the first of them that one
result holds, or where one line is longer, the bytes of it that one result holds (`sed … | cut
-b`). Before, a note named the lines left out however long: inside a line longer than the clip
it named that line (or all three lines of a file of three ~3 KB lines), whose result came back
cut the same way, and a model that did as told read the same cut again. Before that, a
7,780-character file came back as 2,000 characters either side of `[... 3780 characters left
out ...]`, and a model that wrote back what it read deleted the middle of the file.

Not covered: rendering the template (infra/inference/prompts.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from contracts.episode import OBSERVATION_CHARS as OBSERVATION_CHARS  # re-exported
from contracts.episode import OBSERVATION_TOKENS as OBSERVATION_TOKENS
from contracts.episode import READ_FILE_LINES, lines_header, read_lines_hint

LEFT_OUT = re.compile(r"\[\.\.\. ([^\[\]\n]{1,100}) left out \.\.\.\]")
"""A note of what was left out (`clip`'s own, a capture's): what it says, in its group."""
FRAME = 32
"""Room (characters, tokens) a tool's framing takes around what it read: `read_file`'s line
header is counted apart, bash's `exit code: 0\\nstdout:\\n` is 21 characters."""
BY_BASH = "read them with bash: "
"""How `read_lines_hint` starts a `sed` command (a byte range is read by piping it to `cut`)."""
REPEATED_NOTES = 4
"""The most notes `clip` repeats from what it leaves out (a program may print any number)."""
Budget = tuple[int, Callable[[str], bool]]
"""What one result holds: at most this many characters, and whether a text comes back whole."""


class UntrustedText:
    """One tokenizer's encoding of content that must not become special tokens."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.specials = {
            str(tok.content): int(i)
            for i, tok in tokenizer.added_tokens_decoder.items()
            if tok.special
        }
        # longest first: the alternation then matches as the tokenizer does (leftmost-longest)
        names = sorted(self.specials, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, names))) if names else None
        # A private copy of the fast tokenizer with special tokens split, set once: HF's
        # `split_special_tokens=True` flips a flag on the *shared* backend for each call, which
        # races with the prompts that other threads encode with the same tokenizer.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._plain: Any = None
        if backend is not None:
            from tokenizers import Tokenizer

            self._plain = Tokenizer.from_str(backend.to_str())
            self._plain.no_truncation()
            self._plain.no_padding()
            self._plain.encode_special_tokens = True

    def plain_ids(self, text: str) -> list[int]:
        """`text` as ordinary tokens only: a special token's text is split into plain tokens."""
        if not text:
            return []
        if self._plain is not None:
            return [int(t) for t in self._plain.encode(text, add_special_tokens=False).ids]
        ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        return [int(t) for t in ids]

    def count(self, text: str) -> int:
        """Tokens of `text` as untrusted content."""
        return len(self.plain_ids(text))

    def encode(self, rendered: str, span: tuple[int, int]) -> list[int]:
        """The ids of `rendered`, whose `span` is untrusted: the template's special tokens kept,
        none made from the content's text."""
        start, end = span
        matches = list(self._pattern.finditer(rendered)) if self._pattern else []
        if all(m.end() <= start or m.start() >= end for m in matches):
            return [int(t) for t in self.tokenizer.encode(rendered, add_special_tokens=False)]
        assert self._pattern is not None  # a match was found
        # the template's own: matches that lie wholly outside the content (one straddling the
        # content's edge is partly content's text, so text)
        own = [
            m
            for lo, hi in ((0, start), (end, len(rendered)))
            for m in self._pattern.finditer(rendered, lo, hi)
        ]
        ids: list[int] = []
        at = 0
        for m in own:
            ids += self.plain_ids(rendered[at : m.start()])
            ids.append(self.specials[m.group()])
            at = m.end()
        return ids + self.plain_ids(rendered[at:])


def clip(
    text: str,
    limit: int = OBSERVATION_CHARS,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int = OBSERVATION_TOKENS,
) -> str:
    """`text`, or its head and tail around a note of how many characters were left out (and
    the first `REPEATED_NOTES` notes of `LEFT_OUT`'s kind among them): at most `limit`
    characters and, given `count_tokens`, head and tail at most `max_tokens // 2` tokens each."""

    def fits(piece: str) -> bool:  # a result of `piece` and a tool's framing comes back whole
        return len(piece) + FRAME <= limit and (
            count_tokens is None or count_tokens(piece) + FRAME <= max_tokens
        )

    over = len(text) > limit
    if not over and (count_tokens is None or count_tokens(text) <= max_tokens):
        return text
    # the character cut first: it is free, and bounds what is tokenized below
    head, tail = (text[: limit // 2], text[len(text) - limit // 2 :]) if over else (text, text)
    if count_tokens is not None:
        half = max_tokens // 2
        head = head[: _longest(len(head), lambda n: count_tokens(head[:n]) <= half)]
        kept = _longest(len(tail), lambda n: count_tokens(tail[len(tail) - n :]) <= half)
        # not cut by characters, head and tail come from the same text: never overlap them
        kept = min(kept, len(text) - len(head)) if not over else kept
        tail = tail[len(tail) - kept :]
    lines = ""
    if (shown := READ_FILE_LINES.match(text)) and len(head) >= shown.end():
        head, tail, lines = _whole_lines(text, head, tail, shown, (limit, fits))
    left = len(text) - len(head) - len(tail)
    notes = LEFT_OUT.findall(text, len(head), len(text) - len(tail))
    repeated = "".join(f"; {note} left out" for note in notes[:REPEATED_NOTES])
    if len(notes) > REPEATED_NOTES:
        repeated += f"; {len(notes) - REPEATED_NOTES} more such notes"
    if lines and head.endswith("\n"):  # the seam ends its last line
        head = head[:-1]
    return f"{head}\n[... {left} characters left out{lines}{repeated} ...]\n{tail}"


def _whole_lines(
    text: str, head: str, tail: str, shown: re.Match[str], budget: Budget
) -> tuple[str, str, str]:
    """`head` and `tail` of a `read_file` result cut back to whole lines of the file (where a
    whole one is left on that side), and the note's words on the lines not wholly shown."""
    body, first, last = shown.end(), int(shown["first"]), int(shown["last"])
    if (end := head.rfind("\n") + 1) > body:
        head = head[:end]
    start = len(text) - len(tail)
    if text[start - 1] != "\n" and 0 <= (newline := tail.find("\n")) < len(tail) - 1:
        tail = tail[newline + 1 :]
        start = len(text) - len(tail)
    if start <= len(head):
        return head, tail, ""
    # the lines of the first and the last character left out
    lo = min(first + text.count("\n", body, len(head)), last)
    hi = min(first + text.count("\n", body, start - 1), last)
    how = _how_to_read(text, shown, (lo, hi), len(head), budget)
    return head, tail, f": {_named(lo, hi)}{how}"


def _how_to_read(
    text: str, shown: re.Match[str], lines: tuple[int, int], cut: int, budget: Budget
) -> str:
    """How to read `lines` (lo, hi) of a `read_file` result, left out from `text[cut]` on, in
    a result that comes back whole (`budget`): all of them, or the first of them that one
    result holds; where line lo alone is longer, the bytes of it from `cut` on that one result
    holds (`sed … | cut -b`); else nothing."""
    (lo, hi), (limit, fits), path, total = lines, budget, shown["path"], int(shown["total"])
    begin = text.rfind("\n", shown.end() - 1, cut) + 1  # where line `lo` starts
    ends: list[int] = []  # where lines lo, lo+1, … end (after their newline), while they may fit
    while len(ends) <= hi - lo and (not ends or ends[-1] - begin <= limit):
        end = text.find("\n", ends[-1] if ends else begin)
        ends.append(len(text) if end < 0 else end + 1)
        if end < 0:
            break

    def whole(n: int) -> bool:  # lines lo..lo+n-1 come back whole, with their header
        return n == 0 or fits(lines_header(path, lo, lo + n - 1, total) + text[begin : ends[n - 1]])

    if (n := _longest(len(ends), whole)) == hi - lo + 1:
        return f"; {read_lines_hint(path, lo, hi)}"
    if n:
        return (
            f"; one result holds {_named(lo, lo + n - 1)}: {read_lines_hint(path, lo, lo + n - 1)}"
        )
    sed = read_lines_hint(path, lo, lo)  # line `lo` alone is longer than one result holds
    stop = ends[0] - (text[ends[0] - 1] == "\n")
    size = _longest(stop - cut, lambda n: fits(text[cut : cut + n]))
    if not sed.startswith(BY_BASH) or size == 0:
        return ""
    a = len(text[begin:cut].encode()) + 1
    b = a + len(text[cut : cut + size].encode()) - 1
    return f"; one result holds bytes {a}-{b} of line {lo}: {sed} | cut -b {a}-{b}"


def _named(lo: int, hi: int) -> str:
    return f"line {lo}" if lo == hi else f"lines {lo}-{hi}"


def _longest(size: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [0, size] that fits (binary search: tokens grow with characters)."""
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
