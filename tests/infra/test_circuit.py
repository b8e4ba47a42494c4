"""The circuit breaker, driven by a fake clock through every transition."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.circuit import CircuitBreaker, CircuitConfig, CircuitOpenError, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class InfraDown(Exception):
    pass


def make(**overrides: Any) -> tuple[CircuitBreaker, Clock, list[CircuitState]]:
    clock, changes = Clock(), list[CircuitState]()
    base = CircuitConfig(
        consecutive_failures=3,
        window=10,
        min_calls=4,
        failure_rate=0.5,
        base_backoff_s=5,
        max_backoff_s=30,
    )
    config = replace(base, **overrides)
    return CircuitBreaker("k8s", config, clock, changes.append), clock, changes


def test_opens_after_consecutive_failures_and_refuses_calls() -> None:
    breaker, clock, changes = make()
    breaker.record_failure("boom")
    breaker.record_failure("boom")
    assert breaker.state is CircuitState.CLOSED
    breaker.check()
    breaker.record_failure("api 503")
    assert breaker.state is CircuitState.OPEN and changes == [CircuitState.OPEN]
    assert "3 consecutive" in breaker.reason and "api 503" in breaker.reason
    with pytest.raises(CircuitOpenError) as refused:
        breaker.check()
    assert refused.value.retry_after_s == 5.0 and "api 503" in str(refused.value)
    clock.now += 2
    assert breaker.retry_after_s() == 3.0
    clock.now += 2.5
    assert breaker.retry_after_s() == 0.5


def test_a_success_resets_the_consecutive_count() -> None:
    breaker, _, _ = make(min_calls=10, failure_rate=0.9)
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state is CircuitState.CLOSED  # never 3 in a row, and 2/3 < 0.9


def test_opens_on_failure_rate_over_the_window() -> None:
    breaker, _, _ = make(consecutive_failures=100)
    for outcome in [True, False, True]:
        breaker.record_failure() if outcome else breaker.record_success()
    assert breaker.state is CircuitState.CLOSED  # 2/3 but below min_calls
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED  # 2/4 == rate, but the trip happens on a failure
    breaker.record_failure("slow api")
    assert breaker.state is CircuitState.OPEN and "3/5 recent calls failed" in breaker.reason


def test_window_forgets_old_outcomes() -> None:
    breaker, _, _ = make(consecutive_failures=100, window=4, min_calls=4, failure_rate=0.75)
    for _ in range(2):
        breaker.record_failure()
    for _ in range(4):
        breaker.record_success()  # pushes both failures out of the window
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED  # 2/4 < 0.75
    breaker.record_failure()
    assert breaker.state is CircuitState.OPEN


def test_half_open_after_backoff_then_closes_on_a_successful_probe() -> None:
    breaker, clock, changes = make()
    for _ in range(3):
        breaker.record_failure()
    clock.now += 4.999
    assert breaker.state is CircuitState.OPEN
    clock.now += 0.001
    assert breaker.state is CircuitState.HALF_OPEN and breaker.retry_after_s() == 0.0
    breaker.check()  # the one probe
    with pytest.raises(CircuitOpenError, match="probe in flight"):
        breaker.check()
    breaker.record_success()
    assert breaker.state is CircuitState.CLOSED
    assert changes == [CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]
    assert breaker.snapshot()["window_calls"] == 0 and breaker.reason == ""


def test_backoff_grows_exponentially_capped_and_resets_after_close() -> None:
    breaker, clock, _ = make()
    for _ in range(3):
        breaker.record_failure()
    pauses = []
    for _ in range(5):
        pauses.append(breaker.retry_after_s())
        clock.now += breaker.backoff_s
        breaker.check()
        breaker.record_failure("still down")  # the probe fails
        assert breaker.state is CircuitState.OPEN and "probe failed" in breaker.reason
    assert pauses == [5, 10, 20, 30, 30]
    clock.now += 30
    breaker.check()
    breaker.record_success()
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED  # the count restarted at the close
    breaker.record_failure()
    assert breaker.retry_after_s() == 5  # back to the base pause


def test_failures_reported_while_open_do_not_extend_the_pause() -> None:
    breaker, clock, _ = make()
    for _ in range(3):
        breaker.record_failure()
    clock.now += 3
    breaker.record_failure("straggler")
    assert breaker.retry_after_s() == 2 and breaker.backoff_s == 5


def test_guard_counts_only_the_named_failures() -> None:
    breaker, clock, _ = make(consecutive_failures=1)
    with pytest.raises(ValueError), breaker.guard(failures=(InfraDown,)):
        raise ValueError("bad input is not an infra failure")
    assert breaker.state is CircuitState.CLOSED
    with pytest.raises(InfraDown), breaker.guard(failures=(InfraDown,)):
        raise InfraDown("connection refused")
    assert breaker.state is CircuitState.OPEN and "InfraDown: connection refused" in breaker.reason
    with pytest.raises(CircuitOpenError), breaker.guard(failures=(InfraDown,)):
        pytest.fail("the body must not run while open")
    clock.now += 5
    # a cancelled probe gives its slot back instead of wedging the breaker half-open
    with pytest.raises(KeyboardInterrupt), breaker.guard(failures=(InfraDown,)):
        raise KeyboardInterrupt
    assert breaker.state is CircuitState.HALF_OPEN
    with breaker.guard(failures=(InfraDown,)):
        pass
    assert breaker.state is CircuitState.CLOSED


def test_several_probes_when_configured() -> None:
    breaker, clock, _ = make(half_open_probes=2)
    for _ in range(3):
        breaker.record_failure()
    clock.now += 5
    breaker.check()
    breaker.check()
    with pytest.raises(CircuitOpenError):
        breaker.check()


def test_a_released_slot_admits_exactly_one_more_probe() -> None:
    breaker, clock, _ = make(half_open_probes=2)
    breaker.release()  # a call that ended without a verdict while closed frees nothing
    for _ in range(3):
        breaker.record_failure()
    clock.now += 5
    breaker.check()
    breaker.release()
    breaker.release()  # more releases than probes taken: no extra slot
    breaker.check()
    breaker.check()
    with pytest.raises(CircuitOpenError, match="probe in flight"):
        breaker.check()


def test_the_last_failure_with_a_reason_is_shown_while_closed() -> None:
    breaker, _, _ = make()
    breaker.record_failure("api 503")
    breaker.record_failure()  # no reason given: the last one stays
    assert breaker.state is CircuitState.CLOSED
    assert breaker.snapshot()["reason"] == "api 503"


@pytest.mark.parametrize(
    "bad",
    [
        {"consecutive_failures": 0},
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"min_calls": 11},
        {"base_backoff_s": 0},
        {"multiplier": 0.5},
        {"max_backoff_s": 1},
        {"half_open_probes": 0},
        {"window": 0, "min_calls": 0},
        {"min_calls": 0},
    ],
)
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        make(**bad)


@pytest.mark.parametrize(
    "edge",
    [
        {"consecutive_failures": 1, "half_open_probes": 1},
        {"window": 1, "min_calls": 1},
        {"min_calls": 10},  # = window
        {"failure_rate": 1.0},
        {"multiplier": 1.0},
        {"max_backoff_s": 5},  # = base_backoff_s
        {"base_backoff_s": 0.5},
    ],
)
def test_config_accepts_its_bounds(edge: dict[str, float]) -> None:
    breaker, _, _ = make(**edge)
    assert breaker.state is CircuitState.CLOSED
