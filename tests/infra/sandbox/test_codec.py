"""The verifier's data-only codec: exact round trips, refusals, caps, and hostile bytes."""

from __future__ import annotations

import contextlib
import enum
import marshal
import math
import os
import pickle
import random
import threading
from typing import Any

import pytest

from infra.sandbox import codec
from infra.sandbox.codec import CodecError, NotPlainData, decode, encode

PLAIN = [
    None,
    True,
    False,
    0,
    1,
    -1,
    255,
    -256,
    2**64,
    -(2**10000),
    0.0,
    -0.0,
    1.5,
    math.inf,
    -math.inf,
    1e-310,
    complex(1, -2),
    "",
    "héllo ✓",
    "\ud800 lone surrogate",
    b"",
    b"\x00\xff" * 10,
    [],
    (),
    {},
    set(),
    frozenset(),
    [1, [2, [3, (4, {5: {6}})]]],
    (None,),
    ((),),
    {"a": 1, 2: "b", (3, 4): [5], frozenset({6}): None, None: True, 1.5: -0.0, b"k": b"v"},
    {1, "x", (2, 3), frozenset({4})},
    frozenset({(1, 2), "y"}),
    [True, 1, 1.0],
]


def _plain_id(value: Any) -> str | None:
    """A test id: the repr, unless a set of several items is inside (pytest's own id then).

    A set's repr follows the hash seed, and pytest-xdist's workers must collect the same ids.
    """
    if isinstance(value, set | frozenset):
        return None if len(value) > 1 else repr(value)
    if isinstance(value, dict):
        inner = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple):
        inner = list(value)
    else:
        return repr(value)
    return None if any(_plain_id(item) is None for item in inner) else repr(value)


def _same(a: Any, b: Any) -> bool:
    """Equal and of exactly the same types all the way down (1 vs True vs 1.0; -0.0; nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("value", PLAIN, ids=_plain_id)
def test_plain_data_round_trips_exactly_as_fresh_objects(value: object) -> None:
    back = decode(encode(value))
    assert _same(back, value)
    if isinstance(value, list | dict | set):
        assert back is not value


def test_nan_keeps_its_identity_rules() -> None:
    back = decode(encode([math.nan, complex(math.nan, 1)]))
    assert math.isnan(back[0]) and back[0] != back[0]  # type: ignore[index]
    assert math.isnan(back[1].real) and back[1].imag == 1  # type: ignore[index]


class LyingInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class Color(enum.IntEnum):
    RED = 1


def _generator():  # type: ignore[no-untyped-def]
    yield 1


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (AlwaysEqual(), "AlwaysEqual"),
        (LyingInt(3), "LyingInt"),
        (type("S", (str,), {})("x"), "S"),
        (Color.RED, "Color"),
        (bytearray(b"x"), "bytearray"),
        (_generator(), "generator"),
        (print, "builtin_function_or_method"),
        (lambda: 1, "function"),
        ([1, {"k": [2, AlwaysEqual()]}], "AlwaysEqual"),
        ({AlwaysEqual(): 1}, "AlwaysEqual"),
        (compile("1", "x", "eval"), "code"),
        (range(3), "range"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_anything_but_plain_data_is_refused_by_name(value: object, named: str) -> None:
    with pytest.raises(NotPlainData, match=named):
        encode(value, what="the value f() returned")


def test_the_refusal_says_where_inside_the_value() -> None:
    with pytest.raises(NotPlainData, match=r"at \[1\]\['k'\]\[1\]"):
        encode([1, {"k": [2, AlwaysEqual()]}])


def test_cycles_and_deep_nesting_hit_the_depth_cap() -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(NotPlainData, match="nested too deeply"):
        encode(cyclic)
    deep: object = 0
    for _ in range(codec.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(NotPlainData, match="nested too deeply"):
        encode(deep)


def test_size_cap_on_both_sides() -> None:
    with pytest.raises(NotPlainData, match="bytes encoded"):
        encode("x" * 100, max_bytes=50)
    with pytest.raises(CodecError, match="limit"):
        decode(encode("x" * 100), max_bytes=50)


def test_decoder_caps_depth_and_item_count_of_crafted_bytes() -> None:
    deep = b"l\x00\x00\x00\x01" * 1000 + b"N"
    with pytest.raises(CodecError, match="nested too deeply"):
        decode(deep)
    many = b"l" + (100_000).to_bytes(4, "big") + b"N" * 100_000
    assert len(decode(many)) == 100_000  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="too many values"):
        decode(many, max_items=1000)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"s\x00\x00\x00\x05ab", "truncated"),
        (b"NN", "stray bytes"),
        (b"?", "unknown tag"),
        (b"l\xff\xff\xff\xff", "truncated container"),  # a huge count is refused before any work
        (b"s\x00\x00\x00\x01\xff", "invalid UTF-8"),
        (b"S\x00\x00\x00\x01l\x00\x00\x00\x00", "unhashable"),
        (b"d\x00\x00\x00\x01l\x00\x00\x00\x00N", "unhashable"),
        (marshal.dumps(compile("print(1)", "x", "exec")), None),
        (pickle.dumps(os.system), None),
    ],
)
def test_malformed_or_foreign_bytes_are_refused(data: bytes, message: str | None) -> None:
    with pytest.raises(CodecError, match=message):
        decode(data)


def test_random_corruptions_only_ever_raise_codec_error() -> None:
    rng = random.Random(7)
    blobs = [encode(value) for value in PLAIN]
    for _ in range(20_000):
        blob = bytearray(rng.choice(blobs))
        for _ in range(rng.randint(1, 4)):
            if blob and rng.random() < 0.7:
                blob[rng.randrange(len(blob))] = rng.randrange(256)
            else:
                blob.insert(rng.randrange(len(blob) + 1), rng.randrange(256))
        with contextlib.suppress(CodecError):
            decode(bytes(blob))


def test_frames_over_a_pipe() -> None:
    read_fd, write_fd = os.pipe()
    try:
        reader = codec.FrameReader(read_fd)
        codec.write_all(write_fd, codec.frame(("call", "f", (1, [2]), {"k": None})))
        reply = codec.join_tuple(encode("return"), encode({1}))
        codec.write_all(write_fd, codec.frame_encoded(reply))
        assert reader.read() == ("call", "f", (1, [2]), {"k": None})  # both frames in one read
        assert reader.read() == ("return", {1})
        os.write(write_fd, (1 << 30).to_bytes(4, "big"))
        with pytest.raises(CodecError, match="limit"):
            reader.read()
        os.close(write_fd)
        write_fd = -1
        with pytest.raises(codec.EndOfFile):
            codec.FrameReader(read_fd).read()
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_the_wire_format_is_the_documented_one() -> None:
    """Tag, 4-byte big-endian length or count, payload: the smallest two's complement for ints."""
    assert encode(0) == b"i\x00\x00\x00\x01\x00"
    assert encode(127) == b"i\x00\x00\x00\x01\x7f"
    assert encode(255) == b"i\x00\x00\x00\x02\x00\xff"
    assert encode(-256) == b"i\x00\x00\x00\x02\xff\x00"
    assert encode("é") == b"s\x00\x00\x00\x02\xc3\xa9"
    assert encode([None, (True, b"x")]) == b"l\x00\x00\x00\x02Nt\x00\x00\x00\x02Tb\x00\x00\x00\x01x"
    assert encode({1.5: False}) == b"d\x00\x00\x00\x01f?\xf8\x00\x00\x00\x00\x00\x00F"
    assert codec.frame(None) == b"\x00\x00\x00\x01N"
    assert codec.frame_length(b"\x00\x01\x00\x02") == 65538


