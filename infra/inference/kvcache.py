"""The local backend's KV cache and decode attention: a running batch's step touches the cache once.

    register_attention()                    # once per process, before loading a model
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=ATTENTION)
    cache = SlotCache(model.config.num_hidden_layers)
    cache.admit(prefill.past_key_values, mask)       # new rows, left-padded to the batch
    model(input_ids=..., past_key_values=cache)      # one decode step: appended in place
    cache.batch_select_indices(compaction(n, ended)) # rows that ended: only movers copied
    cache.trim(columns)                              # leading all-padding columns: no copy
    cache.row(index, length)                         # a row's last `length` tokens (copies)

Why: with transformers' `DynamicCache` and SDPA, a decode step of a 64-row batch of
SmolLM2-135M at 800 columns took 3.9 s on this 2-core CPU, 4% of it in the model's matmuls:
the cache was concatenated anew every step (18%) and, because a padded batch has a mask, the
3 KV heads were repeated to 9 before attention (59%). Here each layer's keys and values live
in buffers with room, `(slots, kv_heads, columns, head_dim)`: rows `[0, n)` and columns
`[lo, hi)` are live and `keys`/`values` are views of them. A decode step writes one column in
place; a row that ends is filled by the last row (only moved rows are copied); trimming moves
`lo`. `ATTENTION` computes a one-token query against the grouped KV heads directly (two batched
matmuls that read the cache once); longer queries (prefill) go to transformers' SDPA.

Live columns outside a row's own tokens hold zeros: buffers start zeroed, a prefill's padding
columns are zeroed on admission, and so are the columns left of a new row's own (its slot's last
row left its KV there) and the existing rows' columns when the batch widens. The attention mask
hides them (a masked score is set to -inf, not added to, so they weigh exactly 0), but a zero
weight times a stale NaN, left by a row whose prompt computed one, would still be NaN.

A sliding-window layer's cache holds every token here too (`infra.inference.decoder` prefills
into full-width layers); its window is the attention mask's, which transformers builds from
column distances: a row's tokens are contiguous columns, so those are its token distances.

Not covered: linear-attention layers, and models whose attention layers do not call
`past_key_values.update` (transformers' standard decoder layers all do).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

ATTENTION = "tempered_decode"
"""The attention implementation name `load_policy` asks transformers for."""
LEFT_ROOM = 32
"""Free columns kept left of the live ones when a buffer is (re)made: room for a longer prompt."""


def _decode_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a one-token query over grouped KV heads, without repeating them; longer
    queries (a prefill) are transformers' SDPA. Returns `(batch, q_len, heads, head_dim)`."""
    if query.shape[2] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    groups = key.shape[1]
    grouped = query.reshape(batch, groups, heads // groups, dim)  # head h uses KV head h // rep
    scores = torch.matmul(grouped, key.transpose(-1, -2))
    scores = scores * (scaling if scaling is not None else dim**-0.5)
    if attention_mask is not None:  # (batch, 1, 1, columns): True attends (bool) or additive
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    return out.reshape(batch, 1, heads, dim), None


def register_attention() -> None:
    """Make `ATTENTION` known to transformers (with SDPA's masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _decode_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class SlotLayer(DynamicLayer):
    """One layer's keys and values in buffers with room; `keys`/`values` view the live part."""

    def __init__(self) -> None:
        super().__init__()
        self.kbuf: torch.Tensor | None = None
        self.vbuf: torch.Tensor | None = None
        self.n = self.lo = self.hi = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a SlotLayer is filled by SlotCache.admit, not by a prefill")

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.kbuf is not None and self.vbuf is not None
        keys = self.keys = self.kbuf[: self.n, :, self.lo : self.hi]
        values = self.values = self.vbuf[: self.n, :, self.lo : self.hi]
        return keys, values

    def _remake(self, slots: int, left: int, right: int) -> None:
        """New zeroed buffers holding the live part with `left` free columns before it and
        `right` after it, and at least `slots` rows."""
        assert self.kbuf is not None and self.vbuf is not None
        live = self.hi - self.lo
        shape = list(self.kbuf.shape)
        shape[0], shape[2] = max(slots, shape[0]), left + live + right
        kbuf, vbuf = self.kbuf.new_zeros(shape), self.vbuf.new_zeros(shape)
        kbuf[: self.n, :, left : left + live] = self.kbuf[: self.n, :, self.lo : self.hi]
        vbuf[: self.n, :, left : left + live] = self.vbuf[: self.n, :, self.lo : self.hi]
        self.kbuf, self.vbuf, self.lo, self.hi = kbuf, vbuf, left, left + live

    def admit(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows (`keys`: `(rows, kv_heads, width, head_dim)`), right-aligned to the batch's
        last column; the batch widens to the left when they are longer than it."""
        rows, width = keys.shape[0], keys.shape[2]
        if self.kbuf is None:
            shape = list(keys.shape)
            shape[2] = LEFT_ROOM + width + _right_room(width)
            self.kbuf, self.vbuf = keys.new_zeros(shape), values.new_zeros(shape)
            self.lo = self.hi = LEFT_ROOM + width
            self.is_initialized = True
        assert self.kbuf is not None and self.vbuf is not None
        short = self.n + rows > self.kbuf.shape[0]
        if short or self.hi - width < 0:
            live = max(self.hi - self.lo, width)
            # slots grow by half at least, so rows joining one by one do not copy each time
            slots = max(self.n + rows, self.kbuf.shape[0] * 3 // 2) if short else self.n
            self._remake(slots, LEFT_ROOM + live - (self.hi - self.lo), _right_room(live))
        start, new = self.hi - width, slice(self.n, self.n + rows)
        if start < self.lo:  # the batch widens: its rows' new columns may hold a gone row's KV
            self.kbuf[: self.n, :, start : self.lo] = 0
            self.vbuf[: self.n, :, start : self.lo] = 0
            self.lo = start
        self.kbuf[new, :, self.lo : start] = 0  # a gone row may have left its KV here
        self.vbuf[new, :, self.lo : start] = 0
        self.kbuf[new, :, start : self.hi] = keys
        self.vbuf[new, :, start : self.hi] = values
        self.n += rows
        self._view()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the step's columns in place (the model's call in a decode step)."""
        if self.kbuf is None or key_states.shape[0] != self.n:
            raise RuntimeError(f"{key_states.shape[0]} rows stepped, the cache holds {self.n}")
        assert self.vbuf is not None
        width = key_states.shape[2]
        if self.hi + width > self.kbuf.shape[2]:
            live = self.hi - self.lo
            self._remake(self.n, LEFT_ROOM, _right_room(live + width) + width)
        self.kbuf[: self.n, :, self.hi : self.hi + width] = key_states
        self.vbuf[: self.n, :, self.hi : self.hi + width] = value_states
        self.hi += width
        return self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows `indices` in that order. A compaction order (see `compaction`) moves only
        the rows that fill holes; any other order gathers every row."""
        assert self.kbuf is not None and self.vbuf is not None
        order = [int(i) for i in indices]
        moves = [(dst, src) for dst, src in enumerate(order) if dst != src]
        if all(src >= len(order) for _, src in moves):
            for dst, src in moves:
                self.kbuf[dst, :, self.lo : self.hi] = self.kbuf[src, :, self.lo : self.hi]
                self.vbuf[dst, :, self.lo : self.hi] = self.vbuf[src, :, self.lo : self.hi]
        else:
            index = torch.tensor(order, device=self.kbuf.device)
            self.kbuf[: len(order)] = self.kbuf.index_select(0, index)
            self.vbuf[: len(order)] = self.vbuf.index_select(0, index)
        self.n = len(order)
        self._view()

    def trim(self, columns: int) -> None:
        """Drop the first `columns` live columns (padding in every row)."""
        self.lo = min(self.lo + columns, self.hi)
        self._view()

    def row(self, index: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of row `index`'s last `length` columns: `(1, kv_heads, length, head_dim)`."""
        assert self.kbuf is not None and self.vbuf is not None
        columns = slice(self.hi - length, self.hi)
        keys = self.kbuf[index : index + 1, :, columns]
        values = self.vbuf[index : index + 1, :, columns]
        return keys.clone(), values.clone()


def _right_room(live: int) -> int:
    """Free columns after the live ones when a buffer is (re)made: a quarter of them (at least
    64), so a remake's copy is paid once per that many decode steps."""
    return max(64, live // 4)


class SlotCache(Cache):
    """A `Cache` of `SlotLayer`s: the running batch's KV for every layer of one model."""

    def __init__(self, layers: int):
        super().__init__(layers=[SlotLayer() for _ in range(layers)])

    def admit(self, prefilled: Cache, mask: torch.Tensor) -> None:
        """Add the rows of a prefill's cache (same layers, each holding every column; `mask`:
        `(rows, width)`, 0 on padding) to the batch. Padding columns are zeroed, so that whatever
        an attention implementation leaves there for a query that attends to nothing weighs
        exactly 0 (a non-finite value times a zero weight would not). A prefill layer short of
        columns (a sliding-window one keeps its window) is refused before any layer changes."""
        pairs = [(getattr(t, "keys", None), getattr(t, "values", None)) for t in prefilled.layers]
        if len(pairs) != len(self.layers):
            raise ValueError(f"a prefill of {len(pairs)} layers, the cache has {len(self.layers)}")
        for keys, values in pairs:
            if keys is None or values is None or keys.shape[2] != mask.shape[1]:
                held = None if keys is None else keys.shape[2]
                raise ValueError(f"a prefill layer holds {held} of {mask.shape[1]} columns")
        real = mask.bool()[:, None, :, None]
        for mine, (keys, values) in zip(self.layers, pairs, strict=True):
            assert isinstance(mine, SlotLayer) and keys is not None and values is not None
            zero = keys.new_zeros(())
            mine.admit(torch.where(real, keys, zero), torch.where(real, values, zero))

    def row(self, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `index`'s KV of its last `length` tokens in every layer (copies)."""
        layers = [layer for layer in self.layers if isinstance(layer, SlotLayer)]
        return [layer.row(index, length) for layer in layers]

    def trim(self, columns: int) -> None:
        for layer in self.layers:
            assert isinstance(layer, SlotLayer)
            layer.trim(columns)


def compaction(rows: int, ended: list[int]) -> list[int]:
    """The order that keeps every row not in `ended`, filling each ended row's slot among the
    first `rows - len(ended)` with a kept row from the end (so only those rows move)."""
    gone = set(ended)
    size = rows - len(gone)
    tail = [i for i in range(size, rows) if i not in gone]
    order = list(range(size))
    for hole, row in zip((i for i in range(size) if i in gone), tail, strict=True):
        order[hole] = row
    return order
