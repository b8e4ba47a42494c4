"""One weight set at a time, many versions asked for: admit each request only while its version
is the loaded one, and switch versions between drains.

    gate = VersionGate(load=engine_load, wait_s=600)      # load(key) makes `key` the loaded one
    async with gate.serving(key):                         # waits for its turn, then runs on `key`
        ...

The loaded version keeps admitting requests until another version has waiters; then admission
stops, the requests in flight finish (the drain), one waiter calls `load`, and every waiter of
the new version queued at that moment is admitted as one cohort (`_budget`), so two versions
with waiters alternate in cohorts rather than ping-ponging per request. A request that waits
longer than `wait_s` gets an `InferenceError`; one that times out or is cancelled leaves its
cohort; a `load` that fails, or weights lost (`invalidate`), leave the gate with nothing loaded
and no cohort (the next waiter loads again); the failed load fails the request that tried it.

Used by the `vllm` backend, whose engine holds one set of full weights (LoRA versions over it
share its turn). Pure asyncio: no engine, no I/O, so it is tested on its own.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

from infra.inference.base import InferenceError

K = TypeVar("K", bound=Hashable)


class VersionGate(Generic[K]):
    """Serves each request on exactly the version it names; `load`s between drains."""

    def __init__(
        self, load: Callable[[K], Awaitable[None]], wait_s: float, loaded: K | None = None
    ):
        self._load = load
        self.wait_s = wait_s
        self.loaded: K | None = loaded
        self.in_flight = 0
        self.loads = 0
        self._budget = 0  # waiters of `loaded` still admitted although others wait
        self._waiting: Counter[K] = Counter()  # versions with waiters only: scanned per wake
        self._loading = False
        self._changed = asyncio.Condition()

    def invalidate(self) -> None:
        """The loaded weights are lost (their engine died): the next request loads again."""
        self.loaded = None
        self._budget = 0  # a cohort of weights no longer there is owed no turn

    def _others_waiting(self, key: K) -> bool:
        return any(k != key for k in self._waiting)

    def _admits(self, key: K) -> bool:
        if self._loading:
            return False
        if key == self.loaded:
            return self._budget > 0 or not self._others_waiting(key)
        return self.in_flight == 0 and self._budget == 0

    def _leave(self) -> None:
        """A waiter left unadmitted: the cohort is at most the loaded version's waiters left
        (a turn counted for it, and never taken, would hold every other version)."""
        if self.loaded is not None:
            self._budget = min(self._budget, self._waiting[self.loaded])
        self._changed.notify_all()  # its leaving may admit others (e.g. the last of a version)

    @asynccontextmanager
    async def serving(self, key: K) -> AsyncIterator[None]:
        """Waits until `key` is loaded and admitted; the block runs while it stays loaded."""
        await self._acquire(key)
        try:
            yield
        finally:
            async with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    async def _acquire(self, key: K) -> None:
        async with self._changed:
            self._waiting[key] += 1
            admitted = False
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._admits(key)), self.wait_s
                )
                admitted = True
            except TimeoutError:
                raise InferenceError(
                    f"{_name(key)} not loaded within {self.wait_s:.0f}s "
                    f"(serving {_name(self.loaded)}, {self.in_flight} requests in flight)"
                ) from None
            finally:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
                if not admitted:  # timed out or cancelled: it takes no turn of a cohort
                    self._leave()
            if key == self.loaded:
                self._budget = max(0, self._budget - 1)
                self.in_flight += 1
                return
            self._loading = True  # drained, and nobody else is admitted while we load
        loaded: K | None = None
        try:
            await self._load(key)
            loaded = key
        finally:
            async with self._changed:
                self._loading = False
                self.loaded = loaded
                self.loads += loaded is not None
                self._budget = self._waiting[key] if loaded is not None else 0
                self.in_flight += loaded is not None
                self._changed.notify_all()


def _name(key: object) -> str:
    return str(getattr(key, "name", key))
