"""A training run draws task `<id>` as `<id>-e<epoch>` (`drawn_task`); a drawn id over the 128
characters of an id fails the run at once, naming the task, without retry. Before, the drawn id
went unchecked into the task's input, which the task workflow could not decode ("task.id: String
should have at most 128 characters"): its first workflow task failed and was retried for ever,
and the run waited on it. A stored suite with such ids still decodes (runs of earlier releases
replay)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from contracts.errors import ErrorType
from contracts.run import LoadTasksResponse, drawn_task
from contracts.task import AgentTaskInput, TaskSpec


def task(id_: str) -> TaskSpec:
    return TaskSpec(id=id_, prompt="p", entry_point="f", tests="assert f() == 1")


def test_a_drawn_id_over_128_characters_fails_without_retry_naming_the_task() -> None:
    long = task("t" * 126)
    with pytest.raises(ApplicationError) as raised:
        drawn_task([long], 0)
    error = raised.value
    assert error.type == ErrorType.INVALID_TASK and error.non_retryable
    assert f"task {long.id!r}" in error.message and "-e0" in error.message, error.message
    assert "at most 125 characters" in error.message, error.message


def test_an_id_fits_until_its_epoch_suffix_outgrows_it() -> None:
    order = [task("a" * 125), task("b")]
    drawn = [drawn_task(order, index) for index in range(20)]  # epochs 0-9: 128 characters
    assert AgentTaskInput(task=drawn[18], run_id="r").task.id == "a" * 125 + "-e9"
    assert drawn_task(order, 21).id == "b-e10"
    with pytest.raises(ApplicationError, match="drawn in epoch 10 as"):
        drawn_task(order, 20)


def test_a_stored_suite_with_a_long_id_still_decodes() -> None:
    stored = LoadTasksResponse(train=[task("t" * 128)], heldout=[]).model_dump_json()
    assert LoadTasksResponse.model_validate_json(stored).train[0].id == "t" * 128