@pytest.mark.parametrize("value", PLAIN, ids=_plain_id)
def test_the_size_cap_is_exact(value: object) -> None:
    blob = encode(value)
    assert encode(value, max_bytes=len(blob)) == blob
    assert _same(decode(blob, max_bytes=len(blob)), value)
    with pytest.raises(NotPlainData, match=f"{len(blob)} bytes encoded"):
        encode(value, max_bytes=len(blob) - 1)
    with pytest.raises(CodecError, match="limit"):
        decode(blob, max_bytes=len(blob) - 1)


WRAPS = {
    "list": lambda x: [x],
    "tuple": lambda x: (x,),
    "frozenset": lambda x: frozenset([x]),
    "dict": lambda x: {0: x},
}


@pytest.mark.parametrize("wrap", WRAPS.values(), ids=WRAPS.keys())
def test_the_depth_cap_holds_at_its_value_on_both_sides(wrap: Any) -> None:
    nested: object = 0
    for _ in range(5):  # five containers deep
        nested = wrap(nested)
    blob = encode(nested, max_depth=5)
    assert decode(blob, max_depth=5) == nested
    with pytest.raises(NotPlainData, match="nested too deeply"):
        encode(nested, max_depth=4)
    with pytest.raises(CodecError, match="nested too deeply"):
        decode(blob, max_depth=4)


def test_a_dict_key_counts_towards_the_depth_too() -> None:
    keyed = {((0,),): None}  # three containers deep through its key
    assert decode(encode(keyed, max_depth=3), max_depth=3) == keyed
    with pytest.raises(NotPlainData, match="nested too deeply"):
        encode(keyed, max_depth=2)
    with pytest.raises(CodecError, match="nested too deeply"):
        decode(encode(keyed), max_depth=2)


def test_the_item_cap_counts_every_value_once() -> None:
    blob = encode([0, [1, 2], {3: 4}])  # 8 values: 5 scalars and 3 containers
    assert decode(blob, max_items=8) == [0, [1, 2], {3: 4}]
    with pytest.raises(CodecError, match="too many values"):
        decode(blob, max_items=7)


def test_a_frame_of_many_reads_and_one_of_exactly_the_limit() -> None:
    big = codec.frame(b"\x07" * (300 << 10))  # more than one read of the pipe
    small = codec.frame(("done", 1))
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(target=lambda: codec.write_all(write_fd, big + small))
    try:
        writer.start()
        reader = codec.FrameReader(read_fd, max_bytes=len(big) - 4)
        assert reader.read() == b"\x07" * (300 << 10)
        assert reader.read() == ("done", 1)
        writer.join()
        codec.write_all(write_fd, small)
        assert codec.read_frame(read_fd) == ("done", 1)
        codec.write_all(write_fd, big[:4])  # its header is enough to refuse it
        with pytest.raises(CodecError, match="limit"):
            codec.FrameReader(read_fd, max_bytes=len(big) - 5).read()
    finally:
        writer.join()
        os.close(read_fd)
        os.close(write_fd)
