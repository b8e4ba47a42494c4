"""Inputs stored by an earlier release decode on this code, also where a rule added since would
refuse a new one: a run's continue-as-new input carries its whole suite (`RunResume.tasks`), so
a segment that cannot decode its input fails its first workflow task for ever and the run is
stuck. Such rules are asked where a new run is built (`new_run_problem`, asked by
`load_preset`) and where its tasks load (`infra.tasks.load_suite`), with the same message.

The values here are the previous release's: hidden tests with their asserts in a loop (no
top-level assert: refused since f927ceb), a run id of an evaluation's form (refused since
cbb9129). Replaying a whole segment whose suite holds such a task: test_replay_stored_inputs.py.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.rollout import WriteTrajectoriesRequest
from contracts.run import LoadTasksResponse, TrainingRunInput
from contracts.task import AgentTaskInput, TaskSpec
from infra.presets import load_preset
from infra.tasks import load_suite

HISTORY = Path(__file__).parents[1] / "workflows" / "histories" / "training_run_tails_next.json"
LOOPED = "for case in range(3):\n    assert add(case, 1) == case + 1\n"
"""Hidden tests the previous release took: their asserts are in a loop (one unit)."""
NO_TOP_LEVEL_ASSERT = "hidden_tests: they hold no top-level assert"
EVALUATION_FORM = "has the form of an evaluation's run id (<run>-eval-v<N>)"


def stored_input(edit: Any) -> Payload:
    """The input a run of the previous release continued as new with (its second segment's,
    recorded), after `edit` changed its decoded JSON."""
    history = json.loads(HISTORY.read_text())
    started = history["events"][0]["workflowExecutionStartedEventAttributes"]
    recorded = started["input"]["payloads"][0]
    data = json.loads(base64.b64decode(recorded["data"]))
    edit(data)
    metadata = {key: base64.b64decode(value) for key, value in recorded["metadata"].items()}
    return Payload(metadata=metadata, data=json.dumps(data).encode())


def decode(payload: Payload, type_hint: type) -> Any:
    """`payload` as the worker decodes a workflow's input (the SDK's pydantic converter)."""
    return pydantic_data_converter.payload_converter.from_payloads([payload], [type_hint])[0]


def test_a_stored_suite_with_hidden_tests_of_the_previous_release_decodes() -> None:
    def looped(data: dict[str, Any]) -> None:
        data["resume"]["tasks"]["train"][0]["hidden_tests"] = LOOPED

    run = decode(stored_input(looped), TrainingRunInput)
    assert run.resume is not None and run.resume.tasks.train[0].hidden_tests == LOOPED


def test_a_stored_run_id_of_an_evaluations_form_decodes() -> None:
    def renamed(data: dict[str, Any]) -> None:
        data["run_id"] = "exp-eval-v2-retry"

    assert decode(stored_input(renamed), TrainingRunInput).run_id == "exp-eval-v2-retry"


def test_the_activity_requests_of_such_a_task_decode() -> None:
    """An in-flight task of that run: its trajectories' write and its own input."""
    shown = "assert add(1, 1) == 2\n"
    task = TaskSpec(id="add-e0", prompt="p", entry_point="add", tests=shown, hidden_tests=LOOPED)
    write = WriteTrajectoriesRequest(run_id="r", task=task, group_size=2, samples=[])
    assert WriteTrajectoriesRequest.model_validate_json(write.model_dump_json()).task == task
    agent = AgentTaskInput(task=task, run_id="r")
    assert AgentTaskInput.model_validate_json(agent.model_dump_json()).task == task
    suite = LoadTasksResponse(train=[task], heldout=[])
    assert LoadTasksResponse.model_validate_json(suite.model_dump_json()).train == [task]


def test_a_new_run_with_a_run_id_of_an_evaluations_form_is_refused_where_it_is_built() -> None:
    """`tempered runs rm exp` would delete such a run as one of exp's evaluations."""
    run = TrainingRunInput(run_id="exp-eval-v2-retry")
    assert EVALUATION_FORM in (run.new_run_problem() or "")
    with pytest.raises(ValueError, match=re.escape(f"'exp-eval-v2-retry' {EVALUATION_FORM}")):
        load_preset("tiny", run_id="exp-eval-v2-retry")
    assert load_preset("tiny", run_id="exp-eval-retry").run_id == "exp-eval-retry"


def test_a_task_file_with_such_hidden_tests_is_refused_where_it_loads(tmp_path: Path) -> None:
    task = {"id": "add", "prompt": "Write add.", "entry_point": "add"}
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps(task | {"tests": "assert add(1, 2) == 3\n", "hidden_tests": LOOPED}) + "\n"
    )
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: {NO_TOP_LEVEL_ASSERT}"):
        load_suite(str(path))
