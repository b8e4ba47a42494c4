"""`HistoryMark`: what the history added since a mark, in all and per step or task (events
rounded up, bytes down: the rounding the learner's and the run's recorded look-aheads used)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from temporalio import workflow

from workflows.budget import Growth, HistoryMark


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The history as `workflow.info()` reports it, set by the test."""
    now = {"events": 0, "bytes": 0}
    info = SimpleNamespace(
        get_current_history_length=lambda: now["events"],
        get_current_history_size=lambda: now["bytes"],
    )
    monkeypatch.setattr(workflow, "info", lambda: info)
    return now


def test_an_unmarked_mark_counts_from_an_empty_history(history: dict[str, int]) -> None:
    history.update(events=7, bytes=900)
    mark = HistoryMark()
    assert (mark.events, mark.size) == (0, 0)
    assert mark.grown() == Growth(7, 900)


def test_growth_since_the_mark_and_per_unit(history: dict[str, int]) -> None:
    history.update(events=100, bytes=10_000)
    mark = HistoryMark()
    mark.mark()
    assert (mark.events, mark.size) == (100, 10_000)
    history.update(events=110, bytes=10_005)
    assert mark.grown() == Growth(events=10, size=5)
    assert mark.per_unit(3) == Growth(events=4, size=1)  # 10/3 rounded up, 5/3 down
    assert mark.per_unit(1) == Growth(10, 5)
    mark.mark()
    assert mark.grown() == Growth(0, 0)
