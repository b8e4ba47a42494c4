"""A circuit breaker that pauses a sandbox backend whose *infrastructure* keeps failing.

    breaker = CircuitBreaker("kubernetes", on_change=lambda s: record_circuit_state("kubernetes", s))
    with breaker.guard(failures=(SandboxInfraError,)):   # raises CircuitOpenError when open
        result = await backend.run(...)

States: CLOSED (calls pass) → OPEN after `consecutive_failures` infra failures in a row, or when
the failure rate over the last `window` calls (at least `min_calls` of them) reaches
`failure_rate`. OPEN refuses calls for a backoff that doubles with every re-open
(`base_backoff_s` · `multiplier`^k, capped at `max_backoff_s`); once it elapses the breaker is
HALF_OPEN and lets `half_open_probes` calls through. A probe's success closes it (and resets
the backoff); its failure opens it again with the next, longer backoff.

Only platform faults count as failures: a program that fails its tests is a *success* of the
backend. Callers report outcomes (`record_success`/`record_failure`) or use `guard`. The clock
is injected, so the breaker is pure and deterministic; use it from one thread (an event loop).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum


class CircuitState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


class CircuitOpenError(Exception):
    """The backend is paused; retry after `retry_after_s` seconds (a retryable condition)."""

    def __init__(self, name: str, retry_after_s: float, reason: str) -> None:
        super().__init__(f"circuit {name!r} is open ({reason}); next try in {retry_after_s:.1f}s")
        self.name, self.retry_after_s, self.reason = name, retry_after_s, reason


@dataclass(frozen=True)
class CircuitConfig:
    consecutive_failures: int = 5
    failure_rate: float = 0.5
    window: int = 20
    min_calls: int = 10
    base_backoff_s: float = 5.0
    multiplier: float = 2.0
    max_backoff_s: float = 300.0
    half_open_probes: int = 1

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.window < 1 or self.half_open_probes < 1:
            raise ValueError("consecutive_failures, window and half_open_probes must be >= 1")
        if not 0.0 < self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be in (0, 1]")
        if not 1 <= self.min_calls <= self.window:
            raise ValueError("min_calls must be between 1 and window")
        if (
            self.base_backoff_s <= 0
            or self.multiplier < 1
            or self.max_backoff_s < self.base_backoff_s
        ):
            raise ValueError("need base_backoff_s > 0, multiplier >= 1, max_backoff_s >= base")


class CircuitBreaker:
    """Closed → open → half-open → closed, with exponential capped backoff between re-opens."""

    def __init__(
        self,
        name: str,
        config: CircuitConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[CircuitState], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config or CircuitConfig()
        self._clock, self._on_change = clock, on_change
        self._state = CircuitState.CLOSED
        self._outcomes: deque[bool] = deque(maxlen=self.config.window)  # True = failure
        self._consecutive = 0
        self._opens = 0  # re-opens since the last close; sets the backoff
        self._opened_at = 0.0
        self._probes = 0
        self.reason = ""

    # ---- state ----------------------------------------------------------------------------

    @property
    def state(self) -> CircuitState:
        if self._state is CircuitState.OPEN and self._clock() >= self._opened_at + self.backoff_s:
            self._set(CircuitState.HALF_OPEN)
            self._probes = 0
        return self._state

    @property
    def backoff_s(self) -> float:
        """The pause of the current (or next) open period."""
        c = self.config
        exponent = max(self._opens - 1, 0)
        return min(c.base_backoff_s * c.multiplier**exponent, c.max_backoff_s)

    def retry_after_s(self) -> float:
        """Seconds until calls may pass again (0 unless open)."""
        if self.state is not CircuitState.OPEN:
            return 0.0
        return max(self._opened_at + self.backoff_s - self._clock(), 0.0)

    def snapshot(self) -> dict[str, object]:
        failures = sum(self._outcomes)
        return {
            "name": self.name,
            "state": str(self.state),
            "consecutive_failures": self._consecutive,
            "window_calls": len(self._outcomes),
            "window_failures": failures,
            "backoff_s": self.backoff_s,
            "retry_after_s": self.retry_after_s(),
            "reason": self.reason,
        }

    # ---- calls ----------------------------------------------------------------------------

    def check(self) -> None:
        """Admit one call or raise CircuitOpenError; a half-open admission takes a probe slot."""
        state = self.state
        if state is CircuitState.CLOSED:
            return
        if state is CircuitState.HALF_OPEN and self._probes < self.config.half_open_probes:
            self._probes += 1
            return
        if state is CircuitState.OPEN:
            raise CircuitOpenError(self.name, self.retry_after_s(), self.reason)
        raise CircuitOpenError(self.name, self.config.base_backoff_s, "half-open, probe in flight")

    def record_success(self) -> None:
        if self.state is CircuitState.HALF_OPEN:
            self._close()
            return
        self._outcomes.append(False)
        self._consecutive = 0

    def record_failure(self, reason: str = "") -> None:
        state = self.state
        self.reason = reason or self.reason
        if state is CircuitState.HALF_OPEN:
            self._open(f"probe failed: {reason}" if reason else "probe failed")
            return
        if state is CircuitState.OPEN:
            return  # a straggler admitted before the trip; the pause already runs
        self._outcomes.append(True)
        self._consecutive += 1
        c = self.config
        failures = sum(self._outcomes)
        if self._consecutive >= c.consecutive_failures:
            self._open(f"{self._consecutive} consecutive infra failures" + _last(reason))
        elif (
            len(self._outcomes) >= c.min_calls and failures / len(self._outcomes) >= c.failure_rate
        ):
            self._open(f"{failures}/{len(self._outcomes)} recent calls failed" + _last(reason))

    def release(self) -> None:
        """Give back a probe slot whose call ended without a verdict (e.g. cancelled)."""
        if self._state is CircuitState.HALF_OPEN and self._probes > 0:
            self._probes -= 1

    @contextmanager
    def guard(self, failures: tuple[type[BaseException], ...]) -> Iterator[None]:
        """check(); then exceptions of `failures` count as failures, a normal exit as a success,
        and any other exception (cancellation, bad input) as neither."""
        self.check()
        try:
            yield
        except failures as error:
            self.record_failure(f"{type(error).__name__}: {error}"[:300])
            raise
        except BaseException:
            self.release()
            raise
        self.record_success()

    # ---- transitions ----------------------------------------------------------------------

    def _open(self, reason: str) -> None:
        self._opens += 1
        self._opened_at = self._clock()
        self.reason = reason
        self._set(CircuitState.OPEN)

    def _close(self) -> None:
        self._opens = 0
        self._outcomes.clear()
        self._consecutive = 0
        self._probes = 0
        self.reason = ""
        self._set(CircuitState.CLOSED)

    def _set(self, state: CircuitState) -> None:
        if state is not self._state:
            self._state = state
            if self._on_change is not None:
                self._on_change(state)


def _last(reason: str) -> str:
    return f"; last: {reason}" if reason else ""
