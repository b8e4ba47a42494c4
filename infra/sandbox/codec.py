"""The verifier's data-only codec: plain Python values to bytes and back, never code.

    blob = encode(("call", "add", (2, 3), {}))     # NotPlainData for anything else
    value = decode(blob)                           # CodecError for malformed or oversized input

Plain data is None, bool, int, float (nan/inf and -0.0 kept), complex, str (lone surrogates
kept), bytes, and list, tuple, dict, set, frozenset of plain data, nested. Types are matched
exactly: a subclass of int or str, a bytearray, a generator or any other object is refused,
so no method of a foreign class ever runs on either side. `decode` builds fresh objects from
the bytes alone, with caps on total size, nesting depth and number of values, so a hostile
peer can make it fail but never make it run code, recurse without bound or allocate beyond
the caps. The checker and the candidate speak it over pipes (`frame`, `write_all`, `FrameReader`);
the host speaks it to the checker and to the zygotes.

Wire format: one tag byte per value; scalars carry a fixed-size or length-prefixed payload,
containers a count then their items (a dict: key, value, key, value ...). Lengths and counts
are 4-byte big-endian. A frame is a 4-byte length then one encoded value.

Stdlib only (it is loaded into the sandbox's interpreter by `zygote.py`); not a general
serialisation format: no versioning, no streaming, no shared references (a value referenced
twice is encoded twice; a cycle hits the depth cap).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

MAX_BYTES = 16 << 20
"""Largest encoded value (and frame) accepted by default."""
MAX_DEPTH = 100
"""Deepest nesting of containers accepted by default."""
MAX_ITEMS = 1_000_000
"""Most values (scalars and containers together) in one encoded value by default."""

_DOUBLE, _COMPLEX, _LENGTH = struct.Struct(">d"), struct.Struct(">dd"), struct.Struct(">I")


class CodecError(ValueError):
    """The bytes are not one well-formed encoded value within the caps."""


class NotPlainData(TypeError):
    """The value (or something inside it) is not plain data; the message says what and where."""


def describe(value: object) -> str:
    """A short name of the value's type for error messages (never calls the value's methods)."""
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__name__


def encode(
    value: object, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, what: str = "the value"
) -> bytes:
    """`value` as bytes; NotPlainData (naming `what` and the path inside it) if it is not plain
    data or exceeds the caps."""
    out: list[bytes] = []
    try:
        size = _encode(value, out, max_depth)
    except _Refused as refused:
        where = f" (at {''.join(reversed(refused.path))})" if refused.path else ""
        raise NotPlainData(f"{what}{where} {refused.reason}") from None
    if size > max_bytes:
        raise NotPlainData(f"{what} is {size} bytes encoded; the limit is {max_bytes}")
    return b"".join(out)


class _Refused(Exception):  # noqa: N818 - internal: becomes NotPlainData with its path
    def __init__(self, reason: str) -> None:
        self.reason, self.path = reason, list[str]()


def _encode(value: Any, out: list[bytes], depth: int) -> int:  # noqa: C901, PLR0911
    """Append `value` to `out`; return the bytes appended. Exact type matches only; the path
    to a refused value is only built when one is refused."""
    cls = type(value)
    if cls is int:
        raw = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out.append(b"i" + _LENGTH.pack(len(raw)) + raw)
        return 5 + len(raw)
    if cls is str:
        raw = value.encode("utf-8", "surrogatepass")
        out.append(b"s" + _LENGTH.pack(len(raw)) + raw)
        return 5 + len(raw)
    if value is None or cls is bool:
        out.append(b"N" if value is None else b"T" if value else b"F")
        return 1
    if cls is float:
        out.append(b"f" + _DOUBLE.pack(value))
        return 9
    if cls is complex:
        out.append(b"c" + _COMPLEX.pack(value.real, value.imag))
        return 17
    if cls is bytes:
        out.append(b"b" + _LENGTH.pack(len(value)) + value)
        return 5 + len(value)
    tag = _CONTAINER_TAGS.get(cls)
    if tag is None:
        raise _Refused(f"is a {describe(value)}, not plain data")
    if depth <= 0:
        raise _Refused("is nested too deeply (or contains itself)")
    items = list(value.items()) if cls is dict else list(value)
    out.append(tag + _LENGTH.pack(len(items)))
    size, index = 5, 0
    try:
        if cls is dict:
            for index, (key, item) in enumerate(items):  # noqa: B007 - read by the handler
                size += _encode(key, out, depth - 1) + _encode(item, out, depth - 1)
        else:
            for index, item in enumerate(items):  # noqa: B007
                size += _encode(item, out, depth - 1)
    except _Refused as refused:
        key = items[index][0] if cls is dict else index
        label = repr(key)[:40] if tag in b"ltd" and type(key) in (str, int) else "..."
        refused.path.append(f"[{label}]")
        raise
    return size


def join_tuple(*encoded: bytes) -> bytes:
    """The encoding of a tuple whose items are given already encoded."""
    return b"t" + _LENGTH.pack(len(encoded)) + b"".join(encoded)


_CONTAINER_TAGS: dict[type, bytes] = {
    list: b"l",
    tuple: b"t",
    dict: b"d",
    set: b"S",
    frozenset: b"z",
}


def decode(
    data: bytes, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS
) -> Any:
    """The value encoded in `data`, as fresh objects; CodecError for anything else."""
    if len(data) > max_bytes:
        raise CodecError(f"{len(data)} bytes; the limit is {max_bytes}")
    reader = _Reader(bytes(data), max_items)
    value = reader.value(max_depth)
    if reader.pos != len(reader.data):
        raise CodecError(f"{len(reader.data) - reader.pos} stray bytes after the value")
    return value


class _Reader:
    __slots__ = ("data", "items_left", "pos")

    def __init__(self, data: bytes, max_items: int) -> None:
        self.data, self.pos, self.items_left = data, 0, max_items

    def take(self, count: int) -> bytes:
        start = self.pos
        end = start + count
        if end > len(self.data):
            raise CodecError("truncated value")
        self.pos = end
        return self.data[start:end]

    def length(self) -> int:
        pos = self.pos
        if pos + 4 > len(self.data):
            raise CodecError("truncated value")
        self.pos = pos + 4
        return int(_LENGTH.unpack_from(self.data, pos)[0])

    def value(self, depth: int) -> Any:  # noqa: C901, PLR0911, PLR0912
        self.items_left -= 1
        if self.items_left < 0:
            raise CodecError("too many values")
        pos = self.pos
        if pos >= len(self.data):
            raise CodecError("truncated value")
        tag, self.pos = self.data[pos], pos + 1
        if tag == 0x69:  # i
            return int.from_bytes(self.take(self.length()), "big", signed=True)
        if tag == 0x73:  # s
            try:
                return self.take(self.length()).decode("utf-8", "surrogatepass")
            except UnicodeDecodeError as exc:
                raise CodecError(f"invalid UTF-8 in a string: {exc.reason}") from None
        if tag in _SINGLETONS:
            return _SINGLETONS[tag]
        if tag == 0x66:  # f
            return float(_DOUBLE.unpack(self.take(8))[0])
        if tag == 0x63:  # c
            real, imag = _COMPLEX.unpack(self.take(16))
            return complex(real, imag)
        if tag == 0x62:  # b
            return self.take(self.length())
        if tag not in _CONTAINERS:
            raise CodecError(f"unknown tag {bytes([tag])!r} at byte {pos}")
        if depth <= 0:
            raise CodecError("nested too deeply")
        count = self.length()
        if count > len(self.data) - self.pos:  # every item takes at least one byte
            raise CodecError("truncated container")
        item = self.value
        if tag == 0x64:  # d
            pairs = [(item(depth - 1), item(depth - 1)) for _ in range(count)]
            try:
                return dict(pairs)
            except TypeError:
                raise CodecError("unhashable dict key") from None
        items = [item(depth - 1) for _ in range(count)]
        try:
            return _CONTAINERS[tag](items)
        except TypeError:
            raise CodecError("unhashable set item") from None


_SINGLETONS: dict[int, object] = {ord("N"): None, ord("T"): True, ord("F"): False}
_CONTAINERS: dict[int, Callable[[list[Any]], Any]] = {
    tag[0]: cls for cls, tag in _CONTAINER_TAGS.items()
}


# --- frames over file descriptors (blocking; the checker adds deadlines on top) ------------


def frame(value: object, max_bytes: int = MAX_BYTES) -> bytes:
    """`value` encoded and length-prefixed, ready for `write_all`."""
    return frame_encoded(encode(value, max_bytes))


def frame_encoded(body: bytes) -> bytes:
    """An already encoded value, length-prefixed."""
    return _LENGTH.pack(len(body)) + body


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd` (blocking)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class EndOfFile(CodecError):
    """The peer closed its end before (or in the middle of) a frame."""


class FrameReader:
    """Frames from one fd, read in large chunks (one read per small frame, not two).

    `wait`, if given, is called before every read (the checker passes its deadline there)."""

    def __init__(self, fd: int, max_bytes: int = MAX_BYTES) -> None:
        self.fd, self.max_bytes, self.buffer = fd, max_bytes, bytearray()

    def _fill(self, count: int, wait: Callable[[], None] | None) -> None:
        while len(self.buffer) < count:
            if wait is not None:
                wait()
            chunk = os.read(self.fd, max(1 << 16, min(count - len(self.buffer), 1 << 24)))
            if not chunk:
                raise EndOfFile("end of file inside a frame" if self.buffer else "end of file")
            self.buffer += chunk

    def read(self, wait: Callable[[], None] | None = None) -> Any:
        """The next frame's value; EndOfFile, or CodecError for a bad or oversized frame."""
        self._fill(4, wait)
        size = int(_LENGTH.unpack_from(self.buffer)[0])
        if size > self.max_bytes:
            raise CodecError(f"a frame of {size} bytes; the limit is {self.max_bytes}")
        self._fill(4 + size, wait)
        body = bytes(self.buffer[4 : 4 + size])
        del self.buffer[: 4 + size]
        return decode(body, self.max_bytes)


def read_frame(fd: int, max_bytes: int = MAX_BYTES) -> Any:
    """The one frame a peer sends on `fd` (blocking)."""
    return FrameReader(fd, max_bytes).read()


def frame_length(header: bytes) -> int:
    """The body length a 4-byte frame header announces."""
    return int(_LENGTH.unpack(header)[0])
