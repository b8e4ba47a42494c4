"""Reading a GGUF file through transformers without parsing it three times over.

    with parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)

transformers (5.x, with gguf 0.17) reads a GGUF checkpoint for the tokenizer, again for the
config and again for the weights, each time parsing every metadata field (SmolLM2's vocabulary
and merges are ~300,000 of them), and it rebuilds gguf's tensor-name table once per module
of the model (397 times for SmolLM2-135M). Inside `parsed_once`, `gguf.GGUFReader` and
`gguf.get_tensor_name_map` are memoized (transformers imports both from `gguf` when it calls
them), so each file is parsed once and the table is built once; outside, they are gguf's own
again. Measured on the `smollm2` preset's conversion here: tokenizer and weights 11.5 s
against 31.8 s, the same tensors.

Not covered: anything that writes a GGUF file (a memoized reader is opened read-only), or
threads that read other GGUF files meanwhile (the conversions run one at a time, under the
models folder's file lock).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """Memoize gguf's reader and tensor-name table for the `with` block."""
    import gguf

    reader = gguf.GGUFReader

    @functools.cache
    def read_once(path: Any, mode: Any = "r") -> Any:
        return reader(path, mode)

    memoized = {
        "GGUFReader": read_once,
        "get_tensor_name_map": functools.cache(gguf.get_tensor_name_map),
    }
    originals = {name: getattr(gguf, name) for name in memoized}
    for name, value in memoized.items():
        setattr(gguf, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(gguf, name, value)
        read_once.cache_clear()
