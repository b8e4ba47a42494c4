"""The local backend's decoder: continuous batching of a `RowBatch` on a thread of its own.

    decoder = Decoder(max_rows=64, start=load_and_activate)   # start(key) -> the key's RowBatch
    output = await asyncio.wrap_future(decoder.submit(key, prompt, params))

One policy version decodes at a time (`infra.inference.decoder.RowBatch`, its rows and KV).
Waiting rows are taken in order of `SamplingParams.priority` (lower first: a run's evaluations
wait behind its training rollouts), then of arrival; a priority counts for `AGING_S` of waiting,
so no row starves. Rows of the running version join between steps while the first waiting row
is of that version; once it is another version's, the running version stops admitting, finishes
its rows (the drain), and that version starts (its model loaded and, for a LoRA version, its
adapter activated, by `start`, on this thread). A row whose future is cancelled before it is
taken never starts; one in the batch leaves at the next step. A row whose prompt holds an id
outside the model's vocabulary fails alone, not to be retried; a prefill forward's fault fails
the rows of that prefill alone, retried; any other fault loses the batch: its rows fail,
retried (rows that ended in the failing step are answered already). Closing fails every row
still waiting or decoding.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from contracts.task import SamplingParams
from infra.inference.base import GenerationOutput, InferenceError
from infra.inference.decoder import PrefillFailed, Row, RowBatch

log = logging.getLogger(__name__)
Start = Callable[[Hashable], RowBatch]
"""Makes the batch of a policy version: loads its model, activates its adapter."""
AGING_S = 300.0
"""How long a waiting row's priority counts; after it, the row waits by arrival alone."""


@dataclass(eq=False)
class _Waiting:
    key: Hashable
    prompt: list[int]
    params: SamplingParams
    future: Future[GenerationOutput]
    since: float = field(default_factory=time.monotonic)

    def rank(self, now: float) -> int:
        return self.params.priority if now - self.since < AGING_S else 0


class Decoder:
    """Continuous batching on a thread: `submit` rows of any version; one version decodes at a
    time, the others wait for its drain."""

    def __init__(self, max_rows: int, start: Start):
        self.max_rows, self._start = max_rows, start
        self._queue: deque[_Waiting] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="decoder", daemon=True)
        self._thread.start()

    def submit(
        self, key: Hashable, prompt: list[int], params: SamplingParams
    ) -> Future[GenerationOutput]:
        future: Future[GenerationOutput] = Future()
        with self._changed:
            if self._closed:
                raise InferenceError("the local backend is closed", retryable=False)
            self._queue.append(_Waiting(key, prompt, params, future))
            self._changed.notify()
        return future

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=60)

    def _take(self, key: Hashable | None, room: int) -> tuple[Hashable | None, list[_Waiting]]:
        """Requests to admit, first in (priority, arrival) order: of the running version (`key`)
        while the first waiting row is of it, else none (the batch drains); with no batch
        running, of the first waiting row's version (none: nothing to start)."""
        with self._changed:
            while not self._closed and not self._queue and key is None:
                self._changed.wait()
            now = time.monotonic()  # a row its caller gave up on neither drains nor starts
            self._queue = deque(item for item in self._queue if not item.future.cancelled())
            ordered = sorted(self._queue, key=lambda item: item.rank(now))  # stable: arrival
            if not ordered:
                return key, []
            if key is None:
                key = ordered[0].key
            elif ordered[0].key != key:
                return key, []  # drain first
            taken = [item for item in ordered if item.key == key][:room]
            self._queue = deque(item for item in self._queue if item not in taken)
            return key, taken

    def _run(self) -> None:
        key: Hashable | None = None
        batch: RowBatch | None = None
        while not self._closed:
            running = batch is not None and bool(batch.rows)
            room = self.max_rows - (len(batch.rows) if batch is not None else 0)
            key, items = self._take(key if running else None, room)
            if key is None:
                continue
            rows: list[Row] = []
            try:
                if batch is None or not batch.rows:
                    batch = self._start(key)
                for item in items:
                    try:
                        rows.append(batch.row(item.prompt, item.params))
                    except InferenceError as exc:  # the row's own input: it alone fails
                        _fail([item.future], exc)
                        continue
                    rows[-1].future = item.future
                try:
                    batch.admit(rows, self._resolve)
                except PrefillFailed as exc:  # those rows alone fail: the batch goes on
                    log.warning("prefill of %d rows of %s failed: %r", len(exc.rows), key, exc)
                    _fail([r.future for r in exc.rows if r.future is not None], _error(exc.cause))
                batch.step(self._resolve)  # rows that end are answered before the forward
            except Exception as exc:  # an engine fault: the batch is lost, every row of it fails
                log.warning("decode batch of %s failed: %r", key, exc)
                _fail([*_futures(batch), *(item.future for item in items)], _error(exc))
                batch = None
        with self._changed:
            waiting = [item.future for item in self._queue]
        _fail([*waiting, *_futures(batch)], InferenceError("the local backend closed"))

    def _resolve(self, rows: list[Row]) -> None:
        for row in rows:
            if row.future is not None:
                with contextlib.suppress(InvalidStateError):  # its caller gave up on it
                    row.future.set_result(row.output)


def _error(exc: Exception) -> InferenceError:
    return exc if isinstance(exc, InferenceError) else InferenceError(repr(exc))


def _futures(batch: RowBatch | None) -> list[Future[GenerationOutput]]:
    return [r.future for r in (batch.rows if batch else []) if r.future is not None]


def _fail(futures: list[Future[GenerationOutput]], error: Exception) -> None:
    for future in futures:
        with contextlib.suppress(InvalidStateError):  # done, or its caller gave up on it
            future.set_exception(error)
