"""The codec server's `/decode` (infra/codec.py): references resolved within one request's budget.

    decoded = decode_payloads(reader, payloads)   # each JSON payload's references given content

Each reference a payload holds is given a `content` (the object's text; a JSON document parsed,
compacted and cut, infra/codec_documents.py, with the references inside it resolved too, one
level deep) or a `content_error` (one line: what the reader could not show, or the budget
would not). The texts they lead to go in the payload's `shown` lines (infra/codec_shown.py).

A request may read and add at most so much (`_Budget`, made when the request gets its read
thread, so its wait for one takes none of its time): `MAX_REFS` references (each read tried
counts, found or not), `MAX_SECONDS` of reads, `MAX_BYTES` sent (`content`, `shown`, as JSON,
before base64; a document's own bytes and the `shown` lines it adds are reserved before the
references inside it are read, so only those that do not fit are refused, not the document).
What the budget refuses is a `content_error` naming the limit (`OVER_TIME`, `OVER_BYTES`,
`OVER_REFS`); once one reference was over the bytes, the later ones are too. The lines saying
why a reference is not shown are not counted in `MAX_BYTES` (a line on each reference: a
response is at most its request's payloads, `MAX_BYTES` and those).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contracts.common import ObjectRef
from infra.codec_documents import MAX_DOCUMENT_BYTES, as_sent, compact, fit
from infra.codec_payloads import as_ref, rewritten
from infra.codec_reader import NotShown, Reader
from infra.codec_shown import Shown

MAX_OBJECT_BYTES = 64 * 1024
"""Bytes of one object sent at most (more is cut, `content_truncated` says how): of a text,
its first bytes (of a log, `.txt`, its last); of a JSON document, its JSON once shortened."""
MAX_BYTES = 1024 * 1024
"""Bytes one response adds at most, as sent: `content` and `shown` as JSON (a text is in both;
a control byte takes 6), before base64; the lines saying why a reference is not, apart."""
MAX_REFS = 256
"""References resolved in one request at most."""
MAX_DEPTH = 2
"""A reference inside a resolved JSON document is resolved too; one inside that is not."""
MAX_SECONDS = 10.0
"""Time from when a request gets its read thread (not its wait for one) in which it may read
S3; references after it get no content."""
OVER_TIME = f"not shown: over the codec server's time for one request ({MAX_SECONDS:g} s)"
OVER_BYTES = f"not shown: over the codec server's bytes for one request ({MAX_BYTES} bytes)"
OVER_REFS = f"not shown: over the codec server's references for one request ({MAX_REFS})"
log = logging.getLogger("tempered.codec")


@dataclass
class _Failures:
    """The references a request could not show, for one line of the log at its end."""

    first: dict[str, str] = field(default_factory=dict)  # the UI's line: its first detail
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, err: NotShown) -> None:
        self.first.setdefault(str(err), err.detail)
        self.counts[str(err)] += 1

    def log(self) -> None:
        if self.counts:
            kinds = "; ".join(f"{n} like {self.first[line]}" for line, n in self.counts.items())
            log.warning("%d references not shown: %s", self.counts.total(), kinds)


@dataclass
class _Budget:
    """What one request may still read and add, and what it could not show; made when the
    request gets its read thread (its `MAX_SECONDS` start then)."""

    refs: int = MAX_REFS
    bytes: int = MAX_BYTES
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    failures: _Failures = field(default_factory=_Failures)
    spent: bool = False  # a reference was over the bytes: the later ones get no content
    lines: int = 0  # bytes of the `content_error` lines given (not counted in `bytes`)

    def over(self, limit: int) -> str | None:
        """The line of the limit a reference given at most `limit` bytes is over, if any."""
        if self.spent or limit <= 0:
            return OVER_BYTES
        if self.refs <= 0:
            return OVER_REFS
        if time.monotonic() > self.deadline:
            return OVER_TIME
        return None


@dataclass
class Resolver:
    """Resolves references in decoded JSON for display, within one request's `_Budget`, and
    collects the texts they lead to (`shown`) for the top of the payload."""

    reader: Reader
    budget: _Budget = field(default_factory=_Budget)
    shown: Shown = field(default_factory=Shown)
    found: bool = False  # a reference: the payload is marked decoded (`shown`, `payload`)

    def resolve(self, node: Any, depth: int = 0) -> Any:
        if isinstance(node, list):
            return [self.resolve(item, depth) for item in node]
        if not isinstance(node, dict):
            return node
        resolved = {name: self.resolve(value, depth) for name, value in node.items()}
        ref = as_ref(node)
        if ref is not None and depth < MAX_DEPTH:
            resolved.update(self._content(ref, depth))
        return resolved

    def _content(self, ref: ObjectRef, depth: int) -> dict[str, Any]:
        budget = self.budget
        self.found = True
        limit = min(MAX_OBJECT_BYTES, budget.bytes // 2)  # a text is sent twice (`shown`)
        if (over := budget.over(limit)) is not None:
            return self._not_shown(over)
        budget.refs -= 1  # a read tried counts, whatever it finds
        document = ref.key.endswith(".json") and ref.size <= MAX_DOCUMENT_BYTES
        try:  # a document whole (parsed, then cut to `limit`), any other object what is shown
            data, whole = self.reader.read(
                ref, MAX_DOCUMENT_BYTES if document else limit, from_end=_is_log(ref)
            )
        except NotShown as err:  # S3 not answering: the reader answers the next ones at once
            budget.failures.add(err)
            return self._not_shown(str(err))
        room, mark, lines = budget.bytes, self.shown.mark(), budget.lines
        content = self._holding(ref, data, whole, limit, depth, mark[0])
        # what it sends and shows, less the lines inside it saying why a reference is not shown
        cost = len(as_sent(content)) + _cost(self.shown.lines[mark[0] :]) - (budget.lines - lines)
        if cost > room:  # none of it (a cut JSON document or escape is no display), no more
            self.shown.undo(mark)
            budget.spent, budget.lines = True, lines
            return self._not_shown(OVER_BYTES)
        budget.bytes = room - cost  # what is sent, the references inside it included
        return content

    def _not_shown(self, line: str) -> dict[str, Any]:
        reply = {"content_error": line}
        self.budget.lines += len(as_sent(reply)) - 1  # inside its reference: `,` for `{}`
        return reply

    def _holding(
        self, ref: ObjectRef, data: bytes, whole: bool, limit: int, depth: int, since: int
    ) -> dict[str, Any]:
        """What `ref` is given for `data`, what it holds (`whole`: all of it), at most `limit`
        bytes of it; its texts added to `shown` (after its line `since`)."""
        label, size, of = "/".join(ref.key.split("/")[-2:]), ref.size, ""
        if whole and ref.key.endswith(".json"):
            try:
                document = compact(json.loads(data))
                fitted = fit(document, limit)
            except (ValueError, RecursionError):
                pass  # not JSON after all (or too deep to read as JSON): show the text
            else:
                self.shown.glance(label, document)
                if fitted is not None:
                    return self._document(label, fitted, fitted is not document, depth, since)
                data = as_sent(document)  # too many items to fit: its first bytes, as text
                size, of = len(data), f" of its compacted JSON ({ref.size} stored)"
        from_end = not whole and _is_log(ref)  # the reader read its end
        data = data if from_end else data[:limit]  # a document read whole, cut
        text = data.decode(errors="replace")
        if len(data) == size:
            self.shown.text(label, text)
            return {"content": text}
        cut = f"{'last' if from_end else 'first'} {len(data)} of {size} bytes{of}"
        self.shown.text(label, text, cut, from_end)
        return {"content": text, "content_truncated": cut}

    def _document(
        self, label: str, document: Any, cut: bool, depth: int, since: int
    ) -> dict[str, Any]:
        """A parsed document's content (`cut`: its long strings were), references resolved
        once what it sends and shows itself (`shown` from its line `since`) is reserved."""
        self.shown.texts(label, document)
        content = {"content": document}
        if cut:
            content["content_truncated"] = "long strings cut"
        reserved = len(as_sent(content)) + _cost(self.shown.lines[since:])
        if reserved > self.budget.bytes:  # itself over: `_content` refuses it, none read
            return content
        # what the references inside it may add; `_content` charges the whole once resolved
        self.budget.bytes -= reserved
        content["content"] = self.resolve(document, depth + 1)
        return content


def _cost(lines: list[str]) -> int:
    """Bytes `shown` lines take as sent (each with its `,`)."""
    return sum(len(as_sent(line)) + 1 for line in lines)


def _is_log(ref: ObjectRef) -> bool:
    """A log (stdout.txt, stderr.txt): shown by its end when cut, where its error is."""
    return ref.key.endswith(".txt")


def decode_payloads(reader: Reader, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Temporal's remote-codec `/decode`: JSON payloads with their references resolved, within
    one budget the request's payloads share, made now (on the request's read thread)."""
    budget = _Budget()  # `shown` is each payload's own
    decoded = [_decode_one(Resolver(reader, budget), payload) for payload in payloads]
    budget.failures.log()
    return decoded


def _decode_one(resolver: Resolver, payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with its references resolved; unchanged if it has none, is no JSON payload,
    or one this server cannot take (malformed, nested too deeply): it fails alone."""

    def decoded(value: Any) -> bytes | None:
        resolved = resolver.resolve(value)
        if not resolver.found:
            return None
        # what the references hold first (row previews, boxes show the top); `/encode` undoes it
        return as_sent({"shown": resolver.shown.lines, "payload": resolved})

    return rewritten(payload, decoded)
