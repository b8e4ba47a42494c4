"""A cache of immutable values bounded by their (estimated) bytes, whose misses load once.

    cache: Lru[Manifest] = Lru(max_bytes=256 << 20)
    value = cache.load(key, fetch, size)        # threads missing one key at once: one `fetch`
    cache.put(key, value, size(value))          # least recently used out first
    cache.get(key)                              # None if not held

`Trees` (`snapshots.py`) keeps the contents of stored objects and the decoded manifests in two
of these. A value over a quarter of `max_bytes` is not kept (it would push out most of the
rest), but a load still hands its value to the threads that waited for it: before, each reader
queued on the fetch of a large tree fetched it again once the one before was done. A load that
fails hands nothing on: each thread that waited then loads on its own (and fails, or not).

Thread-safe; `load` blocks while it or the load it waits for runs (callers run it in a thread).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

V = TypeVar("V")


@dataclass
class _Load(Generic[V]):
    """One load under way: the threads that miss its key meanwhile wait for it."""

    done: threading.Event = field(default_factory=threading.Event)
    value: V | None = None
    loaded: bool = False


class Lru(Generic[V]):
    """Values by key, at most `max_bytes` of them by their sizes, least recently used out first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        """Bytes of the values kept, by the sizes they were put with."""
        self._values: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._loads: dict[str, _Load[V]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            held = self._values.get(key)
            if held is None:
                return None
            self._values.move_to_end(key)
            return held[0]

    def put(self, key: str, value: V, size: int) -> None:
        """Keep `value` unless it is over a quarter of `max_bytes` (or `key` is held already)."""
        with self._lock:
            if key in self._values or size > self.max_bytes // 4:
                return
            self._values[key] = (value, size)
            self.held += size
            while self.held > self.max_bytes:
                _, (_, evicted) = self._values.popitem(last=False)
                self.held -= evicted

    def load(self, key: str, fetch: Callable[[], V], size: Callable[[V], int]) -> V:
        """The value of `key`: held, or the one a load under way gets, or `fetch()`'s (kept by
        its `size`). A failed `fetch` raises in its own thread only."""
        while True:
            with self._lock:
                if (held := self._values.get(key)) is not None:
                    self._values.move_to_end(key)
                    return held[0]
                under_way = self._loads.get(key)
                if under_way is None:
                    mine = self._loads[key] = _Load[V]()
                    break
            under_way.done.wait()
            if under_way.loaded:
                return cast(V, under_way.value)  # set with `loaded`
        try:
            value = fetch()
            self.put(key, value, size(value))
            mine.value, mine.loaded = value, True
            return value
        finally:
            with self._lock:
                del self._loads[key]
            mine.done.set()
