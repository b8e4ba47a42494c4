"""Finished rows' KV, kept for the prompt that extends them: a later turn prefills only its new tokens.

    store = PrefixStore(max_bytes=2 << 30)
    mine = store.version(key)            # one policy version's entries (the decoder's thread)
    mine.put(tokens, layers)             # a row ended: its processed tokens' (keys, values) per layer
    hit = mine.take(prompt)              # the longest stored proper prefix of `prompt`, removed
    hit.length, hit.layers               # or None

Why: an episode's step k > 0 prompt is, token for token, the previous step's prompt and
completion plus the observation (`infra.inference.prompts`), so all of it but the observation
(and the completion's last token, which no forward pass has read) was computed when the previous
step's row ended. On this 2-core CPU SmolLM2-135M (fp32) prefills ~800 tokens/s and decodes a
row-token in ~8 ms in a 16-row batch; `python bench/prefix.py` measures second turns with and
without the store: 1.49× (a default-run second turn reuses ~140 tokens and prefills ~165).

Entries belong to a policy version (its key; another version's weights give other keys and
values) and leave least recently stored first once their bytes pass `max_bytes`; `take` removes
what it returns (the next step stores a longer entry), `forget` a version's all. Only the
decoder's thread touches a store, so it has no lock.

Not covered: sharing one prefix among different rows (the samples of a group share their first
prefill in `RowBatch.admit` already), and the vLLM backend (its engine caches prefixes itself).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values of one row: `(1, kv_heads, tokens, head_dim)` each."""


@dataclass(frozen=True)
class Prefix:
    """The KV of a prompt's first `length` tokens."""

    length: int
    layers: Layers
    nbytes: int


class PrefixStore:
    """Prefixes of every policy version, bounded by bytes (least recently stored out first)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], Prefix] = OrderedDict()
        self._lengths: dict[Hashable, Counter[int]] = {}

    def version(self, key: Hashable) -> VersionPrefixes:
        return VersionPrefixes(self, key)

    def put(self, key: Hashable, tokens: list[int], layers: Layers) -> None:
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if not tokens or nbytes > self.max_bytes:
            return
        self._drop((key, tuple(tokens)))
        self._entries[(key, tuple(tokens))] = Prefix(len(tokens), layers, nbytes)
        self._lengths.setdefault(key, Counter())[len(tokens)] += 1
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def take(self, key: Hashable, prompt: list[int]) -> Prefix | None:
        """The longest stored prefix of `prompt` shorter than it (one token at least is left
        to prefill: its logits pick the first new token), removed from the store."""
        for length in sorted(self._lengths.get(key, ()), reverse=True):
            if length >= len(prompt):
                continue
            found = self._drop((key, tuple(prompt[:length])))
            if found is not None:
                self.hits += 1
                self.reused_tokens += length
                return found
        return None

    def forget(self, key: Hashable) -> None:
        """Drop every prefix of version `key` (its model was unloaded)."""
        for entry in [e for e in self._entries if e[0] == key]:
            self._drop(entry)

    def _drop(self, entry: tuple[Hashable, tuple[int, ...]]) -> Prefix | None:
        found = self._entries.pop(entry, None)
        if found is not None:
            key, length = entry[0], found.length
            lengths = self._lengths[key]
            lengths[length] -= 1
            if not lengths[length]:
                del lengths[length]
            self.bytes -= found.nbytes
        return found


@dataclass(frozen=True)
class VersionPrefixes:
    """One policy version's view of a `PrefixStore` (what a `RowBatch` is given)."""

    store: PrefixStore
    key: Hashable

    def put(self, tokens: list[int], layers: Layers) -> None:
        self.store.put(self.key, tokens, layers)

    def take(self, prompt: list[int]) -> Prefix | None:
        return self.store.take(self.key, prompt)
